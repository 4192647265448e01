//! Seed images: small real filesystems made by mke2fs and filled with a rich
//! tree, once through the kernel (a loop mount) and once through jext4
//! itself, then cached as files (never committed) so that later runs start
//! at once. A seed whose tools are missing (no root for loop mounts) is
//! skipped with a note.
//!
//! mke2fs runs with a fixed UUID, hash seed and clock, so that the layout
//! is the same from run to run; what the kernel adds (inode generations,
//! timestamps) varies, which is why failures name mutations by structure
//! and field rather than by byte offset.

#[path = "../common/skip.rs"]
mod skip_support;

pub use skip_support::skip;

use jext4::Image;
use jext4::engine::fs::{Caller, FALLOC_FL_KEEP_SIZE, MountOptions};
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

/// Bump when the recipe changes, so that cached seeds are rebuilt.
const RECIPE_VERSION: u32 = 3;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Filler {
    Kernel,
    Jext4,
    /// Filled by jext4, then copied while unlinked files are still open: an
    /// image with orphans for the next mount to release.
    Jext4Orphans,
}

#[derive(Debug, Clone, Copy)]
pub struct SeedSpec {
    pub name: &'static str,
    pub mkfs: &'static [&'static str],
    pub size_mib: u64,
    pub filler: Filler,
    /// On 4 KiB blocks, an htree with an index level under the root needs
    /// thousands of entries, which makes every walk slower: only some
    /// seeds carry one (1 KiB seeds always do, it is cheap there).
    pub two_level_htree: bool,
}

pub const SEEDS: &[SeedSpec] = &[
    SeedSpec {
        name: "ext2-1k-kernel",
        mkfs: &["-t", "ext2", "-b", "1024", "-g", "2048"],
        size_mib: 8,
        two_level_htree: true,
        filler: Filler::Kernel,
    },
    SeedSpec {
        name: "ext3-4k-kernel",
        mkfs: &["-t", "ext3", "-b", "4096"],
        size_mib: 16,
        two_level_htree: false,
        filler: Filler::Kernel,
    },
    SeedSpec {
        name: "ext4-1k-kernel",
        mkfs: &["-t", "ext4", "-b", "1024", "-g", "2048"],
        size_mib: 8,
        two_level_htree: true,
        filler: Filler::Kernel,
    },
    SeedSpec {
        name: "ext4-4k-kernel",
        mkfs: &["-t", "ext4", "-b", "4096", "-g", "1024"],
        size_mib: 16,
        two_level_htree: true,
        filler: Filler::Kernel,
    },
    SeedSpec {
        name: "ext4-1k-nocsum-kernel",
        mkfs: &[
            "-t",
            "ext4",
            "-b",
            "1024",
            "-I",
            "128",
            "-O",
            "^metadata_csum,^64bit,uninit_bg",
        ],
        size_mib: 8,
        two_level_htree: true,
        filler: Filler::Kernel,
    },
    SeedSpec {
        name: "ext4-4k-orphanfile-kernel",
        mkfs: &[
            "-t",
            "ext4",
            "-b",
            "4096",
            "-O",
            "orphan_file,metadata_csum_seed",
        ],
        size_mib: 16,
        two_level_htree: false,
        filler: Filler::Kernel,
    },
    SeedSpec {
        name: "ext2-1k-jext4",
        mkfs: &["-t", "ext2", "-b", "1024", "-g", "2048"],
        size_mib: 8,
        two_level_htree: true,
        filler: Filler::Jext4,
    },
    SeedSpec {
        name: "ext4-1k-jext4",
        mkfs: &["-t", "ext4", "-b", "1024", "-g", "2048"],
        size_mib: 8,
        two_level_htree: true,
        filler: Filler::Jext4,
    },
    SeedSpec {
        name: "ext4-4k-nocsum-jext4",
        mkfs: &["-t", "ext4", "-b", "4096", "-O", "^metadata_csum"],
        size_mib: 16,
        two_level_htree: true,
        filler: Filler::Jext4,
    },
    SeedSpec {
        name: "ext4-1k-orphans-jext4",
        mkfs: &["-t", "ext4", "-b", "1024", "-g", "2048"],
        size_mib: 8,
        two_level_htree: true,
        filler: Filler::Jext4Orphans,
    },
    SeedSpec {
        name: "ext4-4k-orphanfile-jext4",
        mkfs: &["-t", "ext4", "-b", "4096", "-O", "orphan_file"],
        size_mib: 16,
        two_level_htree: false,
        filler: Filler::Jext4Orphans,
    },
];

/// Where seeds are cached: `$JEXT4_FUZZ_SEED_DIR`, else `target/fuzz-seeds`
/// of the repository (also when compiled into the fuzz crate under fuzz/).
pub fn seed_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("JEXT4_FUZZ_SEED_DIR") {
        return PathBuf::from(dir);
    }
    let mut root = Path::new(env!("CARGO_MANIFEST_DIR")).to_path_buf();
    if root.join("fuzz_targets").is_dir() {
        root.pop();
    }
    root.join("target").join("fuzz-seeds")
}

pub fn seed_path(spec: &SeedSpec) -> PathBuf {
    seed_dir().join(format!("{}-v{RECIPE_VERSION}.img", spec.name))
}

fn tool_present(tool: &str) -> bool {
    Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {tool}"))
        .output()
        .map(|output| output.status.success())
        .unwrap_or(false)
}

/// The seed's bytes, made now if not cached; `None` (with a note on stderr)
/// when this machine cannot make it.
pub fn load_or_make(spec: &SeedSpec) -> Option<Vec<u8>> {
    let path = seed_path(spec);
    if let Ok(bytes) = std::fs::read(&path) {
        return Some(bytes);
    }
    if !tool_present("mke2fs") {
        skip(&format!("seed {}: mke2fs is not installed", spec.name));
        return None;
    }
    std::fs::create_dir_all(seed_dir()).expect("creating the seed directory");
    let work = path.with_extension(format!("tmp{}", std::process::id()));
    mkfs(&work, spec);
    let made = match spec.filler {
        Filler::Kernel => fill_with_kernel(&work, spec),
        Filler::Jext4 => fill_with_jext4(&work, spec, false),
        Filler::Jext4Orphans => fill_with_jext4(&work, spec, true),
    };
    if !made {
        let _ = std::fs::remove_file(&work);
        return None;
    }
    std::fs::rename(&work, &path).expect("publishing the seed");
    std::fs::read(&path).ok()
}

fn mkfs(path: &Path, spec: &SeedSpec) {
    let file = std::fs::File::create(path).expect("creating a seed image");
    file.set_len(spec.size_mib << 20).unwrap();
    drop(file);
    let output = Command::new("mke2fs")
        .env("E2FSPROGS_FAKE_TIME", "1700000000")
        .args(["-q", "-F", "-U", "6a9c0d5e-1b2f-4c3d-8e4f-5a6b7c8d9e0f"])
        .args([
            "-E",
            "root_owner=0:0,hash_seed=0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0",
        ])
        .args(spec.mkfs)
        .arg(path)
        .output()
        .expect("running mke2fs");
    assert!(
        output.status.success(),
        "mke2fs {:?} failed: {}",
        spec.mkfs,
        String::from_utf8_lossy(&output.stderr)
    );
}

/// What a tree recipe needs from whoever fills the image.
trait Filling {
    fn block_size(&self) -> u64;
    fn mkdir(&mut self, path: &str);
    /// Write `data` at `offset`, creating the file if needed.
    fn write(&mut self, path: &str, offset: u64, data: &[u8]);
    fn symlink(&mut self, target: &str, path: &str);
    fn link(&mut self, existing: &str, new: &str);
    fn remove(&mut self, path: &str);
    fn set_xattr(&mut self, path: &str, name: &str, value: &[u8]);
    fn fifo(&mut self, path: &str);
    /// Preallocate (unwritten extents) past the end, keeping the size.
    fn preallocate(&mut self, path: &str, offset: u64, len: u64);
    fn extents(&self) -> bool;
}

/// POSIX ACL in the VFS xattr format (posix_acl_xattr.h): version 2, then
/// (tag u16, perm u16, id u32) entries.
fn acl(entries: &[(u16, u16, u32)]) -> Vec<u8> {
    let mut bytes = 2u32.to_le_bytes().to_vec();
    for &(tag, perm, id) in entries {
        bytes.extend(tag.to_le_bytes());
        bytes.extend(perm.to_le_bytes());
        bytes.extend(id.to_le_bytes());
    }
    bytes
}

fn pattern(len: usize, salt: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(salt))
        .collect()
}

/// The tree every seed holds (scaled by block size).
fn fill(f: &mut dyn Filling, two_level_htree: bool) {
    fill_files(f);
    fill_links_and_attributes(f);
    fill_directories(f, two_level_htree);
}

/// Files of every size and mapping shape.
fn fill_files(f: &mut dyn Filling) {
    let bs = f.block_size();
    f.write("/small", 0, b"hello\n");
    f.mkdir("/dir1");
    for (i, len) in [0, 1, bs - 1, bs, bs + 1, 3 * bs, 13 * bs]
        .iter()
        .enumerate()
    {
        f.write(&format!("/dir1/f{i}"), 0, &pattern(*len as usize, i as u8));
    }
    f.mkdir("/dir1/sub");
    f.mkdir("/dir1/sub/deeper");
    f.write("/dir1/sub/deeper/file", 0, b"deep\n");
    f.mkdir("/empty");
    // Sparse: data at the start and far out (double-indirect with block maps).
    f.write("/sparse", 0, &pattern(bs as usize, 7));
    f.write("/sparse", 5 << 20, &pattern(100, 8));
    // One extent per block: an extent tree of depth 1 (2 on 1 KiB blocks),
    // or indirect blocks.
    let fragments = if bs == 1024 { 400 } else { 40 };
    for i in 0..fragments {
        f.write("/fragmented", i * 2 * bs, &pattern(bs as usize, i as u8));
    }
    f.write("/big", 0, &pattern(300 << 10, 3));
    if f.extents() {
        f.write("/prealloc", 0, &pattern(100, 9));
        f.preallocate("/prealloc", 8 * bs, 8 * bs);
    }
}

/// Fast and block symlinks, hard links, a fifo, attributes in the inode
/// body and in blocks (one shared by two files), ACLs.
fn fill_links_and_attributes(f: &mut dyn Filling) {
    let bs = f.block_size();
    f.symlink("small", "/fastlink");
    f.symlink(&"long/".repeat(40), "/slowlink");
    f.symlink("../small", "/dir1/rel");
    f.link("/dir1/f2", "/hardlink");
    f.link("/dir1/f2", "/dir1/sub/hardlink2");
    f.fifo("/fifo");
    f.set_xattr("/small", "user.comment", b"hi");
    f.set_xattr("/small", "trusted.t", b"trusted value");
    f.set_xattr("/dir1/f1", "user.big", &pattern(bs as usize / 2, 1));
    f.set_xattr("/dir1/f1", "user.second", &pattern(64, 2));
    f.set_xattr("/dir1/f3", "user.big", &pattern(bs as usize / 2, 1));
    let access = acl(&[
        (1, 6, 0),
        (2, 6, 1000),
        (4, 4, 0),
        (0x10, 6, 0),
        (0x20, 4, 0),
    ]);
    f.set_xattr("/dir1/f4", "system.posix_acl_access", &access);
    let default = acl(&[(1, 7, 0), (4, 5, 0), (0x20, 5, 0)]);
    f.set_xattr("/dir1", "system.posix_acl_default", &default);
}

/// A directory with deleted entries, htrees of one and two index levels.
fn fill_directories(f: &mut dyn Filling, two_level_htree: bool) {
    let bs = f.block_size();
    f.mkdir("/deleted");
    for i in 0..40 {
        f.write(&format!("/deleted/file-{i:03}"), 0, &pattern(10, i as u8));
    }
    for i in (0..40).step_by(3) {
        f.remove(&format!("/deleted/file-{i:03}"));
    }
    // An htree with an index level under the root: names long enough that
    // few fit a leaf, hard links so that entries cost no inodes.
    f.mkdir("/htree");
    f.write("/htree/target", 0, b"target\n");
    let (names, padding) = match (bs, two_level_htree) {
        (1024, _) => (700, 200),
        (_, true) => (7000, 240),
        (_, false) => (700, 240),
    };
    let name = |i: usize| format!("/htree/{i:05}-{}", "x".repeat(padding));
    for i in 0..names {
        f.link("/htree/target", &name(i));
    }
    for i in (0..names).step_by(7) {
        f.remove(&name(i));
    }
    f.mkdir("/htree1");
    for i in 0..120 {
        f.write(&format!("/htree1/entry-{i}"), 0, b"");
    }
}

// ---------------------------------------------------------------------------
// Through the kernel.

struct KernelFill {
    root: PathBuf,
    block_size: u64,
    extents: bool,
}

fn c_path(path: &Path) -> CString {
    CString::new(path.as_os_str().as_bytes()).unwrap()
}

impl KernelFill {
    fn at(&self, path: &str) -> PathBuf {
        self.root.join(path.trim_start_matches('/'))
    }
}

impl Filling for KernelFill {
    fn block_size(&self) -> u64 {
        self.block_size
    }
    fn extents(&self) -> bool {
        self.extents
    }
    fn mkdir(&mut self, path: &str) {
        std::fs::create_dir(self.at(path)).unwrap();
    }
    fn write(&mut self, path: &str, offset: u64, data: &[u8]) {
        use std::os::unix::fs::FileExt;
        let file = std::fs::OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(false)
            .open(self.at(path))
            .unwrap();
        file.write_all_at(data, offset).unwrap();
    }
    fn symlink(&mut self, target: &str, path: &str) {
        std::os::unix::fs::symlink(target, self.at(path)).unwrap();
    }
    fn link(&mut self, existing: &str, new: &str) {
        std::fs::hard_link(self.at(existing), self.at(new)).unwrap();
    }
    fn remove(&mut self, path: &str) {
        std::fs::remove_file(self.at(path)).unwrap();
    }
    fn set_xattr(&mut self, path: &str, name: &str, value: &[u8]) {
        let path = c_path(&self.at(path));
        let name = CString::new(name).unwrap();
        // SAFETY: valid NUL-terminated strings and a buffer of the given length.
        let result = unsafe {
            libc::lsetxattr(
                path.as_ptr(),
                name.as_ptr(),
                value.as_ptr().cast(),
                value.len(),
                0,
            )
        };
        assert_eq!(
            result,
            0,
            "setxattr {name:?}: {}",
            std::io::Error::last_os_error()
        );
    }
    fn fifo(&mut self, path: &str) {
        let path = c_path(&self.at(path));
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(path.as_ptr(), 0o644) }, 0);
    }
    fn preallocate(&mut self, path: &str, offset: u64, len: u64) {
        use std::os::fd::AsRawFd;
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(self.at(path))
            .unwrap();
        // SAFETY: an open descriptor; no memory is passed.
        let result = unsafe {
            libc::fallocate(
                file.as_raw_fd(),
                libc::FALLOC_FL_KEEP_SIZE,
                offset as i64,
                len as i64,
            )
        };
        assert_eq!(result, 0);
    }
}

fn fill_with_kernel(image: &Path, spec: &SeedSpec) -> bool {
    let mount_point = image.with_extension("mnt");
    std::fs::create_dir_all(&mount_point).unwrap();
    let mounted = Command::new("mount")
        .args(["-o", "loop"])
        .arg(image)
        .arg(&mount_point)
        .output()
        .map(|output| output.status.success())
        .unwrap_or(false);
    if !mounted {
        let _ = std::fs::remove_dir(&mount_point);
        return skip(&format!(
            "seed {}: cannot loop-mount images here",
            spec.name
        ));
    }
    // s_log_block_size, straight from the superblock mke2fs wrote.
    let superblock = std::fs::read(image).unwrap();
    let block_size = 1024u64 << jext4::engine::format::get_u32(&superblock, 1024 + 0x18);
    let mut filler = KernelFill {
        root: mount_point.clone(),
        block_size,
        extents: spec.mkfs.contains(&"ext4"),
    };
    let filled = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        fill(&mut filler, spec.two_level_htree)
    }));
    let unmounted = Command::new("umount")
        .arg(&mount_point)
        .status()
        .map(|status| status.success())
        .unwrap_or(false);
    let _ = std::fs::remove_dir(&mount_point);
    assert!(unmounted, "umount of the seed {} failed", spec.name);
    if let Err(panic) = filled {
        std::panic::resume_unwind(panic);
    }
    true
}

// ---------------------------------------------------------------------------
// Through jext4.

struct JextFill<'a> {
    image: &'a Image,
}

impl Filling for JextFill<'_> {
    fn block_size(&self) -> u64 {
        self.image.fs().geometry().block_size as u64
    }
    fn extents(&self) -> bool {
        self.image
            .fs()
            .geometry()
            .has_incompat(jext4::engine::format::superblock::incompat::EXTENTS)
    }
    fn mkdir(&mut self, path: &str) {
        self.image.create_dir(path).unwrap();
    }
    fn write(&mut self, path: &str, offset: u64, data: &[u8]) {
        let file = self
            .image
            .open_with(
                path,
                jext4::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .create(true)
                    .mode(0o644),
            )
            .unwrap();
        if !data.is_empty() {
            assert_eq!(file.write_at(data, offset).unwrap(), data.len());
        }
    }
    fn symlink(&mut self, target: &str, path: &str) {
        self.image.symlink(target, path).unwrap();
    }
    fn link(&mut self, existing: &str, new: &str) {
        self.image.hard_link(existing, new).unwrap();
    }
    fn remove(&mut self, path: &str) {
        self.image.remove_file(path).unwrap();
    }
    fn set_xattr(&mut self, path: &str, name: &str, value: &[u8]) {
        self.image.set_xattr(path, name, value).unwrap();
    }
    fn fifo(&mut self, path: &str) {
        let fs = self.image.fs();
        let (parent, name) = path.rsplit_once('/').unwrap();
        let parent = self
            .image
            .metadata(if parent.is_empty() { "/" } else { parent });
        fs.mknod(
            parent.unwrap().attr().ino,
            name.as_bytes(),
            0o010644,
            0,
            Caller::ROOT,
        )
        .unwrap();
    }
    fn preallocate(&mut self, path: &str, offset: u64, len: u64) {
        let ino = self.image.metadata(path).unwrap().attr().ino;
        self.image
            .fs()
            .fallocate(ino, offset, len, FALLOC_FL_KEEP_SIZE, Caller::ROOT)
            .unwrap();
    }
}

fn fill_with_jext4(path: &Path, spec: &SeedSpec, orphans: bool) -> bool {
    let options = MountOptions::default();
    let image = Image::options()
        .mount_options(options)
        .open(path)
        .expect("mounting a fresh seed with jext4");
    fill(&mut JextFill { image: &image }, spec.two_level_htree);
    if orphans {
        // Open files, unlink them, make everything durable, and keep a copy
        // of the image as it is now: a crash with orphans pending.
        let names = ["/orphan-a", "/orphan-b", "/dir1/orphan-c"];
        let mut open = Vec::new();
        for (i, name) in names.iter().enumerate() {
            let file = image
                .open_with(
                    name,
                    jext4::OpenOptions::new()
                        .read(true)
                        .write(true)
                        .create(true)
                        .mode(0o644),
                )
                .unwrap();
            file.write_all_at(&pattern(5000 * (i + 1), i as u8), 0)
                .unwrap();
            open.push(file);
        }
        for name in names {
            image.remove_file(name).unwrap();
        }
        image.sync().unwrap();
        let crashed = std::fs::read(path).unwrap();
        drop(open);
        image.close().unwrap();
        std::fs::write(path, crashed).unwrap();
        // The crash left the orphan records in the journal (sync commits,
        // checkpoint comes later); replay it alone, as the kernel's mount
        // would before its orphan pass, so that they are home where the
        // maps and the walk look.
        let device = jext4::engine::dev::FileDevice::open(path, false).expect("reopening the seed");
        let device: std::sync::Arc<dyn jext4::engine::dev::BlockDevice> =
            std::sync::Arc::new(device);
        jext4::engine::fs::recover_device(&device).expect("replaying the seed's journal");
        return true;
    }
    image.close().unwrap();
    true
}
