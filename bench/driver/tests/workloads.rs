//! Runs every driver workload briefly in a temporary directory and checks
//! that its JSON line is there and that the figures and files are consistent
//! with what the workload claims to do.

use std::path::Path;
use std::process::Command;

use serde_json::Value;

fn driver(args: &[&str], dir: &Path) -> Value {
    let output = Command::new(env!("CARGO_BIN_EXE_jext4-bench-driver"))
        .args(args)
        .arg("--dir")
        .arg(dir)
        .output()
        .expect("driver runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "driver {args:?} failed: {stderr}");
    let stdout = String::from_utf8(output.stdout).expect("utf-8 output");
    let line = stdout.lines().last().expect("one JSON line");
    serde_json::from_str(line).expect("valid JSON")
}

fn number(value: &Value, key: &str) -> f64 {
    value[key]
        .as_f64()
        .unwrap_or_else(|| panic!("{key} missing in {value}"))
}

#[test]
fn metafsync_leaves_no_files_behind() {
    let dir = tempfile::tempdir().unwrap();
    let result = driver(
        &["metafsync", "--threads", "2", "--seconds", "0.2"],
        dir.path(),
    );
    assert!(number(&result, "operations") > 0.0);
    assert!(number(&result, "ops_per_sec") > 0.0);
    for thread in ["t0", "t1"] {
        let own = dir.path().join(thread);
        assert_eq!(
            std::fs::read_dir(own).unwrap().count(),
            0,
            "every file unlinked"
        );
    }
}

#[test]
fn varmail_keeps_its_fileset_in_one_directory() {
    let dir = tempfile::tempdir().unwrap();
    let args = [
        "varmail",
        "--threads",
        "2",
        "--seconds",
        "0.2",
        "--files",
        "50",
    ];
    let result = driver(&args, dir.path());
    assert!(number(&result, "operations") > 0.0);
    let files = std::fs::read_dir(dir.path().join("varmail"))
        .unwrap()
        .count();
    assert!(files > 0 && files <= 50, "{files} files");
}

#[test]
fn exim_retires_every_spool_file() {
    let dir = tempfile::tempdir().unwrap();
    let result = driver(&["exim", "--threads", "2", "--seconds", "0.2"], dir.path());
    let messages = number(&result, "operations");
    assert!(messages > 0.0);
    assert_eq!(
        std::fs::read_dir(dir.path().join("input")).unwrap().count(),
        0
    );
    assert_eq!(
        std::fs::read_dir(dir.path().join("msglog"))
            .unwrap()
            .count(),
        0
    );
    let delivered: u64 = std::fs::read_dir(dir.path().join("mail"))
        .unwrap()
        .map(|entry| entry.unwrap().metadata().unwrap().len())
        .sum();
    assert_eq!(
        delivered,
        messages as u64 * 4096,
        "every message in a mailbox"
    );
}

#[test]
fn lsm_keeps_two_tables_per_thread_and_logs_each() {
    let dir = tempfile::tempdir().unwrap();
    let args = [
        "lsm",
        "--threads",
        "2",
        "--seconds",
        "0.2",
        "--table-kib",
        "64",
    ];
    let result = driver(&args, dir.path());
    let outputs = number(&result, "operations") as usize;
    let db = dir.path().join("db");
    let tables = std::fs::read_dir(&db).unwrap().count() - 1; // minus MANIFEST
    assert!(tables <= 4 && tables <= outputs, "{tables} live tables");
    let manifest = std::fs::read_to_string(db.join("MANIFEST-000001")).unwrap();
    assert_eq!(manifest.lines().count(), outputs);
}

#[test]
fn message_journal_reader_sees_every_append() {
    let dir = tempfile::tempdir().unwrap();
    for layout in ["fresh", "fallocate", "zerofill"] {
        let args = [
            "msgjournal",
            "--layout",
            layout,
            "--reader",
            "--count",
            "200",
            "--record-bytes",
            "1024",
        ];
        let result = driver(&args, dir.path());
        if result.get("unsupported").is_some() {
            continue; // a filesystem without fallocate(2)
        }
        let appends = number(&result, "appends");
        assert_eq!(appends, 200.0);
        assert_eq!(number(&result, "reader_bytes"), appends * 1024.0);
        let p50 = number(&result, "p50_us");
        let p99 = number(&result, "p99_us");
        let max = number(&result, "max_us");
        assert!(0.0 < p50 && p50 <= p99 && p99 <= max, "{p50} {p99} {max}");
        assert_eq!(result["cdf"].as_array().unwrap().len(), 107);
    }
}

#[test]
fn small_writers_each_write_their_whole_file() {
    let dir = tempfile::tempdir().unwrap();
    let result = driver(
        &["smallwriters", "--procs", "20", "--writes", "40"],
        dir.path(),
    );
    assert!(number(&result, "seconds") >= number(&result, "write_seconds"));
    let files: Vec<_> = std::fs::read_dir(dir.path().join("writers"))
        .unwrap()
        .map(|entry| entry.unwrap().metadata().unwrap().len())
        .collect();
    assert_eq!(files.len(), 20);
    assert!(files.iter().all(|&len| len == 40 * 1024));
}

#[test]
fn blurt_rewrites_every_file_of_every_step() {
    let dir = tempfile::tempdir().unwrap();
    let args = [
        "blurt",
        "--passes",
        "2",
        "--directories",
        "3",
        "--tasks",
        "10",
        "--writes",
        "5",
    ];
    let result = driver(&args, dir.path());
    assert_eq!(number(&result, "steps_done"), 6.0);
    assert!(result["full_at_step"].is_null());
    for index in 1..=3 {
        let sizes: Vec<_> = std::fs::read_dir(dir.path().join(index.to_string()))
            .unwrap()
            .map(|entry| entry.unwrap().metadata().unwrap().len())
            .collect();
        assert_eq!(sizes.len(), 10);
        assert!(sizes.iter().all(|&len| len == 5 * 1024), "{sizes:?}");
    }
}

#[test]
fn blurt_stops_at_the_first_step_that_hits_a_full_disk() {
    // A 1 MiB tmpfs fills in the second step of 10 × 64 KiB files.
    let dir = tempfile::tempdir().unwrap();
    let mounted = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=1m", "blurt-test"])
        .arg(dir.path())
        .status();
    // Root is part of the test environment (CI runs as root), like loop devices.
    assert!(
        matches!(mounted, Ok(status) if status.success()),
        "mount -t tmpfs failed: {mounted:?} (the test needs root)"
    );
    let args = [
        "blurt",
        "--passes",
        "1",
        "--directories",
        "9",
        "--tasks",
        "10",
        "--writes",
        "64",
    ];
    let result = driver(&args, dir.path());
    let _ = std::process::Command::new("umount")
        .arg(dir.path())
        .status();
    assert_eq!(number(&result, "steps_done"), 1.0);
    assert_eq!(result["full_at_step"], "1:2");
    assert!(number(&result, "enospc_tasks") >= 1.0);
}
