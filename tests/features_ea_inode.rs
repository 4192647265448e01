//! ea_inode images: the kernel stores values larger than a block in EA
//! inodes (one shared by two files with the same value). jext4 reads every
//! value as the kernel reads it, through the library and through FUSE,
//! leaving a read-only open byte-identical, and answers EUCLEAN, as the
//! kernel does, for a value that no longer matches its EA inode's hash.
//! It writes them as the kernel does: large values in EA inodes (equal
//! values sharing one), references dropped when a value is replaced or
//! removed or its file deleted (a shared EA inode lives on for its other
//! file), the last one freeing the EA inode; `e2fsck -fn` (which checks every EA inode's
//! reference count and hash) is clean after each workload, and a kernel
//! loop mount reads back every value jext4 wrote.

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

    assert!(
        std::fs::read(&image).unwrap() == before,
        "a read-only open changed the image"
    );

    // Read-write, through FUSE: every value reads as the kernel wrote it;
    // then b's copy of the shared value is replaced (the EA inode stays,
    // a's), a's largest removed (its EA inode freed), and a deleted.
    let mnt = scratch.path().join("jext4.mnt");
    let mount = JextMount::mount(&image, &mnt, "");
    for (file, name, value) in values() {
        let read = e2e::get_xattr(&mount.path(file), name.as_bytes()).unwrap();
        assert_eq!(read, value, "{file} {name} through FUSE");
    }
    let replaced = e2e::pattern(9, 20_000);
    e2e::set_xattr(&mount.path("b"), "user.big", &replaced).unwrap();
    assert_eq!(
        e2e::get_xattr(&mount.path("a"), b"user.big").unwrap(),
        e2e::pattern(1, 10_000),
        "a's value, whose EA inode b shared"
    );
    e2e::remove_xattr(&mount.path("a"), "user.largest").unwrap();
    std::fs::remove_file(mount.path("a")).unwrap();
    mount.unmount();
    e2e::fsck_clean(&image, "after jext4 changed the kernel's EA inodes");
    let kernel = KernelMount::mount(&image, &scratch.path().join("kernel2.mnt"), true);
    assert!(!kernel.path("a").exists());
    assert_eq!(
        e2e::get_xattr(&kernel.path("b"), b"user.big").unwrap(),
        replaced
    );
    assert_eq!(
        e2e::get_xattr(&kernel.path("b"), b"trusted.other").unwrap(),
        e2e::pattern(3, 5_000)
    );
    kernel.unmount();
}

/// Values of every size jext4 writes through the library, at 1 KiB and
/// 4 KiB blocks: small ones in the inode or the block, large ones in EA
/// inodes (at once above a block's room, or when neither place has room
/// left); replaced (large by small, small by large, large by large),
/// removed, on files renamed over and deleted. After each stage e2fsck is
/// clean and a kernel loop mount reads every value; at the end, with every
/// file gone, the free inode and block counts are back where they began.
#[test]
fn jext4_writes_ea_inodes_the_kernel_and_e2fsck_read() {
    if !e2e::require_e2e() {
        return;
    }
    for block_size in ["1024", "4096"] {
        let scratch = e2e::scratch(&format!("ea-inode-write-{block_size}"));
        let image = common::mkfs(
            scratch.path(),
            "ea-write",
            64,
            &["-t", "ext4", "-b", block_size, "-O", "ea_inode"],
        );
        let free = |image: &Path| {
            let text = common::journal::debugfs_commands(image, "stats");
            let count = |label: &str| -> u64 {
                let line = text.lines().find(|line| line.starts_with(label)).unwrap();
                line[label.len()..].trim().parse().unwrap()
            };
            (count("Free blocks:"), count("Free inodes:"))
        };
        let empty = free(&image);
        let mut expected: Vec<(String, String, Vec<u8>)> = Vec::new();
        let set = |expected: &mut Vec<(String, String, Vec<u8>)>,
                   image: &Image,
                   file: &str,
                   name: &str,
                   value: Vec<u8>| {
            image.set_xattr(file, name, &value).unwrap();
            expected.retain(|(f, n, _)| !(f == file && n == name));
            expected.push((file.to_string(), name.to_string(), value));
        };
        let opened = Image::open(&image).unwrap();
        for file in ["/f1", "/f2", "/f3", "/f4"] {
            opened.write(file, "contents\n").unwrap();
        }
        set(
            &mut expected,
            &opened,
            "/f1",
            "user.small",
            b"tiny".to_vec(),
        );
        set(
            &mut expected,
            &opened,
            "/f1",
            "user.medium",
            e2e::pattern(11, 900),
        );
        set(
            &mut expected,
            &opened,
            "/f1",
            "user.large",
            e2e::pattern(12, 10_000),
        );
        set(
            &mut expected,
            &opened,
            "/f1",
            "user.largest",
            e2e::pattern(13, 65_536),
        );
        // Several medium values: the body and the block fill up, and the
        // last go to EA inodes although each would fit a block alone.
        for n in 0..6 {
            set(
                &mut expected,
                &opened,
                "/f2",
                &format!("user.m{n}"),
                e2e::pattern(20 + n, 700),
            );
        }
        set(
            &mut expected,
            &opened,
            "/f3",
            "trusted.big",
            e2e::pattern(30, 30_000),
        );
        set(
            &mut expected,
            &opened,
            "/f4",
            "user.big",
            e2e::pattern(40, 8_000),
        );
        opened.close().unwrap();
        check(&image, &expected, "after the values were written");
        // Four files, and at least the four values above a block in EA
        // inodes.
        let used_inodes = empty.1 - free(&image).1;
        assert!(
            used_inodes >= 8,
            "{block_size}: {used_inodes} inodes in use"
        );

        let opened = Image::open(&image).unwrap();
        // Large by small, small by large, large by large, one removed.
        set(
            &mut expected,
            &opened,
            "/f1",
            "user.large",
            b"small now".to_vec(),
        );
        set(
            &mut expected,
            &opened,
            "/f1",
            "user.small",
            e2e::pattern(14, 12_000),
        );
        set(
            &mut expected,
            &opened,
            "/f3",
            "trusted.big",
            e2e::pattern(31, 40_000),
        );
        opened.remove_xattr("/f1", "user.largest").unwrap();
        expected.retain(|(f, n, _)| !(f == "/f1" && n == "user.largest"));
        // f4 renamed over f2: f2 and its EA inodes go.
        opened.rename("/f4", "/f2").unwrap();
        expected.retain(|(f, _, _)| f != "/f2");
        for entry in expected.iter_mut().filter(|(f, _, _)| f == "/f4") {
            entry.0 = "/f2".into();
        }
        opened.close().unwrap();
        check(
            &image,
            &expected,
            "after replacing, removing and renaming over",
        );

        let opened = Image::open(&image).unwrap();
        for file in ["/f1", "/f2", "/f3"] {
            opened.remove_file(file).unwrap();
        }
        opened.close().unwrap();
        check(&image, &[], "after every file was deleted");
        assert_eq!(free(&image), empty, "{block_size}: free blocks and inodes");
    }
}

/// e2fsck is clean on `image`, and a kernel loop mount reads `expected`.
fn check(image: &Path, expected: &[(String, String, Vec<u8>)], when: &str) {
    e2e::fsck_clean(image, when);
    let mnt = image.with_extension("mnt");
    let kernel = KernelMount::mount(image, &mnt, true);
    for (file, name, value) in expected {
        let read = e2e::get_xattr(&kernel.path(file.trim_start_matches('/')), name.as_bytes())
            .unwrap_or_else(|error| panic!("{when}: the kernel reads {file} {name}: {error}"));
        assert!(
            read == *value,
            "{when}: {file} {name} differs through the kernel"
        );
    }
    kernel.unmount();
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

/// A nearly full volume, filled with large values until ENOSPC: each file
/// gets a value that fills its inode body, then one that needs an EA inode
/// and, the body being full, a new xattr block for its entry. Whichever of
/// the blocks, the inodes or the EA inode's own blocks run out first, the
/// setxattr that meets ENOSPC leaves nothing behind: e2fsck (which finds
/// an EA inode no entry names, and a block or an inode allocated to
/// nothing) is clean, every value set before it reads back through the
/// kernel, and once every file is deleted the free counts are where they
/// began. Value sizes vary so that the boundary falls on every step.
#[test]
fn enospc_while_making_an_ea_inode_leaves_nothing_behind() {
    if !e2e::require_e2e() {
        return;
    }
    // (label, mke2fs arguments): blocks run out first, then inodes.
    let shapes: [(&str, &[&str]); 2] = [
        (
            "blocks",
            &[
                "-t", "ext4", "-b", "1024", "-O", "ea_inode", "-m", "0", "-N", "4096",
            ],
        ),
        (
            "inodes",
            &[
                "-t", "ext4", "-b", "1024", "-O", "ea_inode", "-m", "0", "-N", "64",
            ],
        ),
    ];
    for (label, args) in shapes {
        for (extra, value_len) in [1_500usize, 2_100, 3_000, 5_000].into_iter().enumerate() {
            let scratch = e2e::scratch(&format!("ea-inode-enospc-{label}-{value_len}"));
            let image = common::mkfs(scratch.path(), "full", 4, args);
            let free = |image: &Path| {
                let text = common::journal::debugfs_commands(image, "stats");
                let count = |label: &str| -> u64 {
                    let line = text.lines().find(|line| line.starts_with(label)).unwrap();
                    line[label.len()..].trim().parse().unwrap()
                };
                (count("Free blocks:"), count("Free inodes:"))
            };
            let empty = free(&image);
            let opened = Image::open(&image).unwrap();
            // In a directory of their own, removed at the end: the root
            // keeps the blocks it grows by.
            opened.create_dir("/d").unwrap();
            let mut expected: Vec<(String, String, Vec<u8>)> = Vec::new();
            let mut files = Vec::new();
            // Empty files first, 0 to 3 of them: the last free inode is
            // then taken by a file or by an EA inode in turn.
            for n in 0..extra {
                let file = format!("/d/e{n}");
                opened.write(&file, "").unwrap();
                files.push(file);
            }
            let mut failed = None;
            'fill: for n in 0..10_000u64 {
                let file = format!("/d/f{n}");
                if let Err(error) = opened.write(&file, "") {
                    failed = Some(("create", error));
                    break;
                }
                files.push(file.clone());
                // 60 bytes fill the body of a 256-byte inode; the big
                // value's entry then needs an xattr block.
                let values = [
                    ("user.fill", e2e::pattern(n, 60)),
                    (
                        "user.big",
                        e2e::pattern(1_000 + n, value_len + n as usize % 700),
                    ),
                ];
                for (name, value) in values {
                    match opened.set_xattr(&file, name, &value) {
                        Ok(()) => expected.push((file.clone(), name.to_string(), value)),
                        Err(error) => {
                            failed = Some(("setxattr", error));
                            break 'fill;
                        }
                    }
                }
            }
            let (what, error) = failed.expect("the volume never filled");
            assert_eq!(
                error.raw_os_error(),
                Some(libc::ENOSPC),
                "{label} {value_len}: {what} failed with {error}"
            );
            // Then, on the file whose large value failed (its body full,
            // no xattr block yet), values a block smaller each time: one of
            // them needs exactly the blocks left for its EA inode, and the
            // xattr block its entry needs on top is then one too many.
            if what == "setxattr" {
                let file = files.last().unwrap();
                for blocks in (1..=7usize).rev() {
                    let name = format!("user.drain{blocks}");
                    let value = e2e::pattern(blocks as u64, blocks * 1024 - 50);
                    match opened.set_xattr(file, &name, &value) {
                        Ok(()) => expected.push((file.clone(), name, value)),
                        Err(error) => assert_eq!(
                            error.raw_os_error(),
                            Some(libc::ENOSPC),
                            "{label} {value_len}: {blocks} blocks: {error}"
                        ),
                    }
                }
            }
            let sets = expected.len();
            eprintln!("{label} {value_len}: ENOSPC at {what} after {sets} values");
            opened.close().unwrap();
            check(
                &image,
                &expected,
                &format!("{label} {value_len}: ENOSPC after {sets} values ({what})"),
            );

            let opened = Image::open(&image).unwrap();
            for file in &files {
                opened.remove_file(file).unwrap();
            }
            opened.remove_dir("/d").unwrap();
            opened.close().unwrap();
            e2e::fsck_clean(&image, &format!("{label} {value_len}: every file deleted"));
            assert_eq!(
                free(&image),
                empty,
                "{label} {value_len}: free blocks and inodes"
            );
        }
    }
}

/// Equal values share one EA inode, as the kernel's do: jext4 sets one
/// 10,000-byte value on three files (twice on one of them), and the four
/// references cost one inode; e2fsck checks the count, the kernel reads
/// every copy and drops three of the references (a removal, a file
/// deleted), jext4 reads the last one and drops it, and the EA inode is
/// freed with it.
#[test]
fn equal_values_share_one_ea_inode() {
    if !e2e::require_e2e() {
        return;
    }
    let scratch = e2e::scratch("ea-inode-share");
    let image = common::mkfs(
        scratch.path(),
        "ea-share",
        64,
        &["-t", "ext4", "-b", "4096", "-O", "ea_inode"],
    );
    let free_inodes = |image: &Path| -> u64 {
        let text = common::journal::debugfs_commands(image, "stats");
        let line = text
            .lines()
            .find(|line| line.starts_with("Free inodes:"))
            .unwrap();
        line["Free inodes:".len()..].trim().parse().unwrap()
    };
    let empty = free_inodes(&image);
    let value = e2e::pattern(21, 10_000);
    let opened = Image::open(&image).unwrap();
    for file in ["/f1", "/f2", "/f3"] {
        opened.write(file, "contents\n").unwrap();
        opened.set_xattr(file, "user.big", &value).unwrap();
    }
    opened.set_xattr("/f1", "user.again", &value).unwrap();
    // Another value of the same length: an EA inode of its own.
    opened
        .set_xattr("/f2", "user.other", e2e::pattern(22, 10_000))
        .unwrap();
    opened.close().unwrap();
    assert_eq!(
        empty - free_inodes(&image),
        3 + 2,
        "three files and two EA inodes: the equal values did not share one"
    );
    e2e::fsck_clean(&image, "after jext4 shared an EA inode");

    let mnt = scratch.path().join("mnt");
    let kernel = KernelMount::mount(&image, &mnt, false);
    for (file, name) in [
        ("f1", "user.big"),
        ("f1", "user.again"),
        ("f2", "user.big"),
        ("f3", "user.big"),
    ] {
        assert_eq!(
            e2e::get_xattr(&kernel.path(file), name.as_bytes()).unwrap(),
            value,
            "the kernel reads {file} {name}"
        );
    }
    e2e::remove_xattr(&kernel.path("f1"), "user.big").unwrap();
    e2e::remove_xattr(&kernel.path("f1"), "user.again").unwrap();
    std::fs::remove_file(kernel.path("f2")).unwrap();
    kernel.unmount();
    e2e::fsck_clean(&image, "after the kernel dropped three references");

    let opened = Image::open(&image).unwrap();
    assert_eq!(opened.xattr("/f3", "user.big").unwrap(), Some(value));
    opened.remove_xattr("/f3", "user.big").unwrap();
    opened.close().unwrap();
    e2e::fsck_clean(&image, "after jext4 dropped the last reference");
    assert_eq!(
        empty - free_inodes(&image),
        2,
        "f1 and f3 left: the shared EA inode was not freed with its last reference"
    );
}
