//! Requests to a running server through the mount itself: ioctls on any
//! file or directory of the mount (usually its root), answered by the
//! server. The kernel never forwards sync(2) or syncfs(2) to a /dev/fuse
//! server (only virtiofs gets FUSE_SYNCFS), so `jext4 sync` asks this way,
//! and `jext4 stats` reads the live statistics this way; `jext4 quota`
//! on a mount sets limits and reads reports this way too.
//!
//! FUSE passes "restricted" ioctls only: the size and direction of the
//! argument come from the command number (linux/ioctl.h `_IOC`), which is
//! how the kernel knows what to copy.

use crate::format::quota::{Dquot, Info, QuotaType};
use crate::fs::{QuotaLimits, QuotaReport};
use std::fs::File;
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::io::AsRawFd;
use std::path::Path;

const IOC_NONE: u32 = 0;
const IOC_READ: u32 = 2;

/// linux/ioctl.h `_IOC(dir, type, nr, size)`.
const fn ioc(direction: u32, kind: u8, number: u8, size: u32) -> u32 {
    direction << 30 | size << 16 | (kind as u32) << 8 | number as u32
}

const IOC_WRITE: u32 = 1;

/// linux/fsverity.h: `_IOW('f', 133, struct fsverity_enable_arg)` (128
/// bytes, then the salt and the signature, which FUSE passes after it).
pub const FS_IOC_ENABLE_VERITY: u32 = ioc(IOC_WRITE, b'f', 133, 128);
/// linux/fsverity.h: `_IOWR('f', 134, struct fsverity_digest)` (4 bytes:
/// the algorithm and the caller's room for the digest, then the digest).
pub const FS_IOC_MEASURE_VERITY: u32 = ioc(IOC_READ | IOC_WRITE, b'f', 134, 4);

/// linux/fs.h: `_IOR('X', 31, struct fsxattr)` and `_IOW('X', 32, ...)`
/// (28 bytes: xflags, extsize, nextents, projid, cowextsize, padding):
/// what `chattr -p`, `lsattr -p` and `xfs_io -c chproj` use, and what the
/// kernel's FUSE sends for FS_IOC_FSGETXATTR / FSSETXATTR on a file of the
/// mount (fuse_fileattr_get, _set).
pub const FS_IOC_FSGETXATTR: u32 = ioc(IOC_READ, b'X', 31, FSXATTR_SIZE);
pub const FS_IOC_FSSETXATTR: u32 = ioc(IOC_WRITE, b'X', 32, FSXATTR_SIZE);
const FSXATTR_SIZE: u32 = 28;
/// linux/fs.h: `_IOR('f', 1, long)`, `_IOW('f', 2, long)` (`lsattr`,
/// `chattr`); the kernel's FUSE passes an int (fuse_fileattr_get).
pub const FS_IOC_GETFLAGS: u32 = ioc(IOC_READ, b'f', 1, 8);
pub const FS_IOC_SETFLAGS: u32 = ioc(IOC_WRITE, b'f', 2, 8);

/// The int of FS_IOC_SETFLAGS; EINVAL when short.
pub fn parse_flags(bytes: &[u8]) -> crate::Result<u32> {
    bytes
        .get(..4)
        .map(|int| u32::from_le_bytes(int.try_into().unwrap()))
        .ok_or_else(|| crate::Error::Invalid("FS_IOC_SETFLAGS: short argument".into()))
}

/// A `struct fsxattr` with `xflags` and `projid` (the rest 0).
pub fn fsxattr(xflags: u32, projid: u32) -> Vec<u8> {
    let mut bytes = vec![0u8; FSXATTR_SIZE as usize];
    bytes[0..4].copy_from_slice(&xflags.to_le_bytes());
    bytes[12..16].copy_from_slice(&projid.to_le_bytes());
    bytes
}

/// The xflags and projid of a `struct fsxattr`; EINVAL when short.
pub fn parse_fsxattr(bytes: &[u8]) -> crate::Result<(u32, u32)> {
    if bytes.len() < FSXATTR_SIZE as usize {
        return Err(crate::Error::Invalid(
            "FS_IOC_FSSETXATTR: short argument".into(),
        ));
    }
    let field = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap());
    Ok((field(0), field(12)))
}

/// `struct fsverity_enable_arg` and what follows it — the salt, then the
/// signature, as the kernel's FUSE passes them (`fuse_setup_enable_verity`)
/// — as the parameters `Fs::enable_verity_with` takes; the block size,
/// salt and signature sizes are checked there. EINVAL for what the kernel
/// refuses as EINVAL (version, reserved fields, a short argument),
/// EOPNOTSUPP for a hash jext4 does not compute (SHA-512).
pub fn parse_enable_verity(arg: &[u8]) -> crate::Result<crate::fs::VerityParams> {
    let field = |at: usize| -> u32 {
        arg.get(at..at + 4)
            .map_or(0, |bytes| u32::from_le_bytes(bytes.try_into().unwrap()))
    };
    let invalid = |why: &str| {
        Err(crate::Error::Invalid(format!(
            "FS_IOC_ENABLE_VERITY: {why}"
        )))
    };
    if arg.len() < 128 {
        return invalid("short argument");
    }
    // version 0, hash_algorithm 4, block_size 8, salt_size 12, salt_ptr
    // 16, sig_size 24, __reserved1 28, sig_ptr 32, __reserved2 40..128.
    if field(0) != 1 || field(28) != 0 || arg[40..128].iter().any(|&b| b != 0) {
        return invalid("version or reserved fields");
    }
    match field(4) {
        1 => {}
        2 => {
            return Err(crate::Error::Unsupported(
                "FS_IOC_ENABLE_VERITY: SHA-512 trees are not written (SHA-256 only)".into(),
            ));
        }
        _ => return invalid("hash algorithm"),
    }
    let (salt_size, sig_size) = (field(12) as usize, field(24) as usize);
    let salt_end = 128 + salt_size;
    let Some(signature) = arg.get(salt_end..salt_end + sig_size) else {
        return invalid("salt or signature shorter than their sizes");
    };
    Ok(crate::fs::VerityParams {
        block_size: Some(field(8)),
        salt: arg[128..salt_end].to_vec(),
        signature: signature.to_vec(),
    })
}

/// The answer to `FS_IOC_MEASURE_VERITY` for `digest`, given the caller's
/// `struct fsverity_digest` header: EOVERFLOW when its room is too small.
pub fn measured(arg: &[u8], digest: &[u8; 32]) -> crate::Result<Vec<u8>> {
    let room = arg
        .get(2..4)
        .map_or(0, |bytes| u16::from_le_bytes(bytes.try_into().unwrap()));
    if (room as usize) < digest.len() {
        return Err(crate::Error::Overflow);
    }
    let mut out = Vec::with_capacity(4 + digest.len());
    out.extend_from_slice(&1u16.to_le_bytes());
    out.extend_from_slice(&(digest.len() as u16).to_le_bytes());
    out.extend_from_slice(digest);
    Ok(out)
}

/// The ioctl type byte of jext4's requests.
const KIND: u8 = b'j';

/// Commit everything accepted so far and wait until it is durable, file
/// data included (`jext4 sync`): `_IO('j', 1)`.
pub const JEXT4_IOC_SYNC: u32 = ioc(IOC_NONE, KIND, 1, 0);

/// The live statistics report (`jext4 stats`): `_IOR('j', 2, [u8; 16383])`
/// (the largest size the command number can carry); the ioctl returns the
/// report's length.
pub const STATS_SIZE: usize = (1 << 14) - 1;
pub const JEXT4_IOC_STATS: u32 = ioc(IOC_READ, KIND, 2, STATS_SIZE as u32);

/// The same request as servers before the FUSE request counters knew it,
/// with an 8 KiB buffer: still answered (the report cut to fit), and tried
/// when a server does not know the larger one.
pub const STATS_SIZE_8K: usize = 8192;
pub const JEXT4_IOC_STATS_8K: u32 = ioc(IOC_READ, KIND, 2, STATS_SIZE_8K as u32);

/// Quota requests (`jext4 quota` on a mount): FUSE does not forward
/// quotactl, so limits and reports go through ioctls, allowed as the
/// kernel allows quotactl's Q_SETQUOTA, Q_SETINFO and Q_GETNEXTQUOTA: to
/// a caller with CAP_SYS_ADMIN (EPERM otherwise). Numbers are in the
/// host's byte order, as a C struct passed to ioctl(2).
///
/// `_IOW('j', 3, [u8; 40])`: set one id's limits: the type (0 user, 1
/// group, 2 project) and the id as u32, then the space soft and hard
/// limits (KiB) and the inode soft and hard limits as u64.
pub const QUOTA_SET_SIZE: usize = 40;
pub const JEXT4_IOC_QUOTA_SET: u32 = ioc(IOC_WRITE, KIND, 3, QUOTA_SET_SIZE as u32);

/// `_IOW('j', 4, [u8; 12])`: set a type's grace times: the type, then the
/// block and inode grace times in seconds, as u32.
pub const QUOTA_GRACE_SIZE: usize = 12;
pub const JEXT4_IOC_QUOTA_GRACE: u32 = ioc(IOC_WRITE, KIND, 4, QUOTA_GRACE_SIZE as u32);

/// `_IOWR('j', 5, [u8; 16383])`: one page of a type's report. In: the
/// type and the first id wanted, as u32. Out: the block and inode grace
/// times, the number of entries that follow and whether entries of
/// higher ids are left (u32 each), then each entry: the id (u32), the
/// space used (bytes), its soft and hard limits (KiB), the inodes used,
/// their soft and hard limits, the block and inode grace deadlines (u64).
pub const QUOTA_PAGE_SIZE: usize = (1 << 14) - 1;
pub const JEXT4_IOC_QUOTA_PAGE: u32 = ioc(IOC_READ | IOC_WRITE, KIND, 5, QUOTA_PAGE_SIZE as u32);
const PAGE_HEADER: usize = 16;
const PAGE_ENTRY: usize = 4 + 8 * 8;
/// Entries one page holds.
pub const PAGE_ENTRIES: usize = (QUOTA_PAGE_SIZE - PAGE_HEADER) / PAGE_ENTRY;

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    u32::from_ne_bytes(bytes[at..at + 4].try_into().unwrap())
}

fn u64_at(bytes: &[u8], at: usize) -> u64 {
    u64::from_ne_bytes(bytes[at..at + 8].try_into().unwrap())
}

fn quota_type(number: u32) -> crate::Result<QuotaType> {
    QuotaType::ALL
        .get(number as usize)
        .copied()
        .ok_or_else(|| crate::Error::Invalid(format!("quota type {number}")))
}

fn argument(bytes: &[u8], size: usize) -> crate::Result<&[u8]> {
    bytes
        .get(..size)
        .ok_or_else(|| crate::Error::Invalid("short quota request".into()))
}

/// JEXT4_IOC_QUOTA_SET's argument.
pub fn quota_set_arg(qtype: QuotaType, id: u32, limits: &QuotaLimits) -> Vec<u8> {
    let mut out = Vec::with_capacity(QUOTA_SET_SIZE);
    out.extend_from_slice(&(qtype as u32).to_ne_bytes());
    out.extend_from_slice(&id.to_ne_bytes());
    for value in [
        limits.space_soft,
        limits.space_hard,
        limits.inode_soft,
        limits.inode_hard,
    ] {
        out.extend_from_slice(&value.to_ne_bytes());
    }
    out
}

pub fn parse_quota_set(bytes: &[u8]) -> crate::Result<(QuotaType, u32, QuotaLimits)> {
    let bytes = argument(bytes, QUOTA_SET_SIZE)?;
    let limits = QuotaLimits {
        space_soft: u64_at(bytes, 8),
        space_hard: u64_at(bytes, 16),
        inode_soft: u64_at(bytes, 24),
        inode_hard: u64_at(bytes, 32),
    };
    Ok((quota_type(u32_at(bytes, 0))?, u32_at(bytes, 4), limits))
}

/// JEXT4_IOC_QUOTA_GRACE's argument.
pub fn quota_grace_arg(qtype: QuotaType, block_grace: u32, inode_grace: u32) -> Vec<u8> {
    [qtype as u32, block_grace, inode_grace]
        .iter()
        .flat_map(|value| value.to_ne_bytes())
        .collect()
}

pub fn parse_quota_grace(bytes: &[u8]) -> crate::Result<(QuotaType, u32, u32)> {
    let bytes = argument(bytes, QUOTA_GRACE_SIZE)?;
    Ok((
        quota_type(u32_at(bytes, 0))?,
        u32_at(bytes, 4),
        u32_at(bytes, 8),
    ))
}

/// JEXT4_IOC_QUOTA_PAGE's argument.
pub fn parse_quota_page(bytes: &[u8]) -> crate::Result<(QuotaType, u32)> {
    let bytes = argument(bytes, 8)?;
    Ok((quota_type(u32_at(bytes, 0))?, u32_at(bytes, 4)))
}

/// The page of `report` from id `first` on.
pub fn quota_page(report: &QuotaReport, first: u32) -> Vec<u8> {
    let from = report.entries.partition_point(|entry| entry.id < first);
    let page = &report.entries[from..];
    let (page, more) = match page.len() > PAGE_ENTRIES {
        true => (&page[..PAGE_ENTRIES], 1u32),
        false => (page, 0),
    };
    let mut out = Vec::with_capacity(PAGE_HEADER + page.len() * PAGE_ENTRY);
    for value in [
        report.info.block_grace,
        report.info.inode_grace,
        page.len() as u32,
        more,
    ] {
        out.extend_from_slice(&value.to_ne_bytes());
    }
    for entry in page {
        out.extend_from_slice(&entry.id.to_ne_bytes());
        for value in [
            entry.space,
            entry.space_soft,
            entry.space_hard,
            entry.inodes,
            entry.inode_soft,
            entry.inode_hard,
            entry.block_time,
            entry.inode_time,
        ] {
            out.extend_from_slice(&value.to_ne_bytes());
        }
    }
    debug_assert!(out.len() <= QUOTA_PAGE_SIZE);
    out
}

/// A page read back: the grace times and entries, and whether more follow.
fn parse_page(bytes: &[u8]) -> std::io::Result<(Info, Vec<Dquot>, bool)> {
    let short = || std::io::Error::new(std::io::ErrorKind::InvalidData, "short quota page");
    if bytes.len() < PAGE_HEADER {
        return Err(short());
    }
    let info = Info {
        block_grace: u32_at(bytes, 0),
        inode_grace: u32_at(bytes, 4),
        ..Info::default()
    };
    let count = u32_at(bytes, 8) as usize;
    if bytes.len() < PAGE_HEADER + count * PAGE_ENTRY {
        return Err(short());
    }
    let entries = (0..count)
        .map(|index| {
            let at = PAGE_HEADER + index * PAGE_ENTRY;
            let field = |number: usize| u64_at(bytes, at + 4 + 8 * number);
            Dquot {
                id: u32_at(bytes, at),
                space: field(0),
                space_soft: field(1),
                space_hard: field(2),
                inodes: field(3),
                inode_soft: field(4),
                inode_hard: field(5),
                block_time: field(6),
                inode_time: field(7),
            }
        })
        .collect();
    Ok((info, entries, u32_at(bytes, 12) != 0))
}

/// Set an id's limits through the mount holding `path`.
pub fn quota_set(
    path: &Path,
    qtype: QuotaType,
    id: u32,
    limits: &QuotaLimits,
) -> std::io::Result<()> {
    let mut arg = quota_set_arg(qtype, id, limits);
    write_ioctl(path, JEXT4_IOC_QUOTA_SET, &mut arg)
}

/// Set a type's grace times through the mount holding `path`.
pub fn quota_grace(
    path: &Path,
    qtype: QuotaType,
    block_grace: u32,
    inode_grace: u32,
) -> std::io::Result<()> {
    let mut arg = quota_grace_arg(qtype, block_grace, inode_grace);
    write_ioctl(path, JEXT4_IOC_QUOTA_GRACE, &mut arg)
}

/// A type's whole report through the mount holding `path`, page by page.
pub fn quota_report(path: &Path, qtype: QuotaType) -> std::io::Result<QuotaReport> {
    let file = open(path)?;
    let mut entries = Vec::new();
    let mut first = 0u32;
    loop {
        let mut buffer = vec![0u8; QUOTA_PAGE_SIZE];
        buffer[..4].copy_from_slice(&(qtype as u32).to_ne_bytes());
        buffer[4..8].copy_from_slice(&first.to_ne_bytes());
        // SAFETY: the kernel copies QUOTA_PAGE_SIZE bytes (the size in the
        // command number) in and out of the buffer, which holds that many.
        let length = unsafe {
            libc::ioctl(
                file.as_raw_fd(),
                JEXT4_IOC_QUOTA_PAGE as _,
                buffer.as_mut_ptr(),
            )
        };
        if length < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // The page says how many entries it carries.
        let (info, page, more) = parse_page(&buffer)?;
        let last = page.last().map(|entry| entry.id);
        entries.extend(page);
        match (more, last) {
            (true, Some(last)) if last < u32::MAX => first = last + 1,
            _ => return Ok(QuotaReport { info, entries }),
        }
    }
}

/// An ioctl whose argument `arg` the kernel copies to the server.
fn write_ioctl(path: &Path, command: u32, arg: &mut [u8]) -> std::io::Result<()> {
    debug_assert_eq!((command >> 16) as usize & 0x3fff, arg.len());
    let file = open(path)?;
    // SAFETY: the kernel reads the command number's size, `arg.len()`
    // bytes (checked above), from the buffer.
    let result = unsafe { libc::ioctl(file.as_raw_fd(), command as _, arg.as_mut_ptr()) };
    if result < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Open `path` (a file or directory on the mount) for an ioctl, without
/// following a final symlink out of the mount and without blocking.
fn open(path: &Path) -> std::io::Result<File> {
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW)
        .open(path)
}

/// Ask the server of the mount holding `path` to commit everything and
/// wait for it.
pub fn sync(path: &Path) -> std::io::Result<()> {
    let file = open(path)?;
    // SAFETY: an argument-less ioctl on a descriptor we own.
    let result = unsafe { libc::ioctl(file.as_raw_fd(), JEXT4_IOC_SYNC as _) };
    if result < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// The live statistics report of the server of the mount holding `path`.
pub fn stats(path: &Path) -> std::io::Result<String> {
    let file = open(path)?;
    match stats_ioctl(&file, JEXT4_IOC_STATS, STATS_SIZE) {
        // An older server: ask the way it knows.
        Err(error) if error.raw_os_error() == Some(libc::ENOTTY) => {
            stats_ioctl(&file, JEXT4_IOC_STATS_8K, STATS_SIZE_8K)
        }
        answer => answer,
    }
}

fn stats_ioctl(file: &File, command: u32, size: usize) -> std::io::Result<String> {
    debug_assert_eq!((command >> 16) as usize & 0x3fff, size);
    let mut buffer = vec![0u8; size];
    // SAFETY: the kernel copies at most `size` bytes (the size in the
    // command number, checked above) into the buffer, which holds that many.
    let length = unsafe { libc::ioctl(file.as_raw_fd(), command as _, buffer.as_mut_ptr()) };
    if length < 0 {
        return Err(std::io::Error::last_os_error());
    }
    buffer.truncate((length as usize).min(size));
    Ok(String::from_utf8_lossy(&buffer).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quota_requests_read_back_what_they_carry() {
        let limits = QuotaLimits {
            space_soft: 1,
            space_hard: 2,
            inode_soft: 3,
            inode_hard: u64::MAX,
        };
        let arg = quota_set_arg(QuotaType::Project, 42, &limits);
        assert_eq!(arg.len(), QUOTA_SET_SIZE);
        assert_eq!(
            parse_quota_set(&arg).unwrap(),
            (QuotaType::Project, 42, limits)
        );
        assert!(parse_quota_set(&arg[..39]).is_err());
        let mut bad = arg.clone();
        bad[..4].copy_from_slice(&3u32.to_ne_bytes());
        assert!(parse_quota_set(&bad).is_err());
        let arg = quota_grace_arg(QuotaType::Group, 60, 7);
        assert_eq!(parse_quota_grace(&arg).unwrap(), (QuotaType::Group, 60, 7));
        // Pages: every entry once, in order, across pages.
        let entries: Vec<Dquot> = (0..PAGE_ENTRIES as u32 * 2 + 5)
            .map(|id| Dquot {
                id: id * 3,
                space: id as u64 * 1024,
                inode_time: 9,
                ..Dquot::default()
            })
            .collect();
        let report = QuotaReport {
            info: Info {
                block_grace: 11,
                inode_grace: 12,
                ..Info::default()
            },
            entries: entries.clone(),
        };
        let mut first = 0;
        let mut read = Vec::new();
        loop {
            let page = quota_page(&report, first);
            assert!(page.len() <= QUOTA_PAGE_SIZE);
            let (info, page, more) = parse_page(&page).unwrap();
            assert_eq!((info.block_grace, info.inode_grace), (11, 12));
            first = page.last().map_or(0, |entry| entry.id + 1);
            read.extend(page);
            if !more {
                break;
            }
        }
        assert_eq!(read, entries);
    }

    #[test]
    fn command_numbers_follow_the_kernel_encoding() {
        // _IO('j', 1), _IOR('j', 2, char[16383]) and _IOR('j', 2,
        // char[8192]) as C computes them.
        assert_eq!(JEXT4_IOC_SYNC, 0x0000_6a01);
        // linux/fsverity.h's numbers.
        assert_eq!(FS_IOC_ENABLE_VERITY, 0x4080_6685);
        assert_eq!(FS_IOC_MEASURE_VERITY, 0xc004_6686);
        assert_eq!(JEXT4_IOC_STATS, 0xbfff_6a02);
        assert_eq!(JEXT4_IOC_STATS_8K, 0x8000_0000 | 8192 << 16 | 0x6a02);
    }

    #[test]
    fn verity_arguments_are_checked_as_the_kernel_checks_them() {
        let mut arg = [0u8; 128];
        arg[0] = 1;
        arg[4] = 1;
        arg[8..12].copy_from_slice(&4096u32.to_le_bytes());
        let params = parse_enable_verity(&arg).unwrap();
        assert_eq!(params.block_size, Some(4096));
        assert!(params.salt.is_empty() && params.signature.is_empty());
        // A salt of 3 and a signature of 2 follow the struct, in order.
        let mut salted = arg.to_vec();
        salted[12] = 3;
        salted[24] = 2;
        salted.extend_from_slice(&[1, 2, 3, 9, 8]);
        let params = parse_enable_verity(&salted).unwrap();
        assert_eq!((params.salt, params.signature), (vec![1, 2, 3], vec![9, 8]));
        assert!(matches!(
            parse_enable_verity(&salted[..130]),
            Err(crate::Error::Invalid(_))
        ));
        let mut sha512 = arg;
        sha512[4] = 2;
        assert!(matches!(
            parse_enable_verity(&sha512),
            Err(crate::Error::Unsupported(_))
        ));
        let mut reserved = arg;
        reserved[100] = 1;
        assert!(matches!(
            parse_enable_verity(&reserved),
            Err(crate::Error::Invalid(_))
        ));
        let digest = [7u8; 32];
        let out = measured(&[1, 0, 32, 0], &digest).unwrap();
        assert_eq!(&out[..4], &[1, 0, 32, 0]);
        assert_eq!(&out[4..], &digest);
        assert_eq!(
            measured(&[1, 0, 16, 0], &digest).unwrap_err().errno(),
            libc::EOVERFLOW
        );
    }
}
