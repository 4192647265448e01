//! A copy-on-write device over a shared, immutable image: one crash state
//! is the image at the epoch's opening flush plus a few writes, and
//! recovery writes a few blocks more. Copying a whole image per state
//! would cost more than checking it.
//!
//! Pages of `PAGE_SIZE` bytes are copied from the base on first write.
//! Locks: `pages` is a leaf lock, never held across anything but a copy.

use crate::dev::{BlockDevice, SECTOR_SIZE};
use parking_lot::RwLock;
use std::collections::HashMap;
use std::io::{self, Write};
use std::sync::Arc;

const PAGE_SIZE: u64 = 4096;

pub struct OverlayDevice {
    base: Arc<Vec<u8>>,
    pages: RwLock<HashMap<u64, Box<[u8]>>>,
}

impl OverlayDevice {
    pub fn new(base: Arc<Vec<u8>>) -> Self {
        debug_assert_eq!(base.len() as u64 % PAGE_SIZE, 0, "image not page-sized");
        OverlayDevice {
            base,
            pages: RwLock::new(HashMap::new()),
        }
    }

    /// A second overlay with the same content (the base is shared).
    pub fn fork(&self) -> OverlayDevice {
        OverlayDevice {
            base: Arc::clone(&self.base),
            pages: RwLock::new(self.pages.read().clone()),
        }
    }

    /// Put `bytes` at `offset`, any alignment: a crash state's writes and
    /// its persistent-memory cache lines (64 bytes) alike.
    pub fn put(&self, offset: u64, bytes: &[u8]) -> io::Result<()> {
        if offset
            .checked_add(bytes.len() as u64)
            .is_none_or(|end| end > self.base.len() as u64)
        {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!(
                    "crash-state bytes at {offset} (+{}) beyond the image",
                    bytes.len()
                ),
            ));
        }
        let mut pages = self.pages.write();
        for (page, in_page, at, len) in Self::pieces(offset, bytes.len()) {
            let copy = pages.entry(page).or_insert_with(|| {
                let from = (page * PAGE_SIZE) as usize;
                self.base[from..from + PAGE_SIZE as usize].into()
            });
            copy[in_page..in_page + len].copy_from_slice(&bytes[at..at + len]);
        }
        Ok(())
    }

    fn check(&self, offset: u64, len: usize) -> io::Result<()> {
        crate::dev::check_range(offset, len, self.base.len() as u64)
    }

    /// Visit the page pieces of `offset..offset+len`: (page, offset in the
    /// page, offset in the caller's buffer, length).
    fn pieces(offset: u64, len: usize) -> impl Iterator<Item = (u64, usize, usize, usize)> {
        let end = offset + len as u64;
        let mut position = offset;
        std::iter::from_fn(move || {
            if position >= end {
                return None;
            }
            let page = position / PAGE_SIZE;
            let in_page = (position % PAGE_SIZE) as usize;
            let piece = (PAGE_SIZE as usize - in_page).min((end - position) as usize);
            let at = (position - offset) as usize;
            position += piece as u64;
            Some((page, in_page, at, piece))
        })
    }

    /// The whole image, for tools that need a file (e2fsck, loop mounts).
    pub fn write_image(&self, out: &mut dyn Write) -> io::Result<()> {
        let pages = self.pages.read();
        let count = self.base.len() as u64 / PAGE_SIZE;
        // Runs of untouched pages go out in one call.
        let mut run_start = 0u64;
        for page in 0..=count {
            let overlaid = page < count && pages.contains_key(&page);
            if page == count || overlaid {
                let from = (run_start * PAGE_SIZE) as usize;
                out.write_all(&self.base[from..(page * PAGE_SIZE) as usize])?;
                if overlaid {
                    out.write_all(&pages[&page])?;
                }
                run_start = page + 1;
            }
        }
        out.flush()
    }

    /// The whole image as bytes.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut bytes = Vec::with_capacity(self.base.len());
        self.write_image(&mut bytes).expect("writing to memory");
        bytes
    }

    /// Pages that differ from the base (written at least once).
    pub fn pages_written(&self) -> usize {
        self.pages.read().len()
    }

    fn page_numbers(&self) -> Vec<u64> {
        self.pages.read().keys().copied().collect()
    }

    fn page(&self, page: u64) -> Vec<u8> {
        let mut bytes = vec![0u8; PAGE_SIZE as usize];
        self.read_at(page * PAGE_SIZE, &mut bytes)
            .expect("a page inside the image");
        bytes
    }
}

/// The image a crash state starts from (the disk at its epoch's opening
/// flush), with the pages changed since it was first made, so that files
/// showing it can be brought up to date page by page.
pub struct Base {
    pub bytes: Arc<Vec<u8>>,
    /// Every page written since `new`, in order (repeats allowed).
    changed: Vec<u64>,
    /// Distinguishes bases of different recordings.
    serial: u64,
}

impl Base {
    pub fn new(bytes: Vec<u8>) -> Self {
        static SERIAL: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        Base {
            bytes: Arc::new(bytes),
            changed: Vec::new(),
            serial: SERIAL.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        }
    }

    /// Apply a write (no overlay may be alive: the bytes are changed in place).
    pub fn write(&mut self, offset: u64, data: &[u8]) {
        let bytes = Arc::make_mut(&mut self.bytes);
        bytes[offset as usize..offset as usize + data.len()].copy_from_slice(data);
        let end = offset + data.len() as u64;
        self.changed
            .extend(offset / PAGE_SIZE..end.div_ceil(PAGE_SIZE));
    }
}

/// A file that shows overlays of one base: rewritten whole when the base
/// is new or the file was changed behind its back, else only where the
/// new overlay differs from what the file shows (writing a 16 MiB image
/// per state would cost more than checking it).
pub struct ImageFile {
    pub path: std::path::PathBuf,
    file: std::fs::File,
    mirror: Vec<u8>,
    /// (serial of the base shown, changes of it already shown); None when
    /// the file's content is unknown.
    shown: Option<(u64, usize)>,
    overlay_pages: Vec<u64>,
}

impl ImageFile {
    pub fn new(path: std::path::PathBuf) -> io::Result<Self> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)?;
        Ok(ImageFile {
            path,
            file,
            mirror: Vec::new(),
            shown: None,
            overlay_pages: Vec::new(),
        })
    }

    /// Something else (e2fsck's replay, a kernel mount) changed the file.
    pub fn invalidate(&mut self) {
        self.shown = None;
    }

    /// Make the file hold `device`'s image; `base` is the image under it.
    pub fn show(&mut self, base: &Base, device: &OverlayDevice) -> io::Result<()> {
        use std::os::unix::fs::FileExt;
        debug_assert!(Arc::ptr_eq(&base.bytes, &device.base));
        let new_pages = device.page_numbers();
        match self.shown {
            Some((serial, seen))
                if serial == base.serial && self.mirror.len() == base.bytes.len() =>
            {
                let mut candidates: Vec<u64> = base.changed[seen..].to_vec();
                candidates.extend_from_slice(&self.overlay_pages);
                candidates.extend_from_slice(&new_pages);
                candidates.sort_unstable();
                candidates.dedup();
                for page in candidates {
                    let wanted = device.page(page);
                    let at = (page * PAGE_SIZE) as usize;
                    let slot = &mut self.mirror[at..at + PAGE_SIZE as usize];
                    if *slot != *wanted {
                        self.file.write_all_at(&wanted, page * PAGE_SIZE)?;
                        slot.copy_from_slice(&wanted);
                    }
                }
            }
            _ => {
                self.mirror = device.to_vec();
                self.file.set_len(self.mirror.len() as u64)?;
                self.file.write_all_at(&self.mirror, 0)?;
            }
        }
        self.shown = Some((base.serial, base.changed.len()));
        self.overlay_pages = new_pages;
        Ok(())
    }
}

impl BlockDevice for OverlayDevice {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.check(offset, buf.len())?;
        let pages = self.pages.read();
        for (page, in_page, at, len) in Self::pieces(offset, buf.len()) {
            let source = match pages.get(&page) {
                Some(bytes) => &bytes[in_page..in_page + len],
                None => {
                    let from = (page * PAGE_SIZE) as usize + in_page;
                    &self.base[from..from + len]
                }
            };
            buf[at..at + len].copy_from_slice(source);
        }
        Ok(())
    }

    fn write_at(&self, offset: u64, buf: &[u8]) -> io::Result<()> {
        self.check(offset, buf.len())?;
        debug_assert_eq!(offset % SECTOR_SIZE, 0);
        self.put(offset, buf)
    }

    fn flush(&self) -> io::Result<()> {
        Ok(())
    }

    fn size_bytes(&self) -> u64 {
        self.base.len() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_stay_in_the_overlay_and_read_back() {
        let base: Arc<Vec<u8>> = Arc::new((0..16384u32).map(|i| (i / 512) as u8).collect());
        let overlay = OverlayDevice::new(Arc::clone(&base));
        // A write straddling two pages.
        overlay.write_at(3584, &[0xee; 1024]).unwrap();
        let mut back = vec![0u8; 2048];
        overlay.read_at(3072, &mut back).unwrap();
        assert_eq!(&back[..512], &[6; 512][..]);
        assert_eq!(&back[512..1536], &[0xee; 1024][..]);
        assert_eq!(&back[1536..], &[9; 512][..]);
        assert_eq!(overlay.pages_written(), 2);
        // The base is untouched; the full image has the write.
        assert_eq!(base[3584], 7);
        let image = overlay.to_vec();
        assert_eq!(image.len(), base.len());
        assert_eq!(&image[3584..4608], &[0xee; 1024][..]);
        assert_eq!(&image[..3584], &base[..3584]);
        assert_eq!(&image[4608..], &base[4608..]);
        // A fork sees the write; its own writes stay its own.
        let fork = overlay.fork();
        fork.write_at(0, &[1; 512]).unwrap();
        overlay.read_at(0, &mut back[..512]).unwrap();
        assert_eq!(&back[..512], &[0; 512][..]);
        assert!(overlay.write_at(16384, &[0; 512]).is_err());
    }

    #[test]
    fn image_files_follow_bases_and_overlays() {
        let dir = std::env::temp_dir().join(format!("jext4-overlay-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut base = Base::new(vec![1u8; 16384]);
        let mut file = ImageFile::new(dir.join("image")).unwrap();
        let expect = |file: &ImageFile, device: &OverlayDevice| {
            assert_eq!(std::fs::read(&file.path).unwrap(), device.to_vec());
        };
        let first = OverlayDevice::new(Arc::clone(&base.bytes));
        first.write_at(4096, &[2; 512]).unwrap();
        file.show(&base, &first).unwrap();
        expect(&file, &first);
        drop(first);
        // The base moves on; the old overlay's page must be restored.
        base.write(8192, &[3; 1024]);
        let second = OverlayDevice::new(Arc::clone(&base.bytes));
        second.write_at(0, &[4; 512]).unwrap();
        file.show(&base, &second).unwrap();
        expect(&file, &second);
        // Changed behind its back: rewritten whole.
        std::fs::write(&file.path, vec![9u8; 16384]).unwrap();
        file.invalidate();
        file.show(&base, &second).unwrap();
        expect(&file, &second);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
