//! varmail: filebench's mail-server personality (used by the DJFS and
//! FastCommit papers). A fileset of `files` files in ONE shared directory, 80 %
//! of them created up front with sizes around 16 KiB; each thread loops over
//! filebench's flow:
//!   delete; create, append, fsync, close; open, read whole, append, fsync,
//!   close; open, read whole, close.
//! Every completed flowop counts as one operation, as filebench counts them
//! (13 per full loop). Appends are 1..=16 KiB (filebench's `appendfilerand`
//! with `meanappendsize=16k`). A per-file lock stands in for filebench's
//! "busy" flag so two threads never work on one file at once.

use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};

use serde_json::json;

use crate::common::{Rng, at, emit, pattern, run_threads};
use crate::files::Files;

const APPEND_MAX: u64 = 16 * 1024;
/// How many random picks a flowop tries before it gives up for this loop.
const PICK_ATTEMPTS: usize = 1000;

struct Fileset {
    dir: PathBuf,
    /// `true` when the file exists.
    exists: Vec<Mutex<bool>>,
}

impl Fileset {
    fn path(&self, index: usize) -> PathBuf {
        self.dir.join(format!("mail{index:05}"))
    }

    /// A file whose existence is `want`, locked for this thread.
    fn pick(&self, rng: &mut Rng, want: bool) -> Option<(usize, MutexGuard<'_, bool>)> {
        for _ in 0..PICK_ATTEMPTS {
            let index = rng.below(self.exists.len() as u64) as usize;
            if let Ok(guard) = self.exists[index].try_lock() {
                if *guard == want {
                    return Some((index, guard));
                }
            }
        }
        None
    }
}

fn append(path: &Path, file: &mut impl Write, rng: &mut Rng, data: &[u8]) -> io::Result<()> {
    let len = 1 + rng.below(APPEND_MAX) as usize;
    file.write_all(&data[..len]).map_err(at(path))
}

fn read_whole(path: &Path, file: &mut impl Read, buffer: &mut Vec<u8>) -> io::Result<()> {
    buffer.clear();
    file.read_to_end(buffer).map_err(at(path)).map(|_| ())
}

/// One pass of the flow; returns the number of flowops completed.
fn flow<F: Files>(
    files: &F,
    set: &Fileset,
    rng: &mut Rng,
    data: &[u8],
    buffer: &mut Vec<u8>,
) -> io::Result<u64> {
    let mut ops = 0;
    if let Some((index, mut exists)) = set.pick(rng, true) {
        let path = set.path(index);
        files.remove_file(&path).map_err(at(&path))?;
        *exists = false;
        ops += 1;
    }
    if let Some((index, mut exists)) = set.pick(rng, false) {
        let path = set.path(index);
        let mut file = files.create(&path).map_err(at(&path))?;
        *exists = true;
        append(&path, &mut file, rng, data)?;
        files.sync_all(&file).map_err(at(&path))?;
        ops += 4; // create, append, fsync, close
    }
    if let Some((index, _exists)) = set.pick(rng, true) {
        let path = set.path(index);
        let mut file = files.open_append(&path).map_err(at(&path))?;
        read_whole(&path, &mut file, buffer)?;
        append(&path, &mut file, rng, data)?;
        files.sync_all(&file).map_err(at(&path))?;
        ops += 5; // open, read whole, append, fsync, close
    }
    if let Some((index, _exists)) = set.pick(rng, true) {
        let path = set.path(index);
        let mut file = files.open(&path).map_err(at(&path))?;
        read_whole(&path, &mut file, buffer)?;
        ops += 3; // open, read whole, close
    }
    Ok(ops)
}

fn populate<F: Files>(files: &F, set: &Fileset, seed: u64, data: &[u8]) -> io::Result<()> {
    let mut rng = Rng::new(seed);
    for (index, exists) in set.exists.iter().enumerate() {
        // filebench's default prealloc=80: four files in five exist at start.
        if rng.below(5) == 0 {
            continue;
        }
        let path = set.path(index);
        let len = 1 + rng.below(2 * APPEND_MAX) as usize;
        files.write(&path, &data[..len]).map_err(at(&path))?;
        *exists.lock().expect("fileset lock") = true;
    }
    Ok(())
}

pub fn run<F: Files>(
    store: Arc<F>,
    dir: PathBuf,
    threads: usize,
    seconds: f64,
    files: usize,
    seed: u64,
) -> io::Result<()> {
    assert!(files > 0, "the fileset needs files");
    let set_dir = dir.join("varmail");
    store.create_dir_all(&set_dir).map_err(at(&set_dir))?;
    let set = Arc::new(Fileset {
        dir: set_dir,
        exists: (0..files).map(|_| Mutex::new(false)).collect(),
    });
    let data = Arc::new(pattern(2 * APPEND_MAX as usize, 3));
    populate(&*store, &set, seed, &data)?;
    let shared = set.clone();
    let result = run_threads(threads, seconds, move |index, stop| {
        let mut rng = Rng::new(seed ^ ((index as u64 + 1) << 32));
        let mut buffer = Vec::new();
        let mut ops = 0;
        while !stop.load(Ordering::Relaxed) {
            ops += flow(&*store, &shared, &mut rng, &data, &mut buffer)?;
        }
        Ok(ops)
    })?;
    emit(json!({
        "workload": "varmail",
        "threads": threads,
        "files": files,
        "operations": result.operations,
        "seconds": result.seconds,
        "ops_per_sec": result.per_second(),
    }));
    Ok(())
}
