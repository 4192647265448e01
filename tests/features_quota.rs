//! quota (user, group and project quota files): jext4 keeps every id's
//! usage as the kernel charges it and e2fsck recounts it. This kernel has
//! no CONFIG_QUOTA (it refuses these images), so e2fsck is the oracle:
//! `e2fsck -fn` recomputes the inodes and bytes of each id and compares
//! them with the files, and debugfs `list_quota` shows what they hold.
//!
//! - A workload through the library (files of every size, hard links, an
//!   xattr block, renames over files, truncates, removals, owners and
//!   groups changed back and forth) leaves counts e2fsck agrees with, on
//!   journaled and unjournaled images, 1 and 4 KiB blocks, with and
//!   without project quotas, and on an image `mke2fs -d` filled (whose
//!   quota files e2fsck recounts first: mke2fs 1.47.0 leaves them wrong).
//! - The same through a FUSE mount, with owners from `chown`.
//! - quota with ea_inode: values in EA inodes count for their owners.

// The jext4 binary, or the mounts and helpers of tests/common that use it.
#![cfg(feature = "cli")]

mod common;
#[path = "tools_support/mod.rs"]
mod tools_support;

use common::server::{Server, fuse_available};
use jext4::Image;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use tools_support::jext4_tool;

const VARIANTS: &[(&str, &[&str])] = &[
    ("4k", &["-t", "ext4", "-O", "quota,project", "-b", "4096"]),
    ("1k", &["-t", "ext4", "-O", "quota", "-b", "1024"]),
    (
        "nojournal",
        &["-t", "ext4", "-O", "quota,^has_journal", "-b", "4096"],
    ),
];

/// What debugfs `list_quota TYPE` says: (id, bytes, inodes) per id.
fn list_quota(image: &Path, qtype: &str) -> Vec<(u32, u64, u64)> {
    let output = std::process::Command::new("debugfs")
        .args(["-R", &format!("lq {qtype}")])
        .arg(image)
        .output()
        .expect("running debugfs");
    assert!(output.status.success(), "debugfs lq {qtype}");
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let id = fields.first()?.parse().ok()?;
            Some((
                id,
                fields.get(1)?.parse().ok()?,
                fields.get(4)?.parse().ok()?,
            ))
        })
        .collect()
}

fn usage_of(listing: &[(u32, u64, u64)], id: u32) -> (u64, u64) {
    listing
        .iter()
        .find(|(of, ..)| *of == id)
        .map_or((0, 0), |(_, bytes, inodes)| (*bytes, *inodes))
}

/// Changes that move usage every way: data, metadata blocks, owners.
fn workload(image: &Image) {
    image.create_dir_all("/home/a/deep").unwrap();
    image.create_dir("/home/b").unwrap();
    for (index, size) in [0usize, 1, 4095, 4096, 70_000, 300_000].iter().enumerate() {
        let contents: Vec<u8> = (0..*size).map(|i| (i * 7 + index) as u8).collect();
        image.write(format!("/home/a/f{index}"), &contents).unwrap();
        image.write(format!("/home/b/g{index}"), &contents).unwrap();
    }
    image.set_owner("/home/a", Some(1000), Some(1000)).unwrap();
    for index in 0..6 {
        image
            .set_owner(format!("/home/a/f{index}"), Some(1000), Some(100))
            .unwrap();
    }
    image.set_owner("/home/b/g5", Some(2000), None).unwrap();
    image.hard_link("/home/a/f4", "/home/b/link").unwrap();
    image
        .set_xattr("/home/a/f3", "user.big", vec![b'x'; 700])
        .unwrap();
    image.rename("/home/b/g4", "/home/a/f2").unwrap();
    image.remove_file("/home/a/f1").unwrap();
    let file = image
        .open_with("/home/a/f5", jext4::OpenOptions::new().write(true))
        .unwrap();
    file.set_len(10_000).unwrap();
    drop(file);
    image.set_owner("/home/b/g5", Some(0), Some(2000)).unwrap();
    image.write("/home/a/deep/late", b"late").unwrap();
    image.remove_dir_all("/home/b").unwrap();
}

#[test]
fn usage_follows_a_library_workload() {
    let dir = tempfile::tempdir().unwrap();
    for (name, args) in VARIANTS {
        let image_path = common::mkfs(dir.path(), name, 32, args);
        let image = Image::open(&image_path).unwrap();
        workload(&image);
        image.close().unwrap();
        common::assert_fsck_clean(&image_path);
        let users = list_quota(&image_path, "user");
        // /home/a, f0, f3, f4 (linked too, counted once) and f5 (cut to
        // 10,000 bytes): f1 removed, f2 renamed over by root's g4.
        let (bytes, inodes) = usage_of(&users, 1000);
        assert_eq!(inodes, 5, "{name}: uid 1000's inodes: {users:?}");
        assert!(bytes > 80_000, "{name}: uid 1000's bytes: {users:?}");
        assert_eq!(usage_of(&users, 2000), (0, 0), "{name}: {users:?}");
        let groups = list_quota(&image_path, "group");
        assert_eq!(usage_of(&groups, 100).1, 4, "{name}: gid 100: {groups:?}");
    }
}

#[test]
fn usage_follows_changes_to_a_mke2fs_d_image() {
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("source");
    std::fs::create_dir_all(source.join("sub")).unwrap();
    for index in 0..20 {
        std::fs::write(
            source.join(format!("sub/f{index}")),
            vec![7u8; index * 1500],
        )
        .unwrap();
    }
    let source_arg = source.to_str().unwrap();
    let image_path = common::mkfs(
        dir.path(),
        "d",
        32,
        &["-t", "ext4", "-O", "quota,project", "-d", source_arg],
    );
    // mke2fs 1.47.0 -d leaves the quota files counting only the root and
    // lost+found: e2fsck -fy recounts them first.
    let fixed = std::process::Command::new("e2fsck")
        .args(["-fy", image_path.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(fixed.status.code().unwrap() <= 1, "{fixed:?}");
    common::assert_fsck_clean(&image_path);
    let image = Image::open(&image_path).unwrap();
    for index in 0..10 {
        image.remove_file(format!("/sub/f{index}")).unwrap();
    }
    workload(&image);
    image.close().unwrap();
    common::assert_fsck_clean(&image_path);
}

#[test]
fn usage_follows_a_mount() {
    if !fuse_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = common::mkfs(dir.path(), "mount", 32, VARIANTS[0].1);
    let server = Server::start(&image, "");
    let root = &server.mountpoint;
    std::fs::create_dir(root.join("d")).unwrap();
    for index in 0..30 {
        let path = root.join(format!("d/f{index}"));
        std::fs::write(&path, vec![1u8; index * 1000]).unwrap();
        std::os::unix::fs::chown(&path, Some(3000 + index as u32 % 3), Some(400)).unwrap();
    }
    for index in 0..10 {
        std::fs::remove_file(root.join(format!("d/f{index}"))).unwrap();
    }
    let owner = std::fs::metadata(root.join("d/f29")).unwrap().uid();
    assert_eq!(owner, 3002);
    server.unmount();
    common::assert_fsck_clean(&image);
    let users = list_quota(&image, "user");
    let inodes: u64 = (3000..3003).map(|id| usage_of(&users, id).1).sum();
    assert_eq!(inodes, 20, "{users:?}");
}

/// quota with ea_inode: each value an attribute keeps in an EA inode
/// counts one inode for the attribute's owner (the kernel's
/// ext4_xattr_inode_alloc_quota, e2fsck's ea_ibody_quota and
/// ea_block_quota), shared EA inodes once per owner; the EA inodes count
/// for no one. Values set, shared, replaced, removed, their owners changed
/// and deleted leave counts e2fsck agrees with.
#[test]
fn ea_inode_values_count_for_their_owners() {
    let dir = tempfile::tempdir().unwrap();
    for block_size in ["1024", "4096"] {
        let image_path = common::mkfs(
            dir.path(),
            &format!("ea-{block_size}"),
            32,
            &["-t", "ext4", "-O", "quota,ea_inode", "-b", block_size],
        );
        let image = Image::open(&image_path).unwrap();
        image.create_dir("/u").unwrap();
        let big = |seed: u8| vec![seed; 9000];
        for name in ["a", "b", "c", "d"] {
            let path = format!("/u/{name}");
            image.write(&path, b"data").unwrap();
            image.set_owner(&path, Some(1000), Some(1000)).unwrap();
        }
        // Two values on a, one on b equal to one of a's (shared), one on c.
        image.set_xattr("/u/a", "user.one", big(1)).unwrap();
        image.set_xattr("/u/a", "user.two", big(2)).unwrap();
        image.set_xattr("/u/b", "user.same", big(2)).unwrap();
        image.set_xattr("/u/c", "user.one", big(3)).unwrap();
        image.set_xattr("/u/d", "user.gone", big(4)).unwrap();
        let users = image
            .fs()
            .quota_report(jext4::engine::format::quota::QuotaType::User)
            .unwrap();
        let inodes = |id: u32| {
            users
                .entries
                .iter()
                .find(|e| e.id == id)
                .map_or(0, |e| e.inodes)
        };
        // Four files and five values.
        assert_eq!(inodes(1000), 9, "{block_size}");
        // Replaced by a small value, removed, given away, deleted.
        image.set_xattr("/u/a", "user.one", b"small").unwrap();
        image.remove_xattr("/u/b", "user.same").unwrap();
        image.set_owner("/u/c", Some(2000), None).unwrap();
        image.remove_file("/u/d").unwrap();
        image.close().unwrap();
        common::assert_fsck_clean(&image_path);
        let users = list_quota(&image_path, "user");
        // a (with one value), b, and c's is 2000's now: 1 + 1 + 1.
        assert_eq!(usage_of(&users, 1000).1, 3, "{block_size}: {users:?}");
        assert_eq!(usage_of(&users, 2000).1, 2, "{block_size}: {users:?}");
    }
}

/// A large value takes an EA inode that counts for its owner, and so is
/// refused past the owner's inode limit (EDQUOT, nothing changed), as
/// ext4_xattr_inode_alloc_quota refuses it; a small value still goes in.
#[test]
fn a_large_value_past_the_inode_limit_is_edquot() {
    let dir = tempfile::tempdir().unwrap();
    let image_path = common::mkfs(
        dir.path(),
        "ea-limit",
        32,
        &["-t", "ext4", "-O", "quota,ea_inode", "-b", "4096"],
    );
    let root = enforcing(&image_path, false);
    root.write("/mine", b"data").unwrap();
    root.set_owner("/mine", Some(1000), Some(1000)).unwrap();
    root.fs()
        .set_quota_limits(QuotaType::User, 1000, hard(0, 2))
        .unwrap();
    let user = as_user(&root, 1000);
    user.set_xattr("/mine", "user.one", vec![1u8; 9000])
        .unwrap();
    assert_eq!(reported(&root, QuotaType::User, 1000).1, 2);
    assert_edquot(
        user.set_xattr("/mine", "user.two", vec![2u8; 9000]),
        "a second large value at the inode limit",
    );
    assert!(user.xattr("/mine", "user.two").unwrap().is_none());
    user.set_xattr("/mine", "user.small", b"small").unwrap();
    // Root is bound by none.
    root.set_xattr("/mine", "user.two", vec![2u8; 9000])
        .unwrap();
    assert_eq!(reported(&root, QuotaType::User, 1000).1, 3);
    drop(user);
    root.close().unwrap();
    common::assert_fsck_clean(&image_path);
}

/// `jext4 quota set` writes limits that debugfs reads back, a usage above
/// a new soft limit starts its grace time, and `jext4 quota report` shows
/// them with repquota -n's columns; an image without quotas is one line.
#[test]
fn limits_set_and_reported_by_the_quota_verb() {
    let dir = tempfile::tempdir().unwrap();
    let image_path = common::mkfs(dir.path(), "verb", 32, VARIANTS[0].1);
    let image = Image::open(&image_path).unwrap();
    image.write("/big", vec![3u8; 50_000]).unwrap();
    image.set_owner("/big", Some(1234), Some(55)).unwrap();
    image.close().unwrap();
    let image_arg = image_path.to_str().unwrap();
    let (code, _, stderr) = jext4_tool(&[
        "quota", "set", "-u", image_arg, "1234", "10", "100", "0", "7",
    ]);
    assert_eq!(code, 0, "{stderr}");
    let (code, _, stderr) =
        jext4_tool(&["quota", "set", "-g", image_arg, "99", "5", "6", "7", "8"]);
    assert_eq!(code, 0, "{stderr}");
    common::assert_fsck_clean(&image_path);
    let output = std::process::Command::new("debugfs")
        .args(["-R", "lq user", image_arg])
        .output()
        .unwrap();
    let listed = String::from_utf8_lossy(&output.stdout);
    let line = listed
        .lines()
        .find(|line| line.split_whitespace().next() == Some("1234"))
        .unwrap_or_else(|| panic!("uid 1234 in:\n{listed}"));
    let fields: Vec<&str> = line.split_whitespace().collect();
    // id, space (bytes), soft, hard, inodes, soft, hard.
    assert_eq!(fields[2..4], ["10", "100"], "{line}");
    assert_eq!(fields[4..7], ["1", "0", "7"], "{line}");
    let (code, report, stderr) = jext4_tool(&["quota", "report", image_arg]);
    assert_eq!(code, 0, "{stderr}");
    let line = report
        .lines()
        .find(|line| line.starts_with("#1234"))
        .unwrap_or_else(|| panic!("#1234 in:\n{report}"));
    let fields: Vec<&str> = line.split_whitespace().collect();
    // Over the soft limit: "+-", 13 blocks of 4 KiB used, a grace time
    // of 7 days.
    assert_eq!(
        fields[..6],
        ["#1234", "+-", "52", "10", "100", "7days"],
        "{report}"
    );
    let (_, groups, _) = jext4_tool(&["quota", "report", "-g", image_arg]);
    assert!(
        groups
            .lines()
            .any(|line| line.split_whitespace().collect::<Vec<_>>()
                == ["#99", "--", "0", "5", "6", "0", "7", "8"]),
        "{groups}"
    );
    let plain = common::mkfs(dir.path(), "plain", 16, &["-t", "ext4"]);
    let (code, _, stderr) = jext4_tool(&["quota", "report", plain.to_str().unwrap()]);
    assert_eq!(code, 1);
    assert!(stderr.contains("keeps no user quotas"), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
}

/// Project ids through a mount, with the tools users have: `chattr +P -p`
/// on a directory (FS_IOC_SETFLAGS, FS_IOC_FSSETXATTR), new entries
/// inheriting it, `xfs_io -c chproj` on a file, `lsattr -p`; a hard link
/// into the project is EXDEV and mv copies instead, as the kernel makes
/// them; a flag jext4 does not keep (+i) is EOPNOTSUPP; the filesystem
/// stays writable, and e2fsck agrees with the project usage.
#[test]
fn project_ids_through_a_mount() {
    if !fuse_available() || !common::require_tool("chattr") || !common::require_tool("xfs_io") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = common::mkfs(dir.path(), "project", 32, VARIANTS[0].1);
    let server = Server::start(&image, "");
    let root = server.mountpoint.clone();
    let run = |program: &str, args: &[&str]| {
        let output = std::process::Command::new(program)
            .args(args)
            .env("LC_ALL", "C")
            .output()
            .unwrap();
        (
            output.status.code().unwrap(),
            String::from_utf8_lossy(&output.stdout).into_owned(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    };
    let at = |name: &str| root.join(name).to_str().unwrap().to_string();
    std::fs::create_dir(root.join("proj")).unwrap();
    std::fs::write(root.join("outside"), b"outside").unwrap();
    let (code, _, stderr) = run("chattr", &["+P", "-p", "42", &at("proj")]);
    assert_eq!(code, 0, "chattr +P -p 42: {stderr}");
    std::fs::write(root.join("proj/inherits"), vec![5u8; 9000]).unwrap();
    std::fs::create_dir(root.join("proj/sub")).unwrap();
    std::fs::write(root.join("own"), b"own").unwrap();
    let (code, _, stderr) = run("xfs_io", &["-c", "chproj 7", &at("own")]);
    assert_eq!(code, 0, "xfs_io chproj: {stderr}");
    let (code, listing, stderr) = run("lsattr", &["-p", &at("proj")]);
    assert_eq!(code, 0, "{stderr}");
    let projects: Vec<(String, String)> = listing
        .lines()
        .map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            (
                fields[0].to_string(),
                fields[2].rsplit('/').next().unwrap().to_string(),
            )
        })
        .collect();
    assert!(
        projects.contains(&("42".into(), "inherits".into())),
        "{listing}"
    );
    assert!(projects.contains(&("42".into(), "sub".into())), "{listing}");
    let (_, own, _) = run("lsattr", &["-p", &at("own")]);
    assert!(own.trim_start().starts_with("7 "), "{own}");
    let linked = std::fs::hard_link(root.join("outside"), root.join("proj/linked"));
    assert_eq!(linked.unwrap_err().raw_os_error(), Some(libc::EXDEV));
    let (code, _, stderr) = run("mv", &[&at("outside"), &at("proj/")]);
    assert_eq!(code, 0, "mv into the project: {stderr}");
    // A flag jext4 does not keep (notail) is refused, not dropped.
    let (code, _, stderr) = run("chattr", &["+t", &at("own")]);
    assert_ne!(code, 0);
    assert!(stderr.contains("Operation not supported"), "{stderr}");
    std::fs::write(root.join("after"), b"still writable").unwrap();
    server.unmount();
    common::assert_fsck_clean(&image);
    let projects = list_quota(&image, "project");
    // proj, inherits, sub and the moved copy of outside; own is 7's.
    assert_eq!(usage_of(&projects, 42).1, 4, "{projects:?}");
    assert_eq!(usage_of(&projects, 7).1, 1, "{projects:?}");
}

use jext4::engine::format::quota::QuotaType;
use jext4::engine::fs::{Caller, QuotaLimits};
use std::io::Write;
use std::os::unix::fs::PermissionsExt;

/// `path` opened with every type's limits enforced (`-o
/// usrquota,grpquota,prjquota`).
/// `project`: the image keeps project quotas.
fn enforcing(path: &Path, project: bool) -> Image {
    Image::options()
        .quota_limits(true, true, project)
        .open(path)
        .unwrap()
}

/// `image`'s engine, its operations run as uid and gid `id` (not exempt
/// from limits: a library caller other than uid 0).
fn as_user(image: &Image, id: u32) -> Image {
    Image::from_fs(image.fs().clone(), Caller::new(id, id))
}

/// Space in KiB and inodes, hard limits only.
fn hard(space_kib: u64, inodes: u64) -> QuotaLimits {
    QuotaLimits {
        space_hard: space_kib,
        inode_hard: inodes,
        ..QuotaLimits::default()
    }
}

/// Write `total` bytes to `path` in 16 KiB writes until one fails: the
/// bytes written, and the error that stopped them.
fn write_until_refused(image: &Image, path: &str, total: usize) -> (u64, Option<std::io::Error>) {
    let mut file = image.create_file(path).unwrap();
    let mut written = 0u64;
    let chunk = vec![0x5au8; 16 * 1024];
    while (written as usize) < total {
        match file.write(&chunk) {
            Ok(0) => break,
            Ok(bytes) => written += bytes as u64,
            Err(error) => return (written, Some(error)),
        }
    }
    (written, None)
}

fn assert_edquot<T: std::fmt::Debug>(result: Result<T, impl Into<std::io::Error>>, what: &str) {
    match result {
        Ok(value) => panic!("{what}: want EDQUOT, got {value:?}"),
        Err(error) => {
            let error: std::io::Error = error.into();
            assert_eq!(error.raw_os_error(), Some(libc::EDQUOT), "{what}: {error}");
        }
    }
}

/// Hard limits as the kernel's check_bdq and check_idq hold them: a user's
/// writes stop at its space limit exactly (a short write, then EDQUOT),
/// its creates at its inode limit (files, directories, symlinks), and a
/// failed create leaves nothing behind; root is bound by no limit, and
/// the user can still delete when over. e2fsck agrees with the counts.
#[test]
fn hard_limits_stop_a_user_where_the_kernel_stops_it() {
    let dir = tempfile::tempdir().unwrap();
    for (name, args) in [VARIANTS[0], VARIANTS[1]] {
        let image_path = common::mkfs(dir.path(), &format!("hard-{name}"), 32, args);
        let root = enforcing(&image_path, name == "4k");
        root.create_dir("/home").unwrap();
        root.set_permissions("/home", PermissionsExt::from_mode(0o777))
            .unwrap();
        root.fs()
            .set_quota_limits(QuotaType::User, 1000, hard(200, 6))
            .unwrap();
        let user = as_user(&root, 1000);
        user.create_dir("/home/u").unwrap();
        let (written, error) = write_until_refused(&user, "/home/u/big", 1 << 20);
        assert_edquot(
            error.map_or(Ok(()), Err),
            &format!("{name}: writing past 200 KiB"),
        );
        let (bytes, inodes) = reported(&root, QuotaType::User, 1000);
        // Every byte of the limit used: the directory's block and the
        // file's blocks.
        assert_eq!(bytes, 200 * 1024, "{name}: uid 1000 after the write");
        assert_eq!(inodes, 2, "{name}");
        assert_eq!(user.metadata("/home/u/big").unwrap().len(), written);
        assert!(written > 150 * 1024, "{name}: {written}");
        // Creates: four more inodes, then EDQUOT for each kind.
        for index in 0..4 {
            user.write(format!("/home/u/small{index}"), b"").unwrap();
        }
        assert_edquot(user.write("/home/u/one-more", b""), "a seventh inode");
        assert_edquot(user.create_dir("/home/u/subdir"), "mkdir past the limit");
        assert_edquot(
            user.symlink("target", "/home/u/link"),
            "symlink past the limit",
        );
        assert!(!user.exists("/home/u/one-more"));
        // Root is bound by none, in the user's own directory too.
        root.write("/home/u/roots", vec![1u8; 64 * 1024]).unwrap();
        root.set_owner("/home/u/roots", Some(1000), None).unwrap();
        // Over the limit now: the user may still delete, and then write.
        assert_edquot(user.write("/home/u/small0", b"x"), "writing over the limit");
        user.remove_file("/home/u/big").unwrap();
        user.remove_file("/home/u/roots").unwrap();
        user.write("/home/u/again", vec![2u8; 8192]).unwrap();
        drop(user);
        root.close().unwrap();
        common::assert_fsck_clean(&image_path);
        let users = list_quota(&image_path, "user");
        assert_eq!(usage_of(&users, 1000).1, 6, "{name}: {users:?}");
    }
}

/// What the open image's quota file says of `id`: (bytes, inodes).
fn reported(image: &Image, qtype: QuotaType, id: u32) -> (u64, u64) {
    let report = image.fs().quota_report(qtype).unwrap();
    report
        .entries
        .iter()
        .find(|entry| entry.id == id)
        .map_or((0, 0), |entry| (entry.space, entry.inodes))
}

/// Soft limits with a grace time, as check_bdq keeps them: past the soft
/// limit while the grace time runs, refused once it ran out (but up to
/// the soft limit), the grace time ended by coming back within it; the
/// grace time set with `jext4 quota grace` and reported by `quota report`.
#[test]
fn soft_limits_hold_once_the_grace_time_ran_out() {
    let dir = tempfile::tempdir().unwrap();
    let image_path = common::mkfs(dir.path(), "soft", 32, VARIANTS[0].1);
    let image_arg = image_path.to_str().unwrap();
    let (code, _, stderr) = jext4_tool(&["quota", "grace", "-u", image_arg, "2", "2"]);
    assert_eq!(code, 0, "{stderr}");
    let (code, _, stderr) =
        jext4_tool(&["quota", "set", "-u", image_arg, "2000", "64", "0", "3", "0"]);
    assert_eq!(code, 0, "{stderr}");
    let root = enforcing(&image_path, true);
    let report = root.fs().quota_report(QuotaType::User).unwrap();
    assert_eq!((report.info.block_grace, report.info.inode_grace), (2, 2));
    root.create_dir("/u").unwrap();
    root.set_owner("/u", Some(2000), Some(2000)).unwrap();
    let user = as_user(&root, 2000);
    // Past both soft limits within the grace time: allowed.
    user.write("/u/a", vec![1u8; 100 * 1024]).unwrap();
    user.write("/u/b", b"").unwrap();
    user.write("/u/c", b"").unwrap();
    let entry = |image: &Image| {
        let report = image.fs().quota_report(QuotaType::User).unwrap();
        *report
            .entries
            .iter()
            .find(|entry| entry.id == 2000)
            .unwrap()
    };
    let started = entry(&root);
    assert!(
        started.block_time > 0 && started.inode_time > 0,
        "{started:?}"
    );
    std::thread::sleep(std::time::Duration::from_millis(3100));
    // The grace time ran out: no block and no inode more.
    let mut file = user
        .open_with("/u/b", jext4::OpenOptions::new().write(true))
        .unwrap();
    assert_edquot(file.write(b"x"), "a block past an expired soft limit");
    drop(file);
    assert_edquot(
        user.write("/u/d", b""),
        "an inode past an expired soft limit",
    );
    // Back within the soft limits: the grace times end, and writes go
    // up to the soft limit.
    user.remove_file("/u/c").unwrap();
    let file = user
        .open_with("/u/a", jext4::OpenOptions::new().write(true))
        .unwrap();
    file.set_len(8 * 1024).unwrap();
    drop(file);
    let within = entry(&root);
    assert_eq!((within.block_time, within.inode_time), (0, 0), "{within:?}");
    user.write("/u/b", vec![2u8; 40 * 1024]).unwrap();
    drop(user);
    root.close().unwrap();
    common::assert_fsck_clean(&image_path);
    let (code, report, stderr) = jext4_tool(&["quota", "report", image_arg]);
    assert_eq!(code, 0, "{stderr}");
    assert!(
        report.contains("Block grace time: 2seconds; Inode grace time: 2seconds"),
        "{report}"
    );
}

/// Project quotas, the container runtimes' directory-tree limit: a tree
/// given a project (+P) stops taking data at the project's limit whoever
/// writes it, and a file moved into the project by its owner
/// (FS_IOC_FSSETXATTR) must fit (dquot_transfer); so must a file given to
/// a group by chgrp.
#[test]
fn project_and_group_limits_hold_for_the_tree_and_transfers() {
    let dir = tempfile::tempdir().unwrap();
    let image_path = common::mkfs(dir.path(), "project-limit", 32, VARIANTS[0].1);
    let root = enforcing(&image_path, true);
    root.create_dir("/tree").unwrap();
    root.set_owner("/tree", Some(1000), Some(1000)).unwrap();
    let tree = root.metadata("/tree").unwrap().ino() as u32;
    root.fs()
        .set_fs_xattr(tree, 0x200, 42, Caller::ROOT)
        .unwrap();
    root.fs()
        .set_quota_limits(QuotaType::Project, 42, hard(128, 0))
        .unwrap();
    let user = as_user(&root, 1000);
    user.create_dir("/tree/sub").unwrap();
    let (written, error) = write_until_refused(&user, "/tree/sub/data", 1 << 20);
    assert_edquot(
        error.map_or(Ok(()), Err),
        "writing past the project's limit",
    );
    // The tree's two directories and the data: 128 KiB.
    assert_eq!(written, 128 * 1024 - 2 * 4096);
    assert_eq!(reported(&root, QuotaType::Project, 42).0, 128 * 1024);
    // A file of the user's own, outside the tree, cannot join the project.
    root.write("/outside", vec![3u8; 8192]).unwrap();
    root.set_owner("/outside", Some(1000), Some(1000)).unwrap();
    let outside = root.metadata("/outside").unwrap().ino() as u32;
    let user_caller = Caller::new(1000, 1000);
    assert_edquot(
        root.fs().set_fs_xattr(outside, 0, 42, user_caller),
        "moving a file into a full project",
    );
    assert_eq!(root.fs().fs_xattr(outside).unwrap().1, 0);
    // chgrp to a group at its limit: refused, and nothing changed.
    root.fs()
        .set_quota_limits(QuotaType::Group, 77, hard(4, 0))
        .unwrap();
    assert_edquot(
        user.set_owner("/outside", None, Some(77)),
        "chgrp to a group over its limit",
    );
    assert_eq!(root.metadata("/outside").unwrap().gid(), 1000);
    root.set_owner("/outside", None, Some(77)).unwrap();
    drop(user);
    root.close().unwrap();
    common::assert_fsck_clean(&image_path);
}

/// Writers of one user on several threads together stop at its limit:
/// what each was granted and has not yet added to the quota file counts
/// for the others (the kernel's reserved space).
#[test]
fn concurrent_writers_of_one_user_stay_within_its_limit() {
    let dir = tempfile::tempdir().unwrap();
    let image_path = common::mkfs(dir.path(), "concurrent", 64, VARIANTS[0].1);
    let root = enforcing(&image_path, true);
    root.create_dir("/u").unwrap();
    root.set_owner("/u", Some(1000), Some(1000)).unwrap();
    root.fs()
        .set_quota_limits(QuotaType::User, 1000, hard(2048, 0))
        .unwrap();
    let user = as_user(&root, 1000);
    let totals: Vec<u64> = std::thread::scope(|scope| {
        let writers: Vec<_> = (0..4)
            .map(|index| {
                let user = &user;
                scope.spawn(move || {
                    let (written, error) =
                        write_until_refused(user, &format!("/u/w{index}"), 8 << 20);
                    assert_edquot(error.map_or(Ok(()), Err), "a writer");
                    written
                })
            })
            .collect();
        writers
            .into_iter()
            .map(|writer| writer.join().unwrap())
            .collect()
    });
    let (bytes, _) = reported(&root, QuotaType::User, 1000);
    assert!(bytes <= 2048 * 1024, "over the limit: {bytes}");
    // Within a few blocks of it (each writer's last grant may be cut).
    assert!(bytes > 2000 * 1024, "stopped early: {bytes} ({totals:?})");
    drop(user);
    root.close().unwrap();
    common::assert_fsck_clean(&image_path);
}

/// Through a mount, as a user (setpriv): `dd` stops with "Disk quota
/// exceeded", and root's writes go on.
#[test]
fn edquot_through_a_mount() {
    if !fuse_available() || !common::require_tool("setpriv") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = common::mkfs(dir.path(), "mounted", 32, VARIANTS[0].1);
    let (code, _, stderr) = jext4_tool(&[
        "quota",
        "set",
        "-u",
        image.to_str().unwrap(),
        "65534",
        "0",
        "256",
        "0",
        "0",
    ]);
    assert_eq!(code, 0, "{stderr}");
    let server = Server::start(&image, "allow_other,usrquota");
    let root = server.mountpoint.clone();
    std::fs::create_dir(root.join("nobody")).unwrap();
    std::os::unix::fs::chown(root.join("nobody"), Some(65534), Some(65534)).unwrap();
    let target = root.join("nobody/fill");
    let output = std::process::Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "dd"])
        .arg("if=/dev/zero")
        .arg(format!("of={}", target.display()))
        .args(["bs=64k", "count=64"])
        .env("LC_ALL", "C")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "dd as nobody was not stopped");
    assert!(stderr.contains("Disk quota exceeded"), "{stderr}");
    let size = std::fs::metadata(&target).unwrap().len();
    assert_eq!(size, 256 * 1024 - 4096, "nobody's file");
    std::fs::write(root.join("nobody/roots"), vec![0u8; 512 * 1024]).unwrap();
    server.unmount();
    common::assert_fsck_clean(&image);
}

/// As in the kernel, limits hold only where the mount asks for them
/// (usrquota, grpquota, prjquota; `quota` is usrquota): without, usage is
/// kept and nothing is refused. prjquota without project quotas is
/// refused, as the kernel refuses it.
#[test]
fn limits_hold_only_where_the_mount_asks() {
    let dir = tempfile::tempdir().unwrap();
    let image_path = common::mkfs(dir.path(), "options", 32, VARIANTS[0].1);
    let root = Image::open(&image_path).unwrap();
    root.create_dir("/u").unwrap();
    root.set_owner("/u", Some(1000), Some(1000)).unwrap();
    root.fs()
        .set_quota_limits(QuotaType::User, 1000, hard(16, 0))
        .unwrap();
    root.fs()
        .set_quota_limits(QuotaType::Group, 1000, hard(16, 0))
        .unwrap();
    let user = as_user(&root, 1000);
    user.write("/u/free", vec![1u8; 64 * 1024]).unwrap();
    drop(user);
    root.close().unwrap();
    // Group limits enforced alone: the group's limit holds.
    let group_only = Image::options()
        .quota_limits(false, true, false)
        .open(&image_path)
        .unwrap();
    let user = as_user(&group_only, 1000);
    assert_edquot(user.write("/u/more", vec![1u8; 4096]), "grpquota");
    drop(user);
    group_only.close().unwrap();
    common::assert_fsck_clean(&image_path);
    let plain = common::mkfs(dir.path(), "no-project", 16, VARIANTS[1].1);
    let refused = Image::options()
        .quota_limits(false, false, true)
        .open(&plain)
        .map(|_| ())
        .unwrap_err();
    assert_eq!(refused.raw_os_error(), Some(libc::EINVAL));
    assert!(
        refused.to_string().contains("no project quotas"),
        "{refused}"
    );
}

/// `df` of a project directory (+P) on a prjquota mount shows its
/// project's limits, as ext4_statfs_project reports them: the blocks and
/// inodes the limits allow, less what the project uses; the root shows
/// the filesystem's. With the project's limit reached, a write there is
/// EDQUOT while root's directory still takes data.
#[test]
fn statfs_of_a_project_directory_shows_its_limits() {
    if !fuse_available() || !common::require_tool("chattr") || !common::require_tool("setpriv") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = common::mkfs(dir.path(), "df", 32, VARIANTS[0].1);
    let (code, _, stderr) = jext4_tool(&[
        "quota",
        "set",
        "-P",
        image.to_str().unwrap(),
        "42",
        "0",
        "1024",
        "0",
        "100",
    ]);
    assert_eq!(code, 0, "{stderr}");
    let server = Server::start(&image, "prjquota,allow_other");
    let root = server.mountpoint.clone();
    std::fs::create_dir(root.join("proj")).unwrap();
    let status = std::process::Command::new("chattr")
        .args(["+P", "-p", "42"])
        .arg(root.join("proj"))
        .status()
        .unwrap();
    assert!(status.success());
    std::fs::write(root.join("proj/data"), vec![7u8; 100 * 1024]).unwrap();
    let statvfs = |path: &Path| {
        let path = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
        let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
        assert_eq!(unsafe { libc::statvfs(path.as_ptr(), &mut stat) }, 0);
        (
            stat.f_blocks,
            stat.f_bfree,
            stat.f_bavail,
            stat.f_files,
            stat.f_ffree,
        )
    };
    // 1024 KiB of 4 KiB blocks; the directory and 25 data blocks used;
    // 100 inodes, two used.
    assert_eq!(statvfs(&root.join("proj")), (256, 230, 230, 100, 98));
    let whole = statvfs(&root);
    assert!(whole.0 > 6000 && whole.3 > 8000, "{whole:?}");
    // A user fills the project (root would be bound by no limit).
    std::os::unix::fs::chown(root.join("proj"), Some(65534), Some(65534)).unwrap();
    let output = std::process::Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "dd"])
        .arg("if=/dev/zero")
        .arg(format!("of={}", root.join("proj/more").display()))
        .args(["bs=64k", "count=64"])
        .env("LC_ALL", "C")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("Disk quota exceeded"), "{stderr}");
    assert_eq!(statvfs(&root.join("proj")).1, 0);
    std::fs::write(root.join("elsewhere"), vec![9u8; 1 << 20]).unwrap();
    server.unmount();
    common::assert_fsck_clean(&image);
}

/// `jext4 quota set|grace|report MOUNTPOINT`: the same requests through
/// the mount's server (FUSE passes no quotactl), allowed to CAP_SYS_ADMIN
/// as quotactl is: a limit set on the mount binds at once (usrquota), the
/// report shows it; a user is refused with EPERM; a directory not on a
/// jext4 mount is named as such.
#[test]
fn quota_verbs_on_a_mount() {
    if !fuse_available() || !common::require_tool("setpriv") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = common::mkfs(dir.path(), "verbs-mounted", 32, VARIANTS[0].1);
    let server = Server::start(&image, "allow_other,usrquota");
    let root = server.mountpoint.clone();
    let at = root.to_str().unwrap();
    std::fs::create_dir(root.join("nobody")).unwrap();
    std::os::unix::fs::chown(root.join("nobody"), Some(65534), Some(65534)).unwrap();
    let (code, _, stderr) = jext4_tool(&["quota", "set", "-u", at, "65534", "0", "64", "0", "10"]);
    assert_eq!(code, 0, "{stderr}");
    let (code, _, stderr) = jext4_tool(&["quota", "grace", "-u", at, "3600", "60"]);
    assert_eq!(code, 0, "{stderr}");
    let output = std::process::Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "dd"])
        .arg("if=/dev/zero")
        .arg(format!("of={}", root.join("nobody/fill").display()))
        .args(["bs=64k", "count=4"])
        .env("LC_ALL", "C")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("Disk quota exceeded"), "{stderr}");
    let (code, report, stderr) = jext4_tool(&["quota", "report", at]);
    assert_eq!(code, 0, "{stderr}");
    assert!(
        report.contains("Block grace time: 1hours; Inode grace time: 60seconds"),
        "{report}"
    );
    let line = report
        .lines()
        .find(|line| line.starts_with("#65534"))
        .unwrap_or_else(|| panic!("#65534 in:\n{report}"));
    let fields: Vec<&str> = line.split_whitespace().collect();
    // The directory and the file: 64 KiB, the hard limit; two inodes.
    assert_eq!(
        fields,
        ["#65534", "--", "64", "0", "64", "2", "0", "10"],
        "{report}"
    );
    // quotactl's permission: CAP_SYS_ADMIN.
    let output = std::process::Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(env!("CARGO_BIN_EXE_jext4"))
        .args(["quota", "report", at])
        .env("LC_ALL", "C")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1));
    assert!(stderr.contains("Operation not permitted"), "{stderr}");
    let elsewhere = dir.path().to_str().unwrap();
    let (code, _, stderr) = jext4_tool(&["quota", "report", elsewhere]);
    assert_eq!(code, 1);
    assert!(stderr.contains("not on a jext4 mount"), "{stderr}");
    server.unmount();
    common::assert_fsck_clean(&image);
}
