//! The journal under the library API (in-process, no FUSE): freed
//! directory blocks are revoked, and the write-ahead guard never fires
//! under concurrent workloads (`Fs::journal_stats().jbd2.guard_violations`
//! stays 0; with debug assertions a violation would panic first).

mod common;

use jext4::api::Image;
use jext4::fs::MountOptions;
use std::time::Duration;

fn journal(image: &Image) -> jext4::journal::Jbd2Stats {
    image
        .fs()
        .journal_stats()
        .jbd2
        .expect("an ext4 image is journaled")
}

/// A directory's blocks are journaled metadata: when the directory goes,
/// they must be revoked (or replay could write an old copy over the
/// block's next owner) and forgotten (or a pending checkpoint could). The
/// kill tests found file data overwritten by an old directory block.
#[test]
fn freed_directory_blocks_are_revoked() {
    for (name, args) in [
        ("ext4-1k", &["-t", "ext4", "-b", "1024"][..]),
        ("ext3-1k", &["-t", "ext3", "-b", "1024"][..]),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let path = common::mkfs(dir.path(), name, 16, args);
        let image = Image::open(&path).unwrap();
        image.create_dir("/d", 0o755).unwrap();
        for index in 0..200 {
            image
                .write_file(&format!("/d/an-entry-with-a-long-name-{index:04}"), b"x")
                .unwrap();
        }
        image.sync().unwrap();
        let dir_blocks = image.metadata("/d").unwrap().size / 1024;
        assert!(dir_blocks >= 4, "the directory has {dir_blocks} blocks");
        for index in 0..200 {
            image
                .remove_file(&format!("/d/an-entry-with-a-long-name-{index:04}"))
                .unwrap();
        }
        image.sync().unwrap();
        let before = journal(&image).revokes_logged;
        image.remove_dir("/d").unwrap();
        image.sync().unwrap();
        let revoked = journal(&image).revokes_logged - before;
        println!("{name}: rmdir of a {dir_blocks}-block directory logged {revoked} revokes");
        assert!(
            revoked >= dir_blocks,
            "{name}: {revoked} revokes for {dir_blocks} directory blocks"
        );
        assert_eq!(journal(&image).guard_violations, 0);
        image.close().unwrap();
        common::assert_fsck_clean(&path);
    }
}

/// Four threads create, write, fsync, rename and delete through the
/// library with a short commit interval and a small journal (so that
/// commits, checkpoints and frozen copies all happen while handles run);
/// the guard counts no violation and e2fsck finds the result clean.
#[test]
fn concurrent_library_workload_never_trips_the_guard() {
    let dir = tempfile::tempdir().unwrap();
    let path = common::mkfs(
        dir.path(),
        "guard",
        32,
        &["-t", "ext4", "-b", "1024", "-J", "size=1"],
    );
    let options = MountOptions {
        commit_interval: Duration::from_secs(1),
        cache_size: 1 << 20,
        ..MountOptions::default()
    };
    let image = Image::open_with(&path, options).unwrap();
    std::thread::scope(|scope| {
        for thread in 0..4 {
            let image = &image;
            scope.spawn(move || {
                let top = format!("/w{thread}");
                image.create_dir(&top, 0o755).unwrap();
                for round in 0..150 {
                    let name = format!("{top}/f{round}");
                    let file = image.create(&name, 0o644).unwrap();
                    let data = vec![(round + thread) as u8; 100 + (round * 37) % 5000];
                    file.write_at(0, &data).unwrap();
                    if round % 5 == 0 {
                        file.sync_all().unwrap();
                    }
                    drop(file);
                    if round % 3 == 0 {
                        image.rename(&name, &format!("{top}/r{round}")).unwrap();
                    }
                    if round % 30 == 29 {
                        // A directory of several blocks, then its removal
                        // (revokes of directory blocks).
                        let sub = format!("{top}/sub{round}");
                        image.create_dir(&sub, 0o755).unwrap();
                        for entry in 0..60 {
                            image
                                .write_file(&format!("{sub}/a-long-entry-name-{entry:03}"), b"y")
                                .unwrap();
                        }
                        for entry in 0..60 {
                            image
                                .remove_file(&format!("{sub}/a-long-entry-name-{entry:03}"))
                                .unwrap();
                        }
                        image.remove_dir(&sub).unwrap();
                    }
                    if round >= 20 && round % 2 == 0 {
                        let old = format!("{top}/f{}", round - 19);
                        if image.metadata(&old).is_ok() {
                            image.remove_file(&old).unwrap();
                        }
                    }
                }
            });
        }
    });
    let stats = journal(&image);
    println!("{stats:?}");
    assert!(stats.commits > 10, "{stats:?}");
    assert!(stats.checkpoints > 0, "{stats:?}");
    assert!(stats.revokes_logged > 0, "{stats:?}");
    assert_eq!(stats.guard_violations, 0, "{stats:?}");
    image.close().unwrap();
    common::assert_fsck_clean(&path);
}
