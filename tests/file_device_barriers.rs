//! `FileDevice`'s ranged barrier (`write_durable`), seen from the system
//! calls it makes. With more than 1 MiB of other writes since the last
//! flush, every range is written back and waited for (`sync_file_range`),
//! then the block is written with `RWF_DSYNC` — and no `fsync`/`fdatasync`,
//! which would write every other dirty page of the image. With little else
//! written, one write and one `fdatasync` do it in two system calls; the
//! fast-commit barrier (`sync_ranges`), which has no block of its own to
//! write, then makes one `fdatasync` and writes nothing. The
//! crash tests model a barrier over a memory device; this holds the image
//! file's implementation to the same promise.
//!
//! The test runs itself again under `strace`, with `BARRIER_CHILD` naming
//! the image: the child makes the calls, the parent reads the trace.

mod common;

use jext4::engine::dev::{BlockDevice, FileDevice};
use std::path::Path;
use std::process::Command;

const CHILD: &str = "JEXT4_BARRIER_CHILD";
const BLOCK: u64 = 4096;
/// Other writes before the barrier: 2 MiB from 1 MiB on (none with
/// `JEXT4_BARRIER_QUIET`).
const OTHER_AT: u64 = 1 << 20;
const OTHER_LEN: usize = 2 << 20;
const DURABLE_AT: u64 = 3 << 20;

/// In the child: other writes, two ranges written, then one barrier over
/// both, or over the first only when `JEXT4_BARRIER_ONE` is set.
fn child(image: &Path) {
    let device = FileDevice::open(image, false).unwrap();
    if std::env::var_os("JEXT4_BARRIER_QUIET").is_none() {
        device.write_at(OTHER_AT, &vec![0x33; OTHER_LEN]).unwrap();
    }
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
    if std::env::var_os("JEXT4_BARRIER_SPARE").is_some() {
        // The fast-commit barrier: a spare block that holds zeros already.
        device
            .sync_ranges(&ranges, (DURABLE_AT, &[0; BLOCK as usize]))
            .unwrap();
    } else {
        device
            .write_durable(DURABLE_AT, &[0xa5; BLOCK as usize], &ranges)
            .unwrap();
    }
}

/// The calls of interest the child made from its barrier's first range
/// write on (the other writes are left out).
fn traced(name: &str, env: &[&str]) -> Vec<String> {
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("img");
    std::fs::write(&image, vec![0u8; (DURABLE_AT + BLOCK) as usize]).unwrap();
    let trace = dir.path().join("trace");
    let mut command = Command::new("strace");
    command
        .args([
            "-f",
            "-e",
            "trace=sync_file_range,pwritev2,pwrite64,fsync,fdatasync,sync,syncfs",
        ])
        .arg("-o")
        .arg(&trace)
        .arg(std::env::current_exe().unwrap())
        .args(["--exact", name, "--test-threads=1", "--nocapture"])
        .env(CHILD, &image);
    for variable in env {
        command.env(variable, "1");
    }
    let output = command.output().unwrap();
    assert!(
        output.status.success(),
        "the traced child failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let calls = [
        "sync_file_range(",
        "pwritev2(",
        "pwrite64(",
        "fsync(",
        "fdatasync(",
        "sync(",
        "syncfs(",
    ];
    std::fs::read_to_string(&trace)
        .unwrap()
        .lines()
        .filter(|line| calls.iter().any(|call| line.contains(call)))
        .map(|line| {
            // "PID  call(...)": strace pads the pid.
            line.split_once(' ')
                .map_or(line, |(_, rest)| rest)
                .trim_start()
                .to_string()
        })
        // The other writes and the ranges' own writes come first; a
        // write of the barrier's block is kept.
        .filter(|line| !line.starts_with("pwrite64(") || line.contains(&spare_write()))
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

/// How strace shows a plain write of the barrier's block.
fn spare_write() -> String {
    format!(", {BLOCK}, {DURABLE_AT})")
}

const WAIT: &str = "SYNC_FILE_RANGE_WAIT_BEFORE|SYNC_FILE_RANGE_WRITE|SYNC_FILE_RANGE_WAIT_AFTER";

/// Run `name` as the child, or trace it; `None` in the child or where
/// strace is missing (skipped with a message).
fn run_traced(name: &str, env: &[&str]) -> Option<Vec<String>> {
    if let Some(image) = std::env::var_os(CHILD) {
        child(Path::new(&image));
        return None;
    }
    if !common::require_tool("strace") {
        return None;
    }
    Some(traced(name, env))
}

#[test]
fn a_barrier_over_two_ranges_starts_both_then_waits_for_each_then_writes_dsync() {
    let name = "a_barrier_over_two_ranges_starts_both_then_waits_for_each_then_writes_dsync";
    let Some(calls) = run_traced(name, &[]) else {
        return;
    };
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

/// The ranged barrier over the one range the test wrote: it waits for that
/// range's write-back, then writes its block with RWF_DSYNC.
fn assert_one_range_then_dsync(calls: &[String]) {
    let durable = format!("{DURABLE_AT}, RWF_DSYNC");
    assert_calls(
        calls,
        &[
            ("sync_file_range(", &format!(", 0, 4096, {WAIT})")),
            ("pwritev2(", &durable),
        ],
    );
}

#[test]
fn a_barrier_over_one_range_waits_for_it_then_writes_dsync() {
    let name = "a_barrier_over_one_range_waits_for_it_then_writes_dsync";
    let Some(calls) = run_traced(name, &["JEXT4_BARRIER_ONE"]) else {
        return;
    };
    assert_one_range_then_dsync(&calls);
}

/// Nothing else written: the barrier's block is written and one fdatasync
/// makes it and the ranges durable.
#[test]
fn a_barrier_with_little_else_written_is_one_fdatasync() {
    let name = "a_barrier_with_little_else_written_is_one_fdatasync";
    let Some(calls) = run_traced(name, &["JEXT4_BARRIER_QUIET"]) else {
        return;
    };
    assert_calls(&calls, &[("pwrite64(", &spare_write()), ("fdatasync(", "")]);
}

/// The fast-commit barrier (`sync_ranges`) with little else written: one
/// fdatasync, and its spare block is not written.
#[test]
fn a_spare_barrier_with_little_else_written_is_one_fdatasync_and_no_write() {
    let name = "a_spare_barrier_with_little_else_written_is_one_fdatasync_and_no_write";
    let Some(calls) = run_traced(name, &["JEXT4_BARRIER_QUIET", "JEXT4_BARRIER_SPARE"]) else {
        return;
    };
    assert_calls(&calls, &[("fdatasync(", "")]);
}

/// With much else written, the fast-commit barrier is the ranged one: each
/// range written back, then the spare block rewritten with RWF_DSYNC.
#[test]
fn a_spare_barrier_over_much_else_written_waits_for_ranges_then_writes_dsync() {
    let name = "a_spare_barrier_over_much_else_written_waits_for_ranges_then_writes_dsync";
    let Some(calls) = run_traced(name, &["JEXT4_BARRIER_ONE", "JEXT4_BARRIER_SPARE"]) else {
        return;
    };
    assert_one_range_then_dsync(&calls);
}
