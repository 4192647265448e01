//! Model-based test of `format::mapping`: random sequences of allocate,
//! punch (and truncate) and mark_written on one inode, for extent trees and
//! block maps at 1 KiB and 4 KiB blocks, over mke2fs images in memory. After
//! every step the whole mapping must equal a per-block model, lookups must
//! agree with it, i_blocks must count exactly the data and tree blocks, and
//! the test allocator must hold exactly the blocks the mapping uses.

mod common;
mod mapping_support;

use jext4::Error;
use jext4::engine::format::inode::Inode;
use jext4::engine::format::mapping::{self, Lookup};
use mapping_support::{Image, TestAllocator, check_invariants, image_bytes, with_ctx};
use proptest::prelude::*;
use std::collections::BTreeMap;

const INO: u32 = 12;

#[derive(Debug, Clone, Copy)]
struct Variant {
    name: &'static str,
    size_mib: u64,
    args: &'static [&'static str],
    extents: bool,
}

const EXT4_1K: Variant = Variant {
    name: "model-ext4-1k",
    size_mib: 16,
    args: &["-t", "ext4", "-b", "1024"],
    extents: true,
};
const EXT4_4K: Variant = Variant {
    name: "model-ext4-4k",
    size_mib: 64,
    args: &["-t", "ext4", "-b", "4096"],
    extents: true,
};
const EXT3_1K: Variant = Variant {
    name: "model-ext3-1k",
    size_mib: 16,
    args: &["-t", "ext3", "-b", "1024"],
    extents: false,
};
const EXT3_4K: Variant = Variant {
    name: "model-ext3-4k",
    size_mib: 64,
    args: &["-t", "ext3", "-b", "4096"],
    extents: false,
};

/// A logical position: near one of the interesting places (block-map level
/// boundaries, far offsets, the end of the addressable range), or in a
/// small dense area where operations collide.
#[derive(Debug, Clone, Copy)]
struct Position {
    near: u8,
    delta: u64,
}

#[derive(Debug, Clone)]
enum Op {
    Allocate {
        at: Position,
        len: u32,
        unwritten: bool,
    },
    Punch {
        at: Position,
        len: Option<u64>,
    },
    MarkWritten {
        at: Position,
        len: u64,
    },
}

fn position() -> impl Strategy<Value = Position> {
    prop_oneof![
        6 => (0u64..600).prop_map(|delta| Position { near: 0, delta }),
        1 => (1u8..8, 0u64..48).prop_map(|(near, delta)| Position { near, delta }),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        5 => (position(), 1u32..=64, any::<bool>())
            .prop_map(|(at, len, unwritten)| Op::Allocate { at, len, unwritten }),
        2 => (position(), prop::option::weighted(0.9, 1u64..=200))
            .prop_map(|(at, len)| Op::Punch { at, len }),
        2 => (position(), 1u64..=100).prop_map(|(at, len)| Op::MarkWritten { at, len }),
    ]
}

#[derive(Debug, Clone)]
struct Setup {
    scatter: bool,
    max_run: u32,
    budget: Option<u64>,
    generation: u32,
}

fn setup() -> impl Strategy<Value = Setup> {
    (
        any::<bool>(),
        prop_oneof![Just(1u32), 2u32..8, Just(u32::MAX)],
        prop::option::weighted(0.2, 20u64..400),
        any::<u32>(),
    )
        .prop_map(|(scatter, max_run, budget, generation)| Setup {
            scatter,
            max_run,
            budget,
            generation,
        })
}

struct Harness {
    image: Image,
    alloc: TestAllocator,
    inode: Inode,
    extents: bool,
    max: u64,
    bases: Vec<u64>,
    /// Logical block → (physical block, unwritten).
    model: BTreeMap<u64, (u64, bool)>,
}

impl Harness {
    fn new(variant: Variant, setup: &Setup) -> Self {
        let bytes = image_bytes(variant.name, variant.size_mib, variant.args);
        let image = Image::memory(bytes);
        let mut alloc = TestAllocator::new(&image);
        alloc.scatter = setup.scatter;
        alloc.max_run = setup.max_run;
        alloc.budget = setup.budget;
        let inode = image.new_file(variant.extents, setup.generation);
        let max = mapping::max_blocks(&image.geo, &inode);
        let per = image.geo.block_size as u64 / 4;
        let gib3 = (3u64 << 30) / image.geo.block_size as u64;
        let bases = vec![
            0,
            12,
            12 + per,
            12 + per + per * per,
            1 << 20,
            gib3,
            max - 64,
        ];
        Harness {
            image,
            alloc,
            inode,
            extents: variant.extents,
            max,
            bases,
            model: BTreeMap::new(),
        }
    }

    fn resolve(&self, at: Position) -> u64 {
        let lblk = match at.near.checked_sub(1) {
            None => at.delta,
            Some(near) => self.bases[(near as usize).min(self.bases.len() - 1)] + at.delta,
        };
        lblk.min(self.max - 1)
    }

    fn run(&mut self, op: &Op) {
        match *op {
            Op::Allocate { at, len, unwritten } => {
                let lblk = self.resolve(at);
                self.allocate(lblk, len, unwritten);
            }
            Op::Punch { at, len } => {
                let start = self.resolve(at);
                self.punch(start, len.map(|len| start + len));
            }
            Op::MarkWritten { at, len } => {
                let start = self.resolve(at);
                self.mark_written(start, len);
            }
        }
    }

    /// The caller's loop: fill every hole in [lblk, lblk + len).
    fn allocate(&mut self, lblk: u64, len: u32, unwritten: bool) {
        let end = (lblk + len as u64).min(self.max);
        let mut cursor = lblk;
        let unwritten = unwritten && self.extents;
        while cursor < end {
            let found =
                mapping::lookup(&self.image.geo, &self.image.cache, INO, &self.inode, cursor);
            let next = match found.unwrap() {
                Lookup::Mapped(extent) => {
                    cursor = extent.end();
                    continue;
                }
                Lookup::Hole { next } => next,
            };
            if !self.extents {
                let refused = with_ctx(&self.image, &mut self.alloc, |ctx| {
                    mapping::allocate(ctx, INO, &mut self.inode, cursor, 1, 0, true)
                });
                assert!(matches!(refused, Err(Error::NotSupported)), "{refused:?}");
            }
            let want = (end - cursor) as u32;
            let result = with_ctx(&self.image, &mut self.alloc, |ctx| {
                mapping::allocate(ctx, INO, &mut self.inode, cursor, want, 0, unwritten)
            });
            let extent = match result {
                Ok(extent) => extent,
                Err(Error::NoSpace) => {
                    assert!(self.alloc.budget.is_some(), "NoSpace without a budget");
                    // A failed allocation maps nothing.
                    return;
                }
                Err(error) => panic!("allocate({cursor}, {want}): {error}"),
            };
            assert_eq!(extent.logical, cursor);
            assert!(extent.len >= 1 && extent.len <= want, "{extent:?}");
            assert_eq!(extent.unwritten, unwritten);
            assert!(
                next.is_none_or(|next| extent.end() <= next),
                "{extent:?} beyond the hole ending at {next:?}"
            );
            for i in 0..extent.len as u64 {
                self.model
                    .insert(cursor + i, (extent.physical + i, unwritten));
            }
            cursor = extent.end();
        }
    }

    fn punch(&mut self, start: u64, end: Option<u64>) {
        let result = with_ctx(&self.image, &mut self.alloc, |ctx| {
            mapping::punch(ctx, INO, &mut self.inode, start, end)
        });
        let end = end.unwrap_or(u64::MAX);
        match result {
            Ok(()) => self.model.retain(|&lblk, _| lblk < start || lblk >= end),
            // Splitting an extent in the middle needs a tree block when the
            // leaf is full; what was unmapped before that stays unmapped.
            Err(Error::NoSpace) if self.extents && self.alloc.budget.is_some() => {
                self.resync(start, end, false);
            }
            Err(error) => panic!("punch({start}, {end}): {error}"),
        }
    }

    fn mark_written(&mut self, start: u64, len: u64) {
        let result = with_ctx(&self.image, &mut self.alloc, |ctx| {
            mapping::mark_written(ctx, INO, &mut self.inode, start, len)
        });
        match result {
            Ok(()) => {
                for (_, (_, unwritten)) in self.model.range_mut(start..start + len) {
                    *unwritten = false;
                }
            }
            Err(Error::NoSpace) if self.extents && self.alloc.budget.is_some() => {
                self.resync(start, start + len, true);
            }
            Err(error) => panic!("mark_written({start}, {len}): {error}"),
        }
    }

    /// After an operation failed part way: nothing outside [start, end)
    /// changed; inside, blocks were only unmapped (punch) or only changed
    /// state (conversion). Then take the mapping as the new model.
    fn resync(&mut self, start: u64, end: u64, conversion: bool) {
        let walk = check_invariants(&self.image, &self.alloc, INO, &self.inode);
        for (lblk, &(physical, unwritten)) in &self.model {
            let now = walk.data.get(lblk);
            if *lblk < start || *lblk >= end {
                assert_eq!(
                    now,
                    Some(&(physical, unwritten)),
                    "block {lblk} outside the range"
                );
            } else if conversion {
                assert_eq!(now.map(|n| n.0), Some(physical), "block {lblk} moved");
            } else {
                assert!(
                    now.is_none_or(|n| *n == (physical, unwritten)),
                    "block {lblk} changed"
                );
            }
        }
        assert!(walk.data.keys().all(|lblk| self.model.contains_key(lblk)));
        self.model = walk.data;
    }

    fn check(&self, op: &Op) {
        let walk = check_invariants(&self.image, &self.alloc, INO, &self.inode);
        assert_eq!(walk.data, self.model, "mapping after {op:?}");
        let mut points = vec![0, 1, self.max - 1, self.max];
        let (at, len) = match *op {
            Op::Allocate { at, len, .. } => (at, len as u64),
            Op::Punch { at, len } => (at, len.unwrap_or(1)),
            Op::MarkWritten { at, len } => (at, len),
        };
        let start = self.resolve(at);
        points.extend([
            start.saturating_sub(1),
            start,
            start + 1,
            start + len - 1,
            start + len,
        ]);
        let step = (self.model.len() / 24).max(1);
        for &lblk in self.model.keys().step_by(step) {
            points.extend([lblk.saturating_sub(1), lblk, lblk + 1]);
        }
        if self.extents {
            points.push(1 << 32);
        }
        for lblk in points {
            self.check_lookup(lblk);
        }
    }

    fn check_lookup(&self, lblk: u64) {
        let found =
            mapping::lookup(&self.image.geo, &self.image.cache, INO, &self.inode, lblk).unwrap();
        match found {
            Lookup::Mapped(extent) => {
                assert_eq!(extent.logical, lblk);
                assert!(extent.len >= 1);
                for i in 0..extent.len as u64 {
                    assert_eq!(
                        self.model.get(&(lblk + i)),
                        Some(&(extent.physical + i, extent.unwritten)),
                        "lookup({lblk}) = {extent:?} at +{i}"
                    );
                }
            }
            Lookup::Hole { next } => {
                assert!(!self.model.contains_key(&lblk), "lookup({lblk}) says hole");
                let expected = self.model.range(lblk + 1..).next().map(|(k, _)| *k);
                assert_eq!(next, expected, "next mapped after hole at {lblk}");
            }
        }
    }

    fn finish(mut self) {
        // Truncating to zero frees everything, tree blocks included.
        self.punch(0, None);
        let walk = check_invariants(&self.image, &self.alloc, INO, &self.inode);
        assert!(walk.data.is_empty() && walk.meta.is_empty());
        assert_eq!(self.inode.blocks, 0);
        assert!(self.alloc.held.is_empty());
        if self.extents {
            assert_eq!(jext4::engine::format::extent::depth(&self.inode), 0);
        } else {
            assert!(self.inode.block.iter().all(|&b| b == 0));
        }
        self.image.close();
    }
}

fn run_model(variant: Variant, setup: Setup, ops: Vec<Op>) {
    let mut harness = Harness::new(variant, &setup);
    for op in &ops {
        harness.run(op);
        harness.check(op);
    }
    harness.finish();
}

/// 40 cases per scheme and block size by default; PROPTEST_CASES=n runs
/// longer searches.
fn config() -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(40);
    ProptestConfig {
        cases,
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn extent_tree_1k_matches_model(setup in setup(), ops in prop::collection::vec(op(), 1..60)) {
        if common::require_tool("mke2fs") { run_model(EXT4_1K, setup, ops); }
    }

    #[test]
    fn extent_tree_4k_matches_model(setup in setup(), ops in prop::collection::vec(op(), 1..60)) {
        if common::require_tool("mke2fs") { run_model(EXT4_4K, setup, ops); }
    }

    #[test]
    fn block_map_1k_matches_model(setup in setup(), ops in prop::collection::vec(op(), 1..60)) {
        if common::require_tool("mke2fs") { run_model(EXT3_1K, setup, ops); }
    }

    #[test]
    fn block_map_4k_matches_model(setup in setup(), ops in prop::collection::vec(op(), 1..60)) {
        if common::require_tool("mke2fs") { run_model(EXT3_4K, setup, ops); }
    }
}
