//! `--flush-file`: what a journaling server must pay per fsync and no
//! more. Each fsync, fdatasync or fsyncdir joins the group being gathered;
//! one flusher thread takes the whole group, writes a 4 KiB block and
//! fdatasyncs the flush file, twice (a fast commit's data barrier, then its
//! tail block and barrier), and only then acknowledges every member. Those
//! that arrive while a pair is under way form the next group: classic group
//! commit, no timers. The replies are handed over, not waited for, so the
//! `/dev/fuse` workers keep serving during a flush (jext4's sync pool does
//! the same for its commits).

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

use fuser::{Errno, ReplyEmpty};

/// The flush file's size: the blocks written rotate through it.
pub const FLUSH_FILE_BYTES: u64 = 1 << 20;
const BLOCK: u64 = 4096;

/// The group being gathered, under the queue's lock.
#[derive(Default)]
struct Queue {
    members: Vec<ReplyEmpty>,
    /// Set at unmount: the flusher commits what is queued, then ends.
    stop: bool,
}

struct Shared {
    queue: Mutex<Queue>,
    /// Wakes the flusher when a group has its first member, or at stop.
    joined: Condvar,
    groups: AtomicU64,
    members: AtomicU64,
    fdatasyncs: AtomicU64,
}

impl Shared {
    /// A panic in the flusher (a bug) leaves the queue usable.
    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.queue
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

pub struct Flush {
    shared: Arc<Shared>,
    flusher: Mutex<Option<JoinHandle<()>>>,
}

impl Flush {
    /// Create or truncate `path` to 1 MiB (its blocks allocated, so the
    /// flushes that follow write over them) and start the flusher.
    pub fn start(path: &Path) -> io::Result<Flush> {
        let context = |error: io::Error| {
            io::Error::new(
                error.kind(),
                format!("--flush-file {}: {error}", path.display()),
            )
        };
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(path)
            .map_err(context)?;
        file.write_all_at(&vec![0; FLUSH_FILE_BYTES as usize], 0)
            .and_then(|()| file.sync_all())
            .map_err(context)?;
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue::default()),
            joined: Condvar::new(),
            groups: AtomicU64::new(0),
            members: AtomicU64::new(0),
            fdatasyncs: AtomicU64::new(0),
        });
        let flusher = std::thread::Builder::new()
            .name("floorfs-flush".into())
            .spawn({
                let shared = Arc::clone(&shared);
                move || flusher(&shared, &file)
            })?;
        Ok(Flush {
            shared,
            flusher: Mutex::new(Some(flusher)),
        })
    }

    /// Join the group being gathered; the flusher replies once the group's
    /// flushes are done.
    pub fn join(&self, reply: ReplyEmpty) {
        let mut queue = self.shared.lock();
        queue.members.push(reply);
        if queue.members.len() == 1 {
            self.shared.joined.notify_one();
        }
    }

    /// Commit what is queued and end the flusher (after the session ended).
    pub fn stop(&self) {
        self.shared.lock().stop = true;
        self.shared.joined.notify_one();
        let flusher = self
            .flusher
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .take();
        if let Some(flusher) = flusher {
            // The flusher does not panic but on a bug, already reported.
            let _ = flusher.join();
        }
    }

    /// The counters for the stats line: groups, members (their ratio is
    /// the group-commit degree) and fdatasyncs of the flush file.
    pub fn stats(&self, stats: &mut serde_json::Map<String, serde_json::Value>) {
        let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        stats.insert(
            "floor_flush_groups".into(),
            load(&self.shared.groups).into(),
        );
        let members = load(&self.shared.members);
        stats.insert("floor_flush_members".into(), members.into());
        let fdatasyncs = load(&self.shared.fdatasyncs);
        stats.insert("floor_flush_fdatasyncs".into(), fdatasyncs.into());
    }
}

fn flusher(shared: &Shared, file: &File) {
    let mut next_block = 0u64;
    loop {
        let group = {
            let mut queue = shared.lock();
            while queue.members.is_empty() && !queue.stop {
                queue = shared
                    .joined
                    .wait(queue)
                    .unwrap_or_else(|poisoned| poisoned.into_inner());
            }
            if queue.members.is_empty() {
                return;
            }
            std::mem::take(&mut queue.members)
        };
        shared.groups.fetch_add(1, Ordering::Relaxed);
        shared
            .members
            .fetch_add(group.len() as u64, Ordering::Relaxed);
        let result = commit(shared, file, &mut next_block);
        for reply in group {
            match &result {
                Ok(()) => reply.ok(),
                Err(_) => reply.error(Errno::EIO),
            }
        }
        if let Err(error) = result {
            eprintln!("floorfs: --flush-file: {error}");
        }
    }
}

/// A fast commit's two barriers: a block and an fdatasync, twice, at
/// rotating offsets so that each one writes a block of its own.
fn commit(shared: &Shared, file: &File, next_block: &mut u64) -> io::Result<()> {
    let block = [0xfc; BLOCK as usize];
    for _ in 0..2 {
        let offset = *next_block % (FLUSH_FILE_BYTES / BLOCK) * BLOCK;
        *next_block += 1;
        file.write_all_at(&block, offset)?;
        file.sync_data()?;
        shared.fdatasyncs.fetch_add(1, Ordering::Relaxed);
    }
    Ok(())
}
