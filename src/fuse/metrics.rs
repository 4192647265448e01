//! What the FUSE front end is asked and how long it takes: per-operation
//! request counts, errors and latency histograms, requests in flight, and
//! the split of each request's time between the engine (`fs::Fs`) and the
//! transport (decoding the request, encoding and sending the reply). Shown
//! by `jext4 stats`; `bench/run` divides the counts by the files a workload
//! made to get the requests per file.
//!
//! The time a request spends in the kernel and queued before a server
//! thread picks it up is not visible from here: "transport" is the
//! server's own share of it.
//!
//! A request is counted when a server thread takes it up, and its error
//! as soon as the handler knows of it: both before its reply leaves, so a
//! report asked for after a reply was seen counts that request (a client
//! comparing two reports sees exactly the requests its work made). Its
//! times are added after the reply, when its clock stops.
//!
//! Locks: each operation's histogram has its own mutex (a leaf, held for
//! one record or one read); the counters are atomics.

use hdrhistogram::Histogram;
use parking_lot::Mutex;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// The FUSE operations, named as in `linux/fuse.h` (RENAME2 counts as
/// rename, BATCH_FORGET as forget: one entry per handler). `Other` is every
/// opcode the server answers with ENOSYS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    Lookup,
    Forget,
    Getattr,
    Setattr,
    Readlink,
    Symlink,
    Mknod,
    Mkdir,
    Unlink,
    Rmdir,
    Rename,
    Link,
    Open,
    Read,
    Write,
    Statfs,
    Release,
    Fsync,
    Setxattr,
    Getxattr,
    Listxattr,
    Removexattr,
    Flush,
    Opendir,
    Readdir,
    Releasedir,
    Fsyncdir,
    Access,
    Create,
    Ioctl,
    Fallocate,
    Readdirplus,
    Lseek,
    Destroy,
    Other,
}

impl Operation {
    pub const ALL: [Operation; 35] = [
        Operation::Lookup,
        Operation::Forget,
        Operation::Getattr,
        Operation::Setattr,
        Operation::Readlink,
        Operation::Symlink,
        Operation::Mknod,
        Operation::Mkdir,
        Operation::Unlink,
        Operation::Rmdir,
        Operation::Rename,
        Operation::Link,
        Operation::Open,
        Operation::Read,
        Operation::Write,
        Operation::Statfs,
        Operation::Release,
        Operation::Fsync,
        Operation::Setxattr,
        Operation::Getxattr,
        Operation::Listxattr,
        Operation::Removexattr,
        Operation::Flush,
        Operation::Opendir,
        Operation::Readdir,
        Operation::Releasedir,
        Operation::Fsyncdir,
        Operation::Access,
        Operation::Create,
        Operation::Ioctl,
        Operation::Fallocate,
        Operation::Readdirplus,
        Operation::Lseek,
        Operation::Destroy,
        Operation::Other,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Operation::Lookup => "lookup",
            Operation::Forget => "forget",
            Operation::Getattr => "getattr",
            Operation::Setattr => "setattr",
            Operation::Readlink => "readlink",
            Operation::Symlink => "symlink",
            Operation::Mknod => "mknod",
            Operation::Mkdir => "mkdir",
            Operation::Unlink => "unlink",
            Operation::Rmdir => "rmdir",
            Operation::Rename => "rename",
            Operation::Link => "link",
            Operation::Open => "open",
            Operation::Read => "read",
            Operation::Write => "write",
            Operation::Statfs => "statfs",
            Operation::Release => "release",
            Operation::Fsync => "fsync",
            Operation::Setxattr => "setxattr",
            Operation::Getxattr => "getxattr",
            Operation::Listxattr => "listxattr",
            Operation::Removexattr => "removexattr",
            Operation::Flush => "flush",
            Operation::Opendir => "opendir",
            Operation::Readdir => "readdir",
            Operation::Releasedir => "releasedir",
            Operation::Fsyncdir => "fsyncdir",
            Operation::Access => "access",
            Operation::Create => "create",
            Operation::Ioctl => "ioctl",
            Operation::Fallocate => "fallocate",
            Operation::Readdirplus => "readdirplus",
            Operation::Lseek => "lseek",
            Operation::Destroy => "destroy",
            Operation::Other => "other",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// Latencies are recorded in microseconds, up to ten minutes, with two
/// significant digits (1 % resolution is plenty for a profile and keeps
/// each histogram a few KiB).
const LATENCY_US_MAX: u64 = 600_000_000;
const LATENCY_DIGITS: u8 = 2;

struct OperationMetrics {
    /// Requests taken up.
    count: AtomicU64,
    errors: AtomicU64,
    /// Requests whose clock stopped (after their reply): what the times
    /// below add up.
    timed: AtomicU64,
    engine_ns: AtomicU64,
    transport_ns: AtomicU64,
    /// Engine latency per request, µs.
    engine_us: Mutex<Histogram<u64>>,
}

impl OperationMetrics {
    fn new() -> Self {
        OperationMetrics {
            count: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            timed: AtomicU64::new(0),
            engine_ns: AtomicU64::new(0),
            transport_ns: AtomicU64::new(0),
            engine_us: Mutex::new(
                Histogram::new_with_bounds(1, LATENCY_US_MAX, LATENCY_DIGITS)
                    .expect("constant histogram bounds"),
            ),
        }
    }
}

/// A transport's polling (`pace.rs`), as `jext4 stats` lines.
fn pace_lines(prefix: &str, pace: super::pace::PaceFigures) -> [String; 5] {
    [
        format!("{prefix}_spin_us {}", pace.window_us),
        format!("{prefix}_polls {}", pace.polls),
        format!("{prefix}_polls_answered {}", pace.polls_answered),
        format!("{prefix}_poll_cpu_us {}", pace.polled_us),
        format!("{prefix}_poll_pauses {}", pace.pauses),
    ]
}

/// Which transport carries the requests, set once the mount is up.
#[derive(Debug, Clone)]
pub struct TransportFigures {
    /// "dev" or "uring".
    pub name: &'static str,
    pub ring: Option<RingFigures>,
    /// Which `/dev/fuse` worker reads (`turns.rs`); not over io_uring.
    pub turns: Option<Arc<super::turns::ReadTurns>>,
}

/// The io_uring transport's shape, its buffers and the requests it
/// carried (FORGET and INTERRUPT still come through /dev/fuse).
#[derive(Debug, Clone)]
pub struct RingFigures {
    pub queues: usize,
    pub threads_per_queue: usize,
    pub entries_per_thread: usize,
    pub buffer_bytes: u64,
    pub requests: Arc<AtomicU64>,
    /// The queue threads' polling (`-o uring_spin`).
    pub pace: Arc<super::pace::Pace>,
}

/// The counters of one mount's FUSE front end, shared by every transport
/// thread.
pub struct RequestMetrics {
    operations: Vec<OperationMetrics>,
    in_flight: AtomicI64,
    in_flight_max: AtomicI64,
    since: Instant,
    transport: OnceLock<TransportFigures>,
}

impl Default for RequestMetrics {
    fn default() -> Self {
        RequestMetrics {
            operations: Operation::ALL
                .iter()
                .map(|_| OperationMetrics::new())
                .collect(),
            in_flight: AtomicI64::new(0),
            in_flight_max: AtomicI64::new(0),
            since: Instant::now(),
            transport: OnceLock::new(),
        }
    }
}

impl RequestMetrics {
    /// Say which transport is live (once, when the mount is up).
    pub fn set_transport(&self, figures: TransportFigures) {
        let _ = self.transport.set(figures);
    }

    fn transport_lines(&self) -> Vec<String> {
        let Some(transport) = self.transport.get() else {
            return Vec::new();
        };
        let mut lines = vec![format!("fuse_transport {}", transport.name)];
        if let Some(turns) = &transport.turns {
            let turns = turns.figures();
            lines.extend([
                format!("fuse_dev_one_reader {}", u8::from(turns.enabled)),
                format!("fuse_dev_worker_switches {}", turns.switches),
                format!("fuse_dev_parks {}", turns.parks),
                format!("fuse_dev_parks_timed_out {}", turns.parks_timed_out),
                format!("fuse_dev_wakes_for_backlog {}", turns.wakes_for_backlog),
                format!("fuse_dev_wakes_for_blocking {}", turns.wakes_for_blocking),
            ]);
            lines.extend(pace_lines("fuse_dev", turns.pace));
        }
        if let Some(ring) = &transport.ring {
            lines.extend([
                format!("fuse_uring_queues {}", ring.queues),
                format!("fuse_uring_threads_per_queue {}", ring.threads_per_queue),
                format!("fuse_uring_entries_per_thread {}", ring.entries_per_thread),
                format!("fuse_uring_buffer_bytes {}", ring.buffer_bytes),
                format!(
                    "fuse_uring_requests {}",
                    ring.requests.load(Ordering::Acquire)
                ),
            ]);
            lines.extend(pace_lines("fuse_uring", ring.pace.figures()));
        }
        lines
    }

    /// Requests being served now (begun, not answered).
    pub fn in_flight(&self) -> i64 {
        self.in_flight.load(Ordering::Acquire)
    }

    /// A request of `operation` arrived (now, or at `arrived` when the
    /// transport saw it earlier than it could start the clock): counted
    /// now, before its reply can leave (not when its clock stops, after the
    /// reply: a client that saw the reply could ask for a report first).
    pub fn begin(&self, operation: Operation, arrived: Instant) -> RequestClock<'_> {
        self.operations[operation.index()]
            .count
            .fetch_add(1, Ordering::AcqRel);
        let in_flight = self.in_flight.fetch_add(1, Ordering::AcqRel) + 1;
        self.in_flight_max.fetch_max(in_flight, Ordering::AcqRel);
        RequestClock {
            metrics: self,
            operation,
            arrived,
            engine: Duration::ZERO,
            failed: false,
        }
    }

    pub fn requests(&self, operation: Operation) -> u64 {
        self.operations[operation.index()]
            .count
            .load(Ordering::Acquire)
    }

    fn finish(&self, clock: &RequestClock<'_>, done: Instant) {
        let entry = &self.operations[clock.operation.index()];
        let engine = clock.engine;
        let total = done.saturating_duration_since(clock.arrived);
        let transport = total.saturating_sub(engine);
        entry.timed.fetch_add(1, Ordering::AcqRel);
        entry
            .engine_ns
            .fetch_add(engine.as_nanos() as u64, Ordering::AcqRel);
        entry
            .transport_ns
            .fetch_add(transport.as_nanos() as u64, Ordering::AcqRel);
        let micros = (engine.as_micros() as u64).clamp(1, LATENCY_US_MAX);
        entry.engine_us.lock().saturating_record(micros);
        let in_flight = self.in_flight.fetch_sub(1, Ordering::AcqRel) - 1;
        debug_assert!(in_flight >= 0, "more requests ended than began");
    }

    /// `name value` lines for the statistics report: totals first, then
    /// one group per operation that was asked at least once.
    pub fn report_lines(&self) -> Vec<String> {
        let mut total = 0;
        let mut engine_ns = 0;
        let mut transport_ns = 0;
        let mut per_operation = Vec::new();
        for operation in Operation::ALL {
            let entry = &self.operations[operation.index()];
            let count = entry.count.load(Ordering::Acquire);
            if count == 0 {
                continue;
            }
            let timed = entry.timed.load(Ordering::Acquire);
            let engine = entry.engine_ns.load(Ordering::Acquire);
            let transport = entry.transport_ns.load(Ordering::Acquire);
            total += count;
            engine_ns += engine;
            transport_ns += transport;
            let histogram = entry.engine_us.lock();
            let name = operation.name();
            per_operation.extend([
                format!("fuse_op_{name} {count}"),
                format!(
                    "fuse_op_{name}_errors {}",
                    entry.errors.load(Ordering::Acquire)
                ),
                format!(
                    "fuse_op_{name}_engine_us_p50 {}",
                    histogram.value_at_quantile(0.5)
                ),
                format!(
                    "fuse_op_{name}_engine_us_p99 {}",
                    histogram.value_at_quantile(0.99)
                ),
                format!("fuse_op_{name}_engine_us_max {}", histogram.max()),
                format!(
                    "fuse_op_{name}_transport_us_mean {}",
                    transport / timed.max(1) / 1000
                ),
            ]);
        }
        let mut lines = self.transport_lines();
        lines.extend([
            format!("fuse_requests {total}"),
            format!(
                "fuse_requests_in_flight {}",
                self.in_flight.load(Ordering::Acquire).max(0)
            ),
            format!(
                "fuse_requests_in_flight_max {}",
                self.in_flight_max.load(Ordering::Acquire)
            ),
            format!("fuse_engine_ms {}", engine_ns / 1_000_000),
            format!("fuse_transport_ms {}", transport_ns / 1_000_000),
            format!("fuse_engine_us {}", engine_ns / 1_000),
            format!("fuse_transport_us {}", transport_ns / 1_000),
            format!("fuse_threads_cpu_us {}", serving_threads_cpu_ns() / 1_000),
            format!("fuse_uptime_ms {}", self.since.elapsed().as_millis()),
        ]);
        lines.extend(per_operation);
        lines
    }
}

/// The CPU time of the threads that serve FUSE requests (fuser's
/// `/dev/fuse` workers and the threads their fsyncs wait on, the io_uring
/// queue threads): engine and transport
/// together, whatever the machine's load, so two transports compare by it
/// (`/proc/self/task/*/schedstat`: nanoseconds on a CPU).
fn serving_threads_cpu_ns() -> u64 {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    tasks
        .flatten()
        .filter(|task| {
            std::fs::read_to_string(task.path().join("comm")).is_ok_and(|name| {
                name.starts_with("fuser-")
                    || name.starts_with("jext4-uring")
                    || name.starts_with(super::sync_pool::THREAD_NAME)
            })
        })
        .filter_map(|task| {
            let schedstat = std::fs::read_to_string(task.path().join("schedstat")).ok()?;
            schedstat.split_whitespace().next()?.parse::<u64>().ok()
        })
        .sum()
}

/// One request's timing, recorded when dropped (the reply has gone out);
/// its count and error are recorded earlier (`begin`, `fail`).
pub struct RequestClock<'m> {
    metrics: &'m RequestMetrics,
    operation: Operation,
    arrived: Instant,
    /// The sum of the request's engine calls (readdirplus makes several).
    engine: Duration,
    failed: bool,
}

impl RequestClock<'_> {
    /// Time `engine` as part of the request's engine share; an error counts
    /// the request as failed.
    pub fn engine<T, E>(&mut self, engine: impl FnOnce() -> Result<T, E>) -> Result<T, E> {
        let result = self.timed(engine);
        if result.is_err() {
            self.fail();
        }
        result
    }

    /// Time an engine call that cannot fail (forget, statfs).
    pub fn timed<T>(&mut self, engine: impl FnOnce() -> T) -> T {
        let began = Instant::now();
        let result = engine();
        self.engine += began.elapsed();
        result
    }

    /// The request is answered with an error the engine did not return
    /// (a bad flag, a name the adapter refuses). Counted now, before the
    /// reply leaves, once per request.
    pub fn fail(&mut self) {
        if !self.failed {
            self.failed = true;
            self.metrics.operations[self.operation.index()]
                .errors
                .fetch_add(1, Ordering::AcqRel);
        }
    }
}

impl Drop for RequestClock<'_> {
    fn drop(&mut self) {
        self.metrics.finish(self, Instant::now());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_split_and_in_flight() {
        let metrics = RequestMetrics::default();
        {
            let mut first = metrics.begin(Operation::Lookup, Instant::now());
            let second = metrics.begin(Operation::Write, Instant::now());
            let answer: Result<u32, i32> = first.engine(|| {
                std::thread::sleep(Duration::from_millis(2));
                Err(libc::ENOENT)
            });
            assert_eq!(answer, Err(libc::ENOENT));
            assert_eq!(metrics.in_flight.load(Ordering::Acquire), 2);
            drop(second);
        }
        assert_eq!(metrics.in_flight.load(Ordering::Acquire), 0);
        assert_eq!(metrics.in_flight_max.load(Ordering::Acquire), 2);
        assert_eq!(metrics.requests(Operation::Lookup), 1);
        assert_eq!(metrics.requests(Operation::Write), 1);
        assert_eq!(metrics.requests(Operation::Read), 0);
        let lines = metrics.report_lines();
        let value = |name: &str| -> u64 {
            lines
                .iter()
                .find_map(|line| line.strip_prefix(&format!("{name} ")))
                .unwrap_or_else(|| panic!("no {name} in {lines:?}"))
                .parse()
                .unwrap()
        };
        assert_eq!(value("fuse_requests"), 2);
        assert_eq!(value("fuse_op_lookup_errors"), 1);
        assert_eq!(value("fuse_op_write_errors"), 0);
        assert!(value("fuse_op_lookup_engine_us_p50") >= 2000);
        // A write that never reached the engine spent its time in transport.
        assert_eq!(value("fuse_op_write_engine_us_max"), 1);
        assert!(!lines.iter().any(|line| line.starts_with("fuse_op_read ")));
    }

    /// A handler answers before its clock stops: a report asked for by a
    /// client that saw the answer (on another server thread) runs while
    /// the clock is still live, and must count the request and its error.
    #[test]
    fn a_request_and_its_error_count_before_its_clock_stops() {
        let metrics = RequestMetrics::default();
        let value = |name: &str| -> Option<u64> {
            metrics
                .report_lines()
                .iter()
                .find_map(|line| line.strip_prefix(&format!("{name} "))?.parse().ok())
        };
        let mut listing = metrics.begin(Operation::Readdirplus, Instant::now());
        let mut lookup = metrics.begin(Operation::Lookup, Instant::now());
        let _: Result<(), i32> = lookup.engine(|| Err(libc::ENOENT));
        lookup.fail(); // a second failure of one request counts once
        // The replies are out; the clocks have not stopped yet.
        assert_eq!(value("fuse_op_readdirplus"), Some(1));
        assert_eq!(value("fuse_op_readdirplus_errors"), Some(0));
        assert_eq!(value("fuse_op_lookup"), Some(1));
        assert_eq!(value("fuse_op_lookup_errors"), Some(1));
        assert_eq!(value("fuse_requests"), Some(2));
        assert_eq!(value("fuse_requests_in_flight"), Some(2));
        // Nothing timed yet: no mean to divide by zero.
        assert_eq!(value("fuse_op_lookup_transport_us_mean"), Some(0));
        let _: Result<(), i32> = listing.engine(|| Ok(()));
        drop((listing, lookup));
        // Stopping the clocks adds times, not requests.
        assert_eq!(value("fuse_op_readdirplus"), Some(1));
        assert_eq!(value("fuse_op_lookup"), Some(1));
        assert_eq!(value("fuse_op_lookup_errors"), Some(1));
        assert_eq!(value("fuse_requests"), Some(2));
        assert_eq!(value("fuse_requests_in_flight"), Some(0));
    }

    #[test]
    fn a_report_with_every_operation_fits_the_stats_ioctl() {
        let metrics = RequestMetrics::default();
        metrics.set_transport(TransportFigures {
            name: "uring",
            ring: Some(RingFigures {
                queues: 64,
                threads_per_queue: 16,
                entries_per_thread: 64,
                buffer_bytes: u64::MAX,
                requests: Arc::new(AtomicU64::new(u64::MAX)),
                pace: Arc::new(crate::fuse::pace::Pace::new(64, Duration::from_millis(10))),
            }),
            turns: None,
        });
        for operation in Operation::ALL {
            let mut clock = metrics.begin(operation, Instant::now());
            let _: Result<(), ()> = clock.engine(|| Ok(()));
        }
        let report = metrics.report_lines().join("\n");
        assert!(report.contains("fuse_transport uring\n"), "{report}");
        // The engine's own lines take about 1.5 KiB of the ioctl's buffer.
        assert!(
            report.len() + 2048 <= super::super::control::STATS_SIZE,
            "{} bytes",
            report.len()
        );
    }
}
