//! The recording is complete and survives the dm-log-writes format: a real
//! mount, workload and unmount recorded, written as a dm-log-writes log,
//! read back, and replayed onto the starting image gives exactly the disk
//! the engine left.

#![cfg(feature = "crashtest")]

mod common;

use jext4::engine::crash::logwrites::{read_log, write_log};
use jext4::engine::crash::tools::{Scratch, make_template};
use jext4::engine::dev::{BlockDevice, MemoryDevice, Record, RecordingDevice};
use jext4::engine::fs::{Caller, Fs, MountOptions};
use std::sync::Arc;

#[test]
fn a_recorded_run_replays_from_its_dm_log_writes_log() {
    if !common::require_tool("mke2fs") {
        return;
    }
    let scratch = Scratch::new().unwrap();
    let start = make_template(&scratch, 1024, 16, false).unwrap();
    let memory = Arc::new(MemoryDevice::from_bytes(start.clone()));
    let device = Arc::new(RecordingDevice::new(memory.clone()));
    let fs = Fs::mount(device.clone(), MountOptions::default()).unwrap();
    let root = jext4::engine::format::superblock::ROOT_INO;
    let dir = fs.mkdir(root, b"d", 0o755, Caller::ROOT).unwrap();
    for index in 0..20u8 {
        let name = format!("f{index}");
        let file = fs
            .create(dir.ino, name.as_bytes(), 0o644, Caller::ROOT)
            .unwrap();
        fs.write(file.ino, 0, &vec![index; 3000], Caller::ROOT)
            .unwrap();
        device.mark(format!("op 0 {index} ack"));
        if index % 5 == 4 {
            fs.fsync(file.ino, false).unwrap();
        }
    }
    fs.unmount().unwrap();
    let log = device.take_log();
    assert!(log.iter().filter(|r| matches!(r, Record::Flush)).count() >= 8);
    let path = scratch.path("run.log");
    write_log(&mut std::fs::File::create(&path).unwrap(), &log).unwrap();
    let back = read_log(&mut std::fs::File::open(&path).unwrap()).unwrap();
    assert_eq!(back, log);
    let mut replayed = start;
    for record in &back {
        if let Record::Write { offset, data } = record {
            replayed[*offset as usize..*offset as usize + data.len()].copy_from_slice(data);
        }
    }
    let mut left = vec![0u8; memory.size_bytes() as usize];
    memory.read_at(0, &mut left).unwrap();
    assert!(replayed == left, "the log misses writes the engine made");
}
