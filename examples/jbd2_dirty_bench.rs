//! Micro-benchmark of the dirty-block path: nanoseconds per
//! `Handle::get_write_access` (with the guard dropped at once, which is
//! what every metadata change pays to join the running transaction), for a
//! block already in the transaction and for a block new to it, on one
//! thread and on two.
//!
//! ```text
//! cargo run --release --example jbd2_dirty_bench [-- ITERATIONS_MILLIONS]
//! ```
//!
//! Built on the public layers alone, the way `Fs::mount` wires them: a
//! `MemoryDevice` holding a JBD2 journal (a version 2 journal superblock
//! written here, 16384 blocks of 4 KiB; checksum v3 and 64bit are turned
//! on by `Journal::jbd2` as for a metadata_csum ext4), the write-ahead
//! guard over the device, the buffer cache over the guard. The commit
//! interval is an hour: nothing commits while a loop is timed, so no
//! frozen copy can be taken there (the program checks that the count stays
//! 0); commits happen between rounds of new blocks, untimed. For scale it
//! also times a 4 KiB buffer copy, which the path must not contain.
//!
//! Figures are printed, never asserted: timing on a shared machine is not
//! a test. Use the release profile (the `ci` profile has debug assertions
//! on, which cost on this path).

use jext4::engine::cache::{Buffer, BufferCache};
use jext4::engine::dev::guard::GuardedDevice;
use jext4::engine::dev::{BlockDevice, MemoryDevice};
use jext4::engine::journal::recovery::JournalArea;
use jext4::engine::journal::{Jbd2Options, Journal, JournalConfig};
use std::hint::black_box;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

const BLOCK_SIZE: usize = 4096;
const JOURNAL_BLOCKS: u64 = 16384;
/// Filesystem blocks before the journal, the ones the benchmark dirties.
const DATA_BLOCKS: u64 = 8192;
/// New blocks per handle and round. Two such handles at once must fit a
/// transaction (a quarter of the log, 4095 blocks, counting each handle's
/// credits and the blocks already registered), or a start would close the
/// transaction and commit it under the other thread's timed loop.
const NEW_PER_ROUND: usize = 1000;

/// A version 2 journal superblock with no features (JBD2 on-disk format:
/// big-endian; h_magic, h_blocktype = 4, s_blocksize at 12, s_maxlen at
/// 16, s_first at 20, s_sequence at 24, s_start at 28 = 0 (empty log),
/// s_nr_users at 64).
fn journal_superblock() -> Vec<u8> {
    let mut block = vec![0u8; BLOCK_SIZE];
    let mut put = |offset: usize, value: u32| {
        block[offset..offset + 4].copy_from_slice(&value.to_be_bytes());
    };
    put(0, jext4::engine::journal::format::MAGIC);
    put(4, jext4::engine::journal::format::block_type::SUPERBLOCK_V2);
    put(12, BLOCK_SIZE as u32);
    put(16, JOURNAL_BLOCKS as u32);
    put(20, 1);
    put(24, 1);
    put(64, 1);
    block[48..64].copy_from_slice(b"jext4-microbench");
    block
}

struct Setup {
    journal: Arc<Journal>,
    cache: Arc<BufferCache>,
}

fn setup() -> Setup {
    let device_bytes = ((DATA_BLOCKS + JOURNAL_BLOCKS) as usize) * BLOCK_SIZE;
    let memory = Arc::new(MemoryDevice::new(device_bytes));
    memory
        .write_at(DATA_BLOCKS * BLOCK_SIZE as u64, &journal_superblock())
        .unwrap();
    let device: Arc<dyn BlockDevice> = memory;
    let area = JournalArea::new(
        Arc::clone(&device),
        BLOCK_SIZE as u32,
        (DATA_BLOCKS..DATA_BLOCKS + JOURNAL_BLOCKS).collect(),
    );
    let guard = Arc::new(GuardedDevice::new(Arc::clone(&device), BLOCK_SIZE as u32));
    let cache = Arc::new(BufferCache::new(
        Arc::clone(&guard) as Arc<dyn BlockDevice>,
        BLOCK_SIZE,
        256 << 20,
    ));
    let config = JournalConfig {
        commit_interval: Duration::from_secs(3600),
        sync_all: false,
    };
    let options = Jbd2Options {
        commit_interval: config.commit_interval,
        async_commit: false,
        fs_64bit: true,
        metadata_csum: true,
        fast_commit: false,
        bytelog: false,
    };
    let journal = Journal::jbd2(Arc::clone(&cache), area, guard, config, &options).unwrap();
    Setup { journal, cache }
}

fn buffers(cache: &BufferCache, blocks: std::ops::Range<u64>) -> Vec<Arc<Buffer>> {
    blocks.map(|block| cache.read(block).unwrap()).collect()
}

fn nanoseconds(elapsed: Duration, calls: u64) -> f64 {
    elapsed.as_nanos() as f64 / calls as f64
}

/// `calls` write accesses to one buffer already in the transaction.
fn already_registered(journal: &Journal, buffer: &Arc<Buffer>, calls: u64) -> Duration {
    let handle = journal.start(1).unwrap();
    drop(handle.get_write_access(buffer).unwrap());
    let started = Instant::now();
    for _ in 0..calls {
        let mut bytes = handle.get_write_access(black_box(buffer)).unwrap();
        bytes[100] = bytes[100].wrapping_add(1);
    }
    let elapsed = started.elapsed();
    handle.stop().unwrap();
    elapsed
}

/// One write access to each buffer, all new to the running transaction;
/// then (untimed) commit, so that the next round finds them new again.
/// With `peers`, the threads that share it commit in step: the leader
/// commits once all have stopped their handles, and nobody starts the
/// next round before that commit is durable (otherwise a round could
/// meet buffers the commit has not captured yet, and time the frozen
/// copies that the shadowing path rightly takes then).
fn new_blocks(
    journal: &Journal,
    buffers: &[Arc<Buffer>],
    rounds: u64,
    peers: Option<(&Barrier, bool)>,
) -> Duration {
    let mut timed = Duration::ZERO;
    for _ in 0..rounds {
        let handle = journal.start(buffers.len() as u32).unwrap();
        let started = Instant::now();
        for buffer in buffers {
            let mut bytes = handle.get_write_access(black_box(buffer)).unwrap();
            bytes[100] = bytes[100].wrapping_add(1);
        }
        timed += started.elapsed();
        handle.stop().unwrap();
        match peers {
            None => journal.sync().unwrap(),
            Some((barrier, leader)) => {
                barrier.wait();
                if leader {
                    journal.sync().unwrap();
                }
                barrier.wait();
            }
        }
    }
    timed
}

/// Run `work` on two threads started together; returns each one's time.
fn on_two_threads(work: impl Fn(usize) -> Duration + Sync) -> [Duration; 2] {
    let barrier = Barrier::new(2);
    std::thread::scope(|scope| {
        let threads: Vec<_> = (0..2)
            .map(|index| {
                let (barrier, work) = (&barrier, &work);
                scope.spawn(move || {
                    barrier.wait();
                    work(index)
                })
            })
            .collect();
        let mut times = [Duration::ZERO; 2];
        for (slot, thread) in times.iter_mut().zip(threads) {
            *slot = thread.join().unwrap();
        }
        times
    })
}

fn frozen(journal: &Journal) -> u64 {
    journal.stats().jbd2.map_or(0, |stats| stats.frozen_copies)
}

/// Run one measurement and print nanoseconds per call for each thread,
/// the total rate, and the frozen copies taken meanwhile (must be 0).
fn measure(journal: &Journal, label: &str, calls_each: u64, run: impl FnOnce() -> Vec<Duration>) {
    let frozen_before = frozen(journal);
    let times = run();
    let frozen = frozen(journal) - frozen_before;
    let per_call: Vec<String> = times
        .iter()
        .map(|time| format!("{:.1}", nanoseconds(*time, calls_each)))
        .collect();
    let slowest = times.iter().max().unwrap();
    let rate = (calls_each * times.len() as u64) as f64 / slowest.as_secs_f64() / 1e6;
    println!(
        "{label:<40} {:>14} ns/call  {rate:6.1} M calls/s  frozen copies {frozen}",
        per_call.join(" / ")
    );
}

fn main() {
    let millions: u64 = std::env::args()
        .nth(1)
        .and_then(|text| text.parse().ok())
        .unwrap_or(10);
    let calls = millions * 1_000_000;
    let Setup { journal, cache } = setup();
    let hot = buffers(&cache, 1..3);
    let fresh = buffers(&cache, 100..100 + 2 * NEW_PER_ROUND as u64);
    let new_rounds = (calls / NEW_PER_ROUND as u64 / 4).max(20);
    let new_calls = new_rounds * NEW_PER_ROUND as u64;
    println!(
        "jbd2 dirty path, {BLOCK_SIZE}-byte blocks, {JOURNAL_BLOCKS}-block journal, \
         debug assertions {}",
        cfg!(debug_assertions)
    );

    // Warm up: page in the device and the code paths.
    already_registered(&journal, &hot[0], calls / 10);
    new_blocks(&journal, &fresh[..NEW_PER_ROUND], 5, None);

    measure(&journal, "already in, 1 thread", calls, || {
        vec![already_registered(&journal, &hot[0], calls)]
    });
    measure(&journal, "new, 1 thread", new_calls, || {
        vec![new_blocks(
            &journal,
            &fresh[..NEW_PER_ROUND],
            new_rounds,
            None,
        )]
    });
    measure(
        &journal,
        "already in, 2 threads, the same block",
        calls,
        || on_two_threads(|_| already_registered(&journal, &hot[0], calls)).to_vec(),
    );
    measure(
        &journal,
        "already in, 2 threads, a block each",
        calls,
        || on_two_threads(|index| already_registered(&journal, &hot[index], calls)).to_vec(),
    );
    let step = Barrier::new(2);
    measure(
        &journal,
        "new, 2 threads, blocks of their own",
        new_calls,
        || {
            on_two_threads(|index| {
                let own = &fresh[index * NEW_PER_ROUND..(index + 1) * NEW_PER_ROUND];
                new_blocks(&journal, own, new_rounds, Some((&step, index == 0)))
            })
            .to_vec()
        },
    );

    // For scale: what a frozen copy (the 4 KiB copy the path must not
    // contain) costs here: the buffer's bytes cloned under its read lock.
    let copies = calls / 10;
    measure(
        &journal,
        "for scale: one 4 KiB frozen-style copy",
        copies,
        || {
            let started = Instant::now();
            for _ in 0..copies {
                black_box(hot[1].read().clone());
            }
            vec![started.elapsed()]
        },
    );
    journal.shutdown().unwrap();
}
