//! `chattr` flags answer as the kernel's: the same operations on files and
//! directories made immutable (+i) and append only (+a), and the other
//! flags jext4 keeps (+d, +A, +S, +D, +j), through a kernel loop mount and
//! through a jext4 FUSE mount of twin images; each operation's errno must
//! be the same. For a FUSE mount the kernel cannot check these flags (FUSE
//! passes none), so every answer here is jext4's own.

// The jext4 binary, or the mounts and helpers of tests/common that use it.
#![cfg(feature = "cli")]

mod common;

use common::journal::{Mount, kernel_available, kernel_lock};
use common::server::{Server, fuse_available};
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::process::Command;

fn c_path(path: &Path) -> CString {
    CString::new(path.as_os_str().as_bytes()).unwrap()
}

/// 0, or the errno of the last call.
fn errno_of(result: libc::c_int) -> i32 {
    match result {
        -1 => std::io::Error::last_os_error().raw_os_error().unwrap(),
        _ => 0,
    }
}

fn open_close(path: &Path, flags: libc::c_int) -> i32 {
    let fd = unsafe { libc::open(c_path(path).as_ptr(), flags | libc::O_CLOEXEC, 0o644) };
    if fd < 0 {
        return errno_of(-1);
    }
    let mut result = 0;
    if flags & libc::O_ACCMODE != libc::O_RDONLY {
        let written = unsafe { libc::write(fd, b"more".as_ptr().cast(), 4) };
        result = errno_of(if written < 0 { -1 } else { 0 });
    }
    unsafe { libc::close(fd) };
    result
}

/// `program args...`: 0 or its exit status, and what it printed.
fn run(program: &str, args: &[&str], root: &Path) -> (i32, String) {
    let output = Command::new(program)
        .args(args)
        .current_dir(root)
        .env("LC_ALL", "C")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&output.stdout).into_owned()
        + &String::from_utf8_lossy(&output.stderr);
    (output.status.code().unwrap_or(-1), text)
}

/// The operations, and each one's answer, on the filesystem at `root`.
fn answers(root: &Path) -> Vec<(String, String)> {
    let at = |name: &str| root.join(name);
    let mut out = Vec::new();
    let mut note = |what: &str, answer: i32| out.push((what.to_string(), answer.to_string()));
    for (name, dir) in [
        ("i", false),
        ("a", false),
        ("di", true),
        ("da", true),
        ("p", false),
    ] {
        if dir {
            std::fs::create_dir(at(name)).unwrap();
            std::fs::write(at(name).join("x"), b"x").unwrap();
        } else {
            std::fs::write(at(name), b"contents").unwrap();
        }
    }
    std::fs::write(at("nobodys"), b"n").unwrap();
    std::os::unix::fs::chown(at("nobodys"), Some(65534), Some(65534)).unwrap();
    for (flag, name) in [
        ("+i", "i"),
        ("+a", "a"),
        ("+i", "di"),
        ("+a", "da"),
        ("+dAS", "p"),
    ] {
        let (code, text) = run("chattr", &[flag, name], root);
        assert_eq!(code, 0, "chattr {flag} {name}: {text}");
    }
    let (code, text) = run("lsattr", &["-d", "i", "a", "di", "da", "p"], root);
    note(&format!("lsattr {}", text.replace('\n', "; ")), code);
    let (code, _) = run("chattr", &["+D", "p"], root);
    note("chattr +D on a file", code);
    let (code, _) = run("chattr", &["+D", "da"], root);
    note("chattr +D on a directory", code);
    let (code, _) = run("chattr", &["-D", "da"], root);
    note("chattr -D", code);
    // Without CAP_LINUX_IMMUTABLE, the owner still may not.
    let as_owner = |flag: &str| {
        let setpriv = ["--reuid=65534", "--regid=65534", "--clear-groups"];
        run(
            "setpriv",
            &[&setpriv[..], &["chattr", flag, "nobodys"]].concat(),
            root,
        )
        .0
    };
    note("chattr +i without CAP_LINUX_IMMUTABLE", as_owner("+i"));
    // +j: data journaling, CAP_SYS_RESOURCE's to change.
    note("chattr +j without CAP_SYS_RESOURCE", as_owner("+j"));
    let (code, _) = run("chattr", &["+j", "p"], root);
    note("chattr +j", code);
    std::fs::write(at("p"), b"journaled contents").unwrap();
    let (code, text) = run("lsattr", &["p"], root);
    note(&format!("lsattr {}", text.trim()), code);
    let (code, _) = run("chattr", &["-j", "p"], root);
    note("chattr -j", code);
    note(
        "p: read after +j and -j",
        i32::from(std::fs::read(at("p")).unwrap() != b"journaled contents"),
    );
    note("chattr +d by the owner", as_owner("+d"));
    for name in ["i", "a"] {
        let path = at(name);
        let c = c_path(&path);
        note(
            &format!("{name}: open for reading"),
            open_close(&path, libc::O_RDONLY),
        );
        note(
            &format!("{name}: open for writing"),
            open_close(&path, libc::O_WRONLY),
        );
        note(
            &format!("{name}: open to append"),
            open_close(&path, libc::O_WRONLY | libc::O_APPEND),
        );
        note(
            &format!("{name}: open to truncate"),
            open_close(&path, libc::O_WRONLY | libc::O_APPEND | libc::O_TRUNC),
        );
        note(
            &format!("{name}: truncate"),
            errno_of(unsafe { libc::truncate(c.as_ptr(), 2) }),
        );
        note(
            &format!("{name}: chmod"),
            errno_of(unsafe { libc::chmod(c.as_ptr(), 0o600) }),
        );
        note(
            &format!("{name}: chown"),
            errno_of(unsafe { libc::chown(c.as_ptr(), 5, 5) }),
        );
        note(
            &format!("{name}: times to now"),
            errno_of(unsafe { libc::utimensat(libc::AT_FDCWD, c.as_ptr(), std::ptr::null(), 0) }),
        );
        let times = [libc::timespec {
            tv_sec: 1000,
            tv_nsec: 0,
        }; 2];
        note(
            &format!("{name}: times set"),
            errno_of(unsafe { libc::utimensat(libc::AT_FDCWD, c.as_ptr(), times.as_ptr(), 0) }),
        );
        let xattr = CString::new("user.x").unwrap();
        note(
            &format!("{name}: setxattr"),
            errno_of(unsafe {
                libc::setxattr(c.as_ptr(), xattr.as_ptr(), b"v".as_ptr().cast(), 1, 0)
            }),
        );
        let other = c_path(&at(&format!("{name}-link")));
        note(
            &format!("{name}: link"),
            errno_of(unsafe { libc::link(c.as_ptr(), other.as_ptr()) }),
        );
        note(
            &format!("{name}: rename"),
            errno_of(unsafe { libc::rename(c.as_ptr(), other.as_ptr()) }),
        );
        note(
            &format!("{name}: unlink"),
            errno_of(unsafe { libc::unlink(c.as_ptr()) }),
        );
    }
    for name in ["di", "da"] {
        let dir = at(name);
        let new = c_path(&dir.join("new"));
        let fd = unsafe {
            libc::open(
                new.as_ptr(),
                libc::O_CREAT | libc::O_WRONLY | libc::O_CLOEXEC,
                0o644,
            )
        };
        note(&format!("{name}: create"), errno_of(fd.min(0)));
        if fd >= 0 {
            unsafe { libc::close(fd) };
        }
        let sub = c_path(&dir.join("sub"));
        note(
            &format!("{name}: mkdir"),
            errno_of(unsafe { libc::mkdir(sub.as_ptr(), 0o755) }),
        );
        let x = c_path(&dir.join("x"));
        let moved = c_path(&dir.join("moved"));
        note(
            &format!("{name}: rename within"),
            errno_of(unsafe { libc::rename(x.as_ptr(), moved.as_ptr()) }),
        );
        let out = c_path(&at(&format!("{name}-out")));
        note(
            &format!("{name}: rename out"),
            errno_of(unsafe { libc::rename(x.as_ptr(), out.as_ptr()) }),
        );
        let into = c_path(&dir.join("into"));
        let p = c_path(&at("p"));
        note(
            &format!("{name}: link into"),
            errno_of(unsafe { libc::link(p.as_ptr(), into.as_ptr()) }),
        );
        note(
            &format!("{name}: unlink within"),
            errno_of(unsafe { libc::unlink(x.as_ptr()) }),
        );
        let c = c_path(&dir);
        note(
            &format!("{name}: chmod"),
            errno_of(unsafe { libc::chmod(c.as_ptr(), 0o700) }),
        );
        note(
            &format!("{name}: rmdir"),
            errno_of(unsafe { libc::rmdir(c.as_ptr()) }),
        );
    }
    // Reading still works, and the flags come off again.
    note(
        "i: read",
        i32::from(std::fs::read(at("i")).unwrap() != b"contents"),
    );
    for (flag, name) in [
        ("-i", "i"),
        ("-a", "a"),
        ("-i", "di"),
        ("-a", "da"),
        ("-dAS", "p"),
    ] {
        let (code, text) = run("chattr", &[flag, name], root);
        assert_eq!(code, 0, "chattr {flag} {name}: {text}");
    }
    std::fs::remove_file(at("i")).unwrap();
    std::fs::remove_dir_all(at("di")).unwrap();
    out
}

#[test]
fn chattr_flags_answer_as_the_kernel() {
    if !fuse_available()
        || !kernel_available()
        || !common::require_tool("chattr")
        || !common::require_tool("setpriv")
    {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let kernel_image = common::mkfs(dir.path(), "kernel", 32, &["-t", "ext4"]);
    let jext4_image = common::mkfs(dir.path(), "jext4", 32, &["-t", "ext4"]);
    let kernel = {
        let _kernel = kernel_lock();
        let mount = Mount::new(&kernel_image, "rw").unwrap();
        let answers = answers(&mount.point);
        mount.unmount();
        answers
    };
    let server = Server::start(&jext4_image, "allow_other");
    let ours = answers(&server.mountpoint);
    drop(server.unmount());
    for (theirs, mine) in kernel.iter().zip(&ours) {
        assert_eq!(theirs, mine, "kernel (left) and jext4 (right) differ");
    }
    assert_eq!(kernel.len(), ours.len());
    common::assert_fsck_clean(&kernel_image);
    common::assert_fsck_clean(&jext4_image);
}
