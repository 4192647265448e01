//! The Tux3 post's five out-of-space quality metrics, as tests
//! that can fail, at 1 KiB and 4 KiB blocks, through the FUSE mount:
//!
//! 1. never an error inside a commit: writers and mkdir/xattr/htree-split
//!    storms at the wall get ENOSPC from the call itself, never EIO; the
//!    journal is not aborted, nothing is logged as an error, the filesystem
//!    stays writable and e2fsck finds it clean;
//! 2. `df` says 100 % (f_bavail == 0) at the first ENOSPC;
//! 3. rm, rmdir, truncate, hole punching, unlink and rename-over work on
//!    the full volume, and the space comes back;
//!
//! and the bad inputs: a volume already full at mount, fallocate far
//! larger than the volume. Then, through the library (counts, not
//! timings): the space budget — ENOSPC on a full volume forces no commit
//! and allocates nothing, freed but uncommitted blocks serve a write, an
//! operation that cannot have its whole cost fails before it allocates —
//! and metric 4 by its cause: rewriting near full steps over the blocks
//! it freed at no cost per allocation. The speeds of metrics 4 and 5 are
//! figures, not assertions: `bench/run --only oos`,
//! `examples/space_budget_cost.rs`.

// The jext4 binary, or the mounts and helpers of tests/common that use it.
#![cfg(feature = "cli")]

mod common;

use common::e2e::{self, JextMount};
use std::fs;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::Path;

/// (block size, image MiB): ext4 as mke2fs makes it, small enough to fill
/// in a second.
const GEOMETRIES: [(u32, u64); 2] = [(1024, 16), (4096, 32)];

fn make_image(scratch: &Path, block_size: u32, mib: u64) -> std::path::PathBuf {
    let block = block_size.to_string();
    common::mkfs(
        scratch,
        &format!("oos{block_size}"),
        mib,
        &["-t", "ext4", "-b", &block],
    )
}

fn is_enospc(error: &std::io::Error) -> bool {
    error.raw_os_error() == Some(libc::ENOSPC)
}

/// Every error of a workload at the wall must be ENOSPC from the call.
fn expect_enospc(error: std::io::Error, what: &str) {
    assert!(is_enospc(&error), "{what}: want ENOSPC, got {error}");
}

/// Fill the volume with one file until ENOSPC (all root may have), then
/// give `leave_kib` KiB back by truncating it, and syncfs.
fn fill_leaving(mnt: &Path, leave_kib: u64) {
    let filler = mnt.join("filler");
    let written = write_until_enospc(&filler, 256 << 10);
    assert!(written > leave_kib << 10, "only {written} bytes fitted");
    let file = fs::File::options().write(true).open(&filler).unwrap();
    file.set_len(written - (leave_kib << 10)).unwrap();
    file.sync_all().unwrap();
    e2e::syncfs(mnt);
}

/// Append to `path` (created if missing) in `chunk`-byte pieces until
/// ENOSPC (the only error allowed); returns the bytes written.
fn write_until_enospc(path: &Path, chunk: usize) -> u64 {
    let data = e2e::pattern(chunk as u64, chunk);
    let mut file = match fs::File::options().create(true).append(true).open(path) {
        Ok(file) => file,
        Err(error) => {
            expect_enospc(error, &format!("create {}", path.display()));
            return 0;
        }
    };
    let mut written = 0;
    loop {
        match file.write(&data) {
            Ok(0) => panic!("write of {} returned 0", path.display()),
            Ok(n) => written += n as u64,
            Err(error) => {
                expect_enospc(error, &format!("write {}", path.display()));
                return written;
            }
        }
    }
}

/// Metric 1's "nothing went wrong inside": `jext4 stats` shows no journal
/// abort, no detected error and no read-only switch; the server logged no
/// I/O error, corruption or panic (fuser's own transport messages aside);
/// and the filesystem still takes a write once some space is freed.
fn assert_commits_never_failed(mount: &JextMount, freed: &Path) {
    let stats = e2e::run_ok(e2e::JEXT4, &["stats", e2e::path_str(&mount.mountpoint)]);
    let stats = String::from_utf8_lossy(&stats.stdout);
    for healthy in [
        "journal_aborted false",
        "errors_detected false",
        "read_only false",
    ] {
        assert!(
            stats.lines().any(|line| line == healthy),
            "jext4 stats: want {healthy:?}:\n{stats}"
        );
    }
    let log = mount.server_log();
    for sign in [
        "journal aborted",
        "I/O error",
        "corruption",
        "read-only",
        "panicked",
    ] {
        assert!(!log.contains(sign), "server log shows {sign:?}:\n{log}");
    }
    if freed.is_dir() {
        fs::remove_dir_all(freed).unwrap();
    } else {
        fs::remove_file(freed).unwrap();
    }
    let probe = mount.path("still-writable");
    let data = e2e::pattern(99, 64 << 10);
    fs::write(&probe, &data).unwrap();
    fs::File::open(&probe).unwrap().sync_all().unwrap();
    assert_eq!(e2e::read_all(&probe), data);
}

/// `tasks` writers at once, each creating its own file and writing it
/// 1 KiB at a time, `writes` times — Tux3's blurt — `passes` times over the
/// same files (a pass truncates the previous one's: the rewrite case).
/// Returns how many writers met ENOSPC.
fn blurt(dir: &Path, passes: usize, tasks: usize, writes: usize) -> usize {
    fs::create_dir_all(dir).unwrap();
    let text = e2e::pattern(7, 1024);
    let mut enospc = 0;
    for _ in 0..passes {
        enospc += std::thread::scope(|scope| {
            let writers: Vec<_> = (0..tasks)
                .map(|task| {
                    let (path, text) = (dir.join(format!("f{task}")), &text);
                    scope.spawn(move || -> bool {
                        let mut file = match fs::File::create(&path) {
                            Ok(file) => file,
                            Err(error) => {
                                expect_enospc(error, "blurt create");
                                return true;
                            }
                        };
                        for _ in 0..writes {
                            if let Err(error) = file.write_all(text) {
                                expect_enospc(error, "blurt write");
                                return true;
                            }
                        }
                        false
                    })
                })
                .collect();
            writers
                .into_iter()
                .map(|writer| writer.join().expect("writer panicked"))
                .filter(|&met_enospc| met_enospc)
                .count()
        });
    }
    enospc
}

#[test]
fn metric1_a_thousand_writers_at_the_wall_never_fail_a_commit() {
    if !e2e::require_e2e() {
        return;
    }
    for (block_size, mib) in GEOMETRIES {
        let scratch = e2e::scratch("oos-writers");
        let image = make_image(scratch.path(), block_size, mib);
        let mount = JextMount::mount(&image, &scratch.path().join("mnt"), "");
        // 4 MiB free against 1,000 × 40 KiB: the wall comes in the first
        // pass, and the second pass rewrites at the wall.
        fill_leaving(&mount.mountpoint, 4 << 10);
        let enospc = blurt(&mount.path("blurt"), 2, 1000, 40);
        eprintln!("{block_size}-byte blocks: {enospc} writer(s) met ENOSPC");
        assert!(enospc > 0, "40 MB fitted in 4 MiB");
        assert_commits_never_failed(&mount, &mount.path("blurt"));
        mount.unmount();
        e2e::fsck_clean(
            &image,
            &format!("after blurt at the wall, {block_size}-byte blocks"),
        );
    }
}

/// One storm: `body(index)` until it fails (ENOSPC, nothing else) or
/// `limit` iterations; returns the iterations that succeeded.
fn storm(limit: usize, what: &str, mut body: impl FnMut(usize) -> std::io::Result<()>) -> usize {
    for index in 0..limit {
        if let Err(error) = body(index) {
            expect_enospc(error, &format!("{what} #{index}"));
            return index;
        }
    }
    limit
}

#[test]
fn metric1_mkdir_xattr_and_htree_split_storms_at_the_wall_never_fail_a_commit() {
    if !e2e::require_e2e() {
        return;
    }
    for (block_size, mib) in GEOMETRIES {
        let scratch = e2e::scratch("oos-storms");
        let image = make_image(scratch.path(), block_size, mib);
        let mount = JextMount::mount(&image, &scratch.path().join("mnt"), "");
        let storms = mount.path("storms");
        for name in ["dirs", "xattrs", "htree"] {
            fs::create_dir_all(storms.join(name)).unwrap();
        }
        fill_leaving(&mount.mountpoint, 256);
        // Four threads at once: a directory storm (a block each), an xattr
        // storm (a 600-byte value needs an xattr block per file), and two
        // name storms into one directory (long names: htree splits).
        let limit = 100_000;
        let counts: Vec<usize> = std::thread::scope(|scope| {
            let dirs = scope.spawn(|| {
                storm(limit, "mkdir", |i| {
                    fs::create_dir(storms.join(format!("dirs/d{i}")))
                })
            });
            let xattrs = scope.spawn(|| {
                let value = e2e::pattern(5, 600);
                storm(limit, "setxattr", |i| {
                    let path = storms.join(format!("xattrs/x{i}"));
                    fs::File::create(&path)?;
                    e2e::set_xattr(&path, "user.storm", &value)
                })
            });
            let names: Vec<_> = (0..2)
                .map(|thread| {
                    let storms = &storms;
                    scope.spawn(move || {
                        storm(limit, "create", |i| {
                            let name = format!("{thread}-{i:06}-{}", "n".repeat(200));
                            fs::File::create(storms.join("htree").join(name)).map(drop)
                        })
                    })
                })
                .collect();
            [dirs, xattrs]
                .into_iter()
                .chain(names)
                .map(|t| t.join().unwrap())
                .collect()
        });
        eprintln!("{block_size}-byte blocks: dirs, xattrs, names ×2 before ENOSPC: {counts:?}");
        assert!(
            counts.iter().all(|&count| count < limit),
            "the volume never filled"
        );
        assert_commits_never_failed(&mount, &mount.path("filler"));
        mount.unmount();
        e2e::fsck_clean(
            &image,
            &format!("after the storms, {block_size}-byte blocks"),
        );
    }
}

/// df's "Use%": used ÷ (used + available), rounded up, as coreutils does.
fn df_percent(mnt: &Path) -> u64 {
    let (blocks, free, available) = block_counts(mnt);
    let used = blocks - free;
    (used * 100).div_ceil((used + available).max(1))
}

#[test]
fn metric2_df_says_100_percent_at_the_first_enospc() {
    if !e2e::require_e2e() {
        return;
    }
    for (block_size, mib) in GEOMETRIES {
        let scratch = e2e::scratch("oos-df");
        let image = make_image(scratch.path(), block_size, mib);
        let mount = JextMount::mount(&image, &scratch.path().join("mnt"), "");
        // Big writes, then small files into what is left, then 1 KiB
        // appends: at each first ENOSPC df must say the volume is full.
        write_until_enospc(&mount.path("big"), 256 << 10);
        let (_, free, available) = e2e::statvfs(&mount.mountpoint);
        eprintln!("{block_size}: big file: {free} free, {available} available at ENOSPC");
        assert_eq!(available, 0, "ENOSPC with {available} blocks available");
        assert_eq!(df_percent(&mount.mountpoint), 100);
        // Room for a few small files, then fill it with them.
        fs::File::options()
            .write(true)
            .open(mount.path("big"))
            .unwrap()
            .set_len(fs::metadata(mount.path("big")).unwrap().len() - (256 << 10))
            .unwrap();
        e2e::syncfs(&mount.mountpoint);
        let data = e2e::pattern(3, 3000);
        let small = storm(10_000, "small file", |i| {
            fs::write(mount.path(&format!("s{i}")), &data)
        });
        let (_, free, available) = e2e::statvfs(&mount.mountpoint);
        eprintln!("{block_size}: {small} small files, then {free} free, {available} available");
        assert!(
            small > 0,
            "freeing 256 KiB made no room for one 3000-byte file"
        );
        assert_eq!(
            available, 0,
            "small files: ENOSPC with {available} blocks available"
        );
        assert_eq!(df_percent(&mount.mountpoint), 100);
        mount.unmount();
        e2e::fsck_clean(&image, &format!("after filling, {block_size}-byte blocks"));
    }
}

/// What metric 3 deletes: a fragmented file (to truncate and punch), a
/// file to unlink, an empty directory, a rename source and target, and a
/// small tree for rm -rf. Made before the volume fills.
fn victims(mnt: &Path, block_size: u32) {
    let block = block_size as usize;
    // Two files written block by block in turn: each gets an extent per
    // block, so the first needs an extent tree of depth 1 or more.
    let fragmented = fs::File::create(mnt.join("fragmented")).unwrap();
    let other = fs::File::create(mnt.join("interleaved")).unwrap();
    for index in 0..600u64 {
        let data = e2e::pattern(index, block);
        fragmented
            .write_all_at(&data, index * block as u64)
            .unwrap();
        other.write_all_at(&data, index * block as u64).unwrap();
        if index % 64 == 63 {
            fragmented.sync_all().unwrap();
            other.sync_all().unwrap();
        }
    }
    // Four extents of four blocks, holes between: the inode's own extent
    // root (four entries) is full, so punching inside an extent, which
    // splits it into two, needs a new leaf block — on a full volume.
    let split = fs::File::create(mnt.join("root-full")).unwrap();
    for extent in 0..4u64 {
        let data = e2e::pattern(50 + extent, 4 * block);
        split
            .write_all_at(&data, extent * 10 * block as u64)
            .unwrap();
    }
    split.sync_all().unwrap();
    fs::write(mnt.join("unlink-me"), e2e::pattern(11, 300 << 10)).unwrap();
    fs::create_dir(mnt.join("empty-dir")).unwrap();
    fs::write(mnt.join("rename-src"), e2e::pattern(12, 10 << 10)).unwrap();
    fs::write(mnt.join("rename-dst"), e2e::pattern(13, 200 << 10)).unwrap();
    for dir in 0..10 {
        let path = mnt.join(format!("tree/d{dir}"));
        fs::create_dir_all(&path).unwrap();
        for file in 0..20 {
            fs::write(path.join(format!("f{file}")), e2e::pattern(file, 5000)).unwrap();
        }
    }
}

/// Fill every last block: big writes, then 1 KiB files, then appends of a
/// byte to them, until each kind meets ENOSPC.
fn fill_to_the_last_block(mnt: &Path) {
    write_until_enospc(&mnt.join("full-big"), 256 << 10);
    let data = e2e::pattern(4, 1024);
    storm(100_000, "1 KiB file", |i| {
        fs::write(mnt.join(format!("full-{i}")), &data)
    });
    write_until_enospc(&mnt.join("full-big"), 1);
    let (_, free, available) = e2e::statvfs(mnt);
    assert_eq!(
        available, 0,
        "filled, yet {available} blocks available ({free} free)"
    );
}

fn punch_hole(path: &Path, offset: u64, length: u64) -> std::io::Result<()> {
    let file = fs::File::options().write(true).open(path)?;
    let mode = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
    let fd = std::os::fd::AsRawFd::as_raw_fd(&file);
    // SAFETY: fallocate on an open descriptor.
    match unsafe { libc::fallocate(fd, mode, offset as i64, length as i64) } {
        0 => Ok(()),
        _ => Err(std::io::Error::last_os_error()),
    }
}

#[test]
fn metric3_rm_rmdir_truncate_unlink_and_rename_work_on_a_full_volume() {
    if !e2e::require_e2e() {
        return;
    }
    for (block_size, mib) in GEOMETRIES {
        let scratch = e2e::scratch("oos-rm");
        let image = make_image(scratch.path(), block_size, mib);
        let mount = JextMount::mount(&image, &scratch.path().join("mnt"), "");
        let mnt = &mount.mountpoint;
        victims(mnt, block_size);
        fill_to_the_last_block(mnt);
        let free_when_full = e2e::statvfs(mnt).1;
        let steps: [(&str, &dyn Fn() -> std::io::Result<()>); 8] = [
            // First, while nothing has been freed yet.
            (
                "punch a hole that splits an extent of a full extent root",
                &|| {
                    punch_hole(
                        &mnt.join("root-full"),
                        block_size as u64 + 100,
                        block_size as u64,
                    )
                },
            ),
            ("punch a hole in the middle of an extent tree", &|| {
                punch_hole(
                    &mnt.join("fragmented"),
                    100 * block_size as u64 + 17,
                    3 * block_size as u64,
                )
            }),
            ("truncate into the middle of a block", &|| {
                fs::File::options()
                    .write(true)
                    .open(mnt.join("fragmented"))?
                    .set_len(300 * block_size as u64 + 5)
            }),
            ("unlink", &|| fs::remove_file(mnt.join("unlink-me"))),
            ("rmdir", &|| fs::remove_dir(mnt.join("empty-dir"))),
            ("rename over a file", &|| {
                fs::rename(mnt.join("rename-src"), mnt.join("rename-dst"))
            }),
            ("rm -rf a tree", &|| fs::remove_dir_all(mnt.join("tree"))),
            ("truncate to zero", &|| {
                fs::File::options()
                    .write(true)
                    .open(mnt.join("fragmented"))?
                    .set_len(0)
            }),
        ];
        for (what, step) in steps {
            step().unwrap_or_else(|error| {
                panic!("{block_size}-byte blocks, full volume: {what}: {error}")
            });
        }
        // The space comes back (once the deletions commit).
        e2e::syncfs(mnt);
        let free_after = e2e::statvfs(mnt).1;
        eprintln!(
            "{block_size}: {free_when_full} blocks free when full, {free_after} after the deletions"
        );
        assert!(
            free_after * block_size as u64 >= free_when_full * block_size as u64 + (1 << 20),
            "deleting ~2 MiB gave back only {} blocks",
            free_after - free_when_full
        );
        let data = e2e::pattern(21, 512 << 10);
        fs::write(mnt.join("after"), &data).unwrap();
        assert_eq!(e2e::read_all(&mnt.join("after")), data);
        assert_eq!(
            e2e::read_all(&mnt.join("rename-dst")),
            e2e::pattern(12, 10 << 10)
        );
        // The split punch zeroed exactly its range and kept the rest.
        let mut expected = Vec::new();
        for extent in 0..4u64 {
            expected.resize(extent as usize * 10 * block_size as usize, 0);
            expected.extend(e2e::pattern(50 + extent, 4 * block_size as usize));
        }
        expected[block_size as usize + 100..2 * block_size as usize + 100].fill(0);
        assert!(
            e2e::read_all(&mnt.join("root-full")) == expected,
            "the punched file is wrong"
        );
        mount.unmount();
        e2e::fsck_clean(
            &image,
            &format!("after deleting on a full volume, {block_size}-byte blocks"),
        );
    }
}

#[test]
fn a_volume_already_full_at_mount_mounts_reports_full_and_deletes() {
    if !e2e::require_e2e() {
        return;
    }
    for (block_size, mib) in GEOMETRIES {
        let scratch = e2e::scratch("oos-full-at-mount");
        let image = make_image(scratch.path(), block_size, mib);
        let mnt = scratch.path().join("mnt");
        let mount = JextMount::mount(&image, &mnt, "");
        fs::create_dir(mnt.join("dir")).unwrap();
        fill_to_the_last_block(&mnt);
        mount.unmount();
        e2e::fsck_clean(&image, "after filling");

        let mount = JextMount::mount(&image, &mnt, "");
        assert_eq!(
            df_percent(&mnt),
            100,
            "a full volume at mount is not 100 % used"
        );
        let error = fs::write(mnt.join("dir/new"), vec![1u8; 64 << 10]).unwrap_err();
        expect_enospc(error, "write on a volume full at mount");
        fs::remove_file(mnt.join("full-big")).unwrap();
        // The failed write left its (empty) file behind, as the kernel does.
        fs::remove_file(mnt.join("dir/new")).unwrap();
        fs::remove_dir(mnt.join("dir")).unwrap();
        e2e::syncfs(&mnt);
        let data = e2e::pattern(8, 1 << 20);
        fs::write(mnt.join("again"), &data).unwrap();
        assert_eq!(e2e::read_all(&mnt.join("again")), data);
        mount.unmount();
        e2e::fsck_clean(
            &image,
            &format!("after a full mount, {block_size}-byte blocks"),
        );
    }
}

/// fallocate of `length` bytes on a new file; its errno, if any.
fn fallocate_errno(root: &Path, length: i64) -> Option<i32> {
    let file = fs::File::create(root.join("huge")).unwrap();
    // SAFETY: fallocate on an open descriptor.
    let result = unsafe { libc::fallocate(std::os::fd::AsRawFd::as_raw_fd(&file), 0, 0, length) };
    (result != 0).then(|| std::io::Error::last_os_error().raw_os_error().unwrap())
}

#[test]
fn fallocate_far_larger_than_the_volume_is_enospc_like_the_kernel() {
    if !e2e::require_e2e() {
        return;
    }
    let (block_size, mib) = GEOMETRIES[0];
    let scratch = e2e::scratch("oos-fallocate");
    let image = make_image(scratch.path(), block_size, mib);
    let reference = scratch.path().join("kernel.img");
    fs::copy(&image, &reference).unwrap();
    // A hundred times the volume, and the largest length the call takes.
    let lengths = [(mib as i64) << 20 << 7, i64::MAX];
    let kmnt = scratch.path().join("kernel");
    let kernel = e2e::KernelMount::mount(&reference, &kmnt, false);
    let expected: Vec<_> = lengths
        .iter()
        .map(|&length| fallocate_errno(&kmnt, length))
        .collect();
    kernel.unmount();
    let mnt = scratch.path().join("mnt");
    let mount = JextMount::mount(&image, &mnt, "");
    let (_, free_at_mount, _) = block_counts(&mnt);
    for (&length, &kernel_errno) in lengths.iter().zip(&expected) {
        let errno = fallocate_errno(&mnt, length);
        assert_eq!(
            errno, kernel_errno,
            "fallocate of {length} bytes: jext4 vs the kernel"
        );
        fs::remove_file(mnt.join("huge")).unwrap();
        // The kernel sends the file's RELEASE after close(2) returned, and
        // the UNLINK may come first: the blocks go back at the release.
        // Every one of them must (a leak would keep this waiting).
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while block_counts(&mnt).1 < free_at_mount {
            assert!(
                std::time::Instant::now() < deadline,
                "{} of {free_at_mount} free blocks back 20 s after the unlink",
                block_counts(&mnt).1
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }
    assert_eq!(expected[0], Some(libc::ENOSPC));
    // Nothing is left allocated once the file is gone.
    let data = e2e::pattern(9, 4 << 20);
    fs::write(mnt.join("fits"), &data).unwrap();
    mount.unmount();
    e2e::fsck_clean(&image, "after oversized fallocates");
}

/// statvfs of `path`: (f_blocks, f_bfree, f_bavail).
fn block_counts(path: &Path) -> (u64, u64, u64) {
    let c_path = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: zeroed is a valid statvfs; the call fills it.
    let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: valid path and out pointer.
    assert_eq!(unsafe { libc::statvfs(c_path.as_ptr(), &mut stat) }, 0);
    (stat.f_blocks, stat.f_bfree, stat.f_bavail)
}

#[test]
fn statfs_reports_the_reserves_as_the_kernel_does() {
    if !e2e::require_e2e() {
        return;
    }
    for (block_size, mib) in GEOMETRIES {
        let scratch = e2e::scratch("oos-statfs");
        let image = make_image(scratch.path(), block_size, mib);
        let reference = scratch.path().join("kernel.img");
        fs::copy(&image, &reference).unwrap();
        let kmnt = scratch.path().join("kernel");
        let kernel = e2e::KernelMount::mount(&reference, &kmnt, false);
        let expected = block_counts(&kmnt);
        kernel.unmount();
        let mount = JextMount::mount(&image, &scratch.path().join("mnt"), "");
        let counts = block_counts(&mount.mountpoint);
        mount.unmount();
        // f_bfree counts every free block; f_bavail leaves out root's
        // blocks and the kernel's s_resv_clusters (our emergency reserve),
        // so df's Size, Used and Avail columns are the kernel's.
        assert_eq!(
            counts, expected,
            "{block_size}-byte blocks: (blocks, free, available) jext4 vs kernel"
        );
    }
}

#[test]
fn rm_rf_works_on_a_full_volume_with_the_smallest_journal() {
    if !e2e::require_e2e() {
        return;
    }
    // mke2fs's smallest journal, 1,024 blocks: deleting thousands of
    // files fills it many times over, so the deletion also meets a full
    // journal (handles wait for checkpoint) on a full volume.
    let scratch = e2e::scratch("oos-journal");
    let image = common::mkfs(
        scratch.path(),
        "journal",
        16,
        &["-t", "ext4", "-b", "1024", "-J", "size=1"],
    );
    let mount = JextMount::mount(&image, &scratch.path().join("mnt"), "");
    let mnt = &mount.mountpoint;
    let data = e2e::pattern(31, 1500);
    for dir in 0..20 {
        let path = mnt.join(format!("tree/d{dir:02}"));
        fs::create_dir_all(&path).unwrap();
        for file in 0..150 {
            fs::write(path.join(format!("f{file:03}")), &data).unwrap();
        }
    }
    fill_to_the_last_block(mnt);
    assert_eq!(df_percent(mnt), 100);
    fs::remove_dir_all(mnt.join("tree")).unwrap();
    e2e::syncfs(mnt);
    let (_, _, available) = e2e::statvfs(mnt);
    assert!(
        available > 3000,
        "rm -rf of 3,000 files gave back {available} blocks"
    );
    assert_commits_never_failed(&mount, &mnt.join("full-big"));
    mount.unmount();
    e2e::fsck_clean(&image, "after rm -rf on a full volume with a 1 MiB journal");
}

/// The engine on `image`, through the library (no FUSE: counts, not
/// timings, are what these tests read), with a commit interval long enough
/// that only what the tests ask for commits.
fn open_engine(image: &Path) -> std::sync::Arc<jext4::engine::fs::Fs> {
    let options = jext4::engine::fs::MountOptions {
        commit_interval: std::time::Duration::from_secs(3600),
        ..Default::default()
    };
    jext4::engine::fs::Fs::open(image, options).unwrap()
}

/// Write `file` at `offset` through the engine until ENOSPC (the only
/// error allowed), in `chunk`-byte pieces; returns where it stopped.
fn engine_fill(fs: &jext4::engine::fs::Fs, ino: u32, offset: u64, chunk: usize) -> u64 {
    let data = e2e::pattern(offset, chunk);
    let mut at = offset;
    loop {
        match fs.write(ino, at, &data, jext4::engine::fs::Caller::ROOT) {
            Ok(written) => at += written as u64,
            Err(jext4::Error::NoSpace) => return at,
            Err(error) => panic!("filling: {error}"),
        }
    }
}

/// The budget fails fast: on a volume full to the last block with nothing
/// freed since the last commit, a thousand mkdirs and a thousand writes
/// into holes are each ENOSPC from their charge — no commit forced, no
/// wait for one, nothing allocated and given back — and the budget says
/// so in its counters. (The journal's own commit count is no measure: the
/// checkpoint thread, which the fill left with a log half full, commits
/// on its own when it meets a buffer of the running transaction.)
#[test]
fn enospc_on_a_full_volume_commits_nothing_and_waits_for_nothing() {
    use jext4::engine::format::superblock::ROOT_INO;
    use jext4::engine::fs::Caller;
    if !e2e::require_e2e() {
        return;
    }
    for (block_size, mib) in GEOMETRIES {
        let scratch = e2e::scratch("oos-fast");
        let image = make_image(scratch.path(), block_size, mib);
        let fs = open_engine(&image);
        let filler = fs
            .create(ROOT_INO, b"filler", 0o644, Caller::ROOT)
            .unwrap()
            .ino;
        let end = engine_fill(&fs, filler, 0, 256 << 10);
        engine_fill(&fs, filler, end, 1);
        fs.sync().unwrap();
        let (budget, free) = (fs.budget_stats(), fs.statfs().free_blocks);
        assert!(budget.balance <= 0, "{block_size}: full, yet {budget:?}");
        for i in 0..1000u64 {
            let name = format!("d{i}");
            let made = fs.mkdir(ROOT_INO, name.as_bytes(), 0o755, Caller::ROOT);
            assert!(
                matches!(made, Err(jext4::Error::NoSpace)),
                "mkdir: {made:?}"
            );
        }
        assert_eq!(fs.budget_stats().forced_commits, budget.forced_commits);
        let hole = 1 << 30;
        for i in 0..1000u64 {
            let wrote = fs.write(filler, hole + i * (1 << 20), &[7; 1024], Caller::ROOT);
            assert!(
                matches!(wrote, Err(jext4::Error::NoSpace)),
                "write: {wrote:?}"
            );
        }
        let after = fs.budget_stats();
        eprintln!("{block_size}: full: {budget:?}\nafter 2,000 failures: {after:?}");
        assert_eq!(after.forced_commits, budget.forced_commits);
        assert!(after.enospc >= budget.enospc + 2000, "{after:?}");
        assert_eq!(after.charged, 0, "failed charges left something charged");
        assert_eq!(
            fs.statfs().free_blocks,
            free,
            "a failure allocated or freed"
        );
        fs.unmount().unwrap();
        e2e::fsck_clean(
            &image,
            &format!("after failing fast, {block_size}-byte blocks"),
        );
    }
}

/// Blocks freed in the running transaction count in the next one's budget:
/// on a full volume, a write that the freed blocks of an uncommitted unlink
/// cover succeeds after at most one commit the budget forces (the kernel
/// retries after a commit too: ext4_should_retry_alloc).
#[test]
fn blocks_freed_but_not_committed_serve_a_write_after_one_forced_commit() {
    use jext4::engine::format::superblock::ROOT_INO;
    use jext4::engine::fs::Caller;
    if !e2e::require_e2e() {
        return;
    }
    for (block_size, mib) in GEOMETRIES {
        let scratch = e2e::scratch("oos-freed");
        let image = make_image(scratch.path(), block_size, mib);
        let fs = open_engine(&image);
        let victim = fs
            .create(ROOT_INO, b"victim", 0o644, Caller::ROOT)
            .unwrap()
            .ino;
        let data = e2e::pattern(1, 1 << 20);
        assert_eq!(
            fs.write(victim, 0, &data, Caller::ROOT).unwrap(),
            data.len()
        );
        let filler = fs
            .create(ROOT_INO, b"filler", 0o644, Caller::ROOT)
            .unwrap()
            .ino;
        let end = engine_fill(&fs, filler, 0, 256 << 10);
        engine_fill(&fs, filler, end, 1);
        fs.sync().unwrap();
        let before = fs.budget_stats();
        fs.unlink(ROOT_INO, b"victim", Caller::ROOT).unwrap();
        let wanted = e2e::pattern(2, 512 << 10);
        let new = fs
            .create(ROOT_INO, b"new", 0o644, Caller::ROOT)
            .unwrap()
            .ino;
        assert_eq!(
            fs.write(new, 0, &wanted, Caller::ROOT).unwrap(),
            wanted.len()
        );
        let after = fs.budget_stats();
        eprintln!("{block_size}: {before:?}\n{after:?}");
        // One commit forced by the budget, unless the checkpoint thread
        // (the fill left the log half full) committed the unlink first
        // (the journal's commit count may still lag then: the budget moves
        // at lock-down, the count when the commit is durable).
        let forced = after.forced_commits - before.forced_commits;
        assert!(forced <= 1, "{after:?}");
        assert!(after.budget > before.budget, "no commit made the room");
        assert_eq!(fs.read(new, 0, wanted.len()).unwrap(), wanted);
        fs.unmount().unwrap();
        e2e::fsck_clean(
            &image,
            &format!("after reusing freed blocks, {block_size}-byte blocks"),
        );
    }
}

/// The whole cost first: a mkdir whose parent's only block is full needs
/// three blocks (its own, and two for the parent to become an htree whose
/// leaf then splits); with two left it fails before allocating anything —
/// before the budget it took both, met the wall at the third, left the
/// parent grown, gave its own block back, and then committed three times
/// to see that block again — and with three it succeeds.
#[test]
fn an_operation_that_cannot_have_its_whole_cost_fails_before_it_allocates() {
    use jext4::engine::format::superblock::ROOT_INO;
    use jext4::engine::fs::Caller;
    if !e2e::require_e2e() {
        return;
    }
    for (block_size, mib) in GEOMETRIES {
        let scratch = e2e::scratch("oos-whole");
        let image = make_image(scratch.path(), block_size, mib);
        let fs = open_engine(&image);
        // Names of one length, as many as one block holds; the new name
        // (same length) does not fit beside them even without "." and "..".
        let name = |i: usize| format!("{i:0120}");
        let probe = fs
            .mkdir(ROOT_INO, b"probe", 0o755, Caller::ROOT)
            .unwrap()
            .ino;
        let mut fit = 0;
        while fs.getattr(probe).unwrap().size == block_size as u64 {
            fs.create(probe, name(fit).as_bytes(), 0o644, Caller::ROOT)
                .unwrap();
            fit += 1;
        }
        let dir = fs.mkdir(ROOT_INO, b"dir", 0o755, Caller::ROOT).unwrap().ino;
        for i in 0..fit - 1 {
            fs.create(dir, name(i).as_bytes(), 0o644, Caller::ROOT)
                .unwrap();
        }
        assert_eq!(fs.getattr(dir).unwrap().size, block_size as u64);
        let filler = fs
            .create(ROOT_INO, b"filler", 0o644, Caller::ROOT)
            .unwrap()
            .ino;
        let mut end = engine_fill(&fs, filler, 0, 256 << 10);
        end = engine_fill(&fs, filler, end, 1);
        let root_room = |fs: &jext4::engine::fs::Fs| {
            let stats = fs.budget_stats();
            stats.balance + stats.root_reserve as i64
        };
        // Exactly two blocks left for root.
        fs.sync().unwrap();
        while root_room(&fs) < 2 {
            end = end.saturating_sub(block_size as u64) / block_size as u64 * block_size as u64;
            fs.truncate(filler, end, Caller::ROOT).unwrap();
            fs.sync().unwrap();
        }
        assert_eq!(root_room(&fs), 2, "{:?}", fs.budget_stats());
        let (free, before) = (fs.statfs().free_blocks, fs.budget_stats());
        for i in 0..10 {
            let made = fs.mkdir(dir, name(fit + i).as_bytes(), 0o755, Caller::ROOT);
            assert!(matches!(made, Err(jext4::Error::NoSpace)), "{made:?}");
        }
        assert_eq!(fs.statfs().free_blocks, free, "a failing mkdir allocated");
        assert_eq!(fs.budget_stats().forced_commits, before.forced_commits);
        assert_eq!(fs.getattr(dir).unwrap().size, block_size as u64);
        // One block more, and the same mkdir fits.
        fs.truncate(filler, end - block_size as u64, Caller::ROOT)
            .unwrap();
        fs.sync().unwrap();
        assert_eq!(root_room(&fs), 3);
        fs.mkdir(dir, name(fit).as_bytes(), 0o755, Caller::ROOT)
            .unwrap();
        assert_eq!(root_room(&fs), 0, "{:?}", fs.budget_stats());
        fs.unmount().unwrap();
        e2e::fsck_clean(
            &image,
            &format!("after a refused mkdir, {block_size}-byte blocks"),
        );
    }
}

/// Metric 4's stall, by its cause and without a clock. Rewriting files on
/// a nearly full volume frees their blocks into the running transaction,
/// where they stay unallocatable until it commits; the allocator must lay
/// them over the bitmap as a mask, not step over them one candidate at a
/// time (the post's 81-step blurt loop spent over 17 minutes doing that).
/// A hundred fragmented files rewritten block by block, interleaved, with
/// their four thousand freed blocks pending in the goal group: each
/// allocation searches about one group and passes over no candidate.
#[test]
fn metric4_rewrites_near_full_step_over_pending_frees_at_no_cost() {
    use jext4::engine::format::superblock::ROOT_INO;
    use jext4::engine::fs::Caller;
    if !e2e::require_e2e() {
        return;
    }
    for (block_size, mib) in GEOMETRIES {
        let scratch = e2e::scratch("oos-rewrite");
        let image = make_image(scratch.path(), block_size, mib);
        let fs = open_engine(&image);
        let dir = fs
            .mkdir(ROOT_INO, b"rewrite", 0o755, Caller::ROOT)
            .unwrap()
            .ino;
        let files: Vec<u32> = (0..100)
            .map(|i| {
                let name = format!("f{i}");
                fs.create(dir, name.as_bytes(), 0o644, Caller::ROOT)
                    .unwrap()
                    .ino
            })
            .collect();
        let block = block_size as usize;
        let write_interleaved = |pass: u64| {
            for round in 0..40u64 {
                for &ino in &files {
                    let data = e2e::pattern(pass * 1000 + ino as u64 + round, block);
                    let at = round * block as u64;
                    assert_eq!(fs.write(ino, at, &data, Caller::ROOT).unwrap(), block);
                }
            }
        };
        write_interleaved(1);
        // Nearly full: 5,000 blocks left, for the 4,000 the rewrite takes
        // while the 4,000 it frees wait for their commit.
        let filler = fs
            .create(ROOT_INO, b"filler", 0o644, Caller::ROOT)
            .unwrap()
            .ino;
        let end = engine_fill(&fs, filler, 0, 256 << 10);
        fs.truncate(
            filler,
            end.saturating_sub(5000 * block as u64),
            Caller::ROOT,
        )
        .unwrap();
        fs.sync().unwrap();
        let before = fs.alloc_stats();
        for &ino in &files {
            fs.truncate(ino, 0, Caller::ROOT).unwrap();
        }
        write_interleaved(2);
        let after = fs.alloc_stats();
        let calls = after.calls - before.calls;
        let searched = after.groups_searched - before.groups_searched;
        let skipped = after.candidates_skipped - before.candidates_skipped;
        eprintln!(
            "{block_size}: {calls} allocations searched {searched} groups, skipped {skipped} runs; {:?}",
            fs.budget_stats()
        );
        assert!(calls >= 4000, "{calls} allocations");
        assert!(searched <= calls + calls / 10, "{searched} group searches");
        assert!(skipped <= calls / 100, "{skipped} candidates passed over");
        for &ino in &files {
            let data = fs.read(ino, 39 * block as u64, block).unwrap();
            assert_eq!(data, e2e::pattern(2 * 1000 + ino as u64 + 39, block));
        }
        fs.unmount().unwrap();
        e2e::fsck_clean(
            &image,
            &format!("after rewriting near full, {block_size}-byte blocks"),
        );
    }
}

/// Preallocation windows (`fs/prealloc.rs`): files appended in turn, a
/// block at a time, get contiguous blocks — each keeps the free blocks
/// after its last run for its next append — so 40 blocks take at most
/// three extents, in the inode (before the windows: 40 extents of one
/// block each and a leaf block per file). A window is only a hint: the
/// file's last release drops it, and a volume filled while 200 files hold
/// windows fills to the last block root may take (the search steps over
/// windows first, then takes their blocks): never an ENOSPC they cause.
#[test]
fn interleaved_appenders_get_contiguous_files_and_windows_never_cost_space() {
    use jext4::engine::format::superblock::ROOT_INO;
    use jext4::engine::fs::Caller;
    if !e2e::require_e2e() {
        return;
    }
    for (block_size, mib) in GEOMETRIES {
        let scratch = e2e::scratch("oos-windows");
        let image = make_image(scratch.path(), block_size, mib);
        let fs = open_engine(&image);
        let dir = fs.mkdir(ROOT_INO, b"d", 0o755, Caller::ROOT).unwrap().ino;
        let files: Vec<u32> = (0..200)
            .map(|i| {
                let name = format!("f{i}");
                let ino = fs
                    .create(dir, name.as_bytes(), 0o644, Caller::ROOT)
                    .unwrap()
                    .ino;
                fs.open_file(ino).unwrap();
                ino
            })
            .collect();
        // blurt's appends: 1 KiB each, 40 per file.
        let chunk = 1024;
        let data = |ino: u32, round: u64| e2e::appended(ino, round, chunk);
        e2e::append_in_turn(&fs, &files, 0..40, chunk);
        let stats = fs.alloc_stats();
        eprintln!("{block_size}: {stats:?}");
        assert!(stats.windows_holding > 0, "{stats:?}");
        let file_blocks = 40 * chunk as u64 / block_size as u64;
        assert!(stats.window_blocks >= 200 * (file_blocks - 4), "{stats:?}");
        for &ino in &files {
            fs.release_file(ino).unwrap();
        }
        assert_eq!(fs.alloc_stats().windows_holding, 0, "released, yet held");
        // Windows again (never released), then fill past them.
        e2e::append_in_turn(&fs, &files, 40..41, chunk);
        let held = fs.alloc_stats().windows_holding;
        assert!(held >= 200 * 4, "{held} blocks in windows");
        let filler = fs
            .create(ROOT_INO, b"filler", 0o644, Caller::ROOT)
            .unwrap()
            .ino;
        let end = engine_fill(&fs, filler, 0, 256 << 10);
        engine_fill(&fs, filler, end, 1);
        let (free, emergency) = (fs.statfs().free_blocks, fs.budget_stats().emergency_reserve);
        assert!(
            free <= emergency,
            "{block_size}: {free} blocks free past root's last ENOSPC, {emergency} emergency, {held} were in windows"
        );
        for &ino in files.iter().step_by(20) {
            for round in [0, 17, 39, 40] {
                let at = round * chunk as u64;
                assert_eq!(fs.read(ino, at, chunk).unwrap(), data(ino, round));
            }
        }
        fs.unmount().unwrap();
        e2e::fsck_clean(&image, &format!("after windows, {block_size}-byte blocks"));
        // 41 KiB each (the 41st after the release): at 1 KiB blocks, 41
        // one-block extents and a leaf block per file before the windows.
        let files = file_extents(&image, 200);
        let extents: usize = files.iter().map(|&(count, _)| count).sum();
        let deep = files.iter().filter(|&&(_, depth)| depth > 0).count();
        eprintln!("{block_size}: {extents} extents, {deep} of 200 files with an extent block");
        assert!(
            extents <= 200 * 5,
            "{block_size}: {extents} extents for 200 files"
        );
        assert!(
            deep <= 20,
            "{block_size}: {deep} of 200 files needed an extent block"
        );
    }
}

/// (extents, tree depth) of `/d/f0` .. `/d/f{count - 1}`.
fn file_extents(image: &Path, count: usize) -> Vec<(usize, u32)> {
    let paths: Vec<String> = (0..count).map(|i| format!("/d/f{i}")).collect();
    e2e::file_extents(image, &paths)
}

/// df says 100 % at the ENOSPC even when the last data block a user may
/// have needs a new extent leaf: the leaf comes out of the emergency
/// reserve (a file's extent count depends on timing — a search steps over
/// blocks a checkpoint pass is writing — so e2e_full met this now and then
/// with one block left available).
#[test]
fn the_last_block_a_user_may_have_is_written_even_when_its_extent_needs_a_leaf() {
    use jext4::engine::format::superblock::ROOT_INO;
    use jext4::engine::fs::Caller;
    if !e2e::require_e2e() {
        return;
    }
    let (block_size, mib) = GEOMETRIES[0];
    let scratch = e2e::scratch("oos-leaf");
    let image = make_image(scratch.path(), block_size, mib);
    let fs = open_engine(&image);
    let user = Caller::new(1000, 1000);
    let dir = fs.mkdir(ROOT_INO, b"u", 0o777, Caller::ROOT).unwrap().ino;
    let frag = fs.create(dir, b"frag", 0o644, user).unwrap().ino;
    let block = vec![7u8; block_size as usize];
    // Four extents: the inode's extent root is full.
    for lblk in [0u64, 2, 4, 6] {
        fs.write(frag, lblk * block_size as u64, &block, user)
            .unwrap();
    }
    let filler = fs.create(dir, b"filler", 0o644, user).unwrap().ino;
    let mut end = 0u64;
    loop {
        match fs.write(filler, end, &block, user) {
            Ok(written) => end += written as u64,
            Err(jext4::Error::NoSpace) => break,
            Err(error) => panic!("filling: {error}"),
        }
    }
    fs.sync().unwrap();
    // Give back what leaves the user exactly one block.
    let available = |fs: &jext4::engine::fs::Fs| fs.statfs().available_blocks;
    assert_eq!(available(&fs), 0);
    let mut size = end;
    while available(&fs) < 1 {
        size -= block_size as u64;
        fs.truncate(filler, size, user).unwrap();
    }
    fs.sync().unwrap();
    assert_eq!(available(&fs), 1, "one block for the user");
    // A fifth extent: one data block and a leaf. The user gets the block.
    fs.write(frag, 8 * block_size as u64, &block, user).unwrap();
    assert_eq!(available(&fs), 0, "df says 100 % after the last block");
    assert!(matches!(
        fs.write(frag, 10 * block_size as u64, &block, user),
        Err(jext4::Error::NoSpace)
    ));
    fs.unmount().unwrap();
    drop(fs);
    e2e::fsck_clean(&image, "after the last block with a new extent leaf");
}
