//! The `jext4` command line: bad arguments, missing or damaged images,
//! unsupported features, unknown options and busy mount points give one
//! clear line and a non-zero exit, never a panic or a leftover mount;
//! `-o ro` refuses writes with EROFS and leaves the image untouched;
//! `fusermount3 -u` unmounts as cleanly as `jext4 umount`.

// The jext4 binary, or the mounts and helpers of tests/common that use it.
#![cfg(feature = "cli")]

mod common;

use common::e2e::{self, JEXT4, JextMount};
use std::fs;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

fn jext4(args: &[&str]) -> Output {
    Command::new(JEXT4)
        .args(args)
        .output()
        .expect("running jext4")
}

/// A refused command: exit status 1, exactly one line on stderr starting
/// with "jext4: " and containing `wanted`, no panic, `mountpoint` not
/// mounted.
fn assert_refused(output: &Output, wanted: &str, mountpoint: &Path) {
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(
        output.status.code(),
        Some(1),
        "exit status; stderr: {stderr}"
    );
    assert!(!stderr.contains("panicked"), "a panic: {stderr}");
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "one line on stderr, got: {stderr}");
    assert!(lines[0].starts_with("jext4: "), "{stderr}");
    assert!(
        lines[0].contains(wanted),
        "stderr should mention {wanted:?}: {stderr}"
    );
    assert!(
        !e2e::is_mount_point(mountpoint),
        "{} was left mounted",
        mountpoint.display()
    );
}

fn setup(name: &str, args: &[&str]) -> (tempfile::TempDir, std::path::PathBuf, std::path::PathBuf) {
    let scratch = e2e::scratch(name);
    let image = common::mkfs(scratch.path(), name, 32, args);
    let mnt = scratch.path().join("mnt");
    fs::create_dir(&mnt).unwrap();
    (scratch, image, mnt)
}

#[test]
fn e2e_cli_bad_arguments() {
    if !e2e::require_e2e() {
        return;
    }
    // Usage errors come from the argument parser: "error: ..." first, a
    // usage hint after, status 2.
    for args in [
        &[][..],
        &["frobnicate"][..],
        &["mount"][..],
        &["mount", "only-an-image"][..],
        &["mount", "-o"][..],
        &["umount"][..],
        &["mount", "--no-such-flag", "a", "b"][..],
    ] {
        let output = jext4(args);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "jext4 {args:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "jext4 {args:?}: {stderr}");
        let first = stderr.lines().next().unwrap_or_default();
        assert!(
            first.starts_with("error: ") || (args.is_empty() && stderr.contains("Usage")),
            "jext4 {args:?}: {stderr}"
        );
    }
}

#[test]
fn e2e_cli_refusals() {
    if !e2e::require_e2e() {
        return;
    }
    let (scratch, image, mnt) = setup("cli-refusals", &["-t", "ext4"]);
    let image_arg = e2e::path_str(&image);
    let mnt_arg = e2e::path_str(&mnt);
    let missing = scratch.path().join("missing.img");
    assert_refused(
        &jext4(&["mount", e2e::path_str(&missing), mnt_arg]),
        "no such file",
        &mnt,
    );
    let no_dir = scratch.path().join("no-such-dir");
    assert_refused(
        &jext4(&["mount", image_arg, e2e::path_str(&no_dir)]),
        "no-such-dir",
        &no_dir,
    );
    assert_refused(
        &jext4(&["mount", "-o", "rw,bogus_option", image_arg, mnt_arg]),
        "bogus_option",
        &mnt,
    );
    assert_refused(
        &jext4(&["mount", "-o", "cache_size=lots", image_arg, mnt_arg]),
        "lots",
        &mnt,
    );
    assert_refused(&jext4(&["umount", mnt_arg]), "not mounted", &mnt);

    // Damaged images: the superblock magic zeroed, a truncated file, an
    // empty file.
    let corrupt = scratch.path().join("corrupt.img");
    fs::copy(&image, &corrupt).unwrap();
    overwrite(&corrupt, 1024 + 56, &[0, 0]);
    assert_refused(
        &jext4(&["mount", e2e::path_str(&corrupt), mnt_arg]),
        "magic",
        &mnt,
    );
    let truncated = scratch.path().join("truncated.img");
    fs::copy(&image, &truncated).unwrap();
    fs::OpenOptions::new()
        .write(true)
        .open(&truncated)
        .unwrap()
        .set_len(8 << 20)
        .unwrap();
    assert_refused(
        &jext4(&["mount", e2e::path_str(&truncated), mnt_arg]),
        "truncated",
        &mnt,
    );
    let empty = scratch.path().join("empty.img");
    fs::write(&empty, b"").unwrap();
    assert_refused(
        &jext4(&["mount", e2e::path_str(&empty), mnt_arg]),
        "too small",
        &mnt,
    );

    // An INCOMPAT feature outside the supported set is named: here an
    // external journal device, which is no filesystem.
    let journal_dev = common::mkfs(
        scratch.path(),
        "journal-dev",
        32,
        &["-O", "journal_dev", "-b", "4096"],
    );
    assert_refused(
        &jext4(&["mount", e2e::path_str(&journal_dev), mnt_arg]),
        "journal_dev",
        &mnt,
    );
    // Nothing above touched the good image.
    e2e::fsck_clean(&image, "after refused mounts");
}

fn overwrite(path: &Path, offset: u64, bytes: &[u8]) {
    use std::os::unix::fs::FileExt;
    let file = fs::OpenOptions::new().write(true).open(path).unwrap();
    file.write_all_at(bytes, offset).unwrap();
}

#[test]
fn e2e_cli_busy() {
    if !e2e::require_e2e() {
        return;
    }
    let (scratch, image, mnt) = setup("cli-busy", &["-t", "ext4"]);
    let other = common::mkfs(scratch.path(), "other", 32, &["-t", "ext4"]);
    let mount = JextMount::mount(&image, &mnt, "");
    fs::write(mount.path("kept"), b"still here").unwrap();
    // The mount point is in use.
    let output = jext4(&["mount", e2e::path_str(&other), e2e::path_str(&mnt)]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("already a mount point"), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    // The image is in use by the first server: a second read-write mount
    // elsewhere is refused.
    let second = scratch.path().join("second");
    fs::create_dir(&second).unwrap();
    assert_refused(
        &jext4(&["mount", e2e::path_str(&image), e2e::path_str(&second)]),
        "in use",
        &second,
    );
    // The first mount is unharmed.
    assert_eq!(fs::read(mount.path("kept")).unwrap(), b"still here");
    mount.unmount();
    e2e::fsck_clean(&image, "after the busy checks");
    e2e::fsck_clean(&other, "the image that was not mounted");
}

#[test]
fn e2e_cli_read_only() {
    if !e2e::require_e2e() {
        return;
    }
    let (_scratch, image, mnt) = setup("cli-ro", &["-t", "ext4"]);
    let mount = JextMount::mount(&image, &mnt, "");
    fs::create_dir(mount.path("dir")).unwrap();
    fs::write(mount.path("dir/file"), b"read me").unwrap();
    mount.unmount();
    let before = e2e::content_digest(&image);

    let mount = JextMount::mount(&image, &mnt, "ro");
    assert_eq!(fs::read(mount.path("dir/file")).unwrap(), b"read me");
    let erofs = |result: std::io::Result<()>, what: &str| {
        let error = result.expect_err(what);
        assert_eq!(error.raw_os_error(), Some(libc::EROFS), "{what}: {error}");
    };
    erofs(fs::write(mount.path("new"), b"x"), "create");
    erofs(
        fs::OpenOptions::new()
            .write(true)
            .open(mount.path("dir/file"))
            .map(drop),
        "open for writing",
    );
    erofs(fs::create_dir(mount.path("newdir")), "mkdir");
    erofs(fs::remove_file(mount.path("dir/file")), "unlink");
    erofs(
        fs::rename(mount.path("dir/file"), mount.path("dir/renamed")),
        "rename",
    );
    erofs(
        e2e::set_xattr(&mount.path("dir/file"), "user.x", b"y"),
        "setxattr",
    );
    erofs(
        std::os::unix::fs::chown(mount.path("dir/file"), Some(1), Some(1)),
        "chown",
    );
    mount.unmount();
    assert_eq!(
        e2e::content_digest(&image),
        before,
        "a read-only mount changed the image"
    );
    e2e::fsck_clean(&image, "after the read-only mount");
}

/// A `jext4 mount --foreground` server owned by the test: killed and
/// lazily unmounted if the test fails before it exits.
struct ForegroundServer {
    child: std::process::Child,
    mountpoint: std::path::PathBuf,
}

impl Drop for ForegroundServer {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = Command::new("fusermount3")
                .args(["-u", "-z"])
                .arg(&self.mountpoint)
                .output();
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

#[test]
fn e2e_cli_fusermount_unmount() {
    if !e2e::require_e2e() {
        return;
    }
    let (_scratch, image, mnt) = setup("cli-fusermount", &["-t", "ext4"]);
    let log = image.with_extension("log");
    let child = Command::new(JEXT4)
        .args(["mount", "--foreground", "--log"])
        .arg(&log)
        .arg(&image)
        .arg(&mnt)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("starting jext4 mount --foreground");
    let mut server = ForegroundServer {
        child,
        mountpoint: mnt.clone(),
    };
    assert!(
        e2e::wait_for(Duration::from_secs(20), || e2e::is_mount_point(&mnt)),
        "the foreground server never mounted: {}",
        fs::read_to_string(&log).unwrap_or_default()
    );
    let data = e2e::pattern(11, 300_000);
    fs::create_dir(mnt.join("dir")).unwrap();
    fs::write(mnt.join("dir/file"), &data).unwrap();
    // The kernel answers a close before the server has seen the RELEASE, and
    // until then the mount is busy: retry EBUSY like a user would.
    let mut unmounted = e2e::run("fusermount3", &["-u", e2e::path_str(&mnt)]);
    for _ in 0..50 {
        if unmounted.status.success()
            || !String::from_utf8_lossy(&unmounted.stderr).contains("busy")
        {
            break;
        }
        std::thread::sleep(Duration::from_millis(40));
        unmounted = e2e::run("fusermount3", &["-u", e2e::path_str(&mnt)]);
    }
    assert!(
        unmounted.status.success(),
        "fusermount3 -u: {}",
        String::from_utf8_lossy(&unmounted.stderr)
    );
    let exited = e2e::wait_for(Duration::from_secs(60), || {
        server.child.try_wait().ok().flatten().is_some()
    });
    assert!(exited, "the server did not exit after fusermount3 -u");
    let status = server.child.wait().unwrap();
    assert!(
        status.success(),
        "server exit status {status}: {}",
        fs::read_to_string(&log).unwrap_or_default()
    );
    assert!(!e2e::is_mount_point(&mnt));
    e2e::fsck_clean(&image, "after fusermount3 -u");
    let dumped = image.with_extension("dump");
    e2e::run_ok(
        "debugfs",
        &[
            "-R",
            &format!("dump /dir/file {}", dumped.display()),
            e2e::path_str(&image),
        ],
    );
    assert_eq!(fs::read(&dumped).unwrap(), data);
}

/// The manual pages and shell completions come from the same definitions
/// as the parser: every command has a page that names its options, and
/// the completion scripts parse in their shells and offer the commands.
#[test]
fn e2e_cli_man_pages_and_completions() {
    let dir = tempfile::tempdir().unwrap();
    let man1 = dir.path().join("man1");
    let made = jext4(&["man", man1.to_str().unwrap()]);
    assert!(
        made.status.success(),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
    let page = |name: &str| {
        fs::read_to_string(man1.join(format!("{name}.1")))
            .unwrap_or_else(|e| panic!("{name}.1: {e}"))
    };
    let main = page("jext4");
    assert!(
        main.starts_with(".ie") || main.contains(".TH jext4 1"),
        "{main}"
    );
    for command in [
        "mount",
        "umount",
        "cp",
        "tar",
        "ls",
        "crashtest",
        "completions",
    ] {
        assert!(main.contains(command), "jext4.1 does not list {command}");
    }
    let mount = page("jext4-mount");
    assert!(mount.contains(".TH jext4-mount 1"), "{mount}");
    assert!(
        mount.contains("foreground") && mount.contains("OPTIONS"),
        "{mount}"
    );
    assert!(page("jext4-cp").contains("archive"));
    if Path::new("/usr/bin/man").exists() {
        let shown = Command::new("man")
            .args(["-l", "-P", "cat"])
            .arg(man1.join("jext4-tar.1"))
            .env("MANWIDTH", "80")
            .output()
            .unwrap();
        assert!(
            shown.status.success(),
            "{}",
            String::from_utf8_lossy(&shown.stderr)
        );
    }

    let bash = jext4(&["completions", "bash"]);
    assert!(bash.status.success());
    let script = dir.path().join("jext4.bash");
    fs::write(&script, &bash.stdout).unwrap();
    let parsed = Command::new("bash")
        .arg("-n")
        .arg(&script)
        .output()
        .unwrap();
    assert!(
        parsed.status.success(),
        "{}",
        String::from_utf8_lossy(&parsed.stderr)
    );
    // Completing `jext4 cra` in bash offers crashtest.
    let completed = Command::new("bash")
        .arg("-c")
        .arg(format!(
            "source {}; COMP_WORDS=(jext4 cra); COMP_CWORD=1; COMP_LINE='jext4 cra'; \
             COMP_POINT=${{#COMP_LINE}}; _jext4 jext4 cra jext4; printf '%s\\n' \"${{COMPREPLY[@]}}\"",
            script.display()
        ))
        .output()
        .unwrap();
    let offered = String::from_utf8_lossy(&completed.stdout);
    assert!(
        offered.lines().any(|l| l == "crashtest"),
        "offered: {offered:?}"
    );
    for shell in ["zsh", "fish"] {
        let out = jext4(&["completions", shell]);
        assert!(out.status.success() && String::from_utf8_lossy(&out.stdout).contains("crashtest"));
    }
    let bad = jext4(&["completions", "tcsh"]);
    assert!(!bad.status.success());
}
