//! The NBD client as a block device, against real servers on
//! loopback (nbdkit): reads, writes, flushes, FUA, TRIM; the server's
//! block-size constraints (read-modify-write below its minimum block) and
//! its CAN_MULTI_CONN and read-only flags; export names; and one clear
//! line for every URI, server or export that cannot be used.

// The jext4 binary, or the mounts and helpers of tests/common that use it.
#![cfg(feature = "cli")]

mod common;

use common::nbd::{Listen, NbdServer, device, servers_available};
use jext4::engine::dev::{BlockDevice, NbdDevice, NbdUri};
use std::process::Command;
use std::sync::Arc;

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut rng = common::workload::Rng::new(seed);
    rng.bytes(len)
}

#[test]
fn reads_writes_flushes_fua_and_trim_over_nbdkit_memory() {
    if !servers_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    for listen in [Listen::Unix, Listen::Tcp] {
        let server = NbdServer::nbdkit(dir.path(), "memory", listen, &["memory", "size=8M"]);
        let device = device(&server.uri);
        assert_eq!(device.size_bytes(), 8 << 20);
        // nbdkit's memory plugin shares one store between connections.
        assert_eq!(device.connection_count(), 4, "{listen:?}");
        let data = pattern(1, 3 << 20);
        device.write_at(512, &data).unwrap();
        assert!(device.unflushed_bytes() >= data.len(), "kept for a replay");
        let mut back = vec![0u8; data.len()];
        device.read_at(512, &mut back).unwrap();
        assert!(back == data, "{listen:?}: read back differs");
        device.flush().unwrap();
        assert_eq!(device.unflushed_bytes(), 0, "a flush covers every write");

        device.write_at_durable(4 << 20, &[7u8; 4096]).unwrap();
        let mut block = [0u8; 4096];
        device.read_at(4 << 20, &mut block).unwrap();
        assert_eq!(block, [7u8; 4096]);

        // The memory plugin frees trimmed pages: they read as zeros.
        device.trim(1 << 20, 1 << 20).unwrap();
        let mut trimmed = vec![1u8; 1 << 20];
        device.read_at(1 << 20, &mut trimmed).unwrap();
        assert!(trimmed.iter().all(|&byte| byte == 0), "TRIM was not sent");
        device.read_at(512, &mut back[..4096]).unwrap();
        assert_eq!(
            &back[..4096],
            &data[..4096],
            "trim reached outside its range"
        );

        let error = device
            .read_at((8 << 20) - 512, &mut [0u8; 1024])
            .unwrap_err();
        assert!(error.to_string().contains("beyond device end"), "{error}");
    }
}

/// Writes are held back until a flush (`src/dev/nbd/plug.rs`): 256
/// neighbouring 4 KiB writes and rewrites of one block reach the server
/// as a few long writes, reads of what is held back never reach it, and
/// after the flush another client reads every byte.
#[test]
fn writes_held_back_merge_and_reads_are_served_from_them() {
    if !servers_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("requests.log");
    let logfile = format!("logfile={}", log.display());
    let server = NbdServer::nbdkit(
        dir.path(),
        "plug",
        Listen::Unix,
        &["--filter=log", "memory", "size=8M", &logfile],
    );
    let device = device(&server.uri);
    let data = pattern(7, 1 << 20);
    for (index, block) in data.chunks(4096).enumerate() {
        device.write_at(index as u64 * 4096, block).unwrap();
        // tar's pattern: the next record rewrites the block the last ended in.
        if index > 0 {
            let mut previous = vec![0u8; 4096];
            device
                .read_at((index as u64 - 1) * 4096, &mut previous)
                .unwrap();
            assert!(previous == data[(index - 1) * 4096..index * 4096]);
            device
                .write_at((index as u64 - 1) * 4096, &previous)
                .unwrap();
        }
    }
    assert!(device.unflushed_bytes() >= data.len());
    let requests = |kind: &str| logged(&log, kind);
    assert_eq!(requests("Write"), 0, "nothing is sent before the flush");
    assert_eq!(requests("Read"), 0, "held-back bytes are read from memory");
    device.flush().unwrap();
    assert_eq!(device.unflushed_bytes(), 0);
    let writes = requests("Write");
    assert!(
        (1..=4).contains(&writes),
        "511 writes of 256 neighbouring blocks reached the server as {writes}"
    );
    // All the flush had to cover was held back as one request: it went
    // with FUA, and no flush followed.
    assert_eq!(requests("Flush"), 0);
    assert_eq!(fua_writes(&log), 1);
    let other = common::nbd::device(&server.uri);
    let mut back = vec![0u8; data.len()];
    other.read_at(0, &mut back).unwrap();
    assert!(back == data, "another client reads what the flush sent");
}

/// Requests of `kind` (nbdkit's name: Read, Write, Flush) in nbdkit's log.
fn logged(log: &std::path::Path, kind: &str) -> usize {
    std::fs::read_to_string(log)
        .unwrap()
        .lines()
        .filter(|line| line.contains(&format!(" {kind} id=")))
        .count()
}

/// Writes in nbdkit's log sent with FUA.
fn fua_writes(log: &std::path::Path) -> usize {
    std::fs::read_to_string(log)
        .unwrap()
        .lines()
        .filter(|line| line.contains(" Write id=") && line.contains("fua=1"))
        .count()
}

/// A flush costs one round trip when one held-back request is all it must
/// make durable (a FUA write), and is an ordinary flush otherwise: two
/// requests apart, a write already sent, or a server without FUA.
#[test]
fn a_flush_of_one_held_back_request_is_one_fua_write() {
    if !servers_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    for name in ["fua", "nofua"] {
        let log = dir.path().join(format!("{name}.log"));
        let logfile = format!("logfile={}", log.display());
        // The log filter outermost: it sees what the client sends.
        let mut args = vec!["--filter=log"];
        if name == "nofua" {
            // The fua filter's default: FUA not offered.
            args.extend(["--filter=fua", "memory", "size=8M"]);
        } else {
            args.extend(["memory", "size=8M"]);
        }
        args.push(&logfile);
        let server = NbdServer::nbdkit(dir.path(), name, Listen::Unix, &args);
        let device = device(&server.uri);
        let count = |kind: &str| logged(&log, kind);
        let fua = name == "fua";
        // One block: a FUA write alone.
        device.write_at(8192, &[1u8; 4096]).unwrap();
        device.flush().unwrap();
        assert_eq!(device.unflushed_bytes(), 0);
        assert_eq!(
            (count("Write"), count("Flush")),
            (1, usize::from(!fua)),
            "{name}"
        );
        assert_eq!(fua_writes(&log), usize::from(fua), "{name}");
        // Two blocks apart: two writes and a flush.
        device.write_at(0, &[2u8; 4096]).unwrap();
        device.write_at(1 << 20, &[3u8; 4096]).unwrap();
        device.flush().unwrap();
        assert_eq!(
            (count("Write"), count("Flush")),
            (3, 1 + usize::from(!fua)),
            "{name}"
        );
        // A write already sent (a FUA write sends what the plug holds) is
        // not covered by a FUA write of another: a flush follows.
        device.write_at(2 << 20, &[4u8; 4096]).unwrap();
        device.write_at_durable(3 << 20, &[5u8; 4096]).unwrap();
        device.write_at(4 << 20, &[6u8; 4096]).unwrap();
        device.flush().unwrap();
        assert_eq!(count("Flush"), 2 + usize::from(!fua) * 2, "{name}");
        assert_eq!(device.unflushed_bytes(), 0);
        let other = common::nbd::device(&server.uri);
        for (at, byte) in [
            (8192, 1u8),
            (0, 2),
            (1 << 20, 3),
            (2 << 20, 4),
            (3 << 20, 5),
            (4 << 20, 6),
        ] {
            let mut back = [0u8; 4096];
            other.read_at(at, &mut back).unwrap();
            assert_eq!(back, [byte; 4096], "{name}: block at {at}");
        }
    }
}

#[test]
fn one_connection_without_multi_conn() {
    if !servers_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let server = NbdServer::nbdkit(
        dir.path(),
        "single",
        Listen::Unix,
        &[
            "--filter=multi-conn",
            "memory",
            "size=1M",
            "multi-conn-mode=disable",
        ],
    );
    let device = device(&server.uri_with("", "x-connections=8"));
    assert_eq!(device.connection_count(), 1);
    let server = NbdServer::nbdkit(dir.path(), "multi", Listen::Unix, &["memory", "size=1M"]);
    assert_eq!(device_count(&server.uri_with("", "x-connections=2")), 2);
}

fn device_count(uri: &str) -> usize {
    device(uri).connection_count()
}

/// A server whose minimum block is 4 KiB refuses smaller requests
/// (blocksize-error-policy=error); 512-byte writes from many threads into
/// the same 4 KiB blocks must all land (read-modify-write, one at a time).
#[test]
fn small_writes_below_the_servers_minimum_block() {
    if !servers_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let server = NbdServer::nbdkit(
        dir.path(),
        "minimum",
        Listen::Unix,
        &[
            "--filter=blocksize-policy",
            "memory",
            "size=1M",
            "blocksize-minimum=4096",
            "blocksize-error-policy=error",
        ],
    );
    let device = Arc::new(device(&server.uri));
    assert_eq!(device.export_info().min_block, 4096);
    let threads: Vec<_> = (0..8u64)
        .map(|thread| {
            let device = Arc::clone(&device);
            std::thread::spawn(move || {
                // Thread t writes sector t of each of the first 16 blocks.
                for block in 0..16u64 {
                    let offset = block * 4096 + thread * 512;
                    device.write_at(offset, &[thread as u8 + 1; 512]).unwrap();
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    let mut all = vec![0u8; 16 * 4096];
    device.read_at(0, &mut all).unwrap();
    for (index, sector) in all.chunks(512).enumerate() {
        let expected = (index % 8) as u8 + 1;
        assert!(
            sector.iter().all(|&b| b == expected),
            "sector {index} lost a write"
        );
    }
    // An unaligned read in the middle of a server block.
    let mut one = [0u8; 512];
    device.read_at(4096 + 1536, &mut one).unwrap();
    assert_eq!(one, [4u8; 512]);
}

#[test]
fn read_only_export_mounts_read_only() {
    if !servers_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = common::mkfs(dir.path(), "ro", 16, &["-t", "ext4", "-b", "1024"]);
    let server = NbdServer::nbdkit(
        dir.path(),
        "ro",
        Listen::Unix,
        &["--readonly", "file", image.to_str().unwrap()],
    );
    let device = device(&server.uri);
    assert!(device.is_read_only());
    let error = device.write_at(0, &[0u8; 512]).unwrap_err();
    assert_eq!(error.raw_os_error(), Some(libc::EROFS));
    drop(device);
    let opened = jext4::Image::open(&server.uri).unwrap();
    assert!(opened.fs().is_read_only());
    let names: Vec<Vec<u8>> = opened
        .read_dir("/")
        .unwrap()
        .map(|e| std::os::unix::ffi::OsStringExt::into_vec(e.unwrap().file_name()))
        .collect();
    assert_eq!(names, vec![b"lost+found".to_vec()]);
    let error = opened.create_dir("/x").unwrap_err();
    assert_eq!(error.errno(), libc::EROFS, "{error}");
}

#[test]
fn export_names_select_and_missing_ones_are_named() {
    if !servers_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let server = NbdServer::nbdkit(
        dir.path(),
        "names",
        Listen::Tcp,
        &[
            "--filter=exportname",
            "memory",
            "size=1M",
            "exportname-strict=true",
            "exportname=disk one",
        ],
    );
    let uri = server.uri_with("disk%20one", "");
    assert_eq!(device(&uri).size_bytes(), 1 << 20);
    let missing = server.uri_with("nope", "");
    let error = NbdDevice::open(&NbdUri::parse(&missing).unwrap(), false)
        .err()
        .expect("no such export");
    assert!(
        error.to_string().contains("no export named 'nope'"),
        "{error}"
    );
    let said = jext4_fails(&["recover", &missing]);
    assert!(said.contains("no export named 'nope'"), "{said}");
}

/// `jext4 ARGS` must fail with exactly one line on stderr; returns it.
fn jext4_fails(args: &[&str]) -> String {
    let output = Command::new(common::server::JEXT4)
        .args(args)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert_eq!(output.status.code(), Some(1), "jext4 {args:?}: {stderr}");
    assert_eq!(stderr.lines().count(), 1, "jext4 {args:?} said:\n{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    stderr
}

#[test]
fn bad_uris_and_unreachable_servers_get_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let mountpoint = dir.path().join("mnt");
    std::fs::create_dir(&mountpoint).unwrap();
    let mnt = mountpoint.to_str().unwrap();
    let nowhere = format!("nbd+unix:///x?socket={}/none.sock", dir.path().display());
    for (args, says) in [
        (vec!["mount", "nbds://127.0.0.1/x", mnt], "TLS"),
        (vec!["recover", "nbds+unix:///x?socket=/s"], "TLS"),
        (vec!["logdump", "nbd://127.0.0.1:0/x"], "port"),
        (vec!["mount", "nbd+unix:///x", mnt], "socket=PATH"),
        (
            vec!["recover", "nbd://127.0.0.1/x?bogus=1"],
            "unknown parameter 'bogus'",
        ),
        (
            vec!["recover", nowhere.as_str()],
            "cannot connect to NBD server",
        ),
        (
            vec!["logdump", "nbd://host.invalid/x"],
            "cannot resolve host.invalid",
        ),
    ] {
        let said = jext4_fails(&args);
        assert!(said.contains(says), "jext4 {args:?}: {said}");
    }
    // The mount of an unreachable server is refused before FUSE starts.
    let said = jext4_fails(&["mount", &nowhere, mnt]);
    assert!(said.contains("cannot connect to NBD server"), "{said}");
    assert!(!common::e2e::is_mount_point(&mountpoint));
}

#[test]
fn oldstyle_servers_are_refused_by_name() {
    if !servers_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let server = NbdServer::nbdkit(
        dir.path(),
        "old",
        Listen::Tcp,
        &["--oldstyle", "memory", "size=1M"],
    );
    let said = jext4_fails(&["logdump", &server.uri]);
    assert!(said.contains("oldstyle"), "{said}");
}
