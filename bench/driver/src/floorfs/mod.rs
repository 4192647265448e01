//! `floorfs`: an in-memory filesystem served over `/dev/fuse` with fuser,
//! asked by the kernel for exactly what jext4 is asked, and doing nothing
//! else: no engine, no journal, no device. Timed beside jext4 and kernel
//! ext4, it is a baseline of the transport on this machine — what a plain
//! FUSE server pays for a workload with no engine at all (issues 9–11);
//! pinned to one CPU with the workload, the floor of any server there.
//!
//! What makes the kernel send the same requests is copied from jext4's
//! FUSE front end (`src/fuse/serve.rs::fuse_config`, `src/fuse/mod.rs`),
//! not imported (this crate does not depend on jext4): the mount options
//! (default_permissions, nodev, nosuid), four `/dev/fuse` workers with
//! cloned descriptors, the INIT capabilities (PARALLEL_DIROPS,
//! DO_READDIRPLUS, HANDLE_KILLPRIV_V2, EXPORT_SUPPORT, POSIX_ACL with
//! DONT_MASK, 1 MiB writes), a one-hour entry and attribute timeout with
//! negative entries, FOPEN_NOFLUSH on every open, and FOPEN_KEEP_CACHE
//! (files) or FOPEN_CACHE_DIR (directories) where an access would not
//! change the atime under relatime. jext4's own `/dev/fuse` read turns
//! (`turns.rs`) and sync pool are engine-side choices it does not copy:
//! fuser's plain worker loop is the floor.
//!
//! The requests are counted per operation; `getfattr -n user.floorfs.stats`
//! on the mount's root reads the counters as JSON, with jext4's names
//! (`fuse_requests`, `fuse_op_lookup`, ...) and the server's CPU time, so
//! bench/run counts requests per file as it does for jext4. The read
//! itself is not counted, and the name is never listed.
//!
//! With `--flush-file`, fsyncs cost what a journaling server must pay: two
//! flushes of the disk under test per group of concurrent fsyncs
//! (`flush.rs`), and the counters add the groups and their members.

mod flush;
mod serve;
mod state;
mod tree;

use std::io;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, UNIX_EPOCH};

use fuser::{
    Config, Errno, FileAttr, FileType, Generation, INodeNo, MountOption, ReplyEmpty, ReplyEntry,
    ReplyXattr, Request, SessionACL,
};

use self::flush::Flush;
use self::tree::{Maker, Tree};

/// jext4's timeout for names (found or not) and attributes.
const TTL: Duration = Duration::from_secs(3600);
/// jext4's largest write (`src/fuse/wire.rs::MAX_WRITE`).
const MAX_WRITE: u32 = 1 << 20;
/// jext4's default `threads=` (`src/fuse/options.rs`).
pub const THREADS_DEFAULT: usize = 4;
/// The virtual attribute of the root that reads the request counters.
const STATS_XATTR: &[u8] = b"user.floorfs.stats";

pub struct Options {
    pub mountpoint: PathBuf,
    pub capacity: u64,
    pub threads: usize,
    /// Read the tree from here at start (if the file is not empty; it is
    /// removed then), write it here at unmount (if the file exists then).
    pub state: Option<PathBuf>,
    /// Answer fsyncs after two fdatasyncs of this file, a group at a time.
    pub flush_file: Option<PathBuf>,
}

/// Mount, serve until unmounted, then write the tree if asked and print
/// the request counters as one JSON line.
pub fn run(options: Options) -> io::Result<()> {
    if options.threads == 0 || options.threads > 64 {
        return Err(invalid("--threads: between 1 and 64 (jext4's bounds)"));
    }
    if options.capacity < tree::BLOCK_SIZE {
        return Err(invalid("--capacity: at least one 4096-byte block"));
    }
    let tree = starting_tree(&options)?;
    let flush = options
        .flush_file
        .as_deref()
        .map(Flush::start)
        .transpose()?;
    let shared = Arc::new(Shared {
        tree: Mutex::new(tree),
        requests: std::array::from_fn(|_| AtomicU64::new(0)),
        flush,
    });
    let floor = FloorFs {
        shared: Arc::clone(&shared),
    };
    let session = fuser::Session::new(floor, &options.mountpoint, &config(options.threads))
        .map_err(|error| {
            io::Error::new(
                error.kind(),
                format!("cannot mount on {}: {error}", options.mountpoint.display()),
            )
        })?;
    // Returns once the kernel ends the session (the mount point was
    // unmounted); fuser then unmounts once more, which fails harmlessly
    // (the harness waits for this process before it mounts there again).
    let served = session.run();
    if let Some(flush) = &shared.flush {
        flush.stop();
    }
    served?;
    if let Some(path) = options.state.as_deref().filter(|path| path.exists()) {
        state::save(&shared.lock(), path)?;
    }
    crate::common::emit(shared.stats_json());
    Ok(())
}

fn starting_tree(options: &Options) -> io::Result<Tree> {
    let saved = options
        .state
        .as_deref()
        .filter(|path| std::fs::metadata(path).is_ok_and(|metadata| metadata.len() > 0));
    let Some(path) = saved else {
        // SAFETY: geteuid and getegid have no preconditions.
        let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
        return Ok(Tree::new(options.capacity, uid, gid));
    };
    let mut tree = state::load(path)?;
    std::fs::remove_file(path)?;
    tree.capacity_blocks = options.capacity / tree::BLOCK_SIZE;
    if tree.used_blocks > tree.capacity_blocks {
        return Err(invalid("--capacity: smaller than the saved tree"));
    }
    Ok(tree)
}

fn invalid(message: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, message)
}

/// jext4's `fuse_config` with its default options.
fn config(threads: usize) -> Config {
    let mut config = Config::default();
    config.mount_options = vec![
        MountOption::DefaultPermissions,
        MountOption::FSName("floorfs".into()),
        MountOption::CUSTOM("subtype=floorfs".into()),
        MountOption::RW,
        MountOption::NoDev,
        MountOption::NoSuid,
    ];
    config.acl = SessionACL::Owner;
    config.n_threads = Some(threads);
    config.clone_fd = true;
    config
}

/// The operations counted.
#[derive(Clone, Copy)]
enum Operation {
    Lookup,
    Forget,
    Getattr,
    Setattr,
    Readlink,
    Symlink,
    Mknod,
    Mkdir,
    Unlink,
    Rmdir,
    Rename,
    Link,
    Open,
    Read,
    Write,
    Statfs,
    Release,
    Fsync,
    Setxattr,
    Getxattr,
    Listxattr,
    Removexattr,
    Flush,
    Opendir,
    Readdir,
    Releasedir,
    Fsyncdir,
    Access,
    Create,
    Fallocate,
    Readdirplus,
}

/// Their names, in `Operation`'s order: jext4's (`src/fuse/metrics.rs`).
const OPERATION_NAMES: [&str; 31] = [
    "lookup",
    "forget",
    "getattr",
    "setattr",
    "readlink",
    "symlink",
    "mknod",
    "mkdir",
    "unlink",
    "rmdir",
    "rename",
    "link",
    "open",
    "read",
    "write",
    "statfs",
    "release",
    "fsync",
    "setxattr",
    "getxattr",
    "listxattr",
    "removexattr",
    "flush",
    "opendir",
    "readdir",
    "releasedir",
    "fsyncdir",
    "access",
    "create",
    "fallocate",
    "readdirplus",
];

/// What the session's workers share: the tree under its one lock, the
/// counters (outside it) and the flush file's group commit if asked.
struct Shared {
    tree: Mutex<Tree>,
    requests: [AtomicU64; OPERATION_NAMES.len()],
    flush: Option<Flush>,
}

impl Shared {
    /// A panic under the lock (a bug) leaves the tree as it was at the
    /// panic; serving on is what a floor needs.
    fn lock(&self) -> MutexGuard<'_, Tree> {
        self.tree
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn stats_json(&self) -> serde_json::Value {
        let mut stats = serde_json::Map::new();
        let mut total = 0;
        for (index, counter) in self.requests.iter().enumerate() {
            let count = counter.load(Ordering::Relaxed);
            total += count;
            stats.insert(format!("fuse_op_{}", OPERATION_NAMES[index]), count.into());
        }
        stats.insert("fuse_requests".into(), total.into());
        stats.insert("fuse_threads_cpu_us".into(), process_cpu_us().into());
        if let Some(flush) = &self.flush {
            flush.stats(&mut stats);
        }
        serde_json::Value::Object(stats)
    }
}

/// User and system CPU time of this process (every thread serves).
fn process_cpu_us() -> u64 {
    // SAFETY: getrusage writes into the zeroed struct it is given.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above; RUSAGE_SELF with a live, writable struct.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) } != 0 {
        return 0;
    }
    let micros = |time: libc::timeval| time.tv_sec as u64 * 1_000_000 + time.tv_usec as u64;
    micros(usage.ru_utime) + micros(usage.ru_stime)
}

pub struct FloorFs {
    shared: Arc<Shared>,
}

fn errno(code: tree::Errno) -> Errno {
    Errno::from_i32(code)
}

/// An entry whose node id is 0: a name that does not exist, which the
/// kernel keeps as a negative dentry for the timeout (as jext4 answers).
fn negative_entry() -> FileAttr {
    FileAttr {
        ino: INodeNo(0),
        size: 0,
        blocks: 0,
        atime: UNIX_EPOCH,
        mtime: UNIX_EPOCH,
        ctime: UNIX_EPOCH,
        crtime: UNIX_EPOCH,
        kind: FileType::RegularFile,
        perm: 0,
        nlink: 0,
        uid: 0,
        gid: 0,
        rdev: 0,
        blksize: 0,
        flags: 0,
    }
}

fn reply_entry(reply: ReplyEntry, result: tree::Result<FileAttr>) {
    match result {
        Ok(attr) => reply.entry(&TTL, &attr, Generation(0)),
        Err(code) => reply.error(errno(code)),
    }
}

fn reply_empty(reply: ReplyEmpty, result: tree::Result<()>) {
    match result {
        Ok(()) => reply.ok(),
        Err(code) => reply.error(errno(code)),
    }
}

fn reply_xattr(reply: ReplyXattr, result: tree::Result<Vec<u8>>, size: u32) {
    match result {
        Ok(value) if size == 0 => reply.size(value.len() as u32),
        Ok(value) if value.len() > size as usize => reply.error(Errno::ERANGE),
        Ok(value) => reply.data(&value),
        Err(code) => reply.error(errno(code)),
    }
}

/// The maker of a new node: the caller, with the umask applied (the kernel
/// leaves it to the server under FUSE_DONT_MASK).
fn maker(request: &Request, mode: u32, umask: u32) -> Maker {
    Maker {
        uid: request.uid(),
        gid: request.gid(),
        mode: (mode & !umask & 0o7777) as u16,
    }
}

impl FloorFs {
    /// Count one request and take the tree's lock. Callers let the guard
    /// go before they reply: the reply's write to /dev/fuse needs no lock.
    fn begin(&self, operation: Operation) -> MutexGuard<'_, Tree> {
        self.count(operation);
        self.shared.lock()
    }

    /// Reply to an fsync of a node that exists: at once, or once its
    /// group's flushes are done with `--flush-file`.
    fn synced(&self, reply: ReplyEmpty, result: tree::Result<()>) {
        match (&self.shared.flush, result) {
            (Some(flush), Ok(())) => flush.join(reply),
            (_, result) => reply_empty(reply, result),
        }
    }

    /// Count a request that needs nothing of the tree.
    fn count(&self, operation: Operation) {
        self.shared.requests[operation as usize].fetch_add(1, Ordering::Relaxed);
    }
}
