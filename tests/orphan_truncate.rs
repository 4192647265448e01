//! A large truncate (freed in chunks, one transaction each) of a file
//! unlinked while open keeps the file on the orphan records until its last
//! close: after a full commit and a crash with the file still open,
//! recovery frees it and `e2fsck -fn` finds the image clean.

mod common;

use jext4::engine::dev::{BlockDevice, FileDevice};
use jext4::engine::format::superblock::ROOT_INO;
use jext4::engine::fs::{Caller, Fs, MountOptions, SetAttr};
use std::sync::Arc;

#[test]
fn truncating_an_open_unlinked_file_keeps_it_an_orphan() {
    if !common::require_tool("mke2fs") || !common::require_tool("e2fsck") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = common::mkfs(dir.path(), "img", 64, &["-t", "ext4", "-b", "1024"]);
    let device = Arc::new(FileDevice::open(&image, false).unwrap());
    let fs = Fs::mount(device as Arc<dyn BlockDevice>, MountOptions::default()).unwrap();
    let ino = fs
        .create(ROOT_INO, b"big", 0o644, Caller::ROOT)
        .unwrap()
        .ino;
    // 4 MiB at 1 KiB blocks: more than one chunk (PUNCH_CHUNK_BLOCKS).
    fs.write(ino, 0, &vec![0x42; 4 << 20], Caller::ROOT)
        .unwrap();
    fs.open_file(ino).unwrap();
    fs.unlink(ROOT_INO, b"big", Caller::ROOT).unwrap();
    let truncate = SetAttr {
        size: Some(0),
        ..SetAttr::default()
    };
    fs.setattr(ino, &truncate, Caller::ROOT).unwrap();
    fs.sync().unwrap();
    // A crash now, the file still open.
    let crashed = dir.path().join("crashed.img");
    std::fs::copy(&image, &crashed).unwrap();
    jext4::engine::fs::recover_image(&crashed).unwrap();
    common::assert_fsck_clean(&crashed);
    fs.release_file(ino).unwrap();
    fs.unmount().unwrap();
    drop(fs);
    common::assert_fsck_clean(&image);
}
