//! When the thread that answered a FUSE request polls for the next one
//! instead of sleeping (`-o uring_spin=µs` over io_uring, `-o
//! dev_spin=µs` over `/dev/fuse`), and what the polling cost.
//!
//! A FUSE request is a synchronous round trip: its caller sleeps until the
//! answer wakes it. Over io_uring the kernel hands a request to the queue
//! of the CPU its caller runs on (`fs/fuse/dev_uring.c`), and that queue's
//! threads are bound to that CPU, so caller and server take turns on one
//! CPU. But when the answer wakes the caller while another CPU is idle,
//! the scheduler moves it there (`select_idle_sibling`): on a virtual
//! machine that wakes a halted vCPU with an interprocessor interrupt, and
//! the caller's next request then goes to that CPU's queue, whose sleeping
//! thread must be woken as well. Measured on the 2-vCPU test machine,
//! untar of drivers/net with nothing else running: 2.4–2.6 s and ~60,000
//! migrations of tar (one per request or so), against 1.0 s and none with
//! tar pinned to one CPU.
//!
//! So while requests keep coming, one thread per queue polls its ring
//! instead of sleeping, and yields its CPU at every turn to whatever else
//! is runnable there. A CPU whose poller runs is not idle, so the caller
//! stays where it is; a request finds its thread awake. Polling stops
//! once no queue has seen a request for the window (`uring_spin` µs), so
//! a burst of requests costs at most one window of polling per CPU after
//! it, and an idle mount costs nothing.
//!
//! Over `/dev/fuse` there is one queue, and the worker whose turn it is to
//! read (`turns.rs`) polls the descriptor (`poll(2)`, no wait) before it
//! goes back to `read(2)`: the caller's next request then finds it awake,
//! with no wake-up to send across CPUs; the answer's wake-up of the caller
//! still crosses. Measured: untar of drivers/net a median 1.48 s against
//! 1.57 s sleeping (4 interleaved rounds, ranges overlapping); see
//! docs/performance.md, *Transports and polling*.
//!
//! A CPU that other work keeps busy needs no poller (the caller will not
//! move to it), and there a poller only hurts: it stays runnable, so a
//! request for it waits until the scheduler gets back to it, where a
//! sleeping thread would have been woken and run at once. A yield that
//! gives the CPU away for longer than `CONTENDED_YIELD` says so; the
//! queue then stops polling for `CONTENDED_PAUSE`.
//!
//! The poller of a queue is the thread that answered last: the kernel
//! makes the entry that came back last the first to get the next request
//! (`fuse_uring_ent_avail` puts it at the head of the available entries),
//! so that thread is the one the next request wakes. A thread that
//! answers takes the turn from whoever had it, which then sleeps.
//!
//! Locks: none; the state is atomics (whose turn it is per queue, the
//! time of the last request, the counters).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// A yield this long gave the CPU to other work than the caller of the
/// last answer (which sends its next request within a few µs).
const CONTENDED_YIELD: Duration = Duration::from_micros(100);
/// How long a queue whose CPU is contended sleeps between requests before
/// it tries polling again. Each try under lasting contention costs a
/// request a time slice of the other work (a few ms), so tries are rare;
/// a pause after a passing contention only costs what not polling costs.
/// (With 50 ms, 4,000 creates beside two CPU-bound processes on 2 CPUs
/// took 0.69-0.92 s against 0.56-0.65 s without polling.)
const CONTENDED_PAUSE: Duration = Duration::from_millis(500);

#[derive(Debug)]
pub struct Pace {
    epoch: Instant,
    /// How long after the last request the pollers go on (0: they never
    /// poll).
    window_ns: u64,
    /// When any queue last received a request, in ns since `epoch` (0:
    /// none yet).
    last_request_ns: AtomicU64,
    /// Per queue: which of its threads may poll (its index + 1; 0: none).
    turns: Box<[AtomicUsize]>,
    /// Per queue: no polling before this time (ns since `epoch`): its CPU
    /// was contended.
    paused_until_ns: Box<[AtomicU64]>,
    /// CPU time the pollers spent, in ns (their threads' CPU clocks).
    polled_ns: AtomicU64,
    /// Polls, and those that ended with a request rather than a quiet
    /// window.
    polls: AtomicU64,
    polls_answered: AtomicU64,
    /// Times a queue stopped polling for a contended CPU.
    pauses: AtomicU64,
}

/// What a poller's look at its transport found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Look {
    /// A request is there to take.
    Request,
    Nothing,
    /// The thread must stop polling (an error, the end of the session).
    Stop,
}

/// What `jext4 stats` shows of the polling.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PaceFigures {
    pub window_us: u64,
    pub polled_us: u64,
    pub polls: u64,
    pub polls_answered: u64,
    pub pauses: u64,
}

impl Pace {
    pub fn new(queues: usize, window: Duration) -> Pace {
        Pace {
            epoch: Instant::now(),
            window_ns: window.as_nanos().min(u64::MAX as u128) as u64,
            last_request_ns: AtomicU64::new(0),
            turns: (0..queues).map(|_| AtomicUsize::new(0)).collect(),
            paused_until_ns: (0..queues).map(|_| AtomicU64::new(0)).collect(),
            polled_ns: AtomicU64::new(0),
            polls: AtomicU64::new(0),
            polls_answered: AtomicU64::new(0),
            pauses: AtomicU64::new(0),
        }
    }

    fn now_ns(&self) -> u64 {
        self.epoch.elapsed().as_nanos().min(u64::MAX as u128) as u64
    }

    /// A queue received a request.
    pub fn note_request(&self) {
        if self.window_ns > 0 {
            // 0 stands for "never": a request at the epoch is at 1 ns.
            self.last_request_ns
                .fetch_max(self.now_ns().max(1), Ordering::Relaxed);
        }
    }

    /// Whether some queue received a request within the window.
    fn busy(&self) -> bool {
        let last = self.last_request_ns.load(Ordering::Relaxed);
        self.window_ns > 0 && last > 0 && self.now_ns().saturating_sub(last) < self.window_ns
    }

    /// Thread `thread` of queue `queue` answered last: the turn to poll is
    /// its now. False where polling is off or paused on that queue.
    fn take_turn(&self, queue: usize, thread: usize) -> bool {
        self.window_ns > 0
            && self.turns.get(queue).is_some_and(|turn| {
                let paused = self.paused_until_ns[queue].load(Ordering::Relaxed);
                if self.now_ns() < paused {
                    return false;
                }
                turn.store(thread + 1, Ordering::Release);
                true
            })
    }

    /// Queue `queue`'s CPU is contended: no polling there for a while.
    fn pause(&self, queue: usize) {
        let until = self.now_ns() + CONTENDED_PAUSE.as_nanos() as u64;
        self.paused_until_ns[queue].fetch_max(until, Ordering::Relaxed);
        self.pauses.fetch_add(1, Ordering::Relaxed);
    }

    /// Whether it is still `thread`'s turn to poll queue `queue` (no other
    /// thread of it answered since).
    fn has_turn(&self, queue: usize, thread: usize) -> bool {
        self.turns[queue].load(Ordering::Acquire) == thread + 1
    }

    /// The end of `thread`'s poll: what it cost and whether a request
    /// ended it. The turn stays with it if a request did, and otherwise
    /// goes to nobody unless another thread took it meanwhile.
    fn end_poll(&self, queue: usize, thread: usize, cpu_ns: u64, answered: bool) {
        if !answered {
            let _ = self.turns[queue].compare_exchange(
                thread + 1,
                0,
                Ordering::AcqRel,
                Ordering::Acquire,
            );
        }
        self.polled_ns.fetch_add(cpu_ns, Ordering::Relaxed);
        self.polls.fetch_add(1, Ordering::Relaxed);
        if answered {
            self.polls_answered.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Thread `thread` of queue `queue` answered: while requests keep
    /// coming, poll for the next one instead of sleeping, calling `look`
    /// between yields of the CPU, until it finds a request, no queue has
    /// had one for the window, another thread of the queue answered since,
    /// or the CPU turns out contended (then the queue pauses). Every yield
    /// lets the caller the answer woke, or anything else runnable here,
    /// run first; every turn without a request brings the window's end
    /// nearer. True when a request ended the poll.
    pub fn poll(&self, queue: usize, thread: usize, mut look: impl FnMut() -> Look) -> bool {
        if !self.busy() || !self.take_turn(queue, thread) {
            return false;
        }
        let mut cpu_before = None;
        let found = loop {
            match look() {
                Look::Request => break true,
                Look::Stop => break false,
                Look::Nothing => {}
            }
            if !self.busy() || !self.has_turn(queue, thread) {
                break false;
            }
            cpu_before.get_or_insert_with(thread_cpu_ns);
            let yielded = Instant::now();
            // SAFETY: sched_yield has no preconditions.
            unsafe { libc::sched_yield() };
            if yielded.elapsed() > CONTENDED_YIELD {
                // Other work runs here: let the scheduler wake this
                // thread for its requests instead.
                self.pause(queue);
                break matches!(look(), Look::Request);
            }
        };
        let cpu_ns = cpu_before.map_or(0, |before| thread_cpu_ns().saturating_sub(before));
        self.end_poll(queue, thread, cpu_ns, found);
        found
    }

    pub fn figures(&self) -> PaceFigures {
        PaceFigures {
            window_us: self.window_ns / 1_000,
            polled_us: self.polled_ns.load(Ordering::Relaxed) / 1_000,
            polls: self.polls.load(Ordering::Relaxed),
            polls_answered: self.polls_answered.load(Ordering::Relaxed),
            pauses: self.pauses.load(Ordering::Relaxed),
        }
    }
}

/// The calling thread's CPU time in ns (what its polling cost, whatever
/// else ran on its CPU meanwhile).
fn thread_cpu_ns() -> u64 {
    let mut time = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the live, writable timespec we pass.
    if unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut time) } != 0 {
        return 0;
    }
    time.tv_sec as u64 * 1_000_000_000 + time.tv_nsec as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn polling_off_never_takes_a_turn_nor_is_busy() {
        let pace = Pace::new(2, Duration::ZERO);
        pace.note_request();
        assert!(!pace.busy());
        assert!(!pace.take_turn(0, 0));
        assert_eq!(pace.figures().window_us, 0);
    }

    #[test]
    fn the_last_to_answer_polls_and_only_within_the_window() {
        let pace = Pace::new(2, Duration::from_millis(50));
        assert!(!pace.busy(), "no request yet");
        pace.note_request();
        assert!(pace.busy());
        assert!(pace.take_turn(0, 3));
        assert!(pace.has_turn(0, 3));
        assert!(pace.take_turn(0, 1), "thread 1 answered later");
        assert!(!pace.has_turn(0, 3) && pace.has_turn(0, 1));
        assert!(pace.take_turn(1, 3), "queue 1 has its own turn");
        assert!(!pace.take_turn(2, 0), "no queue 2");
        // Thread 3 of queue 0 lost its turn: ending its poll leaves thread 1's.
        pace.end_poll(0, 3, 1_500, false);
        assert!(pace.has_turn(0, 1));
        pace.end_poll(0, 1, 500, true);
        assert!(pace.has_turn(0, 1), "a request keeps the turn");
        pace.end_poll(0, 1, 0, false);
        assert!(
            !pace.has_turn(0, 1) && !pace.has_turn(0, 3),
            "a quiet end gives it up"
        );
        assert_eq!(
            pace.figures(),
            PaceFigures {
                window_us: 50_000,
                polled_us: 2,
                polls: 3,
                polls_answered: 1,
                pauses: 0,
            }
        );
        pace.pause(1);
        assert!(!pace.take_turn(1, 0), "queue 1 paused");
        assert!(pace.take_turn(0, 0), "queue 0 not");
        assert_eq!(pace.figures().pauses, 1);
        std::thread::sleep(Duration::from_millis(60));
        assert!(!pace.busy(), "the window passed");
    }

    #[test]
    fn the_thread_clock_moves_with_work() {
        let before = thread_cpu_ns();
        let mut sum = 0u64;
        for value in 0..2_000_000u64 {
            sum = sum.wrapping_add(std::hint::black_box(value));
        }
        std::hint::black_box(sum);
        assert!(thread_cpu_ns() > before);
    }
}
