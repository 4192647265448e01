//! Inode checksums (metadata_csum) are verified when an inode's table
//! block comes from the device, once per inode, not at every read of the
//! cached block (`Inode::decode_in_table`). Detection of what comes from
//! the device stays as strong: an inode damaged on disk is refused when
//! first read even if another inode of its block was read before, and an
//! inode damaged behind a mount is refused once its block was evicted and
//! read back.

mod common;

use jext4::Image;
use jext4::engine::fs::MountOptions;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::Command;

/// Where `debugfs -R "imap PATH"` says the inode of `path` lies: (table
/// block, byte offset in it).
fn inode_location(image: &Path, path: &str) -> (u64, u64) {
    let output = Command::new("debugfs")
        .arg("-R")
        .arg(format!("imap {path}"))
        .arg(image)
        .output()
        .expect("running debugfs");
    let text = String::from_utf8_lossy(&output.stdout);
    let located = text
        .split("located at block ")
        .nth(1)
        .unwrap_or_else(|| panic!("debugfs imap {path}: {text}"));
    let (block, offset) = located
        .trim()
        .split_once(", offset 0x")
        .unwrap_or_else(|| panic!("debugfs imap {path}: {text}"));
    (
        block.parse().unwrap(),
        u64::from_str_radix(offset.trim(), 16).unwrap(),
    )
}

/// Flip a bit of the inode's `i_size` (byte 0x04) in the image file,
/// leaving its checksum stale.
fn damage_inode(image: &Path, (block, offset): (u64, u64), block_size: u64) {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(image)
        .unwrap();
    let at = block * block_size + offset + 0x04;
    let mut byte = [0u8];
    file.read_exact_at(&mut byte, at).unwrap();
    byte[0] ^= 0x10;
    file.write_all_at(&byte, at).unwrap();
    file.sync_all().unwrap();
}

/// An image of 1 KiB blocks holding the empty files `names` at its root.
fn image_with_files(dir: &Path, names: &[String], args: &[&str]) -> std::path::PathBuf {
    let tree = dir.join("tree");
    std::fs::create_dir(&tree).unwrap();
    for name in names {
        std::fs::write(tree.join(name), b"").unwrap();
    }
    let tree_arg = tree.to_str().unwrap();
    let mut all = vec!["-t", "ext4", "-b", "1024", "-d", tree_arg];
    all.extend_from_slice(args);
    common::mkfs(dir, "csum", 16, &all)
}

fn assert_checksum_error(result: jext4::Result<jext4::engine::fs::Attr>, what: &str) {
    let error = result.expect_err(what);
    assert!(error.is_corruption(), "{what}: {error}");
    assert!(error.to_string().contains("checksum"), "{what}: {error}");
}

/// Four 256-byte inodes share a 1 KiB table block: reading one of them
/// verifies that one only, and a damaged neighbour is still refused.
#[test]
fn a_damaged_inode_is_refused_beside_a_verified_one() {
    if !common::require_tool("mke2fs") || !common::require_tool("debugfs") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let names: Vec<String> = (0..6).map(|index| format!("f{index}")).collect();
    let path = image_with_files(dir.path(), &names, &["-I", "256"]);
    let locations: Vec<_> = names
        .iter()
        .map(|name| inode_location(&path, &format!("/{name}")))
        .collect();
    let pair = (0..names.len() - 1)
        .find(|&index| locations[index].0 == locations[index + 1].0)
        .expect("two of the files share a table block");
    damage_inode(&path, locations[pair + 1], 1024);
    let image = Image::open(&path).unwrap();
    let good = image.metadata(format!("/{}", names[pair])).unwrap();
    assert_eq!(good.len(), 0);
    assert_checksum_error(
        image
            .metadata(format!("/{}", names[pair + 1]))
            .map(|m| m.attr().clone()),
        "the damaged neighbour",
    );
}

/// A mounted image whose inode is damaged on disk behind the mount: the
/// cached, verified copy serves reads while it stays cached; once enough
/// other table blocks passed through the cache (1 KiB inodes, one per
/// block, more of them than `cache_size` holds) the block is read again
/// and the damage is refused.
#[test]
fn an_inode_damaged_behind_the_mount_is_refused_after_eviction() {
    if !common::require_tool("mke2fs") || !common::require_tool("debugfs") {
        return;
    }
    const FILLERS: usize = 2500;
    let dir = tempfile::tempdir().unwrap();
    let mut names: Vec<String> = (0..FILLERS).map(|index| format!("f{index:04}")).collect();
    names.push("victim".to_string());
    let path = image_with_files(dir.path(), &names, &["-I", "1024", "-N", "4096"]);
    let victim = inode_location(&path, "/victim");
    let options = MountOptions {
        cache_size: jext4::engine::fs::CACHE_SIZE_MIN,
        ..MountOptions::default()
    };
    let image = Image::options().mount_options(options).open(&path).unwrap();
    let capacity = image.fs().cache_stats().capacity;
    assert!(
        (FILLERS as u64) > 2 * capacity,
        "{FILLERS} table blocks pass through a cache of {capacity}"
    );
    assert_eq!(image.metadata("/victim").unwrap().len(), 0);
    damage_inode(&path, victim, 1024);
    // Still the cached copy, verified when it was read.
    assert_eq!(image.metadata("/victim").unwrap().len(), 0);
    let evictions = image.fs().cache_stats().evictions;
    for name in &names[..FILLERS] {
        image.metadata(format!("/{name}")).unwrap();
    }
    assert!(image.fs().cache_stats().evictions >= evictions + capacity);
    assert_checksum_error(
        image.metadata("/victim").map(|m| m.attr().clone()),
        "the victim read back",
    );
}
