//! `FileDevice`'s ranged barrier (`write_durable`), seen from the system
//! calls it makes: every range is written back and waited for
//! (`sync_file_range`), then the block is written with `RWF_DSYNC` — and no
//! `fsync`/`fdatasync`, which would write every other dirty page of the
//! image. The crash tests model a barrier over a memory device; this holds
//! the image file's implementation to the same promise.
//!
//! The test runs itself again under `strace`, with `BARRIER_CHILD` naming
//! the image: the child makes the calls, the parent reads the trace.

mod common;

use jext4::dev::{BlockDevice, FileDevice};
use std::path::Path;
use std::process::Command;

const CHILD: &str = "JEXT4_BARRIER_CHILD";
const BLOCK: u64 = 4096;
const DURABLE_AT: u64 = 200 * BLOCK;

/// In the child: two ranges written, then one barrier over both, or over
/// the first only when `JEXT4_BARRIER_ONE` is set.
fn child(image: &Path) {
    let device = FileDevice::open(image, false).unwrap();
    let ranges: Vec<(u64, u64)> = [(0, BLOCK), (64 * BLOCK, 2 * BLOCK)]
        .into_iter()
        .take(if std::env::var_os("JEXT4_BARRIER_ONE").is_some() {
            1
        } else {
            2
        })
        .collect();
    for &(offset, len) in &ranges {
        device.write_at(offset, &vec![0x5a; len as usize]).unwrap();
    }
    device
        .write_durable(DURABLE_AT, &[0xa5; BLOCK as usize], &ranges)
        .unwrap();
}

/// The trace of the child's barrier: the lines of the calls of interest.
fn traced(name: &str, one_range: bool) -> Vec<String> {
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("img");
    std::fs::write(&image, vec![0u8; (DURABLE_AT + BLOCK) as usize]).unwrap();
    let trace = dir.path().join("trace");
    let mut command = Command::new("strace");
    command
        .args([
            "-f",
            "-e",
            "trace=sync_file_range,pwritev2,fsync,fdatasync,sync,syncfs",
        ])
        .arg("-o")
        .arg(&trace)
        .arg(std::env::current_exe().unwrap())
        .args(["--exact", name, "--test-threads=1", "--nocapture"])
        .env(CHILD, &image);
    if one_range {
        command.env("JEXT4_BARRIER_ONE", "1");
    }
    let output = command.output().unwrap();
    assert!(
        output.status.success(),
        "the traced child failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    std::fs::read_to_string(&trace)
        .unwrap()
        .lines()
        .filter(|line| {
            [
                "sync_file_range(",
                "pwritev2(",
                "fsync(",
                "fdatasync(",
                "sync(",
                "syncfs(",
            ]
            .iter()
            .any(|call| line.contains(call))
        })
        .map(|line| {
            line.split_once(' ')
                .map_or(line, |(_, rest)| rest)
                .to_string()
        })
        .collect()
}

fn assert_calls(calls: &[String], expected: &[(&str, &str)]) {
    assert_eq!(calls.len(), expected.len(), "calls:\n{}", calls.join("\n"));
    for (call, (name, args)) in calls.iter().zip(expected) {
        assert!(
            call.starts_with(name) && call.contains(args),
            "expected {name} with {args}, got {call}\nall calls:\n{}",
            calls.join("\n")
        );
    }
}

const WAIT: &str = "SYNC_FILE_RANGE_WAIT_BEFORE|SYNC_FILE_RANGE_WRITE|SYNC_FILE_RANGE_WAIT_AFTER";

#[test]
fn a_barrier_over_two_ranges_starts_both_then_waits_for_each_then_writes_dsync() {
    if let Some(image) = std::env::var_os(CHILD) {
        return child(Path::new(&image));
    }
    if !common::require_tool("strace") {
        return;
    }
    let calls = traced(
        "a_barrier_over_two_ranges_starts_both_then_waits_for_each_then_writes_dsync",
        false,
    );
    let second = format!("{}, {}", 64 * BLOCK, 2 * BLOCK);
    let durable = format!("{DURABLE_AT}, RWF_DSYNC");
    assert_calls(
        &calls,
        &[
            ("sync_file_range(", ", 0, 4096, SYNC_FILE_RANGE_WRITE)"),
            (
                "sync_file_range(",
                &format!(", {second}, SYNC_FILE_RANGE_WRITE)"),
            ),
            ("sync_file_range(", &format!(", 0, 4096, {WAIT})")),
            ("sync_file_range(", &format!(", {second}, {WAIT})")),
            ("pwritev2(", &durable),
        ],
    );
}

#[test]
fn a_barrier_over_one_range_waits_for_it_then_writes_dsync() {
    if let Some(image) = std::env::var_os(CHILD) {
        return child(Path::new(&image));
    }
    if !common::require_tool("strace") {
        return;
    }
    let calls = traced(
        "a_barrier_over_one_range_waits_for_it_then_writes_dsync",
        true,
    );
    let durable = format!("{DURABLE_AT}, RWF_DSYNC");
    assert_calls(
        &calls,
        &[
            ("sync_file_range(", &format!(", 0, 4096, {WAIT})")),
            ("pwritev2(", &durable),
        ],
    );
}
