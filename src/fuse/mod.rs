//! The FUSE front end: translates kernel requests into `fs::Fs` calls and
//! results into replies. No filesystem logic lives here, so that the FUSE
//! mount and the library API behave identically.
//!
//! Two transports carry the requests, behind one adapter (`FuseAdapter`,
//! its handlers generic over the answer: `answer.rs`): `/dev/fuse`
//! (`dev.rs`, fuser's session) and FUSE over io_uring (`uring.rs`). fuser
//! 0.18 has no io_uring transport, and its request decoder and reply
//! encoder are private (`ll`, `ReplySender` and the reply constructors
//! are crate-internal), so nothing of it can be fed a request that came
//! from a ring. Rather than decode `/dev/fuse` ourselves too, fuser keeps
//! that path (mount, FUSE_INIT, its tested decoder, notifications), and
//! `wire.rs` decodes and encodes only what the ring carries for the
//! operations served here — a ring entry splits a request into header,
//! operation header and payload anyway. Every handler, engine call, metric
//! and panic rule is written once, here.
//!
//! Inode numbers: FUSE calls the root 1, ext4 calls it 2; ext4's inode 1
//! (bad blocks) is never reachable by name, so the two are simply swapped.
//! Permission checks are the kernel's (`default_permissions`), POSIX ACLs
//! included (`FUSE_POSIX_ACL`); what that leaves to the server — default
//! ACL inheritance, the umask, the mode following the ACL and back — is the
//! engine's (`fs::acl`), so the library API behaves the same.

pub mod answer;
pub mod control;
mod dev;
pub mod helper;
pub mod interrupts;
pub mod metrics;
mod options;
mod pace;
pub mod serve;
mod sync_pool;
mod turns;
mod uring;
mod wire;

pub use options::{FuseOptions, FuseTransport, parse_mount_options, parse_sb, parse_size};

use self::answer::{
    AttrAnswer, CreateAnswer, DataAnswer, DirectoryAnswer, DirectoryPlusAnswer, EmptyAnswer,
    EntryAnswer, IoctlAnswer, LseekAnswer, OpenAnswer, Origin, StatfsAnswer, StatfsFigures,
    WriteAnswer, XattrAnswer,
};
use self::metrics::{Operation, RequestClock, RequestMetrics};
use crate::error::Error;
use crate::format::inode::Timestamp;
use crate::format::superblock::ROOT_INO;
use crate::fs::{Attr, Caller, FileKind, Fs, RenameFlags, SeekWhence, SetAttr, TimeSet, XattrMode};
use fuser::{
    Errno, FileAttr, FileHandle, FileType, FopenFlags, Generation, INodeNo, InitFlags,
    KernelConfig, TimeOrNow, WriteFlags,
};
use parking_lot::Mutex;
use std::collections::HashSet;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// How long the kernel may cache names (found or not) and attributes.
/// jext4 owns the image (the device layer refuses a second writer) and
/// every change goes through the kernel, which invalidates what the change
/// affects; where the engine changes more than the kernel can tell (a
/// write that drops setuid, an ACL that changes the mode, an fallocate
/// that fails part-way), the adapter invalidates it (`attributes_changed`).
/// Hence a long timeout: libfuse's default of 1 s made the kernel ask again
/// for every directory and file a long walk or untar came back to.
const TTL: Duration = Duration::from_secs(3600);

/// The libfuse default, for measuring what the long timeout saves.
const SHORT_TTL: Duration = Duration::from_secs(1);

/// The round-trip savers the adapter asks of the kernel. Each can be
/// switched off for a measurement with `JEXT4_FUSE_OFF=NAME,...` in the
/// server's environment (docs/performance.md, "Where the time goes").
#[derive(Debug, Clone, Copy)]
struct Tuning {
    /// FUSE_HANDLE_KILLPRIV_V2: the engine drops setuid, setgid and file
    /// capabilities on write, truncate and chown, so the kernel stops
    /// asking getxattr("security.capability") before writes.
    killpriv_v2: bool,
    /// FOPEN_NOFLUSH: no FLUSH on close (writes are write-through: a flush
    /// has no deferred error to report, release does the rest).
    noflush: bool,
    /// The long TTL instead of libfuse's 1 s.
    long_ttl: bool,
    /// ENOENT lookups answered as negative entries the kernel may cache.
    negative_entries: bool,
    /// FOPEN_KEEP_CACHE on files and FOPEN_CACHE_DIR on directories
    /// whose atime an access would not change (`FuseAdapter::open_flags`).
    keep_cache: bool,
    /// One `/dev/fuse` worker reads while nothing needs a second
    /// (`turns.rs`).
    one_reader: bool,
}

impl Tuning {
    const NAMES: [&str; 6] = [
        "killpriv_v2",
        "noflush",
        "long_ttl",
        "negative_entries",
        "keep_cache",
        "one_reader",
    ];

    /// The savers `JEXT4_FUSE_OFF` leaves on; an unknown name is refused
    /// (a typo must not measure the wrong thing).
    fn from_env() -> crate::Result<Tuning> {
        Tuning::parse(&std::env::var("JEXT4_FUSE_OFF").unwrap_or_default())
    }

    fn parse(off: &str) -> crate::Result<Tuning> {
        let mut tuning = Tuning {
            killpriv_v2: true,
            noflush: true,
            long_ttl: true,
            negative_entries: true,
            keep_cache: true,
            one_reader: true,
        };
        for name in off
            .split(',')
            .map(str::trim)
            .filter(|name| !name.is_empty())
        {
            match name {
                "killpriv_v2" => tuning.killpriv_v2 = false,
                "noflush" => tuning.noflush = false,
                "long_ttl" => tuning.long_ttl = false,
                "negative_entries" => tuning.negative_entries = false,
                "keep_cache" => tuning.keep_cache = false,
                "one_reader" => tuning.one_reader = false,
                unknown => {
                    return Err(Error::Invalid(format!(
                        "JEXT4_FUSE_OFF: unknown name {unknown:?} (known: {})",
                        Tuning::NAMES.join(", ")
                    )));
                }
            }
        }
        if !off.trim().is_empty() {
            tracing::info!(?tuning, "FUSE round-trip savers");
        }
        Ok(tuning)
    }

    fn ttl(&self) -> &'static Duration {
        if self.long_ttl { &TTL } else { &SHORT_TTL }
    }

    fn open_flags(&self) -> FopenFlags {
        if self.noflush {
            FopenFlags::FOPEN_NOFLUSH
        } else {
            FopenFlags::empty()
        }
    }
}

/// Entries listed per readdirplus request before reading their attributes;
/// more than a reply buffer holds, so a reply is always full or final.
const READDIRPLUS_BATCH: usize = 512;

pub struct FuseAdapter {
    fs: Arc<Fs>,
    /// Set once the session exists: lets a handler tell the kernel that
    /// attributes it caches changed behind its back (an ACL changing the
    /// mode).
    notifier: Arc<OnceLock<fuser::Notifier>>,
    /// Requests by operation, their latency and where it went.
    metrics: Arc<RequestMetrics>,
    tuning: Tuning,
    /// Whether the kernel took FUSE_HANDLE_KILLPRIV_V2 (set by `init`,
    /// before any other request): then a write tells whether the caller
    /// keeps setuid and setgid.
    killpriv_v2: AtomicBool,
    /// Whether the kernel took FUSE_POSIX_ACL (set by `init`).
    posix_acl: AtomicBool,
    /// Inodes whose data may differ from the pages the kernel keeps (a
    /// fallocate or truncate that failed part-way): their next open gets no
    /// FOPEN_KEEP_CACHE, so the kernel drops the pages then. At most one
    /// entry per inode; a leaf lock (nothing is taken under it).
    stale_pages: Mutex<HashSet<u32>>,
}

impl FuseAdapter {
    /// Fails only on a bad `JEXT4_FUSE_OFF`.
    pub fn new(
        fs: Arc<Fs>,
        notifier: Arc<OnceLock<fuser::Notifier>>,
        metrics: Arc<RequestMetrics>,
    ) -> crate::Result<Self> {
        Ok(FuseAdapter {
            fs,
            notifier,
            metrics,
            tuning: Tuning::from_env()?,
            killpriv_v2: AtomicBool::new(false),
            posix_acl: AtomicBool::new(false),
            stale_pages: Mutex::new(HashSet::new()),
        })
    }

    /// Whether one `/dev/fuse` worker reads at a time (`turns.rs`).
    fn one_reader(&self) -> bool {
        self.tuning.one_reader
    }

    pub fn metrics(&self) -> &RequestMetrics {
        &self.metrics
    }

    /// A bug outside any handler (in a transport): abort the journal, as
    /// a handler's panic does (`guard`).
    pub fn abort(&self, why: &str) {
        self.fs.abort(why);
    }

    /// A request a transport answered itself (DESTROY).
    pub fn count(&self, operation: Operation) {
        drop(self.metrics.begin(operation, Instant::now()));
    }

    /// A request a transport refused itself (ENOSYS).
    pub fn count_failure(&self, operation: Operation) {
        self.metrics.begin(operation, Instant::now()).fail();
    }

    /// The engine's statistics followed by the request counters.
    fn stats_report(&self) -> String {
        stats_report(&self.fs, &self.metrics)
    }

    /// Every entry the kernel receives raises its lookup count for that
    /// inode, which the engine must know before the reply leaves (a FORGET
    /// may follow at once).
    fn reply_entry(&self, parent: INodeNo, reply: impl EntryAnswer, result: crate::Result<Attr>) {
        match result {
            Ok(attr) => {
                self.fs.remember(attr.ino);
                reply.entry(
                    self.entry_ttl(parent),
                    &file_attr(&attr),
                    Generation(attr.generation as u64),
                )
            }
            Err(error) => reply.error(errno(&error)),
        }
    }

    /// How long the kernel may keep a name of directory `parent` and the
    /// attributes that came with it: not at all in a casefolded directory,
    /// where a name found stands for every spelling of it, which the
    /// kernel's dentries for a FUSE mount do not know (a rename or unlink
    /// through one spelling would leave the others cached).
    fn entry_ttl(&self, parent: INodeNo) -> &'static Duration {
        match self.fs.is_casefolded(to_ext4(parent)) {
            true => &Duration::ZERO,
            false => self.tuning.ttl(),
        }
    }

    /// A name that does not exist, as an entry with node id 0: the kernel
    /// keeps it as a negative dentry for the entry timeout (fuse.h: "a zero
    /// nodeid is the same as ENOENT, but with a valid timeout") instead of
    /// asking again. Creating the name goes through the kernel, which
    /// replaces the negative dentry; the engine never adds a name by itself.
    fn reply_negative(&self, reply: impl EntryAnswer) {
        let attr = FileAttr {
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
        };
        reply.entry(self.tuning.ttl(), &attr, Generation(0));
    }

    /// Run one request's handler, timed and counted (`metrics`). A panic
    /// (a bug) must neither take the worker thread with it nor leave the
    /// request unanswered: the reply, dropped while unwinding, answers EIO
    /// (fuser's `ReplyRaw`), and the engine aborts its journal and turns
    /// read-only, as after a corruption (the panic hook of the server has
    /// logged the panic itself).
    fn guard(&self, operation: Operation, handler: impl FnOnce(&mut RequestClock<'_>)) {
        let mut clock = self.metrics.begin(operation, Instant::now());
        let handled = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            handler(&mut clock);
        }));
        if let Err(panic) = handled {
            // The only error counted after its reply (EIO, sent while
            // unwinding): a bug's, which aborts the journal anyway.
            clock.fail();
            let why = crate::error::panic_message(&*panic);
            self.fs.abort(&format!(
                "a panic in the FUSE {} handler: {why}",
                operation.name()
            ));
        }
    }

    /// Setting or removing an access ACL may change the mode: drop the
    /// kernel's cached attributes. With FUSE_POSIX_ACL the kernel does it
    /// itself (every ACL change goes through `fuse_set_acl`, which forgets
    /// the cached ACLs and attributes), so a notification would only cost
    /// a system call per ACL set (one per file in `cp -a`).
    fn acl_changed(&self, ino: INodeNo, name: &OsStr) {
        if !self.posix_acl.load(Ordering::Acquire)
            && name.as_bytes().starts_with(b"system.posix_acl")
        {
            self.attributes_changed(ino);
        }
    }

    /// The flags of an OPEN answer: FOPEN_NOFLUSH (a saver), and
    /// FOPEN_KEEP_CACHE where reading the file now would not change its
    /// atime: the pages the kernel holds from earlier opens then stay and
    /// serve reads without asking. They are right: every change of a
    /// file's data goes through the kernel, which updates or drops its
    /// pages, but for a fallocate or a truncate that failed part-way
    /// (`data_changed`).
    fn file_open_flags(&self, attr: &Attr) -> FopenFlags {
        let mut flags = self.tuning.open_flags();
        let stale = self.stale_pages.lock().remove(&attr.ino);
        if !stale && self.caches_accesses(attr) {
            flags |= FopenFlags::FOPEN_KEEP_CACHE;
        }
        flags
    }

    /// The flags of an OPENDIR answer: FOPEN_CACHE_DIR where listing the
    /// directory now would not change its atime. The kernel then keeps
    /// the listing in the directory's pages (FOPEN_KEEP_CACHE keeps the
    /// open from dropping them) and answers the next listing from it,
    /// unless the directory changed since: every change of entries goes
    /// through the kernel, which then drops the listing (`fuse_dir_changed`
    /// bumps the version the cache is checked against).
    fn dir_open_flags(&self, attr: &Attr) -> FopenFlags {
        if self.caches_accesses(attr) {
            FopenFlags::FOPEN_CACHE_DIR | FopenFlags::FOPEN_KEEP_CACHE
        } else {
            FopenFlags::empty()
        }
    }

    /// Whether the kernel may answer reads or listings of `attr`'s inode
    /// from its caches, which the engine never sees: only where such an
    /// access would not change the atime (noatime, nodiratime, or relatime
    /// with an atime after the last change and under a day old). Under
    /// strictatime every access must reach the engine.
    fn caches_accesses(&self, attr: &Attr) -> bool {
        self.tuning.keep_cache && !self.fs.access_changes_atime(attr)
    }

    /// The inode's data may have changed in a way the kernel will not
    /// learn from the reply: its next open drops the pages the kernel
    /// keeps (as every open did before FOPEN_KEEP_CACHE; those of files
    /// open now stay, as they always did). Not a notification: dropping a
    /// page waits for its lock, which a read of the file holds until its
    /// answer, and the thread that would answer it may be this one (one
    /// worker, or one ring entry per queue; libfuse's
    /// `fuse_lowlevel_notify_inval_inode` warns of the same deadlock).
    fn data_changed(&self, ino: INodeNo) {
        self.stale_pages.lock().insert(to_ext4(ino));
    }

    /// The inode's attributes changed in a way the kernel will not learn
    /// from the reply (an error reply after part of the work was done):
    /// drop its cached attributes (a negative offset: attributes only).
    fn attributes_changed(&self, ino: INodeNo) {
        if let Some(notifier) = self.notifier.get()
            && let Err(error) = notifier.inval_inode(ino, -1, 0)
        {
            tracing::debug!(%error, "attribute invalidation not delivered");
        }
    }
}

/// What `jext4 stats` shows of a FUSE mount: the engine's report, then
/// the request counters.
pub fn stats_report(fs: &Fs, metrics: &RequestMetrics) -> String {
    let mut report = fs.stats_report();
    for line in metrics.report_lines() {
        report.push_str(&line);
        report.push('\n');
    }
    report
}

fn to_ext4(ino: INodeNo) -> u32 {
    match ino.0 {
        1 => ROOT_INO,
        n if n == ROOT_INO as u64 => 1,
        n => n as u32,
    }
}

fn to_fuse(ino: u32) -> INodeNo {
    match ino {
        ROOT_INO => INodeNo(1),
        1 => INodeNo(ROOT_INO as u64),
        n => INodeNo(n as u64),
    }
}

fn errno(error: &Error) -> Errno {
    Errno::from_i32(error.errno())
}

/// The request's fsuid and fsgid; its pid is the calling thread's id, where
/// `/proc` tells its supplementary groups and capabilities.
fn caller(origin: &Origin) -> Caller {
    Caller {
        tid: Some(origin.pid),
        ..Caller::new(origin.uid, origin.gid)
    }
}

/// quotactl's check for limits and reports (check_quotactl_permission):
/// CAP_SYS_ADMIN, or EPERM.
fn quota_admin(origin: &Origin) -> crate::Result<()> {
    match caller(origin).capable_sys_admin() {
        true => Ok(()),
        false => Err(Error::NotPermitted),
    }
}

/// `caller` with the umask that create, mknod and mkdir carry: with
/// FUSE_DONT_MASK the kernel leaves the mode unmasked, because only the
/// server knows whether the directory's default ACL replaces the umask.
fn creator(origin: &Origin, umask: u32) -> Caller {
    Caller {
        umask: (umask & 0o777) as u16,
        ..caller(origin)
    }
}

fn system_time(time: Timestamp) -> SystemTime {
    if time.sec >= 0 {
        UNIX_EPOCH + Duration::new(time.sec as u64, time.nsec)
    } else {
        // Before 1970: subtract whole seconds, then add the nanoseconds.
        UNIX_EPOCH - Duration::from_secs(time.sec.unsigned_abs())
            + Duration::from_nanos(time.nsec as u64)
    }
}

fn timestamp(time: SystemTime) -> Timestamp {
    match time.duration_since(UNIX_EPOCH) {
        Ok(after) => Timestamp {
            sec: after.as_secs() as i64,
            nsec: after.subsec_nanos(),
        },
        Err(before) => {
            let before = before.duration();
            let mut sec = -(before.as_secs() as i64);
            let mut nsec = before.subsec_nanos();
            if nsec > 0 {
                sec -= 1;
                nsec = 1_000_000_000 - nsec;
            }
            Timestamp { sec, nsec }
        }
    }
}

fn file_type(kind: FileKind) -> FileType {
    match kind {
        FileKind::Regular => FileType::RegularFile,
        FileKind::Directory => FileType::Directory,
        FileKind::Symlink => FileType::Symlink,
        FileKind::CharDevice => FileType::CharDevice,
        FileKind::BlockDevice => FileType::BlockDevice,
        FileKind::Fifo => FileType::NamedPipe,
        FileKind::Socket => FileType::Socket,
    }
}

fn file_attr(attr: &Attr) -> FileAttr {
    FileAttr {
        ino: to_fuse(attr.ino),
        size: attr.size,
        blocks: attr.blocks,
        atime: system_time(attr.atime),
        mtime: system_time(attr.mtime),
        ctime: system_time(attr.ctime),
        crtime: system_time(attr.crtime),
        kind: file_type(attr.kind),
        perm: attr.perm,
        nlink: attr.nlink,
        uid: attr.uid,
        gid: attr.gid,
        rdev: attr.rdev,
        blksize: attr.blksize,
        flags: 0,
    }
}

/// What readdirplus says of an entry whose inode could not be read: its
/// number and kind, nothing else.
fn unreadable_attr(entry: &crate::fs::Dentry) -> Attr {
    let zero = crate::format::inode::Timestamp::default();
    Attr {
        ino: entry.ino,
        kind: entry.kind,
        perm: 0,
        nlink: 1,
        uid: 0,
        gid: 0,
        size: 0,
        blocks: 0,
        atime: zero,
        mtime: zero,
        ctime: zero,
        crtime: zero,
        rdev: 0,
        blksize: 4096,
        generation: 0,
        flags: 0,
    }
}

fn reply_empty(reply: impl EmptyAnswer, result: crate::Result<()>) {
    match result {
        Ok(()) => reply.ok(),
        Err(error) => reply.error(errno(&error)),
    }
}

/// An ioctl's answer: result 0 with what fits of `out` in the caller's
/// `out_size` bytes, or the error's errno.
fn reply_ioctl(reply: impl IoctlAnswer, result: crate::Result<Vec<u8>>, out_size: u32) {
    match result {
        Ok(out) => {
            let length = out.len().min(out_size as usize);
            reply.ioctl(0, &out[..length]);
        }
        Err(error) => reply.error(errno(&error)),
    }
}

fn reply_xattr(reply: impl XattrAnswer, result: crate::Result<Vec<u8>>, size: u32) {
    match result {
        Ok(data) if size == 0 => reply.size(data.len() as u32),
        Ok(data) if data.len() > size as usize => reply.error(Errno::from_i32(libc::ERANGE)),
        Ok(data) => reply.data(&data),
        Err(error) => reply.error(errno(&error)),
    }
}

fn time_set(time: TimeOrNow) -> TimeSet {
    match time {
        TimeOrNow::Now => TimeSet::Now,
        TimeOrNow::SpecificTime(at) => TimeSet::At(timestamp(at)),
    }
}

impl FuseAdapter {
    /// Choose the capabilities to take from what the kernel offers in
    /// FUSE_INIT (`config`), FUSE_OVER_IO_URING when `uring` asks for it;
    /// says whether the kernel took io_uring.
    pub fn init(&self, config: &mut KernelConfig, uring: bool) -> bool {
        // Optional capabilities: take each one the kernel offers. Not
        // FUSE_WRITEBACK_CACHE: with it, write(2) only fills the kernel's page
        // cache and a full filesystem never fails the write — the ENOSPC of
        // the later write-back is lost (a `dd` to a full volume runs on
        // forever). Write-through costs nothing measurable for `cp -a`.
        for wanted in [
            InitFlags::FUSE_PARALLEL_DIROPS,
            InitFlags::FUSE_DO_READDIRPLUS,
        ] {
            let _ = config.add_capabilities(wanted);
        }
        // The engine removes setuid, setgid and file capabilities on write,
        // truncate and chown as the kernel would (Tx::kill_privileges); the
        // kernel then marks the mount SB_NOSEC and stops asking
        // getxattr("security.capability") before every write.
        let killpriv_v2 = self.tuning.killpriv_v2
            && config
                .add_capabilities(InitFlags::FUSE_HANDLE_KILLPRIV_V2)
                .is_ok();
        self.killpriv_v2.store(killpriv_v2, Ordering::Release);
        // Stable file handles (name_to_handle_at, NFS): lookups of "." and
        // ".." by node id after the kernel forgot the inode (`lookup`).
        if let Err(missing) = config.add_capabilities(InitFlags::FUSE_EXPORT_SUPPORT) {
            tracing::warn!(?missing, "no FUSE export support: file handles go stale");
        }
        // POSIX ACLs: the kernel then checks permissions against them (it
        // checked mode bits only before) and leaves inheritance, the umask
        // and the mode/ACL interplay to the engine (fs::acl), which needs
        // the umask unapplied (DONT_MASK). Both or neither: with ACLs but a
        // masked mode, inheritance would come out wrong.
        let acls = InitFlags::FUSE_POSIX_ACL | InitFlags::FUSE_DONT_MASK;
        match config.add_capabilities(acls) {
            Ok(()) => self.posix_acl.store(true, Ordering::Release),
            Err(missing) => tracing::warn!(
                ?missing,
                "the kernel does not offer POSIX ACL support to FUSE: ACLs are stored but not enforced"
            ),
        }
        let _ = config.set_max_write(wire::MAX_WRITE);
        // The ring's decoder reads the request layouts of protocol 7.36 and
        // later; every kernel that offers io_uring speaks 7.42 or later.
        uring
            && config.kernel_abi() >= fuser::Version(7, 36)
            && config
                .add_capabilities(InitFlags::FUSE_OVER_IO_URING)
                .is_ok()
    }

    // BATCH_FORGET: fuser's default hands each node to forget().
    pub fn forget(&self, ino: INodeNo, nlookup: u64) {
        self.guard(Operation::Forget, move |clock| {
            clock.timed(|| self.fs.forget(to_ext4(ino), nlookup));
        });
    }

    pub fn lookup(&self, parent: INodeNo, name: &OsStr, reply: impl EntryAnswer) {
        // With FUSE_EXPORT_SUPPORT the kernel decodes a file handle whose
        // inode it has forgotten by looking up "." in the handle's node id
        // (any kind of inode), and reconnects a directory through "..".
        // It then compares the generation, so a reused number is ESTALE.
        self.guard(Operation::Lookup, move |clock| {
            let dot = name.as_bytes() == b".";
            let result = clock.engine(|| {
                if dot {
                    self.fs.inode_by_number(to_ext4(parent))
                } else {
                    self.fs.lookup(to_ext4(parent), name.as_bytes())
                }
            });
            // "." and ".." come from file-handle decoding, which wants a
            // plain ENOENT (ESTALE to its caller), not a cached dentry.
            let by_handle = dot || name.as_bytes() == b"..";
            match result {
                // With casefold, no name is cached as missing: one missing
                // in an empty directory may exist once `chattr +F` made
                // another spelling of it the same name.
                Err(Error::NotFound)
                    if self.tuning.negative_entries && !by_handle && !self.fs.may_casefold() =>
                {
                    self.reply_negative(reply)
                }
                result => self.reply_entry(parent, reply, result),
            }
        });
    }

    pub fn getattr(&self, ino: INodeNo, reply: impl AttrAnswer) {
        self.guard(Operation::Getattr, move |clock| {
            match clock.engine(|| self.fs.getattr(to_ext4(ino))) {
                Ok(attr) => reply.attr(self.tuning.ttl(), &file_attr(&attr)),
                Err(error) => reply.error(errno(&error)),
            }
        });
    }

    /// `changes` as the transport decoded them (the mode's permission bits
    /// only).
    pub fn setattr(
        &self,
        origin: &Origin,
        ino: INodeNo,
        changes: &SetAttr,
        reply: impl AttrAnswer,
    ) {
        self.guard(Operation::Setattr, move |clock| {
            debug_assert!(changes.mode.is_none_or(|mode| mode & !0o7777 == 0));
            match clock.engine(|| self.fs.setattr(to_ext4(ino), changes, caller(origin))) {
                Ok(attr) => reply.attr(self.tuning.ttl(), &file_attr(&attr)),
                Err(error) => {
                    // A truncate that failed part-way (an I/O error) may
                    // have moved the size and freed blocks: the kernel
                    // changes neither its size nor its pages on an error.
                    if changes.size.is_some() {
                        self.attributes_changed(ino);
                        self.data_changed(ino);
                    }
                    reply.error(errno(&error))
                }
            }
        });
    }

    pub fn readlink(&self, ino: INodeNo, reply: impl DataAnswer) {
        self.guard(Operation::Readlink, move |clock| {
            match clock.engine(|| self.fs.readlink(to_ext4(ino))) {
                Ok(target) => reply.data(&target),
                Err(error) => reply.error(errno(&error)),
            }
        });
    }

    // One argument per field of the request, as in fuser's trait.
    #[allow(clippy::too_many_arguments)]
    pub fn mknod(
        &self,
        origin: &Origin,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: impl EntryAnswer,
    ) {
        self.guard(Operation::Mknod, move |clock| {
            let result = clock.engine(|| {
                self.fs.mknod(
                    to_ext4(parent),
                    name.as_bytes(),
                    mode as u16,
                    rdev as u64,
                    creator(origin, umask),
                )
            });
            self.reply_entry(parent, reply, result);
        });
    }

    pub fn mkdir(
        &self,
        origin: &Origin,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: impl EntryAnswer,
    ) {
        self.guard(Operation::Mkdir, move |clock| {
            let result = clock.engine(|| {
                self.fs.mkdir(
                    to_ext4(parent),
                    name.as_bytes(),
                    mode as u16,
                    creator(origin, umask),
                )
            });
            self.reply_entry(parent, reply, result);
        });
    }

    pub fn unlink(&self, origin: &Origin, parent: INodeNo, name: &OsStr, reply: impl EmptyAnswer) {
        self.guard(Operation::Unlink, move |clock| {
            let result = clock.engine(|| {
                self.fs
                    .unlink(to_ext4(parent), name.as_bytes(), caller(origin))
            });
            reply_empty(reply, result);
        });
    }

    pub fn rmdir(&self, origin: &Origin, parent: INodeNo, name: &OsStr, reply: impl EmptyAnswer) {
        self.guard(Operation::Rmdir, move |clock| {
            let result = clock.engine(|| {
                self.fs
                    .rmdir(to_ext4(parent), name.as_bytes(), caller(origin))
            });
            reply_empty(reply, result);
        });
    }

    pub fn symlink(
        &self,
        origin: &Origin,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: impl EntryAnswer,
    ) {
        self.guard(Operation::Symlink, move |clock| {
            let result = clock.engine(|| {
                self.fs.symlink(
                    to_ext4(parent),
                    link_name.as_bytes(),
                    target.as_os_str().as_bytes(),
                    caller(origin),
                )
            });
            self.reply_entry(parent, reply, result);
        });
    }

    // One argument per field of the request, as in fuser's trait.
    #[allow(clippy::too_many_arguments)]
    pub fn rename(
        &self,
        origin: &Origin,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: fuser::RenameFlags,
        reply: impl EmptyAnswer,
    ) {
        self.guard(Operation::Rename, move |clock| {
            if flags.contains(fuser::RenameFlags::RENAME_WHITEOUT) {
                clock.fail();
                return reply.error(Errno::from_i32(libc::EINVAL));
            }
            let flags = RenameFlags {
                noreplace: flags.contains(fuser::RenameFlags::RENAME_NOREPLACE),
                exchange: flags.contains(fuser::RenameFlags::RENAME_EXCHANGE),
            };
            let result = clock.engine(|| {
                self.fs.rename(
                    to_ext4(parent),
                    name.as_bytes(),
                    to_ext4(newparent),
                    newname.as_bytes(),
                    flags,
                    caller(origin),
                )
            });
            reply_empty(reply, result);
        });
    }

    pub fn link(
        &self,
        origin: &Origin,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: impl EntryAnswer,
    ) {
        self.guard(Operation::Link, move |clock| {
            let result = clock.engine(|| {
                self.fs.link(
                    to_ext4(ino),
                    to_ext4(newparent),
                    newname.as_bytes(),
                    caller(origin),
                )
            });
            self.reply_entry(newparent, reply, result);
        });
    }

    /// open(2): an fs-verity file opened for writing or truncation is
    /// EPERM, as the kernel's `fsverity_file_open` answers, and so is what
    /// chattr's +i and +a forbid, which the kernel cannot check for a
    /// FUSE mount (`Fs::check_open`).
    pub fn open(&self, ino: INodeNo, flags: i32, reply: impl OpenAnswer) {
        let write = flags & libc::O_ACCMODE != libc::O_RDONLY;
        let append = flags & libc::O_APPEND != 0;
        let truncate = flags & libc::O_TRUNC != 0;
        self.guard(Operation::Open, move |clock| {
            let opened = clock.engine(|| {
                let ino = to_ext4(ino);
                self.fs.check_open(ino, write, append, truncate)?;
                self.fs.open_file(ino)
            });
            match opened {
                Ok(attr) => reply.opened(FileHandle(0), self.file_open_flags(&attr)),
                Err(error) => reply.error(errno(&error)),
            }
        });
    }

    pub fn read(&self, ino: INodeNo, offset: u64, size: u32, reply: impl DataAnswer) {
        self.guard(Operation::Read, move |clock| {
            match clock.engine(|| self.fs.read(to_ext4(ino), offset, size as usize)) {
                Ok(data) => reply.data(&data),
                Err(error) => reply.error(errno(&error)),
            }
        });
    }

    pub fn write(
        &self,
        origin: &Origin,
        ino: INodeNo,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        reply: impl WriteAnswer,
    ) {
        self.guard(Operation::Write, move |clock| {
            // With KILLPRIV_V2 the kernel says whether the caller lacks
            // CAP_FSETID (setuid and setgid go) instead of removing them
            // itself; the engine asks /proc otherwise.
            let caller = Caller {
                fsetid: self
                    .killpriv_v2
                    .load(Ordering::Acquire)
                    .then(|| !write_flags.contains(WriteFlags::FUSE_WRITE_KILL_SUIDGID)),
                ..caller(origin)
            };
            match clock.engine(|| self.fs.write_file(to_ext4(ino), offset, data, caller)) {
                Ok(written) => {
                    if written.privileges_killed {
                        // The mode the kernel caches still has the bits.
                        self.attributes_changed(ino);
                    }
                    reply.written(written.bytes as u32)
                }
                Err(error) => reply.error(errno(&error)),
            }
        });
    }

    pub fn flush(&self, reply: impl EmptyAnswer) {
        self.guard(Operation::Flush, move |_clock| {
            reply.ok();
        });
    }

    pub fn release(&self, ino: INodeNo, reply: impl EmptyAnswer) {
        self.guard(Operation::Release, move |clock| {
            reply_empty(reply, clock.engine(|| self.fs.release_file(to_ext4(ino))));
        });
    }

    pub fn fsync(&self, ino: INodeNo, datasync: bool, reply: impl EmptyAnswer) {
        self.guard(Operation::Fsync, move |clock| {
            reply_empty(
                reply,
                clock.engine(|| self.fs.fsync(to_ext4(ino), datasync)),
            );
        });
    }

    pub fn opendir(&self, ino: INodeNo, reply: impl OpenAnswer) {
        self.guard(Operation::Opendir, move |clock| {
            match clock.engine(|| self.fs.open_file(to_ext4(ino))) {
                Ok(attr) if attr.kind != FileKind::Directory => {
                    let _ = clock.engine(|| self.fs.release_file(to_ext4(ino)));
                    clock.fail();
                    reply.error(Errno::from_i32(libc::ENOTDIR));
                }
                Ok(attr) => reply.opened(FileHandle(0), self.dir_open_flags(&attr)),
                Err(error) => reply.error(errno(&error)),
            }
        });
    }

    pub fn readdir(&self, ino: INodeNo, offset: u64, mut reply: impl DirectoryAnswer) {
        self.guard(Operation::Readdir, move |clock| {
            let result = clock.engine(|| {
                self.fs.readdir(to_ext4(ino), offset, &mut |entry| {
                    let full = reply.add(
                        to_fuse(entry.ino),
                        entry.next,
                        file_type(entry.kind),
                        OsStr::from_bytes(&entry.name),
                    );
                    !full
                })
            });
            match result {
                Ok(()) => reply.ok(),
                Err(error) => reply.error(errno(&error)),
            }
        });
    }

    pub fn readdirplus(&self, ino: INodeNo, offset: u64, mut reply: impl DirectoryPlusAnswer) {
        self.guard(Operation::Readdirplus, move |clock| {
            // Collect a batch first: the attributes are read after the listing
            // has released the filesystem lock (its read lock is not re-entrant
            // once a writer waits).
            let mut entries = Vec::new();
            // Returning false means "not taken": the listing offers that entry
            // again from the previous cookie on the next call.
            let listed = clock.engine(|| {
                self.fs.readdir(to_ext4(ino), offset, &mut |entry| {
                    if entries.len() >= READDIRPLUS_BATCH {
                        return false;
                    }
                    entries.push(entry);
                    true
                })
            });
            if let Err(error) = listed {
                return reply.error(errno(&error));
            }
            for entry in entries {
                // An entry whose inode cannot be read (damaged, or past the
                // initialised inodes) is still listed, as the kernel's
                // readdir lists it: with the kind its entry gives and
                // nothing cached, so that a stat of it asks again and gets
                // the error alone. The engine has logged the damage.
                let (attr, ttl) = match clock.engine(|| self.fs.getattr(entry.ino)) {
                    Ok(attr) => (attr, *self.entry_ttl(ino)),
                    Err(_) => (unreadable_attr(&entry), Duration::ZERO),
                };
                // The kernel counts a lookup for every entry but "." and "..";
                // an entry that does not fit is not sent, so counted after.
                let dots = entry.name == b"." || entry.name == b"..";
                let full = reply.add(
                    entry.next,
                    OsStr::from_bytes(&entry.name),
                    &ttl,
                    &file_attr(&attr),
                    Generation(attr.generation as u64),
                );
                if full {
                    break; // the kernel resumes from the last entry's cookie
                }
                if !dots {
                    self.fs.remember(entry.ino);
                }
            }
            reply.ok();
        });
    }

    pub fn releasedir(&self, ino: INodeNo, reply: impl EmptyAnswer) {
        self.guard(Operation::Releasedir, move |clock| {
            reply_empty(reply, clock.engine(|| self.fs.release_file(to_ext4(ino))));
        });
    }

    pub fn fsyncdir(&self, ino: INodeNo, reply: impl EmptyAnswer) {
        // The directory's transaction (a fast commit where eligible), or
        // everything pending where not (`Fs::fsync_dir`).
        self.guard(Operation::Fsyncdir, move |clock| {
            let ino = to_ext4(ino);
            let result = clock.engine(|| self.fs.getattr(ino).and_then(|_| self.fs.fsync_dir(ino)));
            reply_empty(reply, result);
        });
    }

    pub fn ioctl(
        &self,
        origin: &Origin,
        ino: INodeNo,
        cmd: u32,
        data: &[u8],
        out_size: u32,
        reply: impl IoctlAnswer,
    ) {
        self.guard(Operation::Ioctl, move |clock| match cmd {
            // fs-verity: the kernel's FUSE passes these two with their
            // variable parts (6.4+, `fuse_setup_enable_verity`).
            control::FS_IOC_ENABLE_VERITY => {
                let ino = to_ext4(ino);
                let result = clock.engine(|| {
                    let params = control::parse_enable_verity(data)?;
                    self.fs.enable_verity_with(ino, Caller::ROOT, &params)
                });
                reply_ioctl(reply, result.map(|()| Vec::new()), out_size);
            }
            control::FS_IOC_MEASURE_VERITY => {
                let ino = to_ext4(ino);
                let result = clock.engine(|| self.fs.verity_digest(ino));
                let out = result.and_then(|digest| control::measured(data, &digest));
                reply_ioctl(reply, out, out_size);
            }
            control::FS_IOC_GETFLAGS => {
                let result = clock.engine(|| self.fs.inode_flags(to_ext4(ino)));
                reply_ioctl(
                    reply,
                    result.map(|flags| flags.to_le_bytes().to_vec()),
                    out_size,
                );
            }
            control::FS_IOC_SETFLAGS => {
                let result = clock.engine(|| {
                    let flags = control::parse_flags(data)?;
                    self.fs.set_inode_flags(to_ext4(ino), flags, caller(origin))
                });
                reply_ioctl(reply, result.map(|()| Vec::new()), out_size);
            }
            // Project ids and +P (`chattr -p`, `xfs_io -c chproj`).
            control::FS_IOC_FSGETXATTR => {
                let result = clock.engine(|| self.fs.fs_xattr(to_ext4(ino)));
                let out = result.map(|(xflags, projid)| control::fsxattr(xflags, projid));
                reply_ioctl(reply, out, out_size);
            }
            control::FS_IOC_FSSETXATTR => {
                let result = clock.engine(|| {
                    let (xflags, projid) = control::parse_fsxattr(data)?;
                    self.fs
                        .set_fs_xattr(to_ext4(ino), xflags, projid, caller(origin))
                });
                reply_ioctl(reply, result.map(|()| Vec::new()), out_size);
            }
            control::JEXT4_IOC_SYNC => {
                let result =
                    clock.engine(|| self.fs.getattr(to_ext4(ino)).and_then(|_| self.fs.sync()));
                reply_ioctl(reply, result.map(|()| Vec::new()), out_size);
            }
            control::JEXT4_IOC_QUOTA_SET => {
                let result = clock.engine(|| {
                    quota_admin(origin)?;
                    let (qtype, id, limits) = control::parse_quota_set(data)?;
                    self.fs.set_quota_limits(qtype, id, limits)
                });
                reply_ioctl(reply, result.map(|()| Vec::new()), out_size);
            }
            control::JEXT4_IOC_QUOTA_GRACE => {
                let result = clock.engine(|| {
                    quota_admin(origin)?;
                    let (qtype, block, inode) = control::parse_quota_grace(data)?;
                    self.fs.set_quota_grace(qtype, block, inode)
                });
                reply_ioctl(reply, result.map(|()| Vec::new()), out_size);
            }
            control::JEXT4_IOC_QUOTA_PAGE => {
                let result = clock.engine(|| {
                    quota_admin(origin)?;
                    let (qtype, first) = control::parse_quota_page(data)?;
                    let report = self.fs.quota_report(qtype)?;
                    Ok(control::quota_page(&report, first))
                });
                reply_ioctl(reply, result, out_size);
            }
            control::JEXT4_IOC_STATS | control::JEXT4_IOC_STATS_8K => {
                let report = clock.timed(|| self.stats_report());
                let length = report.len().min(out_size as usize);
                reply.ioctl(length as i32, &report.as_bytes()[..length]);
            }
            // What ext4 does not know either.
            _ => {
                clock.fail();
                reply.error(Errno::from_i32(libc::ENOTTY))
            }
        });
    }

    /// The figures of the filesystem, or of the project whose directory
    /// `ino` is (FUSE_STATFS carries the inode of the path asked about).
    pub fn statfs(&self, ino: INodeNo, reply: impl StatfsAnswer) {
        self.guard(Operation::Statfs, move |clock| {
            let stat = match clock.engine(|| self.fs.statfs_at(to_ext4(ino))) {
                Ok(stat) => stat,
                Err(error) => return reply.error(errno(&error)),
            };
            reply.statfs(&StatfsFigures {
                blocks: stat.blocks,
                free_blocks: stat.free_blocks,
                available_blocks: stat.available_blocks,
                files: stat.files,
                free_files: stat.free_files,
                block_size: stat.block_size,
                name_max: stat.name_max,
                fragment_size: stat.block_size,
            });
        });
    }

    pub fn setxattr(
        &self,
        origin: &Origin,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        reply: impl EmptyAnswer,
    ) {
        self.guard(Operation::Setxattr, move |clock| {
            let mode = match flags {
                0 => XattrMode::Any,
                libc::XATTR_CREATE => XattrMode::Create,
                libc::XATTR_REPLACE => XattrMode::Replace,
                _ => {
                    clock.fail();
                    return reply.error(Errno::from_i32(libc::EINVAL));
                }
            };
            let result = clock.engine(|| {
                self.fs
                    .setxattr(to_ext4(ino), name.as_bytes(), value, mode, caller(origin))
            });
            if result.is_ok() {
                self.acl_changed(ino, name);
            }
            reply_empty(reply, result);
        });
    }

    pub fn getxattr(&self, ino: INodeNo, name: &OsStr, size: u32, reply: impl XattrAnswer) {
        self.guard(Operation::Getxattr, move |clock| {
            let result = clock.engine(|| self.fs.getxattr(to_ext4(ino), name.as_bytes()));
            reply_xattr(reply, result, size);
        });
    }

    pub fn listxattr(&self, ino: INodeNo, size: u32, reply: impl XattrAnswer) {
        self.guard(Operation::Listxattr, move |clock| {
            let result = clock
                .engine(|| self.fs.listxattr(to_ext4(ino)))
                .map(|names| {
                    let mut list = Vec::new();
                    for name in names {
                        list.extend_from_slice(&name);
                        list.push(0);
                    }
                    list
                });
            reply_xattr(reply, result, size);
        });
    }

    pub fn removexattr(
        &self,
        origin: &Origin,
        ino: INodeNo,
        name: &OsStr,
        reply: impl EmptyAnswer,
    ) {
        self.guard(Operation::Removexattr, move |clock| {
            let result = clock.engine(|| {
                self.fs
                    .removexattr(to_ext4(ino), name.as_bytes(), caller(origin))
            });
            if result.is_ok() {
                self.acl_changed(ino, name);
            }
            reply_empty(reply, result);
        });
    }

    pub fn access(&self, ino: INodeNo, reply: impl EmptyAnswer) {
        self.guard(Operation::Access, move |clock| {
            // The kernel checks permissions (default_permissions); we only
            // confirm the inode exists.
            reply_empty(
                reply,
                clock.engine(|| self.fs.getattr(to_ext4(ino))).map(|_| ()),
            );
        });
    }

    pub fn create(
        &self,
        origin: &Origin,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: impl CreateAnswer,
    ) {
        self.guard(Operation::Create, move |clock| {
            let result = clock.engine(|| {
                self.fs
                    .create(
                        to_ext4(parent),
                        name.as_bytes(),
                        mode as u16,
                        creator(origin, umask),
                    )
                    .and_then(|attr| self.fs.open_file(attr.ino))
            });
            match result {
                Ok(attr) => {
                    self.fs.remember(attr.ino);
                    reply.created(
                        self.entry_ttl(parent),
                        &file_attr(&attr),
                        Generation(attr.generation as u64),
                        FileHandle(0),
                        self.tuning.open_flags(),
                    )
                }
                Err(error) => reply.error(errno(&error)),
            }
        });
    }

    pub fn fallocate(
        &self,
        origin: &Origin,
        ino: INodeNo,
        offset: u64,
        length: u64,
        mode: i32,
        reply: impl EmptyAnswer,
    ) {
        self.guard(Operation::Fallocate, move |clock| {
            let result = clock.engine(|| {
                self.fs
                    .fallocate(to_ext4(ino), offset, length, mode as u32, caller(origin))
            });
            // Running out of space part-way keeps what was allocated and
            // the size over it (as ext4 does), and a punch or a zeroing
            // stopped part-way changed some data: the error reply tells
            // the kernel neither, and it drops its pages of the range only
            // after a success.
            if result.is_err() {
                self.attributes_changed(ino);
                self.data_changed(ino);
            }
            reply_empty(reply, result);
        });
    }

    pub fn lseek(&self, ino: INodeNo, offset: i64, whence: i32, reply: impl LseekAnswer) {
        self.guard(Operation::Lseek, move |clock| {
            let whence = match whence {
                libc::SEEK_DATA => SeekWhence::Data,
                libc::SEEK_HOLE => SeekWhence::Hole,
                _ => {
                    clock.fail();
                    return reply.error(Errno::from_i32(libc::EINVAL));
                }
            };
            if offset < 0 {
                clock.fail();
                return reply.error(Errno::from_i32(libc::ENXIO));
            }
            match clock.engine(|| self.fs.seek(to_ext4(ino), offset as u64, whence)) {
                Ok(position) => reply.offset(position as i64),
                Err(error) => reply.error(errno(&error)),
            }
        });
    }
}
