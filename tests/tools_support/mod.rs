//! Shared by the image-tool tests: a tree with every kind of entry the
//! tools must keep, a snapshot of a tree as the kernel reports it (what two
//! trees are compared by), and `jext4` runs that may fail.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// `jext4 ARGS`, standard input empty: (exit code, stdout, stderr).
pub fn jext4_tool(args: &[&str]) -> (i32, String, String) {
    jext4_with_input(args, b"")
}

/// `jext4 ARGS` with `input` on standard input.
pub fn jext4_with_input(args: &[&str], input: &[u8]) -> (i32, String, String) {
    let (code, stdout, stderr) = jext4_bytes(args, input);
    (code, String::from_utf8_lossy(&stdout).into_owned(), stderr)
}

/// `jext4 ARGS` with `input` on standard input, standard output as bytes.
pub fn jext4_bytes(args: &[&str], input: &[u8]) -> (i32, Vec<u8>, String) {
    use std::io::Write;
    let mut child = Command::new(env!("CARGO_BIN_EXE_jext4"))
        .args(args)
        .env_remove("SOURCE_DATE_EPOCH")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(input).unwrap();
    let output = child.wait_with_output().unwrap();
    (
        output.status.code().unwrap_or(-1),
        output.stdout,
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

fn run(program: &str, args: &[&OsStr]) {
    let status = Command::new(program).args(args).status().unwrap();
    assert!(status.success(), "{program} {args:?}");
}

/// A file capability (security.capability, VFS_CAP_REVISION_2):
/// cap_net_bind_service permitted and effective.
const CAPABILITY: [u8; 20] = [1, 0, 0, 2, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];

/// Build, at `root`, a tree with every kind of entry `cp -a` keeps: set-id
/// and sticky modes, other owners, hard links across directories,
/// symlinks (short, long, dangling), character and block devices (large
/// numbers too), a FIFO, sparse files, empty and multi-megabyte files,
/// xattrs of every namespace, a file capability, access and default
/// ACLs, odd names, a directory big enough for an htree, a deep chain.
/// Times are settled last (`settle_times`).
pub fn build_tree(root: &Path) {
    let p = |rel: &str| root.join(rel);
    for dir in ["dir/sub", "sticky", "setgid", "links", "big", "acl"] {
        std::fs::create_dir_all(p(dir)).unwrap();
    }
    let mut deep = p("deep");
    for level in 0..24 {
        deep = deep.join(format!("level{level}"));
    }
    std::fs::create_dir_all(&deep).unwrap();
    std::fs::write(deep.join("bottom"), b"bottom\n").unwrap();
    std::fs::write(p("empty"), b"").unwrap();
    std::fs::write(p("small"), b"hello, image\n").unwrap();
    let pattern: Vec<u8> = (0..(2 << 20) + 777).map(|i: u32| (i % 251) as u8).collect();
    std::fs::write(p("dir/two-megabytes"), &pattern).unwrap();
    std::fs::write(p("setuid"), b"#!/bin/sh\n").unwrap();
    set_mode(&p("setuid"), 0o4755);
    std::fs::write(p("setgid/file"), b"g").unwrap();
    set_mode(&p("setgid/file"), 0o2711);
    set_mode(&p("setgid"), 0o2775);
    set_mode(&p("sticky"), 0o1777);
    std::fs::write(p("links/first"), b"one inode, three names\n").unwrap();
    std::fs::hard_link(p("links/first"), p("links/second")).unwrap();
    std::fs::hard_link(p("links/first"), p("dir/sub/third")).unwrap();
    std::os::unix::fs::symlink("../small", p("dir/up")).unwrap();
    std::os::unix::fs::symlink("/nowhere/at/all", p("dangling")).unwrap();
    let long_target = "x/".repeat(100) + "end";
    std::os::unix::fs::symlink(&long_target, p("long-link")).unwrap();
    make_node(&p("null"), libc::S_IFCHR | 0o666, libc::makedev(1, 3));
    make_node(&p("loop"), libc::S_IFBLK | 0o660, libc::makedev(7, 0));
    make_node(
        &p("big-numbers"),
        libc::S_IFCHR | 0o600,
        libc::makedev(300, 70_000),
    );
    make_node(&p("fifo"), libc::S_IFIFO | 0o644, 0);
    sparse(&p("sparse"), &[(0, 4096), (1 << 20, 8192)], 3 << 20);
    sparse(&p("all-hole"), &[], 5 << 20);
    for index in 0..300 {
        std::fs::write(
            p("big").join(format!("entry-with-a-longish-name-{index:04}")),
            [index as u8],
        )
        .unwrap();
    }
    let odd = root.join(OsStr::from_bytes(b"odd name \xff\xfe"));
    std::fs::write(&odd, b"not UTF-8").unwrap();
    std::fs::write(root.join("n".repeat(255)), b"longest name").unwrap();
    set_xattr(&p("small"), "user.comment", b"a user attribute");
    set_xattr(&p("small"), "user.empty", b"");
    set_xattr(&p("small"), "trusted.overlay", b"y");
    set_xattr(&p("dir"), "user.on-a-directory", &[0, 1, 2, 255]);
    set_xattr(&p("setuid"), "security.capability", &CAPABILITY);
    set_xattr(&p("links/first"), "user.shared", b"by all names");
    std::fs::write(p("acl/file"), b"acl").unwrap();
    run(
        "setfacl",
        &[
            "-m".as_ref(),
            "u:1001:rw-,g:1002:r--".as_ref(),
            p("acl/file").as_os_str(),
        ],
    );
    run(
        "setfacl",
        &[
            "-d".as_ref(),
            "-m".as_ref(),
            "u:1003:r-x".as_ref(),
            p("acl").as_os_str(),
        ],
    );
    // Made after the default ACL: it inherits an access ACL.
    std::fs::write(p("acl/inherited"), b"inherits").unwrap();
    lchown(&p("dir/sub"), 1234, 5678);
    lchown(&p("small"), 1000, 100);
    lchown(&p("dir/up"), 4321, 8765);
    lchown(&p("fifo"), 65534, 65534);
    settle_times(root);
}

/// Give every entry under `root` its own modification time (within the
/// last hour, distinct nanoseconds) and an access time an hour ahead,
/// deepest first: with atime after mtime and ctime (which this sets to
/// now) and less than a day old, relatime leaves atimes alone while both
/// trees are read, so they can be compared.
pub fn settle_times(root: &Path) {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let mut entries = walk(root);
    entries.reverse();
    for (index, path) in entries.iter().enumerate() {
        let mtime = (
            now - 3600 + index as i64 % 1000,
            (index as i64 * 7_919 % 1_000_000_000) as u32,
        );
        jext4::engine::tools::host::set_times(path, (mtime.0 + 7200, mtime.1), mtime).unwrap();
    }
}

fn set_mode(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

fn make_node(path: &Path, mode: u32, rdev: libc::dev_t) {
    jext4::engine::tools::host::mknod(path, mode, rdev).unwrap();
}

fn lchown(path: &Path, uid: u32, gid: u32) {
    jext4::engine::tools::host::lchown(path, uid, gid).unwrap();
}

fn set_xattr(path: &Path, name: &str, value: &[u8]) {
    jext4::engine::tools::host::set_xattr(path, name.as_bytes(), value)
        .unwrap_or_else(|e| panic!("setxattr {name} on {}: {e}", path.display()));
}

/// A file of `size` bytes with data only in `ranges` (offset, length).
fn sparse(path: &Path, ranges: &[(u64, usize)], size: u64) {
    use std::os::unix::fs::FileExt;
    let file = std::fs::File::create(path).unwrap();
    for &(offset, length) in ranges {
        let bytes: Vec<u8> = (0..length).map(|i| (i % 200 + 1) as u8).collect();
        file.write_all_at(&bytes, offset).unwrap();
    }
    file.set_len(size).unwrap();
}

/// Every path under `root` (itself included), parents before children.
pub fn walk(root: &Path) -> Vec<PathBuf> {
    let mut found = vec![root.to_path_buf()];
    let mut next = 0;
    while next < found.len() {
        let path = found[next].clone();
        next += 1;
        if std::fs::symlink_metadata(&path).unwrap().is_dir() {
            let mut children: Vec<PathBuf> = std::fs::read_dir(&path)
                .unwrap()
                .map(|e| e.unwrap().path())
                .collect();
            children.sort();
            found.extend(children);
        }
    }
    found
}

/// What the kernel says of one entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub kind: &'static str,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    /// Regular files and symlinks (directories' sizes are the
    /// filesystem's business).
    pub size: u64,
    pub mtime: (i64, i64),
    pub atime: (i64, i64),
    pub nlink: u64,
    pub rdev: (u32, u32),
    /// FNV-1a of the contents, or the link target.
    pub content: u64,
    /// Where the data is (SEEK_DATA/SEEK_HOLE): holes must stay holes.
    pub data_ranges: Vec<(u64, u64)>,
    pub xattrs: Vec<(Vec<u8>, Vec<u8>)>,
    /// The first name (in walk order) of the entry's inode: hard-link groups.
    pub link_group: String,
}

/// Every entry under `root` by its path relative to it.
pub fn snapshot(root: &Path) -> BTreeMap<String, Record> {
    let mut first_names: BTreeMap<(u64, u64), String> = BTreeMap::new();
    let mut records = BTreeMap::new();
    for path in walk(root) {
        let meta = std::fs::symlink_metadata(&path).unwrap();
        let rel = path
            .strip_prefix(root)
            .unwrap()
            .to_string_lossy()
            .into_owned();
        let kind = meta.file_type();
        let kind_name = if kind.is_dir() {
            "directory"
        } else if kind.is_file() {
            "file"
        } else if kind.is_symlink() {
            "symlink"
        } else {
            use std::os::unix::fs::FileTypeExt;
            match (
                kind.is_char_device(),
                kind.is_block_device(),
                kind.is_fifo(),
            ) {
                (true, _, _) => "char device",
                (_, true, _) => "block device",
                (_, _, true) => "fifo",
                _ => "socket",
            }
        };
        let (content, data_ranges) = match kind_name {
            "file" => {
                let file = std::fs::File::open(&path).unwrap();
                let ranges = jext4::engine::tools::host::data_ranges(&file, meta.len()).unwrap();
                (fnv(&std::fs::read(&path).unwrap()), ranges)
            }
            "symlink" => (
                fnv(std::fs::read_link(&path).unwrap().as_os_str().as_bytes()),
                vec![],
            ),
            _ => (0, vec![]),
        };
        let group = first_names
            .entry((meta.dev(), meta.ino()))
            .or_insert_with(|| rel.clone())
            .clone();
        let mut xattrs = jext4::engine::tools::host::xattrs(&path).unwrap();
        xattrs.sort();
        records.insert(
            rel,
            Record {
                kind: kind_name,
                mode: meta.mode() & 0o7777,
                uid: meta.uid(),
                gid: meta.gid(),
                size: if kind.is_dir() { 0 } else { meta.len() },
                mtime: (meta.mtime(), meta.mtime_nsec()),
                atime: (meta.atime(), meta.atime_nsec()),
                nlink: meta.nlink(),
                rdev: (libc::major(meta.rdev()), libc::minor(meta.rdev())),
                content,
                data_ranges,
                xattrs,
                link_group: if kind.is_dir() { String::new() } else { group },
            },
        );
    }
    records
}

fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |hash, &b| {
        (hash ^ b as u64).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The two snapshots are equal; otherwise the first differences, named.
pub fn assert_same(expected: &BTreeMap<String, Record>, found: &BTreeMap<String, Record>) {
    let mut differences = Vec::new();
    for (path, record) in expected {
        match found.get(path) {
            None => differences.push(format!("{path}: missing")),
            Some(other) if other != record => differences.push(format!(
                "{path}:\n  expected {record:?}\n  found    {other:?}"
            )),
            Some(_) => {}
        }
    }
    for path in found.keys().filter(|path| !expected.contains_key(*path)) {
        differences.push(format!("{path}: not in the source"));
    }
    assert!(
        differences.is_empty(),
        "{} of {} entries differ:\n{}",
        differences.len(),
        expected.len(),
        differences
            .iter()
            .take(12)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
}

/// The snapshot with access times left out: for trees that GNU tar
/// extracted, which sets atimes to the time of extraction whatever the
/// archive holds.
pub fn without_atimes(mut records: BTreeMap<String, Record>) -> BTreeMap<String, Record> {
    for record in records.values_mut() {
        record.atime = (0, 0);
    }
    records
}
