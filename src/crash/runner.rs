//! The crash test: record each scenario, plan its crash states, and put
//! every state through the oracles.
//!
//! Per state (all in this process unless said):
//! - **every state**: jext4 recovery — `Fs::mount` on a copy-on-write copy
//!   replays the journal and releases orphans — then the model check of
//!   every lane (prefix of namespace and metadata, data per sector), a
//!   clean unmount, and no write-ahead guard event;
//! - **every `fsck_every`-th state** (default: every one): `e2fsck -fn` on
//!   the image jext4 left;
//! - **scenarios with an oracle of their own** (the import): that oracle
//!   judges every tree the lanes' model is checked on, and on every state
//!   its work is run again on another jext4 recovery, which must complete
//!   it (and, on `fsck_every`-th states, leave `e2fsck -fn` clean);
//! - **every `replay_every`-th state**: `e2fsck -p -E journal_only` on
//!   another copy of the crashed disk, `e2fsck -fn` clean, then the model
//!   check on that replay (read through jext4); and `jext4 recover` on a
//!   third copy: `e2fsck -fn` clean and byte-identical to e2fsck's replay
//!   outside the primary superblock;
//! - **every `kernel_every`-th state** (root with loop devices): a kernel
//!   loop mount of a third copy replays it; the model check through the
//!   kernel's tree; unmount; `e2fsck -fn` clean.
//!
//! With `fast_commit` the images have the feature and fsync writes fast
//! commits. e2fsck 1.47 cannot replay those states — its fast-commit replay
//! fails or loses files, it fails on a HEAD left by an older transaction,
//! and it wraps the log at the end of the fast-commit area instead of the
//! end of the log — so on a `replay_every`-th state whose fast-commit area
//! opens with a HEAD or whose log wraps, the kernel replays it instead (the
//! reference for fast commits), when it can; such states are counted.
//!
//! With `bytelog` the workload runs on a `-o bytelog` mount of a
//! fast_commit image: fast commits go to the ring through the recording
//! device's persistent-memory mapping, and crash states keep any subset of
//! the cache lines not yet fenced (`states`). Every crashed disk carries
//! the BYTELOG incompat flag, which neither e2fsck nor the kernel accept,
//! so on a `replay_every`-th state `jext4 recover` replays a copy instead:
//! `e2fsck -fn` clean and the model check on it; on a `kernel_every`-th
//! state the kernel must refuse the crashed disk, then mount the recovered
//! copy and agree with the model.

use super::driver::{FsSource, Lane};
use super::import::{IMPORT_DIR, ImportOracle};
use super::logwrites;
use super::model::{LaneModel, TreeSource, read_subtree};
use super::oracle::{Marks, Ordering, check_lane};
use super::overlay::{Base, ImageFile, StateDevice};
use super::states::{self, CrashState};
use super::tools::{self, KernelMount, Scratch, StdSource};
use super::workloads::{Scenario, Workload};
use crate::dev::{BlockDevice, MemoryDevice, Record, RecordingDevice, WindowDevice};
use crate::faults::{self, Fault};
use crate::fs::{AtimePolicy, Caller, Fs, MountOptions};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Image size of every crash test: small enough that e2fsck takes
/// milliseconds, large enough for two block groups at 1 KiB blocks.
pub const IMAGE_MIB: u64 = 16;

/// What is checked on which states (`n`: every n-th; 0: never).
#[derive(Debug, Clone, Copy)]
pub struct Sampling {
    pub fsck_every: usize,
    pub replay_every: usize,
    pub kernel_every: usize,
}

impl Default for Sampling {
    fn default() -> Self {
        Sampling {
            fsck_every: 1,
            replay_every: 4,
            kernel_every: 100,
        }
    }
}

#[derive(Debug, Clone)]
pub struct Config {
    pub block_size: u32,
    /// States over all workloads.
    pub states: usize,
    pub seed: u64,
    pub workloads: Vec<&'static Workload>,
    pub sampling: Sampling,
    /// Check only this state of each workload (reproduction).
    pub only_state: Option<usize>,
    /// Save failing states' images and logs here.
    pub keep: Option<PathBuf>,
    /// Break the journal while recording (fault-injection tests).
    pub faults: Vec<Fault>,
    /// Stop a workload at its first failure.
    pub stop_at_first_failure: bool,
    /// Images with the fast_commit feature: fsync writes fast commits.
    pub fast_commit: bool,
    /// Record on `-o bytelog` mounts (implies `fast_commit`).
    pub bytelog: bool,
    /// Fast commits with one scope for everything (`-o
    /// fast_commit=global`) instead of one per directory.
    pub fast_commit_global: bool,
    /// Record on `-o delalloc` mounts: files' sizes lag behind other
    /// metadata until their data is written out (`oracle::Window`).
    pub delalloc: bool,
    /// Images with meta_bg and no resize_inode, four descriptors to a
    /// block and 256-block groups (`tools::Shape`), so that
    /// the 16 MiB image has several meta groups.
    pub meta_bg: bool,
    /// The journal on a device of its own (`mke2fs -J device=`): recorded
    /// with the filesystem on one device, each a window of it, and shown
    /// to e2fsck and the kernel as a loop device over the image file's
    /// journal part.
    pub external_journal: bool,
    /// Images with inline_data: small files and directories live in their
    /// inodes, and move to blocks as they grow.
    pub inline_data: bool,
    /// Images with user, group and project quotas (quota, project):
    /// e2fsck checks every state's usage counts.
    pub quota: bool,
    /// Images with casefold (utf8, strict) and a casefolded root, so that
    /// every directory the workloads make is casefolded: e2fsck checks
    /// every state's htree hashes of folded names.
    pub casefold: bool,
    /// Record on `-o data=journal` mounts: file data is logged, so each
    /// write's bytes are all old or all new after a crash (the oracle
    /// holds every file to one version whole, `Window::data_atomic`).
    pub data_journal: bool,
    /// Images with bigalloc (clusters of 4 blocks, `tools::Shape`): e2fsck
    /// checks every state's cluster bitmaps, the cluster allocation rules
    /// and i_blocks counted in clusters.
    pub bigalloc: bool,
}

impl Config {
    pub fn new(
        workloads: Vec<&'static Workload>,
        block_size: u32,
        states: usize,
        seed: u64,
    ) -> Self {
        Config {
            block_size,
            states,
            seed,
            workloads,
            sampling: Sampling::default(),
            only_state: None,
            keep: None,
            faults: Vec::new(),
            stop_at_first_failure: false,
            fast_commit: false,
            bytelog: false,
            fast_commit_global: false,
            delalloc: false,
            meta_bg: false,
            external_journal: false,
            inline_data: false,
            quota: false,
            casefold: false,
            data_journal: false,
            bigalloc: false,
        }
    }

    /// Where the journal device starts in the recorded device (after the
    /// filesystem), for runs with an external journal.
    fn journal_at(&self) -> Option<u64> {
        self.external_journal.then_some(IMAGE_MIB << 20)
    }

    /// What the oracle may expect of the namespace: per-directory fast
    /// commits leave each directory a prefix of its own.
    fn ordering(&self) -> Ordering {
        if self.fast_commit_images() && !self.fast_commit_global {
            Ordering::PerDirectory
        } else {
            Ordering::Prefix
        }
    }

    /// The images get the fast_commit feature.
    fn fast_commit_images(&self) -> bool {
        self.fast_commit || self.bytelog
    }
}

#[derive(Debug, Clone)]
pub struct Failure {
    pub workload: String,
    pub scenario: String,
    pub block_size: u32,
    pub fast_commit: bool,
    pub bytelog: bool,
    pub fast_commit_global: bool,
    pub delalloc: bool,
    pub meta_bg: bool,
    pub external_journal: bool,
    pub inline_data: bool,
    pub quota: bool,
    pub casefold: bool,
    pub data_journal: bool,
    pub bigalloc: bool,
    pub seed: u64,
    /// The workload's share of the states: the plan (and so the state
    /// numbers) depends on it.
    pub states: usize,
    pub state: usize,
    pub description: String,
    pub message: String,
    pub saved: Vec<PathBuf>,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "FAILED {} [{}], state {}: {}",
            self.workload, self.scenario, self.state, self.description
        )?;
        writeln!(f, "{}", self.message)?;
        write!(
            f,
            "reproduce: jext4 crashtest --workload {} --block-size {}{}{}{}{}{}{}{}{}{} --seed {} --states {} --state {}",
            self.workload,
            self.block_size,
            match (self.fast_commit, self.bytelog, self.fast_commit_global) {
                (_, true, _) => " --bytelog",
                (true, false, false) => " --fast-commit",
                (true, false, true) => " --fast-commit --fast-commit-global",
                (false, false, _) => "",
            },
            if self.delalloc { " --delalloc" } else { "" },
            if self.meta_bg { " --meta-bg" } else { "" },
            if self.external_journal {
                " --external-journal"
            } else {
                ""
            },
            if self.inline_data {
                " --inline-data"
            } else {
                ""
            },
            if self.quota { " --quota" } else { "" },
            if self.casefold { " --casefold" } else { "" },
            if self.data_journal {
                " --data-journal"
            } else {
                ""
            },
            if self.bigalloc { " --bigalloc" } else { "" },
            self.seed,
            self.states,
            self.state
        )?;
        for path in &self.saved {
            write!(f, "\nsaved: {}", path.display())?;
        }
        Ok(())
    }
}

/// Progress reports for a front end.
pub enum Progress<'a> {
    /// A scenario was recorded and will be checked in `states` states.
    Scenario {
        workload: &'a str,
        scenario: &'a str,
        states: usize,
    },
    State,
    Failure(&'a Failure),
}

#[derive(Debug, Default)]
pub struct Summary {
    pub states: usize,
    pub failures: Vec<Failure>,
    pub fsck_runs: usize,
    pub replay_runs: usize,
    pub kernel_runs: usize,
    /// States whose e2fsck replay was skipped because e2fsck 1.47 cannot
    /// replay them (fast commits, a wrapped log on a fast-commit journal);
    /// the kernel replayed those it could instead.
    pub replay_skipped: usize,
    /// e2fsck replays not compared byte for byte with `jext4 recover`'s:
    /// e2fsck released orphan inodes in place after its replay (times
    /// and journal blocks differ from jext4's release through the
    /// journal); they were checked clean and against the model.
    pub replay_orphans: usize,
    /// Why kernel mounts were skipped, if they were.
    pub kernel_skipped: Option<String>,
    /// Why the verity workload's kernel checks were left out although the
    /// kernel mounts (a kernel without CONFIG_FS_VERITY cannot read verity
    /// files): not a missing device, the kernel's configuration.
    pub kernel_verity_skipped: Option<String>,
    /// States checked per workload, in order.
    pub per_workload: Vec<(String, usize)>,
    pub elapsed: Duration,
}

/// One recorded scenario.
pub struct Recorded {
    /// The disk when the log starts (after setup and a sync).
    pub base: Vec<u8>,
    pub log: Vec<Record>,
    pub lanes: Vec<LaneModel>,
    /// The scenario's own oracle, if it has one (`workloads::Scenario`).
    pub oracle: Option<Arc<ImportOracle>>,
}

/// The options the workloads run with (and, both off, recovery mounts).
pub fn mount_options(bytelog: bool, fast_commit_global: bool, delalloc: bool) -> MountOptions {
    MountOptions {
        bytelog,
        fast_commit_global,
        delalloc,
        // Commits happen when the workload asks (fsync, sync) or the
        // transaction fills up, never on a timer: the recording is
        // reproducible. Fast commits wherever the image has the feature.
        commit_interval: Duration::from_secs(3600),
        atime: AtimePolicy::Never,
        ..MountOptions::default()
    }
}

/// Clears the fault switches however recording ends.
struct FaultsOn;

impl FaultsOn {
    fn set(list: &[Fault]) -> FaultsOn {
        for fault in list {
            faults::set(*fault);
        }
        FaultsOn
    }
}

impl Drop for FaultsOn {
    fn drop(&mut self) {
        faults::clear_all();
    }
}

/// Run `scenario` on a fresh copy of `template` over a recording device;
/// with `journal_at`, the template's external journal device starts at
/// that byte.
pub fn record(
    template: &[u8],
    scenario: &Scenario,
    seed: u64,
    fault_list: &[Fault],
    options: MountOptions,
    journal_at: Option<u64>,
) -> Result<Recorded, String> {
    let memory = Arc::new(MemoryDevice::from_bytes(template.to_vec()));
    let device = Arc::new(RecordingDevice::new(memory).with_latency(scenario.barrier_latency));
    let fs = mount_split(device.clone(), journal_at, options).map_err(|e| format!("mount: {e}"))?;
    let mut lanes: Vec<Lane> = scenario
        .lanes
        .iter()
        .enumerate()
        .map(|(id, root)| Lane::new(id as u32, root, seed, Arc::clone(&fs), Arc::clone(&device)))
        .collect();
    let mut exclude: Vec<String> = scenario.lanes[1..]
        .iter()
        .map(|root| root.trim_start_matches('/').to_string())
        .collect();
    if let Some(bytes) = scenario.fill_leaving_bytes {
        fill(&fs, bytes).map_err(|e| format!("filling the filesystem: {e}"))?;
        exclude.push(FILLER.to_string());
    }
    if scenario.oracle.is_some() {
        exclude.push(IMPORT_DIR.to_string());
    }
    (scenario.setup)(&mut lanes);
    fs.sync().map_err(|e| format!("sync after setup: {e}"))?;
    let (_, base) = device.take_log_with(|inner| {
        let mut bytes = vec![0u8; inner.size_bytes() as usize];
        inner.read_at(0, &mut bytes).map(|()| bytes)
    });
    let base = base.map_err(|e| e.to_string())?;
    for lane in lanes.iter_mut() {
        let lane_exclude = if lane.id == 0 {
            exclude.clone()
        } else {
            Vec::new()
        };
        lane.start_model(lane_exclude)?;
    }
    let faults_on = FaultsOn::set(fault_list);
    (scenario.run)(&mut lanes);
    let unmounted = fs.unmount();
    drop(faults_on);
    let log = device.take_log();
    let violations = fs
        .journal_stats()
        .jbd2
        .map_or(0, |stats| stats.guard_violations);
    unmounted.map_err(|e| format!("unmount after the workload: {e}"))?;
    if let Some(fatal) = lanes.iter().find_map(|lane| lane.fatal.clone()) {
        return Err(format!("the workload failed: {fatal}"));
    }
    if violations > 0 && fault_list.is_empty() {
        return Err(format!(
            "{violations} write-ahead guard events during the workload"
        ));
    }
    let lanes = lanes.into_iter().filter_map(Lane::into_model).collect();
    Ok(Recorded {
        base,
        log,
        lanes,
        oracle: scenario.oracle.clone(),
    })
}

/// Mount the filesystem on `device`; with `journal_at`, the filesystem is
/// the device's bytes before it and its external journal those from it
/// on, each a window (`WindowDevice`) whose flushes are its own.
pub fn mount_split(
    device: Arc<dyn BlockDevice>,
    journal_at: Option<u64>,
    options: MountOptions,
) -> crate::Result<Arc<Fs>> {
    let (fs, journal) = split(device, journal_at);
    Fs::mount_with_journal(fs, journal, options)
}

/// Name of the file that nearly fills the filesystem (outside every lane's
/// checks: it never changes).
const FILLER: &str = ".filler";

/// Preallocate a file so that about `leave_bytes` of space stays free.
fn fill(fs: &Fs, leave_bytes: u64) -> crate::Result<()> {
    let statfs = fs.statfs();
    let leave = leave_bytes / statfs.block_size as u64;
    let blocks = statfs.available_blocks.saturating_sub(leave);
    let attr = fs.create(
        crate::format::superblock::ROOT_INO,
        FILLER.as_bytes(),
        0o600,
        Caller::ROOT,
    )?;
    // In pieces: one transaction's extent changes stay small.
    let piece = 1024 * statfs.block_size as u64;
    let total = blocks * statfs.block_size as u64;
    let mut done = 0;
    while done < total {
        let len = piece.min(total - done);
        fs.fallocate(attr.ino, done, len, 0, Caller::ROOT)?;
        done += len;
    }
    Ok(())
}

/// The image files e2fsck and the kernel read, kept between states so
/// that only changed pages are written.
struct Files {
    jext4: ImageFile,
    replay: ImageFile,
    recover: ImageFile,
    kernel: ImageFile,
    /// jext4's recovery with the scenario's oracle's copy run again.
    resumed: ImageFile,
}

impl Files {
    fn new(scratch: &Scratch) -> Result<Files, String> {
        let open =
            |name: &str| ImageFile::new(scratch.path(name)).map_err(|e| format!("{name}: {e}"));
        Ok(Files {
            jext4: open("jext4.img")?,
            replay: open("e2fsck.img")?,
            recover: open("recover.img")?,
            kernel: open("kernel.img")?,
            resumed: open("resumed.img")?,
        })
    }
}

/// With an external journal (it starts at byte `journal_at` of `file`),
/// the journal part of `file` copied to a file of its own beside it, for
/// e2fsck's `-j` and `jext4 recover --journal`; None without one.
fn journal_out(file: &ImageFile, journal_at: Option<u64>) -> Result<Option<PathBuf>, String> {
    let Some(at) = journal_at else {
        return Ok(None);
    };
    use std::os::unix::fs::FileExt;
    let image = std::fs::File::open(&file.path).map_err(io_text)?;
    let len = image.metadata().map_err(io_text)?.len();
    let mut journal = vec![0u8; len.saturating_sub(at) as usize];
    image.read_exact_at(&mut journal, at).map_err(io_text)?;
    let path = file.path.with_extension("journal");
    std::fs::write(&path, &journal).map_err(io_text)?;
    Ok(Some(path))
}

/// The journal a tool changed (`journal_out`'s file) put back into the
/// image file, so that the file holds the whole disk again.
fn journal_back(
    file: &mut ImageFile,
    journal: Option<&Path>,
    journal_at: Option<u64>,
) -> Result<(), String> {
    use std::os::unix::fs::FileExt;
    let (Some(path), Some(at)) = (journal, journal_at) else {
        return Ok(());
    };
    let bytes = std::fs::read(path).map_err(io_text)?;
    let image = std::fs::OpenOptions::new()
        .write(true)
        .open(&file.path)
        .map_err(io_text)?;
    image.write_all_at(&bytes, at).map_err(io_text)?;
    file.invalidate();
    Ok(())
}

/// Everything one check of one state needs.
struct Checker<'a> {
    config: &'a Config,
    scratch: &'a Scratch,
    recorded: &'a Recorded,
    marks: Marks,
    kernel: bool,
    files: &'a mut Files,
}

#[derive(Default)]
struct Ran {
    fsck: bool,
    replay: bool,
    kernel: bool,
    replay_skipped: bool,
    replay_orphans: bool,
}

fn every(n: usize, number: usize) -> bool {
    n != 0 && number.is_multiple_of(n)
}

fn io_text(error: std::io::Error) -> String {
    error.to_string()
}

impl Checker<'_> {
    fn check(&mut self, state: &CrashState, base: &Base) -> Result<Ran, String> {
        let raw = base.overlay();
        states::apply(&self.recorded.log, state, &mut |offset, data| {
            raw.put(offset, data)
        })
        .map_err(io_text)?;
        let sampling = self.config.sampling;
        let mut ran = Ran::default();
        let recovered = Arc::new(raw.fork());
        self.check_jext4(recovered.clone(), "jext4 recovery", state)?;
        if every(sampling.fsck_every, state.number) {
            self.files.jext4.show(base, &recovered).map_err(io_text)?;
            let journal = journal_out(&self.files.jext4, self.config.journal_at())?;
            tools::fsck_clean_with(
                &self.files.jext4.path,
                journal.as_deref(),
                "after jext4 recovery",
            )?;
            ran.fsck = true;
        }
        if let Some(oracle) = &self.recorded.oracle {
            self.check_resume(oracle, base, &raw, every(sampling.fsck_every, state.number))?;
        }
        let kernel_sample = self.kernel && every(sampling.kernel_every, state.number);
        if self.config.bytelog {
            if every(sampling.replay_every, state.number) || kernel_sample {
                self.check_bytelog_recover(base, &raw, state, kernel_sample)?;
                ran.replay = true;
                ran.kernel = kernel_sample;
            }
            return Ok(ran);
        }
        if every(sampling.replay_every, state.number) {
            if self.e2fsck_can_replay(&raw)? {
                ran.replay_orphans = self.check_e2fsck_replay(base, &raw, state)?;
                ran.replay = true;
            } else {
                ran.replay_skipped = true;
                if self.kernel && !kernel_sample {
                    self.check_kernel(base, &raw, state)?;
                    ran.kernel = true;
                }
            }
        }
        if kernel_sample {
            self.check_kernel(base, &raw, state)?;
            ran.kernel = true;
        }
        Ok(ran)
    }

    /// Whether e2fsck 1.47 replays this crashed disk as the kernel would:
    /// not when its fast-commit area opens with a HEAD (fast commits to
    /// replay, or a stale HEAD that fails e2fsck's recovery), nor when a
    /// fast-commit journal's log wraps (e2fsck wraps it at the end of the
    /// area, the kernel and jext4 at the end of the log).
    fn e2fsck_can_replay(&self, raw: &StateDevice) -> Result<bool, String> {
        if !self.config.fast_commit {
            return Ok(true);
        }
        let device: Arc<dyn BlockDevice> = Arc::new(raw.fork());
        let (fs, journal) = split(device, self.config.journal_at());
        let shape = crate::fs::journal_shape(&fs, journal.as_ref())
            .map_err(|e| format!("reading the log: {e}"))?;
        Ok(!shape.fast_commit || (shape.fast_commit_head.is_none() && !shape.wraps))
    }

    /// Mount (replaying), compare every lane, unmount.
    fn check_jext4(
        &self,
        device: Arc<dyn BlockDevice>,
        how: &str,
        state: &CrashState,
    ) -> Result<(), String> {
        // Recovery mounts are plain fast-commit mounts: they must replay a
        // ByteLog whatever the options.
        let fs = mount_split(
            device,
            self.config.journal_at(),
            mount_options(false, false, false),
        )
        .map_err(|e| format!("{how}: mount: {e}"))?;
        let compared = self.compare(&FsSource(&fs), how, state);
        let unmounted = fs.unmount();
        let violations = fs
            .journal_stats()
            .jbd2
            .map_or(0, |stats| stats.guard_violations);
        compared?;
        unmounted.map_err(|e| format!("{how}: unmount: {e}"))?;
        if violations > 0 {
            return Err(format!("{how}: {violations} write-ahead guard events"));
        }
        Ok(())
    }

    fn compare(
        &self,
        source: &dyn TreeSource,
        how: &str,
        state: &CrashState,
    ) -> Result<(), String> {
        for lane in &self.recorded.lanes {
            let actual = read_subtree(source, &lane.root, "", &lane.exclude)
                .map_err(|e| format!("{how}: reading lane {}: {e}", lane.lane))?;
            let mut window = self.marks.window(lane, state);
            window.sizes_lag = self.config.delalloc;
            window.data_atomic = self.config.data_journal;
            check_lane(lane, &window, &actual, self.config.ordering())
                .map_err(|e| format!("{how}: {e}"))?;
        }
        if let Some(oracle) = &self.recorded.oracle {
            let marks: Vec<&str> = self.recorded.log[..state.acked_before]
                .iter()
                .filter_map(|record| match record {
                    Record::Mark(text) => Some(text.as_str()),
                    _ => None,
                })
                .collect();
            oracle
                .check(source, &marks)
                .map_err(|e| format!("{how}: {e}"))?;
        }
        Ok(())
    }

    /// Another jext4 recovery of the crashed disk, on which the oracle's
    /// work is run again (the import copied again): it must complete, and
    /// with `fsck`, leave a filesystem `e2fsck -fn` finds clean.
    fn check_resume(
        &mut self,
        oracle: &ImportOracle,
        base: &Base,
        raw: &StateDevice,
        fsck: bool,
    ) -> Result<(), String> {
        let resumed = Arc::new(raw.fork());
        let fs = mount_split(
            resumed.clone(),
            self.config.journal_at(),
            mount_options(false, false, false),
        )
        .map_err(|e| format!("resuming: mount: {e}"))?;
        let result = oracle.resume(&fs);
        let unmounted = fs.unmount();
        result?;
        unmounted.map_err(|e| format!("resuming: unmount: {e}"))?;
        if fsck {
            self.files.resumed.show(base, &resumed).map_err(io_text)?;
            let journal = journal_out(&self.files.resumed, self.config.journal_at())?;
            tools::fsck_clean_with(
                &self.files.resumed.path,
                journal.as_deref(),
                "after copying again",
            )?;
        }
        Ok(())
    }

    /// e2fsck replays a copy of the crashed disk; it must be clean, and
    /// agree with the model. `jext4 recover` replays another copy: the
    /// same bytes outside the primary superblock (whose counters and times
    /// e2fsck rewrites), and clean too — unless e2fsck released orphans
    /// (returns true: then the bytes are not compared).
    fn check_e2fsck_replay(
        &mut self,
        base: &Base,
        raw: &StateDevice,
        state: &CrashState,
    ) -> Result<bool, String> {
        let journal_at = self.config.journal_at();
        let replay = &mut self.files.replay;
        replay.show(base, raw).map_err(io_text)?;
        replay.invalidate();
        let replay_journal = journal_out(replay, journal_at)?;
        let orphans = tools::e2fsck_replay(&replay.path, replay_journal.as_deref())?;
        tools::fsck_clean_after(
            &replay.path,
            replay_journal.as_deref(),
            "after e2fsck's journal replay",
            orphans && self.config.bigalloc && self.config.quota,
        )?;
        journal_back(replay, replay_journal.as_deref(), journal_at)?;
        let replayed = std::fs::read(&replay.path).map_err(io_text)?;
        let recover = &mut self.files.recover;
        recover.show(base, raw).map_err(io_text)?;
        recover.invalidate();
        let recover_journal = journal_out(recover, journal_at)?;
        crate::fs::recover_image_from(
            &recover.path,
            crate::format::superblock::PRIMARY_SB_OPTION,
            recover_journal.as_deref(),
        )
        .map_err(|e| format!("jext4 recover: {e}"))?;
        tools::fsck_clean_with(
            &recover.path,
            recover_journal.as_deref(),
            "after jext4 recover",
        )?;
        journal_back(recover, recover_journal.as_deref(), journal_at)?;
        let recovered = std::fs::read(&recover.path).map_err(io_text)?;
        if !orphans {
            let backups = meta_bg_backup_blocks(&recovered);
            compare_replays(&recovered, &replayed, self.config.block_size, &backups)?;
        }
        let device = Arc::new(MemoryDevice::from_bytes(replayed));
        self.check_jext4(device, "e2fsck replay", state)?;
        Ok(orphans)
    }

    /// ByteLog states: `jext4 recover` replays a copy (e2fsck and the kernel
    /// cannot); it must be clean and agree with the model. With `kernel`,
    /// the kernel must refuse the crashed disk (the BYTELOG flag) and read
    /// the recovered one as the model says.
    fn check_bytelog_recover(
        &mut self,
        base: &Base,
        raw: &StateDevice,
        state: &CrashState,
        kernel: bool,
    ) -> Result<(), String> {
        let recover = &mut self.files.recover;
        recover.show(base, raw).map_err(io_text)?;
        recover.invalidate();
        let path = recover.path.clone();
        crate::fs::recover_image(&path).map_err(|e| format!("jext4 recover: {e}"))?;
        tools::fsck_clean(&path, "after jext4 recover")?;
        let recovered = std::fs::read(&path).map_err(io_text)?;
        let crashed_flags = bytelog_flags(raw)?;
        if crashed_flags.0 && !crashed_flags.1 {
            return Err("a disk that needs recovery without the BYTELOG flag".into());
        }
        if kernel {
            let file = &mut self.files.kernel;
            file.show(base, raw).map_err(io_text)?;
            let point = self.scratch.path("kernel.mnt");
            // Before the first commit and after the final unmount the disk
            // is plain ext4; in between the kernel must keep away.
            if crashed_flags.1
                && let Ok(mount) = KernelMount::new(&file.path, &point)
            {
                file.invalidate();
                mount.unmount()?;
                return Err("the kernel mounted a crashed ByteLog image".into());
            }
            let mount = KernelMount::new(&path, &point)
                .map_err(|e| format!("kernel mount after jext4 recover: {e}"))?;
            let compared = self.compare(&StdSource(&mount.point), "kernel after recover", state);
            mount.unmount()?;
            compared?;
            tools::fsck_clean(&path, "after jext4 recover and a kernel mount")?;
        }
        let device = Arc::new(MemoryDevice::from_bytes(recovered));
        self.check_jext4(device, "jext4 recover", state)
    }

    /// The kernel replays a copy on a loop mount; its tree must agree with
    /// the model, and its unmount leave a clean filesystem.
    fn check_kernel(
        &mut self,
        base: &Base,
        raw: &StateDevice,
        state: &CrashState,
    ) -> Result<(), String> {
        let journal_at = self.config.journal_at();
        let file = &mut self.files.kernel;
        file.show(base, raw).map_err(io_text)?;
        file.invalidate();
        let path = file.path.clone();
        let mount = KernelMount::with_journal(&path, journal_at, &self.scratch.path("kernel.mnt"))
            .map_err(|e| format!("kernel replay: {e}"))?;
        let compared = self.compare(&StdSource(&mount.point), "kernel replay", state);
        mount.unmount()?;
        compared?;
        let journal = journal_out(&self.files.kernel, journal_at)?;
        tools::fsck_clean_with(
            &path,
            journal.as_deref(),
            "after the kernel's replay and unmount",
        )
    }
}

/// `device` as the filesystem's and, with `journal_at`, its external
/// journal's, each a window of it.
fn split(
    device: Arc<dyn BlockDevice>,
    journal_at: Option<u64>,
) -> (Arc<dyn BlockDevice>, Option<Arc<dyn BlockDevice>>) {
    let Some(at) = journal_at else {
        return (device, None);
    };
    let len = device.size_bytes();
    let fs: Arc<dyn BlockDevice> = Arc::new(WindowDevice::new(Arc::clone(&device), 0, at));
    let journal: Arc<dyn BlockDevice> = Arc::new(WindowDevice::new(device, at, len - at));
    (fs, Some(journal))
}

/// (needs_recovery, BYTELOG) in the primary superblock of `device`.
fn bytelog_flags(device: &dyn BlockDevice) -> Result<(bool, bool), String> {
    use crate::format::superblock::{self, incompat};
    let sb = superblock::read_from(device).map_err(|e| format!("crashed superblock: {e}"))?;
    Ok((
        sb.has_incompat(incompat::RECOVER),
        sb.has_incompat(incompat::BYTELOG),
    ))
}

/// Run the crash test over `config.workloads`, splitting the state budget
/// evenly between them.
pub fn run(config: &Config, progress: &mut dyn FnMut(Progress<'_>)) -> Result<Summary, String> {
    let started = Instant::now();
    let scratch = Scratch::new()?;
    if config.external_journal && config.bytelog {
        return Err(
            "--external-journal and --bytelog do not go together: ByteLog maps the \
                    journal's fast-commit area, which an external device cannot offer"
                .into(),
        );
    }
    let shape = tools::Shape {
        fast_commit: config.fast_commit_images(),
        meta_bg: config.meta_bg,
        external_journal: config.external_journal,
        inline_data: config.inline_data,
        quota: config.quota,
        casefold: config.casefold,
        bigalloc: config.bigalloc,
    };
    let template = tools::make_template_shaped(&scratch, config.block_size, IMAGE_MIB, &shape)?;
    let mut summary = Summary::default();
    let kernel = config.sampling.kernel_every > 0
        && match tools::kernel_available(&scratch, &template, config.journal_at()) {
            Ok(()) => true,
            Err(error) => {
                summary.kernel_skipped = Some(error);
                false
            }
        };
    let wants_verity = config
        .workloads
        .iter()
        .any(|workload| workload.name == "verity");
    let kernel_verity = kernel
        && wants_verity
        && match tools::kernel_reads_verity(&scratch, &template, config.journal_at()) {
            Ok(()) => true,
            Err(error) => {
                summary.kernel_verity_skipped = Some(error);
                false
            }
        };
    let mut files = Files::new(&scratch)?;
    let context = Context {
        config,
        scratch: &scratch,
        template: &template,
        kernel,
        kernel_verity,
    };
    // The budget is shared evenly; what a workload cannot use (its log has
    // fewer distinct states) goes to those after it.
    for (index, workload) in config.workloads.iter().enumerate() {
        let left = config.states.saturating_sub(summary.states);
        let budget = (left / (config.workloads.len() - index)).max(1);
        let before = summary.states;
        context.run_workload(workload, budget, &mut files, &mut summary, progress)?;
        let checked = summary.states - before;
        summary
            .per_workload
            .push((workload.name.to_string(), checked));
    }
    summary.elapsed = started.elapsed();
    Ok(summary)
}

struct Context<'a> {
    config: &'a Config,
    scratch: &'a Scratch,
    template: &'a [u8],
    kernel: bool,
    /// The kernel reads fs-verity files (CONFIG_FS_VERITY): the verity
    /// workload's kernel checks run only then.
    kernel_verity: bool,
}

impl Context<'_> {
    fn failure(
        &self,
        (workload, scenario, budget): (&Workload, &Scenario, usize),
        state: usize,
    ) -> Failure {
        Failure {
            workload: workload.name.to_string(),
            scenario: scenario.name.clone(),
            block_size: self.config.block_size,
            fast_commit: self.config.fast_commit,
            bytelog: self.config.bytelog,
            fast_commit_global: self.config.fast_commit_global,
            delalloc: self.config.delalloc,
            meta_bg: self.config.meta_bg,
            inline_data: self.config.inline_data,
            quota: self.config.quota,
            casefold: self.config.casefold,
            data_journal: self.config.data_journal,
            bigalloc: self.config.bigalloc,
            external_journal: self.config.external_journal,
            seed: self.config.seed,
            states: budget,
            state,
            description: String::new(),
            message: String::new(),
            saved: Vec::new(),
        }
    }

    fn run_workload(
        &self,
        workload: &Workload,
        budget: usize,
        files: &mut Files,
        summary: &mut Summary,
        progress: &mut dyn FnMut(Progress<'_>),
    ) -> Result<(), String> {
        let scenarios = (workload.scenarios)(self.config.seed, budget);
        let mut first_number = 0;
        for (index, scenario) in scenarios.iter().enumerate() {
            // Shared like the workloads' budget (`first_number` counts the
            // states planned so far).
            let left = budget.saturating_sub(first_number);
            if left == 0 {
                break;
            }
            let per_scenario = match workload.states_per_scenario {
                0 => (left / (scenarios.len() - index)).max(1),
                each => each.min(left),
            };
            let recorded = match record(
                self.template,
                scenario,
                self.config.seed,
                &self.config.faults,
                MountOptions {
                    data_journal: self.config.data_journal.then_some(true),
                    ..mount_options(
                        self.config.bytelog,
                        self.config.fast_commit_global,
                        self.config.delalloc,
                    )
                },
                self.config.journal_at(),
            ) {
                Ok(recorded) => recorded,
                Err(message) => {
                    let mut failure = self.failure((workload, scenario, budget), first_number);
                    failure.description = "recording the workload".into();
                    failure.message = message;
                    progress(Progress::Failure(&failure));
                    summary.failures.push(failure);
                    continue;
                }
            };
            let plan_seed = super::rng::Rng::derive(self.config.seed, &scenario.name).next_u64();
            let plan = states::plan(&recorded.log, per_scenario, plan_seed, workload.tear);
            progress(Progress::Scenario {
                workload: workload.name,
                scenario: &scenario.name,
                states: plan.len(),
            });
            let failed = self.check_plan(
                (workload, scenario, &recorded),
                (&plan, first_number, budget),
                files,
                summary,
                progress,
            )?;
            first_number += plan.len();
            if failed && self.config.stop_at_first_failure {
                break;
            }
        }
        Ok(())
    }

    /// Check the planned states of one recording in epoch order, keeping the
    /// image of the current epoch's start up to date. Returns whether a
    /// state failed.
    fn check_plan(
        &self,
        (workload, scenario, recorded): (&Workload, &Scenario, &Recorded),
        (plan, first_number, budget): (&[CrashState], usize, usize),
        files: &mut Files,
        summary: &mut Summary,
        progress: &mut dyn FnMut(Progress<'_>),
    ) -> Result<bool, String> {
        let epochs = states::epochs(&recorded.log);
        let mut checker = Checker {
            config: self.config,
            scratch: self.scratch,
            recorded,
            marks: Marks::new(&recorded.log),
            kernel: self.kernel && (workload.name != "verity" || self.kernel_verity),
            files,
        };
        let mut base = Base::new(recorded.base.clone());
        // Epochs whose durable entries `base` holds.
        let mut applied = 0;
        let mut failed = false;
        for state in plan {
            let number = first_number + state.number;
            if self.config.only_state.is_some_and(|only| only != number) {
                continue;
            }
            debug_assert!(state.epoch + 1 >= applied, "plan not in epoch order");
            // What each barrier up to the state's epoch made durable, in
            // order (writes and stores, `Epoch::settled`).
            for epoch in epochs.iter().take(state.epoch + 1).skip(applied) {
                for &index in &epoch.settled {
                    let (offset, data) = recorded.log[index].bytes().expect("a write or a store");
                    base.write(offset, data);
                }
            }
            applied = applied.max(state.epoch + 1);
            let numbered = CrashState {
                number,
                ..state.clone()
            };
            let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                checker.check(&numbered, &base)
            }))
            .unwrap_or_else(|panic| Err(format!("panic: {}", panic_text(&panic))));
            summary.states += 1;
            progress(Progress::State);
            match outcome {
                Ok(ran) => {
                    summary.fsck_runs += ran.fsck as usize;
                    summary.replay_runs += ran.replay as usize;
                    summary.kernel_runs += ran.kernel as usize;
                    summary.replay_skipped += ran.replay_skipped as usize;
                    summary.replay_orphans += ran.replay_orphans as usize;
                }
                Err(message) => {
                    failed = true;
                    // A panic may have left a file half written.
                    checker.files.jext4.invalidate();
                    let mut failure = self.failure((workload, scenario, budget), number);
                    failure.description = state.describe();
                    failure.message = message;
                    failure.saved = self.save(&failure, recorded, state, &base);
                    progress(Progress::Failure(&failure));
                    summary.failures.push(failure);
                    if self.config.stop_at_first_failure {
                        break;
                    }
                }
            }
        }
        Ok(failed)
    }

    /// Keep a failing state's disk, the run's base image and its log in
    /// dm-log-writes format (`replay-log --log LOG --replay BASE` rebuilds
    /// any prefix).
    fn save(
        &self,
        failure: &Failure,
        recorded: &Recorded,
        state: &CrashState,
        base: &Base,
    ) -> Vec<PathBuf> {
        let Some(dir) = &self.config.keep else {
            return Vec::new();
        };
        let name = format!(
            "{}-{}-seed{}-state{}",
            failure.workload, failure.block_size, failure.seed, failure.state
        );
        let crashed = base.overlay();
        let _ = states::apply(&recorded.log, state, &mut |offset, data| {
            crashed.put(offset, data)
        });
        let paths = [
            dir.join(format!("{name}.crashed.img")),
            dir.join(format!("{name}.base.img")),
            dir.join(format!("{name}.log")),
        ];
        let written = std::fs::create_dir_all(dir)
            .and_then(|()| {
                crashed
                    .to_vec()
                    .and_then(|image| std::fs::write(&paths[0], image))
            })
            .and_then(|()| std::fs::write(&paths[1], &recorded.base))
            .and_then(|()| {
                let mut file = std::io::BufWriter::new(std::fs::File::create(&paths[2])?);
                logwrites::write_log(&mut file, &recorded.log)
            });
        match written {
            Ok(()) => paths.to_vec(),
            Err(error) => {
                tracing::warn!(%error, "saving a failing crash state");
                Vec::new()
            }
        }
    }
}

/// The backup descriptor blocks of a meta_bg image: e2fsck's close
/// rewrites them from the primaries after its replay (ext2fs_flush writes
/// every meta group's backups even when it leaves the other backups
/// alone), where jext4, like the kernel, leaves them as mke2fs or the last
/// resize wrote them.
fn meta_bg_backup_blocks(image: &[u8]) -> Vec<u64> {
    use crate::format::superblock::{Geometry, SUPERBLOCK_OFFSET, SUPERBLOCK_SIZE, Superblock};
    let start = SUPERBLOCK_OFFSET as usize;
    let Some(bytes) = image.get(start..start + SUPERBLOCK_SIZE) else {
        return Vec::new();
    };
    match Superblock::decode(bytes) {
        Ok(sb) => Geometry::from_superblock(&sb).meta_bg_backup_desc_blocks(),
        Err(_) => Vec::new(),
    }
}

/// Blocks that differ between jext4's and e2fsck's replay of one disk,
/// outside the primary superblock and the blocks `skip`.
fn compare_replays(
    jext4: &[u8],
    e2fsck: &[u8],
    block_size: u32,
    skip: &[u64],
) -> Result<(), String> {
    const SUPERBLOCK: std::ops::Range<usize> = 1024..2048;
    if jext4.len() != e2fsck.len() {
        return Err("jext4 recover changed the image size".into());
    }
    let differing: Vec<usize> = jext4
        .chunks(block_size as usize)
        .zip(e2fsck.chunks(block_size as usize))
        .enumerate()
        .filter(|(index, _)| !skip.contains(&(*index as u64)))
        .filter(|(index, (ours, theirs))| {
            let start = index * block_size as usize;
            ours.iter()
                .zip(theirs.iter())
                .enumerate()
                .any(|(at, (a, b))| a != b && !SUPERBLOCK.contains(&(start + at)))
        })
        .map(|(index, _)| index)
        .collect();
    if differing.is_empty() {
        return Ok(());
    }
    Err(format!(
        "jext4 recover and e2fsck -E journal_only replayed differently: blocks {:?}{}",
        &differing[..differing.len().min(8)],
        if differing.len() > 8 { " …" } else { "" }
    ))
}

fn panic_text(panic: &Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|text| text.to_string()))
        .unwrap_or_else(|| "unknown panic".into())
}
