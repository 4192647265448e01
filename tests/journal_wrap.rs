//! Wrap-around: long workloads on the smallest journal mke2fs makes
//! (`-J size=1` on a 1 KiB-block image: 1024 journal blocks) go round the
//! circular log many times, with checkpoints moving its tail in between.
//! The image is `e2fsck -fn` clean after a clean unmount, and after a
//! kill -9 (replayed by both e2fsck and jext4, identically). How often the
//! log wrapped is measured from the journal superblock (its tail, s_start,
//! sampled while the workload runs) and from the server's statistics.
//!
//! `JEXT4_WRAP_SECONDS` lengthens the FUSE workload (default 6 s).

// The jext4 binary, or the mounts and helpers of tests/common that use it.
#![cfg(feature = "cli")]

mod common;

use common::journal::{fs_superblock, journal_blocks_from_debugfs, log_wraps};
use common::server::{KeepOnPanic, Server, fuse_available, replay_both};
use common::workload::{self, Rng};
use jext4::engine::journal::format::JournalSuperblock;
use std::os::unix::fs::FileExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

const SMALLEST_JOURNAL: &[&str] = &["-t", "ext4", "-b", "1024", "-J", "size=1"];

/// Samples an image's journal superblock while a server writes it (the
/// server's writes are in the page cache, which reads see).
struct TailWatch {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<TailMoves>,
}

#[derive(Debug, Default, Clone, Copy)]
struct TailMoves {
    samples: u64,
    /// The tail moved forward (a checkpoint retired transactions).
    advances: u64,
    /// The tail moved back to the start of the log: one more lap.
    wraps: u64,
    first_sequence: u32,
    last_sequence: u32,
}

impl TailWatch {
    fn start(image: &Path) -> TailWatch {
        let block_size = fs_superblock(image).block_size() as u64;
        let offset = journal_blocks_from_debugfs(image)[0] * block_size;
        let file = std::fs::File::open(image).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            let mut moves = TailMoves::default();
            let mut last_start = 0;
            let mut bytes = vec![0u8; 1024];
            while !stopping.load(Ordering::Relaxed) {
                file.read_exact_at(&mut bytes, offset).unwrap();
                // A sample torn by a concurrent write fails its checksum.
                if let Ok(superblock) = JournalSuperblock::decode(&bytes)
                    && superblock.checksum_matches()
                {
                    moves.samples += 1;
                    if moves.first_sequence == 0 {
                        moves.first_sequence = superblock.sequence;
                    }
                    moves.last_sequence = superblock.sequence;
                    let start = superblock.start;
                    if start != 0 && last_start != 0 && start != last_start {
                        if start < last_start {
                            moves.wraps += 1;
                        } else {
                            moves.advances += 1;
                        }
                    }
                    if start != 0 {
                        last_start = start;
                    }
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            moves
        });
        TailWatch { stop, thread }
    }

    fn finish(self) -> TailMoves {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap()
    }
}

/// `name value` lines of the statistics the server leaves at unmount
/// (`jext4 stats MOUNTPOINT` reads them after the unmount too).
fn server_stats(mountpoint: &Path) -> std::collections::HashMap<String, u64> {
    let text = common::server::jext4(&["stats", mountpoint.to_str().unwrap()]);
    text.lines()
        .filter_map(|line| {
            let (name, value) = line.split_once(' ')?;
            Some((name.to_string(), value.parse().ok()?))
        })
        .collect()
}

/// Run the mixed workload for `seconds` on a fresh server, unmount
/// cleanly; returns the tail movements and the server's statistics.
fn run_and_unmount(
    image: &Path,
    tarball: &Path,
    seed: u64,
    seconds: u64,
) -> (TailMoves, std::collections::HashMap<String, u64>) {
    let server = Server::start(image, "commit=1");
    let watch = TailWatch::start(image);
    let running = workload::start(&server.mountpoint.join("clean"), tarball, seed, true);
    std::thread::sleep(Duration::from_secs(seconds));
    running.request_stop();
    let outcome = running.join();
    let mountpoint = server.mountpoint.clone();
    let ending = server.unmount();
    let moves = watch.finish();
    ending.assert_clean_exit();
    println!("workload: {}", outcome.summary());
    (moves, server_stats(&mountpoint))
}

#[test]
fn fuse_workload_wraps_the_smallest_journal() {
    if !fuse_available() {
        return;
    }
    let seed = workload::seed_from_env("JEXT4_WRAP_SEED");
    let seconds = workload::env_number("JEXT4_WRAP_SECONDS", 6);
    let dir = KeepOnPanic::new();
    let tarball = workload::doc_tarball(dir.path());
    let image = common::mkfs(dir.path(), "wrap", 32, SMALLEST_JOURNAL);
    let log_blocks = journal_blocks_from_debugfs(&image).len() as u64 - 1;
    assert_eq!(
        log_blocks, 1023,
        "mke2fs -J size=1 gives 1024 journal blocks"
    );
    let mut rng = Rng::new(seed);

    // A long run, then a clean unmount.
    let (moves, stats) = run_and_unmount(&image, &tarball, rng.next_u64(), seconds);
    let logged = stats.get("journal_blocks_logged").copied().unwrap_or(0);
    let commits = stats.get("journal_commits").copied().unwrap_or(0);
    // Each commit writes at least a descriptor (or revoke block) and a
    // commit block besides the blocks it logs.
    let laps = (logged + 2 * commits) / log_blocks;
    println!(
        "clean run: {commits} commits, {logged} blocks logged (>= {laps} laps of the log), \
         tail seen to advance {} times and wrap {} times, transactions {}..{}",
        moves.advances, moves.wraps, moves.first_sequence, moves.last_sequence
    );
    assert_eq!(stats.get("write_ahead_guard_events"), Some(&0), "{stats:?}");
    assert!(laps >= 3, "the log went round only {laps} times");
    assert!(
        moves.wraps >= 2,
        "the tail was seen wrapping {} times",
        moves.wraps
    );
    common::assert_fsck_clean(&image);
    remove_tree(&image, "/clean");

    // Then kills: two at random moments, then ones aimed at a moment when
    // the live log runs across the end of the journal (watched on
    // snapshots of the image), until a crash image shows such a log.
    let blocks = journal_blocks_from_debugfs(&image);
    let mut wrapped_kills = 0;
    for attempt in 0..8 {
        let aim_at_wrap = attempt >= 2;
        let (crash, model) =
            kill_during_workload(&image, &blocks, &tarball, &mut rng, attempt, aim_at_wrap);
        let wrapped = log_wraps(&crash, &blocks);
        wrapped_kills += wrapped as u32;
        let recovered = replay_both(&crash);
        let checked = workload::verify_model(&recovered, &format!("kill{attempt}"), &model);
        println!(
            "kill {attempt}: the live log wrapped: {wrapped}; both replays clean and equal; \
             {checked} names verified"
        );
        // Continue from the recovered image, so the log keeps turning,
        // without this round's trees: each round adds up to three untarred
        // trees and the durable files, and eight rounds would fill the
        // 32 MiB image (seen as ENOSPC in one run of four).
        remove_tree(&recovered, &format!("/kill{attempt}"));
        std::fs::rename(&recovered, &image).unwrap();
        if aim_at_wrap && wrapped {
            break;
        }
    }
    assert!(wrapped_kills >= 1, "no kill hit a wrapped log");
}

/// Remove `path` and everything under it from `image` through the library
/// (a clean unmount follows), so that the next round starts with room.
fn remove_tree(image: &Path, path: &str) {
    let opened = jext4::Image::open(image).unwrap();
    opened.remove_dir_all(path).unwrap();
    let free = opened.fs().statfs().free_blocks;
    opened.close().unwrap();
    println!("removed {path}: {free} blocks free");
}

/// Mount `image`, run the workload, kill the server at a random moment
/// or (`aim_at_wrap`) as soon as a snapshot of the image shows a live log
/// that wraps; returns a copy of the crashed image and the workload's
/// model of what must be there.
fn kill_during_workload(
    image: &Path,
    blocks: &[u64],
    tarball: &Path,
    rng: &mut Rng,
    attempt: u32,
    aim_at_wrap: bool,
) -> (PathBuf, workload::Model) {
    let server = Server::start(image, "commit=1");
    let root = server.mountpoint.join(format!("kill{attempt}"));
    let running = workload::start(&root, tarball, rng.next_u64(), attempt % 2 == 1);
    let started = std::time::Instant::now();
    if aim_at_wrap {
        while started.elapsed() < Duration::from_secs(20) && !log_wraps(image, blocks) {
            std::thread::sleep(Duration::from_millis(20));
        }
    } else {
        std::thread::sleep(Duration::from_millis(500 + rng.below(2500)));
    }
    println!(
        "kill {attempt}: before the kill, {}",
        workload::space_report(&server.mountpoint)
    );
    running.expect_kill();
    let ending = server.kill9();
    ending.assert_killed();
    let outcome = running.join();
    println!(
        "kill {attempt} after {:?}: {}",
        started.elapsed(),
        outcome.summary()
    );
    let crash = image.with_extension(format!("crash{attempt}.img"));
    std::fs::copy(image, &crash).unwrap();
    (crash, outcome.model)
}

/// The same through the library: many fsyncs on the smallest journal;
/// the statistics show the laps, the guard stays silent, e2fsck is happy.
#[test]
fn library_workload_wraps_the_smallest_journal() {
    use jext4::Image;
    let dir = tempfile::tempdir().unwrap();
    let path = common::mkfs(dir.path(), "libwrap", 32, SMALLEST_JOURNAL);
    let image = Image::open(&path).unwrap();
    let mut rng = Rng::new(7);
    image.create_dir("/d").unwrap();
    for round in 0..3000u32 {
        let name = format!("/d/f{}", round % 400);
        let file = image
            .open_with(
                &name,
                jext4::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .create(true)
                    .mode(0o644),
            )
            .unwrap();
        file.set_len(0).unwrap();
        let len = rng.below(6000) as usize;
        file.write_all_at(&rng.bytes(len), 0).unwrap();
        file.sync_all().unwrap();
        drop(file);
        if round % 7 == 0 {
            image
                .remove_file(format!("/d/f{}", rng.below(400)))
                .or_else(|e| match e {
                    jext4::Error::NotFound => Ok(()),
                    e => Err(e),
                })
                .unwrap();
        }
    }
    let stats = image.fs().journal_stats().jbd2.unwrap();
    let laps = (stats.blocks_logged + 2 * stats.commits) / 1023;
    println!("{stats:?}: at least {laps} laps of the log");
    assert!(laps >= 5, "{stats:?}");
    assert!(stats.checkpoints >= 5, "{stats:?}");
    assert_eq!(stats.guard_violations, 0, "{stats:?}");
    image.close().unwrap();
    common::assert_fsck_clean(&path);
}
