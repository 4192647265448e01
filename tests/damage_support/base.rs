//! The undamaged images damage is applied to: mke2fs `-d` from a fixed
//! source tree, a fixed hash seed set with debugfs, then `e2fsck -fyD` so
//! that the big directory gets an htree index (two levels under the root
//! at 1 KiB blocks, one at 4 KiB), an xattr block on one file, and every
//! file under `/tree` owned by uid 1000 (not the caller's). Each variant is
//! built once and cached under the target directory (delete
//! `target/tmp/damage-bases` to rebuild; bump `RECIPE_VERSION` when the
//! recipe changes).
//!
//! The tree:
//! - `/big`: `BIG_ENTRIES` empty files with 40-byte names (the htree);
//! - `/tree/small`, `/tree/medium`: 300 and 50,000 bytes;
//! - `/tree/fragmented`: 12 runs of 4 KiB separated by holes, so that
//!   its extent tree has a leaf block (indirect blocks on ext2/3);
//! - `/tree/fast-link`, `/tree/slow-link`: inline and block symlinks;
//! - `/tree/sub/{a,b}`: two small files (the orphans of an orphan chain);
//! - `/tree/names/name-{one,two,three}`: a small linear directory;
//! - `/tree/xattr-a` with a 500-byte `user.big` in an xattr block,
//!   `/tree/xattr-b` without one;
//! - `/tree/empty`: an empty directory (the workload removes it).

use crate::common;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

/// Bump when the recipe changes, so that cached images are rebuilt.
const RECIPE_VERSION: u32 = 2;

pub const BIG_ENTRIES: usize = 5000;
pub const IMAGE_MIB: u64 = 32;
pub const OWNER_UID: u32 = 1000;

/// The mkfs variants damage is applied to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Variant {
    Ext2,
    Ext2NoXattr,
    Ext3,
    Ext4K1,
    Ext4K4,
    /// ext4 without metadata_csum (uninit_bg group checksums): where the
    /// kernel drops a bad htree index instead of refusing the insert.
    Ext4NoCsum,
}

impl Variant {
    pub fn name(self) -> &'static str {
        match self {
            Variant::Ext2 => "ext2-1k",
            Variant::Ext2NoXattr => "ext2-1k-noxattr",
            Variant::Ext3 => "ext3-4k",
            Variant::Ext4K1 => "ext4-1k",
            Variant::Ext4K4 => "ext4-4k",
            Variant::Ext4NoCsum => "ext4-1k-nocsum",
        }
    }

    fn mkfs_args(self) -> &'static [&'static str] {
        match self {
            Variant::Ext2 => &["-t", "ext2", "-b", "1024"],
            Variant::Ext2NoXattr => &["-t", "ext2", "-b", "1024", "-O", "^ext_attr"],
            Variant::Ext3 => &["-t", "ext3", "-b", "4096"],
            Variant::Ext4K1 => &["-t", "ext4", "-b", "1024"],
            Variant::Ext4K4 => &["-t", "ext4", "-b", "4096"],
            Variant::Ext4NoCsum => &["-t", "ext4", "-b", "1024", "-O", "^metadata_csum,uninit_bg"],
        }
    }

    pub fn has_extents(self) -> bool {
        matches!(
            self,
            Variant::Ext4K1 | Variant::Ext4K4 | Variant::Ext4NoCsum
        )
    }

    pub fn has_journal(self) -> bool {
        !matches!(self, Variant::Ext2 | Variant::Ext2NoXattr)
    }

    pub fn has_metadata_csum(self) -> bool {
        matches!(self, Variant::Ext4K1 | Variant::Ext4K4)
    }

    pub fn has_xattrs(self) -> bool {
        self != Variant::Ext2NoXattr
    }

    /// flex_bg: a group's bitmaps and inode table may live in another
    /// group, and the kernel then skips its own-metadata check of the
    /// block bitmap (ext4_valid_block_bitmap).
    pub fn has_flex_bg(self) -> bool {
        self.has_extents()
    }
}

/// The variant's undamaged image (built on first use, then cached).
pub fn image(variant: Variant) -> PathBuf {
    static BUILT: OnceLock<Mutex<HashMap<Variant, PathBuf>>> = OnceLock::new();
    let built = BUILT.get_or_init(|| Mutex::new(HashMap::new()));
    // One builder at a time: two tests wanting the same variant must not
    // both build it, and the machine has few cores anyway.
    let mut built = built
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some(path) = built.get(&variant) {
        return path.clone();
    }
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("damage-bases");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("v{RECIPE_VERSION}-{}.img", variant.name()));
    if !path.exists() {
        build(variant, &dir, &path);
    }
    built.insert(variant, path.clone());
    path
}

/// The name of entry `index` of `/big`: 40 bytes, so that a 1 KiB leaf
/// holds about 20 and the index needs a second level.
pub fn big_name(index: usize) -> String {
    format!("entry-{index:05}-abcdefghijklmnopqrstuvwxyz01")
}

fn build(variant: Variant, dir: &Path, path: &Path) {
    let work = tempfile::tempdir_in(dir).unwrap();
    // mke2fs -d adds names in readdir order: on tmpfs that is the order
    // of creation, the same on every machine (ext4's hash order is not).
    let shm = Path::new("/dev/shm");
    let source_dir = if shm.is_dir() {
        tempfile::tempdir_in(shm).unwrap()
    } else {
        tempfile::tempdir_in(dir).unwrap()
    };
    let source = source_dir.path().join("source");
    write_source_tree(&source);
    let mut args: Vec<&str> = variant.mkfs_args().to_vec();
    let source_str = source.to_str().unwrap();
    args.extend([
        "-U",
        "0b5a3c1e-1111-4222-8333-444455556666",
        "-d",
        source_str,
    ]);
    let image = common::mkfs(work.path(), variant.name(), IMAGE_MIB, &args);
    let image_str = image.to_str().unwrap();
    let mut commands = String::from("ssv hash_seed 0b5a3c1e-aaaa-4bbb-8ccc-ddddeeeeffff\n");
    for name in [
        "small",
        "medium",
        "fragmented",
        "sub/a",
        "sub/b",
        "xattr-a",
        "xattr-b",
        "names/name-one",
        "names/name-two",
        "names/name-three",
    ] {
        commands +=
            &format!("sif /tree/{name} uid {OWNER_UID}\nsif /tree/{name} gid {OWNER_UID}\n");
    }
    if variant.has_xattrs() {
        let value = work.path().join("xattr-value");
        std::fs::write(&value, vec![b'v'; 500]).unwrap();
        commands += &format!("ea_set -f {} /tree/xattr-a user.big\n", value.display());
    }
    common::journal::debugfs_commands(&image, &commands);
    // -D indexes the big directory with the hash seed just set.
    let (code, text) = common::journal::run("e2fsck", &["-fyD", image_str]);
    assert!(
        code <= 1,
        "e2fsck -fyD of the {} base ({code}):\n{text}",
        variant.name()
    );
    common::assert_fsck_clean(&image);
    let partial = path.with_extension("partial");
    std::fs::rename(&image, &partial).unwrap();
    std::fs::rename(&partial, path).unwrap();
}

fn write_source_tree(root: &Path) {
    use std::os::unix::fs::{FileExt, symlink};
    let big = root.join("big");
    let tree = root.join("tree");
    for dir in [
        &big,
        &tree.join("sub"),
        &tree.join("names"),
        &tree.join("empty"),
    ] {
        std::fs::create_dir_all(dir).unwrap();
    }
    for index in 0..BIG_ENTRIES {
        std::fs::File::create(big.join(big_name(index))).unwrap();
    }
    std::fs::write(tree.join("small"), pattern(1, 300)).unwrap();
    std::fs::write(tree.join("medium"), pattern(2, 50_000)).unwrap();
    let fragmented = std::fs::File::create(tree.join("fragmented")).unwrap();
    for run in 0..12u64 {
        fragmented
            .write_all_at(&pattern(10 + run, 4096), run * 2 * 4096)
            .unwrap();
    }
    symlink("small", tree.join("fast-link")).unwrap();
    symlink("x".repeat(200), tree.join("slow-link")).unwrap();
    std::fs::write(tree.join("sub/a"), b"a\n").unwrap();
    std::fs::write(tree.join("sub/b"), b"b\n").unwrap();
    for name in ["name-one", "name-two", "name-three"] {
        std::fs::write(tree.join("names").join(name), name.as_bytes()).unwrap();
    }
    std::fs::write(tree.join("xattr-a"), b"xattr-a\n").unwrap();
    std::fs::write(tree.join("xattr-b"), b"xattr-b\n").unwrap();
}

/// Deterministic bytes for file contents.
pub fn pattern(seed: u64, length: usize) -> Vec<u8> {
    let mut rng = jext4::engine::rng::Rng::new(seed);
    rng.bytes(length)
}
