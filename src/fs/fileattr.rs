//! Inode flags and project ids as `lsattr`, `chattr` and `xfs_io
//! chattr` get and set them (FS_IOC_GETFLAGS/SETFLAGS,
//! FS_IOC_FSGETXATTR/FSSETXATTR; the kernel's ext4_fileattr_get and
//! ext4_fileattr_set): which flags a user sees and may change, who may
//! change them, and the one transaction that changes flags and project id
//! together (its quota usage moving with the id). What +i and +a forbid
//! once set is `iflags.rs`; +j's effect, `data_journal.rs`; +F's,
//! `format/casefold`.

use super::{Caller, Fs, Scope, Tx};
use crate::error::{Error, Result};
use crate::format::inode::{Inode, flags};

/// ext4's inode flags and the FS_XFLAG_* bits FS_IOC_FSGETXATTR shows them
/// as (ext4_iflags_to_xflags).
const XFLAGS: [(u32, u32); 7] = [
    (flags::SYNC, 0x0000_0020),
    (flags::IMMUTABLE, 0x0000_0008),
    (flags::APPEND, 0x0000_0010),
    (flags::NODUMP, 0x0000_0080), // FS_XFLAG_NODUMP
    (flags::NOATIME, 0x0000_0040),
    (flags::PROJINHERIT, FS_XFLAG_PROJINHERIT),
    (0x0200_0000, 0x0000_8000), // EXT4_DAX_FL, FS_XFLAG_DAX
];

/// EXT4_FL_USER_VISIBLE and EXT4_FL_USER_MODIFIABLE (fs/ext4/ext4.h).
const FL_USER_VISIBLE: u32 = 0x705B_DFFF;
const FL_USER_MODIFIABLE: u32 = 0x604B_C0FF;

/// FS_XFLAG_PROJINHERIT: new entries of the directory take its project.
pub const FS_XFLAG_PROJINHERIT: u32 = 0x0000_0200;

fn xflags_of(inode: &Inode) -> u32 {
    XFLAGS
        .iter()
        .filter(|(flag, _)| inode.has_flag(*flag))
        .fold(0, |xflags, (_, xflag)| xflags | xflag)
}

impl Fs {
    /// FS_IOC_FSGETXATTR: the inode's flags as FS_XFLAG_* bits, and its
    /// project id.
    pub fn fs_xattr(&self, ino: u32) -> Result<(u32, u32)> {
        let _inode = self.core.inodes.read(ino, crate::lock::Rank::Inode);
        let inode = self.read_file_inode(ino)?;
        Ok((xflags_of(&inode), inode.projid))
    }

    /// Whether the filesystem has casefolded directories or may have
    /// (the casefold feature).
    pub fn may_casefold(&self) -> bool {
        self.core.geo.encoding.is_some()
    }

    /// Whether `ino` is a casefolded directory, whose names match others
    /// spelled in another case. A FUSE front end must not let the kernel
    /// cache its names: a FUSE mount's dentries match byte for byte.
    pub fn is_casefolded(&self, ino: u32) -> bool {
        if self.core.geo.encoding.is_none() {
            return false;
        }
        let _inode = self.core.inodes.read(ino, crate::lock::Rank::Inode);
        self.read_file_inode(ino)
            .is_ok_and(|inode| inode.is_dir() && inode.has_flag(flags::CASEFOLD))
    }

    /// FS_IOC_GETFLAGS: the inode's flags a user may see
    /// (EXT4_FL_USER_VISIBLE), as `lsattr` shows them.
    pub fn inode_flags(&self, ino: u32) -> Result<u32> {
        let _inode = self.core.inodes.read(ino, crate::lock::Rank::Inode);
        Ok(self.read_file_inode(ino)?.flags & FL_USER_VISIBLE)
    }

    /// FS_IOC_SETFLAGS (`chattr`), for the flags jext4 keeps and acts on
    /// (`FL_CHANGEABLE`): +i and +a (`iflags`), +d, +A, +S, and a
    /// directory's +D, +P (EXT4_PROJINHERIT_FL) and +F (EXT4_CASEFOLD_FL).
    /// A change of another flag a user may set (EXT4_FL_USER_MODIFIABLE)
    /// is EOPNOTSUPP, as is setting one the kind of file cannot have
    /// (ext4_mask_flags); the others are not the caller's and stay as
    /// they are, as in ext4_fileattr_set.
    ///
    /// +F changes only on a filesystem with casefold (else EOPNOTSUPP),
    /// only for a directory (EOPNOTSUPP to set it on anything else, as
    /// ext4_mask_flags strips it; ENOTDIR to clear a stray one) and an
    /// empty one (ENOTEMPTY): its names would otherwise be hashed and
    /// matched by rules they were not stored under.
    pub fn set_inode_flags(&self, ino: u32, new: u32, caller: Caller) -> Result<()> {
        self.change_attributes(ino, caller, |inode| {
            let flags = (inode.flags & !FL_USER_MODIFIABLE) | (new & FL_USER_MODIFIABLE);
            Ok((flags, inode.projid))
        })
    }

    /// FS_IOC_FSSETXATTR for what jext4 keeps: the project id (its quota
    /// usage moves with it) and the flags FS_XFLAG_* bits stand for
    /// (`XFLAGS`; those `set_inode_flags` changes), as
    /// ext4_ioctl_setproject and ext4_fileattr_set do. A project id
    /// without the project feature is EOPNOTSUPP, and in an inode without
    /// room for one EOVERFLOW. The caller's permission is the kernel's
    /// VFS's to check (inode_owner_or_capable, before FUSE passes the
    /// request on).
    ///
    /// A new project id must take the inode's usage within its quota
    /// limits (EDQUOT, as `dquot_transfer`), unless `caller` is bound by
    /// none.
    pub fn set_fs_xattr(&self, ino: u32, xflags: u32, projid: u32, caller: Caller) -> Result<()> {
        self.change_attributes(ino, caller, |inode| {
            let flags = XFLAGS.iter().fold(inode.flags, |flags, &(flag, xflag)| {
                match xflags & xflag != 0 {
                    true => flags | flag,
                    false => flags & !flag,
                }
            });
            Ok((flags, projid))
        })
    }

    /// Give inode `ino` the flags and project id `wanted` says from its
    /// current state (`set_fs_xattr`, `set_inode_flags`).
    fn change_attributes(
        &self,
        ino: u32,
        caller: Caller,
        wanted: impl Fn(&Inode) -> Result<(u32, u32)>,
    ) -> Result<()> {
        let geo = &self.core.geo;
        let project = geo.has_ro_compat(crate::format::superblock::ro_compat::PROJECT);
        self.transact(Scope::File(ino), 2, caller, |tx| {
            let _inode = tx.lock_write(ino, crate::lock::Rank::Inode);
            let mut inode = tx.read_live_inode(ino)?;
            let (new_flags, projid) = wanted(&inode)?;
            let new_flags = tx.change_journal_flag(ino, &inode, new_flags)?;
            let changed = new_flags ^ inode.flags;
            let kind_mask = flags::kind_mask(inode.mode);
            if changed & !FL_CHANGEABLE != 0 || new_flags & changed & !kind_mask != 0 {
                return Err(Error::NotSupported);
            }
            super::iflags::check_flag_change(inode.flags, new_flags, || {
                caller.capable_linux_immutable()
            })?;
            if changed & flags::CASEFOLD != 0 {
                tx.check_casefold_change(ino, &inode, new_flags & flags::CASEFOLD != 0)?;
            }
            if projid != inode.projid {
                // ext4_ioctl_check_immutable: an immutable inode keeps it.
                super::iflags::check_writable(&inode)?;
                if !project {
                    return Err(Error::NotSupported);
                }
                if inode.extra_isize < PROJID_EXTRA_ISIZE {
                    return Err(Error::Overflow);
                }
                tx.grant_transfer(ino, &inode, [inode.uid, inode.gid, projid])?;
                inode.projid = projid;
            }
            inode.flags = new_flags;
            inode.ctime = crate::format::inode::Timestamp::now();
            if inode.is_dir() {
                tx.handle.note(crate::journal::change::Change::Ineligible(
                    crate::journal::change::Ineligible::DirAttributes,
                ));
            }
            tx.write_inode(ino, &inode)
        })
    }
}

/// The flags `set_inode_flags` changes: each kept, and acted on where it
/// asks for something (`iflags` for +i and +a; +S and +D make the
/// changes synchronous, +A keeps atime, +P and +F as above, +j
/// journals a file's data (`data_journal.rs`); +d, nodump, is for
/// dump(8) alone).
const FL_CHANGEABLE: u32 = flags::SYNC
    | flags::JOURNAL_DATA
    | flags::IMMUTABLE
    | flags::APPEND
    | flags::NODUMP
    | flags::NOATIME
    | flags::DIRSYNC
    | flags::PROJINHERIT
    | flags::CASEFOLD;

impl Tx<'_, '_> {
    /// Whether directory `ino` may be made casefolded (`casefold`) or not
    /// (ext4_ioctl_setflags; its lock is held, so it stays empty).
    fn check_casefold_change(&self, ino: u32, inode: &Inode, casefold: bool) -> Result<()> {
        if self.core.geo.encoding.is_none() {
            return Err(Error::NotSupported);
        }
        if !inode.is_dir() {
            return Err(match casefold {
                true => Error::NotSupported,
                false => Error::NotDirectory,
            });
        }
        let mut dir = crate::engine::fs::dirops::DirReader::new(self.core, ino, inode);
        if !crate::format::dir::is_empty(&mut dir)? {
            return Err(Error::NotEmpty);
        }
        Ok(())
    }
}

/// The `i_extra_isize` that reaches past `i_projid` (EXT4_FITS_IN_INODE).
const PROJID_EXTRA_ISIZE: u16 = 32;
