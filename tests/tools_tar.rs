//! `jext4 tar` against GNU tar: an archive GNU tar writes with `--xattrs
//! --acls --sparse` (pax, and gzip, xz and zstd of it; the GNU format's
//! old sparse members too) extracted into an image reads back through a
//! kernel loop mount as the tree it was made from; an archive jext4
//! writes from an image, extracted by GNU tar, gives that tree again.

// The jext4 binary, or the mounts and helpers of tests/common that use it.
#![cfg(feature = "cli")]

mod common;
#[path = "tools_support/mod.rs"]
mod tools_support;

use common::journal::{Mount, kernel_available, kernel_lock};
use std::path::Path;
use std::process::Command;
use tools_support::{assert_same, build_tree, jext4_tool, snapshot, without_atimes};

const GNU_TAR_ATTRIBUTES: &[&str] = &["--xattrs", "--xattrs-include=*", "--acls"];

fn gnu_tar(args: &[&str], dir: &Path) {
    let output = Command::new("tar")
        .args(GNU_TAR_ATTRIBUTES)
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "tar {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

fn arg(image: &Path, path: &str) -> String {
    format!("{}:{path}", image.display())
}

#[test]
fn gnu_tar_archives_extract_into_an_image_as_their_tree() {
    if !kernel_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let tree = dir.path().join("tree");
    build_tree(&tree);
    let expected = snapshot(&tree);
    let archive = dir.path().join("tree.tar");
    gnu_tar(
        &[
            "--sparse",
            "-cf",
            archive.to_str().unwrap(),
            "-C",
            tree.to_str().unwrap(),
            ".",
        ],
        dir.path(),
    );
    let mut archives = vec![("plain", archive.clone())];
    for (name, program) in [("gzip", "gzip"), ("xz", "xz"), ("zstd", "zstd")] {
        if !common::require_tool(program) {
            continue;
        }
        let compressed = dir.path().join(format!("tree.tar.{name}"));
        let output = Command::new(program)
            .args(["-c"])
            .arg(&archive)
            .output()
            .unwrap();
        std::fs::write(&compressed, output.stdout).unwrap();
        archives.push((name, compressed));
    }
    let image = common::mkfs(dir.path(), "tar-in", 256, &["-t", "ext4"]);
    for (name, archive) in &archives {
        let (code, _, stderr) = jext4_tool(&["mkdir", &arg(&image, &format!("/{name}"))]);
        assert_eq!(code, 0, "{stderr}");
        let (code, _, stderr) = jext4_tool(&[
            "tar",
            "-x",
            "-f",
            archive.to_str().unwrap(),
            &arg(&image, &format!("/{name}")),
        ]);
        assert_eq!(code, 0, "tar -x of the {name} archive: {stderr}");
        assert!(stderr.is_empty(), "{stderr}");
    }
    common::assert_fsck_clean(&image);
    let _kernel = kernel_lock();
    let mount = Mount::new(&image, "ro").expect("loop mount");
    for (name, _) in &archives {
        assert_same(&expected, &snapshot(&mount.point.join(name)));
    }
    mount.unmount();
}

#[test]
fn old_gnu_sparse_members_keep_their_holes() {
    let dir = tempfile::tempdir().unwrap();
    let tree = dir.path().join("tree");
    std::fs::create_dir(&tree).unwrap();
    let file = std::fs::File::create(tree.join("sparse")).unwrap();
    use std::os::unix::fs::FileExt;
    file.write_all_at(&[7u8; 4096], 1 << 20).unwrap();
    file.set_len(4 << 20).unwrap();
    let archive = dir.path().join("gnu.tar");
    let status = Command::new("tar")
        .args(["--format=gnu", "--sparse", "-cf"])
        .arg(&archive)
        .arg("-C")
        .arg(&tree)
        .arg(".")
        .status()
        .unwrap();
    assert!(status.success());
    let image = common::mkfs(dir.path(), "gnu-sparse", 64, &["-t", "ext4"]);
    let (code, _, stderr) =
        jext4_tool(&["tar", "-xf", archive.to_str().unwrap(), &arg(&image, "/")]);
    assert_eq!(code, 0, "{stderr}");
    let (code, listing, _) = jext4_tool(&["stat", &arg(&image, "/sparse")]);
    assert_eq!(code, 0);
    assert!(listing.contains("Size: 4194304"), "{listing}");
    // One 4 KiB data block (8 sectors), not 4 MiB of zeros.
    assert!(listing.contains("Blocks: 8 "), "{listing}");
    let (_, bytes, _) = tools_support::jext4_bytes(&["cat", &arg(&image, "/sparse")], b"");
    let mut expected = vec![0u8; 4 << 20];
    expected[1 << 20..(1 << 20) + 4096].fill(7);
    assert!(bytes == expected);
    common::assert_fsck_clean(&image);
}

#[test]
fn archives_jext4_writes_extract_with_gnu_tar_as_the_tree() {
    let dir = tempfile::tempdir().unwrap();
    let tree = dir.path().join("tree");
    build_tree(&tree);
    let expected = snapshot(&tree);
    let image = common::mkfs(dir.path(), "tar-out", 256, &["-t", "ext4"]);
    let (code, _, stderr) =
        jext4_tool(&["cp", "-a", tree.to_str().unwrap(), &arg(&image, "/tree")]);
    assert_eq!(code, 0, "{stderr}");
    for (flag, name) in [
        (None, "plain"),
        (Some("-z"), "gzip"),
        (Some("-J"), "xz"),
        (Some("--zstd"), "zstd"),
    ] {
        let archive = dir.path().join(format!("out-{name}.tar"));
        let mut args = vec!["tar", "-c", "-f", archive.to_str().unwrap()];
        args.extend(flag);
        let source = arg(&image, "/tree");
        args.push(&source);
        let (code, _, stderr) = jext4_tool(&args);
        assert_eq!(code, 0, "tar -c {name}: {stderr}");
        let out = dir.path().join(format!("out-{name}"));
        std::fs::create_dir(&out).unwrap();
        // GNU tar finds the compression itself; -p and --same-owner as root.
        gnu_tar(
            &[
                "--sparse",
                "-xpf",
                archive.to_str().unwrap(),
                "-C",
                out.to_str().unwrap(),
            ],
            dir.path(),
        );
        // GNU tar sets atimes to now when it extracts: the rest must match.
        assert_same(
            &without_atimes(expected.clone()),
            &without_atimes(snapshot(&out)),
        );
    }
    // The same tree gives the same archive.
    let again = dir.path().join("again.tar");
    let (code, _, _) = jext4_tool(&["tar", "-cf", again.to_str().unwrap(), &arg(&image, "/tree")]);
    assert_eq!(code, 0);
    assert!(
        std::fs::read(&again).unwrap() == std::fs::read(dir.path().join("out-plain.tar")).unwrap()
    );
}
