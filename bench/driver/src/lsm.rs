//! LSM compaction: the RocksDB pattern of the DJFS paper. All threads are
//! compaction threads of one database directory. One operation is one
//! compaction output:
//!   1. write a new table file `<number>.sst` in 64 KiB writes, fsync it;
//!   2. fsync the database directory (the new name must be durable before the
//!      manifest names it);
//!   3. append a version edit to the shared `MANIFEST` and fsync it (one writer
//!      at a time, as RocksDB's manifest writer is);
//!   4. unlink the compaction's input tables (here: the thread's tables older
//!      than its two newest).

use std::collections::VecDeque;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use serde_json::json;

use crate::common::{at, emit, fsync_dir, pattern, run_threads};

const WRITE_BYTES: usize = 64 * 1024;
const LIVE_TABLES_PER_THREAD: usize = 2;

struct Database {
    dir: PathBuf,
    next_number: AtomicU64,
    manifest: Mutex<File>,
}

fn write_table(
    db: &Database,
    number: u64,
    table_bytes: usize,
    chunk: &[u8],
) -> io::Result<PathBuf> {
    let path = db.dir.join(format!("{number:06}.sst"));
    let mut file = File::create(&path).map_err(at(&path))?;
    let mut written = 0;
    while written < table_bytes {
        let len = chunk.len().min(table_bytes - written);
        file.write_all(&chunk[..len]).map_err(at(&path))?;
        written += len;
    }
    file.sync_all().map_err(at(&path))?;
    Ok(path)
}

fn log_edit(db: &Database, number: u64, deleted: Option<&PathBuf>) -> io::Result<()> {
    let mut manifest = db.manifest.lock().expect("manifest lock");
    let deleted = deleted.and_then(|path| path.file_name());
    let edit = format!("add {number:06}.sst delete {deleted:?}\n");
    manifest.write_all(edit.as_bytes())?;
    manifest.sync_all()
}

pub fn run(dir: PathBuf, threads: usize, seconds: f64, table_kib: usize) -> io::Result<()> {
    assert!(table_kib > 0, "tables are not empty");
    let db_dir = dir.join("db");
    fs::create_dir_all(&db_dir).map_err(at(&db_dir))?;
    let manifest_path = db_dir.join("MANIFEST-000001");
    let manifest = OpenOptions::new()
        .create(true)
        .append(true)
        .open(&manifest_path)
        .map_err(at(&manifest_path))?;
    let db = Arc::new(Database {
        dir: db_dir,
        next_number: AtomicU64::new(1),
        manifest: Mutex::new(manifest),
    });
    let chunk = pattern(WRITE_BYTES, 11);
    let table_bytes = table_kib * 1024;
    let result = run_threads(threads, seconds, move |_index, stop| {
        let mut live: VecDeque<PathBuf> = VecDeque::new();
        let mut count = 0u64;
        while !stop.load(Ordering::Relaxed) {
            let number = db.next_number.fetch_add(1, Ordering::Relaxed);
            live.push_back(write_table(&db, number, table_bytes, &chunk)?);
            fsync_dir(&db.dir).map_err(at(&db.dir))?;
            let input = (live.len() > LIVE_TABLES_PER_THREAD).then(|| live.pop_front());
            let input = input.flatten();
            log_edit(&db, number, input.as_ref()).map_err(at(&manifest_path))?;
            if let Some(path) = input {
                fs::remove_file(&path).map_err(at(&path))?;
            }
            count += 1;
        }
        Ok(count)
    })?;
    emit(json!({
        "workload": "lsm",
        "threads": threads,
        "table_kib": table_kib,
        "operations": result.operations,
        "seconds": result.seconds,
        "ops_per_sec": result.per_second(),
        "mb_per_sec": result.per_second() * table_bytes as f64 / 1e6,
    }));
    Ok(())
}
