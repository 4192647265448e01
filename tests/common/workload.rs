//! A mixed workload driven through a mounted filesystem, for crash tests:
//! one thread untars a small real tree again and again (renaming and
//! unlinking in the trees it made before), another writes small files and
//! makes them durable with fsync of the file and of its directory. The
//! second thread keeps a model of what every name it touched must hold
//! after a crash: a name's state is certain only once the fsyncs that make
//! its last change durable have returned.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

/// The one seeded generator (SplitMix64), shared with the crash tests.
pub use jext4::engine::rng::Rng;

/// The seed for a randomised test: `$var` if set, else from the clock.
/// Printed, so that a failure can be replayed.
pub fn seed_from_env(var: &str) -> u64 {
    let seed = match std::env::var(var) {
        Ok(text) => text
            .parse()
            .unwrap_or_else(|_| panic!("{var}={text}: not a number")),
        Err(_) => std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64,
    };
    println!("seed {seed} (set {var}={seed} to replay)");
    seed
}

/// `$var` as a number, or `default`.
pub fn env_number(var: &str, default: u64) -> u64 {
    std::env::var(var)
        .ok()
        .and_then(|text| text.parse().ok())
        .unwrap_or(default)
}

/// A tarball of a few package documentation directories of this machine
/// (a small real tree: text, gzip files, changelogs, a few hundred KiB).
pub fn doc_tarball(dir: &Path) -> PathBuf {
    const WANTED: &[&str] = &[
        "bash",
        "e2fsprogs",
        "tar",
        "coreutils",
        "apt",
        "util-linux",
        "gzip",
    ];
    let doc = Path::new("/usr/share/doc");
    let mut chosen: Vec<String> = WANTED
        .iter()
        .filter(|name| doc.join(name).is_dir())
        .map(|name| name.to_string())
        .collect();
    if chosen.len() < 3 {
        // Any machine has some documentation; take the first few.
        let mut names: Vec<String> = std::fs::read_dir(doc)
            .map(|entries| {
                entries
                    .filter_map(|entry| entry.ok())
                    .map(|entry| entry.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        names.sort();
        chosen.extend(names.into_iter().take(8));
    }
    assert!(!chosen.is_empty(), "no documentation under /usr/share/doc");
    let tarball = dir.join("doc.tar");
    let status = Command::new("tar")
        .arg("-C")
        .arg(doc)
        .arg("-cf")
        .arg(&tarball)
        .args(&chosen)
        .stderr(Stdio::null())
        .status()
        .unwrap();
    // tar exits 1 when a file changed while being read; the archive is
    // still usable.
    assert!(
        status.code().is_some_and(|code| code <= 1),
        "tar failed: {status}"
    );
    tarball
}

/// What a name must be after a crash.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Expect {
    Present(Vec<u8>),
    Absent,
    /// Changed since its last durable state: anything goes.
    Uncertain,
}

pub type Model = BTreeMap<String, Expect>;

/// Counts of what the workload did.
#[derive(Debug, Default)]
pub struct Counts {
    pub untars: AtomicU64,
    pub tree_renames: AtomicU64,
    pub tree_unlinks: AtomicU64,
    /// fsync of a file and then of its directory, both returned.
    pub durable_ops: AtomicU64,
}

struct Shared {
    root: PathBuf,
    tarball: PathBuf,
    /// Stop at the next step (clean end).
    stop: AtomicBool,
    /// The server is being killed: errors from now on are expected.
    killed: AtomicBool,
    model: Mutex<Model>,
    counts: Counts,
    /// Hold files open after unlinking them.
    orphans: bool,
}

/// The workload, running.
pub struct Running {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<Result<(), String>>>,
}

/// What the workload left: the model and its counts.
pub struct Outcome {
    pub model: Model,
    pub counts: Counts,
}

impl Outcome {
    pub fn summary(&self) -> String {
        let certain = self
            .model
            .values()
            .filter(|e| **e != Expect::Uncertain)
            .count();
        format!(
            "{} untars, {} tree renames, {} tree unlinks, {} fsync'd operations, {certain} names certain",
            self.counts.untars.load(Ordering::Relaxed),
            self.counts.tree_renames.load(Ordering::Relaxed),
            self.counts.tree_unlinks.load(Ordering::Relaxed),
            self.counts.durable_ops.load(Ordering::Relaxed),
        )
    }
}

/// Start the workload in `root`: a mounted filesystem's root, or a new
/// directory in one (created here). With `orphans`, some files are
/// unlinked while open and kept open, so that a crash leaves orphan inodes.
pub fn start(root: &Path, tarball: &Path, seed: u64, orphans: bool) -> Running {
    std::fs::create_dir_all(root).unwrap();
    let shared = Arc::new(Shared {
        root: root.to_path_buf(),
        tarball: tarball.to_path_buf(),
        stop: AtomicBool::new(false),
        killed: AtomicBool::new(false),
        model: Mutex::new(Model::new()),
        counts: Counts::default(),
        orphans,
    });
    let untar = {
        let shared = Arc::clone(&shared);
        std::thread::spawn(move || shared.guarded(|s| s.untar_loop(Rng::new(seed))))
    };
    let durable = {
        let shared = Arc::clone(&shared);
        std::thread::spawn(move || shared.guarded(|s| s.durable_loop(Rng::new(seed ^ 0x5EED))))
    };
    Running {
        shared,
        threads: vec![untar, durable],
    }
}

impl Running {
    /// Say that the server is about to be killed: errors become expected.
    pub fn expect_kill(&self) {
        self.shared.killed.store(true, Ordering::SeqCst);
    }

    /// Ask the threads to stop after their current step.
    pub fn request_stop(&self) {
        self.shared.stop.store(true, Ordering::SeqCst);
    }

    pub fn durable_ops(&self) -> u64 {
        self.shared.counts.durable_ops.load(Ordering::Relaxed)
    }

    /// Wait for the threads (after a stop request or a kill). Panics with
    /// the first error a thread met before any kill.
    pub fn join(self) -> Outcome {
        let mut failures = Vec::new();
        for thread in self.threads {
            match thread.join() {
                Ok(Ok(())) => {}
                Ok(Err(message)) => failures.push(message),
                Err(_) => failures.push("a workload thread panicked".into()),
            }
        }
        assert!(failures.is_empty(), "workload failed: {failures:?}");
        let shared = Arc::try_unwrap(self.shared)
            .unwrap_or_else(|_| panic!("workload threads still hold the state"));
        Outcome {
            model: shared.model.into_inner().unwrap(),
            counts: shared.counts,
        }
    }
}

/// Why a workload step stopped.
enum Halt {
    /// Stop requested, or the server was killed.
    Expected,
    Failed(String),
}

type Step<T> = Result<T, Halt>;

impl Shared {
    fn guarded(&self, body: impl FnOnce(&Shared) -> Step<()>) -> Result<(), String> {
        match body(self) {
            Ok(()) | Err(Halt::Expected) => Ok(()),
            Err(Halt::Failed(message)) => Err(message),
        }
    }

    /// Turn an I/O result into a step: an error after the kill started
    /// ends the loop quietly; one before is a failure of the filesystem.
    fn check<T>(&self, what: &str, result: std::io::Result<T>) -> Step<T> {
        match result {
            Ok(value) => Ok(value),
            Err(_) if self.killed.load(Ordering::SeqCst) => Err(Halt::Expected),
            Err(error) => Err(Halt::Failed(format!(
                "{what}: {error} ({})",
                space_report(&self.root)
            ))),
        }
    }

    fn keep_going(&self) -> Step<()> {
        if self.stop.load(Ordering::SeqCst) || self.killed.load(Ordering::SeqCst) {
            Err(Halt::Expected)
        } else {
            Ok(())
        }
    }

    /// Untar into `t<i>`, rename it `done<i>`; in `done<i-1>` rename and
    /// unlink some files; remove `done<i-2>` entirely.
    fn untar_loop(&self, mut rng: Rng) -> Step<()> {
        for round in 0u64.. {
            self.keep_going()?;
            let fresh = self.root.join(format!("t{round}"));
            self.check("mkdir", std::fs::create_dir(&fresh))?;
            let status = Command::new("tar")
                .arg("-C")
                .arg(&fresh)
                .arg("-xf")
                .arg(&self.tarball)
                .stderr(Stdio::null())
                .status();
            let status = self.check("tar", status)?;
            if !status.success() {
                self.check::<()>("tar", Err(std::io::Error::other(status.to_string())))?;
            }
            self.counts.untars.fetch_add(1, Ordering::Relaxed);
            let done = self.root.join(format!("done{round}"));
            self.check("rename tree", std::fs::rename(&fresh, &done))?;
            if round >= 1 {
                self.shuffle_tree(&self.root.join(format!("done{}", round - 1)), &mut rng)?;
            }
            if round >= 2 {
                let old = self.root.join(format!("done{}", round - 2));
                self.check("remove tree", std::fs::remove_dir_all(&old))?;
            }
        }
        Ok(())
    }

    /// Rename about a quarter and unlink about an eighth of a tree's files.
    fn shuffle_tree(&self, tree: &Path, rng: &mut Rng) -> Step<()> {
        let mut pending = vec![tree.to_path_buf()];
        let mut files = Vec::new();
        while let Some(dir) = pending.pop() {
            for entry in self.check("readdir", std::fs::read_dir(&dir))? {
                let entry = self.check("readdir", entry)?;
                let kind = self.check("file type", entry.file_type())?;
                if kind.is_dir() {
                    pending.push(entry.path());
                } else {
                    files.push(entry.path());
                }
            }
        }
        for file in files {
            self.keep_going()?;
            match rng.below(8) {
                0 | 1 => {
                    let renamed = file.with_extension("renamed");
                    self.check("rename", std::fs::rename(&file, renamed))?;
                    self.counts.tree_renames.fetch_add(1, Ordering::Relaxed);
                }
                2 => {
                    self.check("unlink", std::fs::remove_file(&file))?;
                    self.counts.tree_unlinks.fetch_add(1, Ordering::Relaxed);
                }
                _ => {}
            }
        }
        Ok(())
    }

    fn set(&self, name: &str, expect: Expect) {
        self.model.lock().unwrap().insert(name.to_string(), expect);
    }

    fn fsync_path(&self, path: &Path) -> Step<()> {
        let file = self.check("open for fsync", std::fs::File::open(path))?;
        self.check("fsync", file.sync_all())
    }

    /// Write `content` to `path` (created or truncated), fsync it.
    fn write_synced(&self, path: &Path, content: &[u8]) -> Step<()> {
        let mut file = self.check("create", std::fs::File::create(path))?;
        self.check("write", file.write_all(content))?;
        self.check("fsync", file.sync_all())
    }

    /// Small files in `s/` and `s2/`, each change made durable by fsync of
    /// the file and of the directories involved; the model follows.
    fn durable_loop(&self, mut rng: Rng) -> Step<()> {
        let dirs = [self.root.join("s"), self.root.join("s2")];
        for dir in &dirs {
            self.check("mkdir", std::fs::create_dir(dir))?;
        }
        self.fsync_path(&self.root)?;
        if let Some(parent) = self.root.parent() {
            // `root` itself may be new.
            self.fsync_path(parent)?;
        }
        let mut live: Vec<String> = Vec::new();
        let mut held: std::collections::VecDeque<std::fs::File> = Default::default();
        for serial in 0u64.. {
            self.keep_going()?;
            let choices = if self.orphans { 11 } else { 10 };
            let choice = if live.len() < 4 {
                0
            } else {
                rng.below(choices)
            };
            match choice {
                0..=3 => self.create_durable(&mut rng, &mut live, serial)?,
                4 | 5 => self.overwrite_durable(&mut rng, &live)?,
                6 => self.replace_durable(&mut rng, &mut live, serial)?,
                7 | 8 => self.unlink_durable(&mut rng, &mut live)?,
                9 => self.move_durable(&mut rng, &mut live)?,
                _ => self.unlink_while_open(&mut rng, &mut held, serial)?,
            }
            self.counts.durable_ops.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }

    fn content(rng: &mut Rng) -> Vec<u8> {
        let len = match rng.below(6) {
            0 => 0,
            1 => 4096,
            2 => 1 + rng.below(64) as usize,
            _ => rng.below(9000) as usize,
        };
        rng.bytes(len)
    }

    fn parent_of(&self, name: &str) -> PathBuf {
        self.root.join(name).parent().unwrap().to_path_buf()
    }

    fn create_durable(&self, rng: &mut Rng, live: &mut Vec<String>, serial: u64) -> Step<()> {
        let name = format!("s/f{serial}");
        let content = Self::content(rng);
        self.set(&name, Expect::Uncertain);
        self.write_synced(&self.root.join(&name), &content)?;
        self.fsync_path(&self.parent_of(&name))?;
        self.set(&name, Expect::Present(content));
        live.push(name);
        Ok(())
    }

    fn overwrite_durable(&self, rng: &mut Rng, live: &[String]) -> Step<()> {
        let name = &live[rng.below(live.len() as u64) as usize];
        let content = Self::content(rng);
        self.set(name, Expect::Uncertain);
        self.write_synced(&self.root.join(name), &content)?;
        self.set(name, Expect::Present(content));
        Ok(())
    }

    /// Write a temporary file, fsync, rename it over a live one, fsync the
    /// directory: the atomic-replace idiom.
    fn replace_durable(&self, rng: &mut Rng, live: &mut [String], serial: u64) -> Step<()> {
        let target = live[rng.below(live.len() as u64) as usize].clone();
        let temporary = format!("{}.tmp{serial}", target);
        let content = Self::content(rng);
        self.set(&temporary, Expect::Uncertain);
        self.write_synced(&self.root.join(&temporary), &content)?;
        self.set(&target, Expect::Uncertain);
        self.check(
            "rename over",
            std::fs::rename(self.root.join(&temporary), self.root.join(&target)),
        )?;
        self.fsync_path(&self.parent_of(&target))?;
        self.set(&temporary, Expect::Absent);
        self.set(&target, Expect::Present(content));
        Ok(())
    }

    fn unlink_durable(&self, rng: &mut Rng, live: &mut Vec<String>) -> Step<()> {
        let name = live.swap_remove(rng.below(live.len() as u64) as usize);
        self.set(&name, Expect::Uncertain);
        self.check("unlink", std::fs::remove_file(self.root.join(&name)))?;
        self.fsync_path(&self.parent_of(&name))?;
        self.set(&name, Expect::Absent);
        Ok(())
    }

    /// Create a file, unlink it durably while it stays open (an orphan
    /// until closed, which a crash leaves to recovery), write to it after
    /// the unlink; a few such files stay open at a time.
    fn unlink_while_open(
        &self,
        rng: &mut Rng,
        held: &mut std::collections::VecDeque<std::fs::File>,
        serial: u64,
    ) -> Step<()> {
        let name = format!("s/o{serial}");
        let path = self.root.join(&name);
        self.set(&name, Expect::Uncertain);
        let mut file = self.check(
            "create",
            std::fs::OpenOptions::new()
                .create(true)
                .truncate(true)
                .read(true)
                .write(true)
                .open(&path),
        )?;
        self.check("write", file.write_all(&Self::content(rng)))?;
        self.check("fsync", file.sync_all())?;
        self.check("unlink open file", std::fs::remove_file(&path))?;
        self.fsync_path(&self.parent_of(&name))?;
        self.set(&name, Expect::Absent);
        self.check("write after unlink", file.write_all(&Self::content(rng)))?;
        self.check("fsync after unlink", file.sync_all())?;
        held.push_back(file);
        if held.len() > 3 {
            held.pop_front();
        }
        Ok(())
    }

    /// Rename a live file into the other directory; fsync both.
    fn move_durable(&self, rng: &mut Rng, live: &mut [String]) -> Step<()> {
        let index = rng.below(live.len() as u64) as usize;
        let from = live[index].clone();
        let (dir, file) = from.split_once('/').unwrap();
        let to = format!("{}/{file}", if dir == "s" { "s2" } else { "s" });
        let content = match self.model.lock().unwrap().get(&from) {
            Some(Expect::Present(content)) => content.clone(),
            other => panic!("live file {from} is {other:?}"),
        };
        self.set(&from, Expect::Uncertain);
        self.set(&to, Expect::Uncertain);
        self.check(
            "rename across",
            std::fs::rename(self.root.join(&from), self.root.join(&to)),
        )?;
        self.fsync_path(&self.parent_of(&to))?;
        self.fsync_path(&self.parent_of(&from))?;
        self.set(&from, Expect::Absent);
        self.set(&to, Expect::Present(content));
        live[index] = to;
        Ok(())
    }
}

/// `statfs` of the filesystem holding `path`, for failure messages: an
/// ENOSPC reads differently on a full volume and on one with room.
pub fn space_report(path: &Path) -> String {
    use std::os::unix::ffi::OsStrExt;
    let Ok(name) = std::ffi::CString::new(path.as_os_str().as_bytes()) else {
        return "statfs: path has a NUL byte".into();
    };
    let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `name` is NUL-terminated and `stat` is a valid out-pointer.
    if unsafe { libc::statvfs(name.as_ptr(), &mut stat) } != 0 {
        return format!("statfs: {}", std::io::Error::last_os_error());
    }
    format!(
        "statfs: {} of {} blocks of {} bytes free ({} for users), {} of {} inodes free",
        stat.f_bfree, stat.f_blocks, stat.f_frsize, stat.f_bavail, stat.f_ffree, stat.f_files
    )
}

/// Check a recovered image against the model through jext4's library,
/// read-only: every certain name (relative to the workload's root, which
/// is `under` in the image: "" for the image's root) is as expected, and
/// every file of the whole tree reads without error. Returns the number
/// of names checked.
pub fn verify_model(image: &Path, under: &str, model: &Model) -> usize {
    use jext4::Image;
    use jext4::engine::fs::MountOptions;
    let options = MountOptions {
        read_only: true,
        ..MountOptions::default()
    };
    let fs = Image::options()
        .mount_options(options)
        .open(image)
        .unwrap_or_else(|e| panic!("read-only open of {}: {e}", image.display()));
    let mut checked = 0;
    for (name, expect) in model {
        let name = &format!("{under}/{name}");
        let found = fs.read(name);
        match (expect, found) {
            (Expect::Present(content), Ok(bytes)) => {
                if bytes != *content {
                    // Leave both next to the image for inspection.
                    let stem = image.with_extension(name.replace('/', "_"));
                    std::fs::write(stem.with_extension("expected"), content).unwrap();
                    std::fs::write(stem.with_extension("found"), &bytes).unwrap();
                }
                assert!(
                    bytes == *content,
                    "{name}: {} bytes found, {} expected (content differs)",
                    bytes.len(),
                    content.len()
                );
                checked += 1;
            }
            (Expect::Present(_), Err(e)) => panic!("{name} was fsync'd but reads as: {e}"),
            (Expect::Absent, Err(jext4::Error::NotFound)) => checked += 1,
            (Expect::Absent, other) => {
                panic!(
                    "{name} was removed durably but is there: {:?}",
                    other.map(|b| b.len())
                )
            }
            (Expect::Uncertain, Ok(_)) | (Expect::Uncertain, Err(jext4::Error::NotFound)) => {}
            (Expect::Uncertain, Err(e)) => panic!("{name}: {e}"),
        }
    }
    // Everything else must at least read back.
    let mut pending = vec![String::from("/")];
    let mut bound = 0;
    while let Some(dir) = pending.pop() {
        bound += 1;
        assert!(bound < 1_000_000, "directory walk does not end");
        for entry in fs
            .read_dir(&dir)
            .unwrap_or_else(|e| panic!("readdir {dir}: {e}"))
        {
            let entry = entry.unwrap_or_else(|e| panic!("readdir {dir}: {e}"));
            let path = format!(
                "{}/{}",
                dir.trim_end_matches('/'),
                entry.file_name().to_string_lossy()
            );
            let kind = entry.file_type().unwrap();
            match () {
                _ if kind.is_dir() => pending.push(path),
                _ if kind.is_file() => {
                    fs.read(&path)
                        .unwrap_or_else(|e| panic!("read {path}: {e}"));
                }
                _ => {}
            }
        }
    }
    drop(fs);
    checked
}
