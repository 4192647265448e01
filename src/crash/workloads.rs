//! The workloads: short deterministic programs in the shape of real
//! applications' I/O, run through the engine in-process on the recording
//! device. Each workload yields one or more scenarios (a fresh filesystem,
//! a setup that is not crash-tested, then the recorded run).
//!
//! Writes stay below the engine's write chunk (2048 blocks), so that every
//! operation is one transaction, as the oracle's prefix check assumes.
//! Errors a workload may provoke (no space, a name that is gone) are
//! ignored: the model records whatever the filesystem did.

use super::driver::Lane;
use super::import::{ImportOracle, Plan};
use super::rng::Rng;
use crate::fs::{FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE};
use std::sync::Arc;

type Setup = Box<dyn Fn(&mut [Lane]) + Send + Sync>;
type Run = Box<dyn Fn(&mut [Lane]) + Send + Sync>;

/// One recorded run on a fresh filesystem.
pub struct Scenario {
    pub name: String,
    /// Lane roots: lane 0 is "/" and excludes the other lanes' subtrees.
    pub lanes: Vec<String>,
    pub setup: Setup,
    pub run: Run,
    /// Nearly fill the filesystem before setup, leaving about this many
    /// bytes free.
    pub fill_leaving_bytes: Option<u64>,
    /// How long each barrier (flush, durable write) keeps its caller after
    /// it is logged, as a real device's flush would: concurrent fsyncs
    /// meanwhile queue behind it and share the next fast commit (group
    /// commit). Zero for single-threaded workloads.
    pub barrier_latency: std::time::Duration,
    /// A workload that judges its own tree (the import): its directory is
    /// outside lane 0's model, and every state is also checked by it.
    pub oracle: Option<Arc<ImportOracle>>,
}

impl Scenario {
    fn single(name: &str, setup: Setup, run: Run) -> Scenario {
        Scenario {
            name: name.to_string(),
            lanes: vec!["/".into()],
            setup,
            run,
            fill_leaving_bytes: None,
            barrier_latency: std::time::Duration::ZERO,
            oracle: None,
        }
    }
}

pub struct Workload {
    /// Its name on the command line.
    pub name: &'static str,
    pub about: &'static str,
    /// The device may tear this workload's multi-sector writes.
    pub tear: bool,
    /// Scenarios for a run with `budget` states (most workloads have one).
    pub scenarios: fn(seed: u64, budget: usize) -> Vec<Scenario>,
    /// States each scenario gets; 0: the scenarios share the budget.
    pub states_per_scenario: usize,
}

pub const WORKLOADS: &[Workload] = &[
    Workload {
        name: "mailspool",
        about: "Exim spool: data file, fsync; header tmp, fsync, rename over; deliveries",
        tear: true,
        scenarios: mailspool,
        states_per_scenario: 0,
    },
    Workload {
        name: "lsm",
        about: "RocksDB: WAL fdatasync; sst files, fsync each, fsync dir; MANIFEST; CURRENT rename",
        tear: true,
        scenarios: lsm,
        states_per_scenario: 0,
    },
    Workload {
        name: "varmail",
        about: "filebench varmail: 4 threads create/append/fsync/read/delete",
        tear: true,
        scenarios: varmail,
        states_per_scenario: 0,
    },
    Workload {
        name: "msgjournal",
        about: "LMAX: 1 KiB appends + fdatasync to a preallocated and to a growing file",
        tear: true,
        scenarios: msgjournal,
        states_per_scenario: 0,
    },
    Workload {
        name: "untar",
        about: "a small source tree unpacked (modes, links, xattrs), then sync",
        tear: true,
        scenarios: untar,
        states_per_scenario: 0,
    },
    Workload {
        name: "import",
        about: "jext4 cp -a of a small tree (every kind of entry, holes, hard links, xattrs) with 1 and 4 threads, and again over an older copy; every state also copied again to completion",
        tear: true,
        scenarios: import,
        states_per_scenario: 0,
    },
    Workload {
        name: "smallwriters",
        about: "1000 tasks writing files 1 KiB at a time on a nearly full filesystem",
        tear: false,
        scenarios: smallwriters,
        states_per_scenario: 0,
    },
    Workload {
        name: "xattrs",
        about: "extended attributes of every size (large ones in EA inodes): set, replaced by larger and smaller, removed, their files renamed over and deleted; fsync and sync",
        tear: true,
        scenarios: xattrs,
        states_per_scenario: 0,
    },
    Workload {
        name: "verity",
        about: "fs-verity enabled on files of every size (empty, one block, a tree of one and of two levels; some salted with 1 KiB Merkle blocks, one signed) among writes and renames; fsync and sync",
        tear: true,
        scenarios: verity,
        states_per_scenario: 0,
    },
    Workload {
        name: "random",
        about: "random namespace and data operations with fsync, fdatasync and sync",
        tear: true,
        scenarios: random,
        states_per_scenario: 0,
    },
    Workload {
        name: "overwrite",
        about: "files rewritten in place across block edges (a database's pages): overwrites, a truncate or a hole now and then, fsync, fdatasync and sync; long enough to wrap the journal",
        tear: true,
        scenarios: overwrite,
        states_per_scenario: 0,
    },
    Workload {
        name: "spool8",
        about: "8 Exim spools, one directory tree each: data, fsync; header in tmp/, fsync, rename into input/; deliveries",
        tear: true,
        scenarios: spool8,
        states_per_scenario: 0,
    },
    Workload {
        name: "compaction",
        about: "4 RocksDB instances: sst files fsynced, db/ fsynced, inputs unlinked, MANIFEST; WAL archived across directories",
        tear: true,
        scenarios: compaction,
        states_per_scenario: 0,
    },
    Workload {
        name: "varmail8",
        about: "filebench varmail at 8 threads, each in its own directory",
        tear: true,
        scenarios: varmail8,
        states_per_scenario: 0,
    },
    Workload {
        name: "openunlink",
        about: "4 threads, own directory each: a file created (and fsynced, or not), unlinked while open, the next one fsynced, then the last close frees it (FUSE's release comes after the unlink)",
        tear: true,
        scenarios: openunlink,
        states_per_scenario: 0,
    },
    Workload {
        name: "dirsync",
        about: "4 threads, own directory each: files created and written, renamed (over others too), linked and unlinked, a subdirectory filled; made durable only by fsync of the directories",
        tear: true,
        scenarios: dirsync,
        states_per_scenario: 0,
    },
    Workload {
        name: "acedirs",
        about: "sequences of up to 3 operations across directories (renames and links between A and B), each made durable by fsync of the file or of either directory",
        tear: false,
        scenarios: acedirs,
        states_per_scenario: ACE_STATES_PER_SCENARIO,
    },
    Workload {
        name: "ace2",
        about: "every sequence of up to 2 operations, each made durable (B3/Ace)",
        tear: false,
        scenarios: ace2,
        states_per_scenario: ACE_STATES_PER_SCENARIO,
    },
    Workload {
        name: "ace3",
        about: "sequences of 3 operations, each made durable (sampled unless the budget is large)",
        tear: false,
        scenarios: ace3,
        states_per_scenario: ACE_STATES_PER_SCENARIO,
    },
];

impl std::fmt::Debug for Workload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name)
    }
}

pub fn find(name: &str) -> Option<&'static Workload> {
    WORKLOADS.iter().find(|workload| workload.name == name)
}

fn mailspool(seed: u64, _budget: usize) -> Vec<Scenario> {
    vec![Scenario::single(
        "mailspool",
        Box::new(|lanes| {
            let _ = lanes[0].mkdir("input");
            let _ = lanes[0].mkdir("mail");
        }),
        Box::new(move |lanes| mailspool_run(&mut lanes[0], seed)),
    )]
}

/// Create `path`, write `len` bytes and fsync it: the applications' way to
/// make a new file (a spool file, a manifest, a message). Each step's
/// outcome is for the oracle to judge, not the workload.
fn create_synced(lane: &mut Lane, path: &str, len: usize) {
    let _ = lane.create(path);
    let _ = lane.append(path, len);
    let _ = lane.fsync(path);
}

fn mailspool_run(lane: &mut Lane, seed: u64) {
    let mut pending = Vec::new();
    let mut rng = Rng::derive(seed, "mailspool");
    for message in 0..20 {
        let id = format!("1t{message:04}");
        let data = format!("input/{id}-D");
        let header = format!("input/{id}-H");
        let temp = format!("input/hdr.{message}");
        create_synced(lane, &data, rng.range(300, 12_000) as usize);
        create_synced(lane, &temp, rng.range(400, 2_000) as usize);
        let _ = lane.rename(&temp, &header);
        pending.push((data, header));
        if message % 3 == 2 {
            // Deliver the oldest message: append to a mailbox, then the
            // spool files go.
            let (data, header) = pending.remove(0);
            let mailbox = format!("mail/user{}", rng.below(3));
            if !lane.exists(&mailbox) {
                let _ = lane.create(&mailbox);
            }
            let _ = lane.append(&mailbox, rng.range(500, 6_000) as usize);
            let _ = lane.fsync(&mailbox);
            let _ = lane.unlink(&data);
            let _ = lane.unlink(&header);
        }
    }
}

fn lsm(seed: u64, _budget: usize) -> Vec<Scenario> {
    vec![Scenario::single(
        "lsm",
        Box::new(|lanes| {
            let lane = &mut lanes[0];
            let _ = lane.mkdir("db");
            let _ = lane.create("db/MANIFEST-000001");
            let _ = lane.append("db/MANIFEST-000001", 300);
            let _ = lane.create("db/CURRENT");
            let _ = lane.append("db/CURRENT", 16);
            let _ = lane.create("db/000002.log");
        }),
        Box::new(move |lanes| lsm_run(&mut lanes[0], seed)),
    )]
}

fn lsm_run(lane: &mut Lane, seed: u64) {
    let mut rng = Rng::derive(seed, "lsm");
    let mut live: Vec<String> = Vec::new();
    let mut next = 3u32;
    let mut manifest = "db/MANIFEST-000001".to_string();
    let mut log = "db/000002.log".to_string();
    for round in 0..10 {
        // Writes go to the WAL, each synced (RocksDB sync=true).
        for _ in 0..rng.range(2, 5) {
            let _ = lane.append(&log, rng.range(100, 1_500) as usize);
            let _ = lane.fdatasync(&log);
        }
        // Memtable flush: a new sst, a new WAL, the old WAL deleted.
        let sst = format!("db/{next:06}.sst");
        next += 1;
        lsm_write_table(lane, &sst, &mut rng);
        let _ = lane.fsync("db");
        let _ = lane.append(&manifest, rng.range(100, 600) as usize);
        let _ = lane.fsync(&manifest);
        live.push(sst);
        let old_log = std::mem::replace(&mut log, format!("db/{next:06}.log"));
        next += 1;
        let _ = lane.create(&log);
        let _ = lane.unlink(&old_log);
        if round % 3 == 2 && live.len() >= 2 {
            // Compaction: merged tables, manifest edit, then the inputs go.
            let inputs: Vec<String> = live.drain(..2).collect();
            let output = format!("db/{next:06}.sst");
            next += 1;
            lsm_write_table(lane, &output, &mut rng);
            let _ = lane.fsync("db");
            let _ = lane.append(&manifest, rng.range(100, 600) as usize);
            let _ = lane.fsync(&manifest);
            live.push(output);
            for input in inputs {
                let _ = lane.unlink(&input);
            }
        }
        if round == 5 {
            // Manifest roll: new manifest, CURRENT replaced by rename.
            let new_manifest = format!("db/MANIFEST-{next:06}");
            next += 1;
            create_synced(lane, &new_manifest, rng.range(500, 2_000) as usize);
            create_synced(lane, "db/CURRENT.dbtmp", 16);
            let _ = lane.rename("db/CURRENT.dbtmp", "db/CURRENT");
            let _ = lane.fsync("db");
            let _ = lane.unlink(&manifest);
            manifest = new_manifest;
        }
    }
}

fn lsm_write_table(lane: &mut Lane, path: &str, rng: &mut Rng) {
    let _ = lane.create(path);
    for _ in 0..rng.range(2, 4) {
        let _ = lane.append(path, rng.range(4_000, 20_000) as usize);
    }
    let _ = lane.fsync(path);
}

/// The barrier latency of the multi-threaded workloads (about an SSD's
/// flush): long enough that concurrent fsyncs meet in group commits.
const GROUP_COMMIT_LATENCY: std::time::Duration = std::time::Duration::from_micros(300);

const VARMAIL_THREADS: u32 = 4;

fn varmail(seed: u64, _budget: usize) -> Vec<Scenario> {
    varmail_scenario("varmail", VARMAIL_THREADS, seed)
}

fn varmail8(seed: u64, _budget: usize) -> Vec<Scenario> {
    varmail_scenario("varmail8", 8, seed)
}

/// `threads` lanes, each in its own directory `/{prefix}N`, made by the
/// root lane (every lane's changes are one directory's transaction):
/// `prepare` runs on each lane at setup, `work` on each lane in a thread
/// of its own.
fn lane_per_directory(
    name: &str,
    prefix: &str,
    threads: u32,
    seed: u64,
    prepare: fn(&mut Lane),
    work: fn(&mut Lane, u64),
) -> Vec<Scenario> {
    let mut lanes = vec!["/".to_string()];
    lanes.extend((0..threads).map(|t| format!("/{prefix}{t}")));
    let prefix = prefix.to_string();
    vec![Scenario {
        name: name.into(),
        lanes,
        setup: Box::new(move |lanes| {
            for t in 0..threads {
                let _ = lanes[0].mkdir(&format!("{prefix}{t}"));
            }
            for lane in lanes.iter_mut().skip(1) {
                prepare(lane);
            }
        }),
        run: Box::new(move |lanes| {
            std::thread::scope(|scope| {
                for lane in lanes.iter_mut().skip(1) {
                    scope.spawn(move || work(lane, seed));
                }
            });
        }),
        fill_leaving_bytes: None,
        barrier_latency: GROUP_COMMIT_LATENCY,
        oracle: None,
    }]
}

/// Varmail at `threads` lanes, each in its own directory `/tN`.
fn varmail_scenario(name: &str, threads: u32, seed: u64) -> Vec<Scenario> {
    lane_per_directory(name, "t", threads, seed, varmail_files, varmail_thread)
}

/// A varmail lane's first files.
fn varmail_files(lane: &mut Lane) {
    for file in 0..4 {
        let name = format!("m{file}");
        let _ = lane.create(&name);
        let _ = lane.append(&name, 3_000);
    }
}

/// One varmail thread: the filebench flowops delete, create+append+fsync,
/// open+append+fsync, open+read, on the thread's own files.
fn varmail_thread(lane: &mut Lane, seed: u64) {
    let mut rng = Rng::derive(seed, &format!("varmail {}", lane.id));
    let mut files: Vec<String> = (0..4).map(|file| format!("m{file}")).collect();
    for next in 4..16 {
        if files.len() > 2 {
            let victim = files.remove(rng.below(files.len() as u64) as usize);
            let _ = lane.unlink(&victim);
        }
        let name = format!("m{next}");
        create_synced(lane, &name, rng.range(1_000, 16_000) as usize);
        files.push(name);
        let target = rng.pick(&files).clone();
        let _ = lane.append(&target, rng.range(1_000, 16_000) as usize);
        let _ = lane.fsync(&target);
        let read = rng.pick(&files).clone();
        let _ = lane.read(&read);
    }
}

/// Files unlinked while open, as metafsync through FUSE does them: the
/// kernel sends the RELEASE of a closed file after the UNLINK that follows
/// the close, so the server sees the last name go while the file is open
/// (an orphan), and the next fsync in the directory commits that unlink.
/// Now and then a sync commits in full while a file is an orphan, so that
/// its last close frees an inode the committed orphan list holds.
fn openunlink(seed: u64, _budget: usize) -> Vec<Scenario> {
    lane_per_directory("openunlink", "o", 4, seed, |_| {}, openunlink_thread)
}

fn openunlink_thread(lane: &mut Lane, seed: u64) {
    let mut rng = Rng::derive(seed, &format!("openunlink {}", lane.id));
    let mut open: Option<u32> = None;
    for file in 0..10 {
        let name = format!("f{file}");
        if file % 2 == 0 {
            create_synced(lane, &name, rng.range(1_000, 9_000) as usize);
        } else {
            // Made and unlinked between two fsyncs: its CREAT and UNLINK
            // go in one fast commit, while it is open.
            let _ = lane.create(&name);
            let _ = lane.append(&name, rng.range(1_000, 9_000) as usize);
        }
        if let Some(ino) = open.take() {
            let _ = lane.close(ino);
        }
        open = lane.open(&name).ok();
        let _ = lane.unlink(&name);
        if file % 2 == 1 {
            create_synced(lane, &format!("g{file}"), rng.range(500, 2_000) as usize);
        }
        if rng.below(5) == 0 {
            let _ = lane.sync();
        }
    }
    if let Some(ino) = open {
        let _ = lane.close(ino);
    }
    create_synced(lane, "last", 1_000);
}

const SPOOLS: u32 = 8;

/// Exim at `SPOOLS` threads, each with its own spool tree: the data file
/// written and fsynced in input/, the header written and fsynced in tmp/
/// then renamed into input/ (across directories: one transaction with
/// input/'s), the message log in msglog/, deliveries appended to a mailbox
/// in mail/ and fsynced, and the delivered message's files unlinked.
fn spool8(seed: u64, _budget: usize) -> Vec<Scenario> {
    lane_per_directory("spool8", "s", SPOOLS, seed, spool_dirs, spool_thread)
}

fn spool_dirs(lane: &mut Lane) {
    for dir in ["input", "tmp", "msglog", "mail"] {
        let _ = lane.mkdir(dir);
    }
}

fn spool_thread(lane: &mut Lane, seed: u64) {
    let mut rng = Rng::derive(seed, &format!("spool {}", lane.id));
    let mut pending: Vec<String> = Vec::new();
    for message in 0..8 {
        let id = format!("1m{message:03}");
        let data = format!("input/{id}-D");
        let temp = format!("tmp/hdr.{id}");
        create_synced(lane, &data, rng.range(300, 6_000) as usize);
        create_synced(lane, &temp, rng.range(200, 1_500) as usize);
        let _ = lane.rename(&temp, &format!("input/{id}-H"));
        let _ = lane.create(&format!("msglog/{id}"));
        let _ = lane.append(&format!("msglog/{id}"), rng.range(100, 400) as usize);
        pending.push(id);
        if message % 2 == 1 {
            // Deliver the oldest: append to a mailbox, sync it, then the
            // spool files go.
            let id = pending.remove(0);
            let mailbox = format!("mail/user{}", rng.below(2));
            if !lane.exists(&mailbox) {
                let _ = lane.create(&mailbox);
            }
            let _ = lane.append(&mailbox, rng.range(300, 6_000) as usize);
            let _ = lane.fsync(&mailbox);
            for file in [format!("input/{id}-D"), format!("input/{id}-H")] {
                let _ = lane.unlink(&file);
            }
            let _ = lane.unlink(&format!("msglog/{id}"));
        }
    }
}

const DATABASES: u32 = 4;

/// RocksDB at `DATABASES` threads, each its own database: WAL appends with
/// fdatasync in wal/, memtable flushes and compactions writing tables in
/// db/ (each fsynced, then db/ fsynced, then the MANIFEST appended and
/// fsynced, then the inputs unlinked), and old WAL files moved to archive/
/// by rename across directories (RocksDB's `wal_dir` with WAL archiving).
fn compaction(seed: u64, _budget: usize) -> Vec<Scenario> {
    lane_per_directory(
        "compaction",
        "r",
        DATABASES,
        seed,
        compaction_files,
        compaction_thread,
    )
}

/// A database's directories, its MANIFEST and its first WAL file.
fn compaction_files(lane: &mut Lane) {
    for dir in ["db", "wal", "archive"] {
        let _ = lane.mkdir(dir);
    }
    let _ = lane.create("db/MANIFEST-000001");
    let _ = lane.append("db/MANIFEST-000001", 300);
    let _ = lane.create("wal/000002.log");
}

fn compaction_thread(lane: &mut Lane, seed: u64) {
    let mut rng = Rng::derive(seed, &format!("compaction {}", lane.id));
    let manifest = "db/MANIFEST-000001";
    let mut live: Vec<String> = Vec::new();
    let mut log = "wal/000002.log".to_string();
    let mut next = 3u32;
    for round in 0..5 {
        for _ in 0..rng.range(1, 3) {
            let _ = lane.append(&log, rng.range(100, 1_500) as usize);
            let _ = lane.fdatasync(&log);
        }
        let sst = format!("db/{next:06}.sst");
        next += 1;
        lsm_write_table(lane, &sst, &mut rng);
        let _ = lane.fsync("db");
        let _ = lane.append(manifest, rng.range(100, 400) as usize);
        let _ = lane.fsync(manifest);
        live.push(sst);
        // The WAL the flush made obsolete goes to the archive.
        let old = std::mem::replace(&mut log, format!("wal/{next:06}.log"));
        next += 1;
        let _ = lane.create(&log);
        let _ = lane.rename(&old, &old.replacen("wal/", "archive/", 1));
        if round % 2 == 1 && live.len() >= 2 {
            let inputs: Vec<String> = live.drain(..2).collect();
            let output = format!("db/{next:06}.sst");
            next += 1;
            lsm_write_table(lane, &output, &mut rng);
            let _ = lane.fsync("db");
            let _ = lane.append(manifest, rng.range(100, 400) as usize);
            let _ = lane.fsync(manifest);
            live.push(output);
            for input in inputs {
                let _ = lane.unlink(&input);
            }
        }
    }
}

const JOURNAL_RECORD: usize = 1024;
const JOURNAL_RECORDS: u64 = 80;

fn msgjournal(_seed: u64, _budget: usize) -> Vec<Scenario> {
    vec![Scenario::single(
        "msgjournal",
        Box::new(|lanes| {
            let lane = &mut lanes[0];
            let _ = lane.mkdir("journal");
            let _ = lane.create("journal/prealloc");
            let size = JOURNAL_RECORDS * JOURNAL_RECORD as u64;
            let _ = lane.fallocate("journal/prealloc", 0, size, 0);
            let _ = lane.create("journal/growing");
        }),
        Box::new(|lanes| {
            let lane = &mut lanes[0];
            for record in 0..JOURNAL_RECORDS {
                let offset = record * JOURNAL_RECORD as u64;
                let _ = lane.write("journal/prealloc", offset, JOURNAL_RECORD);
                let _ = lane.fdatasync("journal/prealloc");
                let _ = lane.append("journal/growing", JOURNAL_RECORD);
                let _ = lane.fdatasync("journal/growing");
            }
        }),
    )]
}

fn overwrite(seed: u64, _budget: usize) -> Vec<Scenario> {
    vec![Scenario::single(
        "overwrite",
        Box::new(|lanes| {
            for file in OVERWRITE_FILES {
                let _ = lanes[0].create(file);
                let _ = lanes[0].write(file, 0, OVERWRITE_FILE_BYTES as usize);
            }
        }),
        Box::new(move |lanes| overwrite_run(&mut lanes[0], seed)),
    )]
}

const OVERWRITE_FILES: [&str; 3] = ["pages", "index", "log"];
/// Each file's size before the run: 16 blocks of 4 KiB, 64 of 1 KiB.
const OVERWRITE_FILE_BYTES: u64 = 64 << 10;

/// Rewrites of ranges from a few bytes to 40 KiB anywhere in the files
/// (whole blocks, parts, several across edges), so that an overwrite's
/// blocks can come back torn or mixed; now and then a file cut short and
/// written back past its end, or a hole punched; a persistence call about
/// every third step. 150 steps log some 1,500 blocks at 4 KiB: the
/// journal wraps, and blocks whose last logged copy has been checkpointed
/// are overwritten again.
fn overwrite_run(lane: &mut Lane, seed: u64) {
    let mut rng = Rng::derive(seed, "overwrite");
    for step in 0..150 {
        let file = *rng.pick(&OVERWRITE_FILES);
        let _ = match rng.below(12) {
            0 => lane.truncate(file, rng.below(OVERWRITE_FILE_BYTES)),
            1 => lane.fallocate(
                file,
                rng.below(OVERWRITE_FILE_BYTES),
                rng.range(1, 16_384),
                FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
            ),
            _ => lane.write(
                file,
                rng.below(OVERWRITE_FILE_BYTES),
                rng.range(1, 40_960) as usize,
            ),
        };
        if step % 3 == 2 {
            let _ = match rng.below(3) {
                0 => lane.fsync(file),
                1 => lane.fdatasync(file),
                _ => lane.sync(),
            };
        }
    }
    let _ = lane.sync();
}

fn xattrs(seed: u64, _budget: usize) -> Vec<Scenario> {
    vec![Scenario::single(
        "xattrs",
        Box::new(|_| {}),
        Box::new(move |lanes| xattrs_run(&mut lanes[0], seed)),
    )]
}

/// Values from a few bytes (in the inode) through a few hundred (in the
/// xattr block) to tens of KiB (in EA inodes, on the template's ea_inode
/// images), some of them equal across files (one EA inode shared, its
/// references counted), each step one transaction: a set, a removal, an
/// fsync, or the file renamed over or deleted (its EA inodes' references
/// dropped) and made again.
fn xattrs_run(lane: &mut Lane, seed: u64) {
    let mut rng = Rng::derive(seed, "xattrs");
    let files = ["a", "b", "c", "d"];
    for file in files {
        let _ = lane.create(file);
        let _ = lane.write(file, 0, 100);
    }
    let names = ["user.small", "user.medium", "user.large", "trusted.other"];
    for _ in 0..28 {
        let file = *rng.pick(&files);
        let name = *rng.pick(&names);
        match rng.below(10) {
            0..=3 => {
                let len = match rng.below(4) {
                    0 => rng.range(1, 100),
                    1 => rng.range(300, 900),
                    2 => rng.range(2_000, 6_000),
                    _ => rng.range(8_000, 40_000),
                };
                let _ = lane.set_xattr(file, name, len as usize);
            }
            4 => {
                // One of two values, each always of one length.
                let key = rng.below(2) as u32;
                let len = [5_000, 30_000][key as usize];
                let _ = lane.set_shared_xattr(file, name, len, key);
            }
            5 => {
                let _ = lane.remove_xattr(file, name);
            }
            6 => {
                let _ = lane.fsync(file);
            }
            7 => {
                let other = *rng.pick(&files);
                if other != file {
                    let _ = lane.rename(file, other);
                    let _ = lane.create(file);
                }
            }
            8 => {
                let _ = lane.unlink(file);
                let _ = lane.create(file);
            }
            _ => {
                let _ = lane.sync();
            }
        }
    }
    let _ = lane.sync();
}

fn verity(seed: u64, _budget: usize) -> Vec<Scenario> {
    vec![Scenario::single(
        "verity",
        Box::new(|_| {}),
        Box::new(move |lanes| verity_run(&mut lanes[0], seed)),
    )]
}

/// The largest write of the verity workload.
const VERITY_WRITE_BYTES: usize = 64 << 10;

/// Files of sizes that give every shape of Merkle tree (none for an empty
/// or one-block file, one level, two), written, then made verity files —
/// the tree past the end in transactions of its own, the flag in the
/// last — between other files' writes, renames and fsyncs.
fn verity_run(lane: &mut Lane, seed: u64) {
    let mut rng = Rng::derive(seed, "verity");
    let sizes = [0usize, 700, 4096, 9_000, 200_000, 600_000];
    for (index, &size) in sizes.iter().enumerate() {
        let name = format!("v{index}");
        let _ = lane.create(&name);
        // In 64 KiB writes: one transaction each even where data=journal
        // logs them (its chunks are bounded by the journal, 186 KiB on the
        // 1 KiB-block images).
        for at in (0..size).step_by(VERITY_WRITE_BYTES) {
            let _ = lane.write(&name, at as u64, VERITY_WRITE_BYTES.min(size - at));
        }
        if rng.below(2) == 0 {
            let _ = lane.fsync(&name);
        }
        let _ = lane.create("other");
        let _ = lane.append("other", rng.range(100, 5_000) as usize);
        // Every other file salted, with 1 KiB Merkle blocks, and one with
        // a signature whose descriptor runs past a block.
        let params = crate::fs::VerityParams {
            block_size: (index % 2 == 1).then_some(1024),
            salt: match index % 2 {
                1 => b"crash-salt".to_vec(),
                _ => Vec::new(),
            },
            signature: match index {
                4 => vec![0x30; 3_000],
                _ => Vec::new(),
            },
        };
        let _ = lane.enable_verity(&name, &params);
        match rng.below(3) {
            0 => {
                let _ = lane.fsync(&name);
            }
            1 => {
                let _ = lane.rename(&name, &format!("renamed{index}"));
            }
            _ => {
                let _ = lane.sync();
            }
        }
    }
    let _ = lane.sync();
}

fn untar(seed: u64, _budget: usize) -> Vec<Scenario> {
    vec![Scenario::single(
        "untar",
        Box::new(|_| {}),
        Box::new(move |lanes| untar_run(&mut lanes[0], seed)),
    )]
}

/// A tree shaped like a small source release: directories three deep,
/// files from empty to 48 KiB with tar's mode changes, fast and slow
/// symlinks, a hard link and a few xattrs, unpacked in tar order.
fn untar_run(lane: &mut Lane, seed: u64) {
    let mut rng = Rng::derive(seed, "untar");
    let top = "pkg-1.0";
    let _ = lane.mkdir(top);
    let dirs = ["src", "src/fs", "src/journal", "doc", "tests", "tests/data"];
    for dir in dirs {
        let path = format!("{top}/{dir}");
        let _ = lane.mkdir(&path);
        for file in 0..rng.range(3, 8) {
            let name = format!("{path}/file{file}.{}", rng.pick(&["rs", "c", "h", "md"]));
            let _ = lane.create(&name);
            let size = match rng.below(4) {
                0 => rng.below(200),
                1 | 2 => rng.range(200, 6_000),
                _ => rng.range(6_000, 48_000),
            };
            if size > 0 {
                let _ = lane.write(&name, 0, size as usize);
            }
            let _ = lane.chmod(&name, *rng.pick(&[0o644, 0o755, 0o600]));
            if rng.chance(1, 8) {
                let _ = lane.set_xattr(&name, "user.origin", rng.range(8, 300) as usize);
            }
        }
        let _ = lane.chmod(&path, 0o755);
    }
    let _ = lane.symlink("src/fs/file0.rs", &format!("{top}/MAIN"));
    let long = format!("{}/{}", "../".repeat(10), "x".repeat(80));
    let _ = lane.symlink(&long, &format!("{top}/doc/LONG"));
    let _ = lane.link(
        &format!("{top}/src/file0.rs"),
        &format!("{top}/tests/LINKED"),
    );
    let _ = lane.sync();
}

fn import(seed: u64, _budget: usize) -> Vec<Scenario> {
    let plans = [
        ("import", Plan::Fresh { threads: 1 }),
        ("import4", Plan::Fresh { threads: 4 }),
        ("import-again", Plan::Again),
    ];
    plans
        .into_iter()
        .map(|(name, plan)| {
            let oracle = Arc::new(ImportOracle::new(plan, seed));
            let (setup, run) = (Arc::clone(&oracle), Arc::clone(&oracle));
            Scenario {
                oracle: Some(oracle),
                ..Scenario::single(
                    name,
                    Box::new(move |lanes| setup.setup(&mut lanes[0])),
                    Box::new(move |lanes| run.run(&mut lanes[0])),
                )
            }
        })
        .collect()
}

const WRITER_TASKS: usize = 1000;

fn smallwriters(seed: u64, _budget: usize) -> Vec<Scenario> {
    vec![Scenario {
        name: "smallwriters".into(),
        lanes: vec!["/".into()],
        setup: Box::new(|lanes| {
            let _ = lanes[0].mkdir("w");
        }),
        run: Box::new(move |lanes| smallwriters_run(&mut lanes[0], seed)),
        // About 1.3 KiB per task: the later rounds (at 4 KiB blocks, the
        // first) run out of space.
        fill_leaving_bytes: Some(1_300_000),
        barrier_latency: std::time::Duration::ZERO,
        oracle: None,
    }]
}

/// A thousand tasks, served round-robin: each creates its file (a name in
/// mixed case: in a casefolded directory its hash is of the folded name)
/// and writes 1 KiB at a time; every tenth task fsyncs its file, every 200 steps a
/// sync; after the second round a third of the files are deleted.
fn smallwriters_run(lane: &mut Lane, seed: u64) {
    let mut rng = Rng::derive(seed, "smallwriters");
    let mut steps = 0;
    for round in 0..3 {
        for task in 0..WRITER_TASKS {
            let path = format!("w/Task{task:04}");
            if round == 0 {
                let _ = lane.create(&path);
            }
            if !lane.exists(&path) {
                continue;
            }
            let _ = lane.append(&path, 1024);
            if task % 10 == round {
                let _ = lane.fsync(&path);
            }
            steps += 1;
            if steps % 200 == 0 {
                let _ = lane.sync();
            }
        }
        if round == 1 {
            for task in (0..WRITER_TASKS).filter(|t| t % 3 == rng.below(3) as usize) {
                let _ = lane.unlink(&format!("w/Task{task:04}"));
            }
            let _ = lane.fsync("w");
        }
    }
}

fn random(seed: u64, _budget: usize) -> Vec<Scenario> {
    vec![Scenario::single(
        "random",
        Box::new(|lanes| {
            let _ = lanes[0].mkdir("d0");
            let _ = lanes[0].mkdir("d1");
        }),
        Box::new(move |lanes| random_run(&mut lanes[0], seed, 160)),
    )]
}

const RANDOM_FILES: &[&str] = &[
    "f0", "f1", "f2", "d0/f3", "d0/f4", "d1/f5", "d0/e0/f6", "d2/f7",
];
const RANDOM_DIRS: &[&str] = &["d0", "d1", "d0/e0", "d2"];

/// Random operations over a small namespace, a persistence call about every
/// fourth step. Now and then a directory is filled past one block and
/// emptied again, and files are written sparsely past four extents, so
/// that metadata blocks are freed and reused (revoke records matter).
fn random_run(lane: &mut Lane, seed: u64, steps: usize) {
    let mut rng = Rng::derive(seed, "random");
    for step in 0..steps {
        let file = *rng.pick(RANDOM_FILES);
        let other = *rng.pick(RANDOM_FILES);
        let dir = *rng.pick(RANDOM_DIRS);
        let other_dir = *rng.pick(RANDOM_DIRS);
        // trusted.*: Linux allows it on every kind of inode (user.* only
        // on files and directories), and `file` may be a symlink.
        let xattr = *rng.pick(&["trusted.a", "trusted.b"]);
        let _ = match rng.below(18) {
            0 | 1 => lane.create(file),
            2 => lane.mkdir(dir),
            3 | 4 => lane.write(file, rng.below(40_000), rng.range(1, 9_000) as usize),
            5 => lane.append(file, rng.range(1, 5_000) as usize),
            6 => sparse_writes(lane, file, &mut rng),
            7 => lane.truncate(file, rng.below(30_000)),
            8 => lane.fallocate(
                file,
                rng.below(20_000),
                rng.range(1, 20_000),
                random_falloc(&mut rng),
            ),
            9 => lane.link(file, other),
            10 => lane.unlink(file),
            11 => lane.rmdir(dir),
            12 => lane.rename(file, other),
            13 => lane.rename(dir, other_dir),
            14 => lane.set_xattr(file, xattr, rng.range(1, 1_500) as usize),
            15 => lane.symlink(&"t".repeat(rng.range(1, 200) as usize), other),
            16 => churn_directory(lane, &mut rng),
            _ => lane.chmod(file, *rng.pick(&[0o600, 0o644, 0o755])),
        };
        if step % 4 == 3 {
            let _ = persist(lane, &mut rng, file, dir);
        }
    }
    let _ = lane.sync();
}

fn random_falloc(rng: &mut Rng) -> u32 {
    *rng.pick(&[
        0,
        FALLOC_FL_KEEP_SIZE,
        FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
    ])
}

fn persist(lane: &mut Lane, rng: &mut Rng, file: &str, dir: &str) -> crate::Result<()> {
    match rng.below(4) {
        0 => lane.fsync(file),
        1 => lane.fdatasync(file),
        2 => lane.fsync(dir),
        _ => lane.sync(),
    }
}

/// Several small writes far apart: more extents than the inode holds.
fn sparse_writes(lane: &mut Lane, file: &str, rng: &mut Rng) -> crate::Result<()> {
    let _ = lane.create(file);
    for extent in 0..6u64 {
        lane.write(file, extent * 24_576 + rng.below(4_096), 1_000)?;
    }
    Ok(())
}

/// Fill `d2` past one directory block, then empty and remove it.
fn churn_directory(lane: &mut Lane, rng: &mut Rng) -> crate::Result<()> {
    let _ = lane.mkdir("d2");
    let count = rng.range(20, 50);
    for entry in 0..count {
        let _ = lane.create(&format!("d2/a-rather-long-file-name-{entry:03}"));
    }
    let _ = persist(lane, rng, "d2", "d2");
    for entry in 0..count {
        let _ = lane.unlink(&format!("d2/a-rather-long-file-name-{entry:03}"));
    }
    let _ = lane.unlink("d2/f7");
    lane.rmdir("d2")
}

/// The Ace operation alphabet: each with fixed arguments over the setup
/// tree (`foo`, `A/`, `A/bar`).
const ACE_OPS: &[&str] = &[
    "creat A/new",
    "creat new",
    "mkdir B",
    "mkdir A/C",
    "link foo A/foo2",
    "link A/bar bar2",
    "unlink foo",
    "unlink A/bar",
    "rename foo A/foo3",
    "rename A/bar foo",
    "rename A B2",
    "write foo append",
    "write A/bar overwrite",
    "truncate foo shrink",
    "truncate A/bar grow",
    "fallocate foo keep_size",
    "fallocate A/bar extend",
    "setxattr foo",
    "setxattr A",
];

/// How each Ace step is made durable.
const ACE_PERSIST: &[&str] = &["fsync", "fdatasync", "sync"];

fn ace2(seed: u64, budget: usize) -> Vec<Scenario> {
    ace_scenarios(seed, budget, 2)
}

fn ace3(seed: u64, budget: usize) -> Vec<Scenario> {
    ace_scenarios(seed, budget, 3)
}

/// Operations across two directories A and B (C is another directory's
/// unsynced noise): renames and links between them, and what each
/// direction of a rename leaves behind.
const ACE_DIR_OPS: &[&str] = &[
    "creat A/new",
    "creat B/new",
    "append A/x",
    "rename A/x B/x2",
    "rename B/y A/y2",
    "link A/x B/xl",
    "rename A/x A/x3",
    "unlink B/y",
    "creat C/noise",
];

/// How each operation is made durable: its file, or either directory.
const ACE_DIR_PERSIST: &[&str] = &["fsync target", "fsync A", "fsync B", "fdatasync target"];

/// Name changes made durable by directory fsyncs alone (FSYNCDIR: a fast
/// commit of the directory's transaction where eligible): each lane
/// creates and writes files, renames one (now and then over another),
/// links and unlinks, fills a subdirectory, and fsyncs the subdirectory
/// and its own directory — never a file.
fn dirsync(seed: u64, _budget: usize) -> Vec<Scenario> {
    lane_per_directory("dirsync", "d", 4, seed, |_| {}, dirsync_thread)
}

fn dirsync_thread(lane: &mut Lane, seed: u64) {
    let mut rng = Rng::derive(seed, &format!("dirsync {}", lane.id));
    let mut files: Vec<String> = Vec::new();
    for round in 0..6 {
        for file in 0..2 {
            let name = format!("f{round}{file}");
            let _ = lane.create(&name);
            let _ = lane.append(&name, rng.range(500, 9_000) as usize);
            files.push(name);
        }
        let from = files.remove(rng.below(files.len() as u64) as usize);
        let to = if files.len() > 1 && rng.below(3) == 0 {
            files.remove(rng.below(files.len() as u64) as usize)
        } else {
            format!("r{round}")
        };
        let _ = lane.rename(&from, &to);
        files.push(to);
        if round % 2 == 1 {
            let linked = rng.pick(&files).clone();
            let _ = lane.link(&linked, &format!("l{round}"));
            let victim = files.remove(rng.below(files.len() as u64) as usize);
            let _ = lane.unlink(&victim);
        }
        if round % 3 == 2 {
            let sub = format!("s{round}");
            let _ = lane.mkdir(&sub);
            let _ = lane.create(&format!("{sub}/inner"));
            let _ = lane.append(&format!("{sub}/inner"), rng.range(100, 3_000) as usize);
            let _ = lane.fsync(&sub);
        }
        let _ = lane.fsync("");
    }
}

fn acedirs(seed: u64, budget: usize) -> Vec<Scenario> {
    let steps = ACE_DIR_OPS.len() * ACE_DIR_PERSIST.len();
    ace_sequences(steps, 1..=3, (seed, "acedirs"), budget)
        .into_iter()
        .map(acedirs_scenario)
        .collect()
}

fn acedirs_scenario(sequence: Vec<usize>) -> Scenario {
    let split = |step: usize| {
        (
            ACE_DIR_OPS[step / ACE_DIR_PERSIST.len()],
            ACE_DIR_PERSIST[step % ACE_DIR_PERSIST.len()],
        )
    };
    let name = sequence
        .iter()
        .map(|&step| {
            let (op, persist) = split(step);
            format!("{op}; {persist}")
        })
        .collect::<Vec<_>>()
        .join("; ");
    Scenario::single(
        &format!("acedirs: {name}"),
        Box::new(|lanes| {
            let lane = &mut lanes[0];
            for dir in ["A", "B", "C"] {
                let _ = lane.mkdir(dir);
            }
            let _ = lane.create("A/x");
            let _ = lane.write("A/x", 0, 4_096);
            let _ = lane.create("B/y");
            let _ = lane.write("B/y", 0, 6_000);
        }),
        Box::new(move |lanes| {
            let lane = &mut lanes[0];
            for &step in &sequence {
                let (op, persist) = split(step);
                let target = acedirs_step(lane, op);
                let _ = match persist {
                    "fsync A" => lane.fsync("A"),
                    "fsync B" => lane.fsync("B"),
                    "fsync target" => lane.fsync(target),
                    _ => lane.fdatasync(target),
                };
            }
        }),
    )
}

/// Run one cross-directory operation; returns the path it leaves behind.
fn acedirs_step(lane: &mut Lane, op: &str) -> &'static str {
    let (result, target) = match op {
        "creat A/new" => (lane.create("A/new"), "A/new"),
        "creat B/new" => (lane.create("B/new"), "B/new"),
        "append A/x" => (lane.append("A/x", 3_000), "A/x"),
        "rename A/x B/x2" => (lane.rename("A/x", "B/x2"), "B/x2"),
        "rename B/y A/y2" => (lane.rename("B/y", "A/y2"), "A/y2"),
        "link A/x B/xl" => (lane.link("A/x", "B/xl"), "B/xl"),
        "rename A/x A/x3" => (lane.rename("A/x", "A/x3"), "A/x3"),
        "unlink B/y" => (lane.unlink("B/y"), "B"),
        "creat C/noise" => (lane.create("C/noise"), "C/noise"),
        other => unreachable!("unknown cross-directory operation {other}"),
    };
    let _ = result;
    target
}

/// States one Ace scenario gets (its log has a few flush epochs).
pub const ACE_STATES_PER_SCENARIO: usize = 5;

/// Every sequence of 1..=`length` steps (of exactly `length` steps for
/// length 3), in a seeded order, as many as the budget pays for.
fn ace_scenarios(seed: u64, budget: usize, length: usize) -> Vec<Scenario> {
    let steps = ACE_OPS.len() * ACE_PERSIST.len();
    let shortest = if length == 3 { 3 } else { 1 };
    ace_sequences(steps, shortest..=length, (seed, "ace"), budget)
        .into_iter()
        .map(ace_scenario)
        .collect()
}

/// Every sequence of `lengths` steps, each one of `steps`, and of those,
/// in an order seeded by `(seed, label)`, as many as `budget` states pay
/// for.
fn ace_sequences(
    steps: usize,
    lengths: std::ops::RangeInclusive<usize>,
    (seed, label): (u64, &str),
    budget: usize,
) -> Vec<Vec<usize>> {
    let mut sequences: Vec<Vec<usize>> = Vec::new();
    for len in lengths {
        let total = steps.pow(len as u32);
        sequences.extend((0..total).map(|mut code| {
            (0..len)
                .map(|_| {
                    let step = code % steps;
                    code /= steps;
                    step
                })
                .collect()
        }));
    }
    // Twice what the budget pays for: some logs yield fewer states, and
    // the runner stops when the budget is spent.
    let wanted = (budget / ACE_STATES_PER_SCENARIO * 2).max(1);
    if wanted < sequences.len() {
        Rng::derive(seed, label).shuffle(&mut sequences);
        sequences.truncate(wanted);
    }
    sequences
}

fn ace_scenario(sequence: Vec<usize>) -> Scenario {
    let name = sequence
        .iter()
        .map(|&step| {
            let (op, persist) = (step / ACE_PERSIST.len(), step % ACE_PERSIST.len());
            format!("{}; {}", ACE_OPS[op], ACE_PERSIST[persist])
        })
        .collect::<Vec<_>>()
        .join("; ");
    Scenario::single(
        &format!("ace: {name}"),
        Box::new(|lanes| {
            let lane = &mut lanes[0];
            let _ = lane.create("foo");
            let _ = lane.write("foo", 0, 4_096);
            let _ = lane.mkdir("A");
            let _ = lane.create("A/bar");
            let _ = lane.write("A/bar", 0, 8_192);
        }),
        Box::new(move |lanes| {
            for &step in &sequence {
                let (op, persist) = (step / ACE_PERSIST.len(), step % ACE_PERSIST.len());
                let target = ace_step(&mut lanes[0], ACE_OPS[op]);
                let _ = match ACE_PERSIST[persist] {
                    "fsync" => lanes[0].fsync(target),
                    "fdatasync" => lanes[0].fdatasync(target),
                    _ => lanes[0].sync(),
                };
            }
        }),
    )
}

/// Run one Ace operation; returns the path to make durable.
fn ace_step(lane: &mut Lane, op: &str) -> &'static str {
    let (result, target) = match op {
        "creat A/new" => (lane.create("A/new"), "A/new"),
        "creat new" => (lane.create("new"), "new"),
        "mkdir B" => (lane.mkdir("B"), "B"),
        "mkdir A/C" => (lane.mkdir("A/C"), "A/C"),
        "link foo A/foo2" => (lane.link("foo", "A/foo2"), "A/foo2"),
        "link A/bar bar2" => (lane.link("A/bar", "bar2"), "bar2"),
        "unlink foo" => (lane.unlink("foo"), ""),
        "unlink A/bar" => (lane.unlink("A/bar"), "A"),
        "rename foo A/foo3" => (lane.rename("foo", "A/foo3"), "A/foo3"),
        "rename A/bar foo" => (lane.rename("A/bar", "foo"), "foo"),
        "rename A B2" => (lane.rename("A", "B2"), "B2"),
        "write foo append" => (lane.append("foo", 5_000), "foo"),
        "write A/bar overwrite" => (lane.write("A/bar", 2_000, 3_000), "A/bar"),
        "truncate foo shrink" => (lane.truncate("foo", 1_000), "foo"),
        "truncate A/bar grow" => (lane.truncate("A/bar", 20_000), "A/bar"),
        "fallocate foo keep_size" => (lane.fallocate("foo", 0, 16_384, FALLOC_FL_KEEP_SIZE), "foo"),
        "fallocate A/bar extend" => (lane.fallocate("A/bar", 8_192, 8_192, 0), "A/bar"),
        "setxattr foo" => (lane.set_xattr("foo", "user.ace", 64), "foo"),
        "setxattr A" => (lane.set_xattr("A", "user.ace", 64), "A"),
        other => unreachable!("unknown Ace operation {other}"),
    };
    let _ = result;
    target
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_ace_enumerates() {
        let mut names: Vec<&str> = WORKLOADS.iter().map(|w| w.name).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), WORKLOADS.len());
        let steps = ACE_OPS.len() * ACE_PERSIST.len();
        let everything = ace_scenarios(1, usize::MAX / 2, 2);
        assert_eq!(everything.len(), steps + steps * steps);
        // A sample is deterministic, and a larger budget extends it.
        let names = |budget| -> Vec<String> {
            ace_scenarios(1, budget, 2)
                .into_iter()
                .map(|scenario| scenario.name)
                .collect()
        };
        let sampled = names(25);
        assert_eq!(sampled.len(), 10);
        assert_eq!(sampled, names(25));
        assert_eq!(sampled[..], names(80)[..10]);
        // Every Ace operation name is one `ace_step` knows (it panics
        // otherwise) — checked by the crash tests that run them.
        assert!(ACE_OPS.iter().all(|op| !op.is_empty()));
    }
}
