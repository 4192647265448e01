//! The `/dev/fuse` transport: fuser's session reads each request, decodes
//! it and calls this `Filesystem`, which hands it to the adapter with
//! fuser's reply as the answer (`answer.rs`). Nothing is decided here but
//! the translation of fuser's arguments; FUSE_INIT is where the adapter
//! chooses the capabilities, FUSE_OVER_IO_URING among them.
//!
//! With the io_uring transport live, the kernel still sends FORGET,
//! BATCH_FORGET and INTERRUPT here (`fs/fuse/dev_uring.c`: only requests
//! that expect an answer go through the ring), and the adapter's
//! invalidations (`fuser::Notifier`) are written here.

use super::answer::Origin;
use super::sync_pool::SyncPool;
use super::turns::ReadTurns;
use super::{FuseAdapter, time_set, timestamp};
use crate::fs::SetAttr;
use fuser::{
    AccessFlags, FileHandle, Filesystem, INodeNo, IoctlFlags, KernelConfig, LockOwner, OpenFlags,
    ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry,
    ReplyIoctl, ReplyLseek, ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow,
    WriteFlags,
};
use std::ffi::OsStr;
use std::path::Path;
use std::sync::{Arc, OnceLock};
use std::time::SystemTime;

pub struct DevSession {
    adapter: Arc<FuseAdapter>,
    /// Ask the kernel for FUSE_OVER_IO_URING in FUSE_INIT.
    want_uring: bool,
    /// Set at FUSE_INIT: whether the kernel took io_uring.
    uring_taken: Arc<OnceLock<bool>>,
    /// Where fsync and fsyncdir wait for their commits (`sync_pool.rs`).
    syncs: Arc<SyncPool>,
    /// Which worker reads next (`turns.rs`).
    turns: Arc<ReadTurns>,
}

impl DevSession {
    pub fn new(
        adapter: Arc<FuseAdapter>,
        want_uring: bool,
        uring_taken: Arc<OnceLock<bool>>,
        syncs: Arc<SyncPool>,
        turns: Arc<ReadTurns>,
    ) -> Self {
        DevSession {
            adapter,
            want_uring,
            uring_taken,
            syncs,
            turns,
        }
    }
}

impl DevSession {
    /// Hand a request that waits for a commit to the sync pool (or run it
    /// here: `SyncPool::run` decides from the requests in service).
    fn wait_for_commit(&self, job: impl FnOnce(&FuseAdapter) + Send + 'static) {
        let adapter = Arc::clone(&self.adapter);
        let busy = adapter.metrics().in_flight();
        self.syncs.run(busy, move || job(&adapter));
    }
}

impl Filesystem for DevSession {
    fn init(&mut self, _request: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        let taken = self.adapter.init(config, self.want_uring);
        let _ = self.uring_taken.set(taken);
        Ok(())
    }

    // BATCH_FORGET: fuser's default hands each node to forget(), so a turn
    // here must not park mid-batch.
    fn forget(&self, _request: &Request, ino: INodeNo, nlookup: u64) {
        let _turn = self.turns.take_briefly();
        self.adapter.forget(ino, nlookup);
    }

    fn lookup(&self, _request: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let _turn = self.turns.take();
        self.adapter.lookup(parent, name, reply);
    }

    fn getattr(&self, _request: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let _turn = self.turns.take();
        self.adapter.getattr(ino, reply);
    }

    fn setattr(
        &self,
        request: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let _turn = self.turns.take();
        let changes = SetAttr {
            mode: mode.map(|mode| (mode & 0o7777) as u16),
            uid,
            gid,
            size,
            atime: atime.map(time_set),
            mtime: mtime.map(time_set),
            ctime: ctime.map(timestamp),
        };
        self.adapter
            .setattr(&Origin::from(request), ino, &changes, reply);
    }

    fn readlink(&self, _request: &Request, ino: INodeNo, reply: ReplyData) {
        let _turn = self.turns.take();
        self.adapter.readlink(ino, reply);
    }

    fn mknod(
        &self,
        request: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        let _turn = self.turns.take();
        self.adapter.mknod(
            &Origin::from(request),
            parent,
            name,
            mode,
            umask,
            rdev,
            reply,
        );
    }

    fn mkdir(
        &self,
        request: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let _turn = self.turns.take();
        self.adapter
            .mkdir(&Origin::from(request), parent, name, mode, umask, reply);
    }

    fn unlink(&self, request: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let _turn = self.turns.take();
        self.adapter
            .unlink(&Origin::from(request), parent, name, reply);
    }

    fn rmdir(&self, request: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let _turn = self.turns.take();
        self.adapter
            .rmdir(&Origin::from(request), parent, name, reply);
    }

    fn symlink(
        &self,
        request: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let _turn = self.turns.take();
        self.adapter
            .symlink(&Origin::from(request), parent, link_name, target, reply);
    }

    fn rename(
        &self,
        request: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: fuser::RenameFlags,
        reply: ReplyEmpty,
    ) {
        let _turn = self.turns.take();
        self.adapter.rename(
            &Origin::from(request),
            parent,
            name,
            newparent,
            newname,
            flags,
            reply,
        );
    }

    fn link(
        &self,
        request: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let _turn = self.turns.take();
        self.adapter
            .link(&Origin::from(request), ino, newparent, newname, reply);
    }

    fn open(&self, _request: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let _turn = self.turns.take();
        self.adapter.open(ino, flags.0, reply);
    }

    fn read(
        &self,
        _request: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let _turn = self.turns.take();
        self.adapter.read(ino, offset, size, reply);
    }

    fn write(
        &self,
        request: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let _turn = self.turns.take();
        self.adapter.write(
            &Origin::from(request),
            ino,
            offset,
            data,
            write_flags,
            reply,
        );
    }

    fn flush(
        &self,
        _request: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        let _turn = self.turns.take();
        self.adapter.flush(reply);
    }

    fn release(
        &self,
        _request: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let _turn = self.turns.take();
        self.adapter.release(ino, reply);
    }

    fn fsync(
        &self,
        _request: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        let _turn = self.turns.take();
        self.wait_for_commit(move |adapter| adapter.fsync(ino, datasync, reply));
    }

    fn opendir(&self, _request: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let _turn = self.turns.take();
        self.adapter.opendir(ino, reply);
    }

    fn readdir(
        &self,
        _request: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        reply: ReplyDirectory,
    ) {
        let _turn = self.turns.take();
        self.adapter.readdir(ino, offset, reply);
    }

    fn readdirplus(
        &self,
        _request: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        reply: ReplyDirectoryPlus,
    ) {
        let _turn = self.turns.take();
        self.adapter.readdirplus(ino, offset, reply);
    }

    fn releasedir(
        &self,
        _request: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        let _turn = self.turns.take();
        self.adapter.releasedir(ino, reply);
    }

    fn fsyncdir(
        &self,
        _request: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        let _turn = self.turns.take();
        self.wait_for_commit(move |adapter| adapter.fsyncdir(ino, reply));
    }

    fn ioctl(
        &self,
        request: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _flags: IoctlFlags,
        cmd: u32,
        in_data: &[u8],
        out_size: u32,
        reply: ReplyIoctl,
    ) {
        let _turn = self.turns.take();
        self.adapter
            .ioctl(&Origin::from(request), ino, cmd, in_data, out_size, reply);
    }

    fn statfs(&self, _request: &Request, ino: INodeNo, reply: ReplyStatfs) {
        let _turn = self.turns.take();
        self.adapter.statfs(ino, reply);
    }

    fn setxattr(
        &self,
        request: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        let _turn = self.turns.take();
        self.adapter
            .setxattr(&Origin::from(request), ino, name, value, flags, reply);
    }

    fn getxattr(
        &self,
        _request: &Request,
        ino: INodeNo,
        name: &OsStr,
        size: u32,
        reply: ReplyXattr,
    ) {
        let _turn = self.turns.take();
        self.adapter.getxattr(ino, name, size, reply);
    }

    fn listxattr(&self, _request: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        let _turn = self.turns.take();
        self.adapter.listxattr(ino, size, reply);
    }

    fn removexattr(&self, request: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let _turn = self.turns.take();
        self.adapter
            .removexattr(&Origin::from(request), ino, name, reply);
    }

    fn access(&self, _request: &Request, ino: INodeNo, _mask: AccessFlags, reply: ReplyEmpty) {
        let _turn = self.turns.take();
        self.adapter.access(ino, reply);
    }

    fn create(
        &self,
        request: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        let _turn = self.turns.take();
        self.adapter
            .create(&Origin::from(request), parent, name, mode, umask, reply);
    }

    fn fallocate(
        &self,
        request: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let _turn = self.turns.take();
        self.adapter
            .fallocate(&Origin::from(request), ino, offset, length, mode, reply);
    }

    fn lseek(
        &self,
        _request: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: i64,
        whence: i32,
        reply: ReplyLseek,
    ) {
        let _turn = self.turns.take();
        self.adapter.lseek(ino, offset, whence, reply);
    }
}
