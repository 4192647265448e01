//! Extended attribute operations: the engine side of getxattr, listxattr,
//! setxattr and removexattr. The formats (in-inode area, xattr block,
//! ACL encoding) are in `format::xattr`.

use super::acl::{self, ACL_ACCESS};
use super::inode::{check_live, read_inode};
use super::{Caller, Fs, Scope};
use crate::error::{Error, Location, Result};
use crate::format::inode::Inode;
use crate::format::inode::Timestamp;
use crate::format::superblock::compat;
use crate::format::xattr::{self, Located, SetMode};
use crate::lock::Rank;

/// An xattr change: the format layer's own blocks, the inode's and, for
/// the first attribute of the filesystem, the superblock's.
const CREDITS_XATTR: u32 = xattr::SET_CREDITS + 2;
const XATTR_SIZE_MAX: usize = 65536;

impl Fs {
    // No `ext_attr` feature (old ext2 images, the Hurd's) is not "no
    // xattrs allowed": like the kernel, reading finds none (ENODATA, an
    // empty list — the answer FUSE's ACL check needs to fall back to the
    // mode bits) and the first set turns the feature on.
    pub fn getxattr(&self, ino: u32, name: &[u8]) -> Result<Vec<u8>> {
        let _inode = self.core.inodes.read(ino, Rank::Inode);
        let result = read_inode(&self.core, ino).and_then(|inode| {
            check_live(ino, &inode)?;
            match xattr::locate(&self.core.geo, &self.core.cache, ino, &inode, name)? {
                Some(Located::Value(value)) => Ok(value),
                Some(Located::InInode(value)) => self.read_ea_inode(ino, &inode, &value),
                None => Err(Error::NoAttribute),
            }
        });
        self.note_error(result)
    }

    /// A value kept in an EA inode (ea_inode), read as a file's data and
    /// checked as the kernel checks it. The EA inode is not locked: images
    /// with EA inodes mount read-only, so nothing changes it meanwhile.
    fn read_ea_inode(&self, owner: u32, inode: &Inode, value: &xattr::EaValue) -> Result<Vec<u8>> {
        debug_assert!(
            self.is_read_only(),
            "EA inodes are read on read-only mounts only"
        );
        // The kernel's iget refuses reserved inodes (EXT4_IGET_EA_INODE).
        if value.ino < self.core.geo.first_ino {
            return Err(Error::corrupt(
                Location::Inode { ino: owner },
                format!("xattr value in reserved inode {}", value.ino),
            ));
        }
        let ea_inode = read_inode(&self.core, value.ino)?;
        let data = match value.size {
            0 => Vec::new(),
            size => self.read_range(value.ino, &ea_inode, 0, size as u64)?,
        };
        xattr::check_ea_inode_value(
            &self.core.geo,
            owner,
            inode.generation,
            value,
            &ea_inode,
            data,
        )
    }

    /// Names of all attributes, with their namespace prefixes.
    pub fn listxattr(&self, ino: u32) -> Result<Vec<Vec<u8>>> {
        let _inode = self.core.inodes.read(ino, Rank::Inode);
        let result = read_inode(&self.core, ino).and_then(|inode| {
            check_live(ino, &inode)?;
            xattr::list(&self.core.geo, &self.core.cache, ino, &inode)
        });
        self.note_error(result)
    }

    pub fn setxattr(
        &self,
        ino: u32,
        name: &[u8],
        value: &[u8],
        mode: SetMode,
        caller: Caller,
    ) -> Result<()> {
        if value.len() > XATTR_SIZE_MAX {
            return Err(Error::Range);
        }
        self.change_xattr(ino, name, Some(value), mode, caller)
    }

    pub fn removexattr(&self, ino: u32, name: &[u8], caller: Caller) -> Result<()> {
        self.change_xattr(ino, name, None, SetMode::Replace, caller)
    }

    fn change_xattr(
        &self,
        ino: u32,
        name: &[u8],
        value: Option<&[u8]>,
        mode: SetMode,
        caller: Caller,
    ) -> Result<()> {
        if name.len() > xattr::XATTR_NAME_MAX {
            return Err(Error::Range);
        }
        self.transact(Scope::File(ino), CREDITS_XATTR, caller, |tx| {
            let _inode = tx.lock_write(ino, Rank::Inode);
            let mut inode = tx.read_live_inode(ino)?;
            self.check_not_freed(ino, &inode)?;
            let result = {
                let mut ctx = tx.meta_ctx();
                if name == ACL_ACCESS {
                    acl::set_access(&mut ctx, ino, &mut inode, value, &caller)
                } else {
                    xattr::set(&mut ctx, ino, &mut inode, name, value, mode)
                }
            };
            if result.is_ok() {
                inode.ctime = Timestamp::now();
            }
            // Written even on error: a block may have been allocated.
            tx.write_inode(ino, &inode)?;
            result?;
            if value.is_some() {
                announce_ext_attr(tx)?;
            }
            Ok(())
        })
    }
}

/// Set `ext_attr` in the superblock, in the transaction that stores the
/// first attribute (the kernel's `ext4_xattr_update_super_block`), so that
/// e2fsck and older kernels know to look for them.
fn announce_ext_attr(tx: &super::Tx<'_, '_>) -> Result<()> {
    let mut sb = tx.core.sbi.lock();
    if sb.has_compat(compat::EXT_ATTR) {
        return Ok(());
    }
    sb.feature_compat |= compat::EXT_ATTR;
    tx.core.sbi.write(&sb, tx.handle)
}
