//! A tree the kernel wrote through a loop mount reads back
//! identically through jext4; jext4 then changes it (renames, deletions,
//! appends, writes into preallocated space, new files, changes to shared
//! xattr blocks), the image stays e2fsck-clean, and the kernel reads back
//! what jext4 showed.

// The jext4 binary, or the mounts and helpers of tests/common that use it.
#![cfg(feature = "cli")]

mod common;

use common::e2e::{self, Expect, JextMount, KernelMount, Params};
use std::fs;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::Instant;

const TREE_ENTRIES: usize = 2000;
const TREE_BYTES: u64 = 30 << 20;
const BIG_DIR_ENTRIES: usize = 3000;

fn reverse(name: &str) {
    if !e2e::require_e2e() {
        return;
    }
    let started = Instant::now();
    let args = common::variant_args(name);
    let extents = name.starts_with("ext4");
    let scratch = e2e::scratch(&format!("reverse-{name}"));
    let image = common::mkfs(scratch.path(), name, 256, args);
    let mnt = scratch.path().join("mnt");

    // The kernel writes.
    let kernel = KernelMount::mount(&image, &mnt, false);
    let params = Params {
        block_size: e2e::statvfs(&mnt).0,
        extents,
        big_dir_entries: BIG_DIR_ENTRIES,
    };
    e2e::copy_real_tree(&mnt.join("tree"), TREE_ENTRIES, TREE_BYTES);
    let outcome = e2e::workload(&mnt, &params);
    drop(outcome.held);
    shared_xattr_blocks(&mnt);
    e2e::syncfs(&mnt);
    let written_by_kernel = e2e::snapshot(&mnt);
    kernel.unmount();
    e2e::fsck_clean(&image, "after the kernel wrote");

    // jext4 reads it back, then changes it.
    let mount = JextMount::mount(&image, &mnt, "");
    let read_by_jext4 = e2e::snapshot(&mnt);
    e2e::assert_same(&written_by_kernel, &read_by_jext4, ("kernel", "jext4"));
    e2e::verify(&mnt, &outcome.expect);
    let expect = modify(&mnt, &params);
    e2e::verify(&mnt, &expect);
    e2e::syncfs(&mnt);
    let changed_by_jext4 = e2e::snapshot(&mnt);
    mount.unmount();
    e2e::fsck_clean(&image, "after jext4 changed the kernel's tree");

    // The kernel reads back what jext4 showed.
    let kernel = KernelMount::mount(&image, &mnt, true);
    let read_by_kernel = e2e::snapshot(&mnt);
    e2e::verify(&mnt, &expect);
    kernel.unmount();
    e2e::assert_same(&changed_by_jext4, &read_by_kernel, ("jext4", "kernel"));
    eprintln!(
        "reverse {name}: {} names, {:.1}s",
        read_by_kernel.len(),
        started.elapsed().as_secs_f64()
    );
}

/// Identical big xattrs on several files: the kernel shares one xattr
/// block between them (h_refcount > 1), which jext4 must copy on write.
fn shared_xattr_blocks(root: &Path) {
    let dir = root.join("shared");
    fs::create_dir(&dir).unwrap();
    let value = e2e::pattern(500, 600);
    for i in 0..5 {
        let path = dir.join(format!("s{i}"));
        fs::write(&path, b"shared").unwrap();
        e2e::set_xattr(&path, "user.shared", &value).unwrap();
    }
}

/// What jext4 changes in the kernel's tree; returns contents to check.
fn modify(root: &Path, params: &Params) -> Vec<Expect> {
    let mut expect = Vec::new();
    let ops = root.join("ops");
    // Renames and deletions inside the kernel's directories.
    fs::rename(ops.join("ren/a/f0"), ops.join("ren/b/f0-moved")).unwrap();
    fs::rename(ops.join("ren/a/f6"), ops.join("ren/b/f1")).unwrap();
    fs::rename(ops.join("ren/a/f5"), ops.join("sym/f5-dir")).unwrap();
    fs::remove_file(ops.join("links/l3")).unwrap();
    e2e::run_ok("rm", &["-rf", e2e::path_str(&ops.join("attrs/dir"))]);
    // The kernel's htree: delete more, add more.
    let big = ops.join("bigdir");
    for i in (1..BIG_DIR_ENTRIES).step_by(3) {
        fs::remove_file(big.join(e2e::big_dir_name(i))).unwrap();
    }
    for i in BIG_DIR_ENTRIES..BIG_DIR_ENTRIES + 700 {
        fs::write(big.join(e2e::big_dir_name(i)), i.to_string()).unwrap();
    }
    // Appends to kernel-written files; a shrink.
    let appended = e2e::pattern(600, 20_000);
    let path = ops.join("ren/b/f0-moved");
    let mut file = fs::OpenOptions::new().append(true).open(&path).unwrap();
    std::io::Write::write_all(&mut file, &appended).unwrap();
    let mut whole = e2e::pattern(0, 1000);
    whole.extend_from_slice(&appended);
    expect.push(Expect::Exact {
        path: "ops/ren/b/f0-moved".into(),
        data: whole,
    });
    let deep = fs::OpenOptions::new()
        .write(true)
        .open(ops.join("deep"))
        .unwrap();
    let far_block = e2e::pattern(601, params.block_size as usize);
    let far = 4 * e2e::deep_file_blocks(params.block_size) * params.block_size;
    deep.write_all_at(&far_block, far).unwrap();
    expect.push(Expect::Sparse {
        path: "ops/deep".into(),
        size: far + params.block_size,
        data: vec![(far, far_block)],
    });
    fs::OpenOptions::new()
        .write(true)
        .open(ops.join("trunc/a"))
        .unwrap()
        .set_len(50_000)
        .unwrap();
    if params.extents {
        // Into the kernel's unwritten (preallocated) extent.
        let file = fs::OpenOptions::new()
            .write(true)
            .open(ops.join("sparse/fallocated"))
            .unwrap();
        let inside = e2e::pattern(602, 7000);
        file.write_all_at(&inside, 100_000).unwrap();
        expect.push(Expect::Sparse {
            path: "ops/sparse/fallocated".into(),
            size: 1 << 20,
            data: vec![(100_000, inside)],
        });
    }
    // New objects among the kernel's.
    fs::create_dir_all(ops.join("new/deeper")).unwrap();
    for i in 0..50u64 {
        let data = e2e::pattern(700 + i, 100 * i as usize);
        fs::write(ops.join(format!("new/deeper/n{i}")), &data).unwrap();
    }
    std::os::unix::fs::symlink("a".repeat(300), ops.join("new/long-link")).unwrap();
    // Shared xattr blocks: change one, remove from one, add to one.
    let shared = root.join("shared");
    e2e::set_xattr(&shared.join("s0"), "user.shared", b"changed").unwrap();
    e2e::remove_xattr(&shared.join("s1"), "user.shared").unwrap();
    e2e::set_xattr(&shared.join("s2"), "user.extra", b"more").unwrap();
    // An ACL rewritten by chmod; times.
    e2e::set_mode(&ops.join("xattr/acl1"), 0o640);
    e2e::set_times(&ops.join("ren/b/victim"), (5, 6), (7, 8));
    // And the real tree: a subtree moved, one removed, a file appended.
    real_tree_changes(&root.join("tree"));
    expect
}

fn real_tree_changes(tree: &Path) {
    let mut dirs: Vec<_> = fs::read_dir(tree)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_dir() && !p.is_symlink())
        .collect();
    dirs.sort();
    fs::rename(&dirs[1], dirs[2].join("moved-by-jext4")).unwrap();
    e2e::run_ok("rm", &["-rf", e2e::path_str(&dirs[3])]);
    let file = e2e::snapshot(&dirs[4])
        .nodes
        .iter()
        .find(|(_, node)| node.kind == e2e::Kind::File)
        .map(|(path, _)| dirs[4].join(path))
        .expect("a file in the real tree");
    let mut handle = fs::OpenOptions::new().append(true).open(file).unwrap();
    std::io::Write::write_all(&mut handle, b"appended by jext4\n").unwrap();
}

#[test]
fn e2e_reverse_ext2_1k() {
    reverse("ext2-1k");
}

#[test]
fn e2e_reverse_ext3_4k() {
    reverse("ext3-4k");
}

#[test]
fn e2e_reverse_ext4_1k() {
    reverse("ext4-1k");
}

#[test]
fn e2e_reverse_ext4_4k() {
    reverse("ext4-4k");
}

#[test]
fn e2e_reverse_ext4_orphan_seed() {
    reverse("ext4-orphan-seed");
}

#[test]
fn e2e_reverse_ext4_fast_commit() {
    reverse("ext4-fast-commit");
}

#[test]
fn e2e_reverse_ext4_inode128() {
    reverse("ext4-inode128");
}

#[test]
fn e2e_reverse_ext4_every_feature() {
    reverse("ext4-every-feature");
}

/// One test above per entry of `common::VARIANTS`: a variant added there
/// must get its test here.
#[test]
fn every_variant_has_a_test() {
    let source = include_str!("e2e_reverse.rs");
    for (name, _) in common::VARIANTS {
        let test_name = name.replace('-', "_");
        assert!(
            source.contains(&format!("(\"{name}\");")) && source.contains(&test_name),
            "no test for the variant {name}"
        );
    }
}
