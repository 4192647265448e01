//! ByteLog (`-o bytelog`) against the kernel, through FUSE and loop mounts:
//! - a cleanly unmounted ByteLog image is plain ext4: no BYTELOG flag,
//!   `e2fsck -fn` clean, and a kernel loop mount reads what was written;
//! - after `kill -9` of the server the image carries the flag: the kernel
//!   refuses it (its unknown-feature message), `jext4 recover` replays the
//!   ring, and the recovered image is clean and holds every file whose
//!   fsync returned, read through the kernel.

// The jext4 binary, or the mounts and helpers of tests/common that use it.
#![cfg(feature = "cli")]

mod common;

use common::journal::{Mount, fs_superblock, kernel_available, kernel_lock, run, tree};
use common::server::{KeepOnPanic, Server, fuse_available, jext4};
use jext4::engine::format::superblock::incompat;
use std::io::Write;
use std::path::Path;

fn available() -> bool {
    common::require_tool("mke2fs")
        && common::require_tool("e2fsck")
        && fuse_available()
        && kernel_available()
}

/// Files created, appended to and fsynced (or fdatasynced) one by one,
/// plus a directory fsync: the fast commits ByteLog writes.
fn write_files(root: &Path, prefix: &str) -> Vec<(String, Vec<u8>)> {
    let dir = root.join(prefix);
    std::fs::create_dir(&dir).unwrap();
    std::fs::File::open(root).unwrap().sync_all().unwrap();
    let mut written = Vec::new();
    for index in 0..12 {
        let name = format!("{prefix}/file{index}");
        let content: Vec<u8> = (0..1000 + index * 700)
            .map(|i| (i * 7 + index) as u8)
            .collect();
        let mut file = std::fs::File::create(root.join(&name)).unwrap();
        file.write_all(&content[..content.len() / 2]).unwrap();
        file.sync_all().unwrap();
        file.write_all(&content[content.len() / 2..]).unwrap();
        if index % 2 == 0 {
            file.sync_data().unwrap();
        } else {
            file.sync_all().unwrap();
        }
        written.push((name, content));
    }
    std::fs::File::open(&dir).unwrap().sync_all().unwrap();
    written
}

fn assert_holds(root: &Path, written: &[(String, Vec<u8>)]) {
    for (name, content) in written {
        let found = std::fs::read(root.join(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(
            found == *content,
            "{name}: {} bytes, not the {} written",
            found.len(),
            content.len()
        );
    }
}

fn has_bytelog_flag(image: &Path) -> bool {
    fs_superblock(image).has_incompat(incompat::BYTELOG)
}

/// `jext4 stats` once the server's counters (refreshed every 2 s) show at
/// least `fast_commits` fast commits, or after 10 s.
fn stats_showing(mountpoint: &Path, fast_commits: u64) -> String {
    let started = std::time::Instant::now();
    loop {
        let stats = jext4(&["stats", mountpoint.to_str().unwrap()]);
        let seen: u64 = stats_line(&stats, "fast_commits").parse().unwrap();
        if seen >= fast_commits || started.elapsed().as_secs() >= 10 {
            return stats;
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}

fn stats_line<'a>(stats: &'a str, key: &str) -> &'a str {
    stats
        .lines()
        .find_map(|line| line.strip_prefix(key)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("no {key} in jext4 stats:\n{stats}"))
}

/// A fast_commit image, served with `-o options`, written by
/// `write_files` until the server counted the fast commits.
fn served(dir: &Path, name: &str, options: &str) -> (Server, Vec<(String, Vec<u8>)>, String) {
    let image = common::mkfs(dir, name, 32, &["-t", "ext4", "-O", "fast_commit"]);
    let server = Server::start(&image, options);
    assert!(has_bytelog_flag(&image), "the flag is set while mounted");
    let written = write_files(&server.mountpoint, name);
    let stats = stats_showing(&server.mountpoint, 12);
    (server, written, stats)
}

/// A loop mount of `image` fails with the kernel's unknown-feature
/// message. Tried a few times: a mount can also fail to get a loop device
/// while other tests hold them, and then the kernel says nothing.
fn assert_kernel_refuses(image: &Path, point: &Path) {
    std::fs::create_dir_all(point).unwrap();
    let mut last = String::new();
    for _ in 0..3 {
        let (code, text) = run(
            "mount",
            &[
                "-o",
                "loop,ro",
                image.to_str().unwrap(),
                point.to_str().unwrap(),
            ],
        );
        if code == 0 {
            let _ = run("umount", &[point.to_str().unwrap()]);
            panic!("the kernel mounted a crashed ByteLog image");
        }
        // The kernel's message ends without a newline: the log holds it
        // back until the next message, which this one is.
        std::fs::write("/dev/kmsg", "jext4 bytelog_kernel: after a refused mount\n").unwrap();
        let (_, dmesg) = run("dmesg", &[]);
        if dmesg.contains("unsupported optional features (80000000)") {
            return;
        }
        let tail: Vec<&str> = dmesg.lines().rev().take(6).collect();
        last = format!("mount: {text}\ndmesg (newest first):\n{}", tail.join("\n"));
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    panic!("no unknown-feature message from the kernel:\n{last}");
}

#[test]
fn a_cleanly_unmounted_bytelog_image_is_plain_ext4() {
    if !available() {
        return;
    }
    let _kernel = kernel_lock();
    let dir = KeepOnPanic::new();
    let (server, written, stats) = served(dir.path(), "clean", "bytelog");
    let image = server.image.clone();
    let fast_commits: u64 = stats_line(&stats, "fast_commits").parse().unwrap();
    assert!(fast_commits >= 12, "{stats}");
    assert!(
        stats_line(&stats, "bytelog_persists")
            .parse::<u64>()
            .unwrap()
            >= fast_commits
    );
    // An image file on an ordinary filesystem: the msync fallback.
    assert_eq!(
        stats_line(&stats, "bytelog_persist_method"),
        "msync",
        "{stats}"
    );
    let ending = server.unmount();
    ending.assert_clean_exit();
    assert!(!has_bytelog_flag(&image), "a clean unmount clears the flag");
    common::assert_fsck_clean(&image);
    let mount = Mount::new(&image, "ro").expect("the kernel mounts a clean ByteLog image");
    assert_holds(&mount.point, &written);
    mount.unmount();
}

#[test]
fn a_crashed_bytelog_image_is_refused_by_the_kernel_and_recovered_by_jext4() {
    if !available() {
        return;
    }
    let _kernel = kernel_lock();
    let dir = KeepOnPanic::new();
    let (server, written, stats) = served(dir.path(), "crash", "bytelog,commit=600");
    let image = server.image.clone();
    let ending = server.kill9();
    ending.assert_killed();
    assert!(has_bytelog_flag(&image), "the crashed image keeps the flag");
    // What the fsyncs made durable is in the ring: they were fast commits
    // (the mkdir before them commits in full: a directory is ineligible).
    let fast_commits: u64 = stats_line(&stats, "fast_commits").parse().unwrap();
    assert!(fast_commits >= 12, "{stats}");
    assert_kernel_refuses(&image, &dir.path().join("refused.mnt"));
    let report = jext4(&["recover", image.to_str().unwrap()]);
    assert!(
        !has_bytelog_flag(&image),
        "recovery clears the flag: {report}"
    );
    common::assert_fsck_clean(&image);
    let mount = Mount::new(&image, "ro").expect("the kernel mounts the recovered image");
    assert_holds(&mount.point, &written);
    let listing = tree(&mount.point);
    mount.unmount();
    assert!(
        listing.iter().any(|(path, ..)| path.ends_with("file11")),
        "{listing:?}"
    );
}
