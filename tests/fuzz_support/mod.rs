//! Shared by the corrupt-image test (`tests/fuzz_corrupt.rs`) and the
//! `cargo fuzz` target (`fuzz/fuzz_targets/corrupt_image.rs`, which
//! includes this module by path): seed images, their structure maps,
//! mutations, and one run of the engine over a damaged image.
#![allow(dead_code)]

pub mod map;
pub mod mutate;
pub mod seeds;

pub use seeds::skip;

use jext4::Error;
use jext4::engine::dev::MemoryDevice;
use jext4::engine::fs::walk::{self, Budget, Stats};
use jext4::engine::fs::{AtimePolicy, Fs, MountOptions};
use std::sync::Arc;
use std::sync::mpsc;
use std::time::Duration;

/// What one run over an image did.
#[derive(Debug)]
pub struct Outcome {
    /// The mount's error, if it failed.
    pub mount_error: Option<Error>,
    pub stats: Stats,
    /// Whether the filesystem had turned read-only when the walk ended.
    pub read_only_after: bool,
    pub unmount_error: Option<Error>,
    /// CPU time the run took (its own thread only): unlike wall time it
    /// does not grow when the machine is busy, so it can flag loops that
    /// end but take far too long.
    pub cpu: Duration,
}

impl Outcome {
    pub fn saw_corruption(&self) -> bool {
        self.mount_error.as_ref().is_some_and(Error::is_corruption)
            || self.stats.corruption_errors > 0
    }
}

/// Mount options for runs: a small cache (eviction is exercised too), no
/// background flushing between the walk's steps.
pub fn mount_options() -> MountOptions {
    MountOptions {
        cache_size: 2 << 20,
        commit_interval: Duration::from_secs(3600),
        atime: AtimePolicy::Relatime,
        ..MountOptions::default()
    }
}

/// Mount `image`, walk and change it, unmount. In the calling thread.
pub fn run_image(image: Vec<u8>, budget: Budget) -> Outcome {
    let started = thread_cpu_time();
    let mut outcome = mount_walk_unmount(image, budget);
    outcome.cpu = thread_cpu_time().saturating_sub(started);
    outcome
}

fn thread_cpu_time() -> Duration {
    let mut spec = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime only writes the timespec it is given.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut spec) };
    Duration::new(spec.tv_sec as u64, spec.tv_nsec as u32)
}

fn mount_walk_unmount(image: Vec<u8>, budget: Budget) -> Outcome {
    let device = Arc::new(MemoryDevice::from_bytes(image));
    let fs = match Fs::mount(device, mount_options()) {
        Ok(fs) => fs,
        Err(error) => {
            return Outcome {
                mount_error: Some(error),
                stats: Stats::default(),
                read_only_after: true,
                unmount_error: None,
                cpu: Duration::ZERO,
            };
        }
    };
    let stats = walk::exercise(&fs, budget);
    let read_only_after = fs.is_read_only();
    let unmount_error = fs.unmount().err();
    Outcome {
        mount_error: None,
        stats,
        read_only_after,
        unmount_error,
        cpu: Duration::ZERO,
    }
}

/// How a watched run ended badly.
#[derive(Debug)]
pub enum Failure {
    Panic(String),
    Hang(Duration),
}

/// `run_image` in a thread of its own, given `timeout` to finish: a panic
/// comes back as `Failure::Panic`, a run that does not end as
/// `Failure::Hang` (its thread is left behind, still running).
pub fn run_watched(image: Vec<u8>, budget: Budget, timeout: Duration) -> Result<Outcome, Failure> {
    let (sender, receiver) = mpsc::channel();
    let worker = std::thread::Builder::new()
        .name("fuzz-run".into())
        .spawn(move || {
            let outcome = run_image(image, budget);
            let _ = sender.send(outcome);
        })
        .expect("spawning a run");
    match receiver.recv_timeout(timeout) {
        Ok(outcome) => {
            let _ = worker.join();
            Ok(outcome)
        }
        Err(mpsc::RecvTimeoutError::Disconnected) => {
            let panic = worker.join().err();
            let message = panic
                .as_ref()
                .and_then(|payload| {
                    payload
                        .downcast_ref::<String>()
                        .cloned()
                        .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
                })
                .unwrap_or_else(|| "panic without a message".into());
            Err(Failure::Panic(message))
        }
        Err(mpsc::RecvTimeoutError::Timeout) => Err(Failure::Hang(timeout)),
    }
}
