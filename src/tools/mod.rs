//! The image tools: trees and tar archives copied into and out of an
//! image without mounting it, through the engine in this process (no FUSE,
//! no loop device, no root). The `jext4 cp`, `tar` and file verbs are thin
//! over these functions, so a Rust program gets the same speed.
//!
//! - [`copy_in()`]: a host tree into the image (`cp -a SRC IMAGE:DEST`),
//!   several threads feeding the engine, one directory at a time each;
//! - [`copy_out()`]: an image tree onto the host;
//! - `unpack` and `pack`: tar archives (ustar, GNU, pax) into and out
//!   of an image (feature `tar`).
//!
//! A source entry that vanishes or cannot be read is reported in the
//! [`Report`] and skipped, as `cp` does; an image that is full, read-only
//! or damaged stops the copy with a [`Failure`] naming the entry, and the
//! image stays consistent (every operation is a journal transaction).

pub mod acl_text;
pub mod copy_in;
pub mod copy_out;
pub mod host;
pub mod imagepath;
#[cfg(feature = "tar")]
pub mod tar_in;
#[cfg(feature = "tar")]
pub mod tar_out;

pub use copy_in::copy_in;
pub use copy_out::copy_out;
pub use imagepath::ImagePath;
#[cfg(feature = "tar")]
pub use tar_in::unpack;
#[cfg(feature = "tar")]
pub use tar_out::pack;

use crate::error::Error;
use crate::format::inode::Timestamp;
use crate::fs::Caller;
use std::fmt;
use std::path::PathBuf;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

/// How a tree is copied.
#[derive(Debug, Clone)]
pub struct CopyOptions {
    /// Keep what `cp -a` keeps: owners, times (nanoseconds), every xattr
    /// and ACL, hard links (one inode, all names), setuid/setgid/sticky.
    /// Without it, as `cp -r`: the mode less the umask and the set-id
    /// bits, the caller's owner, the current time, no xattrs; symbolic
    /// links, devices and FIFOs are still copied as what they are.
    pub preserve: bool,
    /// Every entry gets this owner (`--owner UID:GID`).
    pub owner: Option<(u32, u32)>,
    /// No time later than this (seconds since the epoch): `--mtime`,
    /// `SOURCE_DATE_EPOCH`. Change times are set to it too, so that the
    /// same tree gives the same inodes.
    pub clamp_time: Option<i64>,
    /// Threads feeding the engine (at least 1).
    pub threads: usize,
    /// The umask applied when `preserve` is off.
    pub umask: u16,
}

impl Default for CopyOptions {
    fn default() -> Self {
        CopyOptions {
            preserve: true,
            owner: None,
            clamp_time: None,
            threads: default_threads(),
            umask: 0o022,
        }
    }
}

/// The CPU count, the default number of threads.
pub fn default_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// What a copy is doing, for a progress display: updated by the copying
/// threads as entries and bytes are done.
#[derive(Default)]
pub struct Progress {
    pub entries: AtomicU64,
    pub bytes: AtomicU64,
    /// Called with the source and the destination of each entry done
    /// (`cp -v`), from the copying threads.
    pub verbose: Option<Verbose>,
}

/// The `cp -v` callback: source, destination.
pub type Verbose = Box<dyn Fn(&str, &str) + Send + Sync>;

impl Progress {
    fn entry(&self) {
        self.entries.fetch_add(1, Ordering::Relaxed);
    }

    fn bytes(&self, count: u64) {
        self.bytes.fetch_add(count, Ordering::Relaxed);
    }
}

/// A source entry that was skipped, and why.
#[derive(Debug)]
pub struct Skipped {
    pub path: PathBuf,
    /// The step that failed, as cp words it ("cannot stat", "cannot open").
    pub action: &'static str,
    pub error: Error,
}

impl fmt::Display for Skipped {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} '{}': {}",
            self.action,
            self.path.display(),
            describe(&self.error)
        )
    }
}

/// What a copy did.
#[derive(Debug, Default)]
pub struct Report {
    pub entries: u64,
    pub bytes: u64,
    /// Entries reported and skipped (the copy goes on: exit status 1).
    pub skipped: Vec<Skipped>,
    /// What the destination could not keep, said once each (an export as
    /// non-root cannot set owners, device nodes, trusted.* xattrs).
    pub not_kept: Vec<String>,
}

/// The error that stopped a copy, with the entry it happened on.
#[derive(Debug)]
pub struct Failure {
    pub path: String,
    pub error: Error,
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, describe(&self.error))
    }
}

impl std::error::Error for Failure {}

/// An error as the coreutils word it: the C library's text for its errno
/// ("No such file or directory"), or the engine's own sentence for what
/// has no errno of its own (corruption, an unsupported feature, a bad
/// argument).
pub fn describe(error: &Error) -> String {
    match error {
        Error::Corrupt { .. } | Error::Unsupported(_) | Error::Invalid(_) => error.to_string(),
        Error::Io(io) if io.raw_os_error().is_none() => io.to_string(),
        _ => strerror(error.errno()),
    }
}

/// The C library's message for `errno`, without Rust's " (os error N)".
pub fn strerror(errno: i32) -> String {
    let text = std::io::Error::from_raw_os_error(errno).to_string();
    match text.find(" (os error") {
        Some(at) => text[..at].to_string(),
        None => text,
    }
}

/// Whether an engine error stops the whole copy (the image cannot take
/// more), rather than failing one entry.
fn is_fatal(error: &Error) -> bool {
    matches!(
        error,
        Error::NoSpace | Error::ReadOnly | Error::Corrupt { .. } | Error::Io(_)
    )
}

/// Entries skipped and facts not kept, gathered from several threads.
#[derive(Debug, Default)]
struct Notes {
    skipped: Mutex<Vec<Skipped>>,
    not_kept: Mutex<Vec<String>>,
}

impl Notes {
    fn skip(&self, path: PathBuf, action: &'static str, error: Error) {
        self.skipped.lock().unwrap().push(Skipped {
            path,
            action,
            error,
        });
    }

    /// Say once that `what` could not be kept.
    fn not_kept(&self, what: String) {
        let mut said = self.not_kept.lock().unwrap();
        if !said.contains(&what) {
            said.push(what);
        }
    }

    fn into_report(self, progress: &Progress) -> Report {
        Report {
            entries: progress.entries.load(Ordering::Relaxed),
            bytes: progress.bytes.load(Ordering::Relaxed),
            skipped: self.skipped.into_inner().unwrap(),
            not_kept: self.not_kept.into_inner().unwrap(),
        }
    }
}

/// A time clamped to `limit` (`SOURCE_DATE_EPOCH` semantics: only later
/// times change).
fn clamp(time: (i64, u32), limit: Option<i64>) -> (i64, u32) {
    match limit {
        Some(limit) if time.0 >= limit => (limit, 0),
        _ => time,
    }
}

/// `caller` allowed to keep set-id bits and to set any owner: the image
/// is the user's own file, as with `mke2fs -d` or `tar --same-owner`.
fn privileged(caller: Caller) -> Caller {
    Caller {
        fsetid: Some(true),
        ..caller
    }
}

fn timestamp((sec, nsec): (i64, u32)) -> Timestamp {
    Timestamp { sec, nsec }
}
