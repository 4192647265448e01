//! The kernel as the oracle of the fast commits jext4 writes: fsync-heavy
//! work through FUSE on a fast_commit image (two writers, each in its own
//! directory: creates, appends with fsync and fdatasync, overwrites,
//! truncates, renames, hard links, unlinks, each made durable by an fsync
//! of the file or of its directory), then `kill -9` of the server. On
//! copies of the crashed image:
//! - a kernel loop mount (its own replay) holds every file whose fsync
//!   returned, with its content, and leaves `e2fsck -fn` clean;
//! - `jext4 recover` leaves `e2fsck -fn` clean and the same tree as the
//!   kernel's replay;
//! - e2fsck 1.47's own replay is reported, not judged (docs/durability.md:
//!   it cannot replay fast commits).
//!
//! Seeded: `JEXT4_FC_KILL_SEED` replays a run.

// The jext4 binary, or the mounts and helpers of tests/common that use it.
#![cfg(feature = "cli")]

mod common;
mod fast_commit_support;

use common::journal::{dumpe2fs_needs_recovery, kernel_available, kernel_lock, run};
use common::server::{KeepOnPanic, Server, fuse_available};
use common::workload::{Rng, seed_from_env};
use fast_commit_support::{Durable, copy_image, replays_agree};
use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What one writer made durable, and the names its unfinished operation
/// touches (either state of those is right after a crash).
#[derive(Default)]
struct Model {
    files: BTreeMap<String, Vec<u8>>,
    in_flight: Vec<String>,
}

/// One writer in `root/dir`, until `stop` or an error (the kill).
struct Writer {
    root: PathBuf,
    dir: String,
    rng: Rng,
    model: Arc<Mutex<Model>>,
    fsyncs: Arc<AtomicUsize>,
    next: usize,
}

impl Writer {
    fn path(&self, name: &str) -> PathBuf {
        self.root.join(&self.dir).join(name)
    }

    fn key(&self, name: &str) -> String {
        format!("{}/{name}", self.dir)
    }

    fn names(&self) -> Vec<String> {
        let prefix = format!("{}/", self.dir);
        let model = self.model.lock().unwrap();
        model
            .files
            .keys()
            .filter_map(|key| key.strip_prefix(&prefix).map(str::to_string))
            .collect()
    }

    fn fsync(&self, name: &str, data_only: bool) -> std::io::Result<()> {
        let file = std::fs::File::open(self.path(name))?;
        if data_only {
            file.sync_data()?;
        } else {
            file.sync_all()?;
        }
        self.fsyncs.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn fsync_dir(&self) -> std::io::Result<()> {
        std::fs::File::open(self.root.join(&self.dir))?.sync_all()?;
        self.fsyncs.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Run operations until one fails (the server died).
    fn run(mut self, stop: &AtomicBool) {
        while !stop.load(Ordering::Relaxed) {
            if self.step().is_err() {
                return;
            }
        }
    }

    /// One operation, made durable; the model changes once it is.
    fn step(&mut self) -> std::io::Result<()> {
        let names = self.names();
        let pick = |rng: &mut Rng| names[rng.below(names.len() as u64) as usize].clone();
        let choice = if names.len() < 4 {
            0
        } else {
            self.rng.below(9)
        };
        match choice {
            0 | 1 => {
                let name = format!("f{:04}", self.next);
                self.next += 1;
                let content = self.random_bytes(9000);
                self.change(&[&name], || {
                    std::fs::File::create(self.path(&name))?.write_all(&content)?;
                    self.fsync(&name, false)
                })?;
                self.set(&name, Some(content));
            }
            2 | 3 => {
                let name = pick(&mut self.rng);
                let more = self.random_bytes(3000);
                let data_only = self.rng.below(2) == 0;
                self.change(&[&name], || {
                    let mut file = std::fs::OpenOptions::new()
                        .append(true)
                        .open(self.path(&name))?;
                    file.write_all(&more)?;
                    self.fsync(&name, data_only)
                })?;
                let mut content = self.content(&name);
                content.extend_from_slice(&more);
                self.set(&name, Some(content));
            }
            4 => {
                let name = pick(&mut self.rng);
                let mut content = self.content(&name);
                let at = self.rng.below(content.len() as u64 + 1) as usize;
                let bytes = self.random_bytes(2000);
                self.change(&[&name], || {
                    let file = std::fs::OpenOptions::new()
                        .write(true)
                        .open(self.path(&name))?;
                    file.write_all_at(&bytes, at as u64)?;
                    self.fsync(&name, false)
                })?;
                if content.len() < at + bytes.len() {
                    content.resize(at + bytes.len(), 0);
                }
                content[at..at + bytes.len()].copy_from_slice(&bytes);
                self.set(&name, Some(content));
            }
            5 => {
                let name = pick(&mut self.rng);
                let mut content = self.content(&name);
                let len = self.rng.below(content.len() as u64 + 1) as usize;
                self.change(&[&name], || {
                    std::fs::OpenOptions::new()
                        .write(true)
                        .open(self.path(&name))?
                        .set_len(len as u64)?;
                    self.fsync(&name, false)
                })?;
                content.truncate(len);
                self.set(&name, Some(content));
            }
            6 => {
                // Rename, sometimes over an existing name.
                let from = pick(&mut self.rng);
                let to = if self.rng.below(3) == 0 {
                    pick(&mut self.rng)
                } else {
                    let name = format!("r{:04}", self.next);
                    self.next += 1;
                    name
                };
                if from == to {
                    return Ok(());
                }
                let content = self.content(&from);
                self.change(&[&from, &to], || {
                    std::fs::rename(self.path(&from), self.path(&to))?;
                    self.fsync(&to, false)
                })?;
                self.set(&from, None);
                self.set(&to, Some(content));
            }
            7 => {
                let from = pick(&mut self.rng);
                let to = format!("l{:04}", self.next);
                self.next += 1;
                self.change(&[&from, &to], || {
                    std::fs::hard_link(self.path(&from), self.path(&to))?;
                    self.fsync(&to, false)
                })?;
                // The second name shares the first one's later writes,
                // which the model does not follow: it is not checked.
                self.model.lock().unwrap().in_flight.clear();
            }
            _ => {
                let name = pick(&mut self.rng);
                self.change(&[&name], || {
                    std::fs::remove_file(self.path(&name))?;
                    self.fsync_dir()
                })?;
                self.set(&name, None);
            }
        }
        Ok(())
    }

    /// 1 to `most` random bytes.
    fn random_bytes(&mut self, most: u64) -> Vec<u8> {
        let len = 1 + self.rng.below(most) as usize;
        self.rng.bytes(len)
    }

    /// Run `work` with `names` marked as in flight.
    fn change(
        &self,
        names: &[&str],
        work: impl FnOnce() -> std::io::Result<()>,
    ) -> std::io::Result<()> {
        self.model.lock().unwrap().in_flight = names.iter().map(|n| self.key(n)).collect();
        work()
    }

    fn content(&self, name: &str) -> Vec<u8> {
        self.model.lock().unwrap().files[&self.key(name)].clone()
    }

    fn set(&self, name: &str, content: Option<Vec<u8>>) {
        let mut model = self.model.lock().unwrap();
        model.in_flight.clear();
        match content {
            Some(content) => model.files.insert(self.key(name), content),
            None => model.files.remove(&self.key(name)),
        };
    }
}

/// Every durable file of every writer whose name is not in flight.
fn durable(models: &[Arc<Mutex<Model>>]) -> Durable {
    let mut files = BTreeMap::new();
    for model in models {
        let model = model.lock().unwrap();
        for (name, content) in &model.files {
            if !model.in_flight.contains(name) {
                files.insert(name.clone(), Some(content.clone()));
            }
        }
    }
    Durable { files }
}

fn stat_value(report: &str, name: &str) -> u64 {
    report
        .lines()
        .find_map(|line| line.strip_prefix(&format!("{name} ")))
        .and_then(|value| value.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {name} in:\n{report}"))
}

fn kill_round(dir: &Path, block_size: &str, rng: &mut Rng) {
    let image = common::mkfs(
        dir,
        &format!("fckill{block_size}"),
        64,
        &["-t", "ext4", "-b", block_size, "-O", "fast_commit"],
    );
    // Full commits only when the area fills or a change needs one.
    let server = Server::start(&image, "commit=60");
    let root = server.mountpoint.clone();
    let stop = Arc::new(AtomicBool::new(false));
    let fsyncs = Arc::new(AtomicUsize::new(0));
    let mut models = Vec::new();
    let mut threads = Vec::new();
    for index in 0..2 {
        let dir = format!("w{index}");
        std::fs::create_dir(root.join(&dir)).unwrap();
        let model = Arc::new(Mutex::new(Model::default()));
        models.push(Arc::clone(&model));
        let writer = Writer {
            root: root.clone(),
            dir,
            rng: Rng::new(rng.next_u64()),
            model,
            fsyncs: Arc::clone(&fsyncs),
            next: 0,
        };
        let stop = Arc::clone(&stop);
        threads.push(std::thread::spawn(move || writer.run(&stop)));
    }
    // The directories are made by a full commit; then fsync-heavy work,
    // long enough for the server's stats file (refreshed every 2 s) to
    // show it, and the kill at a random moment after.
    let started = Instant::now();
    while started.elapsed() < Duration::from_millis(2300) {
        std::thread::sleep(Duration::from_millis(10));
    }
    let (_, report) = run(common::server::JEXT4, &["stats", root.to_str().unwrap()]);
    std::thread::sleep(Duration::from_millis(rng.below(300)));
    let ending = server.kill9();
    stop.store(true, Ordering::Relaxed);
    ending.assert_killed();
    for thread in threads {
        thread.join().unwrap();
    }
    let fast_commits = stat_value(&report, "fast_commits");
    let full_commits = stat_value(&report, "full_commits");
    eprintln!(
        "{block_size}: {} fsyncs returned; before the kill {fast_commits} fast commits, \
         {full_commits} full commits, {} flushes per fast commit",
        fsyncs.load(Ordering::Relaxed),
        report
            .lines()
            .find(|line| line.starts_with("fast_commit_flushes_per_commit"))
            .unwrap_or("?")
    );
    assert!(
        fast_commits > full_commits,
        "fsyncs should mostly be fast commits:\n{report}"
    );
    assert!(dumpe2fs_needs_recovery(&image));
    let crash = copy_image(&image, "crash");
    let expected = durable(&models);
    replays_agree(&crash, &expected, block_size);
}

#[test]
fn kill9_during_fsyncs_the_kernel_replays_every_acknowledged_file() {
    if !fuse_available() || !kernel_available() || !common::require_tool("mke2fs") {
        return;
    }
    let _kernel = kernel_lock();
    let seed = seed_from_env("JEXT4_FC_KILL_SEED");
    let mut rng = Rng::new(seed);
    for block_size in ["1024", "4096"] {
        let dir = KeepOnPanic::new();
        kill_round(dir.path(), block_size, &mut rng);
    }
}
