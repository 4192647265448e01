//! A `jext4 mount` server run by a test: started in the foreground as a
//! child of the test process (so the test holds its pid, exit status and
//! standard error), killed with SIGKILL at a chosen moment or unmounted
//! cleanly, and checked for panics — the write-ahead guard panics on a
//! violation in builds with debug assertions (the `ci` and `dev` profiles
//! that `cargo test` builds `CARGO_BIN_EXE_jext4` with).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// The `jext4` binary built for this test run (same profile as the test).
pub const JEXT4: &str = env!("CARGO_BIN_EXE_jext4");

/// How long a mount may take to appear, and an unmount to finish.
const MOUNT_TIMEOUT: Duration = Duration::from_secs(20);
const UNMOUNT_TIMEOUT: Duration = Duration::from_secs(120);

/// Whether FUSE mounts can work here (root or fusermount3, and /dev/fuse).
pub fn fuse_available() -> bool {
    if !Path::new("/dev/fuse").exists() {
        return super::skip("/dev/fuse is missing");
    }
    super::require_tool("fusermount3")
}

fn path_str(path: &Path) -> &str {
    path.to_str().expect("utf-8 path")
}

/// Whether `point` (canonical) is a mount point now.
pub fn is_mounted(point: &Path) -> bool {
    let wanted = path_str(point);
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .any(|line| line.split(' ').nth(4) == Some(wanted))
}

pub struct Server {
    child: Option<Child>,
    pub mountpoint: PathBuf,
    /// The server's standard error (its log, and any panic message).
    pub log: PathBuf,
    pub image: PathBuf,
}

/// How a server ended.
#[derive(Debug)]
pub struct Ending {
    pub status: ExitStatus,
    /// The whole log.
    pub log: String,
}

impl Server {
    /// Mount `image` at `<image>.mnt` with `-o options` (may be empty) and
    /// wait until the mount is live.
    pub fn start(image: &Path, options: &str) -> Server {
        Server::start_named(image.as_os_str(), image, options)
    }

    /// Mount what `name` names (an image path or an NBD URI) with the
    /// mount point and log beside `image`.
    pub fn start_named(name: &std::ffi::OsStr, image: &Path, options: &str) -> Server {
        let mountpoint = image.with_extension("mnt");
        std::fs::create_dir_all(&mountpoint).unwrap();
        let mountpoint = mountpoint.canonicalize().unwrap();
        assert!(
            !is_mounted(&mountpoint),
            "{} is mounted already",
            mountpoint.display()
        );
        let log = image.with_extension("server.log");
        let stderr = std::fs::File::create(&log).unwrap();
        let mut command = Command::new(JEXT4);
        command.arg("mount").arg("--foreground");
        if !options.is_empty() {
            command.args(["-o", options]);
        }
        let child = command
            .arg(name)
            .arg(&mountpoint)
            .env("JEXT4_LOG", "info")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {JEXT4}: {e}"));
        let mut server = Server {
            child: Some(child),
            mountpoint,
            log,
            image: image.to_path_buf(),
        };
        server.wait_for_mount();
        server
    }

    fn wait_for_mount(&mut self) {
        let started = Instant::now();
        while !is_mounted(&self.mountpoint) {
            let child = self.child.as_mut().unwrap();
            if let Some(status) = child.try_wait().unwrap() {
                self.child = None;
                panic!(
                    "the server exited ({status}) before mounting:\n{}",
                    self.read_log()
                );
            }
            assert!(
                started.elapsed() < MOUNT_TIMEOUT,
                "no mount after {MOUNT_TIMEOUT:?}:\n{}",
                self.read_log()
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("server running").id()
    }

    pub fn read_log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGKILL the server, reap it and detach the dead mount
    /// (`fusermount3 -uz`). What it wrote to the image file stays: the
    /// page cache keeps every completed write.
    pub fn kill9(mut self) -> Ending {
        let mut child = self.child.take().expect("server running");
        // SAFETY: kill(2) on the pid of our own unreaped child.
        unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
        let status = child.wait().unwrap();
        detach_lazily(&self.mountpoint);
        Ending {
            status,
            log: self.read_log(),
        }
    }

    /// `jext4 umount`: detach, wait for the server to write everything and
    /// exit. Panics if it does not exit within the timeout (then kills it)
    /// or if `jext4 umount` failed.
    pub fn unmount(self) -> Ending {
        let (output, ending) = self.unmount_reporting();
        assert!(
            output.status.success(),
            "jext4 umount failed: {}\nserver log:\n{}",
            String::from_utf8_lossy(&output.stderr),
            ending.log
        );
        ending
    }

    /// `unmount`, returning what `jext4 umount` said however it ended (it
    /// reports a journal the server aborted, say).
    pub fn unmount_reporting(mut self) -> (std::process::Output, Ending) {
        let output = Command::new(JEXT4)
            .arg("umount")
            .arg(&self.mountpoint)
            .output()
            .unwrap();
        let mut child = self.child.take().expect("server running");
        let started = Instant::now();
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            if started.elapsed() > UNMOUNT_TIMEOUT {
                let _ = child.kill();
                let _ = child.wait();
                detach_lazily(&self.mountpoint);
                panic!(
                    "the server did not exit {UNMOUNT_TIMEOUT:?} after umount:\n{}",
                    self.read_log()
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        let ending = Ending {
            status,
            log: self.read_log(),
        };
        (output, ending)
    }
}

impl Drop for Server {
    /// A failing test must not leave a server or a mount behind.
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
            detach_lazily(&self.mountpoint);
        }
    }
}

/// `fusermount3 -uz`: detach even if busy or if the server is dead.
pub fn detach_lazily(mountpoint: &Path) {
    for _ in 0..50 {
        if !is_mounted(mountpoint) {
            return;
        }
        let _ = Command::new("fusermount3")
            .arg("-uz")
            .arg(mountpoint)
            .stderr(Stdio::null())
            .status();
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(
        !is_mounted(mountpoint),
        "{} is still mounted",
        mountpoint.display()
    );
}

impl Ending {
    /// The server never panicked (a write-ahead guard violation panics with
    /// debug assertions on) and never logged an error.
    pub fn assert_no_panic_or_error(&self) {
        for bad in ["panicked", "write-ahead rule", "ERROR", "journal aborted"] {
            assert!(
                !self.log.contains(bad),
                "the server log contains '{bad}':\n{}",
                self.log
            );
        }
    }

    /// A clean unmount: exit status 0 and nothing bad in the log.
    pub fn assert_clean_exit(&self) {
        self.assert_no_panic_or_error();
        assert!(
            self.status.success(),
            "server exit status {}:\n{}",
            self.status,
            self.log
        );
    }

    /// The server died of our SIGKILL, not of anything else.
    pub fn assert_killed(&self) {
        use std::os::unix::process::ExitStatusExt;
        self.assert_no_panic_or_error();
        assert_eq!(
            self.status.signal(),
            Some(libc::SIGKILL),
            "the server ended with {} before the kill:\n{}",
            self.status,
            self.log
        );
    }
}

/// `jext4 <args>`, asserting success; returns stdout.
pub fn jext4(args: &[&str]) -> String {
    let output = Command::new(JEXT4).args(args).output().unwrap();
    assert!(
        output.status.success(),
        "jext4 {args:?}: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// The crash image replayed twice, on copies: (a) `e2fsck -p -E
/// journal_only`, (b) `jext4 recover`; both must be `e2fsck -fn` clean.
/// Without orphans, (a) and (b) must be identical outside the primary
/// superblock. When the crash left orphan inodes, both release them, but
/// e2fsck does it in place (with the current time as i_dtime) and jext4
/// through a journaled mount, so their bytes differ by design: then the
/// replays alone are compared byte for byte (debugfs `journal_run` against
/// jext4's journal-only recovery, neither of which touches orphans) and
/// (a) and (b) must hold the same tree, read through jext4's library.
/// Returns (b).
pub fn replay_both(crash: &Path) -> PathBuf {
    let theirs = crash.with_extension("e2fsck.img");
    let ours = crash.with_extension("jext4.img");
    std::fs::copy(crash, &theirs).unwrap();
    std::fs::copy(crash, &ours).unwrap();
    let (code, said_e2fsck) =
        super::journal::run("e2fsck", &["-p", "-E", "journal_only", path_str(&theirs)]);
    assert!(
        code <= 1,
        "e2fsck -p -E journal_only ({code}):\n{said_e2fsck}"
    );
    let said_jext4 = jext4(&["recover", path_str(&ours)]);
    if said_jext4.contains("orphan") {
        compare_journal_only_replays(crash);
        let (their_tree, our_tree) = (image_tree(&theirs), image_tree(&ours));
        assert!(
            their_tree == our_tree,
            "e2fsck and jext4 leave different trees after releasing orphans"
        );
        println!(
            "orphans released by both: journal-only replays identical, {} entries alike",
            our_tree.len()
        );
    } else {
        assert_identical(
            &theirs,
            &ours,
            &format!("e2fsck: {said_e2fsck}\njext4: {said_jext4}"),
        );
    }
    for (image, said) in [(&theirs, &said_e2fsck), (&ours, &said_jext4)] {
        let (code, text) = super::journal::run("e2fsck", &["-fn", path_str(image)]);
        assert_eq!(code, 0, "e2fsck -fn after {said}:\n{text}");
    }
    ours
}

/// Identical outside the primary superblock.
fn assert_identical(theirs: &Path, ours: &Path, context: &str) {
    let block_size = super::journal::fs_superblock(theirs).block_size() as usize;
    let differing = super::journal::differences_outside_primary_superblock(
        &std::fs::read(theirs).unwrap(),
        &std::fs::read(ours).unwrap(),
        block_size,
    );
    assert!(
        differing.is_empty(),
        "{} and {} differ in blocks {:?}\n{context}",
        theirs.display(),
        ours.display(),
        &differing[..differing.len().min(20)]
    );
}

/// debugfs `journal_run` and jext4's recovery, journal only, on copies.
fn compare_journal_only_replays(crash: &Path) {
    let theirs = crash.with_extension("debugfs-jr.img");
    let ours = crash.with_extension("jext4-jr.img");
    std::fs::copy(crash, &theirs).unwrap();
    std::fs::copy(crash, &ours).unwrap();
    // -n: a crash image's bitmaps may not match their checksums before
    // the replay, and debugfs would refuse to open it (exiting 0).
    let (code, said) = super::journal::run(
        "debugfs",
        &["-n", "-w", "-R", "journal_run", path_str(&theirs)],
    );
    assert!(
        code == 0 && !super::journal::dumpe2fs_needs_recovery(&theirs),
        "debugfs journal_run did not replay: {said}"
    );
    // The journal inode's map, from the replayed (consistent) image.
    let area = {
        let blocks = super::journal::journal_blocks_from_debugfs(&theirs);
        let block_size = super::journal::fs_superblock(crash).block_size();
        let device = jext4::engine::dev::FileDevice::open(&ours, false).unwrap();
        jext4::engine::journal::recovery::JournalArea::new(
            std::sync::Arc::new(device),
            block_size,
            blocks,
        )
    };
    jext4::engine::fs::recover_journal(&area).unwrap();
    drop(area);
    assert_identical(
        &theirs,
        &ours,
        "journal-only replays (debugfs journal_run, jext4)",
    );
    let _ = std::fs::remove_file(&theirs);
    let _ = std::fs::remove_file(&ours);
}

/// Every entry of an image, read through jext4's library read-only:
/// (path, kind, size, CRC32C of the content or link target).
pub fn image_tree(image: &Path) -> Vec<(String, String, u64, u32)> {
    use jext4::engine::fs::FileKind;
    use std::os::unix::ffi::OsStringExt;
    let options = jext4::engine::fs::MountOptions {
        read_only: true,
        ..jext4::engine::fs::MountOptions::default()
    };
    let fs = jext4::Image::options()
        .mount_options(options)
        .open(image)
        .unwrap_or_else(|e| panic!("read-only open of {}: {e}", image.display()));
    let mut entries = Vec::new();
    let mut pending = vec![String::new()];
    while let Some(dir) = pending.pop() {
        assert!(entries.len() < 10_000_000, "directory walk does not end");
        for entry in fs.read_dir(format!("/{dir}")).unwrap() {
            let entry = entry.unwrap();
            let name = entry.file_name();
            let path = format!("{dir}/{}", name.to_string_lossy());
            let attr = fs.symlink_metadata(&path).unwrap();
            let kind = attr.attr().kind;
            let content = match kind {
                FileKind::Directory => {
                    pending.push(path.clone());
                    Vec::new()
                }
                FileKind::Regular => fs.read(&path).unwrap(),
                FileKind::Symlink => fs.read_link(&path).unwrap().into_os_string().into_vec(),
                _ => Vec::new(),
            };
            let checksum = jext4::engine::format::csum::crc32c_raw(!0, &content);
            entries.push((path, format!("{kind:?}"), attr.len(), checksum));
        }
    }
    entries.sort();
    entries
}

/// A temporary directory that is kept (and named on stderr) when the test
/// fails, so that its images can be inspected.
pub struct KeepOnPanic(Option<tempfile::TempDir>);

impl KeepOnPanic {
    pub fn new() -> KeepOnPanic {
        KeepOnPanic(Some(tempfile::tempdir().unwrap()))
    }

    pub fn path(&self) -> &Path {
        self.0.as_ref().unwrap().path()
    }
}

impl Drop for KeepOnPanic {
    fn drop(&mut self) {
        if std::thread::panicking()
            && let Some(dir) = self.0.take()
        {
            eprintln!("images kept in {}", dir.keep().display());
        }
    }
}
