//! Encrypted files and directories (`encrypt` feature, fscrypt) as they
//! read without their key — jext4 holds none (Documentation/filesystems/
//! fscrypt.rst, fs/crypto/fname.c).
//!
//! An encrypted inode has flag ENCRYPT and its encryption context in the
//! xattr of index 9, name "c" (no name reaches it: listxattr does not show
//! it). Its names on disk are ciphertext of 16 to 255 bytes, any byte
//! included. Without the key the kernel shows each as a "no-key name":
//!
//! ```text
//!   dirhash[2] (u32, CPU order) | ciphertext (up to 149 bytes)
//!   dirhash[2] | ciphertext[..149] | SHA-256 of ciphertext[149..]
//! ```
//!
//! encoded base64url without padding (RFC 4648; the kernel since 5.15),
//! at most 252 characters. The dirhash is the name's htree hash where the
//! kernel lists the directory in hash order, else 0; a lookup by a no-key
//! name compares ciphertext (short form) or the prefix and the digest
//! (long form). An encrypted symlink keeps `le16 length | ciphertext`, and
//! reads as the no-key name of its ciphertext with a dirhash of 0.

use crate::error::{Error, Location, Result};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use sha2::{Digest, Sha256};

/// EXT4_XATTR_INDEX_ENCRYPTION and the context's name.
pub const CONTEXT_INDEX: u8 = 9;
pub const CONTEXT_NAME: &[u8] = b"c";
/// fscrypt_nokey_name: the ciphertext bytes it carries whole.
const NOKEY_BYTES: usize = 149;
const DIRHASH_LEN: usize = 8;
const SHA256_LEN: usize = 32;
/// FSCRYPT_NOKEY_NAME_MAX: the long form's size.
const NOKEY_MAX: usize = DIRHASH_LEN + NOKEY_BYTES + SHA256_LEN;
/// FSCRYPT_NOKEY_NAME_MAX_ENCODED.
const NOKEY_MAX_ENCODED: usize = NOKEY_MAX.div_ceil(3) * 4;
/// FSCRYPT_FNAME_MIN_MSG_LEN: no ciphertext name is shorter.
const CIPHERTEXT_MIN: usize = 16;

/// The no-key name of ciphertext `name` with dirhash `hash`/`minor`
/// (fscrypt_fname_disk_to_usr without the key). A ciphertext shorter
/// than 16 bytes is no name fscrypt makes: corruption (EUCLEAN, as the
/// kernel answers a listing of it).
pub fn nokey_name(hash: u32, minor: u32, name: &[u8], location: Location) -> Result<Vec<u8>> {
    if name.len() < CIPHERTEXT_MIN {
        return Err(Error::corrupt(
            location,
            format!(
                "encrypted name of {} bytes (fscrypt's are at least {CIPHERTEXT_MIN})",
                name.len()
            ),
        ));
    }
    let mut raw = Vec::with_capacity(NOKEY_MAX);
    raw.extend_from_slice(&hash.to_le_bytes());
    raw.extend_from_slice(&minor.to_le_bytes());
    if name.len() <= NOKEY_BYTES {
        raw.extend_from_slice(name);
    } else {
        raw.extend_from_slice(&name[..NOKEY_BYTES]);
        raw.extend_from_slice(&Sha256::digest(&name[NOKEY_BYTES..]));
    }
    Ok(URL_SAFE_NO_PAD.encode(raw).into_bytes())
}

/// A no-key name decoded: what names the entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NokeyName {
    /// The whole ciphertext.
    Short(Vec<u8>),
    /// A ciphertext over 149 bytes: its start and the digest of the rest.
    Long {
        prefix: Vec<u8>,
        digest: [u8; SHA256_LEN],
    },
}

impl NokeyName {
    /// Decode `name` as fscrypt_setup_filename does; None for a name that
    /// is no no-key name (a lookup of it is ENOENT).
    pub fn parse(name: &[u8]) -> Option<NokeyName> {
        if name.len() > NOKEY_MAX_ENCODED {
            return None;
        }
        let raw = URL_SAFE_NO_PAD.decode(name).ok()?;
        let size = raw.len();
        if size == NOKEY_MAX {
            let prefix = raw[DIRHASH_LEN..DIRHASH_LEN + NOKEY_BYTES].to_vec();
            let digest = raw[DIRHASH_LEN + NOKEY_BYTES..].try_into().ok()?;
            return Some(NokeyName::Long { prefix, digest });
        }
        if size <= DIRHASH_LEN || size > DIRHASH_LEN + NOKEY_BYTES {
            return None;
        }
        Some(NokeyName::Short(raw[DIRHASH_LEN..].to_vec()))
    }

    /// Whether ciphertext `stored` is the name (fscrypt_match_name).
    pub fn matches(&self, stored: &[u8]) -> bool {
        match self {
            NokeyName::Short(name) => stored == &name[..],
            NokeyName::Long { prefix, digest } => {
                stored.len() > NOKEY_BYTES
                    && stored[..NOKEY_BYTES] == prefix[..]
                    && Sha256::digest(&stored[NOKEY_BYTES..])[..] == digest[..]
            }
        }
    }
}

/// The ciphertext of an encrypted symlink's target, from its body
/// (`fscrypt_symlink_data`: a le16 length, then that many bytes).
pub fn symlink_ciphertext(body: &[u8], location: Location) -> Result<&[u8]> {
    let bad = |why: &str| Error::corrupt(location, format!("encrypted symlink {why}"));
    let len = u16::from_le_bytes(
        body.get(..2)
            .ok_or_else(|| bad("without a length"))?
            .try_into()
            .expect("two bytes"),
    ) as usize;
    if len == 0 {
        return Err(bad("of length 0"));
    }
    body.get(2..2 + len)
        .ok_or_else(|| bad("longer than its body"))
}

/// The length of the no-key target of an encrypted symlink of `i_size`
/// bytes (a le16 length and that much ciphertext): what `stat` shows, as
/// fscrypt_symlink_getattr.
pub fn symlink_size(i_size: u64) -> u64 {
    let ciphertext = i_size.saturating_sub(2) as usize;
    let raw = DIRHASH_LEN
        + match ciphertext > NOKEY_BYTES {
            true => NOKEY_BYTES + SHA256_LEN,
            false => ciphertext,
        };
    (raw * 4).div_ceil(3) as u64
}

/// The no-key form of an encrypted symlink's target (`body` as stored).
pub fn symlink_target(body: &[u8], location: Location) -> Result<Vec<u8>> {
    let ciphertext = symlink_ciphertext(body, location)?;
    nokey_name(0, 0, ciphertext, location)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at() -> Location {
        Location::Inode { ino: 12 }
    }

    #[test]
    fn short_names_round_trip() {
        let ciphertext: Vec<u8> = (0..32u8).map(|i| i.wrapping_mul(37) ^ 0x5a).collect();
        let name = nokey_name(0x1234_5678, 0x9abc_def0, &ciphertext, at()).unwrap();
        assert_eq!(name.len(), 54); // (8 + 32) * 4 / 3, rounded up
        assert!(
            name.iter()
                .all(|b| b.is_ascii_alphanumeric() || *b == b'-' || *b == b'_')
        );
        let parsed = NokeyName::parse(&name).unwrap();
        assert_eq!(parsed, NokeyName::Short(ciphertext.clone()));
        assert!(parsed.matches(&ciphertext) && !parsed.matches(&ciphertext[1..]));
        // A dirhash of 0: eight zero bytes, ten characters "A" and more.
        assert!(
            nokey_name(0, 0, &ciphertext, at())
                .unwrap()
                .starts_with(b"AAAAAAAAAA")
        );
        assert!(nokey_name(0, 0, &ciphertext[..15], at()).is_err());
    }

    #[test]
    fn long_names_match_by_prefix_and_digest() {
        let ciphertext: Vec<u8> = (0..240u32).map(|i| (i * 7 + 3) as u8).collect();
        let name = nokey_name(1, 2, &ciphertext, at()).unwrap();
        assert_eq!(name.len(), NOKEY_MAX_ENCODED);
        let parsed = NokeyName::parse(&name).unwrap();
        assert!(parsed.matches(&ciphertext));
        let mut other = ciphertext.clone();
        other[200] ^= 1;
        assert!(!parsed.matches(&other));
    }

    #[test]
    fn names_that_are_no_nokey_names_are_refused() {
        assert!(
            NokeyName::parse(b"hello.txt").is_none(),
            "'.' is not base64url"
        );
        assert!(
            NokeyName::parse(b"AAAAAAAAAAA").is_none(),
            "8 bytes: no ciphertext"
        );
        assert!(NokeyName::parse(b"AB").is_none(), "trailing bits set");
        assert!(NokeyName::parse(&[b'A'; 300]).is_none());
    }

    #[test]
    fn symlink_targets() {
        let mut body = vec![20, 0];
        body.extend(0..20u8);
        body.push(0);
        let target = symlink_target(&body, at()).unwrap();
        assert_eq!(
            NokeyName::parse(&target),
            Some(NokeyName::Short((0..20).collect()))
        );
        assert!(symlink_target(&[30, 0, 1, 2], at()).is_err());
    }
}
