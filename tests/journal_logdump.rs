//! `logdump` lists the same log as `debugfs -R "logdump -a"`: the same
//! blocks with the same types and tids, the same tags (home, journal
//! position, flags) and the same revoke records. And neither logdump nor
//! recovery panics or hangs on a journal full of random bytes.

mod common;

use common::journal::*;
use jext4::engine::fs::recover_journal;
use jext4::engine::journal::logdump::logdump;
use proptest::prelude::*;
use std::path::Path;
use std::time::Duration;

/// (journal block, type, tid) of each log block; (home, journal block,
/// flags) of each tag; revoked homes.
#[derive(Debug, Default, PartialEq, Eq)]
struct Listing {
    blocks: Vec<(u64, u32, u32)>,
    tags: Vec<(u64, u64, u32)>,
    revokes: Vec<u64>,
}

fn number(text: &str) -> u64 {
    let digits: String = text.chars().take_while(|c| c.is_ascii_digit()).collect();
    digits
        .parse()
        .unwrap_or_else(|_| panic!("no number in {text:?}"))
}

fn hex_number(text: &str) -> u32 {
    let digits = text.trim_start_matches("0x");
    let end = digits
        .find(|c: char| !c.is_ascii_hexdigit())
        .unwrap_or(digits.len());
    u32::from_str_radix(&digits[..end], 16).unwrap()
}

/// Tag and revoke lines read the same in both dumps.
fn common_line(line: &str, listing: &mut Listing) {
    if let Some(rest) = line.strip_prefix("  FS block ") {
        let home = number(rest);
        let at = rest.split("journal block ").nth(1).unwrap();
        let flags = hex_number(rest.split("(flags ").nth(1).unwrap());
        listing.tags.push((home, number(at), flags));
    } else if let Some(rest) = line.strip_prefix("  Revoke FS block ") {
        listing.revokes.push(number(rest));
    }
}

fn debugfs_listing(image: &Path) -> Listing {
    let (code, text) = run("debugfs", &["-R", "logdump -a", image.to_str().unwrap()]);
    assert_eq!(code, 0, "{text}");
    let mut listing = Listing::default();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("Found expected sequence ") {
            let tid = number(rest) as u32;
            let kind = number(rest.split("type ").nth(1).unwrap()) as u32;
            let at = number(rest.split("at block ").nth(1).unwrap());
            listing.blocks.push((at, kind, tid));
        }
        common_line(line, &mut listing);
    }
    listing
}

fn our_listing(image: &Path) -> (Listing, String) {
    let mut out = Vec::new();
    logdump(&file_area(image), &mut out).unwrap();
    let text = String::from_utf8(out).unwrap();
    let mut listing = Listing::default();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("Block ") {
            let at = number(rest);
            let kind = match rest.split(": ").nth(1).unwrap().split(',').next().unwrap() {
                "descriptor" => 1,
                "commit" => 2,
                "revoke" => 5,
                other => panic!("unknown block kind {other}"),
            };
            let tid = number(rest.split("transaction ").nth(1).unwrap()) as u32;
            listing.blocks.push((at, kind, tid));
        }
        common_line(line, &mut listing);
    }
    (listing, text)
}

fn assert_same_listing(image: &Path) {
    let theirs = debugfs_listing(image);
    let (ours, text) = our_listing(image);
    assert!(
        !theirs.blocks.is_empty() && !theirs.tags.is_empty(),
        "{theirs:?}"
    );
    assert_eq!(ours, theirs, "{}:\n{text}", image.display());
}

#[test]
fn logdump_lists_what_debugfs_lists() {
    if !common::require_tool("debugfs") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    for (name, mkfs, open) in [
        ("ld-v3", &["-t", "ext4", "-b", "1024"][..], "jo -c"),
        ("ld-plain", &["-t", "ext3", "-b", "1024"][..], "jo"),
        ("ld-v2", &["-t", "ext4", "-b", "4096"][..], "jo -c -v 2"),
    ] {
        let image = common::mkfs(dir.path(), name, 16, mkfs);
        let free = free_blocks(&image, 90, 2000);
        let data = image.with_extension("data");
        let block_size = fs_superblock(&image).block_size() as usize;
        data_file(&data, block_size, 80, 1, &[3]);
        let list = |b: &[u64]| b.iter().map(u64::to_string).collect::<Vec<_>>().join(",");
        let commands = format!(
            "{open}\njw -b {} {}\njw -r {}\njw -b {} -c {}\njc\n",
            list(&free[..80]),
            data.display(),
            list(&free[..30]),
            list(&free[80..85]),
            data.display()
        );
        debugfs_commands(&image, &commands);
        assert_same_listing(&image);
    }
}

#[test]
fn logdump_lists_kernel_journals_like_debugfs() {
    if !kernel_available() {
        return;
    }
    let _kernel = kernel_lock();
    let dir = tempfile::tempdir().unwrap();
    let image = common::mkfs(dir.path(), "ld-kernel", 32, &["-t", "ext3", "-b", "1024"]);
    let crash = kernel_crash_image(&image, "commit=1", Duration::ZERO, |root| {
        metadata_workload(root, 0, 60);
        commit_now(root);
        metadata_workload(root, 1, 60);
        commit_now(root);
    });
    assert_same_listing(&crash);
    let (listing, _) = our_listing(&crash);
    assert!(
        !listing.revokes.is_empty(),
        "the workload should revoke: {listing:?}"
    );
}

type Base = Option<(Vec<u8>, u32, Vec<u64>)>;

/// A small journal image, made once, whose log the cases fill with noise.
fn noise_base() -> &'static Base {
    static BASE: std::sync::OnceLock<Base> = std::sync::OnceLock::new();
    BASE.get_or_init(make_noise_base)
}

fn make_noise_base() -> Base {
    if !common::require_tool("debugfs") {
        return None;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = common::mkfs(dir.path(), "noise", 8, &["-t", "ext4", "-b", "1024"]);
    let free = free_blocks(&image, 10, 1000);
    let data = image.with_extension("data");
    data_file(&data, 1024, 10, 1, &[]);
    let list = free
        .iter()
        .map(u64::to_string)
        .collect::<Vec<_>>()
        .join(",");
    debugfs_commands(
        &image,
        &format!("jo -c\njw -b {list} {}\njc\n", data.display()),
    );
    let blocks = journal_blocks_from_debugfs(&image);
    Some((std::fs::read(&image).unwrap(), 1024, blocks))
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 64,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    /// Overwrite log blocks with structured noise (valid magic, small
    /// types and tids near the expected one, random counts and tags): no
    /// panic, no hang, from logdump or recovery.
    #[test]
    fn noise_in_the_log_never_panics(
        writes in proptest::collection::vec((1u64..64, any::<u32>(), 0u32..7, 0u32..4, any::<[u8; 48]>()), 1..40),
        csum in any::<bool>(),
    ) {
        let Some((bytes, block_size, blocks)) = noise_base() else { return Ok(()) };
        let (mut bytes, block_size, blocks) = (bytes.clone(), *block_size, blocks.clone());
        for (index, word, kind, tid_delta, tail) in writes {
            let at = blocks[index as usize] as usize * block_size as usize;
            let block = &mut bytes[at..at + block_size as usize];
            block[..4].copy_from_slice(&0xC03B_3998u32.to_be_bytes());
            block[4..8].copy_from_slice(&kind.to_be_bytes());
            block[8..12].copy_from_slice(&(1 + tid_delta).to_be_bytes());
            block[12..16].copy_from_slice(&word.to_be_bytes());
            block[16..64].copy_from_slice(&tail);
            block[1000..1024].copy_from_slice(&tail[..24]);
        }
        if !csum {
            // Drop the journal checksum feature so that noise reaches the
            // parsers instead of failing checksums.
            let at = blocks[0] as usize * block_size as usize;
            let mut superblock = jext4::engine::journal::format::JournalSuperblock::decode(&bytes[at..at + 1024]).unwrap();
            superblock.feature_incompat &= !(jext4::engine::journal::format::incompat::CSUM_V3);
            bytes[at..at + 1024].copy_from_slice(superblock.encode());
        }
        let (_, area) = memory_area(bytes, block_size, blocks);
        let mut sink = Vec::new();
        let _ = logdump(&area, &mut sink);
        let _ = recover_journal(&area);
    }
}
