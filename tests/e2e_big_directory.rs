//! One directory of 100,000 entries made by jext4 (most
//! through the library, the rest through FUSE) is e2fsck-clean and the
//! kernel lists every name; a lookup in it costs about what it costs in a
//! 100-entry directory. The lookup times are printed, not asserted: they
//! go into the closing note.

// The jext4 binary, or the mounts and helpers of tests/common that use it.
#![cfg(feature = "cli")]

mod common;

use common::e2e::{self, JextMount, KernelMount};
use jext4::Image;
use jext4::engine::fs::Caller;
use std::collections::BTreeSet;
use std::fs;
use std::time::{Duration, Instant};

const ENTRIES: usize = 100_000;
const THROUGH_FUSE: usize = 1_000;
const SMALL_ENTRIES: usize = 100;

fn name(i: usize) -> String {
    // Varied lengths, so that leaf blocks hold different numbers of names.
    format!("entry-{i:06}-{}", "x".repeat(i % 23))
}

/// A fixed pseudo-random sample of indices below `bound`.
fn sample(bound: usize, count: usize) -> Vec<usize> {
    let mut rng = jext4::engine::rng::Rng::new(0x2545_F491_4F6C_DD1D);
    (0..count)
        .map(|_| rng.below(bound as u64) as usize)
        .collect()
}

fn median(mut times: Vec<Duration>) -> Duration {
    times.sort();
    times[times.len() / 2]
}

#[test]
fn e2e_big_directory() {
    if !e2e::require_e2e() {
        return;
    }
    let started = Instant::now();
    let scratch = e2e::scratch("bigdir");
    // 1 KiB blocks: 100,000 names need a two-level htree index here.
    let image = common::mkfs(
        scratch.path(),
        "bigdir",
        256,
        &["-t", "ext4", "-b", "1024", "-N", "131072"],
    );
    let library_entries = ENTRIES - THROUGH_FUSE;
    let (in_process_big, in_process_small) = build_with_library(&image, library_entries);
    let built = started.elapsed();

    let mnt = scratch.path().join("mnt");
    let mount = JextMount::mount(&image, &mnt, "");
    for i in library_entries..ENTRIES {
        fs::File::create(mnt.join("big").join(name(i))).unwrap();
    }
    // Names not looked up through this mount yet: each stat is a FUSE lookup.
    let fuse_big: Vec<Duration> = sample(library_entries, 2000)
        .into_iter()
        .collect::<BTreeSet<_>>()
        .into_iter()
        .map(|i| timed_stat(&mnt.join("big").join(name(i))))
        .collect();
    let fuse_small: Vec<Duration> = (0..SMALL_ENTRIES)
        .map(|i| timed_stat(&mnt.join("small").join(name(i))))
        .collect();
    let listed = fs::read_dir(mnt.join("big")).unwrap().count();
    assert_eq!(listed, ENTRIES, "readdir through jext4");
    mount.unmount();
    e2e::fsck_clean(&image, "after 100,000 entries");
    let htree = e2e::run_ok("debugfs", &["-R", "htree /big", e2e::path_str(&image)]);
    let levels = String::from_utf8_lossy(&htree.stdout)
        .lines()
        .find(|line| line.contains("Indirect levels"))
        .map(str::trim)
        .unwrap_or("Indirect levels: ?")
        .to_string();

    let kernel = KernelMount::mount(&image, &mnt, true);
    let names: BTreeSet<String> = fs::read_dir(kernel.path("big"))
        .unwrap()
        .map(|entry| entry.unwrap().file_name().into_string().unwrap())
        .collect();
    kernel.unmount();
    let expected: BTreeSet<String> = (0..ENTRIES).map(name).collect();
    assert_eq!(names.len(), ENTRIES, "the kernel lists every entry");
    assert!(names == expected, "the kernel lists other names");

    eprintln!(
        "big directory: {ENTRIES} entries ({levels}), built in {:.1}s, test {:.1}s",
        built.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
    eprintln!(
        "lookup, in-process Fs::lookup (warm cache), median: {:?} in {ENTRIES} entries, {:?} in {SMALL_ENTRIES}",
        in_process_big, in_process_small
    );
    eprintln!(
        "lookup, stat() through FUSE (first lookup of each name), median: {:?} in {ENTRIES} entries, {:?} in {SMALL_ENTRIES}",
        median(fuse_big),
        median(fuse_small)
    );
}

/// Create the big and the small directory through the library and time
/// lookups in-process; returns the medians (big, small).
fn build_with_library(image: &std::path::Path, entries: usize) -> (Duration, Duration) {
    let image = Image::open(image).expect("opening the image with the library");
    let fs = image.fs();
    image.create_dir("/big").unwrap();
    image.create_dir("/small").unwrap();
    let big = image.inode_of("/big", true).unwrap();
    let small = image.inode_of("/small", true).unwrap();
    for i in 0..entries {
        fs.create(big, name(i).as_bytes(), 0o644, Caller::ROOT)
            .unwrap_or_else(|error| panic!("creating entry {i}: {error}"));
    }
    for i in 0..SMALL_ENTRIES {
        fs.create(small, name(i).as_bytes(), 0o644, Caller::ROOT)
            .unwrap();
    }
    let time_lookups = |dir: u32, indices: Vec<usize>| {
        let times: Vec<Duration> = indices
            .into_iter()
            .map(|i| {
                let start = Instant::now();
                fs.lookup(dir, name(i).as_bytes()).unwrap();
                start.elapsed()
            })
            .collect();
        median(times)
    };
    let big_median = time_lookups(big, sample(entries, 20_000));
    let small_median = time_lookups(small, sample(SMALL_ENTRIES, 20_000));
    // Names that do not exist cost a full probe too.
    assert!(fs.lookup(big, b"no-such-entry").is_err());
    image.close().expect("closing the image");
    (big_median, small_median)
}

fn timed_stat(path: &std::path::Path) -> Duration {
    let start = Instant::now();
    fs::symlink_metadata(path).unwrap_or_else(|error| panic!("stat {}: {error}", path.display()));
    start.elapsed()
}
