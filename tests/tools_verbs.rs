//! The file verbs on IMAGE:PATH fail as their coreutils namesakes do: the
//! same one-line message (after `jext4 `, the argument as given) and the
//! same exit status, compared with the real coreutils in the C locale on
//! a host directory laid out as the image is. And `jext4 shell`: a
//! failing line is reported with its number and stops the rest, unless -k.

// The jext4 binary, or the mounts and helpers of tests/common that use it.
#![cfg(feature = "cli")]

mod common;
#[path = "tools_support/mod.rs"]
mod tools_support;

use std::path::Path;
use std::process::Command;
use tools_support::{jext4_tool, jext4_with_input};

/// (coreutils command, its arguments; "@" stands for the root: the host
/// directory for coreutils, `IMAGE:` for jext4).
const CASES: &[&[&str]] = &[
    &["rm", "@/nope"],
    &["rm", "@/dir"],
    &["rm", "-f", "@/nope"],
    &["mkdir", "@/dir"],
    &["mkdir", "@/nope/sub"],
    &["mkdir", "-p", "@/dir/new/deeper"],
    &["cat", "@/nope"],
    &["cat", "@/dir"],
    &["ls", "@/nope"],
    &["mv", "@/nope", "@/dir"],
    &["ln", "@/nope", "@/link"],
    &["ln", "-s", "target", "@/file"],
    &["ln", "@/file", "@/file"],
    &["chmod", "zz", "@/file"],
    &["chmod", "644", "@/nope"],
    &["touch", "@/nope/file"],
    &["stat", "@/nope"],
    &["rm", "-r", "@/dir"],
];

#[test]
fn failures_read_as_the_coreutils_write_them() {
    let dir = tempfile::tempdir().unwrap();
    let image = common::mkfs(dir.path(), "verbs", 16, &["-t", "ext4"]);
    let image_root = format!("{}:", image.display());
    for (index, case) in CASES.iter().enumerate() {
        // A fresh layout for every case on both sides: /dir, /file.
        let host = dir.path().join(format!("host{index}"));
        std::fs::create_dir_all(host.join("dir")).unwrap();
        std::fs::write(host.join("file"), b"f").unwrap();
        let script = "rm -r -f /dir /file /link\nmkdir /dir\ntouch /file\n";
        let (code, _, stderr) =
            jext4_with_input(&["shell", image.to_str().unwrap()], script.as_bytes());
        assert_eq!(code, 0, "{stderr}");
        let host_root = host.to_str().unwrap();
        let host_args: Vec<String> = case[1..]
            .iter()
            .map(|a| a.replace('@', host_root))
            .collect();
        let theirs = Command::new(case[0])
            .args(&host_args)
            .env("LC_ALL", "C")
            .output()
            .unwrap();
        let our_args: Vec<String> = case.iter().map(|a| a.replace('@', &image_root)).collect();
        let our_args: Vec<&str> = our_args.iter().map(String::as_str).collect();
        let (code, _, stderr) = jext4_tool(&our_args);
        let ours = stderr
            .replace(&image_root, host_root)
            .replacen("jext4 ", "", 1);
        assert_eq!(
            (code, ours.as_str()),
            (
                theirs.status.code().unwrap(),
                String::from_utf8_lossy(&theirs.stderr).as_ref()
            ),
            "{case:?}"
        );
    }
    common::assert_fsck_clean(&image);
}

#[test]
fn a_failing_shell_line_is_numbered_and_stops_the_rest_unless_k() {
    let dir = tempfile::tempdir().unwrap();
    let image = common::mkfs(dir.path(), "shell", 16, &["-t", "ext4"]);
    let host_file = dir.path().join("host-file");
    std::fs::write(&host_file, b"from the host\n").unwrap();
    let script = format!(
        "# a comment\nmkdir -p /etc/app\ncp {} :/etc/app/config\nrm /nope\ntouch /after\n",
        host_file.display()
    );
    let path = image.to_str().unwrap();
    let (code, _, stderr) = jext4_with_input(&["shell", path], script.as_bytes());
    assert_eq!(code, 1);
    assert!(
        stderr.starts_with(
            "jext4 shell: line 4: rm: cannot remove '/nope': No such file or directory\n"
        ),
        "{stderr}"
    );
    let (code, _, _) = jext4_tool(&["stat", &format!("{path}:/after")]);
    assert_eq!(code, 1, "the line after the failure ran");
    let (code, bytes, _) = jext4_tool(&["cat", &format!("{path}:/etc/app/config")]);
    assert_eq!((code, bytes.as_str()), (0, "from the host\n"));
    let (code, _, _) = jext4_with_input(&["shell", "-k", path], script.as_bytes());
    assert_eq!(code, 1);
    let (code, _, _) = jext4_tool(&["stat", &format!("{path}:/after")]);
    assert_eq!(code, 0, "-k did not go on");
    assert!(!common::journal::dumpe2fs_needs_recovery(&image));
    common::assert_fsck_clean(&image);
}

#[test]
fn an_image_in_use_is_refused_naming_the_holder() {
    let dir = tempfile::tempdir().unwrap();
    let image = common::mkfs(dir.path(), "held", 16, &["-t", "ext4"]);
    // A jext4 shell reading its standard input holds the image.
    let mut holder = Command::new(env!("CARGO_BIN_EXE_jext4"))
        .args(["shell", image.to_str().unwrap()])
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let message = loop {
        let (code, _, stderr) = jext4_tool(&["ls", &format!("{}:/", image.display())]);
        if code != 0 || std::time::Instant::now() > deadline {
            break stderr;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    drop(holder.stdin.take());
    assert!(holder.wait().unwrap().success());
    assert!(
        message.contains(&format!("pid {}", holder.id())),
        "the refusal does not name the holder: {message}"
    );
    assert!(Path::new(&image).exists());
    common::assert_fsck_clean(&image);
}

/// A kernel loop mount holds the image: every verb refuses it with one
/// line naming the mount point, and makes nothing.
#[test]
fn an_image_the_kernel_mounts_is_refused_naming_the_mount() {
    if !common::journal::kernel_available() {
        return;
    }
    let _kernel = common::journal::kernel_lock();
    let dir = tempfile::tempdir().unwrap();
    let image = common::mkfs(dir.path(), "kernel", 16, &["-t", "ext4"]);
    let mount = common::journal::Mount::new(&image, "rw").unwrap();
    let source = dir.path().join("source");
    std::fs::write(&source, b"data").unwrap();
    let target = format!("{}:/copied", image.display());
    let attempts: [&[&str]; 3] = [
        &["ls", &format!("{}:/", image.display())],
        &["cp", "-a", source.to_str().unwrap(), &target],
        &["mkdir", &target],
    ];
    for args in attempts {
        let (code, _, stderr) = jext4_tool(args);
        assert_eq!(code, 1, "jext4 {args:?} did not fail: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "more than one line: {stderr}");
        assert!(
            stderr.contains("mounted by the kernel")
                && stderr.contains(&*mount.point.to_string_lossy()),
            "jext4 {args:?}: the refusal does not name the mount: {stderr}"
        );
    }
    assert!(
        !mount.point.join("copied").exists(),
        "a refused verb wrote the image"
    );
    mount.unmount();
    common::assert_fsck_clean(&image);
}

/// `jext4 stat`'s times read as coreutils' `stat` prints them (TZ=UTC) for
/// the same file on a kernel loop mount: nanoseconds where the inode keeps
/// them, and a birth time of "-" where it has no room for one.
#[test]
fn stat_times_read_as_the_kernels_stat() {
    if !common::e2e::require_e2e() {
        return;
    }
    let scratch = common::e2e::scratch("tools-stat-times");
    for (name, args) in [
        ("inode256", &["-t", "ext4"][..]),
        ("inode128", &["-t", "ext4", "-I", "128"][..]),
    ] {
        let image = common::mkfs(scratch.path(), name, 16, args);
        let path = image.to_str().unwrap();
        let (code, _, stderr) = jext4_tool(&["touch", &format!("{path}:/file")]);
        assert_eq!(code, 0, "{stderr}");
        let (code, ours, stderr) = jext4_tool(&["stat", &format!("{path}:/file")]);
        assert_eq!(code, 0, "{stderr}");
        let mnt = scratch.path().join(format!("{name}.mnt"));
        let kernel = common::e2e::KernelMount::mount(&image, &mnt, true);
        let theirs = Command::new("stat")
            .env("TZ", "UTC")
            .arg(kernel.path("file"))
            .output()
            .unwrap();
        kernel.unmount();
        let times = |text: &str| -> Vec<String> {
            text.lines()
                .filter(|line| {
                    ["Access: 2", "Access: 1", "Modify:", "Change:", " Birth:"]
                        .iter()
                        .any(|start| line.starts_with(start))
                })
                .map(str::to_string)
                .collect()
        };
        let theirs = String::from_utf8_lossy(&theirs.stdout).into_owned();
        assert_eq!(times(&ours), times(&theirs), "{name}:\n{ours}\n{theirs}");
        assert_eq!(times(&ours).len(), 4, "{name}: {ours}");
    }
}
