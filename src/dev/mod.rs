//! Block devices: the bottom layer.
//!
//! Addresses are byte offsets, because the superblock must be read before the
//! block size is known; every offset and length is a multiple of the 512-byte
//! sector (asserted), which is the granularity at which a disk can tear a
//! write and at which the crash-state generator rebuilds disks.
//!
//! `flush` is a barrier: everything written before it returns is durable
//! after it. Nothing above this layer may assume durability without it.

pub mod exclusive;
mod file;
pub mod guard;
mod joined;
mod memory;
pub mod nbd;
pub mod overlay;
pub mod persistent;
pub mod recording;

pub use file::{Claim, FileDevice};
pub use joined::{JoinedDevice, WindowDevice};
pub use memory::MemoryDevice;
pub use nbd::{NbdDevice, NbdUri, is_nbd_uri};
pub use persistent::{PersistMethod, PersistentMemory};
pub use recording::{Record, RecordingDevice};

use std::io;
use std::path::Path;
use std::sync::Arc;

/// The unit of every device offset and length, and of a torn write.
pub const SECTOR_SIZE: u64 = 512;

/// Storage an image lives on: reads and writes at byte offsets, in whole
/// 512-byte sectors, and `flush`, the barrier after which everything
/// written before it is durable.
///
/// Implement it to open an image on storage of your own with
/// `Image::from_device`; `MemoryDevice`, and the engine's image-file and
/// NBD devices, are implementations. Only `read_at`, `write_at`, `flush`
/// and `size_bytes` must be written: the other methods have defaults
/// built on them, which are correct for any device and only slower than
/// a device's own versions.
pub trait BlockDevice: Send + Sync {
    /// Read `buf.len()` bytes at `offset`. Reading past the end is an error.
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()>;
    /// Write `buf` at `offset`. Not durable until the next `flush`.
    fn write_at(&self, offset: u64, buf: &[u8]) -> io::Result<()>;
    /// Write `pieces` one after another from `offset`, as one write where
    /// the device can (`pwritev` on an image file): a run of file data
    /// whose partial edge blocks are built apart from the whole blocks
    /// between them, which go straight from the request. Not durable
    /// until the next `flush`.
    fn write_pieces_at(&self, offset: u64, pieces: &[&[u8]]) -> io::Result<()> {
        let mut at = offset;
        for piece in pieces {
            self.write_at(at, piece)?;
            at += piece.len() as u64;
        }
        Ok(())
    }
    /// Make every completed write durable.
    fn flush(&self) -> io::Result<()>;
    /// Push the completed writes inside `ranges` (byte offset, length) out
    /// of this machine's caches towards the medium and wait for them,
    /// without a barrier: nothing is promised durable until a later
    /// `write_durable` naming them, or `flush`. Lets a caller pay for the
    /// transfer of its own writes before it enters a serialised section.
    fn write_back(&self, _ranges: &[(u64, u64)]) -> io::Result<()> {
        Ok(())
    }
    /// Write `buf` at `offset` and make it durable together with every
    /// write completed before this call inside `ranges` — and promise
    /// nothing about other writes, which may stay in a volatile cache. On
    /// an image file this is `sync_file_range` of the ranges and a
    /// `RWF_DSYNC` write (the host syncs that range and flushes its disk),
    /// so a commit does not wait for another writer's unsynced data;
    /// elsewhere a write and a flush.
    fn write_durable(&self, offset: u64, buf: &[u8], _ranges: &[(u64, u64)]) -> io::Result<()> {
        self.write_at(offset, buf)?;
        self.flush()
    }
    /// Make the completed writes in `ranges` durable: a barrier with no
    /// write of its own to carry. `spare` is a block (offset, content)
    /// that already holds that content, which a device may rewrite to
    /// carry the ranged flush (`write_durable`); a device whose plain
    /// flush costs no more only flushes.
    fn sync_ranges(&self, ranges: &[(u64, u64)], spare: (u64, &[u8])) -> io::Result<()> {
        self.write_durable(spare.0, spare.1, ranges)
    }
    /// Make the completed writes inside bytes `[offset, offset + len)`
    /// durable, and promise nothing about the others: a barrier on one
    /// part of a device standing for a disk of its own (`WindowDevice`).
    /// A device that cannot tell its parts apart flushes them all.
    fn flush_range(&self, _offset: u64, _len: u64) -> io::Result<()> {
        self.flush()
    }
    /// Size of the device in bytes.
    fn size_bytes(&self) -> u64;
    /// Whether writes are refused (opened read-only).
    fn is_read_only(&self) -> bool {
        false
    }
    /// Read what the medium holds now, past any cache of this machine that
    /// another writer of the same medium would not update (the MMP block:
    /// the page cache of a block device is not refreshed by writes through
    /// another device node, another machine, a loop device).
    fn read_uncached(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.read_at(offset, buf)
    }
    /// Write straight to the medium, durably (the MMP block).
    fn write_uncached(&self, offset: u64, buf: &[u8]) -> io::Result<()> {
        self.write_at(offset, buf)?;
        self.flush()
    }
    /// `bytes` are at `offset` on this medium and stay there while it is in
    /// use (the filesystem's UUID). A device that can lose its medium and
    /// find one again — an NBD client reconnecting to whatever server now
    /// answers at the address — checks them before it writes anything
    /// again, so that it never writes into another medium that took the
    /// first one's place. Wrappers pass it on.
    fn expect_identity(&self, _offset: u64, _bytes: &[u8]) {}
    /// Bytes `[offset, offset + len)` as persistent memory (ByteLog), where
    /// the device can be mapped; None where it cannot (NBD, read-only).
    fn map_persistent(
        &self,
        _offset: u64,
        _len: u64,
    ) -> io::Result<Option<Arc<dyn PersistentMemory>>> {
        Ok(None)
    }
}

/// Open what an image argument names: an NBD URI (`nbd://HOST[:PORT]/EXPORT`,
/// `nbd+unix:///EXPORT?socket=PATH`) or an image file or block device.
/// The error is one line that names what was opened.
pub fn open_image(image: &Path, read_only: bool) -> io::Result<Arc<dyn BlockDevice>> {
    let claim = if read_only {
        Claim::Inspect
    } else {
        Claim::Exclusive
    };
    open_image_claimed(image, read_only, claim)
}

/// `open_image` with the claim a file or block device is opened with (an
/// NBD export cannot be claimed: the protocol has no lock).
pub fn open_image_claimed(
    image: &Path,
    read_only: bool,
    claim: Claim,
) -> io::Result<Arc<dyn BlockDevice>> {
    let cannot_open = |error: io::Error| {
        io::Error::new(
            error.kind(),
            format!("cannot open {}: {error}", image.display()),
        )
    };
    if let Some(text) = image.to_str().filter(|text| is_nbd_uri(text)) {
        let uri =
            NbdUri::parse(text).map_err(|why| io::Error::new(io::ErrorKind::InvalidInput, why))?;
        let device = NbdDevice::open(&uri, read_only).map_err(cannot_open)?;
        return Ok(Arc::new(device));
    }
    Ok(Arc::new(
        FileDevice::open_claimed(image, read_only, claim).map_err(cannot_open)?,
    ))
}

/// Checks shared by every implementation: sector alignment and bounds.
pub(crate) fn check_range(offset: u64, len: usize, size: u64) -> io::Result<()> {
    debug_assert_eq!(offset % SECTOR_SIZE, 0, "unaligned device offset {offset}");
    debug_assert_eq!(len as u64 % SECTOR_SIZE, 0, "unaligned device length {len}");
    match offset.checked_add(len as u64) {
        Some(end) if end <= size => Ok(()),
        _ => Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!("access at byte {offset} (+{len}) beyond device end {size}"),
        )),
    }
}
