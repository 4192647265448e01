//! fs-verity as ext4 stores it (`Documentation/filesystems/fsverity.rst`,
//! `Documentation/filesystems/ext4/verity.rst`): a read-only file whose
//! every data block is checked against a Merkle tree of SHA-256 hashes,
//! the tree and its descriptor kept past the end of the file's data.
//!
//! The layout past `i_size` (which stays the data's size):
//! - the Merkle tree from the first 64 KiB boundary at or past `i_size`
//!   (`metadata_pos`), its root level first and the level just above the
//!   data last, one tree block per Merkle block (4 KiB by default, as
//!   fsverity-utils', or any power of two from 1 KiB to the filesystem
//!   block and the page);
//! - the 256-byte descriptor at the next filesystem block boundary,
//!   followed by the signature the enable was given, if any;
//! - its size, a le32, in the last 4 bytes of the block where the
//!   descriptor ends (or the next one when fewer than 4 bytes are left),
//!   which is the file's last mapped block: a reader finds the descriptor
//!   from the end of the last extent.
//!
//! A block's hash is SHA-256 of the block, after the salt if there is one
//! (up to 32 bytes, padded with zeros to SHA-256's 64-byte block),
//! the last data block zero-padded; a tree block is its children's hashes
//! concatenated, zero-padded. A file of one block has no tree (its root
//! hash is its block's hash), an empty file's root hash is all zeros. The
//! file's digest — what `fsverity digest` prints — is the SHA-256 of the
//! descriptor with `sig_size` zero.

use crate::error::{Error, Location, Result};
use sha2::{Digest, Sha256};

/// Where the Merkle tree starts past the data (`ext4_verity_metadata_pos`).
pub const METADATA_ALIGN: u64 = 65536;
/// Bytes of the descriptor, signature excluded.
pub const DESCRIPTOR_SIZE: usize = 256;
/// The largest descriptor the kernel reads (`FS_VERITY_MAX_DESCRIPTOR_SIZE`).
const DESCRIPTOR_SIZE_MAX: u32 = 16384;
/// The largest signature an enable takes (`FS_VERITY_MAX_SIGNATURE_SIZE`).
pub const SIGNATURE_SIZE_MAX: usize = DESCRIPTOR_SIZE_MAX as usize - DESCRIPTOR_SIZE;
/// The descriptor's room for a salt.
pub const SALT_SIZE_MAX: usize = 32;
/// `FS_VERITY_HASH_ALG_SHA256`.
pub const HASH_SHA256: u8 = 1;
/// SHA-256's digest and compression block sizes.
const DIGEST_SIZE: usize = 32;
const HASH_BLOCK_SIZE: usize = 64;
/// The Merkle block jext4 writes: 4 KiB (`log_blocksize` 12).
pub const MERKLE_LOG_BLOCK_SIZE: u8 = 12;
/// Levels the kernel accepts (`FS_VERITY_MAX_LEVELS`).
const LEVELS_MAX: usize = 8;

const D_VERSION: usize = 0;
const D_HASH_ALGORITHM: usize = 1;
const D_LOG_BLOCKSIZE: usize = 2;
const D_SALT_SIZE: usize = 3;
const D_SIG_SIZE: usize = 4;
const D_DATA_SIZE: usize = 8;
const D_ROOT_HASH: usize = 16;
const D_SALT: usize = 80;
const D_RESERVED: usize = 112;

/// The fs-verity descriptor (`struct fsverity_descriptor`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Descriptor {
    pub log_block_size: u8,
    pub data_size: u64,
    pub root_hash: [u8; DIGEST_SIZE],
    pub salt: Vec<u8>,
    /// Bytes of signature after the 256 (kept by the kernel, not checked
    /// here: built-in signatures are the kernel's keyring's business).
    pub sig_size: u32,
}

impl Descriptor {
    /// Decode and check as the kernel's `validate_fsverity_descriptor`;
    /// `bytes` is the descriptor as stored (signature included).
    pub fn decode(ino: u32, bytes: &[u8], i_size: u64) -> Result<Self> {
        let location = Location::Inode { ino };
        let bad = |why: String| Error::corrupt(location, format!("fs-verity descriptor: {why}"));
        if bytes.len() < DESCRIPTOR_SIZE {
            return Err(bad(format!("{} bytes, below 256", bytes.len())));
        }
        if bytes[D_VERSION] != 1 {
            return Err(bad(format!("version {}", bytes[D_VERSION])));
        }
        if bytes[D_HASH_ALGORITHM] != HASH_SHA256 {
            return Err(Error::Unsupported(format!(
                "inode {ino}: fs-verity hash algorithm {} (jext4 reads SHA-256 only)",
                bytes[D_HASH_ALGORITHM]
            )));
        }
        let log_block_size = bytes[D_LOG_BLOCKSIZE];
        if !(10..=16).contains(&log_block_size) {
            return Err(bad(format!("Merkle block size 2^{log_block_size}")));
        }
        let salt_size = bytes[D_SALT_SIZE] as usize;
        if salt_size > 32 {
            return Err(bad(format!("salt of {salt_size} bytes")));
        }
        if bytes[D_RESERVED..DESCRIPTOR_SIZE].iter().any(|&b| b != 0) {
            return Err(bad("reserved bytes set".into()));
        }
        let data_size = u64::from_le_bytes(bytes[D_DATA_SIZE..D_DATA_SIZE + 8].try_into().unwrap());
        if data_size != i_size {
            return Err(bad(format!(
                "data size {data_size}, the file's is {i_size}"
            )));
        }
        let sig_size = u32::from_le_bytes(bytes[D_SIG_SIZE..D_SIG_SIZE + 4].try_into().unwrap());
        if sig_size as usize > bytes.len() - DESCRIPTOR_SIZE {
            return Err(bad(format!("signature of {sig_size} bytes past its end")));
        }
        Ok(Descriptor {
            log_block_size,
            data_size,
            root_hash: bytes[D_ROOT_HASH..D_ROOT_HASH + DIGEST_SIZE]
                .try_into()
                .unwrap(),
            salt: bytes[D_SALT..D_SALT + salt_size].to_vec(),
            sig_size,
        })
    }

    /// The 256 bytes, `sig_size` as given.
    fn encode_with(&self, sig_size: u32) -> [u8; DESCRIPTOR_SIZE] {
        let mut bytes = [0u8; DESCRIPTOR_SIZE];
        bytes[D_VERSION] = 1;
        bytes[D_HASH_ALGORITHM] = HASH_SHA256;
        bytes[D_LOG_BLOCKSIZE] = self.log_block_size;
        bytes[D_SALT_SIZE] = self.salt.len() as u8;
        bytes[D_SIG_SIZE..D_SIG_SIZE + 4].copy_from_slice(&sig_size.to_le_bytes());
        bytes[D_DATA_SIZE..D_DATA_SIZE + 8].copy_from_slice(&self.data_size.to_le_bytes());
        bytes[D_ROOT_HASH..D_ROOT_HASH + DIGEST_SIZE].copy_from_slice(&self.root_hash);
        bytes[D_SALT..D_SALT + self.salt.len()].copy_from_slice(&self.salt);
        bytes
    }

    /// The descriptor as stored: its 256 bytes, then `signature` (the
    /// kernel's `fsverity_descriptor` with its flexible array).
    pub fn encode_signed(&self, signature: &[u8]) -> Vec<u8> {
        let mut bytes = self.encode_with(signature.len() as u32).to_vec();
        bytes.extend_from_slice(signature);
        bytes
    }

    /// The file's digest (`FS_IOC_MEASURE_VERITY`, `fsverity digest`).
    pub fn digest(&self) -> [u8; DIGEST_SIZE] {
        Sha256::digest(self.encode_with(0)).into()
    }

    /// The shape of this file's tree.
    pub fn tree(&self) -> Tree {
        Tree::new(self.data_size, self.log_block_size, &self.salt)
    }
}

/// The shape of a Merkle tree: its levels, where each starts (in Merkle
/// blocks from the tree's start, the root level first), and the padded
/// salt every hash starts with.
#[derive(Debug, Clone)]
pub struct Tree {
    pub block_size: usize,
    /// Blocks in level `l` (0: the level just above the data).
    pub level_blocks: Vec<u64>,
    /// First block of level `l`.
    pub level_start: Vec<u64>,
    padded_salt: Vec<u8>,
}

impl Tree {
    pub fn new(data_size: u64, log_block_size: u8, salt: &[u8]) -> Tree {
        let block_size = 1usize << log_block_size;
        let per_block = (block_size / DIGEST_SIZE) as u64;
        let mut level_blocks = Vec::new();
        let mut blocks = data_size.div_ceil(block_size as u64);
        while blocks > 1 {
            blocks = blocks.div_ceil(per_block);
            level_blocks.push(blocks);
        }
        let mut level_start = vec![0; level_blocks.len()];
        let mut offset = 0;
        for level in (0..level_blocks.len()).rev() {
            level_start[level] = offset;
            offset += level_blocks[level];
        }
        let mut padded_salt = salt.to_vec();
        if !salt.is_empty() {
            padded_salt.resize(salt.len().div_ceil(HASH_BLOCK_SIZE) * HASH_BLOCK_SIZE, 0);
        }
        Tree {
            block_size,
            level_blocks,
            level_start,
            padded_salt,
        }
    }

    /// Merkle blocks in the tree.
    pub fn blocks(&self) -> u64 {
        self.level_blocks.iter().sum()
    }

    /// Whether the kernel accepts this many levels.
    pub fn check_levels(&self, ino: u32) -> Result<()> {
        if self.level_blocks.len() > LEVELS_MAX {
            return Err(Error::corrupt(
                Location::Inode { ino },
                format!("fs-verity tree of {} levels", self.level_blocks.len()),
            ));
        }
        Ok(())
    }

    /// The hash of one block (data or tree), zero-padded to the block size.
    pub fn hash(&self, block: &[u8]) -> [u8; DIGEST_SIZE] {
        debug_assert!(block.len() <= self.block_size);
        let mut hasher = Sha256::new();
        hasher.update(&self.padded_salt);
        hasher.update(block);
        if block.len() < self.block_size {
            hasher.update(vec![0u8; self.block_size - block.len()]);
        }
        hasher.finalize().into()
    }

    /// Where the hash of block `index` of level `level` lies (level 0's
    /// children are data blocks, the others' the level below's blocks):
    /// (tree block, byte offset in it).
    pub fn hash_location(&self, level: usize, index: u64) -> (u64, usize) {
        let per_block = (self.block_size / DIGEST_SIZE) as u64;
        (
            self.level_start[level] + index / per_block,
            (index % per_block) as usize * DIGEST_SIZE,
        )
    }

    /// Build the tree over `data_blocks` (the file's data, each block
    /// given as read, the last one short or not): the tree's blocks in
    /// stored order, and the root hash.
    pub fn build(&self, data_blocks: impl Iterator<Item = Vec<u8>>) -> (Vec<Vec<u8>>, [u8; 32]) {
        let mut levels: Vec<Vec<Vec<u8>>> = vec![Vec::new(); self.level_blocks.len()];
        let mut root = [0u8; DIGEST_SIZE];
        let mut hashes: Vec<[u8; DIGEST_SIZE]> =
            data_blocks.map(|block| self.hash(&block)).collect();
        if hashes.len() == 1 {
            root = hashes[0];
        }
        for level in levels.iter_mut() {
            let per_block = self.block_size / DIGEST_SIZE;
            let blocks: Vec<Vec<u8>> = hashes
                .chunks(per_block)
                .map(|chunk| {
                    let mut block = vec![0u8; self.block_size];
                    for (i, hash) in chunk.iter().enumerate() {
                        block[i * DIGEST_SIZE..(i + 1) * DIGEST_SIZE].copy_from_slice(hash);
                    }
                    block
                })
                .collect();
            hashes = blocks.iter().map(|block| self.hash(block)).collect();
            *level = blocks;
        }
        if !self.level_blocks.is_empty() {
            debug_assert_eq!(hashes.len(), 1, "the root level is one block");
            root = hashes[0];
        }
        let stored = levels.into_iter().rev().flatten().collect();
        (stored, root)
    }
}

/// Where a descriptor of `desc_size` bytes (signature included) and its
/// size go after a tree of `tree_bytes` for data of `data_size` bytes,
/// with filesystem blocks of `fs_block_size`: (metadata start, descriptor
/// position, size field position), as `ext4_write_verity_descriptor`.
pub fn layout(
    data_size: u64,
    tree_bytes: u64,
    fs_block_size: u64,
    desc_size: u64,
) -> (u64, u64, u64) {
    let metadata_pos = data_size.div_ceil(METADATA_ALIGN) * METADATA_ALIGN;
    let desc_pos = (metadata_pos + tree_bytes).div_ceil(fs_block_size) * fs_block_size;
    let size_pos = (desc_pos + desc_size + 4).div_ceil(fs_block_size) * fs_block_size - 4;
    (metadata_pos, desc_pos, size_pos)
}

/// The descriptor's position from the size field that ends at `end` (the
/// end of the file's last extent): (descriptor position, its size), as
/// `ext4_get_verity_descriptor_location` finds them.
pub fn descriptor_location(
    ino: u32,
    end: u64,
    size_field: u32,
    data_size: u64,
    fs_block_size: u64,
) -> Result<(u64, u32)> {
    let location = Location::Inode { ino };
    let size_pos = end
        .checked_sub(4)
        .ok_or_else(|| Error::corrupt(location, "fs-verity file without metadata"))?;
    let size = size_field;
    if size > DESCRIPTOR_SIZE_MAX || size as u64 > size_pos || (size as usize) < DESCRIPTOR_SIZE {
        return Err(Error::corrupt(
            location,
            format!("fs-verity descriptor size {size}"),
        ));
    }
    let desc_pos = (size_pos - size as u64) / fs_block_size * fs_block_size;
    let metadata_pos = data_size.div_ceil(METADATA_ALIGN) * METADATA_ALIGN;
    if desc_pos < metadata_pos {
        return Err(Error::corrupt(
            location,
            format!(
                "fs-verity descriptor at {desc_pos}, before the metadata's start {metadata_pos}"
            ),
        ));
    }
    Ok((desc_pos, size))
}

/// A digest as `fsverity digest` prints it: `sha256:` and lowercase hex.
pub fn digest_text(digest: &[u8; DIGEST_SIZE]) -> String {
    let hex: String = digest.iter().map(|byte| format!("{byte:02x}")).collect();
    format!("sha256:{hex}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_are_stored_root_first() {
        // 1 MiB: 256 data blocks, two leaf blocks, one root.
        let tree = Tree::new(1 << 20, 12, &[]);
        assert_eq!(tree.level_blocks, [2, 1]);
        assert_eq!(tree.level_start, [1, 0]);
        assert_eq!(tree.blocks(), 3);
        // One block or none: no tree.
        assert_eq!(Tree::new(4096, 12, &[]).blocks(), 0);
        assert_eq!(Tree::new(0, 12, &[]).blocks(), 0);
    }

    #[test]
    fn the_metadata_follows_the_kernels_layout() {
        // The worked examples of the kernel's code (4 KiB blocks).
        assert_eq!(layout(100, 0, 4096, 256), (65536, 65536, 69628));
        assert_eq!(layout(0, 0, 4096, 256), (0, 0, 4092));
        assert_eq!(
            layout(1 << 20, 12288, 4096, 256),
            (1 << 20, 1060864, 1064956)
        );
        // A signature of 3,900 bytes: the descriptor runs into a second
        // block, and its size goes in that block's last four bytes.
        assert_eq!(layout(100, 0, 4096, 4156), (65536, 65536, 73724));
        let (desc, size) = descriptor_location(12, 69632, 256, 100, 4096).unwrap();
        assert_eq!((desc, size), (65536, 256));
    }

    #[test]
    fn a_one_block_file_has_its_blocks_hash_as_root() {
        let tree = Tree::new(100, 12, &[]);
        let (stored, root) = tree.build(std::iter::once(vec![7u8; 100]));
        assert!(stored.is_empty());
        assert_eq!(root, tree.hash(&[7u8; 100]));
        let (stored, root) = Tree::new(0, 12, &[]).build(std::iter::empty());
        assert!(stored.is_empty());
        assert_eq!(root, [0; 32]);
    }

    #[test]
    fn descriptors_round_trip() {
        let descriptor = Descriptor {
            log_block_size: 12,
            data_size: 5000,
            root_hash: [9; 32],
            salt: Vec::new(),
            sig_size: 0,
        };
        let bytes = descriptor.encode_signed(&[]);
        assert_eq!(Descriptor::decode(1, &bytes, 5000).unwrap(), descriptor);
        assert!(Descriptor::decode(1, &bytes, 5001).is_err());
        let salted = Descriptor {
            salt: vec![0xab; 32],
            sig_size: 3,
            ..descriptor
        };
        let bytes = salted.encode_signed(&[1, 2, 3]);
        assert_eq!(bytes.len(), DESCRIPTOR_SIZE + 3);
        assert_eq!(Descriptor::decode(1, &bytes, 5000).unwrap(), salted);
        // The digest leaves the signature out, as the kernel's.
        let unsigned = Descriptor {
            sig_size: 0,
            ..salted.clone()
        };
        assert_eq!(salted.digest(), unsigned.digest());
    }
}
