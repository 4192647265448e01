//! Per-directory transactions (DESIGN §2, tier 3; the DJFS paper): which
//! logical transaction holds each change, and how those transactions are
//! coalesced, taken for commit and bound to the handles that fill them.
//!
//! A *scope key* is a directory's inode number — or, for a file reached by
//! number only (an NFS handle) whose directory is unknown, the file's own.
//! Keys form sets (union-find); each set owns one running transaction and
//! the committing ones taken from it: `building` (bound handles draining,
//! then records being built from the inodes), `frozen` (records built, data
//! being written back, waiting for its turn), `queued` (in the journal's
//! fast-commit queue, numbered). With `-o fast_commit=global` every key is
//! the one key `GLOBAL_KEY`: one set, the kernel's single queue.
//!
//! - A path-based operation enters the set of its directory (two for a
//!   rename), a descriptor-based one that of the file's directory: the
//!   directory its pending changes are in, else the one it was created,
//!   linked or looked up in first since mount (`homes`), else its own key.
//!   Entering waits while that set has a transaction building (the
//!   directory's lock-up: other directories never wait), then binds the
//!   handle to the running transaction (`updates`, the kernel's t_updates
//!   per directory).
//! - A change goes to the handle's transaction. When it involves another
//!   set — a name in another directory, an inode whose pending changes are
//!   in another set — the sets are united (running→running: coalesced),
//!   so a rename or a link across directories commits as one. An inode in
//!   a transaction being built by another handle's change is a conflict:
//!   the builder will have read it half-changed, so it merges its
//!   transaction back and tries again (running→committing: waited); one
//!   already frozen is not touched (its records are a frozen snapshot:
//!   shadowed).
//! - A set whose transactions are all durable and empty dissolves: its
//!   keys become independent again.
//!
//! Handles are bound to one transaction at a time; bindings move with the
//! transactions they point at when those merge, so nothing points at a
//! transaction that is gone. Everything here is under the tracker's one
//! leaf lock; waiting happens in `track.rs`.

use super::track::Entries;
use crate::faults::{self, Fault};
use crate::hash::{NumberMap, NumberSet};
use smallvec::{SmallVec, smallvec};

/// A scope key: a directory's inode number (or a file's own).
pub(crate) type Key = u32;
pub(crate) type TxnId = u64;
/// The one key of `-o fast_commit=global`.
pub(crate) const GLOBAL_KEY: Key = 0;
/// Bound on remembered homes (a hint: past it new files are their own
/// scope until they change in a directory).
const MAX_HOMES: usize = 1 << 20;

/// Where a logical transaction is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    Running,
    /// Taken by a committer: its handles drain (`drained` false), then its
    /// inodes are read. `conflict`: another transaction's handle changed
    /// one of them meanwhile.
    Building {
        drained: bool,
        conflict: bool,
    },
    /// Records built; waiting for its turn in the queue.
    Frozen,
    /// In the journal's fast-commit queue under this number.
    Queued(u64),
}

pub(crate) struct Txn {
    pub entries: Entries,
    /// Handles bound to it and not stopped.
    pub updates: u32,
    pub phase: Phase,
    /// A key of the set it belongs to.
    key: Key,
    /// After it was taken: the inodes it holds (their owner).
    taken_inodes: SmallVec<[u32; 4]>,
}

/// A set's keys and transactions are few (a directory, a transaction
/// building, one frozen): in place, so that a directory's first operation
/// and each commit allocate nothing here.
struct SetState {
    members: SmallVec<[Key; 2]>,
    running: TxnId,
    /// Taken and not frozen yet.
    building: SmallVec<[TxnId; 2]>,
    /// Frozen, not queued yet, in the order they froze.
    unqueued: SmallVec<[TxnId; 2]>,
    /// The largest queue number of its commits (0: none).
    last_queued: u64,
}

/// Counters of conflicts (`jext4 stats`).
#[derive(Debug, Default, Clone, Copy)]
pub struct ConflictStats {
    /// Sets united by an operation (running→running).
    pub coalesced: u64,
    /// Changes to an inode of a transaction being built by another
    /// transaction's handle (running→committing, waited for by a retry).
    pub waited: u64,
    /// Changes to an inode of a frozen transaction (running→committing,
    /// shadowed: the records are a snapshot).
    pub shadowed: u64,
}

pub(crate) struct Scopes {
    global: bool,
    /// Non-root key → its parent in the union-find.
    parent: NumberMap<Key, Key>,
    /// Root key → the set.
    sets: NumberMap<Key, SetState>,
    txns: NumberMap<TxnId, Txn>,
    next_txn: TxnId,
    /// Inode → the transaction holding its pending changes.
    owner: NumberMap<u32, TxnId>,
    /// Handle → the transaction it is bound to.
    bound: NumberMap<u64, TxnId>,
    /// Inode → the directory it was first created, linked or looked up in.
    homes: NumberMap<u32, Key>,
    /// The largest queue number known durable.
    durable_seq: u64,
    pub conflicts: ConflictStats,
}

impl Scopes {
    pub fn new(global: bool) -> Self {
        Scopes {
            global,
            parent: NumberMap::default(),
            sets: NumberMap::default(),
            txns: NumberMap::default(),
            next_txn: 1,
            owner: NumberMap::default(),
            bound: NumberMap::default(),
            homes: NumberMap::default(),
            durable_seq: 0,
            conflicts: ConflictStats::default(),
        }
    }

    fn key(&self, key: Key) -> Key {
        if self.global { GLOBAL_KEY } else { key }
    }

    pub fn txn(&self, id: TxnId) -> &Txn {
        &self.txns[&id]
    }

    pub fn txn_mut(&mut self, id: TxnId) -> &mut Txn {
        self.txns.get_mut(&id).expect("a live transaction")
    }

    /// The root of `key`'s set, made a set of its own if it has none.
    fn find(&mut self, key: Key) -> Key {
        let key = self.key(key);
        let mut root = key;
        // Bounded by the number of keys.
        while let Some(&up) = self.parent.get(&root) {
            root = up;
        }
        if root == key && !self.sets.contains_key(&key) {
            let running = self.new_txn(key);
            self.sets.insert(
                key,
                SetState {
                    members: smallvec![key],
                    running,
                    building: SmallVec::new(),
                    unqueued: SmallVec::new(),
                    last_queued: 0,
                },
            );
        }
        // Path compression: every key on the way points at the root.
        let mut at = key;
        while let Some(&up) = self.parent.get(&at) {
            if up != root {
                self.parent.insert(at, root);
            }
            at = up;
        }
        root
    }

    fn new_txn(&mut self, key: Key) -> TxnId {
        let id = self.next_txn;
        self.next_txn += 1;
        self.txns.insert(
            id,
            Txn {
                entries: Entries::default(),
                updates: 0,
                phase: Phase::Running,
                key,
                taken_inodes: SmallVec::new(),
            },
        );
        id
    }

    /// The set of the transaction `id`.
    fn root_of(&mut self, id: TxnId) -> Key {
        let key = self.txns[&id].key;
        self.find(key)
    }

    /// Unite the sets rooted at `a` and `b`; returns the new root.
    fn union(&mut self, a: Key, b: Key) -> Key {
        if a == b {
            return a;
        }
        self.conflicts.coalesced += 1;
        let absorbed = self.sets.remove(&b).expect("a root");
        self.parent.insert(b, a);
        let into = self.sets[&a].running;
        self.merge_txn(into, absorbed.running, false);
        let set = self.sets.get_mut(&a).expect("a root");
        set.members.extend(absorbed.members);
        set.building.extend(absorbed.building);
        set.unqueued.extend(absorbed.unqueued);
        set.last_queued = set.last_queued.max(absorbed.last_queued);
        a
    }

    /// Move transaction `from`'s entries, handles and inodes into `into`
    /// (`before`: its entries go first, as an earlier transaction's) and
    /// drop it.
    fn merge_txn(&mut self, into: TxnId, from: TxnId, before: bool) {
        debug_assert_ne!(into, from);
        let from_txn = self.txns.remove(&from).expect("a live transaction");
        let mut inodes: Vec<u32> = from_txn.entries.inode_numbers().collect();
        inodes.extend(from_txn.taken_inodes);
        for ino in inodes {
            if self.owner.get(&ino) == Some(&from) {
                self.owner.insert(ino, into);
            }
        }
        for bound in self.bound.values_mut() {
            if *bound == from {
                *bound = into;
            }
        }
        let target = self.txns.get_mut(&into).expect("a live transaction");
        target.updates += from_txn.updates;
        if before {
            let later = std::mem::take(&mut target.entries);
            target.entries = from_txn.entries;
            target.entries.append(later);
        } else {
            target.entries.append(from_txn.entries);
        }
    }

    /// The transaction of the running set that `handle`'s change touching
    /// `ino` (its inode, or a name of it) and names in directories `dirs`
    /// goes to: the sets involved are united, the handle bound.
    pub fn route(&mut self, handle: u64, ino: Option<u32>, dirs: &[Key]) -> TxnId {
        if faults::active(Fault::DirCommitSplitsCoalesced)
            && let Some(&dir) = dirs.first()
        {
            // Broken on purpose: the name change goes to its directory's
            // transaction alone, whatever else the operation touched.
            let root = self.find(dir);
            return self.sets[&root].running;
        }
        let own = self.bound.get(&handle).copied();
        if let Some(own) = own
            && dirs.is_empty()
            && ino.is_none_or(|ino| self.owner_of(ino).is_none_or(|owner| owner == own))
        {
            // The common case (an operation's second and later changes to
            // its own inodes): nothing to unite, the handle stays where it
            // is bound, building or running — what the general path below
            // gives, without finding its set.
            debug_assert!(self.txns.contains_key(&own), "bound to a transaction gone");
            return own;
        }
        // Its own set, each directory's, the inode's owner: four at most
        // for a rename, on the stack (every operation routes).
        let mut roots: SmallVec<[Key; 4]> = SmallVec::new();
        if let Some(own) = own {
            roots.push(self.root_of(own));
        }
        for &dir in dirs {
            roots.push(self.find(dir));
        }
        if let Some(ino) = ino
            && let Some(owner) = self.owner_of(ino)
            && Some(owner) != own
        {
            self.touch_foreign(owner);
            roots.push(self.root_of(owner));
            if let Some(own) = own
                && owner > own
                && matches!(self.txns[&own].phase, Phase::Building { .. })
            {
                // A handle of a transaction being built changes an inode
                // another (newer) transaction of its set holds changes to:
                // the build would read them. Build again, with both.
                self.mark_conflict(own);
            }
        }
        if roots.is_empty() {
            let key = self.home_key(ino.unwrap_or(GLOBAL_KEY));
            roots.push(self.find(key));
        }
        let own_building = own.filter(|&id| matches!(self.txns[&id].phase, Phase::Building { .. }));
        if let Some(own) = own_building
            && roots.iter().any(|&root| root != roots[0])
        {
            // Its set grows into another's while it drains: build again.
            self.mark_conflict(own);
        }
        let mut root = roots[0];
        for other in roots[1..].iter().copied() {
            let other = self.find(other);
            root = self.find(root);
            root = self.union(root, other);
        }
        if let Some(own) = own_building {
            return own;
        }
        let running = self.sets[&root].running;
        match self.bound.get(&handle) {
            Some(&bound) => debug_assert_eq!(bound, running, "bound to its set's running"),
            None => self.bind(handle, running),
        }
        running
    }

    /// A handle of another transaction changes an inode of `owner`.
    fn touch_foreign(&mut self, owner: TxnId) {
        match self.txns[&owner].phase {
            Phase::Building { .. } => {
                self.conflicts.waited += 1;
                self.mark_conflict(owner);
            }
            Phase::Frozen | Phase::Queued(_) => self.conflicts.shadowed += 1,
            Phase::Running => {}
        }
    }

    fn mark_conflict(&mut self, id: TxnId) {
        if let Phase::Building { conflict, .. } = &mut self.txn_mut(id).phase {
            *conflict = true;
        }
    }

    fn bind(&mut self, handle: u64, txn: TxnId) {
        debug_assert!(!self.bound.contains_key(&handle));
        self.bound.insert(handle, txn);
        self.txn_mut(txn).updates += 1;
    }

    /// The transaction `handle` is bound to.
    pub fn bound_txn(&self, handle: u64) -> Option<&Txn> {
        self.bound.get(&handle).map(|id| &self.txns[id])
    }

    /// Whether `handle` is bound to a transaction.
    pub fn is_bound(&self, handle: u64) -> bool {
        self.bound.contains_key(&handle)
    }

    /// Unite the sets of `keys` and return the root, for a handle about to
    /// enter it.
    pub fn unite(&mut self, keys: &[Key]) -> Key {
        let mut root = self.find(keys.first().copied().unwrap_or(GLOBAL_KEY));
        if faults::active(Fault::DirCommitSplitsCoalesced) {
            return root; // broken on purpose: see `route`
        }
        for &key in keys.iter().skip(1) {
            let other = self.find(key);
            root = self.find(root);
            root = self.union(root, other);
        }
        root
    }

    /// Whether the set rooted at `root` has a transaction being built.
    pub fn building(&self, root: Key) -> bool {
        !self.sets[&root].building.is_empty()
    }

    /// Bind `handle` to the running transaction of the set rooted at `root`.
    pub fn enter(&mut self, handle: u64, root: Key) {
        let running = self.sets[&root].running;
        self.bind(handle, running);
    }

    /// `handle` stopped: it leaves its transaction. Returns whether that
    /// transaction has no handle left.
    pub fn leave(&mut self, handle: u64) -> bool {
        let Some(id) = self.bound.remove(&handle) else {
            return false;
        };
        let txn = self.txn_mut(id);
        debug_assert!(txn.updates > 0);
        txn.updates -= 1;
        txn.updates == 0
    }

    /// The key an inode's changes are committed under: the set holding its
    /// pending changes, else its directory's (a directory: its own).
    pub fn key_of(&mut self, ino: u32, is_dir: bool) -> Key {
        if let Some(owner) = self.owner_of(ino) {
            return self.root_of(owner);
        }
        if is_dir {
            return self.find(ino);
        }
        let key = self.home_key(ino);
        self.find(key)
    }

    fn home_key(&self, ino: u32) -> Key {
        self.key(self.homes.get(&ino).copied().unwrap_or(ino))
    }

    /// `ino` was named in `dir`: its home unless it has one.
    pub fn learn_home(&mut self, ino: u32, dir: Key) {
        if self.homes.len() < MAX_HOMES || self.homes.contains_key(&ino) {
            self.homes.entry(ino).or_insert(dir);
        }
    }

    /// Record that `txn` now holds `ino`'s pending changes.
    pub fn own(&mut self, ino: u32, txn: TxnId) {
        self.owner.insert(ino, txn);
    }

    // -----------------------------------------------------------------
    // Commit: lock-down, freeze, queue, durability.

    /// Take the running transaction of `key`'s set for commit: `Ok(Some)`
    /// the transaction now building; `Ok(None)` nothing is running (the
    /// set's last queue number tells what to wait for); `Err(())` another
    /// handle is building or its frozen ones are not queued yet: wait.
    pub fn take(&mut self, key: Key) -> std::result::Result<Option<TxnId>, ()> {
        let root = self.find(key);
        let set = &self.sets[&root];
        if !set.building.is_empty() {
            return Err(());
        }
        let running = set.running;
        if self.txns[&running].entries.is_empty() {
            return if set.unqueued.is_empty() {
                Ok(None)
            } else {
                Err(())
            };
        }
        let fresh = self.new_txn(root);
        let set = self.sets.get_mut(&root).expect("a root");
        set.running = fresh;
        set.building.push(running);
        let txn = self.txn_mut(running);
        txn.phase = Phase::Building {
            drained: false,
            conflict: false,
        };
        Ok(Some(running))
    }

    /// The queue number the set of `key` last used, if any since the last
    /// full commit. (Not compared with the numbers known durable: a later
    /// number durable says nothing of a refused earlier one.)
    pub fn last_queued(&mut self, key: Key) -> Option<u64> {
        let root = self.find(key);
        let last = self.sets[&root].last_queued;
        (last > 0).then_some(last)
    }

    /// The transaction's handles have drained: take its entries to build
    /// its records from.
    pub fn drained(&mut self, id: TxnId) -> Entries {
        let txn = self.txn_mut(id);
        debug_assert_eq!(txn.updates, 0);
        txn.phase = Phase::Building {
            drained: true,
            conflict: false,
        };
        let entries = std::mem::take(&mut txn.entries);
        txn.taken_inodes = entries.inode_numbers().collect();
        entries
    }

    /// The records of `id` are built from `entries`: freeze it, unless a
    /// conflict came meanwhile — then its entries go back into the running
    /// transaction, ahead of what came since, and false is returned.
    pub fn freeze(&mut self, id: TxnId, entries: Entries) -> bool {
        let conflict = matches!(self.txns[&id].phase, Phase::Building { conflict: true, .. });
        if conflict {
            self.put_back(id, entries);
            return false;
        }
        let root = self.root_of(id);
        let set = self.sets.get_mut(&root).expect("a root");
        set.building.retain(|building| *building != id);
        set.unqueued.push(id);
        self.txn_mut(id).phase = Phase::Frozen;
        true
    }

    /// Give transaction `id` (taken, whatever its phase) back to its set's
    /// running transaction with `entries`, ahead of what came since (a
    /// conflict, an error, a fallback to a full commit).
    pub fn put_back(&mut self, id: TxnId, entries: Entries) {
        let root = self.root_of(id);
        let set = self.sets.get_mut(&root).expect("a root");
        set.building.retain(|other| *other != id);
        set.unqueued.retain(|other| *other != id);
        let running = set.running;
        self.txn_mut(id).entries = entries;
        self.merge_txn(running, id, true);
    }

    /// Whether `id` is the first frozen transaction of its set: queued
    /// before any later one of the set (it may depend on it).
    pub fn is_turn(&mut self, id: TxnId) -> bool {
        let root = self.root_of(id);
        self.sets[&root].unqueued.first() == Some(&id)
    }

    /// `id` is in the journal's queue as `seq`.
    pub fn queued(&mut self, id: TxnId, seq: u64) {
        let root = self.root_of(id);
        let set = self.sets.get_mut(&root).expect("a root");
        debug_assert_eq!(set.unqueued.first(), Some(&id));
        set.unqueued.retain(|other| *other != id);
        set.last_queued = set.last_queued.max(seq);
        self.txn_mut(id).phase = Phase::Queued(seq);
    }

    /// `id`, queued, is durable (or will never be written: a full commit
    /// covers it): it goes, and so does the set if nothing is left in it.
    /// Returns the inodes it held.
    pub fn retire(&mut self, id: TxnId, durable: Option<u64>) -> SmallVec<[u32; 4]> {
        if let Some(seq) = durable {
            self.durable_seq = self.durable_seq.max(seq);
        }
        let root = self.root_of(id);
        let set = self.sets.get_mut(&root).expect("a root");
        set.unqueued.retain(|other| *other != id);
        set.building.retain(|other| *other != id);
        let txn = self.txns.remove(&id).expect("a live transaction");
        for &ino in &txn.taken_inodes {
            if self.owner.get(&ino) == Some(&id) {
                // A handle bound to this transaction while it was built may
                // have moved the inode here from a newer one of the set
                // that holds changes to it too: that one owns it now.
                match self.newer_holder(root, ino) {
                    Some(newer) => self.owner.insert(ino, newer),
                    None => self.owner.remove(&ino),
                };
            }
        }
        self.dissolve_if_idle(root);
        txn.taken_inodes
    }

    /// The newest live transaction of the set `root` whose entries hold
    /// changes to `ino`.
    fn newer_holder(&self, root: Key, ino: u32) -> Option<TxnId> {
        let set = &self.sets[&root];
        std::iter::once(set.running)
            .chain(set.building.iter().copied())
            .chain(set.unqueued.iter().copied())
            .filter(|id| {
                // A taken transaction's entries moved out when it drained:
                // what it holds is its `taken_inodes`.
                self.txns.get(id).is_some_and(|txn| {
                    txn.entries.inodes.contains_key(&ino) || txn.taken_inodes.contains(&ino)
                })
            })
            .max()
    }

    /// A set with nothing running, taken or bound falls apart into its
    /// keys (they share nothing any more); an idle key's set is dropped.
    fn dissolve_if_idle(&mut self, root: Key) {
        let set = &self.sets[&root];
        let running = &self.txns[&set.running];
        let idle = running.entries.is_empty()
            && running.updates == 0
            && set.building.is_empty()
            && set.unqueued.is_empty()
            // Durable (a refused commit refuses every later one: a number
            // known durable comes after none refused).
            && set.last_queued <= self.durable_seq;
        if !idle {
            return;
        }
        let set = self.sets.remove(&root).expect("a root");
        self.txns.remove(&set.running);
        for member in set.members {
            self.parent.remove(&member);
        }
    }

    /// Full commit of `tid`: every transaction's changes of `tid` or
    /// before are in the log; drop them, and the sets left idle.
    pub fn committed(&mut self, tid: u32) {
        debug_assert!(
            self.txns.values().all(|txn| txn.phase == Phase::Running),
            "a full commit while a directory transaction is taken"
        );
        self.retain_after(tid);
        // Every fast commit queued before is durable or covered by this
        // full commit (none is under way across one).
        for set in self.sets.values_mut() {
            set.last_queued = 0;
        }
        let roots: Vec<Key> = self.sets.keys().copied().collect();
        for root in roots {
            self.dissolve_if_idle(root);
        }
    }

    /// Drop every transaction's changes of `tid` or before (a full commit
    /// holds them, or will: ineligibility) and the owners left pointing at
    /// nothing.
    pub fn retain_after(&mut self, tid: u32) {
        for txn in self.txns.values_mut() {
            txn.entries.retain_after(tid);
        }
        let held: NumberSet<(u32, TxnId)> = self
            .txns
            .iter()
            .flat_map(|(&id, txn)| {
                txn.entries
                    .inode_numbers()
                    .chain(txn.taken_inodes.iter().copied())
                    .map(move |ino| (ino, id))
            })
            .collect();
        self.owner.retain(|&ino, &mut id| held.contains(&(ino, id)));
    }

    /// The transaction holding `ino`'s pending changes, if any.
    fn owner_of(&mut self, ino: u32) -> Option<TxnId> {
        let id = *self.owner.get(&ino)?;
        if self.txns.contains_key(&id) {
            return Some(id);
        }
        self.owner.remove(&ino);
        None
    }

    /// `ino` went back to the free pool: its number may name a new file
    /// elsewhere.
    pub fn forget_home(&mut self, ino: u32) {
        self.homes.remove(&ino);
    }

    /// Transactions alive (running, taken) and sets: for tests and bounds.
    #[cfg(test)]
    pub fn sizes(&self) -> (usize, usize) {
        (self.txns.len(), self.sets.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fs::fast_commit::track::PendingInode;

    #[test]
    fn keys_unite_and_dissolve_when_idle() {
        let mut scopes = Scopes::new(false);
        let a = scopes.find(10);
        let b = scopes.find(20);
        assert_ne!(a, b);
        let root = scopes.unite(&[10, 20]);
        assert_eq!(scopes.find(10), root);
        assert_eq!(scopes.find(20), root);
        assert_eq!(scopes.conflicts.coalesced, 1);
        scopes.dissolve_if_idle(root);
        assert_ne!(scopes.find(10), scopes.find(20), "idle: apart again");
    }

    /// Directory 10's transaction, taken for commit (building), holding
    /// inode 5, changed through handle 1 (still bound to it).
    fn taken_holding_inode_5() -> (Scopes, TxnId) {
        let mut scopes = Scopes::new(false);
        let older = scopes.route(1, Some(5), &[10]);
        scopes.own(5, older);
        scopes
            .txn_mut(older)
            .entries
            .inodes
            .insert(5, PendingInode::default());
        assert_eq!(scopes.take(10), Ok(Some(older)));
        (scopes, older)
    }

    /// A handle bound to a transaction being built changes an inode a newer
    /// transaction of the set holds too: when the older one retires, the
    /// newer one keeps it (another directory touching it then unites with
    /// that set), instead of the inode looking unowned.
    #[test]
    fn an_inode_a_newer_transaction_holds_stays_owned() {
        let (mut scopes, older) = taken_holding_inode_5();
        let root = scopes.find(10);
        let newer = scopes.sets[&root].running;
        assert!(newer > older);
        scopes.own(5, newer);
        scopes
            .txn_mut(newer)
            .entries
            .inodes
            .insert(5, PendingInode::default());
        // The handle still bound to the older one changes inode 5 again.
        scopes.own(5, older);
        scopes.txn_mut(older).taken_inodes.push(5);
        scopes.leave(1);
        scopes.retire(older, None);
        assert_eq!(scopes.owner_of(5), Some(newer));
        assert_eq!(scopes.key_of(5, false), scopes.find(10));
    }

    /// A handle still bound to a transaction being built changes an inode
    /// the set's newer running transaction holds: the build must start
    /// over (it would read the newer changes).
    #[test]
    fn a_building_handle_touching_a_newer_transactions_inode_is_a_conflict() {
        let (mut scopes, older) = taken_holding_inode_5();
        let newer = scopes.route(2, Some(6), &[10]);
        assert!(newer > older);
        scopes.own(6, newer);
        scopes.route(1, Some(6), &[]);
        assert!(matches!(
            scopes.txns[&older].phase,
            Phase::Building { conflict: true, .. }
        ));
    }

    #[test]
    fn global_scope_has_one_set() {
        let mut scopes = Scopes::new(true);
        assert_eq!(scopes.find(10), scopes.find(20));
        assert_eq!(scopes.conflicts.coalesced, 0);
    }
}
