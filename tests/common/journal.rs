//! Journal test helpers: images whose journals need recovery, made by the
//! kernel (loop mount, workload, `xfs_io -x -c shutdown`) or by debugfs's
//! journal writer; the journal map from debugfs; and the differential
//! against `e2fsck -E journal_only`.

use jext4::engine::dev::{BlockDevice, FileDevice, MemoryDevice};
use jext4::engine::format::superblock::Superblock;
use jext4::engine::fs::recover_journal;
use jext4::engine::journal::format::{BlockHeader, JournalSuperblock, block_type, descriptor_tags};
use jext4::engine::journal::recovery::{JournalArea, RecoveryReport};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

/// Run a command, returning (exit code, stdout + stderr).
pub fn run(program: &str, args: &[&str]) -> (i32, String) {
    let output = Command::new(program)
        .args(args)
        .env("DEBUGFS_PAGER", "__none__")
        .env("PAGER", "__none__")
        .output()
        .unwrap_or_else(|e| panic!("running {program}: {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.code().unwrap_or(-1), text)
}

fn path_str(path: &Path) -> &str {
    path.to_str().expect("utf-8 path")
}

/// The ext4 superblock of an image file.
pub fn fs_superblock(image: &Path) -> Superblock {
    let bytes = std::fs::read(image).unwrap();
    Superblock::decode(&bytes[1024..2048]).unwrap()
}

/// `dumpe2fs -h` lists needs_recovery among the features.
pub fn dumpe2fs_needs_recovery(image: &Path) -> bool {
    let (_, text) = run("dumpe2fs", &["-h", path_str(image)]);
    text.lines()
        .any(|line| line.starts_with("Filesystem features:") && line.contains("needs_recovery"))
}

/// The journal inode's block map, from `debugfs -c -R "stat <8>"`: entries
/// `(L1-L2):P1-P2` or `(L):P`; index blocks (`(IND)`, `(ETB0)`, ...) are
/// skipped. Logical blocks must come out dense from 0. Catastrophic mode
/// (`-c`) reads no allocation bitmaps: a crash image the kernel left
/// before its journal is replayed may hold a bitmap whose checksum only
/// the replay makes right, and debugfs then refuses to open it ("Block
/// bitmap checksum does not match bitmap"; seen once in
/// fast_commit_log_that_wraps_replays_like_the_kernel, before jext4 had
/// touched the image).
pub fn journal_blocks_from_debugfs(image: &Path) -> Vec<u64> {
    let (code, text) = run("debugfs", &["-c", "-R", "stat <8>", path_str(image)]);
    assert_eq!(code, 0, "debugfs stat <8>: {text}");
    let mut blocks = Vec::new();
    let mut in_map = false;
    for line in text.lines() {
        if line.starts_with("EXTENTS:") || line.starts_with("BLOCKS:") {
            in_map = true;
            continue;
        }
        if !in_map || line.starts_with("TOTAL") {
            continue;
        }
        for entry in line.split(", ") {
            parse_map_entry(entry.trim(), &mut blocks);
        }
    }
    assert!(!blocks.is_empty(), "no journal map in:\n{text}");
    blocks
}

fn parse_map_entry(entry: &str, blocks: &mut Vec<u64>) {
    let Some((logical, physical)) = entry.split_once("):") else {
        return;
    };
    let logical = logical.trim_start_matches('(');
    if !logical.starts_with(|c: char| c.is_ascii_digit()) {
        return; // (IND), (DIND), (TIND), (ETBn): mapping blocks, not journal blocks
    }
    let range = |text: &str| -> (u64, u64) {
        match text.split_once('-') {
            Some((a, b)) => (a.parse().unwrap(), b.parse().unwrap()),
            None => {
                let a = text.parse().unwrap();
                (a, a)
            }
        }
    };
    let (l1, l2) = range(logical);
    let (p1, p2) = range(physical.trim_end_matches(|c: char| !c.is_ascii_digit()));
    assert_eq!(l2 - l1, p2 - p1, "map entry {entry}");
    assert_eq!(
        l1,
        blocks.len() as u64,
        "journal map has a hole before {entry}"
    );
    blocks.extend(p1..=p2);
}

/// A `JournalArea` over an image file opened read-write.
pub fn file_area(image: &Path) -> JournalArea {
    let block_size = fs_superblock(image).block_size();
    let blocks = journal_blocks_from_debugfs(image);
    let dev: Arc<dyn BlockDevice> = Arc::new(FileDevice::open(image, false).unwrap());
    JournalArea::new(dev, block_size, blocks)
}

/// A `JournalArea` over an in-memory copy of an image.
pub fn memory_area(
    bytes: Vec<u8>,
    block_size: u32,
    blocks: Vec<u64>,
) -> (Arc<MemoryDevice>, JournalArea) {
    let dev = Arc::new(MemoryDevice::from_bytes(bytes));
    let area = JournalArea::new(dev.clone(), block_size, blocks);
    (dev, area)
}

/// Where the two images differ, outside the primary superblock (bytes
/// 1024..2048, which e2fsck rewrites with its own counters and times).
pub fn differences_outside_primary_superblock(a: &[u8], b: &[u8], block_size: usize) -> Vec<u64> {
    assert_eq!(a.len(), b.len(), "image sizes differ");
    let mut a = a.to_vec();
    a[1024..2048].copy_from_slice(&b[1024..2048]);
    a.chunks(block_size)
        .zip(b.chunks(block_size))
        .enumerate()
        .filter(|(_, (x, y))| x != y)
        .map(|(index, _)| index as u64)
        .collect()
}

/// Replay `crash` with `e2fsck -E journal_only -p` and with jext4 (each on
/// its own copy), assert the results are identical outside the primary
/// superblock and that e2fsck finds ours clean. Returns jext4's report and
/// the path of jext4's image.
pub fn recover_both(crash: &Path) -> (RecoveryReport, PathBuf) {
    recover_both_with(crash, true)
}

/// `recover_both`, optionally without the final `e2fsck -fn` verdict (for
/// corrupted journals, where a partial replay may leave inconsistencies
/// that e2fsck's own replay leaves too).
pub fn recover_both_with(crash: &Path, expect_clean: bool) -> (RecoveryReport, PathBuf) {
    let theirs = crash.with_extension("e2fsck.img");
    let ours = crash.with_extension("jext4.img");
    std::fs::copy(crash, &theirs).unwrap();
    std::fs::copy(crash, &ours).unwrap();
    let (code, text) = run("e2fsck", &["-E", "journal_only", "-p", path_str(&theirs)]);
    assert!(code <= 1, "e2fsck -E journal_only failed ({code}):\n{text}");
    let report = {
        let area = file_area(&ours);
        recover_journal(&area)
            .unwrap_or_else(|e| panic!("jext4 recovery of {}: {e}", crash.display()))
    };
    let block_size = fs_superblock(crash).block_size() as usize;
    let differing = differences_outside_primary_superblock(
        &std::fs::read(&theirs).unwrap(),
        &std::fs::read(&ours).unwrap(),
        block_size,
    );
    assert!(
        differing.is_empty(),
        "{}: jext4 and e2fsck replays differ in blocks {:?} (report {report:?})\ne2fsck said:\n{text}",
        crash.display(),
        &differing[..differing.len().min(20)]
    );
    assert!(!dumpe2fs_needs_recovery(&ours), "needs_recovery still set");
    // The primary superblock differs in counters and times, but its state
    // (clean, errors) and features must be what e2fsck leaves.
    let (their_super, our_super) = (fs_superblock(&theirs), fs_superblock(&ours));
    assert_eq!(
        their_super.state,
        our_super.state,
        "{}: s_state",
        crash.display()
    );
    assert_eq!(
        (
            their_super.feature_compat,
            their_super.feature_incompat,
            their_super.feature_ro_compat
        ),
        (
            our_super.feature_compat,
            our_super.feature_incompat,
            our_super.feature_ro_compat
        ),
        "{}: features",
        crash.display()
    );
    if expect_clean {
        let (code, text) = run("e2fsck", &["-fn", path_str(&ours)]);
        assert_eq!(code, 0, "e2fsck -fn after jext4 recovery:\n{text}");
    }
    (report, ours)
}

// ---------------------------------------------------------------------------
// Journal layout, read back for tests that damage log blocks.

/// One block of the log: its journal position, type and tid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogBlock {
    pub index: u64,
    pub block_type: u32,
    pub tid: u32,
    /// For a descriptor: where its first logged block sits.
    pub first_data: Option<u64>,
}

/// Walk the log of an image from s_start (no checksum checks) and list its
/// metadata blocks. Assumes the log does not wrap.
pub fn log_blocks(image: &Path) -> Vec<LogBlock> {
    let bytes = std::fs::read(image).unwrap();
    let block_size = fs_superblock(image).block_size() as usize;
    let map = journal_blocks_from_debugfs(image);
    let journal_block = |index: u64| {
        let at = map[index as usize] as usize * block_size;
        bytes[at..at + block_size].to_vec()
    };
    let superblock = JournalSuperblock::decode(&journal_block(0)).unwrap();
    let format = superblock.log_format();
    let mut index = superblock.start as u64;
    let mut tid = superblock.sequence;
    let mut found = Vec::new();
    while index != 0 && index < superblock.max_len as u64 {
        let block = journal_block(index);
        let Some(header) = BlockHeader::decode(&block) else {
            break;
        };
        if header.sequence != tid {
            break;
        }
        let mut entry = LogBlock {
            index,
            block_type: header.block_type,
            tid,
            first_data: None,
        };
        index += 1;
        match header.block_type {
            block_type::DESCRIPTOR => {
                entry.first_data = Some(index);
                index += descriptor_tags(&format, &block).len() as u64;
            }
            block_type::COMMIT => tid += 1,
            block_type::REVOKE => {}
            _ => break,
        }
        found.push(entry);
    }
    found
}

/// The byte offset in the image of journal block `index`.
pub fn journal_block_offset(image: &Path, index: u64) -> u64 {
    let block_size = fs_superblock(image).block_size() as u64;
    journal_blocks_from_debugfs(image)[index as usize] * block_size
}

/// Flip the bits of `mask` in the byte at `offset` of an image.
pub fn flip_byte(image: &Path, offset: u64, mask: u8) {
    use std::os::unix::fs::FileExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(image)
        .unwrap();
    let mut byte = [0u8];
    file.read_exact_at(&mut byte, offset).unwrap();
    byte[0] ^= mask;
    file.write_all_at(&byte, offset).unwrap();
}

// ---------------------------------------------------------------------------
// debugfs's journal writer.

/// Run a debugfs command file against an image, read-write.
pub fn debugfs_commands(image: &Path, commands: &str) -> String {
    let script = image.with_extension("debugfs-cmds");
    std::fs::write(&script, commands).unwrap();
    let (code, text) = run("debugfs", &["-w", "-f", path_str(&script), path_str(image)]);
    assert_eq!(code, 0, "debugfs -f {commands}:\n{text}");
    assert!(
        !text.contains("while writing journal") && !text.contains("Journal not open"),
        "debugfs journal commands failed:\n{text}"
    );
    text
}

/// `count` free blocks at or after `goal`, from `debugfs -R "ffb"`.
pub fn free_blocks(image: &Path, count: usize, goal: u64) -> Vec<u64> {
    let command = format!("ffb {count} {goal}");
    let (_, text) = run("debugfs", &["-R", &command, path_str(image)]);
    let line = text
        .lines()
        .find(|line| line.starts_with("Free blocks found:"))
        .unwrap_or_else(|| panic!("ffb: {text}"));
    let blocks: Vec<u64> = line["Free blocks found:".len()..]
        .split_whitespace()
        .map(|n| n.parse().unwrap())
        .collect();
    assert_eq!(blocks.len(), count, "{text}");
    blocks
}

/// A data file of `blocks` blocks for `jw -b`: block `i` is filled with a
/// pattern of `i`, and blocks listed in `magic` start with the JBD2 magic
/// (so the writer must escape them).
pub fn data_file(path: &Path, block_size: usize, blocks: usize, seed: u8, magic: &[usize]) {
    let mut bytes = Vec::with_capacity(block_size * blocks);
    for index in 0..blocks {
        let mut block: Vec<u8> = (0..block_size)
            .map(|i| {
                (i as u8)
                    .wrapping_mul(31)
                    .wrapping_add(seed)
                    .wrapping_add(index as u8)
            })
            .collect();
        if magic.contains(&index) {
            block[..4].copy_from_slice(&0xC03B_3998u32.to_be_bytes());
        }
        bytes.extend(block);
    }
    std::fs::write(path, bytes).unwrap();
}

// ---------------------------------------------------------------------------
// The kernel as journal writer.

static KERNEL: Mutex<()> = Mutex::new(());

/// Serialises loop mounts across tests (two cores, shared machine).
pub fn kernel_lock() -> MutexGuard<'static, ()> {
    KERNEL
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Unmounts on drop, so that a failing workload does not leak a mount.
pub struct Mount {
    pub point: PathBuf,
    mounted: bool,
}

impl Mount {
    /// Loop-mount `image` at `<image>.mnt` with `options`.
    pub fn new(image: &Path, options: &str) -> Result<Mount, String> {
        let point = image.with_extension("mnt");
        std::fs::create_dir_all(&point).unwrap();
        let options = format!("loop,{options}");
        let (code, text) = run(
            "mount",
            &["-o", &options, path_str(image), path_str(&point)],
        );
        if code != 0 {
            return Err(text);
        }
        Ok(Mount {
            point,
            mounted: true,
        })
    }

    /// Stop the filesystem dead: nothing more reaches the disk
    /// (`xfs_io -x -c shutdown`, EXT4_GOING_FLAGS_NOLOGFLUSH).
    pub fn shutdown(&self) {
        let (code, text) = run("xfs_io", &["-x", "-c", "shutdown", path_str(&self.point)]);
        assert_eq!(code, 0, "xfs_io shutdown: {text}");
    }

    pub fn unmount(mut self) {
        self.release();
    }

    fn release(&mut self) {
        if self.mounted {
            self.mounted = false;
            if std::thread::panicking() {
                let _ = run("umount", &[path_str(&self.point)]);
            } else {
                super::kernel_umount(&self.point);
            }
        }
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        self.release();
    }
}

/// Whether the kernel's journal tooling is usable here: xfs_io, root, and
/// a loop mount of a small ext4 image that works.
pub fn kernel_available() -> bool {
    if !super::require_tool("xfs_io") || !super::require_tool("mount") {
        return false;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = super::mkfs(dir.path(), "probe", 8, &["-t", "ext4"]);
    match Mount::new(&image, "rw") {
        Ok(mount) => {
            mount.unmount();
            true
        }
        Err(text) => super::skip(&format!("cannot loop-mount here: {text}")),
    }
}

/// Mount `image`, run `workload` on the mount point, give the commit
/// thread `commit_wait` to commit it, shut the filesystem down and copy the
/// image before unmounting (unmount would write checkpointed buffers home).
/// Returns the crash image, asserted to need recovery.
pub fn kernel_crash_image(
    image: &Path,
    options: &str,
    commit_wait: Duration,
    workload: impl FnOnce(&Path),
) -> PathBuf {
    let mount = Mount::new(image, options)
        .unwrap_or_else(|text| panic!("mount -o {options} {}: {text}", image.display()));
    workload(&mount.point);
    std::thread::sleep(commit_wait);
    mount.shutdown();
    let crash = image.with_extension("crash.img");
    std::fs::copy(image, &crash).unwrap();
    mount.unmount();
    assert!(
        dumpe2fs_needs_recovery(&crash),
        "{}: the kernel left no journal to replay",
        crash.display()
    );
    crash
}

/// Make the kernel commit its running transaction now and wait for it
/// (syncfs(2): `ext4_sync_fs` starts a commit and waits), instead of
/// sleeping past the `commit=` interval: on a loaded machine the kernel's
/// commit thread runs late, and a sleep then sees no commit at all.
pub fn commit_now(root: &Path) {
    use std::os::fd::AsRawFd;
    let dir = std::fs::File::open(root).unwrap();
    // SAFETY: syncfs(2) on a descriptor this function owns.
    let result = unsafe { libc::syncfs(dir.as_raw_fd()) };
    assert_eq!(
        result,
        0,
        "syncfs {}: {}",
        root.display(),
        std::io::Error::last_os_error()
    );
}

/// A metadata-heavy workload: directories, small and larger files, renames,
/// hard and symbolic links, deletions of earlier files (revokes), an xattr.
pub fn metadata_workload(root: &Path, round: usize, files: usize) {
    let dir = root.join(format!("round{round}"));
    std::fs::create_dir_all(&dir).unwrap();
    for index in 0..files {
        let mut path = dir.join(format!("file-{index:04}"));
        let size = 100 + (index * 977 + round * 131) % 9000;
        std::fs::write(&path, vec![(index + round) as u8; size]).unwrap();
        if index % 7 == 3 {
            let renamed = dir.join(format!("renamed-{index:04}"));
            std::fs::rename(&path, &renamed).unwrap();
            path = renamed;
        }
        if index % 11 == 5 {
            std::os::unix::fs::symlink(&path, dir.join(format!("link-{index:04}"))).unwrap();
        }
        if index % 13 == 6 {
            std::fs::hard_link(&path, dir.join(format!("hard-{index:04}"))).unwrap();
        }
    }
    // A directory of many entries and a file big enough for mapping
    // blocks: deleting them next round frees metadata, which is revoked.
    let sub = dir.join("sub");
    std::fs::create_dir_all(&sub).unwrap();
    for index in 0..60 {
        std::fs::write(sub.join(format!("entry-with-a-long-name-{index:03}")), b"x").unwrap();
    }
    std::fs::write(dir.join("big"), vec![round as u8 | 1; 300 * 1024]).unwrap();
    if round > 0 {
        let previous = root.join(format!("round{}", round - 1));
        std::fs::remove_dir_all(previous.join("sub")).unwrap();
        std::fs::remove_file(previous.join("big")).unwrap();
        for entry in std::fs::read_dir(&previous).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().to_string();
            if name.ends_with('0') || name.ends_with('5') {
                std::fs::remove_file(&path).unwrap();
            }
        }
    }
    let (code, text) = run(
        "setfattr",
        &["-n", "user.round", "-v", "yes", path_str(&dir)],
    );
    if code != 0 && round == 0 {
        eprintln!("note: setfattr unavailable ({text})");
    }
}

/// Copy the image's current bytes and report whether its on-disk log wraps
/// (runs past the end of the journal back to s_first).
pub fn log_wraps(image: &Path, blocks: &[u64]) -> bool {
    let bytes = std::fs::read(image).unwrap();
    let block_size = Superblock::decode(&bytes[1024..2048]).unwrap().block_size();
    let (_, area) = memory_area(bytes, block_size, blocks.to_vec());
    recover_journal(&area)
        .map(|report| report.log_wrapped)
        .unwrap_or(false)
}

/// Every file and directory under `root`: (relative path, kind, size,
/// CRC32C of the content). Symbolic links are listed by target.
pub fn tree(root: &Path) -> Vec<(String, char, u64, u32)> {
    let mut entries = Vec::new();
    let mut pending = vec![root.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let name = path
                .strip_prefix(root)
                .unwrap()
                .to_string_lossy()
                .to_string();
            let meta = std::fs::symlink_metadata(&path).unwrap();
            if name == "lost+found" {
                continue;
            }
            let (kind, content) = if meta.is_dir() {
                pending.push(path.clone());
                ('d', Vec::new())
            } else if meta.file_type().is_symlink() {
                let target = std::fs::read_link(&path).unwrap();
                ('l', target.to_string_lossy().as_bytes().to_vec())
            } else {
                ('f', std::fs::read(&path).unwrap())
            };
            let checksum = jext4::engine::format::csum::crc32c_raw(!0, &content);
            entries.push((name, kind, meta.len(), checksum));
        }
    }
    entries.sort();
    entries
}

/// The tree of an image, seen through a kernel mount with `options`
/// (mounting replays the journal if it needs it).
pub fn kernel_tree(image: &Path, options: &str) -> Vec<(String, char, u64, u32)> {
    let mount = Mount::new(image, options)
        .unwrap_or_else(|text| panic!("mount -o {options} {}: {text}", image.display()));
    let listing = tree(&mount.point);
    mount.unmount();
    listing
}
