//! End-to-end helpers: the built `jext4` binary mounting real images through
//! FUSE, kernel loop mounts, guards that always unmount (even when a test
//! panics), tree snapshots that can be compared across mounts, and a copy
//! of a real tree. Split by purpose:
//! - this module: the environment check, commands, scratch directories,
//!   image checks;
//! - `mounts`: jext4 and kernel mounts that always unmount;
//! - `tree`: real trees to copy, snapshots and their comparison;
//! - `files`: small file operations the libc wrappers lack;
//! - `workload`: the mixed workload every variant runs, and its check.
//!
//! Everything here needs root, /dev/fuse and loop devices; [`require_e2e`]
//! says why a test cannot run when one of them is missing.

mod files;
mod mounts;
mod tree;
mod workload;

// One flat namespace for the tests (`e2e::JextMount`, `e2e::snapshot`),
// whichever parts a test binary uses.
#[allow(unused_imports)]
pub use files::*;
#[allow(unused_imports)]
pub use mounts::*;
#[allow(unused_imports)]
pub use tree::*;
#[allow(unused_imports)]
pub use workload::*;

use std::collections::BTreeMap;
use std::ffi::CString;
use std::fs;
use std::hash::{DefaultHasher, Hasher};
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// The binary under test.
pub const JEXT4: &str = env!("CARGO_BIN_EXE_jext4");

/// Tools every end-to-end test uses; CI installs them, so their absence is a
/// failure, not a skip.
const TOOLS: &[&str] = &[
    "mke2fs",
    "e2fsck",
    "debugfs",
    "mount",
    "umount",
    "losetup",
    "fusermount3",
    "dumpe2fs",
    "setfacl",
    "setpriv",
];

/// Why end-to-end tests cannot run here, if they cannot.
pub fn skip_reason() -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("not root: loop mounts and FUSE mounts need root".into());
    }
    match fs::metadata("/dev/fuse") {
        Ok(meta) if meta.file_type().is_char_device() => {}
        _ => return Some("/dev/fuse is missing".into()),
    }
    let has_loop = Path::new("/dev/loop-control").exists()
        || Command::new("losetup")
            .arg("-f")
            .output()
            .is_ok_and(|out| out.status.success());
    if !has_loop {
        return Some("no loop devices (/dev/loop-control is missing)".into());
    }
    None
}

/// True when the test may run; otherwise prints the reason and returns
/// false. Missing tools fail the test instead: CI must have them.
pub fn require_e2e() -> bool {
    if let Some(reason) = skip_reason() {
        return super::skip(&reason);
    }
    for tool in TOOLS {
        assert!(
            super::require_tool(tool),
            "{tool} is needed by the end-to-end tests (apt-get install e2fsprogs fuse3 acl util-linux)"
        );
    }
    true
}

/// A scratch directory that other users can traverse (the non-root tests
/// reach mount points inside it). With `JEXT4_E2E_KEEP=1` it stays after the
/// test, images included, for a look with debugfs.
pub fn scratch(name: &str) -> tempfile::TempDir {
    let prefix = format!("jext4-{name}-");
    let mut builder = tempfile::Builder::new();
    builder.prefix(&prefix);
    if std::env::var_os("JEXT4_E2E_KEEP").is_some() {
        builder.disable_cleanup(true);
    }
    let dir = builder.tempdir().expect("creating a scratch directory");
    set_mode(dir.path(), 0o755);
    dir
}

pub fn set_mode(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).expect("chmod");
}

/// Run a command and return its output (never panics on a non-zero exit).
pub fn run(program: &str, args: &[&str]) -> Output {
    Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|error| panic!("running {program}: {error}"))
}

/// Run a command that must succeed.
pub fn run_ok(program: &str, args: &[&str]) -> Output {
    let output = run(program, args);
    assert!(
        output.status.success(),
        "{program} {args:?} failed ({}):\n{}{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

pub fn path_str(path: &Path) -> &str {
    path.to_str().expect("test paths are UTF-8")
}

/// Is `path` a mount point right now (per /proc/self/mountinfo)?
pub fn is_mount_point(path: &Path) -> bool {
    let wanted = path.canonicalize().unwrap_or_else(|_| path.to_path_buf());
    let wanted = wanted.to_string_lossy().replace(' ', "\\040");
    fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .any(|line| line.split(' ').nth(4) == Some(wanted.as_str()))
}

/// `e2fsck -fn` must find nothing.
pub fn fsck_clean(image: &Path, when: &str) {
    let (code, text) = super::fsck(image);
    assert_eq!(code, 0, "e2fsck -fn {when} reported problems:\n{text}");
}

/// Depth of a file's extent tree, from `debugfs -R "ex PATH"`.
pub fn extent_depth(image: &Path, path_in_fs: &str) -> u32 {
    let output = run_ok(
        "debugfs",
        &["-R", &format!("ex {path_in_fs}"), path_str(image)],
    );
    let text = String::from_utf8_lossy(&output.stdout);
    // Rows start with "LEVEL/ DEPTH", e.g. " 1/ 2   3/ 84 ...".
    text.lines()
        .filter_map(|line| {
            let (level, rest) = line.trim_start().split_once('/')?;
            level.parse::<u32>().ok()?;
            rest.split_whitespace().next()?.parse::<u32>().ok()
        })
        .max()
        .unwrap_or_else(|| panic!("no extent rows in debugfs output:\n{text}"))
}

/// `jext4 stats MOUNTPOINT`: the live server's counters, or after an
/// unmount its last report.
pub fn jext4_stats(mountpoint: &Path) -> String {
    let output = run_ok(JEXT4, &["stats", path_str(mountpoint)]);
    String::from_utf8_lossy(&output.stdout).into_owned()
}
