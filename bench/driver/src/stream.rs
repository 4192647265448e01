//! The streaming case of issue 9: while one writer streams a large file into
//! directory b/ without syncing, another loops in directory a/ over create a
//! file, write 1 KiB, fsync, close. What a/'s fsyncs cost then is what one
//! directory pays for another's unsynced data: kernel ext4 with fast_commit
//! commits a/'s inode alone, and its flush does not write b/'s delayed data.
//! Reports a/'s fsync latency percentiles (the create + write + fsync +
//! close, in µs), how many it completed during the stream, and the stream's
//! own time.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use hdrhistogram::Histogram;
use serde_json::json;

use crate::common::{at, emit, pattern};

/// Keep measuring a/ this many times at least, even if b/ ends first.
const MIN_SAMPLES: u64 = 50;

pub fn run(
    dir: PathBuf,
    stream_mib: usize,
    write_kib: usize,
    record_bytes: usize,
) -> io::Result<()> {
    let (a, b) = (dir.join("a"), dir.join("b"));
    for path in [&a, &b] {
        fs::create_dir_all(path).map_err(at(path))?;
    }
    // Both directories exist on disk before the clock starts.
    File::open(&dir)
        .and_then(|handle| handle.sync_all())
        .map_err(at(&dir))?;
    let done = Arc::new(AtomicBool::new(false));
    let streamer = {
        let (done, big) = (done.clone(), b.join("big"));
        std::thread::spawn(move || -> io::Result<f64> {
            let chunk = pattern(write_kib << 10, 3);
            let mut file = File::create(&big).map_err(at(&big))?;
            let began = Instant::now();
            for _ in 0..(stream_mib << 10) / write_kib {
                file.write_all(&chunk).map_err(at(&big))?;
            }
            let seconds = began.elapsed().as_secs_f64();
            done.store(true, Ordering::Release);
            Ok(seconds)
        })
    };
    let record = pattern(record_bytes, 5);
    let mut latency = Histogram::<u64>::new(3).expect("a histogram");
    let mut during = 0u64;
    for index in 0u64.. {
        let finished = done.load(Ordering::Acquire);
        if finished && index >= MIN_SAMPLES {
            break;
        }
        let path = a.join(format!("f{index}"));
        let began = Instant::now();
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(at(&path))?;
        file.write_all(&record).map_err(at(&path))?;
        file.sync_all().map_err(at(&path))?;
        drop(file);
        let micros = began.elapsed().as_micros() as u64;
        latency.record(micros.max(1)).expect("in range");
        during += !finished as u64;
    }
    let stream_seconds = streamer.join().expect("the streamer panicked")?;
    emit(json!({
        "workload": "stream",
        "stream_mib": stream_mib,
        "stream_seconds": stream_seconds,
        "fsyncs": latency.len(),
        "fsyncs_during_stream": during,
        "p50_us": latency.value_at_quantile(0.50),
        "p99_us": latency.value_at_quantile(0.99),
        "p999_us": latency.value_at_quantile(0.999),
        "max_us": latency.max(),
    }));
    Ok(())
}
