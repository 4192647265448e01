//! Fast-commit replay is crash-safe: a crash after any write of a
//! recovery that replays fast commits (optionally tearing that write) leaves
//! an image that a second recovery brings to exactly the result of an
//! uninterrupted one, outside the journal itself.

mod common;
mod fast_commit_support;

use common::journal::*;
use fast_commit_support::*;
use jext4::engine::dev::{BlockDevice, MemoryDevice};
use jext4::engine::fs::recover_device;
use jext4::engine::journal::format::JournalSuperblock;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::Ordering;

/// Recover a copy of `bytes` that crashes after `writes` writes, then
/// recover what is left. Returns the final image.
fn crash_then_recover(bytes: &[u8], writes: usize, tear: bool) -> Vec<u8> {
    let crashing = Arc::new(CrashingDevice::new(bytes.to_vec(), writes, tear));
    let dev: Arc<dyn BlockDevice> = crashing.clone();
    assert!(
        recover_device(&dev).is_err(),
        "no crash after {writes} writes"
    );
    let memory = Arc::new(MemoryDevice::from_bytes(crashing.inner.snapshot()));
    let dev: Arc<dyn BlockDevice> = memory.clone();
    let report = recover_device(&dev)
        .unwrap_or_else(|e| panic!("recovery after a crash at write {writes}: {e}"));
    if let Some(report) = report {
        assert!(report.problem.is_none(), "{report:?}");
    }
    memory.snapshot()
}

#[test]
fn fast_commit_replay_survives_a_crash_at_every_write() {
    if !kernel_available()
        || !common::require_tool("fallocate")
        || !common::require_tool("fsfreeze")
    {
        return;
    }
    let _kernel = kernel_lock();
    let dir = tempfile::tempdir().unwrap();
    let (crash, _) = fast_commit_crash_image_after(
        dir.path(),
        "fccrash",
        1024,
        64,
        LogBefore::Unrelated,
        |work| mixed_workload(work, 6),
    );
    let records = debugfs_fast_commits(&crash);
    for (tag, name) in MIXED_WORKLOAD_RECORDS {
        let found = has_record(&records, tag, name);
        assert!(found, "no {tag} {name} in the fast commits:\n{records}");
    }
    let bytes = std::fs::read(&crash).unwrap();
    let block_size = fs_superblock(&crash).block_size() as usize;
    let journal: BTreeSet<u64> = journal_blocks_from_debugfs(&crash).into_iter().collect();

    let counting = Arc::new(CrashingDevice::new(bytes.clone(), usize::MAX, false));
    let dev: Arc<dyn BlockDevice> = counting.clone();
    let report = recover_device(&dev).unwrap().expect("recovery needed");
    let total = counting.writes_done.load(Ordering::SeqCst);
    let reference = counting.inner.snapshot();
    assert!(
        total > report.blocks_replayed as usize + 4,
        "{total} writes"
    );
    let reference_path = crash.with_extension("reference.img");
    std::fs::write(&reference_path, &reference).unwrap();
    common::assert_fsck_clean(&reference_path);
    let journal_superblock = *journal.first().unwrap() as usize;

    let stride = total.div_ceil(150).max(1);
    let mut checked = 0;
    for writes in (0..total).step_by(stride) {
        for tear in [false, true] {
            let result = crash_then_recover(&bytes, writes, tear);
            let differing: Vec<usize> = reference
                .chunks(block_size)
                .zip(result.chunks(block_size))
                .enumerate()
                .filter(|(index, (a, b))| a != b && !journal.contains(&(*index as u64)))
                .map(|(index, _)| index)
                .collect();
            assert!(
                differing.is_empty(),
                "crash at write {writes} of {total} (tear {tear}): blocks {differing:?} differ"
            );
            let at = journal_superblock * block_size;
            let superblock = JournalSuperblock::decode(&result[at..at + block_size]).unwrap();
            assert_eq!(superblock.start, 0, "crash at write {writes}");
            checked += 1;
        }
    }
    assert!(checked >= 2 * total / stride);
    replay_transaction_is_ordinary(&crash, &bytes, total, &report, &reference_path);
    // A crash in the middle, recovered: e2fsck agrees, and so does the
    // kernel's view of the tree.
    let middle = crash_then_recover(&bytes, total / 2, true);
    let middle_path = crash.with_extension("middle.img");
    std::fs::write(&middle_path, middle).unwrap();
    common::assert_fsck_clean(&middle_path);
    assert_eq!(
        mounted_tree(&middle_path, "ro,noload").unwrap(),
        mounted_tree(&reference_path, "ro,noload").unwrap()
    );
}

/// The first crash point at which the replay's own transaction is committed
/// in the log and the fast commits retired (nothing written home yet): the
/// kernel and e2fsck replay it like any transaction and reach the tree of
/// the uninterrupted jext4 recovery.
fn replay_transaction_is_ordinary(
    crash: &std::path::Path,
    bytes: &[u8],
    total: usize,
    report: &jext4::engine::journal::recovery::RecoveryReport,
    reference: &std::path::Path,
) {
    let tid = report
        .fast_commit
        .expect("a fast_commit journal")
        .expected_tid;
    let block_size = fs_superblock(crash).block_size();
    let blocks = journal_blocks_from_debugfs(crash);
    let committed = (0..total).find_map(|writes| {
        let crashing = Arc::new(CrashingDevice::new(bytes.to_vec(), writes, false));
        let dev: Arc<dyn BlockDevice> = crashing.clone();
        assert!(recover_device(&dev).is_err());
        let image = crashing.inner.snapshot();
        let (_, area) = memory_area(image.clone(), block_size, blocks.clone());
        let mut dump = Vec::new();
        jext4::engine::journal::logdump::logdump(&area, &mut dump).unwrap();
        let dump = String::from_utf8(dump).unwrap();
        let logged = dump.contains(&format!("commit, transaction {tid},"));
        (logged && dump.contains("no records")).then_some(image)
    });
    let image = committed.expect("the replay is logged as a transaction");
    let path = crash.with_extension("logged.img");
    std::fs::write(&path, &image).unwrap();
    assert!(dumpe2fs_needs_recovery(&path));
    let expected = mounted_tree(reference, "ro,noload").unwrap();

    let kernel = crash.with_extension("logged-kernel.img");
    std::fs::copy(&path, &kernel).unwrap();
    assert_eq!(mounted_tree(&kernel, "rw").unwrap(), expected);
    common::assert_fsck_clean(&kernel);

    let e2fsck = crash.with_extension("logged-e2fsck.img");
    std::fs::copy(&path, &e2fsck).unwrap();
    let (code, text) = run(
        "e2fsck",
        &["-E", "journal_only", "-p", e2fsck.to_str().unwrap()],
    );
    assert_eq!(code, 0, "{text}");
    common::assert_fsck_clean(&e2fsck);
    assert_eq!(mounted_tree(&e2fsck, "ro,noload").unwrap(), expected);
}
