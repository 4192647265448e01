//! What the flags `chattr +i` (immutable) and `+a` (append only) forbid.
//!
//! The kernel's VFS checks them (IS_IMMUTABLE, IS_APPEND) before a
//! filesystem sees a request; for a FUSE mount it cannot, since FUSE
//! passes no inode flags, so the engine checks them for every front end,
//! with the VFS's answers (EPERM, root included):
//! - an immutable inode changes in no way: not its data, size, mode,
//!   owner, times, attributes or names (it is neither linked, renamed
//!   nor removed), and an immutable directory's entries do not change;
//! - an append-only file grows only at its end (opened for writing only
//!   with O_APPEND, never truncated), and keeps its mode, owner, explicit
//!   times, attributes and names; an append-only directory takes new
//!   entries but loses none.
//!
//! Only a caller with CAP_LINUX_IMMUTABLE sets or clears them; while +i
//! holds, no other flag of the inode changes.

use crate::error::{Error, Result};
use crate::format::inode::{Inode, flags};

/// Immutable or append only: its attributes and names are fixed
/// (notify_change's ATTR_MODE/UID/GID/TIMES_SET check, may_delete,
/// vfs_link, xattr_permission).
pub(super) fn check_attributes_changeable(inode: &Inode) -> Result<()> {
    match inode.has_flag(flags::IMMUTABLE) || inode.has_flag(flags::APPEND) {
        true => Err(Error::NotPermitted),
        false => Ok(()),
    }
}

/// An immutable inode refuses writes of any kind, its times set to now
/// included (inode_permission's MAY_WRITE).
pub(super) fn check_writable(inode: &Inode) -> Result<()> {
    match inode.has_flag(flags::IMMUTABLE) {
        true => Err(Error::NotPermitted),
        false => Ok(()),
    }
}

/// A directory whose entries a new name may join: not immutable.
pub(super) fn check_dir_addable(dir: &Inode) -> Result<()> {
    check_writable(dir)
}

/// A directory an entry may leave: neither immutable nor append only
/// (may_delete).
pub(super) fn check_dir_removable(dir: &Inode) -> Result<()> {
    check_attributes_changeable(dir)
}

/// What an open may ask of a file: an immutable one opens for reading
/// only; an append-only one for writing only with O_APPEND, never with
/// O_TRUNC (may_open).
pub(super) fn check_open(inode: &Inode, write: bool, append: bool, truncate: bool) -> Result<()> {
    if inode.has_flag(flags::IMMUTABLE) && (write || truncate) {
        return Err(Error::NotPermitted);
    }
    if inode.has_flag(flags::APPEND) && ((write && !append) || truncate) {
        return Err(Error::NotPermitted);
    }
    Ok(())
}

/// A change of the data of a file by a caller: at `offset` (None for a
/// truncate or an fallocate that changes the size): nothing of an
/// immutable file, only appends to an append-only one.
pub(super) fn check_data_change(inode: &Inode, offset: Option<u64>) -> Result<()> {
    check_writable(inode)?;
    match (inode.has_flag(flags::APPEND), offset) {
        (false, _) => Ok(()),
        (true, Some(offset)) if offset >= inode.size => Ok(()),
        (true, _) => Err(Error::NotPermitted),
    }
}

/// chattr from `old` to `new` flags: +i and +a change only with
/// CAP_LINUX_IMMUTABLE (`capable`, asked only then), and while +i stays
/// no other flag does (ext4_ioctl_check_immutable).
pub(super) fn check_flag_change(old: u32, new: u32, capable: impl Fn() -> bool) -> Result<()> {
    let guarded = flags::IMMUTABLE | flags::APPEND;
    if (old ^ new) & guarded != 0 && !capable() {
        return Err(Error::NotPermitted);
    }
    if old & new & flags::IMMUTABLE != 0 && (old ^ new) & !flags::IMMUTABLE != 0 {
        return Err(Error::NotPermitted);
    }
    Ok(())
}
