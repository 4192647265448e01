//! meta_bg images (`mke2fs -O meta_bg,^resize_inode`),
//! whose descriptor blocks lie in their meta groups (groups `M*N`, `M*N+1`
//! and `M*N+N-1` for block `M`, `N` descriptors to a block) instead of
//! after the superblock. jext4 writes a workload on them, `e2fsck -fn` is
//! clean and the kernel reads the same tree; the kernel writes, jext4 reads
//! the same and changes it; `mke2fs -d` images read as the kernel reads
//! them. The descriptors of the upper meta groups must really change
//! (e2fsck's pass 5 then checks each against its bitmaps).

// The jext4 binary, or the mounts and helpers of tests/common that use it.
#![cfg(feature = "cli")]

mod common;

use common::e2e::{self, JextMount, KernelMount, Params};
use std::path::Path;

const TREE_ENTRIES: usize = 1500;
const TREE_BYTES: u64 = 40 << 20;
const BIG_DIR_ENTRIES: usize = 1500;

/// meta_bg geometries with several meta groups in 256 MiB: 1 KiB blocks
/// with 2048-block groups and the default 64-byte descriptors (16 to a
/// block: 8 meta groups), and 4 KiB blocks with 1024-block groups and
/// 256-byte descriptors (16 to a block: 4 meta groups).
const META_BG_1K: &[&str] = &[
    "-t",
    "ext4",
    "-b",
    "1024",
    "-g",
    "2048",
    "-O",
    "meta_bg,^resize_inode",
];
const META_BG_4K: &[&str] = &[
    "-t",
    "ext4",
    "-b",
    "4096",
    "-g",
    "1024",
    "-O",
    "meta_bg,^resize_inode",
    "-E",
    "desc_size=256",
];

/// Each group's free block count, as dumpe2fs reads the descriptors.
fn group_free_blocks(image: &Path) -> Vec<u64> {
    let output = e2e::run_ok("dumpe2fs", &[e2e::path_str(image)]);
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| {
            let (count, rest) = line.trim().split_once(" free blocks, ")?;
            rest.contains("free inodes").then(|| count.parse().ok())?
        })
        .collect()
}

/// (descriptors per block, first meta group) from dumpe2fs's header.
fn meta_bg_shape(image: &Path) -> (u64, u64) {
    let output = e2e::run_ok("dumpe2fs", &["-h", e2e::path_str(image)]);
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        text.lines()
            .any(|line| line.starts_with("Filesystem features:") && line.contains(" meta_bg")),
        "not a meta_bg image:\n{text}"
    );
    let field = |name: &str| -> Option<u64> {
        text.lines()
            .find_map(|line| line.strip_prefix(name))
            .and_then(|value| value.trim().parse().ok())
    };
    let block_size = field("Block size:").expect("block size");
    let desc_size = field("Group descriptor size:").unwrap_or(32);
    (
        block_size / desc_size,
        field("First meta block group:").unwrap_or(0),
    )
}

/// Groups whose descriptors changed, beyond the first meta group: what
/// shows that jext4 wrote descriptors where meta_bg keeps them.
fn changed_upper_groups(image: &Path, before: &[u64]) -> Vec<usize> {
    let (per_block, first_meta_bg) = meta_bg_shape(image);
    let after = group_free_blocks(image);
    assert_eq!(after.len(), before.len(), "group count changed");
    let first_upper = (per_block * first_meta_bg.max(1)) as usize;
    (first_upper..after.len())
        .filter(|&group| after[group] != before[group])
        .collect()
}

fn jext4_writes(name: &str, args: &[&str]) {
    if !e2e::require_e2e() {
        return;
    }
    let scratch = e2e::scratch(name);
    let image = common::mkfs(scratch.path(), name, 256, args);
    let fresh = group_free_blocks(&image);
    let mnt = scratch.path().join("mnt");
    let mount = JextMount::mount(&image, &mnt, "");
    let params = Params {
        block_size: e2e::statvfs(&mnt).0,
        extents: true,
        big_dir_entries: BIG_DIR_ENTRIES,
    };
    e2e::copy_real_tree(&mnt.join("tree"), TREE_ENTRIES, TREE_BYTES);
    let outcome = e2e::workload(&mnt, &params);
    drop(outcome.held);
    e2e::syncfs(&mnt);
    let written = e2e::snapshot(&mnt);
    e2e::verify(&mnt, &outcome.expect);
    mount.unmount();
    e2e::fsck_clean(&image, "after the workload through jext4");
    let upper = changed_upper_groups(&image, &fresh);
    assert!(
        !upper.is_empty(),
        "the workload changed no group outside meta group 0: the test shows nothing"
    );

    let mount = JextMount::mount(&image, &mnt, "ro");
    let jext4_statfs = e2e::statfs_counts(&mnt);
    mount.unmount();
    let kernel = KernelMount::mount(&image, &mnt, true);
    let seen_by_kernel = e2e::snapshot(&kernel.mountpoint);
    e2e::verify(&kernel.mountpoint, &outcome.expect);
    let kernel_statfs = e2e::statfs_counts(&kernel.mountpoint);
    kernel.unmount();
    e2e::assert_same(&written, &seen_by_kernel, ("jext4", "kernel"));
    // The meta groups' descriptor blocks are overhead to both.
    assert_eq!(
        jext4_statfs, kernel_statfs,
        "statfs [bsize, blocks, bfree, bavail, files, ffree]: jext4 vs the kernel"
    );
    eprintln!(
        "{name}: {} names, {} groups past meta group 0 changed",
        written.len(),
        upper.len()
    );
}

#[test]
fn jext4_writes_meta_bg_1k_and_the_kernel_reads_it() {
    jext4_writes("meta-bg-1k", META_BG_1K);
}

#[test]
fn jext4_writes_meta_bg_4k_and_the_kernel_reads_it() {
    jext4_writes("meta-bg-4k", META_BG_4K);
}

/// The kernel fills a meta_bg image (its descriptors in every meta group);
/// jext4 reads the same tree, frees and allocates across the meta groups,
/// and the kernel reads back what jext4 showed.
#[test]
fn the_kernel_writes_meta_bg_and_jext4_reads_and_changes_it() {
    if !e2e::require_e2e() {
        return;
    }
    let scratch = e2e::scratch("meta-bg-kernel");
    let image = common::mkfs(scratch.path(), "meta-bg-kernel", 256, META_BG_1K);
    let mnt = scratch.path().join("mnt");
    let kernel = KernelMount::mount(&image, &mnt, false);
    e2e::copy_real_tree(&mnt.join("tree"), TREE_ENTRIES, TREE_BYTES);
    // 40 MiB: more than meta group 0's 32 MiB, so that some of these lie
    // past it wherever the kernel's Orlov allocator (random for
    // directories under the root) put the tree.
    for index in 0..40u64 {
        let data = e2e::pattern(index, 1 << 20);
        std::fs::write(mnt.join(format!("spread-{index}")), data).unwrap();
    }
    e2e::syncfs(&mnt);
    let by_kernel = e2e::snapshot(&mnt);
    kernel.unmount();
    e2e::fsck_clean(&image, "after the kernel wrote");
    let kernel_counts = group_free_blocks(&image);

    let mount = JextMount::mount(&image, &mnt, "");
    let read_by_jext4 = e2e::snapshot(&mnt);
    e2e::assert_same(&by_kernel, &read_by_jext4, ("kernel", "jext4"));
    // All of them: the frees reach past meta group 0 for certain.
    for index in 0..40u64 {
        std::fs::remove_file(mnt.join(format!("spread-{index}"))).unwrap();
    }
    for index in 40..70u64 {
        let data = e2e::pattern(index, 400_000);
        std::fs::write(mnt.join(format!("spread-{index}")), data).unwrap();
    }
    e2e::syncfs(&mnt);
    let changed_by_jext4 = e2e::snapshot(&mnt);
    mount.unmount();
    e2e::fsck_clean(&image, "after jext4 changed the kernel's tree");
    assert!(
        !changed_upper_groups(&image, &kernel_counts).is_empty(),
        "jext4 changed no group outside meta group 0"
    );

    let kernel = KernelMount::mount(&image, &mnt, true);
    let read_by_kernel = e2e::snapshot(&mnt);
    kernel.unmount();
    e2e::assert_same(&changed_by_jext4, &read_by_kernel, ("jext4", "kernel"));
}

/// `mke2fs -d` lays a tree into a meta_bg image as it creates it: jext4
/// reads what the kernel reads, and writes on it stay e2fsck-clean.
#[test]
fn a_meta_bg_image_made_by_mke2fs_d_reads_as_the_kernel_reads_it() {
    if !e2e::require_e2e() {
        return;
    }
    let scratch = e2e::scratch("meta-bg-mkfs-d");
    let source = scratch.path().join("source");
    e2e::copy_real_tree(&source, TREE_ENTRIES, 20 << 20);
    let mut args = META_BG_4K.to_vec();
    let source_arg = source.to_str().unwrap().to_string();
    args.extend(["-d", &source_arg]);
    let image = common::mkfs(scratch.path(), "meta-bg-mkfs-d", 128, &args);
    e2e::fsck_clean(&image, "after mke2fs -d");
    let mnt = scratch.path().join("mnt");
    let kernel = KernelMount::mount(&image, &mnt, true);
    let by_kernel = e2e::snapshot(&mnt);
    kernel.unmount();
    let mount = JextMount::mount(&image, &mnt, "");
    let by_jext4 = e2e::snapshot(&mnt);
    e2e::assert_same(&by_kernel, &by_jext4, ("kernel", "jext4"));
    std::fs::write(mnt.join("added"), e2e::pattern(7, 2 << 20)).unwrap();
    mount.unmount();
    e2e::fsck_clean(&image, "after jext4 wrote on the mke2fs -d image");
}

/// A superblock whose s_first_meta_bg lies past the descriptor blocks is
/// refused in one line, as the kernel refuses it ("first meta block group
/// too large").
#[test]
fn a_first_meta_group_past_the_table_is_refused() {
    if !common::require_tool("mke2fs") || !common::require_tool("debugfs") {
        return;
    }
    let scratch = tempfile::tempdir().unwrap();
    let image = common::mkfs(scratch.path(), "meta-bg-bad", 64, META_BG_1K);
    let set = e2e::run(
        "debugfs",
        &["-w", "-R", "ssv first_meta_bg 900", e2e::path_str(&image)],
    );
    assert!(set.status.success(), "debugfs: {set:?}");
    let listed = e2e::run(e2e::JEXT4, &["ls", &format!("{}:/", e2e::path_str(&image))]);
    let stderr = String::from_utf8_lossy(&listed.stderr);
    assert!(!listed.status.success(), "jext4 read the bad image");
    assert!(
        stderr.contains("first meta block group 900"),
        "unclear refusal: {stderr}"
    );
    assert_eq!(
        stderr.trim().lines().count(),
        1,
        "more than one line: {stderr}"
    );
}
