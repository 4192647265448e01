//! An in-memory device, for unit tests and for rebuilding crash states.

use super::persistent::{PersistMethod, PersistentMemory, check_lines};
use super::{BlockDevice, check_range};
use parking_lot::RwLock;
use std::io;
use std::sync::Arc;

/// An image held in memory: nothing reaches a disk and `flush` costs
/// nothing (`Image::from_device` over an image read from a file, say).
pub struct MemoryDevice {
    /// Shared with its persistent-memory mappings.
    bytes: Arc<RwLock<Vec<u8>>>,
}

impl MemoryDevice {
    /// A zeroed device of `size` bytes (a multiple of 512).
    pub fn new(size: usize) -> Self {
        MemoryDevice::from_bytes(vec![0; size])
    }

    /// A device holding `bytes` (their length a multiple of 512).
    pub fn from_bytes(bytes: Vec<u8>) -> Self {
        MemoryDevice {
            bytes: Arc::new(RwLock::new(bytes)),
        }
    }

    /// A copy of the whole device, for comparing images.
    pub fn snapshot(&self) -> Vec<u8> {
        self.bytes.read().clone()
    }
}

impl BlockDevice for MemoryDevice {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let bytes = self.bytes.read();
        check_range(offset, buf.len(), bytes.len() as u64)?;
        let start = offset as usize;
        buf.copy_from_slice(&bytes[start..start + buf.len()]);
        Ok(())
    }

    fn write_at(&self, offset: u64, buf: &[u8]) -> io::Result<()> {
        let mut bytes = self.bytes.write();
        check_range(offset, buf.len(), bytes.len() as u64)?;
        let start = offset as usize;
        bytes[start..start + buf.len()].copy_from_slice(buf);
        Ok(())
    }

    fn flush(&self) -> io::Result<()> {
        Ok(())
    }

    fn size_bytes(&self) -> u64 {
        self.bytes.read().len() as u64
    }

    fn map_persistent(
        &self,
        offset: u64,
        len: u64,
    ) -> io::Result<Option<Arc<dyn PersistentMemory>>> {
        check_range(offset, len as usize, self.size_bytes())?;
        Ok(Some(Arc::new(MemoryMapping {
            bytes: Arc::clone(&self.bytes),
            offset,
            len,
        })))
    }
}

/// Part of a memory device as persistent memory: stores are durable at
/// once (there is no power to cut).
struct MemoryMapping {
    bytes: Arc<RwLock<Vec<u8>>>,
    offset: u64,
    len: u64,
}

impl PersistentMemory for MemoryMapping {
    fn len(&self) -> u64 {
        self.len
    }

    fn method(&self) -> PersistMethod {
        PersistMethod::Memory
    }

    fn store(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        check_lines(offset, data.len() as u64, self.len)?;
        let start = (self.offset + offset) as usize;
        self.bytes.write()[start..start + data.len()].copy_from_slice(data);
        Ok(())
    }

    fn persist(&self, offset: u64, len: u64) -> io::Result<()> {
        check_lines(offset, len, self.len)
    }
}
