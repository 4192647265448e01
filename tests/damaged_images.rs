//! Images jext4 did not make, odd or damaged, answered as the kernel
//! answers them: old ext2 images without extended attributes, directories
//! whose htree index is damaged, entries that point past the initialised
//! inodes, and operations that meet corruption half way (the journal
//! aborts, so the disk keeps its last committed state).

mod common;

use common::server::{Server, fuse_available, jext4};
use common::{assert_fsck_clean, mkfs};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::Command;

/// `debugfs -w -f -` with `commands`, asserting it ran.
fn debugfs_write(image: &Path, commands: &str) {
    use std::io::Write;
    let mut child = Command::new("debugfs")
        .args(["-w", "-f", "-"])
        .arg(image)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("running debugfs");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(commands.as_bytes())
        .unwrap();
    let output = child.wait_with_output().unwrap();
    assert!(output.status.success(), "debugfs: {output:?}");
}

fn features(image: &Path) -> String {
    let output = Command::new("dumpe2fs")
        .arg("-h")
        .arg(image)
        .output()
        .unwrap();
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .find(|line| line.starts_with("Filesystem features:"))
        .unwrap_or_default()
        .to_string()
}

/// An ext2 image made without `ext_attr` (old images, the Hurd's): files
/// the caller does not own open and list as on the kernel, reading an
/// attribute finds none, and the first attribute set turns the feature on
/// in the same transaction, as the kernel's `ext4_xattr_update_super_block`.
#[test]
fn ext2_without_ext_attr_reads_and_gains_the_feature() {
    if !fuse_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = mkfs(
        dir.path(),
        "noxattr",
        16,
        &["-t", "ext2", "-O", "^ext_attr"],
    );
    let payload = dir.path().join("payload");
    std::fs::write(&payload, b"hello from an old image\n").unwrap();
    debugfs_write(
        &image,
        &format!(
            "mkdir home\nwrite {} home/note\nsif home uid 1000\nsif home/note uid 1000\n\
             sif <2> uid 1000\n",
            payload.display()
        ),
    );
    assert!(!features(&image).contains("ext_attr"));

    let server = Server::start(&image, "");
    let root = &server.mountpoint;
    let listed: Vec<_> = std::fs::read_dir(root.join("home"))
        .expect("listing a directory the caller does not own")
        .map(|entry| entry.unwrap().file_name())
        .collect();
    assert_eq!(listed, ["note"]);
    let note = root.join("home/note");
    assert_eq!(std::fs::metadata(&note).unwrap().uid(), 1000);
    assert_eq!(
        std::fs::read(&note).expect("reading a file the caller does not own"),
        b"hello from an old image\n"
    );
    let get = Command::new("getfattr")
        .args(["-n", "user.a"])
        .arg(&note)
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&get.stderr).contains("No such attribute"),
        "getfattr: {get:?}"
    );
    // `jext4 sync` and `stats` talk to the server through the mount root.
    jext4(&["sync", root.to_str().unwrap()]);
    assert!(jext4(&["stats", root.to_str().unwrap()]).contains("mounted true"));
    let set = Command::new("setfattr")
        .args(["-n", "user.a", "-v", "1"])
        .arg(&note)
        .status()
        .unwrap();
    assert!(set.success());
    server.unmount().assert_clean_exit();

    assert!(
        features(&image).contains("ext_attr"),
        "{}",
        features(&image)
    );
    assert_fsck_clean(&image);
}
