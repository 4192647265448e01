//! ea_inode images, which jext4 reads and does not write yet: the kernel
//! stores values larger than a block in EA inodes (one shared by two files
//! with the same value); jext4 mounts the image read-only, says why, reads
//! every value as the kernel reads it through the library and through
//! FUSE, leaves the image byte-identical, and answers EUCLEAN, as the
//! kernel does, for a value that no longer matches its EA inode's hash.

// The jext4 binary, or the mounts and helpers of tests/common that use it.
#![cfg(feature = "cli")]

mod common;

use common::e2e::{self, JextMount, KernelMount, path_str};
use jext4::Image;
use std::path::Path;

/// (file, name, value): the big values go to EA inodes (4 KiB blocks).
fn values() -> Vec<(&'static str, &'static str, Vec<u8>)> {
    let big = |seed: u64, len: usize| e2e::pattern(seed, len);
    vec![
        ("a", "user.big", big(1, 10_000)),
        ("a", "user.small", b"in the inode".to_vec()),
        ("a", "user.largest", big(2, 65_000)),
        // The same value again: the kernel shares its EA inode.
        ("b", "user.big", big(1, 10_000)),
        ("b", "trusted.other", big(3, 5_000)),
    ]
}

fn kernel_written(dir: &Path) -> std::path::PathBuf {
    let image = common::mkfs(
        dir,
        "ea-inode",
        64,
        &["-t", "ext4", "-b", "4096", "-O", "ea_inode"],
    );
    let mnt = dir.join("kernel.mnt");
    let kernel = KernelMount::mount(&image, &mnt, false);
    for (file, _, _) in values() {
        std::fs::write(kernel.path(file), b"data\n").unwrap();
    }
    for (file, name, value) in values() {
        e2e::set_xattr(&kernel.path(file), name, &value).unwrap();
    }
    kernel.unmount();
    e2e::fsck_clean(&image, "after the kernel wrote EA inodes");
    image
}

#[test]
fn values_in_ea_inodes_read_as_the_kernel_wrote_them() {
    if !e2e::require_e2e() {
        return;
    }
    let scratch = e2e::scratch("ea-inode");
    let image = kernel_written(scratch.path());
    let before = std::fs::read(&image).unwrap();

    let opened = Image::open_read_only(&image).unwrap();
    for (file, name, value) in values() {
        let read = opened.xattr(format!("/{file}"), name).unwrap();
        assert_eq!(
            read.as_deref(),
            Some(&value[..]),
            "{file} {name} through the library"
        );
    }
    opened.close().unwrap();

    // A read-write mount is turned read-only, saying why.
    let mnt = scratch.path().join("jext4.mnt");
    let mount = JextMount::mount(&image, &mnt, "");
    for (file, name, value) in values() {
        let read = e2e::get_xattr(&mount.path(file), name.as_bytes()).unwrap();
        assert_eq!(read, value, "{file} {name} through FUSE");
    }
    let refused = std::fs::write(mount.path("new"), b"x").unwrap_err();
    assert_eq!(refused.raw_os_error(), Some(libc::EROFS));
    mount.unmount();
    assert!(
        std::fs::read(&image).unwrap() == before,
        "the image changed"
    );
}

/// The first EA inode's value changed on disk: its hash no longer matches.
#[test]
fn a_damaged_ea_inode_value_is_euclean_as_in_the_kernel() {
    if !e2e::require_e2e() {
        return;
    }
    let scratch = e2e::scratch("ea-inode-damaged");
    let image = kernel_written(scratch.path());
    // The first EA inode (flag EA_INODE, 0x200000) among the first
    // inodes: the one of a's user.big, the first value the kernel moved
    // out (debugfs's ea_list does not name EA inodes).
    let ea_ino = (12..40u32)
        .find(|ino| {
            let stat = e2e::run_ok(
                "debugfs",
                &["-R", &format!("stat <{ino}>"), path_str(&image)],
            );
            let text = String::from_utf8_lossy(&stat.stdout).into_owned();
            text.split_whitespace()
                .skip_while(|word| *word != "Flags:")
                .nth(1)
                .and_then(|flags| u32::from_str_radix(flags.trim_start_matches("0x"), 16).ok())
                .is_some_and(|flags| flags & 0x20_0000 != 0)
        })
        .expect("no EA inode among inodes 12..40");
    let bmap = e2e::run_ok(
        "debugfs",
        &["-R", &format!("bmap <{ea_ino}> 0"), path_str(&image)],
    );
    let block: u64 = String::from_utf8_lossy(&bmap.stdout)
        .trim()
        .parse()
        .unwrap();
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(&image)
        .unwrap();
    std::os::unix::fs::FileExt::write_all_at(&file, b"DAMAGED", block * 4096 + 100).unwrap();
    drop(file);

    let kernel_mnt = scratch.path().join("kernel.mnt");
    let kernel = KernelMount::mount(&image, &kernel_mnt, true);
    let theirs = e2e::get_xattr(&kernel.path("a"), b"user.big").map(|_| ());
    let small_theirs = e2e::get_xattr(&kernel.path("a"), b"user.small");
    kernel.unmount();
    let opened = Image::open_read_only(&image).unwrap();
    let ours = opened.xattr("/a", "user.big").map(|_| ());
    let small_ours = opened.xattr("/a", "user.small").unwrap();
    opened.close().unwrap();
    let errno =
        |result: &Result<(), std::io::Error>| result.as_ref().err().and_then(|e| e.raw_os_error());
    assert_eq!(
        errno(&theirs),
        Some(libc::EUCLEAN),
        "the kernel: {theirs:?}"
    );
    let ours_errno = ours.as_ref().err().and_then(|error| error.raw_os_error());
    assert_eq!(ours_errno, errno(&theirs), "jext4: {ours:?}");
    assert_eq!(small_ours.as_deref(), Some(&b"in the inode"[..]));
    assert_eq!(small_theirs.unwrap(), b"in the inode");
}
