//! Recovery is crash-safe and idempotent: a crash after any write of a
//! recovery (optionally tearing that write at a sector boundary) leaves an
//! image that a second recovery brings to the same result as an
//! uninterrupted one.

mod common;

use common::journal::*;
use jext4::engine::dev::{BlockDevice, MemoryDevice};
use jext4::engine::fs::{needs_recovery, recover_journal};
use jext4::engine::journal::format::JournalSuperblock;
use jext4::engine::journal::recovery::JournalArea;
use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// A memory device that accepts `writes_left` writes, then fails every
/// write and flush: the machine died. With `tear`, the fatal write still
/// puts its first sector on the disk.
struct CrashingDevice {
    inner: MemoryDevice,
    writes_left: AtomicUsize,
    writes_done: AtomicUsize,
    tear: bool,
}

impl CrashingDevice {
    fn new(bytes: Vec<u8>, writes_left: usize, tear: bool) -> Self {
        CrashingDevice {
            inner: MemoryDevice::from_bytes(bytes),
            writes_left: AtomicUsize::new(writes_left),
            writes_done: AtomicUsize::new(0),
            tear,
        }
    }

    fn crashed() -> io::Error {
        io::Error::other("simulated crash")
    }
}

impl BlockDevice for CrashingDevice {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.inner.read_at(offset, buf)
    }

    fn write_at(&self, offset: u64, buf: &[u8]) -> io::Result<()> {
        let left = self.writes_left.load(Ordering::SeqCst);
        if left == 0 {
            // The primary superblock spans two sectors and carries its
            // checksum in the second: a torn write of it is the format's
            // own hazard (kernel and e2fsck alike), not recovery's.
            if self.tear && buf.len() > 512 && offset != 1024 {
                self.inner.write_at(offset, &buf[..512])?;
            }
            return Err(Self::crashed());
        }
        self.writes_left.store(left - 1, Ordering::SeqCst);
        self.writes_done.fetch_add(1, Ordering::SeqCst);
        self.inner.write_at(offset, buf)
    }

    fn flush(&self) -> io::Result<()> {
        if self.writes_left.load(Ordering::SeqCst) == 0 {
            return Err(Self::crashed());
        }
        Ok(())
    }

    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }
}

/// Recover `bytes`, crashing after `writes` writes; then recover again.
/// Returns the final image.
fn crash_then_recover(
    bytes: &[u8],
    block_size: u32,
    blocks: &[u64],
    writes: usize,
    tear: bool,
) -> Vec<u8> {
    let device = Arc::new(CrashingDevice::new(bytes.to_vec(), writes, tear));
    let area = JournalArea::new(device.clone(), block_size, blocks.to_vec());
    let crashed = recover_journal(&area);
    assert!(crashed.is_err(), "no crash after {writes} writes");
    let (memory, area) = memory_area(device.inner.snapshot(), block_size, blocks.to_vec());
    let report = recover_journal(&area)
        .unwrap_or_else(|e| panic!("recovery after a crash at write {writes}: {e}"));
    assert!(!needs_recovery(&*area.dev).unwrap());
    assert!(report.problem.is_none(), "{report:?}");
    memory.snapshot()
}

fn check_every_crash_point(image: &std::path::Path, stride: usize) {
    let bytes = std::fs::read(image).unwrap();
    let block_size = fs_superblock(image).block_size();
    let blocks = journal_blocks_from_debugfs(image);
    // The uninterrupted run, counting its writes.
    let counting = Arc::new(CrashingDevice::new(bytes.clone(), usize::MAX, false));
    let area = JournalArea::new(counting.clone(), block_size, blocks.clone());
    let reference_report = recover_journal(&area).unwrap();
    let total_writes = counting.writes_done.load(Ordering::SeqCst);
    assert!(total_writes > reference_report.blocks_replayed as usize);
    let reference = counting.inner.snapshot();
    let journal_superblock_block = blocks[0];
    let block_size = block_size as usize;
    let mut checked = 0;
    for writes in (0..total_writes).step_by(stride) {
        for tear in [false, true] {
            let result = crash_then_recover(&bytes, block_size as u32, &blocks, writes, tear);
            let mut differing =
                differences_outside_primary_superblock(&reference, &result, block_size);
            // A crash after the journal reset makes the second run start
            // the log one tid later; nothing else may differ.
            differing.retain(|&block| block != journal_superblock_block);
            assert!(
                differing.is_empty(),
                "crash at write {writes} (tear {tear}): blocks {differing:?} differ"
            );
            let at = journal_superblock_block as usize * block_size;
            let journal = JournalSuperblock::decode(&result[at..at + block_size]).unwrap();
            assert_eq!(journal.start, 0);
            let next = reference_report.next_tid;
            assert!(
                journal.sequence == next || journal.sequence == next + 1,
                "crash at write {writes}: sequence {} (expected {next})",
                journal.sequence
            );
            checked += 1;
        }
    }
    assert!(checked >= 2);
    // And e2fsck agrees with the result of a crash in the middle.
    let middle = crash_then_recover(&bytes, block_size as u32, &blocks, total_writes / 2, true);
    let path = image.with_extension("middle.img");
    std::fs::write(&path, middle).unwrap();
    let (code, text) = run("e2fsck", &["-fn", path.to_str().unwrap()]);
    assert_eq!(code, 0, "{text}");
}

#[test]
fn debugfs_journal_recovery_survives_a_crash_at_every_write() {
    if !common::require_tool("debugfs") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = common::mkfs(dir.path(), "crash", 8, &["-t", "ext4", "-b", "1024"]);
    let free = free_blocks(&image, 40, 1000);
    let data = image.with_extension("data");
    data_file(&data, 1024, 40, 3, &[2]);
    let list = |blocks: &[u64]| {
        blocks
            .iter()
            .map(u64::to_string)
            .collect::<Vec<_>>()
            .join(",")
    };
    let commands = format!(
        "jo -c\njw -b {} {}\njw -r {}\njw -b {} {}\njc\n",
        list(&free[..30]),
        data.display(),
        list(&free[..4]),
        list(&free[20..40]),
        data.display()
    );
    debugfs_commands(&image, &commands);
    check_every_crash_point(&image, 1);
}

#[test]
fn kernel_journal_recovery_survives_crashes() {
    if !kernel_available() {
        return;
    }
    let _kernel = kernel_lock();
    let dir = tempfile::tempdir().unwrap();
    let image = common::mkfs(dir.path(), "kcrash", 16, &["-t", "ext4", "-b", "1024"]);
    let crash = kernel_crash_image(&image, "commit=1", std::time::Duration::ZERO, |root| {
        metadata_workload(root, 0, 60);
        commit_now(root);
        metadata_workload(root, 1, 40);
        commit_now(root);
    });
    check_every_crash_point(&crash, 7);
}
