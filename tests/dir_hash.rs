//! The directory hash functions against e2fsprogs: `debugfs dx_hash` for
//! every version (legacy, half_md4, tea, and their unsigned variants), with
//! the all-zero seed (the kernel's default seed) and real seeds, over names
//! of every length class (one, several and many hash rounds) and with
//! high bytes where signed and unsigned `char` differ.

mod dir_common;

use dir_common::{Rng, mkfs, random_name, run};
use jext4::engine::format::htree::{NameHash, name_hash};
use std::fmt::Write;

/// debugfs takes the seed as a UUID; s_hash_seed is that UUID's bytes read
/// as four little-endian words.
fn seed_words(uuid: &str) -> [u32; 4] {
    let hex: String = uuid.chars().filter(|c| *c != '-').collect();
    let bytes: Vec<u8> = (0..16)
        .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap())
        .collect();
    std::array::from_fn(|i| u32::from_le_bytes(bytes[4 * i..4 * i + 4].try_into().unwrap()))
}

#[test]
fn hashes_match_debugfs() {
    if !dir_common::can_run("debugfs") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = mkfs(dir.path(), "hash", 4, &["-t", "ext2"]);
    let seeds = [
        "00000000-0000-0000-0000-000000000000",
        "01020304-0506-0708-090a-0b0c0d0e0f10",
        "eb6a64ea-1dbb-4ad5-ada5-b4673058fe81",
    ];
    let mut rng = Rng::new(0x5eed);
    let mut names: Vec<Vec<u8>> = vec![b"a".to_vec(), b"hello".to_vec()];
    for tag in 0..120u64 {
        let len = [1, 3, 4, 15, 16, 17, 31, 32, 33, 64, 100, 200, 255][tag as usize % 13];
        names.push(random_name(&mut rng, len, tag));
    }
    // debugfs reads one command per line and splits on white space; our
    // names have neither.
    let mut commands = Vec::new();
    let mut expected = Vec::new();
    for seed in seeds {
        for version in 0..6u8 {
            for name in &names {
                commands.extend_from_slice(format!("dx_hash -h {version} -s {seed} ").as_bytes());
                commands.extend_from_slice(name);
                commands.push(b'\n');
                expected.push(name_hash(version, &seed_words(seed), name).unwrap());
            }
        }
    }
    let script = dir.path().join("commands");
    std::fs::write(&script, &commands).unwrap();
    let out = run(
        "debugfs",
        &["-f", script.to_str().unwrap(), image.to_str().unwrap()],
    );
    let got: Vec<NameHash> = out
        .lines()
        .filter_map(|line| line.split_once(" is 0x"))
        .map(|(_, rest)| {
            let (major, rest) = rest.split_once(" (minor 0x").unwrap();
            let minor = rest.trim_end_matches(')');
            NameHash {
                major: u32::from_str_radix(major, 16).unwrap(),
                minor: u32::from_str_radix(minor, 16).unwrap(),
            }
        })
        .collect();
    assert_eq!(
        got.len(),
        expected.len(),
        "debugfs answered {} of {}",
        got.len(),
        expected.len()
    );
    let mut mismatches = String::new();
    for (index, (got, want)) in got.iter().zip(&expected).enumerate() {
        if got != want {
            let per_seed = 6 * names.len();
            let version = index % per_seed / names.len();
            let name = &names[index % names.len()];
            writeln!(
                mismatches,
                "seed {} version {version} name {:?}: debugfs {got:x?}, ours {want:x?}",
                seeds[index / per_seed],
                String::from_utf8_lossy(name)
            )
            .unwrap();
        }
    }
    assert!(mismatches.is_empty(), "{mismatches}");
}
