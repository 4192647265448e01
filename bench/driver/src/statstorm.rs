//! A `git status`-like stat storm: git keeps the list of tracked files in
//! its index and, to tell what changed, lstats every one of them (split
//! over threads, `core.preloadIndex`), then reads every directory to find
//! untracked files. Here the list comes from a file (the tarball's
//! listing, made outside the measurement), so the first round meets the
//! filesystem's caches as cold as the caller left them (bench/run
//! remounts first); the later rounds are the warm `git status` of a tree
//! nobody changed.

use std::fs;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::Instant;

use serde_json::json;

use crate::common::{at, emit};

pub struct Options {
    pub dir: PathBuf,
    /// Paths relative to `dir`, one per line; a trailing `/` marks a
    /// directory (tar's listing).
    pub list: PathBuf,
    pub threads: usize,
    pub rounds: usize,
}

pub fn run(options: Options) -> io::Result<()> {
    assert!(options.threads > 0 && options.rounds > 0);
    let listing = fs::read(&options.list).map_err(at(&options.list))?;
    let mut files = Vec::new();
    let mut directories = Vec::new();
    for line in listing
        .split(|&byte| byte == b'\n')
        .filter(|line| !line.is_empty())
    {
        let relative = Path::new(std::ffi::OsStr::from_bytes(line));
        let path = options.dir.join(relative);
        if line.ends_with(b"/") {
            directories.push(path);
        } else {
            files.push(path);
        }
    }
    let mut seconds = Vec::with_capacity(options.rounds);
    for _ in 0..options.rounds {
        let began = Instant::now();
        lstat_all(&files, options.threads)?;
        read_all(&directories)?;
        seconds.push(began.elapsed().as_secs_f64());
    }
    let warm = &seconds[1..];
    let warm_median = if warm.is_empty() {
        None
    } else {
        let mut sorted = warm.to_vec();
        sorted.sort_by(f64::total_cmp);
        Some(sorted[sorted.len() / 2])
    };
    emit(json!({
        "files": files.len(),
        "directories": directories.len(),
        "cold_seconds": seconds[0],
        "warm_seconds": warm_median,
        "rounds": seconds,
    }));
    Ok(())
}

/// lstat every file, the list split in `threads` contiguous parts (git's
/// preload splits its index the same way).
fn lstat_all(files: &[PathBuf], threads: usize) -> io::Result<()> {
    let chunk = files.len().div_ceil(threads).max(1);
    std::thread::scope(|scope| {
        let workers: Vec<_> = files
            .chunks(chunk)
            .map(|part| {
                scope.spawn(move || {
                    for path in part {
                        fs::symlink_metadata(path).map_err(at(path))?;
                    }
                    Ok::<(), io::Error>(())
                })
            })
            .collect();
        workers
            .into_iter()
            .try_for_each(|worker| worker.join().expect("lstat thread panicked"))
    })
}

/// Read every directory whole, as the untracked-files scan does.
fn read_all(directories: &[PathBuf]) -> io::Result<()> {
    for directory in directories {
        for entry in fs::read_dir(directory).map_err(at(directory))? {
            entry.map_err(at(directory))?;
        }
    }
    Ok(())
}
