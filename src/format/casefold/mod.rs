//! Names in casefolded directories (`casefold` feature, flag `+F`): the
//! superblock's encoding, and what it makes of a name — the folded form
//! its htree hash is taken over, and which names are the same name.
//!
//! ext4 has one encoding, `utf8-12.1` (s_encoding 1): a name is folded by
//! mapping each character to its full case folding, decomposed canonically
//! (NFD), Default_Ignorable characters dropped, then putting each run of
//! combining marks in canonical order — the kernel's "nfdicf" (fs/unicode,
//! `utf8_casefold`). The tables are in `data.rs`, generated from the
//! Unicode Character Database cut back to 12.1 (`scripts/utf8data.py`):
//! a character assigned after 12.1 is unassigned to ext4, kept as it is,
//! or a kernel with a later Unicode would hash the same name elsewhere.
//!
//! Names are bytes. In strict mode (s_encoding_flags bit 0) a name that is
//! not valid UTF-8 is refused (EINVAL) in a casefolded directory; without
//! it such a name is stored and matches only itself, byte for byte, and
//! its hash is taken over its raw bytes, as the kernel does.

#[rustfmt::skip]
mod data;

/// ext4.h EXT4_ENC_UTF8_12_1: the only encoding ext4 defines.
pub const ENCODING_UTF8_12_1: u16 = 1;
/// ext4.h EXT4_ENC_STRICT_MODE_FL: names must be valid UTF-8.
pub const ENCODING_STRICT_MODE: u16 = 0x1;

/// Hangul syllables (U+AC00..U+D7A3) decompose by arithmetic, not table
/// (Unicode §3.12): leading consonant, vowel and optional trailing one.
const HANGUL_FIRST: u32 = 0xAC00;
const HANGUL_LAST: u32 = 0xD7A3;
const JAMO_L: u32 = 0x1100;
const JAMO_V: u32 = 0x1161;
const JAMO_T: u32 = 0x11A7;
const JAMO_V_COUNT: u32 = 21;
const JAMO_T_COUNT: u32 = 28;

/// A casefolding filesystem's encoding (from the superblock).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Encoding {
    /// Names in casefolded directories must be valid UTF-8.
    pub strict: bool,
}

impl Encoding {
    /// The encoding a superblock's s_encoding and s_encoding_flags name.
    /// One other than utf8-12.1 is refused, as `ext4_encoding_init`
    /// refuses it. Flag bits besides strict mode are kept by the kernel
    /// without a check (0x2, "no compat fallback", turns off a lookup
    /// fallback jext4 does not need: its lookups hash as it writes).
    pub fn from_superblock(encoding: u16, flags: u16) -> Result<Encoding, String> {
        if encoding != ENCODING_UTF8_12_1 {
            return Err(format!(
                "the superblock asks for character encoding {encoding}, which is unknown \
                 (ext4 knows 1, utf8-12.1)"
            ));
        }
        Ok(Encoding {
            strict: flags & ENCODING_STRICT_MODE != 0,
        })
    }

    /// Whether a casefolded directory may hold `name` (strict mode refuses
    /// what is not UTF-8: `generic_ci_validate_strict_name`).
    pub fn allows(&self, name: &[u8]) -> bool {
        !self.strict || is_valid(name)
    }
}

/// The kernel's `utf8_validate`: well-formed UTF-8 (no overlong forms, no
/// surrogates, nothing past U+10FFFF). Unassigned code points are valid.
pub fn is_valid(name: &[u8]) -> bool {
    std::str::from_utf8(name).is_ok()
}

/// One unit of a name being folded: a character and its combining class,
/// or a stray continuation byte, which the kernel's `utf8byte` copies
/// through where it follows a whole character.
#[derive(Clone, Copy)]
enum Unit {
    Char(u32, u8),
    Stray(u8),
}

impl Unit {
    fn class(self) -> u8 {
        match self {
            Unit::Char(_, class) => class,
            Unit::Stray(_) => 0,
        }
    }
}

/// `name` folded (`utf8_casefold`): the bytes its hash is taken over and
/// that other names are compared by. `None` where the kernel's folding
/// fails — a name that starts with a continuation byte or holds a byte
/// sequence that is no character — and the name is then only itself.
pub fn fold(name: &[u8]) -> Option<Vec<u8>> {
    if name.is_ascii() {
        return Some(name.to_ascii_lowercase());
    }
    let mut units = Vec::with_capacity(name.len());
    let mut at = 0;
    while at < name.len() {
        let byte = name[at];
        if byte & 0xC0 == 0x80 {
            if at == 0 {
                return None;
            }
            units.push(Unit::Stray(byte));
            at += 1;
            continue;
        }
        let (ch, len) = decode(&name[at..])?;
        at += len;
        expand(ch, &mut units);
    }
    canonical_order(&mut units);
    let mut folded = Vec::with_capacity(units.len() + name.len());
    for unit in units {
        match unit {
            Unit::Char(ch, _) => {
                let ch = char::from_u32(ch).expect("the tables hold characters");
                let mut buf = [0u8; 4];
                folded.extend_from_slice(ch.encode_utf8(&mut buf).as_bytes());
            }
            Unit::Stray(byte) => folded.push(byte),
        }
    }
    Some(folded)
}

/// Whether `stored` (a directory's entry) is the name `wanted` in a
/// casefolded directory, whose folded form is `wanted_folded` (`fold`):
/// the same bytes, or both folded alike (`generic_ci_match`).
pub fn matches(stored: &[u8], wanted: &[u8], wanted_folded: Option<&[u8]>) -> bool {
    if stored == wanted {
        return true;
    }
    let Some(wanted_folded) = wanted_folded else {
        return false;
    };
    if stored.is_ascii() && wanted.is_ascii() {
        return stored.eq_ignore_ascii_case(wanted);
    }
    fold(stored).is_some_and(|folded| folded == wanted_folded)
}

/// The character at the start of `bytes` and its length in bytes, if
/// they start with one well-formed UTF-8 sequence.
fn decode(bytes: &[u8]) -> Option<(u32, usize)> {
    let len = match bytes[0] {
        0x00..=0x7F => 1,
        0xC2..=0xDF => 2,
        0xE0..=0xEF => 3,
        0xF0..=0xF4 => 4,
        _ => return None,
    };
    let sequence = std::str::from_utf8(bytes.get(..len)?).ok()?;
    Some((sequence.chars().next()? as u32, len))
}

/// Append what character `ch` folds to, each with its combining class.
fn expand(ch: u32, units: &mut Vec<Unit>) {
    if (HANGUL_FIRST..=HANGUL_LAST).contains(&ch) {
        let index = ch - HANGUL_FIRST;
        let (lv, t) = (index / JAMO_T_COUNT, index % JAMO_T_COUNT);
        units.push(Unit::Char(JAMO_L + lv / JAMO_V_COUNT, 0));
        units.push(Unit::Char(JAMO_V + lv % JAMO_V_COUNT, 0));
        if t != 0 {
            units.push(Unit::Char(JAMO_T + t, 0));
        }
        return;
    }
    if is_ignorable(ch) {
        return;
    }
    match data::FOLD.binary_search_by_key(&ch, |&(point, _, _)| point) {
        Ok(at) => {
            let (_, start, len) = data::FOLD[at];
            let mapped = &data::FOLDED[start as usize..start as usize + len as usize];
            units.extend(mapped.iter().map(|&ch| Unit::Char(ch, class_of(ch))));
        }
        Err(_) => units.push(Unit::Char(ch, class_of(ch))),
    }
}

fn is_ignorable(ch: u32) -> bool {
    let at = data::IGNORABLE.partition_point(|&(_, last)| last < ch);
    data::IGNORABLE
        .get(at)
        .is_some_and(|&(first, _)| first <= ch)
}

/// The canonical combining class of `ch` (0 for most, and for what 12.1
/// does not assign).
fn class_of(ch: u32) -> u8 {
    data::CCC
        .binary_search_by_key(&ch, |&(point, _)| point)
        .map_or(0, |at| data::CCC[at].1)
}

/// Canonical ordering: each run of characters of non-zero class sorted by
/// class, stably (marks of one class keep their order).
fn canonical_order(units: &mut [Unit]) {
    let mut start = 0;
    while start < units.len() {
        if units[start].class() == 0 {
            start += 1;
            continue;
        }
        let end = units[start..]
            .iter()
            .position(|unit| unit.class() == 0)
            .map_or(units.len(), |len| start + len);
        units[start..end].sort_by_key(|unit| unit.class());
        start = end;
    }
}

/// The Unicode version the tables are of.
pub fn unicode_version() -> (u8, u8, u8) {
    data::UNICODE_VERSION
}

#[cfg(test)]
mod tests {
    use super::*;

    fn folded(name: &str) -> String {
        String::from_utf8(fold(name.as_bytes()).unwrap()).unwrap()
    }

    #[test]
    fn folds_as_nfdicf() {
        assert_eq!(folded("README.TXT"), "readme.txt");
        // Full folding (status F) and canonical decomposition.
        assert_eq!(folded("Straße"), "strasse");
        assert_eq!(folded("\u{1E9E}"), "ss");
        assert_eq!(folded("\u{212B}"), "a\u{30A}");
        assert_eq!(folded("\u{0390}"), "\u{3B9}\u{308}\u{301}");
        assert_eq!(folded("\u{212A}"), "k");
        // Status T (Turkic) is not used: İ folds to i + dot above.
        assert_eq!(folded("\u{130}"), "i\u{307}");
        // Compatibility forms are not decomposed; ligatures fold (F).
        assert_eq!(folded("\u{BC}"), "\u{BC}");
        assert_eq!(folded("\u{FB01}"), "fi");
        // Ignorables vanish, assigned or reserved.
        assert_eq!(folded("a\u{AD}b\u{200B}c\u{E0080}"), "abc");
        // Hangul by arithmetic.
        assert_eq!(folded("\u{AC01}"), "\u{1100}\u{1161}\u{11A8}");
        // Marks in canonical order.
        assert_eq!(folded("a\u{301}\u{328}"), "a\u{328}\u{301}");
        // Characters after 12.1 are unassigned: kept as they are (U+A7C0,
        // Unicode 14, would fold to U+A7C1 in a later table).
        assert_eq!(folded("\u{A7C0}"), "\u{A7C0}");
        assert_eq!(unicode_version(), (12, 1, 0));
    }

    #[test]
    fn invalid_names_fold_as_the_kernel_folds_them() {
        assert_eq!(fold(b"A\x80").unwrap(), b"a\x80");
        assert!(fold(b"\x80A").is_none());
        assert!(fold(b"A\xC3").is_none());
        assert!(fold(b"\xED\xA0\x80").is_none(), "a surrogate");
        assert!(fold(b"\xC0\xAF").is_none(), "overlong");
        assert!(fold(b"\xF4\x90\x80\x80").is_none(), "past U+10FFFF");
        assert!(!is_valid(b"A\x80"));
        assert!(is_valid("\u{378}".as_bytes()), "unassigned is valid");
    }

    #[test]
    fn names_match_by_their_folded_forms() {
        let wanted = "STRASSE";
        let wanted_folded = fold(wanted.as_bytes());
        for stored in ["strasse", "Straße", "STRASSE", "stra\u{17F}se"] {
            assert!(
                matches(
                    stored.as_bytes(),
                    wanted.as_bytes(),
                    wanted_folded.as_deref()
                ),
                "{stored}"
            );
        }
        assert!(!matches(
            b"strase",
            wanted.as_bytes(),
            wanted_folded.as_deref()
        ));
        // An invalid name matches only itself.
        assert!(matches(b"A\xC3", b"A\xC3", None));
        assert!(!matches(b"a\xC3", b"A\xC3", None));
    }

    #[test]
    fn strict_mode_refuses_invalid_names() {
        let strict = Encoding::from_superblock(1, ENCODING_STRICT_MODE | 0x2).unwrap();
        assert!(strict.strict && strict.allows("é".as_bytes()) && !strict.allows(b"\xff"));
        assert!(Encoding::from_superblock(1, 0).unwrap().allows(b"\xff"));
        assert!(Encoding::from_superblock(2, 0).is_err());
    }
}
