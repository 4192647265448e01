//! `jext4-bench-driver floorfs` mounted for real over /dev/fuse: a tree
//! made with tar comes back with its contents, modes, links and symlinks;
//! the capacity ends in ENOSPC; rename over a file and rmdir of a full
//! directory answer as ext4 does; the tree survives an unmount and mount
//! through `--state`; with `--flush-file`, concurrent fsyncs all return,
//! a group commit at a time. Needs root and /dev/fuse; skips with the reason only
//! where /dev/fuse is missing (and fails then under JEXT4_NO_SKIP).

use std::ffi::OsStr;
use std::fs;
use std::io::{ErrorKind, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;

struct Floor {
    mountpoint: PathBuf,
    /// Taken by `unmount`, which waits for it.
    server: Option<Child>,
}

impl Floor {
    /// Mount floorfs on `mountpoint`; None (the test skips) without /dev/fuse.
    fn mount(mountpoint: &Path, capacity: u64, state: Option<&Path>) -> Option<Floor> {
        let state = state.map(|state| ["--state".as_ref(), state.as_os_str()]);
        Floor::mount_with(
            mountpoint,
            capacity,
            state.as_ref().map_or(&[], |args| &args[..]),
        )
    }

    /// As `mount`, with more options for the server.
    fn mount_with(mountpoint: &Path, capacity: u64, options: &[&OsStr]) -> Option<Floor> {
        if !Path::new("/dev/fuse").exists() {
            let reason = "no /dev/fuse here";
            assert!(
                std::env::var_os("JEXT4_NO_SKIP").is_none(),
                "JEXT4_NO_SKIP forbids skipping: {reason}"
            );
            eprintln!("SKIP: {reason}");
            return None;
        }
        let mut command = Command::new(env!("CARGO_BIN_EXE_jext4-bench-driver"));
        command.args(["floorfs", "--capacity", &capacity.to_string()]);
        command.args(options);
        let mut server = command
            .arg(mountpoint)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the driver starts");
        let deadline = Instant::now() + Duration::from_secs(20);
        while !mounted(mountpoint) {
            if let Some(status) = server.try_wait().unwrap() {
                let output = server.wait_with_output().unwrap();
                panic!(
                    "floorfs exited {status}: {}",
                    String::from_utf8_lossy(&output.stderr)
                );
            }
            assert!(Instant::now() < deadline, "floorfs did not mount in 20 s");
            std::thread::sleep(Duration::from_millis(20));
        }
        Some(Floor {
            mountpoint: mountpoint.to_path_buf(),
            server: Some(server),
        })
    }

    /// Unmount and wait for the server; its last line, the request counts.
    fn unmount(mut self) -> serde_json::Value {
        let status = Command::new("umount")
            .arg(&self.mountpoint)
            .status()
            .unwrap();
        assert!(status.success(), "umount {}", self.mountpoint.display());
        let server = self.server.take().expect("mounted");
        let output = server.wait_with_output().unwrap();
        assert!(
            output.status.success(),
            "floorfs: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        let stdout = String::from_utf8(output.stdout).unwrap();
        serde_json::from_str(stdout.lines().last().expect("a JSON line")).unwrap()
    }
}

impl Drop for Floor {
    /// A failed test still unmounts, so no mount outlives it.
    fn drop(&mut self) {
        if mounted(&self.mountpoint) {
            let _ = Command::new("umount")
                .arg("-l")
                .arg(&self.mountpoint)
                .status();
        }
        if let Some(server) = self.server.as_mut() {
            let _ = server.wait();
        }
    }
}

fn mounted(path: &Path) -> bool {
    let mountinfo = fs::read_to_string("/proc/self/mountinfo").unwrap();
    let wanted = path.to_str().unwrap();
    mountinfo
        .lines()
        .any(|line| line.split(' ').nth(4) == Some(wanted))
}

/// A small tree with every kind the benchmarks make.
fn make_tree(root: &Path) {
    fs::create_dir_all(root.join("src/deep/er")).unwrap();
    for (index, size) in [0usize, 1, 4095, 4096, 4097, 3 * MIB as usize + 17]
        .into_iter()
        .enumerate()
    {
        let data: Vec<u8> = (0..size).map(|at| (at * 7 + index) as u8).collect();
        fs::write(root.join(format!("src/f{index}")), data).unwrap();
    }
    fs::write(root.join("src/deep/er/script"), b"#!/bin/sh\n").unwrap();
    fs::set_permissions(
        root.join("src/deep/er/script"),
        fs::Permissions::from_mode(0o751),
    )
    .unwrap();
    fs::set_permissions(root.join("src/deep"), fs::Permissions::from_mode(0o700)).unwrap();
    fs::hard_link(root.join("src/f3"), root.join("src/f3-link")).unwrap();
    std::os::unix::fs::symlink("deep/er/script", root.join("src/link")).unwrap();
    std::os::unix::fs::symlink("x".repeat(200), root.join("src/long-link")).unwrap();
}

/// Every entry under `root`: relative path, mode, link target or contents.
fn describe(root: &Path) -> Vec<(PathBuf, u32, Vec<u8>)> {
    let mut found = Vec::new();
    let mut pending = vec![root.to_path_buf()];
    while let Some(directory) = pending.pop() {
        for entry in fs::read_dir(&directory).unwrap() {
            let path = entry.unwrap().path();
            let metadata = fs::symlink_metadata(&path).unwrap();
            let body = if metadata.is_dir() {
                pending.push(path.clone());
                Vec::new()
            } else if metadata.file_type().is_symlink() {
                fs::read_link(&path)
                    .unwrap()
                    .into_os_string()
                    .into_encoded_bytes()
            } else {
                fs::read(&path).unwrap()
            };
            found.push((
                path.strip_prefix(root).unwrap().to_path_buf(),
                metadata.mode(),
                body,
            ));
        }
    }
    found.sort();
    found
}

#[test]
fn a_tarred_tree_comes_back_whole() {
    let work = tempfile::tempdir().unwrap();
    let (source, mountpoint) = (work.path().join("source"), work.path().join("mnt"));
    fs::create_dir_all(&mountpoint).unwrap();
    make_tree(&source);
    let Some(floor) = Floor::mount(&mountpoint, 64 * MIB, None) else {
        return;
    };
    let tarball = work.path().join("tree.tar");
    let tar = |args: &[&str]| {
        let status = Command::new("tar").args(args).status().unwrap();
        assert!(status.success(), "tar {args:?}");
    };
    tar(&[
        "-cf",
        tarball.to_str().unwrap(),
        "-C",
        source.to_str().unwrap(),
        "src",
    ]);
    tar(&[
        "-xpf",
        tarball.to_str().unwrap(),
        "-C",
        mountpoint.to_str().unwrap(),
    ]);
    assert_eq!(
        describe(&mountpoint.join("src")),
        describe(&source.join("src"))
    );
    let copy = fs::metadata(mountpoint.join("src/f3")).unwrap();
    let link = fs::metadata(mountpoint.join("src/f3-link")).unwrap();
    assert_eq!(
        (copy.ino(), copy.nlink()),
        (link.ino(), 2),
        "tar kept the hard link"
    );
    let counts = floor.unmount();
    // tar made 7 files, 3 directories, 2 symlinks and a hard link, each
    // with one request: the counters count what the server was asked.
    let asked = |operation: &str| counts[format!("fuse_op_{operation}")].as_u64().unwrap();
    let made = ["create", "mkdir", "symlink", "link"].map(asked);
    assert_eq!(made, [7, 3, 2, 1], "{counts}");
}

/// statvfs(2)'s free blocks (in 4096-byte units, floorfs's block size).
fn free_blocks(mountpoint: &Path) -> u64 {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(mountpoint.as_os_str().as_bytes()).unwrap();
    // SAFETY: an all-zero statvfs is a valid value, and `path` is a
    // NUL-terminated string that outlives the call.
    let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
    let answer = unsafe { libc::statvfs(path.as_ptr(), &mut stat) };
    assert_eq!(answer, 0, "{}", std::io::Error::last_os_error());
    assert_eq!(stat.f_frsize, 4096);
    stat.f_bfree as u64
}

#[test]
fn capacity_ends_in_enospc_and_deleting_gives_it_back() {
    let work = tempfile::tempdir().unwrap();
    let mountpoint = work.path().join("mnt");
    fs::create_dir_all(&mountpoint).unwrap();
    let Some(floor) = Floor::mount(&mountpoint, 8 * MIB, None) else {
        return;
    };
    let filler = mountpoint.join("filler");
    let mut file = fs::File::create(&filler).unwrap();
    let chunk = vec![0x5a; 256 * 1024];
    let mut written = 0u64;
    let error = loop {
        match file.write(&chunk) {
            Ok(bytes) => written += bytes as u64,
            Err(error) => break error,
        }
    };
    drop(file);
    assert_eq!(error.raw_os_error(), Some(libc::ENOSPC), "{error}");
    // The root directory takes one block of the capacity.
    assert_eq!(written, 8 * MIB - 4096);
    assert_eq!(fs::metadata(&filler).unwrap().len(), written);
    let mkdir = fs::create_dir(mountpoint.join("more")).unwrap_err();
    assert_eq!(mkdir.raw_os_error(), Some(libc::ENOSPC), "{mkdir}");
    fs::remove_file(&filler).unwrap();
    // The kernel sends RELEASE for the closed file in the background (it
    // waits for it only on fuseblk mounts), and an unlinked file that is
    // still open keeps its blocks, as on ext4. So the blocks come back when
    // the server has seen the release, which may be after unlink returns.
    let all_but_root = 8 * MIB / 4096 - 1;
    let deadline = Instant::now() + Duration::from_secs(20);
    while free_blocks(&mountpoint) < all_but_root {
        assert!(
            Instant::now() < deadline,
            "the closed, unlinked file's blocks never came back: {} free",
            free_blocks(&mountpoint)
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(free_blocks(&mountpoint), all_but_root);
    fs::create_dir(mountpoint.join("more")).unwrap();
    fs::write(mountpoint.join("more/file"), vec![1; MIB as usize]).unwrap();
    floor.unmount();
}

#[test]
fn rename_over_and_rmdir_of_a_full_directory() {
    let work = tempfile::tempdir().unwrap();
    let mountpoint = work.path().join("mnt");
    fs::create_dir_all(&mountpoint).unwrap();
    let Some(floor) = Floor::mount(&mountpoint, 16 * MIB, None) else {
        return;
    };
    let at = |name: &str| mountpoint.join(name);
    fs::write(at("old"), b"old contents").unwrap();
    fs::write(at("new"), b"replaced").unwrap();
    fs::rename(at("old"), at("new")).unwrap();
    assert_eq!(fs::read(at("new")).unwrap(), b"old contents");
    assert_eq!(
        fs::metadata(at("old")).unwrap_err().kind(),
        ErrorKind::NotFound
    );
    fs::create_dir_all(at("full/inner")).unwrap();
    let rmdir = fs::remove_dir(at("full")).unwrap_err();
    assert_eq!(rmdir.raw_os_error(), Some(libc::ENOTEMPTY), "{rmdir}");
    fs::create_dir(at("empty")).unwrap();
    let over = fs::rename(at("empty"), at("full")).unwrap_err();
    assert_eq!(over.raw_os_error(), Some(libc::ENOTEMPTY), "{over}");
    let exists = fs::create_dir(at("full")).unwrap_err();
    assert_eq!(exists.raw_os_error(), Some(libc::EEXIST), "{exists}");
    fs::rename(at("full/inner"), at("empty/moved")).unwrap();
    fs::remove_dir(at("full")).unwrap();
    assert_eq!(fs::metadata(at("empty")).unwrap().nlink(), 3);
    assert_eq!(fs::read_dir(at("empty")).unwrap().count(), 1);
    floor.unmount();
}

#[test]
fn the_tree_survives_a_remount_through_state() {
    let work = tempfile::tempdir().unwrap();
    let (source, mountpoint) = (work.path().join("source"), work.path().join("mnt"));
    let state = work.path().join("tree.state");
    fs::create_dir_all(&mountpoint).unwrap();
    make_tree(&source);
    let Some(floor) = Floor::mount(&mountpoint, 64 * MIB, Some(&state)) else {
        return;
    };
    let status = Command::new("cp")
        .arg("-a")
        .arg(source.join("src"))
        .arg(&mountpoint)
        .status()
        .unwrap();
    assert!(status.success());
    let before = describe(&mountpoint);
    // An existing state file asks the server to write its tree at unmount.
    fs::write(&state, b"").unwrap();
    floor.unmount();
    assert!(fs::metadata(&state).unwrap().len() > 3 * MIB);
    let floor = Floor::mount(&mountpoint, 64 * MIB, Some(&state)).unwrap();
    assert!(!state.exists(), "a loaded state is used once");
    assert_eq!(describe(&mountpoint), before);
    let times = |path: &Path| fs::symlink_metadata(path).unwrap().modified().unwrap();
    assert_eq!(
        times(&mountpoint.join("src/f5")),
        times(&source.join("src/f5"))
    );
    floor.unmount();
}

#[test]
fn concurrent_fsyncs_return_a_group_commit_at_a_time() {
    let work = tempfile::tempdir().unwrap();
    let (mountpoint, flush) = (work.path().join("mnt"), work.path().join("flush"));
    fs::create_dir_all(&mountpoint).unwrap();
    // A stale, larger file: the server makes it 1 MiB again.
    fs::write(&flush, vec![1; 3 * MIB as usize]).unwrap();
    let options = ["--flush-file".as_ref(), flush.as_os_str()];
    let Some(floor) = Floor::mount_with(&mountpoint, 64 * MIB, &options) else {
        return;
    };
    const THREADS: usize = 6;
    const FSYNCS: usize = 20;
    std::thread::scope(|scope| {
        for thread in 0..THREADS {
            let path = mountpoint.join(format!("f{thread}"));
            scope.spawn(move || {
                let mut file = fs::File::create(&path).unwrap();
                for round in 0..FSYNCS {
                    file.write_all(&[round as u8; 4096]).unwrap();
                    if round % 2 == 0 {
                        file.sync_all().unwrap();
                    } else {
                        file.sync_data().unwrap();
                    }
                }
            });
        }
    });
    fs::File::open(&mountpoint).unwrap().sync_all().unwrap();
    assert_eq!(fs::metadata(&flush).unwrap().len(), MIB);
    let counts = floor.unmount();
    let count = |name: &str| counts[name].as_u64().unwrap();
    let fsyncs = count("fuse_op_fsync") + count("fuse_op_fsyncdir");
    assert_eq!(fsyncs, (THREADS * FSYNCS + 1) as u64, "{counts}");
    let (groups, members) = (count("floor_flush_groups"), count("floor_flush_members"));
    assert_eq!(members, fsyncs, "every fsync joined a group: {counts}");
    assert!((1..=fsyncs).contains(&groups), "{counts}");
    assert_eq!(count("floor_flush_fdatasyncs"), 2 * groups, "{counts}");
    assert_eq!(fs::metadata(&flush).unwrap().len(), MIB);
}
