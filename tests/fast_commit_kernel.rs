//! Fast commits the kernel wrote, replayed by jext4: the tree after
//! `jext4 recover` (and after a jext4 mount) is the tree after the kernel's
//! own replay, every file fsync'd before the crash is there with its
//! content, and e2fsck finds the image clean. e2fsck 1.47.0's replay of the
//! same image is reported for comparison (it is known to lose files).

mod common;
mod fast_commit_support;

use common::journal::*;
use fast_commit_support::*;
use jext4::engine::fs::{Fs, MountOptions};
use std::path::Path;

fn copy(crash: &Path, suffix: &str) -> std::path::PathBuf {
    let path = crash.with_extension(format!("{suffix}.img"));
    std::fs::copy(crash, &path).unwrap();
    path
}

fn fsck_clean(image: &Path) -> Result<(), String> {
    let (code, text) = common::fsck(image);
    if code == 0 { Ok(()) } else { Err(text) }
}

/// Build the crash image, replay it four ways and compare.
fn replays_like_the_kernel(block_size: u32, size_mib: u64, many: usize) {
    if !kernel_available() || !common::require_tool("fallocate") {
        return;
    }
    let _kernel = kernel_lock();
    let dir = tempfile::tempdir().unwrap();
    let name = format!("fc{block_size}");
    let (crash, durable) =
        fast_commit_crash_image(dir.path(), &name, block_size, size_mib, |work| {
            mixed_workload(work, many)
        });
    // The kernel did write fast commits, for the transaction after the log.
    let records = debugfs_fast_commits(&crash);
    let tails = records
        .lines()
        .filter(|line| line.starts_with("tag TAIL"))
        .count();
    for (tag, name) in MIXED_WORKLOAD_RECORDS {
        let found = has_record(&records, tag, name);
        // A sync(2) anywhere on the machine commits every ext4 mount in
        // full, this one too: the records before it are then in a full
        // commit. CI runs this binary alone; beside other work, say why.
        assert!(
            found,
            "no {tag} {name} in the fast commits (if another process ran sync(2) \
             during the workload, the kernel committed in full: run this test alone):\n{records}"
        );
    }
    let mut dump = Vec::new();
    jext4::engine::journal::logdump::logdump(&file_area(&crash), &mut dump).unwrap();
    let dump = String::from_utf8(dump).unwrap();
    assert!(dump.contains("head for transaction"), "{dump}");

    // A: the kernel's replay.
    let kernel = copy(&crash, "kernel");
    let kernel_tree = mounted_tree(&kernel, "rw").expect("the kernel mounts its own crash");
    let kernel_fsck = fsck_clean(&kernel);
    eprintln!(
        "{block_size}: {tails} fast commits; kernel replay e2fsck-clean: {}",
        kernel_fsck
            .as_ref()
            .map_or_else(|text| format!("no\n{text}"), |()| "yes".into())
    );
    let missing = durable.missing_from(&kernel_tree);
    assert!(missing.is_empty(), "the kernel lost {missing:?}");

    // B: jext4 recover.
    let ours = copy(&crash, "jext4");
    let report = jext4::engine::fs::recover_image(&ours)
        .unwrap()
        .expect("recovery was needed");
    assert!(report.journal.problem.is_none(), "{report:?}");
    fsck_clean(&ours).unwrap_or_else(|text| panic!("e2fsck after jext4 recover:\n{text}"));
    let our_tree = mounted_tree(&ours, "ro,noload").unwrap();
    assert_eq!(
        our_tree,
        kernel_tree,
        "jext4's replay differs from the kernel's:\n{}",
        tree_difference(&kernel_tree, &our_tree)
    );
    assert!(durable.missing_from(&our_tree).is_empty());
    // Recovering again changes nothing.
    assert!(jext4::engine::fs::recover_image(&ours).unwrap().is_none());

    // C: e2fsck's replay, for the record.
    let theirs = copy(&crash, "e2fsck");
    let (code, text) = run(
        "e2fsck",
        &["-E", "journal_only", "-p", theirs.to_str().unwrap()],
    );
    let their_tree = mounted_tree(&theirs, "ro,noload").unwrap_or_default();
    let lost = durable.missing_from(&their_tree);
    eprintln!(
        "{block_size}: e2fsck -E journal_only exit {code} ({}); tree {} the kernel's; e2fsck -fn \
         afterwards {}; fsync'd files lost: {} {:?}",
        text.lines().last().unwrap_or(""),
        if their_tree == kernel_tree {
            "matches"
        } else {
            "differs from"
        },
        if fsck_clean(&theirs).is_ok() {
            "clean"
        } else {
            "NOT clean"
        },
        lost.len(),
        lost.iter()
            .take(6)
            .map(|name| &name[..name.len().min(24)])
            .collect::<Vec<_>>()
    );

    // D: a jext4 mount recovers the same way.
    let mounted = copy(&crash, "mount");
    let fs = Fs::open(&mounted, MountOptions::default()).unwrap();
    fs.unmount().unwrap();
    drop(fs);
    fsck_clean(&mounted).unwrap_or_else(|text| panic!("e2fsck after a jext4 mount:\n{text}"));
    let mounted_tree = mounted_tree(&mounted, "ro").unwrap();
    assert_eq!(
        mounted_tree,
        our_tree,
        "{}",
        tree_difference(&our_tree, &mounted_tree)
    );
}

#[test]
fn kernel_fast_commits_replay_like_the_kernel_1k() {
    replays_like_the_kernel(1024, 64, 25);
}

#[test]
fn kernel_fast_commits_replay_like_the_kernel_4k() {
    replays_like_the_kernel(4096, 128, 25);
}
