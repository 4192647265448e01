//! One owner per image: who else holds an image, so that a refusal can
//! name them.
//!
//! Writers exclude each other through `flock` on an image file and
//! `O_EXCL` on a block device (`FileDevice::open`). What those miss, and
//! what is checked here:
//! - a loop device backed by the image (`/sys/block/loopN/loop/
//!   backing_file`): through it the kernel, or a second jext4, writes the
//!   same bytes without touching the file's lock;
//! - a loop device given as the image: its backing file may be what another
//!   jext4 serves, so the backing file is locked too;
//! - the kernel's own mounts of a block device (`/proc/self/mountinfo`),
//!   which a read-only open (no `O_EXCL`) would not notice.
//!
//! The kernel mounting an image through a loop device *after* jext4 took
//! it is beyond these checks: ext4's multi-mount protection (`mmp`) is
//! what stops that.

use std::fmt;
use std::fs::File;
use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

/// A process holding a lock on an image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    pub pid: u32,
    /// Its command line, spaces between the arguments.
    pub command: String,
}

impl fmt::Display for Holder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "pid {} ({})", self.pid, self.command)
    }
}

impl Holder {
    fn of(pid: u32) -> Holder {
        let command = std::fs::read(format!("/proc/{pid}/cmdline"))
            .map(|bytes| {
                let text = String::from_utf8_lossy(&bytes).replace('\0', " ");
                text.trim().to_string()
            })
            .unwrap_or_default();
        let command = if command.is_empty() {
            "command unknown".to_string()
        } else {
            command
        };
        Holder { pid, command }
    }
}

/// The processes holding a `flock` on the file at `path` (from
/// `/proc/locks`, which names the device and inode of each lock).
pub fn flock_holders(path: &Path) -> Vec<Holder> {
    let Ok(metadata) = std::fs::metadata(path) else {
        return Vec::new();
    };
    let wanted = (
        libc::major(metadata.dev()) as u64,
        libc::minor(metadata.dev()) as u64,
        metadata.ino(),
    );
    // `/proc/locks` is a seq_file read a page at a time, each page a fresh
    // walk of the lock list from its index: a lock released between two
    // pages shifts the rest, and one line is skipped. A holder that is
    // there is found by one of a few reads.
    for _ in 0..LOCKS_READS {
        let Ok(locks) = std::fs::read_to_string("/proc/locks") else {
            return Vec::new();
        };
        let mut holders: Vec<Holder> = locks
            .lines()
            .filter_map(parse_lock_line)
            .filter(|(_, id)| *id == wanted)
            .map(|(pid, _)| Holder::of(pid))
            .collect();
        holders.dedup();
        if !holders.is_empty() {
            return holders;
        }
    }
    Vec::new()
}

/// How many times `/proc/locks` is read before a lock is taken to have no
/// holder listed (see `flock_holders`).
const LOCKS_READS: usize = 4;

/// `1: FLOCK  ADVISORY  WRITE 1234 08:01:5678 0 EOF` → (1234, (8, 1, 5678)).
/// Blocked waiters (`1: -> FLOCK ...`) are not holders.
fn parse_lock_line(line: &str) -> Option<(u32, (u64, u64, u64))> {
    let fields: Vec<&str> = line.split_whitespace().collect();
    if fields.get(1) != Some(&"FLOCK") {
        return None;
    }
    let pid = fields.get(4)?.parse().ok()?;
    let mut id = fields.get(5)?.split(':');
    let major = u64::from_str_radix(id.next()?, 16).ok()?;
    let minor = u64::from_str_radix(id.next()?, 16).ok()?;
    let inode = id.next()?.parse().ok()?;
    Some((pid, (major, minor, inode)))
}

/// A loop device and its state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoopDevice {
    pub device: PathBuf,
    pub read_only: bool,
    /// Set to detach itself at its last close (`mount -o loop` sets it).
    pub autoclear: bool,
}

/// How long a self-clearing loop device that nothing mounts may take to
/// go away: the kernel detaches it asynchronously after its last close, so
/// right after `umount` of a kernel loop mount it is still listed.
const AUTOCLEAR_WAIT: std::time::Duration = std::time::Duration::from_secs(3);

/// `loop_devices_backed_by`, after giving self-clearing loop devices that
/// no kernel mount holds the time to finish detaching.
pub fn settled_loop_devices_backed_by(path: &Path) -> Vec<LoopDevice> {
    let started = std::time::Instant::now();
    loop {
        let found = loop_devices_backed_by(path);
        let leaving = |device: &LoopDevice| {
            device.autoclear
                && std::fs::metadata(&device.device)
                    .is_ok_and(|metadata| kernel_mounts_of(metadata.rdev()).is_empty())
        };
        if !found.iter().any(leaving) || started.elapsed() > AUTOCLEAR_WAIT {
            return found;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// The loop devices whose backing file is the file at `path` (same device
/// and inode: a path differing in spelling still matches).
pub fn loop_devices_backed_by(path: &Path) -> Vec<LoopDevice> {
    let Ok(metadata) = std::fs::metadata(path) else {
        return Vec::new();
    };
    let Ok(entries) = std::fs::read_dir("/sys/block") else {
        return Vec::new();
    };
    let mut found = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.starts_with("loop") {
            continue;
        }
        let Some(backing) = backing_file_of(&name) else {
            continue;
        };
        let same = std::fs::metadata(&backing)
            .is_ok_and(|b| b.dev() == metadata.dev() && b.ino() == metadata.ino());
        if same {
            let flag = |file: &str| {
                std::fs::read_to_string(entry.path().join(file))
                    .is_ok_and(|text| text.trim() == "1")
            };
            found.push(LoopDevice {
                device: PathBuf::from("/dev").join(&name),
                read_only: flag("ro"),
                autoclear: flag("loop/autoclear"),
            });
        }
    }
    found
}

/// The backing file of loop device `name` ("loop3"), if it has one.
fn backing_file_of(name: &str) -> Option<PathBuf> {
    let text = std::fs::read_to_string(format!("/sys/block/{name}/loop/backing_file")).ok()?;
    let path = text.trim_end_matches('\n');
    // A deleted backing file cannot be the image anyone opens by name.
    (!path.is_empty() && !path.ends_with(" (deleted)")).then(|| PathBuf::from(path))
}

/// If `metadata` is a loop device's, its backing file.
pub fn loop_backing_file(metadata: &std::fs::Metadata) -> Option<PathBuf> {
    if !metadata.file_type().is_block_device() {
        return None;
    }
    let rdev = metadata.rdev();
    // Loop devices have major 7 (and the extended minors of 259 for
    // partitions are not loop devices themselves): match by sysfs name.
    let name = std::fs::read_link(format!(
        "/sys/dev/block/{}:{}",
        libc::major(rdev),
        libc::minor(rdev)
    ))
    .ok()?;
    let name = name.file_name()?.to_string_lossy().into_owned();
    if !name.starts_with("loop") {
        return None;
    }
    backing_file_of(&name)
}

/// The kernel's mounts of the block device `rdev`: (mount point, mounted
/// read-write).
pub fn kernel_mounts_of(rdev: u64) -> Vec<(PathBuf, bool)> {
    let Ok(mounts) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    let wanted = format!("{}:{}", libc::major(rdev), libc::minor(rdev));
    mounts
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split(' ').collect();
            if fields.get(2) != Some(&wanted.as_str()) {
                return None;
            }
            let options = fields.get(5)?;
            let read_write = options.split(',').any(|option| option == "rw");
            Some((PathBuf::from(fields.get(4)?), read_write))
        })
        .collect()
}

/// How long a claim retries a lock held by someone else before it refuses.
/// A `flock` belongs to the open file, and a process forked by any thread
/// of the one that held it keeps a copy of the descriptor, and with it the
/// lock, until it execs: a program that closes an image and opens it again
/// while another of its threads starts a process (a test binary running
/// e2fsck beside a remount; a library user doing the same) would otherwise
/// be refused for a lock nobody holds a moment later. A real holder holds
/// it for longer than this.
const FORKED_COPY_GRACE: std::time::Duration = std::time::Duration::from_millis(500);

/// Take `flock` on `file` (exclusive for a writer, shared for a reader),
/// waiting at most `FORKED_COPY_GRACE`; a refusal ("in use by pid N
/// (command)") names the holders of the file at `path`.
pub fn lock(file: &File, path: &Path, read_only: bool) -> io::Result<()> {
    lock_within(file, path, read_only, FORKED_COPY_GRACE)
}

fn lock_within(
    file: &File,
    path: &Path,
    read_only: bool,
    grace: std::time::Duration,
) -> io::Result<()> {
    let kind = if read_only {
        libc::LOCK_SH
    } else {
        libc::LOCK_EX
    };
    let started = std::time::Instant::now();
    loop {
        // SAFETY: flock on a valid, owned descriptor; no memory is shared.
        if unsafe { libc::flock(file.as_raw_fd(), kind | libc::LOCK_NB) } == 0 {
            return Ok(());
        }
        let error = io::Error::last_os_error();
        match error.raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::EWOULDBLOCK) => {}
            _ => return Err(error),
        }
        if started.elapsed() >= grace {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    let holders: Vec<String> = flock_holders(path).iter().map(Holder::to_string).collect();
    let by = if holders.is_empty() {
        "another process".to_string()
    } else {
        holders.join(", ")
    };
    Err(io::Error::new(
        io::ErrorKind::ResourceBusy,
        format!("in use by {by}"),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A child forked while the image was claimed keeps the lock until it
    /// exits (or execs): the next claim waits for it instead of refusing.
    /// A holder that stays is still refused, by name. (The child leaves
    /// when the parent closes a pipe, and the claim waits as long as it
    /// takes: nothing here depends on timing.)
    #[test]
    fn a_claim_waits_out_a_forked_copy_and_refuses_a_real_holder() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("image");
        std::fs::write(&path, [0u8; 4096]).unwrap();
        let first = File::open(&path).unwrap();
        lock(&first, &path, false).unwrap();
        let mut ends = [0; 2];
        // SAFETY: a two-int array for pipe(2) to fill.
        assert_eq!(unsafe { libc::pipe(ends.as_mut_ptr()) }, 0);
        // SAFETY: the child only closes, reads and exits (async-signal-safe).
        let child = unsafe { libc::fork() };
        assert!(child >= 0, "fork: {}", io::Error::last_os_error());
        if child == 0 {
            // SAFETY: as above; _exit skips the parent's atexit handlers.
            // Every descriptor but the pipe's read end and the lock's is
            // closed: the tests around this one run in threads of the same
            // process, and a copy of their images' descriptors kept here
            // would keep their locks too.
            unsafe {
                let keep = [ends[0], first.as_raw_fd()];
                for fd in 3..1024 {
                    if !keep.contains(&fd) {
                        libc::close(fd);
                    }
                }
                let mut byte = 0u8;
                libc::read(ends[0], (&mut byte as *mut u8).cast(), 1);
                libc::_exit(0);
            }
        }
        drop(first);
        // SAFETY: the parent's ends of the pipe it made, closed once each:
        // the child's read returns, and it exits.
        unsafe {
            libc::close(ends[0]);
            libc::close(ends[1]);
        }
        let again = File::open(&path).unwrap();
        let claimed = lock_within(&again, &path, false, std::time::Duration::from_secs(120));
        let mut status = 0;
        // SAFETY: waits for the child forked above, into a live int.
        assert_eq!(unsafe { libc::waitpid(child, &mut status, 0) }, child);
        claimed.expect("the forked copy's lock went with the child");
        let second = File::open(&path).unwrap();
        let refused = lock(&second, &path, false).unwrap_err();
        assert_eq!(refused.kind(), io::ErrorKind::ResourceBusy);
        assert!(refused.to_string().contains("in use by pid"), "{refused}");
    }

    #[test]
    fn reads_proc_locks_lines() {
        assert_eq!(
            parse_lock_line("1: FLOCK  ADVISORY  WRITE 1234 08:01:5678 0 EOF"),
            Some((1234, (8, 1, 5678)))
        );
        assert_eq!(
            parse_lock_line("2: FLOCK  ADVISORY  READ 77 fd:0a:99 0 EOF"),
            Some((77, (0xfd, 0x0a, 99)))
        );
        assert_eq!(
            parse_lock_line("3: POSIX  ADVISORY  WRITE 1 08:01:5 0 EOF"),
            None
        );
        assert_eq!(
            parse_lock_line("1: -> FLOCK  ADVISORY  WRITE 9 08:01:5678 0 EOF"),
            None
        );
    }

    #[test]
    fn names_the_holder_of_a_lock() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("image");
        std::fs::write(&path, b"x").unwrap();
        let first = File::options().read(true).write(true).open(&path).unwrap();
        lock(&first, &path, false).unwrap();
        let second = File::options().read(true).write(true).open(&path).unwrap();
        let error = lock(&second, &path, false).unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::ResourceBusy);
        let me = std::process::id().to_string();
        assert!(error.to_string().contains(&format!("pid {me}")), "{error}");
        // Readers share; a reader excludes a writer.
        drop(first);
        let reader = File::open(&path).unwrap();
        lock(&reader, &path, true).unwrap();
        let another_reader = File::open(&path).unwrap();
        lock(&another_reader, &path, true).unwrap();
        assert!(lock(&second, &path, false).is_err());
    }
}
