//! POSIX ACLs in their two encodings.
//!
//! Userspace reads and writes `system.posix_acl_access` / `_default` in the
//! VFS xattr format (linux/posix_acl_xattr.h): a 4-byte header holding
//! version 2, then 8-byte entries {tag u16, perm u16, id u32}, where entries
//! that name no user or group carry the undefined id 0xFFFFFFFF.
//!
//! ext4 stores the compact format of fs/ext4/acl.h instead: a 4-byte header
//! holding version 1, then entries that are 4 bytes {tag, perm} for
//! USER_OBJ, GROUP_OBJ, MASK and OTHER and 8 bytes {tag, perm, id} for USER
//! and GROUP. All fields are little-endian in both formats.
//!
//! Conversion to disk validates like the kernel's `posix_acl_from_xattr`
//! followed by `posix_acl_valid`; conversion from disk checks what
//! `ext4_acl_from_disk` checks (version, the entry count implied by the
//! size, known tags).

use super::{get_u16, get_u32, put_u16, put_u32};
use crate::error::{Error, Result};

/// `a_version` of the VFS xattr format.
pub const POSIX_ACL_XATTR_VERSION: u32 = 2;
/// `a_version` of ext4's on-disk format.
pub const EXT4_ACL_VERSION: u32 = 1;

/// Entry tags (linux/posix_acl.h ACL_*).
pub mod tag {
    pub const USER_OBJ: u16 = 0x01;
    pub const USER: u16 = 0x02;
    pub const GROUP_OBJ: u16 = 0x04;
    pub const GROUP: u16 = 0x08;
    pub const MASK: u16 = 0x10;
    pub const OTHER: u16 = 0x20;
}

/// Permission bits of an entry (ACL_READ | ACL_WRITE | ACL_EXECUTE).
pub const PERM_MASK: u16 = 0o7;

/// The id the VFS format carries for entries that name nobody.
pub const UNDEFINED_ID: u32 = u32::MAX;

const HEADER_SIZE: usize = 4;
const XATTR_ENTRY_SIZE: usize = 8;
const DISK_ENTRY_SIZE: usize = 8;
const DISK_SHORT_ENTRY_SIZE: usize = 4;
/// Entries stored short in every valid ACL: USER_OBJ, GROUP_OBJ, OTHER, and
/// MASK once named entries exist (the basis of acl.h's `ext4_acl_count`).
const SHORT_ENTRIES: usize = 4;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AclEntry {
    pub tag: u16,
    pub perm: u16,
    /// uid or gid for USER and GROUP entries; meaningless otherwise.
    pub id: u32,
}

impl AclEntry {
    fn names_someone(&self) -> bool {
        self.tag == tag::USER || self.tag == tag::GROUP
    }
}

fn known_tag(value: u16) -> bool {
    matches!(
        value,
        tag::USER_OBJ | tag::USER | tag::GROUP_OBJ | tag::GROUP | tag::MASK | tag::OTHER
    )
}

/// Decode the VFS xattr format. An ACL with no entries decodes to an empty
/// list (the VFS treats it as "no ACL").
pub fn parse_xattr(value: &[u8]) -> Result<Vec<AclEntry>> {
    if value.len() < HEADER_SIZE {
        return Err(Error::Invalid("POSIX ACL shorter than its header".into()));
    }
    if get_u32(value, 0) != POSIX_ACL_XATTR_VERSION {
        // posix_acl_from_xattr answers EOPNOTSUPP for an unknown version.
        return Err(Error::NotSupported);
    }
    let body = value.len() - HEADER_SIZE;
    if !body.is_multiple_of(XATTR_ENTRY_SIZE) {
        return Err(Error::Invalid(
            "POSIX ACL size is not a whole number of entries".into(),
        ));
    }
    let mut entries = Vec::with_capacity(body / XATTR_ENTRY_SIZE);
    for at in (HEADER_SIZE..value.len()).step_by(XATTR_ENTRY_SIZE) {
        let entry = AclEntry {
            tag: get_u16(value, at),
            perm: get_u16(value, at + 2),
            id: get_u32(value, at + 4),
        };
        if !known_tag(entry.tag) {
            return Err(Error::Invalid(format!("unknown ACL tag {:#x}", entry.tag)));
        }
        if entry.names_someone() && entry.id == UNDEFINED_ID {
            return Err(Error::Invalid("ACL entry names the undefined id".into()));
        }
        entries.push(entry);
    }
    Ok(entries)
}

/// Encode the VFS xattr format, as `posix_acl_to_xattr` does.
pub fn encode_xattr(entries: &[AclEntry]) -> Vec<u8> {
    let mut out = vec![0u8; HEADER_SIZE + entries.len() * XATTR_ENTRY_SIZE];
    put_u32(&mut out, 0, POSIX_ACL_XATTR_VERSION);
    for (index, entry) in entries.iter().enumerate() {
        let at = HEADER_SIZE + index * XATTR_ENTRY_SIZE;
        put_u16(&mut out, at, entry.tag);
        put_u16(&mut out, at + 2, entry.perm);
        let id = if entry.names_someone() {
            entry.id
        } else {
            UNDEFINED_ID
        };
        put_u32(&mut out, at + 4, id);
    }
    out
}

/// The number of entries an on-disk ACL of `size` bytes holds, as acl.h's
/// `ext4_acl_count` derives it (the first four entries are taken as short).
fn disk_entry_count(size: usize) -> Option<usize> {
    let body = size.checked_sub(HEADER_SIZE)?;
    let short_part = SHORT_ENTRIES * DISK_SHORT_ENTRY_SIZE;
    if body < short_part {
        (body % DISK_SHORT_ENTRY_SIZE == 0).then_some(body / DISK_SHORT_ENTRY_SIZE)
    } else {
        let long_part = body - short_part;
        long_part
            .is_multiple_of(DISK_ENTRY_SIZE)
            .then_some(long_part / DISK_ENTRY_SIZE + SHORT_ENTRIES)
    }
}

/// Decode ext4's on-disk format. Errors are `Error::Invalid`; the caller
/// knows where the bytes came from and reports corruption there.
pub fn parse_disk(value: &[u8]) -> Result<Vec<AclEntry>> {
    let invalid = |why: &str| Error::Invalid(format!("on-disk ACL: {why}"));
    if value.len() < HEADER_SIZE || get_u32(value, 0) != EXT4_ACL_VERSION {
        return Err(invalid("bad header"));
    }
    let count = disk_entry_count(value.len()).ok_or_else(|| invalid("bad size"))?;
    let mut entries = Vec::with_capacity(count);
    let mut at = HEADER_SIZE;
    for _ in 0..count {
        if at + DISK_SHORT_ENTRY_SIZE > value.len() {
            return Err(invalid("entries run past the end"));
        }
        let mut entry = AclEntry {
            tag: get_u16(value, at),
            perm: get_u16(value, at + 2),
            id: UNDEFINED_ID,
        };
        if !known_tag(entry.tag) {
            return Err(invalid("unknown tag"));
        }
        if entry.names_someone() {
            if at + DISK_ENTRY_SIZE > value.len() {
                return Err(invalid("entries run past the end"));
            }
            entry.id = get_u32(value, at + 4);
            at += DISK_ENTRY_SIZE;
        } else {
            at += DISK_SHORT_ENTRY_SIZE;
        }
        entries.push(entry);
    }
    if at != value.len() {
        return Err(invalid("size does not match the entries"));
    }
    Ok(entries)
}

/// Encode ext4's on-disk format, as `ext4_acl_to_disk` does.
pub fn encode_disk(entries: &[AclEntry]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_SIZE + entries.len() * DISK_ENTRY_SIZE);
    out.extend_from_slice(&EXT4_ACL_VERSION.to_le_bytes());
    for entry in entries {
        out.extend_from_slice(&entry.tag.to_le_bytes());
        out.extend_from_slice(&entry.perm.to_le_bytes());
        if entry.names_someone() {
            out.extend_from_slice(&entry.id.to_le_bytes());
        }
    }
    // A valid ACL has exactly the shape `ext4_acl_count` assumes.
    debug_assert!(validate(entries).is_err() || disk_entry_count(out.len()) == Some(entries.len()));
    out
}

/// The order and completeness rules of the kernel's `posix_acl_valid`:
/// USER_OBJ, then USER entries, GROUP_OBJ, GROUP entries, MASK (required
/// when there are USER or GROUP entries), OTHER; permissions rwx only.
pub fn validate(entries: &[AclEntry]) -> Result<()> {
    #[derive(PartialEq)]
    enum Expect {
        UserObj,
        Users,
        Groups,
        Other,
        Done,
    }
    let invalid = |why: &str| Err(Error::Invalid(format!("POSIX ACL: {why}")));
    let mut state = Expect::UserObj;
    let mut needs_mask = false;
    for entry in entries {
        if entry.perm & !PERM_MASK != 0 {
            return invalid("permission bits beyond rwx");
        }
        state = match (entry.tag, &state) {
            (tag::USER_OBJ, Expect::UserObj) => Expect::Users,
            (tag::USER, Expect::Users) => {
                needs_mask = true;
                Expect::Users
            }
            (tag::GROUP_OBJ, Expect::Users) => Expect::Groups,
            (tag::GROUP, Expect::Groups) => {
                needs_mask = true;
                Expect::Groups
            }
            (tag::MASK, Expect::Groups) => Expect::Other,
            (tag::OTHER, Expect::Other) => Expect::Done,
            (tag::OTHER, Expect::Groups) if !needs_mask => Expect::Done,
            _ => return invalid("entries out of order, repeated or missing"),
        };
    }
    if state != Expect::Done {
        return invalid("incomplete");
    }
    Ok(())
}

/// VFS xattr format → ext4 on-disk format. An ACL with no entries converts
/// to a bare header; callers treat that as "remove the ACL", as the VFS does.
pub fn acl_from_xattr(value: &[u8]) -> Result<Vec<u8>> {
    let entries = parse_xattr(value)?;
    if !entries.is_empty() {
        validate(&entries)?;
    }
    Ok(encode_disk(&entries))
}

/// ext4 on-disk format → VFS xattr format.
pub fn acl_to_xattr(value: &[u8]) -> Result<Vec<u8>> {
    Ok(encode_xattr(&parse_disk(value)?))
}

/// Whether a disk-format value holds no entries (the kernel never stores
/// one; setting it means removal).
pub(crate) fn is_empty_disk(value: &[u8]) -> bool {
    value.len() <= HEADER_SIZE
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(tag: u16, perm: u16, id: u32) -> AclEntry {
        AclEntry { tag, perm, id }
    }

    fn rich_acl() -> Vec<AclEntry> {
        vec![
            entry(tag::USER_OBJ, 7, UNDEFINED_ID),
            entry(tag::USER, 6, 1000),
            entry(tag::USER, 4, 1001),
            entry(tag::GROUP_OBJ, 5, UNDEFINED_ID),
            entry(tag::GROUP, 1, 100),
            entry(tag::MASK, 7, UNDEFINED_ID),
            entry(tag::OTHER, 0, UNDEFINED_ID),
        ]
    }

    #[test]
    fn round_trips_between_formats() {
        let xattr = encode_xattr(&rich_acl());
        let disk = acl_from_xattr(&xattr).unwrap();
        // 4 header + 4 short entries of 4 bytes + 3 named entries of 8 bytes.
        assert_eq!(disk.len(), 4 + 4 * 4 + 3 * 8);
        assert_eq!(get_u32(&disk, 0), EXT4_ACL_VERSION);
        assert_eq!(acl_to_xattr(&disk).unwrap(), xattr);
        assert_eq!(parse_disk(&disk).unwrap(), rich_acl());
    }

    #[test]
    fn rejects_invalid_acls() {
        let mut acl = rich_acl();
        acl.remove(5); // no mask although named entries exist
        assert!(matches!(
            acl_from_xattr(&encode_xattr(&acl)),
            Err(Error::Invalid(_))
        ));
        let mut acl = rich_acl();
        acl.swap(0, 3);
        assert!(acl_from_xattr(&encode_xattr(&acl)).is_err());
        let mut acl = rich_acl();
        acl[1].perm = 0o10;
        assert!(acl_from_xattr(&encode_xattr(&acl)).is_err());
        let mut bytes = encode_xattr(&rich_acl());
        put_u32(&mut bytes, 0, 1);
        assert!(matches!(acl_from_xattr(&bytes), Err(Error::NotSupported)));
        assert!(acl_from_xattr(&bytes[..3]).is_err());
        assert!(acl_from_xattr(&encode_xattr(&rich_acl())[..10]).is_err());
        // Empty ACL: a bare header, which callers treat as removal.
        let empty = acl_from_xattr(&POSIX_ACL_XATTR_VERSION.to_le_bytes()).unwrap();
        assert!(is_empty_disk(&empty));
    }

    #[test]
    fn rejects_malformed_disk_acls() {
        let disk = acl_from_xattr(&encode_xattr(&rich_acl())).unwrap();
        for cut in [0, 3, 6, 10, disk.len() - 2, disk.len() - 1] {
            assert!(parse_disk(&disk[..cut]).is_err(), "cut {cut}");
        }
        // A header alone is a valid, empty ACL.
        assert_eq!(parse_disk(&disk[..4]).unwrap(), vec![]);
        let mut bad = disk.clone();
        put_u16(&mut bad, 4, 0x40);
        assert!(parse_disk(&bad).is_err());
        let mut bad = disk;
        put_u32(&mut bad, 0, 2);
        assert!(parse_disk(&bad).is_err());
    }
}
