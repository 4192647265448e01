//! A regular image file or a block device, through `pread`/`pwrite` and
//! `fdatasync`.

use super::{BlockDevice, check_range};
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, FileTypeExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::Path;

pub struct FileDevice {
    file: File,
    size: u64,
    read_only: bool,
}

/// `_IOR(0x12, 114, size_t)`: the size of a block device in bytes.
const BLKGETSIZE64: libc::c_ulong = 0x8008_1272;

impl FileDevice {
    /// Open an image file or block device. A read-write open takes an
    /// exclusive lock (`O_EXCL` on a block device, `flock` on a file) so that
    /// two servers can never write the same image.
    pub fn open(path: &Path, read_only: bool) -> io::Result<Self> {
        let metadata = std::fs::metadata(path)?;
        let is_block_device = metadata.file_type().is_block_device();
        if !is_block_device && !metadata.is_file() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "not a regular file or block device",
            ));
        }
        let mut options = OpenOptions::new();
        options.read(true).write(!read_only);
        if is_block_device && !read_only {
            options.custom_flags(libc::O_EXCL);
        }
        let file = options.open(path)?;
        if !is_block_device && !read_only {
            // SAFETY: flock on a valid, owned descriptor; no memory is shared.
            let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
            if rc != 0 {
                return Err(io::Error::new(
                    io::ErrorKind::ResourceBusy,
                    "image is in use by another process (locked)",
                ));
            }
        }
        let size = if is_block_device {
            let mut bytes: u64 = 0;
            // SAFETY: BLKGETSIZE64 writes one u64 through the pointer we pass.
            let rc = unsafe { libc::ioctl(file.as_raw_fd(), BLKGETSIZE64, &mut bytes) };
            if rc != 0 {
                return Err(io::Error::last_os_error());
            }
            bytes
        } else {
            metadata.len()
        };
        Ok(FileDevice {
            file,
            size,
            read_only,
        })
    }
}

impl BlockDevice for FileDevice {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        check_range(offset, buf.len(), self.size)?;
        self.file.read_exact_at(buf, offset)
    }

    fn write_at(&self, offset: u64, buf: &[u8]) -> io::Result<()> {
        if self.read_only {
            return Err(io::Error::from_raw_os_error(libc::EROFS));
        }
        check_range(offset, buf.len(), self.size)?;
        self.file.write_all_at(buf, offset)
    }

    fn flush(&self) -> io::Result<()> {
        if self.read_only {
            return Ok(());
        }
        self.file.sync_data()
    }

    fn size_bytes(&self) -> u64 {
        self.size
    }

    fn is_read_only(&self) -> bool {
        self.read_only
    }

    fn map_persistent(
        &self,
        offset: u64,
        len: u64,
    ) -> io::Result<Option<std::sync::Arc<dyn super::PersistentMemory>>> {
        if self.read_only {
            return Ok(None);
        }
        check_range(offset, len as usize, self.size)?;
        let mapping = super::persistent::FileMapping::new(self.file.as_raw_fd(), offset, len)?;
        Ok(Some(std::sync::Arc::new(mapping)))
    }
}
