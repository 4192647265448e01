//! POSIX ACL semantics, as the kernel's fs/posix_acl.c applies them to ext4
//! (`ext4_init_acl`, `ext4_set_acl`, `posix_acl_chmod`): a new inode
//! inherits its directory's default ACL with its mode masked by it (or by
//! the umask when there is none); setting an access ACL sets the mode, and
//! chmod rewrites the access ACL.
//!
//! With `FUSE_POSIX_ACL` the kernel enforces ACLs in its permission checks
//! but leaves all of this to the server (libfuse's FUSE_CAP_POSIX_ACL); the
//! library API gets the same from here. The encodings are `format::acl`'s.

use super::Caller;
use crate::error::Result;
use crate::format::MetaCtx;
use crate::format::acl::{self, AclEntry, tag};
use crate::format::inode::{self as fmt, Inode};
use crate::format::xattr::{self, SetMode};

pub(crate) const ACL_ACCESS: &[u8] = b"system.posix_acl_access";
pub(crate) const ACL_DEFAULT: &[u8] = b"system.posix_acl_default";

/// Journal credits for the ACLs a new inode inherits (an access and a
/// default ACL).
pub(crate) const INHERIT_CREDITS: u32 = 2 * xattr::SET_CREDITS;

const S_ISGID: u16 = 0o2000;

/// The ACLs a new inode takes from its directory, in the VFS xattr format.
#[derive(Debug, Default)]
pub(crate) struct Inherited {
    access: Option<Vec<u8>>,
    default: Option<Vec<u8>>,
}

/// `posix_acl_create`: restrict `mode` (of a new inode in a directory whose
/// default ACL is `parent_default`, in the VFS xattr format) and say which
/// ACLs the inode gets. Without a default ACL the umask applies; with one it
/// does not, and the inode's owner, group-class and other permissions are
/// the intersection of the ACL's and the mode's. Symbolic links get
/// neither (their mode is always 0777).
pub(crate) fn inherit(
    parent_default: Option<&[u8]>,
    mode: &mut u16,
    caller: &Caller,
) -> Result<Inherited> {
    if *mode & fmt::S_IFMT == fmt::S_IFLNK {
        return Ok(Inherited::default());
    }
    let Some(default) = parent_default else {
        *mode &= !(caller.umask & 0o777);
        return Ok(Inherited::default());
    };
    let mut entries = acl::parse_xattr(default)?;
    if entries.is_empty() {
        *mode &= !(caller.umask & 0o777);
        return Ok(Inherited::default());
    }
    acl::validate(&entries)?;
    let extended = create_masq(&mut entries, mode);
    let is_dir = *mode & fmt::S_IFMT == fmt::S_IFDIR;
    Ok(Inherited {
        access: extended.then(|| acl::encode_xattr(&entries)),
        default: is_dir.then(|| default.to_vec()),
    })
}

/// Store what `inherit` decided on the new inode (not yet written back).
pub(crate) fn apply_inherited(
    ctx: &mut MetaCtx<'_, '_>,
    ino: u32,
    inode: &mut Inode,
    inherited: &Inherited,
) -> Result<()> {
    debug_assert!(inherited.default.is_none() || inode.is_dir());
    for (name, value) in [
        (ACL_DEFAULT, &inherited.default),
        (ACL_ACCESS, &inherited.access),
    ] {
        if let Some(value) = value {
            xattr::set(ctx, ino, inode, name, Some(value), SetMode::Any)?;
        }
    }
    Ok(())
}

/// `posix_acl_create_masq`: mask the inherited entries by the requested
/// mode and the mode by the entries. True when the ACL says more than the
/// mode can (named entries or a mask): then it is stored.
fn create_masq(entries: &mut [AclEntry], mode: &mut u16) -> bool {
    let mut extended = false;
    let mut group_class = None;
    for (index, entry) in entries.iter_mut().enumerate() {
        match entry.tag {
            tag::USER_OBJ => {
                entry.perm &= *mode >> 6 & 7;
                *mode &= entry.perm << 6 | !0o700;
            }
            tag::OTHER => {
                entry.perm &= *mode & 7;
                *mode &= entry.perm | !0o007;
            }
            // The mask stands for the group class when there is one.
            tag::MASK => {
                group_class = Some(index);
                extended = true;
            }
            tag::GROUP_OBJ if group_class.is_none() => group_class = Some(index),
            tag::USER | tag::GROUP => extended = true,
            _ => {}
        }
    }
    // validate() guarantees a GROUP_OBJ entry.
    if let Some(index) = group_class {
        let entry = &mut entries[index];
        entry.perm &= *mode >> 3 & 7;
        *mode &= entry.perm << 3 | !0o070;
    }
    extended
}

/// `posix_acl_equiv_mode`: the permission bits an access ACL gives the
/// mode (the mask stands for the group class), and whether it says more
/// than they can.
fn equivalent_mode(entries: &[AclEntry]) -> (u16, bool) {
    let mut permissions = 0;
    let mut extended = false;
    let mut mask = None;
    for entry in entries {
        let perm = entry.perm & acl::PERM_MASK;
        match entry.tag {
            tag::USER_OBJ => permissions |= perm << 6,
            tag::GROUP_OBJ => permissions |= perm << 3,
            tag::OTHER => permissions |= perm,
            tag::MASK => {
                mask = Some(perm);
                extended = true;
            }
            _ => extended = true,
        }
    }
    if let Some(mask) = mask {
        permissions = permissions & !0o070 | mask << 3;
    }
    (permissions, extended)
}

/// Set or remove the access ACL, as `ext4_set_acl` with
/// `posix_acl_update_mode`: the mode follows the ACL, an ACL that says no
/// more than a mode is stored as the mode alone, and setgid is cleared
/// unless the caller is in the file's group or has CAP_FSETID. Removing
/// the ACL leaves the mode as it is.
pub(crate) fn set_access(
    ctx: &mut MetaCtx<'_, '_>,
    ino: u32,
    inode: &mut Inode,
    value: Option<&[u8]>,
    caller: &Caller,
) -> Result<()> {
    let entries = match value {
        Some(value) => acl::parse_xattr(value)?,
        None => Vec::new(),
    };
    // An ACL without entries means "no ACL" (posix_acl_from_xattr).
    if entries.is_empty() {
        return xattr::set(ctx, ino, inode, ACL_ACCESS, None, SetMode::Any);
    }
    acl::validate(&entries)?;
    let (permissions, extended) = equivalent_mode(&entries);
    let stored = extended.then_some(value).flatten();
    xattr::set(ctx, ino, inode, ACL_ACCESS, stored, SetMode::Any)?;
    inode.mode = inode.mode & !0o777 | permissions;
    if inode.mode & S_ISGID != 0 && !caller.in_group_or_capable(inode.gid) {
        inode.mode &= !S_ISGID;
    }
    Ok(())
}

/// `posix_acl_chmod`: after a chmod of an inode with an access ACL, the
/// ACL's owner, group-class (the mask when there is one) and other entries
/// take the new mode's bits; named entries stay.
pub(crate) fn chmod(ctx: &mut MetaCtx<'_, '_>, ino: u32, inode: &mut Inode) -> Result<()> {
    let Some(value) = xattr::get(ctx.geo, ctx.cache, ino, inode, ACL_ACCESS)? else {
        return Ok(());
    };
    let mut entries = acl::parse_xattr(&value)?;
    chmod_masq(&mut entries, inode.mode);
    xattr::set(
        ctx,
        ino,
        inode,
        ACL_ACCESS,
        Some(&acl::encode_xattr(&entries)),
        SetMode::Any,
    )
}

/// `__posix_acl_chmod_masq`.
fn chmod_masq(entries: &mut [AclEntry], mode: u16) {
    let has_mask = entries.iter().any(|entry| entry.tag == tag::MASK);
    for entry in entries {
        entry.perm = match entry.tag {
            tag::USER_OBJ => mode >> 6 & 7,
            tag::MASK => mode >> 3 & 7,
            tag::GROUP_OBJ if !has_mask => mode >> 3 & 7,
            tag::OTHER => mode & 7,
            _ => entry.perm,
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::acl::UNDEFINED_ID;

    fn entry(tag: u16, perm: u16, id: u32) -> AclEntry {
        AclEntry { tag, perm, id }
    }

    fn minimal(user: u16, group: u16, other: u16) -> Vec<AclEntry> {
        vec![
            entry(tag::USER_OBJ, user, UNDEFINED_ID),
            entry(tag::GROUP_OBJ, group, UNDEFINED_ID),
            entry(tag::OTHER, other, UNDEFINED_ID),
        ]
    }

    fn with_named(mask: u16) -> Vec<AclEntry> {
        vec![
            entry(tag::USER_OBJ, 7, UNDEFINED_ID),
            entry(tag::USER, 7, 1000),
            entry(tag::GROUP_OBJ, 5, UNDEFINED_ID),
            entry(tag::MASK, mask, UNDEFINED_ID),
            entry(tag::OTHER, 5, UNDEFINED_ID),
        ]
    }

    #[test]
    fn inheritance_masks_mode_and_acl_both_ways() {
        let caller = Caller {
            umask: 0o077,
            ..Caller::ROOT
        };
        // A default ACL: the umask is ignored, the mode meets the ACL.
        let default = acl::encode_xattr(&with_named(7));
        let mut mode = fmt::S_IFREG | 0o664;
        let inherited = inherit(Some(&default), &mut mode, &caller).unwrap();
        assert_eq!(mode, fmt::S_IFREG | 0o664);
        assert!(inherited.default.is_none(), "files take no default ACL");
        let access = acl::parse_xattr(inherited.access.as_ref().unwrap()).unwrap();
        assert_eq!(access[0].perm, 6, "owner: rwx & rw-");
        assert_eq!(access[3].perm, 6, "mask: rwx & rw-");
        assert_eq!(access[4].perm, 4, "other: r-x & r--");
        assert_eq!(access[1].perm, 7, "named entries are kept as they are");
        // A directory keeps the default ACL as its own.
        let mut mode = fmt::S_IFDIR | 0o2755;
        let inherited = inherit(Some(&default), &mut mode, &caller).unwrap();
        assert_eq!(mode, fmt::S_IFDIR | 0o2755);
        assert_eq!(inherited.default.as_deref(), Some(&default[..]));
        // A minimal default ACL: only the mode changes.
        let default = acl::encode_xattr(&minimal(6, 4, 0));
        let mut mode = fmt::S_IFREG | 0o666;
        let inherited = inherit(Some(&default), &mut mode, &caller).unwrap();
        assert_eq!(mode, fmt::S_IFREG | 0o640);
        assert!(inherited.access.is_none());
        // No default ACL: the umask.
        let mut mode = fmt::S_IFREG | 0o4666;
        inherit(None, &mut mode, &caller).unwrap();
        assert_eq!(mode, fmt::S_IFREG | 0o4600);
        // Symbolic links: neither.
        let mut mode = fmt::S_IFLNK | 0o777;
        let inherited = inherit(Some(&default), &mut mode, &caller).unwrap();
        assert_eq!(mode, fmt::S_IFLNK | 0o777);
        assert!(inherited.access.is_none() && inherited.default.is_none());
    }

    #[test]
    fn mode_follows_acl_and_acl_follows_chmod() {
        assert_eq!(equivalent_mode(&minimal(6, 4, 1)), (0o641, false));
        assert_eq!(equivalent_mode(&with_named(3)), (0o735, true));
        let mut entries = with_named(7);
        chmod_masq(&mut entries, 0o640);
        assert_eq!(
            entries.iter().map(|e| e.perm).collect::<Vec<_>>(),
            [6, 7, 5, 4, 0],
            "the mask takes the group bits; GROUP_OBJ and named entries stay"
        );
        let mut entries = minimal(7, 7, 7);
        chmod_masq(&mut entries, 0o751);
        assert_eq!(equivalent_mode(&entries), (0o751, false));
    }
}
