//! Namespace operations: lookup, create/mknod/mkdir/symlink, link,
//! unlink/rmdir, rename (plain, NOREPLACE, EXCHANGE), readlink.
//!
//! Each operation orders its steps so that an error part-way leaves a
//! consistent filesystem: the new inode is complete before a name points to
//! it, a name is removed before the link count drops, and an inode is freed
//! only when no name and no open file refer to it.

use super::acl;
use super::delalloc::WriteOut;
use super::dirops::{DirReader, DirWriter, disk_name, encrypted_dir};
use super::iflags;
use super::inode::FileKind;
use super::inode::{Attr, attr_of, attr_unlocked, check_live, read_inode};
use super::quota::Ask;
use super::{Caller, Fs, Scope, Tx};
use crate::error::{Error, Location, Result};
use crate::faults;
use crate::format::dir::{self, EntryLocation};
use crate::format::inode::{self as fmt, Inode, Timestamp, flags};
use crate::format::superblock::{incompat, ro_compat};
use crate::format::{inline, mapping, xattr};
use crate::journal::change::{Change, Ineligible};
use crate::lock::Rank;

/// Journal credits by operation (blocks an operation may dirty). Generous
/// upper bounds: inode, bitmap, descriptor, superblock, directory blocks
/// through two htree levels with splits, and the mapping blocks behind them.
pub(crate) const CREDITS_CREATE: u32 = 32;
/// A new inode, with the ACLs it may inherit from its directory.
const CREDITS_CREATE_NODE: u32 = CREDITS_CREATE + acl::INHERIT_CREDITS;
pub(crate) const CREDITS_UNLINK: u32 = 24;
pub(crate) const CREDITS_RENAME: u32 = 48;

/// rename(2) flags.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RenameFlags {
    pub noreplace: bool,
    pub exchange: bool,
}

pub(crate) fn check_name(name: &[u8]) -> Result<()> {
    if name.is_empty() {
        return Err(Error::NotFound);
    }
    if name.len() > dir::NAME_MAX {
        return Err(Error::NameTooLong);
    }
    if name.contains(&b'/') || name.contains(&0) {
        return Err(Error::Invalid("file name contains '/' or NUL".into()));
    }
    Ok(())
}

fn is_dot_or_dotdot(name: &[u8]) -> bool {
    name == b"." || name == b".."
}

/// What kind of object `create_node` makes.
#[derive(Clone, Copy)]
enum NewNode<'a> {
    File { mode: u16 },
    Special { mode: u16, rdev: u64 },
    Directory { mode: u16 },
    Symlink { target: &'a [u8] },
}

/// A bound on `dir::add_entry_cost` from the directory inode alone: the
/// most blocks an insert appends and the mapping blocks behind them.
fn entry_cost_bound(geo: &crate::format::Geometry, dir_inode: &Inode) -> u64 {
    let blocks = dir::add_entry_max_new_blocks(geo);
    blocks as u64 + mapping::append_cost_bound(dir_inode, blocks)
}

/// Blocks a new node's content takes: a directory's first block (its
/// empty mapping grows by no tree block), a slow symlink's target block.
/// An inherited ACL's xattr block is the caller's to add.
fn new_node_blocks(geo: &crate::format::Geometry, node: &NewNode<'_>) -> u64 {
    match node {
        NewNode::Directory { .. } => 1,
        NewNode::Symlink { target }
            if target.len() >= fmt::I_BLOCK_SIZE && target.len() < geo.block_size as usize =>
        {
            1
        }
        NewNode::File { .. } | NewNode::Special { .. } | NewNode::Symlink { .. } => 0,
    }
}

impl Tx<'_, '_> {
    /// What adding entry `name` to directory `dir` may allocate: the
    /// operation charges it before anything changes.
    fn entry_cost(&self, dir: u32, dir_inode: &Inode, name: &[u8]) -> Result<u64> {
        dir::add_entry_cost(&mut DirReader::new(self.core, dir, dir_inode), name)
    }

    /// Charge adding entry `name` to directory `dir` (the bound while far
    /// from full, the exact cost near it). Refuses first what
    /// `dir::add_entry` would refuse on disk grounds, before anything
    /// changes.
    fn charge_entry(&mut self, dir: u32, dir_inode: &Inode, name: &[u8]) -> Result<()> {
        dir::check_addable(&DirReader::new(self.core, dir, dir_inode))?;
        let bound = entry_cost_bound(&self.core.geo, dir_inode);
        self.charge_bounded(bound, |tx| tx.entry_cost(dir, dir_inode, name))?;
        self.grant_entry(dir, dir_inode, name)
    }

    /// Grant adding entry `name` to directory `dir` within the quota limits
    /// of the directory's ids, whose blocks it may add (the kernel's
    /// `ext4_append` charges them): worked out exactly, and only for ids
    /// with limits.
    fn grant_entry(&mut self, dir: u32, dir_inode: &Inode, name: &[u8]) -> Result<()> {
        let Some(ids) = self.quota_ids(dir, dir_inode) else {
            return Ok(());
        };
        if !self.quota_limits_any(ids)? {
            return Ok(());
        }
        let blocks = self.entry_cost(dir, dir_inode, name)?;
        let bytes = blocks * self.core.geo.block_size as u64;
        self.grant_quota(ids.map(Some), Ask::exact(bytes, 0))
            .map(|_| ())
    }

    /// A directory inode that can take a new entry.
    fn writable_dir(&self, ino: u32) -> Result<Inode> {
        let inode = self.read_live_inode(ino)?;
        if !inode.is_dir() {
            return Err(Error::NotDirectory);
        }
        if inode.links_count == 0 {
            return Err(Error::NotFound); // removed while open
        }
        Ok(inode)
    }

    /// A new name in an encrypted directory needs its key, which jext4
    /// never has: ENOKEY (fscrypt_prepare_new_inode, _link), unless the
    /// name (a no-key name) is taken, which is EEXIST as the kernel's
    /// lookup before the create finds it.
    fn refuse_new_encrypted_name(
        &self,
        dir_ino: u32,
        dir_inode: &Inode,
        name: &[u8],
    ) -> Result<()> {
        if !encrypted_dir(self.core, dir_ino, dir_inode)? {
            return Ok(());
        }
        match disk_name(self.core, dir_ino, dir_inode, name) {
            Ok(disk) if self.find_entry(dir_ino, dir_inode, &disk)?.is_some() => Err(Error::Exists),
            Ok(_) | Err(Error::NotFound) => Err(Error::NoKey),
            Err(error) => Err(error),
        }
    }

    pub fn find_entry(
        &self,
        dir_ino: u32,
        dir_inode: &Inode,
        name: &[u8],
    ) -> Result<Option<EntryLocation>> {
        dir::lookup(&mut DirReader::new(self.core, dir_ino, dir_inode), name)
    }

    /// ext4_link and ext4_rename: into a directory whose project its new
    /// entries inherit (+P) goes only what is of that project; the rest
    /// is EXDEV (mv then copies, and the copy takes the project).
    fn check_project_boundary(&self, dir_inode: &Inode, inode: &Inode) -> Result<()> {
        if dir_inode.has_flag(flags::PROJINHERIT) && dir_inode.projid != inode.projid {
            return Err(Error::CrossDevice);
        }
        Ok(())
    }

    fn dir_sync_wanted(&self, dir_inode: &Inode) {
        if self.core.options.dirsync || dir_inode.has_flag(flags::DIRSYNC) {
            self.handle.set_sync();
        }
    }

    /// The directory gains a subdirectory: one more link, or "many" (1)
    /// past the limit with dir_nlink.
    fn inc_dir_links(&self, dir: &mut Inode) -> Result<()> {
        if dir.links_count >= fmt::LINK_MAX || dir.links_count == 1 {
            if !self.core.geo.has_ro_compat(ro_compat::DIR_NLINK) {
                return Err(Error::TooManyLinks);
            }
            dir.links_count = 1;
        } else {
            dir.links_count += 1;
        }
        Ok(())
    }

    fn dec_dir_links(dir: &mut Inode) {
        // 1 means "many" (dir_nlink): stays 1. Never below 2 otherwise.
        if dir.links_count > 2 {
            dir.links_count -= 1;
        }
    }

    /// The owner, group and project a new inode in directory `parent`
    /// takes: the caller's, the directory's group under a setgid directory
    /// (BSD group semantics), the directory's project under +P.
    fn new_inode_ids(&self, parent: &Inode) -> [u32; 3] {
        let gid = match parent.mode & 0o2000 != 0 {
            true => parent.gid,
            false => self.caller.gid,
        };
        let projid = match parent.has_flag(flags::PROJINHERIT) {
            true => parent.projid,
            false => 0,
        };
        [self.caller.uid, gid, projid]
    }

    fn new_inode(&mut self, parent: &Inode, mode: u16) -> Inode {
        let geo = &self.core.geo;
        let now = Timestamp::now();
        let mut inode = Inode::new(geo);
        inode.mode = mode;
        [inode.uid, inode.gid, inode.projid] = self.new_inode_ids(parent);
        if parent.mode & 0o2000 != 0 && mode & fmt::S_IFMT == fmt::S_IFDIR {
            inode.mode |= 0o2000;
        }
        inode.atime = now;
        inode.mtime = now;
        inode.ctime = now;
        inode.crtime = now;
        inode.generation = self.next_generation();
        // ext4_mask_flags: what a child inherits depends on its type.
        inode.flags = parent.flags & flags::INHERITED & flags::kind_mask(mode);
        inode
    }

    /// Create `name` in `parent`, taking the directory's lock and the new
    /// inode's (a stale request by number must not see it half-made).
    fn create_node(&mut self, parent: u32, name: &[u8], node: NewNode<'_>) -> Result<(u32, Inode)> {
        check_name(name)?;
        let _dir = self.lock_write(parent, Rank::Directory);
        let mut parent_inode = self.writable_dir(parent)?;
        self.refuse_new_encrypted_name(parent, &parent_inode, name)?;
        if self.find_entry(parent, &parent_inode, name)?.is_some() {
            return Err(Error::Exists);
        }
        iflags::check_dir_addable(&parent_inode)?;
        let (mode, is_dir) = match node {
            NewNode::File { mode } => (fmt::S_IFREG | (mode & 0o7777), false),
            NewNode::Special { mode, .. } => (mode, false),
            NewNode::Directory { mode } => (fmt::S_IFDIR | (mode & 0o7777), true),
            NewNode::Symlink { .. } => (fmt::S_IFLNK | 0o777, false),
        };
        if is_dir {
            // Check before allocating anything.
            let mut probe = parent_inode.clone();
            self.inc_dir_links(&mut probe)?;
        }
        let parent_default = xattr::get(
            &self.core.geo,
            &self.core.cache,
            parent,
            &parent_inode,
            acl::ACL_DEFAULT,
        )?;
        // The whole cost first: a full volume fails the create before
        // anything is allocated (and so freed again).
        dir::check_addable(&DirReader::new(self.core, parent, &parent_inode))?;
        let content = new_node_blocks(&self.core.geo, &node) + parent_default.is_some() as u64;
        let bound = content + entry_cost_bound(&self.core.geo, &parent_inode);
        self.charge_bounded(bound, |tx| {
            Ok(content + tx.entry_cost(parent, &parent_inode, name)?)
        })?;
        // And within the quota limits: the new inode and its content for
        // its ids (ext4_new_inode's dquot_alloc_inode), the directory's
        // growth for the directory's.
        if self.core.quotas.limits_enforced() {
            let ids = self.new_inode_ids(&parent_inode);
            let bytes = content * self.core.geo.block_size as u64;
            self.grant_quota(ids.map(Some), Ask::exact(bytes, 1))?;
            self.grant_entry(parent, &parent_inode, name)?;
        }
        let ino = self.alloc_inode(parent, is_dir)?;
        faults::panic_point(faults::PanicPoint::Create);
        let _inode = self.lock_write(ino, Rank::Inode);
        let mut inode = self.new_inode(&parent_inode, mode);
        let inherited = acl::inherit(parent_default.as_deref(), &mut inode.mode, &self.caller);
        let extents = self.core.geo.has_incompat(incompat::EXTENTS);
        let built = inherited.and_then(|inherited| {
            self.fill_new_node(ino, &mut inode, &node, parent, extents)?;
            acl::apply_inherited(&mut self.meta_ctx(), ino, &mut inode, &inherited)
        });
        if let Err(error) = built {
            // Undo: nothing points at the inode yet.
            self.discard_new_inode(ino, inode, is_dir)?;
            return Err(error);
        }
        self.write_inode(ino, &inode)?;
        let file_type = dir::file_type_from_mode(inode.mode);
        let handle = self.handle;
        let added = dir::add_entry(
            &mut DirWriter::new(self, parent, &mut parent_inode),
            handle,
            name,
            ino,
            file_type,
        );
        if let Err(error) = added {
            self.write_inode(parent, &parent_inode)?; // the dir may have grown
            inode.links_count = 0;
            self.discard_new_inode(ino, inode, is_dir)?;
            return Err(error);
        }
        if is_dir {
            self.inc_dir_links(&mut parent_inode)?;
        }
        let now = Timestamp::now();
        parent_inode.mtime = now;
        parent_inode.ctime = now;
        self.write_inode(parent, &parent_inode)?;
        self.dir_sync_wanted(&parent_inode);
        Ok((ino, inode))
    }

    /// Set up the type-specific content of a new inode.
    fn fill_new_node(
        &mut self,
        ino: u32,
        inode: &mut Inode,
        node: &NewNode<'_>,
        parent: u32,
        extents: bool,
    ) -> Result<()> {
        match node {
            NewNode::File { .. } => {
                inode.links_count = 1;
                mapping::init(inode, extents);
            }
            NewNode::Special { rdev, mode } => {
                inode.links_count = 1;
                inode.set_device_number(*rdev);
                if matches!(mode & fmt::S_IFMT, fmt::S_IFCHR | fmt::S_IFBLK) {
                    // The device number lives in i_block, which the
                    // kernel's fast-commit replay does not take from the
                    // record.
                    self.handle
                        .note(Change::Ineligible(Ineligible::SymlinkOrDevice));
                }
            }
            NewNode::Directory { .. } => {
                inode.links_count = 2;
                mapping::init(inode, extents);
                self.write_inode(ino, inode)?;
                let handle = self.handle;
                dir::init_dir(&mut DirWriter::new(self, ino, inode), handle, ino, parent)?;
            }
            NewNode::Symlink { target } => {
                inode.links_count = 1;
                self.write_symlink_target(ino, inode, target, extents)?;
            }
        }
        Ok(())
    }

    fn write_symlink_target(
        &mut self,
        ino: u32,
        inode: &mut Inode,
        target: &[u8],
        extents: bool,
    ) -> Result<()> {
        let geo = &self.core.geo;
        if target.is_empty() {
            return Err(Error::NotFound);
        }
        if target.len() >= geo.block_size as usize || target.len() >= 4096 {
            return Err(Error::NameTooLong);
        }
        inode.size = target.len() as u64;
        // The kernel's fast-commit replay cannot rebuild a new symlink.
        self.handle
            .note(Change::Ineligible(Ineligible::SymlinkOrDevice));
        if target.len() < fmt::I_BLOCK_SIZE {
            // A fast symlink: the target lives in i_block, no extents flag.
            inode.block = [0; fmt::I_BLOCK_SIZE];
            inode.block[..target.len()].copy_from_slice(target);
            return Ok(());
        }
        mapping::init(inode, extents);
        let goal = geo.group_first_block(geo.group_of_inode(ino));
        let extent = {
            let mut ctx = self.meta_ctx();
            mapping::allocate(&mut ctx, ino, inode, 0, 1, goal, false)?
        };
        let mut block = vec![0u8; geo.block_size as usize];
        block[..target.len()].copy_from_slice(target);
        self.write_file_blocks(
            (ino, false),
            extent.physical * geo.block_size as u64,
            &block,
        )
    }

    /// Free an inode that no name ever pointed to (a failed create).
    fn discard_new_inode(&mut self, ino: u32, mut inode: Inode, is_dir: bool) -> Result<()> {
        if inode.has_data_blocks(&self.core.geo) && inode.blocks > 0 {
            self.release_all_blocks(ino, &mut inode)?;
        }
        if inode.file_acl != 0 {
            xattr::release_block(&mut self.meta_ctx(), ino, &mut inode)?;
        }
        inode.links_count = 0;
        inode.dtime = super::inode::now_seconds() as u32;
        self.write_inode(ino, &inode)?;
        self.release_inode(ino, is_dir)
    }

    /// Drop one link of `ino` after its name was removed; free it or make it
    /// an orphan when that was the last.
    fn drop_link(&mut self, ino: u32, inode: &mut Inode, open: bool) -> Result<()> {
        inode.ctime = Timestamp::now();
        if inode.is_dir() {
            inode.links_count = 0;
        } else {
            inode.links_count = inode.links_count.saturating_sub(1);
        }
        if inode.links_count > 0 {
            return self.write_inode(ino, inode);
        }
        if open {
            self.orphan_add(ino, inode)?;
            self.core.open_orphans.lock().insert(ino);
            return self.write_inode(ino, inode);
        }
        self.write_inode(ino, inode)?;
        self.evict_inode(ino, inode.clone())
    }
}

impl Fs {
    pub(crate) fn is_open(&self, ino: u32) -> bool {
        self.open_files
            .lock()
            .get(&ino)
            .is_some_and(|&count| count > 0)
    }

    /// Find `name` in directory `parent`.
    pub fn lookup(&self, parent: u32, name: &[u8]) -> Result<Attr> {
        if name.len() > dir::NAME_MAX {
            return Err(Error::NameTooLong);
        }
        let result = self.find(parent, name);
        if let (Ok(attr), Some(tracker)) = (&result, &self.core.fast_commit) {
            // Where a descriptor of it will commit (the first directory it
            // is seen in).
            tracker.learn_home(attr.ino, parent);
        }
        self.note_error(result)
    }

    /// The attributes of `name` in `parent` (`lookup` without telling the
    /// fast-commit tracker).
    fn find(&self, parent: u32, name: &[u8]) -> Result<Attr> {
        // The directory's entries hold still under its lock shared; the
        // inode found is read without its lock (getattr's consistency),
        // so ".." takes no lock against the tree's order.
        let _dir = self.core.inodes.read(parent, Rank::Directory);
        let dir_inode = read_inode(&self.core, parent)?;
        check_live(parent, &dir_inode)?;
        if !dir_inode.is_dir() {
            return Err(Error::NotDirectory);
        }
        let name = disk_name(&self.core, parent, &dir_inode, name)?;
        let entry = dir::lookup(&mut DirReader::new(&self.core, parent, &dir_inode), &name)?
            .ok_or(Error::NotFound)?;
        attr_unlocked(&self.core, entry.ino, |inode| check_live(entry.ino, inode))
    }

    /// Create a regular file.
    pub fn create(&self, parent: u32, name: &[u8], mode: u16, caller: Caller) -> Result<Attr> {
        self.transact(Scope::Dirs(&[parent]), CREDITS_CREATE_NODE, caller, |tx| {
            let (ino, inode) = tx.create_node(parent, name, NewNode::File { mode })?;
            attr_of(tx.core, ino, &inode)
        })
    }

    /// Create a regular file, fifo, socket or device node; `mode` carries
    /// the file type bits.
    pub fn mknod(
        &self,
        parent: u32,
        name: &[u8],
        mode: u16,
        rdev: u64,
        caller: Caller,
    ) -> Result<Attr> {
        let node = match mode & fmt::S_IFMT {
            fmt::S_IFREG | 0 => NewNode::File { mode },
            fmt::S_IFIFO | fmt::S_IFSOCK | fmt::S_IFCHR | fmt::S_IFBLK => {
                NewNode::Special { mode, rdev }
            }
            _ => return Err(Error::Invalid(format!("mknod of mode {mode:o}"))),
        };
        self.transact(Scope::Dirs(&[parent]), CREDITS_CREATE_NODE, caller, |tx| {
            let (ino, inode) = tx.create_node(parent, name, node)?;
            attr_of(tx.core, ino, &inode)
        })
    }

    pub fn mkdir(&self, parent: u32, name: &[u8], mode: u16, caller: Caller) -> Result<Attr> {
        self.transact(Scope::Dirs(&[parent]), CREDITS_CREATE_NODE, caller, |tx| {
            let (ino, inode) = tx.create_node(parent, name, NewNode::Directory { mode })?;
            attr_of(tx.core, ino, &inode)
        })
    }

    pub fn symlink(&self, parent: u32, name: &[u8], target: &[u8], caller: Caller) -> Result<Attr> {
        self.transact(Scope::Dirs(&[parent]), CREDITS_CREATE, caller, |tx| {
            let (ino, inode) = tx.create_node(parent, name, NewNode::Symlink { target })?;
            attr_of(tx.core, ino, &inode)
        })
    }

    /// A symlink's target; an encrypted symlink's in its no-key form (the
    /// ciphertext, as fscrypt_get_symlink shows it without the key).
    pub fn readlink(&self, ino: u32) -> Result<Vec<u8>> {
        let body = self.symlink_body(ino)?;
        let inode = read_inode(&self.core, ino)?;
        if !inode.is_encrypted(&self.core.geo) {
            return Ok(body);
        }
        let result = crate::format::fscrypt::symlink_target(&body, Location::Inode { ino });
        self.note_error(result)
    }

    /// A symlink's target as stored.
    fn symlink_body(&self, ino: u32) -> Result<Vec<u8>> {
        let inode_lock = self.core.inodes.read(ino, Rank::Inode);
        let result = (|| {
            let inode = read_inode(&self.core, ino)?;
            check_live(ino, &inode)?;
            if !inode.is_symlink() {
                return Err(Error::Invalid("not a symbolic link".into()));
            }
            let geo = &self.core.geo;
            let len = inode.size as usize;
            if inode.has_inline_data() {
                return inline::symlink_target(geo, ino, &inode);
            }
            if inode.is_fast_symlink(geo) {
                if len >= fmt::I_BLOCK_SIZE {
                    return Err(Error::corrupt(
                        Location::Inode { ino },
                        "fast symlink longer than i_block",
                    ));
                }
                return Ok(inode.block[..len].to_vec());
            }
            if len == 0 || len >= geo.block_size as usize {
                return Err(Error::corrupt(
                    Location::Inode { ino },
                    format!("symlink size {len}"),
                ));
            }
            let mut block = vec![0u8; geo.block_size as usize];
            match self.core.lookup(ino, &inode, 0)? {
                mapping::Lookup::Mapped(extent) if !extent.unwritten => {
                    self.core
                        .dev()
                        .read_at(extent.physical * geo.block_size as u64, &mut block)?;
                }
                _ => {
                    return Err(Error::corrupt(
                        Location::Inode { ino },
                        "symlink without a data block",
                    ));
                }
            }
            block.truncate(len);
            Ok(block)
        })();
        drop(inode_lock);
        self.note_error(result)
    }

    /// Add a hard link `new_parent/new_name` to `ino`.
    pub fn link(&self, ino: u32, new_parent: u32, new_name: &[u8], caller: Caller) -> Result<Attr> {
        let scope = Scope::Link {
            dir: new_parent,
            file: ino,
        };
        self.transact(scope, CREDITS_CREATE, caller, |tx| {
            check_name(new_name)?;
            if ino == new_parent {
                return Err(Error::NotPermitted); // a directory
            }
            let _dir = tx.lock_write(new_parent, Rank::Directory);
            let _inode = tx.lock_write(ino, Rank::Inode);
            let mut inode = tx.read_live_inode(ino)?;
            if inode.is_dir() {
                return Err(Error::NotPermitted);
            }
            if inode.links_count >= fmt::LINK_MAX {
                return Err(Error::TooManyLinks);
            }
            if inode.links_count == 0 {
                return Err(Error::NotFound); // unlinked while open
            }
            let mut parent_inode = tx.writable_dir(new_parent)?;
            tx.refuse_new_encrypted_name(new_parent, &parent_inode, new_name)?;
            tx.check_project_boundary(&parent_inode, &inode)?;
            if tx
                .find_entry(new_parent, &parent_inode, new_name)?
                .is_some()
            {
                return Err(Error::Exists);
            }
            iflags::check_dir_addable(&parent_inode)?;
            iflags::check_attributes_changeable(&inode)?;
            tx.charge_entry(new_parent, &parent_inode, new_name)?;
            let file_type = dir::file_type_from_mode(inode.mode);
            let handle = tx.handle;
            let added = dir::add_entry(
                &mut DirWriter::new(tx, new_parent, &mut parent_inode),
                handle,
                new_name,
                ino,
                file_type,
            );
            let now = Timestamp::now();
            parent_inode.mtime = now;
            parent_inode.ctime = now;
            tx.write_inode(new_parent, &parent_inode)?;
            added?;
            inode.links_count += 1;
            inode.ctime = now;
            tx.write_inode(ino, &inode)?;
            tx.dir_sync_wanted(&parent_inode);
            attr_of(tx.core, ino, &inode)
        })
    }

    pub fn unlink(&self, parent: u32, name: &[u8], caller: Caller) -> Result<()> {
        self.remove(parent, name, false, caller)
    }

    pub fn rmdir(&self, parent: u32, name: &[u8], caller: Caller) -> Result<()> {
        self.remove(parent, name, true, caller)
    }

    fn remove(&self, parent: u32, name: &[u8], want_dir: bool, caller: Caller) -> Result<()> {
        if want_dir && name == b"." {
            return Err(Error::Invalid("rmdir of \".\"".into()));
        }
        if want_dir && name == b".." {
            return Err(Error::NotEmpty);
        }
        if is_dot_or_dotdot(name) {
            return Err(Error::IsDirectory); // unlink of "." or ".."
        }
        check_name(name)?;
        self.transact_releasing(Scope::Dirs(&[parent]), CREDITS_UNLINK, caller, |tx| {
            let _dir = tx.lock_write(parent, Rank::Directory);
            let mut parent_inode = tx.writable_dir(parent)?;
            let name = &*disk_name(tx.core, parent, &parent_inode, name)?;
            if encrypted_dir(tx.core, parent, &parent_inode)? {
                tx.handle
                    .note(Change::Ineligible(Ineligible::EncryptedName));
            }
            let entry = tx
                .find_entry(parent, &parent_inode, name)?
                .ok_or(Error::NotFound)?;
            if entry.ino == parent {
                return Err(Error::corrupt(
                    Location::Inode { ino: parent },
                    "a directory entry names its own directory",
                ));
            }
            let _victim = tx.lock_write(entry.ino, Rank::Inode);
            let mut inode = tx.read_live_inode(entry.ino)?;
            iflags::check_dir_removable(&parent_inode)?;
            iflags::check_attributes_changeable(&inode)?;
            if want_dir {
                if !inode.is_dir() {
                    return Err(Error::NotDirectory);
                }
                if !dir::is_empty(&mut DirReader::new(tx.core, entry.ino, &inode))? {
                    return Err(Error::NotEmpty);
                }
            } else if inode.is_dir() {
                return Err(Error::IsDirectory);
            }
            let open = self.is_open(entry.ino);
            if !open && (inode.is_dir() || inode.links_count <= 1) {
                tx.check_evictable(entry.ino, &inode)?;
            }
            let handle = tx.handle;
            dir::remove_entry(
                &mut DirWriter::new(tx, parent, &mut parent_inode),
                handle,
                name,
            )?;
            if want_dir {
                Tx::dec_dir_links(&mut parent_inode);
            }
            let now = Timestamp::now();
            parent_inode.mtime = now;
            parent_inode.ctime = now;
            tx.write_inode(parent, &parent_inode)?;
            tx.drop_link(entry.ino, &mut inode, open)?;
            tx.dir_sync_wanted(&parent_inode);
            Ok(())
        })
    }
}

/// Walk up from `start` through ".." entries: the directory just below
/// `ancestor` on the way if `ancestor` is on it (`start` itself when it is
/// `ancestor`'s child), None if the walk reaches the root first. Called
/// with the rename lock held: no directory moves meanwhile, so the answer
/// holds until it is released. A directory removed meanwhile ends the walk
/// (None): its rename then finds it gone under its lock.
fn child_on_path(tx: &Tx<'_, '_>, start: u32, ancestor: u32) -> Result<Option<u32>> {
    let mut ino = start;
    let mut below = None;
    // A path is at most as deep as there are directories; bound the walk.
    for _ in 0..tx.core.geo.inodes_count.min(1 << 20) {
        if ino == ancestor {
            return Ok(below);
        }
        if ino == crate::format::superblock::ROOT_INO {
            return Ok(None);
        }
        let inode = tx.read_inode(ino)?;
        if inode.links_count == 0 || !inode.is_dir() {
            return Ok(None);
        }
        let parent = dir::parent(&mut DirReader::new(tx.core, ino, &inode))?;
        if parent == ino {
            break;
        }
        below = Some(ino);
        ino = parent;
    }
    Err(Error::corrupt(
        Location::Inode { ino: start },
        "directory is not connected to the root",
    ))
}

/// How the two directories of a cross-directory rename are related (the
/// kernel's `lock_rename` trap): the entry that must not move, and the one
/// that must not be replaced, because it is an ancestor of the other
/// directory. Known before any entry's inode is locked, so those locks are
/// never taken against the tree's order.
#[derive(Debug, Default, Clone, Copy)]
struct RenameTraps {
    /// The child of the old directory that contains the new one: moving it
    /// would put it inside itself (EINVAL).
    source: Option<u32>,
    /// The child of the new directory that contains the old one: replacing
    /// it would remove a non-empty directory (ENOTEMPTY; EINVAL for an
    /// exchange).
    target: Option<u32>,
}

impl RenameTraps {
    fn find(tx: &Tx<'_, '_>, old_parent: u32, new_parent: u32) -> Result<Self> {
        if old_parent == new_parent {
            return Ok(RenameTraps::default());
        }
        if let Some(source) = child_on_path(tx, new_parent, old_parent)? {
            return Ok(RenameTraps {
                source: Some(source),
                target: None,
            });
        }
        let target = child_on_path(tx, old_parent, new_parent)?;
        Ok(RenameTraps {
            source: None,
            target,
        })
    }

    /// The two directories in locking order: an ancestor first, else the
    /// lower number first.
    fn lock_order(&self, old_parent: u32, new_parent: u32) -> (u32, u32) {
        if self.source.is_some() {
            (old_parent, new_parent)
        } else if self.target.is_some() {
            (new_parent, old_parent)
        } else {
            (old_parent.min(new_parent), old_parent.max(new_parent))
        }
    }
}

/// The two directories of a rename, which may be one.
struct RenameDirs {
    old_parent: u32,
    new_parent: u32,
    old_dir: Inode,
    new_dir: Option<Inode>,
}

impl RenameDirs {
    fn new_dir(&mut self) -> &mut Inode {
        self.new_dir.as_mut().unwrap_or(&mut self.old_dir)
    }
    fn same(&self) -> bool {
        self.old_parent == self.new_parent
    }
}

impl Tx<'_, '_> {
    /// The entries' part of a rename, with both directories locked: find
    /// them, refuse the traps, lock the inodes they name (the lower number
    /// first), move or exchange them.
    fn rename_entries(
        &mut self,
        dirs: &mut RenameDirs,
        old_name: &[u8],
        new_name: &[u8],
        flags: RenameFlags,
        traps: RenameTraps,
        open_target: &dyn Fn(u32) -> bool,
    ) -> Result<()> {
        let handle = self.handle;
        let src = self
            .find_entry(dirs.old_parent, &dirs.old_dir, old_name)?
            .ok_or(Error::NotFound)?;
        let new_parent = dirs.new_parent;
        let dst = self.find_entry(new_parent, dirs.new_dir_ref(), new_name)?;
        if dst.as_ref().is_some_and(|dst| dst.ino == src.ino) {
            return Ok(()); // two names of one inode: rename does nothing
        }
        if traps.source == Some(src.ino) {
            return Err(Error::InvalidMove);
        }
        if let Some(dst) = &dst
            && traps.target == Some(dst.ino)
        {
            return Err(if flags.exchange {
                Error::InvalidMove
            } else {
                Error::NotEmpty
            });
        }
        for (parent, entry) in [
            (dirs.old_parent, src.ino),
            (new_parent, dst.as_ref().map_or(0, |d| d.ino)),
        ] {
            if entry == dirs.old_parent || entry == new_parent {
                return Err(Error::corrupt(
                    Location::Inode { ino: parent },
                    "a directory entry names a directory of the rename",
                ));
            }
        }
        let (low, high) = match &dst {
            Some(dst) => (src.ino.min(dst.ino), Some(src.ino.max(dst.ino))),
            None => (src.ino, None),
        };
        let _low = self.lock_write(low, Rank::Inode);
        let _high = high.map(|high| self.lock_write(high, Rank::Inode2));
        let mut src_inode = self.read_live_inode(src.ino)?;
        if flags.exchange {
            let dst = dst.ok_or(Error::NotFound)?;
            return self.exchange_entries(dirs, old_name, new_name, &src, &dst, src_inode);
        }
        let src_type = dir::file_type_from_mode(src_inode.mode);
        match dst {
            Some(_) if flags.noreplace => return Err(Error::Exists),
            Some(dst) => {
                // Rename over a file frees the target: like a deletion, it
                // may need the emergency reserve on a full volume.
                self.draws_on_emergency_reserve = true;
                let mut dst_inode = self.read_live_inode(dst.ino)?;
                if src_inode.is_dir() {
                    if !dst_inode.is_dir() {
                        return Err(Error::NotDirectory);
                    }
                    if !dir::is_empty(&mut DirReader::new(self.core, dst.ino, &dst_inode))? {
                        return Err(Error::NotEmpty);
                    }
                } else if dst_inode.is_dir() {
                    return Err(Error::IsDirectory);
                }
                let open = open_target(dst.ino);
                if !open && (dst_inode.is_dir() || dst_inode.links_count <= 1) {
                    self.check_evictable(dst.ino, &dst_inode)?;
                }
                dir::replace_entry(
                    &mut DirWriter::new(self, new_parent, dirs.new_dir()),
                    handle,
                    new_name,
                    src.ino,
                    src_type,
                )?;
                if dst_inode.is_dir() {
                    Tx::dec_dir_links(dirs.new_dir());
                }
                self.drop_link(dst.ino, &mut dst_inode, open)?;
            }
            None => {
                if src_inode.is_dir() && !dirs.same() {
                    let mut probe = dirs.new_dir().clone();
                    self.inc_dir_links(&mut probe)?;
                }
                self.charge_entry(new_parent, dirs.new_dir_ref(), new_name)?;
                dir::add_entry(
                    &mut DirWriter::new(self, new_parent, dirs.new_dir()),
                    handle,
                    new_name,
                    src.ino,
                    src_type,
                )?;
            }
        }
        let old_parent = dirs.old_parent;
        dir::remove_entry(
            &mut DirWriter::new(self, old_parent, &mut dirs.old_dir),
            handle,
            old_name,
        )?;
        if src_inode.is_dir() && !dirs.same() {
            dir::set_parent(
                &mut DirWriter::new(self, src.ino, &mut src_inode),
                handle,
                new_parent,
            )?;
            Tx::dec_dir_links(&mut dirs.old_dir);
            self.inc_dir_links(dirs.new_dir())?;
        }
        src_inode.ctime = Timestamp::now();
        self.write_inode(src.ino, &src_inode)
    }

    fn exchange_entries(
        &mut self,
        dirs: &mut RenameDirs,
        old_name: &[u8],
        new_name: &[u8],
        src: &EntryLocation,
        dst: &EntryLocation,
        mut src_inode: Inode,
    ) -> Result<()> {
        let handle = self.handle;
        // Replayed as records, the first UNLINK would free the inode the
        // second LINK names (ext4_cross_rename marks this too).
        handle.note(Change::Ineligible(Ineligible::CrossRename));
        let mut dst_inode = self.read_live_inode(dst.ino)?;
        let src_type = dir::file_type_from_mode(src_inode.mode);
        let dst_type = dir::file_type_from_mode(dst_inode.mode);
        let (old_parent, new_parent) = (dirs.old_parent, dirs.new_parent);
        dir::replace_entry(
            &mut DirWriter::new(self, new_parent, dirs.new_dir()),
            handle,
            new_name,
            src.ino,
            src_type,
        )?;
        dir::replace_entry(
            &mut DirWriter::new(self, old_parent, &mut dirs.old_dir),
            handle,
            old_name,
            dst.ino,
            dst_type,
        )?;
        if !dirs.same() {
            if src_inode.is_dir() {
                dir::set_parent(
                    &mut DirWriter::new(self, src.ino, &mut src_inode),
                    handle,
                    new_parent,
                )?;
            }
            if dst_inode.is_dir() {
                dir::set_parent(
                    &mut DirWriter::new(self, dst.ino, &mut dst_inode),
                    handle,
                    old_parent,
                )?;
            }
            match (src_inode.is_dir(), dst_inode.is_dir()) {
                (true, false) => {
                    Tx::dec_dir_links(&mut dirs.old_dir);
                    self.inc_dir_links(dirs.new_dir())?;
                }
                (false, true) => {
                    Tx::dec_dir_links(dirs.new_dir());
                    self.inc_dir_links(&mut dirs.old_dir)?;
                }
                _ => {}
            }
        }
        let now = Timestamp::now();
        src_inode.ctime = now;
        dst_inode.ctime = now;
        self.write_inode(src.ino, &src_inode)?;
        self.write_inode(dst.ino, &dst_inode)
    }
}

impl RenameDirs {
    fn new_dir_ref(&self) -> &Inode {
        self.new_dir.as_ref().unwrap_or(&self.old_dir)
    }
}

impl Fs {
    /// rename(2) with the Linux renameat2 flags NOREPLACE and EXCHANGE.
    pub fn rename(
        &self,
        old_parent: u32,
        old_name: &[u8],
        new_parent: u32,
        new_name: &[u8],
        flags: RenameFlags,
        caller: Caller,
    ) -> Result<()> {
        if flags.noreplace && flags.exchange {
            return Err(Error::Invalid(
                "RENAME_NOREPLACE with RENAME_EXCHANGE".into(),
            ));
        }
        check_name(old_name)?;
        check_name(new_name)?;
        if is_dot_or_dotdot(old_name) || is_dot_or_dotdot(new_name) {
            return Err(Error::Invalid("rename of \".\" or \"..\"".into()));
        }
        self.write_out_renamed_over(old_parent, old_name, new_parent, new_name)?;
        let dirs = [old_parent, new_parent];
        let scope = Scope::Dirs(if old_parent == new_parent {
            &dirs[..1]
        } else {
            &dirs
        });
        self.transact(scope, CREDITS_RENAME, caller, |tx| {
            let core = tx.core;
            // Across directories: the rename lock keeps the tree's shape,
            // which fixes the two directories' order and the traps.
            let _rename = (old_parent != new_parent).then(|| core.rename_lock.lock());
            let traps = RenameTraps::find(tx, old_parent, new_parent)?;
            let (first, second) = traps.lock_order(old_parent, new_parent);
            let _first = tx.lock_write(first, Rank::Directory);
            let _second = (first != second).then(|| tx.lock_write(second, Rank::Directory2));
            let old_dir = tx.writable_dir(old_parent)?;
            let new_dir = if old_parent == new_parent {
                None
            } else {
                Some(tx.writable_dir(new_parent)?)
            };
            // A rename into, out of or within an encrypted directory needs
            // the key (fscrypt_prepare_rename): ENOKEY, once the name is
            // found.
            let target_dir = new_dir.as_ref().unwrap_or(&old_dir);
            if encrypted_dir(core, old_parent, &old_dir)?
                || encrypted_dir(core, new_parent, target_dir)?
            {
                let old_disk = disk_name(core, old_parent, &old_dir, old_name)?;
                if tx.find_entry(old_parent, &old_dir, &old_disk)?.is_none() {
                    return Err(Error::NotFound);
                }
                return Err(Error::NoKey);
            }
            // The entry must fit its new directory's project (with
            // RENAME_EXCHANGE, both ways), as ext4_rename checks it.
            let source = tx.find_entry(old_parent, &old_dir, old_name)?;
            if let Some(found) = source {
                tx.check_project_boundary(target_dir, &tx.read_inode(found.ino)?)?;
            }
            let target = tx.find_entry(new_parent, target_dir, new_name)?;
            if flags.exchange
                && let Some(found) = target
            {
                tx.check_project_boundary(&old_dir, &tx.read_inode(found.ino)?)?;
            }
            // chattr +i and +a: the entry leaves its directory and joins
            // the other (the one it replaces leaves that one), as
            // may_delete and may_create check it; a rename onto itself
            // changes nothing and is let be.
            if let Some(found) = source
                && target.is_none_or(|target| target.ino != found.ino)
            {
                iflags::check_dir_removable(&old_dir)?;
                iflags::check_dir_addable(target_dir)?;
                iflags::check_attributes_changeable(&tx.read_inode(found.ino)?)?;
                if let Some(target) = target {
                    iflags::check_dir_removable(target_dir)?;
                    iflags::check_attributes_changeable(&tx.read_inode(target.ino)?)?;
                }
            }
            let mut dirs = RenameDirs {
                old_parent,
                new_parent,
                old_dir,
                new_dir,
            };
            let result = tx.rename_entries(&mut dirs, old_name, new_name, flags, traps, &|ino| {
                self.is_open(ino)
            });
            // Directory inodes are written even after an error: their blocks
            // may have grown before it.
            let now = Timestamp::now();
            if result.is_ok() {
                dirs.old_dir.mtime = now;
                dirs.old_dir.ctime = now;
                dirs.new_dir().mtime = now;
                dirs.new_dir().ctime = now;
            }
            tx.write_inode(old_parent, &dirs.old_dir)?;
            if let Some(new_dir) = &dirs.new_dir {
                tx.write_inode(new_parent, new_dir)?;
            }
            tx.dir_sync_wanted(&dirs.old_dir);
            result
        })
    }
}

impl Fs {
    /// A file renamed over another goes out first when it holds delayed
    /// data (the kernel's `auto_da_alloc`): whoever replaces a file by
    /// writing a new one and renaming it over the old expects, after a
    /// crash, the old file or the new one — not an empty one.
    fn write_out_renamed_over(
        &self,
        old_parent: u32,
        old_name: &[u8],
        new_parent: u32,
        new_name: &[u8],
    ) -> Result<()> {
        if !self.core.delayed.holds_any() {
            return Ok(());
        }
        let Ok(source) = self.find(old_parent, old_name) else {
            return Ok(()); // the rename reports it
        };
        if source.kind == FileKind::Regular && self.find(new_parent, new_name).is_ok() {
            self.write_out(source.ino, WriteOut::Rename)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::format::superblock::ROOT_INO;
    use crate::fs::{Caller, Fs, MountOptions};
    use crate::lock::Rank;
    use std::sync::mpsc;
    use std::time::Duration;

    /// A namespace change in /a holds /a's lock exclusive: lookups,
    /// readdir and getattr in /b go on meanwhile; a lookup in /a waits.
    #[test]
    fn readers_in_one_directory_do_not_wait_for_a_writer_in_another() {
        let scratch = tempfile::tempdir().unwrap();
        let image = scratch.path().join("dirs.img");
        std::fs::File::create(&image)
            .unwrap()
            .set_len(16 << 20)
            .unwrap();
        let mke2fs = std::process::Command::new("mke2fs")
            .args(["-q", "-F", "-t", "ext4"])
            .arg(&image)
            .status()
            .expect("running mke2fs");
        assert!(mke2fs.success());
        let fs = Fs::open(&image, MountOptions::default()).unwrap();
        let caller = Caller::ROOT;
        let a = fs.mkdir(ROOT_INO, b"a", 0o755, caller).unwrap().ino;
        let b = fs.mkdir(ROOT_INO, b"b", 0o755, caller).unwrap().ino;
        fs.create(a, b"x", 0o644, caller).unwrap();
        let y = fs.create(b, b"y", 0o644, caller).unwrap().ino;
        let writer = fs.core.inodes.write(a, Rank::Directory);
        let (done, finished) = mpsc::channel();
        let reader = {
            let fs = std::sync::Arc::clone(&fs);
            std::thread::spawn(move || {
                assert_eq!(fs.lookup(b, b"y").unwrap().ino, y);
                let mut names = 0;
                fs.readdir(b, 0, &mut |_| {
                    names += 1;
                    true
                })
                .unwrap();
                assert_eq!(names, 3, ". .. y");
                fs.getattr(a).unwrap();
                done.send("b").unwrap();
                fs.lookup(a, b"x").unwrap();
                done.send("a").unwrap();
            })
        };
        assert_eq!(finished.recv_timeout(Duration::from_secs(30)), Ok("b"));
        assert!(
            finished.recv_timeout(Duration::from_millis(300)).is_err(),
            "a lookup in /a went past the lock of a change in /a"
        );
        drop(writer);
        assert_eq!(finished.recv_timeout(Duration::from_secs(30)), Ok("a"));
        reader.join().unwrap();
        fs.unmount().unwrap();
    }
}
