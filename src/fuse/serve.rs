//! Running a FUSE session for a mounted `Fs`, and the small runtime files
//! (`<runtime>/jext4/<mountpoint hex>.pid|.status|.log`) that let
//! `jext4 umount` find the server and wait until it has written everything.

use super::dev::DevSession;
use super::metrics::{RequestMetrics, RingFigures, TransportFigures};
use super::sync_pool::SyncPool;
use super::turns::ReadTurns;
use super::{FuseAdapter, FuseOptions, FuseTransport, stats_report, uring, wire};
use crate::error::{Error, Result};
use crate::fs::Fs;
use fuser::{Config, MountOption, SessionACL};
use std::os::fd::{AsFd, AsRawFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

/// Where pid, status and log files live: /run/jext4 for root, else the
/// user's runtime directory.
pub fn runtime_dir() -> PathBuf {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        return PathBuf::from("/run/jext4");
    }
    match std::env::var_os("XDG_RUNTIME_DIR") {
        Some(dir) => PathBuf::from(dir).join("jext4"),
        // SAFETY: as above.
        None => PathBuf::from(format!("/tmp/jext4-{}", unsafe { libc::geteuid() })),
    }
}

/// Runtime file names for a mountpoint: the canonical path in hex, so two
/// different mountpoints never share files.
pub fn runtime_file(mountpoint: &Path, extension: &str) -> PathBuf {
    use std::os::unix::ffi::OsStrExt;
    let hex: String = mountpoint
        .as_os_str()
        .as_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    runtime_dir().join(format!("{hex}.{extension}"))
}

/// What a server leaves in `<runtime>/<mountpoint hex>.pid` while it runs:
/// its pid on the first line, the image it serves on the second.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerRecord {
    pub pid: i32,
    pub mountpoint: PathBuf,
    pub image: PathBuf,
}

impl ServerRecord {
    pub fn write(&self) -> std::io::Result<()> {
        std::fs::write(
            runtime_file(&self.mountpoint, "pid"),
            format!("{}\n{}\n", self.pid, self.image.display()),
        )
    }

    /// Remove the record, unless a newer server of the same mount point
    /// has replaced it meanwhile.
    pub fn remove(&self) {
        if ServerRecord::read(&self.mountpoint).is_some_and(|record| record.pid == self.pid) {
            let _ = std::fs::remove_file(runtime_file(&self.mountpoint, "pid"));
        }
    }

    pub fn read(mountpoint: &Path) -> Option<ServerRecord> {
        let text = std::fs::read_to_string(runtime_file(mountpoint, "pid")).ok()?;
        let mut lines = text.lines();
        let pid = lines.next()?.trim().parse().ok()?;
        let image = PathBuf::from(lines.next().unwrap_or_default());
        Some(ServerRecord {
            pid,
            mountpoint: mountpoint.to_path_buf(),
            image,
        })
    }

    /// Every record in the runtime directory.
    fn all() -> Vec<ServerRecord> {
        let Ok(entries) = std::fs::read_dir(runtime_dir()) else {
            return Vec::new();
        };
        entries
            .flatten()
            .filter_map(|entry| {
                let name = entry.file_name().to_string_lossy().into_owned();
                let hex = name.strip_suffix(".pid")?;
                ServerRecord::read(&mountpoint_of_hex(hex)?)
            })
            .collect()
    }
}

/// The servers still finishing an unmount (their mount is gone, they are
/// writing the last commit and checkpoint) of `image` or on `mountpoint`:
/// a new mount of either waits for them.
pub fn finishing_servers(image: &Path, mountpoint: &Path) -> Vec<ServerRecord> {
    let same_file = |a: &Path, b: &Path| {
        use std::os::unix::fs::MetadataExt;
        match (std::fs::metadata(a), std::fs::metadata(b)) {
            (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
            _ => false,
        }
    };
    ServerRecord::all()
        .into_iter()
        .filter(|record| process_alive(record.pid) && !is_mount_point(&record.mountpoint))
        .filter(|record| record.mountpoint == mountpoint || same_file(&record.image, image))
        .collect()
}

/// A process that exists and is not a zombie (a foreground server whose
/// parent has not reaped it yet has finished its work).
pub fn process_alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the parenthesised command name.
        Ok(stat) => stat
            .rsplit_once(") ")
            .is_some_and(|(_, rest)| !rest.starts_with('Z')),
        Err(_) => false,
    }
}

fn mountpoint_of_hex(hex: &str) -> Option<PathBuf> {
    use std::os::unix::ffi::OsStringExt;
    if !hex.len().is_multiple_of(2) {
        return None;
    }
    let bytes: Option<Vec<u8>> = (0..hex.len())
        .step_by(2)
        .map(|at| u8::from_str_radix(hex.get(at..at + 2)?, 16).ok())
        .collect();
    Some(PathBuf::from(std::ffi::OsString::from_vec(bytes?)))
}

pub fn fuse_config(options: &FuseOptions, read_only: bool, image: &Path) -> Config {
    let mut mount_options = vec![
        MountOption::DefaultPermissions,
        MountOption::FSName(
            options
                .fsname
                .clone()
                .unwrap_or_else(|| image.display().to_string()),
        ),
        // As a mount option the kernel reads, not fuser's Subtype: fuser's
        // own mount(2) (as root) calls every mount plain "fuse" and uses
        // Subtype only as the source name, so findmnt -t fuse.jext4,
        // /proc/mounts and systemd would not see the type. fusermount3 (not
        // root) understands subtype= too.
        MountOption::CUSTOM(format!(
            "subtype={}",
            options.subtype.as_deref().unwrap_or("jext4")
        )),
        if read_only {
            MountOption::RO
        } else {
            MountOption::RW
        },
        if options.dev {
            MountOption::Dev
        } else {
            MountOption::NoDev
        },
        if options.suid {
            MountOption::Suid
        } else {
            MountOption::NoSuid
        },
    ];
    if options.noexec {
        mount_options.push(MountOption::NoExec);
    }
    let mut config = Config::default();
    config.mount_options = mount_options;
    config.acl = if options.allow_other {
        SessionACL::All
    } else if options.allow_root {
        SessionACL::RootAndOwner
    } else {
        SessionACL::Owner
    };
    config.n_threads = Some(options.threads);
    config.clone_fd = true;
    config
}

/// Mount `fs` at `mountpoint`, call `ready` once the kernel has accepted
/// the mount, serve until unmounted, then unmount the engine (final
/// write-out, clean state). The requests travel over `options.transport`.
pub fn serve(
    fs: Arc<Fs>,
    mountpoint: &Path,
    options: &FuseOptions,
    config: &Config,
    ready: impl FnOnce(),
) -> Result<()> {
    let notifier = Arc::new(OnceLock::new());
    let metrics = Arc::new(RequestMetrics::default());
    let adapter = Arc::new(FuseAdapter::new(
        Arc::clone(&fs),
        Arc::clone(&notifier),
        Arc::clone(&metrics),
    )?);
    let want_uring = want_uring(options.transport)?;
    let mut config = config.clone();
    if want_uring {
        // Only FORGET and INTERRUPT still come through /dev/fuse.
        config.n_threads = Some(1);
    }
    let uring_taken = Arc::new(OnceLock::new());
    let workers = config.n_threads.unwrap_or(1);
    let syncs = Arc::new(SyncPool::new(workers));
    let dev_spin = std::time::Duration::from_micros(options.dev_spin_us);
    let turns = ReadTurns::new(workers, adapter.one_reader(), dev_spin);
    let session = DevSession::new(
        Arc::clone(&adapter),
        want_uring,
        Arc::clone(&uring_taken),
        Arc::clone(&syncs),
        Arc::clone(&turns),
    );
    let session = open_session(session, mountpoint, &config).map_err(Error::Io)?;
    let _ = notifier.set(session.notifier());
    turns.set_fd(session.as_fd().as_raw_fd());
    let uring_taken = uring_taken.get().copied().unwrap_or(false);
    let ring = start_transport(&session, &adapter, options, &config, uring_taken, &turns)?;
    ready();
    let reporter = StatsReporter::start(
        Arc::clone(&fs),
        Arc::clone(&metrics),
        runtime_file(mountpoint, "stats"),
    );
    let served = run_until_unmounted(session);
    // Fsyncs still waiting for a commit (an aborted connection) end
    // before the engine's last commit.
    syncs.stop();
    if let Some(ring) = ring {
        ring.stop();
    }
    let unmounted = fs.unmount();
    reporter.stop(&fs, &metrics);
    served.map_err(Error::Io)?;
    unmounted
}

/// Mount and open the session. fuser opens `/dev/fuse` itself, and falls
/// back to the setuid `fusermount3` when mount(2) is refused (not root).
/// Where the user may not open `/dev/fuse` at all (mode 0600, or 0660 with
/// a group the user is not in), FUSE is closed to that user: `fusermount3`
/// opens the device with the caller's own rights too (libfuse's
/// `try_open_fuse_device` drops privileges around the open), and so does
/// libfuse's own mount. That refusal is said as such, not as a failure of
/// the mount point.
fn open_session(
    session: DevSession,
    mountpoint: &Path,
    config: &Config,
) -> std::io::Result<fuser::Session<DevSession>> {
    if let Some(refusal) = dev_fuse_refusal() {
        return Err(refusal);
    }
    fuser::Session::new(session, mountpoint, config).map_err(|error| {
        std::io::Error::new(
            error.kind(),
            format!("cannot mount on {}: {error}", mountpoint.display()),
        )
    })
}

/// Why this process may not open `/dev/fuse`, if it may not.
fn dev_fuse_refusal() -> Option<std::io::Error> {
    use std::os::unix::fs::MetadataExt;
    const DEV_FUSE: &str = "/dev/fuse";
    let error = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(DEV_FUSE)
        .err()?;
    if error.kind() != std::io::ErrorKind::PermissionDenied {
        return None; // missing device, ENODEV: fuser's own message says it
    }
    let shape = std::fs::metadata(DEV_FUSE).map_or_else(
        |_| String::new(),
        |meta| {
            format!(
                " (mode {:04o}, owner {}, group {})",
                meta.mode() & 0o7777,
                meta.uid(),
                meta.gid()
            )
        },
    );
    Some(std::io::Error::new(
        error.kind(),
        format!(
            "cannot mount: this user may not open {DEV_FUSE}{shape}, so FUSE is closed to it \
             (fusermount3 opens the device with the user's own rights too); make {DEV_FUSE} \
             readable and writable for the user (mode 0666 is the usual setting) or mount as root"
        ),
    ))
}

/// Whether to ask the kernel for FUSE over io_uring: `auto` where the
/// kernel offers it; `uring` refuses to mount where it does not.
fn want_uring(transport: FuseTransport) -> Result<bool> {
    match (transport, uring::kernel_offers()) {
        (FuseTransport::Dev, _) => Ok(false),
        (_, Ok(())) => Ok(true),
        (FuseTransport::Auto, Err(why)) => {
            tracing::debug!("serving through /dev/fuse: {why}");
            Ok(false)
        }
        (FuseTransport::Uring, Err(why)) => Err(Error::Invalid(format!(
            "mount option fuse_transport=uring: {why}"
        ))),
    }
}

/// Start the io_uring queues if the kernel took io_uring at FUSE_INIT, and
/// say in the statistics which transport serves. Where the ring cannot
/// start, `auto` stays on /dev/fuse (the kernel falls back to it when a
/// registration fails) and `uring` gives up the mount (dropping the
/// session unmounts).
fn start_transport(
    session: &fuser::Session<DevSession>,
    adapter: &Arc<FuseAdapter>,
    options: &FuseOptions,
    config: &Config,
    uring_taken: bool,
    turns: &Arc<ReadTurns>,
) -> Result<Option<uring::Ring>> {
    let metrics = adapter.metrics();
    let dev = || TransportFigures {
        name: "dev",
        ring: None,
        turns: Some(Arc::clone(turns)),
    };
    let refuse = |why: String| -> Result<Option<uring::Ring>> {
        if options.transport == FuseTransport::Uring {
            return Err(Error::Invalid(format!(
                "mount option fuse_transport=uring: {why}"
            )));
        }
        tracing::warn!("serving through /dev/fuse: {why}");
        metrics.set_transport(dev());
        Ok(None)
    };
    if options.transport == FuseTransport::Dev
        || (!uring_taken
            && options.transport == FuseTransport::Auto
            && uring::kernel_offers().is_err())
    {
        metrics.set_transport(dev());
        return Ok(None);
    }
    if !uring_taken {
        return refuse("the kernel did not take FUSE_OVER_IO_URING at FUSE_INIT".into());
    }
    let shape = uring::RingShape {
        queues: uring::possible_cpus(),
        threads_per_queue: options.uring_threads,
        entries_per_thread: options.uring_depth,
        payload_size: wire::MAX_WRITE as usize,
    };
    let access = uring::Access {
        acl: config.acl,
        // SAFETY: geteuid has no preconditions.
        owner: unsafe { libc::geteuid() },
    };
    let spin = std::time::Duration::from_micros(options.uring_spin_us);
    match uring::Ring::start(session.as_fd(), Arc::clone(adapter), access, shape, spin) {
        Ok(ring) => {
            metrics.set_transport(TransportFigures {
                name: "uring",
                ring: Some(RingFigures {
                    queues: shape.queues,
                    threads_per_queue: shape.threads_per_queue,
                    entries_per_thread: shape.entries_per_thread,
                    buffer_bytes: shape.buffer_bytes(),
                    requests: Arc::clone(&ring.requests),
                    pace: Arc::clone(&ring.pace),
                }),
                turns: None,
            });
            tracing::info!(?shape, ?spin, "serving through FUSE over io_uring");
            Ok(Some(ring))
        }
        Err(why) => refuse(why),
    }
}

/// Serve until the kernel ends the session (the mount point was unmounted:
/// `jext4 umount`, `fusermount3 -u`, a signal). fuser would then unmount
/// the mount point once more: its check whether the mount still exists
/// takes the POLLERR of a finished connection for "mounted" (libfuse's
/// `fuse_kern_unmount` takes it for "gone"). That second unmount fails
/// with EINVAL — the warning "Failed to umount filesystem: Invalid
/// argument" after every clean unmount — or, when a new mount already sits
/// on the same mount point (a quick unmount/mount cycle), unmounts that one,
/// and what is written next lands in the directory underneath. So fuser's
/// mount handle is never dropped: the kernel has unmounted already.
fn run_until_unmounted(session: fuser::Session<DevSession>) -> std::io::Result<()> {
    let background = std::mem::ManuallyDrop::new(session.spawn()?);
    // SAFETY: `guard` is read out exactly once and `background` is never
    // used or dropped afterwards, so the handle has one owner; the other
    // fields (the mount handle) are leaked on purpose, see above.
    let guard = unsafe { std::ptr::read(&background.guard) };
    let served = guard
        .join()
        .map_err(|_| std::io::Error::other("the FUSE session thread panicked"))?;
    match served {
        // The kernel ended the connection rather than the mount: a read of
        // /dev/fuse answers ECONNABORTED instead of ENODEV once it aborted
        // it (seen when a busy mount was detached lazily, under load). The
        // ring's threads take it as the end too (`uring.rs`); the engine
        // still unmounts cleanly after this.
        Err(error) if error.raw_os_error() == Some(libc::ECONNABORTED) => {
            tracing::warn!("the kernel aborted the FUSE connection: stopping");
            Ok(())
        }
        served => served,
    }
}

/// Send every panic (a bug) of any thread to the server's log, with where
/// it happened and a backtrace: the server runs detached, so the default
/// message on stderr would go nowhere. The threads that own the engine
/// catch their panics and abort the journal (`Fs::abort`).
pub fn log_panics() {
    std::panic::set_hook(Box::new(|info| {
        let thread = std::thread::current();
        let message = crate::error::panic_message(info.payload());
        let location = info
            .location()
            .map_or_else(String::new, |location| location.to_string());
        let backtrace = std::backtrace::Backtrace::force_capture();
        // Worded as the standard hook words it, for whoever greps logs
        // for "panicked".
        tracing::error!(
            "thread '{}' panicked at {location}: {message}\n{backtrace}",
            thread.name().unwrap_or("unnamed")
        );
    }));
}

/// Refreshes `<runtime>/<mountpoint>.stats` every few seconds, and once
/// more after unmount, for `jext4 stats`.
struct StatsReporter {
    stop: Arc<(parking_lot::Mutex<bool>, parking_lot::Condvar)>,
    thread: Option<std::thread::JoinHandle<()>>,
    path: PathBuf,
}

impl StatsReporter {
    const INTERVAL: std::time::Duration = std::time::Duration::from_secs(2);

    fn start(fs: Arc<Fs>, metrics: Arc<RequestMetrics>, path: PathBuf) -> Self {
        let stop = Arc::new((parking_lot::Mutex::new(false), parking_lot::Condvar::new()));
        let flag = Arc::clone(&stop);
        let file = path.clone();
        let thread = std::thread::Builder::new()
            .name("jext4-stats".into())
            .spawn(move || {
                let (lock, condvar) = &*flag;
                let mut stopped = lock.lock();
                while !*stopped {
                    let report = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        stats_report(&fs, &metrics)
                    }));
                    match report {
                        Ok(report) => {
                            let _ = std::fs::write(&file, report);
                        }
                        Err(panic) => {
                            let why = crate::error::panic_message(&*panic);
                            fs.abort(&format!("the statistics thread panicked: {why}"));
                            return;
                        }
                    }
                    condvar.wait_for(&mut stopped, Self::INTERVAL);
                }
            })
            .ok();
        StatsReporter { stop, thread, path }
    }

    fn stop(mut self, fs: &Fs, metrics: &RequestMetrics) {
        {
            let (lock, condvar) = &*self.stop;
            *lock.lock() = true;
            condvar.notify_all();
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        let _ = std::fs::write(&self.path, stats_report(fs, metrics));
    }
}

/// Whether `path` is currently a mount point (its device differs from its
/// parent's, or it is listed in the mount table).
pub fn is_mount_point(path: &Path) -> bool {
    let Ok(mounts) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return false;
    };
    let wanted = path.to_string_lossy();
    mounts.lines().any(|line| {
        line.split(' ')
            .nth(4)
            .map(unescape_mountinfo)
            .is_some_and(|mount_point| mount_point == wanted)
    })
}

/// The mount points of every jext4 mount this user can see: type
/// `fuse.jext4`, or (with another `subtype=`) a mount whose server left its
/// pid in the runtime directory.
pub fn jext4_mounts() -> Vec<PathBuf> {
    let Ok(mounts) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    mounts
        .lines()
        .filter_map(|line| {
            let mount_point = PathBuf::from(unescape_mountinfo(line.split(' ').nth(4)?));
            // The filesystem type follows the " - " separator.
            let fs_type = line.split_once(" - ")?.1.split(' ').next()?;
            let ours = fs_type == "fuse.jext4"
                || (fs_type.starts_with("fuse") && runtime_file(&mount_point, "pid").exists());
            ours.then_some(mount_point)
        })
        .collect()
}

/// mountinfo escapes space, tab, newline and backslash as octal.
fn unescape_mountinfo(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        if bytes[index] == b'\\'
            && index + 4 <= bytes.len()
            && bytes[index + 1..index + 4].iter().all(u8::is_ascii_digit)
        {
            let octal = std::str::from_utf8(&bytes[index + 1..index + 4]).unwrap_or("0");
            out.push(u8::from_str_radix(octal, 8).unwrap_or(b'?'));
            index += 4;
        } else {
            out.push(bytes[index]);
            index += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}
