//! Threads sleeping under the journal's state lock until a counter — the
//! committed tid, or the durable fast-commit number — reaches their own
//! target, each on its own condition variable.
//!
//! With one condition variable for every waiter, the end of each group
//! commit (and every handle that left a transaction) woke every sleeping
//! fsync, most of them only to find their commit not done and sleep again:
//! two futex calls and a context switch each, per event, per waiter. Here
//! an event wakes only the waiters it concerns (the jbd2 wait queue keyed
//! by tid, in effect). A waker holds the state lock while it looks, and a
//! waiter registers under it before it sleeps, so no wake-up is lost; a
//! woken waiter re-checks its own condition, so a wake-up too many only
//! costs a round.

use crate::lock::{Condvar, MutexGuard};
use std::sync::Arc;

thread_local! {
    /// The condition variable this thread sleeps on (a thread waits for one
    /// thing at a time; one per thread spares an allocation per wait).
    static SLEEPER: Arc<Condvar> = Arc::new(Condvar::new());
}

/// Waiters, each with the target it waits for.
#[derive(Default)]
pub(crate) struct Waiters {
    sleeping: Vec<(u64, Arc<Condvar>)>,
}

impl Waiters {
    /// Wake every waiter whose target `reached` says is reached.
    pub fn wake_where(&self, reached: impl Fn(u64) -> bool) -> usize {
        let mut woken = 0;
        for (target, condvar) in &self.sleeping {
            if reached(*target) {
                condvar.notify_one();
                woken += 1;
            }
        }
        woken
    }

    /// Wake the waiter with the smallest target above `after` (the next
    /// fast-commit writer).
    pub fn wake_first_after(&self, after: u64) -> bool {
        let next = self
            .sleeping
            .iter()
            .filter(|(target, _)| *target > after)
            .min_by_key(|(target, _)| *target);
        next.is_some_and(|(_, condvar)| condvar.notify_one())
    }

    /// Wake everyone (a journal abort).
    pub fn wake_all(&self) {
        self.wake_where(|_| true);
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.sleeping.len()
    }
}

/// Sleep on this thread's own condition variable, registered in the list
/// `waiters` picks out of the guarded state with `target`, until a waker
/// notifies it. The caller re-checks its condition afterwards.
pub(crate) fn sleep<S>(
    guard: &mut MutexGuard<'_, S>,
    waiters: fn(&mut S) -> &mut Waiters,
    target: u64,
) {
    SLEEPER.with(|condvar| {
        waiters(guard).sleeping.push((target, Arc::clone(condvar)));
        condvar.wait(guard);
        let list = &mut waiters(guard).sleeping;
        let at = list
            .iter()
            .position(|(_, other)| Arc::ptr_eq(other, condvar))
            .expect("a sleeper stays registered until it wakes");
        list.swap_remove(at);
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lock::{Mutex, Rank};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    #[derive(Default)]
    struct Counter {
        reached: u64,
        waiters: Waiters,
    }

    fn waiters_of(counter: &mut Counter) -> &mut Waiters {
        &mut counter.waiters
    }

    /// Each waiter wakes when the counter passes its own target, and only
    /// then: the count of rounds (wake-ups) is one per waiter.
    #[test]
    fn each_waiter_wakes_once_at_its_own_target() {
        let state = Arc::new(Mutex::new(Rank::JournalState, Counter::default()));
        let rounds = Arc::new(AtomicUsize::new(0));
        let threads: Vec<_> = (1..=8u64)
            .map(|target| {
                let state = Arc::clone(&state);
                let rounds = Arc::clone(&rounds);
                std::thread::spawn(move || {
                    let mut guard = state.lock();
                    while guard.reached < target {
                        sleep(&mut guard, waiters_of, target);
                        rounds.fetch_add(1, Ordering::Relaxed);
                    }
                })
            })
            .collect();
        while state.lock().waiters.len() < 8 {
            std::thread::sleep(Duration::from_millis(1));
        }
        for step in 1..=8u64 {
            let mut guard = state.lock();
            guard.reached = step;
            assert_eq!(guard.waiters.wake_where(|target| target <= step), 1);
            drop(guard);
            // The woken one leaves the list before the next step.
            while state.lock().waiters.len() > (8 - step) as usize {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        for thread in threads {
            thread.join().unwrap();
        }
        assert_eq!(rounds.load(Ordering::Relaxed), 8);
    }

    #[test]
    fn wake_first_after_picks_the_smallest_later_target() {
        let state = Arc::new(Mutex::new(Rank::JournalState, Counter::default()));
        let threads: Vec<_> = [5u64, 3, 9]
            .into_iter()
            .map(|target| {
                let state = Arc::clone(&state);
                std::thread::spawn(move || {
                    let mut guard = state.lock();
                    sleep(&mut guard, waiters_of, target);
                    target
                })
            })
            .collect();
        while state.lock().waiters.len() < 3 {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(state.lock().waiters.wake_first_after(3));
        while state.lock().waiters.len() > 2 {
            std::thread::sleep(Duration::from_millis(1));
        }
        let left: Vec<u64> = state.lock().waiters.sleeping.iter().map(|w| w.0).collect();
        assert!(left.contains(&3) && left.contains(&9), "{left:?}");
        state.lock().waiters.wake_all();
        let mut ended: Vec<u64> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        ended.sort_unstable();
        assert_eq!(ended, vec![3, 5, 9]);
    }
}
