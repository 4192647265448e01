//! large_dir images, mounted read-write: a directory that jext4 grows to
//! a three-level htree (what large_dir allows beyond two) is e2fsck-clean
//! and the kernel lists, adds to and removes from it; jext4 then lists
//! what the kernel left.

// The jext4 binary, or the mounts and helpers of tests/common that use it.
#![cfg(feature = "cli")]

mod common;

use common::e2e::{self, KernelMount, path_str};
use jext4::Image;
use jext4::engine::fs::Caller;
use std::collections::BTreeSet;
use std::path::Path;

/// Enough long names to need a third index level with 1 KiB blocks: a
/// leaf holds three or four of them, two levels index about 15,000
/// leaves.
const ENTRIES: usize = 100_000;

fn name(i: usize) -> String {
    // 188 to 255 bytes.
    format!("{i:07}-{}", "n".repeat(180 + i % 68))
}

/// `Indirect levels` of /big's htree root, from debugfs.
fn indirect_levels(image: &Path) -> u32 {
    let htree = e2e::run_ok("debugfs", &["-R", "htree /big", path_str(image)]);
    let text = String::from_utf8_lossy(&htree.stdout);
    text.lines()
        .find_map(|line| line.trim().strip_prefix("Indirect levels: "))
        .and_then(|levels| levels.trim().parse().ok())
        .unwrap_or_else(|| panic!("debugfs htree /big: {text}"))
}

#[test]
fn a_three_level_directory_round_trips_with_the_kernel() {
    if !e2e::require_e2e() {
        return;
    }
    let scratch = e2e::scratch("large-dir");
    let image = common::mkfs(
        scratch.path(),
        "large-dir",
        400,
        &[
            "-t",
            "ext4",
            "-b",
            "1024",
            "-O",
            "large_dir",
            "-N",
            "131072",
        ],
    );
    {
        let image = Image::open(&image).expect("a large_dir image opens read-write");
        image.create_dir("/big").unwrap();
        let big = image.inode_of("/big", true).unwrap();
        let fs = image.fs();
        for i in 0..ENTRIES {
            fs.create(big, name(i).as_bytes(), 0o644, Caller::ROOT)
                .unwrap_or_else(|error| panic!("creating entry {i}: {error}"));
        }
        image.close().unwrap();
    }
    e2e::fsck_clean(&image, "after jext4 filled a large_dir directory");
    assert_eq!(indirect_levels(&image), 2, "three index levels");

    let mnt = scratch.path().join("mnt");
    let kernel = KernelMount::mount(&image, &mnt, false);
    let listed: BTreeSet<String> = std::fs::read_dir(kernel.path("big"))
        .unwrap()
        .map(|entry| entry.unwrap().file_name().into_string().unwrap())
        .collect();
    let mut expected: BTreeSet<String> = (0..ENTRIES).map(name).collect();
    assert!(listed == expected, "the kernel lists other names");
    for i in (0..ENTRIES).step_by(997) {
        std::fs::remove_file(kernel.path(&format!("big/{}", name(i)))).unwrap();
        expected.remove(&name(i));
    }
    for i in ENTRIES..ENTRIES + 100 {
        std::fs::File::create(kernel.path(&format!("big/{}", name(i)))).unwrap();
        expected.insert(name(i));
    }
    kernel.unmount();
    e2e::fsck_clean(&image, "after the kernel changed the directory");

    let image = Image::open_read_only(&image).unwrap();
    let ours: BTreeSet<String> = image
        .read_dir("/big")
        .unwrap()
        .map(|entry| entry.unwrap().file_name().into_string().unwrap())
        .collect();
    assert!(
        ours == expected,
        "jext4 lists other names than the kernel left"
    );
    for i in [1, ENTRIES / 2, ENTRIES + 99] {
        assert!(
            image
                .metadata(format!("/big/{}", name(i)))
                .unwrap()
                .is_file()
        );
    }
    image.close().unwrap();
}
