//! `journal::fast_commit`: the blocks of a fast-commit replay are logged as
//! one transaction after the valid log, so that a crash at any write leaves
//! either none or all of them for recovery; the fast-commit area is retired
//! once that transaction is durable; without room in the log they are
//! written home directly.

mod common;

use common::journal::*;
use jext4::engine::dev::BlockDevice;
use jext4::engine::format::fast_commit::{AreaBuilder, Dentry, Record};
use jext4::engine::fs::recover_journal;
use jext4::engine::journal::fast_commit::{ReplayWrite, write_replayed_blocks};
use jext4::engine::journal::format::fast_commit_head_tid;
use jext4::engine::journal::recovery::{FastCommitArea, JournalArea};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

mod fast_commit_support;
use fast_commit_support::CrashingDevice;

/// A 16 MiB fast_commit image whose journal holds one committed transaction
/// of `logged` blocks (written by debugfs), and whose fast-commit area
/// opens with a fast commit for the next tid. Returns the image, the area,
/// and free blocks not used by the transaction.
fn image_with_log(dir: &Path, logged: usize) -> (PathBuf, FastCommitArea, Vec<u64>) {
    let image = common::mkfs(
        dir,
        "fcj",
        16,
        &["-t", "ext4", "-b", "1024", "-O", "fast_commit"],
    );
    let free = free_blocks(&image, logged + 64, 3000);
    let data = image.with_extension("data");
    data_file(&data, 1024, logged, 5, &[1]);
    let list: Vec<String> = free[..logged].iter().map(u64::to_string).collect();
    debugfs_commands(
        &image,
        &format!("jo -c\njw -b {} {}\njc\n", list.join(","), data.display()),
    );
    let area = file_area(&image);
    // The kernel turns the journal's fast_commit feature on at mount.
    let (mut superblock, _) = area.load_superblock().unwrap();
    superblock.feature_incompat |= jext4::engine::journal::format::incompat::FAST_COMMIT;
    area.store_superblock(&mut superblock).unwrap();
    let (superblock, layout) = area.load_superblock().unwrap();
    let (first_block, end_block) = layout.fast_commit.unwrap();
    let tid = superblock.sequence + 1;
    let mut builder = AreaBuilder::new(1024);
    builder.add(&Record::Head { features: 0, tid });
    builder.add(&Record::Unlink(Dentry {
        parent: 2,
        ino: 11,
        name: b"nothing".to_vec(),
    }));
    builder.tail(tid);
    let built = builder.finish();
    assert_eq!(built.blocks().len(), 1);
    let offset = area.blocks[first_block as usize] * 1024;
    area.dev.write_at(offset, built.bytes()).unwrap();
    let fast_commit = FastCommitArea {
        first_block,
        end_block,
        expected_tid: tid,
        has_records: true,
    };
    (image, fast_commit, free[logged..].to_vec())
}

/// What the replay "changed": `count` free blocks, each with its own bytes.
fn replayed(free: &[u64], count: usize) -> BTreeMap<u64, Vec<u8>> {
    free[..count]
        .iter()
        .map(|&block| (block, vec![(block % 251) as u8 ^ 0x5A; 1024]))
        .collect()
}

fn block(bytes: &[u8], block: u64) -> &[u8] {
    &bytes[block as usize * 1024..(block as usize + 1) * 1024]
}

#[test]
fn a_crash_at_any_write_leaves_none_or_all_of_the_replay() {
    if !common::require_tool("debugfs") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (image, fast_commit, free) = image_with_log(dir.path(), 5);
    let bytes = std::fs::read(&image).unwrap();
    let journal = journal_blocks_from_debugfs(&image);
    let blocks = replayed(&free, 40);
    let mut saw_none = false;
    let mut saw_all = false;
    // Each round lets one more write through; the last one completes.
    for writes in 0..1000 {
        let device = Arc::new(CrashingDevice::new(bytes.clone(), writes, writes % 2 == 1));
        let dev: Arc<dyn BlockDevice> = device.clone();
        let area = JournalArea::new(dev, 1024, journal.clone());
        let outcome = write_replayed_blocks(&area, &fast_commit, &blocks);
        let (memory, area) = memory_area(device.inner.snapshot(), 1024, journal.clone());
        let report = recover_journal(&area).unwrap();
        assert!(report.problem.is_none(), "{report:?}");
        let after = memory.snapshot();
        let new = blocks
            .iter()
            .filter(|&(&at, content)| block(&after, at) == content.as_slice())
            .count();
        let old = blocks
            .keys()
            .filter(|&&at| block(&after, at) == block(&bytes, at))
            .count();
        assert!(
            new == blocks.len() || old == blocks.len(),
            "crash after {writes} writes: {new} new and {old} old blocks"
        );
        // Once logged, the fast commits for that tid are gone or stale.
        assert!(!report.fast_commit.unwrap().has_records || new == 0);
        saw_none |= new == 0;
        saw_all |= new == blocks.len();
        if let Ok(written) = outcome {
            assert_eq!(
                written,
                ReplayWrite::Logged {
                    tid: fast_commit.expected_tid,
                    log_blocks: 40 + 1 + 2,
                }
            );
            assert_eq!(report.transactions_replayed, 2);
            let at = journal[fast_commit.first_block as usize] as usize * 1024;
            assert_eq!(
                fast_commit_head_tid(&bytes[at..at + 1024]),
                Some(fast_commit.expected_tid)
            );
            assert_eq!(
                fast_commit_head_tid(&after[at..at + 1024]),
                None,
                "area retired"
            );
            assert!(saw_none && saw_all);
            return;
        }
    }
    panic!("the replay never completed");
}

#[test]
fn without_room_in_the_log_the_replay_goes_home_directly() {
    if !common::require_tool("debugfs") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // 1000 logged blocks and their descriptors nearly fill the 1024-block log.
    let (image, fast_commit, free) = image_with_log(dir.path(), 1000);
    let blocks = replayed(&free, 40);
    let area = file_area(&image);
    let outcome = write_replayed_blocks(&area, &fast_commit, &blocks).unwrap();
    assert_eq!(outcome, ReplayWrite::Direct);
    let after = std::fs::read(&image).unwrap();
    for (&at, content) in &blocks {
        assert_eq!(block(&after, at), content.as_slice());
    }
    // The log is as it was: its one transaction replays.
    let report = recover_journal(&area).unwrap();
    assert_eq!((report.transactions_replayed, report.problem), (1, None));
    common::assert_fsck_clean(&image);
}
