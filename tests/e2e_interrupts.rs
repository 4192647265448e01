//! A caller that takes a signal while its request is in the server (here
//! dd, whose SIGUSR1 handler prints its progress) makes the kernel send
//! FUSE_INTERRUPT. jext4 lets the request run to its end, as the protocol
//! allows; fuser answers the interrupt with ENOSYS on the descriptor that
//! read it, which the kernel refuses (ENOENT) when another worker's
//! descriptor holds the request. That refusal is not an error: the
//! server's log must hold no ERROR (`src/fuse/interrupts.rs`; the crash
//! tests fail on one), the writes must all land, the image stay clean.

// The jext4 binary, or the mounts and helpers of tests/common that use it.
#![cfg(feature = "cli")]

mod common;

use common::server::{KeepOnPanic, Server, fuse_available};
use std::process::Command;
use std::time::Duration;

/// Rounds of one dd each, and its size: synchronous 1 MiB writes, each a
/// WRITE and a commit, so that a signal mostly finds a request in flight.
const ROUNDS: usize = 8;
const BLOCKS: u64 = 24;
const BLOCK: u64 = 1 << 20;

#[test]
fn interrupted_requests_complete_and_log_no_error() {
    if !fuse_available() {
        return;
    }
    let dir = KeepOnPanic::new();
    let image = common::mkfs(dir.path(), "interrupts", 256, &["-t", "ext4"]);
    let server = Server::start(&image, "");
    let mut signals = 0;
    for round in 0..ROUNDS {
        let file = server.mountpoint.join(format!("f{round}"));
        let mut dd = Command::new("dd")
            .arg("if=/dev/zero")
            .arg(format!("of={}", file.display()))
            .arg(format!("bs={BLOCK}"))
            .arg(format!("count={BLOCKS}"))
            // fullblock: a read of /dev/zero that the signal cuts short
            // would otherwise make a short block of its own.
            .args(["iflag=fullblock", "oflag=sync", "status=none"])
            .spawn()
            .unwrap();
        // dd installs its handler at start; a signal before that would
        // end it (SIGUSR1's default action).
        std::thread::sleep(Duration::from_millis(20));
        let status = loop {
            if let Some(status) = dd.try_wait().unwrap() {
                break status;
            }
            // SAFETY: kill(2) on the pid of our own unreaped child.
            unsafe { libc::kill(dd.id() as i32, libc::SIGUSR1) };
            signals += 1;
            std::thread::sleep(Duration::from_millis(2));
        };
        assert!(status.success(), "dd round {round}: {status}");
        let written = std::fs::metadata(&file).unwrap().len();
        assert_eq!(
            written,
            BLOCKS * BLOCK,
            "round {round}: a write was cut short"
        );
    }
    assert!(signals > ROUNDS, "dd ended before it could be signalled");
    server.unmount().assert_clean_exit();
    common::assert_fsck_clean(&image);
}
