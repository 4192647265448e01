//! End-to-end helpers: the built `jext4` binary mounting real images through
//! FUSE, kernel loop mounts, guards that always unmount (even when a test
//! panics), tree snapshots that can be compared across mounts, and a copy
//! of a real tree.
//!
//! Everything here needs root, /dev/fuse and loop devices; [`require_e2e`]
//! says why a test cannot run when one of them is missing.

use std::collections::BTreeMap;
use std::ffi::CString;
use std::fs;
use std::hash::{DefaultHasher, Hasher};
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// The binary under test.
pub const JEXT4: &str = env!("CARGO_BIN_EXE_jext4");

/// Tools every end-to-end test uses; CI installs them, so their absence is a
/// failure, not a skip.
const TOOLS: &[&str] = &[
    "mke2fs",
    "e2fsck",
    "debugfs",
    "mount",
    "umount",
    "losetup",
    "fusermount3",
    "dumpe2fs",
    "setfacl",
    "setpriv",
];

/// Why end-to-end tests cannot run here, if they cannot.
pub fn skip_reason() -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("not root: loop mounts and FUSE mounts need root".into());
    }
    match fs::metadata("/dev/fuse") {
        Ok(meta) if meta.file_type().is_char_device() => {}
        _ => return Some("/dev/fuse is missing".into()),
    }
    let has_loop = Path::new("/dev/loop-control").exists()
        || Command::new("losetup")
            .arg("-f")
            .output()
            .is_ok_and(|out| out.status.success());
    if !has_loop {
        return Some("no loop devices (/dev/loop-control is missing)".into());
    }
    None
}

/// True when the test may run; otherwise prints the reason and returns
/// false. Missing tools fail the test instead: CI must have them.
pub fn require_e2e() -> bool {
    if let Some(reason) = skip_reason() {
        return super::skip(&reason);
    }
    for tool in TOOLS {
        assert!(
            super::require_tool(tool),
            "{tool} is needed by the end-to-end tests (apt-get install e2fsprogs fuse3 acl util-linux)"
        );
    }
    true
}

/// A scratch directory that other users can traverse (the non-root tests
/// reach mount points inside it). With `JEXT4_E2E_KEEP=1` it stays after the
/// test, images included, for a look with debugfs.
pub fn scratch(name: &str) -> tempfile::TempDir {
    let prefix = format!("jext4-{name}-");
    let mut builder = tempfile::Builder::new();
    builder.prefix(&prefix);
    if std::env::var_os("JEXT4_E2E_KEEP").is_some() {
        builder.disable_cleanup(true);
    }
    let dir = builder.tempdir().expect("creating a scratch directory");
    set_mode(dir.path(), 0o755);
    dir
}

pub fn set_mode(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).expect("chmod");
}

/// Run a command and return its output (never panics on a non-zero exit).
pub fn run(program: &str, args: &[&str]) -> Output {
    Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|error| panic!("running {program}: {error}"))
}

/// Run a command that must succeed.
pub fn run_ok(program: &str, args: &[&str]) -> Output {
    let output = run(program, args);
    assert!(
        output.status.success(),
        "{program} {args:?} failed ({}):\n{}{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

pub fn path_str(path: &Path) -> &str {
    path.to_str().expect("test paths are UTF-8")
}

/// Is `path` a mount point right now (per /proc/self/mountinfo)?
pub fn is_mount_point(path: &Path) -> bool {
    let wanted = path.canonicalize().unwrap_or_else(|_| path.to_path_buf());
    let wanted = wanted.to_string_lossy().replace(' ', "\\040");
    fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .any(|line| line.split(' ').nth(4) == Some(wanted.as_str()))
}

static MOUNT_SERIAL: AtomicUsize = AtomicUsize::new(0);

/// A jext4 FUSE mount made with the built binary. Dropping it unmounts
/// (`jext4 umount`, then `fusermount3 -u -z` if that failed), so a failing
/// test never leaves a mount behind.
pub struct JextMount {
    pub image: PathBuf,
    pub mountpoint: PathBuf,
    pub log: PathBuf,
    /// What `jext4 mount` printed on stderr (it succeeded).
    pub mount_stderr: String,
    mounted: bool,
}

impl JextMount {
    /// Mount `image` on `mountpoint` (created if missing) with `-o options`
    /// (empty: none); panics with the server's message on failure.
    pub fn mount(image: &Path, mountpoint: &Path, options: &str) -> JextMount {
        match JextMount::try_mount(image, mountpoint, options) {
            Ok(mount) => mount,
            Err((output, log)) => panic!(
                "jext4 mount {} failed ({}): {}\nserver log:\n{log}",
                image.display(),
                output.status,
                String::from_utf8_lossy(&output.stderr)
            ),
        }
    }

    /// Mount, or return the command's output and the server log.
    pub fn try_mount(
        image: &Path,
        mountpoint: &Path,
        options: &str,
    ) -> Result<JextMount, (Output, String)> {
        JextMount::try_mount_with_env(image, mountpoint, options, &[])
    }

    /// `try_mount` with extra environment variables for the server.
    pub fn try_mount_with_env(
        image: &Path,
        mountpoint: &Path,
        options: &str,
        env: &[(&str, &str)],
    ) -> Result<JextMount, (Output, String)> {
        fs::create_dir_all(mountpoint).expect("creating the mount point");
        let serial = MOUNT_SERIAL.fetch_add(1, Ordering::Relaxed);
        let log = image.with_extension(format!("jext4-{serial}.log"));
        let mut command = Command::new(JEXT4);
        command.envs(env.iter().copied());
        command.arg("mount").arg("--log").arg(&log);
        if !options.is_empty() {
            command.args(["-o", options]);
        }
        let output = command
            .arg(image)
            .arg(mountpoint)
            .output()
            .expect("running jext4 mount");
        if !output.status.success() {
            let text = fs::read_to_string(&log).unwrap_or_default();
            return Err((output, text));
        }
        assert!(
            is_mount_point(mountpoint),
            "jext4 mount returned success but {} is not a mount point",
            mountpoint.display()
        );
        Ok(JextMount {
            image: image.to_path_buf(),
            mountpoint: mountpoint.to_path_buf(),
            log,
            mount_stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
            mounted: true,
        })
    }

    pub fn path(&self, relative: &str) -> PathBuf {
        self.mountpoint.join(relative)
    }

    /// The server's pid, from the runtime file it writes once mounted.
    pub fn server_pid(&self) -> i32 {
        let mountpoint = self.mountpoint.canonicalize().expect("the mount point");
        jext4::fuse::serve::ServerRecord::read(&mountpoint)
            .unwrap_or_else(|| panic!("no server record for {}", mountpoint.display()))
            .pid
    }

    pub fn server_log(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// `jext4 umount`, which must succeed and leave no mount behind.
    pub fn unmount(mut self) {
        self.mounted = false;
        let output = Command::new(JEXT4)
            .args(["umount", "--timeout", "120"])
            .arg(&self.mountpoint)
            .output()
            .expect("running jext4 umount");
        let still_mounted = is_mount_point(&self.mountpoint);
        if !output.status.success() || still_mounted {
            force_fuse_unmount(&self.mountpoint);
            panic!(
                "jext4 umount {} failed ({}): {}\nserver log:\n{}",
                self.mountpoint.display(),
                output.status,
                String::from_utf8_lossy(&output.stderr),
                self.server_log()
            );
        }
        let log = self.server_log();
        assert!(!log.contains("panicked"), "the server panicked:\n{log}");
    }

    /// Mark as unmounted by someone else (e.g. `fusermount3 -u`).
    pub fn forget(mut self) {
        self.mounted = false;
    }
}

impl Drop for JextMount {
    fn drop(&mut self) {
        if !self.mounted {
            return;
        }
        let _ = Command::new(JEXT4)
            .args(["umount", "--timeout", "60"])
            .arg(&self.mountpoint)
            .output();
        if is_mount_point(&self.mountpoint) {
            force_fuse_unmount(&self.mountpoint);
        }
        eprintln!(
            "jext4 server log ({}):\n{}",
            self.log.display(),
            self.server_log()
        );
    }
}

fn force_fuse_unmount(mountpoint: &Path) {
    let _ = Command::new("fusermount3")
        .args(["-u", "-z"])
        .arg(mountpoint)
        .output();
    if is_mount_point(mountpoint) {
        let _ = Command::new("umount").arg("-l").arg(mountpoint).output();
    }
}

/// A kernel ext4 loop mount. Dropping it unmounts and detaches the loop
/// device.
pub struct KernelMount {
    pub image: PathBuf,
    pub mountpoint: PathBuf,
    mounted: bool,
}

impl KernelMount {
    /// `mount -t ext4 -o loop[,ro]`: the ext4 driver reads ext2 and ext3 too,
    /// with nanosecond timestamps where the inodes have room for them.
    pub fn mount(image: &Path, mountpoint: &Path, read_only: bool) -> KernelMount {
        fs::create_dir_all(mountpoint).expect("creating the mount point");
        let options = if read_only { "loop,ro" } else { "loop" };
        run_ok(
            "mount",
            &[
                "-t",
                "ext4",
                "-o",
                options,
                path_str(image),
                path_str(mountpoint),
            ],
        );
        KernelMount {
            image: image.to_path_buf(),
            mountpoint: mountpoint.to_path_buf(),
            mounted: true,
        }
    }

    pub fn path(&self, relative: &str) -> PathBuf {
        self.mountpoint.join(relative)
    }

    pub fn unmount(mut self) {
        self.mounted = false;
        run_ok("umount", &[path_str(&self.mountpoint)]);
        detach_loops(&self.image);
    }
}

impl Drop for KernelMount {
    fn drop(&mut self) {
        if !self.mounted {
            return;
        }
        if run("umount", &[path_str(&self.mountpoint)])
            .status
            .success()
        {
            detach_loops(&self.image);
            return;
        }
        let _ = run("umount", &["-l", path_str(&self.mountpoint)]);
        detach_loops(&self.image);
    }
}

/// Detach every loop device still bound to `image` (a mount made with
/// `-o loop` normally frees its device itself).
pub fn detach_loops(image: &Path) {
    let output = run("losetup", &["-j", path_str(image)]);
    for line in String::from_utf8_lossy(&output.stdout).lines() {
        if let Some((device, _)) = line.split_once(':') {
            let _ = run("losetup", &["-d", device]);
        }
    }
}

/// `e2fsck -fn` must find nothing.
pub fn fsck_clean(image: &Path, when: &str) {
    let (code, text) = super::fsck(image);
    assert_eq!(code, 0, "e2fsck -fn {when} reported problems:\n{text}");
}

/// Depth of a file's extent tree, from `debugfs -R "ex PATH"`.
pub fn extent_depth(image: &Path, path_in_fs: &str) -> u32 {
    let output = run_ok(
        "debugfs",
        &["-R", &format!("ex {path_in_fs}"), path_str(image)],
    );
    let text = String::from_utf8_lossy(&output.stdout);
    // Rows start with "LEVEL/ DEPTH", e.g. " 1/ 2   3/ 84 ...".
    text.lines()
        .filter_map(|line| {
            let (level, rest) = line.trim_start().split_once('/')?;
            level.parse::<u32>().ok()?;
            rest.split_whitespace().next()?.parse::<u32>().ok()
        })
        .max()
        .unwrap_or_else(|| panic!("no extent rows in debugfs output:\n{text}"))
}

// ---------------------------------------------------------------- trees

/// The source of "a real tree": directories of /usr/share/doc (or
/// /usr/include), taken whole and in name order until about `max_entries`
/// entries or `max_bytes` bytes.
pub fn real_tree_sources(max_entries: usize, max_bytes: u64) -> Vec<PathBuf> {
    let roots = ["/usr/share/doc", "/usr/include", "/usr/share/man"];
    let root = roots
        .iter()
        .map(Path::new)
        .find(|root| root.is_dir())
        .expect("no real tree to copy (/usr/share/doc, /usr/include)");
    let mut names: Vec<PathBuf> = fs::read_dir(root)
        .expect("listing the real tree")
        .filter_map(|entry| entry.ok().map(|entry| entry.path()))
        .collect();
    names.sort();
    let (mut entries, mut bytes) = (0usize, 0u64);
    let mut chosen = Vec::new();
    for path in names {
        let (count, size) = tree_size(&path);
        if entries + count > max_entries || bytes + size > max_bytes {
            continue;
        }
        entries += count;
        bytes += size;
        chosen.push(path);
        if entries >= max_entries * 9 / 10 {
            break;
        }
    }
    assert!(
        entries > 500,
        "the real tree is too small ({entries} entries)"
    );
    chosen
}

fn tree_size(root: &Path) -> (usize, u64) {
    let (mut count, mut bytes) = (0, 0);
    let mut pending = vec![root.to_path_buf()];
    while let Some(path) = pending.pop() {
        let Ok(meta) = fs::symlink_metadata(&path) else {
            continue;
        };
        count += 1;
        bytes += meta.len();
        if meta.is_dir()
            && let Ok(entries) = fs::read_dir(&path)
        {
            pending.extend(entries.filter_map(|e| e.ok().map(|e| e.path())));
        }
    }
    (count, bytes)
}

/// `cp -a` a real tree of about `max_entries` entries into `dest`.
pub fn copy_real_tree(dest: &Path, max_entries: usize, max_bytes: u64) -> usize {
    fs::create_dir_all(dest).expect("creating the copy's directory");
    let sources = real_tree_sources(max_entries, max_bytes);
    let mut args: Vec<&str> = vec!["-a"];
    args.extend(sources.iter().map(|p| path_str(p)));
    args.push(path_str(dest));
    run_ok("cp", &args);
    sources.iter().map(|p| tree_size(p).0).sum()
}

// ------------------------------------------------------------ snapshots

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    File,
    Dir,
    Symlink,
    Fifo,
    Socket,
    CharDevice,
    BlockDevice,
}

/// What a walk records about one name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    pub kind: Kind,
    /// Inode number (0 for the root, which FUSE calls 1 and ext4 2).
    pub ino: u64,
    /// Permission bits with setuid, setgid and sticky.
    pub mode: u32,
    pub nlink: u64,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    /// Allocated 512-byte units.
    pub blocks: u64,
    pub mtime: (i64, i64),
    pub rdev: u64,
    pub target: Option<Vec<u8>>,
    /// Size, count of non-zero 1 KiB pieces, and a hash over them with
    /// their offsets: equal for equal contents whatever the hole layout.
    pub content: Option<String>,
    pub xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
}

impl Node {
    fn fields(&self) -> Vec<(&'static str, String)> {
        let show = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
        let xattrs: Vec<String> = self
            .xattrs
            .iter()
            .map(|(name, value)| {
                let mut hasher = DefaultHasher::new();
                hasher.write(value);
                format!("{}({}b,{:x})", show(name), value.len(), hasher.finish())
            })
            .collect();
        vec![
            ("kind", format!("{:?}", self.kind)),
            ("ino", self.ino.to_string()),
            ("mode", format!("{:o}", self.mode)),
            ("nlink", self.nlink.to_string()),
            ("uid", self.uid.to_string()),
            ("gid", self.gid.to_string()),
            ("size", self.size.to_string()),
            ("blocks", self.blocks.to_string()),
            ("mtime", format!("{}.{:09}", self.mtime.0, self.mtime.1)),
            ("rdev", self.rdev.to_string()),
            (
                "target",
                self.target.as_deref().map(show).unwrap_or_default(),
            ),
            ("content", self.content.clone().unwrap_or_default()),
            ("xattrs", xattrs.join(" ")),
        ]
    }
}

/// Every name under a root, by relative path ("" is the root itself).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    pub nodes: BTreeMap<PathBuf, Node>,
}

impl Snapshot {
    pub fn get(&self, relative: &str) -> Option<&Node> {
        self.nodes.get(Path::new(relative))
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }
}

/// Walk `root` (without following symlinks) and record every name.
pub fn snapshot(root: &Path) -> Snapshot {
    let mut nodes = BTreeMap::new();
    let mut pending = vec![PathBuf::new()];
    // Bounded: each path is visited once; a walk of a million names means a loop.
    while let Some(relative) = pending.pop() {
        assert!(
            nodes.len() < 2_000_000,
            "snapshot of {} does not end",
            root.display()
        );
        let path = root.join(&relative);
        let node = node_of(&path, relative.as_os_str().is_empty());
        if node.kind == Kind::Dir {
            let entries = fs::read_dir(&path)
                .unwrap_or_else(|error| panic!("listing {}: {error}", path.display()));
            for entry in entries {
                let entry =
                    entry.unwrap_or_else(|error| panic!("listing {}: {error}", path.display()));
                pending.push(relative.join(entry.file_name()));
            }
        }
        nodes.insert(relative, node);
    }
    Snapshot { nodes }
}

fn node_of(path: &Path, is_root: bool) -> Node {
    let meta = fs::symlink_metadata(path)
        .unwrap_or_else(|error| panic!("lstat {}: {error}", path.display()));
    let file_type = meta.file_type();
    let kind = if file_type.is_file() {
        Kind::File
    } else if file_type.is_dir() {
        Kind::Dir
    } else if file_type.is_symlink() {
        Kind::Symlink
    } else if file_type.is_fifo() {
        Kind::Fifo
    } else if file_type.is_socket() {
        Kind::Socket
    } else if file_type.is_char_device() {
        Kind::CharDevice
    } else {
        Kind::BlockDevice
    };
    Node {
        kind,
        ino: if is_root { 0 } else { meta.ino() },
        mode: meta.mode() & 0o7777,
        nlink: meta.nlink(),
        uid: meta.uid(),
        gid: meta.gid(),
        size: meta.size(),
        blocks: meta.blocks(),
        mtime: (meta.mtime(), meta.mtime_nsec()),
        rdev: if matches!(kind, Kind::CharDevice | Kind::BlockDevice) {
            meta.rdev()
        } else {
            0
        },
        target: (kind == Kind::Symlink).then(|| {
            fs::read_link(path)
                .unwrap_or_else(|error| panic!("readlink {}: {error}", path.display()))
                .as_os_str()
                .as_bytes()
                .to_vec()
        }),
        content: (kind == Kind::File).then(|| content_digest(path)),
        xattrs: xattrs(path),
    }
}

const PIECE: usize = 1024;

/// Hash the non-zero 1 KiB pieces of a file with their offsets, reading only
/// what SEEK_DATA reports (multi-GiB sparse files stay cheap).
pub fn content_digest(path: &Path) -> String {
    let mut file =
        fs::File::open(path).unwrap_or_else(|error| panic!("open {}: {error}", path.display()));
    let size = file.metadata().expect("fstat").len();
    let fd = file.as_raw_fd();
    let mut hasher = DefaultHasher::new();
    let mut pieces = 0u64;
    let mut next_piece = 0u64; // first byte not yet hashed, piece aligned
    let mut position = 0u64;
    let mut buffer = vec![0u8; 1 << 20];
    while position < size {
        // SAFETY: lseek on a descriptor we own.
        let data = unsafe { libc::lseek(fd, position as i64, libc::SEEK_DATA) };
        let (data, hole) = if data < 0 {
            let error = std::io::Error::last_os_error();
            match error.raw_os_error() {
                Some(libc::ENXIO) => break,
                Some(libc::EINVAL) => (position, size),
                _ => panic!("SEEK_DATA on {}: {error}", path.display()),
            }
        } else {
            // SAFETY: as above.
            let hole = unsafe { libc::lseek(fd, data, libc::SEEK_HOLE) };
            assert!(hole >= data, "SEEK_HOLE on {} failed", path.display());
            (data as u64, (hole as u64).min(size))
        };
        let mut offset = (data / PIECE as u64 * PIECE as u64).max(next_piece);
        while offset < hole {
            let want = ((hole - offset) as usize).min(buffer.len());
            let got = read_at_full(&mut file, offset, &mut buffer[..want], path);
            if got == 0 {
                break;
            }
            for (index, piece) in buffer[..got].chunks(PIECE).enumerate() {
                if piece.iter().any(|&b| b != 0) {
                    hasher.write_u64(offset + (index * PIECE) as u64);
                    hasher.write(piece);
                    pieces += 1;
                }
            }
            offset += got as u64;
        }
        next_piece = offset.div_ceil(PIECE as u64) * PIECE as u64;
        position = hole.max(position + 1);
    }
    format!("{size}:{pieces}:{:016x}", hasher.finish())
}

fn read_at_full(file: &mut fs::File, offset: u64, buffer: &mut [u8], path: &Path) -> usize {
    use std::os::unix::fs::FileExt;
    let mut done = 0;
    while done < buffer.len() {
        match file.read_at(&mut buffer[done..], offset + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(error) if error.kind() == std::io::ErrorKind::Interrupted => {}
            Err(error) => panic!("read {} at {offset}: {error}", path.display()),
        }
    }
    done
}

/// All extended attributes of a name (not following symlinks).
pub fn xattrs(path: &Path) -> BTreeMap<Vec<u8>, Vec<u8>> {
    let c_path = CString::new(path.as_os_str().as_bytes()).expect("path without NUL");
    let mut names = vec![0u8; 64 * 1024];
    // SAFETY: the buffer is valid for its length; the path is NUL-terminated.
    let length = unsafe {
        libc::llistxattr(
            c_path.as_ptr(),
            names.as_mut_ptr() as *mut libc::c_char,
            names.len(),
        )
    };
    if length < 0 {
        let error = std::io::Error::last_os_error();
        if error.raw_os_error() == Some(libc::ENOTSUP) {
            return BTreeMap::new();
        }
        panic!("llistxattr {}: {error}", path.display());
    }
    names.truncate(length as usize);
    let mut result = BTreeMap::new();
    for name in names.split(|&b| b == 0).filter(|name| !name.is_empty()) {
        let value = get_xattr(path, name)
            .unwrap_or_else(|error| panic!("lgetxattr {} {name:?}: {error}", path.display()));
        result.insert(name.to_vec(), value);
    }
    result
}

pub fn get_xattr(path: &Path, name: &[u8]) -> std::io::Result<Vec<u8>> {
    let c_path = CString::new(path.as_os_str().as_bytes()).expect("path without NUL");
    let c_name = CString::new(name).expect("name without NUL");
    let mut value = vec![0u8; 64 * 1024];
    // SAFETY: valid NUL-terminated strings and a buffer of the given length.
    let length = unsafe {
        libc::lgetxattr(
            c_path.as_ptr(),
            c_name.as_ptr(),
            value.as_mut_ptr() as *mut libc::c_void,
            value.len(),
        )
    };
    if length < 0 {
        return Err(std::io::Error::last_os_error());
    }
    value.truncate(length as usize);
    Ok(value)
}

pub fn set_xattr(path: &Path, name: &str, value: &[u8]) -> std::io::Result<()> {
    let c_path = CString::new(path.as_os_str().as_bytes()).expect("path without NUL");
    let c_name = CString::new(name).expect("name without NUL");
    // SAFETY: valid NUL-terminated strings and a value of the given length.
    let result = unsafe {
        libc::lsetxattr(
            c_path.as_ptr(),
            c_name.as_ptr(),
            value.as_ptr() as *const libc::c_void,
            value.len(),
            0,
        )
    };
    if result < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

pub fn remove_xattr(path: &Path, name: &str) -> std::io::Result<()> {
    let c_path = CString::new(path.as_os_str().as_bytes()).expect("path without NUL");
    let c_name = CString::new(name).expect("name without NUL");
    // SAFETY: valid NUL-terminated strings.
    if unsafe { libc::lremovexattr(c_path.as_ptr(), c_name.as_ptr()) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// The differences between two snapshots, one line each (at most `limit`
/// lines, then a count of the rest).
pub fn diff(left: &Snapshot, right: &Snapshot, names: (&str, &str), limit: usize) -> Vec<String> {
    let mut lines = Vec::new();
    let mut total = 0;
    let mut note = |line: String| {
        total += 1;
        if lines.len() < limit {
            lines.push(line);
        }
    };
    for (path, node) in &left.nodes {
        let Some(other) = right.nodes.get(path) else {
            note(format!(
                "{}: only in {} ({:?})",
                path.display(),
                names.0,
                node.kind
            ));
            continue;
        };
        for ((field, a), (_, b)) in node.fields().into_iter().zip(other.fields()) {
            if a != b {
                note(format!(
                    "{}: {field} {}={a} {}={b}",
                    path.display(),
                    names.0,
                    names.1
                ));
            }
        }
    }
    for (path, node) in &right.nodes {
        if !left.nodes.contains_key(path) {
            note(format!(
                "{}: only in {} ({:?})",
                path.display(),
                names.1,
                node.kind
            ));
        }
    }
    if total > lines.len() {
        lines.push(format!("... and {} more differences", total - lines.len()));
    }
    lines
}

/// Panic with a readable diff unless the snapshots are equal.
pub fn assert_same(left: &Snapshot, right: &Snapshot, names: (&str, &str)) {
    let differences = diff(left, right, names, 60);
    assert!(
        differences.is_empty(),
        "{} and {} differ ({} vs {} names):\n{}",
        names.0,
        names.1,
        left.len(),
        right.len(),
        differences.join("\n")
    );
}

// ------------------------------------------------------- small file ops

/// utimensat with nanoseconds, not following a final symlink.
pub fn set_times(path: &Path, atime: (i64, i64), mtime: (i64, i64)) {
    let c_path = CString::new(path.as_os_str().as_bytes()).expect("path without NUL");
    let times = [
        libc::timespec {
            tv_sec: atime.0,
            tv_nsec: atime.1,
        },
        libc::timespec {
            tv_sec: mtime.0,
            tv_nsec: mtime.1,
        },
    ];
    // SAFETY: valid path and a two-element timespec array.
    let result = unsafe {
        libc::utimensat(
            libc::AT_FDCWD,
            c_path.as_ptr(),
            times.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    assert_eq!(
        result,
        0,
        "utimensat {}: {}",
        path.display(),
        std::io::Error::last_os_error()
    );
}

/// renameat2 with RENAME_EXCHANGE.
pub fn exchange(a: &Path, b: &Path) {
    let ca = CString::new(a.as_os_str().as_bytes()).expect("path without NUL");
    let cb = CString::new(b.as_os_str().as_bytes()).expect("path without NUL");
    // SAFETY: valid NUL-terminated paths.
    let result = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            ca.as_ptr(),
            libc::AT_FDCWD,
            cb.as_ptr(),
            libc::RENAME_EXCHANGE,
        )
    };
    assert_eq!(
        result,
        0,
        "renameat2(EXCHANGE) {} {}: {}",
        a.display(),
        b.display(),
        std::io::Error::last_os_error()
    );
}

/// mknod for fifos and device nodes.
pub fn mknod(path: &Path, mode: u32, rdev: u64) {
    let c_path = CString::new(path.as_os_str().as_bytes()).expect("path without NUL");
    // SAFETY: a valid path.
    let result = unsafe { libc::mknod(c_path.as_ptr(), mode, rdev) };
    assert_eq!(
        result,
        0,
        "mknod {}: {}",
        path.display(),
        std::io::Error::last_os_error()
    );
}

/// syncfs on the filesystem holding `path`.
pub fn syncfs(path: &Path) {
    let file = fs::File::open(path).expect("opening for syncfs");
    // SAFETY: a descriptor we own.
    assert_eq!(unsafe { libc::syncfs(file.as_raw_fd()) }, 0, "syncfs");
}

/// A deterministic byte pattern, different per `seed`.
pub fn pattern(seed: u64, length: usize) -> Vec<u8> {
    jext4::crash::rng::Rng::derive(seed, "pattern").bytes(length)
}

pub fn read_all(path: &Path) -> Vec<u8> {
    let mut data = Vec::new();
    fs::File::open(path)
        .and_then(|mut file| file.read_to_end(&mut data))
        .unwrap_or_else(|error| panic!("reading {}: {error}", path.display()));
    data
}

/// Wait until `condition` holds, up to `limit`.
pub fn wait_for(limit: Duration, mut condition: impl FnMut() -> bool) -> bool {
    let start = std::time::Instant::now();
    while start.elapsed() < limit {
        if condition() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    condition()
}

// ------------------------------------------------------------- workload

/// What the workload knows about the filesystem it runs on.
#[derive(Debug, Clone, Copy)]
pub struct Params {
    pub block_size: u64,
    /// Files map their blocks with extents (fallocate, punch, deep trees).
    pub extents: bool,
    /// Entries of the big directory (a third are deleted again).
    pub big_dir_entries: usize,
}

/// A content the workload promises, checked by reading it back.
#[derive(Debug, Clone)]
pub enum Expect {
    Exact {
        path: String,
        data: Vec<u8>,
    },
    /// Data at given offsets, zeros between them, and a size.
    Sparse {
        path: String,
        size: u64,
        data: Vec<(u64, Vec<u8>)>,
    },
}

/// What the workload leaves for the caller: promised contents and files
/// kept open after their last name went (release them by dropping).
pub struct Outcome {
    pub expect: Vec<Expect>,
    pub held: Vec<fs::File>,
}

/// The deep-extent file: one block at every other block, enough of them
/// that four leaves under the inode cannot hold the extents (depth ≥ 2).
pub fn deep_file_blocks(block_size: u64) -> u64 {
    let per_leaf = (block_size - 12) / 12;
    4 * per_leaf + 64
}

/// Every kind of object and change issue 2 lists, under `root/ops`, plus
/// renames, attribute changes and a removal inside the real tree at
/// `root/tree` when it exists.
pub fn workload(root: &Path, params: &Params) -> Outcome {
    let ops = root.join("ops");
    fs::create_dir_all(&ops).expect("mkdir ops");
    let mut outcome = Outcome {
        expect: Vec::new(),
        held: Vec::new(),
    };
    renames(&ops, &mut outcome.expect);
    links(&ops);
    symlinks(&ops, params.block_size);
    sparse_files(&ops, params, &mut outcome.expect);
    deep_extents(&ops, params.block_size, &mut outcome.expect);
    truncates(&ops, params.block_size, &mut outcome.expect);
    open_unlinked(&ops, &mut outcome);
    attributes(&ops);
    extended_attributes(&ops, params.block_size);
    special_nodes(&ops);
    big_directory(&ops.join("bigdir"), params.big_dir_entries);
    if root.join("tree").is_dir() {
        real_tree_changes(&root.join("tree"));
    }
    reuse_freed_space(&ops, &mut outcome.expect);
    outcome
}

/// New files right after deletions take the blocks just freed (first fit
/// near their inode): nothing stale may land on them later.
fn reuse_freed_space(ops: &Path, expect: &mut Vec<Expect>) {
    let dir = ops.join("after-rm");
    fs::create_dir(&dir).unwrap();
    for i in 0..300u64 {
        let path = dir.join(format!("f{i}"));
        let data = pattern(2000 + i, 500 + (37 * i as usize) % 3000);
        write_file(&path, &data);
        expect_exact(expect, ops, &path, data);
    }
}

fn write_file(path: &Path, data: &[u8]) {
    fs::write(path, data).unwrap_or_else(|error| panic!("writing {}: {error}", path.display()));
}

fn expect_exact(expect: &mut Vec<Expect>, ops: &Path, path: &Path, data: Vec<u8>) {
    let relative = path.strip_prefix(ops.parent().unwrap()).unwrap();
    expect.push(Expect::Exact {
        path: relative.to_string_lossy().into_owned(),
        data,
    });
}

fn renames(ops: &Path, expect: &mut Vec<Expect>) {
    let (a, b) = (ops.join("ren/a"), ops.join("ren/b"));
    fs::create_dir_all(&a).unwrap();
    fs::create_dir_all(&b).unwrap();
    for i in 0..10u64 {
        write_file(
            &a.join(format!("f{i}")),
            &pattern(i, 1000 + 100 * i as usize),
        );
    }
    // Across directories.
    fs::rename(a.join("f1"), b.join("f1")).unwrap();
    // Over an existing file, in the same directory and across.
    fs::rename(a.join("f2"), a.join("f3")).unwrap();
    expect_exact(expect, ops, &a.join("f3"), pattern(2, 1200));
    write_file(&b.join("victim"), b"to be replaced");
    fs::rename(a.join("f4"), b.join("victim")).unwrap();
    expect_exact(expect, ops, &b.join("victim"), pattern(4, 1400));
    // A directory across directories (its ".." and both link counts change).
    fs::create_dir_all(a.join("sub/deeper")).unwrap();
    write_file(&a.join("sub/deeper/inner"), b"inner");
    fs::rename(a.join("sub"), b.join("sub")).unwrap();
    // A directory over an empty directory.
    fs::create_dir(a.join("empty_target")).unwrap();
    fs::create_dir(b.join("sub2")).unwrap();
    write_file(&b.join("sub2/content"), b"moved with its directory");
    fs::rename(b.join("sub2"), a.join("empty_target")).unwrap();
    // RENAME_EXCHANGE of a file and a directory in different directories.
    exchange(&a.join("f5"), &b.join("sub"));
    assert!(a.join("f5/deeper/inner").is_file());
    expect_exact(expect, ops, &b.join("sub"), pattern(5, 1500));
}

fn links(ops: &Path) {
    let dir = ops.join("links");
    fs::create_dir_all(&dir).unwrap();
    let original = ops.join("ren/b/f1");
    for name in ["l1", "l2", "l3"] {
        fs::hard_link(&original, dir.join(name)).unwrap();
    }
    fs::remove_file(dir.join("l2")).unwrap();
    assert_eq!(fs::metadata(&original).unwrap().nlink(), 3);
}

fn symlinks(ops: &Path, block_size: u64) {
    let dir = ops.join("sym");
    fs::create_dir_all(&dir).unwrap();
    // Lengths around the 60-byte i_block boundary, and long ones (block
    // symlinks); ~1000 bytes still fits a 1 KiB block.
    let long_max = 1000.min(block_size as usize - 1);
    for length in [1usize, 30, 59, 60, 61, 200, long_max] {
        let target: String = (0..length)
            .map(|i| {
                if i % 10 == 9 {
                    '/'
                } else {
                    (b'a' + (i % 26) as u8) as char
                }
            })
            .collect();
        std::os::unix::fs::symlink(&target, dir.join(format!("len{length}"))).unwrap();
    }
    std::os::unix::fs::symlink("/usr/share/doc", dir.join("absolute")).unwrap();
    std::os::unix::fs::symlink("../ren/b/f1", dir.join("relative")).unwrap();
    std::os::unix::fs::symlink("nowhere/at/all", dir.join("dangling")).unwrap();
    assert_eq!(fs::read(dir.join("relative")).unwrap(), pattern(1, 1100));
}

fn sparse_files(ops: &Path, params: &Params, expect: &mut Vec<Expect>) {
    use std::os::unix::fs::FileExt;
    let dir = ops.join("sparse");
    fs::create_dir_all(&dir).unwrap();
    let middle = fs::File::create(dir.join("middle")).unwrap();
    middle.set_len(16 << 20).unwrap();
    let chunk = pattern(77, 10_000);
    middle.write_all_at(&chunk, (7 << 20) + 123).unwrap();
    expect.push(Expect::Sparse {
        path: "ops/sparse/middle".into(),
        size: 16 << 20,
        data: vec![((7 << 20) + 123, chunk)],
    });
    // Multi-GiB: data at 0 and beyond 2 GiB (large_file, and the
    // indirect tiers on block-mapped images).
    let huge = fs::File::create(dir.join("huge")).unwrap();
    let (head, far) = (pattern(78, 65536), pattern(79, 65536));
    let far_offset = (2u64 << 30) + (1 << 20) + 512;
    huge.write_all_at(&head, 0).unwrap();
    huge.write_all_at(&far, far_offset).unwrap();
    let huge_size = (3u64 << 30) + 12345;
    huge.set_len(huge_size).unwrap();
    expect.push(Expect::Sparse {
        path: "ops/sparse/huge".into(),
        size: huge_size,
        data: vec![(0, head), (far_offset, far)],
    });
    if params.extents {
        // Preallocated (unwritten) space, a write into it, a punched hole.
        let file = fs::File::create(dir.join("fallocated")).unwrap();
        fallocate(&file, 0, 0, 1 << 20);
        let inside = pattern(80, 5000);
        file.write_all_at(&inside, 300_000).unwrap();
        let full = pattern(81, 200_000);
        file.write_all_at(&full, 600_000).unwrap();
        fallocate(
            &file,
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            650_000,
            100_000,
        );
        let mut expected_full = full.clone();
        expected_full[50_000..150_000].fill(0);
        expect.push(Expect::Sparse {
            path: "ops/sparse/fallocated".into(),
            size: 1 << 20,
            data: vec![(300_000, inside), (600_000, expected_full)],
        });
    }
}

pub fn fallocate(file: &fs::File, mode: i32, offset: i64, length: i64) {
    // SAFETY: a descriptor we own.
    let result = unsafe { libc::fallocate(file.as_raw_fd(), mode, offset, length) };
    assert_eq!(result, 0, "fallocate: {}", std::io::Error::last_os_error());
}

fn deep_extents(ops: &Path, block_size: u64, expect: &mut Vec<Expect>) {
    use std::os::unix::fs::FileExt;
    let file = fs::File::create(ops.join("deep")).unwrap();
    let count = deep_file_blocks(block_size);
    let mut data = Vec::new();
    for i in 0..count {
        let block = pattern(1000 + i, block_size as usize);
        let offset = 2 * i * block_size;
        file.write_all_at(&block, offset).unwrap();
        data.push((offset, block));
    }
    expect.push(Expect::Sparse {
        path: "ops/deep".into(),
        size: (2 * count - 1) * block_size,
        data,
    });
}

fn truncates(ops: &Path, block_size: u64, expect: &mut Vec<Expect>) {
    use std::os::unix::fs::FileExt;
    let dir = ops.join("trunc");
    fs::create_dir_all(&dir).unwrap();
    // Down to an unaligned size, up again: the tail past the cut reads as zeros.
    let original = pattern(90, 300_000);
    write_file(&dir.join("a"), &original);
    let file = fs::OpenOptions::new()
        .write(true)
        .open(dir.join("a"))
        .unwrap();
    file.set_len(100_003).unwrap();
    assert_eq!(fs::read(dir.join("a")).unwrap(), original[..100_003]);
    file.set_len(250_000).unwrap();
    let tail = pattern(91, 1000);
    file.write_all_at(&tail, 400_000).unwrap();
    let mut expected = original[..100_003].to_vec();
    expected.resize(400_000, 0);
    expected.extend_from_slice(&tail);
    assert_eq!(fs::read(dir.join("a")).unwrap(), expected);
    expect_exact(expect, ops, &dir.join("a"), expected);
    // Block-aligned cut, then growth into a partial block.
    let bs = block_size as usize;
    let original = pattern(92, 5 * bs);
    write_file(&dir.join("b"), &original);
    let file = fs::OpenOptions::new()
        .write(true)
        .open(dir.join("b"))
        .unwrap();
    file.set_len(2 * block_size).unwrap();
    file.set_len(3 * block_size + 7).unwrap();
    let mut expected = original[..2 * bs].to_vec();
    expected.resize(3 * bs + 7, 0);
    expect_exact(expect, ops, &dir.join("b"), expected);
    // To zero and written again; O_TRUNC.
    write_file(&dir.join("c"), &pattern(93, 50_000));
    fs::OpenOptions::new()
        .write(true)
        .open(dir.join("c"))
        .unwrap()
        .set_len(0)
        .unwrap();
    write_file(&dir.join("c"), b"new content");
    expect_exact(expect, ops, &dir.join("c"), b"new content".to_vec());
    write_file(&dir.join("d"), &pattern(94, 70_000));
    write_file(&dir.join("d"), b"short");
    expect_exact(expect, ops, &dir.join("d"), b"short".to_vec());
}

fn open_unlinked(ops: &Path, outcome: &mut Outcome) {
    use std::os::unix::fs::FileExt;
    let path = ops.join("open_unlinked");
    let data = pattern(95, 200_000);
    write_file(&path, &data);
    let file = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .unwrap();
    fs::remove_file(&path).unwrap();
    assert!(!path.exists());
    let mut read_back = vec![0u8; data.len()];
    file.read_exact_at(&mut read_back, 0).unwrap();
    assert_eq!(read_back, data, "an unlinked open file reads back");
    file.write_all_at(b"still writable", 200_000).unwrap();
    assert_eq!(file.metadata().unwrap().nlink(), 0);
    outcome.held.push(file);
}

fn attributes(ops: &Path) {
    use std::os::unix::fs::{chown, lchown, symlink};
    let dir = ops.join("attrs");
    fs::create_dir_all(&dir).unwrap();
    write_file(&dir.join("file"), b"attributes");
    chown(dir.join("file"), Some(1234), Some(5678)).unwrap();
    set_mode(&dir.join("file"), 0o4751);
    set_times(
        &dir.join("file"),
        (1_234_567_890, 987_654_321),
        (1_234_567_890, 123_456_789),
    );
    fs::create_dir(dir.join("dir")).unwrap();
    chown(dir.join("dir"), Some(42), Some(43)).unwrap();
    set_mode(&dir.join("dir"), 0o2775);
    // After 2038 (the extra epoch bits), and before 1970.
    set_times(
        &dir.join("dir"),
        (4_000_000_000, 1),
        (4_000_000_000, 999_999_999),
    );
    write_file(&dir.join("old"), b"old");
    set_times(
        &dir.join("old"),
        (-123_456_789, 5),
        (-123_456_789, 500_000_000),
    );
    fs::create_dir(dir.join("sticky")).unwrap();
    set_mode(&dir.join("sticky"), 0o1777);
    symlink("file", dir.join("link")).unwrap();
    lchown(dir.join("link"), Some(7), Some(8)).unwrap();
    set_times(&dir.join("link"), (1_500_000_000, 1), (1_500_000_000, 2));
    // A setgid directory hands its group to what is created inside.
    chown(dir.join("dir"), Some(42), Some(500)).unwrap();
    set_mode(&dir.join("dir"), 0o2775);
    write_file(&dir.join("dir/child"), b"inherits the group");
    fs::create_dir(dir.join("dir/subdir")).unwrap();
    assert_eq!(fs::metadata(dir.join("dir/child")).unwrap().gid(), 500);
    set_times(
        &dir.join("dir"),
        (4_000_000_000, 1),
        (4_000_000_000, 999_999_999),
    );
}

fn extended_attributes(ops: &Path, block_size: u64) {
    let dir = ops.join("xattr");
    fs::create_dir_all(&dir).unwrap();
    set_xattr(&dir, "user.on_directory", b"d").unwrap();
    let small = dir.join("small");
    write_file(&small, b"x");
    set_xattr(&small, "user.a", b"1").unwrap();
    set_xattr(&small, "user.b", b"hello world").unwrap();
    set_xattr(&small, "trusted.t", &pattern(1, 20)).unwrap();
    set_xattr(&small, "security.s", b"label").unwrap();
    // Bigger than the inode body: spills into an xattr block.
    let big = dir.join("big");
    write_file(&big, b"x");
    set_xattr(&big, "user.big", &pattern(2, block_size as usize - 200)).unwrap();
    // Replaced with other sizes, removed.
    let changing = dir.join("changing");
    write_file(&changing, b"x");
    set_xattr(&changing, "user.v", &pattern(3, 10)).unwrap();
    set_xattr(&changing, "user.v", &pattern(4, 500)).unwrap();
    set_xattr(&changing, "user.v", &pattern(5, 5)).unwrap();
    set_xattr(&changing, "user.gone", b"soon").unwrap();
    remove_xattr(&changing, "user.gone").unwrap();
    let many = dir.join("many");
    write_file(&many, b"x");
    // Fits a 1 KiB block: 16 entries of 24 bytes and 240 bytes of values.
    for i in 0..16 {
        set_xattr(
            &many,
            &format!("user.key{i:02}"),
            &pattern(i, i as usize * 2),
        )
        .unwrap();
    }
    std::os::unix::fs::symlink("small", dir.join("link")).unwrap();
    set_xattr(&dir.join("link"), "trusted.on_link", b"l").unwrap();
    // POSIX ACLs (access and default), the same ACL on several files.
    for i in 0..4 {
        write_file(&dir.join(format!("acl{i}")), b"acl");
        run_ok(
            "setfacl",
            &[
                "-m",
                "u:1234:rwx,g:5678:r-x",
                path_str(&dir.join(format!("acl{i}"))),
            ],
        );
    }
    fs::create_dir(dir.join("acl_dir")).unwrap();
    run_ok(
        "setfacl",
        &[
            "-d",
            "-m",
            "u:1234:rx,g::r-x",
            path_str(&dir.join("acl_dir")),
        ],
    );
    run_ok("setfacl", &["-m", "u:99:r", path_str(&dir.join("acl_dir"))]);
    assert_eq!(get_xattr(&small, b"user.b").unwrap(), b"hello world");
}

fn special_nodes(ops: &Path) {
    let dir = ops.join("special");
    fs::create_dir_all(&dir).unwrap();
    mknod(&dir.join("fifo"), libc::S_IFIFO | 0o644, 0);
    mknod(&dir.join("socket"), libc::S_IFSOCK | 0o755, 0);
    mknod(
        &dir.join("null"),
        libc::S_IFCHR | 0o666,
        libc::makedev(1, 3),
    );
    mknod(
        &dir.join("loop200"),
        libc::S_IFBLK | 0o660,
        libc::makedev(7, 200),
    );
    // A device number that needs the new (large) encoding.
    mknod(
        &dir.join("big_dev"),
        libc::S_IFCHR | 0o600,
        libc::makedev(300, 70_000),
    );
}

/// `entries` files with names of varied lengths; every third deleted again.
pub fn big_directory(dir: &Path, entries: usize) {
    fs::create_dir_all(dir).unwrap();
    for i in 0..entries {
        fs::File::create(dir.join(big_dir_name(i))).unwrap();
    }
    for i in (0..entries).step_by(3) {
        fs::remove_file(dir.join(big_dir_name(i))).unwrap();
    }
}

pub fn big_dir_name(i: usize) -> String {
    let padding = "n".repeat(i % 47);
    if i % 500 == 7 {
        format!("{i:06}-{}", "L".repeat(240))
    } else {
        format!("{i:06}-{padding}")
    }
}

/// In the copied real tree: a directory moves into another, a file is
/// renamed over another, times with nanoseconds, a subtree removed.
fn real_tree_changes(tree: &Path) {
    let mut dirs: Vec<PathBuf> = fs::read_dir(tree)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| fs::symlink_metadata(p).unwrap().is_dir())
        .collect();
    dirs.sort();
    assert!(dirs.len() >= 4, "the real tree needs a few directories");
    let files: Vec<PathBuf> = snapshot(tree)
        .nodes
        .iter()
        .filter(|(_, node)| node.kind == Kind::File && node.nlink == 1)
        .map(|(path, _)| tree.join(path))
        .take(40)
        .collect();
    assert!(files.len() >= 4);
    fs::rename(&files[0], &files[1]).unwrap();
    for file in &files[2..10] {
        run_ok(
            "touch",
            &["-h", "-d", "2001-02-03 04:05:06.123456789", path_str(file)],
        );
    }
    let moved = dirs[1].join("moved-here");
    fs::rename(&dirs[0], &moved).unwrap();
    run_ok("chown", &["-R", "1000:1000", path_str(&moved)]);
    run_ok("rm", &["-rf", path_str(dirs.last().unwrap())]);
}

/// Check every promised content under `root`.
pub fn verify(root: &Path, expect: &[Expect]) {
    use std::os::unix::fs::FileExt;
    for item in expect {
        match item {
            Expect::Exact { path, data } => {
                let got = read_all(&root.join(path));
                assert!(
                    got == *data,
                    "{path}: {} bytes read, {} expected{}",
                    got.len(),
                    data.len(),
                    first_difference(&got, data)
                );
            }
            Expect::Sparse { path, size, data } => {
                let file = fs::File::open(root.join(path)).unwrap();
                assert_eq!(file.metadata().unwrap().len(), *size, "{path}: size");
                for (offset, bytes) in data {
                    let mut got = vec![0u8; bytes.len()];
                    file.read_exact_at(&mut got, *offset).unwrap();
                    assert!(
                        got == *bytes,
                        "{path} at {offset}{}",
                        first_difference(&got, bytes)
                    );
                }
                // Zeros in the middle of every gap between the ranges.
                let mut ends: Vec<(u64, u64)> =
                    data.iter().map(|(o, b)| (*o, o + b.len() as u64)).collect();
                ends.sort();
                let mut previous_end = 0;
                for (start, end) in ends.into_iter().chain([(*size, *size)]) {
                    if start > previous_end {
                        let middle = previous_end + (start - previous_end) / 2;
                        let length = (start - middle).min(4096) as usize;
                        let mut got = vec![1u8; length];
                        file.read_exact_at(&mut got, middle).unwrap();
                        assert!(got.iter().all(|&b| b == 0), "{path}: not zeros at {middle}");
                    }
                    previous_end = previous_end.max(end);
                }
            }
        }
    }
}

fn first_difference(got: &[u8], want: &[u8]) -> String {
    match got.iter().zip(want).position(|(a, b)| a != b) {
        Some(at) => format!(
            " (first difference at byte {at}: {} vs {})",
            got[at], want[at]
        ),
        None => String::new(),
    }
}

/// statvfs: (block size, free blocks, blocks available to non-root).
pub fn statvfs(path: &Path) -> (u64, u64, u64) {
    let c_path = CString::new(path.as_os_str().as_bytes()).expect("path without NUL");
    // SAFETY: zeroed is a valid statvfs; the call fills it.
    let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: valid path and out pointer.
    let result = unsafe { libc::statvfs(c_path.as_ptr(), &mut stat) };
    assert_eq!(result, 0, "statvfs: {}", std::io::Error::last_os_error());
    (
        stat.f_frsize as u64,
        stat.f_bfree as u64,
        stat.f_bavail as u64,
    )
}
