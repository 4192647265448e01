//! The ext2/ext3 block map: `i_block[0..12]` point at the first twelve
//! data blocks, `i_block[12]` at an indirect block of `block_size / 4`
//! pointers to data, `i_block[13]` at a double-indirect block (pointers to
//! indirect blocks) and `i_block[14]` at a triple-indirect one
//! (Documentation/filesystems/ext4/blockmap.rst). A zero pointer is a hole,
//! at any level. Indirect blocks carry no magic and no checksum, so the
//! only checks possible are that pointers stay inside the filesystem.
//!
//! Walks go through `Route`: the i_block slot heading the subtree that
//! holds a logical block, and the entry to follow in each indirect block
//! below it. Every walk is a loop whose iterations are bounded by the
//! number of indirect blocks a file can have.

use super::inode::{I_BLOCK_SIZE, Inode, flags};
use super::mapping::{self, BlockUse, Extent, Lookup};
use super::superblock::Geometry;
use super::{MetaCtx, get_u32, put_u32};
use crate::cache::{Buffer, BufferCache};
use crate::ensure_format;
use crate::error::{Error, Location, Result};
use std::sync::Arc;

/// Data blocks addressed straight from `i_block`.
pub const DIRECT_BLOCKS: u64 = 12;
/// `i_block` slots: 12 direct pointers, then the indirect, double- and
/// triple-indirect ones.
const SLOTS: usize = I_BLOCK_SIZE / 4;
/// Deepest chain of indirect blocks (triple indirect).
pub const MAX_LEVELS: usize = 3;

/// Where the pointer to a logical block lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Route {
    /// The `i_block` slot heading the subtree.
    slot: usize,
    /// Indirect blocks between the slot and the data pointer (0..=3).
    levels: usize,
    /// The entry to follow in each indirect block, outermost first.
    offsets: [u64; MAX_LEVELS],
}

/// The pointer geometry for one block size.
#[derive(Debug, Clone, Copy)]
struct Shape {
    /// Pointers per indirect block.
    per: u64,
}

impl Shape {
    fn new(geo: &Geometry) -> Self {
        Shape {
            per: geo.block_size as u64 / 4,
        }
    }

    /// Logical blocks under one entry at depth `depth` of a subtree with
    /// `levels` indirect levels.
    fn span(&self, levels: usize, depth: usize) -> u64 {
        debug_assert!(depth < levels);
        self.per.pow((levels - 1 - depth) as u32)
    }

    /// First logical block of the subtree under slot 12 + levels - 1.
    fn subtree_first(&self, levels: usize) -> u64 {
        (1..levels).fold(DIRECT_BLOCKS, |first, l| first + self.per.pow(l as u32))
    }

    /// Logical blocks the whole scheme can address.
    fn capacity(&self) -> u64 {
        self.subtree_first(MAX_LEVELS + 1)
    }

    fn route(&self, lblk: u64) -> Option<Route> {
        if lblk < DIRECT_BLOCKS {
            return Some(Route {
                slot: lblk as usize,
                levels: 0,
                offsets: [0; MAX_LEVELS],
            });
        }
        for levels in 1..=MAX_LEVELS {
            let first = self.subtree_first(levels);
            let size = self.per.pow(levels as u32);
            if lblk < first + size {
                let mut rest = lblk - first;
                let mut offsets = [0; MAX_LEVELS];
                for depth in (0..levels).rev() {
                    offsets[depth] = rest % self.per;
                    rest /= self.per;
                }
                debug_assert_eq!(rest, 0);
                return Some(Route {
                    slot: DIRECT_BLOCKS as usize + levels - 1,
                    levels,
                    offsets,
                });
            }
        }
        None
    }

    /// The logical block a route leads to.
    fn logical(&self, route: &Route) -> u64 {
        if route.levels == 0 {
            return route.slot as u64;
        }
        (0..route.levels).fold(self.subtree_first(route.levels), |lblk, depth| {
            lblk + route.offsets[depth] * self.span(route.levels, depth)
        })
    }

    /// The first logical block after the coverage of the entry at `depth`
    /// that `route` follows (the whole slot for `depth` = None).
    fn skip_past(&self, route: &Route, depth: Option<usize>) -> u64 {
        let Some(depth) = depth else {
            return self.subtree_first(route.levels) + self.per.pow(route.levels as u32);
        };
        let mut start = *route;
        for offset in &mut start.offsets[depth + 1..] {
            *offset = 0;
        }
        self.logical(&start) + self.span(route.levels, depth)
    }

    /// Upper bound on the walk steps over one file: every step passes at
    /// least one pointer of some indirect block or slot, and a file has at
    /// most 1 + (1 + per) + (1 + per + per²) indirect blocks.
    fn step_limit(&self) -> u64 {
        2 * self.per * self.per + 4 * self.per + 16
    }
}

fn slot_pointer(inode: &Inode, slot: usize) -> u64 {
    get_u32(&inode.block, slot * 4) as u64
}

fn set_slot_pointer(inode: &mut Inode, slot: usize, block: u64) {
    debug_assert!(block <= u32::MAX as u64);
    put_u32(&mut inode.block, slot * 4, block as u32);
}

/// A pointer read from disk must name a block of the filesystem's data
/// area (e2fsck: "illegal block").
fn check_pointer(geo: &Geometry, ino: u32, block: u64, what: &str) -> Result<()> {
    ensure_format!(
        block >= geo.first_data_block.max(1) as u64 && block < geo.blocks_count,
        Location::Inode { ino },
        "{what} pointer {block} outside the filesystem"
    );
    Ok(())
}

/// What reading a block map needs.
#[derive(Clone, Copy)]
struct Reader<'a> {
    geo: &'a Geometry,
    cache: &'a BufferCache,
    ino: u32,
    shape: Shape,
}

/// The array that holds a data pointer: `i_block` itself, or a leaf
/// indirect block.
enum Holder {
    Inode,
    Block(Arc<Buffer>),
}

impl<'a> Reader<'a> {
    fn new(geo: &'a Geometry, cache: &'a BufferCache, ino: u32) -> Self {
        Reader {
            geo,
            cache,
            ino,
            shape: Shape::new(geo),
        }
    }

    fn read_indirect(&self, block: u64) -> Result<Arc<Buffer>> {
        check_pointer(self.geo, self.ino, block, "indirect block")?;
        self.cache.read(block)
    }

    /// Follow `route` down to the array holding its data pointer; None
    /// when a zero pointer on the way makes it a hole.
    fn holder(&self, inode: &Inode, route: &Route) -> Result<Option<Holder>> {
        if route.levels == 0 {
            return Ok(Some(Holder::Inode));
        }
        let mut pointer = slot_pointer(inode, route.slot);
        for depth in 0..route.levels {
            if pointer == 0 {
                return Ok(None);
            }
            let buffer = self.read_indirect(pointer)?;
            if depth + 1 == route.levels {
                return Ok(Some(Holder::Block(buffer)));
            }
            pointer = get_u32(&buffer.read(), route.offsets[depth] as usize * 4) as u64;
        }
        unreachable!("the loop returns at the last level")
    }

    fn lookup(&self, inode: &Inode, lblk: u64) -> Result<Lookup> {
        let Some(route) = self.shape.route(lblk) else {
            return Ok(Lookup::Hole { next: None });
        };
        let hole = || {
            Ok(Lookup::Hole {
                next: self.next_mapped(inode, lblk + 1)?,
            })
        };
        let Some(holder) = self.holder(inode, &route)? else {
            return hole();
        };
        // The run is read under the block's lock, which is released before
        // a hole's search reads the same block again.
        let (physical, len) = {
            let guard;
            let (array, first, entries) = match &holder {
                Holder::Inode => (&inode.block[..], route.slot, DIRECT_BLOCKS as usize),
                Holder::Block(buffer) => {
                    guard = buffer.read();
                    let first = route.offsets[route.levels - 1] as usize;
                    (&guard[..], first, self.shape.per as usize)
                }
            };
            let physical = get_u32(array, first * 4) as u64;
            let mut len = 1;
            while physical != 0
                && first + len < entries
                && get_u32(array, (first + len) * 4) as u64 == physical + len as u64
            {
                len += 1;
            }
            (physical, len)
        };
        if physical == 0 {
            return hole();
        }
        check_pointer(self.geo, self.ino, physical, "data block")?;
        Ok(Lookup::Mapped(Extent {
            logical: lblk,
            physical,
            len: len as u32,
            unwritten: false,
        }))
    }

    /// The first mapped logical block at or after `from`, skipping whole
    /// subtrees under zero pointers.
    fn next_mapped(&self, inode: &Inode, from: u64) -> Result<Option<u64>> {
        let mut cursor = from;
        for _ in 0..self.shape.step_limit() {
            let Some(mut route) = self.shape.route(cursor) else {
                return Ok(None);
            };
            if route.levels == 0 {
                let found =
                    (route.slot..DIRECT_BLOCKS as usize).find(|&s| slot_pointer(inode, s) != 0);
                match found {
                    Some(slot) => return Ok(Some(slot as u64)),
                    None => cursor = DIRECT_BLOCKS,
                }
                continue;
            }
            let pointer = slot_pointer(inode, route.slot);
            if pointer == 0 {
                cursor = self.shape.skip_past(&route, None);
                continue;
            }
            // An exhausted block at `depth` ends the coverage of the entry
            // above it (of the slot itself at depth 0).
            match self.scan_subtree(&mut route, pointer)? {
                Ok(()) => return Ok(Some(self.shape.logical(&route))),
                Err(depth) => cursor = self.shape.skip_past(&route, depth.checked_sub(1)),
            }
        }
        Err(Error::corrupt(
            Location::Inode { ino: self.ino },
            "block map walk did not finish",
        ))
    }

    /// Descend from the indirect block `pointer` heading `route`'s slot,
    /// moving each offset forward to the first non-zero entry. `Ok` leaves
    /// `route` at a mapped block; `Err(depth)` says the block at `depth` has
    /// no non-zero entry from the route's offset on.
    fn scan_subtree(&self, route: &mut Route, mut pointer: u64) -> Result<Result<(), usize>> {
        for depth in 0..route.levels {
            let buffer = self.read_indirect(pointer)?;
            let bytes = buffer.read();
            let found = (route.offsets[depth]..self.shape.per)
                .find(|&i| get_u32(&bytes, i as usize * 4) != 0);
            let Some(index) = found else {
                return Ok(Err(depth));
            };
            if index != route.offsets[depth] {
                route.offsets[depth] = index;
                for offset in &mut route.offsets[depth + 1..] {
                    *offset = 0;
                }
            }
            pointer = get_u32(&bytes, index as usize * 4) as u64;
        }
        check_pointer(self.geo, self.ino, pointer, "data block")?;
        Ok(Ok(()))
    }
}

pub fn lookup(
    geo: &Geometry,
    cache: &BufferCache,
    ino: u32,
    inode: &Inode,
    lblk: u64,
) -> Result<Lookup> {
    Reader::new(geo, cache, ino).lookup(inode, lblk)
}

/// A block map being changed.
struct Writer<'x, 'a, 'j> {
    ctx: &'x mut MetaCtx<'a, 'j>,
    ino: u32,
    inode: &'x mut Inode,
    shape: Shape,
}

impl<'x, 'a, 'j> Writer<'x, 'a, 'j> {
    fn new(ctx: &'x mut MetaCtx<'a, 'j>, ino: u32, inode: &'x mut Inode) -> Self {
        debug_assert!(!inode.uses_extents());
        let shape = Shape::new(ctx.geo);
        Writer {
            ctx,
            ino,
            inode,
            shape,
        }
    }

    fn reader(&self) -> Reader<'a> {
        Reader::new(self.ctx.geo, self.ctx.cache, self.ino)
    }

    fn sectors_per_block(&self) -> u64 {
        mapping::sectors_per_block(self.ctx.geo)
    }

    /// A zeroed indirect block near `goal`, counted in i_blocks. Block-map
    /// pointers are 32-bit.
    fn new_indirect(&mut self, goal: u64) -> Result<u64> {
        let buffer = self.ctx.new_meta_block(goal)?;
        let block = buffer.block();
        if block > u32::MAX as u64 {
            self.ctx.free_meta_block(block)?;
            return Err(Error::NoSpace);
        }
        self.inode.blocks += self.sectors_per_block();
        Ok(block)
    }

    fn free_indirect(&mut self, block: u64) -> Result<()> {
        self.ctx.free_meta_block(block)?;
        self.inode.blocks = self.inode.blocks.saturating_sub(self.sectors_per_block());
        Ok(())
    }

    fn write_entry(&mut self, block: u64, index: u64, value: u64) -> Result<()> {
        debug_assert!(index < self.shape.per && value <= u32::MAX as u64);
        let buffer = self.ctx.cache.read(block)?;
        let mut bytes = self.ctx.handle.get_write_access(&buffer)?;
        put_u32(&mut bytes, index as usize * 4, value as u32);
        Ok(())
    }

    /// Walk `route` down to its leaf array, creating zeroed indirect blocks
    /// where pointers are missing (goals follow each other, so a new chain
    /// lands right before the data it maps, as ext2 lays files out).
    /// Returns the leaf indirect block (None: the direct slots) and the goal
    /// for the data.
    fn build_chain(&mut self, route: &Route, goal: u64) -> Result<(Option<u64>, u64)> {
        if route.levels == 0 {
            return Ok((None, goal));
        }
        let mut goal = goal;
        let mut pointer = slot_pointer(self.inode, route.slot);
        if pointer == 0 {
            pointer = self.new_indirect(goal)?;
            set_slot_pointer(self.inode, route.slot, pointer);
            goal = pointer + 1;
        }
        for depth in 0..route.levels - 1 {
            let buffer = self.reader().read_indirect(pointer)?;
            let entry = route.offsets[depth];
            let child = get_u32(&buffer.read(), entry as usize * 4) as u64;
            if child != 0 {
                pointer = child;
                continue;
            }
            let child = self.new_indirect(goal)?;
            self.write_entry(pointer, entry, child)?;
            pointer = child;
            goal = child + 1;
        }
        self.reader().read_indirect(pointer)?;
        Ok((Some(pointer), goal))
    }

    /// Clusters need extents (the mount checks the feature): a block map
    /// on a bigalloc filesystem is refused before anything changes, for
    /// allocation, and for freeing once it maps a block (its runs are not
    /// clusters).
    fn refuse_on_bigalloc(&self) -> Result<()> {
        let maps_blocks =
            (0..I_BLOCK_SIZE / 4).any(|slot| get_u32(&self.inode.block, slot * 4) != 0);
        if self.ctx.geo.bigalloc() && maps_blocks {
            return Err(Error::corrupt(
                Location::Inode { ino: self.ino },
                "a block-mapped file on a bigalloc filesystem",
            ));
        }
        Ok(())
    }

    fn allocate(&mut self, lblk: u64, len: u32, goal: u64) -> Result<Extent> {
        if self.ctx.geo.bigalloc() {
            return Err(Error::corrupt(
                Location::Inode { ino: self.ino },
                "a block-mapped file on a bigalloc filesystem",
            ));
        }
        let limit = max_blocks(self.ctx.geo);
        let route = match self.shape.route(lblk) {
            Some(route) if lblk < limit => route,
            _ => return Err(Error::FileTooBig),
        };
        let reader = self.reader();
        let Lookup::Hole { next } = reader.lookup(self.inode, lblk)? else {
            return Err(Error::Invalid(format!(
                "logical block {lblk} of inode {} is already mapped",
                self.ino
            )));
        };
        // One leaf array per allocation: the caller loops for more.
        let array_room = match route.levels {
            0 => DIRECT_BLOCKS - lblk,
            levels => self.shape.per - route.offsets[levels - 1],
        };
        let hole_end = next.unwrap_or(limit).min(limit);
        let want = (len as u64).min(hole_end - lblk).min(array_room);
        debug_assert!(want > 0);
        // The data run and the indirect blocks above it, before anything
        // changes; near full the run shrinks to what the budget covers.
        let missing = missing_chain(&self.reader(), self.inode, &route)?;
        let want = self.ctx.charge_run(missing, want)? as u32;
        debug_assert!(want > 0);
        let goal = match lblk.checked_sub(1) {
            Some(before) => match reader.lookup(self.inode, before)? {
                Lookup::Mapped(extent) => extent.physical + 1,
                Lookup::Hole { .. } => goal,
            },
            None => goal,
        };
        let attempt = self
            .build_chain(&route, goal)
            .and_then(|(leaf, data_goal)| Ok((leaf, self.allocate_data(data_goal, want)?)));
        let (leaf, (physical, got)) = match attempt {
            Ok(done) => done,
            Err(error) => {
                // Give back indirect blocks created for nothing.
                self.punch(lblk, lblk + 1)?;
                return Err(error);
            }
        };
        let first = route.offsets[route.levels.saturating_sub(1)];
        for i in 0..got as u64 {
            match leaf {
                None => set_slot_pointer(self.inode, route.slot + i as usize, physical + i),
                Some(block) => self.write_entry(block, first + i, physical + i)?,
            }
        }
        self.inode.blocks += got as u64 * self.sectors_per_block();
        Ok(Extent {
            logical: lblk,
            physical,
            len: got,
            unwritten: false,
        })
    }

    fn allocate_data(&mut self, goal: u64, want: u32) -> Result<(u64, u32)> {
        let (physical, got) = self.ctx.alloc.alloc_blocks(self.ctx.handle, goal, want)?;
        debug_assert!(got >= 1 && got <= want);
        let got = got.min(want);
        if physical + got as u64 > u32::MAX as u64 + 1 {
            self.ctx
                .alloc
                .free_blocks(self.ctx.handle, physical, got as u64, false)?;
            return Err(Error::NoSpace);
        }
        Ok((physical, got))
    }

    /// Unmap `[start, end)`: clear data pointers leaf array by leaf array,
    /// free the data, and free indirect blocks left all zero.
    fn punch(&mut self, start: u64, end: u64) -> Result<()> {
        let mut cursor = start;
        for _ in 0..self.shape.step_limit() {
            if cursor >= end {
                return Ok(());
            }
            let Some(route) = self.shape.route(cursor) else {
                return Ok(());
            };
            if route.levels == 0 {
                let stop = end.min(DIRECT_BLOCKS);
                self.clear_direct(cursor, stop)?;
                cursor = stop;
                continue;
            }
            cursor = self.punch_in_subtree(&route, cursor, end)?;
        }
        Err(Error::corrupt(
            Location::Inode { ino: self.ino },
            "block map walk did not finish",
        ))
    }

    fn clear_direct(&mut self, from: u64, to: u64) -> Result<()> {
        let mut runs = Runs::default();
        for slot in from as usize..to as usize {
            let physical = slot_pointer(self.inode, slot);
            if physical != 0 {
                check_pointer(self.ctx.geo, self.ino, physical, "data block")?;
                runs.push(slot as u64, physical);
                set_slot_pointer(self.inode, slot, 0);
            }
        }
        self.free_runs(runs.finish())
    }

    fn free_runs(&mut self, runs: Vec<Extent>) -> Result<()> {
        let metadata = self.inode.blocks_are_metadata();
        for run in runs {
            self.ctx
                .alloc
                .free_blocks(self.ctx.handle, run.physical, run.len as u64, metadata)?;
            let sectors = run.len as u64 * self.sectors_per_block();
            self.inode.blocks = self.inode.blocks.saturating_sub(sectors);
        }
        Ok(())
    }

    /// One step of `punch` below an indirect slot: clear the part of the
    /// leaf array `cursor` falls in, or skip a subtree under a zero pointer.
    /// Returns the next cursor.
    fn punch_in_subtree(&mut self, route: &Route, cursor: u64, end: u64) -> Result<u64> {
        let reader = self.reader();
        let mut chain = [0u64; MAX_LEVELS];
        let mut pointer = slot_pointer(self.inode, route.slot);
        if pointer == 0 {
            return Ok(self.shape.skip_past(route, None));
        }
        for (depth, link) in chain.iter_mut().enumerate().take(route.levels) {
            *link = pointer;
            if depth + 1 == route.levels {
                break;
            }
            let buffer = reader.read_indirect(pointer)?;
            pointer = get_u32(&buffer.read(), route.offsets[depth] as usize * 4) as u64;
            if pointer == 0 {
                return self.skip_zero_entry(route, &chain, depth, &buffer);
            }
        }
        let leaf = chain[route.levels - 1];
        let first = route.offsets[route.levels - 1];
        let stop = (first + (end - cursor)).min(self.shape.per);
        let empty = self.clear_leaf(leaf, cursor, first, stop)?;
        if empty {
            self.free_empty_chain(route, &chain, route.levels - 1)?;
        }
        Ok(cursor + (stop - first))
    }

    /// The entry `route` follows in the indirect block at `depth` (held in
    /// `buffer`) is zero: continue at the next non-zero entry of that block,
    /// or past the block, freeing it if it holds nothing at all (a chain
    /// left behind by an allocation that ran out of space).
    fn skip_zero_entry(
        &mut self,
        route: &Route,
        chain: &[u64; MAX_LEVELS],
        depth: usize,
        buffer: &Buffer,
    ) -> Result<u64> {
        let entry = route.offsets[depth];
        let bytes = buffer.read();
        let non_zero = |i: &u64| get_u32(&bytes, *i as usize * 4) != 0;
        let next = (entry + 1..self.shape.per).find(non_zero);
        let empty = next.is_none() && !(0..entry).any(|i| non_zero(&i));
        drop(bytes);
        if empty {
            self.free_empty_chain(route, chain, depth)?;
        }
        Ok(match next {
            Some(index) => {
                let mut ahead = *route;
                ahead.offsets[depth] = index;
                ahead.offsets[depth + 1..].fill(0);
                self.shape.logical(&ahead)
            }
            None => self.shape.skip_past(route, depth.checked_sub(1)),
        })
    }

    /// Clear entries `[first, stop)` of a leaf indirect block (mapping
    /// logical blocks from `lblk`) and free their data. Returns whether the
    /// whole block is now zero.
    fn clear_leaf(&mut self, block: u64, lblk: u64, first: u64, stop: u64) -> Result<bool> {
        let buffer = self.reader().read_indirect(block)?;
        let mut runs = Runs::default();
        let bytes = buffer.read();
        for i in first..stop {
            let physical = get_u32(&bytes, i as usize * 4) as u64;
            if physical != 0 {
                check_pointer(self.ctx.geo, self.ino, physical, "data block")?;
                runs.push(lblk + (i - first), physical);
            }
        }
        let empty = (0..self.shape.per)
            .all(|i| (first..stop).contains(&i) || get_u32(&bytes, i as usize * 4) == 0);
        drop(bytes);
        let runs = runs.finish();
        if !runs.is_empty() {
            let mut bytes = self.ctx.handle.get_write_access(&buffer)?;
            bytes[first as usize * 4..stop as usize * 4].fill(0);
        }
        self.free_runs(runs)?;
        Ok(empty)
    }

    /// The block of `chain` at `from` is all zero: free it, clear its
    /// pointer, and carry on upwards while parents are left all zero.
    fn free_empty_chain(
        &mut self,
        route: &Route,
        chain: &[u64; MAX_LEVELS],
        from: usize,
    ) -> Result<()> {
        debug_assert!(from < route.levels);
        for depth in (0..=from).rev() {
            self.free_indirect(chain[depth])?;
            if depth == 0 {
                set_slot_pointer(self.inode, route.slot, 0);
                return Ok(());
            }
            let parent = chain[depth - 1];
            let entry = route.offsets[depth - 1];
            self.write_entry(parent, entry, 0)?;
            let buffer = self.reader().read_indirect(parent)?;
            if buffer.read().iter().any(|&byte| byte != 0) {
                return Ok(());
            }
        }
        Ok(())
    }
}

/// Collects (logical, physical) pairs into runs of consecutive blocks.
#[derive(Default)]
struct Runs {
    runs: Vec<Extent>,
}

impl Runs {
    fn push(&mut self, logical: u64, physical: u64) {
        if let Some(last) = self.runs.last_mut()
            && last.end() == logical
            && last.physical + last.len as u64 == physical
        {
            last.len += 1;
            return;
        }
        self.runs.push(Extent {
            logical,
            physical,
            len: 1,
            unwritten: false,
        });
    }

    fn finish(self) -> Vec<Extent> {
        self.runs
    }
}

/// Indirect blocks `build_chain` would create for `route`: those below
/// the first missing pointer (for the space budget).
fn missing_chain(reader: &Reader<'_>, inode: &Inode, route: &Route) -> Result<u64> {
    let mut pointer = slot_pointer(inode, route.slot);
    for depth in 0..route.levels {
        if pointer == 0 {
            return Ok((route.levels - depth) as u64);
        }
        if depth + 1 == route.levels {
            break;
        }
        let buffer = reader.read_indirect(pointer)?;
        pointer = get_u32(&buffer.read(), route.offsets[depth] as usize * 4) as u64;
    }
    Ok(0)
}

/// Indirect blocks that mapping `blocks` new blocks from `lblk` on, one
/// at a time, may allocate (space budget): the chain missing above the
/// first, and a whole chain for each later one that starts a leaf array.
pub fn append_cost(
    geo: &Geometry,
    cache: &BufferCache,
    ino: u32,
    inode: &Inode,
    lblk: u64,
    blocks: u32,
) -> Result<u64> {
    let shape = Shape::new(geo);
    let reader = Reader::new(geo, cache, ino);
    let mut cost = 0;
    for index in 0..blocks as u64 {
        let Some(route) = shape.route(lblk + index) else {
            break; // past the map: the allocation fails with EFBIG
        };
        if index == 0 {
            cost += missing_chain(&reader, inode, &route)?;
        } else if route.levels > 0 && route.offsets[route.levels - 1] == 0 {
            cost += route.levels as u64;
        }
    }
    Ok(cost)
}

pub fn allocate(
    ctx: &mut MetaCtx,
    ino: u32,
    inode: &mut Inode,
    lblk: u64,
    len: u32,
    goal: u64,
    unwritten: bool,
) -> Result<Extent> {
    if unwritten {
        // ext2/ext3 cannot record allocated-but-unwritten blocks.
        return Err(Error::NotSupported);
    }
    Writer::new(ctx, ino, inode).allocate(lblk, len, goal)
}

pub fn punch(
    ctx: &mut MetaCtx,
    ino: u32,
    inode: &mut Inode,
    start: u64,
    end: Option<u64>,
) -> Result<()> {
    let mut writer = Writer::new(ctx, ino, inode);
    let capacity = writer.shape.capacity();
    let end = end.unwrap_or(capacity).min(capacity);
    if start >= end {
        return Ok(());
    }
    writer.refuse_on_bigalloc()?;
    writer.punch(start, end)
}

pub fn init(inode: &mut Inode) {
    inode.block = [0; I_BLOCK_SIZE];
    inode.flags &= !flags::EXTENTS;
}

pub fn for_each_block(
    geo: &Geometry,
    cache: &BufferCache,
    ino: u32,
    inode: &Inode,
    f: &mut dyn FnMut(BlockUse) -> Result<()>,
) -> Result<()> {
    let reader = Reader::new(geo, cache, ino);
    let mut runs = Runs::default();
    for slot in 0..DIRECT_BLOCKS as usize {
        let physical = slot_pointer(inode, slot);
        if physical != 0 {
            check_pointer(geo, ino, physical, "data block")?;
            runs.push(slot as u64, physical);
        }
    }
    for run in runs.finish() {
        f(BlockUse::Data(run))?;
    }
    for levels in 1..=MAX_LEVELS {
        let slot = DIRECT_BLOCKS as usize + levels - 1;
        let pointer = slot_pointer(inode, slot);
        if pointer != 0 {
            let first = reader.shape.subtree_first(levels);
            walk_subtree(&reader, pointer, levels, first, f)?;
        }
    }
    debug_assert_eq!(SLOTS, DIRECT_BLOCKS as usize + MAX_LEVELS);
    Ok(())
}

/// Depth-first over one indirect subtree with an explicit stack of
/// (block, levels below and including it, first logical block).
fn walk_subtree(
    reader: &Reader,
    top: u64,
    levels: usize,
    first: u64,
    f: &mut dyn FnMut(BlockUse) -> Result<()>,
) -> Result<()> {
    let per = reader.shape.per;
    let mut pending = vec![(top, levels, first)];
    // Each indirect block is visited once in a sane map; more visits than
    // the filesystem has blocks means pointers are shared.
    let mut budget = reader.geo.blocks_count;
    while let Some((block, levels, first)) = pending.pop() {
        ensure_format!(
            budget > 0,
            Location::Inode { ino: reader.ino },
            "block map visits more indirect blocks than the filesystem has"
        );
        budget -= 1;
        let buffer = reader.read_indirect(block)?;
        f(BlockUse::Meta(block))?;
        let bytes = buffer.read();
        let span = per.pow(levels as u32 - 1);
        if levels == 1 {
            let mut runs = Runs::default();
            for i in 0..per {
                let physical = get_u32(&bytes, i as usize * 4) as u64;
                if physical != 0 {
                    check_pointer(reader.geo, reader.ino, physical, "data block")?;
                    runs.push(first + i, physical);
                }
            }
            drop(bytes);
            for run in runs.finish() {
                f(BlockUse::Data(run))?;
            }
            continue;
        }
        for i in (0..per).rev() {
            let child = get_u32(&bytes, i as usize * 4) as u64;
            if child != 0 {
                pending.push((child, levels - 1, first + i * span));
            }
        }
    }
    Ok(())
}

/// The largest logical block count a block-mapped file may reach: what the
/// pointers address, and (as ext4_max_bitmap_size) no more than i_blocks
/// can count once the indirect blocks of a dense file are added.
pub fn max_blocks(geo: &Geometry) -> u64 {
    let shape = Shape::new(geo);
    let countable = mapping::max_sectors(geo) / mapping::sectors_per_block(geo);
    let fits = |n: u64| n + indirect_blocks_for(&shape, n) <= countable;
    let mut low = 0;
    let mut high = shape.capacity().min(super::extent::MAX_LOGICAL_BLOCKS);
    if fits(high) {
        return high;
    }
    // Binary search for the largest n that fits: at most 64 rounds.
    while low + 1 < high {
        let middle = low + (high - low) / 2;
        if fits(middle) {
            low = middle;
        } else {
            high = middle;
        }
    }
    low
}

/// Indirect blocks a dense file of `n` blocks needs.
fn indirect_blocks_for(shape: &Shape, n: u64) -> u64 {
    let per = shape.per;
    let Some(mut rest) = n.checked_sub(DIRECT_BLOCKS).filter(|&r| r > 0) else {
        return 0;
    };
    let mut blocks = 1;
    if rest <= per {
        return blocks;
    }
    rest -= per;
    blocks += 1 + rest.min(per * per).div_ceil(per);
    if rest <= per * per {
        return blocks;
    }
    rest -= per * per;
    blocks + 1 + rest.div_ceil(per * per) + rest.div_ceil(per)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_cover_every_level_and_invert() {
        let shape = Shape { per: 256 };
        assert_eq!(shape.capacity(), 12 + 256 + 65536 + 16_777_216);
        let cases = [
            (0, 0, 0, [0, 0, 0]),
            (11, 11, 0, [0, 0, 0]),
            (12, 12, 1, [0, 0, 0]),
            (267, 12, 1, [255, 0, 0]),
            (268, 13, 2, [0, 0, 0]),
            (268 + 256 * 3 + 7, 13, 2, [3, 7, 0]),
            (268 + 65536, 14, 3, [0, 0, 0]),
            (268 + 65536 + 65536 * 2 + 256 + 5, 14, 3, [2, 1, 5]),
        ];
        for (lblk, slot, levels, offsets) in cases {
            let route = shape.route(lblk).unwrap();
            assert_eq!(
                route,
                Route {
                    slot,
                    levels,
                    offsets
                },
                "lblk {lblk}"
            );
            assert_eq!(shape.logical(&route), lblk);
        }
        assert_eq!(shape.route(shape.capacity()), None);
        assert!(shape.route(shape.capacity() - 1).is_some());
    }

    #[test]
    fn skips_land_on_the_next_subtree() {
        let shape = Shape { per: 256 };
        let route = shape.route(268 + 65536 + 65536 * 2 + 256 + 5).unwrap();
        let base = 268 + 65536;
        assert_eq!(shape.skip_past(&route, None), base + 256 * 65536);
        assert_eq!(shape.skip_past(&route, Some(0)), base + 3 * 65536);
        assert_eq!(shape.skip_past(&route, Some(1)), base + 2 * 65536 + 2 * 256);
        assert_eq!(shape.skip_past(&route, Some(2)), base + 2 * 65536 + 256 + 6);
    }

    #[test]
    fn dense_indirect_counts() {
        let shape = Shape { per: 256 };
        assert_eq!(indirect_blocks_for(&shape, 12), 0);
        assert_eq!(indirect_blocks_for(&shape, 13), 1);
        assert_eq!(indirect_blocks_for(&shape, 268), 1);
        assert_eq!(indirect_blocks_for(&shape, 269), 3);
        assert_eq!(indirect_blocks_for(&shape, 268 + 65536), 2 + 256);
        assert_eq!(indirect_blocks_for(&shape, 268 + 65536 + 1), 2 + 256 + 3);
    }
}
