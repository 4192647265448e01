//! Small file operations the standard library lacks (times, exchange,
//! mknod, syncfs, statvfs), data patterns, waiting.

use super::*;

/// utimensat with nanoseconds, not following a final symlink.
pub fn set_times(path: &Path, atime: (i64, i64), mtime: (i64, i64)) {
    let c_path = CString::new(path.as_os_str().as_bytes()).expect("path without NUL");
    let times = [
        libc::timespec {
            tv_sec: atime.0,
            tv_nsec: atime.1,
        },
        libc::timespec {
            tv_sec: mtime.0,
            tv_nsec: mtime.1,
        },
    ];
    // SAFETY: valid path and a two-element timespec array.
    let result = unsafe {
        libc::utimensat(
            libc::AT_FDCWD,
            c_path.as_ptr(),
            times.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    assert_eq!(
        result,
        0,
        "utimensat {}: {}",
        path.display(),
        std::io::Error::last_os_error()
    );
}

/// renameat2 with RENAME_EXCHANGE.
pub fn exchange(a: &Path, b: &Path) {
    let ca = CString::new(a.as_os_str().as_bytes()).expect("path without NUL");
    let cb = CString::new(b.as_os_str().as_bytes()).expect("path without NUL");
    // SAFETY: valid NUL-terminated paths.
    let result = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            ca.as_ptr(),
            libc::AT_FDCWD,
            cb.as_ptr(),
            libc::RENAME_EXCHANGE,
        )
    };
    assert_eq!(
        result,
        0,
        "renameat2(EXCHANGE) {} {}: {}",
        a.display(),
        b.display(),
        std::io::Error::last_os_error()
    );
}

/// mknod for fifos and device nodes.
pub fn mknod(path: &Path, mode: u32, rdev: u64) {
    let c_path = CString::new(path.as_os_str().as_bytes()).expect("path without NUL");
    // SAFETY: a valid path.
    let result = unsafe { libc::mknod(c_path.as_ptr(), mode, rdev) };
    assert_eq!(
        result,
        0,
        "mknod {}: {}",
        path.display(),
        std::io::Error::last_os_error()
    );
}

/// syncfs on the filesystem holding `path`.
pub fn syncfs(path: &Path) {
    let file = fs::File::open(path).expect("opening for syncfs");
    // SAFETY: a descriptor we own.
    assert_eq!(unsafe { libc::syncfs(file.as_raw_fd()) }, 0, "syncfs");
}

/// A deterministic byte pattern, different per `seed`.
pub fn pattern(seed: u64, length: usize) -> Vec<u8> {
    jext4::engine::rng::Rng::derive(seed, "pattern").bytes(length)
}

pub fn read_all(path: &Path) -> Vec<u8> {
    let mut data = Vec::new();
    fs::File::open(path)
        .and_then(|mut file| file.read_to_end(&mut data))
        .unwrap_or_else(|error| panic!("reading {}: {error}", path.display()));
    data
}

/// Wait until `condition` holds, up to `limit`.
pub fn wait_for(limit: Duration, mut condition: impl FnMut() -> bool) -> bool {
    let start = std::time::Instant::now();
    while start.elapsed() < limit {
        if condition() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    condition()
}

/// statvfs: (block size, free blocks, blocks available to non-root).
pub fn statvfs(path: &Path) -> (u64, u64, u64) {
    let c_path = CString::new(path.as_os_str().as_bytes()).expect("path without NUL");
    // SAFETY: zeroed is a valid statvfs; the call fills it.
    let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: valid path and out pointer.
    let result = unsafe { libc::statvfs(c_path.as_ptr(), &mut stat) };
    assert_eq!(result, 0, "statvfs: {}", std::io::Error::last_os_error());
    (
        stat.f_frsize as u64,
        stat.f_bfree as u64,
        stat.f_bavail as u64,
    )
}

/// statvfs counts to compare with the kernel's: [f_bsize, f_blocks,
/// f_bfree, f_bavail, f_files, f_ffree].
pub fn statfs_counts(path: &Path) -> [u64; 6] {
    let c_path = CString::new(path.as_os_str().as_bytes()).expect("path without NUL");
    // SAFETY: zeroed is a valid statvfs; the call fills it.
    let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: valid path and out pointer.
    let result = unsafe { libc::statvfs(c_path.as_ptr(), &mut stat) };
    assert_eq!(result, 0, "statvfs: {}", std::io::Error::last_os_error());
    [
        stat.f_frsize as u64,
        stat.f_blocks as u64,
        stat.f_bfree as u64,
        stat.f_bavail as u64,
        stat.f_files as u64,
        stat.f_ffree as u64,
    ]
}

/// (extents, tree depth) of each file of `paths` in `image`, from one
/// `debugfs -f` run of `ex` commands (rows "LEVEL/ DEPTH ...": the leaf
/// rows, at level == depth, are the extents).
pub fn file_extents(image: &Path, paths: &[String]) -> Vec<(usize, u32)> {
    let commands: String = paths.iter().map(|path| format!("ex {path}\n")).collect();
    let list = image.with_extension("ex");
    std::fs::write(&list, commands).unwrap();
    let output = super::run_ok(
        "debugfs",
        &["-f", super::path_str(&list), super::path_str(image)],
    );
    let text = String::from_utf8_lossy(&output.stdout);
    let mut files: Vec<(usize, u32)> = Vec::new();
    for line in text.lines() {
        if line.starts_with("debugfs:") {
            files.push((0, 0));
            continue;
        }
        let Some((level, rest)) = line.trim_start().split_once('/') else {
            continue;
        };
        let (Ok(level), Some(Ok(depth))) = (
            level.parse::<u32>(),
            rest.split_whitespace().next().map(str::parse::<u32>),
        ) else {
            continue;
        };
        let file = files.last_mut().expect("a row before any command");
        file.1 = file.1.max(depth);
        if level == depth {
            file.0 += 1;
        }
    }
    assert_eq!(files.len(), paths.len(), "debugfs answered:\n{text}");
    assert!(files.iter().all(|&(extents, _)| extents > 0), "{text}");
    files
}

/// The bytes of round `round` of blurt-style appends to inode `ino`.
pub fn appended(ino: u32, round: u64, chunk: usize) -> Vec<u8> {
    pattern(ino as u64 * 100 + round, chunk)
}

/// blurt's appends through the library, as root: for each round of
/// `rounds`, `chunk` bytes (`appended`'s) to each of `files` in turn, at
/// `round * chunk`; each write must be whole.
pub fn append_in_turn(
    fs: &jext4::engine::fs::Fs,
    files: &[u32],
    rounds: std::ops::Range<u64>,
    chunk: usize,
) {
    for round in rounds {
        for &ino in files {
            let at = round * chunk as u64;
            let data = appended(ino, round, chunk);
            let written = fs
                .write(ino, at, &data, jext4::engine::fs::Caller::ROOT)
                .unwrap();
            assert_eq!(written, chunk, "append of round {round} to inode {ino}");
        }
    }
}
