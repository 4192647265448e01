//! Journals with the fast_commit feature: the block replay leaves the
//! fast-commit area alone, reports where it is and which tid its records
//! must carry, and hands it to the caller's fast-commit replay before the
//! journal is reset.

mod common;

use common::journal::*;
use jext4::engine::fs::recover_journal_with;
use jext4::engine::journal::recovery::FastCommitArea;
use std::io::Write;
use std::time::Duration;

#[test]
fn kernel_fast_commits_are_found_and_handed_over() {
    if !kernel_available() {
        return;
    }
    let _kernel = kernel_lock();
    let dir = tempfile::tempdir().unwrap();
    let image = common::mkfs(
        dir.path(),
        "fc",
        64,
        &["-t", "ext4", "-b", "1024", "-O", "fast_commit"],
    );
    let crash = kernel_crash_image(&image, "commit=60", Duration::ZERO, |root| {
        metadata_workload(root, 0, 30);
        assert_eq!(run("sync", &[]).0, 0);
        // fsync of new files in an existing directory: fast commits.
        for index in 0..12 {
            let mut file =
                std::fs::File::create(root.join(format!("round0/fsynced-{index}"))).unwrap();
            file.write_all(&vec![index as u8; 3000]).unwrap();
            file.sync_all().unwrap();
        }
    });
    let mut dump = Vec::new();
    jext4::engine::journal::logdump::logdump(&file_area(&crash), &mut dump).unwrap();
    let dump = String::from_utf8(dump).unwrap();

    let ours = crash.with_extension("jext4.img");
    std::fs::copy(&crash, &ours).unwrap();
    let mut handed: Vec<FastCommitArea> = Vec::new();
    let report = recover_journal_with(&file_area(&ours), |area, fast_commit| {
        // Called before the journal reset: the journal still needs recovery.
        assert!(jext4::engine::fs::needs_recovery(&*area.dev).unwrap());
        handed.push(*fast_commit);
        Ok(())
    })
    .unwrap();
    let fast_commit = report
        .fast_commit
        .expect("a fast_commit journal reports its area");
    assert!(fast_commit.has_records, "{report:?}\n{dump}");
    assert_eq!(fast_commit.expected_tid, report.end_tid);
    assert_eq!(handed, vec![fast_commit]);
    assert!(
        dump.contains(&format!("head for transaction {}", report.end_tid)),
        "{dump}"
    );
    // The image as of the last full commit is consistent on its own.
    let (code, text) = run("e2fsck", &["-fn", ours.to_str().unwrap()]);
    assert_eq!(code, 0, "{text}");
}

/// With fast_commit, the log wraps before the fast-commit area (the
/// kernel's j_last). e2fsck 1.47.0 wraps at s_maxlen instead, reads the
/// fast-commit area as log and loses every transaction past the wrap; jext4
/// follows the kernel: the tree after jext4's replay is the tree after the
/// kernel's own replay.
#[test]
fn fast_commit_log_that_wraps_replays_like_the_kernel() {
    if !kernel_available() {
        return;
    }
    let _kernel = kernel_lock();
    let dir = tempfile::tempdir().unwrap();
    let mut done = false;
    for attempt in 0..3 {
        let image = common::mkfs(
            dir.path(),
            &format!("fcwrap-{attempt}"),
            64,
            &[
                "-t",
                "ext4",
                "-b",
                "1024",
                "-J",
                "size=1",
                "-O",
                "fast_commit",
            ],
        );
        let blocks = journal_blocks_from_debugfs(&image);
        let crash = kernel_crash_image(&image, "commit=1", Duration::ZERO, |root| {
            for round in 0..80 {
                metadata_workload(root, round, 40);
                commit_now(root);
                if round >= 3 && log_wraps(&image, &blocks) {
                    break;
                }
            }
        });
        let ours = crash.with_extension("jext4.img");
        std::fs::copy(&crash, &ours).unwrap();
        let report = jext4::engine::fs::recover_journal(&file_area(&ours)).unwrap();
        if !report.log_wrapped {
            continue;
        }
        assert_eq!(report.problem, None, "{report:?}");
        let (code, text) = run("e2fsck", &["-fn", ours.to_str().unwrap()]);
        assert_eq!(code, 0, "{text}");
        let kernel = crash.with_extension("kernel.img");
        std::fs::copy(&crash, &kernel).unwrap();
        let kernel_replayed = kernel_tree(&kernel, "rw");
        let ours_replayed = kernel_tree(&ours, "ro,noload");
        assert_eq!(ours_replayed, kernel_replayed, "{report:?}");
        let theirs = crash.with_extension("e2fsck.img");
        std::fs::copy(&crash, &theirs).unwrap();
        run(
            "e2fsck",
            &["-E", "journal_only", "-p", theirs.to_str().unwrap()],
        );
        let e2fsck_replayed = kernel_tree(&theirs, "ro,noload");
        eprintln!(
            "e2fsck 1.47.0's replay {} the kernel's ({} vs {} entries)",
            if e2fsck_replayed == kernel_replayed {
                "matches"
            } else {
                "differs from"
            },
            e2fsck_replayed.len(),
            kernel_replayed.len()
        );
        done = true;
        break;
    }
    assert!(done, "the log never wrapped");
}
