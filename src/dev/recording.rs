//! The recording device: wraps any block device and logs, in order, every
//! write (offset and bytes) and every flush that reaches it, with markers
//! that a workload inserts ("operation 7 begins", "operation 7 was
//! acknowledged"). The crash-state generator (`crate::crash`) rebuilds from
//! this log every disk a power cut could have left behind.
//!
//! Order: the log lock is held while the write or flush is performed on the
//! inner device, so the log order is the order in which the operations
//! completed — the order a disk's volatile cache sees them. A flush in the
//! log makes every write logged before it durable.
//!
//! Persistent memory (`map_persistent`, ByteLog): every cache line stored
//! is logged as a `Store` of 64 bytes, every persist as a `Fence` over its
//! range; a fence makes the lines stored before it in its range durable,
//! and nothing else (a flush does not: a CPU cache is not the disk's).
//!
//! Locks: `log` is a leaf lock, held across the inner device call (crash
//! tests run on memory devices, where that costs nothing).

use super::BlockDevice;
use super::persistent::{CACHE_LINE, PersistMethod, PersistentMemory};
use parking_lot::Mutex;
use std::io;
use std::sync::Arc;

/// One entry of the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record {
    /// `data` was written at byte `offset` (both sector-aligned).
    Write { offset: u64, data: Vec<u8> },
    /// Every write logged before this one is durable.
    Flush,
    /// Every write logged before this one that lies inside one of these
    /// byte ranges (offset, length) is durable; nothing is said of the
    /// others (`BlockDevice::write_durable`).
    Sync { ranges: Vec<(u64, u64)> },
    /// One cache line (`data`, 64 bytes) stored at device byte `offset`
    /// through a persistent-memory mapping.
    Store { offset: u64, data: Vec<u8> },
    /// Every line stored before this in device bytes `[offset, offset +
    /// len)` is durable.
    Fence { offset: u64, len: u64 },
    /// A workload's marker; not an I/O.
    Mark(String),
}

impl Record {
    /// The bytes a write or a store puts on the device.
    pub fn bytes(&self) -> Option<(u64, &[u8])> {
        match self {
            Record::Write { offset, data } | Record::Store { offset, data } => {
                Some((*offset, data))
            }
            _ => None,
        }
    }
}

pub struct RecordingDevice {
    inner: Arc<dyn BlockDevice>,
    /// Shared with the persistent-memory mappings made of this device.
    log: Arc<Mutex<Vec<Record>>>,
    /// How long a barrier keeps its caller once logged (`with_latency`).
    barrier_latency: std::time::Duration,
}

impl RecordingDevice {
    pub fn new(inner: Arc<dyn BlockDevice>) -> Self {
        RecordingDevice {
            inner,
            log: Arc::new(Mutex::new(Vec::new())),
            barrier_latency: std::time::Duration::ZERO,
        }
    }

    /// Each flush and durable write returns `latency` after it is logged,
    /// as a device's flush takes time: other threads go on meanwhile (the
    /// log stays exact — the barrier is logged when it took effect).
    pub fn with_latency(mut self, latency: std::time::Duration) -> Self {
        self.barrier_latency = latency;
        self
    }

    fn barrier_wait(&self) {
        if !self.barrier_latency.is_zero() {
            std::thread::sleep(self.barrier_latency);
        }
    }

    /// The device underneath, which holds the result of every write.
    pub fn inner(&self) -> &Arc<dyn BlockDevice> {
        &self.inner
    }

    /// Insert a marker at the current position of the log.
    pub fn mark(&self, text: impl Into<String>) {
        self.log.lock().push(Record::Mark(text.into()));
    }

    /// Number of entries logged so far.
    pub fn len(&self) -> usize {
        self.log.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Take the log so far, leaving it empty; `snapshot` runs under the log
    /// lock, so that what it reads of the inner device is exactly the
    /// state before the first entry of the next log.
    pub fn take_log_with<T>(
        &self,
        snapshot: impl FnOnce(&dyn BlockDevice) -> T,
    ) -> (Vec<Record>, T) {
        let mut log = self.log.lock();
        let taken = std::mem::take(&mut *log);
        let value = snapshot(&*self.inner);
        (taken, value)
    }

    /// Take the log so far, leaving it empty.
    pub fn take_log(&self) -> Vec<Record> {
        self.take_log_with(|_| ()).0
    }
}

impl BlockDevice for RecordingDevice {
    fn expect_identity(&self, offset: u64, bytes: &[u8]) {
        self.inner.expect_identity(offset, bytes);
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.inner.read_at(offset, buf)
    }

    fn write_at(&self, offset: u64, buf: &[u8]) -> io::Result<()> {
        let mut log = self.log.lock();
        self.inner.write_at(offset, buf)?;
        debug_assert!(!buf.is_empty(), "empty write at byte {offset}");
        log.push(Record::Write {
            offset,
            data: buf.to_vec(),
        });
        Ok(())
    }

    fn flush(&self) -> io::Result<()> {
        let mut log = self.log.lock();
        self.inner.flush()?;
        log.push(Record::Flush);
        drop(log);
        self.barrier_wait();
        Ok(())
    }

    fn write_back(&self, ranges: &[(u64, u64)]) -> io::Result<()> {
        self.inner.write_back(ranges)
    }

    /// Logged as the write, then a `Sync` of `ranges` and the write's own.
    fn write_durable(&self, offset: u64, buf: &[u8], ranges: &[(u64, u64)]) -> io::Result<()> {
        let mut log = self.log.lock();
        self.inner.write_durable(offset, buf, ranges)?;
        debug_assert!(!buf.is_empty(), "empty write at byte {offset}");
        log.push(Record::Write {
            offset,
            data: buf.to_vec(),
        });
        let mut synced = ranges.to_vec();
        synced.push((offset, buf.len() as u64));
        log.push(Record::Sync { ranges: synced });
        drop(log);
        self.barrier_wait();
        Ok(())
    }

    /// Logged as a `Sync` of the one range.
    fn flush_range(&self, offset: u64, len: u64) -> io::Result<()> {
        let mut log = self.log.lock();
        self.inner.flush_range(offset, len)?;
        log.push(Record::Sync {
            ranges: vec![(offset, len)],
        });
        drop(log);
        self.barrier_wait();
        Ok(())
    }

    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }

    fn is_read_only(&self) -> bool {
        self.inner.is_read_only()
    }

    fn map_persistent(
        &self,
        offset: u64,
        len: u64,
    ) -> io::Result<Option<Arc<dyn PersistentMemory>>> {
        let Some(inner) = self.inner.map_persistent(offset, len)? else {
            return Ok(None);
        };
        Ok(Some(Arc::new(RecordingMapping {
            inner,
            base: offset,
            log: Arc::clone(&self.log),
        })))
    }
}

/// A persistent-memory mapping whose lines and persists are logged.
struct RecordingMapping {
    inner: Arc<dyn PersistentMemory>,
    /// Device byte of the mapping's first byte.
    base: u64,
    log: Arc<Mutex<Vec<Record>>>,
}

impl PersistentMemory for RecordingMapping {
    fn len(&self) -> u64 {
        self.inner.len()
    }

    fn method(&self) -> PersistMethod {
        self.inner.method()
    }

    fn store(&self, offset: u64, bytes: &[u8]) -> io::Result<()> {
        let mut log = self.log.lock();
        self.inner.store(offset, bytes)?;
        for (index, line) in bytes.chunks(CACHE_LINE as usize).enumerate() {
            log.push(Record::Store {
                offset: self.base + offset + (index as u64) * CACHE_LINE,
                data: line.to_vec(),
            });
        }
        Ok(())
    }

    fn persist(&self, offset: u64, len: u64) -> io::Result<()> {
        let mut log = self.log.lock();
        self.inner.persist(offset, len)?;
        log.push(Record::Fence {
            offset: self.base + offset,
            len,
        });
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dev::MemoryDevice;

    #[test]
    fn logs_writes_flushes_and_marks_in_order() {
        let memory = Arc::new(MemoryDevice::new(8192));
        let device = RecordingDevice::new(memory.clone());
        device.write_at(512, &[1; 512]).unwrap();
        device.mark("op 1 ack");
        device.flush().unwrap();
        device.write_at(1024, &[2; 1024]).unwrap();
        let log = device.take_log();
        assert_eq!(
            log,
            vec![
                Record::Write {
                    offset: 512,
                    data: vec![1; 512]
                },
                Record::Mark("op 1 ack".into()),
                Record::Flush,
                Record::Write {
                    offset: 1024,
                    data: vec![2; 1024]
                },
            ]
        );
        assert!(device.is_empty());
        // The writes reached the device underneath.
        let mut back = [0u8; 512];
        memory.read_at(1536, &mut back).unwrap();
        assert_eq!(back, [2; 512]);
    }

    #[test]
    fn stores_are_logged_line_by_line_with_their_fences() {
        let memory = Arc::new(MemoryDevice::new(8192));
        let device = RecordingDevice::new(memory.clone());
        let mapping = device.map_persistent(4096, 1024).unwrap().unwrap();
        mapping.store(64, &[7; 128]).unwrap();
        mapping.persist(64, 128).unwrap();
        assert_eq!(
            device.take_log(),
            vec![
                Record::Store {
                    offset: 4160,
                    data: vec![7; 64]
                },
                Record::Store {
                    offset: 4224,
                    data: vec![7; 64]
                },
                Record::Fence {
                    offset: 4160,
                    len: 128
                },
            ]
        );
        let mut back = [0u8; 512];
        memory.read_at(4096, &mut back).unwrap();
        assert_eq!(&back[64..192], &[7; 128]);
        assert_eq!(back[0], 0);
    }

    #[test]
    fn a_durable_write_logs_the_ranges_it_makes_durable() {
        let device = RecordingDevice::new(Arc::new(MemoryDevice::new(8192)));
        device
            .write_durable(1024, &[3; 512], &[(4096, 1024)])
            .unwrap();
        assert_eq!(
            device.take_log(),
            vec![
                Record::Write {
                    offset: 1024,
                    data: vec![3; 512]
                },
                Record::Sync {
                    ranges: vec![(4096, 1024), (1024, 512)]
                },
            ]
        );
    }

    #[test]
    fn a_failed_write_is_not_logged() {
        let device = RecordingDevice::new(Arc::new(MemoryDevice::new(1024)));
        assert!(device.write_at(1024, &[0; 512]).is_err());
        assert!(device.is_empty());
    }
}
