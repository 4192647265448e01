//! Which `/dev/fuse` worker reads the next request: the one that answered
//! the last, while nothing else needs a second worker.
//!
//! A FUSE request is a synchronous round trip: its caller sleeps until the
//! answer wakes it. Every worker waits for the next request in `read(2)` on
//! `/dev/fuse`, and the kernel hands each request to the worker that has
//! waited longest (`fuse_dev_do_read` sleeps as an exclusive waiter, which
//! queue at the tail and are woken from the head). With four workers and
//! one caller — `tar`, `cp`, a shell — the requests go round the workers
//! in turn, and each lands on a thread that last ran somewhere else: its
//! wake-up crosses CPUs, and the caller's answer crosses back. Measured on
//! the 2-vCPU test machine, untar of `drivers/net` + sync, interleaved
//! runs under load: 0.9–1.2 s with these turns, 3.3–7.3 s without (docs/
//! performance.md, "Transports and polling"). One worker for good (`threads=1`) is no
//! answer: on the idle machine it settles on the CPU the caller does not
//! run on (4.0 s), and it cannot serve parallel callers or go on while it
//! blocks.
//!
//! So the workers take turns as the io_uring transport's queues do (a
//! caller's requests stay with one thread): a worker that has answered goes
//! back to `read(2)` only if no other worker is reading; otherwise it parks
//! here. A parked worker is woken to read
//! - when the workers that took the last two requests found more requests
//!   queued behind each (`poll(2)` on `/dev/fuse`, no wait): callers that
//!   keep requests queued need a second worker; a single queued RELEASE
//!   or FORGET does not,
//! - when the worker serving a request is about to block: it calls
//!   `lock::before_blocking`, which the engine's ranked locks (on
//!   contention), their condition variables, the inode locks, the
//!   fast-commit tracker's waits and an fsync run on the worker itself
//!   call. Device I/O and the plain leaf locks do not (a second caller
//!   then waits for them, or for the park limit below),
//! - after `PARK_LIMIT` in any case (see `park_while_another_reads`), so
//!   that an idle mount ends with every worker in `read(2)` (where the
//!   end of the session finds them: fuser joins its workers before the
//!   engine unmounts) and nothing spins.
//!
//! While callers keep requests queued, a worker that answered reads on
//! instead of parking, for `BUSY_HOLD` after the queue was last seen busy
//! (`ReadTurns::busy`): parking and waking per request cost more than the
//! kernel's own hand-over there.
//!
//! The worker whose turn it is to read polls the descriptor for a while
//! before it goes back to `read(2)` (`-o dev_spin=µs`, `pace.rs`), so that
//! the caller's next request finds it awake.
//!
//! Locks: `parked` is a leaf (nothing is taken while it is held); the hook
//! takes it under engine locks, never the other way round.

use super::pace::{Look, Pace, PaceFigures};
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::Duration;

/// How long workers stay off parking after callers were seen keeping
/// requests queued (`ReadTurns::busy`).
const BUSY_HOLD: Duration = Duration::from_millis(10);

/// How long a worker stays parked at most before it reads again.
const PARK_LIMIT: Duration = Duration::from_millis(50);

pub struct ReadTurns {
    /// Off: every worker reads (fuser's own behaviour), for measurements
    /// (`JEXT4_FUSE_OFF=one_reader`).
    enabled: bool,
    park_limit: Duration,
    /// The session's `/dev/fuse` descriptor, to see whether requests are
    /// queued (every cloned descriptor shares the one input queue).
    fd: OnceLock<RawFd>,
    /// Workers in `read(2)` or on their way to it (a woken worker is
    /// counted by whoever wakes it, under `parked`).
    readers: AtomicUsize,
    /// Parked workers and the wake-ups handed to them. A leaf lock, and a
    /// std one on purpose: the hook takes it under the engine's ranked
    /// locks, and nothing is taken while it is held.
    parked: Mutex<Parked>,
    /// `parked.count`, readable without the lock.
    parked_now: AtomicUsize,
    unparked: Condvar,
    /// The thread that took the last request, and how often the next one
    /// went to another (the figure this module is about).
    last_taker: AtomicU64,
    switches: AtomicU64,
    /// Until when (µs since `epoch`) answering workers read on (`busy`).
    epoch: std::time::Instant,
    busy_until_us: AtomicU64,
    /// Takes in a row that found requests queued behind them.
    backlog_streak: AtomicU64,
    wakes_for_backlog: AtomicU64,
    wakes_for_blocking: AtomicU64,
    parks: AtomicU64,
    parks_timed_out: AtomicU64,
    /// The reading worker's polling before `read(2)` (one queue: the
    /// session's descriptor).
    pace: Pace,
}

/// What a worker's attempt to park came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Park {
    /// It did not park: nobody else was reading, or callers keep requests
    /// queued.
    Stayed,
    /// Woken to read, counted as a reader by the waker.
    Woken,
    /// Back after the park limit.
    TimedOut,
}

#[derive(Default)]
struct Parked {
    count: usize,
    wakes: usize,
}

/// What `jext4 stats` shows of the turns.
pub struct TurnFigures {
    pub enabled: bool,
    pub switches: u64,
    pub wakes_for_backlog: u64,
    pub wakes_for_blocking: u64,
    pub parks: u64,
    pub parks_timed_out: u64,
    pub pace: PaceFigures,
}

impl ReadTurns {
    /// Turns for `workers` workers (`enabled`: one reads at a time, see
    /// the module header), whose reader polls for `spin` after each
    /// answer (zero: never).
    pub fn new(workers: usize, enabled: bool, spin: Duration) -> Arc<ReadTurns> {
        ReadTurns::with_park_limit(workers, enabled, spin, PARK_LIMIT)
    }

    fn with_park_limit(
        workers: usize,
        enabled: bool,
        spin: Duration,
        park_limit: Duration,
    ) -> Arc<ReadTurns> {
        Arc::new(ReadTurns {
            enabled,
            park_limit,
            fd: OnceLock::new(),
            readers: AtomicUsize::new(workers),
            parked: Mutex::new(Parked::default()),
            parked_now: AtomicUsize::new(0),
            unparked: Condvar::new(),
            last_taker: AtomicU64::new(0),
            switches: AtomicU64::new(0),
            epoch: std::time::Instant::now(),
            busy_until_us: AtomicU64::new(0),
            backlog_streak: AtomicU64::new(0),
            wakes_for_backlog: AtomicU64::new(0),
            wakes_for_blocking: AtomicU64::new(0),
            parks: AtomicU64::new(0),
            parks_timed_out: AtomicU64::new(0),
            pace: Pace::new(1, if enabled { spin } else { Duration::ZERO }),
        })
    }

    /// The session's descriptor, once it exists (after the mount).
    pub fn set_fd(&self, fd: RawFd) {
        let _ = self.fd.set(fd);
    }

    /// A worker took a request from `read(2)`. The returned turn, dropped
    /// once the request is answered (or handed to another thread), sends
    /// the worker back to read or parks it.
    pub fn take(self: &Arc<Self>) -> Turn {
        let left = self.count_take();
        self.pace.note_request();
        if self.enabled {
            install_hook(self);
            if left == 0 && self.parked_now.load(Ordering::Acquire) > 0 && self.backlog_persists() {
                self.wake_one(&self.wakes_for_backlog);
            }
        }
        Turn {
            turns: Arc::clone(self),
            may_park: true,
        }
    }

    /// A turn that goes back to `read(2)` without parking or looking at
    /// the queue: FORGET, which fuser hands over once per node of a
    /// BATCH_FORGET request (its node type is private to fuser, so the
    /// batch cannot take one turn).
    pub fn take_briefly(self: &Arc<Self>) -> Turn {
        self.count_take();
        Turn {
            turns: Arc::clone(self),
            may_park: false,
        }
    }

    /// Count a take; the readers left.
    fn count_take(&self) -> usize {
        let taker = thread_number();
        if self.last_taker.swap(taker, Ordering::Relaxed) != taker {
            self.switches.fetch_add(1, Ordering::Relaxed);
        }
        let readers = self.readers.fetch_sub(1, Ordering::AcqRel);
        debug_assert!(readers > 0, "a request taken with no worker reading");
        readers.wrapping_sub(1)
    }

    /// The serving worker is about to block: if nobody reads meanwhile,
    /// wake a parked worker to read.
    pub fn before_blocking(&self) {
        if self.readers.load(Ordering::Acquire) == 0 {
            self.wake_one(&self.wakes_for_blocking);
        }
    }

    /// Wake a parked worker, if there is one, counted as a reader from
    /// now (so that nobody wakes a second one for the same need).
    fn wake_one(&self, counter: &AtomicU64) {
        let mut parked = self.parked.lock().unwrap_or_else(|e| e.into_inner());
        if parked.count > parked.wakes {
            parked.wakes += 1;
            self.readers.fetch_add(1, Ordering::AcqRel);
            counter.fetch_add(1, Ordering::Relaxed);
            self.unparked.notify_one();
        }
    }

    /// Whether requests were queued behind this take and the one before.
    /// One queued request is usually the kernel's own background work —
    /// the RELEASE of a file just closed — which the reader takes next at
    /// little cost; a second worker pays where callers keep several
    /// requests queued (parallel writers, `make -j`).
    fn backlog_persists(&self) -> bool {
        if self.backlog() {
            self.backlog_streak.fetch_add(1, Ordering::Relaxed) >= 1
        } else {
            self.backlog_streak.store(0, Ordering::Relaxed);
            false
        }
    }

    /// Whether callers keep requests queued: then a worker that answered
    /// reads on instead of parking, as every worker did before these
    /// turns, for `BUSY_HOLD` after requests were last seen queued at a
    /// worker's answer (blurt's thousand writers: parking and waking per
    /// request cost 9 %). Only once the backlog persisted at two takes:
    /// one caller's next request is often queued by the time its answer's
    /// worker gets here, and a worker that stayed would take it from the
    /// warm one.
    fn busy(&self) -> bool {
        let now = self.epoch.elapsed().as_micros() as u64;
        if now < self.busy_until_us.load(Ordering::Relaxed) {
            return true;
        }
        if self.backlog_streak.load(Ordering::Relaxed) >= 2 && self.backlog() {
            self.busy_until_us
                .store(now + BUSY_HOLD.as_micros() as u64, Ordering::Relaxed);
            return true;
        }
        false
    }

    /// Whether requests wait in the kernel's queue now.
    fn backlog(&self) -> bool {
        self.look() == Look::Request
    }

    /// The worker answered: back to `read(2)`, unless another worker is
    /// reading already, then park until needed. The worker that reads
    /// next without having parked polls for the next request first, while
    /// requests keep coming (one back from a timed-out park would take the
    /// polling turn from the warm worker that answered last).
    fn give_back(&self, may_park: bool) {
        let park = if self.enabled && may_park {
            self.park_while_another_reads()
        } else {
            Park::Stayed
        };
        if park == Park::Woken {
            // Counted as a reader by whoever woke it.
            return;
        }
        self.readers.fetch_add(1, Ordering::AcqRel);
        if may_park && park == Park::Stayed {
            self.pace.poll(0, thread_number() as usize, || self.look());
        }
    }

    /// One look of the poll: a request queued, nothing yet, or a session
    /// that has ended (the kernel reports only an error once the
    /// connection is gone: `read(2)` then ends the worker).
    fn look(&self) -> Look {
        let Some(&fd) = self.fd.get() else {
            return Look::Stop;
        };
        let mut poll = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd, no wait; the descriptor lives as long
        // as the session whose workers call this.
        let ready = unsafe { libc::poll(&mut poll, 1, 0) };
        if ready < 0 || poll.revents & (libc::POLLERR | libc::POLLHUP | libc::POLLNVAL) != 0 {
            Look::Stop
        } else if poll.revents & libc::POLLIN != 0 {
            Look::Request
        } else {
            Look::Nothing
        }
    }

    /// Park until woken (`Woken`: the waker counted this worker as a
    /// reader) or for the park limit at most (`TimedOut`): then it reads
    /// again, beside the warm worker, and the next answer parks one of
    /// them. That bounds
    /// what a reader blocked where no hook tells (or one that left fuser's
    /// loop) can hold up, and the end of the session's wait for parked
    /// workers. It also hands the turn round now and then, which measured
    /// faster on the idle test machine than one worker for good: there a
    /// lone worker settles on the CPU the caller does not run on, and
    /// every request crosses CPUs twice (untar of drivers/net: 4.0 s with
    /// `threads=1`, 2.4-2.8 s with a worker that never left its turn,
    /// 1.5-1.6 s handing it round, 1.8-1.9 s with every worker reading).
    fn park_while_another_reads(&self) -> Park {
        let mut parked = self.parked.lock().unwrap_or_else(|e| e.into_inner());
        // Counted as parked before looking at the readers, so a reader
        // that takes a request now sees someone to wake.
        parked.count += 1;
        self.parked_now.store(parked.count, Ordering::Release);
        let mut park = Park::Stayed;
        if self.readers.load(Ordering::Acquire) > 0 && !self.busy() {
            self.parks.fetch_add(1, Ordering::Relaxed);
            let (guard, waited) = self
                .unparked
                .wait_timeout_while(parked, self.park_limit, |parked| parked.wakes == 0)
                .unwrap_or_else(|e| e.into_inner());
            parked = guard;
            if waited.timed_out() {
                self.parks_timed_out.fetch_add(1, Ordering::Relaxed);
                park = Park::TimedOut;
            } else {
                parked.wakes -= 1;
                park = Park::Woken;
            }
        }
        parked.count -= 1;
        self.parked_now.store(parked.count, Ordering::Release);
        park
    }

    pub fn figures(&self) -> TurnFigures {
        TurnFigures {
            enabled: self.enabled,
            switches: self.switches.load(Ordering::Relaxed),
            wakes_for_backlog: self.wakes_for_backlog.load(Ordering::Relaxed),
            wakes_for_blocking: self.wakes_for_blocking.load(Ordering::Relaxed),
            parks: self.parks.load(Ordering::Relaxed),
            parks_timed_out: self.parks_timed_out.load(Ordering::Relaxed),
            pace: self.pace.figures(),
        }
    }
}

impl std::fmt::Debug for ReadTurns {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadTurns")
            .field("enabled", &self.enabled)
            .field("readers", &self.readers.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

/// A worker's hold on a request; see [`ReadTurns::take`].
pub struct Turn {
    turns: Arc<ReadTurns>,
    may_park: bool,
}

impl Drop for Turn {
    fn drop(&mut self) {
        self.turns.give_back(self.may_park);
    }
}

/// A small number for the calling thread (std's ThreadId has no stable
/// integer form).
fn thread_number() -> u64 {
    thread_local!(static NUMBER: u64 = {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        NEXT.fetch_add(1, Ordering::Relaxed)
    });
    NUMBER.with(|number| *number)
}

/// Point the engine's "about to block" hook of this worker thread at these
/// turns, once per thread.
fn install_hook(turns: &Arc<ReadTurns>) {
    thread_local!(static INSTALLED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) });
    if INSTALLED.with(|installed| installed.replace(true)) {
        return;
    }
    let weak = Arc::downgrade(turns);
    crate::lock::set_before_blocking(Box::new(move || {
        if let Some(turns) = weak.upgrade() {
            turns.before_blocking();
        }
    }));
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    /// Long enough that no parked worker of these tests leaves by the
    /// limit, however loaded the machine.
    const NEVER: Duration = Duration::from_secs(3600);

    fn parked(turns: &ReadTurns) -> usize {
        turns.parked.lock().unwrap().count
    }

    /// Worker A answers while B still reads, so A parks; B takes a
    /// request and then blocks on a contended lock of the engine: the
    /// lock's hook wakes A to read, counted as a reader by the waker.
    /// Then the other way round, through the hook called directly.
    #[test]
    fn a_worker_parks_while_another_reads_and_wakes_when_the_reader_blocks() {
        let turns = ReadTurns::with_park_limit(2, true, Duration::ZERO, NEVER);
        let a = {
            let turns = Arc::clone(&turns);
            std::thread::spawn(move || drop(turns.take()))
        };
        while parked(&turns) == 0 {
            std::thread::yield_now();
        }
        let lock = Arc::new(crate::lock::Mutex::new(crate::lock::Rank::Superblock, ()));
        let held = lock.lock();
        let b = {
            let (turns, lock) = (Arc::clone(&turns), Arc::clone(&lock));
            std::thread::spawn(move || {
                let turn = turns.take();
                drop(lock.lock());
                drop(turn);
            })
        };
        a.join().unwrap();
        let figures = turns.figures();
        assert_eq!((figures.parks, figures.wakes_for_blocking), (1, 1));
        assert_eq!(figures.parks_timed_out, 0, "woken, not timed out");
        assert_eq!(turns.readers.load(Ordering::Acquire), 1, "A reads again");
        drop(held);
        // B answers while A reads: B parks in turn, until woken.
        while parked(&turns) == 0 {
            std::thread::yield_now();
        }
        assert_eq!(turns.figures().parks, 2);
        // A takes a request and blocks: B is woken to read.
        let a_again = turns.take_briefly();
        turns.before_blocking();
        b.join().unwrap();
        drop(a_again);
        assert_eq!(turns.figures().wakes_for_blocking, 2);
        assert_eq!(turns.readers.load(Ordering::Acquire), 2);
    }

    #[test]
    fn a_lone_worker_never_parks_and_a_parked_one_reads_again_after_the_limit() {
        let turns = ReadTurns::with_park_limit(1, true, Duration::ZERO, NEVER);
        drop(turns.take());
        assert_eq!(turns.figures().parks, 0);
        assert_eq!(turns.readers.load(Ordering::Acquire), 1);
        let limit = Duration::from_millis(20);
        let turns = ReadTurns::with_park_limit(2, true, Duration::ZERO, limit);
        let start = Instant::now();
        drop(turns.take());
        assert!(start.elapsed() >= limit, "parked until the limit");
        let figures = turns.figures();
        assert_eq!((figures.parks, figures.parks_timed_out), (1, 1));
        assert_eq!(turns.readers.load(Ordering::Acquire), 2);
        let off = ReadTurns::with_park_limit(2, false, Duration::ZERO, NEVER);
        drop(off.take());
        assert_eq!(off.figures().parks, 0, "switched off: never parks");
    }

    /// FORGET turns never park and never look at the queue.
    #[test]
    fn a_brief_turn_goes_back_to_read() {
        let turns = ReadTurns::with_park_limit(2, true, Duration::ZERO, NEVER);
        drop(turns.take_briefly());
        assert_eq!(turns.figures().parks, 0);
        assert_eq!(turns.readers.load(Ordering::Acquire), 2);
    }

    /// The reader polls the descriptor before `read(2)` while requests
    /// keep coming: a queued request ends the poll at once; with none, the
    /// window does. A brief turn, spin zero and turns switched off never
    /// poll. (A pipe stands in for `/dev/fuse`: `poll(2)` is all it sees.)
    #[test]
    fn the_reader_polls_for_the_next_request_within_the_window() {
        let mut ends = [0; 2];
        // SAFETY: a two-int array for pipe(2) to fill.
        assert_eq!(unsafe { libc::pipe(ends.as_mut_ptr()) }, 0);
        let window = Duration::from_millis(300);
        let turns = ReadTurns::with_park_limit(1, true, window, NEVER);
        turns.set_fd(ends[0]);
        // SAFETY: writes one byte from a live buffer to the pipe we made.
        assert_eq!(unsafe { libc::write(ends[1], [1u8].as_ptr().cast(), 1) }, 1);
        drop(turns.take());
        let pace = turns.figures().pace;
        assert_eq!(
            (pace.window_us, pace.polls, pace.polls_answered),
            (300_000, 1, 1)
        );
        // Emptied, the next poll ends with the window (or earlier, on a
        // CPU found contended: the last poll here, as the pause after it
        // would stop the next).
        let mut byte = [0u8];
        // SAFETY: reads one byte into a live buffer from the pipe we made.
        assert_eq!(
            unsafe { libc::read(ends[0], byte.as_mut_ptr().cast(), 1) },
            1
        );
        drop(turns.take());
        let pace = turns.figures().pace;
        assert_eq!(
            (pace.polls, pace.polls_answered),
            (2, 1),
            "no request this time"
        );
        drop(turns.take_briefly());
        assert_eq!(turns.figures().pace.polls, 2, "a brief turn does not poll");
        for quiet in [
            ReadTurns::with_park_limit(1, true, Duration::ZERO, NEVER),
            ReadTurns::with_park_limit(1, false, window, NEVER),
        ] {
            quiet.set_fd(ends[0]);
            drop(quiet.take());
            assert_eq!(quiet.figures().pace.polls, 0);
        }
        // A session that ended (here: the writer gone, POLLHUP) stops the
        // poll at once, however long the window.
        // SAFETY: closes the write end of the pipe we made, once.
        unsafe { libc::close(ends[1]) };
        let ended = ReadTurns::with_park_limit(1, true, Duration::from_secs(60), NEVER);
        ended.set_fd(ends[0]);
        let started = Instant::now();
        drop(ended.take());
        assert!(started.elapsed() < Duration::from_secs(30), "polled on");
        let pace = ended.figures().pace;
        assert_eq!((pace.polls, pace.polls_answered), (1, 0));
        // SAFETY: closes the read end of the pipe we made, once.
        unsafe { libc::close(ends[0]) };
    }
}
