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
    Superblock,
    GroupDescriptor { group: u32 },
    Block { block: u64 },
    Inode { ino: u32 },
    InodeBlock { ino: u32, block: u64 },
    Journal { block: u64 },
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
        location: Location,
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
    #[error("no space left on device")]
    NoSpace,
    #[error("no such file or directory")]
    NotFound,
    #[error("file exists")]
    Exists,
    #[error("not a directory")]
    NotDirectory,
    #[error("is a directory")]
    IsDirectory,
    #[error("directory not empty")]
    NotEmpty,
    #[error("file name too long")]
    NameTooLong,
    #[error("too many links")]
    TooManyLinks,
    #[error("file too large")]
    FileTooBig,
    #[error("permission denied")]
    PermissionDenied,
    #[error("operation not permitted")]
    NotPermitted,
    #[error("no such attribute")]
    NoAttribute,
    #[error("result does not fit the buffer")]
    Range,
    #[error("operation not supported")]
    NotSupported,
    #[error("stale file handle")]
    Stale,
    #[error("too many levels of symbolic links or invalid cross-directory move")]
    InvalidMove,
    #[error("device or resource busy")]
    Busy,
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
            Error::Busy => libc::EBUSY,
        }
    }

    pub fn is_corruption(&self) -> bool {
        matches!(self, Error::Corrupt { .. })
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Early-return a corruption error unless `cond` holds.
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
