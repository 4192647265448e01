//! POSIX ACLs in the text form tar archives carry them in (`SCHILY.acl.
//! access` and `SCHILY.acl.default`, as GNU tar writes them with
//! `--acls`: acl_to_text's long form, one entry per line, numeric ids),
//! to and from the VFS xattr encoding the engine stores.

use crate::error::{Error, Result};
use crate::format::acl::{self, AclEntry, UNDEFINED_ID, tag};

/// `user::rwx\nuser:1001:rw-\ngroup::r--\nmask::rw-\nother::r--\n` (commas
/// also separate entries, as acl_from_text accepts) as the VFS xattr value.
pub fn from_text(text: &str) -> Result<Vec<u8>> {
    let mut entries = Vec::new();
    for entry in text
        .split(['\n', ','])
        .map(str::trim)
        .filter(|e| !e.is_empty())
    {
        let bad = || Error::Invalid(format!("ACL entry '{entry}'"));
        let mut fields = entry.split(':');
        let (kind, qualifier, perms) = match (fields.next(), fields.next(), fields.next()) {
            (Some(kind), Some(qualifier), Some(perms)) => (kind, qualifier, perms),
            _ => return Err(bad()),
        };
        let named = !qualifier.is_empty();
        let tag = match (kind, named) {
            ("user" | "u", false) => tag::USER_OBJ,
            ("user" | "u", true) => tag::USER,
            ("group" | "g", false) => tag::GROUP_OBJ,
            ("group" | "g", true) => tag::GROUP,
            ("mask" | "m", false) => tag::MASK,
            ("other" | "o", false) => tag::OTHER,
            _ => return Err(bad()),
        };
        let id = match named {
            true => qualifier.parse().map_err(|_| bad())?,
            false => UNDEFINED_ID,
        };
        let mut perm = 0;
        for (at, c) in perms.chars().enumerate() {
            perm |= match (at, c) {
                (0, 'r') => 4,
                (1, 'w') => 2,
                (2, 'x') => 1,
                (_, '-') => 0,
                _ => return Err(bad()),
            };
        }
        entries.push(AclEntry { tag, perm, id });
    }
    // The kernel takes entries in tag order, named ones by id.
    entries.sort_by_key(|entry| (entry.tag, entry.id));
    acl::validate(&entries)?;
    Ok(acl::encode_xattr(&entries))
}

/// The VFS xattr value as GNU tar's text (one entry per line).
pub fn to_text(value: &[u8]) -> Result<String> {
    let mut text = String::new();
    for entry in acl::parse_xattr(value)? {
        let (kind, qualifier) = match entry.tag {
            tag::USER_OBJ => ("user", String::new()),
            tag::USER => ("user", entry.id.to_string()),
            tag::GROUP_OBJ => ("group", String::new()),
            tag::GROUP => ("group", entry.id.to_string()),
            tag::MASK => ("mask", String::new()),
            _ => ("other", String::new()),
        };
        let bit = |mask: u16, c: char| if entry.perm & mask != 0 { c } else { '-' };
        text.push_str(&format!(
            "{kind}:{qualifier}:{}{}{}\n",
            bit(4, 'r'),
            bit(2, 'w'),
            bit(1, 'x')
        ));
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gnu_tar_text_round_trips_through_the_xattr_form() {
        let text = "user::rwx\nuser:99:r-x\ngroup::rwx\nmask::rwx\nother::r-x\n";
        let value = from_text(text).unwrap();
        assert_eq!(to_text(&value).unwrap(), text);
        // Commas, and an order the kernel would refuse, are accepted.
        let shuffled = from_text("other::r-x,user:99:r-x,user::rwx,mask::rwx,group::rwx").unwrap();
        assert_eq!(shuffled, value);
        assert!(from_text("user:nobody:rwx").is_err());
        assert!(from_text("user::rwz").is_err());
    }
}
