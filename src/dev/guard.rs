//! The write-ahead guard: a device filter that refuses in-place writes of
//! blocks whose latest change is in a transaction whose commit record is not
//! yet durable.
//!
//! The journal pins a block when a transaction registers it and unpins the
//! transaction's blocks once its commit block is flushed. Any write to a
//! pinned block's home location through this filter is a violation of the
//! write-ahead rule: in debug builds it panics (a bug to find); in release
//! builds the write is kept aside in the "lifeboat" until the pinning
//! transaction is durable, then performed, and counted.
//!
//! Checkpoint writes carry the transaction whose content they write
//! (`write_committed`): that transaction must be durable, whatever newer
//! transaction pins the block meanwhile.
//!
//! Journal log writes never go through the filter (`raw`).
//!
//! Locks: `state` is a leaf lock, held only for map updates, never across
//! I/O.

use super::BlockDevice;
use crate::faults::{self, Fault};
use crate::hash::NumberMap;
use parking_lot::Mutex;
use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

struct GuardState {
    /// Block → the newest transaction that registered it and is not durable.
    pinned: NumberMap<u64, u32>,
    /// Writes held back, by block: (pinning transaction, byte offset, data).
    lifeboat: Vec<(u32, u64, Vec<u8>)>,
    /// File data held back until the next commit is durable: only under
    /// `Fault::DeferOrderedData` (crash tests), always empty otherwise.
    deferred: Vec<(u64, Vec<u8>)>,
}

pub struct GuardedDevice {
    inner: Arc<dyn BlockDevice>,
    block_size: u64,
    state: Mutex<GuardState>,
    /// The newest transaction whose commit record is durable.
    durable_tid: AtomicU64,
    violations: AtomicU64,
}

/// Transaction ids wrap; compare them the way JBD2 does.
fn tid_after(a: u32, b: u32) -> bool {
    (a.wrapping_sub(b) as i32) > 0
}

impl GuardedDevice {
    pub fn new(inner: Arc<dyn BlockDevice>, block_size: u32) -> Self {
        GuardedDevice {
            inner,
            block_size: block_size as u64,
            state: Mutex::new(GuardState {
                pinned: NumberMap::default(),
                lifeboat: Vec::new(),
                deferred: Vec::new(),
            }),
            durable_tid: AtomicU64::new(u64::MAX),
            violations: AtomicU64::new(0),
        }
    }

    /// The unfiltered device, for writes into the journal area.
    pub fn raw(&self) -> &Arc<dyn BlockDevice> {
        &self.inner
    }

    /// `block`'s newest content belongs to transaction `tid`.
    pub fn pin(&self, block: u64, tid: u32) {
        self.state.lock().pinned.insert(block, tid);
    }

    /// Transaction `tid` is durable: release what it pinned (blocks a newer
    /// transaction pinned stay pinned) and perform held-back writes.
    pub fn mark_durable(&self, tid: u32) -> io::Result<()> {
        self.durable_tid.store(tid as u64, Ordering::Release);
        let released = {
            let mut state = self.state.lock();
            state.pinned.retain(|_, pinned| tid_after(*pinned, tid));
            let (ready, waiting): (Vec<_>, Vec<_>) = std::mem::take(&mut state.lifeboat)
                .into_iter()
                .partition(|(pinned, _, _)| !tid_after(*pinned, tid));
            state.lifeboat = waiting;
            ready
        };
        for (_, offset, data) in released {
            self.inner.write_at(offset, &data)?;
        }
        let deferred = std::mem::take(&mut self.state.lock().deferred);
        for (offset, data) in deferred {
            self.inner.write_at(offset, &data)?;
        }
        Ok(())
    }

    /// `Fault::DeferOrderedData`: hold a data write back until the next
    /// commit is durable (breaking data=ordered on purpose).
    fn defer(&self, offset: u64, buf: &[u8]) -> io::Result<()> {
        self.state.lock().deferred.push((offset, buf.to_vec()));
        Ok(())
    }

    /// Reads see held-back data writes, oldest first, as the page cache
    /// would show them.
    fn read_deferred(&self, offset: u64, buf: &mut [u8]) {
        let state = self.state.lock();
        let end = offset + buf.len() as u64;
        for (at, data) in &state.deferred {
            let (from, to) = ((*at).max(offset), (*at + data.len() as u64).min(end));
            if from < to {
                let source = &data[(from - at) as usize..(to - at) as usize];
                buf[(from - offset) as usize..(to - offset) as usize].copy_from_slice(source);
            }
        }
    }

    fn is_durable(&self, tid: u32) -> bool {
        let durable = self.durable_tid.load(Ordering::Acquire);
        durable != u64::MAX && !tid_after(tid, durable as u32)
    }

    /// A checkpoint write: `data` is the content transaction `tid` logged.
    pub fn write_committed(&self, offset: u64, data: &[u8], tid: u32) -> io::Result<()> {
        debug_assert!(
            self.is_durable(tid),
            "write-ahead rule: checkpoint of transaction {tid} before its commit is durable"
        );
        if !self.is_durable(tid) {
            self.violations.fetch_add(1, Ordering::Relaxed);
            self.state
                .lock()
                .lifeboat
                .push((tid, offset, data.to_vec()));
            return Ok(());
        }
        self.inner.write_at(offset, data)
    }

    /// Times the write-ahead rule would have been broken (release builds
    /// keep those writes in the lifeboat instead).
    pub fn violations(&self) -> u64 {
        self.violations.load(Ordering::Relaxed)
    }

    fn pinned_by(&self, offset: u64, len: usize) -> Option<u32> {
        let first = offset / self.block_size;
        let last = (offset + len as u64).div_ceil(self.block_size);
        let state = self.state.lock();
        if state.pinned.is_empty() {
            return None;
        }
        (first..last).find_map(|block| state.pinned.get(&block).copied())
    }
}

impl BlockDevice for GuardedDevice {
    fn expect_identity(&self, offset: u64, bytes: &[u8]) {
        self.inner.expect_identity(offset, bytes);
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.inner.read_at(offset, buf)?;
        if faults::active(Fault::DeferOrderedData) {
            self.read_deferred(offset, buf);
        }
        Ok(())
    }

    /// File data and other home writes: refused while a block in the range
    /// is pinned by a transaction that is not durable.
    fn write_at(&self, offset: u64, buf: &[u8]) -> io::Result<()> {
        if faults::active(Fault::DeferOrderedData) {
            return self.defer(offset, buf);
        }
        if let Some(tid) = self.pinned_by(offset, buf.len()) {
            debug_assert!(
                false,
                "write-ahead rule: home write at byte {offset} over a block pinned by transaction {tid}"
            );
            self.violations.fetch_add(1, Ordering::Relaxed);
            self.state.lock().lifeboat.push((tid, offset, buf.to_vec()));
            return Ok(());
        }
        self.inner.write_at(offset, buf)
    }

    /// Refused over a pinned block like `write_at`, over the whole range:
    /// a held-back or deferred run goes through `write_at` in one piece.
    fn write_pieces_at(&self, offset: u64, pieces: &[&[u8]]) -> io::Result<()> {
        let len = pieces.iter().map(|piece| piece.len()).sum();
        if faults::active(Fault::DeferOrderedData) || self.pinned_by(offset, len).is_some() {
            return self.write_at(offset, &pieces.concat());
        }
        self.inner.write_pieces_at(offset, pieces)
    }

    fn flush(&self) -> io::Result<()> {
        self.inner.flush()
    }

    fn write_back(&self, ranges: &[(u64, u64)]) -> io::Result<()> {
        self.inner.write_back(ranges)
    }

    /// A home write like `write_at` (refused over a pinned block), made
    /// durable with `ranges`.
    fn write_durable(&self, offset: u64, buf: &[u8], ranges: &[(u64, u64)]) -> io::Result<()> {
        if faults::active(Fault::DeferOrderedData) || self.pinned_by(offset, buf.len()).is_some() {
            // Held back: what is on the device is made durable in full.
            self.write_at(offset, buf)?;
            return self.inner.flush();
        }
        self.inner.write_durable(offset, buf, ranges)
    }

    /// Like `write_durable` (the spare block is a journal block, never
    /// pinned, but held the same way if it were).
    fn sync_ranges(&self, ranges: &[(u64, u64)], spare: (u64, &[u8])) -> io::Result<()> {
        let (offset, buf) = spare;
        if faults::active(Fault::DeferOrderedData) || self.pinned_by(offset, buf.len()).is_some() {
            self.write_at(offset, buf)?;
            return self.inner.flush();
        }
        self.inner.sync_ranges(ranges, spare)
    }

    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }

    fn is_read_only(&self) -> bool {
        self.inner.is_read_only()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dev::MemoryDevice;

    #[test]
    fn pins_release_on_durability_and_keep_newer_pins() {
        let guard = GuardedDevice::new(Arc::new(MemoryDevice::new(64 * 1024)), 1024);
        guard.pin(3, 10);
        guard.pin(4, 11);
        assert_eq!(guard.pinned_by(3 * 1024, 1024), Some(10));
        guard.mark_durable(10).unwrap();
        assert_eq!(guard.pinned_by(3 * 1024, 1024), None);
        assert_eq!(guard.pinned_by(4 * 1024, 1024), Some(11));
        guard.write_committed(3 * 1024, &[1; 1024], 10).unwrap();
        guard.write_at(5 * 1024, &[2; 1024]).unwrap();
        assert_eq!(guard.violations(), 0);
    }

    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "write-ahead rule")]
    fn home_write_of_a_pinned_block_panics_in_debug_builds() {
        let guard = GuardedDevice::new(Arc::new(MemoryDevice::new(64 * 1024)), 1024);
        guard.pin(7, 3);
        let _ = guard.write_at(7 * 1024, &[0; 1024]);
    }

    #[test]
    fn tid_comparison_wraps() {
        assert!(tid_after(1, u32::MAX));
        assert!(!tid_after(u32::MAX, 1));
    }
}
