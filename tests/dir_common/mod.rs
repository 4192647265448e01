//! Helpers for the directory tests: a `DirBlocks` over a buffer cache with a
//! logical→physical map, image reading (superblock, descriptors, inodes),
//! and kernel loop mounts.
#![allow(dead_code)]

#[path = "../common/skip.rs"]
mod skip;

use jext4::engine::cache::{Buffer, BufferCache};
use jext4::engine::dev::{BlockDevice, MemoryDevice};
use jext4::engine::format::Geometry;
use jext4::engine::format::dir::{self, DirBlocks, DirEntry};
use jext4::engine::format::group_desc::GroupDesc;
use jext4::engine::format::inode::Inode;
use jext4::engine::format::superblock::Superblock;
use jext4::engine::journal::{Handle, Journal, JournalConfig};
use jext4::{Error, Result};
use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

/// A directory for the tests: blocks mapped through `map`, new blocks from
/// `alloc`.
pub struct TestDir {
    pub geo: Geometry,
    pub cache: Arc<BufferCache>,
    pub ino: u32,
    pub seed: u32,
    pub map: Vec<u64>,
    pub indexed: bool,
    pub alloc: Box<dyn FnMut() -> Option<u64>>,
    /// Where the htree code first found the index damaged (the engine
    /// keeps this per mount).
    pub index_damaged: Option<jext4::Location>,
    /// What listings left out (the engine reports these once a listing
    /// is done).
    pub bad_entries: Vec<jext4::engine::format::dir::BadEntry>,
}

impl DirBlocks for TestDir {
    fn geo(&self) -> &Geometry {
        &self.geo
    }
    fn cache(&self) -> &BufferCache {
        &self.cache
    }
    fn dir_ino(&self) -> u32 {
        self.ino
    }
    fn csum_seed(&self) -> u32 {
        self.seed
    }
    fn block_count(&self) -> u64 {
        self.map.len() as u64
    }
    fn read_block(&mut self, lblk: u64) -> Result<Arc<Buffer>> {
        let physical = *self
            .map
            .get(lblk as usize)
            .ok_or_else(|| Error::Invalid(format!("lblk {lblk} not mapped")))?;
        self.cache.read(physical)
    }
    fn append_block(&mut self, handle: &Handle<'_>) -> Result<(u64, Arc<Buffer>)> {
        let physical = (self.alloc)().ok_or(Error::NoSpace)?;
        let buffer = self.cache.get_for_overwrite(physical)?;
        {
            let mut data = handle.get_create_access(&buffer)?;
            data.fill(0);
        }
        self.map.push(physical);
        Ok((self.map.len() as u64 - 1, buffer))
    }
    fn append_cost(&mut self, _blocks: u32) -> Result<u64> {
        Ok(0) // blocks come from a plain list, no mapping
    }
    fn is_indexed(&self) -> bool {
        self.indexed
    }
    fn is_casefolded(&self) -> bool {
        false
    }
    fn is_encrypted(&self) -> bool {
        false
    }
    fn set_indexed(&mut self, indexed: bool) {
        self.indexed = indexed;
    }
    fn index_damaged(&self) -> bool {
        self.index_damaged.is_some()
    }
    fn note_index_damaged(&mut self, why: &Error) {
        if let Error::Corrupt { location, .. } = why {
            self.index_damaged.get_or_insert(*location);
        }
    }
    fn note_bad_entry(&mut self, bad: jext4::engine::format::dir::BadEntry) {
        self.bad_entries.push(bad);
    }
    fn leaf_ranges(&self) -> Option<Arc<jext4::engine::format::htree::LeafRanges>> {
        None // built again for every lookup: tests see the slow path too
    }
    fn keep_leaf_ranges(&mut self, _ranges: Arc<jext4::engine::format::htree::LeafRanges>) {}
}

/// Superblock and geometry of an image file.
pub fn read_geometry(image: &Path) -> (Superblock, Geometry) {
    let bytes = std::fs::read(image).unwrap();
    let sb = Superblock::decode(&bytes[1024..2048]).unwrap();
    let geo = Geometry::from_superblock(&sb);
    (sb, geo)
}

/// Geometry of a fresh mke2fs image made with `args` (the image is thrown
/// away): real feature sets for memory-only tests.
pub fn geometry_for(args: &[&str], size_mib: u64) -> Geometry {
    let dir = tempfile::tempdir().unwrap();
    let image = mkfs(dir.path(), "geo", size_mib, args);
    read_geometry(&image).1
}

pub fn mkfs(dir: &Path, name: &str, size_mib: u64, args: &[&str]) -> PathBuf {
    let path = dir.join(format!("{name}.img"));
    let file = std::fs::File::create(&path).unwrap();
    file.set_len(size_mib << 20).unwrap();
    drop(file);
    let output = Command::new("mke2fs")
        .args(["-q", "-F", "-E", "root_owner=0:0"])
        .args(args)
        .arg(&path)
        .output()
        .expect("running mke2fs");
    assert!(
        output.status.success(),
        "mke2fs {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    path
}

pub fn run(program: &str, args: &[&str]) -> String {
    let output = Command::new(program).args(args).output().unwrap();
    assert!(
        output.status.success(),
        "{program} {args:?}: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Whether this process may loop-mount images (root, a kernel with ext4).
pub fn can_mount() -> bool {
    let dir = tempfile::tempdir().unwrap();
    let image = mkfs(dir.path(), "probe", 8, &["-t", "ext4"]);
    let mount_point = dir.path().join("mnt");
    std::fs::create_dir(&mount_point).unwrap();
    let mounted = Command::new("mount")
        .args(["-o", "loop"])
        .arg(&image)
        .arg(&mount_point)
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if mounted {
        run("umount", &[mount_point.to_str().unwrap()]);
    } else {
        skip::skip("cannot loop-mount images here");
    }
    mounted
}

/// A loop mount that unmounts when dropped.
pub struct Mount {
    pub point: PathBuf,
}

impl Mount {
    pub fn new(image: &Path, point: &Path, read_only: bool) -> Self {
        std::fs::create_dir_all(point).unwrap();
        let options = if read_only { "loop,ro" } else { "loop" };
        run(
            "mount",
            &[
                "-o",
                options,
                image.to_str().unwrap(),
                point.to_str().unwrap(),
            ],
        );
        Mount {
            point: point.to_path_buf(),
        }
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.point).status();
    }
}

/// Group descriptors of an image held in memory.
pub fn group_descs(geo: &Geometry, image: &[u8]) -> Vec<GroupDesc> {
    let bs = geo.block_size as usize;
    (0..geo.group_count)
        .map(|group| {
            let (block, offset) = geo.group_desc_location(group);
            let at = block as usize * bs + offset;
            GroupDesc::decode(geo, group, &image[at..at + geo.desc_size as usize]).unwrap()
        })
        .collect()
}

/// Byte offset of inode `ino` in the image.
pub fn inode_offset(geo: &Geometry, descs: &[GroupDesc], ino: u32) -> usize {
    let group = geo.group_of_inode(ino) as usize;
    let index = geo.inode_index_in_group(ino) as usize;
    descs[group].inode_table as usize * geo.block_size as usize + index * geo.inode_size as usize
}

pub fn read_inode(geo: &Geometry, image: &[u8], ino: u32) -> Inode {
    let descs = group_descs(geo, image);
    let at = inode_offset(geo, &descs, ino);
    Inode::decode(geo, ino, &image[at..at + geo.inode_size as usize]).unwrap()
}

/// Physical blocks of an inode in logical order, from the ranges `debugfs
/// stat` prints ("(0-11):4385-4396, (IND):4397, (12):5000"); indirect and
/// extent-tree blocks are skipped.
pub fn debugfs_blocks(image: &Path, ino: u32) -> Vec<u64> {
    let out = run(
        "debugfs",
        &["-R", &format!("stat <{ino}>"), image.to_str().unwrap()],
    );
    let ranges = out
        .split_once("BLOCKS:\n")
        .or_else(|| out.split_once("EXTENTS:\n"))
        .map(|(_, rest)| rest.lines().next().unwrap_or(""))
        .unwrap_or("");
    let mut map = Vec::new();
    for range in ranges.split(", ") {
        let Some((logical, physical)) = range.trim().split_once("):") else {
            continue;
        };
        let logical = logical.trim_start_matches('(');
        if !logical.starts_with(|c: char| c.is_ascii_digit()) {
            continue; // (IND), (DIND), (TIND), (ETB0)...
        }
        let first_logical: u64 = logical.split('-').next().unwrap().parse().unwrap();
        assert_eq!(first_logical, map.len() as u64, "hole in inode {ino}");
        let physical = physical.split_whitespace().next().unwrap();
        let (start, end) = match physical.split_once('-') {
            Some((a, b)) => (a.parse::<u64>().unwrap(), b.parse::<u64>().unwrap()),
            None => (physical.parse().unwrap(), physical.parse().unwrap()),
        };
        map.extend(start..=end);
    }
    map
}

/// A read-only `TestDir` over a whole image file held in memory.
pub fn image_dir(image: &Path, ino: u32) -> TestDir {
    let bytes = std::fs::read(image).unwrap();
    let (_, geo) = read_geometry(image);
    let inode = read_inode(&geo, &bytes, ino);
    let map = debugfs_blocks(image, ino);
    assert_eq!(
        map.len() as u64 * geo.block_size as u64,
        inode.size,
        "directory {ino} has holes or tail blocks"
    );
    let dev: Arc<dyn BlockDevice> = Arc::new(MemoryDevice::from_bytes(bytes));
    let cache = Arc::new(BufferCache::new(dev, geo.block_size as usize, 256 << 20));
    TestDir {
        seed: inode.csum_seed(&geo, ino),
        indexed: inode.has_flag(jext4::engine::format::inode::flags::INDEX),
        geo,
        cache,
        ino,
        map,
        alloc: Box::new(|| None),
        index_damaged: None,
        bad_entries: Vec::new(),
    }
}

/// Everything `read_entries` lists from the start, with the cookies given.
pub fn list_all(d: &mut dyn DirBlocks) -> Vec<(DirEntry, u64)> {
    let mut out = Vec::new();
    dir::read_entries(d, 0, &mut |entry, cookie| {
        out.push((entry.clone(), cookie));
        true
    })
    .unwrap();
    out
}

/// List the directory in chunks of `chunk` entries, resuming from cookies;
/// `between` runs after each chunk (to change the directory meanwhile).
pub fn list_in_chunks(
    d: &mut TestDir,
    chunk: usize,
    mut between: impl FnMut(&mut TestDir),
) -> Vec<DirEntry> {
    let mut out = Vec::new();
    let mut cookie = 0;
    loop {
        let mut taken = 0;
        let mut last = None;
        dir::read_entries(d, cookie, &mut |entry, next| {
            if taken == chunk {
                return false;
            }
            taken += 1;
            out.push(entry.clone());
            last = Some(next);
            true
        })
        .unwrap();
        match last {
            Some(next) if taken == chunk => cookie = next,
            Some(_) | None => return out,
        }
        between(d);
    }
}

/// Check listing = model (names → inode) and cookies distinct.
pub fn assert_listing(d: &mut dyn DirBlocks, model: &BTreeMap<Vec<u8>, u32>, parent: u32) {
    let listed = list_all(d);
    let cookies: HashSet<u64> = listed.iter().map(|(_, c)| *c).collect();
    assert_eq!(cookies.len(), listed.len(), "duplicate cookies");
    assert!(!cookies.contains(&0), "cookie 0 handed out");
    let mut seen = BTreeMap::new();
    for (entry, _) in &listed {
        let previous = seen.insert(entry.name.clone(), entry.ino);
        assert!(
            previous.is_none(),
            "{:?} listed twice",
            String::from_utf8_lossy(&entry.name)
        );
    }
    assert_eq!(seen.remove(b".".as_slice()), Some(d.dir_ino()));
    assert_eq!(seen.remove(b"..".as_slice()), Some(parent));
    assert_eq!(seen.len(), model.len(), "listed count");
    assert!(seen == *model, "listing differs from the model");
}

/// A memory-backed environment: a device of `blocks` blocks, a cache and a
/// write-back journal, and a `TestDir` allocating blocks from 1 upward.
pub struct MemEnv {
    pub dev: Arc<MemoryDevice>,
    pub cache: Arc<BufferCache>,
    pub journal: Arc<Journal>,
}

impl MemEnv {
    pub fn new(geo: &Geometry, blocks: u64) -> Self {
        let dev = Arc::new(MemoryDevice::new((blocks * geo.block_size as u64) as usize));
        let cache = Arc::new(BufferCache::new(
            dev.clone(),
            geo.block_size as usize,
            512 << 20,
        ));
        let journal = Journal::write_back(cache.clone(), JournalConfig::default(), false);
        MemEnv {
            dev,
            cache,
            journal,
        }
    }

    pub fn dir(&self, geo: &Geometry, ino: u32, seed: u32, blocks: u64) -> TestDir {
        let mut next = 1u64;
        TestDir {
            geo: geo.clone(),
            cache: self.cache.clone(),
            ino,
            seed,
            map: Vec::new(),
            indexed: false,
            alloc: Box::new(move || {
                (next < blocks).then(|| {
                    next += 1;
                    next - 1
                })
            }),
            index_damaged: None,
            bad_entries: Vec::new(),
        }
    }
}

impl Drop for MemEnv {
    fn drop(&mut self) {
        let _ = self.journal.shutdown();
    }
}

/// The crate's seeded generator (SplitMix64), so failures replay.
pub use jext4::engine::rng::Rng;

/// A unique name: `tag` in hex, then letters, digits and some high bytes
/// (where signed and unsigned hashes differ) up to `len` bytes. Never '/',
/// NUL, "." or "..".
pub fn random_name(rng: &mut Rng, len: usize, tag: u64) -> Vec<u8> {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-";
    let mut name = format!("{tag:x}-").into_bytes();
    while name.len() < len {
        let pick = rng.below(80) as usize;
        name.push(if pick < ALPHABET.len() {
            ALPHABET[pick]
        } else {
            0x80 + rng.below(0x80) as u8
        });
    }
    name
}

pub fn can_run(tool: &str) -> bool {
    let found = Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {tool}"))
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    found || skip::skip(&format!("{tool} is not installed"))
}

/// Pairs of distinct names with equal major hash under `version` (found by
/// brute force: among n names about n²/2^32 pairs collide in 31 bits).
pub fn colliding_pairs(version: u8, seed: &[u32; 4], wanted: usize) -> Vec<(Vec<u8>, Vec<u8>)> {
    use jext4::engine::format::htree::name_hash;
    let mut pairs = Vec::new();
    let mut start = 0u64;
    while pairs.len() < wanted {
        let batch = 1u64 << 21;
        let mut hashes: Vec<(u32, u64)> = (start..start + batch)
            .map(|i| {
                let name = format!("c{i:x}");
                (name_hash(version, seed, name.as_bytes()).unwrap().major, i)
            })
            .collect();
        hashes.sort_unstable();
        let mut index = 1;
        while index < hashes.len() && pairs.len() < wanted {
            if hashes[index].0 == hashes[index - 1].0 {
                let a = format!("c{:x}", hashes[index - 1].1).into_bytes();
                let b = format!("c{:x}", hashes[index].1).into_bytes();
                pairs.push((a, b));
                index += 2;
            } else {
                index += 1;
            }
        }
        start += batch;
    }
    pairs
}

/// Index entries with the continuation bit, over all index blocks of an
/// htree directory (read straight from the blocks, layout per namei.c).
pub fn continuation_entries(d: &mut TestDir) -> usize {
    let bs = d.geo.block_size as usize;
    let mut found = 0;
    for lblk in 0..d.map.len() as u64 {
        let buffer = d.read_block(lblk).unwrap();
        let block = buffer.read();
        let rec_len = u16::from_le_bytes([block[4], block[5]]) as usize;
        let inode = u32::from_le_bytes(block[0..4].try_into().unwrap());
        let base = match lblk {
            0 => 32,
            _ if inode == 0 && rec_len == bs => 8,
            _ => continue,
        };
        let count = u16::from_le_bytes([block[base + 2], block[base + 3]]) as usize;
        for index in 1..count {
            let at = base + index * 8;
            found += (block[at] & 1) as usize;
        }
    }
    found
}
