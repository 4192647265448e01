//! jext4-bench-driver: the workloads of bench/run that no Debian tool models.
//! Each subcommand runs one workload in a directory of the filesystem under
//! test and prints one JSON line with its figures; bench/run does the rest
//! (images, mounts, repetitions, medians, tables). One subcommand is not a
//! workload but a filesystem: `floorfs`, the in-memory FUSE server that
//! bench/run times as the floor of the FUSE transport.

mod blurt;
mod common;
mod exim;
mod files;
mod floorfs;
mod lsm;
mod metafsync;
mod msgjournal;
mod smallwriters;
mod statstorm;
mod stream;
mod varmail;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use files::Host;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    workload: Workload,
}

#[derive(Subcommand)]
enum Workload {
    /// N threads, each in its own directory: create, write 4 KiB, fsync, unlink.
    Metafsync {
        /// With --image: a path inside the image.
        #[arg(long)]
        dir: PathBuf,
        /// Run through jext4's library on this ext4 image, not on a mount.
        #[arg(long, value_name = "IMAGE")]
        image: Option<PathBuf>,
        #[arg(long, default_value_t = 1)]
        threads: usize,
        #[arg(long, default_value_t = 2.0)]
        seconds: f64,
    },
    /// filebench varmail: create/append/fsync/read/delete in one directory.
    Varmail {
        /// With --image: a path inside the image.
        #[arg(long)]
        dir: PathBuf,
        /// Run through jext4's library on this ext4 image, not on a mount.
        #[arg(long, value_name = "IMAGE")]
        image: Option<PathBuf>,
        #[arg(long, default_value_t = 1)]
        threads: usize,
        #[arg(long, default_value_t = 2.0)]
        seconds: f64,
        #[arg(long, default_value_t = 1000)]
        files: usize,
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
    /// Exim mail spool: receive (-D, -H with rename), deliver (mailbox append + fsync), retire.
    Exim {
        #[arg(long)]
        dir: PathBuf,
        #[arg(long, default_value_t = 1)]
        threads: usize,
        #[arg(long, default_value_t = 2.0)]
        seconds: f64,
        #[arg(long, default_value_t = 4096)]
        message_bytes: usize,
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
    /// RocksDB compaction: write + fsync a table, fsync the directory, log to MANIFEST, unlink inputs.
    Lsm {
        #[arg(long)]
        dir: PathBuf,
        #[arg(long, default_value_t = 1)]
        threads: usize,
        #[arg(long, default_value_t = 2.0)]
        seconds: f64,
        #[arg(long, default_value_t = 1024)]
        table_kib: usize,
    },
    /// LMAX message journal: append + fdatasync latency histogram.
    Msgjournal {
        #[arg(long)]
        dir: PathBuf,
        #[arg(long, default_value_t = 4096)]
        record_bytes: usize,
        #[arg(long, value_enum, default_value_t = msgjournal::Layout::Fresh)]
        layout: msgjournal::Layout,
        /// Also run a reader thread tailing the file.
        #[arg(long)]
        reader: bool,
        #[arg(long, default_value_t = 10_000)]
        count: u64,
        /// Stop early after this many seconds, whatever the count.
        #[arg(long, default_value_t = 10.0)]
        seconds: f64,
    },
    /// Issue 9's streaming case: create + 1 KiB write + fsync latency in
    /// a/ while another thread streams a file into b/ without syncing.
    Stream {
        #[arg(long)]
        dir: PathBuf,
        #[arg(long, default_value_t = 400)]
        stream_mib: usize,
        #[arg(long, default_value_t = 1024)]
        write_kib: usize,
        #[arg(long, default_value_t = 1024)]
        record_bytes: usize,
    },
    /// Tux3's many small writers: P processes each writing W records to its own file.
    Smallwriters {
        #[arg(long)]
        dir: PathBuf,
        #[arg(long, default_value_t = 1000)]
        procs: usize,
        #[arg(long, default_value_t = 40)]
        writes: usize,
        #[arg(long, default_value_t = 1024)]
        record_bytes: usize,
    },
    /// A `git status`-like stat storm: lstat every listed file on THREADS
    /// threads, then read every listed directory; ROUNDS times (the first
    /// cold, the rest warm).
    Statstorm {
        #[arg(long)]
        dir: PathBuf,
        #[arg(long)]
        list: PathBuf,
        #[arg(long, default_value_t = 4)]
        threads: usize,
        #[arg(long, default_value_t = 4)]
        rounds: usize,
    },
    /// Tux3's blurt loop: PASSES × DIRECTORIES steps of TASKS processes,
    /// each rewriting DIR/<step>/f<task> WRITES × CHUNK bytes; stops at the
    /// first step with a failed task (ENOSPC is the expected end).
    Blurt {
        #[arg(long)]
        dir: PathBuf,
        #[arg(long, default_value_t = 9)]
        passes: usize,
        #[arg(long, default_value_t = 9)]
        directories: usize,
        #[arg(long, default_value_t = 40)]
        writes: usize,
        #[arg(long, default_value_t = 1000)]
        tasks: usize,
        #[arg(long, default_value_t = 1024)]
        chunk_bytes: usize,
    },
    /// An in-memory filesystem served over /dev/fuse as jext4 serves its
    /// images (same mount options, capabilities, timeouts and open flags),
    /// with no engine: the floor of any FUSE server. Runs until unmounted,
    /// then prints its request counters as one JSON line.
    Floorfs {
        mountpoint: PathBuf,
        /// Bytes of data it holds (4 KiB per block, a block per directory);
        /// beyond it writes, fallocate and mkdir fail with ENOSPC.
        #[arg(long)]
        capacity: u64,
        /// /dev/fuse worker threads (jext4's default).
        #[arg(long, default_value_t = floorfs::THREADS_DEFAULT)]
        threads: usize,
        /// Read the tree from FILE at start if it is not empty (then remove
        /// it); write the tree to FILE at unmount if FILE exists by then.
        #[arg(long, value_name = "FILE")]
        state: Option<PathBuf>,
        /// Create or truncate FILE to 1 MiB; then answer fsync, fdatasync
        /// and fsyncdir only after a 4 KiB write and an fdatasync of FILE,
        /// twice, shared by every fsync that joined before it started
        /// (group commit). Put FILE on the disk under test.
        #[arg(long, value_name = "FILE")]
        flush_file: Option<PathBuf>,
    },
}

/// Runs a workload through jext4's library on `image`: opened before,
/// closed cleanly after (outside the workload's time, as an unmount is).
fn through_library<W>(image: &Path, workload: W) -> std::io::Result<()>
where
    W: FnOnce(Arc<files::Image>) -> std::io::Result<()>,
{
    let store = Arc::new(files::Image::open(image)?);
    workload(store.clone())?;
    match Arc::try_unwrap(store) {
        Ok(store) => store.close(),
        Err(_) => Err(std::io::Error::other(
            "a workload thread still holds the image",
        )),
    }
}

fn main() -> ExitCode {
    let result = match Cli::parse().workload {
        Workload::Metafsync {
            dir,
            image,
            threads,
            seconds,
        } => match image {
            None => metafsync::run(Arc::new(Host), dir, threads, seconds),
            Some(image) => {
                through_library(&image, |store| metafsync::run(store, dir, threads, seconds))
            }
        },
        Workload::Varmail {
            dir,
            image,
            threads,
            seconds,
            files,
            seed,
        } => match image {
            None => varmail::run(Arc::new(Host), dir, threads, seconds, files, seed),
            Some(image) => through_library(&image, |store| {
                varmail::run(store, dir, threads, seconds, files, seed)
            }),
        },
        Workload::Exim {
            dir,
            threads,
            seconds,
            message_bytes,
            seed,
        } => exim::run(dir, threads, seconds, message_bytes, seed),
        Workload::Lsm {
            dir,
            threads,
            seconds,
            table_kib,
        } => lsm::run(dir, threads, seconds, table_kib),
        Workload::Stream {
            dir,
            stream_mib,
            write_kib,
            record_bytes,
        } => stream::run(dir, stream_mib, write_kib, record_bytes),
        Workload::Msgjournal {
            dir,
            record_bytes,
            layout,
            reader,
            count,
            seconds,
        } => msgjournal::run(msgjournal::Options {
            dir,
            record_bytes,
            layout,
            reader,
            count,
            seconds,
        }),
        Workload::Smallwriters {
            dir,
            procs,
            writes,
            record_bytes,
        } => smallwriters::run(dir, procs, writes, record_bytes),
        Workload::Statstorm {
            dir,
            list,
            threads,
            rounds,
        } => statstorm::run(statstorm::Options {
            dir,
            list,
            threads,
            rounds,
        }),
        Workload::Blurt {
            dir,
            passes,
            directories,
            writes,
            tasks,
            chunk_bytes,
        } => blurt::run(blurt::Options {
            dir,
            passes,
            directories,
            writes,
            tasks,
            chunk_bytes,
        }),
        Workload::Floorfs {
            mountpoint,
            capacity,
            threads,
            state,
            flush_file,
        } => floorfs::run(floorfs::Options {
            mountpoint,
            capacity,
            threads,
            state,
            flush_file,
        }),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("jext4-bench-driver: {error}");
            ExitCode::FAILURE
        }
    }
}
