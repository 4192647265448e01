//! Issue 11, "see the requests": `jext4 stats` counts the FUSE requests the
//! server answered, by operation, with their errors, the time spent in the
//! engine and in the transport, and the requests in flight; the counts
//! match what a known workload must have asked, and they survive the
//! unmount in the server's last report.

mod common;

use common::e2e::{self, JEXT4, JextMount};
use std::collections::HashMap;
use std::fs;
use std::io::Write;
use std::path::Path;

/// `jext4 stats` as name → value (numbers, and booleans as 0 or 1).
fn stats(mountpoint: &Path) -> HashMap<String, u64> {
    let output = e2e::run_ok(JEXT4, &["stats", e2e::path_str(mountpoint)]);
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| {
            let (name, value) = line.split_once(' ')?;
            let value = match value {
                "true" => 1,
                "false" => 0,
                number => number.parse().ok()?,
            };
            Some((name.to_string(), value))
        })
        .collect()
}

fn value(stats: &HashMap<String, u64>, name: &str) -> u64 {
    *stats
        .get(name)
        .unwrap_or_else(|| panic!("jext4 stats has no {name}: {stats:?}"))
}

#[test]
fn stats_count_requests_by_operation() {
    if !e2e::require_e2e() {
        return;
    }
    let scratch = e2e::scratch("requests");
    let image = common::mkfs(scratch.path(), "requests", 16, &["-t", "ext4"]);
    let mnt = scratch.path().join("mnt");
    let mount = JextMount::mount(&image, &mnt, "");
    let before = stats(&mnt);
    const FILES: u64 = 20;
    const WRITES: u64 = 3;
    for index in 0..FILES {
        let mut file = fs::File::create(mount.path(&format!("file{index}"))).unwrap();
        for _ in 0..WRITES {
            file.write_all(&[index as u8; 100]).unwrap();
        }
    }
    // Lookups of names that do not exist: answered with ENOENT, counted as
    // errors.
    for index in 0..5 {
        assert!(fs::metadata(mount.path(&format!("missing{index}"))).is_err());
    }
    let after = stats(&mnt);
    let asked = |name: &str| value(&after, name) - before.get(name).copied().unwrap_or(0);
    assert_eq!(asked("fuse_op_create"), FILES);
    assert_eq!(asked("fuse_op_write"), FILES * WRITES);
    assert_eq!(asked("fuse_op_release"), FILES);
    assert!(asked("fuse_op_lookup_errors") >= 5, "{after:?}");
    assert_eq!(value(&after, "fuse_op_write_errors"), 0);
    assert!(asked("fuse_requests") >= FILES * (WRITES + 2), "{after:?}");
    // The stats ioctl itself is in flight while the report is written.
    assert!(value(&after, "fuse_requests_in_flight") >= 1);
    assert!(value(&after, "fuse_requests_in_flight_max") >= 1);
    assert!(value(&after, "fuse_op_write_engine_us_p50") >= 1);
    assert!(
        value(&after, "fuse_op_write_engine_us_max")
            >= value(&after, "fuse_op_write_engine_us_p50")
    );
    for name in ["fuse_engine_ms", "fuse_transport_ms", "fuse_uptime_ms"] {
        value(&after, name);
    }
    // An operation never asked is not listed.
    assert!(!after.contains_key("fuse_op_rename"), "{after:?}");
    mount.unmount();
    // The last report, written after the unmount, keeps the counts.
    let last = stats(&mnt);
    assert_eq!(value(&last, "mounted"), 0, "{last:?}");
    assert!(value(&last, "fuse_op_create") >= FILES);
    assert_eq!(value(&last, "fuse_requests_in_flight"), 0);
    e2e::fsck_clean(&image, "after the counted workload");
}
