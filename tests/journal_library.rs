//! The journal under the library API (in-process, no FUSE): freed
//! directory blocks are revoked, and the write-ahead guard never fires
//! under concurrent workloads (`Fs::journal_stats().jbd2.guard_violations`
//! stays 0; with debug assertions a violation would panic first).

mod common;

use jext4::Image;
use jext4::engine::fs::MountOptions;
use std::os::unix::fs::FileExt;
use std::os::unix::fs::OpenOptionsExt;
use std::time::Duration;

fn journal(image: &Image) -> jext4::engine::journal::Jbd2Stats {
    image
        .fs()
        .journal_stats()
        .jbd2
        .expect("an ext4 image is journaled")
}

/// A directory's blocks are journaled metadata: when the directory goes,
/// they must be revoked (or replay could write an old copy over the
/// block's next owner) and forgotten (or a pending checkpoint could). The
/// kill tests found file data overwritten by an old directory block.
#[test]
fn freed_directory_blocks_are_revoked() {
    for (name, args) in [
        ("ext4-1k", &["-t", "ext4", "-b", "1024"][..]),
        ("ext3-1k", &["-t", "ext3", "-b", "1024"][..]),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let path = common::mkfs(dir.path(), name, 16, args);
        let image = Image::open(&path).unwrap();
        image.create_dir("/d").unwrap();
        for index in 0..200 {
            image
                .write(format!("/d/an-entry-with-a-long-name-{index:04}"), b"x")
                .unwrap();
        }
        image.sync().unwrap();
        let dir_blocks = image.metadata("/d").unwrap().len() / 1024;
        assert!(dir_blocks >= 4, "the directory has {dir_blocks} blocks");
        for index in 0..200 {
            image
                .remove_file(format!("/d/an-entry-with-a-long-name-{index:04}"))
                .unwrap();
        }
        image.sync().unwrap();
        let before = journal(&image).revokes_logged;
        image.remove_dir("/d").unwrap();
        image.sync().unwrap();
        let revoked = journal(&image).revokes_logged - before;
        println!("{name}: rmdir of a {dir_blocks}-block directory logged {revoked} revokes");
        assert!(
            revoked >= dir_blocks,
            "{name}: {revoked} revokes for {dir_blocks} directory blocks"
        );
        assert_eq!(journal(&image).guard_violations, 0);
        image.close().unwrap();
        common::assert_fsck_clean(&path);
    }
}

/// Four threads create, write, fsync, rename and delete through the
/// library with a short commit interval and a small journal (so that
/// commits, checkpoints and frozen copies all happen while handles run);
/// the guard counts no violation and e2fsck finds the result clean.
#[test]
fn concurrent_library_workload_never_trips_the_guard() {
    let dir = tempfile::tempdir().unwrap();
    let path = common::mkfs(
        dir.path(),
        "guard",
        32,
        &["-t", "ext4", "-b", "1024", "-J", "size=1"],
    );
    let options = MountOptions {
        commit_interval: Duration::from_secs(1),
        cache_size: 1 << 20,
        ..MountOptions::default()
    };
    let image = Image::options().mount_options(options).open(&path).unwrap();
    std::thread::scope(|scope| {
        for thread in 0..4 {
            let image = &image;
            scope.spawn(move || {
                let top = format!("/w{thread}");
                image.create_dir(&top).unwrap();
                for round in 0..150 {
                    let name = format!("{top}/f{round}");
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
                    let data = vec![(round + thread) as u8; 100 + (round * 37) % 5000];
                    file.write_all_at(&data, 0).unwrap();
                    if round % 5 == 0 {
                        file.sync_all().unwrap();
                    }
                    drop(file);
                    if round % 3 == 0 {
                        image.rename(&name, format!("{top}/r{round}")).unwrap();
                    }
                    if round % 30 == 29 {
                        // A directory of several blocks, then its removal
                        // (revokes of directory blocks).
                        let sub = format!("{top}/sub{round}");
                        image.create_dir(&sub).unwrap();
                        for entry in 0..60 {
                            image
                                .write(format!("{sub}/a-long-entry-name-{entry:03}"), b"y")
                                .unwrap();
                        }
                        for entry in 0..60 {
                            image
                                .remove_file(format!("{sub}/a-long-entry-name-{entry:03}"))
                                .unwrap();
                        }
                        image.remove_dir(&sub).unwrap();
                    }
                    if round >= 20 && round % 2 == 0 {
                        let old = format!("{top}/f{}", round - 19);
                        if image.metadata(&old).is_ok() {
                            image.remove_file(&old).unwrap();
                        }
                    }
                }
            });
        }
    });
    let stats = journal(&image);
    println!("{stats:?}");
    assert!(stats.commits > 10, "{stats:?}");
    assert!(stats.checkpoints > 0, "{stats:?}");
    assert!(stats.revokes_logged > 0, "{stats:?}");
    assert_eq!(stats.guard_violations, 0, "{stats:?}");
    image.close().unwrap();
    common::assert_fsck_clean(&path);
}

// ---------------------------------------------------------------------------
// The journal layer alone, on a memory device whose writes can be held up.

mod gated {
    use jext4::engine::cache::BufferCache;
    use jext4::engine::dev::guard::GuardedDevice;
    use jext4::engine::dev::{BlockDevice, MemoryDevice};
    use jext4::engine::journal::recovery::JournalArea;
    use jext4::engine::journal::{Jbd2Options, Journal, JournalConfig};
    use std::sync::{Arc, Condvar, Mutex};
    use std::time::Duration;

    pub const BLOCK_SIZE: usize = 1024;
    const JOURNAL_START: u64 = 64;
    // The log keeps 1024 blocks beside a 256-block fast-commit area.
    const JOURNAL_BLOCKS: u64 = 1280;

    /// A memory device whose writes wait while the gate is closed, and
    /// which says how many writers are waiting.
    pub struct GatedDevice {
        inner: MemoryDevice,
        /// (open, writers waiting)
        gate: Mutex<(bool, u32)>,
        changed: Condvar,
        /// Only writes at or past this byte wait.
        held_from: Mutex<u64>,
    }

    impl GatedDevice {
        pub fn close(&self) {
            self.gate.lock().unwrap().0 = false;
        }

        /// Close the gate to writes into the fast-commit area only (the
        /// default 256 blocks at the journal's end).
        pub fn close_fast_commit_area(&self) {
            *self.held_from.lock().unwrap() =
                (JOURNAL_START + JOURNAL_BLOCKS - 256) * BLOCK_SIZE as u64;
            self.close();
        }

        pub fn open(&self) {
            self.gate.lock().unwrap().0 = true;
            self.changed.notify_all();
        }

        /// Wait until some write is held at the gate.
        pub fn wait_for_held_write(&self) {
            let gate = self.gate.lock().unwrap();
            let (gate, timeout) = self
                .changed
                .wait_timeout_while(gate, Duration::from_secs(10), |(_, waiting)| *waiting == 0)
                .unwrap();
            assert!(
                !timeout.timed_out() && gate.1 > 0,
                "no write reached the gate"
            );
        }
    }

    impl BlockDevice for GatedDevice {
        fn read_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
            self.inner.read_at(offset, buf)
        }

        fn write_at(&self, offset: u64, buf: &[u8]) -> std::io::Result<()> {
            if offset < *self.held_from.lock().unwrap() {
                return self.inner.write_at(offset, buf);
            }
            let mut gate = self.gate.lock().unwrap();
            gate.1 += 1;
            self.changed.notify_all();
            let mut gate = self.changed.wait_while(gate, |(open, _)| !*open).unwrap();
            gate.1 -= 1;
            drop(gate);
            self.inner.write_at(offset, buf)
        }

        fn flush(&self) -> std::io::Result<()> {
            self.inner.flush()
        }

        fn size_bytes(&self) -> u64 {
            self.inner.size_bytes()
        }
    }

    /// An empty version 2 journal superblock (JBD2, big-endian: magic,
    /// block type 4, s_blocksize at 12, s_maxlen at 16, s_first at 20,
    /// s_sequence at 24, s_start 0 at 28, s_nr_users at 64).
    fn journal_superblock() -> Vec<u8> {
        let mut block = vec![0u8; BLOCK_SIZE];
        let mut put = |offset: usize, value: u32| {
            block[offset..offset + 4].copy_from_slice(&value.to_be_bytes());
        };
        put(0, jext4::engine::journal::format::MAGIC);
        put(4, jext4::engine::journal::format::block_type::SUPERBLOCK_V2);
        put(12, BLOCK_SIZE as u32);
        put(16, JOURNAL_BLOCKS as u32);
        put(20, 1);
        put(24, 1);
        put(64, 1);
        block
    }

    /// A JBD2 journal over a gated memory device, wired as `Fs::mount`
    /// wires it (cache over the write-ahead guard over the device).
    pub fn journal() -> (Arc<GatedDevice>, Arc<BufferCache>, Arc<Journal>) {
        journal_with(false)
    }

    /// The same, writing fast commits when `fast_commit` (the area is the
    /// default 256 blocks at the journal's end).
    pub fn journal_with(fast_commit: bool) -> (Arc<GatedDevice>, Arc<BufferCache>, Arc<Journal>) {
        let size = ((JOURNAL_START + JOURNAL_BLOCKS) as usize) * BLOCK_SIZE;
        let inner = MemoryDevice::new(size);
        inner
            .write_at(JOURNAL_START * BLOCK_SIZE as u64, &journal_superblock())
            .unwrap();
        let device = Arc::new(GatedDevice {
            inner,
            gate: Mutex::new((true, 0)),
            changed: Condvar::new(),
            held_from: Mutex::new(0),
        });
        let raw: Arc<dyn BlockDevice> = device.clone();
        let area = JournalArea::new(
            Arc::clone(&raw),
            BLOCK_SIZE as u32,
            (JOURNAL_START..JOURNAL_START + JOURNAL_BLOCKS).collect(),
        );
        let guard = Arc::new(GuardedDevice::new(raw, BLOCK_SIZE as u32));
        let cache = Arc::new(BufferCache::new(
            Arc::clone(&guard) as Arc<dyn BlockDevice>,
            BLOCK_SIZE,
            1 << 20,
        ));
        let config = JournalConfig {
            commit_interval: Duration::from_secs(3600),
            sync_all: false,
        };
        let options = Jbd2Options {
            commit_interval: config.commit_interval,
            async_commit: false,
            fs_64bit: false,
            metadata_csum: true,
            fast_commit,
            bytelog: false,
        };
        let journal = Journal::jbd2(Arc::clone(&cache), area, guard, config, &options).unwrap();
        (device, cache, journal)
    }
}

/// sync (syncfs) must not return while a transaction locked down before
/// it is still on its way to the log, even when the running transaction
/// holds nothing. It returned at once: the micro-benchmark saw rounds
/// start while the previous commit was still capturing their buffers.
#[test]
fn sync_waits_for_a_commit_already_under_way() {
    let (device, cache, journal) = gated::journal();
    let buffer = cache.read(5).unwrap();
    {
        let handle = journal.start(1).unwrap();
        handle.get_write_access(&buffer).unwrap()[0] = 0xAB;
        handle.stop().unwrap();
    }
    device.close();
    let (sent, done) = std::sync::mpsc::channel();
    std::thread::scope(|scope| {
        let first = sent.clone();
        let journal_ref = &journal;
        scope.spawn(move || {
            journal_ref.sync().unwrap();
            first.send("first").unwrap();
        });
        // The commit thread has locked the transaction down and is held
        // writing the log: a new, empty transaction runs.
        device.wait_for_held_write();
        scope.spawn(move || {
            journal_ref.sync().unwrap();
            sent.send("second").unwrap();
        });
        let early = done.recv_timeout(Duration::from_millis(300));
        // Open before asserting: a panic here would wait forever for the
        // thread held at the gate.
        device.open();
        assert!(
            early.is_err(),
            "sync returned ({early:?}) while the commit was held before reaching the log"
        );
        let mut finished = vec![done.recv().unwrap(), done.recv().unwrap()];
        finished.sort();
        assert_eq!(finished, ["first", "second"]);
    });
    let stats = journal.stats().jbd2.unwrap();
    assert_eq!((stats.commits, stats.guard_violations), (1, 0), "{stats:?}");
    journal.shutdown().unwrap();
}

/// A device that, once armed, holds back every write the checkpoint
/// thread issues until released.
struct StallCheckpoint {
    inner: std::sync::Arc<dyn jext4::engine::dev::BlockDevice>,
    armed: std::sync::atomic::AtomicBool,
    /// Set while a checkpoint write is held back.
    stalled: std::sync::atomic::AtomicBool,
    release: (std::sync::Mutex<bool>, std::sync::Condvar),
}

impl jext4::engine::dev::BlockDevice for StallCheckpoint {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        self.inner.read_at(offset, buf)
    }

    fn write_at(&self, offset: u64, buf: &[u8]) -> std::io::Result<()> {
        use std::sync::atomic::Ordering;
        if self.armed.load(Ordering::Acquire)
            && std::thread::current().name() == Some("jext4-checkpoint")
        {
            self.stalled.store(true, Ordering::Release);
            let (released, wake) = &self.release;
            let mut released = released.lock().unwrap();
            while !*released {
                released = wake.wait(released).unwrap();
            }
        }
        self.inner.write_at(offset, buf)
    }

    fn flush(&self) -> std::io::Result<()> {
        self.inner.flush()
    }

    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }
}

impl StallCheckpoint {
    fn release(&self) {
        let (released, wake) = &self.release;
        *released.lock().unwrap() = true;
        wake.notify_all();
    }
}

/// The checkpoint runs on its own thread: while a checkpoint pass is held
/// in the middle of its home writes, a create + write + fsync in another
/// directory still commits and returns (the log has room; only a log that
/// is truly full makes a handle wait for the checkpoint).
#[test]
fn an_fsync_does_not_wait_for_a_checkpoint() {
    use jext4::engine::fs::{Caller, Fs};
    use std::sync::Arc;
    use std::sync::atomic::Ordering;
    const ROOT: u32 = 2;
    let caller = Caller::ROOT;
    let dir = tempfile::tempdir().unwrap();
    let path = common::mkfs(
        dir.path(),
        "stall",
        32,
        &["-t", "ext4", "-b", "1024", "-J", "size=1"],
    );
    let device = Arc::new(StallCheckpoint {
        inner: jext4::engine::dev::open_image(&path, false).unwrap(),
        armed: false.into(),
        stalled: false.into(),
        release: Default::default(),
    });
    let fs = Fs::mount(device.clone(), MountOptions::default()).unwrap();
    let a = fs.mkdir(ROOT, b"a", 0o755, caller).unwrap().ino;
    let b = fs.mkdir(ROOT, b"b", 0o755, caller).unwrap().ino;
    fs.sync().unwrap();
    device.armed.store(true, Ordering::Release);
    // Synced creates in /a until the log is half full and the checkpoint
    // thread starts writing home (and is held there).
    let mut created = 0;
    while !device.stalled.load(Ordering::Acquire) {
        assert!(
            created < 5000,
            "no checkpoint after {created} synced creates"
        );
        let name = format!("f{created}");
        let ino = fs.create(a, name.as_bytes(), 0o644, caller).unwrap().ino;
        fs.write(ino, 0, &[created as u8; 3000], caller).unwrap();
        fs.fsync(ino, false).unwrap();
        created += 1;
    }
    let (done, finished) = std::sync::mpsc::channel();
    let writer = {
        let fs = Arc::clone(&fs);
        std::thread::spawn(move || {
            let ino = fs.create(b, b"while-checkpointing", 0o644, caller)?.ino;
            fs.write(ino, 0, b"durable", caller)?;
            fs.fsync(ino, false)?;
            let _ = done.send(());
            Ok::<_, jext4::Error>(())
        })
    };
    // The checkpoint stays held until this wait ends either way.
    let returned = finished.recv_timeout(Duration::from_secs(30));
    device.release();
    writer.join().unwrap().unwrap();
    assert!(
        returned.is_ok(),
        "the fsync in /b waited for the checkpoint held back in its home writes"
    );
    fs.unmount().unwrap();
    drop(fs);
    common::assert_fsck_clean(&path);
    println!("checkpoint held after {created} synced creates; an fsync beside it returned");
}

/// Directory commits queued while a fast commit is being written share the
/// next write of the area (group commit), in queue order, and each is
/// acknowledged only once the write holding it is durable. Before, every
/// waiting fsync wrote its own, and at 8 threads metafsync ran at a tenth
/// of the speed.
#[test]
fn directory_commits_queued_during_a_write_share_the_next_one() {
    use jext4::engine::journal::{FastCommitBegin, FastCommitOutcome};
    let (device, cache, journal) = gated::journal_with(true);
    // Fast commits need a first full commit (the journal superblock must
    // point at the log). The running transaction after it stays empty:
    // nothing (a checkpoint blocked by it) can commit it meanwhile.
    let buffer = cache.read(5).unwrap();
    let handle = journal.start(1).unwrap();
    handle.get_write_access(&buffer).unwrap()[0] = 1;
    handle.stop().unwrap();
    journal.sync().unwrap();
    let tid = journal.running_tid();
    let FastCommitBegin::Started(ticket) = journal.begin_fast_commit(tid).unwrap() else {
        panic!("fast commits may start");
    };
    // The log and the filesystem's blocks go on being written (the
    // checkpoint of the first commit may run at any time).
    device.close_fast_commit_area();
    std::thread::scope(|scope| {
        let ticket = &ticket;
        // No records: HEAD and TAIL alone, one area block.
        let first = ticket.enqueue(Vec::new(), false, Vec::new());
        let writer = scope.spawn(move || ticket.wait(first).unwrap());
        device.wait_for_held_write();
        let followers: Vec<_> = (0..2)
            .map(|_| {
                let seq = ticket.enqueue(Vec::new(), false, Vec::new());
                scope.spawn(move || ticket.wait(seq).unwrap())
            })
            .collect();
        std::thread::sleep(Duration::from_millis(100));
        let early = followers.iter().any(|follower| follower.is_finished());
        // Open before asserting: a panic here would wait forever for the
        // thread held at the gate.
        device.open();
        assert!(!early, "acknowledged before the write holding it");
        assert_eq!(writer.join().unwrap(), FastCommitOutcome::Durable);
        for follower in followers {
            assert_eq!(follower.join().unwrap(), FastCommitOutcome::Durable);
        }
    });
    drop(ticket);
    let stats = journal.stats().jbd2.unwrap();
    assert_eq!(stats.fast_commits, 2, "{stats:?}");
    assert_eq!(stats.fast_commit_members, 3, "{stats:?}");
    journal.shutdown().unwrap();
}

/// An idle journal's commit thread sleeps until the next commit interval.
/// It spun instead once the empty running transaction was older than the
/// interval (its deadline was in the past): an idle mount burnt a CPU.
#[test]
fn an_idle_commit_thread_sleeps() {
    let dir = tempfile::tempdir().unwrap();
    let path = common::mkfs(dir.path(), "idle", 16, &["-t", "ext4"]);
    let options = MountOptions {
        commit_interval: Duration::from_millis(50),
        ..MountOptions::default()
    };
    let image = Image::options().mount_options(options).open(&path).unwrap();
    image.write("/a", b"one").unwrap();
    image.sync().unwrap();
    let before = journal(&image).thread_rounds;
    std::thread::sleep(Duration::from_millis(600));
    let rounds = journal(&image).thread_rounds - before;
    // About one round per 50 ms interval; the spinning thread made
    // millions.
    assert!(rounds <= 60, "{rounds} commit-thread rounds in 600 ms idle");
    image.close().unwrap();
}
