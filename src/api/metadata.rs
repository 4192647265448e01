//! What `stat` says about an inode, shaped like std's `Metadata`,
//! `FileType` and `std::os::unix::fs::MetadataExt`.
//!
//! A `Metadata` is a snapshot taken when it was asked for; it never
//! changes afterwards, as std's does not.

use crate::format::inode::Timestamp;
use crate::fs::{Attr, FileKind};
use std::io;
use std::time::{Duration, SystemTime};

/// The type of a file: regular, directory, symbolic link, device, fifo
/// or socket (std's `FileType` with `std::os::unix::fs::FileTypeExt`'s
/// questions as methods).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileType(pub(super) FileKind);

impl FileType {
    /// A directory.
    pub fn is_dir(&self) -> bool {
        self.0 == FileKind::Directory
    }

    /// A regular file.
    pub fn is_file(&self) -> bool {
        self.0 == FileKind::Regular
    }

    /// A symbolic link.
    pub fn is_symlink(&self) -> bool {
        self.0 == FileKind::Symlink
    }

    /// A block device node.
    pub fn is_block_device(&self) -> bool {
        self.0 == FileKind::BlockDevice
    }

    /// A character device node.
    pub fn is_char_device(&self) -> bool {
        self.0 == FileKind::CharDevice
    }

    /// A named pipe.
    pub fn is_fifo(&self) -> bool {
        self.0 == FileKind::Fifo
    }

    /// A Unix domain socket.
    pub fn is_socket(&self) -> bool {
        self.0 == FileKind::Socket
    }

    /// The `S_IFMT` bits of this type (`S_IFREG`, `S_IFDIR`, …).
    pub fn format_bits(&self) -> u32 {
        u32::from(type_bits(self.0))
    }
}

/// The `S_IFMT` bits of a kind (stat.h).
fn type_bits(kind: FileKind) -> u16 {
    use crate::format::inode as fmt;
    match kind {
        FileKind::Regular => fmt::S_IFREG,
        FileKind::Directory => fmt::S_IFDIR,
        FileKind::Symlink => fmt::S_IFLNK,
        FileKind::CharDevice => fmt::S_IFCHR,
        FileKind::BlockDevice => fmt::S_IFBLK,
        FileKind::Fifo => fmt::S_IFIFO,
        FileKind::Socket => fmt::S_IFSOCK,
    }
}

/// An inode's attributes, as `std::fs::Metadata` (with
/// `std::os::unix::fs::MetadataExt`'s fields as methods: no trait to
/// import; the trait is implemented as well).
#[derive(Debug, Clone)]
pub struct Metadata {
    attr: Attr,
}

#[doc(hidden)]
impl From<Attr> for Metadata {
    fn from(attr: Attr) -> Self {
        Metadata { attr }
    }
}

impl Metadata {
    /// The engine's attribute record behind this metadata (generation,
    /// inode flags): part of the unstable engine surface.
    #[doc(hidden)]
    pub fn attr(&self) -> &Attr {
        &self.attr
    }

    /// The file's type.
    pub fn file_type(&self) -> FileType {
        FileType(self.attr.kind)
    }

    /// A directory.
    pub fn is_dir(&self) -> bool {
        self.file_type().is_dir()
    }

    /// A regular file.
    pub fn is_file(&self) -> bool {
        self.file_type().is_file()
    }

    /// A symbolic link (only from `symlink_metadata`: `metadata` follows
    /// links).
    pub fn is_symlink(&self) -> bool {
        self.file_type().is_symlink()
    }

    /// Size in bytes (a symbolic link's is its target's length).
    pub fn len(&self) -> u64 {
        self.attr.size
    }

    /// Whether the size is 0 (clippy asks `len` to have it).
    pub fn is_empty(&self) -> bool {
        self.attr.size == 0
    }

    /// The permission bits, with setuid, setgid and sticky
    /// (`PermissionsExt::mode` gives them back).
    pub fn permissions(&self) -> std::fs::Permissions {
        std::os::unix::fs::PermissionsExt::from_mode(u32::from(self.attr.perm))
    }

    /// Last data change (mtime), to the nanosecond.
    pub fn modified(&self) -> io::Result<SystemTime> {
        Ok(system_time(self.attr.mtime))
    }

    /// Last access (atime), as the image's atime policy keeps it.
    pub fn accessed(&self) -> io::Result<SystemTime> {
        Ok(system_time(self.attr.atime))
    }

    /// Creation time (ext4's crtime); `Unsupported` where the inode has
    /// no room for it (128-byte inodes, ext2/ext3 images), as std's
    /// `statx` answers there.
    pub fn created(&self) -> io::Result<SystemTime> {
        if self.attr.crtime == (Timestamp { sec: 0, nsec: 0 }) {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "creation time is not available on this inode",
            ));
        }
        Ok(system_time(self.attr.crtime))
    }

    /// The device the file is on: 0 (an image has no device number).
    pub fn dev(&self) -> u64 {
        0
    }

    /// The inode number.
    pub fn ino(&self) -> u64 {
        u64::from(self.attr.ino)
    }

    /// `st_mode`: type bits and permission bits.
    pub fn mode(&self) -> u32 {
        self.file_type().format_bits() | u32::from(self.attr.perm)
    }

    /// Number of hard links.
    pub fn nlink(&self) -> u64 {
        u64::from(self.attr.nlink)
    }

    /// Owner's user id.
    pub fn uid(&self) -> u32 {
        self.attr.uid
    }

    /// Owner's group id.
    pub fn gid(&self) -> u32 {
        self.attr.gid
    }

    /// Device number of a device node (0 for others).
    pub fn rdev(&self) -> u64 {
        u64::from(self.attr.rdev)
    }

    /// Size in bytes (`len`).
    pub fn size(&self) -> u64 {
        self.attr.size
    }

    /// Last access, seconds since the epoch.
    pub fn atime(&self) -> i64 {
        self.attr.atime.sec
    }

    /// Nanoseconds of `atime`.
    pub fn atime_nsec(&self) -> i64 {
        i64::from(self.attr.atime.nsec)
    }

    /// Last modification, seconds since the epoch.
    pub fn mtime(&self) -> i64 {
        self.attr.mtime.sec
    }

    /// Nanoseconds of `mtime`.
    pub fn mtime_nsec(&self) -> i64 {
        i64::from(self.attr.mtime.nsec)
    }

    /// Last status change, seconds since the epoch.
    pub fn ctime(&self) -> i64 {
        self.attr.ctime.sec
    }

    /// Nanoseconds of `ctime`.
    pub fn ctime_nsec(&self) -> i64 {
        i64::from(self.attr.ctime.nsec)
    }

    /// Preferred I/O size: the filesystem's block size.
    pub fn blksize(&self) -> u64 {
        u64::from(self.attr.blksize)
    }

    /// Allocated space in 512-byte units, as `st_blocks`.
    pub fn blocks(&self) -> u64 {
        self.attr.blocks
    }
}

impl std::os::unix::fs::MetadataExt for Metadata {
    fn dev(&self) -> u64 {
        Metadata::dev(self)
    }
    fn ino(&self) -> u64 {
        Metadata::ino(self)
    }
    fn mode(&self) -> u32 {
        Metadata::mode(self)
    }
    fn nlink(&self) -> u64 {
        Metadata::nlink(self)
    }
    fn uid(&self) -> u32 {
        Metadata::uid(self)
    }
    fn gid(&self) -> u32 {
        Metadata::gid(self)
    }
    fn rdev(&self) -> u64 {
        Metadata::rdev(self)
    }
    fn size(&self) -> u64 {
        Metadata::size(self)
    }
    fn atime(&self) -> i64 {
        Metadata::atime(self)
    }
    fn atime_nsec(&self) -> i64 {
        Metadata::atime_nsec(self)
    }
    fn mtime(&self) -> i64 {
        Metadata::mtime(self)
    }
    fn mtime_nsec(&self) -> i64 {
        Metadata::mtime_nsec(self)
    }
    fn ctime(&self) -> i64 {
        Metadata::ctime(self)
    }
    fn ctime_nsec(&self) -> i64 {
        Metadata::ctime_nsec(self)
    }
    fn blksize(&self) -> u64 {
        Metadata::blksize(self)
    }
    fn blocks(&self) -> u64 {
        Metadata::blocks(self)
    }
}

/// An on-disk time as a `SystemTime` (before the epoch too: ext4's
/// times are signed).
pub(super) fn system_time(time: Timestamp) -> SystemTime {
    let nanos = Duration::from_nanos(u64::from(time.nsec));
    if time.sec >= 0 {
        SystemTime::UNIX_EPOCH + Duration::from_secs(time.sec as u64) + nanos
    } else {
        SystemTime::UNIX_EPOCH - Duration::from_secs(time.sec.unsigned_abs()) + nanos
    }
}

/// A `SystemTime` as an on-disk time, to the nanosecond.
pub(super) fn timestamp(time: SystemTime) -> Timestamp {
    match time.duration_since(SystemTime::UNIX_EPOCH) {
        Ok(since) => Timestamp {
            sec: since.as_secs() as i64,
            nsec: since.subsec_nanos(),
        },
        Err(before) => {
            let before = before.duration();
            // -1.25 s is sec -2, nsec 750 000 000.
            let (sec, nsec) = match before.subsec_nanos() {
                0 => (-(before.as_secs() as i64), 0),
                n => (-(before.as_secs() as i64) - 1, 1_000_000_000 - n),
            };
            Timestamp { sec, nsec }
        }
    }
}
