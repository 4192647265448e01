//! External journals (`mke2fs -O journal_dev`, then `mke2fs -J device=`):
//! the journal on a device of its own, named by the filesystem's
//! superblock by UUID and device number. The kernel writes through it and
//! jext4 reads the same tree, then writes through the same journal (its
//! sequence moves on the journal device), `e2fsck -fn -j` is clean and the
//! kernel reads back what jext4 wrote; at 1 KiB blocks the JBD2 superblock
//! sits in block 2 instead of 1. A journal jext4 cannot find, another
//! filesystem's journal, a device that is no journal, and a journal path
//! given to a filesystem with an internal journal are each one clear line.
//! The crash states of external journals are `crash_workloads.rs`'s
//! `external_journal_*` runs.

// The jext4 binary, or the mounts and helpers of tests/common that use it.
#![cfg(feature = "cli")]

mod common;

use common::e2e::{self, JextMount, KernelMount, Params};
use std::path::{Path, PathBuf};
use std::process::Command;

const JOURNAL_MIB: u64 = 16;
const TREE_ENTRIES: usize = 600;
const TREE_BYTES: u64 = 12 << 20;

/// A loop device over a file, detached on drop.
struct Loop {
    device: PathBuf,
    file: PathBuf,
}

impl Loop {
    fn new(file: &Path) -> Loop {
        let output = e2e::run_ok("losetup", &["--find", "--show", e2e::path_str(file)]);
        Loop {
            device: PathBuf::from(String::from_utf8_lossy(&output.stdout).trim()),
            file: file.to_path_buf(),
        }
    }

    fn path(&self) -> &str {
        e2e::path_str(&self.device)
    }
}

impl Drop for Loop {
    /// Detached for certain: a device still open (udev probes a new
    /// filesystem) is only marked to detach at its last close, and until
    /// then jext4 would rightly find the journal on it.
    fn drop(&mut self) {
        let _ = Command::new("losetup").args(["-d", self.path()]).status();
        for _ in 0..100 {
            let bound = Command::new("losetup")
                .args(["-j", e2e::path_str(&self.file)])
                .output()
                .map(|output| !output.stdout.is_empty())
                .unwrap_or(false);
            if !bound {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }
}

/// A journal device image of `JOURNAL_MIB` at `path`.
fn journal_device(path: &Path, block_size: u32) {
    std::fs::File::create(path)
        .unwrap()
        .set_len(JOURNAL_MIB << 20)
        .unwrap();
    let block_size = block_size.to_string();
    e2e::run_ok(
        "mke2fs",
        &[
            "-q",
            "-F",
            "-O",
            "journal_dev",
            "-b",
            &block_size,
            e2e::path_str(path),
        ],
    );
}

/// A filesystem image whose journal is the loop device over `journal`.
fn filesystem_on(dir: &Path, name: &str, block_size: u32, journal: &Loop) -> PathBuf {
    let block_size = block_size.to_string();
    let device = format!("device={}", journal.path());
    common::mkfs(
        dir,
        name,
        128,
        &["-t", "ext4", "-b", &block_size, "-J", &device],
    )
}

/// `e2fsck -fn -j JOURNAL IMAGE` must find nothing.
fn fsck_clean(image: &Path, journal: &Loop, when: &str) {
    let output = Command::new("e2fsck")
        .args(["-fn", "-j", journal.path(), e2e::path_str(image)])
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "e2fsck -fn -j {when}: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// The journal device's `s_sequence`, as dumpe2fs prints it.
fn journal_sequence(journal: &Loop) -> u64 {
    let output = e2e::run_ok("dumpe2fs", &["-h", journal.path()]);
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    let value = text
        .lines()
        .find_map(|line| line.strip_prefix("Journal sequence:"))
        .unwrap_or_else(|| panic!("no journal sequence in:\n{text}"));
    u64::from_str_radix(value.trim().trim_start_matches("0x"), 16).unwrap()
}

fn both_ways(block_size: u32) {
    if !e2e::require_e2e() {
        return;
    }
    let name = format!("external-journal-{block_size}");
    let scratch = e2e::scratch(&name);
    let journal_file = scratch.path().join("journal.img");
    journal_device(&journal_file, block_size);
    let journal = Loop::new(&journal_file);
    let image = filesystem_on(scratch.path(), &name, block_size, &journal);
    let mnt = scratch.path().join("mnt");
    let journal_option = format!("journal_path={}", journal.path());

    let kernel = KernelMount::mount_with(&image, &mnt, &journal_option);
    e2e::copy_real_tree(&mnt.join("tree"), TREE_ENTRIES, TREE_BYTES);
    e2e::syncfs(&mnt);
    let by_kernel = e2e::snapshot(&mnt);
    kernel.unmount();
    fsck_clean(&image, &journal, "after the kernel wrote");

    // Found by the device number the superblock records: no option.
    let before = journal_sequence(&journal);
    let mount = JextMount::mount(&image, &mnt, "");
    e2e::assert_same(&by_kernel, &e2e::snapshot(&mnt), ("kernel", "jext4"));
    let params = Params {
        block_size: e2e::statvfs(&mnt).0,
        extents: true,
        big_dir_entries: 300,
    };
    let outcome = e2e::workload(&mnt, &params);
    drop(outcome.held);
    e2e::syncfs(&mnt);
    let by_jext4 = e2e::snapshot(&mnt);
    e2e::verify(&mnt, &outcome.expect);
    mount.unmount();
    let after = journal_sequence(&journal);
    assert!(
        after > before + 1,
        "jext4's commits did not go to the journal device (sequence {before} → {after})"
    );
    fsck_clean(&image, &journal, "after jext4 wrote");

    let kernel = KernelMount::mount_with(&image, &mnt, &format!("ro,{journal_option}"));
    e2e::assert_same(&by_jext4, &e2e::snapshot(&mnt), ("jext4", "kernel"));
    e2e::verify(&mnt, &outcome.expect);
    kernel.unmount();
    eprintln!(
        "{name}: {} names; journal sequence {before} → {after} through jext4",
        by_jext4.len()
    );
}

#[test]
fn the_kernel_and_jext4_write_through_one_external_journal_4k() {
    both_ways(4096);
}

/// 1 KiB blocks: the JBD2 superblock in block 2, after the ext4 one.
#[test]
fn the_kernel_and_jext4_write_through_one_external_journal_1k() {
    both_ways(1024);
}

/// `jext4 ARGS`: (success, stderr).
fn jext4(args: &[&str]) -> (bool, String) {
    let output = Command::new(common::server::JEXT4)
        .args(args)
        .output()
        .unwrap();
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// A refusal: the verb fails with one line that says `wanted`.
fn assert_refused(args: &[&str], wanted: &str) {
    let (ok, stderr) = jext4(args);
    assert!(!ok, "jext4 {args:?} succeeded");
    assert!(
        stderr.contains(wanted) && stderr.trim_end().lines().count() == 1,
        "jext4 {args:?}: wanted one line saying {wanted:?}, got:\n{stderr}"
    );
}

/// The image tools (`--journal`, a file will do) write through an external
/// journal too; what they cannot use is refused by name.
#[test]
fn the_image_tools_take_a_journal_file_and_refuse_the_wrong_ones() {
    if !e2e::require_e2e() {
        return;
    }
    let scratch = e2e::scratch("external-journal-tools");
    let dir = scratch.path();
    let journal_file = dir.join("journal.img");
    journal_device(&journal_file, 4096);
    let image = {
        let journal = Loop::new(&journal_file);
        filesystem_on(dir, "external-journal-tools", 4096, &journal)
    };
    // The loop device is gone: the superblock's device number finds
    // nothing, and no block device carries the UUID.
    let target = format!("{}:/", image.display());
    assert_refused(&["ls", &target], "journal_path=PATH");
    // Another filesystem's journal device.
    let other = dir.join("other.img");
    journal_device(&other, 4096);
    let other_arg = other.to_str().unwrap();
    assert_refused(
        &["ls", "--journal", other_arg, &target],
        "is the journal of another filesystem",
    );
    // A file that is no journal device.
    let plain = dir.join("plain.img");
    std::fs::write(&plain, vec![0u8; 1 << 20]).unwrap();
    assert_refused(
        &["ls", "--journal", plain.to_str().unwrap(), &target],
        "is not an external journal device",
    );
    // A journal path for a filesystem whose journal is internal.
    let internal = common::mkfs(dir, "internal", 32, &["-t", "ext4"]);
    assert_refused(
        &[
            "ls",
            "--journal",
            journal_file.to_str().unwrap(),
            &format!("{}:/", internal.display()),
        ],
        "not an external journal",
    );

    // The right file: a copy in, read back, the journal used, e2fsck clean.
    let journal_arg = journal_file.to_str().unwrap();
    let source = dir.join("source");
    e2e::copy_real_tree(&source, 800, 8 << 20);
    let (ok, stderr) = jext4(&[
        "cp",
        "-a",
        "--journal",
        journal_arg,
        source.to_str().unwrap(),
        &format!("{}:/copy", image.display()),
    ]);
    assert!(ok, "jext4 cp: {stderr}");
    let journal = Loop::new(&journal_file);
    fsck_clean(&image, &journal, "after jext4 cp");
    assert!(journal_sequence(&journal) > 1, "the journal was not used");
    let mnt = dir.join("mnt");
    let kernel =
        KernelMount::mount_with(&image, &mnt, &format!("ro,journal_path={}", journal.path()));
    // Names, kinds, contents and link targets (`cp -a`'s other keeps are
    // the image tools' own suites').
    e2e::run_ok(
        "diff",
        &[
            "-r",
            "--no-dereference",
            e2e::path_str(&source),
            e2e::path_str(&mnt.join("copy")),
        ],
    );
    kernel.unmount();
}

/// The journal device under another number than the superblock records
/// (one that names no device): given by `journal_path=`, jext4 records
/// its number, as the kernel does, and the kernel then finds it without
/// the option.
#[test]
fn a_journal_device_that_moved_is_recorded_where_it_now_is() {
    if !e2e::require_e2e() {
        return;
    }
    let scratch = e2e::scratch("external-journal-moved");
    let dir = scratch.path();
    let journal_file = dir.join("journal.img");
    journal_device(&journal_file, 4096);
    let image = {
        let journal = Loop::new(&journal_file);
        filesystem_on(dir, "external-journal-moved", 4096, &journal)
    };
    let recorded = |image: &Path| -> String {
        let output = e2e::run_ok("dumpe2fs", &["-h", e2e::path_str(image)]);
        let text = String::from_utf8_lossy(&output.stdout).into_owned();
        text.lines()
            .find_map(|line| line.strip_prefix("Journal device:"))
            .unwrap_or_else(|| panic!("no journal device in:\n{text}"))
            .trim()
            .to_string()
    };
    // The number the superblock records names no device now (255:240),
    // as after the journal's device was renumbered.
    e2e::run_ok(
        "debugfs",
        &["-w", "-R", "ssv journal_dev 0xfff0", e2e::path_str(&image)],
    );
    assert_eq!(recorded(&image), "0xfff0");
    let journal = Loop::new(&journal_file);
    let now = {
        use std::os::unix::fs::MetadataExt;
        let rdev = std::fs::metadata(journal.path()).unwrap().rdev();
        format!("0x{:04x}", libc::major(rdev) << 8 | libc::minor(rdev))
    };
    let mnt = dir.join("mnt");
    let mount = JextMount::mount(&image, &mnt, &format!("journal_path={}", journal.path()));
    std::fs::write(mnt.join("file"), b"through the moved journal\n").unwrap();
    mount.unmount();
    assert_eq!(recorded(&image), now, "the journal's new device number");
    fsck_clean(
        &image,
        &journal,
        "after jext4 recorded the journal's number",
    );
    let kernel = KernelMount::mount(&image, &mnt, true);
    assert_eq!(
        std::fs::read(mnt.join("file")).unwrap(),
        b"through the moved journal\n"
    );
    kernel.unmount();
}
