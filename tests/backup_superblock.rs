//! Images whose primary superblock is zeroed, read from a backup with
//! `sb=N` (1 KiB units, as the kernel takes it) through each front end —
//! a FUSE mount, an image verb (`--sb`) and the library — and compared
//! with the kernel's loop mount of the same damaged image; and a
//! read-write mount from a backup, which writes the backup as the kernel's
//! does and leaves the primary for `e2fsck -b`.

// The jext4 binary, or the mounts and helpers of tests/common that use it.
#![cfg(feature = "cli")]

mod common;

use common::e2e::{self, JEXT4, JextMount, KernelMount, path_str, run, run_ok};
use jext4::Image;
use jext4::engine::fs::MountOptions;
use std::collections::BTreeMap;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// One layout to damage: mke2fs arguments, size, and where its first
/// backup is (block, block size).
struct Layout {
    name: &'static str,
    args: &'static [&'static str],
    size_mib: u64,
    backup_block: u64,
    block_size: u64,
}

impl Layout {
    /// `sb=` for the first backup: its byte offset over 1 KiB.
    fn sb(&self) -> u64 {
        self.backup_block * self.block_size / 1024
    }
}

const LAYOUTS: [Layout; 3] = [
    Layout {
        name: "ext4-1k",
        args: &["-t", "ext4", "-b", "1024"],
        size_mib: 16,
        backup_block: 8193,
        block_size: 1024,
    },
    Layout {
        name: "ext4-4k",
        args: &["-t", "ext4", "-b", "4096"],
        size_mib: 160,
        backup_block: 32768,
        block_size: 4096,
    },
    Layout {
        name: "meta_bg-1k",
        args: &["-t", "ext4", "-b", "1024", "-O", "meta_bg,^resize_inode"],
        size_mib: 64,
        backup_block: 8193,
        block_size: 1024,
    },
];

/// The files the images hold: path → content.
fn tree() -> BTreeMap<&'static str, Vec<u8>> {
    let big: Vec<u8> = (0..300_000u32).flat_map(|i| i.to_le_bytes()).collect();
    BTreeMap::from([
        ("a.txt", b"hello from the primary's backup\n".to_vec()),
        ("dir/big", big),
        ("dir/sub/empty", Vec::new()),
        ("z", vec![b'z'; 5000]),
    ])
}

/// A mke2fs image of `layout` populated with `tree()` (`mke2fs -d`, which
/// writes every backup superblock and descriptor table), primary zeroed.
fn damaged_image(dir: &Path, layout: &Layout) -> PathBuf {
    let source = dir.join(format!("{}-source", layout.name));
    for (path, content) in tree() {
        let path = source.join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, content).unwrap();
    }
    let mut args: Vec<&str> = layout.args.to_vec();
    args.extend(["-d", path_str(&source)]);
    let image = common::mkfs(dir, layout.name, layout.size_mib, &args);
    zero_primary(&image);
    image
}

fn zero_primary(image: &Path) {
    let file = std::fs::OpenOptions::new().write(true).open(image).unwrap();
    file.write_all_at(&[0u8; 1024], 1024).unwrap();
}

fn primary_is_zero(image: &Path) -> bool {
    let file = std::fs::File::open(image).unwrap();
    let mut bytes = [1u8; 1024];
    file.read_exact_at(&mut bytes, 1024).unwrap();
    bytes == [0u8; 1024]
}

/// Every name under `root`, relative, sorted (lost+found included).
fn names_under(root: &Path) -> Vec<String> {
    let mut names = Vec::new();
    let mut pending = vec![root.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            names.push(path.strip_prefix(root).unwrap().display().to_string());
            if path.is_dir() && !path.is_symlink() {
                pending.push(path);
            }
        }
    }
    names.sort();
    names
}

fn jext4(args: &[&str]) -> std::process::Output {
    run(JEXT4, args)
}

/// Read through FUSE, an image verb and the library from the backup, and
/// list the same names as the kernel's `mount -o loop,ro,sb=N`.
#[test]
fn a_zeroed_primary_is_read_from_its_backup_as_the_kernel_reads_it() {
    if !e2e::require_e2e() {
        return;
    }
    let scratch = e2e::scratch("backup-sb-read");
    for layout in &LAYOUTS {
        let image = damaged_image(scratch.path(), layout);
        let sb = layout.sb();
        let sb_option = format!("sb={sb}");
        let before = std::fs::read(&image).unwrap();

        // FUSE, read-only: the files, and not one byte written.
        let mnt = scratch.path().join(format!("{}.mnt", layout.name));
        let mount = JextMount::mount(&image, &mnt, &format!("ro,{sb_option}"));
        for (path, content) in tree() {
            let read = std::fs::read(mount.path(path)).unwrap();
            assert!(
                read == content,
                "{}: {path} read wrong through FUSE",
                layout.name
            );
        }
        let ours = names_under(&mnt);
        mount.unmount();
        assert!(
            std::fs::read(&image).unwrap() == before,
            "{}: a read-only mount from the backup wrote",
            layout.name
        );

        // The kernel, on a copy of the same damaged image.
        let copy = image.with_extension("kernel.img");
        std::fs::copy(&image, &copy).unwrap();
        let kernel_mnt = scratch.path().join(format!("{}.kmnt", layout.name));
        let kernel = KernelMount::mount_with(&copy, &kernel_mnt, &format!("ro,{sb_option}"));
        let theirs = names_under(&kernel_mnt);
        kernel.unmount();
        assert_eq!(
            ours, theirs,
            "{}: names differ from the kernel's",
            layout.name
        );

        // An image verb.
        let sb_text = sb.to_string();
        let root = format!("{}:/", path_str(&image));
        let listed = jext4(&["ls", "--sb", &sb_text, &root]);
        assert!(
            listed.status.success(),
            "{}: jext4 ls: {listed:?}",
            layout.name
        );
        let listed = String::from_utf8_lossy(&listed.stdout);
        let listed: Vec<&str> = listed.split_whitespace().collect();
        assert_eq!(
            listed,
            ["a.txt", "dir", "lost+found", "z"],
            "{}",
            layout.name
        );
        let file = format!("{}:/a.txt", path_str(&image));
        let cat = jext4(&["cat", "--sb", &sb_text, &file]);
        assert_eq!(cat.stdout, tree()["a.txt"], "{}: jext4 cat", layout.name);

        // The library.
        let options = MountOptions {
            read_only: true,
            sb,
            ..MountOptions::default()
        };
        let opened = Image::options()
            .mount_options(options)
            .open(&image)
            .unwrap();
        for (path, content) in tree() {
            let read = opened.read(format!("/{path}")).unwrap();
            assert!(
                read == content,
                "{}: {path} read wrong by the library",
                layout.name
            );
        }
        let mut names: Vec<Vec<u8>> = opened
            .read_dir("/dir")
            .unwrap()
            .map(|entry| entry.unwrap().file_name().into_encoded_bytes())
            .collect();
        names.sort();
        assert_eq!(names, [b"big".to_vec(), b"sub".to_vec()], "{}", layout.name);
        opened.close().unwrap();
        // Without sb= the library is refused, naming this option.
        let refused = Image::open(&image).err().unwrap();
        assert!(
            refused.to_string().contains(&format!("-o {sb_option}")),
            "{}: {refused}",
            layout.name
        );
    }
}

/// `sb=` values that name no superblock, and a verb's `--sb` that is not a
/// number: one line each, no mount.
#[test]
fn bad_sb_values_are_refused_in_one_line() {
    if !e2e::require_e2e() {
        return;
    }
    let scratch = e2e::scratch("backup-sb-bad");
    let layout = &LAYOUTS[1];
    let image = damaged_image(scratch.path(), layout);
    let mnt = scratch.path().join("bad.mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    for (option, wanted) in [
        ("sb=abc", "not a number"),
        ("sb=0", "boot block"),
        ("sb", "needs a value"),
        ("sb=4294967296", "at most 4294967295"),
        ("sb=5", "no superblock at sb=5"),
        ("sb=99999999", "past the end of the device"),
    ] {
        let out = jext4(&["mount", "-o", option, path_str(&image), path_str(&mnt)]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{option} mounted");
        assert_eq!(stderr.trim().lines().count(), 1, "{option}: {stderr}");
        assert!(stderr.contains(wanted), "{option}: {stderr}");
        assert!(!stderr.contains("panicked"), "{option}: {stderr}");
    }
    // A wrong sb= still says where the backup is.
    let out = jext4(&["mount", "-o", "sb=5", path_str(&image), path_str(&mnt)]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("-o sb=131072"));
    let root = format!("{}:/", path_str(&image));
    let out = jext4(&["ls", "--sb", "x", &root]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a number"));
}

/// The bytes of the superblock at `sb` (1 KiB units): mount count and
/// state.
fn backup_fields(image: &Path, sb: u64) -> (u16, u16) {
    let file = std::fs::File::open(image).unwrap();
    let mut bytes = [0u8; 1024];
    file.read_exact_at(&mut bytes, sb * 1024).unwrap();
    let field = |at: usize| u16::from_le_bytes([bytes[at], bytes[at + 1]]);
    assert_eq!(field(0x38), 0xEF53, "the backup lost its magic");
    (field(0x34), field(0x3A))
}

/// `e2fsck -fn` of `image`, its name taken out: exit code and lines.
fn fsck_report(image: &Path) -> (i32, Vec<String>) {
    let (code, text) = common::fsck(image);
    let name = image.display().to_string();
    let lines = text
        .lines()
        .filter(|line| !line.starts_with("e2fsck 1."))
        .map(|line| line.replace(&name, "IMAGE"))
        .collect();
    (code, lines)
}

/// A read-write mount from a backup does what the kernel's does: the
/// superblock written is the backup's, the primary stays zeroed, `e2fsck
/// -fn` reports the same as after the kernel's mount, and `e2fsck -b`
/// then repairs the image with the new file in it.
#[test]
fn a_read_write_mount_from_a_backup_writes_the_backup_as_the_kernel_does() {
    if !e2e::require_e2e() {
        return;
    }
    let scratch = e2e::scratch("backup-sb-rw");
    for layout in &LAYOUTS {
        let image = damaged_image(scratch.path(), layout);
        let sb = layout.sb();
        let sb_option = format!("sb={sb}");
        let (mounts_before, state_before) = backup_fields(&image, sb);
        let ours = image.with_extension("ours.img");
        let theirs = image.with_extension("theirs.img");
        std::fs::copy(&image, &ours).unwrap();
        std::fs::copy(&image, &theirs).unwrap();

        let mnt = scratch.path().join(format!("{}.rw.mnt", layout.name));
        let mount = JextMount::mount(&ours, &mnt, &sb_option);
        std::fs::write(mount.path("new.txt"), b"written from the backup\n").unwrap();
        mount.unmount();
        let kernel_mnt = scratch.path().join(format!("{}.rw.kmnt", layout.name));
        let kernel = KernelMount::mount_with(&theirs, &kernel_mnt, &sb_option);
        std::fs::write(kernel.path("new.txt"), b"written from the backup\n").unwrap();
        kernel.unmount();

        for (who, written) in [("jext4", &ours), ("the kernel", &theirs)] {
            assert!(
                primary_is_zero(written),
                "{}: {who} wrote the primary",
                layout.name
            );
            let (mounts, _) = backup_fields(written, sb);
            assert_eq!(
                mounts,
                mounts_before + 1,
                "{}: {who}'s mount count",
                layout.name
            );
        }
        // mke2fs writes its backups not clean (ext2fs_flush); both
        // unmounts write back the state they mounted with (the kernel's
        // `s_mount_state`), so e2fsck still has to look.
        for (who, written) in [("jext4", &ours), ("the kernel", &theirs)] {
            assert_eq!(
                backup_fields(written, sb).1,
                state_before,
                "{}: the state {who}'s unmount left",
                layout.name
            );
        }
        assert_eq!(state_before & 1, 0, "{}: mke2fs's backup", layout.name);
        // e2fsck reads meta_bg descriptors from the backups in the second
        // group of each meta group when given a backup superblock
        // (`ext2fs_descriptor_block_loc2`), stale ones the kernel and
        // jext4 never read or write: its report then depends on which
        // groups each one allocated in. The flat layouts compare whole.
        if !layout.name.starts_with("meta_bg") {
            assert_eq!(
                fsck_report(&ours),
                fsck_report(&theirs),
                "{}: e2fsck -fn after jext4's and the kernel's mounts",
                layout.name
            );
        }

        // The kernel reads what jext4 wrote through the backup.
        let check = image.with_extension("check.img");
        std::fs::copy(&ours, &check).unwrap();
        let kernel = KernelMount::mount_with(&check, &kernel_mnt, &format!("ro,{sb_option}"));
        let read = std::fs::read(kernel.path("new.txt")).unwrap();
        kernel.unmount();
        assert_eq!(read, b"written from the backup\n", "{}", layout.name);

        // e2fsck -b repairs the primary; the image is then clean with the
        // file in it and mounts without sb=.
        let block = layout.backup_block.to_string();
        let block_size = layout.block_size.to_string();
        let repair = run(
            "e2fsck",
            &["-fy", "-b", &block, "-B", &block_size, path_str(&ours)],
        );
        assert!(
            repair.status.code().is_some_and(|code| code <= 1),
            "{}: e2fsck -b: {repair:?}",
            layout.name
        );
        e2e::fsck_clean(&ours, "after e2fsck -b");
        let cat = run_ok("debugfs", &["-R", "cat /new.txt", path_str(&ours)]);
        assert_eq!(cat.stdout, b"written from the backup\n", "{}", layout.name);
    }
}

/// `jext4 stats`, `logdump` and `recover` of a crashed image whose
/// primary is zeroed: refused without `--sb` (naming it), and with it they
/// read the backup, replay the journal there and leave the primary alone,
/// so that the kernel then reads the file from the backup.
fn the_journal_verbs_read_the_backup(crashed: &Path, sb: u64, verbs: &Path) {
    std::fs::copy(crashed, verbs).unwrap();
    let image = path_str(verbs);
    let sb_arg = sb.to_string();
    for verb in ["stats", "logdump", "recover"] {
        let refused = jext4(&[verb, image]);
        let said = String::from_utf8_lossy(&refused.stderr);
        assert!(
            !refused.status.success() && said.contains("sb=") && said.lines().count() == 1,
            "jext4 {verb} of a zeroed primary: {refused:?}"
        );
    }
    let stats = |expected: &str| {
        let out = jext4(&["stats", "--sb", &sb_arg, image]);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "jext4 stats --sb: {out:?}");
        assert!(
            text.lines().any(|line| line == expected),
            "{expected}:\n{text}"
        );
    };
    stats("needs_recovery true");
    let dump = jext4(&["logdump", "--sb", &sb_arg, image]);
    let text = String::from_utf8_lossy(&dump.stdout);
    assert!(
        dump.status.success() && text.contains(": descriptor, transaction"),
        "jext4 logdump --sb lists no transaction: {dump:?}"
    );
    let recovered = jext4(&["recover", "--sb", &sb_arg, image]);
    let text = String::from_utf8_lossy(&recovered.stdout);
    assert!(
        recovered.status.success() && text.contains("replayed"),
        "jext4 recover --sb: {recovered:?}"
    );
    stats("needs_recovery false");
    assert!(
        primary_is_zero(verbs),
        "jext4 recover --sb wrote the primary"
    );
    let mnt = verbs.with_extension("mnt");
    let kernel = KernelMount::mount_with(verbs, &mnt, &format!("ro,noload,sb={sb}"));
    let read = std::fs::read(kernel.path("fsynced")).unwrap();
    kernel.unmount();
    assert_eq!(
        read, b"durable before the crash\n",
        "after jext4 recover --sb"
    );
}

/// A crash of a mount from a backup leaves needs_recovery in that backup,
/// and the next mount with the same `sb=` replays the journal there (and
/// clears it there), as the kernel's would from the same image.
#[test]
fn a_crash_while_mounted_from_a_backup_is_recovered_from_it() {
    if !e2e::require_e2e() {
        return;
    }
    let scratch = e2e::scratch("backup-sb-crash");
    let layout = &LAYOUTS[1];
    let image = damaged_image(scratch.path(), layout);
    let sb = layout.sb();
    let sb_option = format!("sb={sb}");
    let mnt = scratch.path().join("crash.mnt");
    let mount = JextMount::mount(&image, &mnt, &sb_option);
    let path = mount.path("fsynced");
    std::fs::write(&path, b"durable before the crash\n").unwrap();
    std::fs::File::open(&path).unwrap().sync_all().unwrap();
    let pid = mount.server_pid();
    // SAFETY: kill(2) on the pid of the server this test started.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
    run("fusermount3", &["-u", "-z", path_str(&mnt)]);
    mount.forget();
    let needs_recovery = |image: &Path| {
        let file = std::fs::File::open(image).unwrap();
        let mut incompat = [0u8; 4];
        file.read_exact_at(&mut incompat, sb * 1024 + 0x60).unwrap();
        u32::from_le_bytes(incompat) & 0x4 != 0
    };
    e2e::wait_for(std::time::Duration::from_secs(10), || {
        !std::path::Path::new(&format!("/proc/{pid}")).exists()
    });
    assert!(
        needs_recovery(&image),
        "the crashed mount's backup lacks needs_recovery"
    );
    assert!(primary_is_zero(&image));
    let copy = image.with_extension("kernel.img");
    std::fs::copy(&image, &copy).unwrap();
    the_journal_verbs_read_the_backup(&image, sb, &scratch.path().join("verbs.img"));

    let mount = JextMount::mount(&image, &mnt, &sb_option);
    let read = std::fs::read(mount.path("fsynced")).unwrap();
    mount.unmount();
    assert_eq!(read, b"durable before the crash\n");
    assert!(!needs_recovery(&image), "needs_recovery left in the backup");
    assert!(primary_is_zero(&image));

    let kernel_mnt = scratch.path().join("crash.kmnt");
    let kernel = KernelMount::mount_with(&copy, &kernel_mnt, &sb_option);
    let theirs = std::fs::read(kernel.path("fsynced")).unwrap();
    kernel.unmount();
    assert_eq!(theirs, b"durable before the crash\n", "the kernel's replay");
}
