//! Many small writers: Tux3's test. `procs` processes, each writing `writes`
//! records of `record_bytes` to its own new file, all at once; then one
//! syncfs(2) of the filesystem. The processes are forked first and released
//! together through a pipe, so the figure is the filesystem's time (from the
//! release to the end of syncfs), not fork's.

use std::ffi::CString;
use std::fs::{self, File};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::io::AsRawFd;
use std::path::PathBuf;
use std::time::Instant;

use serde_json::json;

use crate::common::{at, emit, pattern};

/// The child's whole life: wait for the release, write its file, exit.
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
            libc::_exit(2);
        }
        for _ in 0..writes {
            let n = libc::write(fd, record.as_ptr().cast(), record.len());
            if n != record.len() as isize {
                libc::_exit(3);
            }
        }
        libc::_exit(if libc::close(fd) == 0 { 0 } else { 4 });
    }
}

fn spawn_all(
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

fn wait_all(pids: &[libc::pid_t]) -> io::Result<usize> {
    let mut failed = 0;
    for &pid in pids {
        let mut status = 0;
        // SAFETY: waiting for our own child.
        if unsafe { libc::waitpid(pid, &mut status, 0) } != pid {
            return Err(io::Error::last_os_error());
        }
        if !(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0) {
            failed += 1;
        }
    }
    Ok(failed)
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
    let failed = wait_all(&pids)?;
    let written = Instant::now();
    let directory = File::open(&own).map_err(at(&own))?;
    // SAFETY: syncfs on an open descriptor of the filesystem under test.
    if unsafe { libc::syncfs(directory.as_raw_fd()) } != 0 {
        return Err(at(&own)(io::Error::last_os_error()));
    }
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
