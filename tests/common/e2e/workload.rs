//! The mixed workload every image variant runs (renames, links, symlinks,
//! sparse files, deep extents, truncates, open-unlinked files, attributes,
//! xattrs and ACLs, special nodes, a big directory, a real tree), and the
//! check of what it must leave.

use super::*;

/// What the workload knows about the filesystem it runs on.
#[derive(Debug, Clone, Copy)]
pub struct Params {
    pub block_size: u64,
    /// Files map their blocks with extents (fallocate, punch, deep trees).
    pub extents: bool,
    /// Entries of the big directory (a third are deleted again).
    pub big_dir_entries: usize,
}

/// A content the workload promises, checked by reading it back.
#[derive(Debug, Clone)]
pub enum Expect {
    Exact {
        path: String,
        data: Vec<u8>,
    },
    /// Data at given offsets, zeros between them, and a size.
    Sparse {
        path: String,
        size: u64,
        data: Vec<(u64, Vec<u8>)>,
    },
}

/// What the workload leaves for the caller: promised contents and files
/// kept open after their last name went (release them by dropping).
pub struct Outcome {
    pub expect: Vec<Expect>,
    pub held: Vec<fs::File>,
}

/// The deep-extent file: one block at every other block, enough of them
/// that four leaves under the inode cannot hold the extents (depth ≥ 2).
pub fn deep_file_blocks(block_size: u64) -> u64 {
    let per_leaf = (block_size - 12) / 12;
    4 * per_leaf + 64
}

/// Every kind of object and change issue 2 lists, under `root/ops`, plus
/// renames, attribute changes and a removal inside the real tree at
/// `root/tree` when it exists.
pub fn workload(root: &Path, params: &Params) -> Outcome {
    let ops = root.join("ops");
    fs::create_dir_all(&ops).expect("mkdir ops");
    let mut outcome = Outcome {
        expect: Vec::new(),
        held: Vec::new(),
    };
    renames(&ops, &mut outcome.expect);
    links(&ops);
    symlinks(&ops, params.block_size);
    sparse_files(&ops, params, &mut outcome.expect);
    deep_extents(&ops, params.block_size, &mut outcome.expect);
    truncates(&ops, params.block_size, &mut outcome.expect);
    open_unlinked(&ops, &mut outcome);
    attributes(&ops);
    extended_attributes(&ops, params.block_size);
    special_nodes(&ops);
    big_directory(&ops.join("bigdir"), params.big_dir_entries);
    if root.join("tree").is_dir() {
        real_tree_changes(&root.join("tree"));
    }
    reuse_freed_space(&ops, &mut outcome.expect);
    outcome
}

/// New files right after deletions take the blocks just freed (first fit
/// near their inode): nothing stale may land on them later.
fn reuse_freed_space(ops: &Path, expect: &mut Vec<Expect>) {
    let dir = ops.join("after-rm");
    fs::create_dir(&dir).unwrap();
    for i in 0..300u64 {
        let path = dir.join(format!("f{i}"));
        let data = pattern(2000 + i, 500 + (37 * i as usize) % 3000);
        write_file(&path, &data);
        expect_exact(expect, ops, &path, data);
    }
}

fn write_file(path: &Path, data: &[u8]) {
    fs::write(path, data).unwrap_or_else(|error| panic!("writing {}: {error}", path.display()));
}

fn expect_exact(expect: &mut Vec<Expect>, ops: &Path, path: &Path, data: Vec<u8>) {
    let relative = path.strip_prefix(ops.parent().unwrap()).unwrap();
    expect.push(Expect::Exact {
        path: relative.to_string_lossy().into_owned(),
        data,
    });
}

fn renames(ops: &Path, expect: &mut Vec<Expect>) {
    let (a, b) = (ops.join("ren/a"), ops.join("ren/b"));
    fs::create_dir_all(&a).unwrap();
    fs::create_dir_all(&b).unwrap();
    for i in 0..10u64 {
        write_file(
            &a.join(format!("f{i}")),
            &pattern(i, 1000 + 100 * i as usize),
        );
    }
    // Across directories.
    fs::rename(a.join("f1"), b.join("f1")).unwrap();
    // Over an existing file, in the same directory and across.
    fs::rename(a.join("f2"), a.join("f3")).unwrap();
    expect_exact(expect, ops, &a.join("f3"), pattern(2, 1200));
    write_file(&b.join("victim"), b"to be replaced");
    fs::rename(a.join("f4"), b.join("victim")).unwrap();
    expect_exact(expect, ops, &b.join("victim"), pattern(4, 1400));
    // A directory across directories (its ".." and both link counts change).
    fs::create_dir_all(a.join("sub/deeper")).unwrap();
    write_file(&a.join("sub/deeper/inner"), b"inner");
    fs::rename(a.join("sub"), b.join("sub")).unwrap();
    // A directory over an empty directory.
    fs::create_dir(a.join("empty_target")).unwrap();
    fs::create_dir(b.join("sub2")).unwrap();
    write_file(&b.join("sub2/content"), b"moved with its directory");
    fs::rename(b.join("sub2"), a.join("empty_target")).unwrap();
    // RENAME_EXCHANGE of a file and a directory in different directories.
    exchange(&a.join("f5"), &b.join("sub"));
    assert!(a.join("f5/deeper/inner").is_file());
    expect_exact(expect, ops, &b.join("sub"), pattern(5, 1500));
}

fn links(ops: &Path) {
    let dir = ops.join("links");
    fs::create_dir_all(&dir).unwrap();
    let original = ops.join("ren/b/f1");
    for name in ["l1", "l2", "l3"] {
        fs::hard_link(&original, dir.join(name)).unwrap();
    }
    fs::remove_file(dir.join("l2")).unwrap();
    assert_eq!(fs::metadata(&original).unwrap().nlink(), 3);
}

fn symlinks(ops: &Path, block_size: u64) {
    let dir = ops.join("sym");
    fs::create_dir_all(&dir).unwrap();
    // Lengths around the 60-byte i_block boundary, and long ones (block
    // symlinks); ~1000 bytes still fits a 1 KiB block.
    let long_max = 1000.min(block_size as usize - 1);
    for length in [1usize, 30, 59, 60, 61, 200, long_max] {
        let target: String = (0..length)
            .map(|i| {
                if i % 10 == 9 {
                    '/'
                } else {
                    (b'a' + (i % 26) as u8) as char
                }
            })
            .collect();
        std::os::unix::fs::symlink(&target, dir.join(format!("len{length}"))).unwrap();
    }
    std::os::unix::fs::symlink("/usr/share/doc", dir.join("absolute")).unwrap();
    std::os::unix::fs::symlink("../ren/b/f1", dir.join("relative")).unwrap();
    std::os::unix::fs::symlink("nowhere/at/all", dir.join("dangling")).unwrap();
    assert_eq!(fs::read(dir.join("relative")).unwrap(), pattern(1, 1100));
}

fn sparse_files(ops: &Path, params: &Params, expect: &mut Vec<Expect>) {
    use std::os::unix::fs::FileExt;
    let dir = ops.join("sparse");
    fs::create_dir_all(&dir).unwrap();
    let middle = fs::File::create(dir.join("middle")).unwrap();
    middle.set_len(16 << 20).unwrap();
    let chunk = pattern(77, 10_000);
    middle.write_all_at(&chunk, (7 << 20) + 123).unwrap();
    expect.push(Expect::Sparse {
        path: "ops/sparse/middle".into(),
        size: 16 << 20,
        data: vec![((7 << 20) + 123, chunk)],
    });
    // Multi-GiB: data at 0 and beyond 2 GiB (large_file, and the
    // indirect tiers on block-mapped images).
    let huge = fs::File::create(dir.join("huge")).unwrap();
    let (head, far) = (pattern(78, 65536), pattern(79, 65536));
    let far_offset = (2u64 << 30) + (1 << 20) + 512;
    huge.write_all_at(&head, 0).unwrap();
    huge.write_all_at(&far, far_offset).unwrap();
    let huge_size = (3u64 << 30) + 12345;
    huge.set_len(huge_size).unwrap();
    expect.push(Expect::Sparse {
        path: "ops/sparse/huge".into(),
        size: huge_size,
        data: vec![(0, head), (far_offset, far)],
    });
    if params.extents {
        // Preallocated (unwritten) space, a write into it, a punched hole.
        let file = fs::File::create(dir.join("fallocated")).unwrap();
        fallocate(&file, 0, 0, 1 << 20);
        let inside = pattern(80, 5000);
        file.write_all_at(&inside, 300_000).unwrap();
        let full = pattern(81, 200_000);
        file.write_all_at(&full, 600_000).unwrap();
        fallocate(
            &file,
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            650_000,
            100_000,
        );
        let mut expected_full = full.clone();
        expected_full[50_000..150_000].fill(0);
        expect.push(Expect::Sparse {
            path: "ops/sparse/fallocated".into(),
            size: 1 << 20,
            data: vec![(300_000, inside), (600_000, expected_full)],
        });
    }
}

pub fn fallocate(file: &fs::File, mode: i32, offset: i64, length: i64) {
    // SAFETY: a descriptor we own.
    let result = unsafe { libc::fallocate(file.as_raw_fd(), mode, offset, length) };
    assert_eq!(result, 0, "fallocate: {}", std::io::Error::last_os_error());
}

fn deep_extents(ops: &Path, block_size: u64, expect: &mut Vec<Expect>) {
    use std::os::unix::fs::FileExt;
    let file = fs::File::create(ops.join("deep")).unwrap();
    let count = deep_file_blocks(block_size);
    let mut data = Vec::new();
    for i in 0..count {
        let block = pattern(1000 + i, block_size as usize);
        let offset = 2 * i * block_size;
        file.write_all_at(&block, offset).unwrap();
        data.push((offset, block));
    }
    expect.push(Expect::Sparse {
        path: "ops/deep".into(),
        size: (2 * count - 1) * block_size,
        data,
    });
}

fn truncates(ops: &Path, block_size: u64, expect: &mut Vec<Expect>) {
    use std::os::unix::fs::FileExt;
    let dir = ops.join("trunc");
    fs::create_dir_all(&dir).unwrap();
    // Down to an unaligned size, up again: the tail past the cut reads as zeros.
    let original = pattern(90, 300_000);
    write_file(&dir.join("a"), &original);
    let file = fs::OpenOptions::new()
        .write(true)
        .open(dir.join("a"))
        .unwrap();
    file.set_len(100_003).unwrap();
    assert_eq!(fs::read(dir.join("a")).unwrap(), original[..100_003]);
    file.set_len(250_000).unwrap();
    let tail = pattern(91, 1000);
    file.write_all_at(&tail, 400_000).unwrap();
    let mut expected = original[..100_003].to_vec();
    expected.resize(400_000, 0);
    expected.extend_from_slice(&tail);
    assert_eq!(fs::read(dir.join("a")).unwrap(), expected);
    expect_exact(expect, ops, &dir.join("a"), expected);
    // Block-aligned cut, then growth into a partial block.
    let bs = block_size as usize;
    let original = pattern(92, 5 * bs);
    write_file(&dir.join("b"), &original);
    let file = fs::OpenOptions::new()
        .write(true)
        .open(dir.join("b"))
        .unwrap();
    file.set_len(2 * block_size).unwrap();
    file.set_len(3 * block_size + 7).unwrap();
    let mut expected = original[..2 * bs].to_vec();
    expected.resize(3 * bs + 7, 0);
    expect_exact(expect, ops, &dir.join("b"), expected);
    // To zero and written again; O_TRUNC.
    write_file(&dir.join("c"), &pattern(93, 50_000));
    fs::OpenOptions::new()
        .write(true)
        .open(dir.join("c"))
        .unwrap()
        .set_len(0)
        .unwrap();
    write_file(&dir.join("c"), b"new content");
    expect_exact(expect, ops, &dir.join("c"), b"new content".to_vec());
    write_file(&dir.join("d"), &pattern(94, 70_000));
    write_file(&dir.join("d"), b"short");
    expect_exact(expect, ops, &dir.join("d"), b"short".to_vec());
}

fn open_unlinked(ops: &Path, outcome: &mut Outcome) {
    use std::os::unix::fs::FileExt;
    let path = ops.join("open_unlinked");
    let data = pattern(95, 200_000);
    write_file(&path, &data);
    let file = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .unwrap();
    fs::remove_file(&path).unwrap();
    assert!(!path.exists());
    let mut read_back = vec![0u8; data.len()];
    file.read_exact_at(&mut read_back, 0).unwrap();
    assert_eq!(read_back, data, "an unlinked open file reads back");
    file.write_all_at(b"still writable", 200_000).unwrap();
    assert_eq!(file.metadata().unwrap().nlink(), 0);
    outcome.held.push(file);
}

fn attributes(ops: &Path) {
    use std::os::unix::fs::{chown, lchown, symlink};
    let dir = ops.join("attrs");
    fs::create_dir_all(&dir).unwrap();
    write_file(&dir.join("file"), b"attributes");
    chown(dir.join("file"), Some(1234), Some(5678)).unwrap();
    set_mode(&dir.join("file"), 0o4751);
    set_times(
        &dir.join("file"),
        (1_234_567_890, 987_654_321),
        (1_234_567_890, 123_456_789),
    );
    fs::create_dir(dir.join("dir")).unwrap();
    chown(dir.join("dir"), Some(42), Some(43)).unwrap();
    set_mode(&dir.join("dir"), 0o2775);
    // After 2038 (the extra epoch bits), and before 1970.
    set_times(
        &dir.join("dir"),
        (4_000_000_000, 1),
        (4_000_000_000, 999_999_999),
    );
    write_file(&dir.join("old"), b"old");
    set_times(
        &dir.join("old"),
        (-123_456_789, 5),
        (-123_456_789, 500_000_000),
    );
    fs::create_dir(dir.join("sticky")).unwrap();
    set_mode(&dir.join("sticky"), 0o1777);
    symlink("file", dir.join("link")).unwrap();
    lchown(dir.join("link"), Some(7), Some(8)).unwrap();
    set_times(&dir.join("link"), (1_500_000_000, 1), (1_500_000_000, 2));
    // A setgid directory hands its group to what is created inside.
    chown(dir.join("dir"), Some(42), Some(500)).unwrap();
    set_mode(&dir.join("dir"), 0o2775);
    write_file(&dir.join("dir/child"), b"inherits the group");
    fs::create_dir(dir.join("dir/subdir")).unwrap();
    assert_eq!(fs::metadata(dir.join("dir/child")).unwrap().gid(), 500);
    set_times(
        &dir.join("dir"),
        (4_000_000_000, 1),
        (4_000_000_000, 999_999_999),
    );
}

fn extended_attributes(ops: &Path, block_size: u64) {
    let dir = ops.join("xattr");
    fs::create_dir_all(&dir).unwrap();
    set_xattr(&dir, "user.on_directory", b"d").unwrap();
    let small = dir.join("small");
    write_file(&small, b"x");
    set_xattr(&small, "user.a", b"1").unwrap();
    set_xattr(&small, "user.b", b"hello world").unwrap();
    set_xattr(&small, "trusted.t", &pattern(1, 20)).unwrap();
    set_xattr(&small, "security.s", b"label").unwrap();
    // Bigger than the inode body: spills into an xattr block.
    let big = dir.join("big");
    write_file(&big, b"x");
    set_xattr(&big, "user.big", &pattern(2, block_size as usize - 200)).unwrap();
    // Replaced with other sizes, removed.
    let changing = dir.join("changing");
    write_file(&changing, b"x");
    set_xattr(&changing, "user.v", &pattern(3, 10)).unwrap();
    set_xattr(&changing, "user.v", &pattern(4, 500)).unwrap();
    set_xattr(&changing, "user.v", &pattern(5, 5)).unwrap();
    set_xattr(&changing, "user.gone", b"soon").unwrap();
    remove_xattr(&changing, "user.gone").unwrap();
    let many = dir.join("many");
    write_file(&many, b"x");
    // Fits a 1 KiB block: 16 entries of 24 bytes and 240 bytes of values.
    for i in 0..16 {
        set_xattr(
            &many,
            &format!("user.key{i:02}"),
            &pattern(i, i as usize * 2),
        )
        .unwrap();
    }
    std::os::unix::fs::symlink("small", dir.join("link")).unwrap();
    set_xattr(&dir.join("link"), "trusted.on_link", b"l").unwrap();
    // POSIX ACLs (access and default), the same ACL on several files.
    for i in 0..4 {
        write_file(&dir.join(format!("acl{i}")), b"acl");
        run_ok(
            "setfacl",
            &[
                "-m",
                "u:1234:rwx,g:5678:r-x",
                path_str(&dir.join(format!("acl{i}"))),
            ],
        );
    }
    fs::create_dir(dir.join("acl_dir")).unwrap();
    run_ok(
        "setfacl",
        &[
            "-d",
            "-m",
            "u:1234:rx,g::r-x",
            path_str(&dir.join("acl_dir")),
        ],
    );
    run_ok("setfacl", &["-m", "u:99:r", path_str(&dir.join("acl_dir"))]);
    assert_eq!(get_xattr(&small, b"user.b").unwrap(), b"hello world");
}

fn special_nodes(ops: &Path) {
    let dir = ops.join("special");
    fs::create_dir_all(&dir).unwrap();
    mknod(&dir.join("fifo"), libc::S_IFIFO | 0o644, 0);
    mknod(&dir.join("socket"), libc::S_IFSOCK | 0o755, 0);
    mknod(
        &dir.join("null"),
        libc::S_IFCHR | 0o666,
        libc::makedev(1, 3),
    );
    mknod(
        &dir.join("loop200"),
        libc::S_IFBLK | 0o660,
        libc::makedev(7, 200),
    );
    // A device number that needs the new (large) encoding.
    mknod(
        &dir.join("big_dev"),
        libc::S_IFCHR | 0o600,
        libc::makedev(300, 70_000),
    );
}

/// `entries` files with names of varied lengths; every third deleted again.
pub fn big_directory(dir: &Path, entries: usize) {
    fs::create_dir_all(dir).unwrap();
    for i in 0..entries {
        fs::File::create(dir.join(big_dir_name(i))).unwrap();
    }
    for i in (0..entries).step_by(3) {
        fs::remove_file(dir.join(big_dir_name(i))).unwrap();
    }
}

pub fn big_dir_name(i: usize) -> String {
    let padding = "n".repeat(i % 47);
    if i % 500 == 7 {
        format!("{i:06}-{}", "L".repeat(240))
    } else {
        format!("{i:06}-{padding}")
    }
}

/// In the copied real tree: a directory moves into another, a file is
/// renamed over another, times with nanoseconds, a subtree removed.
fn real_tree_changes(tree: &Path) {
    let mut dirs: Vec<PathBuf> = fs::read_dir(tree)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| fs::symlink_metadata(p).unwrap().is_dir())
        .collect();
    dirs.sort();
    assert!(dirs.len() >= 4, "the real tree needs a few directories");
    let files: Vec<PathBuf> = snapshot(tree)
        .nodes
        .iter()
        .filter(|(_, node)| node.kind == Kind::File && node.nlink == 1)
        .map(|(path, _)| tree.join(path))
        .take(40)
        .collect();
    assert!(files.len() >= 4);
    fs::rename(&files[0], &files[1]).unwrap();
    for file in &files[2..10] {
        run_ok(
            "touch",
            &["-h", "-d", "2001-02-03 04:05:06.123456789", path_str(file)],
        );
    }
    let moved = dirs[1].join("moved-here");
    fs::rename(&dirs[0], &moved).unwrap();
    run_ok("chown", &["-R", "1000:1000", path_str(&moved)]);
    run_ok("rm", &["-rf", path_str(dirs.last().unwrap())]);
}

/// Check every promised content under `root`.
pub fn verify(root: &Path, expect: &[Expect]) {
    use std::os::unix::fs::FileExt;
    for item in expect {
        match item {
            Expect::Exact { path, data } => {
                let got = read_all(&root.join(path));
                assert!(
                    got == *data,
                    "{path}: {} bytes read, {} expected{}",
                    got.len(),
                    data.len(),
                    first_difference(&got, data)
                );
            }
            Expect::Sparse { path, size, data } => {
                let file = fs::File::open(root.join(path)).unwrap();
                assert_eq!(file.metadata().unwrap().len(), *size, "{path}: size");
                for (offset, bytes) in data {
                    let mut got = vec![0u8; bytes.len()];
                    file.read_exact_at(&mut got, *offset).unwrap();
                    assert!(
                        got == *bytes,
                        "{path} at {offset}{}",
                        first_difference(&got, bytes)
                    );
                }
                // Zeros in the middle of every gap between the ranges.
                let mut ends: Vec<(u64, u64)> =
                    data.iter().map(|(o, b)| (*o, o + b.len() as u64)).collect();
                ends.sort();
                let mut previous_end = 0;
                for (start, end) in ends.into_iter().chain([(*size, *size)]) {
                    if start > previous_end {
                        let middle = previous_end + (start - previous_end) / 2;
                        let length = (start - middle).min(4096) as usize;
                        let mut got = vec![1u8; length];
                        file.read_exact_at(&mut got, middle).unwrap();
                        assert!(got.iter().all(|&b| b == 0), "{path}: not zeros at {middle}");
                    }
                    previous_end = previous_end.max(end);
                }
            }
        }
    }
}

fn first_difference(got: &[u8], want: &[u8]) -> String {
    match got.iter().zip(want).position(|(a, b)| a != b) {
        Some(at) => format!(
            " (first difference at byte {at}: {} vs {})",
            got[at], want[at]
        ),
        None => String::new(),
    }
}
