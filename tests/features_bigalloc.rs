//! bigalloc images (clusters of 16 blocks by mke2fs's
//! default: the block bitmap counts clusters, free counts are clusters,
//! extents stay in blocks). jext4 mounts them read-only — read-write is
//! refused in one line that says so, the image tools open them read-only
//! — reads every file exactly as the
//! kernel reads it, and answers statfs as the kernel does (in blocks,
//! from cluster counts). Images written by the kernel and made by
//! `mke2fs -d`, at 1 KiB blocks (16 KiB clusters, the filesystem starting
//! at block 0) and 4 KiB blocks (64 KiB clusters).

// The jext4 binary, or the mounts and helpers of tests/common that use it.
#![cfg(feature = "cli")]

mod common;

use common::e2e::{self, JextMount, KernelMount, Params};
use std::path::Path;

const TREE_ENTRIES: usize = 1500;
const TREE_BYTES: u64 = 30 << 20;

/// The kernel's tree and statfs of `image` (a read-only loop mount), then
/// jext4's (`-o ro`): both must agree.
fn jext4_reads_as_the_kernel(image: &Path, mnt: &Path) -> usize {
    let kernel = KernelMount::mount(image, mnt, true);
    let by_kernel = e2e::snapshot(mnt);
    let kernel_statfs = e2e::statfs_counts(mnt);
    kernel.unmount();
    let mount = JextMount::mount(image, mnt, "ro");
    let by_jext4 = e2e::snapshot(mnt);
    let jext4_statfs = e2e::statfs_counts(mnt);
    mount.unmount();
    e2e::assert_same(&by_kernel, &by_jext4, ("kernel", "jext4"));
    assert_eq!(
        jext4_statfs, kernel_statfs,
        "statfs [bsize, blocks, bfree, bavail, files, ffree]: jext4 vs the kernel"
    );
    e2e::fsck_clean(image, "after jext4's read-only mount");
    by_kernel.len()
}

fn kernel_writes(name: &str, block_size: &str) {
    if !e2e::require_e2e() {
        return;
    }
    let scratch = e2e::scratch(name);
    let args = ["-t", "ext4", "-b", block_size, "-O", "bigalloc"];
    let image = common::mkfs(scratch.path(), name, 256, &args);
    let mnt = scratch.path().join("mnt");
    let kernel = KernelMount::mount(&image, &mnt, false);
    let params = Params {
        block_size: e2e::statvfs(&mnt).0,
        extents: true,
        big_dir_entries: 1500,
    };
    e2e::copy_real_tree(&mnt.join("tree"), TREE_ENTRIES, TREE_BYTES);
    let outcome = e2e::workload(&mnt, &params);
    drop(outcome.held);
    e2e::syncfs(&mnt);
    kernel.unmount();
    e2e::fsck_clean(&image, "after the kernel wrote");
    let names = jext4_reads_as_the_kernel(&image, &mnt);
    let mount = JextMount::mount(&image, &mnt, "ro");
    e2e::verify(&mnt, &outcome.expect);
    mount.unmount();
    eprintln!("{name}: {names} names read as the kernel reads them");
}

#[test]
fn the_kernel_writes_bigalloc_1k_and_jext4_reads_it() {
    kernel_writes("bigalloc-1k", "1024");
}

#[test]
fn the_kernel_writes_bigalloc_4k_and_jext4_reads_it() {
    kernel_writes("bigalloc-4k", "4096");
}

#[test]
fn a_bigalloc_image_made_by_mke2fs_d_reads_as_the_kernel_reads_it() {
    if !e2e::require_e2e() {
        return;
    }
    let scratch = e2e::scratch("bigalloc-mkfs-d");
    let source = scratch.path().join("source");
    e2e::copy_real_tree(&source, TREE_ENTRIES, 20 << 20);
    let source_arg = source.to_str().unwrap();
    let args = ["-t", "ext4", "-O", "bigalloc", "-d", source_arg];
    let image = common::mkfs(scratch.path(), "bigalloc-mkfs-d", 128, &args);
    e2e::fsck_clean(&image, "after mke2fs -d");
    let mnt = scratch.path().join("mnt");
    jext4_reads_as_the_kernel(&image, &mnt);
}

/// A read-write open through the library is refused in one line that
/// names the feature and says what works (`-o ro`). The image tools open
/// such an image read-only instead, saying so once: a verb that reads
/// works, one that writes fails with EROFS and leaves the image as it was.
#[test]
fn a_read_write_open_of_bigalloc_is_refused_in_one_line() {
    if !common::require_tool("mke2fs") {
        return;
    }
    let scratch = tempfile::tempdir().unwrap();
    let image = common::mkfs(
        scratch.path(),
        "bigalloc-rw",
        64,
        &["-t", "ext4", "-O", "bigalloc"],
    );
    let refused = jext4::engine::fs::Fs::open(&image, jext4::engine::fs::MountOptions::default())
        .err()
        .expect("jext4 opened bigalloc read-write")
        .to_string();
    assert!(
        refused.contains("bigalloc") && refused.contains("-o ro") && !refused.contains('\n'),
        "unclear refusal: {refused}"
    );
    let before = std::fs::read(&image).unwrap();
    let root = format!("{}:/", e2e::path_str(&image));
    let listed = e2e::run(e2e::JEXT4, &["ls", &root]);
    let stderr = String::from_utf8_lossy(&listed.stderr);
    assert!(listed.status.success(), "jext4 ls of bigalloc: {stderr}");
    assert_eq!(String::from_utf8_lossy(&listed.stdout).trim(), "lost+found");
    assert!(
        stderr.contains("bigalloc") && stderr.contains("read-only"),
        "the read-only open is not said: {stderr}"
    );
    assert_eq!(
        stderr.trim().lines().count(),
        1,
        "more than one line: {stderr}"
    );
    let made = e2e::run(e2e::JEXT4, &["mkdir", &format!("{root}new")]);
    let stderr = String::from_utf8_lossy(&made.stderr);
    assert!(
        !made.status.success(),
        "mkdir on a read-only bigalloc image"
    );
    assert!(
        stderr.to_lowercase().contains("read-only file system"),
        "{stderr}"
    );
    assert!(
        std::fs::read(&image).unwrap() == before,
        "the image changed"
    );
    let options = jext4::engine::fs::MountOptions {
        read_only: true,
        ..jext4::engine::fs::MountOptions::default()
    };
    let fs = jext4::engine::fs::Fs::open(&image, options).expect("a read-only open of bigalloc");
    let statfs = fs.statfs();
    assert!(statfs.free_blocks > 0 && statfs.free_blocks <= statfs.blocks);
    fs.unmount().unwrap();
}
