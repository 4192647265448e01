//! Stable file handles: `name_to_handle_at` / `open_by_handle_at`
//! across dropped caches (`echo 2 > /proc/sys/vm/drop_caches` makes the
//! kernel forget the inodes, so decoding a handle reaches the server with
//! a lookup of "." by node id, and of ".." to reconnect a directory).
//! Handles of files and directories that exist keep working — after a
//! rename too; ESTALE only once the inode is really gone or its number was
//! reused. The same steps on a kernel ext4 loop mount give the same
//! transcript.

// The jext4 binary, or the mounts and helpers of tests/common that use it.
#![cfg(feature = "cli")]

mod common;

use common::e2e::{self, JextMount, KernelMount};
use std::ffi::CString;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::io::{AsRawFd, FromRawFd};
use std::path::Path;

/// A file handle as name_to_handle_at returns it.
struct Handle {
    kind: i32,
    bytes: Vec<u8>,
}

const MAX_HANDLE_SZ: usize = 128;

/// `struct file_handle` with room for the largest handle.
#[repr(C)]
struct RawHandle {
    handle_bytes: u32,
    handle_type: i32,
    f_handle: [u8; MAX_HANDLE_SZ],
}

fn name_to_handle(path: &Path) -> Handle {
    let name = CString::new(path.as_os_str().as_bytes()).unwrap();
    let mut raw = RawHandle {
        handle_bytes: MAX_HANDLE_SZ as u32,
        handle_type: 0,
        f_handle: [0; MAX_HANDLE_SZ],
    };
    let mut mount_id = 0;
    // SAFETY: a NUL-terminated path and a handle buffer of the size it says.
    let result = unsafe {
        libc::name_to_handle_at(
            libc::AT_FDCWD,
            name.as_ptr(),
            (&mut raw as *mut RawHandle).cast(),
            &mut mount_id,
            0,
        )
    };
    assert_eq!(
        result,
        0,
        "name_to_handle_at {}: {}",
        path.display(),
        std::io::Error::last_os_error()
    );
    Handle {
        kind: raw.handle_type,
        bytes: raw.f_handle[..raw.handle_bytes as usize].to_vec(),
    }
}

/// open_by_handle_at: the open file, or the errno.
fn open_by_handle(mount: &fs::File, handle: &Handle, flags: i32) -> Result<fs::File, i32> {
    let mut raw = RawHandle {
        handle_bytes: handle.bytes.len() as u32,
        handle_type: handle.kind,
        f_handle: [0; MAX_HANDLE_SZ],
    };
    raw.f_handle[..handle.bytes.len()].copy_from_slice(&handle.bytes);
    // SAFETY: a valid descriptor and a handle as name_to_handle_at made it.
    let fd = unsafe {
        libc::open_by_handle_at(
            mount.as_raw_fd(),
            (&mut raw as *mut RawHandle).cast(),
            flags,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0));
    }
    // SAFETY: a descriptor we own from now on.
    Ok(unsafe { fs::File::from_raw_fd(fd) })
}

fn drop_caches() {
    // SAFETY: sync has no preconditions.
    unsafe { libc::sync() };
    fs::write("/proc/sys/vm/drop_caches", "2").expect("writing drop_caches (needs root)");
}

/// What opening `handle` gives now: the file's content, a directory's
/// entries, or the errno's name.
fn outcome(mount: &fs::File, handle: &Handle, directory: bool) -> String {
    let flags = if directory {
        libc::O_RDONLY | libc::O_DIRECTORY
    } else {
        libc::O_RDONLY
    };
    match open_by_handle(mount, handle, flags) {
        Err(errno) if errno == libc::ESTALE => "ESTALE".into(),
        Err(errno) => format!("errno {errno}"),
        Ok(file) if directory => {
            let path = format!("/proc/self/fd/{}", file.as_raw_fd());
            let mut names: Vec<String> = fs::read_dir(path)
                .unwrap()
                .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            names.sort();
            format!("dir {names:?}")
        }
        Ok(mut file) => {
            let mut text = String::new();
            std::io::Read::read_to_string(&mut file, &mut text).unwrap();
            format!("file {text:?}")
        }
    }
}

/// The steps, on the filesystem at `root`; one line per observation.
fn transcript(root: &Path) -> Vec<String> {
    let mut lines = Vec::new();
    fs::create_dir_all(root.join("a/b")).unwrap();
    fs::write(root.join("a/b/file"), b"content").unwrap();
    fs::write(root.join("doomed"), b"soon gone").unwrap();
    let mount = fs::File::open(root).unwrap();
    let file = name_to_handle(&root.join("a/b/file"));
    let dir = name_to_handle(&root.join("a/b"));
    let top = name_to_handle(root);
    let doomed = name_to_handle(&root.join("doomed"));
    let observe = |when: &str, lines: &mut Vec<String>| {
        drop_caches();
        lines.push(format!("{when}: file {}", outcome(&mount, &file, false)));
        lines.push(format!("{when}: dir {}", outcome(&mount, &dir, true)));
        lines.push(format!("{when}: root {}", outcome(&mount, &top, true)));
        lines.push(format!(
            "{when}: doomed {}",
            outcome(&mount, &doomed, false)
        ));
    };
    observe("fresh", &mut lines);
    observe("again", &mut lines);
    fs::rename(root.join("a/b"), root.join("moved")).unwrap();
    observe("after rename", &mut lines);
    fs::remove_file(root.join("doomed")).unwrap();
    observe("after unlink", &mut lines);
    // New files may take the freed inode number: a new generation.
    for index in 0..8 {
        fs::write(root.join(format!("new{index}")), b"new").unwrap();
    }
    observe("after reuse", &mut lines);
    lines
}

#[test]
fn file_handles_survive_dropped_caches_like_kernel_ext4() {
    if !e2e::require_e2e() {
        return;
    }
    let scratch = e2e::scratch("handles");
    let image = common::mkfs(scratch.path(), "handles", 16, &["-t", "ext4"]);
    let reference = scratch.path().join("kernel.img");
    fs::copy(&image, &reference).unwrap();

    let mnt = scratch.path().join("jext4");
    let mount = JextMount::mount(&image, &mnt, "");
    let jext4 = transcript(&mnt);
    mount.unmount();
    e2e::fsck_clean(&image, "after the file handle steps");

    let kmnt = scratch.path().join("kernel");
    let kernel_mount = KernelMount::mount(&reference, &kmnt, false);
    let kernel = transcript(&kmnt);
    kernel_mount.unmount();

    eprintln!("{}", jext4.join("\n"));
    assert!(
        kernel.iter().any(|line| line.contains("file \"content\"")),
        "{kernel:?}"
    );
    assert!(
        kernel.iter().any(|line| line.contains("ESTALE")),
        "{kernel:?}"
    );
    assert_eq!(
        jext4, kernel,
        "jext4 and kernel ext4 disagree on file handles"
    );
}
