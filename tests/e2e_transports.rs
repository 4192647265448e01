//! The FUSE mount behaves the same over both transports,
//! `/dev/fuse` and FUSE over io_uring: the mixed workload and a real tree
//! read back the same after a remount and through a kernel loop mount with
//! `e2fsck -fn` clean; fsync'd data survives a kill -9; unmounting an idle
//! or a busy mount ends the server cleanly with nothing of the ring left; a
//! panic while answering aborts the journal; bad choices are refused in
//! one line.
//!
//! The io_uring runs switch the kernel's module parameter
//! (`/sys/module/fuse/parameters/enable_uring`) on and restore it when they
//! end, panics included; they hold a lock meanwhile, so the tests of this
//! binary that touch the parameter take turns. A kernel without the
//! parameter has no FUSE over io_uring: those runs are skipped, with the
//! reason printed. Where the parameter exists, io_uring must work, under
//! `JEXT4_NO_SKIP` as everywhere.

// The jext4 binary, or the mounts and helpers of tests/common that use it.
#![cfg(feature = "cli")]

mod common;

use common::e2e::{self, JEXT4, JextMount, KernelMount, Params};
use std::fs;
use std::io::Write;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

const PARAMETER: &str = "/sys/module/fuse/parameters/enable_uring";

/// Serialises the tests that set the module parameter.
static PARAMETER_LOCK: Mutex<()> = Mutex::new(());

/// The parameter set to a value for as long as this lives, then restored.
struct ParameterSet {
    original: String,
    _turn: MutexGuard<'static, ()>,
}

impl ParameterSet {
    /// `None`: this kernel has no FUSE over io_uring (the reason is
    /// printed); the caller skips.
    fn to(value: &str) -> Option<ParameterSet> {
        let turn = PARAMETER_LOCK
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let Ok(original) = fs::read_to_string(PARAMETER) else {
            eprintln!("SKIP: {PARAMETER} is missing: this kernel has no FUSE over io_uring");
            return None;
        };
        fs::write(PARAMETER, value)
            .unwrap_or_else(|error| panic!("setting {PARAMETER} to {value} (root): {error}"));
        Some(ParameterSet {
            original: original.trim().to_string(),
            _turn: turn,
        })
    }
}

impl Drop for ParameterSet {
    fn drop(&mut self) {
        if let Err(error) = fs::write(PARAMETER, &self.original) {
            eprintln!("restoring {PARAMETER} to {}: {error}", self.original);
        }
    }
}

/// Run `body` with the mount options that choose `transport`, the
/// parameter switched on for io_uring. False: skipped.
fn over(transport: &str, body: impl FnOnce(&str)) -> bool {
    let _switch = match transport {
        "uring" => match ParameterSet::to("Y") {
            Some(switch) => Some(switch),
            None => return false,
        },
        _ => None,
    };
    body(&format!("fuse_transport={transport}"));
    true
}

fn stats(mountpoint: &Path) -> String {
    String::from_utf8_lossy(&e2e::run_ok(JEXT4, &["stats", e2e::path_str(mountpoint)]).stdout)
        .into_owned()
}

fn stat_value(report: &str, name: &str) -> Option<u64> {
    report
        .lines()
        .find_map(|line| line.strip_prefix(&format!("{name} ")))
        .and_then(|value| value.parse().ok())
}

/// The mount's statistics name `transport` as the live one; over io_uring
/// the ring carried the requests.
fn assert_transport(mountpoint: &Path, transport: &str) {
    let report = stats(mountpoint);
    assert!(
        report.contains(&format!("\nfuse_transport {transport}\n")),
        "jext4 stats does not say fuse_transport {transport}:\n{report}"
    );
    if transport == "uring" {
        let carried = stat_value(&report, "fuse_uring_requests").unwrap_or(0);
        let answered = stat_value(&report, "fuse_requests").unwrap_or(0);
        let forgets = stat_value(&report, "fuse_op_forget").unwrap_or(0);
        // Everything but FORGET (which stays on /dev/fuse) came through
        // the ring; the stats request itself is in flight.
        assert!(
            carried > 0 && carried + forgets >= answered,
            "the ring carried {carried} of {answered} requests ({forgets} forgets):\n{report}"
        );
        assert!(stat_value(&report, "fuse_uring_buffer_bytes").unwrap_or(0) > 0);
        // The queue threads poll between requests unless told not to
        // (-o uring_spin=0).
        assert_polls(&report, "fuse_uring", carried);
    } else {
        assert!(!report.contains("fuse_uring_"), "{report}");
        // So does the /dev/fuse worker whose turn it is to read (-o
        // dev_spin=0: never).
        let answered = stat_value(&report, "fuse_requests").unwrap_or(0);
        assert_polls(&report, "fuse_dev", answered);
    }
}

/// A transport polls between requests unless its window is zero: a
/// thread that answered polls, at least once, before it sleeps (after a
/// busy spell, some polls have ended).
fn assert_polls(report: &str, prefix: &str, requests: u64) {
    let window = stat_value(report, &format!("{prefix}_spin_us"));
    let polls = stat_value(report, &format!("{prefix}_polls"));
    match window {
        Some(0) => assert_eq!(polls, Some(0), "{report}"),
        Some(_) if requests > 100 => {
            assert!(polls.is_some_and(|polls| polls > 0), "{report}")
        }
        Some(_) => {}
        None => panic!("no {prefix}_spin_us in the statistics:\n{report}"),
    }
}

/// When a busy mount is detached lazily, the kernel may stop waiting for a
/// request in flight before the server answers it (seen once over
/// /dev/fuse, at the moment of the detach, under a load average of 75);
/// fuser then reports the reply it could not send — ENOENT: the kernel no
/// longer knows the request. Nothing is lost: the busy test checks every
/// byte its writers wrote.
const DROPPED_AT_TEARDOWN: &str = "Failed to send FUSE reply: No such file or directory";

fn server_log_is_clean(log: &str, transport: &str) {
    let log: String = log
        .lines()
        .filter(|line| !line.contains(DROPPED_AT_TEARDOWN))
        .map(|line| format!("{line}\n"))
        .collect();
    for bad in ["panicked", "ERROR", "journal aborted", "left descriptors"] {
        assert!(
            !log.contains(bad),
            "the server log contains {bad:?}:\n{log}"
        );
    }
    assert!(log.contains("unmounted cleanly"), "{log}");
    if transport == "uring" {
        assert!(
            log.contains("serving through FUSE over io_uring")
                && log.contains("no thread or ring left"),
            "the ring did not start or stop as it should:\n{log}"
        );
    }
}

fn workload_reads_back(transport: &str) {
    let scratch = e2e::scratch(&format!("transport-{transport}"));
    let image = common::mkfs(scratch.path(), "workload", 256, &["-t", "ext4"]);
    let mnt = scratch.path().join("mnt");
    over(transport, |options| {
        let mount = JextMount::mount(&image, &mnt, options);
        assert_transport(&mnt, transport);
        let params = Params {
            block_size: e2e::statvfs(&mnt).0,
            extents: true,
            big_dir_entries: 2000,
        };
        e2e::copy_real_tree(&mnt.join("tree"), 2000, 30 << 20);
        let outcome = e2e::workload(&mnt, &params);
        drop(outcome.held);
        e2e::syncfs(&mnt);
        let written = e2e::snapshot(&mnt);
        e2e::verify(&mnt, &outcome.expect);
        assert_transport(&mnt, transport);
        let log = mount.log.clone();
        mount.unmount();
        server_log_is_clean(&fs::read_to_string(&log).unwrap(), transport);
        e2e::fsck_clean(&image, &format!("after the workload over {transport}"));

        // Read back with neither transport polling.
        let mount = JextMount::mount(&image, &mnt, &format!("{options},uring_spin=0,dev_spin=0"));
        let remounted = e2e::snapshot(&mnt);
        e2e::verify(&mnt, &outcome.expect);
        assert_transport(&mnt, transport);
        let prefix = if transport == "uring" {
            "fuse_uring"
        } else {
            "fuse_dev"
        };
        assert_eq!(
            stat_value(&stats(&mnt), &format!("{prefix}_spin_us")),
            Some(0)
        );
        mount.unmount();
        e2e::assert_same(&written, &remounted, ("jext4 mount", "jext4 remount"));

        let kernel = KernelMount::mount(&image, &mnt, true);
        let seen_by_kernel = e2e::snapshot(&kernel.mountpoint);
        e2e::verify(&kernel.mountpoint, &outcome.expect);
        kernel.unmount();
        e2e::assert_same(&remounted, &seen_by_kernel, ("jext4", "kernel"));
    });
}

#[test]
fn workload_over_dev_fuse() {
    if e2e::require_e2e() {
        workload_reads_back("dev");
    }
}

#[test]
fn workload_over_io_uring() {
    if e2e::require_e2e() {
        workload_reads_back("uring");
    }
}

fn debugfs_cat(image: &Path, path: &str) -> Vec<u8> {
    e2e::run_ok(
        "debugfs",
        &["-R", &format!("cat {path}"), e2e::path_str(image)],
    )
    .stdout
}

/// fsync, fdatasync and a directory fsync are durable when they return:
/// a kill -9 right after loses none of it (the commit interval is far).
fn fsync_survives_kill_9(transport: &str) {
    let scratch = e2e::scratch(&format!("kill-{transport}"));
    let image = common::mkfs(scratch.path(), "kill", 32, &["-t", "ext4"]);
    let mnt = scratch.path().join("mnt");
    over(transport, |options| {
        let mount = JextMount::mount(&image, &mnt, &format!("{options},commit=600"));
        assert_transport(&mnt, transport);
        let pid = mount.server_pid();
        let data = e2e::pattern(11, 300_000);
        let mut file = fs::File::create(mount.path("fsynced")).unwrap();
        file.write_all(&data).unwrap();
        file.sync_all().unwrap();
        drop(file);
        let mut file = fs::File::create(mount.path("fdatasynced")).unwrap();
        file.write_all(b"fdatasync").unwrap();
        file.sync_data().unwrap();
        drop(file);
        fs::create_dir(mount.path("dir")).unwrap();
        fs::write(mount.path("dir/entry"), b"in a synced directory").unwrap();
        fs::File::open(mount.path("dir"))
            .unwrap()
            .sync_all()
            .unwrap();
        // SAFETY: kill with a pid and a signal number.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
        assert!(e2e::wait_for(Duration::from_secs(10), || {
            !jext4::engine::fuse::serve::process_alive(pid)
        }));
        e2e::run_ok(JEXT4, &["umount", e2e::path_str(&mnt)]);
        mount.forget();
    });
    e2e::run_ok(JEXT4, &["recover", e2e::path_str(&image)]);
    e2e::fsck_clean(&image, &format!("after kill -9 over {transport}"));
    assert_eq!(debugfs_cat(&image, "/fsynced"), e2e::pattern(11, 300_000));
    assert_eq!(debugfs_cat(&image, "/fdatasynced"), b"fdatasync");
    assert_eq!(debugfs_cat(&image, "/dir/entry"), b"in a synced directory");
}

#[test]
fn fsync_survives_kill_9_over_dev_fuse() {
    if e2e::require_e2e() {
        fsync_survives_kill_9("dev");
    }
}

#[test]
fn fsync_survives_kill_9_over_io_uring() {
    if e2e::require_e2e() {
        fsync_survives_kill_9("uring");
    }
}

/// Unmounting an idle mount ends the server at once, cleanly; a lazy
/// unmount while writers and a stat storm work through open descriptors
/// lets them finish, and the server ends cleanly when the last is closed,
/// with everything they wrote on the image.
fn unmount_idle_and_busy(transport: &str) {
    let scratch = e2e::scratch(&format!("unmount-{transport}"));
    let image = common::mkfs(scratch.path(), "unmount", 64, &["-t", "ext4"]);
    let mnt = scratch.path().join("mnt");
    over(transport, |options| {
        let mount = JextMount::mount(&image, &mnt, options);
        let pid = mount.server_pid();
        fs::write(mount.path("idle"), b"idle").unwrap();
        let log = mount.log.clone();
        mount.unmount();
        assert!(e2e::wait_for(Duration::from_secs(10), || {
            !jext4::engine::fuse::serve::process_alive(pid)
        }));
        server_log_is_clean(&fs::read_to_string(&log).unwrap(), transport);

        let mount = JextMount::mount(&image, &mnt, options);
        let pid = mount.server_pid();
        let log = mount.log.clone();
        let written = busy_lazy_unmount(&mnt);
        mount.forget();
        assert!(
            e2e::wait_for(Duration::from_secs(30), || {
                !jext4::engine::fuse::serve::process_alive(pid)
            }),
            "the server did not end after the last descriptor closed:\n{}",
            fs::read_to_string(&log).unwrap_or_default()
        );
        server_log_is_clean(&fs::read_to_string(&log).unwrap(), transport);
        e2e::fsck_clean(&image, &format!("after a busy unmount over {transport}"));
        for (name, length) in written {
            let data = debugfs_cat(&image, &format!("/{name}"));
            assert_eq!(
                data.len() as u64,
                length,
                "{name}: short after the busy unmount"
            );
            assert!(
                data.iter().all(|&byte| byte == name.as_bytes()[6]),
                "{name}: wrong bytes"
            );
        }
    });
}

/// Writers append to files they hold open and a thread stats names through
/// a directory descriptor; the mount is detached lazily while they run.
/// Returns each file's name and length once every descriptor is closed.
fn busy_lazy_unmount(mnt: &Path) -> Vec<(String, u64)> {
    let stop = Arc::new(AtomicBool::new(false));
    let directory = fs::File::open(mnt).unwrap();
    let mut workers = Vec::new();
    for index in 0..3u8 {
        let name = format!("writer{index}");
        let mut file = fs::File::create(mnt.join(&name)).unwrap();
        let stop = Arc::clone(&stop);
        workers.push(std::thread::spawn(move || {
            let block = vec![name.as_bytes()[6]; 4096];
            let mut length = 0u64;
            while !stop.load(Ordering::Acquire) {
                file.write_all(&block).unwrap();
                length += block.len() as u64;
                if length.is_multiple_of(64 << 10) {
                    file.sync_data().unwrap();
                }
            }
            (name, length)
        }));
    }
    let storm_stop = Arc::clone(&stop);
    let storm = std::thread::spawn(move || {
        let name = std::ffi::CString::new("writer0").unwrap();
        let mut stats = 0u64;
        while !storm_stop.load(Ordering::Acquire) {
            // SAFETY: a live directory descriptor, a NUL-terminated name
            // and a zeroed stat buffer the call fills.
            let mut stat: libc::stat = unsafe { std::mem::zeroed() };
            let result =
                unsafe { libc::fstatat(directory.as_raw_fd(), name.as_ptr(), &mut stat, 0) };
            assert_eq!(result, 0, "fstatat: {}", std::io::Error::last_os_error());
            stats += 1;
        }
        stats
    });
    std::thread::sleep(Duration::from_millis(300));
    e2e::run_ok("fusermount3", &["-u", "-z", e2e::path_str(mnt)]);
    assert!(!e2e::is_mount_point(mnt));
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, Ordering::Release);
    assert!(storm.join().unwrap() > 0);
    workers
        .into_iter()
        .map(|worker| worker.join().unwrap())
        .collect()
}

#[test]
fn unmount_idle_and_busy_over_dev_fuse() {
    if e2e::require_e2e() {
        unmount_idle_and_busy("dev");
    }
}

#[test]
fn unmount_idle_and_busy_over_io_uring() {
    if e2e::require_e2e() {
        unmount_idle_and_busy("uring");
    }
}

/// A panic injected into a create (JEXT4_PANIC_AT, builds with debug
/// assertions) on an io_uring queue thread: the request fails with EIO,
/// the journal aborts, the mount turns read-only, unmount reports it, and
/// the image replays clean with what was committed before.
#[test]
fn panic_on_a_queue_thread_aborts_the_journal() {
    if !e2e::require_e2e() {
        return;
    }
    let scratch = e2e::scratch("uring-panic");
    let image = common::mkfs(scratch.path(), "panic", 16, &["-t", "ext4"]);
    let mnt = scratch.path().join("mnt");
    over("uring", |options| {
        let mount = JextMount::mount(&image, &mnt, options);
        fs::write(mount.path("kept"), b"committed before the panic").unwrap();
        mount.unmount();
        let env = [("JEXT4_PANIC_AT", "create")];
        let mount = JextMount::try_mount_with_env(&image, &mnt, options, &env)
            .unwrap_or_else(|(output, log)| panic!("mount failed: {output:?}\n{log}"));
        assert_transport(&mnt, "uring");
        let error = fs::File::create(mount.path("half")).unwrap_err();
        assert_eq!(error.raw_os_error(), Some(libc::EIO), "{error}");
        let refused = fs::write(mount.path("after"), b"x").unwrap_err();
        assert_eq!(refused.raw_os_error(), Some(libc::EROFS), "{refused}");
        assert_eq!(
            fs::read(mount.path("kept")).unwrap(),
            b"committed before the panic"
        );
        let log = mount.server_log();
        assert!(
            log.contains("panicked at")
                && log.contains("jext4-uring")
                && log.contains("journal aborted"),
            "the panic on the queue thread is not in the log:\n{log}"
        );
        let output = e2e::run(JEXT4, &["umount", "--timeout", "30", e2e::path_str(&mnt)]);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            !output.status.success() && stderr.contains("journal aborted"),
            "jext4 umount after the abort: {stderr}"
        );
        mount.forget();
        let mount = JextMount::mount(&image, &mnt, options);
        assert!(!mount.path("half").exists());
        assert_eq!(
            fs::read(mount.path("kept")).unwrap(),
            b"committed before the panic"
        );
        mount.unmount();
    });
    e2e::fsck_clean(&image, "after a panic on a queue thread");
}

/// A panic on a queue thread outside any handler (JEXT4_PANIC_AT=uring:
/// the first request the ring carries, before it is decoded): that
/// request fails with EIO, the journal aborts, the queue thread goes on
/// answering (the mount reads, refuses writes, unmounts).
#[test]
fn panic_in_the_ring_outside_a_handler_aborts_the_journal() {
    if !e2e::require_e2e() {
        return;
    }
    let scratch = e2e::scratch("uring-ring-panic");
    let image = common::mkfs(scratch.path(), "panic", 16, &["-t", "ext4"]);
    let mnt = scratch.path().join("mnt");
    over("uring", |options| {
        let env = [("JEXT4_PANIC_AT", "uring")];
        let mount = JextMount::try_mount_with_env(&image, &mnt, options, &env)
            .unwrap_or_else(|(output, log)| panic!("mount failed: {output:?}\n{log}"));
        let error = fs::metadata(mount.path("probe")).unwrap_err();
        assert_eq!(error.raw_os_error(), Some(libc::EIO), "{error}");
        assert!(
            e2e::wait_for(Duration::from_secs(10), || {
                let report = stats(&mnt);
                report.contains("read_only true") && report.contains("journal_aborted true")
            }),
            "jext4 stats does not report the abort:\n{}",
            stats(&mnt)
        );
        assert_transport(&mnt, "uring");
        let refused = fs::write(mount.path("after"), b"x").unwrap_err();
        assert_eq!(refused.raw_os_error(), Some(libc::EROFS), "{refused}");
        let log = mount.server_log();
        assert!(
            log.contains("injected panic")
                && log.contains("a panic in the FUSE io_uring queue thread"),
            "{log}"
        );
        let output = e2e::run(JEXT4, &["umount", "--timeout", "30", e2e::path_str(&mnt)]);
        assert!(!output.status.success() && !e2e::is_mount_point(&mnt));
        mount.forget();
    });
    e2e::fsck_clean(&image, "after a panic in the ring");
}

fn mount_error(image: &Path, mnt: &Path, options: &str, env: &[(&str, &str)]) -> String {
    match JextMount::try_mount_with_env(image, mnt, options, env) {
        Ok(_) => panic!("-o {options} {env:?} mounted"),
        Err((output, _)) => {
            assert!(!e2e::is_mount_point(mnt), "-o {options} left a mount");
            String::from_utf8_lossy(&output.stderr).into_owned()
        }
    }
}

/// `auto` takes io_uring when the kernel offers it and /dev/fuse when not;
/// `uring` refuses to mount without it; a bad transport name and a bad
/// JEXT4_FUSE_OFF name are refused in one line that says what is known.
#[test]
fn transports_are_chosen_and_bad_choices_refused() {
    if !e2e::require_e2e() {
        return;
    }
    let scratch = e2e::scratch("transport-choice");
    let image = common::mkfs(scratch.path(), "choice", 16, &["-t", "ext4"]);
    let mnt: PathBuf = scratch.path().join("mnt");
    let error = mount_error(&image, &mnt, "fuse_transport=fast", &[]);
    assert!(
        error.contains("fuse_transport=fast") && error.contains("auto, dev or uring"),
        "{error}"
    );
    let error = mount_error(&image, &mnt, "", &[("JEXT4_FUSE_OFF", "noflush,bogus")]);
    assert!(
        error.contains("JEXT4_FUSE_OFF")
            && error.contains("bogus")
            && error.contains("killpriv_v2, noflush, long_ttl, negative_entries")
            && error.lines().count() == 1,
        "{error}"
    );
    let Some(off) = ParameterSet::to("N") else {
        return;
    };
    let error = mount_error(&image, &mnt, "fuse_transport=uring", &[]);
    assert!(
        error.contains("fuse_transport=uring")
            && error.contains("enable_uring")
            && error.lines().count() == 1,
        "{error}"
    );
    let mount = JextMount::mount(&image, &mnt, "");
    assert_transport(&mnt, "dev");
    mount.unmount();
    drop(off);
    let _on = ParameterSet::to("Y").expect("the parameter was there a moment ago");
    let mount = JextMount::mount(&image, &mnt, "");
    assert_transport(&mnt, "uring");
    mount.unmount();
    e2e::fsck_clean(&image, "after the transport choices");
}

/// Issue 11: one caller's requests stay with one `/dev/fuse` worker at a
/// time (`fuse/turns.rs`: the turn passes at most once per park limit per
/// parked worker) instead of going round the four, each waking a thread
/// that last ran elsewhere, as they do with the turns switched off
/// (`JEXT4_FUSE_OFF=one_reader`) in the same run.
#[test]
fn one_callers_requests_stay_with_one_dev_fuse_worker() {
    if !e2e::require_e2e() {
        return;
    }
    const REQUESTS: u64 = 2000;
    let scratch = e2e::scratch("turns");
    let cases: [(&[(&str, &str)], bool); 2] =
        [(&[("JEXT4_FUSE_OFF", "one_reader")], false), (&[], true)];
    let mut round_the_workers = 0;
    for (index, (env, one_worker)) in cases.into_iter().enumerate() {
        let image = common::mkfs(
            scratch.path(),
            &format!("turns{index}"),
            16,
            &["-t", "ext4"],
        );
        let mnt = scratch.path().join(format!("mnt{index}"));
        let mount =
            JextMount::try_mount_with_env(&image, &mnt, "fuse_transport=dev,threads=4", env)
                .unwrap_or_else(|(output, log)| panic!("mount {env:?}: {output:?}\n{log}"));
        fs::write(mount.path("file"), b"data").unwrap();
        let path = std::ffi::CString::new(e2e::path_str(&mount.path("file"))).unwrap();
        let name = c"user.missing";
        let before = stats(&mnt);
        for _ in 0..REQUESTS {
            // SAFETY: valid C strings; a null buffer of size 0 asks for the
            // size only. Every call is a GETXATTR request (FUSE caches no
            // extended attributes).
            let size =
                unsafe { libc::getxattr(path.as_ptr(), name.as_ptr(), std::ptr::null_mut(), 0) };
            assert_eq!(size, -1);
            assert_eq!(
                std::io::Error::last_os_error().raw_os_error(),
                Some(libc::ENODATA)
            );
        }
        let after = stats(&mnt);
        let count = |report: &str, name: &str| {
            stat_value(report, name).unwrap_or_else(|| panic!("no {name} in\n{report}"))
        };
        let asked = count(&after, "fuse_op_getxattr") - count(&before, "fuse_op_getxattr");
        assert_eq!(asked, REQUESTS, "{after}");
        let switches =
            count(&after, "fuse_dev_worker_switches") - count(&before, "fuse_dev_worker_switches");
        if one_worker {
            assert!(
                switches * 3 < round_the_workers,
                "{switches} switches, {round_the_workers} without the turns:\n{after}"
            );
            // An fsync waits for its commit on the worker that took it
            // (nothing else is in service): a parked worker is woken to
            // read meanwhile.
            let mut file = fs::OpenOptions::new()
                .append(true)
                .open(mount.path("file"))
                .unwrap();
            for _ in 0..10 {
                file.write_all(b"more").unwrap();
                file.sync_all().unwrap();
            }
            let synced = stats(&mnt);
            assert!(
                count(&synced, "fuse_dev_wakes_for_blocking")
                    > count(&after, "fuse_dev_wakes_for_blocking"),
                "{synced}"
            );
        } else {
            // Round the workers: the longest waiting takes each request,
            // unless the one that answered the last is back in read(2)
            // before it runs (about half of them on the test machine).
            assert!(switches > REQUESTS / 10, "{switches} switches:\n{after}");
            round_the_workers = switches;
        }
        mount.unmount();
        e2e::fsck_clean(&image, "after the getxattr loop");
    }
}
