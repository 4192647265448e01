//! Our journals replay under e2fsck: the jext4 server is killed with
//! SIGKILL at a random moment of a mixed workload (untar of a real tree,
//! renames, unlinks, small files made durable with fsync of the file and of
//! its directory), then, on copies of the image:
//! (a) `e2fsck -p -E journal_only` then `e2fsck -fn` is clean;
//! (b) `jext4 recover` then `e2fsck -fn` is clean;
//! (c) (a) and (b) are byte-identical outside the primary superblock;
//! (d) on (b), read through jext4 read-only, every name whose last change
//!     was made durable (its fsyncs returned before the kill) is exactly as
//!     the workload left it, and every file reads.
//!
//! SIGKILL keeps what the server wrote to the image file (the page cache
//! has it): this tests that the log is valid at every moment, not power
//! loss. The server is the binary of this build, so with debug assertions
//! (`cargo test --profile ci`) a write-ahead guard violation panics it, and
//! the test fails on the panic in its log.
//!
//! Seeded: `JEXT4_KILL_SEED` replays a run; `JEXT4_KILL_ROUNDS` sets the
//! rounds per configuration (default 3) for a long run.

// The jext4 binary, or the mounts and helpers of tests/common that use it.
#![cfg(feature = "cli")]

mod common;

use common::journal::dumpe2fs_needs_recovery;
use common::server::{KeepOnPanic, Server, fuse_available, replay_both};
use common::workload::{self, Rng};
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// One FUSE server at a time: the machine is small and the rounds are
/// timed by wall clock.
static SERIAL: Mutex<()> = Mutex::new(());

struct Config {
    name: &'static str,
    mkfs: &'static [&'static str],
    size_mib: u64,
    options: &'static str,
}

fn kill_round(dir: &Path, config: &Config, tarball: &Path, rng: &mut Rng, round: u64) {
    let image = common::mkfs(
        dir,
        &format!("{}-{round}", config.name),
        config.size_mib,
        config.mkfs,
    );
    let server = Server::start(&image, config.options);
    let root = server.mountpoint.clone();
    // Odd rounds leave orphans (files unlinked while open).
    let running = workload::start(&root, tarball, rng.next_u64(), round % 2 == 1);
    let delay = Duration::from_millis(100 + rng.below(2400));
    std::thread::sleep(delay);
    running.expect_kill();
    let ending = server.kill9();
    ending.assert_killed();
    let outcome = running.join();
    assert!(
        dumpe2fs_needs_recovery(&image),
        "a killed server must leave needs_recovery set"
    );
    let started = Instant::now();
    let recovered = replay_both(&image);
    let checked = workload::verify_model(&recovered, "", &outcome.model);
    println!(
        "{} round {round}: killed after {delay:?}; {}; {checked} names verified; checks took {:?}",
        config.name,
        outcome.summary(),
        started.elapsed()
    );
    for extension in ["e2fsck.img", "jext4.img", "img"] {
        let _ = std::fs::remove_file(image.with_extension(extension));
    }
}

fn kill_rounds(config: &Config) {
    if !fuse_available() {
        return;
    }
    let _serial = SERIAL
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    // The binary is built with this test's profile: with debug
    // assertions (ci, dev) a write-ahead violation panics the server.
    println!(
        "server {}, debug assertions {}",
        common::server::JEXT4,
        cfg!(debug_assertions)
    );
    let seed = workload::seed_from_env("JEXT4_KILL_SEED");
    let rounds = workload::env_number("JEXT4_KILL_ROUNDS", 3);
    let dir = KeepOnPanic::new();
    let tarball = workload::doc_tarball(dir.path());
    // Each configuration its own stream from the one seed.
    let mixed = config
        .name
        .bytes()
        .fold(seed, |hash, byte| hash.rotate_left(7) ^ byte as u64);
    let mut rng = Rng::new(mixed);
    for round in 0..rounds {
        kill_round(dir.path(), config, &tarball, &mut rng, round);
    }
}

#[test]
fn kill9_ext4_1k_commit_1() {
    kill_rounds(&Config {
        name: "ext4-1k-commit1",
        mkfs: &["-t", "ext4", "-b", "1024"],
        size_mib: 32,
        options: "commit=1",
    });
}

#[test]
fn kill9_ext4_1k_default_commit() {
    kill_rounds(&Config {
        name: "ext4-1k",
        mkfs: &["-t", "ext4", "-b", "1024"],
        size_mib: 32,
        options: "",
    });
}

#[test]
fn kill9_ext4_4k_commit_1() {
    kill_rounds(&Config {
        name: "ext4-4k-commit1",
        mkfs: &["-t", "ext4", "-b", "4096"],
        size_mib: 64,
        options: "commit=1",
    });
}

#[test]
fn kill9_ext4_4k_async_commit() {
    kill_rounds(&Config {
        name: "ext4-4k-async",
        mkfs: &["-t", "ext4", "-b", "4096"],
        size_mib: 64,
        options: "journal_async_commit",
    });
}

#[test]
fn kill9_smallest_journal() {
    kill_rounds(&Config {
        name: "ext4-1k-journal1M",
        mkfs: &["-t", "ext4", "-b", "1024", "-J", "size=1"],
        size_mib: 32,
        options: "commit=1",
    });
}
