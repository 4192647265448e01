//! What every workload shares: a tiny deterministic random generator, the
//! "N threads for D seconds" loop, directory fsync, and the one-line JSON result.

use std::fs::File;
use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

/// xorshift64*: enough randomness to pick files and sizes, and the same
/// sequence on every filesystem for a given seed, so all peers see one workload.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        // Zero is the one state xorshift never leaves; mix the seed away from it.
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in `0..bound` (bound > 0).
    pub fn below(&mut self, bound: u64) -> u64 {
        debug_assert!(bound > 0);
        self.next_u64() % bound
    }
}

/// A buffer of `len` bytes of a non-zero pattern, so that written data never
/// looks like a hole or a zero-filled preallocation.
pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) | 1)
        .collect()
}

/// fsync a directory: how applications make a create, rename or unlink durable.
pub fn fsync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Result of a timed multi-threaded loop.
pub struct Throughput {
    pub operations: u64,
    pub seconds: f64,
}

impl Throughput {
    pub fn per_second(&self) -> f64 {
        if self.seconds > 0.0 {
            self.operations as f64 / self.seconds
        } else {
            0.0
        }
    }
}

/// Runs `body(thread_index, stop)` on `threads` threads started together, lets
/// them run for `seconds`, then raises `stop` and sums the operation counts they
/// return. The first error of any thread is the result.
pub fn run_threads<F>(threads: usize, seconds: f64, body: F) -> io::Result<Throughput>
where
    F: Fn(usize, &AtomicBool) -> io::Result<u64> + Send + Sync + 'static,
{
    assert!(threads > 0, "at least one thread");
    let body = Arc::new(body);
    let stop = Arc::new(AtomicBool::new(false));
    let start = Arc::new(Barrier::new(threads + 1));
    let handles: Vec<_> = (0..threads)
        .map(|index| {
            let (body, stop, start) = (body.clone(), stop.clone(), start.clone());
            std::thread::spawn(move || {
                start.wait();
                body(index, &stop)
            })
        })
        .collect();
    start.wait();
    let began = Instant::now();
    std::thread::sleep(Duration::from_secs_f64(seconds));
    stop.store(true, Ordering::Relaxed);
    let mut operations = 0;
    let mut first_error = None;
    for handle in handles {
        match handle.join().expect("workload thread panicked") {
            Ok(count) => operations += count,
            Err(error) => first_error = first_error.or(Some(error)),
        }
    }
    // The clock stops when the last thread has finished its last operation,
    // so the operations counted all fall inside the measured time.
    let seconds = began.elapsed().as_secs_f64();
    match first_error {
        Some(error) => Err(error),
        None => Ok(Throughput {
            operations,
            seconds,
        }),
    }
}

/// Prints the one JSON line that bench/run reads.
pub fn emit(value: serde_json::Value) {
    println!("{value}");
}

/// Adds the path to an I/O error, so a failure line names the file.
pub fn at(path: &Path) -> impl FnOnce(io::Error) -> io::Error + '_ {
    move |error| io::Error::new(error.kind(), format!("{}: {error}", path.display()))
}

/// syncfs(2) of the filesystem that holds `dir`.
pub fn syncfs(dir: &Path) -> io::Result<()> {
    use std::os::unix::io::AsRawFd;
    let directory = File::open(dir).map_err(at(dir))?;
    // SAFETY: syncfs on an open descriptor of the filesystem under test.
    if unsafe { libc::syncfs(directory.as_raw_fd()) } != 0 {
        return Err(at(dir)(io::Error::last_os_error()));
    }
    Ok(())
}
