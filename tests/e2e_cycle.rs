//! Cycle mounts just work: `fusermount3 -u` returns as soon as
//! the kernel has unmounted, while the server still writes its last commit
//! and holds the image; a `jext4 mount` of the same image right away waits
//! for it (saying so when that takes over a second) instead of refusing
//! it as in use. Every write of
//! every cycle must land on the image, never in the directory under the
//! mount point, and no server may unmount its successor's mount (fuser's
//! second unmount once did) or warn about a failed unmount.
//!
//! Cycles: 12 by default (a few seconds); `JEXT4_CYCLE_MOUNTS=100` for the
//! long run.

// The jext4 binary, or the mounts and helpers of tests/common that use it.
#![cfg(feature = "cli")]

mod common;

use common::e2e::{self, JextMount};
use std::fs;
use std::path::Path;

fn cycles() -> usize {
    std::env::var("JEXT4_CYCLE_MOUNTS")
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(12)
}

fn cycle_data(cycle: usize) -> Vec<u8> {
    e2e::pattern(cycle as u64, 4096 + cycle * 997)
}

fn underlying_entries(mountpoint: &Path) -> Vec<String> {
    fs::read_dir(mountpoint)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .collect()
}

#[test]
fn unmount_mount_cycles_keep_every_write_on_the_image() {
    if !e2e::require_e2e() {
        return;
    }
    let scratch = e2e::scratch("cycle");
    let image = common::mkfs(scratch.path(), "cycle", 32, &["-t", "ext4"]);
    let mnt = scratch.path().join("mnt");
    let cycles = cycles();
    let mut waited = 0;
    for cycle in 0..cycles {
        let mount = JextMount::try_mount(&image, &mnt, "").unwrap_or_else(|(output, log)| {
            panic!(
                "cycle {cycle}: mount refused: {}\n{log}",
                String::from_utf8_lossy(&output.stderr)
            )
        });
        if mount
            .mount_stderr
            .contains("waiting for the previous server")
        {
            waited += 1;
        }
        // The mount is ready when the command returns: writes go to it.
        let dir = mount.path(&format!("cycle{cycle:03}"));
        fs::create_dir(&dir).unwrap();
        fs::write(dir.join("data"), cycle_data(cycle)).unwrap();
        for previous in 0..cycle {
            let path = mount.path(&format!("cycle{previous:03}/data"));
            assert_eq!(
                e2e::read_all(&path),
                cycle_data(previous),
                "cycle {cycle}: the write of cycle {previous} is not on the image"
            );
        }
        let log = mount.log.clone();
        e2e::run_ok("fusermount3", &["-u", e2e::path_str(&mnt)]);
        mount.forget();
        // Nothing was written beneath the mount.
        assert!(
            underlying_entries(&mnt).is_empty(),
            "cycle {cycle}: files landed in the directory under the mount point: {:?}",
            underlying_entries(&mnt)
        );
        let server_log = fs::read_to_string(&log).unwrap_or_default();
        assert!(
            !server_log.contains("Failed to umount") && !server_log.contains("panic"),
            "cycle {cycle}: server log:\n{server_log}"
        );
    }
    // How often the server was still finishing: timing, not asserted.
    eprintln!("{cycles} unmount/mount cycles; {waited} waited for the previous server");
    // The last server may still be writing: the next mount waits for it.
    let mount = JextMount::mount(&image, &mnt, "");
    for cycle in 0..cycles {
        assert_eq!(
            e2e::read_all(&mount.path(&format!("cycle{cycle:03}/data"))),
            cycle_data(cycle)
        );
    }
    mount.unmount();
    e2e::fsck_clean(&image, "after the unmount/mount cycles");
}
