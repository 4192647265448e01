//! The journal under the library API (in-process, no FUSE).

mod common;

use jext4::api::Image;

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
