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

mod common;

use common::journal::{differences_outside_primary_superblock, dumpe2fs_needs_recovery, run};
use common::server::{Server, fuse_available, jext4};
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

fn path_str(path: &Path) -> &str {
    path.to_str().unwrap()
}

/// Replay with e2fsck and with jext4 on two copies, check both clean and
/// identical; returns jext4's copy.
fn replay_both(crash: &Path) -> std::path::PathBuf {
    let theirs = crash.with_extension("e2fsck.img");
    let ours = crash.with_extension("jext4.img");
    std::fs::copy(crash, &theirs).unwrap();
    std::fs::copy(crash, &ours).unwrap();
    let (code, said_e2fsck) = run("e2fsck", &["-p", "-E", "journal_only", path_str(&theirs)]);
    assert!(
        code <= 1,
        "e2fsck -p -E journal_only ({code}):\n{said_e2fsck}"
    );
    let said_jext4 = jext4(&["recover", path_str(&ours)]);
    let block_size = common::journal::fs_superblock(crash).block_size() as usize;
    let differing = differences_outside_primary_superblock(
        &std::fs::read(&theirs).unwrap(),
        &std::fs::read(&ours).unwrap(),
        block_size,
    );
    assert!(
        differing.is_empty(),
        "e2fsck and jext4 replays differ in blocks {:?}\ne2fsck: {said_e2fsck}\njext4: {said_jext4}",
        &differing[..differing.len().min(20)]
    );
    let (code, text) = run("e2fsck", &["-fn", path_str(&theirs)]);
    assert_eq!(
        code, 0,
        "e2fsck -fn after e2fsck's replay ({said_e2fsck}):\n{text}"
    );
    let (code, text) = run("e2fsck", &["-fn", path_str(&ours)]);
    assert_eq!(
        code, 0,
        "e2fsck -fn after jext4 recover ({said_jext4}):\n{text}"
    );
    ours
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
    let running = workload::start(&root, tarball, rng.next_u64());
    let delay = Duration::from_millis(100 + rng.below(2400));
    std::thread::sleep(delay);
    running.expect_kill();
    let ending = server.kill9();
    let outcome = running.join();
    ending.assert_killed();
    assert!(
        dumpe2fs_needs_recovery(&image),
        "a killed server must leave needs_recovery set"
    );
    let started = Instant::now();
    let recovered = replay_both(&image);
    let checked = workload::verify_model(&recovered, &outcome.model);
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
    let seed = workload::seed_from_env("JEXT4_KILL_SEED");
    let rounds = workload::env_number("JEXT4_KILL_ROUNDS", 3);
    let dir = tempfile::tempdir().unwrap();
    // A failing round leaves its images for inspection.
    let dir = KeepOnPanic(Some(dir));
    let dir = dir.0.as_ref().unwrap();
    let tarball = workload::doc_tarball(dir.path());
    let mut rng = Rng::new(seed ^ config.name.len() as u64);
    for round in 0..rounds {
        kill_round(dir.path(), config, &tarball, &mut rng, round);
    }
}

/// Keeps the directory (and says where) if the test fails.
struct KeepOnPanic(Option<tempfile::TempDir>);

impl Drop for KeepOnPanic {
    fn drop(&mut self) {
        if std::thread::panicking()
            && let Some(dir) = self.0.take()
        {
            eprintln!("images kept in {}", dir.keep().display());
        }
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
