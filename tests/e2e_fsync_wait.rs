//! An fsync waiting for its commit holds no `/dev/fuse` worker: the
//! workers hand fsync and fsyncdir to threads of their own
//! (`src/fuse/sync_pool.rs`), so a mount with one worker keeps answering
//! while an fsync waits — requests that need no block from the device:
//! one that must read a block waits for the device, rightly. The wait is real: the image is served by nbdkit,
//! stopped (SIGSTOP) while the fsync is under way, so its barrier gets no
//! reply until the test lets the server run again.

// The jext4 binary, or the mounts and helpers of tests/common that use it.
#![cfg(feature = "cli")]

mod common;

use common::e2e::{self, JextMount};
use common::nbd::{Listen, NbdServer, servers_available};
use std::io::Write;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, mpsc};
use std::time::Duration;

/// How long the mount may take to answer while the fsync waits: far more
/// than a few lookups need, and less than the NBD client's reply timeout
/// (30 s), after which the stopped server would fail the fsync.
const ANSWER_WITHIN: Duration = Duration::from_secs(15);

fn stat_in_flight(mountpoint: &Path) -> u64 {
    let stats = e2e::jext4_stats(mountpoint);
    stats
        .lines()
        .find_map(|line| line.strip_prefix("fuse_requests_in_flight "))
        .and_then(|value| value.trim().parse().ok())
        .unwrap_or_else(|| panic!("no fuse_requests_in_flight in:\n{stats}"))
}

/// Free blocks by statfs(2).
fn free_blocks(path: &Path) -> u64 {
    let c_path = std::ffi::CString::new(e2e::path_str(path)).unwrap();
    // SAFETY: statvfs is plain old data; all zeros is a valid value.
    let mut buf: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: a valid C string and a buffer of the right type.
    let rc = unsafe { libc::statvfs(c_path.as_ptr(), &mut buf) };
    assert_eq!(rc, 0, "statfs: {}", std::io::Error::last_os_error());
    buf.f_bfree as u64
}

#[test]
fn a_waiting_fsync_holds_no_worker() {
    if !servers_available() || !common::server::fuse_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let raw = common::mkfs(dir.path(), "img", 64, &["-t", "ext4", "-b", "4096"]);
    let server = NbdServer::nbdkit(
        dir.path(),
        "stopped",
        Listen::Unix,
        &["file", e2e::path_str(&raw)],
    );
    let mountpoint = dir.path().join("mnt");
    // One worker: before the pool, the fsync below held it, and nothing
    // else was answered until the server ran again.
    let mount = JextMount::try_mount_logged(
        Path::new(&server.uri),
        &mountpoint,
        "threads=1,fuse_transport=dev",
        dir.path().join("jext4.log"),
    )
    .unwrap_or_else(|(output, log)| {
        panic!(
            "jext4 mount: {}\n{log}",
            String::from_utf8_lossy(&output.stderr)
        )
    });
    for sub in ["a", "b"] {
        std::fs::create_dir(mountpoint.join(sub)).unwrap();
        std::fs::write(mountpoint.join(sub).join("warm"), b"warm").unwrap();
    }
    e2e::syncfs(&mountpoint);
    let data = e2e::pattern(7, 256 << 10);
    let mut file = std::fs::File::create(mountpoint.join("a/f")).unwrap();
    file.write_all(&data).unwrap();

    server.freeze(true);
    let synced = Arc::new(AtomicBool::new(false));
    let fsync = {
        let synced = Arc::clone(&synced);
        std::thread::spawn(move || {
            let result = file.sync_all();
            synced.store(true, Ordering::SeqCst);
            result
        })
    };
    // The answers come from another thread, so that a mount that answers
    // nothing fails the test instead of hanging it.
    let (answered, answers) = mpsc::channel();
    let root = mountpoint.clone();
    std::thread::spawn(move || {
        // The fsync is under way once two requests are: it and the stats
        // request asking.
        while stat_in_flight(&root) < 2 {
            std::thread::sleep(Duration::from_millis(10));
        }
        // Requests that need no block from the stopped server (a create or
        // a read may: it rightly waits then): statfs and another stats.
        let statfs = free_blocks(&root);
        let in_flight = stat_in_flight(&root);
        let _ = answered.send((statfs, in_flight));
    });
    let outcome = answers.recv_timeout(ANSWER_WITHIN);
    let waiting = !synced.load(Ordering::SeqCst);
    server.freeze(false);
    let synced_result = fsync.join().unwrap();
    let (statfs, in_flight) = outcome.unwrap_or_else(|_| {
        panic!("the mount answered nothing within {ANSWER_WITHIN:?} while an fsync waited")
    });
    assert!(
        waiting,
        "the fsync returned while its server was stopped: the test proves nothing"
    );
    synced_result.expect("the fsync, once the server ran again");
    assert!(statfs > 0, "statfs saw no free blocks");
    assert!(in_flight >= 2, "{in_flight} requests in flight");
    mount.unmount();
    drop(server);
    e2e::fsck_clean(&raw, "after the mount");
    let image = jext4::Image::open(&raw).unwrap();
    assert_eq!(image.read("/a/f").unwrap(), data);
    image.close().unwrap();
}
