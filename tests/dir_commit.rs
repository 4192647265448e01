//! Per-directory fast commits: an fsync in one directory returns while
//! another directory's commit is held back, and with one global scope
//! (`-o fast_commit=global`) it does not.
//!
//! The device under the engine holds back the write-back of one
//! directory's data — recognised by its bytes — until the test releases
//! it: that directory's commit is stuck before it reaches the fast-commit
//! area, as behind a slow stream of its own (256 KiB: more than a commit
//! leaves to its group's barrier, `WRITE_BACK_ALONE`).
//!
//! An inode number freed by the held commit is not given to a new file
//! of the other directory (which would tie that file's commit to it).
//!
//! The image as it stands when /a's fsync returns is a crash state: the
//! kernel's replay and jext4's must both hold /a's file and not /b's.

// The jext4 binary, or the mounts and helpers of tests/common that use it.
#![cfg(feature = "cli")]

mod common;

use jext4::engine::dev::{BlockDevice, FileDevice};
use jext4::engine::fs::{Caller, Fs, MountOptions};
use std::io;
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// The bytes of /b's file: a write-back of a range holding them is held.
const HELD_PATTERN: &[u8; 16] = b"held back: dir b";

/// /b's file: 256 KiB of `HELD_PATTERN` (more than a commit leaves to its
/// group's barrier).
fn held_data() -> Vec<u8> {
    HELD_PATTERN
        .iter()
        .copied()
        .cycle()
        .take(256 << 10)
        .collect()
}

/// A device whose `write_back` of a range holding `HELD_PATTERN` waits
/// until `release` (and says when one is waiting); `fail_held` makes that
/// write-back fail with EIO when released.
struct StallingDevice {
    inner: FileDevice,
    /// (a write-back is held, released)
    gate: Mutex<(bool, bool)>,
    changed: Condvar,
    fail_held: std::sync::atomic::AtomicBool,
}

impl StallingDevice {
    fn holds_pattern(&self, ranges: &[(u64, u64)]) -> io::Result<bool> {
        for &(offset, len) in ranges {
            let mut bytes = vec![0u8; len as usize];
            self.inner.read_at(offset, &mut bytes)?;
            if bytes.windows(HELD_PATTERN.len()).any(|w| w == HELD_PATTERN) {
                return Ok(true);
            }
        }
        Ok(false)
    }

    fn wait_until_held(&self, fs: &Fs) {
        let gate = self.gate.lock().unwrap();
        let (gate, timeout) = self
            .changed
            .wait_timeout_while(gate, Duration::from_secs(20), |(held, _)| !*held)
            .unwrap();
        assert!(
            !timeout.timed_out() && gate.0,
            "/b's commit never reached the device: {}",
            fs.stats_report()
        );
    }

    fn release(&self) {
        self.gate.lock().unwrap().1 = true;
        self.changed.notify_all();
    }
}

impl BlockDevice for StallingDevice {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.inner.read_at(offset, buf)
    }

    fn write_at(&self, offset: u64, buf: &[u8]) -> io::Result<()> {
        self.inner.write_at(offset, buf)
    }

    fn flush(&self) -> io::Result<()> {
        self.inner.flush()
    }

    fn write_back(&self, ranges: &[(u64, u64)]) -> io::Result<()> {
        if self.holds_pattern(ranges)? {
            let mut gate = self.gate.lock().unwrap();
            gate.0 = true;
            self.changed.notify_all();
            let _released = self.changed.wait_while(gate, |(_, released)| !*released);
            if self.fail_held.load(std::sync::atomic::Ordering::SeqCst) {
                return Err(io::Error::from_raw_os_error(libc::EIO));
            }
        }
        self.inner.write_back(ranges)
    }

    fn write_durable(&self, offset: u64, buf: &[u8], ranges: &[(u64, u64)]) -> io::Result<()> {
        self.inner.write_durable(offset, buf, ranges)
    }

    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }
}

/// Mount a fresh fast_commit image on a stalling device; make /a and /b.
/// 4 KiB blocks: one block group, so /a's and /b's files share one inode
/// bitmap.
fn mounted(dir: &std::path::Path, global: bool) -> (Arc<StallingDevice>, Arc<Fs>, u32, u32) {
    let args = ["-t", "ext4", "-O", "fast_commit", "-b", "4096"];
    let image = common::mkfs(dir, "dirs", 64, &args);
    let device = Arc::new(StallingDevice {
        inner: FileDevice::open(&image, false).unwrap(),
        gate: Mutex::new((false, false)),
        changed: Condvar::new(),
        fail_held: Default::default(),
    });
    let options = MountOptions {
        // No full commit on a timer while the test holds /b's commit.
        commit_interval: Duration::from_secs(3600),
        fast_commit_global: global,
        ..MountOptions::default()
    };
    let fs = Fs::mount(device.clone() as Arc<dyn BlockDevice>, options).unwrap();
    let root = jext4::engine::format::superblock::ROOT_INO;
    let a = fs.mkdir(root, b"a", 0o755, Caller::ROOT).unwrap().ino;
    let b = fs.mkdir(root, b"b", 0o755, Caller::ROOT).unwrap().ino;
    // The directories are made durable in full (a new directory is not
    // something fast commits describe).
    fs.sync().unwrap();
    (device, fs, a, b)
}

/// Hold /b's commit at the device; fsync a new file in /a meanwhile.
/// Returns whether /a's fsync came back while /b's was held. With
/// `free_in_b`, /b's held commit also frees an inode (a durable file of
/// /b unlinked), the lowest free number when /a's file is created.
fn fsync_in_a_while_b_is_held(global: bool, free_in_b: bool) -> bool {
    let scratch = tempfile::tempdir().unwrap();
    let (device, fs, a, b) = mounted(scratch.path(), global);
    let old = fs.create(b, b"old", 0o644, Caller::ROOT).unwrap().ino;
    fs.sync().unwrap();
    let big = fs.create(b, b"big", 0o644, Caller::ROOT).unwrap().ino;
    let data = held_data();
    fs.write(big, 0, &data, Caller::ROOT).unwrap();
    if free_in_b {
        fs.unlink(b, b"old", Caller::ROOT).unwrap();
    }
    let (a_done_tx, a_done) = mpsc::channel();
    let crashed = scratch.path().join("crashed.img");
    let returned_while_held = std::thread::scope(|scope| {
        let b_fsync = scope.spawn(|| fs.fsync(big, false));
        device.wait_until_held(&fs);
        let fs = &fs;
        scope.spawn(move || {
            let small = fs.create(a, b"small", 0o644, Caller::ROOT).unwrap().ino;
            fs.write(small, 0, &[7u8; 1024], Caller::ROOT).unwrap();
            fs.fsync(small, false).unwrap();
            a_done_tx.send(small).unwrap();
        });
        // Per directory, /a's fsync returns while /b's is held: wait long
        // for it (a loaded machine is slow, and a hang would fail anyway).
        // Global, it cannot return before the release: a short look is
        // enough to see that it has not.
        let patience = Duration::from_secs(if global { 2 } else { 60 });
        let small = a_done.recv_timeout(patience);
        let returned = small.is_ok();
        if returned {
            // A crash now: everything written so far on disk, /b's commit
            // not. Replayed below.
            std::fs::copy(scratch.path().join("dirs.img"), &crashed).unwrap();
        }
        device.release();
        let small = small.unwrap_or_else(|_| {
            // Global scope: /a's fsync ends once /b's commit may go on.
            a_done
                .recv_timeout(Duration::from_secs(30))
                .expect("/a's fsync after the release")
        });
        if free_in_b {
            assert_ne!(small, old, "/b's freed inode number went to /a's file");
        }
        b_fsync.join().unwrap().unwrap();
        returned
    });
    let stats = fs.stats_report();
    fs.unmount().unwrap();
    eprintln!(
        "{}: {}",
        if global { "global" } else { "per directory" },
        stats
            .lines()
            .filter(|line| line.starts_with("fast_commit") && !line.contains("ineligible"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    drop(fs);
    common::assert_fsck_clean(&scratch.path().join("dirs.img"));
    if returned_while_held {
        assert_replays_hold_a_without_b(&crashed);
    }
    returned_while_held
}

/// The image as it was when /a's fsync returned, /b's commit held: jext4's
/// replay and the kernel's (a loop mount) both give /a/small its 1 KiB and
/// no /b/big (its commit never reached the area), clean by e2fsck.
fn assert_replays_hold_a_without_b(crashed: &std::path::Path) {
    let expect = |small: io::Result<Vec<u8>>, big_exists: bool, by: &str| {
        assert_eq!(small.unwrap(), vec![7u8; 1024], "/a/small after {by}");
        assert!(!big_exists, "/b/big after {by}: its commit was held");
    };
    if common::e2e::skip_reason().is_none() {
        let copy = crashed.with_extension("kernel.img");
        std::fs::copy(crashed, &copy).unwrap();
        let mountpoint = crashed.with_extension("mnt");
        let kernel = common::e2e::KernelMount::mount(&copy, &mountpoint, false);
        expect(
            std::fs::read(kernel.path("a/small")),
            kernel.path("b/big").exists(),
            "the kernel's replay",
        );
        kernel.unmount();
        common::assert_fsck_clean(&copy);
    } else {
        common::skip("the kernel's replay: no loop mounts here");
    }
    jext4::engine::fs::recover_image(crashed).unwrap();
    common::assert_fsck_clean(crashed);
    let image = jext4::Image::open(crashed).unwrap();
    expect(
        image.read("/a/small").map_err(io::Error::other),
        image.read("/b/big").is_ok(),
        "jext4's replay",
    );
    image.close().unwrap();
}

#[test]
fn an_fsync_in_one_directory_returns_while_anothers_commit_is_held() {
    if !common::require_tool("mke2fs") || !common::require_tool("e2fsck") {
        return;
    }
    assert!(
        fsync_in_a_while_b_is_held(false, false),
        "/a's fsync waited for /b's commit"
    );
}

/// /b's held commit frees an inode number: a new file of /a does not take
/// it (its creation would have to replay after that freeing, so it would
/// join /b's commit and wait for it).
#[test]
fn a_number_freed_by_a_held_commit_goes_to_no_other_directory() {
    if !common::require_tool("mke2fs") || !common::require_tool("e2fsck") {
        return;
    }
    assert!(
        fsync_in_a_while_b_is_held(false, true),
        "/a's fsync waited for /b's commit"
    );
}

/// The control: with one scope for the whole filesystem, /a's fsync commits
/// /b's changes too and waits for their data.
#[test]
fn with_one_global_scope_the_fsync_waits_for_the_other_directory() {
    if !common::require_tool("mke2fs") || !common::require_tool("e2fsck") {
        return;
    }
    assert!(
        !fsync_in_a_while_b_is_held(true, false),
        "/a's fsync returned while /b's commit, which it carries, was held"
    );
}

/// A write-back error is the image file's, reported once to whichever sync
/// meets it first — here /b's fsync. /a's data, written before it and not
/// yet durable, may be what was lost: /a's later fsync must not say it is
/// durable, and no fsync may after the device failed.
#[test]
fn after_a_failed_write_back_no_fsync_claims_durability() {
    if !common::require_tool("mke2fs") || !common::require_tool("e2fsck") {
        return;
    }
    let scratch = tempfile::tempdir().unwrap();
    let (device, fs, a, b) = mounted(scratch.path(), false);
    device
        .fail_held
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let small = fs.create(a, b"small", 0o644, Caller::ROOT).unwrap().ino;
    fs.write(small, 0, &[7u8; 1024], Caller::ROOT).unwrap();
    let big = fs.create(b, b"big", 0o644, Caller::ROOT).unwrap().ino;
    let data = held_data();
    fs.write(big, 0, &data, Caller::ROOT).unwrap();
    std::thread::scope(|scope| {
        let b_fsync = scope.spawn(|| fs.fsync(big, false));
        device.wait_until_held(&fs);
        device.release();
        let error = b_fsync.join().unwrap().unwrap_err();
        assert_eq!(error.errno(), libc::EIO, "/b's fsync: {error}");
    });
    let error = fs
        .fsync(small, false)
        .expect_err("/a's fsync claimed durability after the device failed");
    assert_eq!(error.errno(), libc::EIO, "/a's fsync: {error}");
    assert!(fs.sync().is_err(), "sync after the device failed");
}
