//! Transactions: the only way metadata changes.
//!
//! Every filesystem operation opens a [`Handle`] with `Journal::start(credits)`
//! before it takes any filesystem lock, changes metadata blocks only through
//! `Handle::get_write_access` / `get_create_access` (whose guard marks the
//! block dirty in the handle's transaction when dropped), hands freed
//! metadata blocks to `Handle::forget`, and closes with `Handle::stop`. Any
//! step may call `Handle::set_sync` (O_SYNC, dirsync, `-o sync`); the stop of
//! that handle then makes everything durable before returning.
//!
//! Lock order (outermost first): handle start → filesystem lock → buffer
//! bytes → the journal's own state. The journal never takes a filesystem lock.
//!
//! Modes:
//! - `WriteBack`: no journal (ext2 images, or until JBD2 is enabled): dirty
//!   buffers are kept in a set and written home by the background flusher,
//!   by `sync`, on cache pressure and at unmount. Same promise as ext2: a
//!   crash may leave the image needing `e2fsck`.

pub mod format;
pub mod logdump;
pub mod recovery;
mod writeback;

use crate::cache::{Buffer, BufferCache};
use crate::error::{Error, Result};
use parking_lot::RwLockWriteGuard;
use std::cell::Cell;
use std::ops::{Deref, DerefMut};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use writeback::WriteBack;

/// Tunables of the transaction layer, set from mount options.
#[derive(Debug, Clone)]
pub struct JournalConfig {
    /// Seconds between background commits (`-o commit=`), or write-back
    /// passes when unjournaled.
    pub commit_interval: Duration,
    /// Every handle stop is synchronous (`-o sync`).
    pub sync_all: bool,
}

impl Default for JournalConfig {
    fn default() -> Self {
        JournalConfig {
            commit_interval: Duration::from_secs(5),
            sync_all: false,
        }
    }
}

pub struct Journal {
    cache: Arc<BufferCache>,
    mode: WriteBack,
    config: JournalConfig,
    /// Set when the filesystem is mounted read-only or turned read-only after
    /// an error: no handle may start.
    read_only: AtomicBool,
}

impl Journal {
    /// An unjournaled transaction layer over `cache`.
    pub fn write_back(
        cache: Arc<BufferCache>,
        config: JournalConfig,
        read_only: bool,
    ) -> Arc<Self> {
        let journal = Arc::new(Journal {
            mode: WriteBack::new(Arc::clone(&cache)),
            cache,
            config,
            read_only: AtomicBool::new(read_only),
        });
        if !read_only {
            WriteBack::start_flusher(&journal);
        }
        journal
    }

    pub fn cache(&self) -> &Arc<BufferCache> {
        &self.cache
    }

    pub fn is_read_only(&self) -> bool {
        self.read_only.load(Ordering::Acquire)
    }

    /// Refuse every further change (errors=remount-ro). Dirty buffers already
    /// accepted are still written at unmount, because they are consistent
    /// with each other; the damage that triggered this was found on read.
    pub fn set_read_only(&self) {
        self.read_only.store(true, Ordering::Release);
    }

    /// Open a handle for an operation that will dirty at most `credits`
    /// metadata blocks.
    pub fn start(&self, credits: u32) -> Result<Handle<'_>> {
        if self.is_read_only() {
            return Err(Error::ReadOnly);
        }
        debug_assert!(credits > 0, "a handle that changes nothing needs no handle");
        Ok(Handle {
            journal: self,
            credits,
            dirtied: Cell::new(0),
            sync: Cell::new(self.config.sync_all),
        })
    }

    /// Make every change accepted so far durable (sync, syncfs, fsync).
    pub fn sync(&self) -> Result<()> {
        self.mode.write_all()?;
        self.cache.flush_device()
    }

    /// Called after handles stop: keep pinned memory within the cache bound.
    fn relieve_pressure(&self) -> Result<()> {
        if self.cache.over_capacity() {
            self.mode.write_all()?;
        }
        Ok(())
    }

    /// Final write-out at unmount; stops the background thread.
    pub fn shutdown(&self) -> Result<()> {
        self.mode.stop_flusher();
        if !self.is_read_only() || self.mode.has_dirty() {
            self.mode.write_all()?;
            self.cache.flush_device()?;
        }
        Ok(())
    }

    pub fn stats(&self) -> JournalStats {
        JournalStats {
            dirty_buffers: self.mode.dirty_count() as u64,
        }
    }
}

#[derive(Debug, Default, Clone, Copy)]
pub struct JournalStats {
    pub dirty_buffers: u64,
}

/// One operation's membership in the running transaction. Not `Sync`: an
/// operation runs on one thread.
pub struct Handle<'j> {
    journal: &'j Journal,
    credits: u32,
    dirtied: Cell<u32>,
    sync: Cell<bool>,
}

impl<'j> Handle<'j> {
    /// Exclusive access to an existing metadata block; the block joins the
    /// transaction when the guard drops.
    pub fn get_write_access<'h>(&'h self, buffer: &'h Arc<Buffer>) -> Result<MetaGuard<'h, 'j>> {
        Ok(MetaGuard {
            handle: self,
            buffer,
            data: buffer.write_unjournaled(),
        })
    }

    /// Exclusive access to a block that has just been allocated as metadata;
    /// its old content is irrelevant and the caller rewrites all of it.
    pub fn get_create_access<'h>(&'h self, buffer: &'h Arc<Buffer>) -> Result<MetaGuard<'h, 'j>> {
        self.get_write_access(buffer)
    }

    /// A metadata block was freed: its pending writes must not reach the
    /// disk (the block may soon hold someone's data), and the cache must
    /// forget it.
    pub fn forget(&self, block: u64) {
        self.journal.mode.forget(block);
        self.journal.cache.forget(block);
    }

    /// The operation must be durable when its outermost handle stops.
    pub fn set_sync(&self) {
        self.sync.set(true);
    }

    pub fn is_sync(&self) -> bool {
        self.sync.get()
    }

    fn dirty_metadata(&self, buffer: &Arc<Buffer>) {
        self.dirtied.set(self.dirtied.get() + 1);
        self.journal.mode.mark_dirty(buffer);
    }

    /// Close the handle; commit and wait if it was flagged sync.
    pub fn stop(self) -> Result<()> {
        if self.dirtied.get() > self.credits {
            // Credits become a hard reservation with JBD2; until then an
            // underestimate is a bug to find, not a failure to report.
            tracing::debug!(
                credits = self.credits,
                dirtied = self.dirtied.get(),
                "handle dirtied more block changes than it reserved"
            );
        }
        if self.sync.get() {
            self.journal.sync()?;
        }
        self.journal.relieve_pressure()
    }
}

/// Write access to one metadata block inside a handle.
pub struct MetaGuard<'h, 'j> {
    handle: &'h Handle<'j>,
    buffer: &'h Arc<Buffer>,
    data: RwLockWriteGuard<'h, Box<[u8]>>,
}

impl MetaGuard<'_, '_> {
    pub fn block(&self) -> u64 {
        self.buffer.block()
    }
}

impl Deref for MetaGuard<'_, '_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.data
    }
}

impl DerefMut for MetaGuard<'_, '_> {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.data
    }
}

impl Drop for MetaGuard<'_, '_> {
    fn drop(&mut self) {
        self.handle.dirty_metadata(self.buffer);
    }
}
