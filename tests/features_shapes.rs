//! The remaining shapes mke2fs makes: 128-byte inodes (second-granular
//! times, no extra fields), `sparse_super2`, `stable_inodes`, `-T small`
//! (1 KiB blocks), `-T largefile` (one inode per MiB), `-T huge`, and one
//! image with every feature jext4 writes at once (but `project`, which
//! this kernel, without CONFIG_QUOTA, mounts read-only only, and `mmp`,
//! whose every open waits out the update interval: `tests/e2e_owner.rs`); and
//! `shared_blocks`, which the kernel mounts read-only only.
//!
//! For each shape both ways, with the kernel as the oracle: jext4 copies
//! the image tools' tree in (`cp -a`: every kind of entry) and changes it
//! (`rm -r`, `mv`, `xattr set`), `e2fsck -fn` is clean, and a kernel loop
//! mount shows the source with the same changes; then the kernel copies
//! the tree in too, and jext4 reads it back (`cp -a` out) as the source.

// The jext4 binary.
#![cfg(feature = "cli")]

mod common;
mod tools_support;

use common::e2e::{self, KernelMount};
use std::collections::BTreeMap;
use tools_support::{Record, snapshot};

/// (name, mke2fs arguments, image MiB).
const SHAPES: &[(&str, &[&str], u64)] = &[
    ("inode128", &["-t", "ext4", "-I", "128"], 256),
    ("sparse_super2", &["-t", "ext4", "-O", "sparse_super2"], 256),
    ("stable_inodes", &["-t", "ext4", "-O", "stable_inodes"], 256),
    ("small", &["-t", "ext4", "-T", "small"], 256),
    // One inode per MiB: the tree's two copies need a larger image.
    ("largefile", &["-t", "ext4", "-T", "largefile"], 1024),
    ("huge", &["-t", "ext4", "-T", "huge"], 256),
    (
        "everything",
        &[
            "-t",
            "ext4",
            "-I",
            "512",
            "-O",
            "metadata_csum,metadata_csum_seed,64bit,flex_bg,huge_file,dir_nlink,extra_isize,\
             large_dir,ea_inode,fast_commit,verity,stable_inodes,sparse_super2",
        ],
        256,
    ),
];

fn jext4_ok(args: &[&str]) {
    let (code, _, stderr) = tools_support::jext4_tool(args);
    assert_eq!(code, 0, "jext4 {args:?}: {stderr}");
}

/// The directories the changes touch: their mtimes are the changes'
/// moments, on the host and in the image apart.
const CHANGED_DIRECTORIES: &[&str] = &["", "dir"];

/// A snapshot as an image of this shape keeps it (128-byte inodes hold
/// whole seconds), the changed directories' mtimes left out.
fn as_kept(mut records: BTreeMap<String, Record>, shape: &str) -> BTreeMap<String, Record> {
    for (path, record) in records.iter_mut() {
        if shape == "inode128" {
            record.mtime.1 = 0;
            record.atime.1 = 0;
        }
        if CHANGED_DIRECTORIES.contains(&path.as_str()) {
            record.mtime = (0, 0);
        }
    }
    records
}

fn both_ways(shape: &str, mkfs: &[&str], mib: u64) {
    let began = std::time::Instant::now();
    let dir = e2e::scratch(&format!("shapes-{shape}"));
    let image = common::mkfs(dir.path(), shape, mib, mkfs);
    let target = |inside: &str| format!("{}:{inside}", e2e::path_str(&image));
    let source = dir.path().join("source");
    tools_support::build_tree(&source);

    // jext4 writes; the kernel reads.
    jext4_ok(&["cp", "-a", e2e::path_str(&source), &target("/tree")]);
    jext4_ok(&["rm", "-r", &target("/tree/dir/sub")]);
    jext4_ok(&["mv", &target("/tree/small"), &target("/tree/moved")]);
    jext4_ok(&["xattr", "set", "user.shape", shape, &target("/tree/moved")]);
    std::fs::remove_dir_all(source.join("dir/sub")).unwrap();
    std::fs::rename(source.join("small"), source.join("moved")).unwrap();
    e2e::set_xattr(&source.join("moved"), "user.shape", shape.as_bytes()).unwrap();
    let wanted = as_kept(snapshot(&source), shape);
    e2e::fsck_clean(&image, &format!("{shape}: after jext4's changes"));
    let kernel = KernelMount::mount(&image, &dir.path().join("kernel"), true);
    let seen = as_kept(snapshot(&kernel.path("tree")), shape);
    kernel.unmount();
    tools_support::assert_same(&wanted, &seen);

    // The kernel writes; jext4 reads.
    let kernel = KernelMount::mount(&image, &dir.path().join("kernel"), false);
    e2e::run_ok(
        "cp",
        &[
            "-a",
            e2e::path_str(&source),
            e2e::path_str(&kernel.path("ktree")),
        ],
    );
    kernel.unmount();
    e2e::fsck_clean(&image, &format!("{shape}: after the kernel's copy"));
    let out = dir.path().join("out");
    std::fs::create_dir(&out).unwrap();
    jext4_ok(&["cp", "-a", &target("/ktree"), e2e::path_str(&out)]);
    let wanted = as_kept(snapshot(&source), shape);
    let read = as_kept(snapshot(&out.join("ktree")), shape);
    tools_support::assert_same(&wanted, &read);
    e2e::fsck_clean(
        &image,
        &format!("{shape}: after jext4 read the kernel's copy"),
    );
    eprintln!("{shape}: both ways in {:.1?}", began.elapsed());
}

#[test]
fn every_shape_both_ways_with_the_kernel() {
    if !e2e::require_e2e() {
        return;
    }
    for (shape, mkfs, mib) in SHAPES {
        both_ways(shape, mkfs, *mib);
    }
}

/// `shared_blocks` (e2fsck's deduplication mark): the kernel refuses a
/// read-write mount and reads; jext4 opens it read-only, saying so and
/// why, so a change fails as on a read-only mount, and reads work.
#[test]
fn shared_blocks_is_read_only_as_in_the_kernel() {
    if !e2e::require_e2e() {
        return;
    }
    let dir = e2e::scratch("shapes-shared-blocks");
    let image = common::mkfs(dir.path(), "shared", 64, &["-t", "ext4"]);
    let target = |inside: &str| format!("{}:{inside}", e2e::path_str(&image));
    jext4_ok(&["mkdir", &target("/kept")]);
    e2e::run_ok(
        "debugfs",
        &["-w", "-R", "feature shared_blocks", e2e::path_str(&image)],
    );
    let mountpoint = dir.path().join("kernel");
    if let Ok(kernel) = KernelMount::try_mount_with(&image, &mountpoint, "") {
        kernel.unmount();
        panic!("the kernel mounted a shared_blocks image read-write");
    }
    let kernel = KernelMount::mount(&image, &mountpoint, true);
    assert!(kernel.path("kept").is_dir());
    kernel.unmount();

    let (code, _, stderr) = tools_support::jext4_tool(&["mkdir", &target("/new")]);
    assert_eq!(code, 1, "jext4 wrote a shared_blocks image: {stderr}");
    assert!(
        stderr.contains("shared_blocks") && stderr.contains("Read-only file system"),
        "{stderr}"
    );
    let (code, listing, stderr) = tools_support::jext4_tool(&["ls", &target("/")]);
    assert_eq!(code, 0, "{stderr}");
    assert!(listing.lines().any(|name| name == "kept"), "{listing}");
    e2e::fsck_clean(&image, "the shared_blocks image after jext4");
}

/// With ea_inode, a value kept in an EA inode adds its blocks to its
/// owner's i_blocks — a fast symlink's too, which must still be read as
/// fast (its size decides, as in the kernel since "ext4: check fast
/// symlink for ea_inode correctly"): jext4 once took its target for block
/// pointers. Both ways with the kernel. (e2fsck 1.47.0 misjudges such a
/// symlink by its i_blocks and reports "illegal blocks" on the kernel's
/// own image, so it checks the images only once the symlinks are gone.)
#[test]
fn a_fast_symlink_with_a_value_in_an_ea_inode_reads_as_the_kernel_keeps_it() {
    if !e2e::require_e2e() {
        return;
    }
    use std::os::unix::fs::MetadataExt;
    let dir = e2e::scratch("shapes-symlink-ea-inode");
    let target = "t".repeat(30);
    let value = vec![b'v'; 4060];
    let args = ["-t", "ext4", "-O", "ea_inode", "-b", "1024"];
    let mountpoint = dir.path().join("kernel");
    // The kernel writes it; jext4 reads it, then removes it.
    let kernels = common::mkfs(dir.path(), "kernels", 32, &args);
    let kernel = KernelMount::mount(&kernels, &mountpoint, false);
    std::os::unix::fs::symlink(&target, kernel.path("link")).unwrap();
    let link = kernel.path("link");
    let name = std::ffi::CString::new("trusted.big").unwrap();
    let path = std::ffi::CString::new(link.to_str().unwrap()).unwrap();
    let set = unsafe {
        libc::lsetxattr(
            path.as_ptr(),
            name.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    assert_eq!(set, 0, "{}", std::io::Error::last_os_error());
    let kernel_blocks = std::fs::symlink_metadata(&link).unwrap().blocks();
    kernel.unmount();
    let image = jext4::Image::open(&kernels).unwrap();
    assert_eq!(
        image.read_link("/link").unwrap().to_str(),
        Some(&target[..])
    );
    let meta = image.symlink_metadata("/link").unwrap();
    assert_eq!((meta.len(), meta.blocks()), (30, kernel_blocks));
    assert_eq!(
        image.xattr("/link", "trusted.big").unwrap(),
        Some(value.clone())
    );
    image.remove_file("/link").unwrap();
    image.close().unwrap();
    e2e::fsck_clean(
        &kernels,
        "the kernel's image after jext4 removed the symlink",
    );
    // jext4 writes it; the kernel reads it, then removes it.
    let ours = common::mkfs(dir.path(), "ours", 32, &args);
    let image = jext4::Image::open(&ours).unwrap();
    image.symlink(&target, "/link").unwrap();
    image.set_xattr("/link", "trusted.big", &value).unwrap();
    image.close().unwrap();
    let kernel = KernelMount::mount(&ours, &mountpoint, false);
    let link = kernel.path("link");
    assert_eq!(
        std::fs::read_link(&link).unwrap().to_str(),
        Some(&target[..])
    );
    assert_eq!(
        std::fs::symlink_metadata(&link).unwrap().blocks(),
        kernel_blocks
    );
    std::fs::remove_file(&link).unwrap();
    kernel.unmount();
    e2e::fsck_clean(&ours, "jext4's image after the kernel removed the symlink");
}
