//! The format layer decodes what mke2fs writes, checksums included, for
//! every image variant the core issue lists.

mod common;

use jext4::engine::format::group_desc::GroupDesc;
use jext4::engine::format::inode::Inode;
use jext4::engine::format::superblock::{Geometry, Superblock};
use std::os::unix::fs::FileExt;

fn read(file: &std::fs::File, offset: u64, len: usize) -> Vec<u8> {
    let mut buf = vec![0; len];
    file.read_exact_at(&mut buf, offset).unwrap();
    buf
}

#[test]
fn decodes_and_reencodes_mke2fs_images() {
    if !common::require_tool("mke2fs") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    for (name, args) in common::VARIANTS {
        let image = common::mkfs(dir.path(), name, 64, args);
        let file = std::fs::File::open(&image).unwrap();
        let sb_bytes = read(&file, 1024, 1024);
        let mut sb = Superblock::decode(&sb_bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(
            sb.check_features().unwrap(),
            "{name}: read-write must be allowed"
        );
        // Re-encoding an unchanged superblock reproduces it bit for bit.
        assert_eq!(
            &sb.encode()[..],
            &sb_bytes[..],
            "{name}: superblock round trip"
        );
        let geo = Geometry::from_superblock(&sb);
        let bs = geo.block_size as u64;
        let mut descs = Vec::new();
        for group in 0..geo.group_count {
            let (block, offset) = geo.group_desc_location(group);
            let table = read(&file, block * bs, bs as usize);
            let bytes = &table[offset..offset + geo.desc_size as usize];
            let desc =
                GroupDesc::decode(&geo, group, bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
            let mut out = vec![0u8; geo.desc_size as usize];
            desc.encode(&geo, group, &mut out);
            assert_eq!(&out[..], bytes, "{name}: group {group} round trip");
            descs.push(desc);
        }
        // Every inode in use in group 0 decodes with a valid checksum and
        // re-encodes to the same bytes.
        let itable = read(
            &file,
            descs[0].inode_table * bs,
            geo.inode_table_blocks as usize * bs as usize,
        );
        let used = geo.inodes_per_group - descs[0].free_inodes;
        let mut checked = 0;
        for index in 0..geo.inodes_per_group.min(used + 16) {
            let ino = index + 1;
            let at = index as usize * geo.inode_size as usize;
            let bytes = &itable[at..at + geo.inode_size as usize];
            if bytes.iter().all(|&b| b == 0) {
                continue;
            }
            let inode = Inode::decode(&geo, ino, bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
            let mut out = vec![0u8; geo.inode_size as usize];
            inode.encode(&geo, ino, &mut out);
            assert_eq!(&out[..], bytes, "{name}: inode {ino} round trip");
            checked += 1;
        }
        assert!(checked >= 2, "{name}: found only {checked} inodes");
        // A flipped byte in a checksummed inode is caught.
        if geo.metadata_csum {
            let at = geo.inode_size as usize; // inode 2, the root
            let mut bytes = itable[at..at + geo.inode_size as usize].to_vec();
            bytes[0x10] ^= 0x40;
            assert!(Inode::decode(&geo, 2, &bytes).unwrap_err().is_corruption());
        }
    }
}
