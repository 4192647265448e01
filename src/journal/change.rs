//! Logical changes: what an operation changed, in the terms of ext4's
//! fast-commit records (an inode, a range of its logical blocks, a name
//! added to or removed from a directory), reported through the handle that
//! made them (`Handle::note`).
//!
//! This is the narrow transaction interface DESIGN §4a asks for: `format/`
//! and `fs/` say *what* changed at the one place each change is made (the
//! mapping entry points, the directory entry functions, the inode store,
//! the inode allocator, the xattr setter), and whoever watches the journal
//! — the fast-commit tracker today, per-directory transactions and the
//! space budget later — sees every change of every handle, tagged with the
//! handle's transaction. The journal itself only forwards them.
//!
//! Changes that fast commits cannot express are reported as
//! [`Ineligible`]: they make fast commits fall back to full commits until
//! the transaction they were made in is committed in full (the kernel's
//! `ext4_fc_mark_ineligible`).

/// Why the running transaction cannot be described by fast-commit records
/// (the kernel's `EXT4_FC_REASON_*`, plus jext4's own where its replay or
/// the kernel's cannot rebuild a change from the records).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Ineligible {
    /// `EXT4_FC_REASON_XATTR`: an extended attribute (or an ACL) changed.
    Xattr,
    /// `EXT4_FC_REASON_CROSS_RENAME`: RENAME_EXCHANGE swapped two names.
    CrossRename,
    /// `EXT4_FC_REASON_RENAME_DIR`: a directory was renamed. The kernel
    /// names only moves across directories; jext4 also falls back for a
    /// rename inside one directory, whose LINK of a directory neither
    /// replay rebuilds.
    RenameDir,
    /// The orphan records changed (a file unlinked while open, released,
    /// or truncated in several transactions): no record carries them.
    Orphan,
    /// A directory was made or removed. The kernel's replay of its CREAT
    /// or UNLINK leaves the link counts of the directory and its parent
    /// and the group's directory count wrong (e2fsck -fn complains), so
    /// jext4 commits these in full.
    DirectoryLinks,
    /// A directory grew a block. The kernel's replay of the names that
    /// filled it appends the block again without counting it in the
    /// directory's `i_blocks`.
    DirectoryGrew,
    /// An inode with an extended-attribute block changed: the kernel's
    /// replay recounts `i_blocks` from the block map alone, without the
    /// attribute block (a slow symlink then even reads as a broken fast
    /// one).
    XattrBlock,
    /// A directory's own attributes (mode, owner, times) were set: the
    /// kernel never records a directory's inode except when creating it.
    DirAttributes,
    /// A new symlink or device node: the kernel's replay cannot rebuild
    /// one from records. It keeps the old inode's `i_block`, where a fast
    /// symlink's target and a device number live; and it recounts
    /// `i_blocks` from that empty map before mapping a slow symlink's
    /// block, after which the inode reads as a fast symlink with a bad
    /// length.
    SymlinkOrDevice,
    /// A block-mapped (ext2/ext3-style) file's mapping changed: both
    /// replays rebuild mappings only in extent trees.
    BlockMapped,
    /// The records would not fit in the fast-commit area (the kernel falls
    /// back when `jbd2_fc_get_buf` runs out), or the tracker's bound on
    /// remembered changes was reached (the kernel's `NOMEM`).
    AreaFull,
    /// A fast commit failed part-way (a device error): the changes it took
    /// are committed in full instead.
    Failed,
    /// `EXT4_FC_REASON_ENCRYPTED_FILENAME`: a name of an encrypted
    /// directory changed (ciphertext, which the kernel's records do not
    /// carry).
    EncryptedName,
    /// `EXT4_FC_REASON_INODE_JOURNAL_DATA`: a file whose data is journaled
    /// changed (`fs/data_journal.rs`): its data is in the full commit's
    /// blocks, which no record carries.
    InodeJournalData,
}

impl Ineligible {
    pub const ALL: [Ineligible; 14] = [
        Ineligible::Xattr,
        Ineligible::CrossRename,
        Ineligible::RenameDir,
        Ineligible::DirectoryLinks,
        Ineligible::DirectoryGrew,
        Ineligible::XattrBlock,
        Ineligible::Orphan,
        Ineligible::DirAttributes,
        Ineligible::SymlinkOrDevice,
        Ineligible::BlockMapped,
        Ineligible::AreaFull,
        Ineligible::Failed,
        Ineligible::EncryptedName,
        Ineligible::InodeJournalData,
    ];

    /// The name `jext4 stats` prints.
    pub fn name(self) -> &'static str {
        match self {
            Ineligible::Xattr => "xattr",
            Ineligible::CrossRename => "cross_rename",
            Ineligible::RenameDir => "rename_dir",
            Ineligible::DirectoryLinks => "directory_links",
            Ineligible::DirectoryGrew => "directory_grew",
            Ineligible::XattrBlock => "xattr_block",
            Ineligible::Orphan => "orphan",
            Ineligible::DirAttributes => "dir_attributes",
            Ineligible::SymlinkOrDevice => "symlink_or_device",
            Ineligible::BlockMapped => "block_mapped",
            Ineligible::AreaFull => "area_full",
            Ineligible::Failed => "failed",
            Ineligible::EncryptedName => "encrypted_name",
            Ineligible::InodeJournalData => "inode_journal_data",
        }
    }

    /// Index in `ALL`, for counters.
    pub fn index(self) -> usize {
        Ineligible::ALL
            .iter()
            .position(|reason| *reason == self)
            .expect("every reason is in ALL")
    }
}

/// One logical change made under a handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change<'a> {
    /// The inode's on-disk fields changed.
    Inode { ino: u32 },
    /// Logical blocks `start..end` of a regular file or symlink map
    /// differently now (mapped, unmapped, or converted from unwritten).
    /// Directories' blocks are never reported: replay rebuilds them from
    /// the names.
    Range { ino: u32, start: u64, end: u64 },
    /// A write put data past the inode's old size: a record of the new
    /// size exposes those bytes, so they must be durable before it is.
    Extended { ino: u32 },
    /// The inode was taken from the free pool.
    InodeAllocated { ino: u32 },
    /// The inode went back to the free pool.
    InodeFreed { ino: u32 },
    /// `name` in directory `parent` now names `ino` (`dir`: a directory).
    Link {
        parent: u32,
        ino: u32,
        name: &'a [u8],
        dir: bool,
    },
    /// `name` in directory `parent`, which named `ino`, is gone.
    Unlink {
        parent: u32,
        ino: u32,
        name: &'a [u8],
        dir: bool,
    },
    /// Something fast commits cannot express.
    Ineligible(Ineligible),
}

/// Who watches the changes of every handle (the fast-commit tracker).
/// Called with filesystem and buffer locks held: implementations take only
/// a leaf lock of their own.
pub trait ChangeObserver: Send + Sync {
    /// `change` was made by the operation holding handle `handle` (its
    /// number: `Handle::id`), in transaction `tid`.
    fn changed(&self, handle: u64, tid: u32, change: Change<'_>);
    /// The operation holding handle `handle` stopped it (its outermost
    /// level): it makes no more changes under it.
    fn stopped(&self, handle: u64);
    /// Transaction `tid`'s commit block is durable: every change made in
    /// it or before is on disk through the log.
    fn committed(&self, tid: u32);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_have_distinct_indices_and_names() {
        let mut names = std::collections::HashSet::new();
        for (index, reason) in Ineligible::ALL.iter().enumerate() {
            assert_eq!(reason.index(), index);
            assert!(names.insert(reason.name()), "{reason:?} named twice");
        }
    }
}
