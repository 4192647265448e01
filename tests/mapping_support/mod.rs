//! Shared by the mapping tests: mke2fs images opened over memory or a file,
//! a block allocator for tests (the real one lives in `fs/`), inode table
//! access through the cache and a handle, and whole-mapping invariants.
//!
//! Test files declare `mod common; mod mapping_support;`.
#![allow(dead_code)]

use jext4::engine::cache::BufferCache;
use jext4::engine::dev::{BlockDevice, FileDevice, MemoryDevice};
use jext4::engine::format::bitmap;
use jext4::engine::format::group_desc::{BG_BLOCK_UNINIT, GroupDesc};
use jext4::engine::format::inode::{Inode, S_IFREG};
use jext4::engine::format::mapping::{self, BlockUse, Extent};
use jext4::engine::format::superblock::{Geometry, Superblock};
use jext4::engine::format::{BlockAllocator, MetaCtx};
use jext4::engine::journal::{Handle, Journal, JournalConfig};
use jext4::{Error, Result};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock};

/// An opened image: device, cache, unjournaled transaction layer, shape.
pub struct Image {
    pub dev: Arc<dyn BlockDevice>,
    pub cache: Arc<BufferCache>,
    pub journal: Arc<Journal>,
    pub geo: Geometry,
    pub descs: Vec<GroupDesc>,
}

impl Image {
    pub fn open(dev: Arc<dyn BlockDevice>) -> Image {
        let mut sb_bytes = vec![0u8; 1024];
        dev.read_at(1024, &mut sb_bytes).unwrap();
        let sb = Superblock::decode(&sb_bytes).unwrap();
        let geo = Geometry::from_superblock(&sb);
        let cache = Arc::new(BufferCache::new(
            Arc::clone(&dev),
            geo.block_size as usize,
            64 << 20,
        ));
        let journal = Journal::write_back(Arc::clone(&cache), JournalConfig::default(), false);
        let descs = (0..geo.group_count)
            .map(|group| {
                let (block, offset) = geo.group_desc_location(group);
                let buffer = cache.read(block).unwrap();
                let bytes = buffer.read();
                GroupDesc::decode(&geo, group, &bytes[offset..]).unwrap()
            })
            .collect();
        Image {
            dev,
            cache,
            journal,
            geo,
            descs,
        }
    }

    pub fn memory(bytes: Vec<u8>) -> Image {
        Image::open(Arc::new(MemoryDevice::from_bytes(bytes)))
    }

    pub fn file(path: &Path) -> Image {
        Image::open(Arc::new(FileDevice::open(path, false).unwrap()))
    }

    fn inode_location(&self, ino: u32) -> (u64, usize) {
        let group = self.geo.group_of_inode(ino);
        let index = self.geo.inode_index_in_group(ino) as u64;
        let per_block = self.geo.block_size as u64 / self.geo.inode_size as u64;
        let block = self.descs[group as usize].inode_table + index / per_block;
        let offset = (index % per_block) as usize * self.geo.inode_size as usize;
        (block, offset)
    }

    pub fn read_inode(&self, ino: u32) -> Inode {
        let (block, offset) = self.inode_location(ino);
        let buffer = self.cache.read(block).unwrap();
        let bytes = buffer.read();
        Inode::decode(&self.geo, ino, &bytes[offset..]).unwrap()
    }

    pub fn write_inode(&self, handle: &Handle<'_>, ino: u32, inode: &Inode) {
        let (block, offset) = self.inode_location(ino);
        let buffer = self.cache.read(block).unwrap();
        let mut bytes = handle.get_write_access(&buffer).unwrap();
        inode.encode(&self.geo, ino, &mut bytes[offset..]);
    }

    /// Write everything home and stop the flusher.
    pub fn close(&self) {
        self.journal.sync().unwrap();
        self.journal.shutdown().unwrap();
    }

    /// A fresh regular-file inode with an empty mapping of either scheme.
    pub fn new_file(&self, extents: bool, generation: u32) -> Inode {
        let mut inode = Inode::new(&self.geo);
        inode.mode = S_IFREG | 0o644;
        inode.links_count = 1;
        inode.generation = generation;
        mapping::init(&mut inode, extents);
        inode
    }
}

/// mke2fs images, made once per test binary and copied per case.
pub fn image_bytes(name: &str, size_mib: u64, args: &[&str]) -> Vec<u8> {
    static IMAGES: OnceLock<Mutex<HashMap<String, Vec<u8>>>> = OnceLock::new();
    let images = IMAGES.get_or_init(|| Mutex::new(HashMap::new()));
    let mut images = images.lock().unwrap();
    images
        .entry(name.to_string())
        .or_insert_with(|| {
            let dir = tempfile::tempdir().unwrap();
            let path = crate::common::mkfs(dir.path(), name, size_mib, args);
            std::fs::read(path).unwrap()
        })
        .clone()
}

/// Bitmap, descriptor and superblock updates for an allocator that must
/// leave the image e2fsck-clean.
struct OnDisk {
    cache: Arc<BufferCache>,
    descs: Vec<GroupDesc>,
}

/// A first-fit allocator over the image's real bitmaps. It remembers every
/// block it handed out and refuses to free a block it does not hold, so
/// tests can compare what it holds with what the mapping uses.
pub struct TestAllocator {
    geo: Geometry,
    used: Vec<bool>,
    /// Blocks handed out and not yet freed.
    pub held: BTreeSet<u64>,
    /// Most blocks returned by one allocation.
    pub max_run: u32,
    /// Start searching one past the goal, so that consecutive allocations
    /// are never physically contiguous (no merging: many extents).
    pub scatter: bool,
    /// Blocks it may still hand out before answering NoSpace: charges
    /// (`BlockAllocator::charge`) past it fail.
    pub budget: Option<u64>,
    /// Blocks charged by the running operation and not yet allocated:
    /// every allocation must fit in them (the format layer's estimates are
    /// worst cases), and `with_ctx` drops the rest when the operation ends.
    pub prepaid: u64,
    /// Ignore frees of blocks it never handed out (for garbage mappings).
    pub lenient: bool,
    on_disk: Option<OnDisk>,
}

impl TestAllocator {
    /// Track free space in memory only.
    pub fn new(image: &Image) -> Self {
        let geo = image.geo.clone();
        let mut used = vec![false; geo.blocks_count as usize];
        used[..geo.first_data_block as usize].fill(true);
        for group in 0..geo.group_count {
            let desc = &image.descs[group as usize];
            let mut bits = vec![0u8; geo.block_size as usize];
            if desc.flags & BG_BLOCK_UNINIT != 0 {
                bitmap::uninit_block_bitmap(
                    &geo,
                    group,
                    image.descs.iter().map(|d| d.locations()),
                    &mut bits,
                );
            } else {
                let buffer = image.cache.read(desc.block_bitmap).unwrap();
                bits.copy_from_slice(&buffer.read());
            }
            let first = geo.group_first_block(group);
            for bit in 0..geo.blocks_in_group(group) as usize {
                used[first as usize + bit] = bitmap::test_bit(&bits, bit);
            }
        }
        TestAllocator {
            geo,
            used,
            held: BTreeSet::new(),
            max_run: u32::MAX,
            scatter: false,
            budget: None,
            prepaid: 0,
            lenient: false,
            on_disk: None,
        }
    }

    /// Also keep the on-disk bitmaps, descriptors and free counts right.
    pub fn persistent(image: &Image) -> Self {
        let mut allocator = TestAllocator::new(image);
        allocator.on_disk = Some(OnDisk {
            cache: Arc::clone(&image.cache),
            descs: image.descs.clone(),
        });
        allocator
    }

    /// Take over blocks already in use by a file made elsewhere (debugfs),
    /// so that freeing them later is legitimate.
    pub fn adopt(&mut self, blocks: impl IntoIterator<Item = u64>) {
        for block in blocks {
            assert!(self.used[block as usize], "adopting free block {block}");
            assert!(self.held.insert(block), "adopting block {block} twice");
        }
    }

    pub fn is_used(&self, block: u64) -> bool {
        self.used[block as usize]
    }

    fn find_run(&self, goal: u64, count: u32) -> Option<(u64, u32)> {
        let first = self.geo.first_data_block as u64;
        let total = self.geo.blocks_count;
        let span = total - first;
        let start = goal.clamp(first, total - 1) - first + self.scatter as u64;
        let found = (0..span)
            .map(|i| first + (start + i) % span)
            .find(|&b| !self.used[b as usize])?;
        let mut len = 1;
        while len < count
            && found + (len as u64) < total
            && !self.used[(found + len as u64) as usize]
        {
            len += 1;
        }
        Some((found, len))
    }

    fn mark(&mut self, handle: &Handle<'_>, start: u64, count: u64, in_use: bool) {
        let foreign = (start..start + count).any(|block| !self.held.contains(&block));
        if self.lenient && !in_use && foreign {
            return;
        }
        for block in start..start + count {
            assert_ne!(self.used[block as usize], in_use, "block {block} state");
            self.used[block as usize] = in_use;
            if in_use {
                self.held.insert(block);
            } else {
                assert!(
                    self.held.remove(&block),
                    "freeing block {block} never handed out"
                );
            }
        }
        if let Some(on_disk) = &mut self.on_disk {
            on_disk.record(&self.geo, handle, start, count, in_use);
        }
    }
}

impl OnDisk {
    /// Flip the bitmap bits of a run, and move the groups' and the
    /// superblock's free counts.
    fn record(
        &mut self,
        geo: &Geometry,
        handle: &Handle<'_>,
        start: u64,
        count: u64,
        in_use: bool,
    ) {
        let mut block = start;
        while block < start + count {
            let group = geo.group_of_block(block);
            let group_end = geo.group_first_block(group) + geo.blocks_in_group(group) as u64;
            let piece = group_end.min(start + count) - block;
            self.record_in_group(geo, handle, group, block, piece, in_use);
            block += piece;
        }
        let (block, offset) = geo.superblock_location();
        let buffer = self.cache.read(block).unwrap();
        let mut bytes = handle.get_write_access(&buffer).unwrap();
        let mut sb = Superblock::decode(&bytes[offset..offset + 1024]).unwrap();
        if in_use {
            sb.free_blocks_count -= count;
        } else {
            sb.free_blocks_count += count;
        }
        bytes[offset..offset + 1024].copy_from_slice(sb.encode());
    }

    fn record_in_group(
        &mut self,
        geo: &Geometry,
        handle: &Handle<'_>,
        group: u32,
        start: u64,
        count: u64,
        in_use: bool,
    ) {
        let first = geo.group_first_block(group);
        let desc_list = self.descs.clone();
        let desc = &mut self.descs[group as usize];
        let buffer = self.cache.read(desc.block_bitmap).unwrap();
        {
            let mut bits = handle.get_write_access(&buffer).unwrap();
            if desc.flags & BG_BLOCK_UNINIT != 0 {
                bitmap::uninit_block_bitmap(
                    geo,
                    group,
                    desc_list.iter().map(|d| d.locations()),
                    &mut bits,
                );
                desc.flags &= !BG_BLOCK_UNINIT;
            }
            for block in start..start + count {
                let bit = (block - first) as usize;
                if in_use {
                    bitmap::set_bit(&mut bits, bit);
                } else {
                    bitmap::clear_bit(&mut bits, bit);
                }
            }
            desc.set_block_bitmap_csum(geo, &bits);
        }
        if in_use {
            desc.free_blocks -= count as u32;
        } else {
            desc.free_blocks += count as u32;
        }
        let (block, offset) = geo.group_desc_location(group);
        let buffer = self.cache.read(block).unwrap();
        desc.encode(
            geo,
            group,
            &mut handle.get_write_access(&buffer).unwrap()[offset..],
        );
    }
}

impl BlockAllocator for TestAllocator {
    fn charge(&mut self, blocks: u64) -> Result<()> {
        if blocks > self.budget.unwrap_or(u64::MAX) {
            return Err(Error::NoSpace);
        }
        self.prepaid = self.prepaid.max(blocks);
        Ok(())
    }

    fn charge_run(&mut self, fixed: u64, flexible: u64) -> Result<u64> {
        let room = self.budget.unwrap_or(u64::MAX).saturating_sub(fixed);
        let granted = flexible.min(room);
        if fixed > self.budget.unwrap_or(u64::MAX) || (granted == 0 && flexible > 0) {
            return Err(Error::NoSpace);
        }
        self.prepaid = self.prepaid.max(fixed + granted);
        Ok(granted)
    }

    fn alloc_blocks(&mut self, handle: &Handle<'_>, goal: u64, count: u32) -> Result<(u64, u32)> {
        assert!(count > 0);
        assert!(
            count as u64 <= self.prepaid,
            "allocating {count} blocks with {} charged: a cost estimate missed them",
            self.prepaid
        );
        let mut count = count.min(self.max_run);
        if let Some(budget) = self.budget {
            if budget == 0 {
                return Err(Error::NoSpace);
            }
            count = count.min(budget as u32);
        }
        let (start, len) = self.find_run(goal, count).ok_or(Error::NoSpace)?;
        if let Some(budget) = &mut self.budget {
            *budget -= len as u64;
        }
        self.prepaid -= len as u64;
        self.mark(handle, start, len as u64, true);
        Ok((start, len))
    }

    fn free_blocks(
        &mut self,
        handle: &Handle<'_>,
        start: u64,
        count: u64,
        metadata: bool,
    ) -> Result<()> {
        assert!(count > 0);
        self.mark(handle, start, count, false);
        if let Some(budget) = &mut self.budget {
            *budget += count;
        }
        if metadata {
            assert_eq!(count, 1, "tree and indirect blocks are freed one by one");
            handle.free_blocks(start, 1, true);
        }
        Ok(())
    }
}

/// Run `op` inside one handle with a MetaCtx over `image` and `alloc`.
pub fn with_ctx<T>(
    image: &Image,
    alloc: &mut TestAllocator,
    op: impl FnOnce(&mut MetaCtx) -> Result<T>,
) -> Result<T> {
    let handle = image.journal.start(64).unwrap();
    let result = {
        let mut ctx = MetaCtx {
            geo: &image.geo,
            cache: &image.cache,
            handle: &handle,
            alloc,
        };
        op(&mut ctx)
    };
    // What the operation charged and did not allocate goes back.
    alloc.prepaid = 0;
    handle.stop().unwrap();
    result
}

/// Everything the mapping occupies, as for_each_block reports it.
#[derive(Debug, Default)]
pub struct Walk {
    /// Logical block → (physical block, unwritten).
    pub data: BTreeMap<u64, (u64, bool)>,
    pub runs: Vec<Extent>,
    pub meta: Vec<u64>,
}

impl Walk {
    pub fn blocks(&self) -> u64 {
        self.data.len() as u64 + self.meta.len() as u64
    }
}

pub fn walk(image: &Image, ino: u32, inode: &Inode) -> Result<Walk> {
    let mut walk = Walk::default();
    mapping::for_each_block(&image.geo, &image.cache, ino, inode, &mut |used| {
        match used {
            BlockUse::Data(run) => {
                assert!(run.len > 0);
                for i in 0..run.len as u64 {
                    let previous = walk
                        .data
                        .insert(run.logical + i, (run.physical + i, run.unwritten));
                    assert!(
                        previous.is_none(),
                        "logical block {} reported twice",
                        run.logical + i
                    );
                }
                walk.runs.push(run);
            }
            BlockUse::Meta(block) => walk.meta.push(block),
        }
        Ok(())
    })?;
    Ok(walk)
}

/// Invariants that hold after every operation: i_blocks counts exactly the
/// data and tree blocks; no physical block is used twice; the allocator
/// holds exactly the blocks the mapping uses (no leak, nothing mapped that
/// is free).
pub fn check_invariants(image: &Image, alloc: &TestAllocator, ino: u32, inode: &Inode) -> Walk {
    let walk = walk(image, ino, inode).expect("mapping walks cleanly");
    let sectors = image.geo.block_size as u64 / 512;
    assert_eq!(inode.blocks, walk.blocks() * sectors, "i_blocks");
    let mut physical: BTreeSet<u64> = BTreeSet::new();
    for (logical, (block, _)) in &walk.data {
        assert!(
            physical.insert(*block),
            "block {block} mapped twice (logical {logical})"
        );
    }
    for block in &walk.meta {
        assert!(
            physical.insert(*block),
            "tree block {block} also used elsewhere"
        );
    }
    for block in &physical {
        assert!(alloc.is_used(*block), "block {block} is mapped but free");
    }
    assert_eq!(
        physical, alloc.held,
        "blocks held by the allocator vs used by the mapping"
    );
    walk
}
