//! Images a mount must refuse, and how: one line that says what is wrong
//! and what repairs it, with the kernel's decision (checked against a loop
//! mount where one is possible) — a journal that recovery cannot finish,
//! a damaged journal superblock, an external journal device, a zeroed
//! primary superblock, and a user who may not open `/dev/fuse`.

// The jext4 binary, or the mounts and helpers of tests/common that use it.
#![cfg(feature = "cli")]

mod common;

use common::e2e::{self, JEXT4};
use common::journal::{
    Mount, data_file, debugfs_commands, dumpe2fs_needs_recovery, flip_byte, free_blocks,
    journal_block_offset, kernel_lock, log_blocks, run,
};
use jext4::engine::journal::format::block_type;
use std::path::{Path, PathBuf};
use std::process::Command;

/// `jext4 ARGS`: exit code and stderr.
fn jext4(args: &[&str]) -> (i32, String) {
    let output = Command::new(JEXT4).args(args).output().unwrap();
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

fn path_str(path: &Path) -> &str {
    path.to_str().unwrap()
}

/// `jext4 mount IMAGE DIR` must refuse with a message containing every
/// one of `wanted`, on one line; unmounts if it mounted after all.
fn assert_mount_refused(image: &Path, options: &str, wanted: &[&str]) -> String {
    let mnt = image.with_extension("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    let (code, stderr) = jext4(&["mount", "-o", options, path_str(image), path_str(&mnt)]);
    if code == 0 {
        jext4(&["umount", path_str(&mnt)]);
        panic!("jext4 mount -o {options} {} mounted", image.display());
    }
    assert_eq!(stderr.trim().lines().count(), 1, "one line: {stderr}");
    for text in wanted {
        assert!(stderr.contains(text), "{text:?} missing from: {stderr}");
    }
    assert!(!stderr.contains("I/O error"), "{stderr}");
    stderr
}

/// The kernel's decision for a loop mount of a copy of `image`
/// (`require_e2e` has checked that loop mounts work).
fn kernel_mounts(image: &Path, options: &str) -> bool {
    let copy = image.with_extension("kernel.img");
    std::fs::copy(image, &copy).unwrap();
    let _lock = kernel_lock();
    Mount::new(&copy, options).map(Mount::unmount).is_ok()
}

/// A 1 KiB-block ext4 image whose journal holds one committed transaction
/// of five blocks with checksum v3, needing recovery.
fn journal_to_replay(dir: &Path, name: &str) -> PathBuf {
    let image = common::mkfs(dir, name, 16, &["-t", "ext4", "-b", "1024"]);
    let blocks = free_blocks(&image, 5, 3000);
    let data = image.with_extension("data");
    data_file(&data, 1024, 5, 7, &[]);
    let list: Vec<String> = blocks.iter().map(u64::to_string).collect();
    debugfs_commands(
        &image,
        &format!("jo -c\njw -b {} {}\njc\n", list.join(","), data.display()),
    );
    assert!(dumpe2fs_needs_recovery(&image));
    image
}

/// A transaction the kernel would not finish replaying refuses every
/// mount, as the kernel's does ("error loading journal"), and stays for
/// e2fsck: the first jext4 mount used to replay, reset the journal, clear
/// needs_recovery and then fail, and the second one mounted a filesystem
/// whose check e2fsck had been denied.
#[test]
fn a_journal_recovery_cannot_finish_refuses_every_mount_until_e2fsck() {
    if !e2e::require_e2e() {
        return;
    }
    let scratch = e2e::scratch("refuse-replay");
    let image = journal_to_replay(scratch.path(), "base");
    let log = log_blocks(&image);
    let descriptor = log
        .iter()
        .find(|block| block.block_type == block_type::DESCRIPTOR)
        .unwrap();
    let cases = [
        // A logged copy whose tag checksum fails.
        (
            "data",
            journal_block_offset(&image, descriptor.first_data.unwrap() + 1) + 500,
            "journal recovery failed: logged copy of block",
        ),
    ];
    for (label, offset, problem) in cases {
        let damaged = scratch.path().join(format!("{label}.img"));
        std::fs::copy(&image, &damaged).unwrap();
        flip_byte(&damaged, offset, 0x10);
        assert!(
            !kernel_mounts(&damaged, "rw"),
            "{label}: the kernel mounted"
        );
        for attempt in 1..=2 {
            let message = assert_mount_refused(&damaged, "rw", &[problem, "e2fsck -fy", "kept"]);
            assert!(
                dumpe2fs_needs_recovery(&damaged),
                "{label}, mount {attempt}: needs_recovery cleared: {message}"
            );
        }
        let (code, text) = run("e2fsck", &["-fy", path_str(&damaged)]);
        assert!(code <= 1, "{label}: e2fsck -fy exited {code}: {text}");
        let mnt = damaged.with_extension("mnt");
        let (code, stderr) = jext4(&["mount", path_str(&damaged), path_str(&mnt)]);
        assert_eq!(code, 0, "{label}: after e2fsck -fy: {stderr}");
        let (code, stderr) = jext4(&["umount", path_str(&mnt)]);
        assert_eq!(code, 0, "{label}: umount: {stderr}");
        common::assert_fsck_clean(&damaged);
    }
}

/// A commit block that fails its checksum ends the log: a power cut while
/// it was written leaves such a torn block, and after a power cut the
/// image mounts (the kernel refuses it and leaves it to e2fsck, whose
/// replay stops there too). The transaction is not replayed and the
/// filesystem is marked with errors, so e2fsck checks it.
#[test]
fn a_commit_block_failing_its_checksum_ends_the_log() {
    if !e2e::require_e2e() {
        return;
    }
    let scratch = e2e::scratch("torn-commit");
    let image = journal_to_replay(scratch.path(), "base");
    let commit = log_blocks(&image)
        .into_iter()
        .find(|block| block.block_type == block_type::COMMIT)
        .unwrap();
    flip_byte(
        &image,
        journal_block_offset(&image, commit.index) + 60,
        0x10,
    );
    let mnt = image.with_extension("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    let (code, stderr) = jext4(&["mount", path_str(&image), path_str(&mnt)]);
    assert_eq!(code, 0, "a torn commit: {stderr}");
    let (code, stderr) = jext4(&["umount", path_str(&mnt)]);
    assert_eq!(code, 0, "umount: {stderr}");
    assert!(!dumpe2fs_needs_recovery(&image));
    let (_, header) = run("dumpe2fs", &["-h", path_str(&image)]);
    assert!(header.contains("with errors"), "{header}");
    common::assert_fsck_clean(&image);
}

/// A journal superblock that does not load refuses read-write and
/// read-only mounts alike, as the kernel's ("no valid journal superblock
/// found", "journal checksum error"); the message names e2fsck -fy, which
/// makes a new journal, and `-o ro,noload`, which mounts.
#[test]
fn a_damaged_journal_superblock_names_e2fsck() {
    if !e2e::require_e2e() {
        return;
    }
    let scratch = e2e::scratch("refuse-jsb");
    let clean = common::mkfs(scratch.path(), "clean", 16, &["-t", "ext4", "-b", "1024"]);
    let replay = journal_to_replay(scratch.path(), "replay");
    let magic = scratch.path().join("magic.img");
    std::fs::copy(&clean, &magic).unwrap();
    flip_byte(&magic, journal_block_offset(&clean, 0) + 1, 0xFF);
    // The UUID is covered by the checksum (v3, set by debugfs's writer).
    let checksum = scratch.path().join("checksum.img");
    std::fs::copy(&replay, &checksum).unwrap();
    flip_byte(&checksum, journal_block_offset(&replay, 0) + 0x30, 0x55);
    for (image, problem) in [
        (&magic, "no journal superblock (bad magic)"),
        (&checksum, "journal superblock checksum mismatch"),
    ] {
        for options in ["rw", "ro"] {
            assert!(
                !kernel_mounts(image, options),
                "the kernel mounted {options}"
            );
            assert_mount_refused(image, options, &[problem, "e2fsck -fy", "ro,noload"]);
        }
        let mnt = image.with_extension("mnt");
        let (code, stderr) = jext4(&["mount", "-o", "ro,noload", path_str(image), path_str(&mnt)]);
        assert_eq!(code, 0, "-o ro,noload: {stderr}");
        jext4(&["umount", path_str(&mnt)]);
        let (code, text) = run("e2fsck", &["-fy", path_str(image)]);
        assert!(code <= 1, "e2fsck -fy exited {code}: {text}");
        let (code, stderr) = jext4(&["mount", path_str(image), path_str(&mnt)]);
        assert_eq!(code, 0, "after e2fsck -fy: {stderr}");
        jext4(&["umount", path_str(&mnt)]);
    }
}

/// `mke2fs -O journal_dev` makes an ext4 superblock with every filesystem
/// field zero: it is named for what it is, once, by every command.
#[test]
fn an_external_journal_device_is_called_one() {
    if !e2e::require_e2e() {
        return;
    }
    let scratch = e2e::scratch("refuse-journal-dev");
    let image = common::mkfs(
        scratch.path(),
        "journal",
        8,
        &["-O", "journal_dev", "-b", "4096"],
    );
    let wanted = "an ext4 external journal device (journal_dev), not a filesystem";
    let stderr = assert_mount_refused(&image, "rw", &[wanted]);
    assert!(!stderr.contains("inodes per group"), "{stderr}");
    for command in ["stats", "recover", "logdump"] {
        let (code, stderr) = jext4(&[command, path_str(&image)]);
        assert_ne!(code, 0, "jext4 {command}");
        assert!(stderr.contains(wanted), "jext4 {command}: {stderr}");
        assert_eq!(
            stderr.matches(path_str(&image)).count(),
            1,
            "jext4 {command} names the image once: {stderr}"
        );
    }
}

/// A zeroed primary superblock: the refusal says where the backup is, and
/// the e2fsck command and the `-o sb=` it names work, for the kernel and
/// for jext4.
#[test]
fn a_zeroed_primary_superblock_names_its_backup() {
    if !e2e::require_e2e() {
        return;
    }
    let scratch = e2e::scratch("refuse-primary");
    for (block_size, size_mib, backup) in [(1024u64, 16, 8193u64), (4096, 160, 32768)] {
        let name = format!("primary-{block_size}");
        let block_size_arg = block_size.to_string();
        let image = common::mkfs(
            scratch.path(),
            &name,
            size_mib,
            &["-t", "ext4", "-b", &block_size_arg],
        );
        {
            use std::os::unix::fs::FileExt;
            let file = std::fs::OpenOptions::new()
                .write(true)
                .open(&image)
                .unwrap();
            file.write_all_at(&[0u8; 1024], 1024).unwrap();
        }
        let sb_option = format!("sb={}", backup * block_size / 1024);
        let e2fsck = format!("e2fsck -b {backup} -B {block_size} IMAGE");
        let message =
            format!("a backup superblock is at block {backup} ({block_size}-byte blocks)");
        assert_mount_refused(
            &image,
            "rw",
            &[&message, &e2fsck, &format!("-o {sb_option}")],
        );
        assert!(
            !kernel_mounts(&image, "ro"),
            "the kernel mounted without sb="
        );
        assert!(
            kernel_mounts(&image, &format!("ro,{sb_option}")),
            "the kernel refused -o {sb_option}"
        );
        // And so does jext4 with the option it names.
        let mnt = image.with_extension("mnt");
        let ro_sb = format!("ro,{sb_option}");
        let (code, stderr) = jext4(&["mount", "-o", &ro_sb, path_str(&image), path_str(&mnt)]);
        assert_eq!(code, 0, "jext4 -o {ro_sb}: {stderr}");
        jext4(&["umount", path_str(&mnt)]);
        let (code, text) = run(
            "e2fsck",
            &[
                "-fy",
                "-b",
                &backup.to_string(),
                "-B",
                &block_size_arg,
                path_str(&image),
            ],
        );
        assert!(code <= 1, "e2fsck -b exited {code}: {text}");
        let (code, stderr) = jext4(&["mount", path_str(&image), path_str(&mnt)]);
        assert_eq!(code, 0, "after e2fsck -b: {stderr}");
        jext4(&["umount", path_str(&mnt)]);
    }
}

/// Where `/dev/fuse` is closed to the user (mode 0600 here, in a private
/// mount namespace so the machine's device is left alone), FUSE is closed
/// to it: fusermount3 opens the device with the user's own rights too, so
/// libfuse refuses the same way. The message says so and names the device,
/// instead of "I/O error: cannot mount on DIR: Permission denied".
#[test]
fn a_user_without_dev_fuse_is_told_why() {
    if !e2e::require_e2e() {
        return;
    }
    for tool in ["unshare", "setpriv", "mknod"] {
        assert!(
            common::require_tool(tool),
            "{tool} is needed (util-linux, coreutils)"
        );
    }
    let scratch = e2e::scratch("refuse-dev-fuse");
    let image = common::mkfs(scratch.path(), "user", 16, &["-t", "ext4"]);
    let mnt = scratch.path().join("mnt");
    let run_dir = scratch.path().join("run");
    std::fs::create_dir(&mnt).unwrap();
    std::fs::create_dir(&run_dir).unwrap();
    let node = scratch.path().join("fuse");
    for path in [&image, &mnt, &run_dir] {
        std::os::unix::fs::chown(path, Some(65534), Some(65534)).unwrap();
    }
    let script = format!(
        r#"set -e
mount --make-rprivate /
mknod -m 0600 '{node}' c 10 229
mount --bind '{node}' /dev/fuse
set +e
setpriv --reuid=65534 --regid=65534 --clear-groups env XDG_RUNTIME_DIR='{run}' \
    '{jext4}' mount '{image}' '{mnt}'
echo "exit $?"
# fusermount3 itself: the same refusal, in its own words.
setpriv --reuid=65534 --regid=65534 --clear-groups env _FUSE_COMMFD=0 fusermount3 -- '{mnt}'
"#,
        node = node.display(),
        run = run_dir.display(),
        jext4 = JEXT4,
        image = image.display(),
        mnt = mnt.display(),
    );
    let output = Command::new("unshare")
        .args(["-m", "sh", "-c", &script])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stdout.contains("exit 1"),
        "stdout: {stdout}\nstderr: {stderr}"
    );
    let ours = stderr
        .lines()
        .find(|line| line.starts_with("jext4:"))
        .unwrap_or_else(|| panic!("no jext4 message: {stderr}"));
    assert!(
        ours.contains("this user may not open /dev/fuse (mode 0600"),
        "{ours}"
    );
    assert!(ours.contains("fusermount3"), "{ours}");
    assert!(
        !ours.contains("I/O error") && !ours.contains("cannot mount on"),
        "{ours}"
    );
    assert!(
        stderr.contains("fusermount3: failed to open /dev/fuse: Permission denied"),
        "fusermount3 should refuse as well: {stderr}"
    );
    let machine = std::fs::metadata("/dev/fuse").unwrap();
    assert!(std::os::unix::fs::FileTypeExt::is_char_device(
        &machine.file_type()
    ));
}
