//! inline_data: images whose small files, directories and
//! symlinks live in their inodes (`i_block` and the `system.data` xattr),
//! read and written by jext4 exactly as a kernel loop mount reads and
//! writes them.
//!
//! - The kernel writes a tree (files of every size around the inline
//!   limits, directories that stay in `i_block`, spill into system.data or
//!   outgrow the inode, symlinks) → jext4, mounted through FUSE, shows the
//!   same tree: names, kinds, sizes, `st_blocks`, link counts, contents,
//!   symlink targets, and the same SEEK_DATA / SEEK_HOLE answers.
//! - `mke2fs -d` builds an image from a host tree (e2fsprogs also makes
//!   inline symlinks) → jext4 shows the host tree.
//! - Readdir cookies of inline directories resume where they were, with and
//!   without dir_index, also across the move of a directory to a block.
//! - jext4 writes the same tree as the kernel: the same files and
//!   directories inline, with the same inline sizes, the same ones moved
//!   to blocks; and the same changes to a tree the kernel wrote (names
//!   added until a directory moves to a block, names removed, a directory
//!   moved to another parent, inline files cut, grown, appended past the
//!   inode and fallocated). `e2fsck -fn` is clean after each.

// The jext4 binary, or the mounts and helpers of tests/common that use it.
#![cfg(feature = "cli")]

mod common;

use common::journal::{Mount, kernel_available, kernel_lock};
use common::server::{Server, fuse_available};
use jext4::Image;
use std::os::unix::fs::MetadataExt;
use std::os::unix::io::AsRawFd;
use std::path::Path;

/// mke2fs arguments of each variant: 4 KiB blocks with 256-byte inodes
/// (mke2fs's default), 1 KiB blocks with 512-byte inodes (a larger
/// system.data), and no dir_index (positional readdir cookies).
const VARIANTS: &[(&str, &[&str])] = &[
    ("4k-256", &["-t", "ext4", "-O", "inline_data", "-b", "4096"]),
    (
        "1k-512",
        &["-t", "ext4", "-O", "inline_data", "-b", "1024", "-I", "512"],
    ),
    (
        "4k-nodirindex",
        &["-t", "ext4", "-O", "inline_data,^dir_index", "-b", "4096"],
    ),
];

/// Sizes around the limits: i_block's 60 bytes, the system.data room of a
/// 256-byte inode (60 + 68 at most) and of a 512-byte one, a block.
const FILE_SIZES: &[usize] = &[0, 1, 6, 59, 60, 61, 100, 127, 128, 129, 200, 320, 4101];

fn pattern(seed: usize, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (seed * 31 + i * 7 + i / 251) as u8)
        .collect()
}

/// The tree every variant gets, built with ordinary file calls.
fn populate(root: &Path) {
    for (index, &size) in FILE_SIZES.iter().enumerate() {
        std::fs::write(root.join(format!("file{size}")), pattern(index, size)).unwrap();
    }
    std::fs::create_dir(root.join("empty")).unwrap();
    // Three names fit i_block; more spill into system.data; many outgrow
    // the inode and make the kernel convert the directory to a block.
    for (dir, count, name_len) in [("few", 3, 3), ("spill", 5, 10), ("many", 40, 12)] {
        std::fs::create_dir(root.join(dir)).unwrap();
        for i in 0..count {
            let name = format!("{i:0>width$}", width = name_len);
            std::fs::write(root.join(dir).join(&name), pattern(i, i % 90)).unwrap();
        }
    }
    std::fs::create_dir_all(root.join("few/sub/deeper")).unwrap();
    std::fs::write(root.join("few/sub/deeper/leaf"), b"leaf\n").unwrap();
    std::os::unix::fs::symlink("short", root.join("link-short")).unwrap();
    let long = "/a/target/longer/than/sixty/bytes/so/that/it/is/no/fast/symlink/at/all";
    std::os::unix::fs::symlink(long, root.join("link-long")).unwrap();
    std::fs::hard_link(root.join("file6"), root.join("few/hardlink")).unwrap();
}

/// (path, kind, size, st_blocks, nlink, CRC32C of the content or target).
type Listing = Vec<(String, char, u64, u64, u64, u32)>;

/// (path, the attribute names listxattr gives, NUL-separated).
type XattrNames = Vec<(String, Vec<u8>)>;

/// (path, offset, whence, the offset answered or -errno).
type Seeks = Vec<(String, u64, i32, i64)>;

fn tree(root: &Path) -> Listing {
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
            if name == "lost+found" {
                continue;
            }
            let meta = std::fs::symlink_metadata(&path).unwrap();
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
            let nlink = if meta.is_dir() { 0 } else { meta.nlink() };
            entries.push((name, kind, meta.len(), meta.blocks(), nlink, checksum));
        }
    }
    entries.sort();
    entries
}

fn xattr_names(root: &Path, listing: &Listing) -> XattrNames {
    let mut names = Vec::new();
    for (name, ..) in listing {
        let path =
            std::ffi::CString::new(root.join(name).into_os_string().into_encoded_bytes()).unwrap();
        let mut buffer = vec![0u8; 4096];
        // SAFETY: the buffer outlives the call and its length is passed.
        let len =
            unsafe { libc::llistxattr(path.as_ptr(), buffer.as_mut_ptr().cast(), buffer.len()) };
        assert!(
            len >= 0,
            "llistxattr {name}: {}",
            std::io::Error::last_os_error()
        );
        buffer.truncate(len as usize);
        names.push((name.clone(), buffer));
    }
    names
}

/// Attributes beside inline data in the inode body: the kernel keeps them
/// with system.data, which listxattr never shows.
fn set_xattrs(root: &Path) {
    for (file, value) in [
        ("file6", &b"v"[..]),
        ("file100", b"a longer value"),
        ("few", b"d"),
    ] {
        let path =
            std::ffi::CString::new(root.join(file).into_os_string().into_encoded_bytes()).unwrap();
        // SAFETY: NUL-terminated strings and a value with its length.
        let set = unsafe {
            libc::lsetxattr(
                path.as_ptr(),
                c"user.note".as_ptr(),
                value.as_ptr().cast(),
                value.len(),
                0,
            )
        };
        assert_eq!(
            set,
            0,
            "setxattr {file}: {}",
            std::io::Error::last_os_error()
        );
    }
}

/// SEEK_DATA and SEEK_HOLE of every regular file from a few offsets: the
/// offset answered, or the errno.
fn seeks(root: &Path, listing: &Listing) -> Seeks {
    let mut answers = Vec::new();
    for (name, kind, size, ..) in listing {
        if *kind != 'f' {
            continue;
        }
        let file = std::fs::File::open(root.join(name)).unwrap();
        for offset in [0, 1, size / 2, size.saturating_sub(1), *size, size + 10] {
            for whence in [libc::SEEK_DATA, libc::SEEK_HOLE] {
                // SAFETY: lseek on a descriptor this function owns.
                let answer = unsafe { libc::lseek(file.as_raw_fd(), offset as i64, whence) };
                let answer = if answer < 0 {
                    -(std::io::Error::last_os_error().raw_os_error().unwrap() as i64)
                } else {
                    answer
                };
                answers.push((name.clone(), offset, whence, answer));
            }
        }
    }
    answers
}

/// Whether the open image's `path` still has its data inline.
fn has_inline_flag_open(image: &Image, path: &str) -> bool {
    let ino = image.inode_of(path, true).unwrap();
    image.fs().getattr(ino).unwrap().flags & 0x1000_0000 != 0
}

/// What debugfs says of `path`: its inline data size, or None.
fn inline_size(image: &Path, path: &str) -> Option<u64> {
    let stat = debugfs_stat(image, path);
    stat.lines()
        .find_map(|line| line.trim().strip_prefix("Size of inline data: "))
        .map(|size| size.trim().parse().unwrap())
}

/// Whether debugfs shows EXT4_INLINE_DATA_FL in `path`'s flags (it prints
/// no inline size for symlinks).
fn has_inline_flag(image: &Path, path: &str) -> bool {
    let stat = debugfs_stat(image, path);
    let flags = stat
        .split("Flags: ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("no flags in debugfs stat {path}:\n{stat}"));
    let flags = u32::from_str_radix(flags.trim_start_matches("0x"), 16).unwrap();
    flags & 0x1000_0000 != 0
}

fn debugfs_stat(image: &Path, path: &str) -> String {
    let output = std::process::Command::new("debugfs")
        .args(["-R", &format!("stat {path}")])
        .arg(image)
        .output()
        .expect("running debugfs");
    assert!(output.status.success(), "debugfs stat {path}");
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn mkfs(dir: &Path, name: &str, args: &[&str]) -> std::path::PathBuf {
    common::mkfs(dir, name, 32, args)
}

/// Run `work` on a read-write kernel loop mount of `image`.
fn through_the_kernel(image: &Path, work: impl FnOnce(&Path)) {
    let _kernel = kernel_lock();
    let mount = Mount::new(image, "rw").unwrap();
    work(&mount.point);
    mount.unmount();
}

/// The kernel's view and its SEEK answers, from a read-only loop mount.
fn kernel_view(image: &Path) -> (Listing, Seeks, XattrNames) {
    let mount = Mount::new(image, "ro").unwrap();
    let listing = tree(&mount.point);
    let answers = seeks(&mount.point, &listing);
    let names = xattr_names(&mount.point, &listing);
    mount.unmount();
    (listing, answers, names)
}

/// jext4's view through FUSE, with the server's log.
fn jext4_view(image: &Path) -> (Listing, Seeks, XattrNames, String) {
    let server = Server::start(image, "");
    let listing = tree(&server.mountpoint);
    let answers = seeks(&server.mountpoint, &listing);
    let names = xattr_names(&server.mountpoint, &listing);
    let ending = server.unmount();
    (listing, answers, names, ending.log)
}

/// Every path of `listing` with what debugfs says of its inline data:
/// the inline flag and the inline size.
fn inline_layout(image: &Path, listing: &Listing) -> Vec<(String, bool, Option<u64>)> {
    listing
        .iter()
        .map(|(path, ..)| {
            let at = format!("/{path}");
            (
                path.clone(),
                has_inline_flag(image, &at),
                inline_size(image, &at),
            )
        })
        .collect()
}

/// Changes to a populated tree that take inline files and directories
/// through every path: names added until directories move to blocks,
/// names removed from both regions, a directory moved to another parent
/// (its ".." in i_block), a directory removed, inline files cut, grown by
/// truncation past their bytes, appended past the inode, fallocated, and
/// rewritten in place.
fn mutate(root: &Path) {
    for i in 0..12 {
        std::fs::write(root.join(format!("few/added-{i}")), pattern(i, i * 9)).unwrap();
    }
    std::fs::remove_file(root.join("spill/0000000001")).unwrap();
    std::fs::remove_file(root.join("spill/0000000004")).unwrap();
    std::fs::write(root.join("spill/x"), b"short").unwrap();
    std::fs::rename(root.join("few/sub"), root.join("spill/sub")).unwrap();
    std::fs::remove_dir(root.join("empty")).unwrap();
    std::fs::create_dir(root.join("new-empty")).unwrap();
    let open = |name: &str| {
        std::fs::OpenOptions::new()
            .write(true)
            .open(root.join(name))
            .unwrap()
    };
    open("file100").set_len(30).unwrap();
    open("file61").set_len(2000).unwrap();
    open("file127").set_len(0).unwrap();
    std::io::Write::write_all(&mut open("file127"), b"again").unwrap();
    let appended = std::fs::OpenOptions::new()
        .append(true)
        .open(root.join("file59"))
        .unwrap();
    std::io::Write::write_all(&mut &appended, &pattern(3, 300)).unwrap();
    // SAFETY: fallocate on a descriptor the closure's file owns.
    let fallocated = unsafe { libc::fallocate(open("file6").as_raw_fd(), 0, 0, 8192) };
    assert_eq!(fallocated, 0, "{}", std::io::Error::last_os_error());
    std::os::unix::fs::FileExt::write_at(&open("file60"), b"XY", 10).unwrap();
}

#[test]
fn kernel_written_tree_reads_the_same() {
    if !kernel_available() || !fuse_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    for (name, args) in VARIANTS {
        let image = mkfs(dir.path(), name, args);
        through_the_kernel(&image, |root| {
            populate(root);
            set_xattrs(root);
        });
        common::assert_fsck_clean(&image);
        // The tree covers what it means to: inline files with and without
        // system.data, a directory spilling into it, one that outgrew it.
        assert_eq!(inline_size(&image, "/file6"), Some(60), "{name}");
        assert!(inline_size(&image, "/file100").unwrap() >= 100, "{name}");
        assert_eq!(inline_size(&image, "/file4101"), None, "{name}");
        assert_eq!(inline_size(&image, "/empty"), Some(60), "{name}");
        assert_eq!(inline_size(&image, "/few/sub/deeper"), Some(60), "{name}");
        assert!(inline_size(&image, "/spill").unwrap() > 60, "{name}");
        assert_eq!(inline_size(&image, "/many"), None, "{name}");
        let (kernel, kernel_seeks, kernel_names) = {
            let _kernel = kernel_lock();
            kernel_view(&image)
        };
        let (ours, our_seeks, our_names, log) = jext4_view(&image);
        assert_eq!(ours, kernel, "{name}: the tree jext4 shows");
        assert_eq!(our_seeks, kernel_seeks, "{name}: SEEK_DATA / SEEK_HOLE");
        assert_eq!(our_names, kernel_names, "{name}: listxattr");
        assert!(
            kernel_names.iter().any(|(_, names)| !names.is_empty()),
            "{name}: some attribute is listed"
        );
        assert!(
            !log.contains("read-only"),
            "{name}: the mount is read-write:\n{log}"
        );
        common::assert_fsck_clean(&image);
    }
}

/// jext4 writes the tree the kernel writes, and the same inline layout:
/// which files and directories are inline, at which sizes, and which
/// moved to blocks.
#[test]
fn jext4_writes_what_the_kernel_writes() {
    if !kernel_available() || !fuse_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    for (name, args) in VARIANTS {
        let kernels = mkfs(dir.path(), &format!("k-{name}"), args);
        through_the_kernel(&kernels, |root| {
            populate(root);
            set_xattrs(root);
        });
        let ours = mkfs(dir.path(), &format!("j-{name}"), args);
        let server = Server::start(&ours, "");
        populate(&server.mountpoint);
        set_xattrs(&server.mountpoint);
        server.unmount();
        common::assert_fsck_clean(&ours);
        let (theirs_view, ours_view) = {
            let _kernel = kernel_lock();
            (kernel_view(&kernels), kernel_view(&ours))
        };
        assert_eq!(ours_view, theirs_view, "{name}: the tree the kernel reads");
        let layout = inline_layout(&kernels, &theirs_view.0);
        assert!(
            layout
                .iter()
                .any(|(_, _, size)| size.is_some_and(|s| s > 60))
        );
        assert_eq!(
            inline_layout(&ours, &ours_view.0),
            layout,
            "{name}: the inline layout"
        );
    }
}

/// The kernel writes a tree; then the same changes (`mutate`) through the
/// kernel and through jext4 leave the same tree and the same inline
/// layout, and jext4's image is clean.
#[test]
fn jext4_changes_what_the_kernel_wrote_as_the_kernel_does() {
    if !kernel_available() || !fuse_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    for (name, args) in VARIANTS {
        let kernels = mkfs(dir.path(), &format!("mk-{name}"), args);
        through_the_kernel(&kernels, |root| {
            populate(root);
            set_xattrs(root);
        });
        let ours = dir.path().join(format!("mj-{name}.img"));
        std::fs::copy(&kernels, &ours).unwrap();
        through_the_kernel(&kernels, mutate);
        let server = Server::start(&ours, "");
        mutate(&server.mountpoint);
        server.unmount();
        common::assert_fsck_clean(&kernels);
        common::assert_fsck_clean(&ours);
        let (theirs_view, ours_view) = {
            let _kernel = kernel_lock();
            (kernel_view(&kernels), kernel_view(&ours))
        };
        assert_eq!(ours_view, theirs_view, "{name}: the tree after the changes");
        assert_eq!(
            inline_layout(&ours, &ours_view.0),
            inline_layout(&kernels, &theirs_view.0),
            "{name}: the inline layout after the changes"
        );
    }
}

#[test]
fn mke2fs_d_tree_reads_the_same() {
    if !fuse_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("source");
    std::fs::create_dir(&source).unwrap();
    populate(&source);
    // A symlink e2fsprogs stores inline: longer than i_block, within the
    // inode's room (ext2fs_symlink tries inline data first).
    let target = "t".repeat(90);
    std::os::unix::fs::symlink(&target, source.join("link-inline")).unwrap();
    let expected = tree(&source);
    for (name, args) in VARIANTS {
        let source_arg = source.to_str().unwrap();
        let args: Vec<&str> = args.iter().copied().chain(["-d", source_arg]).collect();
        let image = mkfs(dir.path(), &format!("d-{name}"), &args);
        common::assert_fsck_clean(&image);
        assert_eq!(inline_size(&image, "/file61"), Some(61), "{name}");
        assert!(has_inline_flag(&image, "/link-inline"), "{name}");
        assert_eq!(inline_size(&image, "/empty"), Some(60), "{name}");
        let (ours, ..) = jext4_view(&image);
        // Directory sizes and st_blocks are the image's own, not the
        // host's (the kernel-written test compares those): the rest.
        let strip = |listing: &Listing| -> Vec<(String, char, u64, u64, u32)> {
            listing
                .iter()
                .map(|(path, kind, size, _, nlink, sum)| {
                    let size = if *kind == 'd' { 0 } else { *size };
                    (path.clone(), *kind, size, *nlink, *sum)
                })
                .collect()
        };
        assert_eq!(strip(&ours), strip(&expected), "{name}: mke2fs -d tree");
    }
}

/// Every cookie of an inline directory's listing resumes right after its
/// entry, through the library (no kernel needed: mke2fs -d builds it).
#[test]
fn readdir_cookies_resume() {
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("source");
    std::fs::create_dir(&source).unwrap();
    populate(&source);
    for (name, args) in VARIANTS {
        let source_arg = source.to_str().unwrap();
        let args: Vec<&str> = args.iter().copied().chain(["-d", source_arg]).collect();
        let image = mkfs(dir.path(), &format!("c-{name}"), &args);
        let opened = Image::open(&image).unwrap();
        let fs = opened.fs();
        for path in ["/few", "/spill", "/empty", "/few/sub"] {
            let ino = opened.inode_of(path, true).unwrap();
            let mut all = Vec::new();
            fs.readdir(ino, 0, &mut |entry| {
                all.push(entry);
                true
            })
            .unwrap();
            let mut names: Vec<Vec<u8>> = all.iter().map(|e| e.name.clone()).collect();
            names.sort();
            let mut on_host: Vec<Vec<u8>> = std::fs::read_dir(source.join(&path[1..]))
                .unwrap()
                .map(|entry| entry.unwrap().file_name().into_encoded_bytes())
                .chain([b".".to_vec(), b"..".to_vec()])
                .collect();
            on_host.sort();
            assert_eq!(names, on_host, "{name} {path}");
            for (at, entry) in all.iter().enumerate() {
                let mut rest = Vec::new();
                fs.readdir(ino, entry.next, &mut |entry| {
                    rest.push(entry);
                    true
                })
                .unwrap();
                assert_eq!(
                    rest,
                    all[at + 1..],
                    "{name} {path}: from cookie {}",
                    entry.next
                );
            }
        }
        // A listing goes on where it was after the directory moved to a
        // block meanwhile: every name after the cookie still comes.
        let ino = opened.inode_of("/spill", true).unwrap();
        let mut before = Vec::new();
        fs.readdir(ino, 0, &mut |entry| {
            before.push(entry);
            true
        })
        .unwrap();
        for i in 0..40 {
            opened
                .write(format!("/spill/added-name-{i:03}"), b"x")
                .unwrap();
        }
        assert!(
            !has_inline_flag_open(&opened, "/spill"),
            "{name}: moved to a block"
        );
        let cookie = before[3].next;
        let mut after = Vec::new();
        fs.readdir(ino, cookie, &mut |entry| {
            after.push(entry.name);
            true
        })
        .unwrap();
        for entry in &before[4..] {
            assert!(
                after.contains(&entry.name),
                "{name}: {:?} after the move",
                String::from_utf8_lossy(&entry.name)
            );
        }
        for entry in &before[..4] {
            assert!(!after.contains(&entry.name), "{name}: listed twice");
        }
        opened.close().unwrap();
        common::assert_fsck_clean(&image);
    }
}

/// The kernel crashes with inline files and directories in its journal
/// (and in fast commits, where the image has them): jext4's mount replays
/// the journal and shows the tree a kernel mount shows after e2fsck's
/// replay.
#[test]
fn kernel_crash_replays_the_same() {
    if !kernel_available() || !fuse_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    for (name, features) in [
        ("crash", "inline_data"),
        ("crash-fc", "inline_data,fast_commit"),
    ] {
        let image = mkfs(dir.path(), name, &["-t", "ext4", "-O", features]);
        let crash = {
            let _kernel = kernel_lock();
            common::journal::kernel_crash_image(&image, "rw", std::time::Duration::ZERO, |root| {
                populate(root);
                common::journal::commit_now(root);
                std::fs::write(root.join("few/late"), b"after the commit").unwrap();
                std::fs::remove_file(root.join("file59")).unwrap();
                std::fs::create_dir(root.join("spill/newdir")).unwrap();
                for synced in ["few/late", "file61"] {
                    let file = std::fs::OpenOptions::new()
                        .append(true)
                        .open(root.join(synced))
                        .unwrap();
                    std::io::Write::write_all(&mut &file, b"+").unwrap();
                    file.sync_all().unwrap();
                }
            })
        };
        // The oracle's replay: e2fsck's, or for fast commits the kernel's
        // (e2fsck 1.47.0 drops the system.data of inline inodes its fast
        // commit replay rewrites: the kernel then refuses them).
        let theirs = crash.with_extension("theirs.img");
        std::fs::copy(&crash, &theirs).unwrap();
        let fast_commit = features.contains("fast_commit");
        if fast_commit {
            let _kernel = kernel_lock();
            Mount::new(&theirs, "rw").unwrap().unmount();
        } else {
            let (code, text) = common::journal::run(
                "e2fsck",
                &["-E", "journal_only", "-p", theirs.to_str().unwrap()],
            );
            assert!(code <= 1, "{name}: e2fsck replay: {text}");
        }
        let (kernel, kernel_seeks, kernel_names) = {
            let _kernel = kernel_lock();
            kernel_view(&theirs)
        };
        assert!(kernel.iter().any(|(path, ..)| path == "few/late"), "{name}");
        let replayed = if fast_commit {
            // Fast commits of inline inodes are the kernel's to replay for
            // now: jext4 refuses in one line, and reads the kernel's replay.
            let output = std::process::Command::new(common::server::JEXT4)
                .args(["ls", &format!("{}:/", crash.display())])
                .output()
                .unwrap();
            let stderr = String::from_utf8_lossy(&output.stderr);
            assert!(!output.status.success(), "{name}: {stderr}");
            assert!(stderr.contains("kernel mount"), "{name}: {stderr}");
            assert_eq!(stderr.lines().count(), 1, "{name}: {stderr}");
            theirs
        } else {
            crash
        };
        let (ours, our_seeks, our_names, _) = jext4_view(&replayed);
        assert_eq!(ours, kernel, "{name}: the tree after replay");
        assert_eq!(our_seeks, kernel_seeks, "{name}: SEEK_DATA / SEEK_HOLE");
        assert_eq!(our_names, kernel_names, "{name}: listxattr");
        if !fast_commit {
            // (The kernel's fast-commit replay of this workload leaves a
            // hard-linked inode's count at 1, which e2fsck reports: its
            // image is the oracle's, read here, not ours.)
            common::assert_fsck_clean(&replayed);
        }
    }
}
