//! Inode locks (the kernel's `i_rwsem`): one reader-writer lock per inode
//! in use, in a table keyed by inode number that holds an entry only while
//! someone holds or waits for it (and a few unused ones to reuse) — memory
//! stays bounded by the threads, not by the inodes ever touched.
//!
//! An inode's lock guards its fields, its mapping and its data, its
//! extended attributes and, for a directory, its entries. What a lock is
//! taken for sets its rank (`crate::lock`): Directory (and Directory2) for
//! a directory whose entries an operation reads or changes, Inode (and
//! Inode2) for the inode an operation changes itself. Several inode locks
//! are taken parent before child and, within a rank's pair, by the rule
//! the caller states (ancestor first, lower number first).
//!
//! Readers that need one consistent copy of an inode's fields only
//! (getattr) take no lock: writers encode an inode whole under its table
//! block's lock, so a decode sees all of one change or none of it.

use crate::hash::NumberMap;
use crate::lock::{Held, Rank, take_or_wait};
use parking_lot::lock_api::{ArcRwLockReadGuard, ArcRwLockWriteGuard};
use parking_lot::{Mutex, RawRwLock, RwLock};
use std::sync::Arc;

/// Shards of the table: lookups of different inodes rarely share one.
const SHARDS: usize = 64;

/// Tags inode lock identities for the checker (no real address has it).
const IDENTITY_TAG: usize = 1 << (usize::BITS - 2);

/// Unused entries a shard keeps for its next inodes: taking an inode's
/// lock (several per request) then allocates nothing, and the spares stay
/// bounded (64 shards of 8).
const SPARES_PER_SHARD: usize = 8;

type Entry = Arc<RwLock<()>>;

#[derive(Default)]
struct Shard {
    entries: NumberMap<u32, Entry>,
    /// Entries nobody holds, unlocked, ready for the next inode.
    spares: Vec<Entry>,
}

pub(crate) struct InodeLocks {
    /// Leaf locks: held only to find, insert or drop an entry.
    shards: Box<[Mutex<Shard>]>,
}

enum Guard {
    Read(#[allow(dead_code)] ArcRwLockReadGuard<RawRwLock, ()>),
    Write(#[allow(dead_code)] ArcRwLockWriteGuard<RawRwLock, ()>),
}

/// One inode's lock, held; released (and its entry dropped when nobody
/// else wants it) on drop.
#[must_use]
pub(crate) struct InodeGuard<'a> {
    table: &'a InodeLocks,
    ino: u32,
    guard: Option<Guard>,
    _held: Held,
}

impl InodeLocks {
    pub fn new() -> Self {
        InodeLocks {
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
        }
    }

    fn shard(&self, ino: u32) -> &Mutex<Shard> {
        &self.shards[ino as usize % SHARDS]
    }

    fn entry(&self, ino: u32) -> Entry {
        let mut shard = self.shard(ino).lock();
        let Shard { entries, spares } = &mut *shard;
        let entry = entries
            .entry(ino)
            .or_insert_with(|| spares.pop().unwrap_or_default());
        Arc::clone(entry)
    }

    /// Take `ino`'s lock shared, as `rank`.
    pub fn read(&self, ino: u32, rank: Rank) -> InodeGuard<'_> {
        let held = Held::acquire(rank, IDENTITY_TAG | ino as usize);
        let entry = self.entry(ino);
        let guard = Guard::Read(take_or_wait(entry.try_read_arc(), || entry.read_arc()));
        self.guard(ino, guard, held)
    }

    /// Take `ino`'s lock exclusive, as `rank`.
    pub fn write(&self, ino: u32, rank: Rank) -> InodeGuard<'_> {
        let held = Held::acquire(rank, IDENTITY_TAG | ino as usize);
        let entry = self.entry(ino);
        let guard = Guard::Write(take_or_wait(entry.try_write_arc(), || entry.write_arc()));
        self.guard(ino, guard, held)
    }

    fn guard(&self, ino: u32, guard: Guard, held: Held) -> InodeGuard<'_> {
        InodeGuard {
            table: self,
            ino,
            guard: Some(guard),
            _held: held,
        }
    }

    /// Entries in the table (tests: none once every guard dropped).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|shard| shard.lock().entries.len())
            .sum()
    }
}

impl Drop for InodeGuard<'_> {
    fn drop(&mut self) {
        // Unlock (and drop this guard's reference) first; the entry goes
        // when the table's is the only reference left. New references are
        // taken under the shard's lock, so none can appear meanwhile.
        drop(self.guard.take());
        let mut shard = self.table.shard(self.ino).lock();
        if shard
            .entries
            .get(&self.ino)
            .is_some_and(|entry| Arc::strong_count(entry) == 1)
        {
            let entry = shard.entries.remove(&self.ino).expect("looked up");
            // Nobody else references it: unlocked, and nobody can lock it.
            debug_assert!(!entry.is_locked());
            if shard.spares.len() < SPARES_PER_SHARD {
                shard.spares.push(entry);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    #[test]
    fn readers_share_writers_exclude_and_entries_go() {
        let table = Arc::new(InodeLocks::new());
        {
            let _first = table.read(12, Rank::Inode);
            // Another thread may read the same inode meanwhile.
            let other = Arc::clone(&table);
            std::thread::spawn(move || drop(other.read(12, Rank::Inode)))
                .join()
                .unwrap();
        }
        assert_eq!(table.len(), 0, "no entry outlives its guards");
        let inside = Arc::new(AtomicU32::new(0));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let (table, inside) = (Arc::clone(&table), Arc::clone(&inside));
                std::thread::spawn(move || {
                    for _ in 0..200 {
                        let _guard = table.write(12, Rank::Inode);
                        assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0);
                        inside.fetch_sub(1, Ordering::SeqCst);
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().unwrap();
        }
        assert_eq!(table.len(), 0);
    }

    #[cfg(debug_assertions)]
    #[test]
    #[should_panic(expected = "taking Directory while holding Inode")]
    fn a_child_before_its_parent_panics() {
        let table = InodeLocks::new();
        let _child = table.write(13, Rank::Inode);
        let _parent = table.write(2, Rank::Directory);
    }
}
