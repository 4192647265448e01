//! The FUSE wire format for the io_uring transport: requests decoded from
//! a ring entry, answers encoded into it. The layouts are those of
//! `include/uapi/linux/fuse.h` (protocol 7.36 and later, in the host's
//! byte order); fuser decodes the same requests for `/dev/fuse` but keeps
//! its decoder private, and a ring entry splits a request differently
//! anyway:
//! - `in_out` (128 bytes): `struct fuse_in_header`, then on the way back
//!   `struct fuse_out_header`;
//! - `op_in` (128 bytes): the operation's own fixed header, when it has one
//!   (`fuse_write_in`, `fuse_mkdir_in`, …; LOOKUP, UNLINK and the like have
//!   none: `fs/fuse` makes their first argument empty);
//! - the payload buffer: every further argument (names NUL-terminated,
//!   write data), `ring_ent_in_out.payload_sz` bytes; on the way back the
//!   answer's arguments (`fuse_entry_out`, read data, …).
//!
//! Only what the adapter serves is decoded; anything else is `Unsupported`
//! and answered ENOSYS, as fuser answers what a filesystem leaves out.

use crate::format::inode::Timestamp;
use crate::fs::{SetAttr, TimeSet};
use fuser::{FileAttr, FileType, Generation, INodeNo};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The largest write (and read) the server takes in one request; a ring
/// entry's payload buffer is at least this large (`fs/fuse/dev_uring.c`:
/// max(FUSE_MIN_READ_BUFFER, max_write, max_pages × page size)).
pub const MAX_WRITE: u32 = 1 << 20;

pub const OUT_HEADER_SIZE: usize = 16;
/// `struct fuse_uring_req_header`: in_out, op_in, ring_ent_in_out.
pub const RING_HEADER_SIZE: usize = 128 + 128 + 32;
pub const RING_OP_IN_OFFSET: usize = 128;
pub const RING_ENT_IN_OUT_OFFSET: usize = 256;

/// Opcodes (`enum fuse_opcode`) the ring may carry.
mod opcode {
    pub const LOOKUP: u32 = 1;
    pub const FORGET: u32 = 2;
    pub const GETATTR: u32 = 3;
    pub const SETATTR: u32 = 4;
    pub const READLINK: u32 = 5;
    pub const SYMLINK: u32 = 6;
    pub const MKNOD: u32 = 8;
    pub const MKDIR: u32 = 9;
    pub const UNLINK: u32 = 10;
    pub const RMDIR: u32 = 11;
    pub const RENAME: u32 = 12;
    pub const LINK: u32 = 13;
    pub const OPEN: u32 = 14;
    pub const READ: u32 = 15;
    pub const WRITE: u32 = 16;
    pub const STATFS: u32 = 17;
    pub const RELEASE: u32 = 18;
    pub const FSYNC: u32 = 20;
    pub const SETXATTR: u32 = 21;
    pub const GETXATTR: u32 = 22;
    pub const LISTXATTR: u32 = 23;
    pub const REMOVEXATTR: u32 = 24;
    pub const FLUSH: u32 = 25;
    pub const OPENDIR: u32 = 27;
    pub const READDIR: u32 = 28;
    pub const RELEASEDIR: u32 = 29;
    pub const FSYNCDIR: u32 = 30;
    pub const ACCESS: u32 = 34;
    pub const CREATE: u32 = 35;
    pub const DESTROY: u32 = 38;
    pub const IOCTL: u32 = 39;
    pub const BATCH_FORGET: u32 = 42;
    pub const FALLOCATE: u32 = 43;
    pub const READDIRPLUS: u32 = 44;
    pub const RENAME2: u32 = 45;
    pub const LSEEK: u32 = 46;
}

/// `fuse_setattr_in.valid` bits.
const FATTR_MODE: u32 = 1 << 0;
const FATTR_UID: u32 = 1 << 1;
const FATTR_GID: u32 = 1 << 2;
const FATTR_SIZE: u32 = 1 << 3;
const FATTR_ATIME: u32 = 1 << 4;
const FATTR_MTIME: u32 = 1 << 5;
const FATTR_ATIME_NOW: u32 = 1 << 7;
const FATTR_MTIME_NOW: u32 = 1 << 8;
const FATTR_CTIME: u32 = 1 << 10;

/// `struct fuse_in_header`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InHeader {
    pub opcode: u32,
    pub unique: u64,
    pub nodeid: u64,
    pub uid: u32,
    pub gid: u32,
    pub pid: u32,
}

impl InHeader {
    pub fn decode(bytes: &[u8]) -> Option<InHeader> {
        let mut fields = Fields::new(bytes);
        let _len = fields.u32()?;
        Some(InHeader {
            opcode: fields.u32()?,
            unique: fields.u64()?,
            nodeid: fields.u64()?,
            uid: fields.u32()?,
            gid: fields.u32()?,
            pid: fields.u32()?,
        })
    }
}

/// A decoded request: the operation's arguments, borrowing names and data
/// from the entry's buffers.
#[derive(Debug)]
pub enum Request<'a> {
    Lookup {
        name: &'a OsStr,
    },
    Getattr,
    Setattr(SetAttr),
    Readlink,
    Symlink {
        name: &'a OsStr,
        target: &'a OsStr,
    },
    Mknod {
        name: &'a OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
    },
    Mkdir {
        name: &'a OsStr,
        mode: u32,
        umask: u32,
    },
    Unlink {
        name: &'a OsStr,
    },
    Rmdir {
        name: &'a OsStr,
    },
    Rename {
        name: &'a OsStr,
        newparent: u64,
        newname: &'a OsStr,
        flags: u32,
    },
    Link {
        oldnodeid: u64,
        newname: &'a OsStr,
    },
    Open {
        /// The open(2) flags (`fuse_open_in.flags`).
        flags: i32,
    },
    Read {
        offset: u64,
        size: u32,
    },
    Write {
        offset: u64,
        data: &'a [u8],
        write_flags: u32,
    },
    Statfs,
    Release,
    Fsync {
        datasync: bool,
    },
    Setxattr {
        name: &'a OsStr,
        value: &'a [u8],
        flags: i32,
    },
    Getxattr {
        name: &'a OsStr,
        size: u32,
    },
    Listxattr {
        size: u32,
    },
    Removexattr {
        name: &'a OsStr,
    },
    Flush,
    Opendir,
    Readdir {
        offset: u64,
        size: u32,
    },
    Readdirplus {
        offset: u64,
        size: u32,
    },
    Releasedir,
    Fsyncdir,
    Access,
    Create {
        name: &'a OsStr,
        mode: u32,
        umask: u32,
    },
    Ioctl {
        cmd: u32,
        /// What the caller passes in (the kernel copies it per `cmd`).
        data: &'a [u8],
        out_size: u32,
    },
    Fallocate {
        offset: u64,
        length: u64,
        mode: i32,
    },
    Lseek {
        offset: i64,
        whence: i32,
    },
    Destroy,
    /// Requests without an answer (they come through `/dev/fuse`).
    Forget,
    Unsupported,
}

/// Why a request could not be decoded: the kernel sent less than its
/// layout needs. Answered EINVAL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Malformed;

impl<'a> Request<'a> {
    /// Decode the request of `opcode` from its operation header (`op_in`)
    /// and its payload.
    pub fn decode(opcode: u32, op_in: &'a [u8], payload: &'a [u8]) -> Result<Self, Malformed> {
        let mut header = Fields::new(op_in);
        let mut rest = Fields::new(payload);
        Self::decode_fields(opcode, &mut header, &mut rest).ok_or(Malformed)
    }

    fn decode_fields(opcode: u32, header: &mut Fields<'a>, rest: &mut Fields<'a>) -> Option<Self> {
        use opcode::*;
        match opcode {
            LOOKUP | SYMLINK | MKNOD | MKDIR | UNLINK | RMDIR | RENAME | RENAME2 | LINK
            | CREATE => Self::decode_namespace(opcode, header, rest),
            READ | READDIR | READDIRPLUS | WRITE | FSYNC | IOCTL | FALLOCATE | LSEEK => {
                Self::decode_file(opcode, header, rest)
            }
            SETXATTR | GETXATTR | LISTXATTR | REMOVEXATTR => {
                Self::decode_xattr(opcode, header, rest)
            }
            SETATTR => Some(Request::Setattr(decode_setattr(header)?)),
            OPEN => Some(Request::Open {
                flags: header.u32()? as i32,
            }),
            _ => Some(Self::without_arguments(opcode)),
        }
    }

    /// Operations on names: the names are in the payload.
    fn decode_namespace(
        opcode: u32,
        header: &mut Fields<'a>,
        rest: &mut Fields<'a>,
    ) -> Option<Self> {
        use opcode::*;
        Some(match opcode {
            LOOKUP => Request::Lookup { name: rest.name()? },
            SYMLINK => Request::Symlink {
                name: rest.name()?,
                target: rest.name()?,
            },
            MKNOD => {
                let (mode, rdev, umask) = (header.u32()?, header.u32()?, header.u32()?);
                Request::Mknod {
                    name: rest.name()?,
                    mode,
                    umask,
                    rdev,
                }
            }
            MKDIR => {
                let (mode, umask) = (header.u32()?, header.u32()?);
                Request::Mkdir {
                    name: rest.name()?,
                    mode,
                    umask,
                }
            }
            UNLINK => Request::Unlink { name: rest.name()? },
            RMDIR => Request::Rmdir { name: rest.name()? },
            RENAME | RENAME2 => {
                let newparent = header.u64()?;
                let flags = if opcode == RENAME2 { header.u32()? } else { 0 };
                Request::Rename {
                    name: rest.name()?,
                    newparent,
                    newname: rest.name()?,
                    flags,
                }
            }
            LINK => Request::Link {
                oldnodeid: header.u64()?,
                newname: rest.name()?,
            },
            CREATE => {
                let (_flags, mode, umask) = (header.u32()?, header.u32()?, header.u32()?);
                Request::Create {
                    name: rest.name()?,
                    mode,
                    umask,
                }
            }
            _ => unreachable!("decode_fields routes only namespace opcodes here"),
        })
    }

    /// Operations on an open file or directory: the operation header leads
    /// with the file handle.
    fn decode_file(opcode: u32, header: &mut Fields<'a>, rest: &mut Fields<'a>) -> Option<Self> {
        use opcode::*;
        if opcode == WRITE {
            return decode_write(header, rest);
        }
        let _fh = header.u64()?;
        Some(match opcode {
            READ | READDIR | READDIRPLUS => {
                let (offset, size) = (header.u64()?, header.u32()?);
                match opcode {
                    READ => Request::Read { offset, size },
                    READDIR => Request::Readdir { offset, size },
                    _ => Request::Readdirplus { offset, size },
                }
            }
            // FUSE_FSYNC_FDATASYNC
            FSYNC => Request::Fsync {
                datasync: header.u32()? & 1 != 0,
            },
            IOCTL => {
                let (_flags, cmd) = (header.u32()?, header.u32()?);
                let (_arg, in_size, out_size) = (header.u64()?, header.u32()?, header.u32()?);
                let data = rest.bytes(in_size as usize)?;
                Request::Ioctl {
                    cmd,
                    data,
                    out_size,
                }
            }
            FALLOCATE => {
                let (offset, length, mode) = (header.u64()?, header.u64()?, header.u32()?);
                Request::Fallocate {
                    offset,
                    length,
                    mode: mode as i32,
                }
            }
            LSEEK => {
                let (offset, whence) = (header.u64()?, header.u32()?);
                Request::Lseek {
                    offset: offset as i64,
                    whence: whence as i32,
                }
            }
            _ => unreachable!("decode_fields routes only file opcodes here"),
        })
    }

    fn decode_xattr(opcode: u32, header: &mut Fields<'a>, rest: &mut Fields<'a>) -> Option<Self> {
        use opcode::*;
        Some(match opcode {
            SETXATTR => {
                let (size, flags) = (header.u32()?, header.u32()?);
                let name = rest.name()?;
                Request::Setxattr {
                    name,
                    value: rest.bytes(size as usize)?,
                    flags: flags as i32,
                }
            }
            GETXATTR => {
                let size = header.u32()?;
                Request::Getxattr {
                    name: rest.name()?,
                    size,
                }
            }
            LISTXATTR => Request::Listxattr {
                size: header.u32()?,
            },
            REMOVEXATTR => Request::Removexattr { name: rest.name()? },
            _ => unreachable!("decode_fields routes only xattr opcodes here"),
        })
    }

    /// Operations whose arguments the adapter does not use (the node id
    /// in the request header is all), and those it does not serve.
    fn without_arguments(opcode: u32) -> Self {
        use opcode::*;
        match opcode {
            GETATTR => Request::Getattr,
            READLINK => Request::Readlink,
            STATFS => Request::Statfs,
            RELEASE => Request::Release,
            FLUSH => Request::Flush,
            OPENDIR => Request::Opendir,
            RELEASEDIR => Request::Releasedir,
            FSYNCDIR => Request::Fsyncdir,
            ACCESS => Request::Access,
            DESTROY => Request::Destroy,
            FORGET | BATCH_FORGET => Request::Forget,
            _ => Request::Unsupported,
        }
    }
}

fn decode_write<'a>(header: &mut Fields<'a>, rest: &mut Fields<'a>) -> Option<Request<'a>> {
    let _fh = header.u64()?;
    let (offset, size, write_flags) = (header.u64()?, header.u32()?, header.u32()?);
    Some(Request::Write {
        offset,
        data: rest.bytes(size as usize)?,
        write_flags,
    })
}

fn decode_setattr(header: &mut Fields<'_>) -> Option<SetAttr> {
    let valid = header.u32()?;
    let _padding = header.u32()?;
    let _fh = header.u64()?;
    let size = header.u64()?;
    let _lock_owner = header.u64()?;
    let (atime, mtime, ctime) = (header.u64()?, header.u64()?, header.u64()?);
    let (atime_nsec, mtime_nsec, ctime_nsec) = (header.u32()?, header.u32()?, header.u32()?);
    let mode = header.u32()?;
    let _unused = header.u32()?;
    let (uid, gid) = (header.u32()?, header.u32()?);
    let given = |bit: u32| valid & bit != 0;
    let time = |now: u32, sec: u64, nsec: u32| {
        if given(now) {
            TimeSet::Now
        } else {
            TimeSet::At(Timestamp {
                sec: sec as i64,
                nsec,
            })
        }
    };
    Some(SetAttr {
        mode: given(FATTR_MODE).then_some((mode & 0o7777) as u16),
        uid: given(FATTR_UID).then_some(uid),
        gid: given(FATTR_GID).then_some(gid),
        size: given(FATTR_SIZE).then_some(size),
        atime: given(FATTR_ATIME).then(|| time(FATTR_ATIME_NOW, atime, atime_nsec)),
        mtime: given(FATTR_MTIME).then(|| time(FATTR_MTIME_NOW, mtime, mtime_nsec)),
        ctime: given(FATTR_CTIME).then_some(Timestamp {
            sec: ctime as i64,
            nsec: ctime_nsec,
        }),
    })
}

/// Fields read one after the other from a byte slice.
struct Fields<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Fields<'a> {
    fn new(bytes: &'a [u8]) -> Self {
        Fields { bytes, at: 0 }
    }

    fn bytes(&mut self, length: usize) -> Option<&'a [u8]> {
        let end = self.at.checked_add(length)?;
        let bytes = self.bytes.get(self.at..end)?;
        self.at = end;
        Some(bytes)
    }

    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_ne_bytes(self.bytes(4)?.try_into().ok()?))
    }

    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_ne_bytes(self.bytes(8)?.try_into().ok()?))
    }

    /// A NUL-terminated name, without its NUL.
    fn name(&mut self) -> Option<&'a OsStr> {
        let rest = self.bytes.get(self.at..)?;
        let length = rest.iter().position(|&byte| byte == 0)?;
        let name = self.bytes(length)?;
        self.at += 1;
        Some(OsStr::from_bytes(name))
    }
}

/// An answer's bytes written into a fixed buffer (a ring entry's payload).
/// Nothing the adapter answers outgrows the buffer (the kernel sizes its
/// requests to it); a write that would is refused and reported.
pub struct Encoder<'b> {
    buffer: &'b mut [u8],
    length: usize,
}

impl<'b> Encoder<'b> {
    pub fn new(buffer: &'b mut [u8]) -> Self {
        Encoder { buffer, length: 0 }
    }

    pub fn len(&self) -> usize {
        self.length
    }

    pub fn room(&self) -> usize {
        self.buffer.len() - self.length
    }

    /// Append `bytes`; false (and nothing written) if they do not fit.
    pub fn put(&mut self, bytes: &[u8]) -> bool {
        let Some(target) = self.buffer.get_mut(self.length..self.length + bytes.len()) else {
            return false;
        };
        target.copy_from_slice(bytes);
        self.length += bytes.len();
        true
    }

    fn put_u32(&mut self, value: u32) -> bool {
        self.put(&value.to_ne_bytes())
    }

    fn put_u64(&mut self, value: u64) -> bool {
        self.put(&value.to_ne_bytes())
    }

    /// Zeros up to the next multiple of 8 (directory entries).
    fn align8(&mut self) -> bool {
        let padding = self.length.next_multiple_of(8) - self.length;
        self.put(&[0; 8][..padding])
    }

    /// `struct fuse_attr` (88 bytes).
    pub fn attr(&mut self, attr: &FileAttr) -> bool {
        let (atime, atime_nsec) = seconds(attr.atime);
        let (mtime, mtime_nsec) = seconds(attr.mtime);
        let (ctime, ctime_nsec) = seconds(attr.ctime);
        [
            attr.ino.0,
            attr.size,
            attr.blocks,
            atime as u64,
            mtime as u64,
            ctime as u64,
        ]
        .iter()
        .all(|&value| self.put_u64(value))
            && [
                atime_nsec,
                mtime_nsec,
                ctime_nsec,
                mode(attr.kind, attr.perm),
                attr.nlink,
                attr.uid,
                attr.gid,
                attr.rdev,
                attr.blksize,
                0, // flags
            ]
            .iter()
            .all(|&value| self.put_u32(value))
    }

    /// `struct fuse_entry_out` (128 bytes): the node id is the attributes'
    /// inode (0: a negative entry).
    pub fn entry(&mut self, ttl: &Duration, attr: &FileAttr, generation: Generation) -> bool {
        self.put_u64(attr.ino.0)
            && self.put_u64(generation.0)
            && self.put_u64(ttl.as_secs())
            && self.put_u64(ttl.as_secs())
            && self.put_u32(ttl.subsec_nanos())
            && self.put_u32(ttl.subsec_nanos())
            && self.attr(attr)
    }

    /// `struct fuse_attr_out` (104 bytes).
    pub fn attr_out(&mut self, ttl: &Duration, attr: &FileAttr) -> bool {
        self.put_u64(ttl.as_secs())
            && self.put_u32(ttl.subsec_nanos())
            && self.put_u32(0)
            && self.attr(attr)
    }

    /// `struct fuse_open_out` (16 bytes).
    pub fn open_out(&mut self, fh: u64, open_flags: u32) -> bool {
        self.put_u64(fh) && self.put_u32(open_flags) && self.put_u32(0)
    }

    /// `struct fuse_write_out`, `fuse_getxattr_out` (8 bytes each).
    pub fn size_out(&mut self, size: u32) -> bool {
        self.put_u32(size) && self.put_u32(0)
    }

    /// `struct fuse_lseek_out`.
    pub fn offset_out(&mut self, offset: i64) -> bool {
        self.put_u64(offset as u64)
    }

    /// `struct fuse_statfs_out` (80 bytes).
    pub fn statfs_out(&mut self, figures: &super::answer::StatfsFigures) -> bool {
        [
            figures.blocks,
            figures.free_blocks,
            figures.available_blocks,
            figures.files,
            figures.free_files,
        ]
        .iter()
        .all(|&value| self.put_u64(value))
            && [
                figures.block_size,
                figures.name_max,
                figures.fragment_size,
                0,
            ]
            .iter()
            .all(|&value| self.put_u32(value))
            && self.put(&[0; 24])
    }

    /// `struct fuse_ioctl_out` and the data after it.
    pub fn ioctl_out(&mut self, result: i32, data: &[u8]) -> bool {
        self.put_u32(result as u32)
            && self.put_u32(0)
            && self.put_u32(0)
            && self.put_u32(0)
            && self.put(data)
    }

    /// `struct fuse_dirent` and its name, padded to 8 bytes, if the whole
    /// entry fits within `limit` bytes of answer; false (nothing written)
    /// otherwise.
    pub fn dirent(&mut self, limit: usize, dirent: &Dirent<'_>) -> bool {
        let size = (24 + dirent.name.len()).next_multiple_of(8);
        if self.length + size > limit || size > self.room() {
            return false;
        }
        self.put_dirent(dirent)
    }

    /// `struct fuse_direntplus` (an entry_out, then a dirent), as `dirent`.
    pub fn direntplus(
        &mut self,
        limit: usize,
        dirent: &Dirent<'_>,
        ttl: &Duration,
        attr: &FileAttr,
        generation: Generation,
    ) -> bool {
        let size = (128 + 24 + dirent.name.len()).next_multiple_of(8);
        if self.length + size > limit || size > self.room() {
            return false;
        }
        self.entry(ttl, attr, generation) && self.put_dirent(dirent)
    }

    fn put_dirent(&mut self, dirent: &Dirent<'_>) -> bool {
        let name = dirent.name.as_bytes();
        self.put_u64(dirent.ino.0)
            && self.put_u64(dirent.offset)
            && self.put_u32(name.len() as u32)
            && self.put_u32(mode(dirent.kind, 0) >> 12)
            && self.put(name)
            && self.align8()
    }
}

/// One directory entry of a readdir answer.
pub struct Dirent<'n> {
    pub ino: INodeNo,
    pub offset: u64,
    pub kind: FileType,
    pub name: &'n OsStr,
}

/// `struct fuse_out_header` into the ring entry's `in_out`.
pub fn out_header(in_out: &mut [u8], length: usize, error: i32, unique: u64) {
    debug_assert!(in_out.len() >= OUT_HEADER_SIZE);
    in_out[0..4].copy_from_slice(&((OUT_HEADER_SIZE + length) as u32).to_ne_bytes());
    in_out[4..8].copy_from_slice(&error.to_ne_bytes());
    in_out[8..16].copy_from_slice(&unique.to_ne_bytes());
}

/// The file type bits and permissions of `st_mode`.
fn mode(kind: FileType, perm: u16) -> u32 {
    let kind = match kind {
        FileType::NamedPipe => libc::S_IFIFO,
        FileType::CharDevice => libc::S_IFCHR,
        FileType::BlockDevice => libc::S_IFBLK,
        FileType::Directory => libc::S_IFDIR,
        FileType::RegularFile => libc::S_IFREG,
        FileType::Symlink => libc::S_IFLNK,
        FileType::Socket => libc::S_IFSOCK,
    };
    kind | u32::from(perm)
}

/// Seconds and nanoseconds since the epoch, the nanoseconds always
/// counting forward (before 1970: -1.25 s is -2 s and 750 ms).
fn seconds(time: SystemTime) -> (i64, u32) {
    match time.duration_since(UNIX_EPOCH) {
        Ok(after) => (after.as_secs() as i64, after.subsec_nanos()),
        Err(before) => {
            let before = before.duration();
            match before.subsec_nanos() {
                0 => (-(before.as_secs() as i64), 0),
                nsec => (-(before.as_secs() as i64) - 1, 1_000_000_000 - nsec),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(fields: &[&[u8]]) -> Vec<u8> {
        fields.concat()
    }

    #[test]
    fn decodes_names_headers_and_refuses_short_requests() {
        let request = Request::decode(opcode::LOOKUP, &[], b"name\0").unwrap();
        assert!(matches!(request, Request::Lookup { name } if name == "name"));
        let payload = b"old\0new\0";
        let op_in = bytes(&[
            &7u64.to_ne_bytes(),
            &1u32.to_ne_bytes(),
            &0u32.to_ne_bytes(),
        ]);
        match Request::decode(opcode::RENAME2, &op_in, payload).unwrap() {
            Request::Rename {
                name,
                newparent,
                newname,
                flags,
            } => {
                assert_eq!(
                    (name.as_bytes(), newparent, newname.as_bytes(), flags),
                    (&b"old"[..], 7, &b"new"[..], 1)
                );
            }
            other => panic!("{other:?}"),
        }
        // A name without its NUL, a header cut short.
        assert_eq!(
            Request::decode(opcode::LOOKUP, &[], b"name").unwrap_err(),
            Malformed
        );
        assert_eq!(
            Request::decode(opcode::MKDIR, &[0; 4], b"d\0").unwrap_err(),
            Malformed
        );
        let write_in = bytes(&[
            &0u64.to_ne_bytes(),
            &4096u64.to_ne_bytes(),
            &5u32.to_ne_bytes(),
            &4u32.to_ne_bytes(),
        ]);
        match Request::decode(opcode::WRITE, &write_in, b"hello").unwrap() {
            Request::Write {
                offset,
                data,
                write_flags,
            } => assert_eq!((offset, data, write_flags), (4096, &b"hello"[..], 4)),
            other => panic!("{other:?}"),
        }
        assert_eq!(
            Request::decode(opcode::WRITE, &write_in, b"hell").unwrap_err(),
            Malformed
        );
        assert!(matches!(
            Request::decode(999, &[], &[]).unwrap(),
            Request::Unsupported
        ));
    }

    #[test]
    fn decodes_setattr_with_now_and_pre_epoch_times() {
        let mut op_in = vec![0u8; 88];
        let valid = FATTR_MODE | FATTR_ATIME | FATTR_ATIME_NOW | FATTR_MTIME | FATTR_SIZE;
        op_in[0..4].copy_from_slice(&valid.to_ne_bytes());
        op_in[16..24].copy_from_slice(&10u64.to_ne_bytes()); // size
        op_in[40..48].copy_from_slice(&(-2i64 as u64).to_ne_bytes()); // mtime
        op_in[60..64].copy_from_slice(&5u32.to_ne_bytes()); // mtimensec
        op_in[68..72].copy_from_slice(&0o104755u32.to_ne_bytes()); // mode
        let Request::Setattr(changes) = Request::decode(opcode::SETATTR, &op_in, &[]).unwrap()
        else {
            panic!("not a setattr");
        };
        assert_eq!(changes.mode, Some(0o4755));
        assert_eq!(changes.size, Some(10));
        assert_eq!(changes.uid, None);
        assert!(matches!(changes.atime, Some(TimeSet::Now)));
        assert!(matches!(
            changes.mtime,
            Some(TimeSet::At(Timestamp { sec: -2, nsec: 5 }))
        ));
        assert!(changes.ctime.is_none());
    }

    #[test]
    fn encodes_entries_and_directory_entries_to_the_kernels_sizes() {
        let attr = FileAttr {
            ino: INodeNo(12),
            size: 3,
            blocks: 8,
            atime: UNIX_EPOCH - Duration::from_millis(1250),
            mtime: UNIX_EPOCH + Duration::new(5, 6),
            ctime: UNIX_EPOCH,
            crtime: UNIX_EPOCH,
            kind: FileType::Directory,
            perm: 0o755,
            nlink: 2,
            uid: 1,
            gid: 2,
            rdev: 0,
            blksize: 4096,
            flags: 0,
        };
        let mut buffer = vec![0u8; 4096];
        let mut encoder = Encoder::new(&mut buffer);
        assert!(encoder.entry(&Duration::from_secs(3600), &attr, Generation(9)));
        assert_eq!(encoder.len(), 128);
        let length = encoder.len();
        assert_eq!(&buffer[..8], &12u64.to_ne_bytes());
        // atime -1.25 s: -2 s and 750 ms; mode with S_IFDIR.
        assert_eq!(&buffer[40 + 24..40 + 32], &(-2i64).to_ne_bytes());
        assert_eq!(&buffer[40 + 48..40 + 52], &750_000_000u32.to_ne_bytes());
        assert_eq!(
            &buffer[40 + 60..40 + 64],
            &(libc::S_IFDIR | 0o755).to_ne_bytes()
        );
        assert_eq!(length, 128);
        let mut encoder = Encoder::new(&mut buffer);
        let dirent = Dirent {
            ino: INodeNo(5),
            offset: 1,
            kind: FileType::RegularFile,
            name: OsStr::new("abc"),
        };
        assert!(encoder.dirent(32, &dirent));
        assert_eq!(encoder.len(), 32);
        // The next one would pass the limit: refused, nothing written.
        assert!(!encoder.dirent(63, &dirent));
        assert_eq!(encoder.len(), 32);
        assert!(encoder.direntplus(4096, &dirent, &Duration::ZERO, &attr, Generation(0)));
        assert_eq!(encoder.len(), 32 + 128 + 32);
    }
}
