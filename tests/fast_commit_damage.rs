//! Damaged fast commits are ignored from the damage on, as the kernel
//! ignores them: a TAIL with a bad CRC or another tid, or a record that
//! cannot be parsed, ends the replay at the last valid TAIL; a HEAD for
//! another transaction replays nothing. The kernel's own replay of each
//! damaged image is the reference; where it refuses to mount (damage in the
//! first fast commit), jext4 replays nothing, like e2fsck.

mod common;
mod fast_commit_support;

use common::journal::*;
use fast_commit_support::*;
use jext4::engine::format::fast_commit::tag;
use std::path::{Path, PathBuf};

const COMMITS: usize = 6;

/// A crash image with `COMMITS` fast commits, one new file each.
fn six_fast_commits(dir: &Path, block_size: u32) -> PathBuf {
    let (crash, _) =
        fast_commit_crash_image(dir, &format!("dmg{block_size}"), block_size, 64, |work| {
            for index in 0..COMMITS {
                work.write(
                    &format!("file-{index}"),
                    vec![index as u8 + 1; 1500 + index],
                );
            }
        });
    crash
}

/// The area's records and where each fast commit starts and ends: (first
/// byte, TAIL offset).
fn commits(area: &FastCommitBlocks, bytes: &[u8]) -> Vec<(usize, usize)> {
    let mut commits = Vec::new();
    let mut start = 0;
    for (record_tag, offset) in area.records(bytes) {
        if record_tag == tag::TAIL {
            commits.push((start, offset));
            // A TAIL runs to the end of its block.
            start = (offset / area.block_size + 1) * area.block_size;
        }
    }
    assert!(commits.len() >= COMMITS, "{} fast commits", commits.len());
    commits
}

/// Damage a copy of `crash`, replay it with the kernel and with jext4, and
/// compare. `expected_files` is how many of the files must survive.
fn check(
    crash: &Path,
    label: &str,
    expected_files: usize,
    damage: impl Fn(&FastCommitBlocks, &mut Vec<u8>),
) {
    let damaged = crash.with_extension(format!("{label}.img"));
    std::fs::copy(crash, &damaged).unwrap();
    let area = FastCommitBlocks::of(&damaged);
    let mut bytes = area.read(&damaged);
    damage(&area, &mut bytes);
    area.write(&damaged, &bytes);

    let kernel = damaged.with_extension("kernel.img");
    std::fs::copy(&damaged, &kernel).unwrap();
    let kernel_tree = mounted_tree(&kernel, "rw");

    let ours = damaged.with_extension("jext4.img");
    std::fs::copy(&damaged, &ours).unwrap();
    let report = jext4::engine::fs::recover_image(&ours)
        .unwrap()
        .expect("recovery needed");
    assert!(report.journal.problem.is_none(), "{label}: {report:?}");
    common::assert_fsck_clean(&ours);
    let our_tree = mounted_tree(&ours, "ro,noload").unwrap();
    let files = our_tree
        .keys()
        .filter(|name| name.starts_with("d/file-"))
        .count();
    assert_eq!(files, expected_files, "{label}: {our_tree:?}");
    match kernel_tree {
        Ok(kernel_tree) => assert_eq!(
            our_tree,
            kernel_tree,
            "{label}: {}",
            tree_difference(&kernel_tree, &our_tree)
        ),
        Err(error) => {
            // Only damage in the first fast commit makes the kernel refuse.
            assert_eq!(expected_files, 0, "{label}: the kernel refused: {error}");
            eprintln!("{label}: the kernel refuses to mount; jext4 replays no fast commit");
        }
    }
}

fn damaged_records_are_ignored_like_the_kernel(block_size: u32) {
    if !kernel_available() {
        return;
    }
    let _kernel = kernel_lock();
    let dir = tempfile::tempdir().unwrap();
    let crash = six_fast_commits(dir.path(), block_size);
    check(&crash, "intact", COMMITS, |_, _| {});
    check(&crash, "bad-crc-3", 2, |area, bytes| {
        let (_, tail) = commits(area, bytes)[2];
        bytes[tail + 8] ^= 0x10;
    });
    check(&crash, "wrong-tid-4", 3, |area, bytes| {
        let (start, tail) = commits(area, bytes)[3];
        let tid = u32::from_le_bytes(bytes[tail + 4..tail + 8].try_into().unwrap());
        bytes[tail + 4..tail + 8].copy_from_slice(&(tid + 1).to_le_bytes());
        reseal(bytes, start, tail); // only the tid is wrong
    });
    check(&crash, "unknown-tag-5", 4, |area, bytes| {
        let (start, tail) = commits(area, bytes)[4];
        let record = area
            .records(bytes)
            .into_iter()
            .find(|&(record_tag, offset)| offset >= start && record_tag == tag::CREAT)
            .unwrap()
            .1;
        assert!(record < tail);
        bytes[record..record + 2].copy_from_slice(&0x0042u16.to_le_bytes());
        reseal(bytes, start, tail); // a well-sealed record nobody knows
    });
    check(&crash, "bad-crc-1", 0, |area, bytes| {
        let (_, tail) = commits(area, bytes)[0];
        bytes[tail + 9] ^= 0x01;
    });
    check(&crash, "head-for-another-tid", 0, |_, bytes| {
        let tid = u32::from_le_bytes(bytes[8..12].try_into().unwrap());
        bytes[8..12].copy_from_slice(&(tid.wrapping_sub(1)).to_le_bytes());
    });
}

#[test]
fn damaged_fast_commits_are_ignored_like_the_kernel_1k() {
    damaged_records_are_ignored_like_the_kernel(1024);
}

#[test]
fn damaged_fast_commits_are_ignored_like_the_kernel_4k() {
    damaged_records_are_ignored_like_the_kernel(4096);
}
