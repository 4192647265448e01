//! Attributes the Linux kernel wrote, read back through `format::xattr`.
//!
//! A loop-mounted mke2fs image gets small, empty, large and many
//! attributes (spilling from the inode body into the block), names with
//! bytes above 0x7F, trusted/security names, POSIX ACLs (access and default,
//! inherited), attributes on a directory and a symlink, and two files whose
//! identical blocks the kernel shares through mbcache. While mounted, the
//! kernel's own listxattr/getxattr answers are recorded; after unmounting,
//! our `list` must give the same names in the same order and our `get` the
//! same bytes (ACLs included, in the VFS format).

mod common;
mod xattr_support;

use std::path::Path;
use xattr_support::{Image, Mount, inode_number, kernel_get, kernel_list, kernel_set, run};

const VARIANTS: &[(&str, usize, &[&str])] = &[
    (
        "ext4-4k-256",
        4096,
        &["-t", "ext4", "-b", "4096", "-I", "256"],
    ),
    (
        "ext3-4k-128",
        4096,
        &["-t", "ext3", "-b", "4096", "-I", "128"],
    ),
    (
        "ext4-1k-256",
        1024,
        &["-t", "ext4", "-b", "1024", "-I", "256"],
    ),
];

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len).map(|i| seed.wrapping_add((i * 7) as u8)).collect()
}

fn set(path: &Path, name: &[u8], value: &[u8]) {
    kernel_set(path, name, value)
        .unwrap_or_else(|errno| panic!("setxattr {path:?} {name:?}: errno {errno}"));
}

fn setfacl(args: &[&str]) {
    let output = run("setfacl", args);
    assert!(output.status.success(), "setfacl {args:?}: {output:?}");
}

/// Create the files and attributes; returns the paths to compare.
fn populate(mount: &Mount, block_size: usize) -> Vec<&'static str> {
    let path = |relative: &str| mount.path(relative);
    for file in [
        "small", "large", "many", "acl", "highname", "shared1", "shared2", "gnu",
    ] {
        std::fs::write(path(file), b"").unwrap();
    }
    set(&path("small"), b"user.a", b"1");
    set(&path("small"), b"user.bb", b"hello");
    set(&path("small"), b"user.empty", b"");
    set(&path("small"), b"trusted.t", b"xyz");
    set(&path("small"), b"security.s", b"sec");
    set(
        &path("large"),
        b"user.big",
        &pattern(1, 3000.min(block_size - 100)),
    );
    for i in 0..(block_size - 100) / 64 {
        let name = format!("user.attr{i:02}");
        set(
            &path("many"),
            name.as_bytes(),
            &pattern(i as u8, 30 + i % 5),
        );
    }
    let acl = path("acl");
    setfacl(&[
        "-m",
        "u:1000:rw,u:1001:r,g:100:rx,m::rwx",
        acl.to_str().unwrap(),
    ]);
    std::fs::create_dir(path("dacl")).unwrap();
    let dacl = path("dacl");
    setfacl(&["-m", "u:1000:rwx", dacl.to_str().unwrap()]);
    setfacl(&["-d", "-m", "u:1000:rx,g:100:r", dacl.to_str().unwrap()]);
    std::fs::write(path("dacl/inherited"), b"").unwrap();
    set(&path("highname"), b"user.\xe9\xe8", b"high");
    for file in ["shared1", "shared2"] {
        set(&path(file), b"user.s1", &pattern(3, 200));
        set(&path(file), b"user.s2", &pattern(4, 100));
    }
    std::fs::create_dir(path("dir")).unwrap();
    set(&path("dir"), b"user.d", b"dirattr");
    std::os::unix::fs::symlink("small", path("link")).unwrap();
    set(&path("link"), b"trusted.l", b"linkattr");
    // The Hurd namespace, if this kernel accepts it.
    let _ = kernel_set(&path("gnu"), b"gnu.translator", b"/hurd/null");
    vec![
        "small",
        "large",
        "many",
        "acl",
        "dacl",
        "dacl/inherited",
        "highname",
        "shared1",
        "shared2",
        "dir",
        "link",
        "gnu",
    ]
}

type Attributes = Vec<(Vec<u8>, Vec<u8>)>;

#[test]
fn reads_what_the_kernel_wrote() {
    if !common::require_tool("mke2fs") || !common::require_tool("setfacl") {
        return;
    }
    for &(variant, block_size, args) in VARIANTS {
        let dir = tempfile::tempdir().unwrap();
        let image = common::mkfs(dir.path(), variant, 32, args);
        let Some(mount) = Mount::new(&image, &dir.path().join("mnt")) else {
            return;
        };
        let paths = populate(&mount, block_size);
        // The kernel's answers are the oracle.
        let expected: Vec<(&str, u32, Attributes)> = paths
            .iter()
            .map(|&relative| {
                let path = mount.path(relative);
                let attributes = kernel_list(&path)
                    .into_iter()
                    .map(|name| {
                        let value = kernel_get(&path, &name).unwrap();
                        (name, value)
                    })
                    .collect();
                (relative, inode_number(&path), attributes)
            })
            .collect();
        mount.unmount();
        common::assert_fsck_clean(&image);

        let bytes = std::fs::read(&image).unwrap();
        let image = Image::from_bytes(bytes.clone());
        let mut compared = 0;
        for (path, ino, attributes) in &expected {
            let names: Vec<Vec<u8>> = attributes.iter().map(|(name, _)| name.clone()).collect();
            assert_eq!(image.list(*ino).unwrap(), names, "{variant}: list {path}");
            for (name, value) in attributes {
                let ours = image.get(*ino, name).unwrap();
                let shown = String::from_utf8_lossy(name);
                assert_eq!(
                    ours.as_deref(),
                    Some(&value[..]),
                    "{variant}: {path} {shown}"
                );
                compared += 1;
            }
            assert_eq!(image.get(*ino, b"user.absent").unwrap(), None);
        }
        check_workload_landed(&image, &expected, variant, block_size);
        check_damage_is_reported(&image, bytes, &expected, variant);
        eprintln!("{variant}: {compared} attributes compared");
    }
}

/// The oracle holds what the workload meant to create: otherwise the
/// comparison above would prove less than it seems.
fn check_workload_landed(
    image: &Image,
    expected: &[(&str, u32, Attributes)],
    variant: &str,
    block_size: usize,
) {
    let find = |path: &str| expected.iter().find(|(p, _, _)| *p == path).unwrap();
    let (_, large_ino, large) = find("large");
    assert_eq!(large[0].1, pattern(1, 3000.min(block_size - 100)));
    assert_ne!(
        image.inode(*large_ino).file_acl,
        0,
        "{variant}: large value in a block"
    );
    let (_, many_ino, many) = find("many");
    assert_eq!(many.len(), (block_size - 100) / 64);
    let many_inode = image.inode(*many_ino);
    assert_ne!(
        many_inode.file_acl, 0,
        "{variant}: many attributes spill to a block"
    );
    if image.geo.inode_size > 128 {
        let area = many_inode.inline_xattr_area();
        assert_eq!(
            &area[..4],
            &0xEA02_0000u32.to_le_bytes(),
            "{variant}: some stay in the inode"
        );
    }
    let acl_names: Vec<&[u8]> = find("dacl").2.iter().map(|(n, _)| &n[..]).collect();
    assert!(
        acl_names.contains(&&b"system.posix_acl_default"[..]),
        "{variant}"
    );
    assert!(
        acl_names.contains(&&b"system.posix_acl_access"[..]),
        "{variant}"
    );
    let (_, one, _) = find("shared1");
    let (_, two, _) = find("shared2");
    let (one, two) = (image.inode(*one), image.inode(*two));
    assert_ne!(one.file_acl, 0);
    assert_eq!(
        one.file_acl, two.file_acl,
        "{variant}: the kernel shares identical blocks"
    );
}

/// Damage to the block of "large" is reported as corruption at that
/// inode and block, never as a value or a panic.
fn check_damage_is_reported(
    image: &Image,
    bytes: Vec<u8>,
    expected: &[(&str, u32, Attributes)],
    variant: &str,
) {
    let (_, ino, attributes) = expected.iter().find(|(p, _, _)| *p == "large").unwrap();
    let block = image.inode(*ino).file_acl;
    let block_start = (block * image.geo.block_size as u64) as usize;
    let first_entry = block_start + 32;
    let value_offs = u16::from_le_bytes([bytes[first_entry + 2], bytes[first_entry + 3]]);
    let mut damages: Vec<(&str, Vec<u8>)> = Vec::new();
    let mut overlapping = bytes.clone();
    overlapping[first_entry + 2..first_entry + 4].copy_from_slice(&40u16.to_le_bytes());
    damages.push(("value offset into the entries", overlapping));
    let mut bad_magic = bytes.clone();
    bad_magic[block_start] ^= 0xFF;
    damages.push(("magic", bad_magic));
    if image.geo.metadata_csum {
        let mut flipped = bytes;
        flipped[block_start + value_offs as usize] ^= 0x01;
        damages.push(("a value byte under metadata_csum", flipped));
    }
    for (what, damaged) in damages {
        let damaged = Image::from_bytes(damaged);
        let error = damaged.get(*ino, &attributes[0].0).unwrap_err();
        match error {
            jext4::Error::Corrupt { location, .. } => assert_eq!(
                location,
                jext4::Location::InodeBlock { ino: *ino, block },
                "{variant}: {what}"
            ),
            other => panic!("{variant}: {what}: {other}"),
        }
        assert!(
            damaged.list(*ino).unwrap_err().is_corruption(),
            "{variant}: {what}"
        );
    }
}
