//! The images of crash states: the disk at an epoch's opening flush
//! (`Base`), shared by the copy-on-write devices (`dev::overlay`) that
//! hold each state's writes and its recovery's, and the files that show
//! those devices to tools that need a file (e2fsck, loop mounts).
//!
//! Pages of `PAGE_SIZE` bytes are the overlays' copy unit and the unit in
//! which files are brought up to date.

use crate::dev::BlockDevice;
use crate::dev::overlay::{OverlayDevice, SharedImage};
use std::io;
use std::sync::Arc;

const PAGE_SIZE: u64 = 4096;

/// A crash state's device: writes over the shared image of its epoch.
pub type StateDevice = OverlayDevice<SharedImage>;

/// The image a crash state starts from (the disk at its epoch's opening
/// flush), with the pages changed since it was first made, so that files
/// showing it can be brought up to date page by page.
pub struct Base {
    image: Arc<SharedImage>,
    /// Every page written since `new`, in order (repeats allowed).
    changed: Vec<u64>,
    /// Distinguishes bases of different recordings.
    serial: u64,
}

impl Base {
    pub fn new(bytes: Vec<u8>) -> Self {
        static SERIAL: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        Base {
            image: Arc::new(SharedImage::new(bytes)),
            changed: Vec::new(),
            serial: SERIAL.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        }
    }

    /// A crash state's device: this image, and writes kept apart from it.
    pub fn overlay(&self) -> StateDevice {
        OverlayDevice::new(Arc::clone(&self.image), PAGE_SIZE as u32)
    }

    fn len(&self) -> usize {
        self.image.bytes().len()
    }

    /// Apply a write (no overlay may be alive: the bytes are changed in place).
    pub fn write(&mut self, offset: u64, data: &[u8]) {
        debug_assert_eq!(
            Arc::strong_count(&self.image),
            1,
            "an overlay of the base is alive"
        );
        let bytes = Arc::make_mut(&mut self.image).bytes_mut();
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
    pub fn show(&mut self, base: &Base, device: &StateDevice) -> io::Result<()> {
        use std::os::unix::fs::FileExt;
        debug_assert!(Arc::ptr_eq(&base.image, device.base()));
        debug_assert_eq!(device.page_size(), PAGE_SIZE);
        let new_pages = device.page_numbers();
        match self.shown {
            Some((serial, seen)) if serial == base.serial && self.mirror.len() == base.len() => {
                let mut candidates: Vec<u64> = base.changed[seen..].to_vec();
                candidates.extend_from_slice(&self.overlay_pages);
                candidates.extend_from_slice(&new_pages);
                candidates.sort_unstable();
                candidates.dedup();
                for page in candidates {
                    let mut wanted = vec![0u8; PAGE_SIZE as usize];
                    device.read_at(page * PAGE_SIZE, &mut wanted)?;
                    let at = (page * PAGE_SIZE) as usize;
                    let slot = &mut self.mirror[at..at + PAGE_SIZE as usize];
                    if *slot != *wanted {
                        self.file.write_all_at(&wanted, page * PAGE_SIZE)?;
                        slot.copy_from_slice(&wanted);
                    }
                }
            }
            _ => {
                self.mirror = device.to_vec()?;
                self.file.set_len(self.mirror.len() as u64)?;
                self.file.write_all_at(&self.mirror, 0)?;
            }
        }
        self.shown = Some((base.serial, base.changed.len()));
        self.overlay_pages = new_pages;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_files_follow_bases_and_overlays() {
        let dir = std::env::temp_dir().join(format!("jext4-overlay-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut base = Base::new(vec![1u8; 16384]);
        let mut file = ImageFile::new(dir.join("image")).unwrap();
        let expect = |file: &ImageFile, device: &StateDevice| {
            assert_eq!(std::fs::read(&file.path).unwrap(), device.to_vec().unwrap());
        };
        let first = base.overlay();
        first.write_at(4096, &[2; 512]).unwrap();
        file.show(&base, &first).unwrap();
        expect(&file, &first);
        drop(first);
        // The base moves on; the old overlay's page must be restored.
        base.write(8192, &[3; 1024]);
        let second = base.overlay();
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
