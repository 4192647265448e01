//! Images jext4 did not make, odd or damaged, answered as the kernel
//! answers them: old ext2 images without extended attributes, directories
//! whose htree index is damaged, entries that point past the initialised
//! inodes, and operations that meet corruption half way (the journal
//! aborts, so the disk keeps its last committed state).

// The jext4 binary, or the mounts and helpers of tests/common that use it.
#![cfg(feature = "cli")]

mod common;

use common::server::{Server, fuse_available, jext4};
use common::{assert_fsck_clean, mkfs};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::Command;

/// `debugfs -w -f -` with `commands`, asserting it ran.
fn debugfs_write(image: &Path, commands: &str) {
    use std::io::Write;
    let mut child = Command::new("debugfs")
        .args(["-w", "-f", "-"])
        .arg(image)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("running debugfs");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(commands.as_bytes())
        .unwrap();
    let output = child.wait_with_output().unwrap();
    assert!(output.status.success(), "debugfs: {output:?}");
}

fn features(image: &Path) -> String {
    let output = Command::new("dumpe2fs")
        .arg("-h")
        .arg(image)
        .output()
        .unwrap();
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .find(|line| line.starts_with("Filesystem features:"))
        .unwrap_or_default()
        .to_string()
}

/// An ext2 image made without `ext_attr` (old images, the Hurd's): files
/// the caller does not own open and list as on the kernel, reading an
/// attribute finds none, and the first attribute set turns the feature on
/// in the same transaction, as the kernel's `ext4_xattr_update_super_block`.
#[test]
fn ext2_without_ext_attr_reads_and_gains_the_feature() {
    if !fuse_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = mkfs(
        dir.path(),
        "noxattr",
        16,
        &["-t", "ext2", "-O", "^ext_attr"],
    );
    let payload = dir.path().join("payload");
    std::fs::write(&payload, b"hello from an old image\n").unwrap();
    debugfs_write(
        &image,
        &format!(
            "mkdir home\nwrite {} home/note\nsif home uid 1000\nsif home/note uid 1000\n\
             sif <2> uid 1000\n",
            payload.display()
        ),
    );
    assert!(!features(&image).contains("ext_attr"));

    let server = Server::start(&image, "");
    let root = &server.mountpoint;
    let listed: Vec<_> = std::fs::read_dir(root.join("home"))
        .expect("listing a directory the caller does not own")
        .map(|entry| entry.unwrap().file_name())
        .collect();
    assert_eq!(listed, ["note"]);
    let note = root.join("home/note");
    assert_eq!(std::fs::metadata(&note).unwrap().uid(), 1000);
    assert_eq!(
        std::fs::read(&note).expect("reading a file the caller does not own"),
        b"hello from an old image\n"
    );
    let get = Command::new("getfattr")
        .args(["-n", "user.a"])
        .arg(&note)
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&get.stderr).contains("No such attribute"),
        "getfattr: {get:?}"
    );
    // `jext4 sync` and `stats` talk to the server through the mount root.
    jext4(&["sync", root.to_str().unwrap()]);
    assert!(jext4(&["stats", root.to_str().unwrap()]).contains("mounted true"));
    let set = Command::new("setfattr")
        .args(["-n", "user.a", "-v", "1"])
        .arg(&note)
        .status()
        .unwrap();
    assert!(set.success());
    server.unmount().assert_clean_exit();

    assert!(
        features(&image).contains("ext_attr"),
        "{}",
        features(&image)
    );
    assert_fsck_clean(&image);
}

/// `debugfs -R "stat PATH"`: the extent tree's first leaf block, `(ETB0):N`.
fn extent_leaf(image: &Path, path: &str) -> u64 {
    let output = Command::new("debugfs")
        .args(["-R", &format!("stat {path}")])
        .arg(image)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    let at = text
        .find("(ETB0):")
        .unwrap_or_else(|| panic!("no extent leaf:\n{text}"));
    let digits: String = text[at + 7..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().unwrap()
}

/// `e2fsck -fn` lines that name a problem (not the pass headers, the
/// program's banner or the summary with counts).
fn fsck_problems(image: &Path) -> Vec<String> {
    let (_, text) = common::fsck(image);
    text.lines()
        .filter(|line| {
            !line.starts_with("Pass ")
                && !line.starts_with("e2fsck ")
                && !line.contains(" files (")
                && !line.contains("WARNING: Filesystem still has errors")
                && !line.trim().is_empty()
        })
        .map(str::to_string)
        .collect()
}

/// Replay the journal with e2fsck alone (`-E journal_only`), as the next
/// mount would: what is left is the last committed state.
fn replay(image: &Path) {
    let status = Command::new("e2fsck")
        .args(["-p", "-E", "journal_only"])
        .arg(image)
        .status()
        .unwrap();
    assert!(
        status.code().unwrap_or(8) <= 1,
        "e2fsck -E journal_only: {status}"
    );
}

/// `rm` of a file whose extent leaf fails its checksum: the name goes
/// first, the blocks cannot be freed. The kernel (errors=remount-ro)
/// aborts the journal when it records the error, so the half operation
/// never reaches the disk; so does jext4. After a replay the image has
/// exactly the damage it had before, the name is still there, the
/// journal superblock records the abort, and the server logged the
/// corruption once, with its place.
#[test]
fn rm_meeting_a_damaged_extent_leaf_leaves_the_disk_as_it_was() {
    if !fuse_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = mkfs(dir.path(), "leaf", 32, &["-t", "ext4", "-b", "4096"]);
    let server = Server::start(&image, "");
    let root = server.mountpoint.clone();
    std::fs::write(root.join("kept"), b"written before the damage\n").unwrap();
    // One block every other block: more extents than the inode holds, so
    // the tree has a leaf block.
    {
        use std::os::unix::fs::FileExt;
        let victim = std::fs::File::create(root.join("victim")).unwrap();
        for block in (0..40u64).step_by(2) {
            victim.write_all_at(b"x", block * 4096).unwrap();
        }
    }
    server.unmount().assert_clean_exit();
    let leaf = extent_leaf(&image, "/victim");
    {
        use std::os::unix::fs::FileExt;
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&image)
            .unwrap();
        // An extent's start block, inside the leaf: the checksum fails.
        let mut byte = [0u8];
        file.read_exact_at(&mut byte, leaf * 4096 + 20).unwrap();
        file.write_all_at(&[byte[0] ^ 0x40], leaf * 4096 + 20)
            .unwrap();
    }
    let before = fsck_problems(&image);
    assert!(!before.is_empty(), "the damage is visible to e2fsck");

    let server = Server::start(&image, "");
    let root = server.mountpoint.clone();
    std::fs::write(root.join("unsynced"), b"accepted, never synced\n").unwrap();
    let error = std::fs::remove_file(root.join("victim")).expect_err("rm of a damaged file");
    assert_eq!(error.raw_os_error(), Some(libc::EUCLEAN), "{error}");
    // Unmount writes nothing more and reports the abort, as after a panic.
    let mountpoint = server.mountpoint.clone();
    let (said, ending) = server.unmount_reporting();
    let stderr = String::from_utf8_lossy(&said.stderr);
    assert!(
        !said.status.success() && stderr.contains("journal aborted") && stderr.contains("e2fsck"),
        "jext4 umount after the abort: {stderr}"
    );
    assert!(!common::server::is_mounted(&mountpoint));
    let corruption_lines: Vec<_> = ending
        .log
        .lines()
        .filter(|line| line.contains("corruption detected"))
        .collect();
    assert_eq!(corruption_lines.len(), 1, "log:\n{}", ending.log);
    assert!(
        corruption_lines[0].contains(&format!("block {leaf}"))
            && corruption_lines[0].contains("found_in"),
        "the log names the block and where it was found: {}",
        corruption_lines[0]
    );

    let logdump = jext4(&["logdump", image.to_str().unwrap()]);
    assert!(
        logdump.contains("errno -5"),
        "the journal records the abort:\n{logdump}"
    );
    replay(&image);
    assert_eq!(
        fsck_problems(&image),
        before,
        "only the damage that was there"
    );
    let listing = common::journal::debugfs_commands(&image, "ls -l /");
    assert!(
        listing.contains("victim") && listing.contains("kept"),
        "{listing}"
    );
    let dumpe2fs = Command::new("dumpe2fs")
        .arg("-h")
        .arg(&image)
        .output()
        .unwrap();
    let header = String::from_utf8_lossy(&dumpe2fs.stdout);
    assert!(
        header.contains("Filesystem state:         clean with errors")
            || header.contains("not clean with errors"),
        "the superblock records the error:\n{header}"
    );
}

/// A 1 KiB-block image whose `/big` holds `count` empty files (an htree
/// of one index level), made by `mke2fs -d` with `args` and indexed by
/// `e2fsck -D`; returns the image and the names.
fn htree_image(
    dir: &Path,
    name: &str,
    count: usize,
    args: &[&str],
) -> (std::path::PathBuf, Vec<String>) {
    let source = dir.join(format!("{name}-source"));
    std::fs::create_dir_all(source.join("big")).unwrap();
    let names: Vec<String> = (0..count)
        .map(|i| format!("entry-{i:05}-{}", i * 7919 % 1000))
        .collect();
    for name in &names {
        std::fs::write(source.join("big").join(name), b"").unwrap();
    }
    let mut all = vec!["-t", "ext4", "-b", "1024", "-d", source.to_str().unwrap()];
    all.extend_from_slice(args);
    let image = mkfs(dir, name, 32, &all);
    // mke2fs -d writes directories linearly; e2fsck -D indexes them.
    let status = Command::new("e2fsck")
        .args(["-fyD"])
        .arg(&image)
        .output()
        .unwrap();
    assert!(
        status.status.code().unwrap_or(8) <= 1,
        "e2fsck -fyD: {status:?}"
    );
    assert!(
        common::journal::debugfs_commands(&image, "htree /big").contains("Root node dump"),
        "/big is an htree"
    );
    (image, names)
}

/// The physical block of `/big`'s htree root, and the bytes of that block.
fn htree_root(image: &Path) -> (u64, Vec<u8>) {
    let text = common::journal::debugfs_commands(image, "blocks /big");
    let first: u64 = text
        .split_whitespace()
        .find_map(|word| word.parse().ok())
        .unwrap_or_else(|| panic!("no blocks for /big: {text}"));
    let bytes = std::fs::read(image).unwrap();
    (
        first,
        bytes[first as usize * 1024..first as usize * 1024 + 1024].to_vec(),
    )
}

fn write_block(image: &Path, block: u64, bytes: &[u8]) {
    use std::os::unix::fs::FileExt;
    let file = std::fs::OpenOptions::new().write(true).open(image).unwrap();
    file.write_all_at(bytes, block * 1024).unwrap();
}

/// Names in a listing through the mount, sorted, with duplicates kept.
fn listed(dir: &Path) -> std::io::Result<Vec<String>> {
    let mut names = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        names.push(entry?.file_name().into_string().unwrap());
    }
    names.sort();
    Ok(names)
}

/// A damaged htree index that each node's own checks pass — two index
/// entries naming one leaf, so that a walk through it would list that
/// leaf twice and another not at all — and one whose root fails its
/// checks: either way every name is listed once and found by lookup (the
/// leaves are read linearly, as ext4_readdir and ext4_find_entry fall
/// back to) and the damage is logged once. Adding a name then does what
/// the kernel's ext4_add_entry does: on a checksummed filesystem it is
/// refused (EUCLEAN) and the image keeps exactly its damage; without
/// checksums the directory gives up its index and takes the name as a
/// linear directory, which e2fsck then finds clean.
#[test]
fn damaged_htree_index_lists_and_finds_every_name() {
    if !fuse_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // Without checksums the redirected entry passes every node check.
    let (redirected, names) =
        htree_image(dir.path(), "redirected", 3000, &["-O", "^metadata_csum"]);
    let (root_block, mut root) = htree_root(&redirected);
    let entry = |i: usize| 32 + 8 * i;
    let second_leaf = root[entry(1) + 4..entry(1) + 8].to_vec();
    root[entry(2) + 4..entry(2) + 8].copy_from_slice(&second_leaf);
    write_block(&redirected, root_block, &root);
    // With checksums: a count above the limit.
    let (bad_count, _) = htree_image(dir.path(), "count", 3000, &[]);
    let (root_block, mut root) = htree_root(&bad_count);
    root[34..36].copy_from_slice(&500u16.to_le_bytes());
    write_block(&bad_count, root_block, &root);

    for (image, checksummed) in [(&redirected, false), (&bad_count, true)] {
        let before = fsck_problems(image);
        assert!(
            !before.is_empty(),
            "e2fsck sees the damage of {}",
            image.display()
        );
        let server = Server::start(image, "");
        let big = server.mountpoint.join("big");
        let mut expected = names.clone();
        expected.sort();
        let names_listed = listed(&big)
            .unwrap_or_else(|e| panic!("listing {}: {e}\n{}", image.display(), server.read_log()));
        assert_eq!(names_listed, expected, "listing of {}", image.display());
        for name in names.iter().step_by(97) {
            std::fs::metadata(big.join(name)).unwrap_or_else(|e| panic!("stat {name}: {e}"));
        }
        let added = std::fs::write(big.join("new-name"), b"");
        let (_, ending) = server.unmount_reporting();
        let damaged_lines = ending
            .log
            .lines()
            .filter(|l| l.contains("ERROR damaged htree index"))
            .count();
        assert_eq!(damaged_lines, 1, "log:\n{}", ending.log);
        if checksummed {
            let refused = added.expect_err("add through a damaged index");
            assert_eq!(refused.raw_os_error(), Some(libc::EUCLEAN), "{refused}");
            assert_eq!(
                fsck_problems(image),
                before,
                "only the damage that was there"
            );
        } else {
            added.expect("a linear add into a directory without checksums");
            assert_fsck_clean(image);
            let listing = common::journal::debugfs_commands(image, "ls /big");
            assert!(
                listing.contains("new-name") && listing.contains(&names[2999]),
                "{listing}"
            );
        }
    }
}

/// An orphan list of linked files that comes back on itself (a → b → a):
/// the kernel's orphan cleanup takes each inode off the list as it goes
/// and mounts; so does jext4, cutting the list where it loops. Both leave
/// an image e2fsck finds clean, the files whole.
#[test]
fn orphan_list_of_linked_files_that_loops_is_cleaned_up() {
    if !fuse_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = mkfs(dir.path(), "loop", 32, &["-t", "ext4"]);
    let payload = dir.path().join("payload");
    std::fs::write(&payload, b"still here\n").unwrap();
    debugfs_write(
        &image,
        &format!(
            "write {p} a\nwrite {p} b\nsif a dtime @13\nsif b dtime @12\nssv last_orphan 12\n",
            p = payload.display()
        ),
    );
    assert!(!fsck_problems(&image).is_empty(), "e2fsck sees the loop");
    let kernel = image.with_extension("kernel.img");
    std::fs::copy(&image, &kernel).unwrap();

    let server = Server::start(&image, "");
    for name in ["a", "b"] {
        assert_eq!(
            std::fs::read(server.mountpoint.join(name)).unwrap(),
            b"still here\n"
        );
    }
    server.unmount().assert_clean_exit();
    assert_fsck_clean(&image);

    // The kernel, where it can mount here, does the same.
    if common::journal::kernel_available() {
        let _kernel = common::journal::kernel_lock();
        let mount = common::journal::Mount::new(&kernel, "").expect("kernel mount");
        assert_eq!(
            std::fs::read(mount.point.join("a")).unwrap(),
            b"still here\n"
        );
        mount.unmount();
        assert_fsck_clean(&kernel);
    }
}

/// Where `dumpe2fs` puts every group's bitmaps and inode table, and each
/// group's superblock copy and descriptor blocks: `(first, last)` blocks.
fn metadata_ranges(image: &Path) -> Vec<(u64, u64)> {
    let output = Command::new("dumpe2fs").arg(image).output().unwrap();
    let text = String::from_utf8_lossy(&output.stdout);
    let mut ranges = Vec::new();
    for line in text.lines().map(str::trim) {
        for prefix in [
            "Block bitmap at ",
            "Inode bitmap at ",
            "Inode table at ",
            "Primary superblock at ",
            "Backup superblock at ",
            "Group descriptors at ",
            "Reserved GDT blocks at ",
        ] {
            // "Backup superblock at 8193, Group descriptors at 8194-8194"
            for part in line.split(", ") {
                let Some(rest) = part.strip_prefix(prefix) else {
                    continue;
                };
                let span: String = rest
                    .chars()
                    .take_while(|c| c.is_ascii_digit() || *c == '-')
                    .collect();
                let mut ends = span.split('-').map(|n| n.parse::<u64>().unwrap());
                let first = ends.next().unwrap();
                ranges.push((first, ends.next().unwrap_or(first)));
            }
        }
    }
    assert!(ranges.len() > 4, "no layout in dumpe2fs:\n{text}");
    ranges
}

/// Blocks of `path` in `image` (`debugfs blocks`).
fn blocks_of(image: &Path, path: &str) -> Vec<u64> {
    let output = Command::new("debugfs")
        .args(["-n", "-R", &format!("blocks {path}")])
        .arg(image)
        .output()
        .unwrap();
    String::from_utf8_lossy(&output.stdout)
        .split_whitespace()
        .map(|word| word.parse().unwrap())
        .collect()
}

/// Create directories and files with data through jext4 on `image`
/// until an operation meets the damage (if one does), check the server's
/// log, replay what the journal holds, and return what the objects that
/// were made own. `expect_log`: the corruption the log must name, once,
/// where the workload is sure to meet it; then the operation that met it
/// failed with EUCLEAN and the filesystem turned read-only, as the
/// kernel's does under errors=remount-ro. Also returns the server's log.
fn fill_and_collect_blocks(image: &Path, expect_log: Option<&str>) -> (Vec<u64>, String) {
    let server = Server::start(image, "");
    let root = server.mountpoint.clone();
    let mut made = 0;
    let mut refused = None;
    for index in 0..12 {
        let dir = root.join(format!("d{index}"));
        let step = std::fs::create_dir(&dir)
            .and_then(|()| std::fs::write(dir.join("f"), vec![index as u8; 20 << 10]))
            .and_then(|()| std::fs::File::open(dir.join("f"))?.sync_all());
        match step {
            Ok(()) => made += 1,
            Err(error) => {
                refused = Some(error);
                break;
            }
        }
    }
    let (_, ending) = server.unmount_reporting();
    let log = &ending.log;
    for bad in ["panicked", "write-ahead rule"] {
        assert!(
            !log.contains(bad),
            "the server log contains '{bad}':\n{log}"
        );
    }
    let noted: Vec<&str> = log
        .lines()
        .filter(|line| line.contains("corruption detected"))
        .collect();
    match (expect_log, &refused) {
        (Some(expected), Some(error)) => {
            assert_eq!(error.raw_os_error(), Some(libc::EUCLEAN), "{error}");
            assert_eq!(noted.len(), 1, "the corruption is logged once:\n{log}");
            assert!(noted[0].contains(expected), "{}", noted[0]);
        }
        (Some(expected), None) => panic!("nothing met the damage ({expected}):\n{log}"),
        (None, Some(error)) => assert_eq!(error.raw_os_error(), Some(libc::EUCLEAN), "{error}"),
        (None, None) => assert!(noted.is_empty(), "{log}"),
    }
    replay(image);
    let mut owned = Vec::new();
    for index in 0..made {
        owned.extend(blocks_of(image, &format!("/d{index}")));
        let file = blocks_of(image, &format!("/d{index}/f"));
        assert!(!file.is_empty(), "d{index}/f has blocks");
        owned.extend(file);
    }
    (owned, ending.log)
}

/// e2fsck's problem lines after the run that the damaged image did not
/// already have (the superblock's free totals aside: they follow the
/// groups jext4 counts, as the kernel's counters).
fn new_problems(before: &[String], image: &Path) -> Vec<String> {
    // Compared by kind: the numbers in a line (a group's free count) move
    // with what the run allocated.
    let kind = |line: &str| line.replace(|c: char| c.is_ascii_digit(), "#");
    let before: Vec<String> = before.iter().map(|line| kind(line)).collect();
    fsck_problems(image)
        .into_iter()
        .filter(|line| {
            !before.contains(&kind(line))
                && !line.starts_with("Free blocks count wrong (")
                && !line.ends_with("? no")
        })
        .collect()
}

/// A block bitmap that marks inode-table blocks free (with its group's
/// free count raised to match, so that nothing but the layout gives it
/// away); no metadata block is ever handed out, and e2fsck finds nothing
/// the damage did not already show. Without flex_bg the bitmap is the
/// inode table's own group's, which the kernel checks
/// (`ext4_valid_block_bitmap`): the first allocation that reads it fails
/// with EUCLEAN, the corruption is logged once and the filesystem turns
/// read-only (errors=remount-ro). With flex_bg the inode tables of all
/// groups lie in group 0, whose bitmap the kernel does not check at all
/// (only its allocator's system zone stops it, when it meets the block):
/// the group is kept out of allocation, which is logged once, and
/// nothing fails.
#[test]
fn a_block_bitmap_that_frees_inode_table_blocks_is_not_allocated_from() {
    if !fuse_available() {
        return;
    }
    for (name, args) in [
        ("flex", &["-t", "ext4"][..]),
        ("noflex", &["-t", "ext4", "-O", "^flex_bg"][..]),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let image = mkfs(dir.path(), name, 32, args);
        let layout = metadata_ranges(&image);
        // The last blocks of group 1's inode table: unused inodes, so the
        // damage is only the bitmap's.
        let output = Command::new("dumpe2fs").arg(&image).output().unwrap();
        let text = String::from_utf8_lossy(&output.stdout).into_owned();
        let group1 = &text[text.find("Group 1:").unwrap()..];
        let table = group1[group1.find("Inode table at ").unwrap() + 15..]
            .split(|c: char| !c.is_ascii_digit() && c != '-')
            .next()
            .unwrap()
            .to_string();
        let last: u64 = table.split('-').nth(1).unwrap().parse().unwrap();
        let freed: Vec<u64> = (last - 3..=last).collect();
        let holder = {
            let output = Command::new("debugfs")
                .args(["-R", &format!("testb {}", freed[0])])
                .arg(&image)
                .output()
                .unwrap();
            assert!(String::from_utf8_lossy(&output.stdout).contains("marked in use"));
            // The group whose bitmap holds those bits (1 KiB blocks: 8192
            // a group from block 1).
            (freed[0] - 1) / 8192
        };
        let free_now: u64 = {
            let at = text.find(&format!("Group {holder}:")).unwrap();
            let line = text[at..]
                .lines()
                .find(|line| line.contains(" free blocks, "))
                .unwrap();
            line.trim().split(' ').next().unwrap().parse().unwrap()
        };
        let mut commands: String = freed.iter().map(|b| format!("freeb {b}\n")).collect();
        commands += &format!(
            "set_bg {holder} free_blocks_count {}\nset_bg {holder} checksum calc\n",
            free_now + freed.len() as u64
        );
        debugfs_write(&image, &commands);
        let before = fsck_problems(&image);
        assert!(!before.is_empty(), "{name}: e2fsck sees the damage");

        // Without flex_bg the damaged bitmap is group 1's, which the
        // allocator may not reach on this small a workload; with flex_bg
        // it is group 0's, the first searched, which nothing fails for.
        let (owned, log) = fill_and_collect_blocks(&image, None);
        if name == "flex" {
            let refused = log
                .lines()
                .filter(|line| line.contains("group not allocated from"))
                .count();
            assert_eq!(refused, 1, "{name}: kept out of allocation, once:\n{log}");
            let group_of = |block: u64| (block - 1) / 8192;
            let taken: Vec<u64> = (owned.iter().copied())
                .filter(|&block| group_of(block) == holder)
                .collect();
            assert!(
                taken.is_empty(),
                "{name}: blocks {taken:?} taken from group {holder}"
            );
        }
        for block in owned {
            assert!(
                !layout
                    .iter()
                    .any(|&(first, last)| (first..=last).contains(&block)),
                "{name}: block {block} handed out is metadata"
            );
        }
        // e2fsck names the damage itself as a checksum mismatch or as the
        // freed range, depending on what else it finds: both are the
        // damage, not jext4's doing.
        let damage = format!(
            "Block bitmap differences:  +({}--{})",
            freed[0],
            freed[freed.len() - 1]
        );
        let new: Vec<String> = new_problems(&before, &image)
            .into_iter()
            .filter(|line| *line != damage)
            .collect();
        assert!(
            new.is_empty(),
            "{name}: e2fsck finds new problems: {new:?} (before: {before:?})"
        );
    }
}

/// A block bitmap whose checksum fails (metadata_csum): the allocation
/// that reads it fails with EUCLEAN and the filesystem turns read-only, as
/// the kernel's does under errors=remount-ro; what was made before stands.
#[test]
fn a_bad_block_bitmap_checksum_turns_the_filesystem_read_only() {
    if !fuse_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = mkfs(dir.path(), "csum", 32, &["-t", "ext4"]);
    // Group 0 holds the root directory: its bitmap is the first searched.
    debugfs_write(
        &image,
        "set_bg 0 block_bitmap_csum 0x1\nset_bg 0 checksum calc\n",
    );
    let before = fsck_problems(&image);
    assert!(!before.is_empty(), "e2fsck sees the bad checksum");
    let layout = metadata_ranges(&image);
    let (owned, _) = fill_and_collect_blocks(&image, Some("block bitmap checksum mismatch"));
    for block in owned {
        assert!(
            !layout
                .iter()
                .any(|&(first, last)| (first..=last).contains(&block)),
            "block {block} handed out is metadata"
        );
    }
    let new = new_problems(&before, &image);
    assert!(new.is_empty(), "e2fsck finds new problems: {new:?}");
}

/// A descriptor that points a group's inode bitmap at its block bitmap:
/// the kernel refuses the mount ("failed to initialize system zone"), and
/// so does jext4, read-only too, with one line that names both and
/// e2fsck; the image is left as it was.
#[test]
fn bitmaps_sharing_a_block_refuse_the_mount() {
    let dir = tempfile::tempdir().unwrap();
    let image = mkfs(dir.path(), "share", 32, &["-t", "ext4"]);
    let output = Command::new("dumpe2fs").arg(&image).output().unwrap();
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    let group1 = &text[text.find("Group 1:").unwrap()..];
    let block_bitmap: u64 = group1[group1.find("Block bitmap at ").unwrap() + 16..]
        .split(|c: char| !c.is_ascii_digit())
        .next()
        .unwrap()
        .parse()
        .unwrap();
    debugfs_write(
        &image,
        &format!("set_bg 1 inode_bitmap {block_bitmap}\nset_bg 1 checksum calc\n"),
    );
    assert_image_refused(
        &image,
        &["inode bitmap of group 1", "block bitmap of group 1"],
    );
}

/// `jext4 ls` (which opens the image read-only) and `jext4 mkdir`
/// (read-write) both refuse `image` with a message naming each of
/// `wanted` and e2fsck, and leave it as it was.
fn assert_image_refused(image: &Path, wanted: &[&str]) {
    let original = std::fs::read(image).unwrap();
    for (verb, path) in [("ls", "/"), ("mkdir", "/new")] {
        let spot = format!("{}:{path}", image.display());
        let output = Command::new(common::server::JEXT4)
            .arg(verb)
            .arg(&spot)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{verb} opened the image");
        assert!(
            wanted.iter().all(|text| stderr.contains(text)) && stderr.contains("e2fsck"),
            "{verb:?}: {stderr}"
        );
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
    assert_eq!(std::fs::read(image).unwrap(), original, "image unchanged");
}

/// A descriptor that points a group's inode bitmap into a backup's
/// reserved descriptor blocks (group 1's): the kernel's system zone holds
/// every group's superblock copy, descriptor and reserved descriptor
/// blocks (`ext4_num_base_meta_blocks`, since 6.4), so it refuses the
/// mount ("failed to initialize system zone"); so does jext4, read-only
/// too, naming both and e2fsck. (The zone of older kernels, which jext4
/// followed, left reserved blocks out and mounted it.)
#[test]
fn an_inode_bitmap_in_a_backups_reserved_descriptors_refuses_the_mount() {
    let dir = tempfile::tempdir().unwrap();
    let image = mkfs(dir.path(), "reserved", 32, &["-t", "ext4", "-b", "1024"]);
    let text = common::journal::debugfs_commands(&image, "stats");
    let number = |label: &str| -> u64 {
        let line = text.lines().find(|line| line.starts_with(label)).unwrap();
        line[label.len()..].trim().parse().unwrap()
    };
    let reserved = number("Reserved GDT blocks:");
    assert!(reserved > 0, "mke2fs reserved no descriptor blocks");
    // Group 1 starts at block 8193: its superblock copy, one descriptor
    // block, then the reserved ones.
    let target = 8193 + 2 + reserved / 2;
    debugfs_write(
        &image,
        &format!("set_bg 2 inode_bitmap {target}\nset_bg 2 checksum calc\n"),
    );
    if common::journal::kernel_available() {
        let copy = dir.path().join("kernel.img");
        std::fs::copy(&image, &copy).unwrap();
        let _kernel = common::journal::kernel_lock();
        let mounted = common::journal::Mount::new(&copy, "ro").map(|mount| mount.unmount());
        assert!(mounted.is_err(), "the kernel mounted the image");
    }
    assert_image_refused(
        &image,
        &["inode bitmap of group 2", "descriptor blocks of group 1"],
    );
}

/// A descriptor that points a group's block bitmap into its own inode
/// table: the kernel's system-zone test lets that through (the table,
/// added after the bitmap, starts before it) and mounts the image; jext4
/// mounts it too, says the group is not allocated from, and creates
/// elsewhere: the group's inode table (which holds its "bitmap") is left
/// as it was. (e2fsck itself reads the backup descriptors of such an
/// image; `damage_diff`'s `bitmaps_share_block` compares its verdicts
/// after the kernel's run and jext4's.)
#[test]
fn a_bitmap_inside_its_own_inode_table_mounts_and_its_group_is_passed_over() {
    let dir = tempfile::tempdir().unwrap();
    let image = mkfs(
        dir.path(),
        "inside",
        32,
        &["-t", "ext4", "-b", "1024", "-N", "2048"],
    );
    let output = Command::new("dumpe2fs").arg(&image).output().unwrap();
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    let field = |group: &str, name: &str| -> u64 {
        let at = &text[text.find(group).unwrap()..];
        at[at.find(name).unwrap() + name.len()..]
            .trim_start()
            .split(|c: char| !c.is_ascii_digit())
            .next()
            .unwrap()
            .parse()
            .unwrap()
    };
    let table = field("Group 1:", "Inode table at ");
    let next_table = field("Group 2:", "Inode table at ");
    let inodes_per_group = field("Inodes per group:", "Inodes per group:");
    debugfs_write(
        &image,
        &format!(
            "set_bg 1 block_bitmap {}\nset_bg 1 checksum calc\n",
            table + 3
        ),
    );
    let table_bytes = |image: &Path| {
        let bytes = std::fs::read(image).unwrap();
        bytes[table as usize * 1024..next_table as usize * 1024].to_vec()
    };
    let before = table_bytes(&image);
    for name in ["new", "other"] {
        let spot = format!("{}:/{name}", image.display());
        let output = Command::new(common::server::JEXT4)
            .args(["mkdir", &spot])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(output.status.success(), "jext4 mkdir: {stderr}");
        assert!(
            stderr.contains("group 1 is not allocated from")
                && stderr.contains("lies inside the inode table of group 1")
                && stderr.contains("e2fsck"),
            "{stderr}"
        );
        let stat = Command::new("debugfs")
            .args(["-R", &format!("stat /{name}")])
            .arg(&image)
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(&stat.stdout);
        let ino: u64 = said["Inode: ".len()..]
            .split(|c: char| !c.is_ascii_digit())
            .next()
            .unwrap()
            .parse()
            .unwrap();
        assert_ne!(
            (ino - 1) / inodes_per_group,
            1,
            "/{name} is inode {ino}, in group 1"
        );
    }
    assert!(
        table_bytes(&image) == before,
        "group 1's inode table changed"
    );
}

/// An ext2 inode bitmap that marks a live file's inode free: the first
/// create in its directory meets that inode, fails (EUCLEAN here, EIO in
/// the kernel, which says "doubly allocated?") and leaves the live
/// inode's bit set again, as the kernel's allocator leaves it; without a
/// journal that stays, so e2fsck then finds the same in both images.
#[test]
fn a_live_inode_marked_free_gets_its_bit_back_as_in_the_kernel() {
    if !common::e2e::require_e2e() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = mkfs(dir.path(), "freed", 64, &["-t", "ext2", "-b", "1024"]);
    debugfs_write(
        &image,
        "mkdir /tree\nwrite /dev/null /tree/f1\nwrite /dev/null /tree/f2\nwrite /dev/null /tree/f3\n",
    );
    debugfs_write(&image, "freei /tree/f2\n");
    let before = fsck_problems(&image);
    assert!(
        before
            .iter()
            .any(|line| line.starts_with("Inode bitmap differences")),
        "the damage: {before:?}"
    );
    let theirs = dir.path().join("kernel.img");
    std::fs::copy(&image, &theirs).unwrap();

    let spot = format!("{}:/tree/new", image.display());
    let output = Command::new(common::server::JEXT4)
        .args(["touch", &spot])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        !output.status.success() && stderr.contains("inode bitmap marks an inode with links free"),
        "jext4 touch: {stderr}"
    );
    let mnt = dir.path().join("mnt");
    let kernel = common::e2e::KernelMount::mount(&theirs, &mnt, false);
    // The kernel catches the double allocation only for an inode it has
    // in memory (`insert_inode_locked`): look at the files first, as the
    // damage runner's walk does. (An uncached one it silently takes over.)
    for entry in std::fs::read_dir(kernel.path("tree")).unwrap() {
        entry.unwrap().metadata().unwrap();
    }
    let refused = std::fs::File::create(kernel.path("tree/new")).unwrap_err();
    kernel.unmount();
    assert_eq!(
        refused.raw_os_error(),
        Some(libc::EIO),
        "the kernel: {refused}"
    );
    let ours = fsck_problems(&image);
    assert!(
        !ours
            .iter()
            .any(|line| line.starts_with("Inode bitmap differences")),
        "the live inode's bit was not set back: {ours:?}"
    );
    assert_eq!(
        ours,
        fsck_problems(&theirs),
        "e2fsck after jext4 and after the kernel"
    );
}
