//! fs-verity files (`format::verity` has the layout): enabling verity on
//! a file as the kernel's `FS_IOC_ENABLE_VERITY` does it on ext4, its
//! digest (`FS_IOC_MEASURE_VERITY`), and reads checked block by block
//! against the Merkle tree (a block that fails is EIO, as in the kernel).
//! A verity file is read-only: writes, truncates and fallocate get EPERM
//! (`file.rs`, `regular_file`).
//!
//! Enabling, in the kernel's order (`ext4_begin_enable_verity`,
//! `ext4_end_enable_verity`), each step its own transaction(s):
//! 1. the file goes on the orphan records, durably (committed before the
//!    tree is written), and every block past its end is freed: a crash
//!    from here on is finished by orphan recovery,
//!    which cuts the file back to its size — dropping whatever metadata
//!    this left past it — and takes it off the records;
//! 2. the Merkle tree, the descriptor and its size are written past the
//!    end as file data (ordered: on the device before the commit that
//!    maps them), the size unchanged;
//! 3. in one transaction, the VERITY flag is set and the file taken off
//!    the orphan records: from that commit on the file is a verity file
//!    with all its metadata durable under it.
//!
//! A failure in 2 frees the blocks past the end again and takes the file
//! off the records, leaving it as it was.

use super::{Caller, Fs, Scope};
use crate::error::{Error, Location, Result};
use crate::format::inode::{Inode, Timestamp, flags};
use crate::format::mapping::Lookup;
use crate::format::superblock::ro_compat;
use crate::format::verity::{self, Descriptor, MERKLE_LOG_BLOCK_SIZE, Tree};
use crate::journal::change::{Change, Ineligible};
use crate::lock::Rank;
use std::collections::HashMap;
use std::sync::Arc;

/// Credits of a transaction of the enable that touches the inode and the
/// orphan records only.
const CREDITS_VERITY_STATE: u32 = 8;

/// Descriptors kept by `Descriptors`: past this many files, the next one
/// starts the memory over.
const DESCRIPTORS_KEPT: usize = 1024;

/// The descriptors of verity files read lately, by inode number and
/// generation: a verity file never changes, so each read need not walk
/// its extents to the end and read the descriptor again. Dropped when
/// the inode is freed (`release_inode`); the generation keeps a number
/// given to a new file from matching an old entry meanwhile (a leaf lock).
#[derive(Default)]
pub(crate) struct Descriptors(
    parking_lot::Mutex<crate::hash::NumberMap<u32, (u32, Arc<Descriptor>)>>,
);

impl Descriptors {
    fn get(&self, ino: u32, generation: u32) -> Option<Arc<Descriptor>> {
        match self.0.lock().get(&ino) {
            Some((kept, descriptor)) if *kept == generation => Some(Arc::clone(descriptor)),
            _ => None,
        }
    }

    fn keep(&self, ino: u32, generation: u32, descriptor: &Arc<Descriptor>) {
        let mut kept = self.0.lock();
        if kept.len() >= DESCRIPTORS_KEPT {
            kept.clear();
        }
        kept.insert(ino, (generation, Arc::clone(descriptor)));
    }

    /// `ino` was freed.
    pub fn forget(&self, ino: u32) {
        self.0.lock().remove(&ino);
    }
}

/// What `FS_IOC_ENABLE_VERITY` takes besides the file (`struct
/// fsverity_enable_arg`; SHA-256 is the one hash).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VerityParams {
    /// The Merkle tree's block size: a power of two from 1 KiB to the
    /// filesystem's block and the page (4 KiB); None for the default
    /// (`Fs::verity_block_size`).
    pub block_size: Option<u32>,
    /// Hashed before every block, at most 32 bytes.
    pub salt: Vec<u8>,
    /// Kept after the descriptor, as a kernel without built-in signature
    /// checking keeps it (`CONFIG_FS_VERITY_BUILTIN_SIGNATURES` off): jext4
    /// holds no keyring, so it neither checks it nor refuses it; at most
    /// 16,128 bytes.
    pub signature: Vec<u8>,
}

/// The tree's log block size for `params`, refused as the kernel refuses
/// them (`fsverity_ioctl_enable`, `fsverity_init_merkle_tree_params`):
/// EINVAL for a block size that is not a power of two or lies outside 1
/// KiB to the page and the filesystem block, EMSGSIZE for a salt or a
/// signature larger than the descriptor has room for.
fn check_params(params: &VerityParams, fs_log_block_size: u8, default: u32) -> Result<u8> {
    let block_size = params.block_size.unwrap_or(default);
    if !block_size.is_power_of_two() {
        return Err(Error::Invalid(format!(
            "fs-verity: Merkle block size {block_size} is not a power of two"
        )));
    }
    if params.salt.len() > verity::SALT_SIZE_MAX {
        return Err(Error::MessageTooLong(format!(
            "fs-verity: a salt of {} bytes (at most {})",
            params.salt.len(),
            verity::SALT_SIZE_MAX
        )));
    }
    if params.signature.len() > verity::SIGNATURE_SIZE_MAX {
        return Err(Error::MessageTooLong(format!(
            "fs-verity: a signature of {} bytes (at most {})",
            params.signature.len(),
            verity::SIGNATURE_SIZE_MAX
        )));
    }
    let log = block_size.trailing_zeros() as u8;
    if !(10..=PAGE_LOG_SIZE).contains(&log) || log > fs_log_block_size {
        return Err(Error::Invalid(format!(
            "fs-verity: Merkle block size {block_size} (from 1024 to {}: the page and the \
             filesystem block)",
            1u32 << PAGE_LOG_SIZE.min(fs_log_block_size)
        )));
    }
    Ok(log)
}

/// The page size's log, the kernel's PAGE_SHIFT on the machines jext4
/// images go to (x86, arm64 with 4 KiB pages): the largest Merkle block.
const PAGE_LOG_SIZE: u8 = 12;

impl Fs {
    /// The Merkle block size `enable_verity` writes: 4 KiB, or the
    /// filesystem's block below that (the kernel's limit).
    pub fn verity_block_size(&self) -> u32 {
        1 << MERKLE_LOG_BLOCK_SIZE.min(self.core.geo.log_block_size as u8 + 10)
    }

    /// `FS_IOC_ENABLE_VERITY` with SHA-256, the default block size and no
    /// salt (`enable_verity_with`).
    pub fn enable_verity(&self, ino: u32, caller: Caller) -> Result<()> {
        self.enable_verity_with(ino, caller, &VerityParams::default())
    }

    /// `FS_IOC_ENABLE_VERITY`: build the Merkle tree of regular file `ino`
    /// with `params` and make it a verity file. Refused as the kernel
    /// refuses it: EINVAL or EMSGSIZE for parameters it refuses
    /// (`check_params`), EOPNOTSUPP without the `verity` feature (as the
    /// kernel, jext4 does not set it: `tune2fs -O verity`) or on a file
    /// without extents, EISDIR on a directory, EINVAL on another kind of
    /// file, EEXIST on a verity file, EROFS read-only.
    pub fn enable_verity_with(
        &self,
        ino: u32,
        caller: Caller,
        params: &VerityParams,
    ) -> Result<()> {
        let result = check_params(
            params,
            self.core.geo.log_block_size as u8 + 10,
            self.verity_block_size(),
        )
        .and_then(|log| self.enable_verity_inner(ino, caller, log, params));
        self.note_error(result)
    }

    fn enable_verity_inner(
        &self,
        ino: u32,
        caller: Caller,
        log_block_size: u8,
        params: &VerityParams,
    ) -> Result<()> {
        if self.is_read_only() {
            return Err(Error::ReadOnly);
        }
        if !self.core.sbi.lock().has_ro_compat(ro_compat::VERITY) {
            return Err(Error::Unsupported(
                "the filesystem has no verity feature: `tune2fs -O verity IMAGE` turns it on"
                    .into(),
            ));
        }
        if !self.core.verity_enabling.lock().insert(ino) {
            return Err(Error::Busy);
        }
        let result = self.enable_verity_steps(ino, caller, log_block_size, params);
        self.core.verity_enabling.lock().remove(&ino);
        result
    }

    fn enable_verity_steps(
        &self,
        ino: u32,
        caller: Caller,
        log_block_size: u8,
        params: &VerityParams,
    ) -> Result<()> {
        // Held data first, now that writes are refused: the tree covers
        // what reads return (the write-out is not refused, `Writer`).
        self.fsync(ino, false)?;
        let block_size = self.core.geo.block_size as u64;
        let size = self.transact(Scope::File(ino), CREDITS_VERITY_STATE, caller, |tx| {
            let _inode = tx.lock_write(ino, Rank::Inode);
            let mut inode = tx.read_live_inode(ino)?;
            check_enable(&self.core.geo, ino, &inode)?;
            // A write that passed its check as the enable began may have
            // held data since: the tree must cover it.
            if tx.core.delayed.holds(ino) {
                return Err(Error::Busy);
            }
            // ext4_begin_enable_verity: inline data moves to a block first.
            if inode.has_inline_data() {
                tx.convert_inline_file(ino, &mut inode)?;
            }
            if !inode.uses_extents() {
                return Err(Error::Unsupported(format!(
                    "inode {ino}: fs-verity needs an extent-mapped file"
                )));
            }
            tx.handle.note(Change::Ineligible(Ineligible::Orphan));
            if crate::faults::active(crate::faults::Fault::VerityFlagBeforeTree) {
                inode.flags |= flags::VERITY;
            } else {
                tx.orphan_add(ino, &mut inode)?;
            }
            tx.write_inode(ino, &inode)?;
            // Durable before the tree is written: a crash from here on
            // finds the file on the records (one commit an enable, which
            // is rare and reads the whole file anyway).
            tx.handle.set_sync();
            Ok(inode.size)
        })?;
        // The last extent must end with the metadata.
        self.punch_in_chunks(ino, size.div_ceil(block_size))?;
        let written = self.write_verity_metadata(ino, size, caller, log_block_size, params);
        if let Err(error) = written {
            let undone = self
                .punch_in_chunks(ino, size.div_ceil(block_size))
                .and_then(|()| self.finish_enable(ino, caller, false));
            if let Err(undo) = undone {
                tracing::warn!(%undo, ino, "undoing a failed verity enable");
            }
            return Err(error);
        }
        self.finish_enable(ino, caller, true)
    }

    /// Step 3 (with `verity`), or the end of an undo: off the orphan
    /// records, the flag set or not.
    fn finish_enable(&self, ino: u32, caller: Caller, verity: bool) -> Result<()> {
        self.transact(Scope::File(ino), CREDITS_VERITY_STATE, caller, |tx| {
            let _inode = tx.lock_write(ino, Rank::Inode);
            let mut inode = tx.read_live_inode(ino)?;
            tx.handle.note(Change::Ineligible(Ineligible::Orphan));
            if inode.links_count > 0 {
                tx.orphan_remove(ino, &mut inode)?;
            }
            if verity {
                inode.flags |= flags::VERITY;
                inode.ctime = Timestamp::now();
            }
            tx.write_inode(ino, &inode)
        })
    }

    /// Step 2: the tree over the data, then the descriptor (with the
    /// signature) and its size, past the end of a file of `size` bytes.
    fn write_verity_metadata(
        &self,
        ino: u32,
        size: u64,
        caller: Caller,
        log_block_size: u8,
        params: &VerityParams,
    ) -> Result<()> {
        let fs_block_size = self.core.geo.block_size as u64;
        let tree = Tree::new(size, log_block_size, &params.salt);
        tree.check_levels(ino)?;
        let merkle_block = tree.block_size as u64;
        let inode = self.read_file_inode(ino)?;
        let blocks = size.div_ceil(merkle_block);
        let mut failed = None;
        let data = (0..blocks).map_while(|index| {
            let start = index * merkle_block;
            match self.read_range(ino, &inode, start, (start + merkle_block).min(size)) {
                Ok(block) => Some(block),
                Err(error) => {
                    failed = Some(error);
                    None
                }
            }
        });
        let (stored, root_hash) = tree.build(data);
        if let Some(error) = failed {
            return Err(error);
        }
        let descriptor = Descriptor {
            log_block_size,
            data_size: size,
            root_hash,
            salt: params.salt.clone(),
            sig_size: params.signature.len() as u32,
        };
        let encoded = descriptor.encode_signed(&params.signature);
        let tree_bytes = tree.blocks() * merkle_block;
        let (metadata_pos, desc_pos, size_pos) =
            verity::layout(size, tree_bytes, fs_block_size, encoded.len() as u64);
        let mut metadata = vec![0u8; (size_pos + 4 - metadata_pos) as usize];
        for (index, block) in stored.iter().enumerate() {
            let at = index * merkle_block as usize;
            metadata[at..at + block.len()].copy_from_slice(block);
        }
        let at = (desc_pos - metadata_pos) as usize;
        metadata[at..at + encoded.len()].copy_from_slice(&encoded);
        let at = (size_pos - metadata_pos) as usize;
        metadata[at..].copy_from_slice(&(encoded.len() as u32).to_le_bytes());
        self.write_past_end(ino, metadata_pos, &metadata, caller)
    }

    /// Write `bytes` at `offset` of file `ino`, past its end, its size
    /// left as it is (the verity metadata), in transactions of a write's
    /// chunk each (decided again under the inode lock, as `write_file`
    /// does: chattr +j may land between chunks).
    fn write_past_end(&self, ino: u32, offset: u64, bytes: &[u8], caller: Caller) -> Result<()> {
        let (mut chunk, mut credits) = self
            .core
            .write_chunk(ino, &super::inode::read_inode(&self.core, ino)?);
        let mut done = 0;
        while done < bytes.len() {
            let piece = &bytes[done..(done + chunk as usize).min(bytes.len())];
            let position = offset + done as u64;
            let written = self.transact(Scope::File(ino), credits, caller, |tx| {
                let _inode = tx.lock_write(ino, Rank::Inode);
                if let Some(resized) = tx.write_chunk_outgrown(ino, piece.len(), credits) {
                    return Ok(Err(resized));
                }
                let mut inode = tx.read_live_inode(ino)?;
                // On the orphan records: no fast commit may carry it.
                tx.handle.note(Change::Ineligible(Ineligible::Orphan));
                let size = inode.size;
                let written = tx.write_data(ino, &mut inode, position, piece);
                inode.size = size;
                tx.write_inode(ino, &inode)?;
                written.map(Ok)
            })?;
            let written = match written {
                Ok(written) => written,
                // Journaled since the chunk was cut: the piece again, cut
                // and credited for that.
                Err(resized) => {
                    (chunk, credits) = resized;
                    continue;
                }
            };
            if written < piece.len() {
                return Err(Error::NoSpace);
            }
            done += written;
        }
        Ok(())
    }

    /// The digest of verity file `ino` (`FS_IOC_MEASURE_VERITY`, what
    /// `fsverity digest` prints); ENODATA for a file that is not one.
    pub fn verity_digest(&self, ino: u32) -> Result<[u8; 32]> {
        let result = (|| {
            let _inode = self.core.inodes.read(ino, Rank::Inode);
            let inode = self.read_file_inode(ino)?;
            if !inode.has_flag(flags::VERITY) {
                return Err(Error::NoAttribute);
            }
            Ok(self.verity_descriptor(ino, &inode)?.digest())
        })();
        self.note_error(result)
    }

    /// Whether `ino` may be opened as asked (`write`, with O_APPEND
    /// `append`, with O_TRUNC `truncate`): an fs-verity file only for
    /// reading (EPERM, as `fsverity_file_open`), and chattr's +i and +a
    /// as `may_open` has them (`iflags::check_open`).
    pub fn check_open(&self, ino: u32, write: bool, append: bool, truncate: bool) -> Result<()> {
        let _inode = self.core.inodes.read(ino, Rank::Inode);
        let inode = self.read_file_inode(ino)?;
        super::file::refuse_encrypted_contents(&self.core.geo, &inode)?;
        if (write || truncate) && inode.has_flag(flags::VERITY) {
            return Err(Error::NotPermitted);
        }
        super::iflags::check_open(&inode, write, append, truncate)
    }

    /// An inode in use, read outside a transaction (the caller holds its
    /// lock).
    pub(super) fn read_file_inode(&self, ino: u32) -> Result<Inode> {
        let inode = super::inode::read_inode(&self.core, ino)?;
        super::inode::check_live(ino, &inode)?;
        Ok(inode)
    }

    /// The descriptor of verity file `ino`, kept from an earlier read or
    /// found from the end of its last extent.
    fn verity_descriptor(&self, ino: u32, inode: &Inode) -> Result<Arc<Descriptor>> {
        let descriptors = &self.core.verity_descriptors;
        if let Some(descriptor) = descriptors.get(ino, inode.generation) {
            return Ok(descriptor);
        }
        let descriptor = Arc::new(self.load_verity_descriptor(ino, inode)?);
        descriptors.keep(ino, inode.generation, &descriptor);
        Ok(descriptor)
    }

    /// The descriptor of verity file `ino`, read from the end of its last
    /// extent (`ext4_get_verity_descriptor_location`).
    fn load_verity_descriptor(&self, ino: u32, inode: &Inode) -> Result<Descriptor> {
        let location = Location::Inode { ino };
        if !inode.uses_extents() {
            return Err(Error::corrupt(location, "fs-verity file without extents"));
        }
        let block_size = self.core.geo.block_size as u64;
        let end = self.mapped_end(ino, inode)? * block_size;
        let size_field = self.read_range(ino, inode, end.saturating_sub(4), end)?;
        let size_field = u32::from_le_bytes(
            size_field
                .try_into()
                .map_err(|_| Error::corrupt(location, "fs-verity file without metadata"))?,
        );
        let (desc_pos, desc_size) =
            verity::descriptor_location(ino, end, size_field, inode.size, block_size)?;
        let bytes = self.read_range(ino, inode, desc_pos, desc_pos + desc_size as u64)?;
        Descriptor::decode(ino, &bytes, inode.size)
    }

    /// The logical block after the file's last mapped one.
    fn mapped_end(&self, ino: u32, inode: &Inode) -> Result<u64> {
        let limit = crate::format::mapping::max_blocks(&self.core.geo, inode);
        let (mut lblk, mut end) = (0u64, 0u64);
        while lblk < limit {
            match self.core.lookup(ino, inode, lblk)? {
                Lookup::Mapped(extent) => {
                    lblk += extent.len as u64;
                    end = lblk;
                }
                Lookup::Hole { next: Some(next) } if next > lblk => lblk = next,
                Lookup::Hole { .. } => break,
            }
        }
        Ok(end)
    }

    /// Bytes `offset..end` of verity file `ino` (`end` at most its size),
    /// each Merkle block they touch checked against the tree: the kernel's
    /// `fsverity_verify_blocks`, a failure EIO.
    pub(super) fn read_verified(
        &self,
        ino: u32,
        inode: &Inode,
        offset: u64,
        end: u64,
    ) -> Result<Vec<u8>> {
        let descriptor = self.verity_descriptor(ino, inode)?;
        let tree = descriptor.tree();
        tree.check_levels(ino)?;
        let merkle_block = tree.block_size as u64;
        let first = offset / merkle_block;
        let last = (end - 1) / merkle_block;
        let from = first * merkle_block;
        let to = ((last + 1) * merkle_block).min(inode.size);
        let mut data = self.read_range(ino, inode, from, to)?;
        data.resize(((last + 1 - first) * merkle_block) as usize, 0);
        let metadata_pos = inode.size.div_ceil(verity::METADATA_ALIGN) * verity::METADATA_ALIGN;
        let mut verified: HashMap<u64, Vec<u8>> = HashMap::new();
        for (i, block) in data.chunks(merkle_block as usize).enumerate() {
            let index = first + i as u64;
            self.verify_block(
                ino,
                inode,
                &descriptor,
                &tree,
                metadata_pos,
                index,
                block,
                &mut verified,
            )?;
        }
        let start = (offset - from) as usize;
        data.truncate(start + (end - offset) as usize);
        data.drain(..start);
        Ok(data)
    }

    /// Data block `index` against its hash, up the tree to the root hash;
    /// tree blocks once checked are kept in `verified` for the read.
    #[allow(clippy::too_many_arguments)]
    fn verify_block(
        &self,
        ino: u32,
        inode: &Inode,
        descriptor: &Descriptor,
        tree: &Tree,
        metadata_pos: u64,
        index: u64,
        block: &[u8],
        verified: &mut HashMap<u64, Vec<u8>>,
    ) -> Result<()> {
        let mut hash = tree.hash(block);
        let mut child = index;
        for level in 0..tree.level_blocks.len() {
            let (tree_block, at) = tree.hash_location(level, child);
            if let Some(known) = verified.get(&tree_block) {
                // Already checked up to the root: its hashes stand.
                return self.expect_hash(ino, index, &known[at..at + 32], &hash);
            }
            let start = metadata_pos + tree_block * tree.block_size as u64;
            let bytes = self.read_range(ino, inode, start, start + tree.block_size as u64)?;
            self.expect_hash(ino, index, &bytes[at..at + 32], &hash)?;
            hash = tree.hash(&bytes);
            child = tree_block - tree.level_start[level];
            verified.insert(tree_block, bytes);
        }
        if inode.size == 0 {
            return Ok(());
        }
        self.expect_hash(ino, index, &descriptor.root_hash, &hash)
    }

    fn expect_hash(&self, ino: u32, index: u64, stored: &[u8], computed: &[u8; 32]) -> Result<()> {
        if stored == computed {
            return Ok(());
        }
        let location = Location::Inode { ino };
        let detail = format!("fs-verity: block {index} does not match its Merkle tree hash");
        if self.first_report(&location, &detail) {
            tracing::error!(ino, block = index, "fs-verity: data corrupted");
        }
        Err(Error::VerityMismatch { ino, block: index })
    }
}

/// What `FS_IOC_ENABLE_VERITY` refuses, in the kernel's order.
fn check_enable(geo: &crate::format::Geometry, ino: u32, inode: &Inode) -> Result<()> {
    if inode.is_dir() {
        return Err(Error::IsDirectory);
    }
    super::file::refuse_encrypted_contents(geo, inode)?;
    if !inode.is_reg() {
        return Err(Error::Invalid(format!(
            "inode {ino}: fs-verity needs a regular file"
        )));
    }
    // fsverity_ioctl_enable: not on an append-only file, and it needs
    // write permission, which an immutable one never gives.
    if inode.has_flag(flags::APPEND) || inode.has_flag(flags::IMMUTABLE) {
        return Err(Error::NotPermitted);
    }
    if inode.has_flag(flags::VERITY) {
        return Err(Error::Exists);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn descriptor(data_size: u64) -> Arc<Descriptor> {
        Arc::new(Descriptor {
            log_block_size: MERKLE_LOG_BLOCK_SIZE,
            data_size,
            root_hash: [7; 32],
            salt: Vec::new(),
            sig_size: 0,
        })
    }

    /// Either safeguard alone keeps an old file's descriptor from a new
    /// file under its number: the generation, and the forgetting.
    #[test]
    fn kept_descriptors_match_number_and_generation() {
        let kept = Descriptors::default();
        kept.keep(12, 5, &descriptor(100));
        assert_eq!(kept.get(12, 5).unwrap().data_size, 100);
        assert!(kept.get(12, 6).is_none(), "another generation");
        assert!(kept.get(13, 5).is_none(), "another number");
        kept.forget(12);
        assert!(kept.get(12, 5).is_none(), "freed");
        for ino in 0..DESCRIPTORS_KEPT as u32 + 1 {
            kept.keep(ino, 1, &descriptor(ino as u64));
        }
        assert!(kept.0.lock().len() <= DESCRIPTORS_KEPT, "bounded");
    }
}
