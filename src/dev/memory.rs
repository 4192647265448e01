//! An in-memory device, for unit tests and for rebuilding crash states.

use super::{BlockDevice, check_range};
use parking_lot::RwLock;
use std::io;

pub struct MemoryDevice {
    bytes: RwLock<Vec<u8>>,
}

impl MemoryDevice {
    pub fn new(size: usize) -> Self {
        MemoryDevice {
            bytes: RwLock::new(vec![0; size]),
        }
    }

    pub fn from_bytes(bytes: Vec<u8>) -> Self {
        MemoryDevice {
            bytes: RwLock::new(bytes),
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
}
