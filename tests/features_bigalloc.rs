//! bigalloc images (clusters of 16 blocks by mke2fs's default: the block
//! bitmap counts clusters, free counts are clusters, extents stay in
//! blocks). jext4 reads and writes them as the kernel does: a file's
//! blocks of one logical cluster share one physical cluster at their own
//! offsets, a cluster is freed with the last block of it, i_blocks and
//! quota count whole clusters, each tree and xattr block takes a cluster.
//! jext4 writes a workload, e2fsck is clean (it checks the cluster rules
//! and counts) and the kernel reads the same tree; the kernel writes,
//! jext4 reads the same and changes it, punching and truncating inside the
//! kernel's clusters; st_blocks after each step of a sequence of partial
//! cluster writes, punches and truncates is the kernel's; statfs is the
//! kernel's. Images written by the kernel and made by `mke2fs -d`, at 1
//! KiB blocks (16 KiB clusters, the filesystem starting at block 0) and 4
//! KiB blocks (64 KiB clusters).

// The jext4 binary, or the mounts and helpers of tests/common that use it.
#![cfg(feature = "cli")]

mod common;

use common::e2e::{self, JextMount, KernelMount, Params};
use std::path::Path;

const TREE_ENTRIES: usize = 1500;
const TREE_BYTES: u64 = 30 << 20;

/// The kernel's tree and statfs of `image` (a read-only loop mount), then
/// jext4's (`-o ro`): both must agree.
fn jext4_reads_as_the_kernel(image: &Path, mnt: &Path) -> usize {
    let kernel = KernelMount::mount(image, mnt, true);
    let by_kernel = e2e::snapshot(mnt);
    let kernel_statfs = e2e::statfs_counts(mnt);
    kernel.unmount();
    let mount = JextMount::mount(image, mnt, "ro");
    let by_jext4 = e2e::snapshot(mnt);
    let jext4_statfs = e2e::statfs_counts(mnt);
    mount.unmount();
    e2e::assert_same(&by_kernel, &by_jext4, ("kernel", "jext4"));
    assert_eq!(
        jext4_statfs, kernel_statfs,
        "statfs [bsize, blocks, bfree, bavail, files, ffree]: jext4 vs the kernel"
    );
    e2e::fsck_clean(image, "after jext4's read-only mount");
    by_kernel.len()
}

/// A bigalloc image of `mib` MiB with `block_size`-byte blocks and
/// mke2fs's default clusters of 16 blocks, `extra` options besides.
fn bigalloc_image(
    dir: &Path,
    name: &str,
    block_size: &str,
    mib: u64,
    extra: &[&str],
) -> std::path::PathBuf {
    let mut args = vec!["-t", "ext4", "-b", block_size, "-O", "bigalloc"];
    args.extend_from_slice(extra);
    common::mkfs(dir, name, mib, &args)
}

/// The real tree and the workload, written and synced through the mount
/// at `mnt`; what the workload's files must hold.
fn fill(mnt: &Path) -> Vec<e2e::Expect> {
    let params = Params {
        block_size: e2e::statvfs(mnt).0,
        extents: true,
        big_dir_entries: 1500,
    };
    e2e::copy_real_tree(&mnt.join("tree"), TREE_ENTRIES, TREE_BYTES);
    let outcome = e2e::workload(mnt, &params);
    drop(outcome.held);
    e2e::syncfs(mnt);
    outcome.expect
}

fn kernel_writes(name: &str, block_size: &str) {
    if !e2e::require_e2e() {
        return;
    }
    let scratch = e2e::scratch(name);
    let image = bigalloc_image(scratch.path(), name, block_size, 256, &[]);
    let mnt = scratch.path().join("mnt");
    let kernel = KernelMount::mount(&image, &mnt, false);
    let expect = fill(&mnt);
    kernel.unmount();
    e2e::fsck_clean(&image, "after the kernel wrote");
    let names = jext4_reads_as_the_kernel(&image, &mnt);
    let mount = JextMount::mount(&image, &mnt, "ro");
    e2e::verify(&mnt, &expect);
    mount.unmount();
    eprintln!("{name}: {names} names read as the kernel reads them");
    jext4_cuts_into_clusters(&image, &mnt, "tree");
}

/// Through jext4, cut into the clusters another writer allocated (the
/// kernel, mke2fs -d) under `tree`: punch holes and truncate inside
/// clusters of its files, write into the holes again, delete some;
/// e2fsck is clean and the kernel reads what jext4 showed.
fn jext4_cuts_into_clusters(image: &Path, mnt: &Path, tree: &str) {
    use std::os::unix::fs::FileExt;
    let mount = JextMount::mount(image, mnt, "");
    let block = e2e::statvfs(mnt).0;
    let mut files: Vec<std::path::PathBuf> = Vec::new();
    collect_files(&mnt.join(tree), &mut files);
    files.sort();
    let mut changed = 0;
    for (index, path) in files.iter().enumerate() {
        let size = std::fs::metadata(path).unwrap().len();
        if size < 3 * block {
            continue;
        }
        let file = std::fs::OpenOptions::new().write(true).open(path).unwrap();
        match index % 4 {
            // A hole of a block and a half from inside the first cluster.
            0 => e2e::fallocate(&file, PUNCH_HOLE, block as i64 + 100, block as i64 * 3 / 2),
            // Cut inside a cluster, then grow back past it with data.
            1 => {
                file.set_len(size / 2 + 7).unwrap();
                file.write_all_at(&e2e::pattern(index as u64, 3000), size / 2 + 5000)
                    .unwrap();
            }
            // A punched block written again (its cluster kept).
            2 => {
                e2e::fallocate(&file, PUNCH_HOLE, block as i64, block as i64);
                file.write_all_at(&e2e::pattern(index as u64, 10), block + 1)
                    .unwrap();
            }
            _ => {
                drop(file);
                std::fs::remove_file(path).unwrap();
            }
        }
        changed += 1;
    }
    assert!(changed > 50, "only {changed} files to change");
    e2e::syncfs(mnt);
    let by_jext4 = e2e::snapshot(mnt);
    mount.unmount();
    e2e::fsck_clean(image, "after jext4 cut into the kernel's clusters");
    let kernel = KernelMount::mount(image, mnt, true);
    let by_kernel = e2e::snapshot(mnt);
    kernel.unmount();
    e2e::assert_same(&by_jext4, &by_kernel, ("jext4", "kernel"));
}

const PUNCH_HOLE: i32 = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;

fn collect_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        let kind = entry.file_type().unwrap();
        if kind.is_dir() {
            collect_files(&entry.path(), out);
        } else if kind.is_file() {
            out.push(entry.path());
        }
    }
}

#[test]
fn the_kernel_writes_bigalloc_1k_and_jext4_reads_it() {
    kernel_writes("bigalloc-1k", "1024");
}

#[test]
fn the_kernel_writes_bigalloc_4k_and_jext4_reads_it() {
    kernel_writes("bigalloc-4k", "4096");
}

#[test]
fn a_bigalloc_image_made_by_mke2fs_d_reads_as_the_kernel_reads_it_and_takes_changes() {
    if !e2e::require_e2e() {
        return;
    }
    let scratch = e2e::scratch("bigalloc-mkfs-d");
    let source = scratch.path().join("source");
    e2e::copy_real_tree(&source, TREE_ENTRIES, 20 << 20);
    let source_arg = source.to_str().unwrap();
    let args = ["-t", "ext4", "-O", "bigalloc", "-d", source_arg];
    let image = common::mkfs(scratch.path(), "bigalloc-mkfs-d", 128, &args);
    e2e::fsck_clean(&image, "after mke2fs -d");
    let mnt = scratch.path().join("mnt");
    jext4_reads_as_the_kernel(&image, &mnt);
    // mke2fs -d allocates as libext2fs does: jext4 cuts into those
    // clusters too.
    jext4_cuts_into_clusters(&image, &mnt, "");
}

/// jext4 writes the workload on a bigalloc image; e2fsck is clean (the
/// cluster allocation rules, the cluster bitmaps, i_blocks in clusters)
/// and the kernel reads the same tree and the same statfs.
fn jext4_writes(name: &str, block_size: &str) {
    if !e2e::require_e2e() {
        return;
    }
    let scratch = e2e::scratch(name);
    let image = bigalloc_image(scratch.path(), name, block_size, 256, &[]);
    let mnt = scratch.path().join("mnt");
    let mount = JextMount::mount(&image, &mnt, "");
    let expect = fill(&mnt);
    let written = e2e::snapshot(&mnt);
    let jext4_statfs = e2e::statfs_counts(&mnt);
    mount.unmount();
    e2e::fsck_clean(&image, "after the workload through jext4");
    let kernel = KernelMount::mount(&image, &mnt, true);
    let by_kernel = e2e::snapshot(&mnt);
    e2e::verify(&mnt, &expect);
    let kernel_statfs = e2e::statfs_counts(&mnt);
    kernel.unmount();
    e2e::assert_same(&written, &by_kernel, ("jext4", "kernel"));
    assert_eq!(
        jext4_statfs, kernel_statfs,
        "statfs [bsize, blocks, bfree, bavail, files, ffree]: jext4 vs the kernel"
    );
    eprintln!(
        "{name}: {} names written, read back by the kernel",
        written.len()
    );
}

#[test]
fn jext4_writes_bigalloc_1k_and_the_kernel_reads_it() {
    jext4_writes("bigalloc-w1k", "1024");
}

#[test]
fn jext4_writes_bigalloc_4k_and_the_kernel_reads_it() {
    jext4_writes("bigalloc-w4k", "4096");
}

/// One file through writes, punches and truncates that land inside
/// clusters, fsynced after each: its st_blocks after every step, and the
/// free count once everything is deleted, are the kernel's.
fn cluster_steps(root: &Path, block: u64) -> Vec<(String, u64)> {
    use std::os::unix::fs::{FileExt, MetadataExt};
    let path = root.join("clusters");
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)
        .unwrap();
    let mut seen = Vec::new();
    let mut step = |what: &str, file: &std::fs::File| {
        file.sync_all().unwrap();
        seen.push((what.to_string(), std::fs::metadata(&path).unwrap().blocks()));
    };
    let byte = |at: u64| e2e::pattern(at, 1);
    file.write_all_at(&byte(1), block).unwrap();
    step("a byte in block 1", &file);
    file.write_all_at(&byte(3), 3 * block + 9).unwrap();
    step("block 3, same cluster", &file);
    file.write_all_at(&byte(20), 20 * block).unwrap();
    step("block 20, the second cluster", &file);
    e2e::fallocate(&file, PUNCH_HOLE, block as i64, block as i64);
    step("punch block 1 (block 3 keeps the cluster)", &file);
    e2e::fallocate(&file, PUNCH_HOLE, 3 * block as i64, block as i64);
    step("punch block 3 (the cluster's last)", &file);
    file.set_len(18 * block + 5).unwrap();
    step("truncate inside the second cluster", &file);
    file.write_all_at(&e2e::pattern(7, 10 * block as usize), 14 * block)
        .unwrap();
    step("blocks 14..24 across a cluster edge", &file);
    e2e::fallocate(&file, 0, 40 * block as i64, 30 * block as i64);
    step("fallocate blocks 40..70", &file);
    e2e::fallocate(&file, PUNCH_HOLE, 41 * block as i64, 28 * block as i64);
    step("punch 41..69 (both end clusters kept)", &file);
    // Fragments: every other block over 10 clusters, then half punched:
    // a tree with one leaf block (a cluster of its own; few enough that
    // the leaf never splits, where the kernel's split policy is its own).
    for index in 0..80u64 {
        file.write_all_at(&byte(index), (100 + 2 * index) * block)
            .unwrap();
    }
    step("80 fragments", &file);
    e2e::fallocate(&file, PUNCH_HOLE, 100 * block as i64, 80 * block as i64);
    step("half the fragments punched", &file);
    e2e::set_xattr(&path, "user.big", &e2e::pattern(9, 700)).unwrap();
    step("an xattr block", &file);
    // Still more extents than the root holds: the tree keeps its leaf
    // (the kernel keeps a tree's depth; jext4 moves a leaf that fits
    // back into the root).
    file.set_len(200 * block + 3).unwrap();
    step("truncate among the fragments", &file);
    drop(file);
    seen
}

#[test]
fn st_blocks_follow_clusters_as_the_kernel_counts_them() {
    if !e2e::require_e2e() {
        return;
    }
    for block_size in ["1024", "4096"] {
        let name = format!("bigalloc-steps-{block_size}");
        let scratch = e2e::scratch(&name);
        let image = bigalloc_image(scratch.path(), &name, block_size, 64, &[]);
        let copy = scratch.path().join("copy.img");
        std::fs::copy(&image, &copy).unwrap();
        let mnt = scratch.path().join("mnt");
        let block: u64 = block_size.parse().unwrap();

        let kernel = KernelMount::mount(&image, &mnt, false);
        let fresh_kernel = e2e::statvfs(&mnt).1;
        let by_kernel = cluster_steps(&mnt, block);
        std::fs::remove_file(mnt.join("clusters")).unwrap();
        e2e::syncfs(&mnt);
        let emptied_kernel = e2e::statvfs(&mnt).1;
        kernel.unmount();

        let mount = JextMount::mount(&copy, &mnt, "");
        let fresh = e2e::statvfs(&mnt).1;
        let by_jext4 = cluster_steps(&mnt, block);
        mount.unmount();
        e2e::fsck_clean(&copy, "after the cluster steps through jext4");
        let mount = JextMount::mount(&copy, &mnt, "");
        std::fs::remove_file(mnt.join("clusters")).unwrap();
        e2e::syncfs(&mnt);
        let emptied = e2e::statvfs(&mnt).1;
        mount.unmount();
        e2e::fsck_clean(&copy, "after the file was deleted");

        assert_eq!(
            by_jext4, by_kernel,
            "{block_size}: st_blocks after each step, jext4 vs the kernel"
        );
        assert_eq!(
            (fresh, emptied),
            (fresh_kernel, emptied_kernel),
            "free blocks"
        );
        assert_eq!(fresh, emptied, "{block_size}: a cluster leaked");
        let cluster_sectors = 16 * block / 512;
        assert!(
            by_jext4
                .iter()
                .any(|(_, sectors)| *sectors == 2 * cluster_sectors),
            "{by_jext4:?}"
        );
    }
}

/// Filled to ENOSPC through jext4, a bigalloc image stays clean: the
/// space budget counts clusters, so no commit fails at the wall, and
/// what is left free is less than a cluster per file in flight.
#[test]
fn a_bigalloc_image_fills_to_enospc_and_stays_clean() {
    if !e2e::require_e2e() {
        return;
    }
    // With delalloc too: its reservations (a cluster per held block) are
    // written out at the wall, and what they held back is used.
    for options in ["", "delalloc"] {
        let name = format!("bigalloc-full{options}");
        let scratch = e2e::scratch(&name);
        let image = bigalloc_image(scratch.path(), &name, "1024", 32, &["-m", "0"]);
        let mnt = scratch.path().join("mnt");
        let mount = JextMount::mount(&image, &mnt, options);
        let mut written = 0u64;
        let mut full = false;
        for index in 0..10_000u64 {
            let size = 500 + (index * 7919) % 40_000;
            let data = e2e::pattern(index, size as usize);
            match std::fs::write(mnt.join(format!("f{index}")), data) {
                Ok(()) => written += size,
                Err(error) if error.raw_os_error() == Some(libc::ENOSPC) => {
                    full = true;
                    break;
                }
                Err(error) => panic!("{name}: write {index}: {error}"),
            }
        }
        assert!(full, "{name}: never reached ENOSPC ({written} bytes)");
        e2e::syncfs(&mnt);
        let (block, free, _) = e2e::statvfs(&mnt);
        mount.unmount();
        // The emergency reserve stays (s_resv_clusters: 2 % of the
        // clusters), and less than a file's worst case besides.
        let clusters = (32 << 20) / (16 * block);
        let reserve = (clusters / 50).min(4096) * 16;
        assert!(
            free >= reserve && free < reserve + 16 * 4,
            "{name}: {free} free blocks of {block} bytes left at ENOSPC (reserve {reserve})"
        );
        e2e::fsck_clean(&image, "at ENOSPC");
        eprintln!("{name}: {written} bytes written, {free} blocks free at ENOSPC");
    }
}

/// What the kernel refuses, refused with its reason: bigalloc without
/// extents (ext4_check_feature_compatibility; mke2fs will not make one,
/// debugfs does). Delayed allocation works there (its reservations a
/// cluster per block), and so do the image tools' writes.
#[test]
fn bigalloc_refusals_delalloc_and_the_image_tools() {
    if !common::require_tool("mke2fs") || !common::require_tool("debugfs") {
        return;
    }
    let scratch = tempfile::tempdir().unwrap();
    let image = common::mkfs(
        scratch.path(),
        "bigalloc-rw",
        64,
        &["-t", "ext4", "-b", "1024", "-O", "bigalloc"],
    );
    let delalloc = jext4::ImageOptions::new()
        .delalloc(true)
        .open(&image)
        .unwrap();
    for index in 0..40u64 {
        let data = e2e::pattern(index, (index * 3001 % 70_000) as usize + 1);
        delalloc.write(format!("/d{index}"), &data).unwrap();
    }
    delalloc.close().unwrap();
    e2e::fsck_clean(&image, "after delalloc writes");
    let reopened = jext4::Image::open_read_only(&image).unwrap();
    for index in 0..40u64 {
        let data = e2e::pattern(index, (index * 3001 % 70_000) as usize + 1);
        assert_eq!(reopened.read(format!("/d{index}")).unwrap(), data);
    }
    drop(reopened);
    let root = format!("{}:/", e2e::path_str(&image));
    let made = e2e::run(e2e::JEXT4, &["mkdir", &format!("{root}new")]);
    assert!(
        made.status.success(),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
    let listed = e2e::run(e2e::JEXT4, &["ls", &root]);
    let names = String::from_utf8_lossy(&listed.stdout);
    assert!(
        names.lines().any(|name| name == "new") && names.lines().count() == 42,
        "{names}"
    );
    e2e::fsck_clean(&image, "after jext4 mkdir");

    let changed = e2e::run(
        "debugfs",
        &["-w", "-R", "feature ^extent", e2e::path_str(&image)],
    );
    assert!(changed.status.success());
    let refused = jext4::engine::fs::Fs::open(&image, jext4::engine::fs::MountOptions::default())
        .err()
        .expect("bigalloc without extents")
        .to_string();
    assert!(
        refused.contains("bigalloc") && refused.contains("extents"),
        "{refused}"
    );
}

/// A fast symlink with an xattr block owns that block's cluster in
/// i_blocks (the kernel's `ext4_inode_is_fast_symlink` takes off
/// `EXT4_CLUSTER_SIZE >> 9`): one the kernel made and one jext4 made each
/// read and delete through the other, e2fsck clean.
#[test]
fn fast_symlinks_with_an_xattr_block_stay_fast() {
    if !e2e::require_e2e() {
        return;
    }
    let scratch = e2e::scratch("bigalloc-symlink");
    let image = bigalloc_image(scratch.path(), "bigalloc-symlink", "1024", 64, &[]);
    let mnt = scratch.path().join("mnt");
    let value = format!("0x{}", "ab".repeat(400));
    let make = |mnt: &Path, name: &str| {
        // A target whose bytes would be block numbers if read as a map.
        std::os::unix::fs::symlink("\u{40}\u{10}/target", mnt.join(name)).unwrap();
        let path = mnt.join(name);
        let set = e2e::run(
            "setfattr",
            &[
                "-h",
                "-n",
                "trusted.big",
                "-v",
                &value,
                e2e::path_str(&path),
            ],
        );
        assert!(
            set.status.success(),
            "{}",
            String::from_utf8_lossy(&set.stderr)
        );
    };
    let kernel = KernelMount::mount(&image, &mnt, false);
    make(&mnt, "by-kernel");
    kernel.unmount();
    let mount = JextMount::mount(&image, &mnt, "");
    make(&mnt, "by-jext4");
    for name in ["by-kernel", "by-jext4"] {
        let target = std::fs::read_link(mnt.join(name)).unwrap();
        assert_eq!(target, Path::new("\u{40}\u{10}/target"), "{name}");
    }
    std::fs::remove_file(mnt.join("by-kernel")).unwrap();
    mount.unmount();
    e2e::fsck_clean(&image, "after jext4's symlink and the kernel's removal");
    let kernel = KernelMount::mount(&image, &mnt, false);
    let target = std::fs::read_link(mnt.join("by-jext4")).unwrap();
    assert_eq!(target, Path::new("\u{40}\u{10}/target"));
    std::fs::remove_file(mnt.join("by-jext4")).unwrap();
    kernel.unmount();
    e2e::fsck_clean(&image, "after the kernel removed jext4's symlink");
}
