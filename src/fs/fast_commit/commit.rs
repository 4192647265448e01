//! Writing fast commits: fsync's fast path (the kernel's `ext4_fc_commit`).
//!
//! An fsync whose inode changed in the running transaction, when nothing
//! ineligible happened since the last full commit, writes one fast commit
//! instead of committing the transaction:
//! 1. `Journal::begin_fast_commit` waits for a full commit under way (the
//!    transaction before must be durable, or replay would never reach the
//!    records) and for another fast commit (which covers this fsync when
//!    it began after the fsync did: then nothing is left to write — the
//!    group commit of concurrent fsyncs);
//! 2. with the journal's updates locked (`FastCommitSlot::lock_updates`,
//!    the kernel's `jbd2_journal_lock_updates`: every handle has stopped,
//!    none starts, so no operation is half-way and none holds a lock)
//!    everything queued is taken (`Tracker::take`) and turned into records
//!    from the inodes as stored: a consistent cut, the "snapshot when the
//!    fast commit starts", with no filesystem lock; operations go on once
//!    the records are built (readers never stopped);
//! 3. the journal lays them out — HEAD, records, TAIL — after the earlier
//!    fast commits of the transaction, data first where they expose new
//!    data (see `journal::fc_commit` for the flushes, `journal::bytelog`
//!    for `-o bytelog`).
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

use super::track::{DentryOp, PendingInode, Snapshot, Tracker};
use crate::error::Result;
use crate::format::fast_commit::{Dentry, Record, max_range_len};
use crate::format::inode::Inode;
use crate::format::mapping::{self, Extent, Lookup};
use crate::format::superblock::GOOD_OLD_INODE_SIZE;
use crate::fs::inode::{inode_location, read_inode};
use crate::fs::{Core, Fs};
use crate::journal::FastCommitBegin;
use crate::journal::change::Ineligible;
use crate::journal::faults::{self, Fault};
use std::collections::HashSet;

/// ext4's logical block numbers are 32 bits: `EXT_MAX_BLOCKS`.
const MAX_LOGICAL_BLOCKS: u64 = u32::MAX as u64;

/// How an fsync's changes became durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Durable through a fast commit or a full commit that finished
    /// meanwhile; `flushed`: a device flush came after the call began.
    Durable { flushed: bool },
    /// A full commit is needed.
    FullCommit,
}

/// One fast commit's records (HEAD and TAIL are the journal's).
struct Built {
    records: Vec<Record>,
    /// The records expose data written since the last flush.
    data_first: bool,
    /// A record the kernel would replay wrongly: commit in full instead.
    ineligible: Option<Ineligible>,
}

impl Fs {
    /// Make transaction `tid` (the newest to change the inode being
    /// synced) durable with a fast commit if it can be done.
    pub(crate) fn fast_commit(&self, tracker: &Tracker, tid: u32) -> Result<Outcome> {
        // Read after this fsync's changes were made: a fast commit begun
        // later carries them.
        let seen = self.core.journal.fast_commit_sequence();
        if !tracker.eligible(tid) {
            tracker.count_fallback();
            return Ok(Outcome::FullCommit);
        }
        let mut slot = match self.core.journal.begin_fast_commit(tid, seen)? {
            FastCommitBegin::Durable { flushed } => return Ok(Outcome::Durable { flushed }),
            FastCommitBegin::Refused => {
                tracker.count_fallback();
                return Ok(Outcome::FullCommit);
            }
            FastCommitBegin::Started(slot) => slot,
        };
        let built = {
            let updates = slot.lock_updates();
            let Some(snapshot) = tracker.take(slot.tid) else {
                tracker.count_fallback();
                return Ok(Outcome::FullCommit);
            };
            if snapshot.is_empty() {
                // A fast commit that ended before this one could start took
                // this fsync's changes, from a cut made after they (and the
                // data written with them) were: its final flush covers
                // them. (Had it failed, the transaction would be
                // ineligible and `take` would have said so.) A ByteLog one
                // may have issued no flush: the data needs one.
                return Ok(Outcome::Durable {
                    flushed: slot.ends_with_flush(),
                });
            }
            let built = build(&self.core, &snapshot);
            drop(updates);
            built
        };
        let built = match built {
            Ok(Built {
                ineligible: Some(reason),
                ..
            }) => {
                tracker.mark_ineligible(slot.tid, reason);
                tracker.count_fallback();
                return Ok(Outcome::FullCommit);
            }
            Ok(built) => built,
            Err(error) => {
                tracker.mark_ineligible(slot.tid, Ineligible::Failed);
                return Err(error);
            }
        };
        match slot.write(&built.records, built.data_first) {
            Ok(Some(written)) => {
                tracker.count_commit(written.record_bytes as u64, written.flushes);
                // Without a flush (ByteLog, no new data mapped) the fsync
                // still flushes the data it may have written in place.
                Ok(Outcome::Durable {
                    flushed: written.flushes > 0,
                })
            }
            Ok(None) => {
                tracker.mark_ineligible(slot.tid, Ineligible::AreaFull);
                tracker.count_fallback();
                Ok(Outcome::FullCommit)
            }
            Err(error) => {
                tracker.mark_ineligible(slot.tid, Ineligible::Failed);
                Err(error)
            }
        }
    }
}

/// The records of `snapshot`, in the order replay needs them.
fn build(core: &Core, snapshot: &Snapshot) -> Result<Built> {
    let mut writer = RecordWriter {
        core,
        records: Vec::new(),
        data_first: false,
        ranges_written: HashSet::new(),
        ineligible: None,
    };
    for dentry in &snapshot.dentries {
        let record = Dentry {
            parent: dentry.parent,
            ino: dentry.ino,
            name: dentry.name.clone(),
        };
        match dentry.op {
            DentryOp::Create => writer.create(record, snapshot.inodes.get(&dentry.ino))?,
            DentryOp::Link => writer.records.push(Record::Link(record)),
            DentryOp::Unlink => writer.records.push(Record::Unlink(record)),
        }
    }
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
    /// Inodes whose ranges went out with their CREAT.
    ranges_written: HashSet<u32>,
    ineligible: Option<Ineligible>,
}

impl RecordWriter<'_> {
    /// A new inode's first name: its INODE record and ranges, then CREAT
    /// (replay builds the unnamed inode first, then names it).
    fn create(&mut self, dentry: Dentry, pending: Option<&PendingInode>) -> Result<()> {
        let inode = read_inode(self.core, dentry.ino)?;
        debug_assert!(inode.mode != 0, "CREAT of a freed inode {}", dentry.ino);
        self.inode_record(dentry.ino, &inode)?;
        if let Some(pending) = pending.filter(|_| !inode.is_dir()) {
            self.range_records(dentry.ino, &inode, pending)?;
            self.ranges_written.insert(dentry.ino);
        }
        self.records.push(Record::Create(dentry));
        Ok(())
    }

    /// A changed inode: its ranges, then its INODE record. Directories and
    /// inodes without links (freed, or open orphans, which are ineligible)
    /// are left to their names.
    fn inode(&mut self, ino: u32, pending: &PendingInode) -> Result<()> {
        let inode = read_inode(self.core, ino)?;
        if inode.mode == 0 || inode.links_count == 0 || inode.is_dir() {
            return Ok(());
        }
        if !self.ranges_written.contains(&ino) {
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
                lblk = match mapping::lookup(&self.core.geo, &self.core.cache, ino, inode, lblk)? {
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
