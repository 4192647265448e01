//! metadata + fsync: the ext4 ByteLog RFC's `meta_create_unlink_fsyncN` and
//! DJFS's MDTest pattern. Each thread owns a directory and repeats: create a
//! file, write 4 KiB, fsync, close, unlink. One operation is one such cycle.

use std::io::{self, Write};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use serde_json::json;

use crate::common::{at, emit, pattern, run_threads};
use crate::files::Files;

pub fn run<F: Files>(files: Arc<F>, dir: PathBuf, threads: usize, seconds: f64) -> io::Result<()> {
    for index in 0..threads {
        let own = dir.join(format!("t{index}"));
        files.create_dir_all(&own).map_err(at(&own))?;
    }
    let block = pattern(4096, 7);
    let root = dir.clone();
    let result = run_threads(threads, seconds, move |index, stop| {
        let own = root.join(format!("t{index}"));
        let mut cycles = 0u64;
        while !stop.load(Ordering::Relaxed) {
            let path = own.join(format!("f{cycles}"));
            let mut file = files.create_new(&path).map_err(at(&path))?;
            file.write_all(&block).map_err(at(&path))?;
            files.sync_all(&file).map_err(at(&path))?;
            drop(file);
            files.remove_file(&path).map_err(at(&path))?;
            cycles += 1;
        }
        Ok(cycles)
    })?;
    emit(json!({
        "workload": "metafsync",
        "threads": threads,
        "operations": result.operations,
        "seconds": result.seconds,
        "ops_per_sec": result.per_second(),
    }));
    Ok(())
}
