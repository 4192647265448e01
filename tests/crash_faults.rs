//! The crash-state oracle can fail: each fault switch breaks one rule of
//! the journal (or of the fast-commit writer, on fast_commit images) on
//! purpose, and a crash-state run must catch it.
//!
//! The switches are process-wide, so these tests run one at a time and
//! nothing else runs in this test binary.

#![cfg(feature = "crashtest")]

mod common;

use jext4::engine::crash::workloads::{Workload, find};
use jext4::engine::crash::{Config, Sampling, run};
use jext4::engine::faults::Fault;
use std::sync::Mutex;

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// How the workloads commit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    FullCommits,
    FastCommits,
    /// Fast commits through ByteLog (`-o bytelog`).
    ByteLog,
    /// Full commits, with delayed allocation (`-o delalloc`).
    Delalloc,
    /// Full commits on meta_bg images with several meta groups.
    MetaBg,
    /// Full commits, the journal on a device of its own.
    ExternalJournal,
    /// Full commits on inline_data images.
    InlineData,
    /// Full commits on images with user, group and project quotas.
    Quota,
    /// Full commits on casefold images whose every directory is +F.
    Casefold,
    /// Full commits with file data journaled (`-o data=journal`).
    DataJournal,
    /// Full commits on bigalloc images.
    Bigalloc,
}

/// Run `workloads` with `fault` on in `mode`; return the first failure's
/// report.
fn first_failure(
    fault: Fault,
    workloads: &[&str],
    block_size: u32,
    states: usize,
    mode: Mode,
) -> Option<String> {
    let _one = ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let chosen: Vec<&'static Workload> = workloads.iter().map(|name| find(name).unwrap()).collect();
    let mut config = Config::new(chosen, block_size, states, 11);
    config.faults = vec![fault];
    config.stop_at_first_failure = true;
    config.fast_commit = mode == Mode::FastCommits;
    config.bytelog = mode == Mode::ByteLog;
    config.delalloc = mode == Mode::Delalloc;
    config.meta_bg = mode == Mode::MetaBg;
    config.external_journal = mode == Mode::ExternalJournal;
    config.inline_data = mode == Mode::InlineData;
    config.quota = mode == Mode::Quota;
    config.casefold = mode == Mode::Casefold;
    config.data_journal = mode == Mode::DataJournal;
    config.bigalloc = mode == Mode::Bigalloc;
    config.sampling = Sampling {
        fsck_every: 1,
        replay_every: 0,
        kernel_every: 0,
    };
    let summary = run(&config, &mut |_| {}).unwrap();
    assert!(
        !jext4::engine::faults::any_active(),
        "a fault outlived its run"
    );
    summary.failures.first().map(|failure| failure.to_string())
}

fn assert_caught(fault: Fault, workloads: &[&str], states: usize) {
    assert_caught_on(fault, workloads, states, Mode::FullCommits);
}

fn assert_caught_on(fault: Fault, workloads: &[&str], states: usize, mode: Mode) {
    if !common::require_tool("mke2fs") || !common::require_tool("e2fsck") {
        return;
    }
    for block_size in [1024, 4096] {
        match first_failure(fault, workloads, block_size, states, mode) {
            Some(report) => eprintln!("{fault:?} at {block_size}-byte blocks caught:\n{report}\n"),
            None => panic!("{fault:?} at {block_size}-byte blocks was not caught by {workloads:?}"),
        }
    }
}

#[test]
fn a_commit_block_written_without_the_flush_before_it_is_caught() {
    assert_caught(Fault::SkipPreCommitFlush, &["mailspool", "random"], 400);
}

/// A block written home early is harmless while an older committed copy of
/// it is still in the log (replay puts that back): the workloads that catch
/// it write blocks never logged before (untar's new directories and inode
/// table blocks) or run long enough for checkpoints to empty the log
/// (smallwriters).
#[test]
fn metadata_written_home_before_its_commit_is_caught() {
    assert_caught(
        Fault::WriteHomeBeforeCommit,
        &["untar", "smallwriters"],
        400,
    );
}

#[test]
fn a_dropped_revoke_record_is_caught() {
    assert_caught(Fault::DropRevoke, &["random", "lsm"], 600);
}

#[test]
fn a_tail_moved_before_the_checkpoint_is_durable_is_caught() {
    assert_caught(Fault::EarlyTailAdvance, &["untar", "lsm"], 600);
}

#[test]
fn file_data_written_after_its_commit_is_caught() {
    assert_caught(Fault::DeferOrderedData, &["msgjournal", "mailspool"], 400);
}

/// The import workload judges entries with its own oracle (per entry, not
/// per operation): file data behind its commit shows bytes the source
/// never had. (Metadata written home early is not among what it catches:
/// at 1 KiB blocks not one of 600 states shows it, as for most workloads —
/// the blocks it writes home early still have an older committed copy in
/// the log, which replay puts back; `untar` and `smallwriters` catch it.)
#[test]
fn the_import_oracle_catches_broken_ordering() {
    assert_caught(Fault::DeferOrderedData, &["import"], 150);
}

/// Fast commits: a TAIL made durable before the records and the data it
/// covers loses an acknowledged fsync or shows stale data.
#[test]
fn a_fast_commit_tail_durable_before_its_records_is_caught() {
    assert_caught_on(
        Fault::FastCommitTailFirst,
        &["msgjournal", "mailspool"],
        300,
        Mode::FastCommits,
    );
}

/// Fast commits: records without the mapping changes leave appended data
/// unmapped under the new size.
#[test]
fn a_fast_commit_without_its_range_records_is_caught() {
    assert_caught_on(
        Fault::FastCommitDropRange,
        &["msgjournal", "mailspool"],
        300,
        Mode::FastCommits,
    );
}

/// Fast commits: a CRC over the wrong span is refused by replay, and the
/// fsyncs it sealed are lost.
#[test]
fn a_fast_commit_crc_over_the_wrong_span_is_caught() {
    assert_caught_on(
        Fault::FastCommitCrcSpan,
        &["mailspool", "lsm"],
        300,
        Mode::FastCommits,
    );
}

/// Per-directory commits: a directory's commit that leaves its inodes'
/// data out of its barrier lets the TAIL be durable before the data the
/// records map (stale or zero bytes under an acknowledged size).
#[test]
fn a_directory_commit_without_its_data_is_caught() {
    assert_caught_on(
        Fault::DirCommitSkipsData,
        &["msgjournal", "mailspool"],
        300,
        Mode::FastCommits,
    );
}

/// Per-directory commits: a rename across directories split between the
/// two directories' transactions is committed half by an fsync of one
/// (both names, or neither, survive).
#[test]
fn a_rename_across_directories_committed_by_halves_is_caught() {
    assert_caught_on(
        Fault::DirCommitSplitsCoalesced,
        &["acedirs", "spool8"],
        400,
        Mode::FastCommits,
    );
}

/// Group commit: an fsync acknowledged while the write holding its
/// directory's commit is still under way loses it to a crash before the
/// write's barrier. Needs concurrent fsyncs: eight threads.
#[test]
fn an_fsync_acknowledged_before_its_fast_commit_is_durable_is_caught() {
    assert_caught_on(
        Fault::FastCommitAckEarly,
        &["varmail8", "spool8"],
        400,
        Mode::FastCommits,
    );
}

/// FSYNCDIR: a directory fsync's fast commit that leaves out one of its
/// name changes loses a name the fsync acknowledged (or brings back one
/// it removed).
#[test]
fn a_directory_fsync_that_leaves_out_a_name_is_caught() {
    assert_caught_on(
        Fault::DirSyncDropsDentry,
        &["dirsync", "acedirs"],
        300,
        Mode::FastCommits,
    );
}

/// ByteLog: records whose cache lines are not written back and fenced
/// before the ANCHOR that names them may be lost after the fsync returned
/// (the crash states keep any subset of unfenced lines).
#[test]
fn bytelog_records_left_unfenced_are_caught() {
    assert_caught_on(
        Fault::ByteLogPayloadUnfenced,
        &["msgjournal", "mailspool"],
        200,
        Mode::ByteLog,
    );
}

/// ByteLog: a payload CRC over the wrong span makes replay refuse every
/// window, and the fsyncs they sealed are lost.
#[test]
fn a_bytelog_crc_over_the_wrong_span_is_caught() {
    assert_caught_on(
        Fault::ByteLogCrcSpan,
        &["msgjournal", "mailspool"],
        200,
        Mode::ByteLog,
    );
}

#[test]
fn an_fsync_that_leaves_held_data_in_memory_is_caught() {
    assert_caught_on(
        Fault::DelallocFsyncSkipsWriteOut,
        &["msgjournal", "mailspool"],
        400,
        Mode::Delalloc,
    );
}

/// meta_bg: a descriptor written where the table would be without meta_bg
/// overwrites another block and leaves its own meta group's counts stale.
#[test]
fn a_descriptor_written_outside_its_meta_group_is_caught() {
    assert_caught_on(
        Fault::MetaBgFlatDescriptor,
        &["untar", "mailspool"],
        200,
        Mode::MetaBg,
    );
}

/// inline_data: a directory that outgrows its inode moved to a block
/// without the names its `system.data` value held loses them.
#[test]
fn an_inline_directory_converted_without_its_value_is_caught() {
    assert_caught_on(
        Fault::InlineDirConvertDropsValue,
        &["untar", "dirsync"],
        100,
        Mode::InlineData,
    );
}

/// quota: usage written a transaction after the change it counts leaves,
/// after a crash between the two, counts e2fsck finds wrong.
#[test]
fn quota_usage_written_apart_from_its_change_is_caught() {
    assert_caught_on(
        Fault::QuotaChargedLate,
        &["untar", "mailspool"],
        100,
        Mode::Quota,
    );
}

/// quota with ea_inode: values kept in EA inodes not counted for their
/// owners leave inode counts e2fsck finds wrong.
#[test]
fn ea_inode_values_uncounted_in_quota_are_caught() {
    assert_caught_on(Fault::EaInodeQuotaUncharged, &["xattrs"], 100, Mode::Quota);
}

/// casefold: a casefolded directory's htree hashing raw names instead of
/// folded ones puts "Task0001" where "task0001" belongs (e2fsck: the
/// leaves' hashes are out of their index's ranges).
#[test]
fn casefolded_names_hashed_raw_are_caught() {
    assert_caught_on(
        Fault::CasefoldHashRaw,
        &["smallwriters"],
        60,
        Mode::Casefold,
    );
}

/// data=journal: a logged block also written home at once shows, after a
/// crash before its commit, an overwrite's new bytes beside the old ones
/// Harmless only while an older copy of the block is still in the log,
/// which replay puts back: the overwrite workload runs long enough for
/// checkpoints to empty the log.
#[test]
fn journaled_data_written_home_before_its_commit_is_caught() {
    assert_caught_on(
        Fault::DataJournalWrittenHome,
        &["overwrite"],
        200,
        Mode::DataJournal,
    );
}

/// bigalloc: the end clusters of an unmapped range freed while blocks of
/// the file still lie there leave e2fsck a bitmap that has in-use
/// clusters free (and i_blocks counting too few).
#[test]
fn a_bigalloc_cluster_freed_while_shared_is_caught() {
    assert_caught_on(
        Fault::BigallocClusterFreedShared,
        &["overwrite"],
        60,
        Mode::Bigalloc,
    );
}

/// bigalloc: a block mapped into a cluster the file has, counted in
/// i_blocks as a new cluster, leaves counts e2fsck finds wrong.
#[test]
fn a_bigalloc_cluster_counted_twice_is_caught() {
    assert_caught_on(
        Fault::BigallocImpliedCounted,
        &["overwrite"],
        60,
        Mode::Bigalloc,
    );
}

/// ea_inode: a replaced, removed or deleted value whose EA inode keeps
/// its reference leaves an EA inode nothing names in use (e2fsck: its
/// reference count is wrong).
#[test]
fn an_ea_inode_reference_kept_is_caught() {
    assert_caught_on(Fault::EaInodeRefKept, &["xattrs"], 200, Mode::FullCommits);
}

/// ea_inode: a value set equal to one an EA inode holds shares it without
/// taking a reference, so the EA inode is freed (or its count wrong) while
/// another place names it.
#[test]
fn an_ea_inode_shared_without_a_reference_is_caught() {
    assert_caught_on(
        Fault::EaInodeShareUncounted,
        &["xattrs"],
        200,
        Mode::FullCommits,
    );
}

/// fs-verity: the flag set before the Merkle tree is written leaves, after
/// a crash, a verity file whose reads fail.
#[test]
fn a_verity_flag_set_before_its_tree_is_caught() {
    assert_caught_on(
        Fault::VerityFlagBeforeTree,
        &["verity"],
        200,
        Mode::FullCommits,
    );
}

/// An external journal: a barrier that flushes the filesystem's device
/// and not the journal's lets a commit be acknowledged, and checkpointed
/// home, with its log still volatile.
#[test]
fn a_journal_device_left_unflushed_is_caught() {
    assert_caught_on(
        Fault::ExternalJournalUnflushed,
        &["mailspool", "varmail"],
        200,
        Mode::ExternalJournal,
    );
}

/// Without a fault the same runs pass: what the tests above catch is the
/// fault, not the harness.
#[test]
fn the_same_runs_pass_without_faults() {
    if !common::require_tool("mke2fs") || !common::require_tool("e2fsck") {
        return;
    }
    let _one = ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let names = [
        "mailspool",
        "random",
        "lsm",
        "untar",
        "msgjournal",
        "import",
    ];
    for mode in [
        Mode::FullCommits,
        Mode::FastCommits,
        Mode::ByteLog,
        Mode::Delalloc,
        Mode::MetaBg,
        Mode::ExternalJournal,
    ] {
        let chosen: Vec<&'static Workload> = names.iter().map(|name| find(name).unwrap()).collect();
        // Fewer on fast_commit images: crash_workloads.rs covers them too.
        let states = if mode == Mode::FullCommits { 500 } else { 300 };
        let mut config = Config::new(chosen, 1024, states, 11);
        config.sampling.kernel_every = 0;
        config.fast_commit = mode == Mode::FastCommits;
        config.bytelog = mode == Mode::ByteLog;
        config.delalloc = mode == Mode::Delalloc;
        config.meta_bg = mode == Mode::MetaBg;
        config.external_journal = mode == Mode::ExternalJournal;
        let summary = run(&config, &mut |_| {}).unwrap();
        let failures: Vec<String> = summary.failures.iter().map(|f| f.to_string()).collect();
        assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    }
}
