//! Fast commits with nonsense in them: records whose values are random but
//! whose CRCs are valid (so that the scan accepts them) must never make
//! recovery panic or hang (debug assertions included); it replays them or
//! fails with an error naming the damage. (About a quarter of the cases
//! fail: blocks outside the filesystem or on its metadata, unknown inodes.)

mod common;
mod fast_commit_support;

use common::journal::*;
use fast_commit_support::*;
use jext4::engine::dev::{BlockDevice, MemoryDevice};
use jext4::engine::format::fast_commit::tag;
use jext4::engine::fs::recover_device;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use std::sync::Arc;

#[test]
fn nonsense_records_never_panic() {
    if !kernel_available() || !common::require_tool("fallocate") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let crash = {
        let _kernel = kernel_lock();
        fast_commit_crash_image(dir.path(), "noise", 1024, 32, |work| {
            mixed_workload(work, 4)
        })
        .0
    };
    let image = std::fs::read(&crash).unwrap();
    let area = FastCommitBlocks::of(&crash);
    let bytes = area.read(&crash);
    let records: Vec<(u16, usize)> = area.records(&bytes);
    // The valid fast commits: (first byte, TAIL) pairs, and the records
    // inside them that carry values.
    let mut commits = Vec::new();
    let mut start = 0;
    for &(record_tag, offset) in &records {
        if record_tag == tag::TAIL {
            commits.push((start, offset));
            start = (offset / area.block_size + 1) * area.block_size;
        }
    }
    let last_tail = commits.last().unwrap().1;
    let targets: Vec<usize> = records
        .iter()
        .filter(|&&(record_tag, offset)| {
            offset < last_tail && ![tag::HEAD, tag::TAIL, tag::PAD].contains(&record_tag)
        })
        .map(|&(_, offset)| offset)
        .collect();
    assert!(targets.len() > 20, "{} records", targets.len());

    let mut runner = TestRunner::new(Config {
        cases: 64,
        failure_persistence: None,
        ..Config::default()
    });
    let strategy = proptest::collection::vec((0..targets.len(), 4usize..64, any::<u8>()), 1..6);
    runner
        .run(&strategy, |changes| {
            let mut noisy = bytes.clone();
            for &(target, at, value) in &changes {
                let record = targets[target];
                let len = u16::from_le_bytes([noisy[record + 2], noisy[record + 3]]) as usize;
                // Anywhere in the value, never the tag or length.
                let offset = record + 4 + at % len.max(1);
                noisy[offset] = value;
            }
            for &(start, tail) in &commits {
                reseal(&mut noisy, start, tail);
            }
            let mut disk = image.clone();
            for (index, &offset) in area.offsets.iter().enumerate() {
                let block = &noisy[index * area.block_size..(index + 1) * area.block_size];
                disk[offset as usize..offset as usize + area.block_size].copy_from_slice(block);
            }
            let memory = Arc::new(MemoryDevice::from_bytes(disk));
            let dev: Arc<dyn BlockDevice> = memory.clone();
            // Either outcome is acceptable; a panic is not.
            let outcome = recover_device(&dev);
            if let Ok(Some(report)) = &outcome {
                prop_assert!(report.problem.is_none());
            }
            Ok(())
        })
        .unwrap();
}
