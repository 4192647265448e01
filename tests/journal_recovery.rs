//! Journal recovery against the reference: journals written by debugfs and
//! by the kernel are replayed by jext4 and by `e2fsck -E journal_only`; the
//! two images must be identical outside the primary superblock, and
//! `e2fsck -fn` must find jext4's clean.

mod common;

use common::journal::*;
use jext4::engine::fs::recover_journal;
use jext4::engine::journal::recovery::RecoveryProblem;
use std::path::Path;
use std::time::Duration;

/// One debugfs-written journal: transactions with an escaped block, a
/// multi-descriptor transaction, revokes (some spanning several revoke
/// blocks), a block rewritten after its revoke, and a last transaction that
/// is written but never committed.
struct DebugfsJournal {
    /// Blocks of transaction 1 (the first one starts with the magic).
    first: Vec<u64>,
    /// Revoked in transaction 2, and not rewritten after.
    revoked: Vec<u64>,
    /// Revoked in transaction 2, then rewritten in transaction 3.
    rewritten: u64,
    /// Written by the uncommitted transaction.
    uncommitted: u64,
}

fn debugfs_journal(image: &Path, open: &str) -> DebugfsJournal {
    let block_size = fs_superblock(image).block_size() as usize;
    let free = free_blocks(image, 160, 2000);
    let first: Vec<u64> = free[..100].to_vec();
    let revoked: Vec<u64> = free[10..40].to_vec();
    let rewritten = free[5];
    let uncommitted = free[150];
    let data = image.with_extension("data");
    data_file(&data, block_size, 100, 7, &[0, 42]);
    let data2 = image.with_extension("data2");
    data_file(&data2, block_size, 2, 99, &[1]);
    let list = |blocks: &[u64]| {
        blocks
            .iter()
            .map(u64::to_string)
            .collect::<Vec<_>>()
            .join(",")
    };
    // Enough revoke records to need more than one revoke block at 1 KiB.
    let mut revoke_list = revoked.clone();
    revoke_list.push(rewritten);
    let blocks_count = fs_superblock(image).blocks_count;
    revoke_list.extend(blocks_count - 400..blocks_count - 100);
    let commands = format!(
        "{open}\njw -b {} {}\njw -r {}\njw -b {},{} {}\njw -b {} -c {}\njc\n",
        list(&first),
        data.display(),
        list(&revoke_list),
        rewritten,
        free[120],
        data2.display(),
        uncommitted,
        data2.display(),
    );
    debugfs_commands(image, &commands);
    DebugfsJournal {
        first,
        revoked,
        rewritten,
        uncommitted,
    }
}

fn block_of(image: &[u8], block_size: usize, block: u64) -> &[u8] {
    &image[block as usize * block_size..][..block_size]
}

#[test]
fn debugfs_journals_replay_like_e2fsck() {
    if !common::require_tool("debugfs") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let variants: &[(&str, &[&str], &str)] = &[
        ("ext3-plain", &["-t", "ext3", "-b", "1024"], "jo"),
        ("ext3-csum-v1", &["-t", "ext3", "-b", "1024"], "jo -c"),
        ("ext4-1k-v3", &["-t", "ext4", "-b", "1024"], "jo -c"),
        ("ext4-4k-v3", &["-t", "ext4", "-b", "4096"], "jo -c"),
        ("ext4-1k-v2", &["-t", "ext4", "-b", "1024"], "jo -c -v 2"),
        ("ext4-4k-64bit-plain", &["-t", "ext4", "-b", "4096"], "jo"),
    ];
    for (name, args, open) in variants {
        let image = common::mkfs(dir.path(), name, 32, args);
        let written = debugfs_journal(&image, open);
        let before = std::fs::read(&image).unwrap();
        assert!(dumpe2fs_needs_recovery(&image), "{name}");
        let (report, ours) = recover_both(&image);
        assert_eq!(report.problem, None, "{name}");
        assert_eq!(report.next_tid, report.end_tid + 1);
        if *name == "ext3-csum-v1" {
            // debugfs's v1 commit checksum also covers revoke blocks, which
            // the kernel's does not: e2fsck's recovery (and ours) rejects
            // the revoke transaction as a failed commit and stops there.
            assert_eq!(report.failed_commit, Some(2), "{name}: {report:?}");
            assert_eq!(report.transactions_replayed, 1, "{name}: {report:?}");
            assert_eq!(report.blocks_replayed, 100, "{name}: {report:?}");
            continue;
        }
        assert_eq!(report.failed_commit, None, "{name}");
        assert_eq!(report.transactions_replayed, 3, "{name}: {report:?}");
        // 100 + 2 logged; 31 copies of the first transaction revoked.
        assert_eq!(report.blocks_replayed, 102 - 31, "{name}: {report:?}");
        assert_eq!(report.revoked_blocks_skipped, 31, "{name}");
        assert_eq!(report.revoke_records, 331, "{name}");
        let block_size = fs_superblock(&image).block_size() as usize;
        let data = std::fs::read(image.with_extension("data")).unwrap();
        let data2 = std::fs::read(image.with_extension("data2")).unwrap();
        let after = std::fs::read(&ours).unwrap();
        for (index, &block) in written.first.iter().enumerate() {
            let expected = if written.revoked.contains(&block) {
                block_of(&before, block_size, block)
            } else if block == written.rewritten {
                &data2[..block_size]
            } else {
                &data[index * block_size..][..block_size]
            };
            assert!(
                block_of(&after, block_size, block) == expected,
                "{name}: block {block}"
            );
        }
        let escaped = block_of(&after, block_size, written.first[0]);
        assert_eq!(
            escaped[..4],
            0xC03B_3998u32.to_be_bytes(),
            "{name}: unescaped"
        );
        assert!(
            block_of(&after, block_size, written.uncommitted)
                == block_of(&before, block_size, written.uncommitted),
            "{name}: the uncommitted transaction must not replay"
        );
        // Idempotent: a second run finds nothing to do and changes nothing.
        let again = recover_journal(&file_area(&ours)).unwrap();
        assert!(!again.needed, "{name}");
        assert_eq!(
            std::fs::read(&ours).unwrap(),
            after,
            "{name}: second recovery changed the image"
        );
    }
}

/// Kernel images: (name, mke2fs arguments, mount options, payload that
/// starts with the JBD2 magic so data=journal logs escaped blocks).
const KERNEL_VARIANTS: &[(&str, &[&str], &str)] = &[
    ("k-ext3-1k", &["-t", "ext3", "-b", "1024"], "commit=1"),
    ("k-ext4-1k", &["-t", "ext4", "-b", "1024"], "commit=1"),
    ("k-ext4-4k", &["-t", "ext4", "-b", "4096"], "commit=1"),
    (
        "k-ext4-small",
        &["-t", "ext4", "-b", "1024", "-J", "size=1"],
        "commit=1",
    ),
    (
        "k-ext4-csum-v1",
        &["-t", "ext4", "-b", "4096", "-O", "^metadata_csum"],
        "commit=1,journal_checksum",
    ),
    (
        "k-ext4-async",
        &["-t", "ext4", "-b", "1024", "-O", "^metadata_csum"],
        "commit=1,journal_async_commit,data=writeback",
    ),
    (
        "k-ext4-data-journal",
        &["-t", "ext4", "-b", "4096"],
        "commit=1,data=journal",
    ),
];

fn magic_payload(root: &Path, blocks: usize) {
    let mut bytes = Vec::new();
    for index in 0..blocks {
        let mut block = vec![index as u8; 4096];
        block[..4].copy_from_slice(&0xC03B_3998u32.to_be_bytes());
        bytes.extend(block);
    }
    std::fs::write(root.join("magic.bin"), bytes).unwrap();
}

#[test]
fn kernel_journals_replay_like_e2fsck() {
    if !kernel_available() {
        return;
    }
    let _kernel = kernel_lock();
    let dir = tempfile::tempdir().unwrap();
    for (name, args, options) in KERNEL_VARIANTS {
        let image = common::mkfs(dir.path(), name, 64, args);
        let crash = kernel_crash_image(&image, options, Duration::ZERO, |root| {
            metadata_workload(root, 0, 120);
            magic_payload(root, 16);
            commit_now(root);
            metadata_workload(root, 1, 80);
            commit_now(root);
        });
        let (report, ours) = recover_both(&crash);
        assert!(report.needed, "{name}");
        assert_eq!(report.problem, None, "{name}: {report:?}");
        assert!(report.transactions_replayed >= 1, "{name}: {report:?}");
        assert!(report.blocks_replayed > 0, "{name}: {report:?}");
        if options.contains("data=journal") {
            let mut dump = Vec::new();
            jext4::engine::journal::logdump::logdump(&file_area(&crash), &mut dump).unwrap();
            let dump = String::from_utf8(dump).unwrap();
            assert!(
                dump.contains(" escape"),
                "{name}: no escaped block in the log:\n{dump}"
            );
        }
        let again = recover_journal(&file_area(&ours)).unwrap();
        assert!(!again.needed, "{name}: needs_recovery after recovery");
        eprintln!("{name}: {report:?}");
    }
}

#[test]
fn kernel_log_that_wraps_replays_like_e2fsck() {
    if !kernel_available() {
        return;
    }
    let _kernel = kernel_lock();
    let dir = tempfile::tempdir().unwrap();
    for (name, args) in [
        ("wrap-1k", &["-t", "ext4", "-b", "1024", "-J", "size=1"][..]),
        ("wrap-4k", &["-t", "ext4", "-b", "4096", "-J", "size=4"][..]),
    ] {
        let mut wrapped_report = None;
        for attempt in 0..3 {
            let image = common::mkfs(dir.path(), &format!("{name}-{attempt}"), 64, args);
            let blocks = journal_blocks_from_debugfs(&image);
            let crash = kernel_crash_image(&image, "commit=1", Duration::ZERO, |root| {
                for round in 0..80 {
                    metadata_workload(root, round, 100);
                    commit_now(root);
                    if round >= 3 && log_wraps(&image, &blocks) {
                        break;
                    }
                }
            });
            let (report, _) = recover_both(&crash);
            assert_eq!(report.problem, None, "{name}: {report:?}");
            if report.log_wrapped {
                wrapped_report = Some(report);
                break;
            }
        }
        let report = wrapped_report.unwrap_or_else(|| panic!("{name}: the log never wrapped"));
        eprintln!("{name}: {report:?}");
    }
}

#[test]
fn refuses_what_it_cannot_replay() {
    if !common::require_tool("debugfs") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = common::mkfs(dir.path(), "refuse", 16, &["-t", "ext4", "-b", "1024"]);
    debugfs_journal(&image, "jo -c");
    let journal_sb = journal_block_offset(&image, 0);

    // A flipped byte in the journal superblock: its checksum fails.
    let bad = image.with_extension("bad-sb.img");
    std::fs::copy(&image, &bad).unwrap();
    flip_byte(&bad, journal_sb + 0x10, 0x01);
    match recover_journal(&file_area(&bad)) {
        Err(jext4::Error::Corrupt { location, .. }) => {
            assert_eq!(location, jext4::Location::Journal { block: 0 })
        }
        other => panic!("bad journal superblock: {other:?}"),
    }
    // An unknown incompat feature, with a valid checksum.
    let unknown = image.with_extension("unknown.img");
    std::fs::copy(&image, &unknown).unwrap();
    {
        let area = file_area(&unknown);
        let block = area.read_block(0).unwrap();
        let mut superblock =
            jext4::engine::journal::format::JournalSuperblock::decode(&block).unwrap();
        superblock.feature_incompat |= 0x4000;
        area.dev
            .write_at(area.blocks[0] * 1024, superblock.encode())
            .unwrap();
        assert!(matches!(
            recover_journal(&area),
            Err(jext4::Error::Unsupported(_))
        ));
    }
    // An external journal (s_journal_uuid set).
    let external = image.with_extension("external.img");
    std::fs::copy(&image, &external).unwrap();
    let (code, text) = run(
        "debugfs",
        &[
            "-w",
            "-R",
            "ssv journal_uuid 01234567-89ab-cdef-0123-456789abcdef",
            external.to_str().unwrap(),
        ],
    );
    assert_eq!(code, 0, "{text}");
    match recover_journal(&file_area(&external)) {
        Err(jext4::Error::Unsupported(message)) => {
            assert!(message.contains("external"), "{message}")
        }
        other => panic!("external journal: {other:?}"),
    }
    // Nothing above changed the images it refused.
    assert!(dumpe2fs_needs_recovery(&bad) && dumpe2fs_needs_recovery(&unknown));
}

#[test]
fn report_names_the_problem_of_a_torn_data_block() {
    if !common::require_tool("debugfs") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = common::mkfs(dir.path(), "torn", 16, &["-t", "ext4", "-b", "1024"]);
    debugfs_journal(&image, "jo -c");
    let log = log_blocks(&image);
    let first = log[0].first_data.unwrap();
    flip_byte(&image, journal_block_offset(&image, first + 3) + 100, 0x20);
    let (report, _) = recover_both_with(&image, false);
    assert!(
        matches!(report.problem, Some(RecoveryProblem::DataChecksum { .. })),
        "{report:?}"
    );
    // The other blocks of the log were still replayed.
    assert!(report.blocks_replayed >= 70, "{report:?}");
}

#[test]
fn an_aborted_journal_marks_the_filesystem_with_errors_like_e2fsck() {
    if !common::require_tool("debugfs") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = common::mkfs(dir.path(), "errno", 16, &["-t", "ext4", "-b", "1024"]);
    debugfs_journal(&image, "jo -c");
    {
        let area = file_area(&image);
        let block = area.read_block(0).unwrap();
        let mut superblock =
            jext4::engine::journal::format::JournalSuperblock::decode(&block).unwrap();
        superblock.errno = -5; // -EIO, as jbd2_journal_abort records it
        area.dev
            .write_at(area.blocks[0] * 1024, superblock.encode())
            .unwrap();
    }
    let (report, ours) = recover_both(&image);
    assert_eq!(report.problem, None);
    let state = fs_superblock(&ours).state;
    assert_ne!(
        state & jext4::engine::format::superblock::STATE_ERROR,
        0,
        "state {state:#x}"
    );
    let area = file_area(&ours);
    let journal =
        jext4::engine::journal::format::JournalSuperblock::decode(&area.read_block(0).unwrap())
            .unwrap();
    assert_eq!((journal.errno, journal.start), (0, 0));
}
