//! The floor's whole filesystem: a map of inode numbers to nodes, held in
//! memory under one lock (`FloorFs`). It answers the namespace and data
//! operations the benchmarks make with the errno kernel ext4 gives for the
//! cases they meet (EEXIST, ENOENT, ENOTEMPTY, ENOSPC, ...), and counts the
//! space its files take as a filesystem would: 4 KiB blocks per file
//! (holes included: a file is one `Vec`), one block per directory, one per
//! symlink whose target does not fit in the inode (ext4's 60 bytes).
//!
//! Inode numbers are never reused (a counter), so generations are all 0; a
//! node lives while it has a name, an open handle or a kernel lookup, as an
//! inode does under FUSE; its data goes as soon as it has neither a name
//! nor an open handle.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, SystemTime};

use fuser::{FileAttr, FileType, INodeNo, TimeOrNow};

pub const BLOCK_SIZE: u64 = 4096;
pub const ROOT: u64 = 1;
/// ext4's limit on a name (EXT4_NAME_LEN).
pub const NAME_MAX: usize = 255;
/// Symlink targets up to this length live in the inode (ext4's i_block).
const FAST_SYMLINK_MAX: usize = 60;
/// The first readdir cookie of a real entry: 1 and 2 are "." and "..".
const FIRST_COOKIE: u64 = 3;

/// An errno, answered to the kernel as it is.
pub type Errno = i32;
pub type Result<T> = std::result::Result<T, Errno>;

pub enum Content {
    File(Vec<u8>),
    Directory(Directory),
    Symlink(Vec<u8>),
    /// A device node, fifo or socket: its type and device number.
    Special(FileType, u32),
}

/// Entries by name, and by a cookie that stays valid while others come and
/// go, so a listing resumed at an offset neither skips nor repeats one.
#[derive(Default)]
pub struct Directory {
    pub parent: u64,
    pub next_cookie: u64,
    pub by_name: HashMap<Vec<u8>, (u64, u64)>,
    pub by_cookie: BTreeMap<u64, (Vec<u8>, u64)>,
}

impl Directory {
    pub fn new(parent: u64) -> Directory {
        Directory {
            parent,
            next_cookie: FIRST_COOKIE,
            ..Directory::default()
        }
    }

    fn get(&self, name: &[u8]) -> Option<u64> {
        self.by_name.get(name).map(|&(ino, _)| ino)
    }

    pub fn insert(&mut self, name: &[u8], ino: u64) {
        let cookie = self.next_cookie;
        self.next_cookie += 1;
        let old = self.by_name.insert(name.to_vec(), (ino, cookie));
        debug_assert!(old.is_none(), "a name added twice");
        self.by_cookie.insert(cookie, (name.to_vec(), ino));
    }

    fn remove(&mut self, name: &[u8]) -> Option<u64> {
        let (ino, cookie) = self.by_name.remove(name)?;
        self.by_cookie.remove(&cookie);
        Some(ino)
    }
}

pub struct Node {
    pub content: Content,
    /// Permission bits (07777); the type is the content's.
    pub mode: u16,
    pub uid: u32,
    pub gid: u32,
    pub nlink: u32,
    pub atime: SystemTime,
    pub mtime: SystemTime,
    pub ctime: SystemTime,
    pub xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
    /// The kernel's lookup count (FORGET lowers it).
    pub lookups: u64,
    /// Open file handles (RELEASE closes them).
    pub opens: u32,
}

impl Node {
    pub fn kind(&self) -> FileType {
        match &self.content {
            Content::File(_) => FileType::RegularFile,
            Content::Directory(_) => FileType::Directory,
            Content::Symlink(_) => FileType::Symlink,
            Content::Special(kind, _) => *kind,
        }
    }

    /// The blocks this node's data takes.
    pub fn blocks(&self) -> u64 {
        match &self.content {
            Content::File(data) => blocks_of(data.len() as u64),
            Content::Directory(_) => 1,
            Content::Symlink(target) => u64::from(target.len() > FAST_SYMLINK_MAX),
            Content::Special(..) => 0,
        }
    }

    fn size(&self) -> u64 {
        match &self.content {
            Content::File(data) | Content::Symlink(data) => data.len() as u64,
            Content::Directory(_) => BLOCK_SIZE,
            Content::Special(..) => 0,
        }
    }

    /// Whether reading or listing it now would change its atime, under
    /// relatime (`fs/inode.c: relatime_need_update`, as jext4's default):
    /// the kernel may serve it from its caches only where not.
    pub fn access_changes_atime(&self, now: SystemTime) -> bool {
        self.atime <= self.mtime
            || self.atime <= self.ctime
            || now
                .duration_since(self.atime)
                .is_ok_and(|age| age >= Duration::from_secs(24 * 3600))
    }

    pub fn attr(&self, ino: u64) -> FileAttr {
        let rdev = match self.content {
            Content::Special(_, rdev) => rdev,
            _ => 0,
        };
        FileAttr {
            ino: INodeNo(ino),
            size: self.size(),
            blocks: self.blocks() * (BLOCK_SIZE / 512),
            atime: self.atime,
            mtime: self.mtime,
            ctime: self.ctime,
            crtime: self.ctime,
            kind: self.kind(),
            perm: self.mode,
            nlink: self.nlink,
            uid: self.uid,
            gid: self.gid,
            rdev,
            blksize: BLOCK_SIZE as u32,
            flags: 0,
        }
    }
}

pub fn blocks_of(bytes: u64) -> u64 {
    bytes.div_ceil(BLOCK_SIZE)
}

/// Who makes a node, and with what permission bits (the umask applied).
pub struct Maker {
    pub uid: u32,
    pub gid: u32,
    pub mode: u16,
}

/// The changes of a SETATTR.
#[derive(Default)]
pub struct Changes {
    pub mode: Option<u16>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<TimeOrNow>,
    pub mtime: Option<TimeOrNow>,
    pub ctime: Option<SystemTime>,
}

pub struct Tree {
    pub nodes: HashMap<u64, Node>,
    pub next_ino: u64,
    pub used_blocks: u64,
    pub capacity_blocks: u64,
}

impl Tree {
    pub fn new(capacity_bytes: u64, root_uid: u32, root_gid: u32) -> Tree {
        let mut tree = Tree {
            nodes: HashMap::new(),
            next_ino: ROOT + 1,
            used_blocks: 0,
            capacity_blocks: capacity_bytes / BLOCK_SIZE,
        };
        let root = new_node(
            Content::Directory(Directory::new(ROOT)),
            &Maker {
                uid: root_uid,
                gid: root_gid,
                mode: 0o755,
            },
            2,
        );
        tree.used_blocks = root.blocks();
        tree.nodes.insert(ROOT, root);
        tree
    }

    pub fn node(&self, ino: u64) -> Result<&Node> {
        self.nodes.get(&ino).ok_or(libc::ENOENT)
    }

    pub fn node_mut(&mut self, ino: u64) -> Result<&mut Node> {
        self.nodes.get_mut(&ino).ok_or(libc::ENOENT)
    }

    pub fn directory(&self, ino: u64) -> Result<&Directory> {
        match &self.node(ino)?.content {
            Content::Directory(directory) => Ok(directory),
            _ => Err(libc::ENOTDIR),
        }
    }

    fn directory_mut(&mut self, ino: u64) -> Result<&mut Directory> {
        match &mut self.node_mut(ino)?.content {
            Content::Directory(directory) => Ok(directory),
            _ => Err(libc::ENOTDIR),
        }
    }

    /// The entry `name` of `parent`, its lookup counted. "." and ".." are
    /// what the kernel asks when it decodes a file handle.
    pub fn lookup(&mut self, parent: u64, name: &[u8]) -> Result<FileAttr> {
        let ino = match name {
            b"." => parent,
            b".." => self.directory(parent)?.parent,
            _ => self.directory(parent)?.get(name).ok_or(libc::ENOENT)?,
        };
        self.remember(ino)
    }

    /// One more kernel lookup of `ino`; its attributes.
    pub fn remember(&mut self, ino: u64) -> Result<FileAttr> {
        let node = self.node_mut(ino)?;
        node.lookups += 1;
        Ok(node.attr(ino))
    }

    pub fn forget(&mut self, ino: u64, lookups: u64) {
        if let Some(node) = self.nodes.get_mut(&ino) {
            debug_assert!(
                node.lookups >= lookups,
                "the kernel forgot more than it looked up"
            );
            node.lookups = node.lookups.saturating_sub(lookups);
            self.release_if_unused(ino);
        }
    }

    /// Take a nameless node's data back once nothing has it open, and the
    /// node itself once the kernel has forgotten it too.
    fn release_if_unused(&mut self, ino: u64) {
        let Some(node) = self.nodes.get_mut(&ino) else {
            return;
        };
        if node.nlink > 0 || node.opens > 0 || ino == ROOT {
            return;
        }
        self.used_blocks -= node.blocks();
        if let Content::File(data) = &mut node.content {
            *data = Vec::new();
        }
        self.used_blocks += node.blocks();
        if node.lookups == 0 {
            let node = self.nodes.remove(&ino);
            self.used_blocks -= node.map_or(0, |node| node.blocks());
        }
    }

    /// Make `name` in `parent` (create, mknod, mkdir, symlink); its
    /// attributes, one lookup counted.
    pub fn make(
        &mut self,
        parent: u64,
        name: &[u8],
        content: Content,
        maker: &Maker,
    ) -> Result<FileAttr> {
        check_name(name)?;
        let parent_node = self.node(parent)?;
        let setgid = parent_node.mode & libc::S_ISGID as u16 != 0;
        let group = if setgid { parent_node.gid } else { maker.gid };
        if self.directory(parent)?.get(name).is_some() {
            return Err(libc::EEXIST);
        }
        let is_directory = matches!(content, Content::Directory(_));
        let mut node = new_node(content, maker, if is_directory { 2 } else { 1 });
        node.gid = group;
        if is_directory && setgid {
            node.mode |= libc::S_ISGID as u16;
        }
        self.charge(node.blocks())?;
        let ino = self.next_ino;
        self.next_ino += 1;
        self.nodes.insert(ino, node);
        self.directory_mut(parent)?.insert(name, ino);
        let parent_node = self.node_mut(parent)?;
        if is_directory {
            parent_node.nlink += 1;
        }
        touch_change(parent_node);
        self.remember(ino)
    }

    /// Blocks more for data, or ENOSPC.
    fn charge(&mut self, blocks: u64) -> Result<()> {
        if self.used_blocks + blocks > self.capacity_blocks {
            return Err(libc::ENOSPC);
        }
        self.used_blocks += blocks;
        Ok(())
    }

    pub fn link(&mut self, ino: u64, parent: u64, name: &[u8]) -> Result<FileAttr> {
        check_name(name)?;
        if matches!(self.node(ino)?.content, Content::Directory(_)) {
            return Err(libc::EPERM);
        }
        if self.directory(parent)?.get(name).is_some() {
            return Err(libc::EEXIST);
        }
        self.directory_mut(parent)?.insert(name, ino);
        touch_change(self.node_mut(parent)?);
        let node = self.node_mut(ino)?;
        node.nlink += 1;
        node.ctime = SystemTime::now();
        self.remember(ino)
    }

    pub fn unlink(&mut self, parent: u64, name: &[u8]) -> Result<()> {
        let ino = self.directory(parent)?.get(name).ok_or(libc::ENOENT)?;
        if matches!(self.node(ino)?.content, Content::Directory(_)) {
            return Err(libc::EISDIR);
        }
        self.directory_mut(parent)?.remove(name);
        touch_change(self.node_mut(parent)?);
        self.drop_link(ino);
        Ok(())
    }

    pub fn rmdir(&mut self, parent: u64, name: &[u8]) -> Result<()> {
        let ino = self.directory(parent)?.get(name).ok_or(libc::ENOENT)?;
        if !self.directory(ino)?.by_name.is_empty() {
            return Err(libc::ENOTEMPTY);
        }
        self.directory_mut(parent)?.remove(name);
        let parent_node = self.node_mut(parent)?;
        parent_node.nlink -= 1;
        touch_change(parent_node);
        self.drop_link(ino);
        Ok(())
    }

    /// A name of `ino` went: a directory loses both its links.
    fn drop_link(&mut self, ino: u64) {
        if let Some(node) = self.nodes.get_mut(&ino) {
            node.nlink = match node.content {
                Content::Directory(_) => 0,
                _ => node.nlink - 1,
            };
            node.ctime = SystemTime::now();
            self.release_if_unused(ino);
        }
    }

    pub fn open(&mut self, ino: u64) -> Result<&Node> {
        let node = self.node_mut(ino)?;
        node.opens += 1;
        Ok(&*node)
    }

    pub fn release(&mut self, ino: u64) {
        if let Some(node) = self.nodes.get_mut(&ino) {
            debug_assert!(node.opens > 0, "a release without an open");
            node.opens = node.opens.saturating_sub(1);
            self.release_if_unused(ino);
        }
    }

    /// Up to `size` bytes at `offset`; an access that relatime records
    /// moves the atime.
    pub fn read(&mut self, ino: u64, offset: u64, size: u32) -> Result<Vec<u8>> {
        let node = self.node_mut(ino)?;
        let now = SystemTime::now();
        if node.access_changes_atime(now) {
            node.atime = now;
        }
        let Content::File(data) = &node.content else {
            return Err(libc::EISDIR);
        };
        let start = (offset.min(data.len() as u64)) as usize;
        let end = start.saturating_add(size as usize).min(data.len());
        Ok(data[start..end].to_vec())
    }

    /// Write `bytes` at `offset`: as much as the free blocks hold (a short
    /// write), ENOSPC when not a byte fits. `kill_suid_gid`: the kernel
    /// asks the server to drop setuid and setgid (FUSE_HANDLE_KILLPRIV_V2).
    pub fn write(
        &mut self,
        ino: u64,
        offset: u64,
        bytes: &[u8],
        kill_suid_gid: bool,
    ) -> Result<u32> {
        let free = self.capacity_blocks - self.used_blocks;
        let node = self.node_mut(ino)?;
        let Content::File(data) = &mut node.content else {
            return Err(libc::EISDIR);
        };
        let end = offset.checked_add(bytes.len() as u64).ok_or(libc::EFBIG)?;
        let old_blocks = blocks_of(data.len() as u64);
        let room = (old_blocks + free) * BLOCK_SIZE;
        let end = end.min(room.max(data.len() as u64));
        if end <= offset {
            return if bytes.is_empty() {
                Ok(0)
            } else {
                Err(libc::ENOSPC)
            };
        }
        if end as usize > data.len() {
            data.resize(end as usize, 0);
        }
        let written = (end - offset) as usize;
        data[offset as usize..end as usize].copy_from_slice(&bytes[..written]);
        let new_blocks = blocks_of(data.len() as u64);
        if kill_suid_gid {
            node.mode &= !(libc::S_ISUID | libc::S_ISGID) as u16;
        }
        touch_change(node);
        self.used_blocks += new_blocks - old_blocks;
        debug_assert!(self.used_blocks <= self.capacity_blocks);
        Ok(written as u32)
    }

    /// Set the size (truncate or extend with zeros), charging the blocks.
    fn resize(&mut self, ino: u64, size: u64) -> Result<()> {
        let node = self.node(ino)?;
        let Content::File(data) = &node.content else {
            return Err(libc::EISDIR);
        };
        let (old, new) = (blocks_of(data.len() as u64), blocks_of(size));
        if new > old {
            self.charge(new - old)?;
        } else {
            self.used_blocks -= old - new;
        }
        if let Content::File(data) = &mut self.node_mut(ino)?.content {
            data.resize(size as usize, 0);
            if size == 0 {
                data.shrink_to_fit();
            }
        }
        Ok(())
    }

    /// fallocate mode 0: the range exists afterwards, the size grows to
    /// its end.
    pub fn fallocate(&mut self, ino: u64, offset: u64, length: u64) -> Result<()> {
        let end = offset.checked_add(length).ok_or(libc::EFBIG)?;
        let size = self.node(ino)?.size();
        if end > size {
            self.resize(ino, end)?;
            touch_change(self.node_mut(ino)?);
        }
        Ok(())
    }

    pub fn setattr(&mut self, ino: u64, changes: &Changes) -> Result<FileAttr> {
        if let Some(size) = changes.size {
            self.resize(ino, size)?;
        }
        let now = SystemTime::now();
        let node = self.node_mut(ino)?;
        if changes.size.is_some() {
            node.mtime = now;
        }
        if let Some(mode) = changes.mode {
            node.mode = mode & 0o7777;
        }
        node.uid = changes.uid.unwrap_or(node.uid);
        node.gid = changes.gid.unwrap_or(node.gid);
        let at = |time: TimeOrNow| match time {
            TimeOrNow::Now => now,
            TimeOrNow::SpecificTime(time) => time,
        };
        node.atime = changes.atime.map_or(node.atime, at);
        node.mtime = changes.mtime.map_or(node.mtime, at);
        node.ctime = changes.ctime.unwrap_or(now);
        Ok(node.attr(ino))
    }
}

fn new_node(content: Content, maker: &Maker, nlink: u32) -> Node {
    let now = SystemTime::now();
    Node {
        content,
        mode: maker.mode & 0o7777,
        uid: maker.uid,
        gid: maker.gid,
        nlink,
        atime: now,
        mtime: now,
        ctime: now,
        xattrs: BTreeMap::new(),
        lookups: 0,
        opens: 0,
    }
}

/// A directory's entries or a file's data changed.
pub fn touch_change(node: &mut Node) {
    let now = SystemTime::now();
    node.mtime = now;
    node.ctime = now;
}

pub fn check_name(name: &[u8]) -> Result<()> {
    if name.len() > NAME_MAX {
        return Err(libc::ENAMETOOLONG);
    }
    debug_assert!(
        !name.is_empty() && !name.contains(&b'/'),
        "the kernel passes one name"
    );
    Ok(())
}

/// One entry of a listing: the cookie to resume after it, its inode and
/// name (`.` and `..` included).
pub struct Listed<'a> {
    pub next: u64,
    pub ino: u64,
    pub name: &'a [u8],
    pub node: &'a Node,
}

impl Tree {
    /// Hand the entries of directory `ino` after cookie `offset` to `add`
    /// until it says the reply is full (the entry it refused is offered
    /// again from the previous cookie). A listing from the start is an
    /// access relatime may record.
    pub fn list(
        &mut self,
        ino: u64,
        offset: u64,
        mut add: impl FnMut(Listed) -> bool,
    ) -> Result<()> {
        self.directory(ino)?;
        if offset == 0 {
            let node = self.node_mut(ino)?;
            let now = SystemTime::now();
            if node.access_changes_atime(now) {
                node.atime = now;
            }
        }
        let directory = self.directory(ino)?;
        let dots = [(1, ino, &b"."[..]), (2, directory.parent, &b".."[..])];
        for (next, entry, name) in dots.into_iter().filter(|&(next, ..)| next > offset) {
            let node = self.node(entry)?;
            if add(Listed {
                next,
                ino: entry,
                name,
                node,
            }) {
                return Ok(());
            }
        }
        let after = offset.max(FIRST_COOKIE - 1).saturating_add(1);
        for (&next, (name, entry)) in directory.by_cookie.range(after..) {
            let node = self.node(*entry)?;
            if add(Listed {
                next,
                ino: *entry,
                name,
                node,
            }) {
                return Ok(());
            }
        }
        Ok(())
    }

    /// rename(2) with RENAME_NOREPLACE and RENAME_EXCHANGE; the kernel has
    /// checked the kinds match and that a directory does not move under
    /// itself (`vfs_rename`), ENOTEMPTY is the filesystem's.
    pub fn rename(
        &mut self,
        from: (u64, &[u8]),
        to: (u64, &[u8]),
        noreplace: bool,
        exchange: bool,
    ) -> Result<()> {
        check_name(to.1)?;
        let ino = self.directory(from.0)?.get(from.1).ok_or(libc::ENOENT)?;
        let target = self.directory(to.0)?.get(to.1);
        if exchange {
            let target = target.ok_or(libc::ENOENT)?;
            self.move_entry(from, to, ino);
            self.move_entry(to, from, target);
        } else {
            if let Some(target) = target {
                if noreplace {
                    return Err(libc::EEXIST);
                }
                if target == ino {
                    return Ok(()); // two names of one inode: nothing to do
                }
                self.check_replaceable(ino, target)?;
                self.directory_mut(to.0)?.remove(to.1);
                if let Content::Directory(_) = self.node(target)?.content {
                    self.node_mut(to.0)?.nlink -= 1;
                }
                self.drop_link(target);
            }
            self.directory_mut(from.0)?.remove(from.1);
            self.move_entry(from, to, ino);
        }
        touch_change(self.node_mut(from.0)?);
        touch_change(self.node_mut(to.0)?);
        Ok(())
    }

    fn check_replaceable(&self, ino: u64, target: u64) -> Result<()> {
        match (&self.node(ino)?.content, &self.node(target)?.content) {
            (Content::Directory(_), Content::Directory(directory))
                if !directory.by_name.is_empty() =>
            {
                Err(libc::ENOTEMPTY)
            }
            (Content::Directory(_), Content::Directory(_)) => Ok(()),
            (Content::Directory(_), _) => Err(libc::ENOTDIR),
            (_, Content::Directory(_)) => Err(libc::EISDIR),
            _ => Ok(()),
        }
    }

    /// Name `ino` `to` (replacing whatever that name held, which the
    /// caller has dealt with); a directory changes parents.
    fn move_entry(&mut self, from: (u64, &[u8]), to: (u64, &[u8]), ino: u64) {
        if let Ok(directory) = self.directory_mut(to.0) {
            directory.remove(to.1);
            directory.insert(to.1, ino);
        }
        let Some(node) = self.nodes.get_mut(&ino) else {
            return;
        };
        node.ctime = SystemTime::now();
        let Content::Directory(directory) = &mut node.content else {
            return;
        };
        directory.parent = to.0;
        if from.0 != to.0 {
            if let Some(old_parent) = self.nodes.get_mut(&from.0) {
                old_parent.nlink -= 1;
            }
            if let Some(new_parent) = self.nodes.get_mut(&to.0) {
                new_parent.nlink += 1;
            }
        }
    }

    pub fn getxattr(&self, ino: u64, name: &[u8]) -> Result<Vec<u8>> {
        self.node(ino)?
            .xattrs
            .get(name)
            .cloned()
            .ok_or(libc::ENODATA)
    }

    /// The names, each ended by a NUL (listxattr's format).
    pub fn listxattr(&self, ino: u64) -> Result<Vec<u8>> {
        let mut list = Vec::new();
        for name in self.node(ino)?.xattrs.keys() {
            list.extend_from_slice(name);
            list.push(0);
        }
        Ok(list)
    }

    pub fn setxattr(&mut self, ino: u64, name: &[u8], value: &[u8], flags: i32) -> Result<()> {
        let node = self.node_mut(ino)?;
        let exists = node.xattrs.contains_key(name);
        match flags {
            libc::XATTR_CREATE if exists => return Err(libc::EEXIST),
            libc::XATTR_REPLACE if !exists => return Err(libc::ENODATA),
            0 | libc::XATTR_CREATE | libc::XATTR_REPLACE => {}
            _ => return Err(libc::EINVAL),
        }
        node.xattrs.insert(name.to_vec(), value.to_vec());
        node.ctime = SystemTime::now();
        Ok(())
    }

    pub fn removexattr(&mut self, ino: u64, name: &[u8]) -> Result<()> {
        let node = self.node_mut(ino)?;
        node.xattrs.remove(name).ok_or(libc::ENODATA)?;
        node.ctime = SystemTime::now();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const USER: Maker = Maker {
        uid: 1000,
        gid: 1000,
        mode: 0o644,
    };

    fn file(tree: &mut Tree, parent: u64, name: &str) -> u64 {
        let content = Content::File(Vec::new());
        tree.make(parent, name.as_bytes(), content, &USER)
            .unwrap()
            .ino
            .0
    }

    fn directory(tree: &mut Tree, parent: u64, name: &str) -> u64 {
        let content = Content::Directory(Directory::new(parent));
        tree.make(parent, name.as_bytes(), content, &USER)
            .unwrap()
            .ino
            .0
    }

    fn names(tree: &mut Tree, ino: u64, offset: u64, limit: usize) -> Vec<(u64, String)> {
        let mut listed = Vec::new();
        tree.list(ino, offset, |entry| {
            listed.push((entry.next, String::from_utf8_lossy(entry.name).into_owned()));
            listed.len() == limit
        })
        .unwrap();
        listed
    }

    #[test]
    fn a_listing_resumes_after_its_cookie_whatever_went_meanwhile() {
        let mut tree = Tree::new(1 << 20, 0, 0);
        for name in ["a", "b", "c"] {
            file(&mut tree, ROOT, name);
        }
        let first = names(&mut tree, ROOT, 0, 3);
        assert_eq!(
            first
                .iter()
                .map(|(_, name)| name.as_str())
                .collect::<Vec<_>>(),
            [".", "..", "a"]
        );
        tree.unlink(ROOT, b"a").unwrap();
        tree.unlink(ROOT, b"b").unwrap();
        file(&mut tree, ROOT, "d");
        let rest = names(&mut tree, ROOT, first[2].0, 10);
        assert_eq!(
            rest.iter()
                .map(|(_, name)| name.as_str())
                .collect::<Vec<_>>(),
            ["c", "d"]
        );
    }

    #[test]
    fn writes_stop_at_the_capacity_and_an_unlinked_closed_file_gives_it_back() {
        let mut tree = Tree::new(4 * BLOCK_SIZE, 0, 0);
        let ino = file(&mut tree, ROOT, "f");
        tree.open(ino).unwrap();
        // The root takes one of the four blocks: three are left.
        let written = tree
            .write(ino, 0, &[7; 5 * BLOCK_SIZE as usize], false)
            .unwrap();
        assert_eq!(written as u64, 3 * BLOCK_SIZE);
        assert_eq!(
            tree.write(ino, written as u64, &[7; 10], false),
            Err(libc::ENOSPC)
        );
        let content = Content::Directory(Directory::new(ROOT));
        assert_eq!(
            tree.make(ROOT, b"d", content, &USER).err(),
            Some(libc::ENOSPC)
        );
        tree.unlink(ROOT, b"f").unwrap();
        assert_eq!(tree.used_blocks, 4, "open: the data stays");
        tree.release(ino);
        assert_eq!(tree.used_blocks, 1);
        tree.forget(ino, 1);
        assert!(!tree.nodes.contains_key(&ino));
    }

    #[test]
    fn rename_keeps_link_counts_and_refuses_what_ext4_refuses() {
        let mut tree = Tree::new(1 << 20, 0, 0);
        let (a, b) = (
            directory(&mut tree, ROOT, "a"),
            directory(&mut tree, ROOT, "b"),
        );
        let inner = directory(&mut tree, a, "inner");
        file(&mut tree, b, "f");
        assert_eq!(
            tree.rename((ROOT, b"a"), (ROOT, b"b"), false, false),
            Err(libc::ENOTEMPTY)
        );
        assert_eq!(
            tree.rename((a, b"inner"), (b, b"f"), false, false),
            Err(libc::ENOTDIR)
        );
        assert_eq!(
            tree.rename((b, b"f"), (a, b"inner"), false, false),
            Err(libc::EISDIR)
        );
        assert_eq!(
            tree.rename((b, b"f"), (ROOT, b"a"), true, false),
            Err(libc::EEXIST)
        );
        tree.rename((a, b"inner"), (b, b"f"), false, true).unwrap();
        assert_eq!(
            (tree.node(a).unwrap().nlink, tree.node(b).unwrap().nlink),
            (2, 3)
        );
        assert_eq!(tree.directory(inner).unwrap().parent, b);
        tree.rename((a, b"inner"), (ROOT, b"moved"), false, false)
            .unwrap();
        assert!(tree.directory(a).unwrap().by_name.is_empty());
        assert_eq!(tree.rmdir(ROOT, b"b"), Err(libc::ENOTEMPTY));
        tree.rmdir(b, b"f").unwrap();
        assert_eq!(tree.node(b).unwrap().nlink, 2);
    }
}
