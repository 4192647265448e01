//! Filling a filesystem through the FUSE mount ends in
//! ENOSPC (never EIO), with big files, with many small files and with
//! inodes; the image stays e2fsck-clean; deleting frees space and writing
//! works again; an unprivileged user cannot eat the blocks reserved for
//! root.

// The jext4 binary, or the mounts and helpers of tests/common that use it.
#![cfg(feature = "cli")]

mod common;

use common::e2e::{self, JextMount};
use std::fs;
use std::io::Write;
use std::path::Path;

const IMAGE_MIB: u64 = 32;

/// Write `chunk`-sized pieces to `path` until an error; the error must be
/// ENOSPC. Returns the bytes written.
fn write_until_full(path: &Path, chunk: usize, limit: u64) -> u64 {
    let data = e2e::pattern(path.as_os_str().len() as u64, chunk);
    let mut file = match fs::File::create(path) {
        Ok(file) => file,
        Err(error) => {
            assert_enospc(&error, path);
            return 0;
        }
    };
    let mut written = 0u64;
    while written < limit {
        match file.write(&data) {
            Ok(0) => panic!("write of {} returned 0", path.display()),
            Ok(n) => written += n as u64,
            Err(error) => {
                assert_enospc(&error, path);
                return written;
            }
        }
    }
    // Nothing may fail later: ENOSPC must come from write(2) itself.
    if let Err(error) = file.sync_all() {
        panic!(
            "{}: write(2) accepted data that fsync then refused: {error}",
            path.display()
        );
    }
    written
}

fn assert_enospc(error: &std::io::Error, path: &Path) {
    assert_eq!(
        error.raw_os_error(),
        Some(libc::ENOSPC),
        "{}: want ENOSPC, got {error}",
        path.display()
    );
}

/// Big files of up to 4 MiB until the volume is full.
fn fill_with_big_files(dir: &Path) -> usize {
    fs::create_dir_all(dir).unwrap();
    for index in 0.. {
        let limit = 4 << 20;
        let written = write_until_full(&dir.join(format!("big{index}")), 256 << 10, limit);
        if written < limit {
            return index + 1;
        }
    }
    unreachable!()
}

/// Small files (3 KiB) until a create or a write fails; it must be ENOSPC.
fn fill_with_small_files(dir: &Path, size: usize) -> usize {
    fs::create_dir_all(dir).unwrap();
    let data = e2e::pattern(7, size);
    for index in 0..1_000_000 {
        let path = dir.join(format!("small{index:06}"));
        if let Err(error) = fs::write(&path, &data) {
            assert_enospc(&error, &path);
            return index;
        }
    }
    panic!("a {IMAGE_MIB} MiB filesystem never filled up");
}

fn superblock_field(image: &Path, field: &str) -> u64 {
    let output = e2e::run_ok("dumpe2fs", &["-h", e2e::path_str(image)]);
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .find_map(|line| line.strip_prefix(field))
        .and_then(|value| value.trim().parse().ok())
        .unwrap_or_else(|| panic!("dumpe2fs reports {field}"))
}

fn reserved_blocks(image: &Path) -> u64 {
    superblock_field(image, "Reserved block count:")
}

/// The kernel's s_resv_clusters, which jext4 keeps as its emergency
/// reserve: 2 % of the blocks, at most 4,096.
fn emergency_reserve(image: &Path) -> u64 {
    (superblock_field(image, "Block count:") / 50).min(4096)
}

#[test]
fn e2e_full() {
    if !e2e::require_e2e() {
        return;
    }
    let scratch = e2e::scratch("full");
    let image = common::mkfs(scratch.path(), "full", IMAGE_MIB, &["-t", "ext4"]);
    let mnt = scratch.path().join("mnt");
    let reserved = reserved_blocks(&image);

    // Big files, as root: the whole volume, reserved blocks included.
    let mount = JextMount::mount(&image, &mnt, "");
    let files = fill_with_big_files(&mnt.join("big"));
    let (block_size, free, available) = e2e::statvfs(&mnt);
    eprintln!("big files: {files}, {free} blocks of {block_size} bytes left free");
    // Full as the kernel fills it: nothing available (df 100 %), and free
    // only the emergency reserve that deletions may draw on.
    assert_eq!(available, 0, "full, yet {available} blocks are available");
    let reserve = emergency_reserve(&image);
    assert!(
        free <= reserve + 64,
        "full, yet {free} blocks are free beyond the {reserve}-block emergency reserve"
    );
    // rm works on the full volume, and frees space at once.
    fs::remove_file(mnt.join("big/big0")).unwrap();
    assert!(e2e::statvfs(&mnt).1 > free, "deleting freed nothing");
    fs::write(mnt.join("after-rm"), e2e::pattern(1, 1 << 20)).unwrap();
    mount.unmount();
    e2e::fsck_clean(&image, "after filling with big files");

    // Many small files in the space of two deleted big files.
    let mount = JextMount::mount(&image, &mnt, "");
    fs::remove_file(mnt.join("big/big1")).unwrap();
    fs::remove_file(mnt.join("big/big2")).unwrap();
    let small = fill_with_small_files(&mnt.join("small"), 3000);
    eprintln!("small files: {small} before ENOSPC");
    assert!(small > 1000, "only {small} small files fit in 8 MiB");
    mount.unmount();
    e2e::fsck_clean(&image, "after filling with small files");

    // Inodes: empty files until none is left, which is ENOSPC as well.
    let mount = JextMount::mount(&image, &mnt, "");
    e2e::run_ok("rm", &["-rf", e2e::path_str(&mnt.join("big"))]);
    let empty = fill_with_small_files(&mnt.join("empty"), 0);
    eprintln!("empty files: {empty} before the inodes ran out");
    mount.unmount();
    e2e::fsck_clean(&image, "after running out of inodes");

    // Deleting makes room again.
    let mount = JextMount::mount(&image, &mnt, "");
    e2e::run_ok("rm", &["-rf", e2e::path_str(&mnt.join("empty"))]);
    e2e::run_ok("rm", &["-rf", e2e::path_str(&mnt.join("small"))]);
    let data = e2e::pattern(3, 5 << 20);
    fs::write(mnt.join("again"), &data).unwrap();
    assert_eq!(e2e::read_all(&mnt.join("again")), data);
    mount.unmount();
    e2e::fsck_clean(&image, "after deleting and writing again");

    reserved_blocks_stay_for_root(&image, &mnt, reserved);
}

/// As `nobody` (allow_other mount), writing stops with ENOSPC while the
/// reserved blocks are still free; root can then still write.
fn reserved_blocks_stay_for_root(image: &Path, mnt: &Path, reserved: u64) {
    let mount = JextMount::mount(image, mnt, "allow_other");
    let user_dir = mnt.join("user");
    fs::create_dir(&user_dir).unwrap();
    e2e::set_mode(&user_dir, 0o777);
    let target = user_dir.join("fill");
    let output = e2e::run(
        "setpriv",
        &[
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "dd",
            "if=/dev/zero",
            &format!("of={}", target.display()),
            "bs=256k",
            // Bounded: twice the image, should ENOSPC never come.
            &format!("count={}", IMAGE_MIB * 8),
        ],
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "dd as nobody never stopped");
    assert!(
        stderr.contains("No space left on device"),
        "dd as nobody: want ENOSPC, got: {stderr}"
    );
    let (_, free, available) = e2e::statvfs(mnt);
    eprintln!("as nobody: stopped with {free} blocks free, {reserved} reserved");
    assert_eq!(
        available, 0,
        "a user write stopped while blocks were available"
    );
    assert!(
        free + 64 >= reserved,
        "a user ate into the reserved blocks: {free} free, {reserved} reserved"
    );
    fs::write(mnt.join("root-writes"), e2e::pattern(4, 100_000)).unwrap();
    mount.unmount();
    e2e::fsck_clean(image, "after the unprivileged fill");
}

/// fallocate(2) that runs out of space part-way: the kernel keeps what it
/// allocated and grows the size over it (ext4_alloc_file_blocks), so the
/// size never hides allocated blocks; jext4 must leave the same shape.
fn fallocate_until_enospc(root: &Path) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt;
    use std::os::unix::io::AsRawFd;
    let path = root.join("preallocated");
    let file = fs::File::create(&path).unwrap();
    // SAFETY: fallocate on an open descriptor.
    let result = unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, (IMAGE_MIB as i64) << 20) };
    let error = std::io::Error::last_os_error();
    assert_eq!(result, -1, "fallocate of the whole volume succeeded");
    assert_eq!(error.raw_os_error(), Some(libc::ENOSPC), "{error}");
    let meta = fs::metadata(&path).unwrap();
    (meta.size(), meta.blocks() * 512)
}

#[test]
fn fallocate_enospc_grows_the_size_like_the_kernel() {
    if !e2e::require_e2e() {
        return;
    }
    let scratch = e2e::scratch("falloc-enospc");
    let image = common::mkfs(scratch.path(), "falloc", IMAGE_MIB, &["-t", "ext4"]);
    let reference = scratch.path().join("kernel.img");
    fs::copy(&image, &reference).unwrap();
    let mnt = scratch.path().join("mnt");
    let mount = JextMount::mount(&image, &mnt, "");
    let (size, allocated) = fallocate_until_enospc(&mnt);
    mount.unmount();
    e2e::fsck_clean(&image, "after fallocate ran out of space");
    let kmnt = scratch.path().join("kernel");
    let kernel = e2e::KernelMount::mount(&reference, &kmnt, false);
    let (kernel_size, kernel_allocated) = fallocate_until_enospc(&kmnt);
    kernel.unmount();
    eprintln!(
        "jext4: size {size}, {allocated} bytes allocated; kernel: size {kernel_size}, {kernel_allocated}"
    );
    // Allocators differ; the shape must not: a size grown over most of
    // what was allocated (the kernel's, like ours, stops at the last
    // extent that fit), never zero with the blocks kept.
    for (who, size, allocated) in [
        ("jext4", size, allocated),
        ("kernel", kernel_size, kernel_allocated),
    ] {
        assert!(
            size > 0 && allocated > 0,
            "{who}: size {size}, {allocated} allocated"
        );
        assert!(
            size <= allocated,
            "{who}: size {size} beyond the {allocated} bytes allocated"
        );
        assert!(
            size >= allocated / 2,
            "{who}: size {size} hides most of the {allocated} bytes allocated"
        );
    }
}
