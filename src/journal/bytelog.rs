//! ByteLog: fast commits written through a persistent-memory mapping of the
//! fast-commit area (`-o bytelog`; the records' format is
//! `format::bytelog`'s, the ordering rules are the ones below).
//!
//! The area `[first, end)` (the block the kernel reads past it stays zero,
//! as without ByteLog) is mapped once at mount and split: its first eighth
//! (at least one block) holds the ordinary stream, one 64-byte line per
//! fast commit — `[HEAD] ANCHOR TAIL`, the TAIL running to the line's end —
//! and the rest is the ring.
//!
//! One fast commit, in this order:
//! 1. when its records expose data written since the last flush, a device
//!    flush (the write-ahead rule is the same as without ByteLog: data a
//!    record maps is durable before the TAIL that makes the record count);
//! 2. its records are stored in the ring from where the last one ended and
//!    persisted (written back and fenced): durable before anything names
//!    them;
//! 3. the line `[HEAD] ANCHOR TAIL` is stored in the ordinary stream and
//!    persisted: from here on replay applies the fast commit, and the
//!    fsync may return.
//!
//! A crash before 3 is durable leaves a line that is all old (the scan
//! stops there: an older transaction's TAIL, zeros) or torn, which its
//! TAIL's CRC rejects; records without their anchor are never read. A crash
//! after 3 finds every record line durable (2 came first). Replay checks
//! all of it anyway (`format::bytelog::read_window`), so a broken order
//! shows up as lost fast commits in the crash tests rather than as wrong
//! data.
//!
//! A full commit retires the area (`Jbd2::retire_area`): the next fast
//! commit starts both streams over with a HEAD, and the first line is
//! zeroed once the commit block is durable. Seqs go on across retirements:
//! a record left from an earlier round never carries the seq replay expects.
//!
//! Lock: `position` is a leaf lock; only the holder of the fast-commit slot
//! and the commit thread's retirement (no slot exists then) take it.

use super::fc_commit::Written;
use super::recovery::JournalArea;
use crate::dev::{BlockDevice, PersistMethod, PersistentMemory};
use crate::error::{Error, Result};
use crate::faults::{self, Fault};
use crate::format::bytelog::{LINE, RingBuilder};
use crate::format::fast_commit::{AreaBuilder, Record};
use parking_lot::Mutex;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// The ordinary stream's share of the area: one part in this many.
const STREAM_SHARE: u32 = 8;

pub(crate) struct ByteLog {
    memory: Arc<dyn PersistentMemory>,
    /// Bytes of the ordinary stream; the ring follows it.
    stream_bytes: u64,
    ring_bytes: u64,
    /// Blocks of the ordinary stream: the ring's first block, relative to
    /// the area's (what anchors name).
    ring_block: u32,
    position: Mutex<Position>,
    /// Persists (cache-line write-back and fence, or msync) issued.
    pub persists: AtomicU64,
}

#[derive(Debug, Default)]
struct Position {
    /// Next byte of the ordinary stream and of the ring.
    stream: u64,
    ring: u64,
    /// Seq of the next ring record.
    seq: u32,
}

impl ByteLog {
    /// Map journal blocks `[first, end)` of `area`, which must lie in one
    /// run on the device (mke2fs makes journals contiguous).
    pub fn map(area: &JournalArea, first: u32, end: u32) -> Result<ByteLog> {
        let blocks = &area.blocks[first as usize..end as usize];
        let contiguous = blocks.windows(2).all(|pair| pair[1] == pair[0] + 1);
        if blocks.len() < 2 || !contiguous {
            return Err(Error::Unsupported(
                "bytelog: the journal's fast-commit area is not one run of blocks on the device"
                    .into(),
            ));
        }
        let block_size = area.fs_block_size as u64;
        let len = blocks.len() as u64 * block_size;
        let memory = area
            .dev
            .map_persistent(blocks[0] * block_size, len)?
            .ok_or_else(|| {
                Error::Unsupported(
                    "bytelog: the device cannot be memory-mapped (it needs an image file or a \
                     block device opened read-write)"
                        .into(),
                )
            })?;
        let ring_block = (blocks.len() as u32 / STREAM_SHARE).max(1);
        let stream_bytes = ring_block as u64 * block_size;
        debug_assert!(stream_bytes < len);
        tracing::info!(
            method = %memory.method(),
            stream_bytes,
            ring_bytes = len - stream_bytes,
            "ByteLog mapped"
        );
        Ok(ByteLog {
            memory,
            stream_bytes,
            ring_bytes: len - stream_bytes,
            ring_block,
            position: Mutex::new(Position::default()),
            persists: AtomicU64::new(0),
        })
    }

    pub fn method(&self) -> PersistMethod {
        self.memory.method()
    }

    /// Write one fast commit of `records` for transaction `tid` (`head`:
    /// the first since the area was retired). `data_first`: the records
    /// expose data written since the last flush, which `dev.flush()` makes
    /// durable first. None when the area has no room (nothing was written).
    pub fn write(
        &self,
        dev: &dyn BlockDevice,
        tid: u32,
        head: bool,
        records: &[Record],
        data_first: bool,
    ) -> Result<Option<Written>> {
        let mut position = self.position.lock();
        debug_assert_eq!(head, position.stream == 0, "HEAD opens the stream");
        let mut ring = RingBuilder::new(tid, position.ring as u32, position.seq);
        for record in records {
            ring.add(record);
        }
        let (ring_bytes, anchor) = ring.finish(self.ring_block);
        let mut line = AreaBuilder::new(LINE);
        if head {
            line.add(&Record::Head { features: 0, tid });
        }
        line.add(&Record::Anchor(anchor));
        line.tail(tid);
        let record_bytes = line.record_bytes() + ring_bytes.len();
        let line = line.finish();
        let line = line.bytes();
        debug_assert_eq!(line.len(), LINE, "[HEAD] ANCHOR TAIL fit one line");
        if position.stream + LINE as u64 > self.stream_bytes
            || position.ring + ring_bytes.len() as u64 > self.ring_bytes
        {
            return Ok(None);
        }
        let stream_at = position.stream;
        let ring_at = self.stream_bytes + position.ring;
        // Counted before any I/O: after an error part of it may be stored,
        // and the next fast commit must not mix with it.
        position.stream += LINE as u64;
        position.ring += ring_bytes.len() as u64;
        position.seq = position.seq.wrapping_add(anchor.count);
        let mut written = Written {
            record_bytes,
            area_bytes: (ring_bytes.len() + line.len()) as u64,
            flushes: 0,
            persists: 0,
        };
        if data_first {
            dev.flush()?;
            written.flushes += 1;
        }
        if !ring_bytes.is_empty() {
            self.memory.store(ring_at, &ring_bytes)?;
            if !faults::active(Fault::ByteLogPayloadUnfenced) {
                self.persist(ring_at, ring_bytes.len() as u64, &mut written)?;
            }
        }
        self.memory.store(stream_at, line)?;
        self.persist(stream_at, LINE as u64, &mut written)?;
        Ok(Some(written))
    }

    fn persist(&self, offset: u64, len: u64, written: &mut Written) -> Result<()> {
        self.memory.persist(offset, len)?;
        self.persists.fetch_add(1, Ordering::Relaxed);
        written.persists += 1;
        Ok(())
    }

    /// A full commit's commit block is durable: every fast commit is
    /// spent. Start over, and zero the stream's first line if it was used
    /// (no scan then finds a HEAD for the transaction just committed).
    pub fn retire(&self) -> Result<()> {
        let mut position = self.position.lock();
        if position.stream == 0 {
            return Ok(());
        }
        position.stream = 0;
        position.ring = 0;
        self.memory.store(0, &[0u8; LINE])?;
        self.memory.persist(0, LINE as u64)?;
        self.persists.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}
