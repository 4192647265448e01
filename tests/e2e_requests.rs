//! See the requests: `jext4 stats` counts the FUSE requests the
//! server answered, by operation, with their errors, the time spent in the
//! engine and in the transport, and the requests in flight; the counts
//! match what a known workload must have asked, and they survive the
//! unmount in the server's last report.

// The jext4 binary, or the mounts and helpers of tests/common that use it.
#![cfg(feature = "cli")]

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
    // The kernel sends RELEASE in the background once close returns
    // (fs/fuse/file.c: fuse_file_release, synchronous on fuseblk only):
    // the last ones may reach the server after the report. Wait for them.
    let mut after = HashMap::new();
    let released = |after: &HashMap<String, u64>| {
        after.get("fuse_op_release").copied().unwrap_or(0)
            - before.get("fuse_op_release").copied().unwrap_or(0)
    };
    e2e::wait_for(std::time::Duration::from_secs(30), || {
        after = stats(&mnt);
        released(&after) >= FILES
    });
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

/// How many requests of `operations` the server took up between two
/// reports: exactly those the kernel sent in between, as the server counts
/// a request before it replies (a reply seen before the first report is
/// counted in it, even if the thread that sent it has not finished).
fn asked_between(
    before: &HashMap<String, u64>,
    after: &HashMap<String, u64>,
    operations: &[&str],
) -> u64 {
    operations
        .iter()
        .map(|operation| {
            let name = format!("fuse_op_{operation}");
            after.get(&name).copied().unwrap_or(0) - before.get(&name).copied().unwrap_or(0)
        })
        .sum()
}

/// Under relatime a listing or a read that would not change the atime is
/// answered from the kernel's caches (FOPEN_CACHE_DIR, FOPEN_KEEP_CACHE),
/// and a change made through the kernel drops what it cached; under
/// strictatime every access reaches the server (and updates the atime).
/// The kernel keeps a cached listing while the directory's pages stay
/// (fs/fuse/readdir.c: a page gone missing resets the cache): something
/// else on the machine dropping caches (`echo 2 > drop_caches`, as
/// e2e_handles does in its own binary) or memory pressure would make a
/// listing reach the server.
#[test]
fn unchanged_listings_and_files_come_from_the_kernels_caches_where_atime_allows() {
    if !e2e::require_e2e() {
        return;
    }
    let scratch = e2e::scratch("caches");
    for (options, cached) in [("relatime", true), ("strictatime", false)] {
        let image = common::mkfs(scratch.path(), options, 16, &["-t", "ext4"]);
        let mnt = scratch.path().join(format!("mnt-{options}"));
        let mount = JextMount::mount(&image, &mnt, options);
        fs::create_dir(mount.path("dir")).unwrap();
        for index in 0..40 {
            fs::write(mount.path(&format!("dir/f{index}")), vec![b'a'; 8192]).unwrap();
        }
        let count = || fs::read_dir(mount.path("dir")).unwrap().count();
        let file = mount.path("dir/f7");
        // The first accesses update the atime (older than the changes) and
        // fill the caches.
        for _ in 0..2 {
            assert_eq!(count(), 40);
            assert_eq!(fs::read(&file).unwrap(), vec![b'a'; 8192]);
        }
        let before = stats(&mnt);
        assert_eq!(count(), 40);
        assert_eq!(fs::read(&file).unwrap(), vec![b'a'; 8192]);
        let after = stats(&mnt);
        let listed = asked_between(&before, &after, &["readdir", "readdirplus"]);
        let read = asked_between(&before, &after, &["read"]);
        if cached {
            assert_eq!((listed, read), (0, 0), "{options}: {after:?}");
        } else {
            assert!(listed > 0 && read > 0, "{options}: {after:?}");
        }
        // Changes through the kernel drop what it cached.
        fs::write(mount.path("dir/new"), b"new").unwrap();
        fs::write(&file, vec![b'b'; 4096]).unwrap();
        assert_eq!(count(), 41);
        assert_eq!(fs::read(&file).unwrap(), vec![b'b'; 4096]);
        mount.unmount();
        e2e::fsck_clean(&image, options);
    }
}

/// Writes, truncates and chowns of setuid, setgid and capable files by
/// root and by an unprivileged user in and out of the file's group; prints
/// the mode and capabilities after each. The same script runs on jext4
/// (which removes them itself under FUSE_HANDLE_KILLPRIV_V2) and on kernel
/// ext4, which must agree line for line.
const PRIVILEGE_SCRIPT: &str = r#"set -e
cd "$1"
mkdir t
chmod 777 t
cd t
user() { setpriv --reuid=65534 --regid=65534 --clear-groups -- "$@"; }
for mode in 4755 2755 2745 6755 6745 4644; do
  for group in 65534 0; do
    for op in write truncate root-write root-truncate chown; do
      f="f-$mode-$group-$op"
      echo data > "$f"
      chown 65534:$group "$f"
      chmod 666 "$f"
      chmod "$mode" "$f"
      case $op in
        write) user sh -c "echo more >> '$f'" ;;
        truncate) user truncate -s 1 "$f" ;;
        root-write) echo more >> "$f" ;;
        root-truncate) truncate -s 2 "$f" ;;
        chown) chown 65534:0 "$f" ;;
      esac
      echo "$f $(stat -c %a "$f")"
    done
  done
done
for op in write truncate chown; do
  f="cap-$op"
  echo data > "$f"
  setcap cap_net_raw+ep "$f"
  case $op in
    write) echo more >> "$f" ;;
    truncate) truncate -s 1 "$f" ;;
    chown) chown 65534 "$f" ;;
  esac
  echo "$f $(getfattr --absolute-names -n security.capability "$f" 2>&1 | grep -c '^security.capability' || true)"
done
"#;

fn privilege_outcomes(directory: &Path) -> String {
    let output = e2e::run(
        "sh",
        &["-c", PRIVILEGE_SCRIPT, "sh", e2e::path_str(directory)],
    );
    assert!(
        output.status.success(),
        "the privilege script failed in {}:\n{}\n{}",
        directory.display(),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[test]
fn write_truncate_and_chown_drop_privileges_as_kernel_ext4_does() {
    if !e2e::require_e2e() {
        return;
    }
    for tool in ["setpriv", "setcap", "getfattr"] {
        assert!(common::require_tool(tool), "{tool} is needed");
    }
    let scratch = e2e::scratch("privileges");
    let kernel_image = common::mkfs(scratch.path(), "kernel", 16, &["-t", "ext4"]);
    let kernel = e2e::KernelMount::mount(&kernel_image, &scratch.path().join("kernel"), false);
    let expected = privilege_outcomes(&kernel.mountpoint);
    kernel.unmount();
    let image = common::mkfs(scratch.path(), "jext4", 16, &["-t", "ext4"]);
    let mount = JextMount::mount(&image, &scratch.path().join("jext4"), "allow_other");
    let got = privilege_outcomes(&mount.mountpoint);
    mount.unmount();
    // The script must have exercised both outcomes.
    assert!(expected.contains("f-4755-65534-write 755"), "{expected}");
    assert!(
        expected.contains("f-4755-65534-root-write 4755"),
        "{expected}"
    );
    assert!(expected.contains("cap-write 0"), "{expected}");
    assert_eq!(got, expected, "jext4 (left) against kernel ext4 (right)");
    e2e::fsck_clean(&image, "after the privilege script");
}
