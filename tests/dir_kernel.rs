//! Directories made by the Linux kernel (loop mounts of mke2fs images), read
//! by our code: `dir::check` accepts the kernel's tree (so our hashes put
//! every name in the leaf the kernel chose), every name is found with its
//! inode and file type, and readdir lists exactly the kernel's entries.
//! Covers half_md4, tea and legacy hashes, signed and unsigned, two- and
//! three-level trees, collisions across leaves, linear directories, and
//! the no-filetype format.

mod dir_common;

use dir_common::{
    Mount, Rng, assert_listing, can_mount, image_dir, list_all, mkfs, random_name, run,
};
use jext4::engine::format::dir::{
    self, FT_DIR, FT_FIFO, FT_REG_FILE, FT_SYMLINK, file_type_from_mode,
};
use jext4::engine::format::htree::hash_version;
use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// name → (inode, file type) as the kernel made them.
type Model = BTreeMap<Vec<u8>, (u32, u8)>;

struct KernelDir {
    _tmp: tempfile::TempDir,
    image: PathBuf,
    ino: u32,
    model: Model,
}

/// Make an image, adjust it with `tune` commands, mount it, let `build`
/// fill directory /d, unmount.
fn kernel_dir(
    size_mib: u64,
    mkfs_args: &[&str],
    tune: &[&[&str]],
    build: impl FnOnce(&Path, &Path) -> Model,
) -> KernelDir {
    let tmp = tempfile::tempdir().unwrap();
    let image = mkfs(tmp.path(), "kernel", size_mib, mkfs_args);
    for command in tune {
        let mut args: Vec<&str> = command[1..].to_vec();
        args.push(image.to_str().unwrap());
        run(command[0], &args);
    }
    let (ino, model) = {
        let mount = Mount::new(&image, &tmp.path().join("mnt"), false);
        let d = mount.point.join("d");
        std::fs::create_dir(&d).unwrap();
        let model = build(&mount.point, &d);
        (std::fs::metadata(&d).unwrap().ino() as u32, model)
    };
    KernelDir {
        _tmp: tmp,
        image,
        ino,
        model,
    }
}

/// Hard links named `names` to a few files made in the mount's root.
fn link_names(root: &Path, d: &Path, names: &[Vec<u8>]) -> Model {
    let targets: Vec<(PathBuf, u32)> = (0..16)
        .map(|i| {
            let path = root.join(format!("target{i}"));
            std::fs::write(&path, b"x").unwrap();
            let ino = std::fs::metadata(&path).unwrap().ino() as u32;
            (path, ino)
        })
        .collect();
    let mut model = Model::new();
    for (index, name) in names.iter().enumerate() {
        let (target, ino) = &targets[index % targets.len()];
        std::fs::hard_link(target, d.join(OsStr::from_bytes(name))).unwrap();
        model.insert(name.clone(), (*ino, FT_REG_FILE));
    }
    model
}

fn names(count: u64, len: (usize, usize), seed: u64) -> Vec<Vec<u8>> {
    let mut rng = Rng::new(seed);
    (0..count)
        .map(|tag| {
            let n = len.0 + rng.below((len.1 - len.0 + 1) as u64) as usize;
            random_name(&mut rng, n, tag)
        })
        .collect()
}

/// Read the kernel's directory with our code and compare with the model;
/// returns the check statistics.
fn verify(kd: &KernelDir, filetype: bool) -> dir::DirStats {
    let mut d = image_dir(&kd.image, kd.ino);
    let stats = dir::check(&mut d).unwrap_or_else(|e| panic!("check: {e}"));
    eprintln!("{stats:?}");
    assert_eq!(stats.entries, kd.model.len() as u64 + 2);
    for (name, (ino, file_type)) in &kd.model {
        let found = dir::lookup(&mut d, name)
            .unwrap()
            .unwrap_or_else(|| panic!("{:?} not found", String::from_utf8_lossy(name)));
        assert_eq!(found.ino, *ino);
        assert_eq!(found.file_type, if filetype { *file_type } else { 0 });
    }
    for absent in [b"absent".as_slice(), b"zz-not-there", &[0xfe; 200]] {
        assert!(dir::lookup(&mut d, absent).unwrap().is_none());
    }
    let inodes: BTreeMap<Vec<u8>, u32> =
        kd.model.iter().map(|(n, (i, _))| (n.clone(), *i)).collect();
    assert_listing(&mut d, &inodes, 2);
    for (entry, _) in list_all(&mut d) {
        if let Some((_, file_type)) = kd.model.get(&entry.name) {
            assert_eq!(entry.file_type, if filetype { *file_type } else { 0 });
        }
    }
    assert_eq!(dir::parent(&mut d).unwrap(), 2);
    assert_eq!(dir::is_empty(&mut d).unwrap(), kd.model.is_empty());
    stats
}

#[test]
fn half_md4_two_levels_100k_entries() {
    if !can_mount() {
        return;
    }
    let all = names(100_000, (30, 60), 1);
    let kd = kernel_dir(256, &["-t", "ext4", "-b", "1024"], &[], |root, d| {
        link_names(root, d, &all)
    });
    let stats = verify(&kd, true);
    assert_eq!(stats.levels, 2);
}

#[test]
fn three_levels_with_large_dir() {
    if !can_mount() {
        return;
    }
    let all = names(100_000, (190, 255), 2);
    let kd = kernel_dir(
        400,
        &["-t", "ext4", "-b", "1024", "-O", "large_dir"],
        &[],
        |root, d| link_names(root, d, &all),
    );
    let stats = verify(&kd, true);
    assert_eq!(stats.levels, 3);
}

#[test]
fn tea_unsigned_with_deletions() {
    if !can_mount() {
        return;
    }
    let all = names(20_000, (10, 80), 3);
    let kd = kernel_dir(
        64,
        &["-t", "ext4", "-b", "1024"],
        &[
            &["tune2fs", "-E", "hash_alg=tea"],
            &["debugfs", "-w", "-R", "ssv flags 2"],
        ],
        |root, d| {
            let mut model = link_names(root, d, &all);
            for name in all.iter().step_by(3) {
                std::fs::remove_file(d.join(OsStr::from_bytes(name))).unwrap();
                model.remove(name);
            }
            model
        },
    );
    let (_, geo) = dir_common::read_geometry(&kd.image);
    assert!(geo.hash_unsigned && geo.def_hash_version == hash_version::TEA);
    verify(&kd, true);
}

#[test]
fn legacy_collisions_across_leaves() {
    if !can_mount() {
        return;
    }
    let tmp_geo = {
        let tmp = tempfile::tempdir().unwrap();
        let image = mkfs(tmp.path(), "g", 8, &["-t", "ext4"]);
        dir_common::read_geometry(&image).1
    };
    let version = if tmp_geo.hash_unsigned {
        hash_version::LEGACY_UNSIGNED
    } else {
        hash_version::LEGACY
    };
    // The legacy hash ignores the seed, so pairs found now collide in the
    // image made next.
    let pairs = dir_common::colliding_pairs(version, &[0; 4], 1500);
    let all: Vec<Vec<u8>> = pairs
        .iter()
        .flat_map(|(a, b)| [a.clone(), b.clone()])
        .collect();
    let kd = kernel_dir(
        64,
        &["-t", "ext4", "-b", "1024"],
        &[&["tune2fs", "-E", "hash_alg=legacy"]],
        |root, d| link_names(root, d, &all),
    );
    let mut d = image_dir(&kd.image, kd.ino);
    let continued = dir_common::continuation_entries(&mut d);
    eprintln!("kernel made {continued} continuation entries");
    assert!(continued > 0);
    verify(&kd, true);
}

#[test]
fn file_types_and_linear_directories() {
    if !can_mount() {
        return;
    }
    for args in [
        &["-t", "ext4", "-b", "4096", "-O", "^dir_index"][..],
        &["-t", "ext2", "-b", "1024"][..],
    ] {
        let all = names(3_000, (1, 100), 4);
        let kd = kernel_dir(64, args, &[], |root, d| {
            let mut model = link_names(root, d, &all);
            std::fs::create_dir(d.join("sub")).unwrap();
            std::os::unix::fs::symlink("target0", d.join("link")).unwrap();
            let fifo = std::ffi::CString::new(d.join("fifo").as_os_str().as_bytes()).unwrap();
            // SAFETY: a valid NUL-terminated path; mkfifo reads it only.
            assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0);
            for (name, expected) in [("sub", FT_DIR), ("link", FT_SYMLINK), ("fifo", FT_FIFO)] {
                let meta = std::fs::symlink_metadata(d.join(name)).unwrap();
                assert_eq!(file_type_from_mode(meta.mode() as u16), expected);
                model.insert(name.as_bytes().to_vec(), (meta.ino() as u32, expected));
            }
            model
        });
        let stats = verify(&kd, true);
        assert!(stats.blocks > 1, "{args:?}");
    }
}

#[test]
fn no_filetype_feature() {
    if !can_mount() {
        return;
    }
    let all = names(5_000, (1, 255), 5);
    let kd = kernel_dir(
        64,
        &["-t", "ext2", "-b", "4096", "-O", "^filetype"],
        &[],
        |root, d| link_names(root, d, &all),
    );
    let stats = verify(&kd, false);
    assert!(stats.levels >= 1);
}
