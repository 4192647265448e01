//! The crash-state generator: which disks a power cut during a recorded
//! run could have left behind.
//!
//! The log is cut into epochs at its barriers: epoch 0 runs from the start
//! of the log to the first barrier, epoch e from the e-th barrier to the
//! next one (or the end of the log). A barrier is a flush (every write
//! before it is durable) or, with persistent memory (ByteLog), a fence
//! (every cache line stored before it in its range is durable). A crash
//! inside epoch e leaves on the disk everything a barrier before it made
//! durable, plus any subset of the rest — the writes since the last flush
//! and the lines stored and not fenced since: a volatile cache destages
//! them in any order. Without persistent memory those are exactly the
//! epoch's own writes. Of two writes to the same sector that both reached
//! the disk, the later one wins (it replaced the earlier in the cache):
//! states apply their writes in log order. Writes and stores never cover
//! the same bytes while either is not durable (`dev::persistent`), so their
//! relative order does not matter.
//!
//! Kinds of states:
//! - `AtFlush`: none of the epoch's writes (every prefix ending at a flush;
//!   the last epoch's is the state after the whole log when it ends with a
//!   flush);
//! - `InOrder`: the first k writes of the epoch (a crash with no
//!   reordering);
//! - `Subset`: a random subset of the epoch's writes;
//! - `Torn`: a random subset, plus part of one more multi-sector write: a
//!   random proper subset of its 512-byte sectors. The primary superblock
//!   (bytes 1024..2048) is never torn: it carries its own checksum across
//!   two sectors, a hazard of the format for the kernel and e2fsck alike.
//!
//! What the oracle needs beside the image: ops that began before the last
//! entry the state includes may show their effects (`begun_before`), and
//! every acknowledgement logged before the epoch's closing flush must hold
//! (`acked_before`): the crash may have come just before that flush.
//!
//! The plan is deterministic given the log, the budget and the seed.

use super::rng::Rng;
use crate::dev::{Record, SECTOR_SIZE};
use std::collections::HashSet;

/// Bytes of the primary ext4 superblock.
const SUPERBLOCK_RANGE: std::ops::Range<u64> = 1024..2048;

/// Attempts at drawing a state not drawn before, per state wanted.
const DRAW_ATTEMPTS: usize = 8;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Epoch {
    /// First log index after the opening barrier (0 for epoch 0).
    pub start: usize,
    /// Index of the closing barrier, or the log's length.
    pub end: usize,
    /// Log indices of the writes and stores not durable at the epoch's
    /// end, in log order: what a crash inside it may or may not keep.
    pub writes: Vec<usize>,
    /// Log indices the opening barrier made durable, in log order: the disk
    /// at `start` is the previous epoch's plus these.
    pub settled: Vec<usize>,
}

/// Cut `log` into barrier epochs.
pub fn epochs(log: &[Record]) -> Vec<Epoch> {
    let mut epochs = Vec::new();
    let mut writes: Vec<usize> = Vec::new();
    let mut stores: Vec<usize> = Vec::new();
    let mut start = 0;
    let mut settled = Vec::new();
    let pending = |writes: &[usize], stores: &[usize]| {
        let mut all = [writes, stores].concat();
        all.sort_unstable();
        all
    };
    for (index, record) in log.iter().enumerate() {
        let made_durable = match record {
            Record::Write { .. } => {
                debug_assert!(
                    disjoint(log, index, &stores),
                    "a write over unfenced stores"
                );
                writes.push(index);
                continue;
            }
            Record::Store { .. } => {
                debug_assert!(
                    disjoint(log, index, &writes),
                    "a store over unflushed writes"
                );
                stores.push(index);
                continue;
            }
            Record::Mark(_) => continue,
            Record::Flush => std::mem::take(&mut writes),
            Record::Sync { ranges } => {
                let covered = |entry: &usize| inside(log, *entry, ranges);
                let (synced, rest) = std::mem::take(&mut writes).into_iter().partition(covered);
                writes = rest;
                synced
            }
            Record::Fence { offset, len } => {
                let covered = |entry: &usize| inside(log, *entry, &[(*offset, *len)]);
                let (fenced, rest) = stores.into_iter().partition(covered);
                stores = rest;
                fenced
            }
        };
        epochs.push(Epoch {
            start,
            end: index,
            writes: pending(&writes, &stores)
                .into_iter()
                .chain(made_durable.iter().copied())
                .collect::<std::collections::BTreeSet<_>>()
                .into_iter()
                .collect(),
            settled: std::mem::take(&mut settled),
        });
        debug_assert!(
            writes
                .iter()
                .all(|&older| !overlapped_later(log, older, &made_durable)),
            "a barrier made a write durable over part of an older pending one"
        );
        settled = made_durable;
        start = index + 1;
    }
    epochs.push(Epoch {
        start,
        end: log.len(),
        writes: pending(&writes, &stores),
        settled,
    });
    debug_assert!(epochs.windows(2).all(|pair| pair[0].end < pair[1].start));
    epochs
}

/// Whether entry `index` lies wholly inside one of `ranges` (offset,
/// length).
fn inside(log: &[Record], index: usize, ranges: &[(u64, u64)]) -> bool {
    let (at, data) = log[index].bytes().expect("a write or a store");
    let end = at + data.len() as u64;
    ranges
        .iter()
        .any(|&(offset, len)| offset <= at && end <= offset + len)
}

/// Whether a newer write of `durable` overlaps the pending write `older`.
/// A crash state could then put the older bytes back over the newer,
/// durable ones: the writers never do that (a barrier over some ranges
/// names whole writes, and a block is rewritten inside the same ranges).
fn overlapped_later(log: &[Record], older: usize, durable: &[usize]) -> bool {
    let (at, data) = log[older].bytes().expect("a write");
    let end = at + data.len() as u64;
    durable
        .iter()
        .filter(|&&newer| newer > older)
        .any(|&newer| {
            let (newer_at, newer_data) = log[newer].bytes().expect("a write");
            newer_at < end && at < newer_at + newer_data.len() as u64
        })
}

/// Whether entry `index` touches none of the bytes of `others`.
fn disjoint(log: &[Record], index: usize, others: &[usize]) -> bool {
    let (at, data) = log[index].bytes().expect("a write or a store");
    let end = at + data.len() as u64;
    others.iter().all(|&other| {
        let (other_at, other_data) = log[other].bytes().expect("a write or a store");
        end <= other_at || other_at + other_data.len() as u64 <= at
    })
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StateKind {
    AtFlush,
    InOrder,
    Subset,
    Torn,
}

/// Part of one write reached the disk: these of its sectors.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TornWrite {
    pub entry: usize,
    pub sectors: Vec<u32>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CrashState {
    /// Position in the plan: with the seed, what reproduces the state.
    pub number: usize,
    pub epoch: usize,
    pub kind: StateKind,
    /// Writes of the epoch that reached the disk, in log order.
    pub writes: Vec<usize>,
    pub torn: Option<TornWrite>,
    /// Operations whose begin mark precedes this index may show effects.
    pub begun_before: usize,
    /// Acknowledgements whose mark precedes this index must hold.
    pub acked_before: usize,
}

impl CrashState {
    fn new(epoch_index: usize, epoch: &Epoch, kind: StateKind, writes: Vec<usize>) -> Self {
        // The crash comes after the epoch's opening barrier, even when the
        // state keeps only entries from before it (unfenced stores).
        let last = writes
            .last()
            .map_or(epoch.start, |&last| (last + 1).max(epoch.start));
        CrashState {
            number: 0,
            epoch: epoch_index,
            kind,
            writes,
            torn: None,
            begun_before: last,
            acked_before: epoch.end,
        }
    }

    /// One line for reports.
    pub fn describe(&self) -> String {
        let torn = match &self.torn {
            Some(torn) => format!(", entry {} torn to sectors {:?}", torn.entry, torn.sectors),
            None => String::new(),
        };
        format!(
            "{:?} in flush epoch {}, {} of its writes{torn}",
            self.kind,
            self.epoch,
            self.writes.len()
        )
    }
}

fn can_tear(log: &[Record], index: usize) -> bool {
    match &log[index] {
        Record::Write { offset, data } => {
            let end = offset + data.len() as u64;
            data.len() as u64 > SECTOR_SIZE
                && (end <= SUPERBLOCK_RANGE.start || *offset >= SUPERBLOCK_RANGE.end)
        }
        _ => false,
    }
}

/// Draws states of one epoch.
struct Drawer<'a> {
    log: &'a [Record],
    rng: Rng,
    tear: bool,
}

impl Drawer<'_> {
    fn draw(&mut self, epoch_index: usize, epoch: &Epoch, kind: StateKind) -> Option<CrashState> {
        let writes = &epoch.writes;
        if writes.is_empty() {
            return None;
        }
        match kind {
            StateKind::AtFlush => Some(CrashState::new(epoch_index, epoch, kind, Vec::new())),
            StateKind::InOrder => {
                let count = self.rng.range(1, writes.len() as u64) as usize;
                let chosen = writes[..count].to_vec();
                Some(CrashState::new(epoch_index, epoch, kind, chosen))
            }
            StateKind::Subset => {
                let chosen = self.subset(writes);
                Some(CrashState::new(epoch_index, epoch, kind, chosen))
            }
            StateKind::Torn => self.torn(epoch_index, epoch),
        }
    }

    /// A non-empty random subset, with a density of 1/4, 1/2 or 3/4 so that
    /// both sparse and nearly complete epochs are tried.
    fn subset(&mut self, writes: &[usize]) -> Vec<usize> {
        let density = self.rng.range(1, 3);
        let mut chosen: Vec<usize> = writes
            .iter()
            .copied()
            .filter(|_| self.rng.chance(density, 4))
            .collect();
        if chosen.is_empty() {
            chosen.push(*self.rng.pick(writes));
        }
        chosen
    }

    fn torn(&mut self, epoch_index: usize, epoch: &Epoch) -> Option<CrashState> {
        if !self.tear {
            return None;
        }
        let tearable: Vec<usize> = epoch
            .writes
            .iter()
            .copied()
            .filter(|&index| can_tear(self.log, index))
            .collect();
        if tearable.is_empty() {
            return None;
        }
        let victim = *self.rng.pick(&tearable);
        let Record::Write { data, .. } = &self.log[victim] else {
            unreachable!("tearable entries are writes");
        };
        let sectors = (data.len() as u64 / SECTOR_SIZE) as u32;
        // A proper, non-empty subset of the sectors, in any pattern.
        let mut kept: Vec<u32> = (0..sectors).filter(|_| self.rng.chance(1, 2)).collect();
        if kept.is_empty() {
            kept.push(self.rng.below(sectors as u64) as u32);
        }
        if kept.len() == sectors as usize {
            kept.remove(self.rng.below(sectors as u64) as usize);
        }
        let others: Vec<usize> = epoch
            .writes
            .iter()
            .copied()
            .filter(|&i| i != victim)
            .collect();
        let mut chosen = if others.is_empty() {
            Vec::new()
        } else {
            self.subset(&others)
        };
        chosen.retain(|&index| index != victim);
        let mut state = CrashState::new(epoch_index, epoch, StateKind::Torn, chosen);
        state.begun_before = state.begun_before.max(victim + 1);
        state.torn = Some(TornWrite {
            entry: victim,
            sectors: kept,
        });
        Some(state)
    }
}

/// Plan at most `budget` states of `log`. Every epoch's `AtFlush` state
/// comes first when the budget allows (else an evenly spaced sample); the
/// rest of the budget goes round-robin over the epochs that have writes,
/// cycling through in-order, subset and (with `tear`) torn states.
pub fn plan(log: &[Record], budget: usize, seed: u64, tear: bool) -> Vec<CrashState> {
    let epochs = epochs(log);
    let mut drawer = Drawer {
        log,
        rng: Rng::derive(seed, "crash-state plan"),
        tear,
    };
    let flush_budget = if budget >= 2 * epochs.len() {
        epochs.len()
    } else {
        budget.div_ceil(2).min(epochs.len())
    };
    let mut states: Vec<CrashState> = spread(epochs.len(), flush_budget, &mut drawer.rng)
        .into_iter()
        .map(|index| CrashState::new(index, &epochs[index], StateKind::AtFlush, Vec::new()))
        .collect();
    let with_writes: Vec<usize> = (0..epochs.len())
        .filter(|&index| !epochs[index].writes.is_empty())
        .collect();
    let wanted = budget.saturating_sub(states.len());
    // With fewer states than epochs, the epochs drawn from are spread over
    // the whole run too.
    let with_writes: Vec<usize> = spread(with_writes.len(), wanted, &mut drawer.rng)
        .into_iter()
        .map(|index| with_writes[index])
        .collect();
    let mut seen: HashSet<(usize, Vec<usize>, Option<TornWrite>)> = HashSet::new();
    // Each pass over the epochs draws one kind: in-order, subset, torn,
    // subset, and again.
    let kinds = [
        StateKind::InOrder,
        StateKind::Subset,
        StateKind::Torn,
        StateKind::Subset,
    ];
    for attempt in 0..wanted * DRAW_ATTEMPTS {
        if states.len() >= budget || with_writes.is_empty() {
            break;
        }
        let epoch_index = with_writes[attempt % with_writes.len()];
        let kind = kinds[(attempt / with_writes.len()) % kinds.len()];
        let Some(state) = drawer.draw(epoch_index, &epochs[epoch_index], kind) else {
            continue;
        };
        let complete =
            state.torn.is_none() && state.writes.len() == epochs[epoch_index].writes.len();
        // All of an epoch's writes is the next epoch's AtFlush state when
        // its barrier makes all of them durable.
        if complete
            && epochs
                .get(epoch_index + 1)
                .is_some_and(|next| next.settled.len() == state.writes.len())
        {
            continue;
        }
        if seen.insert((state.epoch, state.writes.clone(), state.torn.clone())) {
            states.push(state);
        }
    }
    states.sort_by_key(|state| (state.epoch, state.kind != StateKind::AtFlush));
    for (number, state) in states.iter_mut().enumerate() {
        state.number = number;
    }
    debug_assert!(states.len() <= budget);
    states
}

/// `count` indices evenly spread over `0..len`, from a random offset.
fn spread(len: usize, count: usize, rng: &mut Rng) -> Vec<usize> {
    if count >= len {
        return (0..len).collect();
    }
    if count == 0 {
        return Vec::new();
    }
    let step = len as f64 / count as f64;
    let offset = rng.below(step.floor().max(1.0) as u64) as f64;
    let mut picked: Vec<usize> = (0..count)
        .map(|i| ((offset + i as f64 * step) as usize).min(len - 1))
        .collect();
    picked.dedup();
    picked
}

/// The disk of `state`: `image` must hold the state of its epoch's start
/// (everything its barriers made durable, `Epoch::settled`); the state's
/// writes and stores are applied through `write`.
pub fn apply(
    log: &[Record],
    state: &CrashState,
    write: &mut dyn FnMut(u64, &[u8]) -> std::io::Result<()>,
) -> std::io::Result<()> {
    for &index in &state.writes {
        if let Some((offset, data)) = log[index].bytes() {
            write(offset, data)?;
        }
    }
    if let Some(torn) = &state.torn
        && let Record::Write { offset, data } = &log[torn.entry]
    {
        for &sector in &torn.sectors {
            let at = sector as usize * SECTOR_SIZE as usize;
            write(offset + at as u64, &data[at..at + SECTOR_SIZE as usize])?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(offset: u64, sectors: usize, byte: u8) -> Record {
        Record::Write {
            offset,
            data: vec![byte; sectors * 512],
        }
    }

    fn sample_log() -> Vec<Record> {
        vec![
            write(4096, 8, 1),
            write(8192, 2, 2),
            Record::Mark("op 0 1 begin".into()),
            Record::Flush,
            write(4096, 8, 3),
            write(1024, 2, 4),
            write(12288, 1, 5),
            Record::Flush,
            Record::Mark("op 0 1 ack".into()),
        ]
    }

    #[test]
    fn epochs_split_at_flushes() {
        let epochs = epochs(&sample_log());
        assert_eq!(epochs.len(), 3);
        assert_eq!(epochs[0].writes, vec![0, 1]);
        assert_eq!((epochs[1].start, epochs[1].end), (4, 7));
        assert_eq!(epochs[1].writes, vec![4, 5, 6]);
        assert!(epochs[2].writes.is_empty());
    }

    #[test]
    fn a_sync_makes_only_its_ranges_durable() {
        let log = vec![
            write(4096, 8, 1),
            write(16384, 8, 2),
            write(8192, 1, 3),
            Record::Sync {
                ranges: vec![(4096, 4096), (8192, 512)],
            },
            write(4096, 8, 4),
            Record::Flush,
        ];
        let epochs = epochs(&log);
        assert_eq!(epochs.len(), 3);
        assert_eq!(epochs[0].writes, vec![0, 1, 2]);
        // The write outside the ranges stays pending across the barrier.
        assert_eq!(epochs[1].settled, vec![0, 2]);
        assert_eq!(epochs[1].writes, vec![1, 4]);
        assert_eq!(epochs[2].settled, vec![1, 4]);
        assert!(epochs[2].writes.is_empty());
    }

    #[test]
    fn a_write_partly_inside_the_ranges_stays_pending() {
        let log = vec![
            write(4096, 8, 1),
            Record::Sync {
                ranges: vec![(4096, 512)],
            },
            Record::Sync {
                ranges: vec![(4096, 4096)],
            },
        ];
        let epochs = epochs(&log);
        assert!(epochs[1].settled.is_empty());
        assert_eq!(epochs[1].writes, vec![0]);
        assert_eq!(epochs[2].settled, vec![0]);
    }

    #[test]
    fn plans_are_deterministic_bounded_and_distinct() {
        let log = sample_log();
        let plan_a = plan(&log, 12, 42, true);
        assert_eq!(plan_a, plan(&log, 12, 42, true));
        assert!(plan_a.len() <= 12);
        let at_flush = plan_a
            .iter()
            .filter(|s| s.kind == StateKind::AtFlush)
            .count();
        assert_eq!(at_flush, 3, "every epoch's flush state: {plan_a:#?}");
        for (number, state) in plan_a.iter().enumerate() {
            assert_eq!(state.number, number);
            if let Some(torn) = &state.torn {
                // Never the superblock, never a whole or an empty write.
                assert_ne!(torn.entry, 5);
                assert!(!torn.sectors.is_empty() && torn.sectors.len() < 8);
                assert!(!state.writes.contains(&torn.entry));
            }
            let epoch = &epochs(&log)[state.epoch];
            assert!(state.writes.iter().all(|w| epoch.writes.contains(w)));
            assert_eq!(state.acked_before, epoch.end);
        }
        let mut keys: Vec<_> = plan_a
            .iter()
            .map(|s| (s.epoch, s.writes.clone(), s.torn.clone()))
            .collect();
        keys.sort();
        keys.dedup();
        assert_eq!(keys.len(), plan_a.len());
        assert!(plan(&log, 12, 43, true) != plan_a || plan_a.len() < 4);
    }

    #[test]
    fn small_budgets_sample_flush_states() {
        let mut log = Vec::new();
        for i in 0..100u64 {
            log.push(write(8192 * (i + 1), 1, i as u8));
            log.push(write(8192 * (i + 1) + 4096, 1, i as u8));
            log.push(Record::Flush);
        }
        let states = plan(&log, 10, 1, false);
        assert_eq!(states.len(), 10);
        let at_flush: Vec<usize> = states
            .iter()
            .filter(|s| s.kind == StateKind::AtFlush)
            .map(|s| s.epoch)
            .collect();
        assert_eq!(at_flush.len(), 5);
        // Spread over the run, not bunched at its start.
        assert!(at_flush.last().unwrap() - at_flush[0] >= 60, "{at_flush:?}");
        let others: Vec<usize> = states
            .iter()
            .filter(|s| s.kind != StateKind::AtFlush)
            .map(|s| s.epoch)
            .collect();
        assert!(others.last().unwrap() - others[0] >= 60, "{others:?}");
    }

    #[test]
    fn apply_writes_whole_and_torn_entries() {
        let log = sample_log();
        let state = CrashState {
            number: 0,
            epoch: 1,
            kind: StateKind::Torn,
            writes: vec![6],
            torn: Some(TornWrite {
                entry: 4,
                sectors: vec![1, 7],
            }),
            begun_before: 7,
            acked_before: 7,
        };
        let mut image = vec![0u8; 16384];
        apply(&log, &state, &mut |offset, data| {
            image[offset as usize..offset as usize + data.len()].copy_from_slice(data);
            Ok(())
        })
        .unwrap();
        assert_eq!(image[12288], 5);
        assert_eq!(image[4096], 0);
        assert_eq!(image[4096 + 512], 3);
        assert_eq!(image[4096 + 7 * 512], 3);
        assert_eq!(image[4096 + 6 * 512], 0);
    }
}
