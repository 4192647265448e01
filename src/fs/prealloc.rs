//! Preallocation windows: the free blocks right after a file's last
//! allocated run, kept in memory for that file's next append, so that
//! files appended in turn by many writers (a thousand 1 KiB appenders)
//! each get contiguous blocks instead of one block each in turn. ext3's
//! block reservation windows and ext4 mballoc's inode preallocation
//! without delayed allocation serve the same purpose.
//!
//! A window is a hint, never an allocation: its blocks stay free in the
//! bitmap, in the free counts, in `statfs` and in the space budget, and
//! nothing of it reaches the disk or the journal — a crash or an unmount
//! forgets it. Searches for other allocations step over windows (each
//! group keeps their blocks as a mask, like its pending frees); when that
//! finds nothing anywhere, a second search ignores the windows and takes
//! their blocks, so a window never causes an ENOSPC. A file's window is
//! used only for the run that continues its last one physically (the
//! goal the extent tree computes), checked against the bitmap and the
//! pending frees under the group lock first (another file may have taken
//! part of it by then); any other allocation for the file drops it, and
//! so does the file's last release.
//!
//! Locks: a group's window mask is under that group's lock [Group]; the
//! window of each inode is in `Windows::owners`, a leaf lock taken under
//! a group lock or under none.

use super::group::SpareMasks;
use crate::format::bitmap;
use parking_lot::Mutex;
use std::collections::HashMap;

/// The smallest window, in blocks: 16 KiB at 1 KiB blocks, 64 KiB at
/// 4 KiB (ext4's stream threshold, `s_mb_stream_request`, is 16 blocks
/// too).
pub(crate) const WINDOW_MIN_BLOCKS: u32 = 16;
/// The largest window: a file that grew past the smallest one gets a
/// window as large as what it holds, up to this.
pub(crate) const WINDOW_MAX_BLOCKS: u32 = 256;
/// At most this many files hold a window (files written through the
/// library are never released): past it, new windows are not made.
pub(crate) const MAX_WINDOWS: usize = 8192;

/// Free blocks `start..start + len` (bits of `group`) kept for one file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Window {
    pub group: u32,
    pub start: u32,
    pub len: u32,
}

impl Window {
    pub fn end(&self) -> u32 {
        self.start + self.len
    }
}

/// A data allocation that may leave a window for inode `ino` behind it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct WindowAsk {
    pub ino: u32,
    /// Bits of window wanted after the run (blocks; clusters with
    /// bigalloc).
    pub len: u32,
}

impl WindowAsk {
    /// The window for a file that maps `mapped` blocks so far, in the
    /// allocator's units: clusters of `ratio` blocks (blocks without
    /// bigalloc), at least one.
    pub fn for_file(ino: u32, mapped: u64, ratio: u32) -> WindowAsk {
        let blocks = mapped.clamp(WINDOW_MIN_BLOCKS as u64, WINDOW_MAX_BLOCKS as u64) as u32;
        WindowAsk {
            ino,
            len: (blocks / ratio).max(1),
        }
    }
}

/// The windows by inode (a leaf lock).
#[derive(Default)]
pub(crate) struct Windows {
    owners: Mutex<HashMap<u32, Window>>,
}

impl Windows {
    /// Remove and return `ino`'s window: its blocks are the caller's to
    /// unmask (under the group's lock).
    pub fn take(&self, ino: u32) -> Option<Window> {
        self.owners.lock().remove(&ino)
    }

    /// Record `window` as `ino`'s; false (nothing recorded) when too many
    /// files hold one. `ino` holds none: it was taken first.
    pub fn put(&self, ino: u32, window: Window) -> bool {
        debug_assert!(window.len > 0);
        let mut owners = self.owners.lock();
        if owners.len() >= MAX_WINDOWS {
            return false;
        }
        let before = owners.insert(ino, window);
        debug_assert!(before.is_none(), "inode {ino} had a window already");
        true
    }
}

/// One group's window blocks, as a mask over its bitmap (none while the
/// group has no window). Under the group's lock.
#[derive(Default)]
pub(crate) struct WindowMask {
    mask: Vec<u8>,
    blocks: u32,
}

impl WindowMask {
    /// Mask bits `start..start + len` (free, unmasked blocks).
    pub fn add(&mut self, start: u32, len: u32, spare: &SpareMasks) {
        if self.mask.is_empty() {
            self.mask = spare.take();
        }
        for bit in start as usize..(start + len) as usize {
            debug_assert!(
                !bitmap::test_bit(&self.mask, bit),
                "windows overlap at bit {bit}"
            );
            bitmap::set_bit(&mut self.mask, bit);
        }
        self.blocks += len;
    }

    /// Unmask bits `start..start + len` (a window that was added); the
    /// mask goes back to `spare` with the last window.
    pub fn remove(&mut self, start: u32, len: u32, spare: &SpareMasks) {
        debug_assert!(
            self.blocks >= len,
            "unmasking {len} of {} blocks",
            self.blocks
        );
        for bit in start as usize..(start + len) as usize {
            debug_assert!(
                bitmap::test_bit(&self.mask, bit),
                "bit {bit} was not masked"
            );
            bitmap::clear_bit(&mut self.mask, bit);
        }
        self.blocks -= len;
        if self.blocks == 0 {
            spare.give(std::mem::take(&mut self.mask));
        }
    }

    pub fn mask(&self) -> Option<&[u8]> {
        (!self.mask.is_empty()).then_some(&self.mask[..])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mask_holds_windows_until_the_last_goes() {
        let spare = SpareMasks::new(8);
        let mut mask = WindowMask::default();
        assert!(mask.mask().is_none());
        mask.add(3, 4, &spare);
        mask.add(10, 2, &spare);
        let bits = mask.mask().unwrap();
        assert!(bitmap::test_bit(bits, 3) && bitmap::test_bit(bits, 6));
        assert!(!bitmap::test_bit(bits, 7) && bitmap::test_bit(bits, 11));
        mask.remove(3, 4, &spare);
        assert!(!bitmap::test_bit(mask.mask().unwrap(), 3));
        mask.remove(10, 2, &spare);
        assert!(mask.mask().is_none(), "no window left, no mask");
        mask.add(1, 1, &spare);
        let bits = mask.mask().unwrap();
        assert!(
            bitmap::test_bit(bits, 1) && !bitmap::test_bit(bits, 3),
            "a spare mask comes zeroed"
        );
    }

    #[test]
    fn window_sizes_follow_the_file_within_bounds() {
        assert_eq!(WindowAsk::for_file(12, 0, 1).len, WINDOW_MIN_BLOCKS);
        assert_eq!(WindowAsk::for_file(12, 40, 1).len, 40);
        assert_eq!(WindowAsk::for_file(12, 1 << 20, 1).len, WINDOW_MAX_BLOCKS);
        // bigalloc: the same blocks, counted in clusters.
        assert_eq!(WindowAsk::for_file(12, 40, 4).len, 10);
        assert_eq!(WindowAsk::for_file(12, 0, 1024).len, 1);
        let windows = Windows::default();
        let window = Window {
            group: 1,
            start: 5,
            len: 3,
        };
        assert!(windows.put(12, window));
        assert_eq!(windows.take(12), Some(window));
        assert_eq!(windows.take(12), None);
    }
}
