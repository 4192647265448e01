//! File data: read, write, truncate, fallocate, SEEK_DATA/SEEK_HOLE, fsync,
//! and the open counts that keep unlinked files alive.
//!
//! Data blocks never enter the metadata cache: they are read and written
//! directly on the device, in runs as long as the mapping is contiguous.
//! A newly allocated block is written whole (zeros around the caller's
//! bytes), so that nothing stale from a previous owner can ever be read
//! back; a partial write into an existing block reads it first.

use super::data_journal::punch_revoke_credits;
use super::delalloc::{Placement, WriteOut};
use super::fast_commit::Outcome;
use super::inode::PUNCH_CHUNK_BLOCKS;
use super::inode::{
    Attr, attr_of, attr_unlocked, check_live, has_xattrs, read_inode, setid_bits_to_drop,
};
use super::{AtimePolicy, Caller, Fs, Scope, Tx};
use crate::error::{Error, Result};
use crate::format::inode::{Inode, Timestamp};
use crate::format::mapping::{self, Extent, Lookup};
use crate::format::superblock::Geometry;
use crate::format::{inline, xattr};
use crate::journal::change::Change;
use crate::lock::Rank;
use smallvec::SmallVec;

/// What a write did: its length, and whether it took privileges away.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Written {
    pub bytes: usize,
    pub privileges_killed: bool,
}

pub const FALLOC_FL_KEEP_SIZE: u32 = 0x01;
pub const FALLOC_FL_PUNCH_HOLE: u32 = 0x02;
pub const FALLOC_FL_ZERO_RANGE: u32 = 0x10;

/// Blocks one write transaction maps at most; larger writes loop.
pub(super) const WRITE_CHUNK_BLOCKS: u64 = 2048;

/// Journal credits of one write chunk: the inode, the extent path with
/// splits (depth up to 5, two blocks per level), block bitmaps and
/// descriptors of the few groups 2048 blocks can span, the superblock.
pub(super) const CREDITS_WRITE: u32 = 32;

/// A small truncate: at most `PUNCH_CHUNK_BLOCKS` blocks freed (bitmaps and
/// descriptors of the groups they span, extent leaves), the tail block's
/// path, the inode, the orphan records, the superblock.
const CREDITS_TRUNCATE: u32 = 160;

/// What one transaction of `Fs::write_file` did.
enum ChunkStep {
    /// Wrote this many bytes of the chunk.
    Written(usize),
    /// Wrote nothing: the file holds delayed data this chunk cannot join.
    WriteOutFirst,
    /// Wrote nothing: the chunk is too large, or its credits too few, for
    /// the file as the transaction found it (`Tx::write_chunk_outgrown`);
    /// the chunk bytes and credits to cut it again with.
    Resize((u64, u32)),
}

/// `lseek` whence values that look at the mapping.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SeekWhence {
    Data,
    Hole,
}

pub(super) fn max_file_size(geo: &Geometry, inode: &Inode) -> u64 {
    mapping::max_blocks(geo, inode).saturating_mul(geo.block_size as u64)
}

/// Who changes a regular file's data (`Tx::with_file`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Writer {
    /// A caller's write, truncate or fallocate.
    Caller,
    /// The write-out of data delayed allocation holds: data the file
    /// already has, which an fs-verity enable writes out before it reads
    /// the file (it may not wait for writes it refuses).
    HeldData,
}

/// An encrypted file's contents are ciphertext, and jext4 has no key:
/// they are neither read nor written, nor the file truncated (ENOKEY, as
/// `fscrypt_file_open` and `fscrypt_prepare_setattr` answer).
pub(super) fn refuse_encrypted_contents(geo: &Geometry, inode: &Inode) -> Result<()> {
    match inode.is_reg() && inode.is_encrypted(geo) {
        true => Err(Error::NoKey),
        false => Ok(()),
    }
}

impl Tx<'_, '_> {
    fn regular_file(&self, ino: u32, writer: Writer) -> Result<Inode> {
        let inode = self.read_live_inode(ino)?;
        if inode.is_dir() {
            return Err(Error::IsDirectory);
        }
        if !inode.is_reg() {
            return Err(Error::Invalid("not a regular file".into()));
        }
        refuse_encrypted_contents(&self.core.geo, &inode)?;
        // fs-verity files are read-only (the kernel: EPERM), and so, while
        // verity is being enabled on them, are the others (ETXTBSY).
        if inode.has_flag(crate::format::inode::flags::VERITY) {
            return Err(Error::NotPermitted);
        }
        if writer == Writer::Caller && self.core.verity_enabling.lock().contains(&ino) {
            return Err(Error::TextFileBusy);
        }
        // chattr +i: no caller changes the data (held data written out
        // is data the file already has).
        if writer == Writer::Caller {
            super::iflags::check_writable(&inode)?;
        }
        Ok(inode)
    }

    /// Write `data` at byte `offset`; returns how much was written (all of
    /// it, unless the file size limit cuts it short).
    pub(super) fn write_data(
        &mut self,
        ino: u32,
        inode: &mut Inode,
        offset: u64,
        data: &[u8],
    ) -> Result<usize> {
        let geo = &self.core.geo;
        let block_size = geo.block_size as u64;
        let limit = max_file_size(geo, inode);
        if offset >= limit {
            return Err(Error::FileTooBig);
        }
        let data = &data[..data.len().min((limit - offset) as usize)];
        let end = offset + data.len() as u64;
        let target = (ino, self.core.journals_data(ino, inode));
        debug_assert!(
            !(target.1 && self.core.delayed.holds(ino)),
            "inode {ino}: journaled data held by delayed allocation"
        );
        let mut position = offset;
        while position < end {
            let lblk = position / block_size;
            let last_lblk = (end - 1) / block_size;
            let extent = match self.core.lookup(ino, inode, lblk)? {
                Lookup::Mapped(extent) => extent,
                Lookup::Hole { next } => {
                    let hole_end = next.unwrap_or(u64::MAX).min(last_lblk + 1);
                    let wanted = (hole_end - lblk).min(u32::MAX as u64) as u32;
                    let goal = geo.group_first_block(geo.group_of_inode(ino));
                    let mut ctx = self.meta_ctx();
                    let extent =
                        match mapping::allocate(&mut ctx, ino, inode, lblk, wanted, goal, false) {
                            // A datasync change even where i_blocks stays
                            // (bigalloc: blocks of a cluster the file has).
                            Ok(extent) => {
                                self.mapping_changed = true;
                                extent
                            }
                            // Out of space part-way: what is written stays
                            // written — unless a commit makes room: then
                            // `Fs::transact` commits and writes the chunk
                            // again (rewriting what this try wrote).
                            Err(Error::NoSpace | Error::QuotaExceeded)
                                if position > offset && self.space_wait.is_none() =>
                            {
                                break;
                            }
                            Err(error) => return Err(error),
                        };
                    write_run(self, (target, &extent), position, end, data, offset, true)?;
                    position = (extent.logical + extent.len as u64) * block_size;
                    continue;
                }
            };
            let written = write_run(
                self,
                (target, &extent),
                position,
                end,
                data,
                offset,
                extent.unwritten,
            )?;
            if extent.unwritten {
                self.mapping_changed = true;
                let mut ctx = self.meta_ctx();
                // Every block the run touched, partial ones included.
                let last_touched = (position + written - 1) / block_size;
                mapping::mark_written(&mut ctx, ino, inode, lblk, last_touched - lblk + 1)?;
            }
            position += written;
        }
        let end = end.min(position);
        // Logged data is the inode's datasync change (`with_file`).
        self.data_logged |= target.1 && position > offset;
        if end > inode.size {
            inode.size = end;
            self.handle.note(Change::Extended { ino });
        }
        Ok((end - offset) as usize)
    }

    /// Run `body` on a regular file's inode and write the inode back even
    /// if `body` fails part-way: its mapping may already have changed.
    pub(super) fn with_regular_file<R>(
        &mut self,
        ino: u32,
        body: impl FnOnce(&mut Self, &mut Inode) -> Result<R>,
    ) -> Result<R> {
        self.with_file(ino, Writer::Caller, body)
    }

    /// `with_regular_file` for `writer`.
    pub(super) fn with_file<R>(
        &mut self,
        ino: u32,
        writer: Writer,
        body: impl FnOnce(&mut Self, &mut Inode) -> Result<R>,
    ) -> Result<R> {
        let mut inode = self.regular_file(ino, writer)?;
        let before = (inode.size, inode.blocks, inode.block);
        self.mapping_changed = false;
        self.data_logged = false;
        let result = match writer {
            // A caller's blocks count against the file's quota limits; the
            // write-out of held data is the data's, taken already.
            Writer::Caller => {
                let subject = self.quota_ids(ino, &inode);
                self.with_quota_subject(subject, |tx| body(tx, &mut inode))
            }
            Writer::HeldData => body(self, &mut inode),
        };
        if !self.mapping_changed
            && !self.data_logged
            && before == (inode.size, inode.blocks, inode.block)
        {
            self.write_inode_timestamps(ino, &inode)?;
        } else {
            self.write_inode(ino, &inode)?;
        }
        result
    }

    /// Zero bytes `from..to` of the file on disk where blocks are mapped and
    /// written (edges of a punched range, the tail past a new EOF).
    fn zero_range_in_place(&mut self, ino: u32, inode: &Inode, from: u64, to: u64) -> Result<()> {
        let geo = &self.core.geo;
        let block_size = geo.block_size as u64;
        let target = (ino, self.core.journals_data(ino, inode));
        let mut position = from;
        while position < to {
            let lblk = position / block_size;
            let block_end = ((lblk + 1) * block_size).min(to);
            if let Lookup::Mapped(extent) = self.core.lookup(ino, inode, lblk)?
                && !extent.unwritten
            {
                let mut block = vec![0u8; block_size as usize];
                let physical = extent.physical; // the run starts at lblk
                self.core.read_file_blocks(target.1, physical, &mut block)?;
                let start = (position - lblk * block_size) as usize;
                let stop = (block_end - lblk * block_size) as usize;
                block[start..stop].fill(0);
                self.write_file_blocks(target, physical * block_size, &block)?;
                self.data_logged |= target.1;
            }
            position = block_end;
        }
        Ok(())
    }

    /// Set the size: cut blocks past the new end, zero the tail of the last
    /// partial block, or extend sparsely.
    pub fn truncate_to(&mut self, ino: u32, inode: &mut Inode, size: u64) -> Result<()> {
        if inode.has_inline_data() {
            return self.truncate_inline(ino, inode, size);
        }
        let geo = &self.core.geo;
        let block_size = geo.block_size as u64;
        if size > max_file_size(geo, inode) {
            return Err(Error::FileTooBig);
        }
        if size < inode.size {
            let keep_blocks = size.div_ceil(block_size);
            if !size.is_multiple_of(block_size) {
                let tail_end = (keep_blocks * block_size).min(inode.size);
                self.zero_range_in_place(ino, inode, size, tail_end)?;
            }
            self.punch_mapping(ino, inode, keep_blocks, None)?;
        }
        inode.size = size;
        Ok(())
    }
}

/// Write the part of `data` (which starts at file byte `data_offset`) that
/// falls in `extent` of inode `ino`, from file byte `position` up to `end`.
/// With `fresh`, the blocks hold nothing worth keeping: partial blocks are
/// padded with zeros instead of read. Returns the bytes of the file covered
/// (position up to the end of the write or of the extent).
fn write_run(
    tx: &Tx<'_, '_>,
    (target, extent): ((u32, bool), &Extent),
    position: u64,
    end: u64,
    data: &[u8],
    data_offset: u64,
    fresh: bool,
) -> Result<u64> {
    let block_size = tx.core.geo.block_size as u64;
    let extent_end = (extent.logical + extent.len as u64) * block_size;
    let run_end = end.min(extent_end);
    let first_block = position / block_size;
    let last_block = (run_end - 1) / block_size;
    let physical = extent.physical + (first_block - extent.logical);
    let head = (position - first_block * block_size) as usize;
    let tail = ((last_block + 1) * block_size - run_end) as usize;
    let source = &data[(position - data_offset) as usize..(run_end - data_offset) as usize];
    if head == 0 && tail == 0 {
        // Whole blocks: straight from the request, no copy.
        tx.write_file_blocks(target, physical * block_size, source)?;
        return Ok(run_end - position);
    }
    if first_block == last_block {
        let buffer = edged_block(tx, (target.1, physical), (head, tail), source, fresh)?;
        tx.write_file_blocks(target, physical * block_size, &buffer)?;
        return Ok(run_end - position);
    }
    // The partial edge blocks built apart, the whole blocks between them
    // straight from the request: one device write of the three pieces.
    let bs = block_size as usize;
    let head_bytes = if head > 0 { bs - head } else { 0 };
    let tail_bytes = if tail > 0 { bs - tail } else { 0 };
    let first = (head > 0)
        .then(|| {
            edged_block(
                tx,
                (target.1, physical),
                (head, 0),
                &source[..head_bytes],
                fresh,
            )
        })
        .transpose()?;
    let last_physical = physical + (last_block - first_block);
    let tail_source = &source[source.len() - tail_bytes..];
    let last = (tail > 0)
        .then(|| edged_block(tx, (target.1, last_physical), (0, tail), tail_source, fresh))
        .transpose()?;
    let middle = &source[head_bytes..source.len() - tail_bytes];
    let pieces: SmallVec<[&[u8]; 3]> = [first.as_deref(), Some(middle), last.as_deref()]
        .into_iter()
        .flatten()
        .filter(|piece| !piece.is_empty())
        .collect();
    tx.write_file_pieces(target, physical * block_size, &pieces)?;
    Ok(run_end - position)
}

/// Device block `physical` as a write of `source` leaves it, `source`
/// starting `head` bytes into it and ending `tail` bytes before its end:
/// zeros around `source` when `fresh` (only there: a fresh block is
/// mostly an append's bytes), else the block read whole (device access is
/// by sectors) with `source` copied over it.
fn edged_block(
    tx: &Tx<'_, '_>,
    (journaled, physical): (bool, u64),
    (head, tail): (usize, usize),
    source: &[u8],
    fresh: bool,
) -> Result<Vec<u8>> {
    let block_size = tx.core.geo.block_size as usize;
    debug_assert_eq!(head + source.len() + tail, block_size);
    let mut block = Vec::with_capacity(block_size);
    if fresh {
        block.resize(head, 0);
        block.extend_from_slice(source);
        block.resize(block_size, 0);
        return Ok(block);
    }
    block.resize(block_size, 0);
    tx.core.read_file_blocks(journaled, physical, &mut block)?;
    block[head..head + source.len()].copy_from_slice(source);
    Ok(block)
}

/// Whether an access at `now` changes an atime, given [atime, mtime,
/// ctime]: always (strictatime), never (noatime), or under relatime when
/// the atime is not after the last change or is a day old
/// (`fs/inode.c: relatime_need_update`).
fn atime_wanted(
    policy: AtimePolicy,
    [atime, mtime, ctime]: [Timestamp; 3],
    now: Timestamp,
) -> bool {
    match policy {
        AtimePolicy::Never => false,
        AtimePolicy::Strict => true,
        AtimePolicy::Relatime => {
            atime <= mtime || atime <= ctime || now.sec - atime.sec >= 24 * 3600
        }
    }
}

impl Fs {
    /// A file or directory was opened: it stays until released even if its
    /// last name goes.
    ///
    /// The check and the count happen under the filesystem lock, so that an
    /// unlink (which decides under the write lock whether the inode is
    /// open) either sees this open and makes the inode an orphan, or has
    /// freed it already and this open fails with ESTALE. FUSE opens by inode
    /// number after a lookup that may predate a concurrent unlink; the
    /// kernel then looks the name up again.
    pub fn open_file(&self, ino: u32) -> Result<Attr> {
        let _inode = self.core.inodes.read(ino, Rank::Inode);
        let result = read_inode(&self.core, ino).and_then(|inode| {
            self.check_not_freed(ino, &inode)?;
            let attr = attr_of(&self.core, ino, &inode)?;
            *self.open_files.lock().entry(ino).or_insert(0) += 1;
            Ok(attr)
        });
        self.note_error(result)
    }

    /// An inode named by number (not through a directory) must not have been
    /// freed: one without links that is not an open orphan was freed by an
    /// unlink (say, a directory removed while it was a process's working
    /// directory, or a name unlinked between a lookup and an open), and it
    /// keeps its mode on disk, so the mode alone cannot tell.
    pub(crate) fn check_not_freed(&self, ino: u32, inode: &Inode) -> Result<()> {
        if inode.mode == 0
            || (inode.links_count == 0 && !self.core.open_orphans.lock().contains(&ino))
        {
            return Err(Error::Stale);
        }
        Ok(())
    }

    /// The matching release of `open_file`; frees the inode if it was unlinked.
    pub fn release_file(&self, ino: u32) -> Result<()> {
        let last = {
            let mut open = self.open_files.lock();
            match open.get_mut(&ino) {
                Some(count) if *count > 1 => {
                    *count -= 1;
                    false
                }
                Some(_) => {
                    open.remove(&ino);
                    true
                }
                None => false,
            }
        };
        if last && let Some(window) = self.core.windows.take(ino) {
            // Its blocks go back to every file's searches.
            self.core.groups.drop_window(window);
        }
        if last && self.core.delayed.take_emptied(ino) {
            self.write_out(ino, WriteOut::Close)?;
        }
        if last && !self.is_read_only() {
            return self.note_error(self.evict_if_unlinked(ino));
        }
        Ok(())
    }

    /// Read up to `size` bytes at `offset`.
    pub fn read(&self, ino: u32, offset: u64, size: usize) -> Result<Vec<u8>> {
        let inode_lock = self.core.inodes.read(ino, Rank::Inode);
        let result = (|| {
            let inode = read_inode(&self.core, ino)?;
            check_live(ino, &inode)?;
            if inode.is_dir() {
                return Err(Error::IsDirectory);
            }
            refuse_encrypted_contents(&self.core.geo, &inode)?;
            // With data held by delayed allocation, the size it shows.
            let file_size = self.core.delayed.size_of(ino).unwrap_or(inode.size);
            if offset >= file_size || size == 0 {
                return Ok((Vec::new(), inode));
            }
            let end = file_size.min(offset.saturating_add(size as u64));
            let data = match inode.has_flag(crate::format::inode::flags::VERITY) {
                true => self.read_verified(ino, &inode, offset, end)?,
                false => self.read_range(ino, &inode, offset, end)?,
            };
            Ok((data, inode))
        })();
        drop(inode_lock);
        let (data, inode) = self.note_error(result)?;
        self.touch_atime(ino, &inode);
        Ok(data)
    }

    pub(super) fn read_range(
        &self,
        ino: u32,
        inode: &Inode,
        offset: u64,
        end: u64,
    ) -> Result<Vec<u8>> {
        let geo = &self.core.geo;
        if inode.has_inline_data() {
            return inline::read_range(geo, ino, inode, offset, end);
        }
        let block_size = geo.block_size as u64;
        let first_block = offset / block_size;
        let last_block = (end - 1) / block_size;
        let mut buffer = vec![0u8; ((last_block - first_block + 1) * block_size) as usize];
        let journaled = self.core.journals_data(ino, inode);
        let mut lblk = first_block;
        while lblk <= last_block {
            match self.core.lookup(ino, inode, lblk)? {
                Lookup::Mapped(extent) => {
                    let count = (extent.len as u64).min(last_block + 1 - lblk);
                    if !extent.unwritten {
                        let at = ((lblk - first_block) * block_size) as usize;
                        let span = &mut buffer[at..at + (count * block_size) as usize];
                        self.core
                            .read_file_blocks(journaled, extent.physical, span)?;
                    }
                    lblk += count;
                }
                Lookup::Hole { next } => {
                    lblk = next.unwrap_or(u64::MAX).min(last_block + 1);
                }
            }
        }
        // Held blocks are holes in the mapping.
        self.core.delayed.read_into(ino, first_block, &mut buffer);
        let start = (offset - first_block * block_size) as usize;
        buffer.drain(..start);
        buffer.truncate((end - offset) as usize);
        Ok(buffer)
    }

    /// relatime: record an access when the old atime predates the last
    /// change or is a day old. Best effort: a read never fails for it.
    pub(super) fn touch_atime(&self, ino: u32, inode: &Inode) {
        let now = Timestamp::now();
        let wanted = atime_wanted(
            self.core.options.atime,
            [inode.atime, inode.mtime, inode.ctime],
            now,
        );
        if !wanted || self.is_read_only() || inode.has_flag(crate::format::inode::flags::NOATIME) {
            return;
        }
        // Shared: two updates of one inode's atime differ in it alone, and
        // whatever changes the rest of the inode holds its lock exclusive.
        let _ = self.transact(Scope::File(ino), 1, Caller::ROOT, |tx| {
            let _inode = tx.lock_read(ino, Rank::Inode);
            let mut inode = tx.read_live_inode(ino)?;
            inode.atime = now;
            tx.write_inode_timestamps(ino, &inode)
        });
    }

    /// Whether reading `attr`'s file, or listing its directory, would
    /// change its atime now (the mount's atime options, `nodiratime`, the
    /// inode's NOATIME flag, a read-only mount). A front end may serve
    /// reads or listings from a cache of its own, which the engine never
    /// sees, only where this is false.
    pub fn access_changes_atime(&self, attr: &Attr) -> bool {
        let exempt = self.is_read_only()
            || attr.flags & crate::format::inode::flags::NOATIME != 0
            || (attr.kind == super::FileKind::Directory && self.core.options.nodiratime);
        !exempt
            && atime_wanted(
                self.core.options.atime,
                [attr.atime, attr.mtime, attr.ctime],
                Timestamp::now(),
            )
    }

    /// Write `data` at `offset`; returns the number of bytes written.
    pub fn write(&self, ino: u32, offset: u64, data: &[u8], caller: Caller) -> Result<usize> {
        self.write_file(ino, offset, data, caller)
            .map(|written| written.bytes)
    }

    /// `write`, telling also whether the write took setuid, setgid or file
    /// capabilities away (a front end that caches the mode must drop it).
    pub fn write_file(
        &self,
        ino: u32,
        offset: u64,
        data: &[u8],
        caller: Caller,
    ) -> Result<Written> {
        let mut written = Written {
            bytes: 0,
            privileges_killed: false,
        };
        if data.is_empty() {
            return Ok(written);
        }
        let mut done = 0usize;
        let mut drained = false;
        // Large writes are cut into chunks, one transaction each, so that a
        // transaction's size stays bounded (a journaled file's, by the
        // journal: its data is in the transaction). Guessed here from the
        // inode read without its lock; each step checks it under the lock
        // (`Tx::write_chunk_outgrown`: chattr +j may land between chunks).
        let (mut chunk_bytes, mut chunk_credits) = match read_inode(&self.core, ino) {
            Ok(inode) => self.core.write_chunk(ino, &inode),
            Err(_) => (
                WRITE_CHUNK_BLOCKS * self.core.geo.block_size as u64,
                CREDITS_WRITE,
            ),
        };
        while done < data.len() {
            let chunk_len = (data.len() - done).min(chunk_bytes as usize);
            let chunk = &data[done..done + chunk_len];
            let position = offset + done as u64;
            // The first chunk also takes the privileges the write removes
            // (the kernel's file_remove_privs before a write).
            let first = done == 0;
            let credits = chunk_credits + if first { xattr::SET_CREDITS } else { 0 };
            let chunk_written = self.transact(Scope::File(ino), credits, caller, |tx| {
                let _inode = tx.lock_write(ino, Rank::Inode);
                if let Some(resized) = tx.write_chunk_outgrown(ino, chunk_len, chunk_credits) {
                    return Ok(ChunkStep::Resize(resized));
                }
                tx.with_regular_file(ino, |tx, inode| {
                    // chattr +a: only at the end.
                    super::iflags::check_data_change(inode, Some(position))?;
                    if first && (inode.mode & 0o6000 != 0 || has_xattrs(inode)) {
                        let setid = setid_bits_to_drop(inode, &caller, false);
                        written.privileges_killed = tx.kill_privileges(ino, inode, setid)?;
                    }
                    let written = match tx.write_inline(ino, inode, position, chunk)? {
                        Some(bytes) => bytes,
                        None => match tx.write_delayed(ino, inode, position, chunk)? {
                            Placement::Held(bytes) => bytes,
                            Placement::Direct => tx.write_data(ino, inode, position, chunk)?,
                            Placement::WriteOutFirst => return Ok(ChunkStep::WriteOutFirst),
                        },
                    };
                    let now = Timestamp::now();
                    inode.mtime = now;
                    inode.ctime = now;
                    if inode.has_flag(crate::format::inode::flags::SYNC) {
                        tx.handle.set_sync();
                    }
                    Ok(ChunkStep::Written(written))
                })
            });
            match chunk_written {
                // The file holds delayed data this chunk cannot join.
                Ok(ChunkStep::WriteOutFirst) => self.write_out(ino, WriteOut::Mapping)?,
                // Its data became journaled since the chunk was cut: the
                // same bytes again, in a chunk and with credits that fit.
                Ok(ChunkStep::Resize((bytes, credits))) => {
                    (chunk_bytes, chunk_credits) = (bytes, credits);
                }
                Ok(ChunkStep::Written(bytes)) if bytes == chunk_len => done += bytes,
                // At the wall (short, or ENOSPC), once: held data's
                // worst-case reservations may be what is missing — written
                // out, they are exact — so the rest is tried again.
                outcome @ (Ok(ChunkStep::Written(_)) | Err(Error::NoSpace))
                    if !drained && self.core.sbi.budget.reserved() > 0 =>
                {
                    if let Ok(ChunkStep::Written(bytes)) = outcome {
                        done += bytes;
                    }
                    drained = true;
                    self.write_out_all(WriteOut::Space)?;
                }
                Ok(ChunkStep::Written(bytes)) => {
                    done += bytes;
                    break;
                }
                // A short write is a success for what was written.
                Err(Error::NoSpace | Error::FileTooBig | Error::QuotaExceeded) if done > 0 => break,
                Err(error) => return Err(error),
            }
        }
        written.bytes = done;
        // The bytes are taken: a write-out failing now (another file's,
        // for memory or space) is this write's no more than the kernel's
        // writeback is — the data stays held and its fsync reports it.
        if let Err(error) = self.after_delayed_write(ino) {
            tracing::warn!(%error, ino, "delayed allocation: write-out after a write failed");
        }
        Ok(written)
    }

    /// Change the size of a regular file.
    pub fn truncate(&self, ino: u32, size: u64, caller: Caller) -> Result<()> {
        let block_size = self.core.geo.block_size as u64;
        let keep_blocks = size.div_ceil(block_size);
        // A small cut happens in one transaction; a large one sets the size
        // with the inode on the orphan records, frees the blocks in chunks,
        // then takes it off (a crash midway: the next mount finishes it).
        // Growing a file allocates nothing; shrinking frees, and may need
        // the emergency reserve to split an extent on a full volume.
        let mut emptied = false;
        let chunked = self.with_nothing_held(ino, || {
            self.transact_releasing(Scope::File(ino), CREDITS_TRUNCATE, caller, |tx| {
                let _inode = tx.lock_write(ino, Rank::Inode);
                self.check_not_freed(ino, &tx.read_live_inode(ino)?)?;
                if tx.core.delayed.holds(ino) {
                    return Ok(None); // a write held more meanwhile
                }
                tx.with_regular_file(ino, |tx, inode| {
                    super::iflags::check_data_change(inode, None)?;
                    if inode.size == size {
                        return Ok(Some(false));
                    }
                    emptied = size == 0;
                    let large =
                        size < inode.size && inode.blocks / (block_size / 512) > PUNCH_CHUNK_BLOCKS;
                    if large {
                        if !size.is_multiple_of(block_size) {
                            let tail_end = (keep_blocks * block_size).min(inode.size);
                            tx.zero_range_in_place(ino, inode, size, tail_end)?;
                        }
                        inode.size = size;
                        tx.orphan_add(ino, inode)?;
                    } else {
                        tx.truncate_to(ino, inode, size)?;
                    }
                    let now = Timestamp::now();
                    inode.mtime = now;
                    inode.ctime = now;
                    Ok(Some(large))
                })
            })
        })?;
        if emptied {
            // Rewritten next, most likely: out at the last close.
            self.core.delayed.note_emptied(ino);
        }
        if chunked {
            self.punch_in_chunks(ino, keep_blocks)?;
            self.transact_releasing(Scope::File(ino), CREDITS_TRUNCATE, caller, |tx| {
                let _inode = tx.lock_write(ino, Rank::Inode);
                let mut inode = tx.read_live_inode(ino)?;
                if inode.links_count == 0 {
                    // Unlinked while open: the orphan record stays until
                    // the last close frees it (or the next mount does).
                    return Ok(());
                }
                tx.orphan_remove(ino, &mut inode)?;
                tx.write_inode(ino, &inode)
            })?;
        }
        Ok(())
    }

    /// fallocate(2): preallocate (optionally keeping the size), punch a
    /// hole, or zero a range.
    pub fn fallocate(
        &self,
        ino: u32,
        offset: u64,
        length: u64,
        mode: u32,
        caller: Caller,
    ) -> Result<()> {
        let supported = FALLOC_FL_KEEP_SIZE | FALLOC_FL_PUNCH_HOLE | FALLOC_FL_ZERO_RANGE;
        if mode & !supported != 0 {
            return Err(Error::NotSupported);
        }
        if mode & FALLOC_FL_PUNCH_HOLE != 0
            && (mode & FALLOC_FL_KEEP_SIZE == 0 || mode & FALLOC_FL_ZERO_RANGE != 0)
        {
            return Err(Error::Invalid("PUNCH_HOLE needs KEEP_SIZE".into()));
        }
        if length == 0 {
            return Err(Error::Invalid("zero-length fallocate".into()));
        }
        let end = offset.checked_add(length).ok_or(Error::FileTooBig)?;
        let punching = mode & (FALLOC_FL_PUNCH_HOLE | FALLOC_FL_ZERO_RANGE) != 0;
        let block_size = self.core.geo.block_size as u64;
        // The whole blocks a punch frees (`fallocate_inode`).
        let (first_full, end_full) = (offset.div_ceil(block_size), end / block_size);
        // A journaled file's blocks are revoked as they are freed, one
        // record each: a large range is freed in chunks first, one
        // transaction each (`Fs::punch_journaled_range`), the last chunk
        // with the edges in the operation's own. Asked first of the inode
        // read without its lock; the operation's transaction checks again
        // (chattr +j may land between) and sends it back here.
        let mut chunked = punching
            && read_inode(&self.core, ino).is_ok_and(|inode| self.core.journals_data(ino, &inode));
        let mut body = |tx: &mut Tx<'_, '_>| {
            let _inode = tx.lock_write(ino, Rank::Inode);
            if tx.core.delayed.holds(ino) {
                return Ok(None); // a write held more meanwhile
            }
            if punching
                && let Ok(inode) = tx.read_live_inode(ino)
                && tx
                    .journaled_punch_start(ino, &inode, first_full, end_full)?
                    .is_some()
            {
                return Ok(Some(false)); // chunks first
            }
            tx.with_regular_file(ino, |tx, inode| {
                // chattr +a: an allocation may grow the file, nothing
                // else (vfs_fallocate).
                if mode & !FALLOC_FL_KEEP_SIZE != 0 {
                    super::iflags::check_data_change(inode, None)?;
                }
                tx.fallocate_inode(ino, inode, offset, end, mode)
            })
            .map(|()| Some(true))
        };
        // A journaled file's last chunk goes with the edges: credits for
        // its revoke records too.
        let revoke_credits = match punching {
            true => punch_revoke_credits(&self.core.geo),
            false => 0,
        };
        let credits = 64 + revoke_credits;
        self.with_nothing_held(ino, || {
            if chunked {
                self.punch_journaled_range(ino, first_full, end_full, caller)?;
            }
            let done = if mode & FALLOC_FL_PUNCH_HOLE != 0 {
                // Punching frees, but splitting an extent may take a block.
                self.transact_releasing(Scope::File(ino), credits, caller, &mut body)?
            } else {
                self.transact(Scope::File(ino), credits, caller, &mut body)?
            };
            match done {
                Some(true) => Ok(Some(())),
                Some(false) => {
                    chunked = true;
                    Ok(None)
                }
                None => Ok(None),
            }
        })
    }
}

impl Tx<'_, '_> {
    fn fallocate_inode(
        &mut self,
        ino: u32,
        inode: &mut Inode,
        offset: u64,
        end: u64,
        mode: u32,
    ) -> Result<()> {
        {
            let tx = self;
            if inode.has_inline_data() {
                // ext4_fallocate: every mode moves the data to a block first.
                tx.convert_inline_file(ino, inode)?;
            }
            if !inode.uses_extents() {
                return Err(Error::NotSupported); // as the kernel on block-mapped files
            }
            let geo = &tx.core.geo;
            if end > max_file_size(geo, inode) {
                return Err(Error::FileTooBig);
            }
            let block_size = geo.block_size as u64;
            let now = Timestamp::now();
            if mode & (FALLOC_FL_PUNCH_HOLE | FALLOC_FL_ZERO_RANGE) != 0 {
                let first_full = offset.div_ceil(block_size);
                let end_full = end / block_size;
                if first_full > end_full {
                    // Inside one block: only bytes to zero.
                    tx.zero_range_in_place(ino, inode, offset, end)?;
                } else {
                    tx.zero_range_in_place(ino, inode, offset, first_full * block_size)?;
                    tx.zero_range_in_place(ino, inode, end_full * block_size, end)?;
                    tx.punch_mapping(ino, inode, first_full, Some(end_full))?;
                }
                if mode & FALLOC_FL_ZERO_RANGE != 0 {
                    let mut reached = 0;
                    let (from, to) = (first_full * block_size, end_full * block_size);
                    tx.preallocate(ino, inode, from, to, &mut reached)?;
                }
                inode.mtime = now;
                inode.ctime = now;
            } else {
                let mut reached = 0;
                let allocated = tx.preallocate(ino, inode, offset, end, &mut reached);
                inode.ctime = now;
                if let Err(error) = allocated {
                    // What was allocated stays, and so does the size that
                    // covers it, as the kernel leaves them.
                    if mode & FALLOC_FL_KEEP_SIZE == 0 && reached > inode.size {
                        inode.size = reached;
                        inode.mtime = now;
                    }
                    return Err(error);
                }
            }
            if mode & FALLOC_FL_KEEP_SIZE == 0 && end > inode.size {
                inode.size = end;
                inode.mtime = now;
            }
            Ok(())
        }
    }
}

impl Fs {
    /// SEEK_DATA / SEEK_HOLE from `offset`.
    pub fn seek(&self, ino: u32, offset: u64, whence: SeekWhence) -> Result<u64> {
        self.with_nothing_held(ino, || {
            let _inode = self.core.inodes.read(ino, Rank::Inode);
            if self.core.delayed.holds(ino) {
                return Ok(None); // a write held more meanwhile
            }
            self.seek_mapped(ino, offset, whence).map(Some)
        })
    }

    /// `seek` of a file that holds no delayed data (its inode lock held).
    fn seek_mapped(&self, ino: u32, offset: u64, whence: SeekWhence) -> Result<u64> {
        let result = (|| {
            let inode = read_inode(&self.core, ino)?;
            check_live(ino, &inode)?;
            if offset >= inode.size {
                return Err(Error::Io(std::io::Error::from_raw_os_error(libc::ENXIO)));
            }
            let geo = &self.core.geo;
            if inode.has_inline_data() {
                let data_end = inline::data_end(geo, ino, &inode)?;
                return match whence {
                    SeekWhence::Data if offset < data_end => Ok(offset),
                    SeekWhence::Data => {
                        Err(Error::Io(std::io::Error::from_raw_os_error(libc::ENXIO)))
                    }
                    SeekWhence::Hole => Ok(offset.max(data_end)),
                };
            }
            let block_size = geo.block_size as u64;
            let mut lblk = offset / block_size;
            let last = inode.size.div_ceil(block_size);
            while lblk < last {
                match self.core.lookup(ino, &inode, lblk)? {
                    // Unwritten extents read as zeros: they count as holes.
                    Lookup::Mapped(extent) if !extent.unwritten => {
                        if whence == SeekWhence::Data {
                            return Ok((lblk * block_size).max(offset));
                        }
                        lblk += extent.len as u64;
                    }
                    Lookup::Mapped(extent) => {
                        if whence == SeekWhence::Hole {
                            return Ok((lblk * block_size).max(offset));
                        }
                        lblk += extent.len as u64;
                    }
                    Lookup::Hole { next } => {
                        if whence == SeekWhence::Hole {
                            return Ok((lblk * block_size).max(offset));
                        }
                        lblk = next.unwrap_or(last);
                    }
                }
            }
            match whence {
                SeekWhence::Hole => Ok(inode.size),
                SeekWhence::Data => Err(Error::Io(std::io::Error::from_raw_os_error(libc::ENXIO))),
            }
        })();
        self.note_error(result)
    }

    /// fsync / fdatasync: the file's data and (for fsync, all of; for
    /// fdatasync, what reading the data needs of) its metadata are durable
    /// when this returns. Data is already on the device; it needs a
    /// barrier, and a commit only if the transaction holding the inode's
    /// change is not durable yet — an overwrite of allocated blocks commits
    /// nothing. The commit is a fast commit of the file's directory
    /// transaction where the image has them and the changes since the last
    /// full commit allow it (`fast_commit::commit`).
    pub fn fsync(&self, ino: u32, datasync: bool) -> Result<()> {
        self.check_device_healthy()?;
        self.write_out(ino, WriteOut::Fsync)?;
        if !self.core.journal.is_journaled() {
            return self.note_error(self.core.journal.sync());
        }
        let pending = self
            .core
            .inode_tids
            .lock()
            .get(ino)
            .map(|tids| if datasync { tids.datasync } else { tids.sync });
        let Some(tid) = pending else {
            return self.note_error(self.sync_data_of(ino));
        };
        if let Some(tracker) = &self.core.fast_commit {
            let is_dir = read_inode(&self.core, ino).is_ok_and(|inode| inode.is_dir());
            match self.note_error(self.fast_commit(tracker, ino, is_dir, tid))? {
                Outcome::Durable { data: true } => return Ok(()),
                Outcome::Durable { data: false } => return self.note_error(self.sync_data_of(ino)),
                Outcome::FullCommit => {}
            }
        }
        if self.note_error(self.core.journal.commit_and_wait(tid))? {
            return Ok(()); // the commit's final flush covered the data too
        }
        self.note_error(self.core.journal.flush_data())
    }

    /// Make the data `ino` wrote in place durable: a barrier over its
    /// ranges where they are known (another file's unsynced data stays
    /// where it is), a flush of the device otherwise.
    fn sync_data_of(&self, ino: u32) -> Result<()> {
        match self
            .core
            .fast_commit
            .as_ref()
            .and_then(|tracker| tracker.data_ranges([ino]))
        {
            Some(ranges) => self.core.journal.barrier(&ranges),
            None => self.core.journal.flush_data(),
        }
    }

    /// Attributes after a change made through a file handle.
    pub fn attr_after_write(&self, ino: u32) -> Result<Attr> {
        let result = attr_unlocked(&self.core, ino, |_| Ok(()));
        self.note_error(result)
    }
}

impl Tx<'_, '_> {
    /// Allocate unwritten extents over the holes of bytes `from..to`.
    /// Map `from..to` with unwritten extents where there are holes. On an
    /// error (ENOSPC part-way), `reached` says up to which byte the range
    /// is mapped from `from` on: the kernel's `ext4_alloc_file_blocks`
    /// grows the size that far before it fails.
    fn preallocate(
        &mut self,
        ino: u32,
        inode: &mut Inode,
        from: u64,
        to: u64,
        reached: &mut u64,
    ) -> Result<()> {
        let geo = &self.core.geo;
        let block_size = geo.block_size as u64;
        let mut lblk = from / block_size;
        let end = to.div_ceil(block_size);
        while lblk < end {
            match self.core.lookup(ino, inode, lblk)? {
                Lookup::Mapped(extent) => lblk += extent.len as u64,
                Lookup::Hole { next } => {
                    let hole_end = next.unwrap_or(u64::MAX).min(end);
                    let wanted = (hole_end - lblk).min(u32::MAX as u64) as u32;
                    let goal = geo.group_first_block(geo.group_of_inode(ino));
                    let mut ctx = self.meta_ctx();
                    let extent = mapping::allocate(&mut ctx, ino, inode, lblk, wanted, goal, true)?;
                    self.mapping_changed = true;
                    lblk = extent.logical + extent.len as u64;
                }
            }
            *reached = (lblk * block_size).min(to);
        }
        Ok(())
    }
}
