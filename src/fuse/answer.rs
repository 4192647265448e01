//! The transport boundary: what a request handler needs from whoever
//! carried the request in and carries the answer out. The adapter's
//! handlers (`FuseAdapter`) take the asker (`Origin`) and one answer per
//! request, and are generic over the answer's type, so that the same
//! handler — engine calls, metrics, panic handling — serves both
//! transports:
//! - `/dev/fuse` (`dev.rs`): fuser's session reads and decodes the
//!   request and hands its own reply types, implemented here by
//!   forwarding;
//! - FUSE over io_uring (`uring.rs`): the ring's entries carry the request
//!   and the answer (`wire.rs` encodes them).
//!
//! Every answer is given exactly once (each method consumes it). An answer
//! dropped unanswered — a handler that panicked — answers EIO, as fuser's
//! replies do, so the kernel never waits for a request nobody answers.

use fuser::{Errno, FileAttr, FileHandle, FileType, FopenFlags, Generation, INodeNo};
use std::ffi::OsStr;
use std::time::Duration;

/// Who asked: the fields of the request header the engine uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Origin {
    pub uid: u32,
    pub gid: u32,
    /// The calling thread's id (`/proc` tells its groups and capabilities).
    pub pid: u32,
}

impl From<&fuser::Request> for Origin {
    fn from(request: &fuser::Request) -> Self {
        Origin {
            uid: request.uid(),
            gid: request.gid(),
            pid: request.pid(),
        }
    }
}

/// Every answer can be an error.
pub trait Answer {
    fn error(self, errno: Errno);
}

pub trait EmptyAnswer: Answer {
    fn ok(self);
}

pub trait EntryAnswer: Answer {
    fn entry(self, ttl: &Duration, attr: &FileAttr, generation: Generation);
}

pub trait AttrAnswer: Answer {
    fn attr(self, ttl: &Duration, attr: &FileAttr);
}

pub trait DataAnswer: Answer {
    fn data(self, data: &[u8]);
}

pub trait OpenAnswer: Answer {
    fn opened(self, fh: FileHandle, flags: FopenFlags);
}

pub trait WriteAnswer: Answer {
    fn written(self, size: u32);
}

pub trait CreateAnswer: Answer {
    fn created(
        self,
        ttl: &Duration,
        attr: &FileAttr,
        generation: Generation,
        fh: FileHandle,
        flags: FopenFlags,
    );
}

/// What statfs reports, in the order of `struct fuse_kstatfs`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatfsFigures {
    pub blocks: u64,
    pub free_blocks: u64,
    pub available_blocks: u64,
    pub files: u64,
    pub free_files: u64,
    pub block_size: u32,
    pub name_max: u32,
    pub fragment_size: u32,
}

pub trait StatfsAnswer: Answer {
    fn statfs(self, figures: &StatfsFigures);
}

pub trait XattrAnswer: Answer {
    /// The size the value (or the name list) would take: the caller asked
    /// with a zero-sized buffer.
    fn size(self, size: u32);
    fn data(self, data: &[u8]);
}

pub trait LseekAnswer: Answer {
    fn offset(self, offset: i64);
}

pub trait IoctlAnswer: Answer {
    fn ioctl(self, result: i32, data: &[u8]);
}

/// A readdir answer filled entry by entry up to the size the kernel asked
/// for; `add` says true (and takes nothing) once the entry does not fit.
pub trait DirectoryAnswer: Answer {
    #[must_use]
    fn add(&mut self, ino: INodeNo, offset: u64, kind: FileType, name: &OsStr) -> bool;
    fn ok(self);
}

pub trait DirectoryPlusAnswer: Answer {
    #[must_use]
    fn add(
        &mut self,
        offset: u64,
        name: &OsStr,
        ttl: &Duration,
        attr: &FileAttr,
        generation: Generation,
    ) -> bool;
    fn ok(self);
}

// fuser's replies, for the /dev/fuse transport: each answer forwards to
// the reply method of the same name.

macro_rules! fuser_answer {
    ($($reply:ty),* $(,)?) => {
        $(impl Answer for $reply {
            fn error(self, errno: Errno) {
                <$reply>::error(self, errno)
            }
        })*
    };
}

fuser_answer!(
    fuser::ReplyEmpty,
    fuser::ReplyEntry,
    fuser::ReplyAttr,
    fuser::ReplyData,
    fuser::ReplyOpen,
    fuser::ReplyWrite,
    fuser::ReplyCreate,
    fuser::ReplyStatfs,
    fuser::ReplyXattr,
    fuser::ReplyLseek,
    fuser::ReplyIoctl,
    fuser::ReplyDirectory,
    fuser::ReplyDirectoryPlus,
);

impl EmptyAnswer for fuser::ReplyEmpty {
    fn ok(self) {
        fuser::ReplyEmpty::ok(self)
    }
}

impl EntryAnswer for fuser::ReplyEntry {
    fn entry(self, ttl: &Duration, attr: &FileAttr, generation: Generation) {
        fuser::ReplyEntry::entry(self, ttl, attr, generation)
    }
}

impl AttrAnswer for fuser::ReplyAttr {
    fn attr(self, ttl: &Duration, attr: &FileAttr) {
        fuser::ReplyAttr::attr(self, ttl, attr)
    }
}

impl DataAnswer for fuser::ReplyData {
    fn data(self, data: &[u8]) {
        fuser::ReplyData::data(self, data)
    }
}

impl OpenAnswer for fuser::ReplyOpen {
    fn opened(self, fh: FileHandle, flags: FopenFlags) {
        fuser::ReplyOpen::opened(self, fh, flags)
    }
}

impl WriteAnswer for fuser::ReplyWrite {
    fn written(self, size: u32) {
        fuser::ReplyWrite::written(self, size)
    }
}

impl CreateAnswer for fuser::ReplyCreate {
    fn created(
        self,
        ttl: &Duration,
        attr: &FileAttr,
        generation: Generation,
        fh: FileHandle,
        flags: FopenFlags,
    ) {
        fuser::ReplyCreate::created(self, ttl, attr, generation, fh, flags)
    }
}

impl StatfsAnswer for fuser::ReplyStatfs {
    fn statfs(self, figures: &StatfsFigures) {
        fuser::ReplyStatfs::statfs(
            self,
            figures.blocks,
            figures.free_blocks,
            figures.available_blocks,
            figures.files,
            figures.free_files,
            figures.block_size,
            figures.name_max,
            figures.fragment_size,
        )
    }
}

impl XattrAnswer for fuser::ReplyXattr {
    fn size(self, size: u32) {
        fuser::ReplyXattr::size(self, size)
    }

    fn data(self, data: &[u8]) {
        fuser::ReplyXattr::data(self, data)
    }
}

impl LseekAnswer for fuser::ReplyLseek {
    fn offset(self, offset: i64) {
        fuser::ReplyLseek::offset(self, offset)
    }
}

impl IoctlAnswer for fuser::ReplyIoctl {
    fn ioctl(self, result: i32, data: &[u8]) {
        fuser::ReplyIoctl::ioctl(self, result, data)
    }
}

impl DirectoryAnswer for fuser::ReplyDirectory {
    fn add(&mut self, ino: INodeNo, offset: u64, kind: FileType, name: &OsStr) -> bool {
        fuser::ReplyDirectory::add(self, ino, offset, kind, name)
    }

    fn ok(self) {
        fuser::ReplyDirectory::ok(self)
    }
}

impl DirectoryPlusAnswer for fuser::ReplyDirectoryPlus {
    fn add(
        &mut self,
        offset: u64,
        name: &OsStr,
        ttl: &Duration,
        attr: &FileAttr,
        generation: Generation,
    ) -> bool {
        // fuser names the entry by the attributes' inode too.
        fuser::ReplyDirectoryPlus::add(self, attr.ino, offset, name, ttl, attr, generation)
    }

    fn ok(self) {
        fuser::ReplyDirectoryPlus::ok(self)
    }
}
