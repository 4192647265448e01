//! Message journal: the LMAX pattern. One writer appends fixed-size records,
//! each followed by fdatasync, and a message counts as journalled only when
//! fdatasync returns; the latency of one append is write + fdatasync. The file
//! is prepared (outside the measured part) as one of:
//!   fresh     — empty, so every append extends the file and allocates;
//!   fallocate — preallocated with fallocate(2) (unwritten extents), as LMAX's
//!               journaller does at start-up;
//!   zerofill  — pre-filled with zeros and fsynced, so appends overwrite
//!               allocated, initialised blocks.
//! With `--reader`, a second thread tails the file: it reads every record
//! once the writer has published it (the position a ring buffer would hand
//! over), sleeping 20 µs when it has caught up.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::ValueEnum;
use hdrhistogram::Histogram;
use serde_json::json;

use crate::common::{at, emit, fsync_dir, pattern};

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum Layout {
    Fresh,
    Fallocate,
    Zerofill,
}

const ZERO_CHUNK: usize = 1 << 20;
/// Latencies are recorded in nanoseconds, up to a minute, to 3 significant digits.
const LATENCY_NS_MAX: u64 = 60_000_000_000;

/// Quantiles reported in the CDF: every percent, then the tail.
fn cdf_quantiles() -> Vec<f64> {
    let mut quantiles: Vec<f64> = (0..100).map(|p| p as f64 / 100.0).collect();
    quantiles.extend([0.995, 0.999, 0.9995, 0.9999, 0.99995, 0.99999, 1.0]);
    quantiles
}

fn prepare(path: &Path, layout: Layout, len: u64) -> io::Result<File> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(path)
        .map_err(at(path))?;
    match layout {
        Layout::Fresh => {}
        Layout::Fallocate => {
            let len = libc::off_t::try_from(len).expect("journal length fits off_t");
            // SAFETY: fd is an open descriptor owned by `file` for the whole call.
            let rc = unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, len) };
            if rc != 0 {
                return Err(io::Error::last_os_error());
            }
        }
        Layout::Zerofill => {
            let zeros = vec![0u8; ZERO_CHUNK];
            let mut offset = 0;
            while offset < len {
                let n = (len - offset).min(ZERO_CHUNK as u64) as usize;
                file.write_all_at(&zeros[..n], offset).map_err(at(path))?;
                offset += n as u64;
            }
        }
    }
    file.sync_all().map_err(at(path))?;
    fsync_dir(path.parent().expect("journal has a directory"))?;
    Ok(file)
}

/// Reads every published byte once; returns the bytes read.
fn tail(path: PathBuf, published: Arc<AtomicU64>, done: Arc<AtomicBool>) -> io::Result<u64> {
    let file = File::open(&path).map_err(at(&path))?;
    let mut buffer = vec![0u8; 64 * 1024];
    let mut offset = 0u64;
    loop {
        let finished = done.load(Ordering::Acquire);
        let end = published.load(Ordering::Acquire);
        if offset >= end {
            if finished {
                return Ok(offset);
            }
            std::thread::sleep(Duration::from_micros(20));
            continue;
        }
        let want = (end - offset).min(buffer.len() as u64) as usize;
        let n = file
            .read_at(&mut buffer[..want], offset)
            .map_err(at(&path))?;
        if n == 0 {
            let detail = format!("published byte {offset} not readable");
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, detail));
        }
        offset += n as u64;
    }
}

pub struct Options {
    pub dir: PathBuf,
    pub record_bytes: usize,
    pub layout: Layout,
    pub reader: bool,
    pub count: u64,
    pub seconds: f64,
}

pub fn run(options: Options) -> io::Result<()> {
    let Options {
        dir,
        record_bytes,
        layout,
        reader,
        count,
        seconds,
    } = options;
    assert!(record_bytes > 0 && count > 0, "something to append");
    let name = format!(
        "journal-{layout:?}-{record_bytes}-{}",
        if reader { "r" } else { "w" }
    );
    let path = dir.join(name.to_lowercase());
    let file = match prepare(&path, layout, count * record_bytes as u64) {
        Ok(file) => file,
        // ext2 (and ext4 images without extents) cannot preallocate: a
        // property of the filesystem, reported as such rather than as a failure.
        Err(error) if error.raw_os_error() == Some(libc::EOPNOTSUPP) => {
            emit(json!({
                "workload": "msgjournal",
                "unsupported": format!("fallocate(2): {error}"),
            }));
            return Ok(());
        }
        Err(error) => return Err(at(&path)(error)),
    };

    let published = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let tailer = reader.then(|| {
        let (path, published, done) = (path.clone(), published.clone(), done.clone());
        std::thread::spawn(move || tail(path, published, done))
    });

    let mut histogram =
        Histogram::<u64>::new_with_bounds(1, LATENCY_NS_MAX, 3).expect("histogram bounds");
    let record = pattern(record_bytes, 13);
    let deadline = Instant::now() + Duration::from_secs_f64(seconds);
    let began = Instant::now();
    let mut appended = 0u64;
    while appended < count && Instant::now() < deadline {
        let offset = appended * record_bytes as u64;
        let start = Instant::now();
        file.write_all_at(&record, offset).map_err(at(&path))?;
        file.sync_data().map_err(at(&path))?;
        let latency_ns = start.elapsed().as_nanos() as u64;
        histogram.saturating_record(latency_ns.max(1));
        appended += 1;
        published.store(offset + record_bytes as u64, Ordering::Release);
    }
    let elapsed = began.elapsed().as_secs_f64();
    done.store(true, Ordering::Release);
    let reader_bytes = match tailer {
        Some(handle) => Some(handle.join().expect("reader thread panicked")?),
        None => None,
    };
    let us = |ns: u64| ns as f64 / 1000.0;
    let cdf: Vec<(f64, f64)> = cdf_quantiles()
        .into_iter()
        .map(|q| (q, us(histogram.value_at_quantile(q))))
        .collect();
    emit(json!({
        "workload": "msgjournal",
        "layout": format!("{layout:?}").to_lowercase(),
        "record_bytes": record_bytes,
        "reader": reader,
        "appends": appended,
        "seconds": elapsed,
        "appends_per_sec": appended as f64 / elapsed.max(1e-9),
        "reader_bytes": reader_bytes,
        "p50_us": us(histogram.value_at_quantile(0.50)),
        "p99_us": us(histogram.value_at_quantile(0.99)),
        "p99_9_us": us(histogram.value_at_quantile(0.999)),
        "p99_99_us": us(histogram.value_at_quantile(0.9999)),
        "max_us": us(histogram.max()),
        "mean_us": histogram.mean() / 1000.0,
        "cdf": cdf,
    }));
    Ok(())
}
