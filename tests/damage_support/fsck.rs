//! `e2fsck -fn` output sorted into problem kinds: each problem line with
//! its numbers, names, paths and dates taken out, so that "Inode 12,
//! i_size is 0, should be 1024" and "Inode 40, i_size is 7, should be 9"
//! are one kind, and the kinds two runs leave can be compared as sets.
//! Bitmap differences split by sign: `-` (marked in use, not used) and
//! `+` (used, not marked) are different problems. Left out: e2fsck's
//! banner, passes, answers and summary, Pass 1D's list of who shares a
//! block (implied by "Multiply-claimed block(s) in inode N"), and the
//! superblock's free totals (see `is_chatter`).

use std::collections::BTreeMap;
use std::path::Path;

/// What `e2fsck -fn` said about one image.
#[derive(Debug, Clone, Default)]
pub struct Report {
    pub exit_code: i32,
    /// Problem kind → the first line of that kind, as e2fsck wrote it.
    pub kinds: BTreeMap<String, String>,
    pub text: String,
}

pub fn check(image: &Path) -> Report {
    let (exit_code, text) = crate::common::fsck(image);
    let mut kinds = classify(&text);
    // e2fsck fell back to a backup superblock (the descriptors are
    // damaged) and found the log not empty: backups never carry
    // needs_recovery (e2fsprogs writes them without it), so these two say
    // only that committed transactions wait in the log — as after any
    // journal abort — when the primary the kernel mounts from does say
    // needs_recovery. Without it they are the problem they name.
    if text.contains("Recovery flag not set in backup superblock")
        && crate::common::journal::dumpe2fs_needs_recovery(image)
    {
        kinds.retain(|_, line| {
            !line.contains("Recovery flag not set in backup superblock")
                && !line.contains("needs_recovery flag is clear, but journal has data")
        });
    }
    Report {
        exit_code,
        kinds,
        text,
    }
}

/// Problem kinds in e2fsck's output.
pub fn classify(text: &str) -> BTreeMap<String, String> {
    let mut kinds = BTreeMap::new();
    for line in text.lines() {
        let trimmed = line.trim();
        if is_chatter(trimmed) {
            continue;
        }
        for kind in kinds_of(trimmed) {
            kinds.entry(kind).or_insert_with(|| trimmed.to_string());
        }
    }
    kinds
}

/// Lines that are not problems: the banner, pass headers, answers, the
/// summary, and the notes on why the check ran.
fn is_chatter(line: &str) -> bool {
    const PREFIXES: &[&str] = &[
        "e2fsck ",
        "Pass ",
        "Warning: skipping journal recovery",
        "Fix? no",
        "Clear? no",
        "Salvage? no",
        "Recreate? no",
        "Relocate? no",
        "Ignore error? no",
        "Clear inode? no",
        "Clear HTree index? no",
        "Connect to /lost+found? no",
        "Abort? no",
        "Optimize? no",
        "Run journal anyway? no",
    ];
    if line.is_empty() || PREFIXES.iter().any(|prefix| line.starts_with(prefix)) {
        return true;
    }
    // "IMAGE: 12/2048 files (...)", "IMAGE: ***** WARNING ...",
    // "IMAGE contains a file system with errors, check forced.",
    // "IMAGE was not cleanly unmounted, check forced."
    // A question on a line of its own ("Clone multiply-claimed blocks?
    // no"): the problem is the line before.
    (line.ends_with("? no") || line.ends_with("? yes")) && !line.contains(". ")
        // Pass 1B-1D's account of who shares which blocks: implied by
        // "Multiply-claimed block(s) in inode N".
        || line.contains("(inode #")
        || line.contains("multiply-claimed block(s), shared with")
        || line.starts_with("(There are ")
        // The superblock's free totals: the kernel keeps them in per-CPU
        // counters and writes them when it pleases, so after a clean
        // kernel unmount they may be off by a few (e2fsck fixes them
        // silently when preening). The per-group counts stay problems.
        || line.starts_with("Free blocks count wrong (")
        || line.starts_with("Free inodes count wrong (")
        || line.contains(" files (") && line.contains(" blocks")
        || line.contains("**********")
        || line.ends_with("check forced.")
        || line.starts_with("Running additional passes")
}

fn kinds_of(line: &str) -> Vec<String> {
    for bitmap in ["Block bitmap differences:", "Inode bitmap differences:"] {
        if let Some(rest) = line.strip_prefix(bitmap) {
            let mut kinds = Vec::new();
            for sign in ['-', '+'] {
                if rest.split_whitespace().any(|word| word.starts_with(sign)) {
                    kinds.push(format!("{bitmap} {sign}"));
                }
            }
            return kinds;
        }
    }
    vec![normalise(line)]
}

/// Numbers to `N`, quoted names to `'*'`, paths to `/*`, parenthesised
/// dates ("mod time Tue Nov 14 ...") dropped, a trailing question dropped.
pub fn normalise(line: &str) -> String {
    let line = drop_question(line);
    let mut out = String::new();
    let mut chars = line.chars().peekable();
    while let Some(character) = chars.next() {
        match character {
            '\'' => {
                for next in chars.by_ref() {
                    if next == '\'' {
                        break;
                    }
                }
                out.push_str("'*'");
            }
            '/' if out.is_empty() || out.ends_with(' ') || out.ends_with('(') => {
                while chars
                    .peek()
                    .is_some_and(|next| !next.is_whitespace() && *next != ')')
                {
                    chars.next();
                }
                out.push_str("/*");
            }
            '0'..='9' => {
                while chars
                    .peek()
                    .is_some_and(|next| next.is_ascii_hexdigit() || *next == 'x')
                {
                    chars.next();
                }
                out.push('N');
            }
            _ => out.push(character),
        }
    }
    let out = drop_dates(&out);
    // "N N N" (block lists) and "N--N" ranges say the same as one "N".
    let mut collapsed = out.split_whitespace().collect::<Vec<_>>().join(" ");
    for (from, to) in [("N N", "N"), ("N--N", "N"), ("N-N", "N"), ("N, N", "N")] {
        while collapsed.contains(from) {
            collapsed = collapsed.replace(from, to);
        }
    }
    collapsed
}

/// "Fix? no", "Clear? no" and the like at the end of a problem line.
fn drop_question(line: &str) -> &str {
    let Some(body) = line
        .strip_suffix("? no")
        .or_else(|| line.strip_suffix("? yes"))
    else {
        return line;
    };
    // The question is the last sentence: after the last ".  " or ". ".
    match body.rfind(". ") {
        Some(end) => &line[..end + 1],
        None => line,
    }
}

fn drop_dates(line: &str) -> String {
    match line.find(", mod time ") {
        Some(start) => {
            let end = line[start..]
                .find(')')
                .map_or(line.len(), |end| start + end);
            format!("{}{}", &line[..start], &line[end..])
        }
        None => line.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_names_and_paths_are_one_kind() {
        assert_eq!(
            normalise("Inode 12, i_size is 0, should be 1024.  Fix? no"),
            normalise("Inode 4077, i_size is 77, should be 9.  Fix? no")
        );
        assert_eq!(
            normalise("Entry 'a' in /tree/sub (13) has deleted/unused inode 45.  Clear? no"),
            "Entry '*' in /* (N) has deleted/unused inode N."
        );
        let kinds = classify(
            "Block bitmap differences:  -(1234--1240) +5678\nFix? no\n\nInode bitmap differences:  -12\n",
        );
        let names: Vec<&str> = kinds.keys().map(String::as_str).collect();
        assert_eq!(
            names,
            [
                "Block bitmap differences: +",
                "Block bitmap differences: -",
                "Inode bitmap differences: -"
            ]
        );
    }
}
