//! Access times as the kernel keeps them: for each atime mount option
//! (`relatime`, `strictatime`, `noatime`, `nodiratime`), whether a file
//! read and a directory listing update the atime — on jext4 through FUSE
//! and on a kernel ext4 loop mount of the same kind of image, transcripts
//! identical. (fstests' generic/003 found `nodiratime` taken for `noatime`.)

// The jext4 binary, or the mounts and helpers of tests/common that use it.
#![cfg(feature = "cli")]

mod common;

use common::e2e::{self, JextMount, KernelMount};
use std::ffi::CString;
use std::fs;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// Set `path`'s atime to `seconds` (mtime untouched): an atime older than
/// the last change, which relatime must update on the next access.
fn set_atime(path: &Path, seconds: i64) {
    let c = CString::new(path.as_os_str().as_bytes()).unwrap();
    let times = [
        libc::timespec {
            tv_sec: seconds,
            tv_nsec: 0,
        },
        libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_OMIT,
        },
    ];
    // SAFETY: a valid NUL-terminated path and two timespecs.
    let rc = unsafe { libc::utimensat(libc::AT_FDCWD, c.as_ptr(), times.as_ptr(), 0) };
    assert_eq!(rc, 0, "utimensat {}", path.display());
}

fn atime(path: &Path) -> (i64, i64) {
    let m = fs::metadata(path).unwrap();
    (m.atime(), m.atime_nsec())
}

/// Let the kernel's coarse clock (a jiffy: up to 10 ms) move on, so that
/// an access is stamped later than the change or the access before it on
/// kernel ext4 as on jext4 (whose clock is fine): an atime equal to the
/// mtime counts as older under relatime, and a strictatime update to the
/// same tick would look like no update.
fn after_a_tick() {
    std::thread::sleep(std::time::Duration::from_millis(25));
}

/// Accesses on the mounted filesystem at `root`, each followed by whether
/// it changed the atime.
fn transcript(root: &Path) -> Vec<String> {
    let dir = root.join("d");
    let file = dir.join("f");
    fs::create_dir(&dir).unwrap();
    fs::write(&file, [b'c'; 4096]).unwrap();
    let mut lines = Vec::new();
    let mut step = |what: &str, path: &Path, access: &dyn Fn()| {
        let before = atime(path);
        after_a_tick();
        access();
        let changed = atime(path) != before;
        lines.push(format!(
            "{what}: {}",
            if changed { "updated" } else { "kept" }
        ));
    };
    let read = || drop(fs::read(&file).unwrap());
    let list = || {
        fs::read_dir(&dir).unwrap().for_each(drop);
    };
    set_atime(&file, 1000);
    step("read, atime older than mtime", &file, &read);
    step("read again", &file, &read);
    // A change through the filesystem makes the atime older than it
    // again: the next access updates it under relatime. An overwrite of
    // the whole page leaves it cached and up to date in the kernel, which
    // must not answer the read from it (FOPEN_KEEP_CACHE).
    fs::OpenOptions::new()
        .write(true)
        .open(&file)
        .unwrap()
        .write_all(&[b'd'; 4096])
        .unwrap();
    step("read after a write", &file, &read);
    step("read again after the write", &file, &read);
    set_atime(&file, 1000);
    step("read, atime set older again", &file, &read);
    set_atime(&dir, 1000);
    step("list, atime older than mtime", &dir, &list);
    step("list again", &dir, &list);
    // Likewise a new entry, for a listing (FOPEN_CACHE_DIR).
    fs::write(dir.join("g"), b"").unwrap();
    step("list after a create", &dir, &list);
    step("list again after the create", &dir, &list);
    set_atime(&dir, 1000);
    step("list, atime set older again", &dir, &list);
    lines
}

#[test]
fn atime_options_match_the_kernel() {
    if !e2e::require_e2e() {
        return;
    }
    let scratch = e2e::scratch("atime");
    for options in [
        "relatime",
        "strictatime",
        "noatime",
        "nodiratime",
        "strictatime,nodiratime",
    ] {
        let name = options.replace(',', "-");
        let image = common::mkfs(scratch.path(), &format!("j-{name}"), 16, &["-t", "ext4"]);
        let mnt = scratch.path().join(format!("j-{name}-mnt"));
        let mount = JextMount::mount(&image, &mnt, options);
        let ours = transcript(&mnt);
        mount.unmount();
        e2e::fsck_clean(&image, options);

        let image = common::mkfs(scratch.path(), &format!("k-{name}"), 16, &["-t", "ext4"]);
        let mnt = scratch.path().join(format!("k-{name}-mnt"));
        let kernel = KernelMount::mount_with(&image, &mnt, options);
        let theirs = transcript(&mnt);
        kernel.unmount();
        assert_eq!(ours, theirs, "-o {options}: jext4 (left) vs kernel ext4");
    }
}
