//! `jext4 cp` both ways, against the kernel: a tree with every kind of
//! entry (and a real one, /usr/share/doc) imported into an image must read
//! back through a kernel loop mount exactly as its source — names, types,
//! modes, owners, nanosecond times, sizes, contents, hard-link groups,
//! device numbers, xattrs, ACLs, holes — with `e2fsck -fn` clean and the
//! journal clear; a tree the kernel wrote must come out of an image the
//! same way. Also: ENOSPC in the middle of an import, a vanished source,
//! and a rootless run.

// The jext4 binary, or the mounts and helpers of tests/common that use it.
#![cfg(feature = "cli")]

mod common;
#[path = "tools_support/mod.rs"]
mod tools_support;

use common::journal::{Mount, dumpe2fs_needs_recovery, kernel_available, kernel_lock};
use common::server::JEXT4;
use std::path::Path;
use std::process::Command;
use tools_support::{build_tree, jext4_bytes, jext4_tool, snapshot};

fn arg(image: &Path, path: &str) -> String {
    format!("{}:{path}", image.display())
}

#[test]
fn import_reads_back_through_the_kernel_as_its_source() {
    if !kernel_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("tree");
    build_tree(&source);
    let image = common::mkfs(dir.path(), "import", 512, &["-t", "ext4"]);
    let (code, _, stderr) = jext4_tool(&[
        "cp",
        "-a",
        "-j",
        "2",
        source.to_str().unwrap(),
        &arg(&image, "/tree"),
    ]);
    assert_eq!(code, 0, "cp -a: {stderr}");
    let real = Path::new("/usr/share/doc");
    let real_copy = dir.path().join("doc");
    if real.is_dir() {
        // Copied to a directory of ours first, so that its atimes hold
        // still while both are read (tools_support::settle_times).
        let status = Command::new("cp")
            .arg("-a")
            .arg(real)
            .arg(&real_copy)
            .status()
            .unwrap();
        assert!(status.success());
        tools_support::settle_times(&real_copy);
        let (code, _, stderr) =
            jext4_tool(&["cp", "-a", real_copy.to_str().unwrap(), &arg(&image, "/")]);
        assert_eq!(code, 0, "cp -a /usr/share/doc: {stderr}");
    }
    common::assert_fsck_clean(&image);
    assert!(
        !dumpe2fs_needs_recovery(&image),
        "the image was not closed clean"
    );
    let _kernel = kernel_lock();
    let mount = Mount::new(&image, "ro").expect("loop mount");
    let expected = snapshot(&source);
    let found = snapshot(&mount.point.join("tree"));
    tools_support::assert_same(&expected, &found);
    if real.is_dir() {
        let expected = snapshot(&real_copy);
        assert!(expected.len() > 100, "/usr/share/doc is nearly empty");
        tools_support::assert_same(&expected, &snapshot(&mount.point.join("doc")));
    }
    mount.unmount();
}

#[test]
fn export_of_a_kernel_written_tree_keeps_everything() {
    if !kernel_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = common::mkfs(dir.path(), "export", 128, &["-t", "ext4"]);
    let expected = {
        let _kernel = kernel_lock();
        let mount = Mount::new(&image, "rw").expect("loop mount");
        let tree = mount.point.join("tree");
        build_tree(&tree);
        let expected = snapshot(&tree);
        mount.unmount();
        expected
    };
    let out = dir.path().join("out");
    let (code, _, stderr) = jext4_tool(&["cp", "-a", &arg(&image, "/tree"), out.to_str().unwrap()]);
    assert_eq!(code, 0, "cp -a out: {stderr}");
    assert!(
        !stderr.contains("not kept"),
        "root was refused something: {stderr}"
    );
    tools_support::assert_same(&expected, &snapshot(&out));
    common::assert_fsck_clean(&image);
}

#[test]
fn a_full_image_stops_at_the_first_enospc_and_stays_consistent() {
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("big");
    std::fs::create_dir(&source).unwrap();
    for index in 0..40 {
        let bytes: Vec<u8> = (0..1 << 20).map(|i: u32| (i as u8) ^ index).collect();
        std::fs::write(source.join(format!("file{index:02}")), bytes).unwrap();
    }
    let image = common::mkfs(dir.path(), "small", 16, &["-t", "ext4"]);
    let (code, _, stderr) =
        jext4_tool(&["cp", "-r", source.to_str().unwrap(), &arg(&image, "/big")]);
    assert_eq!(code, 1, "a 40 MiB tree fitted into 16 MiB: {stderr}");
    assert!(
        stderr.contains("No space left on device") && stderr.contains("/big/file"),
        "ENOSPC without the entry's path: {stderr}"
    );
    assert_eq!(stderr.lines().count(), 1, "one line, then stop: {stderr}");
    common::assert_fsck_clean(&image);
    assert!(!dumpe2fs_needs_recovery(&image));
    // Files before the wall are whole.
    let (code, listing, _) = jext4_tool(&["ls", &arg(&image, "/big")]);
    assert_eq!(code, 0);
    let names: Vec<&str> = listing.lines().collect();
    assert!(names.len() > 3, "{names:?}");
    for name in &names[..names.len() - 1] {
        let (code, bytes, _) = jext4_bytes(&["cat", &arg(&image, &format!("/big/{name}"))], b"");
        let index: u8 = name[4..].parse().unwrap();
        assert_eq!(code, 0);
        let expected: Vec<u8> = (0..1u32 << 20).map(|i| (i as u8) ^ index).collect();
        assert!(bytes == expected, "{name} is not whole");
    }
}

#[test]
fn unreadable_sources_are_reported_by_path_and_skipped() {
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("tree");
    std::fs::create_dir_all(source.join("sub")).unwrap();
    std::fs::write(source.join("sub/kept"), b"kept").unwrap();
    let image = common::mkfs(dir.path(), "skip", 32, &["-t", "ext4"]);
    let missing = dir.path().join("missing");
    let (code, _, stderr) = jext4_tool(&[
        "cp",
        "-a",
        missing.to_str().unwrap(),
        source.to_str().unwrap(),
        &arg(&image, "/"),
    ]);
    assert_eq!(code, 1, "{stderr}");
    assert_eq!(
        stderr.trim(),
        format!(
            "jext4 cp: cannot stat '{}': No such file or directory",
            missing.display()
        )
    );
    let (code, bytes, _) = jext4_tool(&["cat", &arg(&image, "/tree/sub/kept")]);
    assert_eq!((code, bytes.as_str()), (0, "kept"));
    common::assert_fsck_clean(&image);
}

#[test]
fn rootless_import_and_export_keep_what_the_host_allows() {
    if !common::require_tool("setpriv") || unsafe { libc::geteuid() } != 0 {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // nobody must reach the files: a directory of its own.
    let base = dir.path().join("nobody");
    std::fs::create_dir(&base).unwrap();
    let source = base.join("tree");
    std::fs::create_dir_all(source.join("d")).unwrap();
    std::fs::write(source.join("d/f"), b"data").unwrap();
    std::os::unix::fs::symlink("d/f", source.join("l")).unwrap();
    let image = common::mkfs(&base, "rootless", 32, &["-t", "ext4"]);
    Command::new("chown")
        .args(["-R", "65534:65534"])
        .arg(&base)
        .status()
        .unwrap();
    let as_nobody = |args: &[&str]| {
        let output = Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups", JEXT4])
            .args(args)
            .env_remove("JEXT4_LOG")
            .output()
            .unwrap();
        (
            output.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    };
    let (code, stderr) = as_nobody(&["cp", "-a", source.to_str().unwrap(), &arg(&image, "/tree")]);
    assert_eq!(code, 0, "rootless import: {stderr}");
    // A device made in the image by root: nobody cannot make it on the
    // host, nor give it root's owner. Said once each, not an error.
    let node = dir.path().join("null");
    jext4::engine::tools::host::mknod(&node, libc::S_IFCHR | 0o666, libc::makedev(1, 3)).unwrap();
    let (code, _, stderr) = jext4_tool(&[
        "cp",
        "-a",
        node.to_str().unwrap(),
        &arg(&image, "/tree/null"),
    ]);
    assert_eq!(code, 0, "{stderr}");
    Command::new("chown")
        .args(["65534:65534"])
        .arg(&image)
        .status()
        .unwrap();
    let out = base.join("out");
    let (code, stderr) = as_nobody(&["cp", "-a", &arg(&image, "/tree"), out.to_str().unwrap()]);
    assert_eq!(code, 0, "rootless export: {stderr}");
    assert_eq!(
        stderr.matches("not kept: device nodes").count(),
        1,
        "{stderr}"
    );
    assert_eq!(std::fs::read(out.join("d/f")).unwrap(), b"data");
    assert_eq!(std::fs::read_link(out.join("l")).unwrap(), Path::new("d/f"));
    common::assert_fsck_clean(&image);
    // No FUSE device was opened: nothing of ours is mounted.
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!mounts.contains(base.to_str().unwrap()));
}

/// `cp -r` and `cp -a` into a directory with a default ACL: each entry
/// gets the mode and the access and default ACLs the kernel gives the
/// same `cp` on the host (`-r`: inherited from the directory, the umask
/// left out as the kernel leaves it; `-a`: the source's own).
#[test]
fn cp_into_a_directory_with_a_default_acl_does_as_the_kernel() {
    if !common::require_tool("setfacl") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("src");
    std::fs::create_dir_all(source.join("sub")).unwrap();
    std::fs::write(source.join("file"), b"data").unwrap();
    std::fs::write(source.join("sub/script"), b"#!/bin/sh\n").unwrap();
    let mode = |path: &Path, mode: u32| {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, PermissionsExt::from_mode(mode)).unwrap();
    };
    mode(&source.join("file"), 0o664);
    mode(&source.join("sub/script"), 0o775);
    let host_dest = dir.path().join("dest");
    std::fs::create_dir(&host_dest).unwrap();
    let status = Command::new("setfacl")
        .args(["-d", "-m", "u::rwx,u:1234:rwx,g::r-x,m::rwx,o::---"])
        .arg(&host_dest)
        .status()
        .unwrap();
    assert!(status.success());
    let default_acl =
        jext4::engine::tools::host::xattr(&host_dest, b"system.posix_acl_default").unwrap();
    let image = common::mkfs(dir.path(), "acl", 16, &["-t", "ext4"]);
    {
        let opened = jext4::Image::open(&image).unwrap();
        opened.create_dir("/dest").unwrap();
        opened
            .set_xattr("/dest", "system.posix_acl_default", &default_acl)
            .unwrap();
        opened.close().unwrap();
    }
    for flag in ["-r", "-a"] {
        let name = format!("copy{flag}");
        let status = Command::new("cp")
            .arg(flag)
            .arg(&source)
            .arg(host_dest.join(&name))
            .status()
            .unwrap();
        assert!(status.success());
        let (code, _, stderr) = jext4_tool(&[
            "cp",
            flag,
            source.to_str().unwrap(),
            &arg(&image, &format!("/dest/{name}")),
        ]);
        assert_eq!(code, 0, "jext4 cp {flag}: {stderr}");
    }
    let opened = jext4::Image::open(&image).unwrap();
    for flag in ["-r", "-a"] {
        for entry in ["", "/file", "/sub", "/sub/script"] {
            let path = format!("copy{flag}{entry}");
            let host = host_dest.join(&path);
            let inside = format!("/dest/{path}");
            let host_mode = std::fs::symlink_metadata(&host).unwrap().permissions();
            let image_mode = opened.symlink_metadata(&inside).unwrap().attr().perm;
            use std::os::unix::fs::PermissionsExt;
            assert_eq!(
                image_mode as u32,
                host_mode.mode() & 0o7777,
                "cp {flag}: mode of {path}"
            );
            for acl in ["system.posix_acl_access", "system.posix_acl_default"] {
                let on_host = jext4::engine::tools::host::xattr(&host, acl.as_bytes()).ok();
                let in_image = opened.xattr(&inside, acl).ok().flatten();
                assert_eq!(in_image, on_host, "cp {flag}: {acl} of {path}");
            }
        }
    }
    opened.close().unwrap();
    common::assert_fsck_clean(&image);
}

/// Where `cp -a` puts things, as GNU cp puts them on the host: a source
/// into an existing directory, to a new name, its contents with `DIR/.`
/// (into an existing directory, a new one, and the image's root), and a
/// trailing slash. Both ways: into an image and out of it.
#[test]
fn cp_lands_entries_where_gnu_cp_does() {
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("src");
    std::fs::create_dir_all(source.join("sub")).unwrap();
    std::fs::write(source.join("a"), b"a").unwrap();
    std::fs::write(source.join("sub/b"), b"b").unwrap();
    let src = source.to_str().unwrap();
    let names = |root: &Path| -> Vec<String> {
        tools_support::walk(root)
            .iter()
            .map(|path| path.strip_prefix(root).unwrap().display().to_string())
            .filter(|name| !name.starts_with("lost+found"))
            .collect()
    };
    // (source as written, destination under the root, whether the
    // destination directory exists first).
    let cases: &[(String, &str, bool)] = &[
        (src.to_string(), "/dest", true),
        (src.to_string(), "/dest", false),
        (format!("{src}/."), "/dest", true),
        (format!("{src}/."), "/dest", false),
        (format!("{src}/."), "/", true),
        (format!("{src}/"), "/dest", true),
        (format!("{src}/./"), "/dest", true),
    ];
    for (index, (from, to, exists)) in cases.iter().enumerate() {
        let host = dir.path().join(format!("host{index}"));
        std::fs::create_dir(&host).unwrap();
        if *exists && *to != "/" {
            std::fs::create_dir(host.join(&to[1..])).unwrap();
        }
        let host_dest = format!("{}{to}", host.display());
        let status = Command::new("cp")
            .args(["-a", from, &host_dest])
            .status()
            .unwrap();
        assert!(status.success(), "cp -a {from} {host_dest}");
        let image = common::mkfs(dir.path(), &format!("land{index}"), 16, &["-t", "ext4"]);
        if *exists && *to != "/" {
            let (code, _, stderr) = jext4_tool(&["mkdir", &arg(&image, to)]);
            assert_eq!(code, 0, "{stderr}");
        }
        let (code, _, stderr) = jext4_tool(&["cp", "-a", from, &arg(&image, to)]);
        assert_eq!(code, 0, "cp -a {from} IMAGE:{to}: {stderr}");
        common::assert_fsck_clean(&image);
        let out = dir.path().join(format!("out{index}"));
        let (code, _, stderr) =
            jext4_tool(&["cp", "-a", &arg(&image, "/."), out.to_str().unwrap()]);
        assert_eq!(code, 0, "cp -a IMAGE:/. {}: {stderr}", out.display());
        assert_eq!(
            names(&out),
            names(&host),
            "cp -a {from} {to} (exists: {exists})"
        );
        // Out of the image: the same rules with the image as the source.
        let back = dir.path().join(format!("back{index}"));
        std::fs::create_dir(&back).unwrap();
        let (code, _, stderr) = jext4_tool(&[
            "cp",
            "-a",
            &arg(&image, &format!("{to}/.")),
            back.to_str().unwrap(),
        ]);
        assert_eq!(code, 0, "{stderr}");
        assert_eq!(
            names(&back),
            names(Path::new(&host_dest)),
            "cp -a IMAGE:{to}/. {}",
            back.display()
        );
    }
}
