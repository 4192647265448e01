//! The workload both mounts run, written once with `std::fs` against a
//! mount point: a walk that lists every name and stats, reads and lists
//! the xattrs of each entry, a read of `/tree` by an unprivileged caller,
//! then changes aimed at the damage (mkdir, create and write with fsync,
//! creates in the damaged directory, rm of the damaged file, rename into
//! the damaged directory, rmdir, reading back what was written). Every
//! step runs in a thread of its own under a time limit, so a hang is a
//! result ("hang") and not a stuck test; each step's result is recorded.

use super::damage::Plan;
use std::collections::BTreeMap;
use std::ffi::CString;
use std::fs;
use std::io::Write;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

/// A step's time limit: far above what any step takes (the walk of about
/// 5,000 entries takes a second or two through FUSE).
pub const STEP_LIMIT: Duration = Duration::from_secs(60);

/// Bounds on the walk: a directory entry that names an ancestor would
/// otherwise make it endless.
const WALK_ENTRIES_MAX: usize = 50_000;
const WALK_DEPTH_MAX: usize = 16;

/// The uid the unprivileged step reads as: neither root nor the owner
/// (uid 1000) of the files under `/tree`.
const STRANGER: u32 = 65534;

/// How a step ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Done(String),
    Failed(i32),
    Hang,
}

impl Outcome {
    pub fn show(&self) -> String {
        match self {
            Outcome::Done(what) if what.is_empty() => "ok".into(),
            Outcome::Done(what) => format!("ok ({what})"),
            Outcome::Failed(errno) => errno_name(*errno),
            Outcome::Hang => format!("hang (no answer in {STEP_LIMIT:?})"),
        }
    }
}

/// What `lstat` said of an entry: the fields both mounts must agree on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stat {
    pub kind: char,
    pub size: u64,
    pub mode: u32,
    pub nlink: u64,
    pub uid: u32,
    pub gid: u32,
}

#[derive(Debug, Clone)]
pub struct Entry {
    pub stat: Result<Stat, i32>,
    /// Length and CRC32C of a file's content or a link's target.
    pub content: Option<Result<(u64, u32), i32>>,
    /// Number of xattr names (regular files and directories).
    pub xattrs: Option<Result<usize, i32>>,
}

#[derive(Debug, Clone, Default)]
pub struct Listing {
    /// Names in readdir's order ("." and ".." left out).
    pub names: Vec<Vec<u8>>,
    /// The error that ended the listing, if one did.
    pub error: Option<i32>,
}

/// Everything the walk saw.
#[derive(Debug, Clone, Default)]
pub struct Walk {
    pub dirs: BTreeMap<String, Listing>,
    pub entries: BTreeMap<String, Entry>,
    pub truncated: bool,
}

/// The recorded run of the workload on one mount.
#[derive(Debug, Clone, Default)]
pub struct Record {
    pub walk: Option<Walk>,
    pub steps: Vec<(String, Outcome)>,
}

/// Run `work` in a thread of its own, waiting at most `STEP_LIMIT`. A
/// thread that does not answer is left behind (the caller then tears the
/// mount down, which ends its system call).
pub fn timed<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    let (sender, receiver) = mpsc::channel();
    std::thread::Builder::new()
        .name("damage-step".into())
        .spawn(move || {
            let _ = sender.send(work());
        })
        .expect("spawning a step");
    receiver.recv_timeout(STEP_LIMIT).ok()
}

/// Only the walk, for a read-only mount.
pub fn walk_only(root: &Path) -> Result<Walk, ()> {
    let root = root.to_path_buf();
    timed(move || walk(&root)).ok_or(())
}

/// The whole workload. Stops at the first hang (the mount is then dead to
/// the caller).
pub fn run(root: &Path, plan: &Plan) -> Record {
    let mut record = Record::default();
    match walk_only(root) {
        Ok(walk) => record.walk = Some(walk),
        Err(()) => {
            record.steps.push(("walk".into(), Outcome::Hang));
            return record;
        }
    }
    for (name, step) in steps(root, plan) {
        let outcome = timed(step).unwrap_or(Outcome::Hang);
        let hang = outcome == Outcome::Hang;
        record.steps.push((name, outcome));
        if hang {
            break;
        }
    }
    record
}

type Step = Box<dyn FnOnce() -> Outcome + Send>;

/// The steps after the walk, in order, each with its name.
fn steps(root: &Path, plan: &Plan) -> Vec<(String, Step)> {
    let at = |path: &str| root.join(path.trim_start_matches('/'));
    let target = at(&plan.target_dir);
    let written = super::base::pattern(77, 64 << 10);
    let mut steps: Vec<(String, Step)> = Vec::new();
    let tree = at("/tree");
    steps.push((
        "read /tree as uid 65534".into(),
        Box::new(move || read_as_stranger(&tree)),
    ));
    let new_dir = at("/new");
    steps.push((
        "mkdir /new".into(),
        Box::new(move || outcome(fs::create_dir(&new_dir).map(|()| String::new()))),
    ));
    let new_file = at("/new/file");
    let content = written.clone();
    steps.push((
        "create+write+fsync /new/file".into(),
        Box::new(move || outcome(write_file(&new_file, &content))),
    ));
    let dir = target.clone();
    steps.push((
        format!("create 16 files in {}", plan.target_dir),
        Box::new(move || create_files(&dir, 16)),
    ));
    let sub = target.join("made-dir");
    steps.push((
        format!("mkdir {}/made-dir", plan.target_dir),
        Box::new(move || outcome(fs::create_dir(&sub).map(|()| String::new()))),
    ));
    let remove = at(&plan.remove);
    steps.push((
        format!("rm {}", plan.remove),
        Box::new(move || outcome(fs::remove_file(&remove).map(|()| String::new()))),
    ));
    let xattr_file = at("/tree/xattr-b");
    steps.push((
        "setxattr user.workload on /tree/xattr-b".into(),
        Box::new(move || set_xattr(&xattr_file)),
    ));
    let (from, to) = (at("/new/file"), target.join("moved-in"));
    steps.push((
        format!("rename /new/file -> {}/moved-in", plan.target_dir),
        Box::new(move || outcome(fs::rename(&from, &to).map(|()| String::new()))),
    ));
    let empty = at("/tree/empty");
    steps.push((
        "rmdir /tree/empty".into(),
        Box::new(move || outcome(fs::remove_dir(&empty).map(|()| String::new()))),
    ));
    let moved = target.join("moved-in");
    steps.push((
        format!("read back {}/moved-in", plan.target_dir),
        Box::new(move || read_back(&moved, &written)),
    ));
    let root = root.to_path_buf();
    steps.push(("syncfs".into(), Box::new(move || syncfs(&root))));
    steps
}

fn outcome(result: std::io::Result<String>) -> Outcome {
    match result {
        Ok(what) => Outcome::Done(what),
        Err(error) => Outcome::Failed(error.raw_os_error().unwrap_or(libc::EIO)),
    }
}

fn errno_of(error: &std::io::Error) -> i32 {
    error.raw_os_error().unwrap_or(libc::EIO)
}

fn write_file(path: &Path, content: &[u8]) -> std::io::Result<String> {
    let mut file = fs::File::create(path)?;
    file.write_all(content)?;
    file.sync_all()?;
    Ok(String::new())
}

fn create_files(dir: &Path, count: usize) -> Outcome {
    for index in 0..count {
        let path = dir.join(format!("made-{index:02}"));
        if let Err(error) = fs::write(&path, super::base::pattern(index as u64, 1024)) {
            return Outcome::Failed(errno_of(&error));
        }
    }
    Outcome::Done(String::new())
}

fn read_back(path: &Path, expected: &[u8]) -> Outcome {
    match fs::read(path) {
        Ok(bytes) if bytes == expected => Outcome::Done(String::new()),
        Ok(bytes) => Outcome::Done(format!("WRONG CONTENT: {} bytes", bytes.len())),
        Err(error) => Outcome::Failed(errno_of(&error)),
    }
}

fn set_xattr(path: &Path) -> Outcome {
    let path = CString::new(path.as_os_str().as_bytes()).unwrap();
    let value = b"workload-value";
    // SAFETY: both strings are NUL-terminated and the value outlives the call.
    let result = unsafe {
        libc::lsetxattr(
            path.as_ptr(),
            c"user.workload".as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    if result == 0 {
        Outcome::Done(String::new())
    } else {
        Outcome::Failed(errno_of(&std::io::Error::last_os_error()))
    }
}

fn syncfs(root: &Path) -> Outcome {
    let dir = match fs::File::open(root) {
        Ok(dir) => dir,
        Err(error) => return Outcome::Failed(errno_of(&error)),
    };
    // SAFETY: syncfs on a descriptor we own.
    if unsafe { libc::syncfs(std::os::unix::io::AsRawFd::as_raw_fd(&dir)) } == 0 {
        Outcome::Done(String::new())
    } else {
        Outcome::Failed(errno_of(&std::io::Error::last_os_error()))
    }
}

/// List `/tree` and read its regular files with fsuid and fsgid 65534 (in
/// this thread only: setfsuid is per thread on Linux).
fn read_as_stranger(tree: &Path) -> Outcome {
    // SAFETY: setfsgid/setfsuid change only this thread's file-access ids.
    unsafe {
        libc::setfsgid(STRANGER);
        libc::setfsuid(STRANGER);
    }
    let entries = match fs::read_dir(tree) {
        Ok(entries) => entries,
        Err(error) => return Outcome::Failed(errno_of(&error)),
    };
    let (mut listed, mut read) = (0, 0);
    let mut errors = Vec::new();
    for entry in entries {
        let entry = match entry {
            Ok(entry) => entry,
            Err(error) => return Outcome::Failed(errno_of(&error)),
        };
        listed += 1;
        let path = entry.path();
        if fs::symlink_metadata(&path).is_ok_and(|meta| meta.is_file()) {
            match fs::read(&path) {
                Ok(_) => read += 1,
                Err(error) => errors.push(format!(
                    "{}: {}",
                    entry.file_name().to_string_lossy(),
                    errno_name(errno_of(&error))
                )),
            }
        }
    }
    if errors.is_empty() {
        Outcome::Done(format!("{listed} names, {read} files read"))
    } else {
        Outcome::Done(format!(
            "{listed} names, {read} files read; {}",
            errors.join(", ")
        ))
    }
}

/// Breadth first from `root`: every name readdir gives, `lstat` of each,
/// the content of regular files and link targets, xattr names.
pub fn walk(root: &Path) -> Walk {
    let mut walk = Walk::default();
    let mut pending = vec![(String::from("/"), 0usize)];
    let mut next = 0;
    while next < pending.len() {
        let (dir, depth) = pending[next].clone();
        next += 1;
        let listing = list(&root.join(dir.trim_start_matches('/')));
        for name in &listing.names {
            if walk.entries.len() >= WALK_ENTRIES_MAX {
                walk.truncated = true;
                break;
            }
            let child = child_path(&dir, name);
            let entry = examine(&root.join(child.trim_start_matches('/')));
            if matches!(&entry.stat, Ok(stat) if stat.kind == 'd') {
                if depth < WALK_DEPTH_MAX {
                    pending.push((child.clone(), depth + 1));
                } else {
                    walk.truncated = true;
                }
            }
            walk.entries.insert(child, entry);
        }
        walk.dirs.insert(dir, listing);
    }
    walk
}

/// The path of `name` under `dir`, as the walk names it (the bytes of a
/// name that is not UTF-8 are shown lossily).
pub fn child_path(dir: &str, name: &[u8]) -> String {
    let name = String::from_utf8_lossy(name);
    if dir == "/" {
        format!("/{name}")
    } else {
        format!("{dir}/{name}")
    }
}

fn list(dir: &Path) -> Listing {
    let mut listing = Listing::default();
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(error) => {
            listing.error = Some(errno_of(&error));
            return listing;
        }
    };
    for entry in entries {
        match entry {
            Ok(entry) => listing.names.push(entry.file_name().into_vec()),
            Err(error) => {
                listing.error = Some(errno_of(&error));
                break;
            }
        }
        if listing.names.len() > WALK_ENTRIES_MAX {
            listing.error = Some(libc::E2BIG);
            break;
        }
    }
    listing
}

fn examine(path: &Path) -> Entry {
    let stat = fs::symlink_metadata(path)
        .map(|meta| Stat {
            kind: if meta.is_dir() {
                'd'
            } else if meta.is_symlink() {
                'l'
            } else if meta.is_file() {
                'f'
            } else {
                'o'
            },
            size: meta.size(),
            mode: meta.mode(),
            nlink: meta.nlink(),
            uid: meta.uid(),
            gid: meta.gid(),
        })
        .map_err(|error| errno_of(&error));
    let kind = stat.as_ref().map(|stat| stat.kind).unwrap_or('?');
    let content = match kind {
        'f' => Some(fs::read(path)),
        'l' => Some(fs::read_link(path).map(|target| target.into_os_string().into_vec())),
        _ => None,
    }
    .map(|result| {
        result
            .map(|bytes| {
                let sum = jext4::engine::format::csum::crc32c_raw(!0, &bytes);
                (bytes.len() as u64, sum)
            })
            .map_err(|error| errno_of(&error))
    });
    let xattrs = matches!(kind, 'f' | 'd').then(|| list_xattrs(path));
    Entry {
        stat,
        content,
        xattrs,
    }
}

fn list_xattrs(path: &Path) -> Result<usize, i32> {
    let path = CString::new(path.as_os_str().as_bytes()).unwrap();
    let mut buffer = vec![0u8; 64 << 10];
    // SAFETY: the buffer is as long as the length we pass.
    let length =
        unsafe { libc::llistxattr(path.as_ptr(), buffer.as_mut_ptr().cast(), buffer.len()) };
    if length < 0 {
        return Err(errno_of(&std::io::Error::last_os_error()));
    }
    Ok(buffer[..length as usize]
        .iter()
        .filter(|&&byte| byte == 0)
        .count())
}

/// "EUCLEAN" for 117, and so on; the number where the name is unknown.
pub fn errno_name(errno: i32) -> String {
    let name = match errno {
        libc::EPERM => "EPERM",
        libc::ENOENT => "ENOENT",
        libc::EIO => "EIO",
        libc::E2BIG => "E2BIG (too many names)",
        libc::EACCES => "EACCES",
        libc::EEXIST => "EEXIST",
        libc::ENOTDIR => "ENOTDIR",
        libc::EISDIR => "EISDIR",
        libc::EINVAL => "EINVAL",
        libc::EFBIG => "EFBIG",
        libc::ENOSPC => "ENOSPC",
        libc::EROFS => "EROFS",
        libc::EMLINK => "EMLINK",
        libc::ENAMETOOLONG => "ENAMETOOLONG",
        libc::ENOTEMPTY => "ENOTEMPTY",
        libc::ELOOP => "ELOOP",
        libc::ENODATA => "ENODATA",
        libc::EBADMSG => "EBADMSG (bad checksum)",
        libc::EOVERFLOW => "EOVERFLOW",
        libc::EOPNOTSUPP => "EOPNOTSUPP",
        libc::ESTALE => "ESTALE",
        libc::EUCLEAN => "EUCLEAN (corrupt)",
        libc::ENOTCONN => "ENOTCONN",
        libc::ENXIO => "ENXIO",
        _ => return format!("errno {errno}"),
    };
    name.into()
}

/// Errors that say the filesystem found something wrong on disk.
pub fn is_corruption_errno(errno: i32) -> bool {
    matches!(
        errno,
        libc::EUCLEAN | libc::EIO | libc::EBADMSG | libc::ESTALE
    )
}

/// Directories and paths of the walk, for debugfs: every directory the
/// walk could list.
pub fn listed_dirs(walk: &Walk) -> Vec<String> {
    walk.dirs.keys().cloned().collect()
}

pub fn mount_point(dir: &Path, name: &str) -> PathBuf {
    let point = dir.join(name);
    fs::create_dir_all(&point).unwrap();
    point
}
