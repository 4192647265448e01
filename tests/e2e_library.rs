//! Library API: the `build_image` example, run as an unprivileged
//! user on a fresh image (no FUSE, no root), leaves an image that e2fsck
//! finds clean and that a kernel loop mount shows with the expected files
//! and contents.

// The jext4 binary, or the mounts and helpers of tests/common that use it.
#![cfg(feature = "cli")]

mod common;

use common::e2e::{self, KernelMount};
use std::fs;
use std::os::unix::fs::DirBuilderExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Build the example with the profile and target directory of this test
/// binary (or, if that profile is not one Cargo.toml defines, release),
/// and return its path.
fn build_example() -> PathBuf {
    let this = std::env::current_exe().expect("the test binary's path");
    // <target>/<profile dir>/deps/<test binary>
    let profile_dir = this.parent().and_then(Path::parent).expect("target layout");
    let target_dir = profile_dir.parent().expect("target layout");
    let profile = match profile_dir.file_name().and_then(|n| n.to_str()) {
        Some("debug") => "dev".to_string(),
        Some(name) => name.to_string(),
        None => panic!("unexpected target layout: {}", this.display()),
    };
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml");
    let mut failures = String::new();
    for (profile, dir) in [
        (profile.as_str(), profile_dir),
        ("release", &target_dir.join("release")),
    ] {
        let output = Command::new(env!("CARGO"))
            .args([
                "build",
                "--offline",
                "--example",
                "build_image",
                "--profile",
                profile,
            ])
            .arg("--manifest-path")
            .arg(&manifest)
            .arg("--target-dir")
            .arg(target_dir)
            .output()
            .expect("running cargo");
        let example = dir.join("examples/build_image");
        if output.status.success() && example.is_file() {
            return example;
        }
        failures.push_str(&String::from_utf8_lossy(&output.stderr));
    }
    panic!("cargo build --example build_image failed:\n{failures}");
}

fn check_tree(root: &Path, owner: u32) {
    let conf = fs::read(root.join("etc/app/app.conf")).unwrap();
    assert_eq!(conf, b"listen = 0.0.0.0:8080\nworkers = 4\n");
    let mut modules: Vec<String> = fs::read_dir(root.join("etc/app/conf.d"))
        .unwrap()
        .map(|entry| entry.unwrap().file_name().into_string().unwrap())
        .collect();
    modules.sort();
    assert_eq!(modules.len(), 20);
    for (n, name) in modules.iter().enumerate() {
        assert_eq!(name, &format!("{n:02}-module.conf"));
        let text = fs::read_to_string(root.join("etc/app/conf.d").join(name)).unwrap();
        assert_eq!(text, format!("module = {n}\n"));
    }
    // Written, fsynced, renamed over the older file.
    assert_eq!(
        fs::read(root.join("etc/app/state")).unwrap(),
        b"generation 2\n"
    );
    assert!(!root.join("etc/app/state.tmp").exists());
    let state = fs::metadata(root.join("etc/app/state")).unwrap();
    assert_eq!(state.mode() & 0o7777, 0o600);
    assert_eq!(
        state.uid(),
        owner,
        "files belong to the user who ran the library"
    );
    // Sparse in the middle.
    let data = fs::read(root.join("var/lib/app/data.bin")).unwrap();
    let chunk: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
    assert_eq!(data.len(), (10 << 20) + chunk.len());
    assert_eq!(data[..chunk.len()], chunk[..]);
    assert!(data[chunk.len()..10 << 20].iter().all(|&b| b == 0));
    assert_eq!(data[10 << 20..], chunk[..]);
    let link = fs::read_link(root.join("var/lib/app/config")).unwrap();
    assert_eq!(link, Path::new("../../../etc/app/app.conf"));
    // The relative link resolves, through the kernel, to the config file.
    assert_eq!(
        fs::read(root.join("var/lib/app/config")).unwrap(),
        fs::read(root.join("etc/app/app.conf")).unwrap()
    );
}

#[test]
fn e2e_library() {
    if !e2e::require_e2e() {
        return;
    }
    let scratch = e2e::scratch("library");
    // Copied where an unprivileged user may run it.
    let example = scratch.path().join("build_image");
    fs::copy(build_example(), &example).unwrap();
    const NOBODY: u32 = 65534;
    for (name, args) in [("ext4", &["-t", "ext4"][..]), ("ext2", &["-t", "ext2"][..])] {
        let image = common::mkfs(scratch.path(), name, 64, args);
        std::os::unix::fs::chown(&image, Some(NOBODY), Some(NOBODY)).unwrap();
        let output = e2e::run(
            "setpriv",
            &[
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                e2e::path_str(&example),
                e2e::path_str(&image),
            ],
        );
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success(),
            "build_image on {name} failed: {stdout}{}",
            String::from_utf8_lossy(&output.stderr)
        );
        assert!(stdout.contains("/etc/app/state: generation 2"), "{stdout}");
        assert!(stdout.contains("closed cleanly"), "{stdout}");
        e2e::fsck_clean(&image, &format!("after the library example on {name}"));
        let kernel = KernelMount::mount(&image, &scratch.path().join("mnt"), true);
        check_tree(&kernel.mountpoint, NOBODY);
        kernel.unmount();
    }
}

/// A release that arrives after the unlink already freed the inode (FUSE
/// sends release asynchronously after close; the kernel may also hold an
/// inode number past its deletion) must not free the inode a second time.
#[test]
fn e2e_library_release_after_delete() {
    if !e2e::require_e2e() {
        return;
    }
    let scratch = e2e::scratch("release-after-delete");
    let image = common::mkfs(scratch.path(), "release", 32, &["-t", "ext4"]);
    let opened = jext4::Image::open(&image).unwrap();
    let fs = opened.fs();
    let root = jext4::engine::format::superblock::ROOT_INO;
    let caller = jext4::engine::fs::Caller::ROOT;
    for round in 0..3u32 {
        let name = format!("file{round}");
        let file = fs.create(root, name.as_bytes(), 0o644, caller).unwrap();
        fs.write(file.ino, 0, b"data", caller).unwrap();
        fs.unlink(root, name.as_bytes(), caller).unwrap(); // not open: freed now
        // The late open/release pair of a handle that outlived the name.
        if fs.open_file(file.ino).is_ok() {
            fs.release_file(file.ino)
                .expect("releasing a deleted inode is not corruption");
        }
        assert!(
            !fs.is_read_only(),
            "round {round}: the filesystem turned read-only"
        );
    }
    opened.close().unwrap();
    e2e::fsck_clean(&image, "after late releases");
}

/// `Image::remove_dir_all` removes a nested tree (files, symlinks, empty
/// and full directories, a tree deeper than it is wide), gives every block
/// and inode back, refuses a file, and leaves an e2fsck-clean image.
#[test]
fn remove_dir_all_removes_a_tree_and_gives_the_space_back() {
    use jext4::Image;
    let dir = tempfile::tempdir().unwrap();
    let path = common::mkfs(dir.path(), "rmtree", 16, &["-t", "ext4", "-b", "1024"]);
    let image = Image::open(&path).unwrap();
    image.create_dir("/keep").unwrap();
    image.write("/keep/file", b"stays").unwrap();
    let before = image.fs().statfs();
    let mut deep = String::from("/tree");
    for level in 0..40 {
        image.create_dir(&deep).unwrap();
        image
            .write(format!("{deep}/f{level}"), vec![level as u8; 3000])
            .unwrap();
        image
            .symlink("../somewhere", format!("{deep}/link"))
            .unwrap();
        image
            .create_dir_with(
                format!("{deep}/empty"),
                jext4::DirBuilder::new().mode(0o700),
            )
            .unwrap();
        deep.push_str(&format!("/d{level}"));
    }
    assert!(matches!(
        image.remove_dir_all("/keep/file"),
        Err(jext4::Error::NotDirectory)
    ));
    image.remove_dir_all("/tree").unwrap();
    assert!(matches!(
        image.metadata("/tree"),
        Err(jext4::Error::NotFound)
    ));
    assert_eq!(image.read("/keep/file").unwrap(), b"stays");
    image.sync().unwrap();
    let after = image.fs().statfs();
    assert_eq!(after.free_files, before.free_files);
    assert_eq!(after.free_blocks, before.free_blocks);
    image.close().unwrap();
    common::assert_fsck_clean(&path);
}
