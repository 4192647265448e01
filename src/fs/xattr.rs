//! Extended attribute operations: the engine side of getxattr, listxattr,
//! setxattr and removexattr. The formats (in-inode area, xattr block,
//! ACL encoding) are in `format::xattr`.

use super::inode::{check_live, read_inode};
use super::{Caller, Fs};
use crate::error::{Error, Result};
use crate::format::MetaCtx;
use crate::format::acl::{self, AclEntry, tag};
use crate::format::inode::Inode;
use crate::format::inode::Timestamp;
use crate::format::superblock::compat;
use crate::format::xattr::{self, SetMode};
use crate::lock::Rank;

const ACL_ACCESS: &[u8] = b"system.posix_acl_access";

/// An xattr change: the format layer's own blocks plus the inode's.
const CREDITS_XATTR: u32 = xattr::SET_CREDITS + 1;
const XATTR_NAME_MAX: usize = 255;
const XATTR_SIZE_MAX: usize = 65536;

impl Fs {
    fn check_xattr_support(&self) -> Result<()> {
        if self.core.geo.has_compat(compat::EXT_ATTR) {
            Ok(())
        } else {
            Err(Error::NotSupported)
        }
    }

    pub fn getxattr(&self, ino: u32, name: &[u8]) -> Result<Vec<u8>> {
        self.check_xattr_support()?;
        let _inode = self.core.inodes.read(ino, Rank::Inode);
        let result = read_inode(&self.core, ino).and_then(|inode| {
            check_live(ino, &inode)?;
            xattr::get(&self.core.geo, &self.core.cache, ino, &inode, name)?
                .ok_or(Error::NoAttribute)
        });
        self.note_error(result)
    }

    /// Names of all attributes, with their namespace prefixes.
    pub fn listxattr(&self, ino: u32) -> Result<Vec<Vec<u8>>> {
        self.check_xattr_support()?;
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
        self.check_xattr_support()?;
        if name.len() > XATTR_NAME_MAX {
            return Err(Error::Range);
        }
        self.transact(CREDITS_XATTR, caller, |tx| {
            let _inode = tx.lock_write(ino, Rank::Inode);
            let mut inode = tx.read_live_inode(ino)?;
            self.check_not_freed(ino, &inode)?;
            let result = {
                let mut ctx = tx.meta_ctx();
                if name == ACL_ACCESS {
                    set_access_acl(&mut ctx, ino, &mut inode, value, mode)
                } else {
                    xattr::set(&mut ctx, ino, &mut inode, name, value, mode)
                }
            };
            if result.is_ok() {
                inode.ctime = Timestamp::now();
            }
            // Written even on error: a block may have been allocated.
            tx.write_inode(ino, &inode)?;
            result
        })
    }
}

/// Setting an access ACL also sets the mode (posix_acl_update_mode): the
/// owner, group-class (the mask when there is one) and other bits follow
/// the ACL, and an ACL that says no more than a mode is stored as the mode
/// alone. This is how `cp -a` and `setfacl` set permissions.
fn set_access_acl(
    ctx: &mut MetaCtx<'_, '_>,
    ino: u32,
    inode: &mut Inode,
    value: Option<&[u8]>,
    mode: SetMode,
) -> Result<()> {
    let Some(value) = value else {
        return xattr::set(ctx, ino, inode, ACL_ACCESS, None, mode);
    };
    let entries = acl::parse_xattr(value)?;
    if entries.is_empty() {
        return xattr::set(ctx, ino, inode, ACL_ACCESS, None, mode);
    }
    acl::validate(&entries)?;
    let permissions = mode_of_acl(&entries);
    if acl::acl_equivalent_mode(value).is_some() {
        match xattr::set(ctx, ino, inode, ACL_ACCESS, None, SetMode::Any) {
            Ok(()) | Err(Error::NoAttribute) => {}
            Err(error) => return Err(error),
        }
    } else {
        xattr::set(ctx, ino, inode, ACL_ACCESS, Some(value), mode)?;
    }
    inode.mode = (inode.mode & !0o777) | permissions;
    Ok(())
}

/// The permission bits an access ACL implies for the mode.
fn mode_of_acl(entries: &[AclEntry]) -> u16 {
    let mut permissions = 0;
    let mut group = 0;
    let mut mask = None;
    for entry in entries {
        let perm = entry.perm & acl::PERM_MASK;
        match entry.tag {
            tag::USER_OBJ => permissions |= perm << 6,
            tag::GROUP_OBJ => group = perm,
            tag::MASK => mask = Some(perm),
            tag::OTHER => permissions |= perm,
            _ => {}
        }
    }
    permissions | mask.unwrap_or(group) << 3
}

/// chmod of an inode with an access ACL rewrites the ACL's owner, mask (or
/// group) and other entries to the new mode (posix_acl_chmod).
pub(crate) fn chmod_access_acl(
    ctx: &mut MetaCtx<'_, '_>,
    ino: u32,
    inode: &mut Inode,
) -> Result<()> {
    let Some(value) = xattr::get(ctx.geo, ctx.cache, ino, inode, ACL_ACCESS)? else {
        return Ok(());
    };
    let mut entries = acl::parse_xattr(&value)?;
    let has_mask = entries.iter().any(|entry| entry.tag == tag::MASK);
    for entry in &mut entries {
        entry.perm = match entry.tag {
            tag::USER_OBJ => inode.mode >> 6 & 7,
            tag::MASK => inode.mode >> 3 & 7,
            tag::GROUP_OBJ if !has_mask => inode.mode >> 3 & 7,
            tag::OTHER => inode.mode & 7,
            _ => entry.perm,
        };
    }
    xattr::set(
        ctx,
        ino,
        inode,
        ACL_ACCESS,
        Some(&acl::encode_xattr(&entries)),
        SetMode::Any,
    )
}
