//! data=journal: jext4 logs file data in the journal with the metadata
//! that maps it, and the kernel and e2fsck replay it.
//!
//! - Written with `-o data=journal` and fsynced, a file's new bytes are in
//!   the log and not yet home: a copy of the image taken then (a crash)
//!   still shows the old bytes to debugfs, which reads home blocks; e2fsck's
//!   replay and jext4's are identical, and both, like a kernel mount's
//!   replay, give the new bytes — blocks that start with the JBD2 magic
//!   included (escaped in the log).
//! - The per-inode flag (`chattr +j`, here set by debugfs) journals one
//!   file's data on a data=ordered mount; freeing such a file's blocks
//!   revokes them, so a file written in place over them after a crash
//!   replay keeps its bytes.
//! - The data mode is decided as the kernel decides it: the superblock's
//!   default (`tune2fs -o journal_data`) unless an option says otherwise,
//!   delalloc refused with data=journal, and no data= on an image without
//!   a journal.
//! - After every workload `e2fsck -fn` is clean and a kernel loop mount
//!   reads the same bytes.

mod common;

use common::journal::{Mount, kernel_available, kernel_lock, recover_both, run};
use jext4::Image;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Bytes of `len` that differ with `seed`, with the JBD2 magic at the
/// start of every block listed in `magic` (4 KiB blocks' offsets).
fn pattern(seed: u8, len: usize, magic: &[usize]) -> Vec<u8> {
    let mut bytes: Vec<u8> = (0..len)
        .map(|i| (i as u8).wrapping_mul(29).wrapping_add(seed) ^ (i >> 9) as u8)
        .collect();
    for &block in magic {
        let at = block * 4096;
        if at + 4 <= len {
            bytes[at..at + 4].copy_from_slice(&0xC03B_3998u32.to_be_bytes());
        }
    }
    bytes
}

fn mkfs(dir: &Path, name: &str, args: &[&str]) -> Option<PathBuf> {
    if !common::require_tool("mke2fs") || !common::require_tool("e2fsck") {
        return None;
    }
    Some(common::mkfs(dir, name, 32, args))
}

/// Open with a commit interval no test reaches: commits happen at fsync.
fn open(image: &Path, data_journal: Option<bool>) -> jext4::Result<Image> {
    let mut options = Image::options();
    options.commit_interval(Duration::from_secs(3600));
    if let Some(journal) = data_journal {
        options.data_journal(journal);
    }
    options.open(image)
}

/// What debugfs reads of `path` from its home blocks (no replay).
fn home_bytes(image: &Path, path: &str) -> Vec<u8> {
    let out = std::process::Command::new("debugfs")
        .args(["-R", &format!("cat {path}"), image.to_str().unwrap()])
        .output()
        .unwrap();
    out.stdout
}

/// Overwrite `bytes` at `offset` of `path` and fsync it.
fn overwrite_synced(image: &Image, path: &str, offset: u64, bytes: &[u8], datasync: bool) {
    let file = image
        .open_with(path, jext4::OpenOptions::new().write(true))
        .unwrap();
    file.write_all_at(bytes, offset).unwrap();
    match datasync {
        true => file.sync_data().unwrap(),
        false => file.sync_all().unwrap(),
    }
}

/// `image` copied while jext4 holds it open: a crash after the fsyncs.
fn crash_copy(image: &Path) -> PathBuf {
    let crash = image.with_extension("crash.img");
    std::fs::copy(image, &crash).unwrap();
    crash
}

/// The kernel's view of `image` (a copy of it: a crash image is replayed
/// by the mount).
fn kernel_reads(image: &Path, files: &[(&str, &[u8])]) {
    if !kernel_available() {
        return;
    }
    let copy = image.with_extension("kernel.img");
    std::fs::copy(image, &copy).unwrap();
    let _kernel = kernel_lock();
    let mount = Mount::new(&copy, "rw").unwrap();
    for (path, expected) in files {
        let found = std::fs::read(mount.point.join(path.trim_start_matches('/'))).unwrap();
        assert!(found == *expected, "kernel: {path} differs");
    }
    mount.unmount();
}

#[test]
fn logged_data_is_replayed_by_e2fsck_the_kernel_and_jext4() {
    for (variant, args) in [
        ("4k", &["-t", "ext4", "-b", "4096"][..]),
        ("1k", &["-t", "ext4", "-b", "1024"][..]),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let Some(path) = mkfs(dir.path(), variant, args) else {
            return;
        };
        let old = pattern(1, 96 << 10, &[]);
        {
            let image = open(&path, Some(false)).unwrap();
            image.write("/db", &old).unwrap();
            image.close().unwrap();
        }
        // An overwrite across block edges, and a new file whose blocks
        // start with the JBD2 magic.
        let patch = pattern(2, 30_000, &[]);
        let fresh = pattern(3, 40 << 10, &[0, 3, 9]);
        let image = open(&path, Some(true)).unwrap();
        overwrite_synced(&image, "/db", 5_000, &patch, true);
        let mut file = image.create_file("/fresh").unwrap();
        file.write_all(&fresh).unwrap();
        file.sync_all().unwrap();
        image.sync_dir("/").unwrap();
        let mut new = old.clone();
        new[5_000..5_000 + patch.len()].copy_from_slice(&patch);
        let crash = crash_copy(&path);
        // Logged, not home: debugfs, reading home blocks, sees the old.
        assert!(
            home_bytes(&crash, "/db") == old,
            "{variant}: an overwrite reached its blocks before the checkpoint"
        );
        let (_, ours) = recover_both(&crash);
        let recovered = open(&ours, None).unwrap();
        assert!(
            recovered.read("/db").unwrap() == new,
            "{variant}: /db after replay"
        );
        assert!(
            recovered.read("/fresh").unwrap() == fresh,
            "{variant}: /fresh after replay"
        );
        recovered.close().unwrap();
        kernel_reads(&crash, &[("/db", &new), ("/fresh", &fresh)]);
        // Through the same open image, before and after the close.
        assert!(image.read("/db").unwrap() == new);
        drop(file);
        image.close().unwrap();
        common::assert_fsck_clean(&path);
        let image = open(&path, None).unwrap();
        assert!(image.read("/db").unwrap() == new);
        assert!(image.read("/fresh").unwrap() == fresh);
        image.close().unwrap();
        kernel_reads(&path, &[("/db", &new), ("/fresh", &fresh)]);
    }
}

/// Truncates, partial blocks and rewrites of a journaled file read back as
/// written, through the open image and after it is closed.
#[test]
fn a_journaled_file_reads_back_through_every_change() {
    let dir = tempfile::tempdir().unwrap();
    let Some(path) = mkfs(dir.path(), "changes", &["-t", "ext4", "-b", "1024"]) else {
        return;
    };
    let image = open(&path, Some(true)).unwrap();
    let mut expected = pattern(4, 300_000, &[]);
    image.write("/f", &expected).unwrap();
    let steps: &[(u64, usize)] = &[(0, 1), (1023, 2), (70_000, 150_000), (299_999, 10)];
    for (round, &(offset, len)) in steps.iter().enumerate() {
        let bytes = pattern(10 + round as u8, len, &[]);
        overwrite_synced(&image, "/f", offset, &bytes, round % 2 == 0);
        let end = offset as usize + len;
        if end > expected.len() {
            expected.resize(end, 0);
        }
        expected[offset as usize..end].copy_from_slice(&bytes);
        assert!(image.read("/f").unwrap() == expected, "after write {round}");
    }
    let file = image
        .open_with("/f", jext4::OpenOptions::new().write(true))
        .unwrap();
    file.set_len(12_345).unwrap();
    expected.truncate(12_345);
    file.set_len(20_000).unwrap();
    expected.resize(20_000, 0);
    file.sync_all().unwrap();
    drop(file);
    assert!(image.read("/f").unwrap() == expected, "after the truncates");
    image.close().unwrap();
    common::assert_fsck_clean(&path);
    let image = open(&path, None).unwrap();
    assert!(image.read("/f").unwrap() == expected, "after the close");
    image.close().unwrap();
    kernel_reads(&path, &[("/f", &expected)]);
}

/// The JOURNAL_DATA flag journals one file on an ordered mount; its blocks,
/// freed, are revoked: a file written in place over them survives the
/// replay of the freed file's logged copies.
#[test]
fn the_per_inode_flag_journals_one_file_and_its_freed_blocks_are_revoked() {
    let dir = tempfile::tempdir().unwrap();
    let Some(path) = mkfs(dir.path(), "flag", &["-t", "ext4", "-b", "4096"]) else {
        return;
    };
    {
        let image = open(&path, None).unwrap();
        image
            .write("/journaled", pattern(5, 64 << 10, &[]))
            .unwrap();
        image.write("/ordered", pattern(6, 64 << 10, &[])).unwrap();
        image.close().unwrap();
    }
    // EXTENTS | JOURNAL_DATA, as `chattr +j` leaves it.
    let (code, text) = run(
        "debugfs",
        &[
            "-w",
            "-R",
            "sif /journaled flags 0x84000",
            path.to_str().unwrap(),
        ],
    );
    assert_eq!(code, 0, "{text}");
    let image = open(&path, None).unwrap();
    let patch = pattern(7, 20_000, &[]);
    overwrite_synced(&image, "/journaled", 1_000, &patch, true);
    overwrite_synced(&image, "/ordered", 1_000, &patch, true);
    let crash = crash_copy(&path);
    assert!(
        home_bytes(&crash, "/journaled") == pattern(5, 64 << 10, &[]),
        "the flagged file's overwrite reached its blocks before the checkpoint"
    );
    let mut ordered = pattern(6, 64 << 10, &[]);
    ordered[1_000..21_000].copy_from_slice(&patch);
    assert!(
        home_bytes(&crash, "/ordered") == ordered,
        "the ordered file's overwrite is not in place after its fsync"
    );
    // Free the journaled file's blocks (revoked), then fill them from an
    // ordered file written in place.
    let freed = blocks_of(&crash, "/journaled");
    image.remove_file("/journaled").unwrap();
    image.sync().unwrap();
    let filler = pattern(8, 256 << 10, &[]);
    let mut file = image.create_file("/filler").unwrap();
    file.write_all(&filler).unwrap();
    file.sync_all().unwrap();
    image.sync_dir("/").unwrap();
    let crash = crash_copy(&path);
    let (_, ours) = recover_both(&crash);
    let reused = blocks_of(&ours, "/filler");
    assert!(
        freed.iter().any(|block| reused.contains(block)),
        "the filler took none of the freed blocks ({freed:?} / {reused:?}): the test proves nothing"
    );
    let recovered = open(&ours, None).unwrap();
    assert!(
        recovered.read("/filler").unwrap() == filler,
        "a replay wrote a freed file's logged blocks over the filler"
    );
    recovered.close().unwrap();
    kernel_reads(&crash, &[("/filler", &filler), ("/ordered", &ordered)]);
    drop(file);
    image.close().unwrap();
    common::assert_fsck_clean(&path);
}

/// The data blocks of `path` as debugfs lists them.
fn blocks_of(image: &Path, path: &str) -> Vec<u64> {
    let (code, text) = run(
        "debugfs",
        &["-R", &format!("blocks {path}"), image.to_str().unwrap()],
    );
    assert_eq!(code, 0, "{text}");
    text.split_whitespace()
        .filter_map(|word| word.parse().ok())
        .collect()
}

#[test]
fn the_data_mode_is_decided_as_the_kernel_decides_it() {
    let dir = tempfile::tempdir().unwrap();
    let Some(path) = mkfs(dir.path(), "default", &["-t", "ext4", "-b", "4096"]) else {
        return;
    };
    {
        let image = open(&path, None).unwrap();
        image.write("/f", pattern(1, 32 << 10, &[])).unwrap();
        image.close().unwrap();
    }
    let (code, text) = run("tune2fs", &["-o", "journal_data", path.to_str().unwrap()]);
    assert_eq!(code, 0, "{text}");
    // The superblock's default: data=journal; an option overrides it.
    let options = [(None, true), (Some(false), false), (Some(true), true)];
    for (round, (option, logged)) in options.into_iter().enumerate() {
        let patch = pattern(20 + round as u8, 9_000, &[]);
        let image = open(&path, option).unwrap();
        let mode = if logged { "journal" } else { "ordered" };
        let report = image.fs().stats_report();
        assert!(
            report.contains(&format!("\ndata_mode {mode}\n")),
            "{report}"
        );
        let before = image.read("/f").unwrap();
        overwrite_synced(&image, "/f", 100, &patch, false);
        let crash = crash_copy(&path);
        let home = home_bytes(&crash, "/f");
        assert_eq!(
            home == before,
            logged,
            "data_journal {option:?}: the overwrite is {} home after fsync",
            if home == before { "not" } else { "already" }
        );
        image.close().unwrap();
    }
    common::assert_fsck_clean(&path);
    // data=journal with delalloc: refused, by the kernel too.
    let mut options = Image::options();
    options.data_journal(true).delalloc(true);
    let error = options.open(&path).unwrap_err().to_string();
    assert!(error.contains("data=journal and delalloc"), "{error}");
    if kernel_available() {
        let _kernel = kernel_lock();
        assert!(Mount::new(&path, "data=journal,delalloc").is_err());
    }
    // No journal: no data mode but the default.
    let bare = mkfs(dir.path(), "bare", &["-t", "ext4", "-O", "^has_journal"]).unwrap();
    let error = open(&bare, Some(true)).unwrap_err().to_string();
    assert!(error.contains("no journal"), "{error}");
    open(&bare, None).unwrap().close().unwrap();
    // Fast commits are off under data=journal, and the image stays clean.
    let fast = mkfs(dir.path(), "fast", &["-t", "ext4", "-O", "fast_commit"]).unwrap();
    let image = open(&fast, Some(true)).unwrap();
    image.write("/g", pattern(3, 10_000, &[])).unwrap();
    let file = image.open_file("/g").unwrap();
    file.sync_all().unwrap();
    drop(file);
    assert_eq!(
        image.fs().fast_commit_stats().map(|stats| stats.commits),
        None,
        "fast commits written under data=journal"
    );
    image.close().unwrap();
    common::assert_fsck_clean(&fast);
}

/// `chattr +j` through the library: the file's overwrites are logged from
/// then on; cleared, it stays journaled until the image is opened again
/// (logged copies may still await their checkpoint), then writes in place.
#[test]
fn the_flag_set_and_cleared_through_the_library() {
    let dir = tempfile::tempdir().unwrap();
    let Some(path) = mkfs(dir.path(), "toggle", &["-t", "ext4", "-b", "4096"]) else {
        return;
    };
    // Logged: the home blocks are as they were before the overwrite.
    let logged = |image: &Image, round: u8| {
        let before = home_bytes(&crash_copy(&path), "/f");
        overwrite_synced(image, "/f", 4_000, &pattern(round, 10_000, &[]), true);
        home_bytes(&crash_copy(&path), "/f") == before
    };
    // Home before the rounds: debugfs reads no log.
    let image = open(&path, None).unwrap();
    image.write("/f", pattern(1, 32 << 10, &[])).unwrap();
    image.close().unwrap();
    let image = open(&path, None).unwrap();
    assert!(!logged(&image, 2), "an ordered file's overwrite was logged");
    let flags = image.flags("/f").unwrap();
    image
        .set_flags("/f", flags | jext4::JOURNAL_DATA_FL)
        .unwrap();
    assert_ne!(image.flags("/f").unwrap() & jext4::JOURNAL_DATA_FL, 0);
    assert!(logged(&image, 3), "+j: the overwrite reached its blocks");
    image.set_flags("/f", flags).unwrap();
    assert_eq!(image.flags("/f").unwrap() & jext4::JOURNAL_DATA_FL, 0);
    assert!(logged(&image, 4), "-j before the next open: not logged");
    let expected = image.read("/f").unwrap();
    image.close().unwrap();
    common::assert_fsck_clean(&path);
    let image = open(&path, None).unwrap();
    assert!(image.read("/f").unwrap() == expected);
    assert!(!logged(&image, 5), "-j after the next open: still logged");
    image.close().unwrap();
    common::assert_fsck_clean(&path);
}
