//! A panic (a bug) while a directory's fast commit is being built gives
//! its transaction back: the directory's next operations, which wait while
//! one of its transactions is being built, go on, and the next fsync takes
//! a full commit. Alone in its test binary: the panic point is global.

mod common;

use jext4::engine::dev::{BlockDevice, FileDevice};
use jext4::engine::faults::{PanicPoint, arm_panic};
use jext4::engine::format::superblock::ROOT_INO;
use jext4::engine::fs::{Caller, Fs, MountOptions};
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, mpsc};
use std::time::Duration;

#[test]
fn a_panic_while_building_a_directory_commit_leaves_the_directory_usable() {
    if !cfg!(debug_assertions) {
        eprintln!("skipped: panic points are armed only in builds with debug assertions");
        return;
    }
    if !common::require_tool("mke2fs") || !common::require_tool("e2fsck") {
        return;
    }
    let scratch = tempfile::tempdir().unwrap();
    let args = ["-t", "ext4", "-O", "fast_commit", "-b", "4096"];
    let image = common::mkfs(scratch.path(), "panic", 64, &args);
    let device = Arc::new(FileDevice::open(&image, false).unwrap());
    let options = MountOptions {
        commit_interval: Duration::from_secs(3600),
        ..MountOptions::default()
    };
    let fs = Fs::mount(device as Arc<dyn BlockDevice>, options).unwrap();
    let dir = fs.mkdir(ROOT_INO, b"d", 0o755, Caller::ROOT).unwrap().ino;
    fs.sync().unwrap();
    let file = fs.create(dir, b"f", 0o644, Caller::ROOT).unwrap().ino;
    fs.write(file, 0, &[1u8; 1024], Caller::ROOT).unwrap();
    arm_panic(PanicPoint::FastCommitBuild);
    let fsync = std::panic::catch_unwind(AssertUnwindSafe(|| fs.fsync(file, false)));
    assert!(fsync.is_err(), "the armed panic point did not fire");

    let (done, outcome) = mpsc::channel();
    let worker = fs.clone();
    // Not scoped: if the operation hangs, the test fails instead.
    std::thread::spawn(move || {
        let result = worker
            .create(dir, b"g", 0o644, Caller::ROOT)
            .and_then(|entry| {
                worker.write(entry.ino, 0, b"after the panic", Caller::ROOT)?;
                worker.fsync(entry.ino, false)?;
                worker.fsync(file, false)
            });
        done.send(result.map_err(|error| error.to_string()))
            .unwrap();
    });
    let result = outcome
        .recv_timeout(Duration::from_secs(30))
        .expect("the directory's next operation waited for the commit that panicked");
    result.unwrap();
    let stats = fs.stats_report();
    assert!(
        stats.lines().any(|line| line.starts_with("fast_commit_ineligible_failed ")
            && !line.ends_with(" 0")),
        "the given-back transaction was not marked ineligible:\n{stats}"
    );
    fs.unmount().unwrap();
    drop(fs);
    common::assert_fsck_clean(&image);
}
