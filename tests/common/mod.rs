//! Helpers shared by the integration tests: real images from mke2fs, and
//! the e2fsck oracle.
#![allow(dead_code)]

// Mounts and the `jext4` binary: built only with the command (feature `cli`).
#[cfg(feature = "cli")]
pub mod e2e;
pub mod journal;
#[cfg(feature = "cli")]
pub mod nbd;
#[cfg(feature = "cli")]
pub mod server;
mod skip;
pub mod workload;

pub use skip::skip;

use std::path::{Path, PathBuf};
use std::process::Command;

/// The image variants the core issue requires, as mke2fs arguments.
pub const VARIANTS: &[(&str, &[&str])] = &[
    ("ext2-1k", &["-t", "ext2", "-b", "1024"]),
    ("ext3-4k", &["-t", "ext3", "-b", "4096"]),
    ("ext4-1k", &["-t", "ext4", "-b", "1024"]),
    ("ext4-4k", &["-t", "ext4", "-b", "4096"]),
    (
        "ext4-orphan-seed",
        &["-t", "ext4", "-O", "orphan_file,metadata_csum_seed"],
    ),
    ("ext4-fast-commit", &["-t", "ext4", "-O", "fast_commit"]),
    // 128-byte inodes: no extra fields, times in whole seconds, no crtime.
    ("ext4-inode128", &["-t", "ext4", "-I", "128"]),
    // Every feature jext4 writes that this machine's kernel mounts, at
    // once (`project` needs a kernel with CONFIG_QUOTA).
    (
        "ext4-every-feature",
        &[
            "-t",
            "ext4",
            "-b",
            "1024",
            "-O",
            "meta_bg,^resize_inode,large_dir,orphan_file,metadata_csum_seed,stable_inodes,mmp,\
             sparse_super2,fast_commit",
        ],
    ),
];

/// The mke2fs arguments of the variant called `name` (a test per variant
/// names its own entry of `VARIANTS`).
pub fn variant_args(name: &str) -> &'static [&'static str] {
    VARIANTS
        .iter()
        .find(|(variant, _)| *variant == name)
        .map(|(_, args)| *args)
        .expect("a variant of tests/common VARIANTS")
}

pub fn require_tool(tool: &str) -> bool {
    let found = Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {tool}"))
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    found || skip(&format!("{tool} is not installed"))
}

/// Create an image of `size_mib` MiB with mke2fs and the given arguments.
pub fn mkfs(dir: &Path, name: &str, size_mib: u64, args: &[&str]) -> PathBuf {
    let path = dir.join(format!("{name}.img"));
    let file = std::fs::File::create(&path).unwrap();
    file.set_len(size_mib << 20).unwrap();
    drop(file);
    let output = Command::new("mke2fs")
        .args(["-q", "-F", "-E", "root_owner=0:0"])
        .args(args)
        .arg(&path)
        .output()
        .expect("running mke2fs");
    assert!(
        output.status.success(),
        "mke2fs {args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    path
}

/// Run `e2fsck -fn` and return (exit code, output).
pub fn fsck(image: &Path) -> (i32, String) {
    let output = Command::new("e2fsck")
        .args(["-fn"])
        .arg(image)
        .output()
        .expect("running e2fsck");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.code().unwrap_or(-1), text)
}

/// Assert that `e2fsck -fn` finds nothing to fix.
pub fn assert_fsck_clean(image: &Path) {
    let (code, text) = fsck(image);
    assert_eq!(
        code,
        0,
        "e2fsck -fn {} reported problems:\n{text}",
        image.display()
    );
}

/// Unmount a kernel mount, waiting out a transient EBUSY: any process's
/// path walk through the mount (a mount-table scanner resolving mount
/// points, a child of another test thread holding an inherited descriptor
/// until its exec closes it) holds a reference for a moment, and umount(2)
/// refuses while it does. A holder still there after `UMOUNT_PATIENCE` is
/// a real leak, and the failure names every process with a descriptor,
/// working directory or root under the mount point.
pub fn kernel_umount(mountpoint: &Path) {
    const UMOUNT_PATIENCE: std::time::Duration = std::time::Duration::from_secs(5);
    let began = std::time::Instant::now();
    loop {
        let output = Command::new("umount")
            .arg(mountpoint)
            .output()
            .expect("running umount");
        if output.status.success() {
            if began.elapsed() > std::time::Duration::from_millis(15) {
                eprintln!(
                    "umount {}: busy for {:?} before it went",
                    mountpoint.display(),
                    began.elapsed()
                );
            }
            return;
        }
        let text = String::from_utf8_lossy(&output.stderr).into_owned();
        if !text.contains("busy") || began.elapsed() > UMOUNT_PATIENCE {
            panic!(
                "umount {}: {}; holders: {:?}",
                mountpoint.display(),
                text.trim(),
                holders_under(mountpoint)
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// Processes with a descriptor, working directory or root under `dir`:
/// `pid (command): path` for each.
pub fn holders_under(dir: &Path) -> Vec<String> {
    let mut holders = Vec::new();
    let Ok(processes) = std::fs::read_dir("/proc") else {
        return holders;
    };
    for process in processes.flatten() {
        let pid = process.file_name().to_string_lossy().into_owned();
        if !pid.bytes().all(|byte| byte.is_ascii_digit()) {
            continue;
        }
        let base = process.path();
        let command = std::fs::read_to_string(base.join("comm")).unwrap_or_default();
        let mut links = vec![base.join("cwd"), base.join("root")];
        if let Ok(descriptors) = std::fs::read_dir(base.join("fd")) {
            links.extend(descriptors.flatten().map(|entry| entry.path()));
        }
        for link in links {
            if let Ok(target) = std::fs::read_link(&link)
                && target.starts_with(dir)
            {
                holders.push(format!("{pid} ({}): {}", command.trim(), target.display()));
            }
        }
    }
    holders
}
