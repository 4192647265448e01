//! Writing fast commits: fsync's fast path (the kernel's `ext4_fc_commit`),
//! one directory transaction at a time (DESIGN §2, tier 3).
//!
//! An fsync whose inode changed in the running JBD2 transaction, when
//! nothing ineligible happened since the last full commit, commits the
//! directory transaction holding the inode's changes (`scope.rs`) instead
//! of the JBD2 transaction:
//! 1. `Journal::begin_fast_commit` waits for a full commit under way (the
//!    transaction before must be durable, or replay would never reach the
//!    records) and hands out a ticket that keeps the next one from locking
//!    down meanwhile; many directories hold tickets at once;
//! 2. the directory's running transaction is taken (`Tracker::lock_down`;
//!    an earlier commit of the same directory still being built is waited
//!    for), the handles inside it drain — new operations in that directory
//!    wait at their start, no other directory's do — and its records are
//!    built from the inodes as stored, each read under its inode lock: a
//!    consistent cut of that directory. An inode another directory's
//!    operation changed meanwhile makes the build start over (a conflict);
//!    records built are frozen: later changes go to the next transaction;
//! 3. the data its inodes wrote in place, when more than a few blocks, is
//!    written back (`write_back`: this directory's, not another's stream;
//!    a few blocks go with the group's barrier), it waits for its turn behind
//!    earlier commits of the same directory, and is queued; the journal
//!    writes everything queued as one fast commit — HEAD, records, TAIL —
//!    with barriers over the queued commits' data and records
//!    (`journal::fc_commit`: concurrent directories share one write and
//!    its flushes), and acknowledges in queue order.
//!
//! Records, in the kernel's order: HEAD (first after a full commit); the
//! name changes in the order they were made, a CREAT preceded by its
//! inode's INODE and range records; then, per changed inode, its ranges
//! (ADD_RANGE for what is mapped now, DEL_RANGE for holes) and its INODE
//! record; TAIL. Directories get no INODE record but the one before their
//! CREAT, and no ranges: replay rebuilds them from their names.
//!
//! Anything that goes wrong before the TAIL is written makes the
//! transaction ineligible and the fsync commits it in full: the changes
//! taken are in that transaction, so the full commit covers them.

use super::data::DataMark;
use super::scope::TxnId;
use super::track::{DentryOp, Entries, Freeze, LockDown, PendingInode, Tracker};
use crate::error::Result;
use crate::faults::{self, Fault};
use crate::format::fast_commit::{Dentry, Record, max_range_len};
use crate::format::inode::Inode;
use crate::format::mapping::{Extent, Lookup};
use crate::format::superblock::GOOD_OLD_INODE_SIZE;
use crate::fs::inode::{inode_location, read_inode};
use crate::fs::{Core, Fs};
use crate::journal::change::Ineligible;
use crate::journal::{FastCommitBegin, FastCommitOutcome, FastCommitTicket};
use crate::lock::Rank;
use smallvec::SmallVec;

/// ext4's logical block numbers are 32 bits: `EXT_MAX_BLOCKS`.
const MAX_LOGICAL_BLOCKS: u64 = u32::MAX as u64;

/// Data a directory commit writes back before it queues, rather than
/// in the group's barrier (bytes).
const WRITE_BACK_ALONE: u64 = 128 << 10;

/// Builds of one directory's commit tried before an fsync gives up on
/// conflicts and commits in full.
const MAX_BUILD_ATTEMPTS: usize = 4;

/// How an fsync's changes became durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Durable through a fast commit, or a full commit that finished
    /// meanwhile. `data`: the inode's data written in place is durable
    /// too (its ranges were in the barrier, or a flush came after the call
    /// began); else the caller makes it so.
    Durable { data: bool },
    /// A full commit is needed.
    FullCommit,
}

/// One directory transaction's records (HEAD and TAIL are the journal's).
struct Built {
    records: Vec<Record>,
    /// The records expose data written since the last flush.
    data_first: bool,
    /// A record the kernel would replay wrongly: commit in full instead.
    ineligible: Option<Ineligible>,
}

/// What committing one taken transaction came to.
enum Committed {
    /// `data`: the fsynced inode's data was in the barrier.
    Durable {
        data: bool,
    },
    /// Built while another directory's operation changed one of its
    /// inodes: given back, try again.
    Conflict,
    FullCommit,
}

impl Fs {
    /// fsync(2) of directory `ino` (FUSE's FSYNCDIR): the names created,
    /// linked, removed and renamed in it, and the changes its transaction
    /// holds of the inodes it names (their data included), are durable on
    /// return — the kernel's `ext4_sync_file` on a directory, which fast
    /// commits it. Its transaction is committed whatever the directory's
    /// own inode last changed in: a file written in it changes the
    /// transaction, not the directory. Where fast commits are not written
    /// (no `fast_commit` feature, `-o fast_commit=off`, no journal) or the
    /// changes are not eligible, everything is committed, as `sync` does.
    pub fn fsync_dir(&self, ino: u32) -> Result<()> {
        self.check_device_healthy()?;
        let tracker = match &self.core.fast_commit {
            Some(tracker) if self.core.journal.is_journaled() => tracker,
            _ => return self.sync(),
        };
        // Every transaction before the running one is durable once a fast
        // commit may start (`begin_fast_commit` waits for it).
        let tid = self.core.journal.running_tid();
        match self.note_error(self.fast_commit(tracker, ino, true, tid))? {
            Outcome::Durable { data: true } => Ok(()),
            // Made durable by an earlier commit or a full one: the data
            // its inodes wrote in place since may still need a barrier.
            Outcome::Durable { data: false } => self.note_error(self.core.journal.flush_data()),
            Outcome::FullCommit => {
                if self.note_error(self.core.journal.commit_and_wait(tid))? {
                    return Ok(()); // the commit's final flush covered the data
                }
                self.note_error(self.core.journal.flush_data())
            }
        }
    }

    /// Make transaction `tid` (the newest to change inode `ino`, being
    /// synced) durable with a fast commit of `ino`'s directory transaction
    /// if it can be done.
    pub(crate) fn fast_commit(
        &self,
        tracker: &Tracker,
        ino: u32,
        is_dir: bool,
        tid: u32,
    ) -> Result<Outcome> {
        if !tracker.eligible(tid) {
            tracker.count_fallback();
            return Ok(Outcome::FullCommit);
        }
        let ticket = match self.core.journal.begin_fast_commit(tid)? {
            FastCommitBegin::Durable { flushed } => return Ok(Outcome::Durable { data: flushed }),
            FastCommitBegin::Refused => {
                tracker.count_fallback();
                return Ok(Outcome::FullCommit);
            }
            FastCommitBegin::Started(ticket) => ticket,
        };
        let key = tracker.key_of(ino, is_dir);
        for _ in 0..MAX_BUILD_ATTEMPTS {
            let committed = match tracker.lock_down(key) {
                LockDown::Nothing { after } => self.wait_earlier(tracker, &ticket, after)?,
                LockDown::Commit(txn) => self.commit_txn(tracker, &ticket, txn, ino, is_dir)?,
            };
            match committed {
                Committed::Durable { data } => return Ok(Outcome::Durable { data }),
                Committed::Conflict => continue,
                Committed::FullCommit => {
                    tracker.count_fallback();
                    return Ok(Outcome::FullCommit);
                }
            }
        }
        tracker.count_fallback();
        Ok(Outcome::FullCommit)
    }

    /// Nothing runs in the directory: an earlier commit of it (numbered
    /// `after`, if not durable yet) holds the fsync's changes.
    fn wait_earlier(
        &self,
        tracker: &Tracker,
        ticket: &FastCommitTicket<'_>,
        after: Option<u64>,
    ) -> Result<Committed> {
        if let Some(seq) = after
            && ticket.wait(seq)? == FastCommitOutcome::NoRoom
        {
            return Ok(Committed::FullCommit);
        }
        if !tracker.eligible(ticket.tid) {
            // The changes may have been dropped for the full commit to
            // hold them.
            return Ok(Committed::FullCommit);
        }
        Ok(Committed::Durable { data: false })
    }

    /// Commit the taken transaction `txn`: drain, build, freeze, write
    /// back its data, queue, wait. `ino` is the inode being synced (its
    /// data goes in the barrier whether or not `txn` holds it), `is_dir`
    /// whether it is a directory.
    fn commit_txn(
        &self,
        tracker: &Tracker,
        ticket: &FastCommitTicket<'_>,
        txn: TxnId,
        ino: u32,
        is_dir: bool,
    ) -> Result<Committed> {
        let unwind = GiveBackOnUnwind {
            tracker,
            txn,
            tid: ticket.tid,
            queued: std::cell::Cell::new(false),
        };
        let entries = tracker.drain(txn);
        faults::panic_point(faults::PanicPoint::FastCommitBuild);
        // Broken on purpose: a directory fsync's last name change is lost.
        let drop_last_dentry = is_dir && faults::active(Fault::DirSyncDropsDentry);
        let built = match build(&self.core, &entries, drop_last_dentry) {
            Ok(built) => built,
            Err(error) => {
                tracker.put_back(txn, entries);
                tracker.mark_ineligible(ticket.tid, Ineligible::Failed);
                return Err(error);
            }
        };
        if let Some(reason) = built.ineligible {
            tracker.put_back(txn, entries);
            tracker.mark_ineligible(ticket.tid, reason);
            return Ok(Committed::FullCommit);
        }
        let mut inodes: SmallVec<[u32; 4]> = entries.inodes.keys().copied().collect();
        inodes.push(ino);
        match tracker.freeze(txn, entries, ticket.tid) {
            Freeze::Frozen => {}
            Freeze::Conflict => return Ok(Committed::Conflict),
            Freeze::Ineligible => return Ok(Committed::FullCommit),
        }
        let queued = self.write_back_and_queue(tracker, ticket, txn, built, &inodes);
        let (seq, data_mark) = match queued {
            Ok(Some(queued)) => {
                unwind.queued.set(true);
                queued
            }
            Ok(None) => {
                tracker.retire(txn, None);
                return Ok(Committed::FullCommit);
            }
            Err(error) => {
                tracker.mark_ineligible(ticket.tid, Ineligible::Failed);
                tracker.put_back(txn, Entries::default());
                return Err(error);
            }
        };
        match ticket.wait(seq) {
            Ok(FastCommitOutcome::Durable) => {
                if let Some(mark) = &data_mark {
                    tracker.forget_durable_data(mark);
                }
                tracker.retire(txn, Some(seq));
                tracker.count_commit();
                Ok(Committed::Durable { data: true })
            }
            // Ineligible first: nobody may take the retired transaction's
            // changes for durable meanwhile.
            Ok(FastCommitOutcome::NoRoom) => {
                tracker.mark_ineligible(ticket.tid, Ineligible::AreaFull);
                tracker.retire(txn, None);
                Ok(Committed::FullCommit)
            }
            Err(error) => {
                tracker.mark_ineligible(ticket.tid, Ineligible::Failed);
                tracker.retire(txn, None);
                Err(error)
            }
        }
    }

    /// Write back the data of `inodes` (this directory's: the slow part
    /// when it streamed, paid before the queue), wait for the turn of the
    /// frozen `txn` in its set, and queue its records. Returns the queue
    /// number and the mark of the data writes its barrier covers, or
    /// `None` when an earlier commit of the set failed and went back
    /// unwritten: then only a full commit may carry `txn`.
    fn write_back_and_queue(
        &self,
        tracker: &Tracker,
        ticket: &FastCommitTicket<'_>,
        txn: TxnId,
        built: Built,
        inodes: &[u32],
    ) -> Result<Option<(u64, Option<DataMark>)>> {
        let mut data_mark = None;
        let ranges = match tracker.data_ranges_marked(inodes) {
            // Broken on purpose: the data is neither written back nor in
            // the barrier.
            Some(_) if faults::active(Fault::DirCommitSkipsData) => Vec::new(),
            Some((ranges, mark)) => {
                data_mark = Some(mark);
                // A stream's data is written back here, before the queue,
                // so that the group it joins does not wait for it; a few
                // blocks go with the group's barrier, which writes every
                // member's at once — queued sooner, the fsync meets more
                // others in its group.
                let bytes: u64 = ranges.iter().map(|&(_, len)| len).sum();
                if bytes > WRITE_BACK_ALONE {
                    self.core.dev().write_back(&ranges)?;
                }
                ranges
            }
            None => {
                // More pieces than remembered: everything, the slow way.
                self.core.journal.flush_data()?;
                Vec::new()
            }
        };
        // Our turn comes when every earlier commit of the set is queued —
        // or failed (its write-back) and was put back after marking the
        // transaction ineligible: our records may build on its changes (a
        // name it created, now renamed), so they must not go out alone.
        if !tracker.wait_turn(txn, ticket.tid) {
            return Ok(None);
        }
        let seq = ticket.enqueue(built.records, built.data_first, ranges);
        tracker.queued(txn, seq);
        Ok(Some((seq, data_mark)))
    }
}

/// A directory commit between taking its transaction and retiring it: if
/// it unwinds (a panic, a bug), the transaction is given back — put back
/// into the running one, or retired if queued — and marked ineligible, so
/// that the directory's operations, which wait while a transaction is
/// being built, and the commits behind it in the set, do not wait forever
/// (the front end turns the panic into an aborted journal and EIO).
struct GiveBackOnUnwind<'a> {
    tracker: &'a Tracker,
    txn: TxnId,
    tid: u32,
    queued: std::cell::Cell<bool>,
}

impl Drop for GiveBackOnUnwind<'_> {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        self.tracker.mark_ineligible(self.tid, Ineligible::Failed);
        if self.queued.get() {
            self.tracker.retire(self.txn, None);
        } else {
            self.tracker.put_back(self.txn, Entries::default());
        }
    }
}

/// The records of `snapshot`, in the order replay needs them. Each inode
/// is read under its inode lock: whole, never half-way through a change.
/// `drop_last_dentry`: the fault `DirSyncDropsDentry`.
fn build(core: &Core, snapshot: &Entries, drop_last_dentry: bool) -> Result<Built> {
    // At least one record per name and per inode, plus one per range
    // changed: reserved at once rather than grown record by record.
    let records = snapshot.dentries.len()
        + (snapshot.inodes.values())
            .map(|pending| 1 + pending.ranges.len())
            .sum::<usize>();
    let mut writer = RecordWriter {
        core,
        records: Vec::with_capacity(records),
        data_first: false,
        ranges_written: SmallVec::new(),
        ineligible: None,
    };
    let kept =
        snapshot.dentries.len() - (drop_last_dentry && !snapshot.dentries.is_empty()) as usize;
    for dentry in &snapshot.dentries[..kept] {
        let record = Dentry {
            parent: dentry.parent,
            ino: dentry.ino,
            name: dentry.name.to_vec(),
        };
        match dentry.op {
            DentryOp::Create => writer.create(record, snapshot.inodes.get(&dentry.ino))?,
            DentryOp::Link => writer.records.push(Record::Link(record)),
            DentryOp::Unlink => writer.records.push(Record::Unlink(record)),
        }
    }
    writer.ranges_written.sort_unstable();
    for (&ino, pending) in &snapshot.inodes {
        writer.inode(ino, pending)?;
    }
    Ok(Built {
        records: writer.records,
        data_first: writer.data_first,
        ineligible: writer.ineligible,
    })
}

struct RecordWriter<'a> {
    core: &'a Core,
    records: Vec<Record>,
    data_first: bool,
    /// Inodes whose ranges went out with their CREAT (few in a commit: in
    /// place), sorted once the names are done, for the inodes' pass.
    ranges_written: SmallVec<[u32; 4]>,
    ineligible: Option<Ineligible>,
}

impl RecordWriter<'_> {
    /// A new inode's first name: its INODE record and ranges, then CREAT
    /// (replay builds the unnamed inode first, then names it).
    fn create(&mut self, dentry: Dentry, pending: Option<&PendingInode>) -> Result<()> {
        let _lock = self.core.inodes.read(dentry.ino, Rank::Inode);
        let inode = read_inode(self.core, dentry.ino)?;
        if inode.mode == 0 || inode.links_count == 0 {
            // Freed since (by an operation of the next transaction, whose
            // UNLINK will find no name), or its last name went while it is
            // open (an orphan): nothing to create. An INODE record without
            // links would make the kernel's replay of the CREAT fail (its
            // iget refuses an inode without links) and leave the inode
            // marked in use with no name.
            return Ok(());
        }
        self.inode_record(dentry.ino, &inode)?;
        if let Some(pending) = pending.filter(|_| !inode.is_dir()) {
            self.range_records(dentry.ino, &inode, pending)?;
            self.ranges_written.push(dentry.ino);
        }
        self.records.push(Record::Create(dentry));
        Ok(())
    }

    /// A changed inode: its ranges, then its INODE record. Directories and
    /// inodes without links (freed, or open orphans, which are ineligible)
    /// are left to their names.
    fn inode(&mut self, ino: u32, pending: &PendingInode) -> Result<()> {
        let _lock = self.core.inodes.read(ino, Rank::Inode);
        let inode = read_inode(self.core, ino)?;
        if inode.mode == 0 || inode.links_count == 0 || inode.is_dir() {
            return Ok(());
        }
        if self.ranges_written.binary_search(&ino).is_err() {
            self.range_records(ino, &inode, pending)?;
        }
        self.data_first |= pending.extended;
        self.inode_record(ino, &inode)
    }

    /// The inode as the inode table holds it now: the first 128 bytes plus
    /// `i_extra_isize` (ext4_fc_write_inode).
    fn inode_record(&mut self, ino: u32, inode: &Inode) -> Result<()> {
        if inode.file_acl != 0 {
            // The kernel's replay would recount i_blocks without it.
            self.ineligible = Some(Ineligible::XattrBlock);
        }
        let geo = &self.core.geo;
        let len = if geo.inode_size as usize > GOOD_OLD_INODE_SIZE as usize {
            GOOD_OLD_INODE_SIZE as usize + inode.extra_isize as usize
        } else {
            GOOD_OLD_INODE_SIZE as usize
        };
        debug_assert!(len <= geo.inode_size as usize);
        let (block, offset) = inode_location(geo, &self.core.groups, ino);
        let buffer = self.core.cache.read(block)?;
        let raw = buffer.read()[offset..offset + len].to_vec();
        self.records.push(Record::Inode { ino, raw });
        Ok(())
    }

    /// What the changed ranges map to now: ADD_RANGE for mapped runs (at
    /// most an extent's length each), DEL_RANGE for holes.
    fn range_records(&mut self, ino: u32, inode: &Inode, pending: &PendingInode) -> Result<()> {
        if faults::active(Fault::FastCommitDropRange) {
            return Ok(()); // broken on purpose: the mapping changes are lost
        }
        for &(start, end) in &pending.ranges {
            let end = end.min(MAX_LOGICAL_BLOCKS);
            let mut lblk = start;
            // Each step covers at least one block.
            while lblk < end {
                lblk = match self.core.lookup(ino, inode, lblk)? {
                    Lookup::Mapped(extent) => self.add_range(ino, &extent, end),
                    Lookup::Hole { next } => {
                        let hole_end = next.unwrap_or(end).min(end);
                        self.records.push(Record::DelRange {
                            ino,
                            lblk: lblk as u32,
                            len: (hole_end - lblk) as u32,
                        });
                        hole_end
                    }
                };
            }
        }
        Ok(())
    }

    /// ADD_RANGE records for `extent` up to logical block `end`; returns
    /// where they stop.
    fn add_range(&mut self, ino: u32, extent: &Extent, end: u64) -> u64 {
        let stop = extent.end().min(end);
        let max = max_range_len(extent.unwritten) as u64;
        let mut lblk = extent.logical;
        while lblk < stop {
            let len = (stop - lblk).min(max);
            self.records.push(Record::AddRange {
                ino,
                extent: Extent {
                    logical: lblk,
                    physical: extent.physical_of(lblk),
                    len: len as u32,
                    unwritten: extent.unwritten,
                },
            });
            lblk += len;
        }
        // Written blocks newly mapped hold data written since the last
        // flush: it goes first.
        self.data_first |= !extent.unwritten;
        stop
    }
}
