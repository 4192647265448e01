//! Running a FUSE session for a mounted `Fs`, and the small runtime files
//! (`<runtime>/jext4/<mountpoint hex>.pid|.status|.log`) that let
//! `jext4 umount` find the server and wait until it has written everything.

use super::{FuseAdapter, FuseOptions};
use crate::error::{Error, Result};
use crate::fs::Fs;
use fuser::{Config, MountOption, SessionACL};
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

pub fn fuse_config(options: &FuseOptions, read_only: bool, image: &Path) -> Config {
    let mut mount_options = vec![
        MountOption::DefaultPermissions,
        MountOption::FSName(
            options
                .fsname
                .clone()
                .unwrap_or_else(|| image.display().to_string()),
        ),
        MountOption::Subtype(options.subtype.clone().unwrap_or_else(|| "jext4".into())),
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
/// write-out, clean state).
pub fn serve(fs: Arc<Fs>, mountpoint: &Path, config: &Config, ready: impl FnOnce()) -> Result<()> {
    let notifier = Arc::new(OnceLock::new());
    let adapter = FuseAdapter::new(Arc::clone(&fs), Arc::clone(&notifier));
    let session = fuser::Session::new(adapter, mountpoint, config).map_err(|error| {
        Error::Io(std::io::Error::new(
            error.kind(),
            format!("cannot mount on {}: {error}", mountpoint.display()),
        ))
    })?;
    let _ = notifier.set(session.notifier());
    ready();
    let reporter = StatsReporter::start(Arc::clone(&fs), runtime_file(mountpoint, "stats"));
    let served = session.run();
    let unmounted = fs.unmount();
    reporter.stop(&fs);
    served.map_err(Error::Io)?;
    unmounted
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

    fn start(fs: Arc<Fs>, path: PathBuf) -> Self {
        let stop = Arc::new((parking_lot::Mutex::new(false), parking_lot::Condvar::new()));
        let flag = Arc::clone(&stop);
        let file = path.clone();
        let thread = std::thread::Builder::new()
            .name("jext4-stats".into())
            .spawn(move || {
                let (lock, condvar) = &*flag;
                let mut stopped = lock.lock();
                while !*stopped {
                    let _ = std::fs::write(&file, fs.stats_report());
                    condvar.wait_for(&mut stopped, Self::INTERVAL);
                }
            })
            .ok();
        StatsReporter { stop, thread, path }
    }

    fn stop(mut self, fs: &Fs) {
        {
            let (lock, condvar) = &*self.stop;
            *lock.lock() = true;
            condvar.notify_all();
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        let _ = std::fs::write(&self.path, fs.stats_report());
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
