//! Writes that cover blocks partly keep the bytes around them: overwrites
//! whose edges fall inside blocks (one block, two, many), appends inside a
//! block, and writes into fresh blocks past the end, checked against a
//! plain byte model after every write and after a remount, on 1 KiB and
//! 4 KiB blocks; e2fsck finds the image clean.

// The jext4 binary, or the mounts and helpers of tests/common that use it.
#![cfg(feature = "cli")]

mod common;

use common::e2e;
use jext4::engine::format::superblock::ROOT_INO;
use jext4::engine::fs::{Caller, Fs, MountOptions};

/// (offset, length) in turn: a base, then edges at every place a block
/// can be cut.
const WRITES: [(u64, usize); 12] = [
    (0, 40_000),
    (1000, 5000),
    (4095, 2),
    (8191, 4098),
    (100, 10),
    (1023, 1),
    (12_000, 300),
    (40_000, 777),
    (40_777, 5000),
    (30_001, 9_998),
    (70_000, 3),
    (65_000, 5_500),
];

fn write_model(model: &mut Vec<u8>, at: u64, data: &[u8]) {
    let end = at as usize + data.len();
    if model.len() < end {
        model.resize(end, 0);
    }
    model[at as usize..end].copy_from_slice(data);
}

fn read_all(fs: &Fs, ino: u32) -> Vec<u8> {
    let size = fs.getattr(ino).unwrap().size;
    fs.read(ino, 0, size as usize + 100).unwrap()
}

#[test]
fn partial_block_writes_keep_the_bytes_around_them() {
    if !e2e::require_e2e() {
        return;
    }
    for block_size in [1024u32, 4096] {
        let scratch = e2e::scratch("overwrite");
        let block = block_size.to_string();
        let image = common::mkfs(scratch.path(), "ow", 16, &["-t", "ext4", "-b", &block]);
        let fs = Fs::open(&image, MountOptions::default()).unwrap();
        let ino = fs.create(ROOT_INO, b"f", 0o644, Caller::ROOT).unwrap().ino;
        let mut model = Vec::new();
        for (seed, &(at, len)) in WRITES.iter().enumerate() {
            let data = e2e::pattern(seed as u64 + 1, len);
            fs.write(ino, at, &data, Caller::ROOT).unwrap();
            write_model(&mut model, at, &data);
            assert!(
                read_all(&fs, ino) == model,
                "{block_size}-byte blocks: after writing {len} bytes at {at}"
            );
        }
        fs.unmount().unwrap();
        drop(fs);
        let fs = Fs::open(&image, MountOptions::default()).unwrap();
        assert!(
            read_all(&fs, ino) == model,
            "{block_size}-byte blocks: after a remount"
        );
        fs.unmount().unwrap();
        drop(fs);
        e2e::fsck_clean(&image, "after partial block writes");
    }
}
