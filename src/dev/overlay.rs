//! A copy-on-write device over another: reads fall through to the base
//! until a page is written; a write copies its page up and stays here. The
//! base is never written.
//!
//! Two users, one device:
//! - crash states (`crate::crash`): the recorded image at an epoch's
//!   opening flush is shared by every state of that epoch (a
//!   [`SharedImage`]); a state is that image plus a few writes, and
//!   recovery writes a few blocks more. Copying a whole image per state
//!   would cost more than checking it.
//! - fast-commit replay (`fs::fast_commit`): the engine applies the records
//!   on an overlay of the real device, so that nothing reaches the device
//!   before the journal holds the replay's blocks; `take_pages` then hands
//!   the changed blocks over (pages of the filesystem's block size).
//!
//! Pages are `page_size` bytes, chosen by the user, and copied whole from
//! the base on first write.
//! Locks: `pages` is a leaf lock. It is held across a read of the base
//! (falling through, or copying a page up), never across anything else.

use super::{BlockDevice, SECTOR_SIZE, check_range};
use parking_lot::RwLock;
use std::collections::BTreeMap;
use std::io;
use std::sync::Arc;

pub struct OverlayDevice<B: BlockDevice + ?Sized = dyn BlockDevice> {
    base: Arc<B>,
    page_size: u64,
    /// Page number → its bytes, for every page written [guards: own lock].
    pages: RwLock<BTreeMap<u64, Vec<u8>>>,
}

impl<B: BlockDevice + ?Sized> OverlayDevice<B> {
    pub fn new(base: Arc<B>, page_size: u32) -> Self {
        debug_assert!(
            page_size as u64 >= SECTOR_SIZE && page_size.is_power_of_two(),
            "overlay page of {page_size} bytes"
        );
        OverlayDevice {
            base,
            page_size: page_size as u64,
            pages: RwLock::new(BTreeMap::new()),
        }
    }

    /// The device under the overlay.
    pub fn base(&self) -> &Arc<B> {
        &self.base
    }

    pub fn page_size(&self) -> u64 {
        self.page_size
    }

    /// A second overlay with the same content (the base is shared).
    pub fn fork(&self) -> Self {
        OverlayDevice {
            base: Arc::clone(&self.base),
            page_size: self.page_size,
            pages: RwLock::new(self.pages.read().clone()),
        }
    }

    /// Put `bytes` at `offset`, any alignment: a crash state's writes and
    /// its persistent-memory cache lines (64 bytes) alike.
    pub fn put(&self, offset: u64, bytes: &[u8]) -> io::Result<()> {
        let size = self.base.size_bytes();
        if offset
            .checked_add(bytes.len() as u64)
            .is_none_or(|end| end > size)
        {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!(
                    "overlay write at byte {offset} (+{}) beyond device end {size}",
                    bytes.len()
                ),
            ));
        }
        let mut pages = self.pages.write();
        for (page, in_page, at, len) in self.pieces(offset, bytes.len()) {
            let copy = match pages.entry(page) {
                std::collections::btree_map::Entry::Occupied(entry) => entry.into_mut(),
                std::collections::btree_map::Entry::Vacant(entry) => {
                    entry.insert(self.read_base_page(page)?)
                }
            };
            copy[in_page..in_page + len].copy_from_slice(&bytes[at..at + len]);
        }
        Ok(())
    }

    /// Page `page` as the base holds it; a last page that the device ends
    /// inside is zero past the end (no access can reach those bytes).
    fn read_base_page(&self, page: u64) -> io::Result<Vec<u8>> {
        let start = page * self.page_size;
        let len = self.page_size.min(self.base.size_bytes() - start) as usize;
        let mut bytes = vec![0u8; self.page_size as usize];
        self.base.read_at(start, &mut bytes[..len])?;
        Ok(bytes)
    }

    /// The page pieces of `offset..offset+len`: (page, offset in the page,
    /// offset in the caller's buffer, length).
    fn pieces(&self, offset: u64, len: usize) -> impl Iterator<Item = (u64, usize, usize, usize)> {
        let page_size = self.page_size;
        let end = offset + len as u64;
        let mut position = offset;
        std::iter::from_fn(move || {
            if position >= end {
                return None;
            }
            let page = position / page_size;
            let in_page = (position % page_size) as usize;
            let piece = (page_size as usize - in_page).min((end - position) as usize);
            let at = (position - offset) as usize;
            position += piece as u64;
            Some((page, in_page, at, piece))
        })
    }

    /// The numbers of the pages written at least once, in order.
    pub fn page_numbers(&self) -> Vec<u64> {
        self.pages.read().keys().copied().collect()
    }

    /// Pages that differ from the base (written at least once).
    pub fn pages_written(&self) -> usize {
        self.pages.read().len()
    }

    /// Every page written, by number, leaving the overlay as its base.
    pub fn take_pages(&self) -> BTreeMap<u64, Vec<u8>> {
        std::mem::take(&mut *self.pages.write())
    }

    /// The whole device as bytes.
    pub fn to_vec(&self) -> io::Result<Vec<u8>> {
        let mut bytes = vec![0u8; self.base.size_bytes() as usize];
        self.read_at(0, &mut bytes)?;
        Ok(bytes)
    }
}

impl<B: BlockDevice + ?Sized> BlockDevice for OverlayDevice<B> {
    /// Pages written come from the overlay; runs of the others, in one read
    /// of the base each.
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        check_range(offset, buf.len(), self.size_bytes())?;
        let pages = self.pages.read();
        // The part of `buf` still to read from the base: [from, to).
        let (mut from, mut to) = (0usize, 0usize);
        for (page, in_page, at, len) in self.pieces(offset, buf.len()) {
            let Some(bytes) = pages.get(&page) else {
                debug_assert!(from == to || to == at, "base run with a gap");
                if from == to {
                    from = at;
                }
                to = at + len;
                continue;
            };
            if from < to {
                self.base
                    .read_at(offset + from as u64, &mut buf[from..to])?;
                from = to;
            }
            buf[at..at + len].copy_from_slice(&bytes[in_page..in_page + len]);
        }
        if from < to {
            self.base
                .read_at(offset + from as u64, &mut buf[from..to])?;
        }
        Ok(())
    }

    fn write_at(&self, offset: u64, buf: &[u8]) -> io::Result<()> {
        check_range(offset, buf.len(), self.size_bytes())?;
        self.put(offset, buf)
    }

    fn flush(&self) -> io::Result<()> {
        Ok(())
    }

    fn size_bytes(&self) -> u64 {
        self.base.size_bytes()
    }
}

/// An image in memory that overlays share and nothing writes through
/// them: the base of crash states. Its owner may change it (`bytes_mut`)
/// while no overlay holds it.
#[derive(Clone)]
pub struct SharedImage {
    bytes: Vec<u8>,
}

impl SharedImage {
    pub fn new(bytes: Vec<u8>) -> Self {
        SharedImage { bytes }
    }

    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    pub fn bytes_mut(&mut self) -> &mut [u8] {
        &mut self.bytes
    }
}

impl BlockDevice for SharedImage {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        check_range(offset, buf.len(), self.size_bytes())?;
        let start = offset as usize;
        buf.copy_from_slice(&self.bytes[start..start + buf.len()]);
        Ok(())
    }

    fn write_at(&self, offset: u64, _buf: &[u8]) -> io::Result<()> {
        Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("write at byte {offset} to a shared image (overlays only read it)"),
        ))
    }

    fn flush(&self) -> io::Result<()> {
        Ok(())
    }

    fn size_bytes(&self) -> u64 {
        self.bytes.len() as u64
    }

    fn is_read_only(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dev::MemoryDevice;

    #[test]
    fn writes_stay_in_the_overlay_and_read_back() {
        let base = Arc::new(SharedImage::new(
            (0..16384u32).map(|i| (i / 512) as u8).collect(),
        ));
        let overlay = OverlayDevice::new(Arc::clone(&base), 4096);
        // A write straddling two pages.
        overlay.write_at(3584, &[0xee; 1024]).unwrap();
        let mut back = vec![0u8; 2048];
        overlay.read_at(3072, &mut back).unwrap();
        assert_eq!(&back[..512], &[6; 512][..]);
        assert_eq!(&back[512..1536], &[0xee; 1024][..]);
        assert_eq!(&back[1536..], &[9; 512][..]);
        assert_eq!(overlay.pages_written(), 2);
        assert_eq!(overlay.page_numbers(), vec![0, 1]);
        // The base is untouched; the full image has the write.
        assert_eq!(base.bytes()[3584], 7);
        let image = overlay.to_vec().unwrap();
        assert_eq!(image.len(), base.bytes().len());
        assert_eq!(&image[3584..4608], &[0xee; 1024][..]);
        assert_eq!(&image[..3584], &base.bytes()[..3584]);
        assert_eq!(&image[4608..], &base.bytes()[4608..]);
        // A fork sees the write; its own writes stay its own.
        let fork = overlay.fork();
        fork.write_at(0, &[1; 512]).unwrap();
        overlay.read_at(0, &mut back[..512]).unwrap();
        assert_eq!(&back[..512], &[0; 512][..]);
        fork.read_at(3584, &mut back[..512]).unwrap();
        assert_eq!(&back[..512], &[0xee; 512][..]);
        // Nothing beyond the end, by either path; the base refuses writes.
        assert!(overlay.write_at(16384, &[0; 512]).is_err());
        assert!(overlay.put(16380, &[0; 8]).is_err());
        assert!(base.write_at(0, &[0; 512]).is_err());
    }

    #[test]
    fn unaligned_puts_copy_their_page_up() {
        let base = Arc::new(SharedImage::new(vec![5u8; 8192]));
        let overlay = OverlayDevice::new(base, 4096);
        // Two persistent-memory cache lines, one each side of a page end.
        overlay.put(4096 - 64, &[1; 128]).unwrap();
        let image = overlay.to_vec().unwrap();
        assert!(image[..4032].iter().all(|&b| b == 5));
        assert!(image[4032..4160].iter().all(|&b| b == 1));
        assert!(image[4160..].iter().all(|&b| b == 5));
    }

    #[test]
    fn reads_fall_through_and_pages_are_taken_whole() {
        let base: Arc<dyn BlockDevice> = Arc::new(MemoryDevice::from_bytes(
            (0..8192u32).map(|i| (i % 251) as u8).collect(),
        ));
        let overlay = OverlayDevice::new(Arc::clone(&base), 4096);
        // A write across the block boundary, sector-aligned.
        overlay.write_at(3584, &[0xAA; 1024]).unwrap();
        let mut bytes = vec![0u8; 8192];
        overlay.read_at(0, &mut bytes).unwrap();
        assert!(bytes[3584..4608].iter().all(|&b| b == 0xAA));
        assert_eq!(bytes[100], 100);
        assert_eq!(bytes[5000], (5000 % 251) as u8);
        let mut untouched = vec![0u8; 512];
        base.read_at(3584, &mut untouched).unwrap();
        assert_eq!(
            untouched[0],
            (3584 % 251) as u8,
            "the device is not written"
        );
        let blocks = overlay.take_pages();
        assert_eq!(blocks.keys().copied().collect::<Vec<_>>(), vec![0, 1]);
        assert_eq!(blocks[&1][0], 0xAA);
        assert_eq!(blocks[&1][600], ((4096 + 600) % 251) as u8);
        // Taken: the overlay reads as its base again.
        overlay.read_at(3584, &mut untouched).unwrap();
        assert_eq!(untouched[0], (3584 % 251) as u8);
    }

    #[test]
    fn runs_of_base_pages_around_written_ones_read_right() {
        let pattern = |i: u32| (i % 253) as u8;
        let base = Arc::new(SharedImage::new((0..40960u32).map(pattern).collect()));
        let overlay = OverlayDevice::new(base, 1024);
        for page in [3u64, 4, 9, 30] {
            overlay.write_at(page * 1024, &[0xFF; 1024]).unwrap();
        }
        let mut bytes = vec![0u8; 38912];
        overlay.read_at(1024, &mut bytes).unwrap();
        for (at, &byte) in bytes.iter().enumerate() {
            let position = at as u32 + 1024;
            let written = [3, 4, 9, 30].contains(&(position / 1024));
            let expected = if written { 0xFF } else { pattern(position) };
            assert_eq!(byte, expected, "byte {position}");
        }
    }
}
