//! Helpers shared by the integration tests: real images from mke2fs, and
//! the e2fsck oracle.
#![allow(dead_code)]

pub mod e2e;
pub mod journal;
pub mod nbd;
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
