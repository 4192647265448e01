//! The journal's side of fast-commit replay: making it atomic.
//!
//! Fast commits are applied after the block replay and before the journal
//! is reset (`recovery::replay`). Applying them changes many blocks
//! (inodes, bitmaps, descriptors, directory and extent blocks). Written
//! home one by one, a crash in between would leave a mixture that a second
//! recovery cannot reconcile: its block replay puts back the logged blocks
//! the first attempt had changed, but not the others. So the replay's
//! blocks are first logged as one ordinary JBD2 transaction, with the tid
//! the fast commits extend, right after the last transaction of the valid
//! log; they go home only once its commit block is durable. (The kernel's
//! fast_commit.c names exactly this as the missing piece of its replay's
//! crash safety.)
//!
//! A crash before the commit block is durable leaves the valid log as it
//! was: the next recovery replays the fast commits again from the same
//! state. A crash after it: every recovery — jext4's, the kernel's,
//! e2fsck's — replays the new transaction like any other, and then finds
//! no fast commits for the tid after it (the area's HEAD is zeroed once
//! the commit block is durable, for e2fsck's sake). The commit block's
//! place is zeroed before anything else is written, so that a scan of a
//! half-written transaction stops there whatever the old log held; a zeroed
//! block also follows the commit block, so that nothing further on in the
//! old log (transactions written after a failed async commit) can extend
//! the log.
//!
//! The new transaction goes only into free log space, between the end of
//! the valid log and its start: the old log must stay readable until the
//! commit. When the replay changed more blocks than that space holds, the
//! blocks are written home directly (the kernel's way, not crash-atomic)
//! and the caller is told so.

use super::format::{
    BlockHeader, DescriptorBuilder, JournalSuperblock, LogLayout, block_type, crc32_be,
    descriptor_tags, encode_commit_block,
};
use super::recovery::{FastCommitArea, JournalArea};
use crate::error::{Error, Location, Result};
use std::collections::BTreeMap;

/// How the replayed blocks reached their homes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplayWrite {
    /// Logged as transaction `tid` in `log_blocks` journal blocks first.
    Logged { tid: u32, log_blocks: u32 },
    /// Written home directly: the log had no room for them.
    Direct,
}

/// Make `blocks` (filesystem block → new contents) durable in their homes,
/// atomically through the log when it has room: as transaction
/// `fast_commit.expected_tid`, the first tid the block replay did not
/// reach. Everything is flushed when this returns.
pub fn write_replayed_blocks(
    area: &JournalArea,
    fast_commit: &FastCommitArea,
    blocks: &BTreeMap<u64, Vec<u8>>,
) -> Result<ReplayWrite> {
    let tid = fast_commit.expected_tid;
    let (superblock, layout) = area.load_superblock()?;
    debug_assert!(
        superblock.start != 0,
        "fast commits are replayed after a log"
    );
    let position = log_end(area, &superblock, &layout, tid)?;
    let log = build_transaction(&superblock, tid, blocks);
    let log_size = (layout.last - layout.first) as u64;
    let used = if position == superblock.start && tid != superblock.sequence {
        log_size // the valid log goes all the way round
    } else {
        (position as u64 + log_size - superblock.start as u64) % log_size
    };
    let outcome = if log.len() as u64 <= log_size - used {
        write_log(area, &layout, position, &log)?;
        retire_fast_commits(area, fast_commit)?;
        ReplayWrite::Logged {
            tid,
            log_blocks: log.len() as u32,
        }
    } else {
        ReplayWrite::Direct
    };
    write_home(area, blocks)?;
    Ok(outcome)
}

/// The log position after the last commit block before `end_tid`: where
/// transaction `end_tid` begins. Walks the log the way recovery's replay
/// pass does (the scan has already accepted every transaction before
/// `end_tid`, so anything unexpected is corruption).
fn log_end(
    area: &JournalArea,
    superblock: &JournalSuperblock,
    layout: &LogLayout,
    end_tid: u32,
) -> Result<u32> {
    let format = superblock.log_format();
    let (first, last) = (layout.first as u64, layout.last as u64);
    let wrap = |index: u64| {
        if index >= last {
            index - (last - first)
        } else {
            index
        }
    };
    let mut index = superblock.start as u64;
    let mut tid = superblock.sequence;
    // Each step moves past at least one log block.
    for _ in 0..=layout.total {
        if tid == end_tid {
            return Ok(index as u32);
        }
        let block = area.read_block(index)?;
        let header = BlockHeader::decode(&block).filter(|header| header.sequence == tid);
        index = match header.map(|header| header.block_type) {
            Some(block_type::DESCRIPTOR) => {
                wrap(wrap(index + 1) + descriptor_tags(&format, &block).len() as u64)
            }
            Some(block_type::COMMIT) => {
                tid = tid.wrapping_add(1);
                wrap(index + 1)
            }
            Some(block_type::REVOKE) => wrap(index + 1),
            _ => {
                return Err(Error::corrupt(
                    Location::Journal { block: index },
                    format!("the log ends before transaction {end_tid}"),
                ));
            }
        };
    }
    Err(Error::corrupt(
        Location::Journal { block: index },
        "the log is longer than the journal",
    ))
}

/// The transaction's log blocks in order: descriptors each followed by
/// their (escaped) copies, the commit block, then the zeroed terminator.
fn build_transaction(
    superblock: &JournalSuperblock,
    tid: u32,
    blocks: &BTreeMap<u64, Vec<u8>>,
) -> Vec<Vec<u8>> {
    let format = superblock.log_format();
    let mut log = Vec::with_capacity(blocks.len() + blocks.len() / 8 + 3);
    // Checksum v1: CRC32 over descriptors and copies, in log order.
    let mut crc32 = !0u32;
    let mut pending = blocks.iter().peekable();
    while pending.peek().is_some() {
        let mut descriptor = DescriptorBuilder::new(&format, tid, superblock.uuid);
        let mut copies = Vec::new();
        while !descriptor.is_full() {
            let Some((&fs_block, bytes)) = pending.next() else {
                break;
            };
            let mut copy = bytes.clone();
            descriptor.add(fs_block, &mut copy);
            copies.push(copy);
        }
        let descriptor = descriptor.finish();
        crc32 = crc32_be(crc32, &descriptor);
        log.push(descriptor);
        for copy in copies {
            crc32 = crc32_be(crc32, &copy);
            log.push(copy);
        }
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    log.push(encode_commit_block(
        &format,
        tid,
        now.as_secs(),
        now.subsec_nanos(),
        crc32,
    ));
    log.push(vec![0; format.block_size]);
    log
}

/// Write the transaction from `position`: first a zeroed block where the
/// commit block goes, so that a scan of a half-written transaction stops
/// there whatever the old log held; then everything but the commit block;
/// then the commit block. A flush after each step.
fn write_log(area: &JournalArea, layout: &LogLayout, position: u32, log: &[Vec<u8>]) -> Result<()> {
    debug_assert!(log.len() >= 3, "a descriptor, a commit block, a terminator");
    let commit_at = log.len() - 2;
    let next = |index: u32| {
        if index + 1 == layout.last {
            layout.first
        } else {
            index + 1
        }
    };
    let commit_index = (0..commit_at).fold(position, |index, _| next(index));
    write_journal_block(area, commit_index, &log[log.len() - 1])?;
    area.dev.flush()?;
    let mut index = position;
    for (at, block) in log.iter().enumerate() {
        if at != commit_at {
            write_journal_block(area, index, block)?;
        }
        index = next(index);
    }
    area.dev.flush()?;
    write_journal_block(area, commit_index, &log[commit_at])?;
    area.dev.flush()?;
    Ok(())
}

/// Once the replay's transaction is durable the fast commits are spent:
/// zero the area's first block, so that no recovery of the log finds a HEAD
/// (for the tid just used). The kernel and jext4 would merely stop at it;
/// e2fsck 1.47.0 fails its whole recovery ("Invalid argument") on a HEAD
/// for another tid.
fn retire_fast_commits(area: &JournalArea, fast_commit: &FastCommitArea) -> Result<()> {
    debug_assert!(fast_commit.first_block < fast_commit.end_block);
    let zero = vec![0u8; area.fs_block_size as usize];
    write_journal_block(area, fast_commit.first_block, &zero)?;
    area.dev.flush()?;
    Ok(())
}

fn write_journal_block(area: &JournalArea, index: u32, block: &[u8]) -> Result<()> {
    let fs_block = area.blocks[index as usize];
    area.dev
        .write_at(fs_block * area.fs_block_size as u64, block)?;
    Ok(())
}

/// Write every block home, runs of consecutive blocks together, and flush.
fn write_home(area: &JournalArea, blocks: &BTreeMap<u64, Vec<u8>>) -> Result<()> {
    let block_size = area.fs_block_size as u64;
    let mut run: Vec<u8> = Vec::new();
    let mut run_start = 0;
    let mut next = None;
    for (&fs_block, bytes) in blocks {
        debug_assert_eq!(bytes.len() as u64, block_size);
        if next != Some(fs_block) && !run.is_empty() {
            area.dev.write_at(run_start * block_size, &run)?;
            run.clear();
        }
        if run.is_empty() {
            run_start = fs_block;
        }
        run.extend_from_slice(bytes);
        next = Some(fs_block + 1);
    }
    if !run.is_empty() {
        area.dev.write_at(run_start * block_size, &run)?;
    }
    area.dev.flush()?;
    Ok(())
}
