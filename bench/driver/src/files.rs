//! Where a workload's files live: the host's filesystem (a mount of the
//! filesystem under test, through the kernel) or an image opened through
//! jext4's library (`--image`: no mount, no FUSE, the engine called
//! directly). The workloads that have a library form are written once,
//! against this trait.

use std::io::{self, Read, Write};
use std::path::Path;

/// The calls the library-form workloads make, shaped as `std::fs`'s.
pub trait Files: Send + Sync + 'static {
    type File: Read + Write + Send;
    fn create_dir_all(&self, path: &Path) -> io::Result<()>;
    /// Write-only, failing if the file exists (`O_CREAT | O_EXCL`).
    fn create_new(&self, path: &Path) -> io::Result<Self::File>;
    /// Write-only, created or truncated (`File::create`).
    fn create(&self, path: &Path) -> io::Result<Self::File>;
    /// Read and append.
    fn open_append(&self, path: &Path) -> io::Result<Self::File>;
    /// Read-only (`File::open`).
    fn open(&self, path: &Path) -> io::Result<Self::File>;
    fn write(&self, path: &Path, data: &[u8]) -> io::Result<()>;
    fn remove_file(&self, path: &Path) -> io::Result<()>;
    fn sync_all(&self, file: &Self::File) -> io::Result<()>;
}

/// The host's filesystem, through the kernel.
pub struct Host;

impl Files for Host {
    type File = std::fs::File;
    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        std::fs::create_dir_all(path)
    }
    fn create_new(&self, path: &Path) -> io::Result<Self::File> {
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(path)
    }
    fn create(&self, path: &Path) -> io::Result<Self::File> {
        std::fs::File::create(path)
    }
    fn open_append(&self, path: &Path) -> io::Result<Self::File> {
        std::fs::OpenOptions::new()
            .read(true)
            .append(true)
            .open(path)
    }
    fn open(&self, path: &Path) -> io::Result<Self::File> {
        std::fs::File::open(path)
    }
    fn write(&self, path: &Path, data: &[u8]) -> io::Result<()> {
        std::fs::write(path, data)
    }
    fn remove_file(&self, path: &Path) -> io::Result<()> {
        std::fs::remove_file(path)
    }
    fn sync_all(&self, file: &Self::File) -> io::Result<()> {
        file.sync_all()
    }
}

/// An image through jext4's library.
pub struct Image(pub jext4::Image);

impl Image {
    /// Opens the image read-write; the workload's paths are inside it.
    pub fn open(path: &Path) -> io::Result<Image> {
        Ok(Image(jext4::Image::open(path)?))
    }

    /// Unmounts cleanly: the journal committed and checkpointed.
    pub fn close(self) -> io::Result<()> {
        Ok(self.0.close()?)
    }
}

impl Files for Image {
    type File = jext4::File;
    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        Ok(self.0.create_dir_all(path)?)
    }
    fn create_new(&self, path: &Path) -> io::Result<Self::File> {
        let mut options = jext4::OpenOptions::new();
        options.write(true).create_new(true);
        Ok(self.0.open_with(path, &options)?)
    }
    fn create(&self, path: &Path) -> io::Result<Self::File> {
        Ok(self.0.create_file(path)?)
    }
    fn open_append(&self, path: &Path) -> io::Result<Self::File> {
        let mut options = jext4::OpenOptions::new();
        options.read(true).append(true);
        Ok(self.0.open_with(path, &options)?)
    }
    fn open(&self, path: &Path) -> io::Result<Self::File> {
        Ok(self.0.open_file(path)?)
    }
    fn write(&self, path: &Path, data: &[u8]) -> io::Result<()> {
        Ok(self.0.write(path, data)?)
    }
    fn remove_file(&self, path: &Path) -> io::Result<()> {
        Ok(self.0.remove_file(path)?)
    }
    fn sync_all(&self, file: &Self::File) -> io::Result<()> {
        Ok(file.sync_all()?)
    }
}
