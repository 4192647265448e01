//! Inode numbers a front end still names are not reused: FUSE requests
//! carry the number and not the generation, so a kernel that still holds a
//! freed number (a lookup racing an unlink) must not reach a new, unrelated
//! file through it. `Fs::remember`/`Fs::forget` follow the kernel's lookup
//! counts; the allocator skips remembered numbers.

mod common;

use jext4::Image;

#[test]
fn remembered_inode_numbers_are_not_reused_until_forgotten() {
    let dir = tempfile::tempdir().unwrap();
    let path = common::mkfs(dir.path(), "reuse", 8, &["-t", "ext4"]);
    let image = Image::open(&path).unwrap();
    image.create_dir("/d").unwrap();

    // Without a front end's reference, a freed number comes straight back
    // (the allocator takes the lowest free one): the check below can fail.
    image.write("/d/a", b"a").unwrap();
    let first = image.metadata("/d/a").unwrap().attr().ino;
    image.remove_file("/d/a").unwrap();
    image.write("/d/b", b"b").unwrap();
    assert_eq!(image.metadata("/d/b").unwrap().attr().ino, first);
    image.remove_file("/d/b").unwrap();

    // Named twice by the front end, then freed: two new files get other
    // numbers, and the stale one still shows the freed inode.
    image.write("/d/c", b"c").unwrap();
    let named = image.metadata("/d/c").unwrap().attr().ino;
    assert_eq!(named, first);
    image.fs().remember(named);
    image.fs().remember(named);
    image.remove_file("/d/c").unwrap();
    image.create_dir("/d/e").unwrap();
    image.write("/d/f", b"f").unwrap();
    for other in ["/d/e", "/d/f"] {
        assert_ne!(image.metadata(other).unwrap().attr().ino, named, "{other}");
    }
    let stale = image.fs().getattr(named);
    assert!(
        stale.as_ref().map_or(true, |attr| attr.nlink == 0),
        "the stale number still shows the freed inode, not a new file: {stale:?}"
    );

    // One forget of two leaves it named; the second frees the number.
    image.fs().forget(named, 1);
    image.write("/d/g", b"g").unwrap();
    assert_ne!(image.metadata("/d/g").unwrap().attr().ino, named);
    image.fs().forget(named, 1);
    image.write("/d/h", b"h").unwrap();
    assert_eq!(image.metadata("/d/h").unwrap().attr().ino, named);

    image.close().unwrap();
    common::assert_fsck_clean(&path);
}
