//! Regular files whose data lives in the inode (inline_data): writes that
//! stay there, and the move to a block when one does not fit. The bytes'
//! layout is `format::inline`'s; directories are `format::dir`'s, through
//! `DirWriter`.
//!
//! As the kernel does it (fs/ext4/inline.c):
//! - A new, empty file becomes inline at its first write that ends within
//!   the inode's room (`inline::max_size`: 60 bytes of i_block and the
//!   `system.data` value the body has room for — 128 bytes in all in a
//!   256-byte inode); the value grows to exactly the write's end.
//! - A write past the room, a fallocate, a truncate that grows the file
//!   past its inline bytes, or enabling fs-verity moves the data to block
//!   0 first (ext4_convert_inline_data): the inode loses its inline bytes
//!   in the same transaction that maps the block and writes them there
//!   (ordered data, before the commit), so a crash never leaves the file
//!   without them.
//! - A truncate that shrinks the file shrinks its inline bytes
//!   (ext4_inline_data_truncate); the file stays inline, even at size 0.
//!
//! One difference: the kernel tries inline only for inodes it created in
//! this mount (EXT4_STATE_MAY_INLINE_DATA, an in-memory state). jext4 has
//! no such state; it takes any empty file that maps nothing for one. Both
//! layouts are valid ext4, and the kernel reads either.

use super::Tx;
use crate::error::Result;
use crate::format::extent;
use crate::format::inline;
use crate::format::inode::{I_BLOCK_SIZE, Inode};
use crate::format::superblock::incompat;

impl Tx<'_, '_> {
    /// A write of `data` at `offset` to a file whose data is, or may
    /// become, inline: `Some(length)` when it was made in the inode;
    /// `None` when the file maps blocks (moved there now if it was inline)
    /// and the write goes the usual way. The caller writes the inode.
    pub(super) fn write_inline(
        &mut self,
        ino: u32,
        inode: &mut Inode,
        offset: u64,
        data: &[u8],
    ) -> Result<Option<usize>> {
        let geo = &self.core.geo;
        if !geo.has_incompat(incompat::INLINE_DATA) {
            return Ok(None);
        }
        let inline = inode.has_inline_data();
        // Data held by delayed allocation is the file's too, though its
        // size on disk does not show it yet.
        if !inline && (!may_become_inline(inode) || self.core.delayed.holds(ino)) {
            return Ok(None);
        }
        let end = offset + data.len() as u64;
        if end <= inline::max_size(geo, ino, inode)? as u64 {
            let stored = match inline {
                true => inline::stored_bytes(geo, ino, inode)?,
                false => vec![0; I_BLOCK_SIZE],
            };
            inline::store(geo, ino, inode, &inline::written(stored, offset, data))?;
            inode.size = inode.size.max(end);
            self.mapping_changed = true;
            return Ok(Some(data.len()));
        }
        if inline {
            self.convert_inline_file(ino, inode)?;
        }
        Ok(None)
    }

    /// Move an inline file's data to block 0 (ext4_convert_inline_data):
    /// the block charged first, so that a full volume fails the operation
    /// before anything changes; then, in this transaction, the inline
    /// bytes taken out of the inode and written to the new block. The
    /// kernel maps block 0 whatever the size, and so does this.
    pub(super) fn convert_inline_file(&mut self, ino: u32, inode: &mut Inode) -> Result<()> {
        debug_assert!(inode.is_reg() && inode.has_inline_data());
        let geo = &self.core.geo;
        let mut bytes = inline::stored_bytes(geo, ino, inode)?;
        // What lies past the size reads as zeros, and must stay so.
        let size = inode.size;
        if (size as usize) < bytes.len() {
            bytes[size as usize..].fill(0);
        }
        self.charge(1)?;
        inline::destroy(geo, ino, inode)?;
        self.mapping_changed = true;
        let written = self.write_data(ino, inode, 0, &bytes)?;
        debug_assert_eq!(written, bytes.len());
        debug_assert!(!inode.has_inline_data() && inode.blocks > 0);
        // The block holds the bytes; the size stays what it was.
        inode.size = size;
        Ok(())
    }

    /// Cut or grow an inline file to `size`: shrunk in place, or moved to
    /// a block when it grows past its inline bytes (as ext4_setattr does).
    /// The caller sets the times and writes the inode.
    pub(super) fn truncate_inline(&mut self, ino: u32, inode: &mut Inode, size: u64) -> Result<()> {
        debug_assert!(inode.has_inline_data());
        let geo = &self.core.geo;
        let stored = inline::stored_bytes(geo, ino, inode)?;
        if size > stored.len() as u64 {
            self.convert_inline_file(ino, inode)?;
            return self.truncate_to(ino, inode, size);
        }
        if size < inode.size {
            inline::store(geo, ino, inode, &inline::truncated(stored, size))?;
        }
        inode.size = size;
        self.mapping_changed = true;
        Ok(())
    }
}

/// Whether a regular file may take inline data at its next write: empty,
/// and mapping nothing (an empty extent root, as a new file has).
fn may_become_inline(inode: &Inode) -> bool {
    inode.is_reg()
        && inode.size == 0
        && inode.uses_extents()
        && extent::depth(inode) == 0
        && extent::root_entries(inode) == 0
}
