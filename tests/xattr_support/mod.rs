//! Shared by the xattr tests: an image held in memory with a test block
//! allocator that updates the real bitmaps, descriptors and superblock (so
//! that e2fsck can judge the result), inode read/write through the cache,
//! and the kernel side: loop mounts and raw xattr system calls.
#![allow(dead_code)]

use jext4::engine::cache::BufferCache;
use jext4::engine::dev::{BlockDevice, MemoryDevice};
use jext4::engine::format::bitmap;
use jext4::engine::format::group_desc::{BG_BLOCK_UNINIT, GroupDesc};
use jext4::engine::format::inode::Inode;
use jext4::engine::format::superblock::{Geometry, Superblock};
use jext4::engine::format::xattr::{self, SetMode};
use jext4::engine::format::{BlockAllocator, MetaCtx};
use jext4::engine::journal::{Handle, Journal, JournalConfig};
use jext4::{Error, Result};
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

/// A block allocator over the image's own bitmaps: first free block from
/// the goal's group on, skipping groups whose bitmap is not initialised.
pub struct TestAllocator {
    geo: Geometry,
    cache: Arc<BufferCache>,
    descs: Vec<GroupDesc>,
    superblock: Superblock,
    /// Blocks charged and not yet allocated: every allocation must have
    /// been charged first (`BlockAllocator::charge`).
    prepaid: u64,
}

impl TestAllocator {
    fn load(geo: &Geometry, cache: &Arc<BufferCache>) -> Self {
        let (block, offset) = geo.superblock_location();
        let bytes = cache.read(block).unwrap().read()[offset..offset + 1024].to_vec();
        let superblock = Superblock::decode(&bytes).unwrap();
        let descs = (0..geo.group_count)
            .map(|group| {
                let (block, offset) = geo.group_desc_location(group);
                let buffer = cache.read(block).unwrap();
                let bytes = buffer.read();
                GroupDesc::decode(geo, group, &bytes[offset..offset + geo.desc_size as usize])
                    .unwrap()
            })
            .collect();
        TestAllocator {
            geo: geo.clone(),
            cache: Arc::clone(cache),
            descs,
            superblock,
            prepaid: 0,
        }
    }

    fn bitmap_position(&self, block: u64) -> (u32, usize) {
        let group = self.geo.group_of_block(block);
        let bit = (block - self.geo.group_first_block(group)) as usize;
        (group, bit)
    }

    pub fn is_in_use(&self, block: u64) -> bool {
        let (group, bit) = self.bitmap_position(block);
        let desc = &self.descs[group as usize];
        assert_eq!(
            desc.flags & BG_BLOCK_UNINIT,
            0,
            "group {group} not initialised"
        );
        let buffer = self.cache.read(desc.block_bitmap).unwrap();
        bitmap::test_bit(&buffer.read(), bit)
    }

    /// Flip one block's bit and keep the counts and checksums in step.
    fn update(&mut self, handle: &Handle<'_>, block: u64, in_use: bool) -> Result<()> {
        let (group, bit) = self.bitmap_position(block);
        let geo = &self.geo;
        let desc = &mut self.descs[group as usize];
        let buffer = self.cache.read(desc.block_bitmap)?;
        {
            let mut bytes = handle.get_write_access(&buffer)?;
            assert_eq!(
                bitmap::test_bit(&bytes, bit),
                !in_use,
                "block {block} state"
            );
            if in_use {
                bitmap::set_bit(&mut bytes, bit);
                desc.free_blocks -= 1;
                self.superblock.free_blocks_count -= 1;
            } else {
                bitmap::clear_bit(&mut bytes, bit);
                desc.free_blocks += 1;
                self.superblock.free_blocks_count += 1;
            }
            desc.set_block_bitmap_csum(geo, &bytes);
        }
        let (block, offset) = geo.group_desc_location(group);
        let buffer = self.cache.read(block)?;
        {
            let mut bytes = handle.get_write_access(&buffer)?;
            desc.encode(
                geo,
                group,
                &mut bytes[offset..offset + geo.desc_size as usize],
            );
        }
        let (block, offset) = geo.superblock_location();
        let buffer = self.cache.read(block)?;
        let mut bytes = handle.get_write_access(&buffer)?;
        bytes[offset..offset + 1024].copy_from_slice(self.superblock.encode());
        Ok(())
    }
}

impl BlockAllocator for TestAllocator {
    fn charge(&mut self, blocks: u64) -> Result<()> {
        self.prepaid = self.prepaid.max(blocks);
        Ok(())
    }

    fn charge_run(&mut self, fixed: u64, flexible: u64) -> Result<u64> {
        self.prepaid = self.prepaid.max(fixed + flexible);
        Ok(flexible)
    }

    fn alloc_blocks(&mut self, handle: &Handle<'_>, goal: u64, _count: u32) -> Result<(u64, u32)> {
        assert!(self.prepaid >= 1, "allocating a block nobody charged");
        self.prepaid -= 1;
        let groups = self.geo.group_count;
        let start = self
            .geo
            .group_of_block(goal.max(self.geo.first_data_block as u64));
        for step in 0..groups {
            let group = (start + step) % groups;
            let desc = &self.descs[group as usize];
            if desc.flags & BG_BLOCK_UNINIT != 0 || desc.free_blocks == 0 {
                continue;
            }
            let buffer = self.cache.read(desc.block_bitmap)?;
            let end = self.geo.blocks_in_group(group) as usize;
            let found = bitmap::find_zero(&buffer.read(), 0, end);
            if let Some(bit) = found {
                let block = self.geo.group_first_block(group) + bit as u64;
                self.update(handle, block, true)?;
                return Ok((block, 1));
            }
        }
        Err(Error::NoSpace)
    }

    fn free_blocks(
        &mut self,
        handle: &Handle<'_>,
        start: u64,
        count: u64,
        metadata: bool,
    ) -> Result<()> {
        for block in start..start + count {
            self.update(handle, block, false)?;
        }
        handle.free_blocks(start, count, metadata);
        Ok(())
    }
}

/// An image in memory, opened with the format layer.
pub struct Image {
    pub dev: Arc<MemoryDevice>,
    pub cache: Arc<BufferCache>,
    pub journal: Arc<Journal>,
    pub geo: Geometry,
    pub alloc: TestAllocator,
}

impl Image {
    pub fn from_bytes(bytes: Vec<u8>) -> Image {
        let mut sb = vec![0u8; 1024];
        sb.copy_from_slice(&bytes[1024..2048]);
        let geo = Geometry::from_superblock(&Superblock::decode(&sb).unwrap());
        let dev = Arc::new(MemoryDevice::from_bytes(bytes));
        let device: Arc<dyn BlockDevice> = Arc::clone(&dev) as Arc<dyn BlockDevice>;
        let cache = Arc::new(BufferCache::new(device, geo.block_size as usize, 8 << 20));
        let journal = Journal::write_back(Arc::clone(&cache), JournalConfig::default(), false);
        let alloc = TestAllocator::load(&geo, &cache);
        Image {
            dev,
            cache,
            journal,
            geo,
            alloc,
        }
    }

    pub fn open(path: &Path) -> Image {
        Image::from_bytes(std::fs::read(path).unwrap())
    }

    fn inode_location(&self, ino: u32) -> (u64, usize) {
        let group = self.geo.group_of_inode(ino);
        let index = self.geo.inode_index_in_group(ino) as u64;
        let byte = index * self.geo.inode_size as u64;
        let table = self.alloc.descs[group as usize].inode_table;
        let block_size = self.geo.block_size as u64;
        (table + byte / block_size, (byte % block_size) as usize)
    }

    pub fn inode(&self, ino: u32) -> Inode {
        let (block, offset) = self.inode_location(ino);
        let buffer = self.cache.read(block).unwrap();
        let bytes = buffer.read();
        Inode::decode(&self.geo, ino, &bytes[offset..]).unwrap()
    }

    fn write_inode(&self, handle: &Handle<'_>, ino: u32, inode: &Inode) {
        let (block, offset) = self.inode_location(ino);
        let buffer = self.cache.read(block).unwrap();
        let mut bytes = handle.get_write_access(&buffer).unwrap();
        inode.encode(&self.geo, ino, &mut bytes[offset..]);
    }

    pub fn get(&self, ino: u32, name: &[u8]) -> Result<Option<Vec<u8>>> {
        xattr::get(&self.geo, &self.cache, ino, &self.inode(ino), name)
    }

    pub fn list(&self, ino: u32) -> Result<Vec<Vec<u8>>> {
        xattr::list(&self.geo, &self.cache, ino, &self.inode(ino))
    }

    /// `xattr::set` inside a handle; the inode is written back on success
    /// only, as fs/ would do.
    pub fn set(
        &mut self,
        ino: u32,
        name: &[u8],
        value: Option<&[u8]>,
        mode: SetMode,
    ) -> Result<()> {
        let mut inode = self.inode(ino);
        let before = inode.clone();
        let handle = self.journal.start(xattr::SET_CREDITS + 1).unwrap();
        let mut ctx = MetaCtx {
            geo: &self.geo,
            cache: &self.cache,
            handle: &handle,
            alloc: &mut self.alloc,
        };
        let result = xattr::set(&mut ctx, ino, &mut inode, name, value, mode);
        match &result {
            Ok(()) => self.write_inode(&handle, ino, &inode),
            // A failed set must leave the inode as it was.
            Err(_) => assert_eq!(
                encode(&self.geo, ino, &inode),
                encode(&self.geo, ino, &before),
                "a failed set changed inode {ino}"
            ),
        }
        handle.stop().unwrap();
        result
    }

    pub fn release_block(&mut self, ino: u32) -> Result<()> {
        let mut inode = self.inode(ino);
        let handle = self.journal.start(xattr::SET_CREDITS + 1).unwrap();
        let mut ctx = MetaCtx {
            geo: &self.geo,
            cache: &self.cache,
            handle: &handle,
            alloc: &mut self.alloc,
        };
        let result = xattr::release_block(&mut ctx, ino, &mut inode);
        if result.is_ok() {
            self.write_inode(&handle, ino, &inode);
        }
        handle.stop().unwrap();
        result
    }

    /// Write everything home and return the image bytes.
    pub fn finish(self) -> Vec<u8> {
        self.journal.sync().unwrap();
        self.journal.shutdown().unwrap();
        self.dev.snapshot()
    }
}

fn encode(geo: &Geometry, ino: u32, inode: &Inode) -> Vec<u8> {
    let mut bytes = vec![0u8; geo.inode_size as usize];
    inode.encode(geo, ino, &mut bytes);
    bytes
}

// ---------------------------------------------------------------------------
// The kernel side.

pub fn run(program: &str, args: &[&str]) -> std::process::Output {
    Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("running {program}: {e}"))
}

/// A loop mount, unmounted on drop.
pub struct Mount {
    pub dir: PathBuf,
    mounted: bool,
}

impl Mount {
    /// `None` (with a SKIP line) when this environment cannot loop-mount.
    pub fn new(image: &Path, dir: &Path) -> Option<Mount> {
        std::fs::create_dir_all(dir).unwrap();
        let image = image.to_str().unwrap();
        let output = run("mount", &["-o", "loop", image, dir.to_str().unwrap()]);
        if !output.status.success() {
            eprintln!(
                "SKIP: cannot loop-mount: {}",
                String::from_utf8_lossy(&output.stderr)
            );
            return None;
        }
        Some(Mount {
            dir: dir.to_path_buf(),
            mounted: true,
        })
    }

    pub fn path(&self, relative: &str) -> PathBuf {
        self.dir.join(relative)
    }

    pub fn unmount(mut self) {
        crate::common::kernel_umount(&self.dir);
        self.mounted = false;
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        if self.mounted {
            let _ = run("umount", &[self.dir.to_str().unwrap()]);
        }
    }
}

fn c_path(path: &Path) -> CString {
    CString::new(path.as_os_str().as_bytes()).unwrap()
}

/// lsetxattr(2); the errno on failure.
pub fn kernel_set(path: &Path, name: &[u8], value: &[u8]) -> std::result::Result<(), i32> {
    let path = c_path(path);
    let name = CString::new(name).unwrap();
    // SAFETY: valid NUL-terminated strings and a buffer of the given length.
    let rc = unsafe {
        libc::lsetxattr(
            path.as_ptr(),
            name.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0))
    }
}

/// lgetxattr(2), `None` for ENODATA.
pub fn kernel_get(path: &Path, name: &[u8]) -> Option<Vec<u8>> {
    let path = c_path(path);
    let name = CString::new(name).unwrap();
    let mut buffer = vec![0u8; 70000];
    // SAFETY: valid strings; the buffer is writable for its length.
    let rc = unsafe {
        libc::lgetxattr(
            path.as_ptr(),
            name.as_ptr(),
            buffer.as_mut_ptr().cast(),
            buffer.len(),
        )
    };
    if rc < 0 {
        let errno = std::io::Error::last_os_error().raw_os_error();
        assert_eq!(errno, Some(libc::ENODATA), "lgetxattr failed");
        return None;
    }
    buffer.truncate(rc as usize);
    Some(buffer)
}

/// llistxattr(2), names in the kernel's order.
pub fn kernel_list(path: &Path) -> Vec<Vec<u8>> {
    let path = c_path(path);
    let mut buffer = vec![0u8; 70000];
    // SAFETY: valid string; the buffer is writable for its length.
    let rc = unsafe { libc::llistxattr(path.as_ptr(), buffer.as_mut_ptr().cast(), buffer.len()) };
    assert!(rc >= 0, "llistxattr: {}", std::io::Error::last_os_error());
    buffer.truncate(rc as usize);
    buffer
        .split(|&b| b == 0)
        .filter(|name| !name.is_empty())
        .map(<[u8]>::to_vec)
        .collect()
}

pub fn inode_number(path: &Path) -> u32 {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(path).unwrap().ino() as u32
}

/// lremovexattr(2); the errno on failure.
pub fn kernel_remove(path: &Path, name: &[u8]) -> std::result::Result<(), i32> {
    let path = c_path(path);
    let name = CString::new(name).unwrap();
    // SAFETY: valid NUL-terminated strings.
    let rc = unsafe { libc::lremovexattr(path.as_ptr(), name.as_ptr()) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0))
    }
}
