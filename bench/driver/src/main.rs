//! jext4-bench-driver: the workloads of bench/run that no Debian tool models.
//! Each subcommand runs one workload in a directory of the filesystem under
//! test and prints one JSON line with its figures; bench/run does the rest
//! (images, mounts, repetitions, medians, tables).

mod blurt;
mod common;
mod exim;
mod lsm;
mod metafsync;
mod msgjournal;
mod smallwriters;
mod statstorm;
mod stream;
mod varmail;

use std::path::PathBuf;
use std::process::ExitCode;

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
        #[arg(long)]
        dir: PathBuf,
        #[arg(long, default_value_t = 1)]
        threads: usize,
        #[arg(long, default_value_t = 2.0)]
        seconds: f64,
    },
    /// filebench varmail: create/append/fsync/read/delete in one directory.
    Varmail {
        #[arg(long)]
        dir: PathBuf,
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
}

fn main() -> ExitCode {
    let result = match Cli::parse().workload {
        Workload::Metafsync {
            dir,
            threads,
            seconds,
        } => metafsync::run(dir, threads, seconds),
        Workload::Varmail {
            dir,
            threads,
            seconds,
            files,
            seed,
        } => varmail::run(dir, threads, seconds, files, seed),
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
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("jext4-bench-driver: {error}");
            ExitCode::FAILURE
        }
    }
}
