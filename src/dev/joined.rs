//! A filesystem's device and its external journal's device as one address
//! space: the filesystem's bytes at their own offsets, the journal
//! device's after them from `journal_base` on. The journal layer then
//! addresses an external journal as it addresses an internal one — block
//! numbers on one device, its log and the home blocks it replays — and
//! nothing above this layer has to know that two media are involved.
//!
//! Why a flush is a barrier on both: the write-ahead rule spans the two
//! devices. A commit's log must be durable (journal device) before its
//! blocks go home (filesystem device), and a checkpoint's home writes must
//! be durable before the journal superblock forgets their transactions. A
//! barrier on one of them only would break one of the two orders; the
//! kernel's jbd2 issues a flush to the filesystem's device before it moves
//! the tail of an external log for the same reason.

use super::{BlockDevice, SECTOR_SIZE};
use std::io;
use std::sync::Arc;

/// The filesystem device and, after it, the journal device.
pub struct JoinedDevice {
    fs: Arc<dyn BlockDevice>,
    journal: Arc<dyn BlockDevice>,
    journal_base: u64,
}

/// Byte ranges (offset, length) of one device.
type Ranges = Vec<(u64, u64)>;

/// Which device a byte range lies on, and where on it.
enum Side<'a> {
    Fs(&'a dyn BlockDevice, u64),
    Journal(&'a dyn BlockDevice, u64),
}

impl JoinedDevice {
    /// `journal` placed at byte `journal_base`, a multiple of the sector at
    /// or past the end of `fs`.
    pub fn new(fs: Arc<dyn BlockDevice>, journal: Arc<dyn BlockDevice>, journal_base: u64) -> Self {
        assert!(
            journal_base >= fs.size_bytes() && journal_base.is_multiple_of(SECTOR_SIZE),
            "the journal device overlaps the filesystem's"
        );
        JoinedDevice {
            fs,
            journal,
            journal_base,
        }
    }

    /// The side a range of `len` bytes at `offset` lies on; a range that
    /// crosses from one device into the gap or the other is refused.
    fn side(&self, offset: u64, len: u64) -> io::Result<Side<'_>> {
        let end = offset.checked_add(len);
        match end {
            Some(end) if end <= self.fs.size_bytes() => Ok(Side::Fs(&*self.fs, offset)),
            Some(_) if offset >= self.journal_base => {
                Ok(Side::Journal(&*self.journal, offset - self.journal_base))
            }
            _ => Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!(
                    "access at byte {offset} (+{len}) is on neither the filesystem's device \
                     nor the journal's"
                ),
            )),
        }
    }

    /// `ranges` split by device, each in that device's own offsets.
    fn split(&self, ranges: &[(u64, u64)]) -> io::Result<(Ranges, Ranges)> {
        let (mut fs, mut journal) = (Vec::new(), Vec::new());
        for &(offset, len) in ranges {
            match self.side(offset, len)? {
                Side::Fs(_, at) => fs.push((at, len)),
                Side::Journal(_, at) => journal.push((at, len)),
            }
        }
        Ok((fs, journal))
    }
}

impl BlockDevice for JoinedDevice {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        match self.side(offset, buf.len() as u64)? {
            Side::Fs(dev, at) | Side::Journal(dev, at) => dev.read_at(at, buf),
        }
    }

    fn write_at(&self, offset: u64, buf: &[u8]) -> io::Result<()> {
        match self.side(offset, buf.len() as u64)? {
            Side::Fs(dev, at) | Side::Journal(dev, at) => dev.write_at(at, buf),
        }
    }

    fn write_pieces_at(&self, offset: u64, pieces: &[&[u8]]) -> io::Result<()> {
        let len = pieces.iter().map(|piece| piece.len() as u64).sum();
        match self.side(offset, len)? {
            Side::Fs(dev, at) | Side::Journal(dev, at) => dev.write_pieces_at(at, pieces),
        }
    }

    /// Both devices (see the module's preamble). The journal's first: a
    /// caller that flushes after a commit block wants its log durable.
    fn flush(&self) -> io::Result<()> {
        if !crate::faults::active(crate::faults::Fault::ExternalJournalUnflushed) {
            self.journal.flush()?;
        }
        self.fs.flush()
    }

    fn write_back(&self, ranges: &[(u64, u64)]) -> io::Result<()> {
        let (fs, journal) = self.split(ranges)?;
        self.fs.write_back(&fs)?;
        self.journal.write_back(&journal)
    }

    /// A durable write and the ranges it carries (`carried`).
    fn write_durable(&self, offset: u64, buf: &[u8], ranges: &[(u64, u64)]) -> io::Result<()> {
        self.carried(offset, buf.len(), ranges, |dev, at, ranges| {
            dev.write_durable(at, buf, ranges)
        })
    }

    fn sync_ranges(&self, ranges: &[(u64, u64)], spare: (u64, &[u8])) -> io::Result<()> {
        self.carried(spare.0, spare.1.len(), ranges, |dev, at, ranges| {
            dev.sync_ranges(ranges, (at, spare.1))
        })
    }

    /// The joined space: the journal device ends it.
    fn size_bytes(&self) -> u64 {
        self.journal_base + self.journal.size_bytes()
    }

    fn is_read_only(&self) -> bool {
        self.fs.is_read_only() || self.journal.is_read_only()
    }

    fn read_uncached(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        match self.side(offset, buf.len() as u64)? {
            Side::Fs(dev, at) | Side::Journal(dev, at) => dev.read_uncached(at, buf),
        }
    }

    fn write_uncached(&self, offset: u64, buf: &[u8]) -> io::Result<()> {
        match self.side(offset, buf.len() as u64)? {
            Side::Fs(dev, at) | Side::Journal(dev, at) => dev.write_uncached(at, buf),
        }
    }

    fn expect_identity(&self, offset: u64, bytes: &[u8]) {
        self.fs.expect_identity(offset, bytes);
    }
}

impl JoinedDevice {
    /// A barrier carried by a write of `len` bytes at `offset`, over
    /// `ranges`: the ranges on the other device than the write's are
    /// flushed there first (a commit's file data, on the filesystem's,
    /// before its commit block, on the journal's), then `carry` makes the
    /// write durable with the ranges on its own device.
    fn carried(
        &self,
        offset: u64,
        len: usize,
        ranges: &[(u64, u64)],
        carry: impl FnOnce(&dyn BlockDevice, u64, &[(u64, u64)]) -> io::Result<()>,
    ) -> io::Result<()> {
        let (fs, journal) = self.split(ranges)?;
        match self.side(offset, len as u64)? {
            Side::Journal(dev, at) => {
                if !fs.is_empty() {
                    self.fs.flush()?;
                }
                carry(dev, at, &journal)
            }
            Side::Fs(dev, at) => {
                if !journal.is_empty() {
                    self.flush_journal()?;
                }
                carry(dev, at, &fs)
            }
        }
    }

    fn flush_journal(&self) -> io::Result<()> {
        match crate::faults::active(crate::faults::Fault::ExternalJournalUnflushed) {
            true => Ok(()),
            false => self.journal.flush(),
        }
    }
}

/// A byte range of another device as a device of its own: the crash tests
/// put a filesystem and its external journal side by side on one recorded
/// device, each a window of it, so that the crash-state generator sees the
/// writes of both in the order they completed. A flush makes durable the
/// window's writes only, as a flush of one of two disks would.
pub struct WindowDevice {
    inner: Arc<dyn BlockDevice>,
    base: u64,
    len: u64,
}

impl WindowDevice {
    /// Bytes `[base, base + len)` of `inner`, both multiples of the sector.
    pub fn new(inner: Arc<dyn BlockDevice>, base: u64, len: u64) -> Self {
        assert!(
            base.is_multiple_of(SECTOR_SIZE)
                && len.is_multiple_of(SECTOR_SIZE)
                && base + len <= inner.size_bytes(),
            "a window outside its device"
        );
        WindowDevice { inner, base, len }
    }

    fn inside(&self, offset: u64, len: u64) -> io::Result<u64> {
        super::check_range(offset, len as usize, self.len)?;
        Ok(self.base + offset)
    }

    fn shifted(&self, ranges: &[(u64, u64)]) -> io::Result<Vec<(u64, u64)>> {
        ranges
            .iter()
            .map(|&(offset, len)| Ok((self.inside(offset, len)?, len)))
            .collect()
    }
}

impl BlockDevice for WindowDevice {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.inner
            .read_at(self.inside(offset, buf.len() as u64)?, buf)
    }

    fn write_at(&self, offset: u64, buf: &[u8]) -> io::Result<()> {
        self.inner
            .write_at(self.inside(offset, buf.len() as u64)?, buf)
    }

    /// The window's writes only: a ranged barrier over the whole window.
    fn flush(&self) -> io::Result<()> {
        self.inner.flush_range(self.base, self.len)
    }

    fn write_durable(&self, offset: u64, buf: &[u8], ranges: &[(u64, u64)]) -> io::Result<()> {
        let at = self.inside(offset, buf.len() as u64)?;
        self.inner.write_durable(at, buf, &self.shifted(ranges)?)
    }

    fn sync_ranges(&self, ranges: &[(u64, u64)], spare: (u64, &[u8])) -> io::Result<()> {
        let at = self.inside(spare.0, spare.1.len() as u64)?;
        self.inner
            .sync_ranges(&self.shifted(ranges)?, (at, spare.1))
    }

    fn size_bytes(&self) -> u64 {
        self.len
    }

    fn is_read_only(&self) -> bool {
        self.inner.is_read_only()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dev::{MemoryDevice, Record, RecordingDevice};

    const MIB: u64 = 1 << 20;

    /// A recorded 3 MiB device: the filesystem its first 2 MiB, the
    /// journal the last, joined again at byte 2 MiB.
    fn joined() -> (Arc<RecordingDevice>, JoinedDevice) {
        let recording = Arc::new(RecordingDevice::new(Arc::new(MemoryDevice::new(
            3 * MIB as usize,
        ))));
        let inner: Arc<dyn BlockDevice> = recording.clone();
        let fs = Arc::new(WindowDevice::new(Arc::clone(&inner), 0, 2 * MIB));
        let journal = Arc::new(WindowDevice::new(inner, 2 * MIB, MIB));
        (recording, JoinedDevice::new(fs, journal, 2 * MIB))
    }

    #[test]
    fn writes_land_on_their_own_device() {
        let (recording, joined) = joined();
        joined.write_at(4096, &[1; 512]).unwrap();
        joined.write_at(2 * MIB + 1024, &[2; 512]).unwrap();
        let log = recording.take_log();
        let offsets: Vec<u64> = log
            .iter()
            .filter_map(|r| r.bytes())
            .map(|(o, _)| o)
            .collect();
        assert_eq!(offsets, [4096, 2 * MIB + 1024]);
        let mut back = [0u8; 512];
        joined.read_at(2 * MIB + 1024, &mut back).unwrap();
        assert_eq!(back, [2; 512]);
        assert_eq!(joined.size_bytes(), 3 * MIB);
    }

    #[test]
    fn a_range_across_the_two_devices_is_refused() {
        let (_, joined) = joined();
        let error = joined.write_at(2 * MIB - 512, &[0; 1024]).unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::UnexpectedEof);
    }

    #[test]
    fn a_flush_is_a_barrier_on_both_windows() {
        let (recording, joined) = joined();
        joined.flush().unwrap();
        let synced: Vec<Vec<(u64, u64)>> = recording
            .take_log()
            .into_iter()
            .filter_map(|record| match record {
                Record::Sync { ranges } => Some(ranges),
                _ => None,
            })
            .collect();
        assert_eq!(synced, [vec![(2 * MIB, MIB)], vec![(0, 2 * MIB)]]);
    }

    #[test]
    fn a_durable_journal_write_flushes_the_filesystem_ranges_it_carries() {
        let (recording, joined) = joined();
        joined
            .write_durable(2 * MIB, &[3; 512], &[(8192, 4096), (2 * MIB + 512, 512)])
            .unwrap();
        let log = recording.take_log();
        // The filesystem's window flushed first, then the write with the
        // journal's own range, in the journal's offsets made absolute.
        assert!(matches!(&log[0], Record::Sync { ranges } if ranges == &[(0, 2 * MIB)]));
        assert!(matches!(&log[1], Record::Write { offset, .. } if *offset == 2 * MIB));
        assert!(
            matches!(&log[2], Record::Sync { ranges } if ranges == &[(2 * MIB + 512, 512), (2 * MIB, 512)])
        );
    }
}
