//! Sixteen threads against one jext4 FUSE mount with sixteen workers:
//! creates, renames across directories (files and directories), unlinks,
//! data writes, fsyncs, readdir and stat, all at once in eight shared
//! directories. Under `--profile ci` the server is built with debug
//! assertions, so the lock checker (`jext4::engine::lock`) panics on the first
//! acquisition out of rank order; the server log must show none.
//!
//! The model: each thread owns its names (`t{thread}-…`), so whatever the
//! interleaving, where each of them is and what it holds is known to its
//! thread alone. Every readdir and stat checks the thread's own names
//! against its model while the others run; at the end the whole tree must
//! be exactly the union of the models, e2fsck clean, and the same through
//! a kernel mount. Once on a plain image, once on a fast_commit image
//! (per-directory fast commits).

// The jext4 binary, or the mounts and helpers of tests/common that use it.
#![cfg(feature = "cli")]

mod common;

use common::e2e::{self, JextMount, KernelMount};
use jext4::engine::rng::Rng;
use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

const THREADS: u64 = 16;
const STEPS: u64 = 1500;
/// Shared top-level directories every thread works in.
const DIRECTORIES: u64 = 8;
/// Files each thread owns (present or not at any moment).
const FILES_PER_THREAD: u64 = 6;

/// What one thread knows of its own names.
#[derive(Default)]
struct Model {
    /// File name → (directory index, contents).
    files: BTreeMap<String, (u64, Vec<u8>)>,
    /// The thread's own directory, if it exists: (directory index, the
    /// files inside it, by name and contents).
    subdir: Option<(u64, BTreeMap<String, Vec<u8>>)>,
}

fn top(root: &Path, index: u64) -> PathBuf {
    root.join(format!("d{index}"))
}

fn subdir_name(thread: u64) -> String {
    format!("t{thread}-dir")
}

/// The thread's names listed in `dir`, as readdir sees them now.
fn own_names(dir: &Path, prefix: &str) -> BTreeSet<String> {
    fs::read_dir(dir)
        .unwrap_or_else(|error| panic!("readdir {}: {error}", dir.display()))
        .map(|entry| entry.unwrap().file_name().into_string().unwrap())
        .filter(|name| name.starts_with(prefix))
        .collect()
}

impl Model {
    /// The names of this thread the model places in top directory `index`.
    fn names_in(&self, index: u64, thread: u64) -> BTreeSet<String> {
        let mut names: BTreeSet<String> = self
            .files
            .iter()
            .filter(|(_, (dir, _))| *dir == index)
            .map(|(name, _)| name.clone())
            .collect();
        if let Some((dir, _)) = &self.subdir
            && *dir == index
        {
            names.insert(subdir_name(thread));
        }
        names
    }
}

/// One thread's steps, kept in `model`; every check is against it.
/// Returns the fsyncs done.
fn worker(root: &Path, thread: u64, model: &mut Model) -> usize {
    let mut rng = Rng::derive(thread, "e2e_stress");
    let prefix = format!("t{thread}-");
    let mut fsyncs = 0;
    for step in 0..STEPS {
        let name = format!("t{thread}-f{}", rng.below(FILES_PER_THREAD));
        let dir = rng.below(DIRECTORIES);
        let context = format!("thread {thread} step {step}");
        match rng.below(10) {
            0 | 1 => {
                // Create (or rewrite) a file, fsync it now and then.
                let data = e2e::pattern(thread * 1000 + step, rng.range(1, 9000) as usize);
                let at = match model.files.get(&name) {
                    Some((current, _)) => *current,
                    None => dir,
                };
                let path = top(root, at).join(&name);
                let mut file = fs::File::create(&path).expect(&context);
                file.write_all(&data).expect(&context);
                if rng.chance(1, 2) {
                    file.sync_all().expect(&context);
                    fsyncs += 1;
                }
                model.files.insert(name, (at, data));
            }
            2 | 3 => {
                // Rename across directories (or within one).
                if let Some((from, data)) = model.files.remove(&name) {
                    fs::rename(top(root, from).join(&name), top(root, dir).join(&name))
                        .expect(&context);
                    model.files.insert(name, (dir, data));
                }
            }
            4 => {
                if let Some((at, _)) = model.files.remove(&name) {
                    fs::remove_file(top(root, at).join(&name)).expect(&context);
                }
            }
            5 => {
                // A data write inside or past the end, then fdatasync.
                if let Some((at, data)) = model.files.get_mut(&name) {
                    let offset = rng.below(data.len() as u64 + 4096);
                    let chunk = e2e::pattern(step + 7, rng.range(1, 5000) as usize);
                    let file = fs::OpenOptions::new()
                        .write(true)
                        .open(top(root, *at).join(&name))
                        .expect(&context);
                    file.write_all_at(&chunk, offset).expect(&context);
                    let end = offset as usize + chunk.len();
                    if data.len() < end {
                        data.resize(end, 0);
                    }
                    data[offset as usize..end].copy_from_slice(&chunk);
                    if rng.chance(1, 2) {
                        file.sync_data().expect(&context);
                        fsyncs += 1;
                    }
                }
            }
            6 => {
                // Readdir of any directory: this thread's names are there
                // exactly as the model says, whatever the others do.
                let listed = own_names(&top(root, dir), &prefix);
                assert_eq!(listed, model.names_in(dir, thread), "{context}: d{dir}");
            }
            7 => {
                // Stat every file the thread owns.
                for (name, (at, data)) in &model.files {
                    let meta = fs::symlink_metadata(top(root, *at).join(name)).expect(&context);
                    assert_eq!(meta.len(), data.len() as u64, "{context}: {name}");
                }
            }
            8 => subdir_step(root, thread, model, &mut rng, &context),
            _ => {
                // Read a file back.
                if let Some((at, data)) = model.files.get(&name) {
                    let read = e2e::read_all(&top(root, *at).join(&name));
                    assert!(read == *data, "{context}: {name} differs from its model");
                }
            }
        }
    }
    fsyncs
}

/// The thread's own directory: made, moved between the shared
/// directories (a cross-directory directory rename, which rewrites its
/// ".."), given a file, emptied and removed.
fn subdir_step(root: &Path, thread: u64, model: &mut Model, rng: &mut Rng, context: &str) {
    let name = subdir_name(thread);
    let to = rng.below(DIRECTORIES);
    match model.subdir.take() {
        None => {
            fs::create_dir(top(root, to).join(&name)).expect(context);
            model.subdir = Some((to, BTreeMap::new()));
        }
        Some((at, mut inside)) => match rng.below(3) {
            0 => {
                fs::rename(top(root, at).join(&name), top(root, to).join(&name)).expect(context);
                model.subdir = Some((to, inside));
            }
            1 => {
                let file = format!("g{}", rng.below(3));
                let data = e2e::pattern(thread, rng.range(1, 3000) as usize);
                fs::write(top(root, at).join(&name).join(&file), &data).expect(context);
                inside.insert(file, data);
                model.subdir = Some((at, inside));
            }
            _ => {
                let path = top(root, at).join(&name);
                for file in inside.keys() {
                    fs::remove_file(path.join(file)).expect(context);
                }
                fs::remove_dir(&path).expect(context);
            }
        },
    }
}

/// The tree the models describe, as (relative path → contents; None for
/// a directory).
fn expected_tree(models: &[Model]) -> BTreeMap<PathBuf, Option<Vec<u8>>> {
    let mut tree = BTreeMap::new();
    for index in 0..DIRECTORIES {
        tree.insert(PathBuf::from(format!("d{index}")), None);
    }
    for (thread, model) in models.iter().enumerate() {
        for (name, (at, data)) in &model.files {
            tree.insert(PathBuf::from(format!("d{at}/{name}")), Some(data.clone()));
        }
        if let Some((at, inside)) = &model.subdir {
            let dir = PathBuf::from(format!("d{at}/{}", subdir_name(thread as u64)));
            for (file, data) in inside {
                tree.insert(dir.join(file), Some(data.clone()));
            }
            tree.insert(dir, None);
        }
    }
    tree
}

/// The tree on the mount, in the same shape.
fn actual_tree(root: &Path) -> BTreeMap<PathBuf, Option<Vec<u8>>> {
    let mut tree = BTreeMap::new();
    let mut pending = vec![PathBuf::new()];
    while let Some(relative) = pending.pop() {
        for entry in fs::read_dir(root.join(&relative)).unwrap() {
            let entry = entry.unwrap();
            let path = relative.join(entry.file_name());
            if entry.file_type().unwrap().is_dir() {
                if path != Path::new("lost+found") {
                    tree.insert(path.clone(), None);
                    pending.push(path);
                }
            } else {
                tree.insert(path.clone(), Some(e2e::read_all(&root.join(&path))));
            }
        }
    }
    tree
}

#[test]
fn sixteen_threads_through_fuse_match_their_models() {
    stress(false);
}

/// The same on a fast_commit image: every fsync commits its directory's
/// transaction, renames across the shared directories unite theirs, and
/// concurrent fsyncs share writes of the fast-commit area.
#[test]
fn sixteen_threads_with_per_directory_fast_commits_match_their_models() {
    stress(true);
}

fn stress(fast_commit: bool) {
    if !e2e::require_e2e() {
        return;
    }
    let scratch = e2e::scratch("stress");
    let features: &[&str] = if fast_commit {
        &["-t", "ext4", "-O", "fast_commit"]
    } else {
        &["-t", "ext4"]
    };
    let image = common::mkfs(scratch.path(), "stress", 256, features);
    let mnt = scratch.path().join("mnt");
    let mount = JextMount::mount(&image, &mnt, "threads=16");
    for index in 0..DIRECTORIES {
        fs::create_dir(top(&mnt, index)).unwrap();
    }
    let started = std::time::Instant::now();
    let results: Vec<(Model, usize)> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..THREADS)
            .map(|thread| {
                let root = mnt.clone();
                scope.spawn(move || {
                    let mut model = Model::default();
                    let fsyncs = worker(&root, thread, &mut model);
                    (model, fsyncs)
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|worker| worker.join().expect("a worker failed"))
            .collect()
    });
    let elapsed = started.elapsed();
    let fsyncs: usize = results.iter().map(|(_, fsyncs)| fsyncs).sum();
    let models: Vec<Model> = results.into_iter().map(|(model, _)| model).collect();
    let expected = expected_tree(&models);
    let seen = actual_tree(&mnt);
    assert!(
        seen == expected,
        "the tree differs from the models: only on the mount {:?}, only in the models {:?}",
        seen.keys()
            .filter(|path| !expected.contains_key(*path))
            .collect::<Vec<_>>(),
        expected
            .keys()
            .filter(|path| !seen.contains_key(*path))
            .collect::<Vec<_>>()
    );
    let seen_by_jext4 = e2e::snapshot(&mnt);
    let log = mount.server_log();
    mount.unmount();
    // The server's last report, written as it unmounted.
    let stats = e2e::jext4_stats(&mnt);
    if fast_commit {
        let value = |name: &str| -> u64 {
            stats
                .lines()
                .find_map(|line| line.strip_prefix(&format!("{name} ")))
                .and_then(|value| value.parse().ok())
                .unwrap_or_else(|| panic!("no {name} in:\n{stats}"))
        };
        assert!(
            value("fast_commit_directory_transactions") > 0,
            "no directory transaction was fast-committed:\n{stats}"
        );
        eprintln!(
            "{}",
            stats
                .lines()
                .filter(|line| line.starts_with("fast_commit") || line.starts_with("dir_tx"))
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
    assert!(
        !log.contains("panicked") && !log.contains("lock ranking violated"),
        "the server panicked:\n{log}"
    );
    e2e::fsck_clean(&image, "after the 16-thread stress");
    let kernel = KernelMount::mount(&image, &mnt, true);
    let seen_by_kernel = e2e::snapshot(&mnt);
    kernel.unmount();
    e2e::assert_same(&seen_by_jext4, &seen_by_kernel, ("jext4", "kernel"));
    eprintln!(
        "stress{}: {THREADS} threads × {STEPS} steps, {fsyncs} fsyncs, {} names at the end, {:.1} s",
        if fast_commit { " (fast commits)" } else { "" },
        expected.len(),
        elapsed.as_secs_f64()
    );
}
