//! What the space budget costs far from full (issue 10, metric 5): the
//! same allocation-heavy workload through the library with the budget on
//! and off, for instruction counts under callgrind (load-independent) and
//! wall time.
//!
//! ```text
//! cargo build --release --example space_budget_cost
//! valgrind --tool=callgrind target/release/examples/space_budget_cost IMAGE on
//! valgrind --tool=callgrind target/release/examples/space_budget_cost IMAGE off
//! ```
//!
//! IMAGE is an ext4 image made fresh for each run (`mkfs.ext4 -F -q`, 1 GiB
//! or more keeps it far from full); it is changed. The workload is blurt's
//! shape on one thread: in each of 9 directories, 200 files written 40 ×
//! 1 KiB each in turn (every 1 KiB append to a new block is one
//! allocation, each charged), then 100 MiB written in 1 MiB pieces, then
//! every file removed. It prints its figures; the budget's counters show
//! that it charged (on) or did not (off). Figures are printed, never
//! asserted: a test does not time.

use jext4::engine::format::superblock::ROOT_INO;
use jext4::engine::fs::{Caller, Fs, MountOptions};
use std::path::PathBuf;
use std::time::Instant;

const DIRECTORIES: u32 = 9;
const FILES: u32 = 200;
const WRITES: u64 = 40;
const CHUNK: usize = 1024;
const BIG_MIB: u64 = 100;

fn main() {
    let mut args = std::env::args().skip(1);
    let (Some(image), Some(switch)) = (args.next(), args.next()) else {
        eprintln!("usage: space_budget_cost IMAGE on|off");
        std::process::exit(2);
    };
    let options = MountOptions {
        space_budget: match switch.as_str() {
            "on" => true,
            "off" => false,
            other => {
                eprintln!("space_budget_cost: {other:?}: expected on or off");
                std::process::exit(2);
            }
        },
        ..MountOptions::default()
    };
    let fs = Fs::open(&PathBuf::from(image), options).expect("mounting the image");
    let began = Instant::now();
    let names = small_files(&fs);
    big_file(&fs);
    remove_all(&fs, &names);
    fs.sync().expect("sync");
    let seconds = began.elapsed().as_secs_f64();
    let budget = fs.budget_stats();
    let alloc = fs.alloc_stats();
    println!(
        "budget {switch}: {seconds:.3} s, {} allocations, {} charges, {} backed out",
        alloc.calls, budget.charges, budget.backed_out
    );
    fs.unmount().expect("unmount");
}

/// Blurt's files, appended to in turn; returns (directory, name) of each.
fn small_files(fs: &Fs) -> Vec<(u32, Vec<u8>)> {
    let text = vec![b'x'; CHUNK];
    let mut files = Vec::new();
    for directory in 0..DIRECTORIES {
        let name = format!("d{directory}");
        let dir = fs
            .mkdir(ROOT_INO, name.as_bytes(), 0o755, Caller::ROOT)
            .expect("mkdir")
            .ino;
        let inodes: Vec<u32> = (0..FILES)
            .map(|file| {
                let name = format!("f{file}").into_bytes();
                let ino = fs.create(dir, &name, 0o644, Caller::ROOT).expect("create");
                files.push((dir, name));
                ino.ino
            })
            .collect();
        for write in 0..WRITES {
            for &ino in &inodes {
                fs.write(ino, write * CHUNK as u64, &text, Caller::ROOT)
                    .expect("write");
            }
        }
    }
    files
}

fn big_file(fs: &Fs) {
    let ino = fs
        .create(ROOT_INO, b"big", 0o644, Caller::ROOT)
        .expect("create")
        .ino;
    let piece = vec![b'y'; 1 << 20];
    for mib in 0..BIG_MIB {
        fs.write(ino, mib << 20, &piece, Caller::ROOT)
            .expect("write");
    }
}

fn remove_all(fs: &Fs, files: &[(u32, Vec<u8>)]) {
    for (dir, name) in files {
        fs.unlink(*dir, name, Caller::ROOT).expect("unlink");
    }
    fs.unlink(ROOT_INO, b"big", Caller::ROOT).expect("unlink");
}
