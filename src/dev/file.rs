//! A regular image file or a block device, through `pread`/`pwrite` and
//! `fdatasync`.

use super::{BlockDevice, check_range, exclusive};
use smallvec::SmallVec;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, FileTypeExt, MetadataExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::Path;

pub struct FileDevice {
    file: File,
    size: u64,
    read_only: bool,
    /// The image file was found shorter than at open (logged once).
    shrink_reported: std::sync::atomic::AtomicBool,
    /// A second, O_DIRECT descriptor of a block device, for
    /// `read_uncached`/`write_uncached` (opened on first use).
    direct: std::sync::OnceLock<Option<File>>,
    path: std::path::PathBuf,
    is_block_device: bool,
    /// The backing file of a loop device given as the image, locked as the
    /// image would be: nobody else may serve it by its own name meanwhile.
    _backing_lock: Option<File>,
    /// Bytes written since the last flush began (an upper bound of what
    /// the host may hold dirty: its own write-back is not seen).
    unflushed: std::sync::atomic::AtomicU64,
}

/// Other data a ranged barrier leaves unwritten below which it is one
/// write and one `fdatasync` instead (`FileDevice::write_durable`).
const FLUSH_ALL_BELOW: u64 = 1 << 20;

/// `_IOR(0x12, 114, size_t)`: the size of a block device in bytes.
const BLKGETSIZE64: libc::c_ulong = 0x8008_1272;

/// How an open claims the image against other users (`dev::exclusive`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Claim {
    /// A writer: nobody else may write or serve it (a read-write mount).
    Exclusive,
    /// A reader that must not see it change (a read-only mount): other
    /// readers are fine, writers are not.
    Shared,
    /// A look that tolerates a live writer (logdump, like debugfs).
    Inspect,
}

impl FileDevice {
    /// Open an image file or block device. A read-write open claims it
    /// exclusively (see `open_claimed`); a read-only one claims nothing.
    pub fn open(path: &Path, read_only: bool) -> io::Result<Self> {
        let claim = if read_only {
            Claim::Inspect
        } else {
            Claim::Exclusive
        };
        FileDevice::open_claimed(path, read_only, claim)
    }

    /// Open an image file or block device and claim it: `flock` on a file
    /// (exclusive or shared), `O_EXCL` on a block device for a writer, and
    /// the checks of `dev::exclusive` — loop devices backed by the file,
    /// kernel mounts of the device, the backing file of a loop device. A
    /// refusal names the holder.
    pub fn open_claimed(path: &Path, read_only: bool, claim: Claim) -> io::Result<Self> {
        debug_assert!(!(claim == Claim::Exclusive && read_only));
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
        if is_block_device && claim == Claim::Exclusive {
            options.custom_flags(libc::O_EXCL);
        }
        let file = options.open(path).map_err(|error| {
            if error.raw_os_error() == Some(libc::EBUSY) {
                io::Error::new(io::ErrorKind::ResourceBusy, busy_device_message(&metadata))
            } else {
                error
            }
        })?;
        let backing_lock = match claim {
            Claim::Inspect => None,
            Claim::Exclusive | Claim::Shared if is_block_device => {
                claim_block_device(&metadata, claim)?
            }
            Claim::Exclusive | Claim::Shared => {
                exclusive::lock(&file, path, claim == Claim::Shared)?;
                refuse_loop_devices(path, claim)?;
                None
            }
        };
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
            shrink_reported: std::sync::atomic::AtomicBool::new(false),
            direct: std::sync::OnceLock::new(),
            path: path.to_path_buf(),
            is_block_device,
            _backing_lock: backing_lock,
            unflushed: std::sync::atomic::AtomicU64::new(0),
        })
    }
}

/// All of `pieces`, one after another from `offset`: one `pwritev`, and
/// what a short write leaves (rare) piece by piece.
fn pwritev_all(file: &File, offset: u64, pieces: &[&[u8]]) -> io::Result<()> {
    let iov: SmallVec<[libc::iovec; 4]> = pieces
        .iter()
        .map(|piece| libc::iovec {
            iov_base: piece.as_ptr() as *mut libc::c_void,
            iov_len: piece.len(),
        })
        .collect();
    let written = loop {
        // SAFETY: `iov` describes the `pieces`, which outlive the call and
        // are only read by it; there are far fewer than IOV_MAX of them.
        let written = unsafe {
            libc::pwritev(
                file.as_raw_fd(),
                iov.as_ptr(),
                iov.len() as i32,
                offset as i64,
            )
        };
        if written >= 0 {
            break written as usize;
        }
        let error = io::Error::last_os_error();
        if error.kind() != io::ErrorKind::Interrupted {
            return Err(error);
        }
    };
    let (mut skip, mut at) = (written, offset + written as u64);
    for piece in pieces {
        if skip >= piece.len() {
            skip -= piece.len();
            continue;
        }
        file.write_all_at(&piece[skip..], at)?;
        at += (piece.len() - skip) as u64;
        skip = 0;
    }
    Ok(())
}

/// `pwritev2(RWF_DSYNC)` of all of `buf` at `offset`.
fn pwrite_dsync(file: &File, mut offset: u64, mut buf: &[u8]) -> io::Result<()> {
    // Each round writes at least one byte or fails.
    while !buf.is_empty() {
        let iov = libc::iovec {
            iov_base: buf.as_ptr() as *mut libc::c_void,
            iov_len: buf.len(),
        };
        // SAFETY: `iov` describes `buf`, which outlives the call and is
        // only read by it.
        let written =
            unsafe { libc::pwritev2(file.as_raw_fd(), &iov, 1, offset as i64, libc::RWF_DSYNC) };
        if written < 0 {
            let error = io::Error::last_os_error();
            if error.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(error);
        }
        if written == 0 {
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                "pwritev2 wrote nothing",
            ));
        }
        buf = &buf[written as usize..];
        offset += written as u64;
    }
    Ok(())
}

/// Why `O_EXCL` on a block device failed: the kernel's mount of it, if it
/// has one, else someone else's exclusive open.
fn busy_device_message(metadata: &std::fs::Metadata) -> String {
    let mounts = exclusive::kernel_mounts_of(metadata.rdev());
    match mounts.first() {
        Some((mount_point, _)) => format!("mounted by the kernel at {}", mount_point.display()),
        None => "in use (opened exclusively by another program)".to_string(),
    }
}

/// A block device: a reader refuses one the kernel has mounted read-write;
/// a loop device's backing file is locked as the image itself would be.
fn claim_block_device(metadata: &std::fs::Metadata, claim: Claim) -> io::Result<Option<File>> {
    if claim == Claim::Shared
        && let Some((mount_point, _)) = exclusive::kernel_mounts_of(metadata.rdev())
            .into_iter()
            .find(|(_, read_write)| *read_write)
    {
        return Err(io::Error::new(
            io::ErrorKind::ResourceBusy,
            format!(
                "mounted read-write by the kernel at {}",
                mount_point.display()
            ),
        ));
    }
    let Some(backing) = exclusive::loop_backing_file(metadata) else {
        return Ok(None);
    };
    let file = File::open(&backing)?;
    exclusive::lock(&file, &backing, claim == Claim::Shared).map_err(|error| {
        io::Error::new(
            error.kind(),
            format!("backed by {}, which is {error}", backing.display()),
        )
    })?;
    Ok(Some(file))
}

/// An image file that a loop device exposes is written through it without
/// the file's lock: refuse it (a reader only when the loop device can
/// write).
fn refuse_loop_devices(path: &Path, claim: Claim) -> io::Result<()> {
    let loops = exclusive::settled_loop_devices_backed_by(path);
    let Some(device) = loops
        .iter()
        .find(|device| claim == Claim::Exclusive || !device.read_only)
    else {
        return Ok(());
    };
    let mounted = std::fs::metadata(&device.device)
        .ok()
        .map(|metadata| exclusive::kernel_mounts_of(metadata.rdev()))
        .and_then(|mounts| mounts.into_iter().next());
    let how = match mounted {
        Some((mount_point, _)) => format!(
            "mounted by the kernel at {} through {}",
            mount_point.display(),
            device.device.display()
        ),
        None => format!(
            "attached to the loop device {0} (`losetup -d {0}` frees it)",
            device.device.display()
        ),
    };
    Err(io::Error::new(io::ErrorKind::ResourceBusy, how))
}

/// `_IO(0x12, 104)`: the logical sector size of a block device.
const BLKSSZGET: libc::c_ulong = 0x1268;

impl FileDevice {
    /// The O_DIRECT descriptor of a block device, if it can be had. An
    /// image file needs none: its page cache is where every local user of
    /// the file — jext4, a loop device over it — reads and writes.
    fn direct(&self) -> Option<&File> {
        self.direct
            .get_or_init(|| {
                if !self.is_block_device {
                    return None;
                }
                OpenOptions::new()
                    .read(true)
                    .write(!self.read_only)
                    .custom_flags(libc::O_DIRECT)
                    .open(&self.path)
                    .ok()
            })
            .as_ref()
    }

    /// Run `io` on a buffer aligned for O_DIRECT (the logical sector size),
    /// when `offset` and `len` are aligned too; None otherwise.
    fn with_aligned<R>(
        file: &File,
        offset: u64,
        len: usize,
        io: impl FnOnce(&mut [u8]) -> io::Result<R>,
    ) -> Option<io::Result<R>> {
        let mut sector: libc::c_int = 0;
        // SAFETY: BLKSSZGET writes one int through the pointer we pass.
        if unsafe { libc::ioctl(file.as_raw_fd(), BLKSSZGET, &mut sector) } != 0 || sector <= 0 {
            return None;
        }
        let sector = sector as usize;
        if !offset.is_multiple_of(sector as u64) || !len.is_multiple_of(sector) || len == 0 {
            return None;
        }
        let layout = std::alloc::Layout::from_size_align(len, sector.max(4096)).ok()?;
        // SAFETY: a non-zero size; freed below with the same layout.
        let pointer = unsafe { std::alloc::alloc_zeroed(layout) };
        if pointer.is_null() {
            return None;
        }
        // SAFETY: `pointer` is valid for `len` bytes until freed below.
        let buffer = unsafe { std::slice::from_raw_parts_mut(pointer, len) };
        let result = io(buffer);
        // SAFETY: allocated above with this layout.
        unsafe { std::alloc::dealloc(pointer, layout) };
        Some(result)
    }
}

impl FileDevice {
    /// A read past the file's end inside the size it had at open: someone
    /// truncated the image under the mount. Say so, once, in the log and
    /// in the error, instead of a bare EIO.
    fn explain_short_read(&self, error: io::Error) -> io::Error {
        if error.kind() != io::ErrorKind::UnexpectedEof || self.is_block_device {
            return error;
        }
        let now = self
            .file
            .metadata()
            .map(|metadata| metadata.len())
            .unwrap_or(0);
        if now >= self.size {
            return error;
        }
        let why = format!(
            "{} shrank to {now} bytes while in use (it had {} at mount): truncated under the mount?",
            self.path.display(),
            self.size
        );
        if !self
            .shrink_reported
            .swap(true, std::sync::atomic::Ordering::Relaxed)
        {
            tracing::error!("{why}");
        }
        io::Error::new(io::ErrorKind::UnexpectedEof, why)
    }
}

impl FileDevice {
    /// Little but `ranges` can be unflushed: one `fdatasync` makes them
    /// durable in one system call, where the ranged way makes one or two
    /// per range and costs the host a write of its own.
    fn flush_is_cheap(&self, ranges: &[(u64, u64)]) -> bool {
        let named: u64 = ranges.iter().map(|&(_, len)| len).sum();
        self.unflushed.load(std::sync::atomic::Ordering::Relaxed) <= named + FLUSH_ALL_BELOW
    }
}

impl BlockDevice for FileDevice {
    fn read_uncached(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        check_range(offset, buf.len(), self.size)?;
        if let Some(direct) = self.direct()
            && let Some(result) = FileDevice::with_aligned(direct, offset, buf.len(), |aligned| {
                direct.read_exact_at(aligned, offset)?;
                buf.copy_from_slice(aligned);
                Ok(())
            })
        {
            return result;
        }
        self.file.read_exact_at(buf, offset)
    }

    fn write_uncached(&self, offset: u64, buf: &[u8]) -> io::Result<()> {
        if self.read_only {
            return Err(io::Error::from_raw_os_error(libc::EROFS));
        }
        check_range(offset, buf.len(), self.size)?;
        if let Some(direct) = self.direct()
            && let Some(result) = FileDevice::with_aligned(direct, offset, buf.len(), |aligned| {
                aligned.copy_from_slice(buf);
                direct.write_all_at(aligned, offset)?;
                direct.sync_data()
            })
        {
            return result;
        }
        self.file.write_all_at(buf, offset)?;
        self.file.sync_data()
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        check_range(offset, buf.len(), self.size)?;
        self.file
            .read_exact_at(buf, offset)
            .map_err(|error| self.explain_short_read(error))
    }

    fn write_at(&self, offset: u64, buf: &[u8]) -> io::Result<()> {
        if self.read_only {
            return Err(io::Error::from_raw_os_error(libc::EROFS));
        }
        check_range(offset, buf.len(), self.size)?;
        self.file.write_all_at(buf, offset)?;
        self.unflushed
            .fetch_add(buf.len() as u64, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }

    fn write_pieces_at(&self, offset: u64, pieces: &[&[u8]]) -> io::Result<()> {
        if self.read_only {
            return Err(io::Error::from_raw_os_error(libc::EROFS));
        }
        let len: usize = pieces.iter().map(|piece| piece.len()).sum();
        check_range(offset, len, self.size)?;
        pwritev_all(&self.file, offset, pieces)?;
        self.unflushed
            .fetch_add(len as u64, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }

    fn flush(&self) -> io::Result<()> {
        if self.read_only {
            return Ok(());
        }
        // Writes landing from here on may miss this flush: they count for
        // the next one.
        self.unflushed
            .store(0, std::sync::atomic::Ordering::Relaxed);
        self.file.sync_data()
    }

    /// `sync_file_range`: the ranges' dirty pages are written and waited
    /// for, others are left alone. Every range's writes are started first
    /// (WRITE), then each is waited for (WAIT_BEFORE | WRITE | WAIT_AFTER,
    /// which also catches pages under write-back when the first call came):
    /// the ranges' transfers overlap instead of running one after another.
    fn write_back(&self, ranges: &[(u64, u64)]) -> io::Result<()> {
        if self.read_only {
            return Ok(());
        }
        for &(offset, len) in ranges {
            check_range(offset, len as usize, self.size)?;
        }
        let start = libc::SYNC_FILE_RANGE_WRITE;
        let wait = libc::SYNC_FILE_RANGE_WAIT_BEFORE
            | libc::SYNC_FILE_RANGE_WRITE
            | libc::SYNC_FILE_RANGE_WAIT_AFTER;
        let passes: &[u32] = if ranges.len() > 1 {
            &[start, wait]
        } else {
            &[wait]
        };
        for &flags in passes {
            for &(offset, len) in ranges {
                // SAFETY: plain syscall on our own descriptor; no memory passed.
                let rc = unsafe {
                    libc::sync_file_range(self.file.as_raw_fd(), offset as i64, len as i64, flags)
                };
                if rc != 0 {
                    return Err(io::Error::last_os_error());
                }
            }
        }
        Ok(())
    }

    /// The ranges written back (`write_back`), then `buf` written with
    /// `RWF_DSYNC`: the host syncs that write's range — its own journal
    /// included, for the blocks a sparse image file gained — and flushes
    /// its disk's cache, which makes the ranges written back durable too.
    /// Other dirty pages of the image stay in the host's page cache.
    fn write_durable(&self, offset: u64, buf: &[u8], ranges: &[(u64, u64)]) -> io::Result<()> {
        if self.read_only {
            return Err(io::Error::from_raw_os_error(libc::EROFS));
        }
        check_range(offset, buf.len(), self.size)?;
        if self.flush_is_cheap(ranges) {
            // Little else can be dirty: one write and one fdatasync make
            // the ranges durable with it, in two system calls where the
            // ranged way makes one or two per range and costs the host a
            // write of its own.
            self.write_at(offset, buf)?;
            return self.flush();
        }
        self.write_back(ranges)?;
        match pwrite_dsync(&self.file, offset, buf) {
            Err(error)
                if matches!(
                    error.raw_os_error(),
                    Some(libc::EOPNOTSUPP | libc::ENOSYS | libc::EINVAL)
                ) =>
            {
                // A kernel without RWF_DSYNC (before 4.7): write and flush.
                self.file.write_all_at(buf, offset)?;
                self.file.sync_data()
            }
            result => result,
        }
    }

    /// With little else unflushed, one `fdatasync` and nothing written;
    /// otherwise the ranges are written back and the spare block is
    /// rewritten with `RWF_DSYNC` (`write_durable`), so that other
    /// writers' dirty pages are not written back with them.
    fn sync_ranges(&self, ranges: &[(u64, u64)], spare: (u64, &[u8])) -> io::Result<()> {
        if self.flush_is_cheap(ranges) {
            return self.flush();
        }
        self.write_durable(spare.0, spare.1, ranges)
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
