//! Errors of every layer, and their errno at the FUSE boundary.
//!
//! One umbrella type keeps the `?` chains short across layers; the variants
//! stay typed so that callers (and tests) match on what happened, never on
//! message text. `Corrupt` carries where the damage was found, because the
//! operator who reads the log needs a block or inode number to run
//! `debugfs` on, not a sentence.

use std::fmt;

/// Where in the image a corruption was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Location {
    /// The primary superblock (or the backup the image was opened from).
    Superblock,
    /// The descriptor of a block group.
    GroupDescriptor {
        /// The group's number.
        group: u32,
    },
    /// A metadata block with no one inode to blame (a bitmap, an inode
    /// table block).
    Block {
        /// The block's number, in filesystem blocks.
        block: u64,
    },
    /// An inode itself: its fields or its checksum.
    Inode {
        /// The inode's number.
        ino: u32,
    },
    /// A block an inode owns: an extent tree node, a directory block,
    /// an xattr block.
    InodeBlock {
        /// The owner's inode number.
        ino: u32,
        /// The block's number, in filesystem blocks.
        block: u64,
    },
    /// The journal: its superblock, a descriptor, a commit block.
    Journal {
        /// The block's index inside the journal (0: its superblock).
        block: u64,
    },
}

impl Location {
    /// The inode and block involved (0 where none), as the superblock's
    /// error record and the kernel's error lines name them.
    pub fn ino_and_block(&self) -> (u32, u64) {
        match *self {
            Location::Inode { ino } => (ino, 0),
            Location::Block { block } => (0, block),
            Location::InodeBlock { ino, block } => (ino, block),
            Location::Superblock | Location::GroupDescriptor { .. } | Location::Journal { .. } => {
                (0, 0)
            }
        }
    }
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Location::Superblock => write!(f, "superblock"),
            Location::GroupDescriptor { group } => write!(f, "group descriptor {group}"),
            Location::Block { block } => write!(f, "block {block}"),
            Location::Inode { ino } => write!(f, "inode {ino}"),
            Location::InodeBlock { ino, block } => write!(f, "inode {ino}, block {block}"),
            Location::Journal { block } => write!(f, "journal block {block}"),
        }
    }
}

/// What went wrong, typed: match on the variant, never on the message.
/// Every variant has the errno the kernel would give (`errno`,
/// `raw_os_error`) and std's `io::ErrorKind` for it (`kind`), and the
/// whole converts into `std::io::Error`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The device failed a read, write or flush — or an open was refused
    /// (in use, permission, no such device): the Display says "I/O error"
    /// only for the failures (`io_error_is_failure`), since a refusal
    /// already says what refused.
    #[error("{prefix}{0}", prefix = if io_error_is_failure(.0) { "I/O error: " } else { "" })]
    Io(#[from] std::io::Error),
    /// An on-disk structure is inconsistent (bad magic, bad checksum,
    /// out-of-range pointer). The filesystem turns read-only when this is seen.
    #[error("corrupt filesystem at {location}: {detail}")]
    Corrupt {
        /// Where the damage is.
        location: Location,
        /// What is wrong there, in a sentence.
        detail: String,
        /// Where in jext4 the damage was noticed (the kernel's
        /// `function:line` in its `EXT4-fs error` lines and in the
        /// superblock's error record).
        origin: &'static std::panic::Location<'static>,
    },
    /// The image uses a feature this build cannot handle safely.
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// Bad argument from the caller (bad mount option, bad flag combination).
    #[error("invalid argument: {0}")]
    Invalid(String),
    /// The filesystem is mounted read-only, or turned read-only after an error.
    #[error("read-only filesystem")]
    ReadOnly,
    /// ENOSPC: no blocks or inodes left (`ErrorKind::StorageFull`).
    #[error("no space left on device")]
    NoSpace,
    /// ENOENT: a name, or a directory on the way to it, is missing.
    #[error("no such file or directory")]
    NotFound,
    /// EEXIST: the name is taken.
    #[error("file exists")]
    Exists,
    /// ENOTDIR: a path goes through something that is not a directory.
    #[error("not a directory")]
    NotDirectory,
    /// EISDIR: a directory where a file is needed (written, unlinked).
    #[error("is a directory")]
    IsDirectory,
    /// ENOTEMPTY: a directory to remove or replace still has entries.
    #[error("directory not empty")]
    NotEmpty,
    /// ENAMETOOLONG: a name over 255 bytes.
    #[error("file name too long")]
    NameTooLong,
    /// EMLINK: an inode at ext4's link limit.
    #[error("too many links")]
    TooManyLinks,
    /// EFBIG: past the largest offset the file's mapping can hold.
    #[error("file too large")]
    FileTooBig,
    /// EACCES.
    #[error("permission denied")]
    PermissionDenied,
    /// EPERM: not allowed whatever the permissions (a hard link to a
    /// directory, an immutable inode).
    #[error("operation not permitted")]
    NotPermitted,
    /// ENODATA: no extended attribute of that name.
    #[error("no such attribute")]
    NoAttribute,
    /// ERANGE: a result does not fit the buffer, or a value is too big.
    #[error("result does not fit the buffer")]
    Range,
    /// EOPNOTSUPP: not something this inode or image can do.
    #[error("operation not supported")]
    NotSupported,
    /// EIO, as the kernel gives it: a block of an fs-verity file does not
    /// match its Merkle tree (the file's data or its tree changed on disk).
    /// Not a device failure: the filesystem stays writable.
    #[error("fs-verity: block {block} of inode {ino} does not match its Merkle tree")]
    VerityMismatch {
        /// The file.
        ino: u32,
        /// The Merkle block of its data (4 KiB, or the block size below).
        block: u64,
    },
    /// ESTALE: the inode behind a number was freed meanwhile.
    #[error("stale file handle")]
    Stale,
    /// A rename that would move a directory under itself, or `.`/`..`.
    #[error("invalid move: a directory cannot move into itself")]
    InvalidMove,
    /// More symbolic links than Linux follows (MAXSYMLINKS, 40) while
    /// resolving one path: ELOOP, as `open(2)` gives.
    #[error("too many levels of symbolic links")]
    TooManySymlinks,
    /// EBUSY.
    #[error("device or resource busy")]
    Busy,
    /// EXDEV: a link or rename into a directory whose project its entries
    /// inherit (+P), of something of another project.
    #[error("invalid cross-device link")]
    CrossDevice,
    /// ETXTBSY: a write to a file fs-verity is being enabled on.
    #[error("text file busy")]
    TextFileBusy,
    /// EMSGSIZE: a value larger than its place allows (an fs-verity salt
    /// or signature larger than the descriptor takes).
    #[error("{0}")]
    MessageTooLong(String),
    /// EOVERFLOW: a value the on-disk field cannot hold (a project id in an
    /// inode without room for one, a verity digest larger than the
    /// caller's buffer).
    #[error("value too large for defined data type")]
    Overflow,
    /// EDQUOT: the change would take a user, group or project past its
    /// hard quota limit, or past its soft limit once the grace time ran
    /// out (the kernel's check_bdq and check_idq).
    #[error("disk quota exceeded")]
    QuotaExceeded,
    /// ENOKEY: the file or directory is encrypted and its key is not
    /// here (jext4 holds no fscrypt keys): its contents cannot be read or
    /// written, nor names added to it.
    #[error("required key not available")]
    NoKey,
    /// The image was closed (`Image::close`) while a `File` of it was
    /// still open: EBADF, as an operation on a closed descriptor.
    #[error("the image is closed")]
    Closed,
}

/// Whether an `io::Error` is a failure of the device (EIO, a short read
/// or write, a dropped connection) rather than a refusal that names its
/// reason (in use, permission denied, not found, read-only, bad input).
pub fn io_error_is_failure(error: &std::io::Error) -> bool {
    use std::io::ErrorKind::*;
    !matches!(
        error.kind(),
        PermissionDenied
            | ResourceBusy
            | NotFound
            | AlreadyExists
            | InvalidInput
            | ReadOnlyFilesystem
            | Unsupported
            | IsADirectory
            | NotADirectory
            | ConnectionRefused
            | AddrInUse
            | WouldBlock
    )
}

impl Error {
    /// Shorthand used by the format layer when a structure does not parse.
    /// The caller's source location is kept as the error's origin.
    #[doc(hidden)]
    #[track_caller]
    pub fn corrupt(location: Location, detail: impl Into<String>) -> Self {
        Error::Corrupt {
            location,
            detail: detail.into(),
            origin: std::panic::Location::caller(),
        }
    }

    /// A corruption's detail rewritten by `extend` (a hint at what repairs
    /// it, say), its place and origin kept; any other error unchanged.
    #[doc(hidden)]
    pub fn map_corrupt_detail(self, extend: impl FnOnce(String) -> String) -> Self {
        match self {
            Error::Corrupt {
                location,
                detail,
                origin,
            } => Error::Corrupt {
                location,
                detail: extend(detail),
                origin,
            },
            error => error,
        }
    }

    /// The errno a FUSE reply or a library caller sees.
    pub fn errno(&self) -> i32 {
        match self {
            Error::Io(e) => e.raw_os_error().unwrap_or(libc::EIO),
            Error::Corrupt { .. } => libc::EUCLEAN,
            Error::Unsupported(_) => libc::EOPNOTSUPP,
            Error::Invalid(_) => libc::EINVAL,
            Error::ReadOnly => libc::EROFS,
            Error::NoSpace => libc::ENOSPC,
            Error::NotFound => libc::ENOENT,
            Error::Exists => libc::EEXIST,
            Error::NotDirectory => libc::ENOTDIR,
            Error::IsDirectory => libc::EISDIR,
            Error::NotEmpty => libc::ENOTEMPTY,
            Error::NameTooLong => libc::ENAMETOOLONG,
            Error::TooManyLinks => libc::EMLINK,
            Error::FileTooBig => libc::EFBIG,
            Error::PermissionDenied => libc::EACCES,
            Error::NotPermitted => libc::EPERM,
            Error::NoAttribute => libc::ENODATA,
            Error::Range => libc::ERANGE,
            Error::NotSupported => libc::EOPNOTSUPP,
            Error::Stale => libc::ESTALE,
            Error::InvalidMove => libc::EINVAL,
            Error::TooManySymlinks => libc::ELOOP,
            Error::Busy => libc::EBUSY,
            Error::CrossDevice => libc::EXDEV,
            Error::TextFileBusy => libc::ETXTBSY,
            Error::Overflow => libc::EOVERFLOW,
            Error::MessageTooLong(_) => libc::EMSGSIZE,
            Error::QuotaExceeded => libc::EDQUOT,
            Error::NoKey => libc::ENOKEY,
            Error::Closed => libc::EBADF,
            Error::VerityMismatch { .. } => libc::EIO,
        }
    }

    /// The errno the kernel would give for this error (`errno`), as
    /// `std::io::Error::raw_os_error` gives it: always `Some`.
    pub fn raw_os_error(&self) -> Option<i32> {
        Some(self.errno())
    }

    /// The `std::io::ErrorKind` std gives for the same failure:
    /// `NotFound` for ENOENT, `AlreadyExists` for EEXIST,
    /// `DirectoryNotEmpty`, `IsADirectory`, `StorageFull`,
    /// `ReadOnlyFilesystem`, `FilesystemLoop` and so on — std's own
    /// errno table, applied to `errno`, so that the two never disagree.
    pub fn kind(&self) -> std::io::ErrorKind {
        match self {
            Error::Io(error) => error.kind(),
            error => std::io::Error::from_raw_os_error(error.errno()).kind(),
        }
    }

    /// Whether this is damage found on disk (`Corrupt`).
    pub fn is_corruption(&self) -> bool {
        matches!(self, Error::Corrupt { .. })
    }
}

/// The result of every jext4 operation.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// `?` on a jext4 result in a function returning `std::io::Result`.
///
/// An error that says no more than its errno becomes the OS error itself
/// (`raw_os_error` and the message are std's: "No such file or directory
/// (os error 2)"); one that carries a detail (a corruption's location, a
/// bad argument's reason) keeps it as the inner error, with the same
/// `kind`, so that `get_ref` can downcast it back to `jext4::Error`.
/// A device error is handed back as it came.
impl From<Error> for std::io::Error {
    fn from(error: Error) -> std::io::Error {
        match error {
            Error::Io(error) => error,
            Error::Corrupt { .. }
            | Error::Unsupported(_)
            | Error::Invalid(_)
            | Error::MessageTooLong(_)
            | Error::Closed
            | Error::VerityMismatch { .. } => std::io::Error::new(error.kind(), error),
            error => std::io::Error::from_raw_os_error(error.errno()),
        }
    }
}

/// Early-return a corruption error unless `cond` holds (the format
/// layer's; not part of the API).
#[doc(hidden)]
#[macro_export]
macro_rules! ensure_format {
    ($cond:expr, $location:expr, $($arg:tt)+) => {
        if !$cond {
            return Err($crate::error::Error::corrupt($location, format!($($arg)+)).into());
        }
    };
}

/// The message a panic carried (`panic!` with a literal or a formatted
/// string), for the log line that reports it.
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(text) = payload.downcast_ref::<&str>() {
        text.to_string()
    } else if let Some(text) = payload.downcast_ref::<String>() {
        text.clone()
    } else {
        "(no message)".to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io;

    #[test]
    fn kinds_and_errnos_are_std_s() {
        use io::ErrorKind::*;
        let cases = [
            (Error::NotFound, NotFound, libc::ENOENT),
            (Error::Exists, AlreadyExists, libc::EEXIST),
            (Error::NotEmpty, DirectoryNotEmpty, libc::ENOTEMPTY),
            (Error::IsDirectory, IsADirectory, libc::EISDIR),
            (Error::NotDirectory, NotADirectory, libc::ENOTDIR),
            (Error::NoSpace, StorageFull, libc::ENOSPC),
            (Error::ReadOnly, ReadOnlyFilesystem, libc::EROFS),
            (Error::PermissionDenied, PermissionDenied, libc::EACCES),
            (Error::Invalid("x".into()), InvalidInput, libc::EINVAL),
            (Error::CrossDevice, CrossesDevices, libc::EXDEV),
            (Error::TextFileBusy, ExecutableFileBusy, libc::ETXTBSY),
            (Error::QuotaExceeded, QuotaExceeded, libc::EDQUOT),
        ];
        for (error, kind, errno) in cases {
            assert_eq!(error.kind(), kind, "{error}");
            assert_eq!(error.raw_os_error(), Some(errno), "{error}");
            let converted = io::Error::from(error);
            assert_eq!(converted.kind(), kind);
        }
        // FilesystemLoop is not a stable name yet: compare what it prints.
        let looped = Error::TooManySymlinks;
        assert_eq!(format!("{:?}", looped.kind()), "FilesystemLoop");
        assert_eq!(looped.raw_os_error(), Some(libc::ELOOP));
        let plain = io::Error::from(Error::NotFound);
        assert_eq!(plain.raw_os_error(), Some(libc::ENOENT));
        let detailed = io::Error::from(Error::Invalid("bad flag".into()));
        assert!(detailed.to_string().contains("bad flag"));
        assert!(
            detailed
                .get_ref()
                .unwrap()
                .downcast_ref::<Error>()
                .is_some()
        );
    }

    #[test]
    fn io_display_names_failures_and_leaves_refusals_alone() {
        let failed = Error::Io(io::Error::from_raw_os_error(libc::EIO));
        assert_eq!(
            failed.to_string(),
            "I/O error: Input/output error (os error 5)"
        );
        let busy = Error::Io(io::Error::new(
            io::ErrorKind::ResourceBusy,
            "in use by pid 7",
        ));
        assert_eq!(busy.to_string(), "in use by pid 7");
        let denied = Error::Io(io::Error::from_raw_os_error(libc::EACCES));
        assert_eq!(denied.to_string(), "Permission denied (os error 13)");
        let short = Error::Io(io::Error::new(io::ErrorKind::UnexpectedEof, "short read"));
        assert_eq!(short.to_string(), "I/O error: short read");
    }
}
