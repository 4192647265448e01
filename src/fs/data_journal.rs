//! data=journal: file data logged in the journal with the metadata that
//! maps it, as the kernel's journalled address space logs it.
//!
//! Which files: `Core::journals_data`, the kernel's
//! `ext4_inode_journal_mode` — every regular file with `-o data=journal`
//! (or the superblock's default mount options, `tune2fs -o
//! journal_data`), and a file with the JOURNAL_DATA flag (`chattr +j`)
//! when delayed allocation is off; never an encrypted file (the kernel
//! falls back to ordered for those, and jext4 writes none) nor an EA
//! inode (its blocks are metadata already, `xattr.rs`).
//!
//! - **Writing.** Such a file's blocks go through the metadata cache and
//!   the operation's handle, as a directory block does: logged at commit,
//!   written home only by the checkpoint after it. No byte reaches its
//!   home before the commit that carries it (the write-ahead rule, here
//!   for data too), so a crash leaves each write's blocks all old or all
//!   new, with the size and times of the same transaction.
//! - **Reading.** Until the checkpoint the device holds an older copy:
//!   reads of such a file take the cached copy of a block where there is
//!   one, asked before the device (`Core::read_file_blocks`). Only
//!   journaled writes put data blocks in the cache (`get_for_overwrite`;
//!   reads never insert), so a cached copy of a data block is always the
//!   newest.
//! - **Freeing.** As metadata (`Tx::punch_mapping`): forgotten by the
//!   cache, its pending checkpoint write dropped, and revoked, so that
//!   neither a checkpoint nor a replay writes a logged copy over the
//!   block's next owner. The kernel revokes for the per-inode flag and
//!   skips it under the mount option, where every write is logged; jext4
//!   writes a few blocks in place even then (slow symlinks), so it revokes
//!   always. A revoke record per block: a large range is freed in chunks,
//!   one transaction each, each handle reserving credits for its records
//!   (truncate and unlink by `Fs::punch_in_chunks`, a fallocate punch or
//!   zero range by `Fs::punch_journaled_range`).
//! - **Size.** A write's transaction carries its data, so its chunk is
//!   bounded by the journal (`Core::write_chunk`), not only by
//!   `WRITE_CHUNK_BLOCKS`, and decided again in each transaction under
//!   the inode lock (`Tx::write_chunk_outgrown`: chattr +j may land
//!   between two chunks of one write).
//! - **fsync** waits for the transaction that logged the data (fdatasync
//!   too: the data is the inode's datasync change, as the kernel's
//!   `i_datasync_tid`). Fast commits are off under the mount option (the
//!   kernel clears `journal_fast_commit`), and a change to such a file
//!   makes its transaction ineligible (`EXT4_FC_REASON_INODE_JOURNAL_DATA`).

use super::file::{CREDITS_WRITE, WRITE_CHUNK_BLOCKS, max_file_size};
use super::inode::PUNCH_CHUNK_BLOCKS;
use super::{Caller, Core, Fs, MountOptions, Scope, Tx};
use crate::error::{Error, Result};
use crate::faults::{self, Fault};
use crate::format::inode::{Inode, flags};
use crate::format::mapping::Lookup;
use crate::format::superblock::{Geometry, Superblock, compat, default_mount};
use crate::hash::NumberSet;
use crate::lock::Rank;
use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

/// Log blocks the revoke records of a chunk of `PUNCH_CHUNK_BLOCKS`
/// freed blocks take at most: 8 bytes a record (a 64-bit journal; 4
/// otherwise) in a block less its header and checksum tail (`jbd2.rs`,
/// `revokes_per_block`). With bigalloc a chunk frees the clusters it
/// touches, two more than it fills at worst. A handle's credits count
/// only the buffers it will log, yet the commit writes its revoke blocks
/// too: a step that frees a journaled file's blocks reserves these
/// besides.
pub(super) fn punch_revoke_credits(geo: &Geometry) -> u32 {
    let records = PUNCH_CHUNK_BLOCKS + 2 * geo.cluster_ratio as u64;
    (records * 8).div_ceil(geo.block_size as u64 - 32) as u32
}

/// Files whose JOURNAL_DATA flag was cleared in this mount while it
/// journaled their data (`Tx::change_journal_flag`). Asked on every read
/// and write of every file: an atomic answers while there are none.
#[derive(Default)]
pub(crate) struct UntilRemount {
    any: AtomicBool,
    inodes: Mutex<NumberSet<u32>>,
}

impl UntilRemount {
    fn insert(&self, ino: u32) {
        self.inodes.lock().insert(ino);
        self.any.store(true, Ordering::Release);
    }

    fn contains(&self, ino: u32) -> bool {
        self.any.load(Ordering::Acquire) && self.inodes.lock().contains(&ino)
    }
}

/// Decide the data mode at mount as the kernel does (`ext4_set_def_opts`,
/// `ext4_check_journal_data_mode`): an explicit option over the
/// superblock's default; data=journal turns fast commits off and refuses
/// an explicit delalloc; a filesystem without a journal refuses a data
/// mode other than its default.
pub(super) fn settle(sb: &Superblock, options: &mut MountOptions) -> Result<()> {
    let default = sb.default_mount_opts & default_mount::JMODE == default_mount::JMODE_DATA;
    let journal = options.data_journal.unwrap_or(default);
    if !sb.has_compat(compat::HAS_JOURNAL) {
        if journal != default {
            return Err(Error::Invalid(
                "data=: the filesystem has no journal (the kernel: can't mount with data=, \
                 fs mounted w/o journal)"
                    .into(),
            ));
        }
        options.data_journal = Some(false);
        return Ok(());
    }
    options.data_journal = Some(journal);
    if !journal {
        return Ok(());
    }
    if options.delalloc {
        return Err(Error::Invalid(
            "can't mount with both data=journal and delalloc".into(),
        ));
    }
    if options.bytelog {
        return Err(Error::Invalid(
            "bytelog needs fast commits, which data=journal turns off".into(),
        ));
    }
    if options.fast_commit != Some(false) && sb.has_compat(compat::FAST_COMMIT) {
        tracing::info!("data=journal disables fast commits, as in the kernel");
    }
    options.fast_commit = Some(false);
    Ok(())
}

impl Core {
    /// Whether `inode`'s data is logged in the journal (see the module).
    pub(crate) fn journals_data(&self, ino: u32, inode: &Inode) -> bool {
        self.journal_mode_data(inode, inode.flags)
            || (inode.is_reg() && self.journaled_until_remount.contains(ino))
    }

    /// `ext4_inode_journal_mode` of `inode` were its flags `flags`.
    fn journal_mode_data(&self, inode: &Inode, flags: u32) -> bool {
        inode.is_reg()
            && flags & flags::EA_INODE == 0
            && self.journal.is_journaled()
            && (self.options.data_journal == Some(true)
                || (flags & flags::JOURNAL_DATA != 0 && !self.options.delalloc))
            && !inode.is_encrypted(&self.geo)
    }

    /// The bytes one write transaction takes of file `inode`'s data at
    /// most, and the journal credits it needs: a journaled file's chunk
    /// is logged whole, so it is held to half the largest transaction
    /// (and a quarter of the cache it is pinned in) and each of its
    /// blocks, plus a partial one at each edge, costs a credit.
    pub(super) fn write_chunk(&self, ino: u32, inode: &Inode) -> (u64, u32) {
        let block_size = self.geo.block_size as u64;
        if !self.journals_data(ino, inode) {
            return (WRITE_CHUNK_BLOCKS * block_size, CREDITS_WRITE);
        }
        let journal = self.journal.max_transaction_blocks().unwrap_or(u32::MAX) as u64;
        let cache = self.cache.capacity_blocks() as u64;
        let blocks = (journal / 2)
            .saturating_sub(CREDITS_WRITE as u64 + 2)
            .min(cache / 4)
            .clamp(1, WRITE_CHUNK_BLOCKS);
        (blocks * block_size, CREDITS_WRITE + blocks as u32 + 2)
    }

    /// Read device blocks from `physical` into `span` (whole blocks) as
    /// file data: with `journaled`, a block's cached copy (logged, maybe
    /// not home yet) where there is one, the device only for the others.
    ///
    /// The cache is asked first, the device after. The other order loses
    /// committed data: the device read returns the old home copy, then
    /// the checkpoint writes the committed copy home and lets the buffer
    /// go, another insert evicts it, and the lookup finds nothing — the
    /// stale bytes are returned, and a read-modify-write (`edged_block`,
    /// `zero_range_in_place`) logs them over the committed ones. In this
    /// order a block missing from the cache is home already:
    /// - the cache evicts only a buffer nobody else holds
    ///   (`BufferCache::evict`: strong count 1), and a transaction holds
    ///   each buffer it logs from `get_write_access` until its checkpoint
    ///   (`Checkpoint::buffers`, dropped by `retire_oldest` only after the
    ///   home writes are issued and flushed): a logged block leaves the
    ///   cache only once its newest committed copy is home;
    /// - no newer logged copy can appear between the lookup and the device
    ///   read where it matters: journaled writes and frees of a file's
    ///   blocks hold its inode lock, as do the read-modify-writes that
    ///   call this (a plain read racing a write may see either version,
    ///   as with any read beside a write);
    /// - a freed block is forgotten (`BufferCache::forget`) under the same
    ///   inode lock, and is no longer the file's.
    pub(super) fn read_file_blocks(
        &self,
        journaled: bool,
        physical: u64,
        span: &mut [u8],
    ) -> Result<()> {
        let block_size = self.geo.block_size as usize;
        debug_assert!(span.len().is_multiple_of(block_size));
        if !journaled {
            self.dev().read_at(physical * block_size as u64, span)?;
            return Ok(());
        }
        // Runs of blocks with no cached copy, read from the device in one
        // request each; cached blocks are copied as they are met.
        let blocks = span.len() / block_size;
        let mut uncached_from = None;
        for index in 0..=blocks {
            let cached = (index < blocks)
                .then(|| self.cache.peek(physical + index as u64))
                .flatten()
                .filter(|buffer| buffer.is_uptodate());
            if index < blocks && cached.is_none() {
                uncached_from.get_or_insert(index);
                continue;
            }
            if let Some(from) = uncached_from.take() {
                let run = &mut span[from * block_size..index * block_size];
                self.dev()
                    .read_at((physical + from as u64) * block_size as u64, run)?;
            }
            if let Some(buffer) = cached {
                span[index * block_size..(index + 1) * block_size].copy_from_slice(&buffer.read());
            }
        }
        Ok(())
    }
}

impl Tx<'_, '_> {
    /// `chattr +j` / `-j` (ext4_ioctl_setflags, then
    /// ext4_change_inode_journal_flag): only with CAP_SYS_RESOURCE
    /// (EPERM); without a journal the flag stays as it was, silently, as
    /// in the kernel. Returns the flags to store. Setting it needs
    /// nothing more: the file's data written in place so far is on the
    /// device, and from now on its writes are logged. Clearing it where
    /// it journaled the file's data keeps the file journaled until the
    /// next mount: its logged copies may not be home yet, and an in-place
    /// write would be overwritten by their checkpoint (the kernel flushes
    /// the whole journal instead, with every operation held off).
    pub(super) fn change_journal_flag(
        &self,
        ino: u32,
        inode: &Inode,
        new_flags: u32,
    ) -> Result<u32> {
        if (inode.flags ^ new_flags) & flags::JOURNAL_DATA == 0 {
            return Ok(new_flags);
        }
        if !self.caller.capable_sys_resource() {
            return Err(Error::NotPermitted);
        }
        if !self.core.journal.is_journaled() {
            return Ok(new_flags ^ flags::JOURNAL_DATA);
        }
        if self.core.journals_data(ino, inode) && !self.core.journal_mode_data(inode, new_flags) {
            self.core.journaled_until_remount.insert(ino);
        }
        Ok(new_flags)
    }

    /// Whether a write step of `len` bytes of file `ino`, cut and given
    /// `credits` (`Core::write_chunk`) from the inode read before the
    /// transaction and without its lock, is too large for the file as
    /// this transaction finds it under its lock: set journaled
    /// meanwhile (chattr +j), its chunk shrinks and costs a credit a
    /// block, and a step logged with the ordered chunk's credits would
    /// overrun the journal (an abort). Then the step writes nothing and
    /// returns the chunk and credits to cut it again with. The caller
    /// holds the inode lock; an inode that cannot be read is left to the
    /// step to report.
    pub(super) fn write_chunk_outgrown(
        &self,
        ino: u32,
        len: usize,
        credits: u32,
    ) -> Option<(u64, u32)> {
        let inode = self.read_live_inode(ino).ok()?;
        let (chunk_bytes, chunk_credits) = self.core.write_chunk(ino, &inode);
        (len as u64 > chunk_bytes || credits < chunk_credits)
            .then_some((chunk_bytes, chunk_credits))
    }

    /// Where a fallocate punch (or zero range) of whole blocks
    /// `from..to` of file `ino` must free a journaled file's blocks in
    /// chunks before its own transaction: the first mapped block of the
    /// range, when the file journals its data and more than one chunk
    /// (`PUNCH_CHUNK_BLOCKS`) lies from there to the range's end — each
    /// freed block is revoked, one record each, and the whole range in one
    /// transaction could outgrow the journal. None for a file the
    /// operation refuses or treats otherwise (inline data, block maps, a
    /// range past the largest file): its own transaction says so.
    pub(super) fn journaled_punch_start(
        &self,
        ino: u32,
        inode: &Inode,
        from: u64,
        to: u64,
    ) -> Result<Option<u64>> {
        let block_size = self.core.geo.block_size as u64;
        if from >= to
            || !self.core.journals_data(ino, inode)
            || inode.has_inline_data()
            || !inode.uses_extents()
            || to.saturating_mul(block_size) > max_file_size(&self.core.geo, inode)
        {
            return Ok(None);
        }
        let start = match self.core.lookup(ino, inode, from)? {
            Lookup::Mapped(_) => from,
            Lookup::Hole { next: Some(next) } if next < to => next,
            Lookup::Hole { .. } => return Ok(None),
        };
        Ok((to - start > PUNCH_CHUNK_BLOCKS).then_some(start))
    }

    /// Log whole blocks of file `ino`'s data, `pieces` one after another
    /// from device byte `offset`: each block through the cache and this
    /// operation's handle, home at the checkpoint after its commit.
    pub(super) fn log_file_blocks(&self, ino: u32, offset: u64, pieces: &[&[u8]]) -> Result<()> {
        let block_size = self.core.geo.block_size as usize;
        debug_assert!(offset.is_multiple_of(block_size as u64));
        let mut block = offset / block_size as u64;
        for piece in pieces {
            debug_assert!(
                piece.len().is_multiple_of(block_size),
                "inode {ino}: a journaled write of a partial block"
            );
            for bytes in piece.chunks(block_size) {
                let buffer = self.core.cache.get_for_overwrite(block)?;
                self.handle
                    .get_write_access(&buffer)?
                    .copy_from_slice(bytes);
                if faults::active(Fault::DataJournalWrittenHome) {
                    // Broken on purpose: the block home before its commit,
                    // around the write-ahead guard (which would refuse it).
                    self.core.home.write_at(block * block_size as u64, bytes)?;
                }
                block += 1;
            }
        }
        Ok(())
    }
}

impl Fs {
    /// Free the mapped blocks of whole blocks `from..to` of journaled file
    /// `ino` (a fallocate punch or zero range), `PUNCH_CHUNK_BLOCKS` at a
    /// time, one transaction each, as truncate frees (`punch_in_chunks`),
    /// until at most one chunk is left: that one goes with the edges and
    /// the times in the operation's own transaction. Each step reserves
    /// credits for its revoke records too. Stops, leaving the rest to the
    /// operation, when the file no longer needs it
    /// (`Tx::journaled_punch_start`); fails, having freed nothing more, as
    /// the operation would on an append-only or immutable file.
    pub(super) fn punch_journaled_range(
        &self,
        ino: u32,
        from: u64,
        to: u64,
        caller: Caller,
    ) -> Result<()> {
        // Truncate's: the groups, descriptors and leaves of a chunk, and
        // the revoke blocks.
        let credits = self.punch_chunk_credits();
        let mut position = from;
        loop {
            let next = self.transact_releasing(Scope::File(ino), credits, caller, |tx| {
                let _inode = tx.lock_write(ino, Rank::Inode);
                let inode = tx.read_live_inode(ino)?;
                let Some(start) = tx.journaled_punch_start(ino, &inode, position, to)? else {
                    return Ok(None);
                };
                super::iflags::check_data_change(&inode, None)?;
                let end = start + PUNCH_CHUNK_BLOCKS;
                tx.with_regular_file(ino, |tx, inode| {
                    tx.punch_mapping(ino, inode, start, Some(end))
                })?;
                Ok(Some(end))
            })?;
            match next {
                // Strictly increasing, and below `to` by more than a chunk.
                Some(end) => position = end,
                None => return Ok(()),
            }
        }
    }
}
