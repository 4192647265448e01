//! fuser's requests answered from the tree: each handler counts its
//! request, does its work under the tree's lock and replies after letting
//! it go. What jext4 answers that the kernel could tell apart (negative
//! entries, open flags, capabilities) is answered the same way here.

use std::ffi::OsStr;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::time::SystemTime;

use fuser::{
    AccessFlags, Errno, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo,
    InitFlags, KernelConfig, LockOwner, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite,
    ReplyXattr, Request, TimeOrNow, WriteFlags,
};

use super::tree::{self, Changes, Content, Directory};
use super::{
    FloorFs, MAX_WRITE, Operation, STATS_XATTR, TTL, errno, maker, negative_entry, reply_empty,
    reply_entry, reply_xattr,
};

impl Filesystem for FloorFs {
    fn init(&mut self, _request: &Request, config: &mut KernelConfig) -> io::Result<()> {
        // Each one jext4 takes where the kernel offers it (`FuseAdapter::init`).
        for wanted in [
            InitFlags::FUSE_PARALLEL_DIROPS,
            InitFlags::FUSE_DO_READDIRPLUS,
            InitFlags::FUSE_HANDLE_KILLPRIV_V2,
            InitFlags::FUSE_EXPORT_SUPPORT,
            InitFlags::FUSE_POSIX_ACL | InitFlags::FUSE_DONT_MASK,
        ] {
            let _ = config.add_capabilities(wanted);
        }
        let _ = config.set_max_write(MAX_WRITE);
        Ok(())
    }

    fn forget(&self, _request: &Request, ino: INodeNo, nlookup: u64) {
        self.begin(Operation::Forget).forget(ino.0, nlookup);
    }

    fn lookup(&self, _request: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let result = self
            .begin(Operation::Lookup)
            .lookup(parent.0, name.as_bytes());
        // "." and ".." come from file-handle decoding, which wants a plain
        // ENOENT, not a cached dentry (as jext4 answers).
        let dots = matches!(name.as_bytes(), b"." | b"..");
        match result {
            Err(libc::ENOENT) if !dots => reply.entry(&TTL, &negative_entry(), Generation(0)),
            result => reply_entry(reply, result),
        }
    }

    fn getattr(&self, _request: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let result = self
            .begin(Operation::Getattr)
            .node(ino.0)
            .map(|node| node.attr(ino.0));
        match result {
            Ok(attr) => reply.attr(&TTL, &attr),
            Err(code) => reply.error(errno(code)),
        }
    }

    fn setattr(
        &self,
        _request: &Request,
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
        let changes = Changes {
            mode: mode.map(|mode| (mode & 0o7777) as u16),
            uid,
            gid,
            size,
            atime,
            mtime,
            ctime,
        };
        let result = self.begin(Operation::Setattr).setattr(ino.0, &changes);
        match result {
            Ok(attr) => reply.attr(&TTL, &attr),
            Err(code) => reply.error(errno(code)),
        }
    }

    fn readlink(&self, _request: &Request, ino: INodeNo, reply: ReplyData) {
        let result = match self
            .begin(Operation::Readlink)
            .node(ino.0)
            .map(|node| &node.content)
        {
            Ok(Content::Symlink(target)) => Ok(target.clone()),
            Ok(_) => Err(libc::EINVAL),
            Err(code) => Err(code),
        };
        match result {
            Ok(target) => reply.data(&target),
            Err(code) => reply.error(errno(code)),
        }
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
        let content = match mode & libc::S_IFMT {
            libc::S_IFREG => Content::File(Vec::new()),
            libc::S_IFIFO => Content::Special(FileType::NamedPipe, rdev),
            libc::S_IFCHR => Content::Special(FileType::CharDevice, rdev),
            libc::S_IFBLK => Content::Special(FileType::BlockDevice, rdev),
            libc::S_IFSOCK => Content::Special(FileType::Socket, rdev),
            _ => return reply.error(Errno::EINVAL),
        };
        let maker = maker(request, mode, umask);
        let result = self
            .begin(Operation::Mknod)
            .make(parent.0, name.as_bytes(), content, &maker);
        reply_entry(reply, result);
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
        let content = Content::Directory(Directory::new(parent.0));
        let maker = maker(request, mode, umask);
        let result = self
            .begin(Operation::Mkdir)
            .make(parent.0, name.as_bytes(), content, &maker);
        reply_entry(reply, result);
    }

    fn unlink(&self, _request: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let result = self
            .begin(Operation::Unlink)
            .unlink(parent.0, name.as_bytes());
        reply_empty(reply, result);
    }

    fn rmdir(&self, _request: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let result = self
            .begin(Operation::Rmdir)
            .rmdir(parent.0, name.as_bytes());
        reply_empty(reply, result);
    }

    fn symlink(
        &self,
        request: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let content = Content::Symlink(target.as_os_str().as_bytes().to_vec());
        let maker = maker(request, 0o777, 0);
        let result =
            self.begin(Operation::Symlink)
                .make(parent.0, link_name.as_bytes(), content, &maker);
        reply_entry(reply, result);
    }

    fn rename(
        &self,
        _request: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let mut tree = self.begin(Operation::Rename);
        if flags.contains(RenameFlags::RENAME_WHITEOUT) {
            drop(tree);
            return reply.error(Errno::EINVAL);
        }
        let result = tree.rename(
            (parent.0, name.as_bytes()),
            (newparent.0, newname.as_bytes()),
            flags.contains(RenameFlags::RENAME_NOREPLACE),
            flags.contains(RenameFlags::RENAME_EXCHANGE),
        );
        drop(tree);
        reply_empty(reply, result);
    }

    fn link(
        &self,
        _request: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let result = self
            .begin(Operation::Link)
            .link(ino.0, newparent.0, newname.as_bytes());
        reply_entry(reply, result);
    }

    fn open(&self, _request: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let result = self.begin(Operation::Open).open(ino.0).map(|node| {
            if node.access_changes_atime(SystemTime::now()) {
                FopenFlags::FOPEN_NOFLUSH
            } else {
                FopenFlags::FOPEN_NOFLUSH | FopenFlags::FOPEN_KEEP_CACHE
            }
        });
        match result {
            Ok(flags) => reply.opened(FileHandle(0), flags),
            Err(code) => reply.error(errno(code)),
        }
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
        let result = self.begin(Operation::Read).read(ino.0, offset, size);
        match result {
            Ok(data) => reply.data(&data),
            Err(code) => reply.error(errno(code)),
        }
    }

    fn write(
        &self,
        _request: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let kill = write_flags.contains(WriteFlags::FUSE_WRITE_KILL_SUIDGID);
        let result = self
            .begin(Operation::Write)
            .write(ino.0, offset, data, kill);
        match result {
            Ok(written) => reply.written(written),
            Err(code) => reply.error(errno(code)),
        }
    }

    fn flush(
        &self,
        _request: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        self.count(Operation::Flush);
        reply.ok();
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
        self.begin(Operation::Release).release(ino.0);
        reply.ok();
    }

    fn fsync(
        &self,
        _request: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        let result = self.begin(Operation::Fsync).node(ino.0).map(|_| ());
        self.synced(reply, result);
    }

    fn opendir(&self, _request: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let tree = self.begin(Operation::Opendir);
        let result = tree
            .directory(ino.0)
            .and_then(|_| tree.node(ino.0))
            .map(|node| {
                if node.access_changes_atime(SystemTime::now()) {
                    FopenFlags::empty()
                } else {
                    FopenFlags::FOPEN_CACHE_DIR | FopenFlags::FOPEN_KEEP_CACHE
                }
            });
        drop(tree);
        match result {
            Ok(flags) => reply.opened(FileHandle(0), flags),
            Err(code) => reply.error(errno(code)),
        }
    }

    fn readdir(
        &self,
        _request: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let result = self.begin(Operation::Readdir).list(ino.0, offset, |entry| {
            reply.add(
                INodeNo(entry.ino),
                entry.next,
                entry.node.kind(),
                OsStr::from_bytes(entry.name),
            )
        });
        match result {
            Ok(()) => reply.ok(),
            Err(code) => reply.error(errno(code)),
        }
    }

    fn readdirplus(
        &self,
        _request: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let mut tree = self.begin(Operation::Readdirplus);
        // The kernel counts a lookup for every entry it receives but "."
        // and ".."; one that does not fit is not sent.
        let mut sent = Vec::new();
        let result = tree.list(ino.0, offset, |entry| {
            let attr = entry.node.attr(entry.ino);
            let name = OsStr::from_bytes(entry.name);
            let full = reply.add(
                INodeNo(entry.ino),
                entry.next,
                name,
                &TTL,
                &attr,
                Generation(0),
            );
            if !full && !matches!(entry.name, b"." | b"..") {
                sent.push(entry.ino);
            }
            full
        });
        for entry in sent {
            let _ = tree.remember(entry);
        }
        drop(tree);
        match result {
            Ok(()) => reply.ok(),
            Err(code) => reply.error(errno(code)),
        }
    }

    fn releasedir(
        &self,
        _request: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        self.count(Operation::Releasedir);
        reply.ok();
    }

    fn fsyncdir(
        &self,
        _request: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        let result = self.begin(Operation::Fsyncdir).directory(ino.0).map(|_| ());
        self.synced(reply, result);
    }

    fn statfs(&self, _request: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let tree = self.begin(Operation::Statfs);
        let (blocks, used, nodes) = (
            tree.capacity_blocks,
            tree.used_blocks,
            tree.nodes.len() as u64,
        );
        drop(tree);
        // Inodes as mkfs.ext4 makes them: one per 16 KiB.
        let files = (blocks / 4).max(nodes);
        let free = blocks - used;
        let block = tree::BLOCK_SIZE as u32;
        reply.statfs(
            blocks,
            free,
            free,
            files,
            files - nodes,
            block,
            tree::NAME_MAX as u32,
            block,
        );
    }

    fn setxattr(
        &self,
        _request: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        let result = self
            .begin(Operation::Setxattr)
            .setxattr(ino.0, name.as_bytes(), value, flags);
        reply_empty(reply, result);
    }

    fn getxattr(
        &self,
        _request: &Request,
        ino: INodeNo,
        name: &OsStr,
        size: u32,
        reply: ReplyXattr,
    ) {
        if ino.0 == tree::ROOT && name.as_bytes() == STATS_XATTR {
            let stats = self.shared.stats_json().to_string().into_bytes();
            return reply_xattr(reply, Ok(stats), size);
        }
        let result = self
            .begin(Operation::Getxattr)
            .getxattr(ino.0, name.as_bytes());
        reply_xattr(reply, result, size);
    }

    fn listxattr(&self, _request: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        let result = self.begin(Operation::Listxattr).listxattr(ino.0);
        reply_xattr(reply, result, size);
    }

    fn removexattr(&self, _request: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let result = self
            .begin(Operation::Removexattr)
            .removexattr(ino.0, name.as_bytes());
        reply_empty(reply, result);
    }

    fn access(&self, _request: &Request, ino: INodeNo, _mask: AccessFlags, reply: ReplyEmpty) {
        // The kernel checks permissions (default_permissions).
        let result = self.begin(Operation::Access).node(ino.0).map(|_| ());
        reply_empty(reply, result);
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
        let maker = maker(request, mode, umask);
        let mut tree = self.begin(Operation::Create);
        let result = tree
            .make(parent.0, name.as_bytes(), Content::File(Vec::new()), &maker)
            .and_then(|attr| tree.open(attr.ino.0).map(|_| attr));
        drop(tree);
        match result {
            Ok(attr) => reply.created(
                &TTL,
                &attr,
                Generation(0),
                FileHandle(0),
                FopenFlags::FOPEN_NOFLUSH,
            ),
            Err(code) => reply.error(errno(code)),
        }
    }

    fn fallocate(
        &self,
        _request: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let mut tree = self.begin(Operation::Fallocate);
        let result = match mode {
            0 => tree.fallocate(ino.0, offset, length),
            _ => Err(libc::EOPNOTSUPP),
        };
        drop(tree);
        reply_empty(reply, result);
    }
}
