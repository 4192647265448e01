//! The unjournaled mode: a set of dirty buffers written home in block order
//! by a background flusher, by `sync`, under cache pressure and at unmount.
//!
//! Locks: `dirty` is taken after a buffer's byte lock (a `MetaGuard` drops
//! while holding it) and never held while taking a buffer lock or doing I/O.

use super::Journal;
use crate::cache::{Buffer, BufferCache};
use crate::error::Result;
use parking_lot::{Condvar, Mutex};
use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock, Weak};
use std::thread::JoinHandle;

pub(super) struct WriteBack {
    cache: Arc<BufferCache>,
    dirty: Mutex<BTreeMap<u64, Arc<Buffer>>>,
    /// Serialises write-out passes so that a block is never written by two
    /// passes at once in an order that could put older bytes last.
    pass: Mutex<()>,
    flusher: Mutex<Option<JoinHandle<()>>>,
    stop: Arc<(Mutex<bool>, Condvar)>,
    /// Writes the filesystem's summary before each pass.
    pub(super) commit_hook: OnceLock<Arc<dyn super::CommitHook>>,
}

impl WriteBack {
    pub(super) fn new(cache: Arc<BufferCache>) -> Self {
        WriteBack {
            cache,
            dirty: Mutex::new(BTreeMap::new()),
            pass: Mutex::new(()),
            flusher: Mutex::new(None),
            stop: Arc::new((Mutex::new(false), Condvar::new())),
            commit_hook: OnceLock::new(),
        }
    }

    pub(super) fn mark_dirty(&self, buffer: &Arc<Buffer>) {
        self.dirty
            .lock()
            .entry(buffer.block())
            .or_insert_with(|| Arc::clone(buffer));
    }

    /// A freed metadata block must not be written any more. A pass that
    /// already took it into its batch could still write it after the block
    /// holds someone's data, so wait for such a pass to end first.
    pub(super) fn forget(&self, block: u64) {
        let _pass = self.pass.lock();
        self.dirty.lock().remove(&block);
    }

    pub(super) fn has_dirty(&self) -> bool {
        !self.dirty.lock().is_empty()
    }

    pub(super) fn dirty_count(&self) -> usize {
        self.dirty.lock().len()
    }

    /// Write every dirty buffer home, in block order.
    pub(super) fn write_all(&self) -> Result<()> {
        // The summary changes only with blocks that are dirty too.
        if let Some(hook) = self.commit_hook.get()
            && self.has_dirty()
        {
            hook.before_commit(&super::CommitAccess::write_back(self));
        }
        let _pass = self.pass.lock();
        let batch = std::mem::take(&mut *self.dirty.lock());
        let mut failed = None;
        for (block, buffer) in batch {
            if failed.is_some() {
                // Keep the rest dirty: a later pass retries them.
                self.dirty.lock().entry(block).or_insert(buffer);
                continue;
            }
            if let Err(error) = self.cache.write_home(&buffer) {
                self.dirty.lock().entry(block).or_insert(buffer);
                failed = Some(error);
            }
        }
        match failed {
            Some(error) => Err(error),
            None => Ok(()),
        }
    }

    /// The background flusher: a write-back pass every commit interval, so
    /// an idle mount reaches the disk within seconds like ext2 does.
    pub(super) fn start_flusher(journal: &Arc<Journal>) {
        let weak: Weak<Journal> = Arc::downgrade(journal);
        let Some(mode) = journal.write_back_mode() else {
            return;
        };
        let stop = Arc::clone(&mode.stop);
        let interval = journal.config.commit_interval;
        let thread = std::thread::Builder::new()
            .name("jext4-flush".into())
            .spawn(move || {
                loop {
                    {
                        let (lock, condvar) = &*stop;
                        let mut stopped = lock.lock();
                        if !*stopped {
                            condvar.wait_for(&mut stopped, interval);
                        }
                        if *stopped {
                            return;
                        }
                    }
                    let Some(journal) = weak.upgrade() else {
                        return;
                    };
                    let Some(mode) = journal.write_back_mode() else {
                        return;
                    };
                    if journal.abort_reason().is_some() {
                        return;
                    }
                    let pass =
                        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| mode.write_all()));
                    match pass {
                        Ok(Ok(())) => {}
                        Ok(Err(error)) => tracing::error!(%error, "background write-back failed"),
                        Err(panic) => {
                            let why = crate::error::panic_message(&*panic);
                            journal.abort(&format!("the flusher thread panicked: {why}"));
                            return;
                        }
                    }
                }
            })
            .expect("spawning the flusher thread");
        *mode.flusher.lock() = Some(thread);
    }

    pub(super) fn stop_flusher(&self) {
        {
            let (lock, condvar) = &*self.stop;
            *lock.lock() = true;
            condvar.notify_all();
        }
        if let Some(thread) = self.flusher.lock().take() {
            // The flusher may be the last holder of the journal and run this
            // very function from its own drop; never join oneself.
            if thread.thread().id() != std::thread::current().id() {
                let _ = thread.join();
            }
        }
    }
}
