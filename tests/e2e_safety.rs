//! Nothing can hang the server: numeric mount options bounded
//! as the kernel bounds them and refused by name; a panic in a server
//! thread logged and turned into an aborted journal (read-only, EIO for
//! what it interrupted, exit once unmounted, an image that replays clean);
//! SIGTERM and SIGINT unmounting as soon as the mount is no longer busy,
//! each retry logged.

// The jext4 binary, or the mounts and helpers of tests/common that use it.
#![cfg(feature = "cli")]

mod common;

use common::e2e::{self, JEXT4, JextMount};
use std::fs;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

fn process_alive(pid: i32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit_once(") ")
            .is_some_and(|(_, rest)| !rest.starts_with('Z'))
    })
}

fn stats(mountpoint: &Path) -> String {
    let output = e2e::run_ok(JEXT4, &["stats", e2e::path_str(mountpoint)]);
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[test]
fn numeric_options_out_of_bounds_are_refused_by_name() {
    if !e2e::require_e2e() {
        return;
    }
    let scratch = e2e::scratch("options");
    let image = common::mkfs(scratch.path(), "options", 16, &["-t", "ext4"]);
    let mnt = scratch.path().join("mnt");
    fs::create_dir_all(&mnt).unwrap();
    for (option, name) in [
        // Once a hang: the commit thread's clock overflowed.
        ("commit=9223372036854775807", "commit"),
        // The kernel's bound is INT_MAX / HZ.
        ("commit=8589935", "commit"),
        ("commit=-5", "commit"),
        ("cache_size=4096T", "cache_size"),
        ("cache_size=100K", "cache_size"),
        ("threads=0", "threads"),
        ("threads=100000", "threads"),
    ] {
        let started = Instant::now();
        let output = e2e::run(
            JEXT4,
            &[
                "mount",
                "-o",
                option,
                e2e::path_str(&image),
                e2e::path_str(&mnt),
            ],
        );
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "-o {option} was accepted");
        assert!(
            stderr.contains(&format!("{name}=")),
            "-o {option}: the refusal does not name the option: {stderr}"
        );
        assert!(started.elapsed() < Duration::from_secs(10));
        assert!(!e2e::is_mount_point(&mnt), "-o {option} left a mount");
    }
    // The largest interval the kernel takes works.
    let mount = JextMount::mount(&image, &mnt, "commit=8589934");
    fs::write(mount.path("file"), b"kept").unwrap();
    mount.unmount();
    e2e::fsck_clean(&image, "after commit=8589934");
}

/// A panic injected at `point` (JEXT4_PANIC_AT, honoured by builds with
/// debug assertions) while `work` runs on the mount: the panic reaches the
/// log, the journal aborts, the mount turns read-only but still reads, and
/// unmount ends the server (reporting the abort) without a hang; the image
/// then mounts again, replays, and is clean, with `kept` intact.
fn panic_aborts_the_journal(point: &str, work: impl FnOnce(&JextMount)) {
    let scratch = e2e::scratch(&format!("panic-{point}"));
    let image = common::mkfs(scratch.path(), "panic", 16, &["-t", "ext4"]);
    let mnt = scratch.path().join("mnt");
    let mount = JextMount::mount(&image, &mnt, "");
    fs::create_dir(mount.path("dir")).unwrap();
    fs::write(mount.path("dir/kept"), b"committed before the panic").unwrap();
    mount.unmount();

    let env = [("JEXT4_PANIC_AT", point)];
    let mount = JextMount::try_mount_with_env(&image, &mnt, "", &env)
        .unwrap_or_else(|(output, log)| panic!("mount failed: {output:?}\n{log}"));
    let pid = mount.server_pid();
    work(&mount);
    // Reads go on; writes are refused.
    assert_eq!(
        fs::read(mount.path("dir/kept")).unwrap(),
        b"committed before the panic"
    );
    let refused = fs::write(mount.path("dir/after"), b"x").unwrap_err();
    assert_eq!(refused.raw_os_error(), Some(libc::EROFS), "{refused}");
    // The statistics say so (they are refreshed every 2 s).
    assert!(
        e2e::wait_for(Duration::from_secs(10), || {
            let report = stats(&mnt);
            report.contains("read_only true") && report.contains("journal_aborted true")
        }),
        "jext4 stats does not report the abort:\n{}",
        stats(&mnt)
    );
    let log = mount.server_log();
    assert!(
        log.contains("panicked at")
            && log.contains("injected panic")
            && log.contains("journal aborted"),
        "the panic is not in the log:\n{log}"
    );
    // Unmount ends the server, which reports the abort.
    let output = e2e::run(JEXT4, &["umount", "--timeout", "30", e2e::path_str(&mnt)]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        !output.status.success() && stderr.contains("journal aborted"),
        "jext4 umount after the abort: {stderr}"
    );
    assert!(!e2e::is_mount_point(&mnt));
    assert!(!process_alive(pid), "the server is still running");
    mount.forget();
    // Nothing holds the image: it mounts at once, replays and is clean.
    let mount = JextMount::mount(&image, &mnt, "");
    assert_eq!(
        fs::read(mount.path("dir/kept")).unwrap(),
        b"committed before the panic"
    );
    assert!(!mount.path("dir/after").exists());
    mount.unmount();
    e2e::fsck_clean(&image, &format!("after a panic at {point}"));
}

#[test]
fn panic_in_the_commit_thread_aborts_the_journal() {
    if !e2e::require_e2e() {
        return;
    }
    panic_aborts_the_journal("commit", |mount| {
        // The fsync waits for the commit the panic interrupts: EIO, never
        // a hang.
        let mut file = fs::File::create(mount.path("dir/lost")).unwrap();
        file.write_all(b"never committed").unwrap();
        let error = file.sync_all().unwrap_err();
        assert_eq!(error.raw_os_error(), Some(libc::EIO), "{error}");
    });
}

#[test]
fn panic_inside_an_operation_aborts_before_anything_commits() {
    if !e2e::require_e2e() {
        return;
    }
    panic_aborts_the_journal("create", |mount| {
        // The create panics with its inode allocated in the running
        // transaction: the request fails, the half-made change never
        // commits.
        let error = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .open(mount.path("dir/half"))
            .unwrap_err();
        assert_eq!(error.raw_os_error(), Some(libc::EIO), "{error}");
        assert!(!mount.path("dir/half").exists());
    });
}

#[test]
fn signals_unmount_once_the_mount_is_free() {
    if !e2e::require_e2e() {
        return;
    }
    let scratch = e2e::scratch("signals");
    let image = common::mkfs(scratch.path(), "signals", 16, &["-t", "ext4"]);
    let mnt = scratch.path().join("mnt");
    let mount = JextMount::mount(&image, &mnt, "");
    let pid = mount.server_pid();
    let mut open = fs::File::create(mount.path("held-open")).unwrap();
    open.write_all(b"written while a signal waits").unwrap();
    // SAFETY: kill with a pid and a signal number.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    // Busy for longer than the old retry window (2 s), and a second signal.
    std::thread::sleep(Duration::from_millis(2500));
    assert!(e2e::is_mount_point(&mnt), "unmounted while a file was open");
    // SAFETY: as above.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGINT) }, 0);
    // The server logs the second signal when its signal thread runs: on a
    // loaded machine that may take longer than any fixed pause.
    let logged = |log: &str| {
        log.matches("cannot unmount yet").count() >= 2 && log.contains("signal received again")
    };
    assert!(
        e2e::wait_for(Duration::from_secs(10), || logged(&mount.server_log())),
        "retries are not logged:\n{}",
        mount.server_log()
    );
    drop(open);
    assert!(
        e2e::wait_for(Duration::from_secs(10), || !process_alive(pid)),
        "the server did not unmount and exit once the file was closed:\n{}",
        mount.server_log()
    );
    assert!(!e2e::is_mount_point(&mnt));
    let log = mount.server_log();
    assert!(log.contains("unmounted cleanly"), "{log}");
    assert!(!log.contains("Failed to umount"), "{log}");
    mount.forget();
    e2e::fsck_clean(&image, "after the signalled unmount");
    let output = Command::new("debugfs")
        .args(["-R", "cat /held-open"])
        .arg(&image)
        .output()
        .unwrap();
    assert_eq!(output.stdout, b"written while a signal waits");
}

fn debugfs_cat(image: &Path, path: &str) -> Vec<u8> {
    Command::new("debugfs")
        .args(["-R", &format!("cat {path}")])
        .arg(image)
        .output()
        .unwrap()
        .stdout
}

/// `jext4 sync` and fsync of any directory commit everything pending: after
/// a kill -9 (with a commit interval far away) the recovered image holds
/// what was written before them. The dead mount the kill leaves is named
/// as such and `jext4 umount` clears it.
#[test]
fn jext4_sync_and_directory_fsync_survive_kill_9() {
    if !e2e::require_e2e() {
        return;
    }
    let scratch = e2e::scratch("sync");
    let image = common::mkfs(scratch.path(), "sync", 16, &["-t", "ext4"]);
    let mnt = scratch.path().join("mnt");
    let mount = JextMount::mount(&image, &mnt, "commit=600");
    let pid = mount.server_pid();
    fs::create_dir(mount.path("a")).unwrap();
    fs::write(mount.path("a/synced"), b"made durable by jext4 sync").unwrap();
    e2e::run_ok(JEXT4, &["sync", e2e::path_str(&mnt)]);
    fs::create_dir(mount.path("b")).unwrap();
    fs::create_dir(mount.path("c")).unwrap();
    fs::write(mount.path("b/by-dir-fsync"), b"made durable by fsync of c").unwrap();
    fs::File::open(mount.path("c")).unwrap().sync_all().unwrap();
    // SAFETY: kill with a pid and a signal number.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
    assert!(e2e::wait_for(Duration::from_secs(10), || !process_alive(
        pid
    )));

    let output = e2e::run(JEXT4, &["stats", e2e::path_str(&mnt)]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        !output.status.success() && stderr.contains("dead FUSE mount"),
        "stats on a dead mount: {stderr}"
    );
    let output = e2e::run(
        JEXT4,
        &["mount", e2e::path_str(&image), e2e::path_str(&mnt)],
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        !output.status.success()
            && stderr.contains("dead FUSE mount")
            && stderr.contains("jext4 umount"),
        "mount on a dead mount: {stderr}"
    );
    e2e::run_ok(JEXT4, &["umount", e2e::path_str(&mnt)]);
    assert!(!e2e::is_mount_point(&mnt));
    mount.forget();

    e2e::run_ok(JEXT4, &["recover", e2e::path_str(&image)]);
    e2e::fsck_clean(&image, "after kill -9 and recovery");
    assert_eq!(
        debugfs_cat(&image, "/a/synced"),
        b"made durable by jext4 sync"
    );
    assert_eq!(
        debugfs_cat(&image, "/b/by-dir-fsync"),
        b"made durable by fsync of c"
    );
}
