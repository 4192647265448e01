//! Cross-checks against the real tools. A file written by `debugfs` on a
//! mke2fs image is read with our code, then extended, converted and
//! punched with it (extent trees up to depth 2, unwritten extents, all four
//! block-map levels), its inode written back through the cache and a handle
//! and the image synced. Then:
//! - `debugfs -R "ex f"` / `"stat f"` must list exactly the extents, tree
//!   blocks, data blocks and indirect blocks our walk reports;
//! - `e2fsck -fn` must be clean (the test allocator keeps bitmaps, group
//!   descriptors and free counts right, so the whole verdict counts);
//! - a read-only kernel mount must read our data where we mapped it and
//!   zeros in holes and unwritten extents (skipped where mounting fails);
//! - truncating to zero with our code leaves an e2fsck-clean image.

mod common;
mod mapping_support;

use jext4::engine::format::extent;
use jext4::engine::format::inode::Inode;
use jext4::engine::format::mapping::{self, Lookup};
use mapping_support::{Image, TestAllocator, Walk, check_invariants, with_ctx};
use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::Command;

fn debugfs(image: &Path, request: &str, write: bool) -> String {
    let mut command = Command::new("debugfs");
    if write {
        command.arg("-w");
    }
    let output = command
        .args(["-R", request])
        .arg(image)
        .output()
        .expect("running debugfs");
    assert!(output.status.success(), "debugfs {request}: {output:?}");
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// The inode number of `/f`.
fn inode_of_f(image: &Path) -> u32 {
    let stat = debugfs(image, "stat f", false);
    let field = stat
        .split_whitespace()
        .skip_while(|w| *w != "Inode:")
        .nth(1);
    field.expect("stat prints the inode").parse().unwrap()
}

/// One extent as `debugfs ex` lists it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Listed {
    logical: u64,
    physical: u64,
    len: u64,
    unwritten: bool,
}

/// Leaf extents and tree blocks (children of index entries) from
/// `debugfs -R "ex f"`.
fn parse_ex(text: &str) -> (Vec<Listed>, BTreeSet<u64>) {
    let mut leaves = Vec::new();
    let mut tree_blocks = BTreeSet::new();
    for line in text.lines().skip_while(|l| !l.starts_with("Level")).skip(1) {
        let spaced = line.replace('/', " / ").replace('-', " - ");
        let words: Vec<&str> = spaced.split_whitespace().collect();
        // level / max entry / entries lstart - lend pstart [- pend] len [flags]
        let number = |i: usize| words[i].parse::<u64>().unwrap();
        let (level, max_level) = (number(0), number(2));
        let physical = number(9);
        if level < max_level {
            tree_blocks.insert(physical);
            continue;
        }
        assert_eq!(words[10], "-", "leaf line {line:?}");
        leaves.push(Listed {
            logical: number(6),
            physical,
            len: number(12),
            unwritten: words.get(13) == Some(&"Uninit"),
        });
    }
    (leaves, tree_blocks)
}

/// Data blocks per logical block and indirect blocks from the BLOCKS part
/// of `debugfs -R "stat f"`: "(0-11):100-111, (IND):112, (12):113, ...".
fn parse_blocks(text: &str) -> (BTreeMap<u64, u64>, BTreeSet<u64>) {
    let list = text.split("BLOCKS:").nth(1).unwrap_or("");
    let list = list.split("TOTAL:").next().unwrap();
    let mut data = BTreeMap::new();
    let mut indirect = BTreeSet::new();
    for item in list.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        let (logical, physical) = item.split_once("):").unwrap();
        let logical = logical.trim_start_matches('(');
        let range = |s: &str| -> (u64, u64) {
            match s.split_once('-') {
                Some((a, b)) => (a.parse().unwrap(), b.parse().unwrap()),
                None => (s.parse().unwrap(), s.parse().unwrap()),
            }
        };
        if logical.ends_with("IND") {
            indirect.insert(physical.parse().unwrap());
            continue;
        }
        let ((l0, l1), (p0, p1)) = (range(logical), range(physical));
        assert_eq!(l1 - l0, p1 - p0, "{item}");
        for i in 0..=l1 - l0 {
            data.insert(l0 + i, p0 + i);
        }
    }
    (data, indirect)
}

/// What each logical block of the file must read as.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Content {
    /// The original block `n` of /etc/services.
    Original(u64),
    /// The pattern we wrote at this logical block.
    Pattern,
    Zero,
}

fn pattern(lblk: u64, block_size: usize) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(block_size);
    while bytes.len() < block_size {
        bytes.extend_from_slice(&(lblk * 0x9E37_79B9 + 1).to_le_bytes());
    }
    bytes
}

struct Session {
    path: std::path::PathBuf,
    image: Image,
    alloc: TestAllocator,
    ino: u32,
    inode: Inode,
    /// Expected content of every logical block we care about.
    content: BTreeMap<u64, Content>,
}

impl Session {
    fn open(path: &Path) -> Session {
        let ino = inode_of_f(path);
        let image = Image::file(path);
        let mut alloc = TestAllocator::persistent(&image);
        let inode = image.read_inode(ino);
        let walk = mapping_support::walk(&image, ino, &inode).unwrap();
        alloc.adopt(
            walk.data
                .values()
                .map(|(physical, _)| *physical)
                .chain(walk.meta),
        );
        let blocks = inode.size.div_ceil(image.geo.block_size as u64);
        let content = (0..blocks).map(|b| (b, Content::Original(b))).collect();
        Session {
            path: path.to_path_buf(),
            image,
            alloc,
            ino,
            inode,
            content,
        }
    }

    fn bs(&self) -> u64 {
        self.image.geo.block_size as u64
    }

    /// Allocate [lblk, lblk + len) (caller loop) and write the pattern into
    /// every written block, straight to the device like file data.
    fn allocate(&mut self, lblk: u64, len: u64, unwritten: bool) {
        let mut cursor = lblk;
        while cursor < lblk + len {
            if let Lookup::Mapped(found) = self.lookup(cursor) {
                cursor = found.end();
                continue;
            }
            let want = (lblk + len - cursor) as u32;
            let got = with_ctx(&self.image, &mut self.alloc, |ctx| {
                mapping::allocate(ctx, self.ino, &mut self.inode, cursor, want, 0, unwritten)
            })
            .unwrap();
            for i in 0..got.len as u64 {
                let state = if unwritten {
                    Content::Zero
                } else {
                    Content::Pattern
                };
                self.content.insert(got.logical + i, state);
                let bytes = pattern(got.logical + i, self.bs() as usize);
                self.image
                    .dev
                    .write_at((got.physical + i) * self.bs(), &bytes)
                    .unwrap();
            }
            cursor = got.end();
        }
    }

    /// Blocks being converted hold our pattern from now on.
    fn mark_written(&mut self, lblk: u64, len: u64) {
        for l in lblk..lblk + len {
            if let Lookup::Mapped(found) = self.lookup(l) {
                let bytes = pattern(l, self.bs() as usize);
                self.image
                    .dev
                    .write_at(found.physical * self.bs(), &bytes)
                    .unwrap();
                self.content.insert(l, Content::Pattern);
            }
        }
        with_ctx(&self.image, &mut self.alloc, |ctx| {
            mapping::mark_written(ctx, self.ino, &mut self.inode, lblk, len)
        })
        .unwrap();
    }

    fn punch(&mut self, start: u64, end: Option<u64>) {
        with_ctx(&self.image, &mut self.alloc, |ctx| {
            mapping::punch(ctx, self.ino, &mut self.inode, start, end)
        })
        .unwrap();
        let end = end.unwrap_or(u64::MAX);
        for (_, state) in self.content.range_mut(start..end) {
            *state = Content::Zero;
        }
    }

    fn lookup(&self, lblk: u64) -> Lookup {
        mapping::lookup(
            &self.image.geo,
            &self.image.cache,
            self.ino,
            &self.inode,
            lblk,
        )
        .unwrap()
    }

    /// Set the size, write the inode home and close the image.
    fn finish(self, size: u64) -> (std::path::PathBuf, Walk, BTreeMap<u64, Content>) {
        let mut inode = self.inode.clone();
        inode.size = size;
        let walk = check_invariants(&self.image, &self.alloc, self.ino, &inode);
        let handle = self.image.journal.start(4).unwrap();
        self.image.write_inode(&handle, self.ino, &inode);
        handle.stop().unwrap();
        self.image.close();
        (self.path, walk, self.content)
    }
}

/// e2fsck -fn exits 0 and says nothing beyond its pass headers and summary.
fn assert_fsck_clean(path: &Path, when: &str) {
    assert_fsck_clean_but(path, when, &[]);
}

/// The same, tolerating lines that contain one of `hints` (e2fsck's
/// "could be narrower/shallower" suggestions, which are no errors and do
/// not change its exit code).
fn assert_fsck_clean_but(path: &Path, when: &str, hints: &[&str]) {
    let (code, text) = common::fsck(path);
    assert_eq!(code, 0, "e2fsck -fn {when}:\n{text}");
    let complaints: Vec<&str> = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .filter(|l| !hints.iter().any(|hint| l.contains(hint)))
        .filter(|l| !l.starts_with("Pass ") && !l.contains(" files (") && !l.starts_with("e2fsck "))
        .collect();
    assert!(complaints.is_empty(), "e2fsck -fn {when} said:\n{text}");
}

/// Read the file through a read-only kernel mount and compare every block
/// we know about. Returns false (and says so) where mounting is impossible.
fn kernel_reads(path: &Path, content: &BTreeMap<u64, Content>, size: u64, bs: u64) -> bool {
    let mountpoint = tempfile::tempdir().unwrap();
    let mounted = Command::new("mount")
        .args(["-o", "ro,loop"])
        .arg(path)
        .arg(mountpoint.path())
        .output();
    match mounted {
        Ok(output) if output.status.success() => {}
        other => return common::skip(&format!("kernel read: mount failed: {other:?}")),
    }
    let result = std::panic::catch_unwind(|| {
        let file = std::fs::File::open(mountpoint.path().join("f")).unwrap();
        assert_eq!(file.metadata().unwrap().len(), size);
        let original = std::fs::read("/etc/services").unwrap();
        for (&lblk, &state) in content {
            let offset = lblk * bs;
            if offset >= size {
                continue;
            }
            let len = bs.min(size - offset) as usize;
            let mut got = vec![0u8; len];
            file.read_exact_at(&mut got, offset).unwrap();
            let expected = match state {
                Content::Zero => vec![0; len],
                Content::Pattern => pattern(lblk, bs as usize)[..len].to_vec(),
                Content::Original(n) => {
                    let start = (n * bs) as usize;
                    let mut bytes = original
                        [start.min(original.len())..(start + len).min(original.len())]
                        .to_vec();
                    bytes.resize(len, 0);
                    bytes
                }
            };
            assert!(
                got == expected,
                "kernel read of logical block {lblk} ({state:?}) differs"
            );
        }
    });
    common::kernel_umount(mountpoint.path());
    if let Err(panic) = result {
        std::panic::resume_unwind(panic);
    }
    true
}

/// A fresh image holding /etc/services as `/f`, written by debugfs.
fn image_with_file(dir: &Path, name: &str, args: &[&str]) -> std::path::PathBuf {
    let path = common::mkfs(dir, name, 64, args);
    debugfs(&path, "write /etc/services f", true);
    assert_fsck_clean(&path, "after debugfs write");
    path
}

fn extent_tree_round_trip(name: &str, args: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let path = image_with_file(dir.path(), name, args);
    let before = parse_ex(&debugfs(&path, "ex f", false));
    let mut session = Session::open(&path);
    assert!(session.inode.uses_extents());
    // debugfs' tree reads the same through our lookup.
    for listed in &before.0 {
        let found = session.lookup(listed.logical);
        assert!(
            matches!(found, Lookup::Mapped(e) if e.physical == listed.physical && e.len as u64 == listed.len),
            "{listed:?} vs {found:?}"
        );
    }
    // One-block extents scattered on disk until the tree has depth 2.
    session.alloc.scatter = true;
    let mut count = 0;
    while extent::depth(&session.inode) < 2 || count % 50 != 0 {
        session.allocate(20 + 2 * count, 1, false);
        count += 1;
    }
    session.alloc.scatter = false;
    let unwritten_at = 20 + 2 * count + 100;
    session.allocate(unwritten_at, 50, true);
    session.mark_written(unwritten_at + 10, 10);
    let far = 200_000;
    session.allocate(far, 8, false);
    // Preallocated beyond the end of file, as fallocate(KEEP_SIZE) does.
    session.allocate(far + 100, 5, true);
    session.punch(40, Some(60));
    session.punch(unwritten_at + 15, Some(unwritten_at + 16));
    session.punch(5, Some(7));
    let size = (far + 8) * session.bs();
    let (path, walk, content) = session.finish(size);

    let (leaves, tree_blocks) = parse_ex(&debugfs(&path, "ex f", false));
    let ours: Vec<Listed> = walk
        .runs
        .iter()
        .map(|r| Listed {
            logical: r.logical,
            physical: r.physical,
            len: r.len as u64,
            unwritten: r.unwritten,
        })
        .collect();
    assert_eq!(leaves, ours, "debugfs ex leaves");
    assert_eq!(
        tree_blocks,
        walk.meta.iter().copied().collect(),
        "tree blocks"
    );
    assert!(walk.meta.len() > 4, "depth 2 needs several tree blocks");
    assert_fsck_clean(&path, "after extending and punching");
    kernel_reads(&path, &content, size, walk_block_size(&path));

    // Truncate to zero with our code: e2fsck-clean, nothing left.
    let mut session = Session::open(&path);
    session.punch(0, None);
    assert_eq!(session.inode.blocks, 0);
    assert_eq!(extent::depth(&session.inode), 0);
    let (path, walk, _) = session.finish(0);
    assert_eq!(walk.blocks(), 0);
    assert_fsck_clean(&path, "after truncating to zero");
    assert!(debugfs(&path, "stat f", false).contains("Blockcount: 0"));
}

fn walk_block_size(path: &Path) -> u64 {
    let stats = debugfs(path, "stats", false);
    let field = stats.split("Block size:").nth(1).unwrap();
    field.split_whitespace().next().unwrap().parse().unwrap()
}

fn block_map_round_trip(name: &str, args: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let path = image_with_file(dir.path(), name, args);
    let (before, _) = parse_blocks(&debugfs(&path, "stat f", false));
    let mut session = Session::open(&path);
    assert!(!session.inode.uses_extents());
    for (&lblk, &physical) in &before {
        assert!(matches!(session.lookup(lblk), Lookup::Mapped(e) if e.physical == physical));
    }
    let per = session.bs() / 4;
    let dind = 12 + per;
    let tind = dind + per * per;
    let last_original = before.keys().last().copied().unwrap();
    session.allocate(last_original + 3, 20, false);
    session.allocate(dind + 5, 2 * per, false);
    session.allocate(tind + per * per + 7, 3, false);
    session.allocate(tind + 2 * per * per - 2, 4, false);
    session.punch(2, Some(4));
    session.punch(dind + 5 + per - 3, Some(dind + 5 + per + 2));
    let end = tind + 2 * per * per + 2;
    let size = end * session.bs() - 100;
    let (path, walk, content) = session.finish(size);

    let (data, indirect) = parse_blocks(&debugfs(&path, "stat f", false));
    let ours: BTreeMap<u64, u64> = walk.data.iter().map(|(l, (p, _))| (*l, *p)).collect();
    assert_eq!(data, ours, "debugfs data blocks");
    assert_eq!(
        indirect,
        walk.meta.iter().copied().collect(),
        "indirect blocks"
    );
    assert_fsck_clean(&path, "after extending and punching");
    kernel_reads(&path, &content, size, walk_block_size(&path));

    let mut session = Session::open(&path);
    session.punch(0, None);
    assert_eq!(session.inode.blocks, 0);
    assert!(session.inode.block.iter().all(|&b| b == 0));
    let (path, _, _) = session.finish(0);
    assert_fsck_clean(&path, "after truncating to zero");
}

#[test]
fn extent_trees_agree_with_debugfs_e2fsck_and_kernel_1k() {
    if common::require_tool("debugfs") && common::require_tool("e2fsck") {
        extent_tree_round_trip("tools-ext4-1k", &["-t", "ext4", "-b", "1024"]);
    }
}

#[test]
fn extent_trees_agree_with_debugfs_e2fsck_and_kernel_4k() {
    if common::require_tool("debugfs") && common::require_tool("e2fsck") {
        extent_tree_round_trip("tools-ext4-4k", &["-t", "ext4", "-b", "4096"]);
    }
}

#[test]
fn block_maps_agree_with_debugfs_e2fsck_and_kernel_ext2_1k() {
    if common::require_tool("debugfs") && common::require_tool("e2fsck") {
        block_map_round_trip("tools-ext2-1k", &["-t", "ext2", "-b", "1024"]);
    }
}

#[test]
fn block_maps_agree_with_debugfs_e2fsck_and_kernel_ext3_4k() {
    if common::require_tool("debugfs") && common::require_tool("e2fsck") {
        block_map_round_trip("tools-ext3-4k", &["-t", "ext3", "-b", "4096"]);
    }
}

/// Run `mount` with `args`; false (and a SKIP line) where it cannot.
fn mount(args: &[&str], image: &Path, mountpoint: &Path) -> bool {
    let output = Command::new("mount")
        .args(args)
        .arg(image)
        .arg(mountpoint)
        .output();
    match output {
        Ok(output) if output.status.success() => true,
        other => common::skip(&format!("mount failed: {other:?}")),
    }
}

/// A tree the kernel built (depth 2 from scattered one-block writes) is
/// read exactly as debugfs lists it, then punched by our code and still
/// passes e2fsck and reads back through the kernel.
#[test]
fn kernel_made_extent_tree_is_read_and_punched() {
    if !common::require_tool("debugfs") || !common::require_tool("e2fsck") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = common::mkfs(dir.path(), "kernel-tree", 64, &["-t", "ext4", "-b", "1024"]);
    let mountpoint = tempfile::tempdir().unwrap();
    if !mount(&["-o", "loop"], &path, mountpoint.path()) {
        return;
    }
    let bs = 1024u64;
    let count = 500u64;
    {
        let file = std::fs::File::create(mountpoint.path().join("f")).unwrap();
        for i in 0..count {
            file.write_all_at(&pattern(2 * i, bs as usize), 2 * i * bs)
                .unwrap();
            if i % 16 == 0 {
                // Allocate as we go, so blocks do not coalesce physically.
                file.sync_data().unwrap();
            }
        }
        file.sync_all().unwrap();
    }
    common::kernel_umount(mountpoint.path());
    assert_fsck_clean(&path, "after the kernel wrote");

    let (leaves, tree_blocks) = parse_ex(&debugfs(&path, "ex f", false));
    let mut session = Session::open(&path);
    assert!(
        extent::depth(&session.inode) >= 1,
        "the kernel built a tree"
    );
    let walk = check_invariants(&session.image, &session.alloc, session.ino, &session.inode);
    let ours: Vec<Listed> = walk
        .runs
        .iter()
        .map(|r| Listed {
            logical: r.logical,
            physical: r.physical,
            len: r.len as u64,
            unwritten: r.unwritten,
        })
        .collect();
    assert_eq!(ours, leaves, "kernel tree leaves");
    assert_eq!(
        walk.meta.iter().copied().collect::<BTreeSet<u64>>(),
        tree_blocks
    );
    session.content = (0..2 * count)
        .map(|l| {
            (
                l,
                if l % 2 == 0 {
                    Content::Pattern
                } else {
                    Content::Zero
                },
            )
        })
        .collect();
    session.punch(100, Some(300));
    session.punch(501, Some(502));
    session.allocate(301, 40, false);
    session.punch(700, None);
    let size = 700 * bs;
    let (path, walk, content) = session.finish(size);
    let (leaves, tree_blocks) = parse_ex(&debugfs(&path, "ex f", false));
    assert_eq!(leaves.len(), walk.runs.len());
    assert_eq!(tree_blocks, walk.meta.iter().copied().collect());
    // Punching a hole in the kernel's full leaves leaves them sparse, which
    // e2fsck suggests compacting, exactly as after the kernel's own punch.
    assert_fsck_clean_but(
        &path,
        "after punching the kernel's tree",
        &["could be narrower"],
    );
    kernel_reads(&path, &content, size, bs);
}

/// One random step for the e2fsck property below.
#[derive(Debug, Clone)]
enum Step {
    Allocate {
        lblk: u64,
        len: u64,
        unwritten: bool,
    },
    Punch {
        lblk: u64,
        len: u64,
    },
    MarkWritten {
        lblk: u64,
        len: u64,
    },
}

fn step() -> impl proptest::strategy::Strategy<Value = Step> {
    use proptest::prelude::*;
    let lblk = prop_oneof![4 => 0u64..3000, 1 => 100_000u64..100_100];
    prop_oneof![
        4 => (lblk.clone(), 1u64..64, any::<bool>())
            .prop_map(|(lblk, len, unwritten)| Step::Allocate { lblk, len, unwritten }),
        2 => (lblk.clone(), 1u64..400).prop_map(|(lblk, len)| Step::Punch { lblk, len }),
        1 => (lblk, 1u64..200).prop_map(|(lblk, len)| Step::MarkWritten { lblk, len }),
    ]
}

/// Random trees of either scheme, written into a real image, pass e2fsck
/// (whose only tolerated remarks are its tree-shape suggestions, printed
/// here when they occur) and read back through debugfs as we see them.
fn random_steps_pass_e2fsck(extents: bool, scatter: bool, steps: Vec<Step>) {
    let dir = tempfile::tempdir().unwrap();
    let args: &[&str] = if extents {
        &["-t", "ext4", "-b", "1024"]
    } else {
        &["-t", "ext3", "-b", "1024"]
    };
    let path = image_with_file(dir.path(), "random", args);
    let mut session = Session::open(&path);
    session.alloc.scatter = scatter;
    for step in &steps {
        match *step {
            Step::Allocate {
                lblk,
                len,
                unwritten,
            } => session.allocate(lblk, len, unwritten && extents),
            Step::Punch { lblk, len } => session.punch(lblk, Some(lblk + len)),
            Step::MarkWritten { lblk, len } => session.mark_written(lblk, len),
        }
    }
    let walk = check_invariants(&session.image, &session.alloc, session.ino, &session.inode);
    let last_written = walk
        .data
        .iter()
        .filter(|(_, (_, u))| !u)
        .map(|(l, _)| *l)
        .max();
    let size = last_written.map_or(0, |l| (l + 1) * session.bs());
    let (path, walk, _) = session.finish(size);
    if extents {
        let (leaves, tree_blocks) = parse_ex(&debugfs(&path, "ex f", false));
        assert_eq!(leaves.len(), walk.runs.len());
        assert_eq!(tree_blocks, walk.meta.iter().copied().collect());
    } else {
        let (data, indirect) = parse_blocks(&debugfs(&path, "stat f", false));
        assert_eq!(data.len(), walk.data.len());
        assert_eq!(indirect, walk.meta.iter().copied().collect());
    }
    let (_, text) = common::fsck(&path);
    for hint in text.lines().filter(|l| l.contains("could be")) {
        eprintln!("e2fsck hint after {} steps: {hint}", steps.len());
    }
    assert_fsck_clean_but(
        &path,
        "after random steps",
        &["could be narrower", "could be shallower"],
    );
}

proptest::proptest! {
    #![proptest_config(proptest::test_runner::Config { cases: 12, ..Default::default() })]

    #[test]
    fn random_extent_trees_pass_e2fsck(
        scatter in proptest::bool::ANY,
        steps in proptest::collection::vec(step(), 1..80),
    ) {
        if common::require_tool("debugfs") && common::require_tool("e2fsck") {
            random_steps_pass_e2fsck(true, scatter, steps);
        }
    }

    #[test]
    fn random_block_maps_pass_e2fsck(
        scatter in proptest::bool::ANY,
        steps in proptest::collection::vec(step(), 1..80),
    ) {
        if common::require_tool("debugfs") && common::require_tool("e2fsck") {
            random_steps_pass_e2fsck(false, scatter, steps);
        }
    }
}
