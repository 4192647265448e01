//! Directories written by our code into real images, judged by e2fsck and
//! the kernel. The kernel makes an empty directory /new and a few files;
//! our code fills /new (adds, removes, renames-over) through a `DirBlocks`
//! whose new blocks come from the image's free blocks; the test then writes
//! what the fs layer will own later (extent tree of /new, i_size, i_blocks,
//! INDEX flag, the files' link counts, bitmaps, descriptor and superblock
//! counts). `e2fsck -fn` must find nothing to fix, the kernel must list and
//! look up every name, then change the directory itself, after which
//! e2fsck and our code must still agree.

mod dir_common;

use dir_common::{
    Mount, Rng, TestDir, can_mount, debugfs_blocks, group_descs, inode_offset, mkfs, random_name,
    read_geometry, read_inode, run,
};
use jext4::engine::cache::BufferCache;
use jext4::engine::dev::MemoryDevice;
use jext4::engine::format::Geometry;
use jext4::engine::format::bitmap::{count_set, set_bit, test_bit, uninit_block_bitmap};
use jext4::engine::format::csum::crc32c_raw;
use jext4::engine::format::dir::{self, FT_REG_FILE};
use jext4::engine::format::group_desc::{BG_BLOCK_UNINIT, GroupDesc};
use jext4::engine::format::htree::hash_version;
use jext4::engine::format::inode::{Inode, flags};
use jext4::engine::format::superblock::Superblock;
use jext4::engine::format::{put_u16, put_u32};
use jext4::engine::journal::{Journal, JournalConfig};
use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirEntryExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::rc::Rc;

type Model = BTreeMap<Vec<u8>, u32>;

struct Prepared {
    tmp: tempfile::TempDir,
    image: PathBuf,
    dir_ino: u32,
    /// The files entries may name, in /src (one link each from there).
    files: Vec<u32>,
}

fn prepare(size_mib: u64, mkfs_args: &[&str], tune: &[&[&str]]) -> Prepared {
    let tmp = tempfile::tempdir().unwrap();
    let image = mkfs(tmp.path(), "image", size_mib, mkfs_args);
    for command in tune {
        let mut args: Vec<&str> = command[1..].to_vec();
        args.push(image.to_str().unwrap());
        run(command[0], &args);
    }
    let mount = Mount::new(&image, &tmp.path().join("mnt"), false);
    let new = mount.point.join("new");
    std::fs::create_dir(&new).unwrap();
    std::fs::create_dir(mount.point.join("src")).unwrap();
    let files = (0..20)
        .map(|i| {
            let path = mount.point.join("src").join(format!("file{i}"));
            std::fs::write(&path, b"data").unwrap();
            std::fs::metadata(&path).unwrap().ino() as u32
        })
        .collect();
    let dir_ino = std::fs::metadata(&new).unwrap().ino() as u32;
    drop(mount);
    Prepared {
        tmp,
        image,
        dir_ino,
        files,
    }
}

/// Free blocks of the image, handed out in order from group 1 (long runs,
/// so the extent tree stays small); remembers what it gave.
struct ImageAlloc {
    geo: Geometry,
    bitmaps: Vec<Vec<u8>>,
    touched: BTreeSet<u32>,
    group: u32,
    bit: usize,
    allocated: u64,
}

impl ImageAlloc {
    fn new(geo: &Geometry, descs: &[GroupDesc], image: &[u8]) -> Self {
        let bs = geo.block_size as usize;
        let bitmaps = (0..geo.group_count)
            .map(|group| {
                let desc = &descs[group as usize];
                let mut bitmap = vec![0u8; bs];
                if desc.flags & BG_BLOCK_UNINIT != 0 {
                    uninit_block_bitmap(
                        geo,
                        group,
                        descs.iter().map(|d| d.locations()),
                        &mut bitmap,
                    );
                } else {
                    let at = desc.block_bitmap as usize * bs;
                    bitmap.copy_from_slice(&image[at..at + bs]);
                }
                bitmap
            })
            .collect();
        ImageAlloc {
            geo: geo.clone(),
            bitmaps,
            touched: BTreeSet::new(),
            group: 1.min(geo.group_count - 1),
            bit: 0,
            allocated: 0,
        }
    }

    fn alloc(&mut self) -> Option<u64> {
        while self.group < self.geo.group_count {
            let bits = self.geo.blocks_in_group(self.group) as usize;
            let bitmap = &mut self.bitmaps[self.group as usize];
            while self.bit < bits {
                let bit = self.bit;
                self.bit += 1;
                if !test_bit(bitmap, bit) {
                    set_bit(bitmap, bit);
                    self.touched.insert(self.group);
                    self.allocated += 1;
                    return Some(self.geo.group_first_block(self.group) + bit as u64);
                }
            }
            (self.group, self.bit) = (self.group + 1, 0);
        }
        None
    }
}

/// Let `work` fill the directory through our code, then write the result
/// into the image file with everything around it made consistent.
fn write_directory(prep: &Prepared, work: impl FnOnce(&mut TestDir, &Journal) -> Model) -> Model {
    let bytes = std::fs::read(&prep.image).unwrap();
    let (_, geo) = read_geometry(&prep.image);
    let descs = group_descs(&geo, &bytes);
    let inode = read_inode(&geo, &bytes, prep.dir_ino);
    let alloc = Rc::new(RefCell::new(ImageAlloc::new(&geo, &descs, &bytes)));
    let dev = Arc::new(MemoryDevice::from_bytes(bytes));
    let cache = Arc::new(BufferCache::new(
        dev.clone(),
        geo.block_size as usize,
        512 << 20,
    ));
    let journal = Journal::write_back(cache.clone(), JournalConfig::default(), false);
    let shared = alloc.clone();
    let mut d = TestDir {
        geo: geo.clone(),
        cache,
        ino: prep.dir_ino,
        seed: inode.csum_seed(&geo, prep.dir_ino),
        map: debugfs_blocks(&prep.image, prep.dir_ino),
        indexed: inode.has_flag(flags::INDEX),
        alloc: Box::new(move || shared.borrow_mut().alloc()),
        index_damaged: None,
        bad_entries: Vec::new(),
    };
    let model = work(&mut d, &journal);
    let stats = dir::check(&mut d).unwrap();
    eprintln!("{stats:?}");
    journal.shutdown().unwrap();
    let mut image = dev.snapshot();
    let mut links: HashMap<u32, u16> = HashMap::new();
    for ino in model.values() {
        *links.entry(*ino).or_default() += 1;
    }
    let mut alloc = alloc.borrow_mut();
    patch_image(&geo, &mut image, prep.dir_ino, &d, &mut alloc, &links);
    std::fs::write(&prep.image, &image).unwrap();
    model
}

use std::sync::Arc;

/// ext3_extents.h: header magic, entry sizes.
const EXTENT_MAGIC: u16 = 0xF30A;

fn extent_header(bytes: &mut [u8], entries: usize, max: usize, depth: u16) {
    put_u16(bytes, 0, EXTENT_MAGIC);
    put_u16(bytes, 2, entries as u16);
    put_u16(bytes, 4, max as u16);
    put_u16(bytes, 6, depth);
    put_u32(bytes, 8, 0);
}

/// The directory's extent tree: in the inode when four extents do, else one
/// level of leaf blocks (with their checksum tail). Returns i_block and the
/// number of tree blocks.
fn extent_tree(
    geo: &Geometry,
    image: &mut [u8],
    seed: u32,
    map: &[u64],
    alloc: &mut ImageAlloc,
) -> ([u8; 60], u64) {
    let mut extents: Vec<(u32, u64, u16)> = Vec::new();
    for (lblk, &physical) in map.iter().enumerate() {
        match extents.last_mut() {
            Some(last) if last.1 + last.2 as u64 == physical && last.2 < 32768 => last.2 += 1,
            _ => extents.push((lblk as u32, physical, 1)),
        }
    }
    let put_extent = |bytes: &mut [u8], (lblk, start, len): (u32, u64, u16)| {
        put_u32(bytes, 0, lblk);
        put_u16(bytes, 4, len);
        put_u16(bytes, 6, (start >> 32) as u16);
        put_u32(bytes, 8, start as u32);
    };
    let mut i_block = [0u8; 60];
    if extents.len() <= 4 {
        extent_header(&mut i_block, extents.len(), 4, 0);
        for (index, extent) in extents.iter().enumerate() {
            put_extent(&mut i_block[12 + 12 * index..], *extent);
        }
        return (i_block, 0);
    }
    let bs = geo.block_size as usize;
    let per_leaf = (bs - 12) / 12;
    let chunks: Vec<_> = extents.chunks(per_leaf).collect();
    assert!(chunks.len() <= 4, "too many extents for a one-level tree");
    extent_header(&mut i_block, chunks.len(), 4, 1);
    for (index, chunk) in chunks.iter().enumerate() {
        let leaf = alloc.alloc().unwrap();
        let block = &mut image[leaf as usize * bs..(leaf as usize + 1) * bs];
        block.fill(0);
        extent_header(block, chunk.len(), per_leaf, 0);
        for (slot, extent) in chunk.iter().enumerate() {
            put_extent(&mut block[12 + 12 * slot..], *extent);
        }
        if geo.metadata_csum {
            let tail = 12 + 12 * per_leaf;
            let checksum = crc32c_raw(seed, &block[..tail]);
            put_u32(block, tail, checksum);
        }
        let entry = &mut i_block[12 + 12 * index..];
        put_u32(entry, 0, chunk[0].0);
        put_u32(entry, 4, leaf as u32);
        put_u16(entry, 8, (leaf >> 32) as u16);
    }
    (i_block, chunks.len() as u64)
}

fn write_inode(geo: &Geometry, image: &mut [u8], ino: u32, inode: &Inode) {
    let descs = group_descs(geo, image);
    let at = inode_offset(geo, &descs, ino);
    inode.encode(geo, ino, &mut image[at..at + geo.inode_size as usize]);
}

fn patch_image(
    geo: &Geometry,
    image: &mut [u8],
    dir_ino: u32,
    d: &TestDir,
    alloc: &mut ImageAlloc,
    links: &HashMap<u32, u16>,
) {
    let bs = geo.block_size as usize;
    let mut inode = read_inode(geo, image, dir_ino);
    let (i_block, tree_blocks) = extent_tree(geo, image, d.seed, &d.map, alloc);
    inode.block = i_block;
    inode.size = d.map.len() as u64 * bs as u64;
    inode.blocks = (d.map.len() as u64 + tree_blocks) * (bs as u64 / 512);
    if d.indexed {
        inode.flags |= flags::INDEX;
    }
    write_inode(geo, image, dir_ino, &inode);
    for (&ino, &count) in links {
        let mut file = read_inode(geo, image, ino);
        file.links_count = 1 + count;
        write_inode(geo, image, ino, &file);
    }
    let mut descs = group_descs(geo, image);
    for &group in &alloc.touched {
        let desc = &mut descs[group as usize];
        let bitmap = &alloc.bitmaps[group as usize];
        let at = desc.block_bitmap as usize * bs;
        image[at..at + bs].copy_from_slice(bitmap);
        desc.flags &= !BG_BLOCK_UNINIT;
        let in_group = geo.blocks_in_group(group) as usize;
        desc.free_blocks = (in_group - count_set(bitmap, in_group)) as u32;
        desc.set_block_bitmap_csum(geo, bitmap);
        let (block, offset) = geo.group_desc_location(group);
        let at = block as usize * bs + offset;
        desc.encode(geo, group, &mut image[at..at + geo.desc_size as usize]);
    }
    let mut sb = Superblock::decode(&image[1024..2048]).unwrap();
    sb.free_blocks_count -= alloc.allocated;
    let encoded = sb.encode().to_vec();
    image[1024..2048].copy_from_slice(&encoded);
}

/// Adds with removes and renames-over mixed in; entries name the prepared
/// files round robin.
fn mixed_workload(
    ops: u64,
    name_len: (usize, usize),
    seed: u64,
    files: &[u32],
) -> impl FnOnce(&mut TestDir, &Journal) -> Model {
    let files = files.to_vec();
    move |d, journal| {
        let mut rng = Rng::new(seed);
        let mut model = Model::new();
        let mut live: Vec<Vec<u8>> = Vec::new();
        for op in 0..ops {
            let handle = journal.start(16).unwrap();
            let file = files[rng.below(files.len() as u64) as usize];
            match rng.below(8) {
                0 if !live.is_empty() => {
                    let name = live.swap_remove(rng.below(live.len() as u64) as usize);
                    dir::remove_entry(d, &handle, &name).unwrap();
                    model.remove(&name);
                }
                1 if !live.is_empty() => {
                    let name = &live[rng.below(live.len() as u64) as usize];
                    dir::replace_entry(d, &handle, name, file, FT_REG_FILE).unwrap();
                    model.insert(name.clone(), file);
                }
                _ => {
                    let len = name_len.0 + rng.below((name_len.1 - name_len.0 + 1) as u64) as usize;
                    let name = random_name(&mut rng, len, op);
                    dir::add_entry(d, &handle, &name, file, FT_REG_FILE).unwrap();
                    model.insert(name.clone(), file);
                    live.push(name);
                }
            }
            handle.stop().unwrap();
        }
        model
    }
}

fn assert_fsck_clean(image: &Path) {
    let output = std::process::Command::new("e2fsck")
        .arg("-fn")
        .arg(image)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(output.status.code(), Some(0), "e2fsck -fn:\n{text}");
}

/// The kernel lists exactly the model and finds every name by lookup.
fn kernel_agrees(prep: &Prepared, model: &Model) {
    let mount = Mount::new(&prep.image, &prep.tmp.path().join("ro"), true);
    let new = mount.point.join("new");
    let mut listed = Model::new();
    for entry in std::fs::read_dir(&new).unwrap() {
        let entry = entry.unwrap();
        listed.insert(entry.file_name().as_bytes().to_vec(), entry.ino() as u32);
    }
    assert!(
        listed == *model,
        "kernel listing differs ({} vs {})",
        listed.len(),
        model.len()
    );
    for (name, ino) in model {
        let meta = std::fs::symlink_metadata(new.join(OsStr::from_bytes(name))).unwrap();
        assert_eq!(meta.ino() as u32, *ino);
    }
}

/// The kernel adds and removes names in our directory; afterwards e2fsck is
/// clean and our code reads the kernel's changes.
fn kernel_changes_then_we_read(prep: &Prepared, mut model: Model) {
    {
        let mount = Mount::new(&prep.image, &prep.tmp.path().join("rw"), false);
        let new = mount.point.join("new");
        let target = mount.point.join("src").join("file0");
        let target_ino = std::fs::metadata(&target).unwrap().ino() as u32;
        let doomed: Vec<Vec<u8>> = model.keys().step_by(7).cloned().collect();
        for name in doomed {
            std::fs::remove_file(new.join(OsStr::from_bytes(&name))).unwrap();
            model.remove(&name);
        }
        let mut rng = Rng::new(99);
        for tag in 0..3000u64 {
            let name = random_name(&mut rng, 30, 1 << 40 | tag);
            std::fs::hard_link(&target, new.join(OsStr::from_bytes(&name))).unwrap();
            model.insert(name, target_ino);
        }
    }
    assert_fsck_clean(&prep.image);
    let mut d = dir_common::image_dir(&prep.image, prep.dir_ino);
    let stats = dir::check(&mut d).unwrap();
    assert_eq!(stats.entries, model.len() as u64 + 2);
    for (name, ino) in &model {
        assert_eq!(
            dir::lookup(&mut d, name).unwrap().map(|l| l.ino),
            Some(*ino)
        );
    }
    let parent = dir::parent(&mut d).unwrap();
    dir_common::assert_listing(&mut d, &model, parent);
}

fn round_trip(
    size_mib: u64,
    mkfs_args: &[&str],
    tune: &[&[&str]],
    ops: u64,
    name_len: (usize, usize),
    levels: u32,
) {
    let prep = prepare(size_mib, mkfs_args, tune);
    let work = mixed_workload(ops, name_len, ops ^ size_mib, &prep.files);
    let model = write_directory(&prep, work);
    assert_fsck_clean(&prep.image);
    let mut d = dir_common::image_dir(&prep.image, prep.dir_ino);
    assert_eq!(dir::check(&mut d).unwrap().levels, levels, "{mkfs_args:?}");
    kernel_agrees(&prep, &model);
    kernel_changes_then_we_read(&prep, model);
}

#[test]
fn ext4_1k_two_levels_e2fsck_and_kernel() {
    if !can_mount() {
        return;
    }
    round_trip(
        128,
        &["-t", "ext4", "-b", "1024"],
        &[],
        100_000,
        (10, 50),
        2,
    );
}

#[test]
fn ext4_1k_three_levels_large_dir_e2fsck_and_kernel() {
    if !can_mount() {
        return;
    }
    round_trip(
        256,
        &["-t", "ext4", "-b", "1024", "-O", "large_dir"],
        &[],
        100_000,
        (190, 255),
        3,
    );
}

#[test]
fn ext4_4k_tea_unsigned_without_metadata_csum() {
    if !can_mount() {
        return;
    }
    round_trip(
        128,
        &["-t", "ext4", "-b", "4096", "-O", "^metadata_csum"],
        &[
            &["tune2fs", "-E", "hash_alg=tea"],
            &["debugfs", "-w", "-R", "ssv flags 2"],
        ],
        30_000,
        (1, 255),
        2,
    );
}

#[test]
fn linear_directory_e2fsck_and_kernel() {
    if !can_mount() {
        return;
    }
    round_trip(
        64,
        &["-t", "ext4", "-b", "1024", "-O", "^dir_index"],
        &[],
        4_000,
        (1, 80),
        0,
    );
}

#[test]
fn legacy_collisions_e2fsck_and_kernel() {
    if !can_mount() {
        return;
    }
    let prep = prepare(
        64,
        &["-t", "ext4", "-b", "1024"],
        &[&["tune2fs", "-E", "hash_alg=legacy"]],
    );
    let (_, geo) = read_geometry(&prep.image);
    let version = if geo.hash_unsigned {
        hash_version::LEGACY_UNSIGNED
    } else {
        hash_version::LEGACY
    };
    let pairs = dir_common::colliding_pairs(version, &geo.hash_seed, 1500);
    let files = prep.files.clone();
    let model = write_directory(&prep, move |d, journal| {
        let mut model = Model::new();
        let handle = journal.start(16).unwrap();
        for (index, (a, b)) in pairs.iter().enumerate() {
            for name in [a, b] {
                let file = files[index % files.len()];
                dir::add_entry(d, &handle, name, file, FT_REG_FILE).unwrap();
                model.insert(name.clone(), file);
            }
        }
        handle.stop().unwrap();
        assert!(dir_common::continuation_entries(d) > 0);
        model
    });
    assert_fsck_clean(&prep.image);
    kernel_agrees(&prep, &model);
    kernel_changes_then_we_read(&prep, model);
}
