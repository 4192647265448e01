//! For every image variant, a real tree and every kind of
//! change written through a jext4 FUSE mount reads back the same after a
//! remount and through a kernel loop mount, and `e2fsck -fn` is clean.

// The jext4 binary, or the mounts and helpers of tests/common that use it.
#![cfg(feature = "cli")]

mod common;

use common::e2e::{self, JextMount, KernelMount, Params};
use std::path::Path;
use std::time::Instant;

/// Real-tree size per variant: thousands of files, moderate bytes.
const TREE_ENTRIES: usize = 4000;
const TREE_BYTES: u64 = 60 << 20;
const BIG_DIR_ENTRIES: usize = 3000;

fn variant(name: &str) {
    if !e2e::require_e2e() {
        return;
    }
    let started = Instant::now();
    let args = common::variant_args(name);
    let scratch = e2e::scratch(name);
    let image = common::mkfs(scratch.path(), name, 256, args);
    let mnt = scratch.path().join("mnt");
    let extents = !name.starts_with("ext2") && !name.starts_with("ext3");

    // The smallest metadata cache on two variants: buffers are evicted and
    // read again all the time while the workload runs.
    let options = if name.ends_with("-1k") {
        "cache_size=1M"
    } else {
        ""
    };
    let mount = JextMount::mount(&image, &mnt, options);
    let block_size = e2e::statvfs(&mnt).0;
    let params = Params {
        block_size,
        extents,
        big_dir_entries: BIG_DIR_ENTRIES,
    };
    let copied = e2e::copy_real_tree(&mnt.join("tree"), TREE_ENTRIES, TREE_BYTES);
    let outcome = e2e::workload(&mnt, &params);
    release_held(&mnt, outcome.held, true);
    e2e::syncfs(&mnt);
    let written = e2e::snapshot(&mnt);
    e2e::verify(&mnt, &outcome.expect);
    mount.unmount();
    e2e::fsck_clean(&image, "after the workload through jext4");

    // A fresh mount reads what the first one showed (nothing came from
    // the kernel's caches).
    let mount = JextMount::mount(&image, &mnt, "");
    let remounted = e2e::snapshot(&mnt);
    e2e::verify(&mnt, &outcome.expect);
    mount.unmount();
    e2e::fsck_clean(&image, "after a second jext4 mount");
    e2e::assert_same(&written, &remounted, ("jext4 mount", "jext4 remount"));

    if extents {
        let depth = e2e::extent_depth(&image, "/ops/deep");
        assert!(depth >= 2, "/ops/deep has extent depth {depth}, want ≥ 2");
    }

    let kernel = KernelMount::mount(&image, &mnt, true);
    let seen_by_kernel = e2e::snapshot(&kernel.mountpoint);
    e2e::verify(&kernel.mountpoint, &outcome.expect);
    kernel.unmount();
    e2e::assert_same(&remounted, &seen_by_kernel, ("jext4", "kernel"));
    eprintln!(
        "{name}: {copied} real-tree entries, {} names compared, {:.1}s",
        written.len(),
        started.elapsed().as_secs_f64()
    );
}

/// Close files that were kept open after their unlink; with `check`, their
/// blocks must be free afterwards.
pub fn release_held(mnt: &Path, held: Vec<std::fs::File>, check: bool) {
    let (_, free_before, _) = e2e::statvfs(mnt);
    let count = held.len();
    drop(held);
    if check && count > 0 {
        let freed = e2e::wait_for(std::time::Duration::from_secs(5), || {
            e2e::statvfs(mnt).1 > free_before
        });
        assert!(freed, "closing an unlinked file did not free its blocks");
    }
}

#[test]
fn e2e_variants_ext2_1k() {
    variant("ext2-1k");
}

#[test]
fn e2e_variants_ext3_4k() {
    variant("ext3-4k");
}

#[test]
fn e2e_variants_ext4_1k() {
    variant("ext4-1k");
}

#[test]
fn e2e_variants_ext4_4k() {
    variant("ext4-4k");
}

#[test]
fn e2e_variants_ext4_orphan_seed() {
    variant("ext4-orphan-seed");
}

#[test]
fn e2e_variants_ext4_fast_commit() {
    variant("ext4-fast-commit");
}

#[test]
fn e2e_variants_ext4_inode128() {
    variant("ext4-inode128");
}

#[test]
fn e2e_variants_ext4_every_feature() {
    variant("ext4-every-feature");
}

/// One test above per entry of `common::VARIANTS`: a variant added there
/// must get its test here.
#[test]
fn every_variant_has_a_test() {
    let source = include_str!("e2e_variants.rs");
    for (name, _) in common::VARIANTS {
        let test_name = name.replace('-', "_");
        assert!(
            source.contains(&format!("(\"{name}\");")) && source.contains(&test_name),
            "no test for the variant {name}"
        );
    }
}
