//! Delayed allocation (`-o delalloc`, `src/fs/delalloc.rs`), through the
//! library: what held data reads as, where it lands, what a crash keeps,
//! and what it costs in space and memory. The oracles: the same operations
//! on a mount without delayed allocation (byte for byte), `e2fsck -fn`,
//! `debugfs`' extent lists, and crash images copied from under a live
//! mount and replayed. Crash states: `jext4 crashtest --delalloc`
//! (tests/crash_workloads.rs, tests/crash_faults.rs).

// The jext4 binary, or the mounts and helpers of tests/common that use it.
#![cfg(feature = "cli")]

mod common;

use common::e2e;
use jext4::engine::format::superblock::ROOT_INO;
use jext4::engine::fs::{Caller, Fs, MountOptions, SeekWhence};
use proptest::prelude::*;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

const GEOMETRIES: [(u32, u64); 2] = [(1024, 64), (4096, 64)];

fn make_image(dir: &Path, block_size: u32, mib: u64, extra: &[&str]) -> std::path::PathBuf {
    let block = block_size.to_string();
    let mut args = vec!["-t", "ext4", "-b", &block];
    args.extend_from_slice(extra);
    common::mkfs(dir, &format!("da{block_size}"), mib, &args)
}

/// Options of these tests: no commit or write-out by age, so that only
/// what a test does moves data.
fn options(delalloc: bool) -> MountOptions {
    MountOptions {
        delalloc,
        commit_interval: Duration::from_secs(3600),
        ..Default::default()
    }
}

fn open(image: &Path, delalloc: bool) -> Arc<Fs> {
    Fs::open(image, options(delalloc)).unwrap()
}

/// What a crash would leave: the image file as the mount has written it
/// so far (its writes reach the host's page cache), then replayed by a
/// mount of the copy.
fn crash_copy(image: &Path, name: &str) -> std::path::PathBuf {
    let copy = image.with_file_name(name);
    std::fs::copy(image, &copy).unwrap();
    copy
}

fn ino_of(fs: &Fs, parent: u32, name: &str) -> u32 {
    fs.lookup(parent, name.as_bytes()).unwrap().ino
}

fn whole(fs: &Fs, ino: u32) -> Vec<u8> {
    let size = fs.getattr(ino).unwrap().size;
    fs.read(ino, 0, size as usize).unwrap()
}

/// A thousand 1 KiB appends in turn over 200 files (blurt's pattern) are
/// held, read back as written before any block is allocated, and go out
/// as one extent per file; e2fsck finds the image clean and a mount
/// without delayed allocation reads the same bytes.
#[test]
fn interleaved_appenders_get_one_extent_per_file() {
    if !e2e::require_e2e() {
        return;
    }
    for (block_size, mib) in GEOMETRIES {
        let scratch = e2e::scratch("da-appenders");
        let image = make_image(scratch.path(), block_size, mib, &[]);
        let fs = open(&image, true);
        let dir = fs.mkdir(ROOT_INO, b"d", 0o755, Caller::ROOT).unwrap().ino;
        let files: Vec<u32> = (0..200)
            .map(|i| {
                let name = format!("f{i}");
                fs.create(dir, name.as_bytes(), 0o644, Caller::ROOT)
                    .unwrap()
                    .ino
            })
            .collect();
        let free_before = fs.statfs().free_blocks;
        let chunk = 1024;
        let data = |ino: u32, round: u64| e2e::appended(ino, round, chunk);
        e2e::append_in_turn(&fs, &files, 0..40, chunk);
        let stats = fs.delalloc_stats();
        let file_bytes = 40 * chunk as u64;
        assert_eq!(stats.bytes_held, 200 * file_bytes, "{stats:?}");
        assert_eq!(stats.blocks_written_out, 0, "{stats:?}");
        // Held blocks count as used, as the kernel's dirty clusters do.
        let held_blocks = 200 * file_bytes / block_size as u64;
        assert_eq!(fs.statfs().free_blocks, free_before - held_blocks);
        for &ino in files.iter().step_by(13) {
            let attr = fs.getattr(ino).unwrap();
            assert_eq!(attr.size, file_bytes);
            assert_eq!(attr.blocks, file_bytes / 512);
            for round in [0, 1, 39] {
                let at = round * chunk as u64;
                assert_eq!(fs.read(ino, at, chunk).unwrap(), data(ino, round));
            }
        }
        // Unmount writes everything out.
        fs.unmount().unwrap();
        drop(fs);
        e2e::fsck_clean(
            &image,
            &format!("delalloc appenders, {block_size}-byte blocks"),
        );
        let paths: Vec<String> = (0..200).map(|i| format!("/d/f{i}")).collect();
        let extents = e2e::file_extents(&image, &paths);
        let total: usize = extents.iter().map(|&(count, _)| count).sum();
        assert_eq!(total, 200, "{block_size}: {total} extents for 200 files");
        let fs = open(&image, false);
        for (&ino, i) in files.iter().zip(0..) {
            assert_eq!(ino_of(&fs, dir, &format!("f{i}")), ino);
            let expected: Vec<u8> = (0..40).flat_map(|round| data(ino, round)).collect();
            assert_eq!(whole(&fs, ino), expected, "f{i}");
        }
        fs.unmount().unwrap();
        drop(fs);
    }
}

/// fsync writes a file's held data out before it commits: a crash keeps
/// it. A file written and not synced is, after the crash, as of its last
/// write-out (empty here) — never a size over blocks nobody wrote.
#[test]
fn fsync_makes_held_data_durable_and_a_crash_shows_files_as_written_out() {
    if !e2e::require_e2e() {
        return;
    }
    for (block_size, mib) in GEOMETRIES {
        let scratch = e2e::scratch("da-fsync");
        let image = make_image(scratch.path(), block_size, mib, &[]);
        let fs = open(&image, true);
        let synced = fs
            .create(ROOT_INO, b"synced", 0o644, Caller::ROOT)
            .unwrap()
            .ino;
        let held = fs
            .create(ROOT_INO, b"held", 0o644, Caller::ROOT)
            .unwrap()
            .ino;
        let bytes = e2e::pattern(7, 5000);
        fs.write(held, 0, &bytes, Caller::ROOT).unwrap();
        fs.write(synced, 0, &bytes, Caller::ROOT).unwrap();
        fs.fsync(synced, false).unwrap();
        assert!(fs.delalloc_stats().bytes_held > 0, "held was written out");
        let crashed = crash_copy(&image, "crashed.img");
        drop(fs);
        let fs = open(&crashed, false);
        assert_eq!(whole(&fs, ino_of(&fs, ROOT_INO, "synced")), bytes);
        assert_eq!(fs.getattr(ino_of(&fs, ROOT_INO, "held")).unwrap().size, 0);
        fs.unmount().unwrap();
        e2e::fsck_clean(&crashed, "crash copy after a delalloc fsync");
    }
}

/// Writing a new file and renaming it over an old one (the replace idiom)
/// writes the new file out before the rename (the kernel's
/// auto_da_alloc): when the rename commits — here with another file's
/// fsync — the new file's bytes are on disk with it, never an empty file.
#[test]
fn a_file_renamed_over_another_is_written_out_with_the_rename() {
    if !e2e::require_e2e() {
        return;
    }
    let scratch = e2e::scratch("da-rename");
    let image = make_image(scratch.path(), 4096, 32, &[]);
    let fs = open(&image, true);
    let old = e2e::pattern(1, 3000);
    let new = e2e::pattern(2, 6000);
    let target = fs
        .create(ROOT_INO, b"config", 0o644, Caller::ROOT)
        .unwrap()
        .ino;
    fs.write(target, 0, &old, Caller::ROOT).unwrap();
    fs.sync().unwrap();
    let temp = fs
        .create(ROOT_INO, b"config.tmp", 0o644, Caller::ROOT)
        .unwrap()
        .ino;
    fs.write(temp, 0, &new, Caller::ROOT).unwrap();
    assert!(fs.delalloc_stats().bytes_held > 0);
    fs.rename(
        ROOT_INO,
        b"config.tmp",
        ROOT_INO,
        b"config",
        Default::default(),
        Caller::ROOT,
    )
    .unwrap();
    let stats = fs.delalloc_stats();
    assert_eq!(stats.bytes_held, 0, "{stats:?}");
    assert!(stats.write_outs.contains(&("rename", 1)), "{stats:?}");
    config_survives_another_fsync(fs, &image, &new, "after rename over");
}

/// Another file's fsync commits the running transaction (no fast commits
/// on these images), then a crash: `/config` must hold `expected`, and
/// the replayed copy must be clean.
fn config_survives_another_fsync(fs: Arc<Fs>, image: &Path, expected: &[u8], when: &str) {
    let other = fs
        .create(ROOT_INO, b"other", 0o644, Caller::ROOT)
        .unwrap()
        .ino;
    fs.write(other, 0, b"x", Caller::ROOT).unwrap();
    fs.fsync(other, false).unwrap();
    let crashed = crash_copy(image, "crashed.img");
    drop(fs);
    let fs = open(&crashed, false);
    assert_eq!(
        whole(&fs, ino_of(&fs, ROOT_INO, "config")),
        expected,
        "{when}"
    );
    fs.unmount().unwrap();
    e2e::fsck_clean(&crashed, &format!("crash copy {when}"));
}

/// Held data stays within its bound (a quarter of cache_size): writers
/// past it write the oldest files out.
#[test]
fn held_data_stays_within_its_memory_bound() {
    if !e2e::require_e2e() {
        return;
    }
    let scratch = e2e::scratch("da-memory");
    let image = make_image(scratch.path(), 4096, 64, &[]);
    let options = MountOptions {
        cache_size: 4 << 20,
        ..options(true)
    };
    let fs = Fs::open(&image, options).unwrap();
    let limit = fs.delalloc_stats().limit;
    assert_eq!(limit, 1 << 20);
    let files: Vec<u32> = (0..8)
        .map(|i| {
            fs.create(ROOT_INO, format!("f{i}").as_bytes(), 0o644, Caller::ROOT)
                .unwrap()
                .ino
        })
        .collect();
    let chunk = 16 << 10;
    for round in 0..64u64 {
        for &ino in &files {
            let data = e2e::pattern(ino as u64 * 1000 + round, chunk);
            fs.write(ino, round * chunk as u64, &data, Caller::ROOT)
                .unwrap();
            let held = fs.delalloc_stats().bytes_held;
            assert!(held <= limit, "{held} bytes held, bound {limit}");
        }
    }
    let stats = fs.delalloc_stats();
    assert!(
        stats
            .write_outs
            .iter()
            .any(|&(why, n)| why == "memory" && n > 0),
        "{stats:?}"
    );
    for &ino in &files {
        let expected: Vec<u8> = (0..64)
            .flat_map(|round| e2e::pattern(ino as u64 * 1000 + round, chunk))
            .collect();
        assert_eq!(whole(&fs, ino), expected);
    }
    fs.unmount().unwrap();
    e2e::fsck_clean(&image, "after the memory bound");
}

/// Appenders with delayed allocation fill the volume to the wall: the
/// first ENOSPC comes with the free blocks gone but the emergency reserve
/// (held blocks' worst-case reservations do not hide any), no write-out
/// fails, and the image is clean.
#[test]
fn appenders_fill_the_volume_and_enospc_leaves_nothing_hidden() {
    if !e2e::require_e2e() {
        return;
    }
    for (block_size, mib) in GEOMETRIES {
        let scratch = e2e::scratch("da-full");
        let image = make_image(scratch.path(), block_size, mib, &[]);
        let fs = open(&image, true);
        let files: Vec<u32> = (0..64)
            .map(|i| {
                fs.create(ROOT_INO, format!("f{i}").as_bytes(), 0o644, Caller::ROOT)
                    .unwrap()
                    .ino
            })
            .collect();
        let chunk = 8 << 10;
        let mut sizes = vec![0u64; files.len()];
        'fill: for round in 0u64.. {
            for (index, &ino) in files.iter().enumerate() {
                let data = e2e::pattern(ino as u64 * 10_000 + round, chunk);
                match fs.write(ino, sizes[index], &data, Caller::ROOT) {
                    Ok(written) => sizes[index] += written as u64,
                    Err(jext4::Error::NoSpace) => break 'fill,
                    Err(error) => panic!("{block_size}: write: {error}"),
                }
            }
        }
        let (free, emergency) = (fs.statfs().free_blocks, fs.budget_stats().emergency_reserve);
        assert!(
            free <= emergency,
            "{block_size}: {free} blocks free at root's first ENOSPC, {emergency} emergency"
        );
        assert_eq!(fs.budget_stats().reserved_delayed, 0);
        for (index, &ino) in files.iter().enumerate().step_by(7) {
            assert_eq!(fs.getattr(ino).unwrap().size, sizes[index]);
        }
        // The space comes back.
        for i in 0..64 {
            fs.unlink(ROOT_INO, format!("f{i}").as_bytes(), Caller::ROOT)
                .unwrap();
        }
        fs.unmount().unwrap();
        e2e::fsck_clean(&image, &format!("delalloc at the wall, {block_size}"));
    }
}

/// The replace idiom without a rename: truncate to zero, write the new
/// contents, close. The last close writes the file out (the kernel's
/// auto_da_alloc), so when the truncate commits — here with another
/// file's fsync — the new bytes are on disk with it.
#[test]
fn a_file_truncated_to_zero_and_rewritten_goes_out_at_its_last_close() {
    if !e2e::require_e2e() {
        return;
    }
    let scratch = e2e::scratch("da-close");
    let image = make_image(scratch.path(), 4096, 32, &[]);
    let fs = open(&image, true);
    let ino = fs
        .create(ROOT_INO, b"config", 0o644, Caller::ROOT)
        .unwrap()
        .ino;
    fs.write(ino, 0, &e2e::pattern(1, 9000), Caller::ROOT)
        .unwrap();
    fs.sync().unwrap();
    fs.open_file(ino).unwrap();
    fs.truncate(ino, 0, Caller::ROOT).unwrap();
    let new = e2e::pattern(2, 5000);
    fs.write(ino, 0, &new, Caller::ROOT).unwrap();
    assert!(fs.delalloc_stats().bytes_held > 0);
    fs.release_file(ino).unwrap();
    let stats = fs.delalloc_stats();
    assert_eq!(stats.bytes_held, 0, "{stats:?}");
    assert!(stats.write_outs.contains(&("close", 1)), "{stats:?}");
    config_survives_another_fsync(fs, &image, &new, "after truncate, rewrite, close");
}

/// Held data older than the commit interval goes out on its own.
#[test]
fn held_data_goes_out_after_the_commit_interval() {
    if !e2e::require_e2e() {
        return;
    }
    let scratch = e2e::scratch("da-age");
    let image = make_image(scratch.path(), 4096, 32, &[]);
    let options = MountOptions {
        commit_interval: Duration::from_secs(1),
        ..options(true)
    };
    let fs = Fs::open(&image, options).unwrap();
    let ino = fs.create(ROOT_INO, b"f", 0o644, Caller::ROOT).unwrap().ino;
    fs.write(ino, 0, &e2e::pattern(3, 6000), Caller::ROOT)
        .unwrap();
    assert!(fs.delalloc_stats().bytes_held > 0);
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while fs.delalloc_stats().bytes_held > 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "still held after 20 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let stats = fs.delalloc_stats();
    assert!(stats.write_outs.contains(&("age", 1)), "{stats:?}");
    fs.unmount().unwrap();
    e2e::fsck_clean(&image, "after a write-out by age");
}

/// getattr takes no lock; a write-out running meanwhile stores the new
/// size and then drops the held data. A reader must never see the file
/// shrink (a FUSE kernel would cache the shorter size).
#[test]
fn the_size_never_goes_back_while_held_data_goes_out() {
    if !e2e::require_e2e() {
        return;
    }
    let scratch = e2e::scratch("da-getattr");
    let image = make_image(scratch.path(), 4096, 64, &[]);
    let fs = open(&image, true);
    let ino = fs.create(ROOT_INO, b"f", 0o644, Caller::ROOT).unwrap().ino;
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reader = {
        let (fs, done) = (Arc::clone(&fs), Arc::clone(&done));
        std::thread::spawn(move || {
            let mut last = 0;
            let mut reads = 0u64;
            while !done.load(std::sync::atomic::Ordering::Acquire) {
                let size = fs.getattr(ino).unwrap().size;
                assert!(size >= last, "size went from {last} back to {size}");
                last = size;
                reads += 1;
            }
            reads
        })
    };
    let chunk = e2e::pattern(4, 3000);
    for round in 0..4000u64 {
        fs.write(ino, round * 3000, &chunk, Caller::ROOT).unwrap();
        if round % 3 == 2 {
            fs.fsync(ino, true).unwrap();
        }
    }
    done.store(true, std::sync::atomic::Ordering::Release);
    let reads = reader.join().unwrap();
    assert!(reads > 100, "only {reads} reads");
    fs.unmount().unwrap();
}

#[derive(Debug, Clone)]
enum Op {
    Write { at: u64, len: usize, seed: u64 },
    Truncate(u64),
    Punch { at: u64, len: u64 },
    Seek(u64),
    Fsync,
    Sync,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0u64..70_000, 1usize..9_000, any::<u64>())
            .prop_map(|(at, len, seed)| Op::Write { at, len, seed }),
        1 => (0u64..80_000).prop_map(Op::Truncate),
        1 => (0u64..60_000, 1u64..20_000).prop_map(|(at, len)| Op::Punch { at, len }),
        1 => (0u64..80_000).prop_map(Op::Seek),
        1 => Just(Op::Fsync),
        1 => Just(Op::Sync),
    ]
}

fn apply(fs: &Fs, ino: u32, op: &Op) -> String {
    let done = |result: jext4::Result<()>| format!("{result:?}");
    match op {
        Op::Write { at, len, seed } => {
            format!(
                "{:?}",
                fs.write(ino, *at, &e2e::pattern(*seed, *len), Caller::ROOT)
            )
        }
        Op::Truncate(size) => done(fs.truncate(ino, *size, Caller::ROOT)),
        Op::Punch { at, len } => done(fs.fallocate(ino, *at, *len, 0x01 | 0x02, Caller::ROOT)),
        Op::Seek(at) => format!(
            "{:?} {:?}",
            fs.seek(ino, *at, SeekWhence::Data),
            fs.seek(ino, *at, SeekWhence::Hole)
        ),
        Op::Fsync => done(fs.fsync(ino, false)),
        Op::Sync => done(fs.sync()),
    }
}

/// What a reader sees of the file: size and bytes (reads leave held data
/// held; SEEK_DATA/SEEK_HOLE, which write the file out, are ops of their
/// own).
fn observe(fs: &Fs, ino: u32) -> (u64, Vec<u8>) {
    let size = fs.getattr(ino).unwrap().size;
    let bytes = fs.read(ino, 0, size as usize + 100).unwrap();
    (size, bytes)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// Any sequence of writes, truncates, hole punches, seeks and syncs
    /// reads the same with held data as without: size and bytes after every
    /// step, what each op answered (SEEK_DATA/SEEK_HOLE's offsets) — and
    /// both images end clean.
    #[test]
    fn held_data_reads_as_written_data_does(ops in proptest::collection::vec(op(), 1..40)) {
        if !e2e::require_e2e() {
            return Ok(());
        }
        let scratch = e2e::scratch("da-model");
        let mounts: Vec<(std::path::PathBuf, Arc<Fs>, u32)> = [true, false]
            .into_iter()
            .map(|delalloc| {
                let dir = scratch.path().join(if delalloc { "on" } else { "off" });
                std::fs::create_dir(&dir).unwrap();
                let image = make_image(&dir, 1024, 8, &[]);
                let fs = open(&image, delalloc);
                let ino = fs.create(ROOT_INO, b"f", 0o644, Caller::ROOT).unwrap().ino;
                (image, fs, ino)
            })
            .collect();
        for (step, op) in ops.iter().enumerate() {
            let outcomes: Vec<String> = mounts.iter().map(|(_, fs, ino)| apply(fs, *ino, op)).collect();
            prop_assert_eq!(&outcomes[0], &outcomes[1], "step {} {:?}", step, op);
            let seen: Vec<_> = mounts.iter().map(|(_, fs, ino)| observe(fs, *ino)).collect();
            prop_assert!(seen[0] == seen[1], "step {} {:?}: sizes {} and {}", step, op, seen[0].0, seen[1].0);
        }
        for (image, fs, _) in mounts {
            fs.unmount().unwrap();
            drop(fs);
            e2e::fsck_clean(&image, "after a delalloc model run");
        }
    }
}
