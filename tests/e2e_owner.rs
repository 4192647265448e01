//! One owner per image, with the kernel as the other party:
//! jext4 refuses an image that a loop device exposes or that the kernel
//! has mounted, and a loop device whose backing file jext4 already serves;
//! every refusal names the holder. Nothing is written by the refused mount.

// The jext4 binary, or the mounts and helpers of tests/common that use it.
#![cfg(feature = "cli")]

mod common;

use common::e2e::{self, JEXT4, JextMount, KernelMount};
use std::fs;
use std::path::Path;

/// `jext4 mount` must fail with one line containing every `expected` part.
fn assert_refused(image: &Path, mountpoint: &Path, options: &str, expected: &[&str]) {
    fs::create_dir_all(mountpoint).unwrap();
    let mut args = vec!["mount"];
    if !options.is_empty() {
        args.extend(["-o", options]);
    }
    args.extend([e2e::path_str(image), e2e::path_str(mountpoint)]);
    let output = e2e::run(JEXT4, &args);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        !output.status.success(),
        "jext4 mount {} was accepted",
        image.display()
    );
    for part in expected {
        assert!(stderr.contains(part), "refusal lacks {part:?}: {stderr}");
    }
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(!e2e::is_mount_point(mountpoint));
}

struct Loop(String);

impl Loop {
    fn attach(image: &Path, read_only: bool) -> Loop {
        let mut args = vec!["-f", "--show"];
        if read_only {
            args.push("-r");
        }
        args.push(e2e::path_str(image));
        let output = e2e::run_ok("losetup", &args);
        Loop(String::from_utf8_lossy(&output.stdout).trim().to_string())
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        let _ = e2e::run("losetup", &["-d", &self.0]);
    }
}

#[test]
fn loop_devices_and_kernel_mounts_are_refused_by_name() {
    if !e2e::require_e2e() {
        return;
    }
    let scratch = e2e::scratch("owner");
    let image = common::mkfs(scratch.path(), "owner", 32, &["-t", "ext4"]);
    let mnt = scratch.path().join("mnt");
    let before = e2e::content_digest(&image);

    // A loop device over the image: refused read-write, and read-only
    // too while the loop device can write.
    {
        let device = Loop::attach(&image, false);
        assert_refused(
            &image,
            &mnt,
            "",
            &["attached to the loop device", &device.0],
        );
        assert_refused(&image, &mnt, "ro", &[&device.0]);
    }
    // A read-only loop device: a read-only jext4 mount may share it.
    {
        let _device = Loop::attach(&image, true);
        JextMount::mount(&image, &mnt, "ro").unmount();
    }
    assert_eq!(e2e::content_digest(&image), before, "a refused mount wrote");
    // The kernel's loop mount: refused, naming its mount point.
    let kmnt = scratch.path().join("kernel");
    {
        let kernel = KernelMount::mount(&image, &kmnt, false);
        assert_refused(
            &image,
            &mnt,
            "",
            &["mounted by the kernel at", e2e::path_str(&kmnt)],
        );
        kernel.unmount();
    }

    // jext4 serves the image: a loop device over it cannot be served.
    let mount = JextMount::mount(&image, &mnt, "");
    fs::write(mount.path("served"), b"by the first server").unwrap();
    {
        let device = Loop::attach(&image, false);
        let second = scratch.path().join("second");
        let pid = mount.server_pid().to_string();
        assert_refused(
            Path::new(&device.0),
            &second,
            "",
            &["backed by", "in use by pid", &pid],
        );
        assert_refused(
            Path::new(&device.0),
            &second,
            "ro",
            &["in use by pid", &pid],
        );
    }
    assert_eq!(
        fs::read(mount.path("served")).unwrap(),
        b"by the first server"
    );
    mount.unmount();

    // A loop device the kernel has mounted read-write: a read-only jext4
    // mount of the device is refused.
    {
        let device = Loop::attach(&image, false);
        e2e::run_ok("mount", &["-t", "ext4", &device.0, e2e::path_str(&kmnt)]);
        assert_refused(
            Path::new(&device.0),
            &mnt,
            "ro",
            &["mounted read-write by the kernel"],
        );
        assert_refused(
            Path::new(&device.0),
            &mnt,
            "",
            &["mounted by the kernel at"],
        );
        e2e::run_ok("umount", &[e2e::path_str(&kmnt)]);
    }
    e2e::fsck_clean(&image, "after the ownership checks");
}

/// `debugfs -R dump_mmp`'s sequence line.
fn mmp_sequence(image: &Path) -> String {
    let output = e2e::run_ok("debugfs", &["-R", "dump_mmp", e2e::path_str(image)]);
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .find_map(|line| line.strip_prefix("sequence: "))
        .expect("dump_mmp prints the sequence")
        .to_string()
}

const SEQ_CLEAN: &str = "ff4d4d50";

/// An MMP image with the shortest update interval (the kernel still waits
/// 11 s at every mount: its check interval is at least 5 s).
fn mmp_image(scratch: &Path, name: &str) -> std::path::PathBuf {
    let args = ["-t", "ext4", "-O", "mmp", "-E", "mmp_update_interval=1"];
    common::mkfs(scratch, name, 32, &args)
}

/// jext4 holds an MMP image: the kernel's loop mount of it (which the
/// image file's lock cannot stop) waits and refuses; jext4 goes on; its
/// unmount leaves the block clean.
fn kernel_refuses_what_jext4_serves(scratch: &Path) {
    let image = mmp_image(scratch, "mmp-jext4");
    let mnt = scratch.join("jext4-holds");
    let mount = JextMount::mount(&image, &mnt, "");
    fs::write(mount.path("mine"), b"served by jext4").unwrap();
    let kmnt = scratch.join("kernel-tries");
    assert!(
        KernelMount::try_mount_with(&image, &kmnt, "").is_err(),
        "the kernel mounted an image jext4 serves"
    );
    assert!(!e2e::is_mount_point(&kmnt));
    assert_eq!(fs::read(mount.path("mine")).unwrap(), b"served by jext4");
    fs::write(mount.path("after"), b"still writable").unwrap();
    mount.unmount();
    assert_eq!(mmp_sequence(&image), SEQ_CLEAN);
    e2e::fsck_clean(&image, "after the kernel was refused");
    // A clean MMP image mounts in the kernel.
    let kernel = KernelMount::mount(&image, &kmnt, false);
    assert_eq!(fs::read(kernel.path("after")).unwrap(), b"still writable");
    kernel.unmount();
}

/// The kernel holds an MMP image: jext4, reaching the same bytes through a
/// second loop device (as another machine would reach a shared disk, where
/// no lock can help), waits and refuses, naming the kernel's node and
/// device; the kernel's data is untouched.
fn jext4_refuses_what_the_kernel_serves(scratch: &Path) {
    let image = mmp_image(scratch, "mmp-kernel");
    let kmnt = scratch.join("kernel-holds");
    let kernel = KernelMount::mount(&image, &kmnt, false);
    fs::write(kernel.path("kernels"), b"served by the kernel").unwrap();
    let second = Loop::attach(&image, false);
    let mnt = scratch.join("jext4-tries");
    assert_refused(
        Path::new(&second.0),
        &mnt,
        "",
        &[
            "multi-mount protection",
            "in use on another node",
            "node \"",
        ],
    );
    drop(second);
    assert_eq!(
        fs::read(kernel.path("kernels")).unwrap(),
        b"served by the kernel"
    );
    kernel.unmount();
    assert_eq!(mmp_sequence(&image), SEQ_CLEAN);
    e2e::fsck_clean(&image, "after jext4 was refused");
}

/// MMP both ways, the kernel as the other party. Every MMP mount waits as
/// the kernel's does (11 s), so the two directions run side by side.
#[test]
fn mmp_images_are_refused_both_ways_and_mount_when_clean() {
    if !e2e::require_e2e() {
        return;
    }
    let scratch = e2e::scratch("mmp");
    let root = scratch.path().to_path_buf();
    let other = root.clone();
    let jext4_holds = std::thread::spawn(move || kernel_refuses_what_jext4_serves(&other));
    jext4_refuses_what_the_kernel_serves(&root);
    jext4_holds
        .join()
        .expect("the kernel-side direction failed");
}
