//! The host side of the image tools: the few calls std::fs does not offer
//! (extended attributes, SEEK_DATA/SEEK_HOLE, mknod, lchown, utimensat
//! with nanoseconds), each a thin wrapper over its system call that never
//! follows a final symbolic link.

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::io::AsRawFd;
use std::path::Path;

/// The longest value an xattr may have on Linux (XATTR_SIZE_MAX).
const XATTR_SIZE_MAX: usize = 65536;

fn c_path(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

fn c_name(name: &[u8]) -> io::Result<CString> {
    CString::new(name).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

/// Every extended attribute of `path` (not following a final symlink),
/// names with their namespace prefix, in the order the host lists them.
/// A filesystem without xattrs has none.
pub fn xattrs(path: &Path) -> io::Result<Vec<(Vec<u8>, Vec<u8>)>> {
    let c = c_path(path)?;
    let mut names = vec![0u8; 4096];
    let length = loop {
        // SAFETY: the buffer is valid for names.len() bytes.
        let length =
            unsafe { libc::llistxattr(c.as_ptr(), names.as_mut_ptr().cast(), names.len()) };
        if length >= 0 {
            break length as usize;
        }
        let error = io::Error::last_os_error();
        match error.raw_os_error() {
            Some(libc::ERANGE) if names.len() < 1 << 20 => names.resize(names.len() * 4, 0),
            Some(libc::ENOTSUP) => return Ok(Vec::new()),
            _ => return Err(error),
        }
    };
    let mut found = Vec::new();
    for name in names[..length].split(|&b| b == 0).filter(|n| !n.is_empty()) {
        match xattr(path, name) {
            Ok(value) => found.push((name.to_vec(), value)),
            // Removed between the listing and the read.
            Err(error) if error.raw_os_error() == Some(libc::ENODATA) => {}
            Err(error) => return Err(error),
        }
    }
    Ok(found)
}

/// One extended attribute's value.
pub fn xattr(path: &Path, name: &[u8]) -> io::Result<Vec<u8>> {
    let (c, n) = (c_path(path)?, c_name(name)?);
    let mut value = vec![0u8; XATTR_SIZE_MAX];
    // SAFETY: the buffer is valid for value.len() bytes.
    let length = unsafe {
        libc::lgetxattr(
            c.as_ptr(),
            n.as_ptr(),
            value.as_mut_ptr().cast(),
            value.len(),
        )
    };
    if length < 0 {
        return Err(io::Error::last_os_error());
    }
    value.truncate(length as usize);
    Ok(value)
}

pub fn set_xattr(path: &Path, name: &[u8], value: &[u8]) -> io::Result<()> {
    let (c, n) = (c_path(path)?, c_name(name)?);
    // SAFETY: valid C strings and a value buffer of value.len() bytes.
    let result = unsafe {
        libc::lsetxattr(
            c.as_ptr(),
            n.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    match result {
        0 => Ok(()),
        _ => Err(io::Error::last_os_error()),
    }
}

/// The ranges of `file` (of `size` bytes) that hold data, found with
/// SEEK_DATA and SEEK_HOLE: what a sparse copy reads; holes stay holes.
/// A filesystem without hole reporting answers one range, the whole file.
pub fn data_ranges(file: &std::fs::File, size: u64) -> io::Result<Vec<(u64, u64)>> {
    let fd = file.as_raw_fd();
    let mut ranges = Vec::new();
    let mut offset = 0u64;
    while offset < size {
        // SAFETY: lseek on a descriptor this file owns.
        let data = unsafe { libc::lseek(fd, offset as libc::off_t, libc::SEEK_DATA) };
        if data < 0 {
            let error = io::Error::last_os_error();
            // ENXIO: no data after offset (the rest is a hole).
            if error.raw_os_error() == Some(libc::ENXIO) {
                break;
            }
            return Err(error);
        }
        // SAFETY: as above.
        let hole = unsafe { libc::lseek(fd, data, libc::SEEK_HOLE) };
        if hole < 0 {
            return Err(io::Error::last_os_error());
        }
        let (start, end) = (data as u64, (hole as u64).min(size));
        if start >= end {
            break;
        }
        ranges.push((start, end));
        offset = end;
    }
    Ok(ranges)
}

/// mknod(2) of a FIFO, socket or device node (`mode` with its type bits).
pub fn mknod(path: &Path, mode: u32, rdev: u64) -> io::Result<()> {
    let c = c_path(path)?;
    // SAFETY: a valid C string.
    match unsafe { libc::mknod(c.as_ptr(), mode as libc::mode_t, rdev as libc::dev_t) } {
        0 => Ok(()),
        _ => Err(io::Error::last_os_error()),
    }
}

/// lchown(2): the owner of `path` itself, a symlink's included.
pub fn lchown(path: &Path, uid: u32, gid: u32) -> io::Result<()> {
    let c = c_path(path)?;
    // SAFETY: a valid C string.
    match unsafe { libc::lchown(c.as_ptr(), uid, gid) } {
        0 => Ok(()),
        _ => Err(io::Error::last_os_error()),
    }
}

/// utimensat(2) with AT_SYMLINK_NOFOLLOW: access and modification times,
/// in seconds and nanoseconds, of `path` itself.
pub fn set_times(path: &Path, atime: (i64, u32), mtime: (i64, u32)) -> io::Result<()> {
    let c = c_path(path)?;
    let times = [
        libc::timespec {
            tv_sec: atime.0 as libc::time_t,
            tv_nsec: atime.1 as _,
        },
        libc::timespec {
            tv_sec: mtime.0 as libc::time_t,
            tv_nsec: mtime.1 as _,
        },
    ];
    // SAFETY: a valid C string and an array of two timespecs.
    let result = unsafe {
        libc::utimensat(
            libc::AT_FDCWD,
            c.as_ptr(),
            times.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    match result {
        0 => Ok(()),
        _ => Err(io::Error::last_os_error()),
    }
}

/// The process's umask (read by setting it and putting it back: there is
/// no call that only reads it). Call before starting threads that create
/// files.
pub fn umask() -> u16 {
    // SAFETY: umask has no preconditions.
    let mask = unsafe { libc::umask(0o022) };
    // SAFETY: as above.
    unsafe { libc::umask(mask) };
    mask as u16
}

/// Whether this process may do what root may with files (owners,
/// device nodes, trusted.* attributes): effective uid 0.
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}
