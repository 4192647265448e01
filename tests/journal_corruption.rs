//! Damaged journals: jext4 must do exactly what e2fsck 1.47 does with
//! them (same image afterwards, outside the primary superblock) and never
//! panic or hang. Targeted damage checks each rule of the kernel's scan;
//! random bit flips over the live log check everything else.

mod common;

use jext4::engine::rng::Rng;

use common::journal::*;
use jext4::engine::journal::format::block_type;
use jext4::engine::journal::recovery::{RecoveryProblem, RecoveryReport};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// A debugfs journal of four committed transactions: 20 blocks; 5 revokes;
/// 10 blocks; 5 blocks.
fn four_transactions(dir: &Path, name: &str, mkfs: &[&str], open: &str) -> PathBuf {
    let image = common::mkfs(dir, name, 16, mkfs);
    let block_size = fs_superblock(&image).block_size() as usize;
    let free = free_blocks(&image, 40, 3000);
    let data = image.with_extension("data");
    data_file(&data, block_size, 20, 11, &[4]);
    let list = |blocks: &[u64]| {
        blocks
            .iter()
            .map(u64::to_string)
            .collect::<Vec<_>>()
            .join(",")
    };
    let revokes = if open.contains("-c") && mkfs.contains(&"ext3") {
        // debugfs's checksum v1 wrongly covers revoke blocks (see
        // journal_recovery.rs): keep revokes out of v1 journals.
        format!("jw -b {} {}", free[35], data.display())
    } else {
        format!("jw -r {}", list(&free[..5]))
    };
    let commands = format!(
        "{open}\njw -b {} {}\n{revokes}\njw -b {} {}\njw -b {} {}\njc\n",
        list(&free[..20]),
        data.display(),
        list(&free[10..20]),
        data.display(),
        list(&free[25..30]),
        data.display(),
    );
    debugfs_commands(&image, &commands);
    image
}

/// Copy `image`, damage the copy with `damage`, and compare replays.
fn damaged(image: &Path, label: &str, damage: impl FnOnce(&Path)) -> RecoveryReport {
    let copy = image.with_extension(format!("{label}.img"));
    std::fs::copy(image, &copy).unwrap();
    damage(&copy);
    let (report, _) = recover_both_with(&copy, false);
    report
}

/// Make the big-endian 64-bit commit time at `offset` smaller: clear the
/// top set bit of its first non-zero byte.
fn make_older(image: &Path, offset: u64) {
    let bytes = std::fs::read(image).unwrap();
    let at = offset as usize;
    let index = (at..at + 8)
        .find(|&i| bytes[i] != 0)
        .expect("a commit time of zero cannot get older");
    let top_bit = 0x80u8 >> bytes[index].leading_zeros();
    flip_byte(image, index as u64, top_bit);
}

fn nth(log: &[LogBlock], kind: u32, tid_offset: u32) -> LogBlock {
    let first_tid = log[0].tid;
    *log.iter()
        .find(|block| block.block_type == kind && block.tid == first_tid + tid_offset)
        .unwrap_or_else(|| panic!("no block of type {kind} in transaction +{tid_offset}: {log:?}"))
}

#[test]
fn damaged_checksummed_journals_replay_like_e2fsck() {
    if !common::require_tool("debugfs") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = four_transactions(dir.path(), "v3", &["-t", "ext4", "-b", "1024"], "jo -c");
    let log = log_blocks(&image);
    let at = |block: LogBlock, byte: u64| journal_block_offset(&image, block.index) + byte;
    let first_tid = log[0].tid;

    // A bad descriptor tail with a commit that is not older: the whole
    // recovery fails and nothing is replayed.
    let report = damaged(&image, "descriptor", |copy| {
        flip_byte(copy, at(nth(&log, block_type::DESCRIPTOR, 2), 20), 0x04)
    });
    assert_eq!(
        report.problem,
        Some(RecoveryProblem::TransactionChecksum { tid: first_tid + 2 })
    );
    assert_eq!(report.blocks_replayed, 0);

    // The same for a revoke block.
    let report = damaged(&image, "revoke", |copy| {
        flip_byte(copy, at(nth(&log, block_type::REVOKE, 1), 17), 0x01)
    });
    assert!(matches!(
        report.problem,
        Some(RecoveryProblem::TransactionChecksum { .. })
    ));

    // A bad commit checksum: the log ends before that transaction.
    let report = damaged(&image, "commit", |copy| {
        flip_byte(copy, at(nth(&log, block_type::COMMIT, 2), 60), 0x80)
    });
    assert_eq!(report.problem, None);
    assert_eq!(report.failed_commit, Some(first_tid + 2));
    assert_eq!(report.transactions_replayed, 2);

    // A commit whose time runs backwards (and whose checksum then fails) is
    // a stale block: the log ends there quietly.
    let report = damaged(&image, "stale-commit", |copy| {
        make_older(copy, at(nth(&log, block_type::COMMIT, 2), 48))
    });
    assert_eq!((report.problem, report.failed_commit), (None, None));
    assert_eq!(report.transactions_replayed, 2);

    // A torn logged block: skipped, everything else replayed, failure
    // reported.
    let descriptor = nth(&log, block_type::DESCRIPTOR, 3);
    let report = damaged(&image, "data", |copy| {
        let data = descriptor.first_data.unwrap() + 1;
        flip_byte(copy, journal_block_offset(copy, data) + 500, 0x10)
    });
    assert!(matches!(
        report.problem,
        Some(RecoveryProblem::DataChecksum { .. })
    ));
    assert_eq!(report.blocks_replayed, 20 - 5 + 10 + 5 - 1);

    // A lost commit magic or a sequence break ends the log early.
    let report = damaged(&image, "no-magic", |copy| {
        flip_byte(copy, at(nth(&log, block_type::COMMIT, 1), 0), 0xFF)
    });
    assert_eq!((report.problem, report.transactions_replayed), (None, 1));
    let report = damaged(&image, "sequence", |copy| {
        flip_byte(copy, at(nth(&log, block_type::DESCRIPTOR, 3), 11), 0x01)
    });
    assert_eq!((report.problem, report.transactions_replayed), (None, 3));
}

#[test]
fn damaged_unchecksummed_journals_replay_like_e2fsck() {
    if !common::require_tool("debugfs") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let plain = four_transactions(dir.path(), "plain", &["-t", "ext3", "-b", "1024"], "jo");
    let log = log_blocks(&plain);
    // r_count past the block: the revoke pass fails (EINVAL).
    let revoke = nth(&log, block_type::REVOKE, 1);
    let report = damaged(&plain, "r-count", |copy| {
        flip_byte(copy, journal_block_offset(copy, revoke.index) + 13, 0x40)
    });
    assert_eq!(
        report.problem,
        Some(RecoveryProblem::RevokeCount {
            index: revoke.index
        })
    );
    assert_eq!(report.blocks_replayed, 0);
    // A tag moved to another home: both tools write it there.
    let descriptor = nth(&log, block_type::DESCRIPTOR, 2);
    let report = damaged(&plain, "tag", |copy| {
        flip_byte(
            copy,
            journal_block_offset(copy, descriptor.index) + 12 + 3,
            0x01,
        )
    });
    assert_eq!(report.problem, None);

    // Checksum v1: a changed logged block fails its commit's CRC32.
    let v1 = four_transactions(dir.path(), "v1", &["-t", "ext3", "-b", "1024"], "jo -c");
    let log = log_blocks(&v1);
    let descriptor = nth(&log, block_type::DESCRIPTOR, 2);
    let report = damaged(&v1, "v1-data", |copy| {
        let data = descriptor.first_data.unwrap() + 2;
        flip_byte(copy, journal_block_offset(copy, data) + 7, 0x01)
    });
    assert_eq!(report.failed_commit, Some(log[0].tid + 2));
    assert_eq!(report.transactions_replayed, 2);
}

#[test]
fn damaged_async_commit_journal_replays_like_e2fsck() {
    if !kernel_available() {
        return;
    }
    let _kernel = kernel_lock();
    let dir = tempfile::tempdir().unwrap();
    let image = common::mkfs(
        dir.path(),
        "async",
        32,
        &["-t", "ext4", "-b", "1024", "-O", "^metadata_csum"],
    );
    let crash = kernel_crash_image(
        &image,
        "commit=1,journal_async_commit,data=writeback",
        Duration::ZERO,
        |root| {
            metadata_workload(root, 0, 60);
            commit_now(root);
            metadata_workload(root, 1, 60);
            commit_now(root);
        },
    );
    let log = log_blocks(&crash);
    let commits = log
        .iter()
        .filter(|b| b.block_type == block_type::COMMIT)
        .count();
    assert!(commits >= 2, "{log:?}");
    // A changed logged block of the first transaction: with async_commit
    // the scan goes on past the failed commit but replays nothing from it
    // on; the next commit block records the failure.
    let descriptor = *log
        .iter()
        .find(|block| block.block_type == block_type::DESCRIPTOR)
        .unwrap();
    assert!(descriptor.tid < log.last().unwrap().tid, "{log:?}");
    let report = damaged(&crash, "async-data", |copy| {
        let data = descriptor.first_data.unwrap();
        flip_byte(copy, journal_block_offset(copy, data) + 99, 0x02)
    });
    assert_eq!(report.end_tid, descriptor.tid, "{report:?}");
    assert_eq!(report.failed_commit, Some(descriptor.tid), "{report:?}");
}

/// Flip random bits in the live log (metadata and logged blocks) and
/// compare with e2fsck each time.
fn random_damage(image: &Path, rounds: usize, seed: u64) {
    let log = log_blocks(image);
    let first = log.first().unwrap().index;
    let last = log.last().unwrap().index;
    let block_size = fs_superblock(image).block_size() as u64;
    let mut rng = Rng::new(seed);
    let mut compared = 0;
    for round in 0..rounds {
        let index = first + rng.below(last - first + 1);
        let offset = if rng.below(2) == 0 {
            rng.below(64)
        } else {
            rng.below(block_size)
        };
        let bit = 1u8 << rng.below(8);
        let copy = image.with_extension(format!("random{round}.img"));
        std::fs::copy(image, &copy).unwrap();
        flip_byte(&copy, journal_block_offset(&copy, index) + offset, bit);
        let theirs = copy.with_extension("e2fsck.img");
        std::fs::copy(&copy, &theirs).unwrap();
        let (code, _) = run(
            "e2fsck",
            &["-E", "journal_only", "-p", theirs.to_str().unwrap()],
        );
        if code > 1 {
            continue; // e2fsck itself gave up (replayed garbage into its superblock)
        }
        let (report, _) = recover_both_with(&copy, false);
        if matches!(
            report.problem,
            Some(RecoveryProblem::HomeOutsideDevice { .. })
        ) {
            panic!("round {round}: a tag pointing past the device slipped through: {report:?}");
        }
        compared += 1;
    }
    assert!(
        compared * 2 > rounds,
        "only {compared} of {rounds} rounds compared"
    );
}

#[test]
fn random_damage_replays_like_e2fsck() {
    if !common::require_tool("debugfs") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let v3 = four_transactions(
        dir.path(),
        "rand-v3",
        &["-t", "ext4", "-b", "1024"],
        "jo -c",
    );
    random_damage(&v3, 40, 0x5EED_0001);
    let v2 = four_transactions(
        dir.path(),
        "rand-v2",
        &["-t", "ext4", "-b", "4096"],
        "jo -c -v 2",
    );
    random_damage(&v2, 20, 0x5EED_0002);
}
