//! Multi-mount protection (the `mmp` feature), as the kernel's
//! fs/ext4/mmp.c and e2fsprogs' lib/ext2fs/mmp.c do it, so that jext4 and
//! the kernel (or e2fsck, or jext4 on another machine sharing the disk)
//! refuse each other's live filesystems.
//!
//! Claim at a read-write mount (`ext4_multi_mount_protect`): read the MMP
//! block; a clean sequence goes on at once, e2fsck's sequence refuses,
//! anything else is a live updater — wait (twice the check interval plus a
//! second) and read again: if it changed, refuse, naming the node and
//! device. Then write a random sequence with our node and device names,
//! wait as long again, and read it back: someone else's sequence means two
//! claimed at once, and we refuse. Then a heartbeat thread (`kmmpd`)
//! rewrites the block with the next sequence every `s_mmp_update_interval`
//! seconds; when it was late by more than the check interval it reads the
//! block back first, and another node's sequence there aborts the
//! filesystem ("multiply mounted"). Unmount writes the clean sequence.
//!
//! The block is read and written on the raw device, never through the
//! buffer cache (it belongs to whoever updates it, not to a transaction),
//! and past the page cache of a block device (`read_uncached`: O_DIRECT,
//! as e2fsprogs opens it), which writes by another node would not update.
//! (The design puts exclusivity in dev/; MMP needs the superblock's fields
//! and checksum seed, so its protocol lives here, beside mount.)

use crate::dev::BlockDevice;
use crate::error::{Error, Result};
use crate::format::mmp::{self, CHECK_MULT, MAX_CHECK_INTERVAL, MIN_CHECK_INTERVAL, Mmp};
use crate::format::superblock::{Geometry, Superblock};
use parking_lot::{Condvar, Mutex};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// What the heartbeat calls when another node took the block: abort.
pub(crate) type ConflictHandler = Box<dyn Fn(&str) + Send + Sync>;

struct Shared {
    dev: Arc<dyn BlockDevice>,
    block: u64,
    block_size: usize,
    seed: Option<u32>,
    update_interval: Duration,
    nodename: String,
    bdevname: String,
    /// Set to stop the heartbeat.
    stop: Mutex<bool>,
    wake: Condvar,
    on_conflict: Mutex<Option<ConflictHandler>>,
}

/// A claimed MMP block and its heartbeat; `stop` (or drop) writes the clean
/// sequence.
pub(crate) struct Protection {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl Shared {
    fn read(&self) -> Result<Mmp> {
        let mut bytes = vec![0u8; self.block_size];
        self.dev
            .read_uncached(self.block * self.block_size as u64, &mut bytes)?;
        Mmp::decode(&bytes, self.block, self.seed)
    }

    fn write(&self, seq: u32, check_interval: u16) -> Result<()> {
        let mmp = Mmp::new(
            seq,
            now_seconds(),
            &self.nodename,
            &self.bdevname,
            check_interval,
        );
        let mut bytes = vec![0u8; self.block_size];
        // The rest of the block is whatever was there (kernel: the whole
        // buffer is written back as read); only the structure matters.
        let offset = self.block * self.block_size as u64;
        self.dev.read_uncached(offset, &mut bytes)?;
        mmp.encode(&mut bytes, self.seed);
        self.dev.write_uncached(offset, &bytes)?;
        Ok(())
    }

    /// Wait `wait`, then refuse if the block no longer holds `seq`: someone
    /// else updates it.
    fn wait_unchanged(&self, seq: u32, wait: Duration, why: &str) -> Result<()> {
        tracing::info!(seconds = wait.as_secs(), "multi-mount protection: {why}");
        std::thread::sleep(wait);
        let found = self.read()?;
        if found.seq != seq {
            return Err(in_use(&found, "the filesystem is in use on another node"));
        }
        Ok(())
    }

    /// Sleep `duration` unless stopped first; true when stopped.
    fn sleep(&self, duration: Duration) -> bool {
        let deadline = Instant::now() + duration;
        let mut stopped = self.stop.lock();
        while !*stopped {
            if self.wake.wait_until(&mut stopped, deadline).timed_out() {
                break;
            }
        }
        *stopped
    }
}

/// Claim the MMP block of the filesystem on `dev` for a read-write mount.
/// Blocks for twice the kernel's wait (11 s with mke2fs's default
/// interval), as the kernel's mount does.
pub(crate) fn claim(
    dev: &Arc<dyn BlockDevice>,
    sb: &Superblock,
    geo: &Geometry,
    device_name: &str,
) -> Result<Protection> {
    let shared = Arc::new(Shared {
        dev: Arc::clone(dev),
        block: sb.mmp_block,
        block_size: geo.block_size as usize,
        seed: geo.metadata_csum.then_some(geo.csum_seed),
        update_interval: Duration::from_secs(
            sb.mmp_update_interval.clamp(1, MAX_CHECK_INTERVAL) as u64
        ),
        nodename: node_name(),
        bdevname: device_name.to_string(),
        stop: Mutex::new(false),
        wake: Condvar::new(),
        on_conflict: Mutex::new(None),
    });
    let first = shared.read()?;
    let wait = Duration::from_secs(mmp::wait_seconds(
        sb.mmp_update_interval,
        first.check_interval,
    ));
    match first.seq {
        mmp::SEQ_CLEAN => {}
        mmp::SEQ_FSCK => return Err(in_use(&first, "e2fsck is running on the filesystem")),
        seq if seq > mmp::SEQ_MAX => {
            return Err(in_use(&first, &format!("invalid MMP sequence {seq:#x}")));
        }
        seq => shared.wait_unchanged(
            seq,
            wait,
            "the filesystem was not unmounted cleanly or is in use; waiting to see",
        )?,
    }
    let seq = random_seq();
    let check_interval = initial_check_interval(sb.mmp_update_interval);
    shared.write(seq, check_interval)?;
    shared.wait_unchanged(
        seq,
        wait,
        "claimed the MMP block, waiting to make sure nobody else does",
    )?;
    let heartbeat = Arc::clone(&shared);
    let thread = std::thread::Builder::new()
        .name("jext4-mmp".into())
        .spawn(move || heartbeat_loop(&heartbeat, check_interval))
        .map_err(Error::Io)?;
    Ok(Protection {
        shared,
        thread: Some(thread),
    })
}

impl Protection {
    /// What to do when another node is found writing the block.
    pub(crate) fn on_conflict(&self, handler: ConflictHandler) {
        *self.shared.on_conflict.lock() = Some(handler);
    }

    /// Stop the heartbeat and mark the filesystem clean (unmount).
    pub(crate) fn stop(mut self) -> Result<()> {
        self.stop_heartbeat()
    }

    fn stop_heartbeat(&mut self) -> Result<()> {
        let Some(thread) = self.thread.take() else {
            return Ok(());
        };
        *self.shared.stop.lock() = true;
        self.shared.wake.notify_all();
        match thread.join() {
            Ok(()) => Ok(()),
            Err(_) => Err(Error::Io(std::io::Error::other(
                "the MMP heartbeat thread panicked",
            ))),
        }
    }
}

impl Drop for Protection {
    fn drop(&mut self) {
        if let Err(error) = self.stop_heartbeat() {
            tracing::error!(%error, "multi-mount protection: stopping the heartbeat failed");
        }
    }
}

/// `kmmpd`: a new sequence every update interval; a late round reads the
/// block back first. Ends with the clean sequence, unless another node took
/// the block.
fn heartbeat_loop(shared: &Shared, mut check_interval: u16) {
    let mut seq = 0u32;
    let mut failed_writes = 0u64;
    loop {
        seq = if seq >= mmp::SEQ_MAX { 1 } else { seq + 1 };
        let written_at = Instant::now();
        if let Err(error) = shared.write(seq, check_interval) {
            if failed_writes.is_multiple_of(60) {
                tracing::error!(%error, "multi-mount protection: cannot write the MMP block");
            }
            failed_writes += 1;
        }
        if shared.sleep(shared.update_interval) {
            break;
        }
        let late = written_at.elapsed();
        if late > Duration::from_secs(check_interval as u64) {
            match shared.read() {
                Ok(found) if found.seq == seq && found.nodename() == shared.nodename => {}
                Ok(found) => {
                    let why = format!(
                        "multi-mount protection: the filesystem seems to have been multiply mounted \
                         (the MMP block was updated by node {:?}, device {:?})",
                        found.nodename(),
                        found.bdevname()
                    );
                    tracing::error!("{why}");
                    if let Some(handler) = &*shared.on_conflict.lock() {
                        handler(&why);
                    }
                    return;
                }
                Err(error) => {
                    tracing::error!(%error, "multi-mount protection: cannot read the MMP block");
                    if let Some(handler) = &*shared.on_conflict.lock() {
                        handler(&format!("cannot read the MMP block: {error}"));
                    }
                    return;
                }
            }
        }
        // Take as long as the last round took into account, as kmmpd does.
        check_interval = (CHECK_MULT as u64 * late.as_secs())
            .clamp(MIN_CHECK_INTERVAL as u64, MAX_CHECK_INTERVAL as u64)
            as u16;
    }
    if let Err(error) = shared.write(mmp::SEQ_CLEAN, check_interval) {
        tracing::error!(%error, "multi-mount protection: cannot mark the MMP block clean");
    }
}

fn initial_check_interval(update_interval: u16) -> u16 {
    (CHECK_MULT * update_interval.min(MAX_CHECK_INTERVAL)).max(MIN_CHECK_INTERVAL)
}

fn in_use(found: &Mmp, why: &str) -> Error {
    let age = now_seconds().saturating_sub(found.time);
    Error::Io(std::io::Error::new(
        std::io::ErrorKind::ResourceBusy,
        format!(
            "multi-mount protection: {why} (MMP block last updated by node {:?}, device {:?}, {age} s ago)",
            found.nodename(),
            found.bdevname()
        ),
    ))
}

/// A new sequence number of a mount: random, at most SEQ_MAX
/// (`mmp_new_seq`).
fn random_seq() -> u32 {
    loop {
        let mut bytes = [0u8; 4];
        // SAFETY: getrandom writes at most the 4 bytes of the buffer.
        let got = unsafe { libc::getrandom(bytes.as_mut_ptr().cast(), bytes.len(), 0) };
        let seq = if got == 4 {
            u32::from_le_bytes(bytes)
        } else {
            // No entropy source: the clock's nanoseconds will do.
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default()
                .subsec_nanos()
        };
        if seq <= mmp::SEQ_MAX {
            return seq;
        }
    }
}

fn now_seconds() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs()
}

/// This machine's node name (uname -n), as the kernel writes it.
fn node_name() -> String {
    // SAFETY: uname fills the zeroed struct we pass.
    let mut name: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: a pointer to a live struct.
    if unsafe { libc::uname(&mut name) } != 0 {
        return "unknown host".into();
    }
    let bytes: Vec<u8> = name
        .nodename
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}
