//! Fast commits written by jext4 (library API, no FUSE): fsync on a
//! fast_commit image writes fast commits, not full commits; a copy of the
//! image taken right after the last fsync — a crash — replays with the
//! kernel (a loop mount: its own fast-commit replay) to a tree holding
//! every fsync'd file, `e2fsck -fn` clean; jext4's replay gives the same
//! tree; e2fsck's own replay is reported for comparison.

mod common;
mod fast_commit_support;

use common::journal::{kernel_available, kernel_lock};
use fast_commit_support::*;
use jext4::Image;
use jext4::engine::fs::MountOptions;
use std::collections::BTreeMap;
use std::os::unix::fs::FileExt;
use std::os::unix::fs::OpenOptionsExt;
use std::time::Duration;

fn pattern(seed: usize, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| ((i * 31 + seed * 7) % 251) as u8)
        .collect()
}

/// The fsync'd files of `work`, as `Durable` (paths from the root).
struct Model {
    files: BTreeMap<String, Option<Vec<u8>>>,
}

impl Model {
    fn durable(&self) -> Durable {
        Durable {
            files: self.files.clone(),
        }
    }
}

fn options() -> MountOptions {
    MountOptions {
        // Only fsync commits: the crash comes before any timer would.
        commit_interval: Duration::from_secs(3600),
        ..MountOptions::default()
    }
}

/// Name changes, appends, truncates, each made durable by an fsync; the
/// directories they need are made first (making one needs a full commit).
fn workload(image: &Image, model: &mut Model) {
    image.create_dir("/d/sub").unwrap();
    image.create_dir("/d/gone").unwrap();
    image.remove_dir("/d/gone").unwrap();
    model.files.insert("d/sub".into(), None);
    let mut write = |path: &str, content: Vec<u8>| {
        let file = image
            .open_with(
                path,
                jext4::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .create(true)
                    .mode(0o640),
            )
            .unwrap();
        file.write_all_at(&content, 0).unwrap();
        file.sync_all().unwrap();
        model.files.insert(path[1..].to_string(), Some(content));
    };
    write("/d/a", pattern(1, 3000));
    write("/d/b", pattern(2, 5000));
    for round in 0..6 {
        write(&format!("/d/small-{round}"), pattern(round, 100 + round));
    }
    let a = image
        .open_with("/d/a", jext4::OpenOptions::new().read(true).write(true))
        .unwrap();
    a.write_all_at(&pattern(3, 2000), 3000).unwrap();
    a.sync_all().unwrap();
    drop(a);
    let mut a_content = pattern(1, 3000);
    a_content.extend(pattern(3, 2000));
    model.files.insert("d/a".into(), Some(a_content.clone()));

    image.hard_link("/d/b", "/d/b2").unwrap();
    image.remove_file("/d/old").unwrap();
    model.files.remove("d/old");
    image.rename("/d/a", "/d/a-renamed").unwrap();
    let b = image
        .open_with("/d/b", jext4::OpenOptions::new().read(true).write(true))
        .unwrap();
    b.set_len(1000).unwrap();
    b.sync_all().unwrap();
    drop(b);
    model.files.remove("d/a");
    model.files.insert("d/a-renamed".into(), Some(a_content));
    model.files.insert("d/b".into(), Some(pattern(2, 1000)));
    model.files.insert("d/b2".into(), Some(pattern(2, 1000)));

    let big: Vec<u8> = (0..300_000).map(|i| (i % 253) as u8).collect();
    let file = image
        .open_with(
            "/d/sub/big",
            jext4::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .mode(0o600),
        )
        .unwrap();
    file.write_all_at(&big, 0).unwrap();
    file.sync_data().unwrap();
    drop(file);
    model.files.insert("d/sub/big".into(), Some(big));
    let keep = image
        .open_with("/d/keep", jext4::OpenOptions::new().read(true).write(true))
        .unwrap();
    keep.write_all_at(b"EEP!", 1).unwrap();
    keep.sync_all().unwrap();
    model.files.insert("d/keep".into(), Some(b"kEEP!".to_vec()));
}

/// A 32 MiB ext4 image with the fast_commit feature, `name` plus the
/// block size.
fn fast_commit_image(dir: &std::path::Path, name: &str, block_size: &str) -> std::path::PathBuf {
    common::mkfs(
        dir,
        &format!("{name}{block_size}"),
        32,
        &["-t", "ext4", "-b", block_size, "-O", "fast_commit"],
    )
}

/// fsync of a directory (FSYNCDIR) on a fast_commit image is a fast commit
/// of the directory's transaction, never a full commit: the names created,
/// renamed, linked and removed in it and the files it names, written but
/// never fsynced themselves, are in the kernel's replay; jext4's replay
/// agrees.
#[test]
fn fsync_of_a_directory_is_a_fast_commit_the_kernel_replays() {
    if !common::require_tool("mke2fs") || !kernel_available() {
        return;
    }
    let _kernel = kernel_lock();
    for block_size in ["1024", "4096"] {
        let dir = tempfile::tempdir().unwrap();
        let path = fast_commit_image(dir.path(), "dirsync", block_size);
        let image = Image::options()
            .mount_options(options())
            .open(&path)
            .unwrap();
        image.create_dir("/d").unwrap();
        image.create_dir("/e").unwrap();
        image.write("/d/old", b"old\n").unwrap();
        image.write("/d/moved", b"moved\n").unwrap();
        image.sync().unwrap();
        let before = image.fs().fast_commit_stats().expect("fast commits on");
        let mut model = Model {
            files: BTreeMap::from([("d".to_string(), None), ("e".to_string(), None)]),
        };
        for (name, seed) in [("a", 1), ("b", 2)] {
            let content = pattern(seed, 3000 * seed);
            image.write(format!("/d/{name}"), &content).unwrap();
            model.files.insert(format!("d/{name}"), Some(content));
        }
        image.rename("/d/moved", "/d/renamed").unwrap();
        model
            .files
            .insert("d/renamed".into(), Some(b"moved\n".to_vec()));
        image.hard_link("/d/a", "/d/a2").unwrap();
        model.files.insert("d/a2".into(), Some(pattern(1, 3000)));
        image.remove_file("/d/old").unwrap();
        // Another directory's change: not the fsync's to make durable.
        image.write("/e/elsewhere", b"not synced\n").unwrap();
        image.sync_dir("/d").unwrap();
        assert!(matches!(
            image.sync_dir("/d/a"),
            Err(jext4::Error::NotDirectory)
        ));
        let crash = copy_image(&path, "crash");
        let stats = image.fs().fast_commit_stats().unwrap();
        // A crash: the mount is abandoned, never unmounted.
        std::mem::forget(image);
        assert_eq!(
            stats.commits,
            before.commits + 1,
            "{block_size}: one fast commit"
        );
        assert_eq!(
            stats.fallbacks, before.fallbacks,
            "{block_size}: a full commit"
        );
        let names = mounted_tree(&copy_image(&crash, "names"), "rw").unwrap();
        for gone in ["d/old", "d/moved"] {
            assert!(!names.contains_key(gone), "{block_size}: {gone} came back");
        }
        replays_agree(&crash, &model.durable(), block_size);
    }
}

#[test]
fn fsync_writes_fast_commits_that_the_kernel_replays() {
    if !common::require_tool("mke2fs") || !kernel_available() {
        return;
    }
    let _kernel = kernel_lock();
    for block_size in ["1024", "4096"] {
        let dir = tempfile::tempdir().unwrap();
        let path = fast_commit_image(dir.path(), "write", block_size);
        let image = Image::options()
            .mount_options(options())
            .open(&path)
            .unwrap();
        image.create_dir("/d").unwrap();
        image.write("/d/old", b"old\n").unwrap();
        image.write("/d/keep", b"keep\n").unwrap();
        image.sync().unwrap();
        let mut model = Model {
            files: BTreeMap::from([
                ("d".to_string(), None),
                ("d/keep".to_string(), Some(b"keep\n".to_vec())),
            ]),
        };
        let before = image.fs().fast_commit_stats().expect("fast commits on");
        workload(&image, &mut model);
        let crash = copy_image(&path, "crash");
        let stats = image.fs().fast_commit_stats().unwrap();
        eprintln!("{}", image.fs().stats_report());
        // A crash: the mount is abandoned, never unmounted.
        std::mem::forget(image);
        let fast_commits = stats.commits - before.commits;
        assert!(
            fast_commits >= 10,
            "{block_size}: only {fast_commits} fast commits"
        );

        // logdump decodes the records; every TAIL so far is sealed.
        let mut dump = Vec::new();
        jext4::engine::fs::logdump_image(&crash, &mut dump).unwrap();
        let dump = String::from_utf8(dump).unwrap();
        for expected in [
            "HEAD features 0x0",
            "ADD_RANGE inode",
            "CREAT parent",
            "INODE ",
        ] {
            assert!(dump.contains(expected), "no {expected} in:\n{dump}");
        }
        assert!(
            dump.contains("TAIL transaction") && !dump.contains("crc BAD"),
            "{dump}"
        );

        replays_agree(&crash, &model.durable(), block_size);
    }
}
