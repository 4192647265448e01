//! Threads that wait for commits on behalf of the `/dev/fuse` workers.
//!
//! An fsync sleeps until its commit is durable: hundreds of microseconds
//! to milliseconds, during which the worker that took it would read no
//! other request. With `threads=N` workers, N concurrent fsyncs would stop
//! the whole mount — every lookup, create and write queued behind them —
//! and cap the fsyncs that can share one commit (group commit, fast or
//! full) at N. So a worker hands fsync and fsyncdir to this pool and goes
//! back to `/dev/fuse` at once; the answer is written from the pool thread
//! when the commit returns (a FUSE answer may come from any thread, in any
//! order).
//!
//! Threads start on demand, up to `MAX_THREADS`, and end after
//! `IDLE_EXIT` without work. When every one is busy the worker runs the
//! job itself, as before the pool: memory stays bounded and nothing waits
//! in an unbounded queue. So does a worker that finds the mount nearly
//! idle (fewer other requests in service than half the workers): a hand-
//! over costs a thread wake-up, tens of microseconds of CPU on a virtual
//! machine, for nothing when the other workers are free anyway (one of
//! them, parked, is woken to read meanwhile: `turns.rs`). The io_uring
//! transport does not use the pool: an
//! answer there is tied to the ring entry that carried the request, and
//! its queues already hold `uring_threads` threads each.

use parking_lot::{Condvar, Mutex};
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

/// The most fsyncs waiting for commits at once beyond the workers (each
/// holds a thread and its stack while it waits).
pub const MAX_THREADS: usize = 64;

/// A thread with no work for this long ends (a burst of fsyncs leaves no
/// crowd of sleeping threads behind).
const IDLE_EXIT: Duration = Duration::from_secs(10);

/// Name of the pool's threads (`/proc/self/task/*/comm`: the statistics
/// count their CPU time as serving time).
pub const THREAD_NAME: &str = "jext4-sync";

type Job = Box<dyn FnOnce() + Send>;

pub struct SyncPool {
    shared: Arc<Shared>,
    /// Jobs run on the caller while fewer other requests than this are
    /// in service (half the workers; 0 with one worker: always handed over).
    inline_below: i64,
}

struct Shared {
    /// A leaf lock: nothing is taken under it, jobs run outside it.
    state: Mutex<State>,
    work: Condvar,
    /// Signalled when a thread ends.
    ended: Condvar,
}

#[derive(Default)]
struct State {
    jobs: VecDeque<Job>,
    /// Threads alive, and those waiting for a job.
    threads: usize,
    idle: usize,
    stopping: bool,
}

impl SyncPool {
    /// A pool for `workers` `/dev/fuse` workers.
    pub fn new(workers: usize) -> SyncPool {
        SyncPool {
            shared: Arc::new(Shared {
                state: Mutex::new(State::default()),
                work: Condvar::new(),
                ended: Condvar::new(),
            }),
            inline_below: (workers / 2) as i64,
        }
    }

    /// Run `job` on a pool thread, or on the caller's when the mount is
    /// nearly idle (`busy`: the other requests in service) or every thread
    /// is busy (or the pool stops, or no thread can be started).
    pub fn run(&self, busy: i64, job: impl FnOnce() + Send + 'static) {
        if busy < self.inline_below {
            return run_here(job);
        }
        let mut state = self.shared.state.lock();
        if state.stopping {
            drop(state);
            return job();
        }
        if state.idle > state.jobs.len() {
            state.jobs.push_back(Box::new(job));
            self.shared.work.notify_one();
            return;
        }
        if state.threads < MAX_THREADS && self.spawn() {
            state.threads += 1;
            state.jobs.push_back(Box::new(job));
            return;
        }
        drop(state);
        run_here(job);
    }

    /// Start one thread (it takes a job once the caller's lock is gone).
    fn spawn(&self) -> bool {
        let shared = Arc::clone(&self.shared);
        let spawned = std::thread::Builder::new()
            .name(THREAD_NAME.into())
            .spawn(move || shared.serve());
        if let Err(error) = &spawned {
            tracing::warn!("no thread for an fsync, the worker waits itself: {error}");
        }
        spawned.is_ok()
    }

    /// Run what was handed over, then wait until every thread has ended
    /// (before the engine unmounts: no commit may still be waited for).
    pub fn stop(&self) {
        let mut state = self.shared.state.lock();
        state.stopping = true;
        self.shared.work.notify_all();
        while state.threads > 0 {
            self.shared.ended.wait(&mut state);
        }
    }
}

/// Run `job` on the calling worker, which then waits for the commit
/// itself: another worker reads meanwhile (`turns.rs`).
fn run_here(job: impl FnOnce()) {
    crate::lock::before_blocking();
    job();
}

impl Shared {
    fn serve(&self) {
        let mut state = self.state.lock();
        loop {
            if let Some(job) = state.jobs.pop_front() {
                drop(state);
                // The adapter's handlers catch their own panics (and abort
                // the journal); this keeps the count right if one escapes.
                let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
                state = self.state.lock();
                continue;
            }
            if state.stopping {
                break;
            }
            state.idle += 1;
            let timed_out = self.work.wait_for(&mut state, IDLE_EXIT).timed_out();
            state.idle -= 1;
            if timed_out && state.jobs.is_empty() {
                break;
            }
        }
        state.threads -= 1;
        self.ended.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::{MAX_THREADS, SyncPool};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Barrier};

    #[test]
    fn jobs_run_on_other_threads_until_every_thread_is_busy() {
        let pool = SyncPool::new(4);
        let caller = std::thread::current().id();
        let on_caller = Arc::new(AtomicUsize::new(0));
        // MAX_THREADS jobs that hold their thread until all have started:
        // each must have run elsewhere, or the barrier would never open.
        let barrier = Arc::new(Barrier::new(MAX_THREADS + 1));
        for _ in 0..MAX_THREADS {
            let barrier = Arc::clone(&barrier);
            pool.run(2, move || {
                barrier.wait();
            });
        }
        // Every thread is busy: the next job runs on the caller.
        let counter = Arc::clone(&on_caller);
        pool.run(2, move || {
            if std::thread::current().id() == caller {
                counter.fetch_add(1, Ordering::SeqCst);
            }
        });
        assert_eq!(on_caller.load(Ordering::SeqCst), 1);
        // So does one that finds fewer than two others in service.
        let counter = Arc::clone(&on_caller);
        pool.run(1, move || {
            if std::thread::current().id() == caller {
                counter.fetch_add(1, Ordering::SeqCst);
            }
        });
        assert_eq!(on_caller.load(Ordering::SeqCst), 2);
        barrier.wait();
        pool.stop();
    }

    #[test]
    fn stop_runs_what_was_handed_over_and_waits_for_it() {
        let pool = SyncPool::new(1);
        let done = Arc::new(AtomicUsize::new(0));
        for _ in 0..200 {
            let done = Arc::clone(&done);
            pool.run(0, move || {
                std::thread::sleep(std::time::Duration::from_millis(1));
                done.fetch_add(1, Ordering::SeqCst);
            });
        }
        pool.stop();
        assert_eq!(done.load(Ordering::SeqCst), 200);
        // After stop, jobs run on the caller.
        let counter = Arc::clone(&done);
        pool.run(0, move || {
            counter.fetch_add(1, Ordering::SeqCst);
        });
        assert_eq!(done.load(Ordering::SeqCst), 201);
    }
}
