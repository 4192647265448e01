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

/// A device whose reads can be held at one point: a read by the armed
/// thread longer than a block (file data, not a cached metadata block)
/// reports itself and waits, after the device has answered, until the
/// test lets it go.
struct HeldReads {
    inner: jext4::MemoryDevice,
    armed: std::sync::Mutex<Option<std::thread::ThreadId>>,
    held: std::sync::Mutex<std::sync::mpsc::Sender<()>>,
    release: std::sync::Mutex<std::sync::mpsc::Receiver<()>>,
}

impl jext4::BlockDevice for HeldReads {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        self.inner.read_at(offset, buf)?;
        let mine = {
            let mut armed = self.armed.lock().unwrap();
            let mine = buf.len() > 4096 && *armed == Some(std::thread::current().id());
            if mine {
                *armed = None;
            }
            mine
        };
        if mine {
            self.held.lock().unwrap().send(()).unwrap();
            // Bounded: a test that never lets go fails instead of hanging.
            let _ = self
                .release
                .lock()
                .unwrap()
                .recv_timeout(Duration::from_secs(60));
        }
        Ok(())
    }
    fn write_at(&self, offset: u64, buf: &[u8]) -> std::io::Result<()> {
        self.inner.write_at(offset, buf)
    }
    fn flush(&self) -> std::io::Result<()> {
        self.inner.flush()
    }
    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }
}

/// A read of a journaled file beside the checkpoint returns the committed
/// bytes: where the read asked the device first and the cache after, the
/// device could answer with the old home copy, the checkpoint then write
/// the committed copy home and the cache evict it, and the read return
/// the old bytes (which a read-modify-write then logged over the new).
/// Here the read is held right after the device answers while other
/// writes cycle the log and the cache.
#[test]
fn a_read_beside_the_checkpoint_returns_the_committed_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let Some(path) = mkfs(
        dir.path(),
        "held",
        &["-t", "ext4", "-b", "4096", "-J", "size=4"],
    ) else {
        return;
    };
    let (held_tx, held_rx) = std::sync::mpsc::channel();
    let (release_tx, release_rx) = std::sync::mpsc::channel();
    let device = std::sync::Arc::new(HeldReads {
        inner: jext4::MemoryDevice::from_bytes(std::fs::read(&path).unwrap()),
        armed: std::sync::Mutex::new(None),
        held: std::sync::Mutex::new(held_tx),
        release: std::sync::Mutex::new(release_rx),
    });
    struct Shared(std::sync::Arc<HeldReads>);
    impl jext4::BlockDevice for Shared {
        fn read_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
            self.0.read_at(offset, buf)
        }
        fn write_at(&self, offset: u64, buf: &[u8]) -> std::io::Result<()> {
            self.0.write_at(offset, buf)
        }
        fn flush(&self) -> std::io::Result<()> {
            self.0.flush()
        }
        fn size_bytes(&self) -> u64 {
            self.0.size_bytes()
        }
    }
    let mut options = Image::options();
    options
        .commit_interval(Duration::from_secs(3600))
        .data_journal(true)
        .cache_size(1 << 20);
    let image = options
        .open_device(Box::new(Shared(device.clone())))
        .unwrap();
    let old = pattern(1, 64 << 10, &[]);
    let new = pattern(2, 64 << 10, &[]);
    image.write("/a", &old).unwrap();
    image.sync().unwrap();
    // Committed, logged, cached, not home.
    overwrite_synced(&image, "/a", 0, &new, true);
    let pressure = image.create_file("/b").unwrap();
    let read = std::thread::scope(|scope| {
        let reader = scope.spawn(|| {
            *device.armed.lock().unwrap() = Some(std::thread::current().id());
            let read = image.read("/a").unwrap();
            *device.armed.lock().unwrap() = None;
            read
        });
        // Held (only where the device is read before the cache): 16 MiB of
        // another journaled file, fsynced by the 256 KiB, cycles the 4 MiB
        // log four times (checkpointing /a's transaction) and the 1 MiB
        // cache sixteen times (evicting /a's blocks once home).
        while !reader.is_finished() {
            if held_rx.recv_timeout(Duration::from_millis(10)).is_ok() {
                let bytes = pattern(3, 256 << 10, &[]);
                for round in 0..64u64 {
                    pressure.write_all_at(&bytes, round << 18).unwrap();
                    pressure.sync_data().unwrap();
                }
                release_tx.send(()).unwrap();
                break;
            }
        }
        reader.join().unwrap()
    });
    assert!(
        read == new,
        "a read beside the checkpoint returned bytes older than the commit"
    );
    drop(pressure);
    image.close().unwrap();
    std::fs::write(&path, device.inner.snapshot()).unwrap();
    common::assert_fsck_clean(&path);
}

/// A device that slows the armed thread's large writes (a write's data
/// chunks on an ordered file) until `released`, 20 ms each at most: an
/// operation queued on the file's lock meanwhile gets in between chunks.
struct SlowWrites {
    inner: jext4::MemoryDevice,
    armed: std::sync::Mutex<Option<std::thread::ThreadId>>,
    started: std::sync::atomic::AtomicBool,
    released: std::sync::atomic::AtomicBool,
}

impl SlowWrites {
    fn hold(&self, len: usize) {
        use std::sync::atomic::Ordering;
        if len < (1 << 20) || *self.armed.lock().unwrap() != Some(std::thread::current().id()) {
            return;
        }
        self.started.store(true, Ordering::SeqCst);
        for _ in 0..20 {
            if self.released.load(Ordering::SeqCst) {
                return;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

impl jext4::BlockDevice for SlowWrites {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        self.inner.read_at(offset, buf)
    }
    fn write_at(&self, offset: u64, buf: &[u8]) -> std::io::Result<()> {
        self.inner.write_at(offset, buf)?;
        self.hold(buf.len());
        Ok(())
    }
    fn write_pieces_at(&self, offset: u64, pieces: &[&[u8]]) -> std::io::Result<()> {
        let mut at = offset;
        for piece in pieces {
            self.inner.write_at(at, piece)?;
            at += piece.len() as u64;
        }
        self.hold((at - offset) as usize);
        Ok(())
    }
    fn flush(&self) -> std::io::Result<()> {
        self.inner.flush()
    }
    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }
}

/// `chattr +j` landing while a large write to the file runs: the write's
/// later chunks are journaled, cut and credited as a journaled file's
/// (not at the ordered chunk, 8 MiB with a few credits, which overran the
/// 4 MiB journal and aborted it).
#[test]
fn the_flag_set_during_a_large_write() {
    use std::sync::atomic::Ordering;
    if !common::require_tool("mke2fs") || !common::require_tool("e2fsck") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = common::mkfs(
        dir.path(),
        "racing",
        128,
        &["-t", "ext4", "-b", "4096", "-J", "size=4"],
    );
    struct Shared(std::sync::Arc<SlowWrites>);
    impl jext4::BlockDevice for Shared {
        fn read_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
            self.0.read_at(offset, buf)
        }
        fn write_at(&self, offset: u64, buf: &[u8]) -> std::io::Result<()> {
            self.0.write_at(offset, buf)
        }
        fn write_pieces_at(&self, offset: u64, pieces: &[&[u8]]) -> std::io::Result<()> {
            self.0.write_pieces_at(offset, pieces)
        }
        fn flush(&self) -> std::io::Result<()> {
            self.0.flush()
        }
        fn size_bytes(&self) -> u64 {
            self.0.size_bytes()
        }
    }
    let device = std::sync::Arc::new(SlowWrites {
        inner: jext4::MemoryDevice::from_bytes(std::fs::read(&path).unwrap()),
        armed: std::sync::Mutex::new(None),
        started: false.into(),
        released: false.into(),
    });
    let mut options = Image::options();
    options.commit_interval(Duration::from_secs(3600));
    let image = options
        .open_device(Box::new(Shared(device.clone())))
        .unwrap();
    image.write("/f", b"x").unwrap();
    let flags = image.flags("/f").unwrap();
    let data = pattern(9, 64 << 20, &[]);
    let writing = std::sync::atomic::AtomicBool::new(true);
    let landed_mid_write = std::thread::scope(|scope| {
        let writer = scope.spawn(|| {
            *device.armed.lock().unwrap() = Some(std::thread::current().id());
            let file = image
                .open_with("/f", jext4::OpenOptions::new().write(true))
                .unwrap();
            let written = file.write_at(&data, 0);
            writing.store(false, Ordering::SeqCst);
            written
        });
        while !device.started.load(Ordering::SeqCst) && !writer.is_finished() {
            std::thread::sleep(Duration::from_millis(1));
        }
        image
            .set_flags("/f", flags | jext4::JOURNAL_DATA_FL)
            .unwrap();
        let landed = writing.load(Ordering::SeqCst);
        device.released.store(true, Ordering::SeqCst);
        assert_eq!(writer.join().unwrap().unwrap(), data.len());
        landed
    });
    assert!(
        landed_mid_write,
        "the flag landed after the write: the test proves nothing"
    );
    assert_ne!(image.flags("/f").unwrap() & jext4::JOURNAL_DATA_FL, 0);
    assert!(image.read("/f").unwrap() == data, "the write reads back");
    image.sync().unwrap();
    image.close().unwrap();
    std::fs::write(&path, device.inner.snapshot()).unwrap();
    common::assert_fsck_clean(&path);
}

/// A punch and a zero range over most of a large journaled file, on a
/// 1 MiB journal: every freed block is revoked, and the records of the
/// whole range (hundreds of thousands) outgrow the journal in one
/// transaction; freed in chunks, each with credits for its records, the
/// journal never overflows, and the range reads as zeros.
#[test]
fn a_large_punch_of_a_journaled_file_fits_a_small_journal() {
    let [keep_size, punch_hole, zero_range] = [
        libc::FALLOC_FL_KEEP_SIZE,
        libc::FALLOC_FL_PUNCH_HOLE,
        libc::FALLOC_FL_ZERO_RANGE,
    ]
    .map(|mode| mode as u32);
    if !common::require_tool("mke2fs") || !common::require_tool("e2fsck") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = common::mkfs(
        dir.path(),
        "punch",
        512,
        &["-t", "ext4", "-b", "1024", "-J", "size=1"],
    );
    let image = open(&path, Some(true)).unwrap();
    let size: u64 = 384 << 20;
    let file = image.create_file("/f").unwrap();
    let ino = file.ino() as u32;
    let (fs, caller) = (image.fs(), image.caller());
    fs.fallocate(ino, 0, size, 0, caller).unwrap();
    image.sync().unwrap();
    // Logged data at both edges and inside the range.
    let piece = pattern(11, 64 << 10, &[]);
    for at in [0, 100 << 20, size - (64 << 10)] {
        file.write_all_at(&piece, at).unwrap();
    }
    image.sync().unwrap();
    let (hole, zeroed, end) = (5_000, (200 << 20) + 123, size - 7_000);
    fs.fallocate(ino, hole, zeroed - hole, punch_hole | keep_size, caller)
        .unwrap();
    fs.fallocate(ino, zeroed, end - zeroed, zero_range, caller)
        .unwrap();
    image.sync().unwrap();
    let report = fs.stats_report();
    assert!(
        report.contains("revokes"),
        "no revoke records counted: {report}"
    );
    let check = |image: &Image| {
        let file = image.open_file("/f").unwrap();
        assert_eq!(file.metadata().unwrap().len(), size);
        let mut buffer = vec![0u8; 8 << 20];
        let mut at = 0;
        while at < size {
            file.read_exact_at(&mut buffer, at).unwrap();
            for (index, &byte) in buffer.iter().enumerate() {
                let offset = at + index as u64;
                let expected = if offset < hole || offset >= end {
                    let base = [0, 100 << 20, size - (64 << 10)]
                        .into_iter()
                        .find(|&base| (base..base + (64 << 10)).contains(&offset));
                    base.map_or(0, |base| piece[(offset - base) as usize])
                } else {
                    0
                };
                assert_eq!(byte, expected, "byte {offset}");
            }
            at += buffer.len() as u64;
        }
    };
    check(&image);
    drop(file);
    image.close().unwrap();
    common::assert_fsck_clean(&path);
    let image = open(&path, None).unwrap();
    check(&image);
    image.close().unwrap();
}
