//! Directories as `format::dir` sees them: logical blocks of a directory
//! inode, mapped to physical blocks through `format::mapping` and read
//! through the cache. `DirReader` serves lookups and listings under the
//! shared lock; `DirWriter` also grows the directory, inside a `Tx`.

use super::inode::{FileKind, check_live, read_inode};
use super::{Core, Fs, Tx};
use crate::cache::{Buffer, BufferCache};
use crate::error::{Error, Location, Result};
use crate::format::dir::{self, BadEntry, DirBlocks, DirEntry};
use crate::format::fscrypt;
use crate::format::htree::LeafRanges;
use crate::format::inline;
use crate::format::inode::{Inode, flags};
use crate::format::mapping::{self, Lookup};
use crate::format::superblock::Geometry;
use crate::journal::Handle;
use std::borrow::Cow;
use std::sync::Arc;

fn dir_block(core: &Core, ino: u32, inode: &Inode, lblk: u64) -> Result<Arc<Buffer>> {
    if lblk >= inode.size / core.geo.block_size as u64 {
        return Err(Error::corrupt(
            Location::Inode { ino },
            format!("directory block {lblk} beyond the directory's size"),
        ));
    }
    match core.lookup(ino, inode, lblk)? {
        Lookup::Mapped(extent) if !extent.unwritten => core.cache.read(extent.physical),
        _ => Err(Error::corrupt(
            Location::Inode { ino },
            format!("directory has a hole at block {lblk}"),
        )),
    }
}

/// Mapping blocks that appending `blocks` blocks to directory `ino` may
/// allocate (space budget).
fn append_cost(core: &Core, ino: u32, inode: &Inode, blocks: u32) -> Result<u64> {
    let lblk = inode.size / core.geo.block_size as u64;
    mapping::append_cost(&core.geo, &core.cache, ino, inode, lblk, blocks)
}

fn index_damaged(core: &Core, ino: u32) -> bool {
    core.damaged_indexes.lock().contains_key(&ino)
}

fn leaf_ranges(core: &Core, ino: u32) -> Option<Arc<LeafRanges>> {
    core.damaged_indexes.lock().get(&ino).cloned().flatten()
}

/// Keep `ranges` for directory `ino` while the mount's bound allows.
fn keep_leaf_ranges(core: &Core, ino: u32, ranges: Arc<LeafRanges>) {
    let mut damaged = core.damaged_indexes.lock();
    let kept: usize = damaged.values().flatten().map(|kept| kept.len()).sum();
    if kept + ranges.len() <= super::LEAF_RANGES_KEPT_MAX
        && let Some(slot) = damaged.get_mut(&ino)
    {
        *slot = Some(ranges);
    }
}

/// Remember that directory `ino`'s htree index is damaged and log it the
/// first time (the kernel warns from dx_probe and falls back to a linear
/// scan; e2fsck -fD rebuilds the index).
fn note_index_damaged(core: &Core, ino: u32, why: &Error) {
    let first = {
        let mut damaged = core.damaged_indexes.lock();
        let first = !damaged.contains_key(&ino);
        damaged.entry(ino).or_insert(None);
        first
    };
    if first {
        let found_in = match why {
            Error::Corrupt { origin, .. } => origin.to_string(),
            _ => String::new(),
        };
        tracing::error!(
            directory = ino,
            error = %why,
            %found_in,
            "damaged htree index; its leaves are read linearly and no name is added \
             to it until e2fsck -fD rebuilds it"
        );
    }
}

/// An inline directory's bytes, `None` for a directory of blocks.
fn inline_bytes(core: &Core, ino: u32, inode: &Inode) -> Result<Option<Vec<u8>>> {
    if !inode.has_inline_data() {
        return Ok(None);
    }
    inline::stored_bytes(&core.geo, ino, inode).map(Some)
}

pub(crate) struct DirReader<'a> {
    core: &'a Core,
    ino: u32,
    inode: &'a Inode,
    seed: u32,
    /// What a listing left out, for the caller to report (at most
    /// `BAD_ENTRIES_KEPT`; the rest are counted in `bad_entries_more`).
    bad_entries: Vec<BadEntry>,
    bad_entries_more: usize,
}

/// Bad entries one listing keeps for its report: each is logged, and a
/// directory of garbage must not make that unbounded.
const BAD_ENTRIES_KEPT: usize = 16;

impl<'a> DirReader<'a> {
    pub fn new(core: &'a Core, ino: u32, inode: &'a Inode) -> Self {
        DirReader {
            core,
            ino,
            inode,
            seed: inode.csum_seed(&core.geo, ino),
            bad_entries: Vec::new(),
            bad_entries_more: 0,
        }
    }
}

impl DirBlocks for DirReader<'_> {
    fn geo(&self) -> &Geometry {
        &self.core.geo
    }
    fn cache(&self) -> &BufferCache {
        &self.core.cache
    }
    fn dir_ino(&self) -> u32 {
        self.ino
    }
    fn csum_seed(&self) -> u32 {
        self.seed
    }
    fn block_count(&self) -> u64 {
        self.inode.size / self.core.geo.block_size as u64
    }
    fn read_block(&mut self, lblk: u64) -> Result<Arc<Buffer>> {
        dir_block(self.core, self.ino, self.inode, lblk)
    }
    fn append_block(&mut self, _handle: &Handle<'_>) -> Result<(u64, Arc<Buffer>)> {
        debug_assert!(false, "a DirReader never grows a directory");
        Err(Error::ReadOnly)
    }
    fn append_cost(&mut self, blocks: u32) -> Result<u64> {
        append_cost(self.core, self.ino, self.inode, blocks)
    }
    fn is_indexed(&self) -> bool {
        self.inode.has_flag(flags::INDEX)
    }
    fn is_casefolded(&self) -> bool {
        self.inode.has_flag(flags::CASEFOLD)
    }
    fn is_encrypted(&self) -> bool {
        self.inode.is_encrypted(self.geo())
    }
    fn set_indexed(&mut self, _indexed: bool) {
        debug_assert!(false, "a DirReader never changes a directory");
    }
    fn index_damaged(&self) -> bool {
        index_damaged(self.core, self.ino)
    }
    fn note_index_damaged(&mut self, why: &Error) {
        note_index_damaged(self.core, self.ino, why)
    }
    fn leaf_ranges(&self) -> Option<Arc<LeafRanges>> {
        leaf_ranges(self.core, self.ino)
    }
    fn keep_leaf_ranges(&mut self, ranges: Arc<LeafRanges>) {
        keep_leaf_ranges(self.core, self.ino, ranges)
    }
    fn note_bad_entry(&mut self, bad: BadEntry) {
        if self.bad_entries.len() < BAD_ENTRIES_KEPT {
            self.bad_entries.push(bad);
        } else {
            self.bad_entries_more += 1;
        }
    }
    fn inline_bytes(&self) -> Result<Option<Vec<u8>>> {
        inline_bytes(self.core, self.ino, self.inode)
    }
    fn inline_max(&self) -> Result<usize> {
        inline::max_size(&self.core.geo, self.ino, self.inode)
    }
}

pub(crate) struct DirWriter<'t, 'a, 'j> {
    tx: &'t mut Tx<'a, 'j>,
    ino: u32,
    inode: &'t mut Inode,
    seed: u32,
}

impl<'t, 'a, 'j> DirWriter<'t, 'a, 'j> {
    pub fn new(tx: &'t mut Tx<'a, 'j>, ino: u32, inode: &'t mut Inode) -> Self {
        let seed = inode.csum_seed(&tx.core.geo, ino);
        DirWriter {
            tx,
            ino,
            inode,
            seed,
        }
    }
}

impl DirBlocks for DirWriter<'_, '_, '_> {
    fn geo(&self) -> &Geometry {
        &self.tx.core.geo
    }
    fn cache(&self) -> &BufferCache {
        &self.tx.core.cache
    }
    fn dir_ino(&self) -> u32 {
        self.ino
    }
    fn csum_seed(&self) -> u32 {
        self.seed
    }
    fn block_count(&self) -> u64 {
        self.inode.size / self.tx.core.geo.block_size as u64
    }
    fn read_block(&mut self, lblk: u64) -> Result<Arc<Buffer>> {
        dir_block(self.tx.core, self.ino, self.inode, lblk)
    }
    fn append_block(&mut self, handle: &Handle<'_>) -> Result<(u64, Arc<Buffer>)> {
        let core = self.tx.core;
        let geo = &core.geo;
        let lblk = self.block_count();
        // Without large_dir, a directory's size stays below 2 GiB (e2fsck's
        // limit; the kernel reads only i_size_lo of a directory then); with
        // it, within the 2^32 logical blocks an extent tree maps.
        let limit = match geo.has_incompat(crate::format::superblock::incompat::LARGEDIR) {
            true => (u32::MAX as u64) * geo.block_size as u64,
            false => 1 << 31,
        };
        if (lblk + 1) * geo.block_size as u64 >= limit {
            return Err(Error::NoSpace);
        }
        let goal = geo.group_first_block(geo.group_of_inode(self.ino));
        let extent = {
            let mut ctx = self.tx.meta_ctx();
            mapping::allocate(&mut ctx, self.ino, self.inode, lblk, 1, goal, false)?
        };
        debug_assert_eq!(extent.logical, lblk);
        self.inode.size = (lblk + 1) * geo.block_size as u64;
        let buffer = core.cache.get_for_overwrite(extent.physical)?;
        handle.get_create_access(&buffer)?.fill(0);
        buffer.set_verified();
        Ok((lblk, buffer))
    }
    fn append_cost(&mut self, blocks: u32) -> Result<u64> {
        append_cost(self.tx.core, self.ino, self.inode, blocks)
    }
    fn is_indexed(&self) -> bool {
        self.inode.has_flag(flags::INDEX)
    }
    fn is_casefolded(&self) -> bool {
        self.inode.has_flag(flags::CASEFOLD)
    }
    fn is_encrypted(&self) -> bool {
        self.inode.is_encrypted(self.geo())
    }
    fn set_indexed(&mut self, indexed: bool) {
        if indexed {
            self.inode.flags |= flags::INDEX;
        } else {
            self.inode.flags &= !flags::INDEX;
        }
    }
    fn index_damaged(&self) -> bool {
        index_damaged(self.tx.core, self.ino)
    }
    fn note_index_damaged(&mut self, why: &Error) {
        note_index_damaged(self.tx.core, self.ino, why)
    }
    fn leaf_ranges(&self) -> Option<Arc<LeafRanges>> {
        leaf_ranges(self.tx.core, self.ino)
    }
    fn keep_leaf_ranges(&mut self, ranges: Arc<LeafRanges>) {
        keep_leaf_ranges(self.tx.core, self.ino, ranges)
    }
    fn note_bad_entry(&mut self, bad: BadEntry) {
        debug_assert!(false, "listings read through a DirReader: {bad:?}");
        tracing::warn!(?bad, directory = self.ino, "bad directory entry");
    }
    fn inline_bytes(&self) -> Result<Option<Vec<u8>>> {
        inline_bytes(self.tx.core, self.ino, self.inode)
    }
    fn inline_max(&self) -> Result<usize> {
        inline::max_size(&self.tx.core.geo, self.ino, self.inode)
    }
    fn store_inline(&mut self, bytes: &[u8]) -> Result<()> {
        // A directory's size is its inline bytes' (e2fsck: 60 plus the
        // value's length, exactly).
        inline::store(&self.tx.core.geo, self.ino, self.inode, bytes)?;
        self.inode.size = bytes.len() as u64;
        Ok(())
    }
    fn destroy_inline(&mut self) -> Result<()> {
        inline::destroy(&self.tx.core.geo, self.ino, self.inode)?;
        self.inode.size = 0;
        Ok(())
    }
}

/// One entry of a directory listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dentry {
    pub ino: u32,
    pub name: Vec<u8>,
    pub kind: FileKind,
    /// Cookie to resume the listing after this entry.
    pub next: u64,
}

/// The kind a directory entry's file type byte names (`EXT4_FT_*`).
fn kind_of_file_type(file_type: u8) -> Option<FileKind> {
    Some(match file_type {
        1 => FileKind::Regular,
        2 => FileKind::Directory,
        3 => FileKind::CharDevice,
        4 => FileKind::BlockDevice,
        5 => FileKind::Fifo,
        6 => FileKind::Socket,
        7 => FileKind::Symlink,
        _ => return None,
    })
}

/// What one readdir call met besides the names it emitted.
struct Listing {
    inode: Inode,
    /// Entries left out, for `report_bad_entries`.
    bad: Vec<BadEntry>,
    bad_more: usize,
    /// Entries whose inode could not say their kind.
    unknown: Vec<Error>,
    /// The call found the end with nothing left to emit.
    ended: bool,
}

impl Fs {
    /// List directory `ino` from `cookie` (0 = start), calling `emit` for
    /// each entry until it returns false.
    pub fn readdir(
        &self,
        ino: u32,
        cookie: u64,
        emit: &mut dyn FnMut(Dentry) -> bool,
    ) -> Result<()> {
        let dir = self.core.inodes.read(ino, crate::lock::Rank::Directory);
        let result = self.list_locked(ino, cookie, emit);
        drop(dir);
        let listing = self.note_error(result)?;
        self.report_bad_entries(ino, listing.bad, listing.bad_more, listing.unknown);
        // A listing is an access, as the kernel's iterate_dir counts it
        // (file_accessed), under the same atime policy as a file read.
        if listing.inode.links_count > 0 && !self.core.options.nodiratime {
            self.touch_atime(ino, &listing.inode);
        }
        // A directory whose listing left names out (a name with '/',
        // which no listing can carry, or a leaf that could not be read)
        // ends its listing with an error, after every other name (the call
        // that finds the end empty), so that a walk that returns no error
        // lists every name on disk. The kernel's readdir stops at a name
        // with '/' (EUCLEAN) and skips a damaged block. Like any
        // corruption, it leaves the filesystem read-only.
        if listing.ended && self.core.incomplete_listings.lock().contains(&ino) {
            return self.note_error(Err(Error::corrupt(
                Location::Inode { ino },
                "the directory's listing left out names it could not read or carry",
            )));
        }
        Ok(())
    }

    /// Every entry of directory `ino` but "." and "..", in directory
    /// order: `readdir` from the start, collected (the walks of the tools,
    /// the library and the crash driver).
    pub fn entries(&self, ino: u32) -> Result<Vec<Dentry>> {
        let mut entries = Vec::new();
        self.readdir(ino, 0, &mut |entry| {
            if entry.name != b"." && entry.name != b".." {
                entries.push(entry);
            }
            true
        })?;
        Ok(entries)
    }

    /// `readdir`'s work under the directory's shared lock.
    fn list_locked(
        &self,
        ino: u32,
        cookie: u64,
        emit: &mut dyn FnMut(Dentry) -> bool,
    ) -> Result<Listing> {
        let inode = read_inode(&self.core, ino)?;
        check_live(ino, &inode)?;
        if !inode.is_dir() {
            return Err(Error::NotDirectory);
        }
        if inode.links_count == 0 {
            // Removed while open: empty.
            return Ok(Listing {
                inode,
                bad: Vec::new(),
                bad_more: 0,
                unknown: Vec::new(),
                ended: true,
            });
        }
        let encrypted = encrypted_dir(&self.core, ino, &inode)?;
        let hasher = match encrypted {
            true => dir::listing_hasher(&mut DirReader::new(&self.core, ino, &inode))?,
            false => None,
        };
        let mut reader = DirReader::new(&self.core, ino, &inode);
        let mut unknown = Vec::new();
        let (mut emitted, mut stopped) = (false, false);
        let mut failed = None;
        dir::read_entries(&mut reader, cookie, &mut |entry: &DirEntry, next: u64| {
            // Without the key, an encrypted directory's names are shown in
            // their no-key form, which carries the hash the kernel's
            // listing gives them.
            let name = match encrypted && entry.name != b"." && entry.name != b".." {
                true => {
                    let (hash, minor) = hasher.map_or((0, 0), |hasher| {
                        let hash = hasher.full(&entry.name);
                        (hash.major, hash.minor)
                    });
                    match fscrypt::nokey_name(hash, minor, &entry.name, Location::Inode { ino }) {
                        Ok(name) => name,
                        Err(error) => {
                            failed = Some(error);
                            return false;
                        }
                    }
                }
                false => entry.name.clone(),
            };
            let kind = match kind_of_file_type(entry.file_type) {
                Some(kind) => kind,
                // No file type in the entry (ext2 without `filetype`, or an
                // entry made without one): the inode says. One that cannot
                // is listed all the same, as the kernel lists it
                // (DT_UNKNOWN): FUSE has no unknown type, so it goes as a
                // regular file, the failure is reported, and a stat of the
                // name gets the error.
                None => kind_from_inode(&self.core, entry.ino).unwrap_or_else(|error| {
                    unknown.push(error);
                    FileKind::Regular
                }),
            };
            emitted = true;
            let taken = emit(Dentry {
                ino: entry.ino,
                name,
                kind,
                next,
            });
            stopped |= !taken;
            taken
        })?;
        if let Some(error) = failed {
            return Err(error);
        }
        Ok(Listing {
            bad: std::mem::take(&mut reader.bad_entries),
            bad_more: reader.bad_entries_more,
            inode,
            unknown,
            ended: !stopped && !emitted,
        })
    }

    /// Say what a listing of directory `dir` left out: a corrupt entry as
    /// any corruption (logged once, read-only, recorded), a name no
    /// listing may carry as an error line of its own (the listing's end
    /// reports it as corruption).
    fn report_bad_entries(&self, dir: u32, bad: Vec<BadEntry>, more: usize, unknown: Vec<Error>) {
        let short = more > 0 || bad.iter().any(|bad| !matches!(bad, BadEntry::Corrupt(_)));
        if short {
            self.core.incomplete_listings.lock().insert(dir);
        }
        for bad in bad {
            match bad {
                BadEntry::Corrupt(error) | BadEntry::Lost(error) => {
                    self.note_failure(&error, false);
                }
                BadEntry::UnlistableName { location, offset } => {
                    let detail = format!("entry at {offset} has a name with '/'; it is not listed");
                    if self.first_report(&location, &detail) {
                        tracing::error!(%location, %detail, "corrupt directory entry left out of a listing");
                    }
                }
            }
        }
        for error in unknown {
            self.note_failure(&error, false);
        }
        if more > 0 {
            tracing::error!(
                directory = dir,
                more,
                "more bad entries left out of a listing"
            );
        }
    }
}

/// Whether directory `ino` is encrypted (its names fscrypt ciphertext);
/// one that is casefolded too keeps a hash in each entry, which jext4
/// does not read yet: refused.
pub(crate) fn encrypted_dir(core: &Core, ino: u32, inode: &Inode) -> Result<bool> {
    if !inode.is_encrypted(&core.geo) {
        return Ok(false);
    }
    if inode.has_flag(flags::CASEFOLD) {
        return Err(Error::Unsupported(format!(
            "directory {ino} is encrypted and casefolded, which jext4 does not read yet"
        )));
    }
    Ok(true)
}

/// The name on disk that `name`, as a caller gives it, stands for in
/// directory `ino`: itself, or in an encrypted directory the ciphertext
/// its no-key form names (NotFound for a name that is no no-key name, or
/// whose long form matches no entry).
pub(crate) fn disk_name<'n>(
    core: &Core,
    ino: u32,
    inode: &Inode,
    name: &'n [u8],
) -> Result<Cow<'n, [u8]>> {
    if !encrypted_dir(core, ino, inode)? || name == b"." || name == b".." {
        return Ok(Cow::Borrowed(name));
    }
    let nokey = fscrypt::NokeyName::parse(name).ok_or(Error::NotFound)?;
    if let fscrypt::NokeyName::Short(ciphertext) = nokey {
        return Ok(Cow::Owned(ciphertext));
    }
    let mut found = None;
    dir::read_entries(&mut DirReader::new(core, ino, inode), 0, &mut |entry, _| {
        if nokey.matches(&entry.name) {
            found = Some(entry.name.clone());
            return false;
        }
        true
    })?;
    found.map(Cow::Owned).ok_or(Error::NotFound)
}

/// The kind of inode `ino`, for an entry that does not say.
fn kind_from_inode(core: &Core, ino: u32) -> Result<FileKind> {
    let inode = read_inode(core, ino)?;
    FileKind::from_mode(inode.mode)
        .ok_or_else(|| Error::corrupt(Location::Inode { ino }, "entry names an unused inode"))
}
