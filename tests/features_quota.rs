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
//! - quota with ea_inode (whose EA inodes jext4 does not charge yet)
//!   mounts read-only, saying so.

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

#[test]
fn quota_with_ea_inode_mounts_read_only() {
    let dir = tempfile::tempdir().unwrap();
    let image_path = common::mkfs(
        dir.path(),
        "ea",
        32,
        &["-t", "ext4", "-O", "quota,ea_inode"],
    );
    let refused = Image::open(&image_path).map(|_| ()).unwrap_err();
    assert!(
        refused.to_string().contains("quota (with ea_inode)"),
        "{refused}"
    );
    let image = Image::open_read_only(&image_path).unwrap();
    assert!(image.read_dir("/").unwrap().count() > 0);
    image.close().unwrap();
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
    let (code, _, stderr) = run("chattr", &["+i", &at("own")]);
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
