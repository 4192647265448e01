//! Faults over NBD: a server that fails writes (nbdkit's `error`
//! filter: EIO, ENOSPC, at a chosen rate) or flushes (a script plugin)
//! turns the filesystem read-only with one clear line, and nothing
//! acknowledged is lost; a slow server (`delay` filter) changes nothing
//! but time; a server killed and restarted in the middle of a workload is
//! reconnected to, the writes it lost replayed; a server that stays away
//! longer than the reconnect timeout turns the filesystem read-only, and
//! `jext4 recover` once it is back leaves a clean image with every
//! fsync'd file; so does a server that hangs (stopped: connections open,
//! nothing answered), once `x-io-timeout` and the reconnect timeout run
//! out — never a hang.

// The jext4 binary, or the mounts and helpers of tests/common that use it.
#![cfg(feature = "cli")]

mod common;

use common::e2e;
use common::nbd::{Listen, NbdServer, servers_available};
use jext4::Image;
use std::collections::BTreeMap;
use std::os::unix::fs::FileExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Files whose fsync returned success: name → content.
type Durable = BTreeMap<String, Vec<u8>>;

fn content(n: usize) -> Vec<u8> {
    e2e::pattern(n as u64 + 1, 3000 + (n * 997) % 9000)
}

/// Create, write and fsync files through the library until an operation
/// fails; `trigger` runs after `before_fault` files. Returns the durable
/// files and the error.
fn fsync_until_error(
    image: &Image,
    before_fault: usize,
    trigger: impl FnOnce(),
) -> (Durable, jext4::Error) {
    let mut durable = Durable::new();
    let mut trigger = Some(trigger);
    for n in 0..2000 {
        if n == before_fault {
            (trigger.take().unwrap())();
        }
        let name = format!("/f{n}");
        let data = content(n);
        let result = image
            .open_with(
                &name,
                jext4::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .create(true)
                    .mode(0o644),
            )
            .and_then(|file| {
                file.write_all_at(&data, 0)?;
                file.sync_all()
            });
        match result {
            Ok(()) => {
                durable.insert(name, data);
            }
            Err(error) => return (durable, error),
        }
    }
    panic!("2000 files without an error: the fault was not injected");
}

/// After the fault: further changes are refused with EROFS.
fn assert_read_only(image: &Image) {
    assert!(
        image.fs().is_read_only(),
        "the filesystem is still writable"
    );
    let error = image.create_dir("/after").unwrap_err();
    assert_eq!(error.errno(), libc::EROFS, "{error}");
}

/// The image is clean once recovered and holds every durable file.
fn assert_recovered_with(raw: &Path, durable: &Durable) {
    e2e::fsck_clean(raw, "after jext4 recover");
    let options = jext4::engine::fs::MountOptions {
        read_only: true,
        ..Default::default()
    };
    let image = Image::options().mount_options(options).open(raw).unwrap();
    for (name, data) in durable {
        let read = image
            .read(name)
            .unwrap_or_else(|error| panic!("{name}, fsync'd before the fault: {error}"));
        assert!(&read == data, "{name}: content differs");
    }
}

fn recover(uri: &str) {
    let output = std::process::Command::new(common::server::JEXT4)
        .args(["recover", uri])
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "jext4 recover {uri}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// nbdkit's error filter on writes, armed by a trigger file.
fn write_errors(error: &str, rate: &str) {
    if !servers_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let raw = common::mkfs(dir.path(), "img", 32, &["-t", "ext4", "-b", "1024"]);
    let trigger = dir.path().join("inject");
    let server = NbdServer::nbdkit(
        dir.path(),
        "errors",
        Listen::Unix,
        &[
            "--filter=error",
            "file",
            e2e::path_str(&raw),
            &format!("error-pwrite={error}"),
            &format!("error-pwrite-rate={rate}"),
            &format!("error-pwrite-file={}", trigger.display()),
        ],
    );
    let image = Image::open(&server.uri).unwrap();
    let (durable, failure) = fsync_until_error(&image, 20, || {
        std::fs::write(&trigger, b"").unwrap();
    });
    assert!(durable.len() >= 20);
    let said = failure.to_string();
    assert!(
        said.contains(error) && said.contains("NBD"),
        "the error names the cause: {said}"
    );
    assert_read_only(&image);
    let _ = image.close();
    std::fs::remove_file(&trigger).unwrap();
    recover(&server.uri);
    drop(server);
    assert_recovered_with(&raw, &durable);
}

#[test]
fn eio_on_half_the_writes() {
    write_errors("EIO", "50%");
}

#[test]
fn enospc_on_every_write() {
    write_errors("ENOSPC", "100%");
}

/// nbdkit 1.32's error filter cannot fail flushes: a script plugin does
/// (slowly: a process per request, so the workload is small).
#[test]
fn eio_on_flush() {
    if !servers_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let raw = common::mkfs(dir.path(), "img", 16, &["-t", "ext4", "-b", "4096"]);
    let trigger = dir.path().join("inject");
    let script = dir.path().join("disk.sh");
    std::fs::write(
        &script,
        format!(
            r#"#!/bin/sh
disk={disk}
case "$1" in
  get_size) stat -L -c %s "$disk" ;;
  can_write|can_flush) exit 0 ;;
  pread) exec dd if="$disk" skip="$4" count="$3" iflag=skip_bytes,count_bytes status=none ;;
  pwrite) exec dd of="$disk" seek="$4" conv=notrunc oflag=seek_bytes status=none ;;
  flush)
    if [ -e {trigger} ]; then echo "EIO injected flush error" >&2; exit 1; fi ;;
  *) exit 2 ;;
esac
"#,
            disk = raw.display(),
            trigger = trigger.display()
        ),
    )
    .unwrap();
    e2e::set_mode(&script, 0o755);
    let server = NbdServer::nbdkit(
        dir.path(),
        "flush",
        Listen::Unix,
        &["sh", e2e::path_str(&script)],
    );
    let image = Image::open(&server.uri).unwrap();
    let (durable, failure) = fsync_until_error(&image, 5, || {
        std::fs::write(&trigger, b"").unwrap();
    });
    assert_eq!(durable.len(), 5, "the first fsync after the fault fails");
    let said = failure.to_string();
    assert!(said.contains("flush") && said.contains("NBD_EIO"), "{said}");
    assert_read_only(&image);
    let _ = image.close();
    std::fs::remove_file(&trigger).unwrap();
    recover(&server.uri);
    drop(server);
    assert_recovered_with(&raw, &durable);
}

/// Latency on every request (nbdkit's delay filter): slower, and the same.
#[test]
fn delayed_server() {
    if !servers_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let raw = common::mkfs(dir.path(), "img", 16, &["-t", "ext4", "-b", "1024"]);
    let server = NbdServer::nbdkit(
        dir.path(),
        "delay",
        Listen::Tcp,
        &[
            "--filter=delay",
            "file",
            e2e::path_str(&raw),
            "delay-read=2ms",
            "delay-write=2ms",
        ],
    );
    let image = Image::open(&server.uri).unwrap();
    let started = Instant::now();
    let mut durable = Durable::new();
    for n in 0..10 {
        let name = format!("/f{n}");
        image.write(&name, content(n)).unwrap();
        image.open_file(&name).unwrap().sync_all().unwrap();
        durable.insert(name, content(n));
    }
    image.close().unwrap();
    assert!(
        started.elapsed() > Duration::from_millis(20),
        "the delay filter did nothing"
    );
    drop(server);
    assert_recovered_with(&raw, &durable);
}

/// A hung server (SIGSTOP: its socket still accepts, nothing answers):
/// the reply timeout (`x-io-timeout`) takes the connection for lost, the
/// reconnects time out in their handshake, and after the reconnect
/// timeout the filesystem turns read-only with EIO — bounded, where
/// without a reply timeout the fsync would wait forever. Once the server
/// runs again, `jext4 recover` leaves every fsync'd file.
#[test]
fn hung_server_times_out() {
    if !servers_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let raw = common::mkfs(dir.path(), "img", 32, &["-t", "ext4", "-b", "1024"]);
    let server = NbdServer::nbdkit(
        dir.path(),
        "hung",
        Listen::Unix,
        &["file", e2e::path_str(&raw)],
    );
    let uri = server.uri_with("", "x-io-timeout=1&x-reconnect-timeout=2");
    let (done, finished) = std::sync::mpsc::channel();
    let worker = std::thread::spawn(move || {
        let image = Image::open(&uri).unwrap();
        let (durable, failure) = fsync_until_error(&image, 20, || server.freeze(true));
        let _ = done.send(());
        assert_eq!(failure.errno(), libc::EIO, "{failure}");
        let said = failure.to_string();
        assert!(said.contains("gave up reconnecting"), "{said}");
        assert_read_only(&image);
        server.freeze(false);
        let _ = image.close();
        (server, durable)
    });
    // Bounded by the timeouts (about 4 s); a hang is the failure.
    if finished.recv_timeout(Duration::from_secs(120)).is_err() {
        panic!("the fsync to a hung server never returned");
    }
    let (server, durable) = worker.join().unwrap();
    recover(&server.uri);
    drop(server);
    assert!(durable.len() >= 20);
    assert_recovered_with(&raw, &durable);
}

/// A FUSE mount writing fsync'd files from a thread; returns the durable
/// ones when `stop` is set or the first write fails.
fn fsync_writer(
    root: PathBuf,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<(Durable, Option<std::io::Error>)> {
    std::thread::spawn(move || {
        use std::io::Write;
        let mut durable = Durable::new();
        for n in 0..100_000 {
            if stop.load(Ordering::Acquire) {
                return (durable, None);
            }
            let name = format!("/f{n}");
            let data = content(n);
            let result = std::fs::File::create(root.join(&name[1..])).and_then(|mut file| {
                file.write_all(&data)?;
                file.sync_all()
            });
            match result {
                Ok(()) => {
                    durable.insert(name, data);
                }
                Err(error) => return (durable, Some(error)),
            }
        }
        (durable, None)
    })
}

/// The server is killed and restarted while files are being written and
/// fsync'd. nbdkit's cache filter in writeback mode keeps writes in memory
/// until a flush, so the restart loses what was acknowledged but not
/// flushed, as a real server's cache would: the client must write it again.
#[test]
fn server_killed_and_restarted_mid_workload() {
    if !servers_available() || !e2e::require_e2e() {
        return;
    }
    let dir = e2e::scratch("nbd-restart");
    let raw = common::mkfs(dir.path(), "img", 32, &["-t", "ext4", "-b", "1024"]);
    let mut server = NbdServer::nbdkit(
        dir.path(),
        "restart",
        Listen::Unix,
        &[
            "--filter=cache",
            "file",
            e2e::path_str(&raw),
            "cache=writeback",
        ],
    );
    let uri = server.uri_with("", "x-reconnect-timeout=20");
    let (mount, mountpoint) = common::nbd::mount(dir.path(), &uri);
    let stop = Arc::new(AtomicBool::new(false));
    let writer = fsync_writer(mountpoint.clone(), Arc::clone(&stop));
    std::thread::sleep(Duration::from_millis(700));
    server.kill9();
    std::thread::sleep(Duration::from_millis(300));
    server.start();
    std::thread::sleep(Duration::from_millis(700));
    stop.store(true, Ordering::Release);
    let (durable, error) = writer.join().unwrap();
    let log = mount.server_log();
    assert!(
        error.is_none(),
        "a write failed across the restart: {error:?}\n{log}"
    );
    assert!(
        log.contains("NBD connection restored"),
        "no reconnect:\n{log}"
    );
    mount.unmount();
    drop(server);
    e2e::fsck_clean(&raw, "after a server restart");
    recover(e2e::path_str(&raw));
    assert!(durable.len() > 20, "only {} files", durable.len());
    assert_recovered_with(&raw, &durable);
}

/// The server stays away longer than the reconnect timeout: the
/// filesystem turns read-only; once the server is back, `jext4 recover`
/// leaves a clean image with every file fsync'd before.
#[test]
fn server_gone_past_the_timeout() {
    if !servers_available() || !e2e::require_e2e() {
        return;
    }
    let dir = e2e::scratch("nbd-gone");
    let raw = common::mkfs(dir.path(), "img", 32, &["-t", "ext4", "-b", "1024"]);
    let mut server = NbdServer::nbdkit(
        dir.path(),
        "gone",
        Listen::Unix,
        &["file", e2e::path_str(&raw)],
    );
    let uri = server.uri_with("", "x-reconnect-timeout=1");
    let (mount, mountpoint) = common::nbd::mount(dir.path(), &uri);
    let stop = Arc::new(AtomicBool::new(false));
    let writer = fsync_writer(mountpoint.clone(), Arc::clone(&stop));
    std::thread::sleep(Duration::from_millis(500));
    server.kill9();
    let (durable, error) = writer.join().unwrap();
    let error = error.expect("writes fail once the server is gone for good");
    assert_eq!(error.raw_os_error(), Some(libc::EIO), "{error}");
    let refused = std::fs::write(mountpoint.join("after"), b"x").unwrap_err();
    assert_eq!(refused.raw_os_error(), Some(libc::EROFS), "{refused}");
    let log = mount.server_log();
    assert!(
        log.contains("gave up reconnecting") && log.contains("filesystem is now read-only"),
        "no clear line:\n{log}"
    );
    let _ = std::process::Command::new(common::server::JEXT4)
        .args(["umount", e2e::path_str(&mountpoint)])
        .output();
    mount.forget();
    server.start();
    recover(&server.uri);
    drop(server);
    assert!(durable.len() > 5, "only {} files", durable.len());
    assert_recovered_with(&raw, &durable);
}

/// Deterministic: a file is written, the server is killed and restarted,
/// then the file is fsync'd. The file is larger than the client's plug
/// (4 MiB), so most of it has been sent before the kill. With `read_back`,
/// the file is read back before the kill, which waits for the server's
/// acknowledgements: the writes sent are then acknowledged and unflushed,
/// in nbdkit's writeback cache that the kill loses, and the client must
/// replay them from its log; without, they are still in flight when the
/// server dies, and the client must send them again. What the plug still
/// holds is sent after the restart either way.
fn restart_after_writes(read_back: bool) {
    if !servers_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let raw = common::mkfs(dir.path(), "img", 32, &["-t", "ext4", "-b", "4096"]);
    let mut server = NbdServer::nbdkit(
        dir.path(),
        "replay",
        Listen::Unix,
        &[
            "--filter=cache",
            "file",
            e2e::path_str(&raw),
            "cache=writeback",
        ],
    );
    let image = Image::open(server.uri_with("", "x-reconnect-timeout=10")).unwrap();
    let big = e2e::pattern(99, 10 << 20);
    let file = image
        .open_with(
            "/big",
            jext4::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .mode(0o644),
        )
        .unwrap();
    file.write_all_at(&big, 0).unwrap();
    if read_back {
        assert!(
            {
                let mut back = vec![0; big.len()];
                file.read_exact_at(&mut back, 0).unwrap();
                back
            } == big
        );
    }
    server.kill9();
    server.start();
    file.sync_all().unwrap();
    drop(file);
    image.close().unwrap();
    drop(server);
    let mut durable = Durable::new();
    durable.insert("/big".into(), big);
    assert_recovered_with(&raw, &durable);
}

#[test]
fn acknowledged_writes_lost_by_a_restarted_server_are_replayed() {
    restart_after_writes(true);
}

#[test]
fn writes_in_flight_when_the_server_dies_are_sent_again() {
    restart_after_writes(false);
}

/// The server dies and another image is served at the same address (a
/// restart on the wrong disk): the client must not write a byte into it —
/// its superblock UUID differs, so the reconnect gives up and the
/// filesystem turns read-only — and the first image, served again, is
/// recovered with every file fsync'd before.
#[test]
fn a_server_restarted_on_another_image_is_never_written_to() {
    if !servers_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let first = common::mkfs(dir.path(), "first", 32, &["-t", "ext4", "-b", "4096"]);
    let other = common::mkfs(dir.path(), "other", 32, &["-t", "ext4", "-b", "4096"]);
    let other_before = std::fs::read(&other).unwrap();
    let serve = |image: &Path| {
        NbdServer::nbdkit(
            dir.path(),
            "swap",
            Listen::Unix,
            &["file", e2e::path_str(image)],
        )
    };
    let mut server = serve(&first);
    let image = Image::open(server.uri_with("", "x-reconnect-timeout=10")).unwrap();
    let mut durable = Durable::new();
    for n in 0..20 {
        let name = format!("/f{n}");
        image.write(&name, content(n)).unwrap();
        image.open_file(&name).unwrap().sync_all().unwrap();
        durable.insert(name, content(n));
    }
    image.write("/unsynced", content(99)).unwrap();
    server.kill9();
    drop(server);
    let swapped = serve(&other);
    let error = image.sync().unwrap_err();
    assert_eq!(error.errno(), libc::EIO, "{error}");
    assert_read_only(&image);
    drop(image);
    drop(swapped);
    assert!(
        std::fs::read(&other).unwrap() == other_before,
        "the client wrote into the image that took the first one's place"
    );
    let server = serve(&first);
    recover(&server.uri);
    drop(server);
    assert_recovered_with(&first, &durable);
}
