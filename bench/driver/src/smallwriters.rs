//! Many small writers: Tux3's test. `procs` processes, each writing `writes`
//! records of `record_bytes` to its own new file, all at once; then one
//! syncfs(2) of the filesystem. The processes are forked first and released
//! together through a pipe, so the figure is the filesystem's time (from the
//! release to the end of syncfs), not fork's.

use std::ffi::CString;
use std::fs;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::time::Instant;

use serde_json::json;

use crate::common::{at, emit, pattern, syncfs};

/// The child's whole life: wait for the release, write its file, exit with
/// 0, or with the errno of the call that failed (EIO for a short write), so
/// that the parent can tell a full disk (ENOSPC) from anything else.
/// Only async-signal-safe calls here (we are a fork of the driver).
fn child(release: libc::c_int, path: &CString, record: &[u8], writes: usize) -> ! {
    let mut byte = 0u8;
    // SAFETY: plain syscalls on descriptors and buffers this process owns.
    unsafe {
        libc::read(release, (&mut byte as *mut u8).cast(), 1);
        let fd = libc::open(
            path.as_ptr(),
            libc::O_CREAT | libc::O_WRONLY | libc::O_TRUNC,
            0o644,
        );
        if fd < 0 {
            libc::_exit(errno_status());
        }
        for _ in 0..writes {
            let n = libc::write(fd, record.as_ptr().cast(), record.len());
            if n < 0 {
                libc::_exit(errno_status());
            }
            if n != record.len() as isize {
                libc::_exit(libc::EIO);
            }
        }
        libc::_exit(if libc::close(fd) == 0 {
            0
        } else {
            errno_status()
        });
    }
}

/// The calling thread's errno as an exit status (never 0: a failure with
/// errno unset is reported as EIO).
fn errno_status() -> libc::c_int {
    // SAFETY: __errno_location points at this thread's errno.
    match unsafe { *libc::__errno_location() } {
        0 => libc::EIO,
        errno => errno & 0xff,
    }
}

pub fn spawn_all(
    paths: &[CString],
    record: &[u8],
    writes: usize,
) -> io::Result<(libc::c_int, Vec<libc::pid_t>)> {
    let mut pipe = [0 as libc::c_int; 2];
    // SAFETY: pipe() fills the two-element array.
    if unsafe { libc::pipe(pipe.as_mut_ptr()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let [release_read, release_write] = pipe;
    let mut pids = Vec::with_capacity(paths.len());
    for path in paths {
        // SAFETY: the driver is single-threaded here; the child only makes syscalls.
        match unsafe { libc::fork() } {
            -1 => return Err(io::Error::last_os_error()),
            0 => {
                // SAFETY: closing the child's copy of the write end, so the
                // parent's close alone delivers end-of-file.
                unsafe { libc::close(release_write) };
                child(release_read, path, record, writes)
            }
            pid => pids.push(pid),
        }
    }
    // SAFETY: the parent no longer needs the read end.
    unsafe { libc::close(release_read) };
    Ok((release_write, pids))
}

/// Waits for every writer; returns the errno of each one that failed (a
/// writer killed by a signal counts as EINTR).
pub fn wait_all(pids: &[libc::pid_t]) -> io::Result<Vec<i32>> {
    let mut failures = Vec::new();
    for &pid in pids {
        let mut status = 0;
        // SAFETY: waiting for our own child.
        if unsafe { libc::waitpid(pid, &mut status, 0) } != pid {
            return Err(io::Error::last_os_error());
        }
        if !libc::WIFEXITED(status) {
            failures.push(libc::EINTR);
        } else if libc::WEXITSTATUS(status) != 0 {
            failures.push(libc::WEXITSTATUS(status));
        }
    }
    Ok(failures)
}

pub fn run(dir: PathBuf, procs: usize, writes: usize, record_bytes: usize) -> io::Result<()> {
    let own = dir.join("writers");
    fs::create_dir_all(&own).map_err(at(&own))?;
    let paths: Vec<CString> = (0..procs)
        .map(|index| {
            let path = own.join(format!("w{index:05}"));
            CString::new(path.as_os_str().as_bytes()).expect("no NUL in paths")
        })
        .collect();
    let record = pattern(record_bytes, 17);
    let (release, pids) = spawn_all(&paths, &record, writes)?;
    let began = Instant::now();
    // SAFETY: closing the write end releases every child at once.
    unsafe { libc::close(release) };
    let failed = wait_all(&pids)?.len();
    let written = Instant::now();
    syncfs(&own)?;
    let seconds = began.elapsed().as_secs_f64();
    if failed > 0 {
        let detail = format!("{failed} of {procs} writer processes failed");
        return Err(io::Error::other(detail));
    }
    emit(json!({
        "workload": "smallwriters",
        "procs": procs,
        "writes": writes,
        "record_bytes": record_bytes,
        "write_seconds": (written - began).as_secs_f64(),
        "seconds": seconds,
    }));
    Ok(())
}
