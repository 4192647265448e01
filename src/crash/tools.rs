//! The outside world of a crash test: a scratch directory (in `/dev/shm`
//! when there is one: images are written and checked thousands of times),
//! the mke2fs template, e2fsck, and kernel loop mounts.

use super::model::{Stat, TreeSource, Xattrs};
use super::oracle::STALE_PATTERN;
use crate::fs::FileKind;
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

/// Bytes of e2fsck output kept in a failure report.
const OUTPUT_KEPT: usize = 1500;

/// Tries of an unmount that finds the filesystem busy (about 2 s in all).
const UMOUNT_ATTEMPTS: u32 = 8;

/// A directory removed (with its content) on drop.
pub struct Scratch {
    pub dir: PathBuf,
}

impl Scratch {
    pub fn new() -> Result<Scratch, String> {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let parent = if Path::new("/dev/shm").is_dir() {
            PathBuf::from("/dev/shm")
        } else {
            std::env::temp_dir()
        };
        let dir = parent.join(format!(
            "jext4-crashtest-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        Ok(Scratch { dir })
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Run a program; (exit code, stdout + stderr).
pub fn run(program: &str, args: &[&str], env: &[(&str, &str)]) -> Result<(i32, String), String> {
    let output = Command::new(program)
        .args(args)
        .envs(env.iter().copied())
        .output()
        .map_err(|e| format!("running {program}: {e}"))?;
    let mut text = String::from_utf8_lossy(&output.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&output.stderr));
    Ok((output.status.code().unwrap_or(-1), text))
}

fn shorten(text: &str) -> String {
    if text.len() <= OUTPUT_KEPT {
        return text.trim_end().to_string();
    }
    let mut end = OUTPUT_KEPT;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}\n…", &text[..end])
}

fn path_str(path: &Path) -> Result<&str, String> {
    path.to_str()
        .ok_or_else(|| format!("{} is not UTF-8", path.display()))
}

/// A fresh ext4 image of `mib` MiB with `block_size` blocks (and the
/// `fast_commit` feature when asked), made the same way every time (fixed
/// UUID, hash seed and time), whose free space holds the stale pattern (so
/// that data read before it was written is visible).
pub fn make_template(
    scratch: &Scratch,
    block_size: u32,
    mib: u64,
    fast_commit: bool,
) -> Result<Vec<u8>, String> {
    make_template_with(scratch, block_size, mib, fast_commit, false)
}

/// Blocks per group of the meta_bg template: 64 groups at 1 KiB blocks,
/// 16 at 4 KiB in 16 MiB.
const META_BG_GROUP_BLOCKS: u32 = 256;
/// Descriptors per block of the meta_bg template (`-E desc_size`): with
/// 256-block groups, 16 meta groups at 1 KiB blocks and 4 at 4 KiB.
const META_BG_DESCS_PER_BLOCK: u32 = 4;
/// Groups per flex group of the meta_bg template: one meta group each, so
/// that Orlov spreads directories (and their files) over the meta groups.
const META_BG_FLEX_GROUPS: &str = "4";

/// `make_template`, and with `meta_bg` the feature without resize_inode,
/// in a geometry that gives the image several meta groups (the groups
/// and descriptor blocks the kernel's mke2fs default would make appear
/// only in much larger images).
pub fn make_template_with(
    scratch: &Scratch,
    block_size: u32,
    mib: u64,
    fast_commit: bool,
    meta_bg: bool,
) -> Result<Vec<u8>, String> {
    let path = scratch.path(&format!("template-{block_size}.img"));
    let stale: Vec<u8> = STALE_PATTERN
        .iter()
        .copied()
        .cycle()
        .take(1 << 20)
        .collect();
    let mut file = std::fs::File::create(&path).map_err(|e| e.to_string())?;
    for _ in 0..mib {
        std::io::Write::write_all(&mut file, &stale).map_err(|e| e.to_string())?;
    }
    drop(file);
    let block_size_arg = block_size.to_string();
    // ea_inode: the xattrs workload's large values go to EA inodes (the
    // other workloads' small ones never do).
    let mut features = String::from(if fast_commit {
        "fast_commit,ea_inode"
    } else {
        "^fast_commit,ea_inode"
    });
    let mut extended = String::from(
        "nodiscard,lazy_itable_init=0,lazy_journal_init=0,root_owner=0:0,\
         hash_seed=6a657874-3463-7261-7368-746573740002",
    );
    let group_blocks = META_BG_GROUP_BLOCKS.to_string();
    let mut args = vec!["-q", "-F", "-t", "ext4", "-b", &block_size_arg];
    if meta_bg {
        features.push_str(",meta_bg,^resize_inode");
        let desc_size = block_size / META_BG_DESCS_PER_BLOCK;
        extended.push_str(&format!(",desc_size={desc_size}"));
        args.extend(["-g", &group_blocks, "-G", META_BG_FLEX_GROUPS]);
    }
    let path_arg = path_str(&path)?;
    args.extend([
        "-O",
        &features,
        "-U",
        "6a657874-3463-7261-7368-746573740001",
        "-E",
        &extended,
        path_arg,
    ]);
    let (code, text) = run("mke2fs", &args, &[("E2FSPROGS_FAKE_TIME", "1700000000")])?;
    if code != 0 {
        return Err(format!("mke2fs failed: {}", shorten(&text)));
    }
    let bytes = std::fs::read(&path).map_err(|e| e.to_string())?;
    let _ = std::fs::remove_file(&path);
    Ok(bytes)
}

/// `e2fsck -fn`: Ok when it finds nothing to fix.
pub fn fsck_clean(image: &Path, what: &str) -> Result<(), String> {
    let (code, text) = run("e2fsck", &["-fn", path_str(image)?], &[])?;
    if code != 0 {
        return Err(format!(
            "e2fsck -fn {what} exited {code}:\n{}",
            shorten(&text)
        ));
    }
    Ok(())
}

/// `e2fsck -p -E journal_only`: replay the journal like the standard tools.
/// Returns whether it also released orphan inodes (it does that after the
/// replay, in place, where jext4 and the kernel do it through the journal).
pub fn e2fsck_replay(image: &Path) -> Result<bool, String> {
    let (code, text) = run(
        "e2fsck",
        &["-p", "-E", "journal_only", path_str(image)?],
        &[],
    )?;
    // 0: nothing to do, 1: the journal was replayed.
    if code > 1 {
        return Err(format!(
            "e2fsck -p -E journal_only exited {code}:\n{}",
            shorten(&text)
        ));
    }
    // "Clearing orphaned inode N (...)", "Truncating orphaned inode N".
    Ok(text.contains("orphaned inode"))
}

/// A kernel loop mount, unmounted on drop.
pub struct KernelMount {
    pub point: PathBuf,
    mounted: bool,
}

impl KernelMount {
    pub fn new(image: &Path, point: &Path) -> Result<KernelMount, String> {
        std::fs::create_dir_all(point).map_err(|e| e.to_string())?;
        let (code, text) = run(
            "mount",
            &[
                "-t",
                "ext4",
                "-o",
                "loop",
                path_str(image)?,
                path_str(point)?,
            ],
            &[],
        )?;
        if code != 0 {
            return Err(format!("kernel mount failed: {}", shorten(&text)));
        }
        Ok(KernelMount {
            point: point.to_path_buf(),
            mounted: true,
        })
    }

    /// Unmount. "Busy" is retried for a while: a process forked by another
    /// thread holds this process's open files until it execs.
    pub fn unmount(mut self) -> Result<(), String> {
        self.mounted = false;
        let mut last = String::new();
        for attempt in 0..UMOUNT_ATTEMPTS {
            let (code, text) = run("umount", &[path_str(&self.point)?], &[])?;
            if code == 0 {
                return Ok(());
            }
            last = text;
            std::thread::sleep(std::time::Duration::from_millis(20 << attempt.min(4)));
        }
        Err(format!("umount failed: {}", shorten(&last)))
    }
}

impl Drop for KernelMount {
    fn drop(&mut self) {
        if self.mounted
            && let Some(point) = self.point.to_str()
        {
            let _ = run("umount", &[point], &[]);
        }
    }
}

/// Whether loop mounts work here (root, loop devices, ext4 in the kernel).
pub fn kernel_available(scratch: &Scratch, template: &[u8]) -> Result<(), String> {
    let image = scratch.path("probe.img");
    std::fs::write(&image, template).map_err(|e| e.to_string())?;
    let mount = KernelMount::new(&image, &scratch.path("probe.mnt"))?;
    mount.unmount()?;
    let _ = std::fs::remove_file(&image);
    Ok(())
}

/// A mounted tree read through the kernel.
pub struct StdSource<'a>(pub &'a Path);

impl StdSource<'_> {
    fn full(&self, path: &str) -> PathBuf {
        self.0.join(path.trim_start_matches('/'))
    }
}

fn kind_of(file_type: std::fs::FileType) -> FileKind {
    use std::os::unix::fs::FileTypeExt;
    if file_type.is_dir() {
        FileKind::Directory
    } else if file_type.is_symlink() {
        FileKind::Symlink
    } else if file_type.is_fifo() {
        FileKind::Fifo
    } else if file_type.is_socket() {
        FileKind::Socket
    } else if file_type.is_char_device() {
        FileKind::CharDevice
    } else if file_type.is_block_device() {
        FileKind::BlockDevice
    } else {
        FileKind::Regular
    }
}

impl TreeSource for StdSource<'_> {
    fn stat(&self, path: &str) -> Result<Option<Stat>, String> {
        match std::fs::symlink_metadata(self.full(path)) {
            Ok(meta) => Ok(Some(Stat {
                ino: meta.ino() as u32,
                kind: kind_of(meta.file_type()),
                size: meta.size(),
                perm: (meta.mode() & 0o7777) as u16,
                nlink: meta.nlink() as u32,
            })),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(error) => Err(format!("{path}: {error}")),
        }
    }

    fn list(&self, path: &str) -> Result<Vec<String>, String> {
        let entries = std::fs::read_dir(self.full(path)).map_err(|e| format!("{path}: {e}"))?;
        entries
            .map(|entry| {
                entry
                    .map(|entry| entry.file_name().to_string_lossy().into_owned())
                    .map_err(|e| format!("{path}: {e}"))
            })
            .collect()
    }

    fn read(&self, path: &str, _size: u64) -> Result<Vec<u8>, String> {
        std::fs::read(self.full(path)).map_err(|e| format!("{path}: {e}"))
    }

    fn read_link(&self, path: &str) -> Result<Vec<u8>, String> {
        let target = std::fs::read_link(self.full(path)).map_err(|e| format!("{path}: {e}"))?;
        Ok(target.as_os_str().as_bytes().to_vec())
    }

    fn xattrs(&self, path: &str) -> Result<Xattrs, String> {
        let full = CString::new(self.full(path).as_os_str().as_bytes())
            .map_err(|_| format!("{path}: NUL in path"))?;
        let names = xattr_call(|buf, len| {
            // SAFETY: `full` is a valid C string; `buf` has `len` bytes.
            unsafe { libc::llistxattr(full.as_ptr(), buf.cast(), len) }
        })
        .map_err(|e| format!("{path}: listxattr: {e}"))?;
        let mut pairs = Vec::new();
        for name in names.split(|&b| b == 0).filter(|name| !name.is_empty()) {
            let c_name = CString::new(name).map_err(|_| format!("{path}: bad xattr name"))?;
            let value = xattr_call(|buf, len| {
                // SAFETY: both strings are valid C strings; `buf` has `len` bytes.
                unsafe { libc::lgetxattr(full.as_ptr(), c_name.as_ptr(), buf.cast(), len) }
            })
            .map_err(|e| format!("{path}: getxattr: {e}"))?;
            pairs.push((name.to_vec(), value));
        }
        pairs.sort();
        Ok(pairs)
    }
}

/// Call a size-then-fill xattr syscall (`call(buffer, length)`).
fn xattr_call(call: impl Fn(*mut u8, usize) -> isize) -> std::io::Result<Vec<u8>> {
    // The value may grow between the two calls: retry a bounded number of times.
    for _ in 0..4 {
        let size = call(std::ptr::null_mut(), 0);
        if size < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let mut buffer = vec![0u8; size as usize];
        let filled = call(buffer.as_mut_ptr(), buffer.len());
        if filled >= 0 {
            buffer.truncate(filled as usize);
            return Ok(buffer);
        }
        let error = std::io::Error::last_os_error();
        if error.raw_os_error() != Some(libc::ERANGE) {
            return Err(error);
        }
    }
    Err(std::io::Error::from_raw_os_error(libc::ERANGE))
}
