//! Targeted mapping scenarios: extent trees of depth 2 and 3, multi-GiB
//! sparse files in both schemes, extents at their length limits,
//! unwritten conversion, and corrupt structures that must give errors,
//! never panics or endless walks.

mod common;
mod mapping_support;

use jext4::Error;
use jext4::engine::format::extent;
use jext4::engine::format::inode::Inode;
use jext4::engine::format::mapping::{self, Extent, Lookup};
use mapping_support::{Image, TestAllocator, Walk, check_invariants, image_bytes, with_ctx};
use proptest::prelude::*;

const INO: u32 = 12;

fn ext4_1k() -> Image {
    Image::memory(image_bytes(
        "trees-ext4-1k",
        64,
        &["-t", "ext4", "-b", "1024"],
    ))
}

fn ext4_4k() -> Image {
    Image::memory(image_bytes(
        "trees-ext4-4k",
        64,
        &["-t", "ext4", "-b", "4096"],
    ))
}

/// Small images for the many cases of the garbage tests.
fn small(extents: bool) -> Image {
    if extents {
        Image::memory(image_bytes(
            "trees-small-ext4",
            8,
            &["-t", "ext4", "-b", "1024"],
        ))
    } else {
        Image::memory(image_bytes(
            "trees-small-ext3",
            16,
            &["-t", "ext3", "-b", "1024"],
        ))
    }
}

fn ext3_1k() -> Image {
    Image::memory(image_bytes(
        "trees-ext3-1k",
        32,
        &["-t", "ext3", "-b", "1024"],
    ))
}

fn ext3_4k() -> Image {
    Image::memory(image_bytes(
        "trees-ext3-4k",
        64,
        &["-t", "ext3", "-b", "4096"],
    ))
}

fn lookup(image: &Image, inode: &Inode, lblk: u64) -> Lookup {
    mapping::lookup(&image.geo, &image.cache, INO, inode, lblk).unwrap()
}

fn allocate(
    image: &Image,
    alloc: &mut TestAllocator,
    inode: &mut Inode,
    lblk: u64,
    len: u32,
    unwritten: bool,
) -> Extent {
    allocate_near(image, alloc, inode, lblk, len, 0, unwritten)
}

fn allocate_near(
    image: &Image,
    alloc: &mut TestAllocator,
    inode: &mut Inode,
    lblk: u64,
    len: u32,
    goal: u64,
    unwritten: bool,
) -> Extent {
    with_ctx(image, alloc, |ctx| {
        mapping::allocate(ctx, INO, inode, lblk, len, goal, unwritten)
    })
    .unwrap()
}

/// Allocate [lblk, lblk + len) the way a caller does: loop until covered.
fn allocate_all(
    image: &Image,
    alloc: &mut TestAllocator,
    inode: &mut Inode,
    lblk: u64,
    len: u64,
    goal: u64,
    unwritten: bool,
) -> Vec<Extent> {
    let mut done = Vec::new();
    let mut cursor = lblk;
    while cursor < lblk + len {
        let want = (lblk + len - cursor).min(u32::MAX as u64) as u32;
        let extent = allocate_near(image, alloc, inode, cursor, want, goal, unwritten);
        cursor = extent.end();
        done.push(extent);
    }
    done
}

fn punch(
    image: &Image,
    alloc: &mut TestAllocator,
    inode: &mut Inode,
    start: u64,
    end: Option<u64>,
) {
    with_ctx(image, alloc, |ctx| {
        mapping::punch(ctx, INO, inode, start, end)
    })
    .unwrap();
}

fn truncate_to_zero(image: &Image, alloc: &mut TestAllocator, inode: &mut Inode) {
    punch(image, alloc, inode, 0, None);
    let walk = check_invariants(image, alloc, INO, inode);
    assert_eq!(walk.blocks(), 0);
    assert_eq!(inode.blocks, 0);
    assert!(alloc.held.is_empty(), "{} blocks leaked", alloc.held.len());
}

/// One-block extents at every other logical block until the tree reaches
/// `depth`; every lookup answers right; then punch a middle range and
/// truncate.
fn grow_to_depth(image: Image, depth: u16) {
    let mut alloc = TestAllocator::new(&image);
    let mut inode = image.new_file(true, 0x5EED);
    let mut count = 0u64;
    while extent::depth(&inode) < depth {
        let got = allocate(
            &image,
            &mut alloc,
            &mut inode,
            2 * count,
            1,
            count.is_multiple_of(3),
        );
        assert_eq!(got.len, 1);
        count += 1;
    }
    // A few more so the deepest level has more than one node.
    for _ in 0..200 {
        allocate(&image, &mut alloc, &mut inode, 2 * count, 1, false);
        count += 1;
    }
    let walk = check_invariants(&image, &alloc, INO, &inode);
    assert_eq!(walk.runs.len() as u64, count, "no two extents may merge");
    // Every block of a small tree; a sample of a big one (debug builds).
    for i in (0..count).step_by(1 + count as usize / 4000) {
        match lookup(&image, &inode, 2 * i) {
            Lookup::Mapped(found) => {
                assert_eq!(found.len, 1);
                assert_eq!(found.unwritten, i % 3 == 0 && i < count - 200);
                assert_eq!(walk.data[&(2 * i)].0, found.physical);
            }
            hole => panic!("block {} unmapped: {hole:?}", 2 * i),
        }
        let next = (i + 1 < count).then_some(2 * i + 2);
        assert_eq!(lookup(&image, &inode, 2 * i + 1), Lookup::Hole { next });
    }
    // Punch the middle third (splitting trimmed edges) and check again.
    let (from, to) = (2 * count / 3 + 1, 4 * count / 3);
    punch(&image, &mut alloc, &mut inode, from, Some(to));
    let after = check_invariants(&image, &alloc, INO, &inode);
    let expected: Vec<_> = walk
        .data
        .iter()
        .filter(|(lblk, _)| **lblk < from || **lblk >= to)
        .map(|(lblk, value)| (*lblk, *value))
        .collect();
    assert_eq!(after.data.into_iter().collect::<Vec<_>>(), expected);
    assert!(extent::depth(&inode) >= depth - 1);
    truncate_to_zero(&image, &mut alloc, &mut inode);
    assert_eq!(extent::depth(&inode), 0);
    image.close();
}

#[test]
fn extent_tree_depth_two_at_4k() {
    if common::require_tool("mke2fs") {
        grow_to_depth(ext4_4k(), 2);
    }
}

#[test]
fn extent_tree_depth_three_at_1k() {
    if common::require_tool("mke2fs") {
        grow_to_depth(ext4_1k(), 3);
    }
}

/// Data at 0, at 3 GiB and at the last addressable block; lookups jump
/// over the holes; truncate frees everything.
fn sparse_file(image: Image, extents: bool) {
    let mut alloc = TestAllocator::new(&image);
    let mut inode = image.new_file(extents, 7);
    let max = mapping::max_blocks(&image.geo, &inode);
    let at_3gib = (3u64 << 30) / image.geo.block_size as u64;
    assert!(at_3gib < max);
    for lblk in [0, at_3gib, max - 1] {
        let got = allocate(&image, &mut alloc, &mut inode, lblk, 4, false);
        assert_eq!(got.logical, lblk);
        assert_eq!(got.len, if lblk == max - 1 { 1 } else { 4 });
    }
    assert!(matches!(
        with_ctx(&image, &mut alloc, |ctx| mapping::allocate(
            ctx, INO, &mut inode, max, 1, 0, false
        )),
        Err(Error::FileTooBig)
    ));
    assert_eq!(
        lookup(&image, &inode, 4),
        Lookup::Hole {
            next: Some(at_3gib)
        }
    );
    assert_eq!(
        lookup(&image, &inode, at_3gib + 4),
        Lookup::Hole {
            next: Some(max - 1)
        }
    );
    assert_eq!(lookup(&image, &inode, max), Lookup::Hole { next: None });
    assert!(matches!(lookup(&image, &inode, at_3gib + 3), Lookup::Mapped(e) if e.len == 1));
    let walk = check_invariants(&image, &alloc, INO, &inode);
    assert_eq!(walk.data.len(), 9);
    if !extents {
        // IND is unused; 0 is direct, 3 GiB and the end sit under TIND
        // (4 KiB: 3 GiB is in DIND) — each needs its chain.
        assert!(walk.meta.len() >= 4, "{:?}", walk.meta);
    }
    // Punching the holes between changes nothing.
    punch(&image, &mut alloc, &mut inode, 4, Some(at_3gib));
    punch(&image, &mut alloc, &mut inode, at_3gib + 4, Some(max - 1));
    assert_eq!(
        check_invariants(&image, &alloc, INO, &inode).data,
        walk.data
    );
    truncate_to_zero(&image, &mut alloc, &mut inode);
    image.close();
}

#[test]
fn sparse_multi_gib_extent_file() {
    if common::require_tool("mke2fs") {
        sparse_file(ext4_1k(), true);
        sparse_file(ext4_4k(), true);
    }
}

#[test]
fn sparse_multi_gib_block_map_file() {
    if common::require_tool("mke2fs") {
        sparse_file(ext3_1k(), false);
        sparse_file(ext3_4k(), false);
    }
}

#[test]
fn block_map_chains_are_created_and_freed() {
    if !common::require_tool("mke2fs") {
        return;
    }
    let image = ext3_1k();
    let mut alloc = TestAllocator::new(&image);
    let mut inode = image.new_file(false, 1);
    let per = 256;
    let tind_first = 12 + per + per * per;
    // One block under TIND needs three indirect blocks.
    allocate(&image, &mut alloc, &mut inode, tind_first + 5, 1, false);
    assert_eq!(check_invariants(&image, &alloc, INO, &inode).meta.len(), 3);
    // A sequential fill lays the indirect block right before its data.
    let runs = allocate_all(&image, &mut alloc, &mut inode, 0, 12 + per - 2, 0, false);
    assert!(runs.len() >= 2);
    let ind = u32::from_le_bytes(inode.block[48..52].try_into().unwrap()) as u64;
    let walk = check_invariants(&image, &alloc, INO, &inode);
    assert_eq!(walk.meta.len(), 4);
    assert_eq!(
        walk.data[&11].0 + 2,
        walk.data[&12].0,
        "IND sits between blocks 11 and 12"
    );
    assert_eq!(ind, walk.data[&11].0 + 1);
    // An allocation never crosses the end of a leaf indirect block.
    let got = allocate(&image, &mut alloc, &mut inode, 12 + per - 2, 10, false);
    assert_eq!(got.len, 2);
    assert_eq!(check_invariants(&image, &alloc, INO, &inode).meta.len(), 4);
    // Punching the TIND block frees its whole chain.
    punch(
        &image,
        &mut alloc,
        &mut inode,
        tind_first,
        Some(tind_first + per * per),
    );
    assert_eq!(check_invariants(&image, &alloc, INO, &inode).meta.len(), 1);
    assert_eq!(&inode.block[56..60], &[0; 4]);
    truncate_to_zero(&image, &mut alloc, &mut inode);
    image.close();
}

fn runs(walk: &Walk) -> Vec<(u64, u32, bool)> {
    walk.runs
        .iter()
        .map(|r| (r.logical, r.len, r.unwritten))
        .collect()
}

#[test]
fn unwritten_extents_split_and_merge_back() {
    if !common::require_tool("mke2fs") {
        return;
    }
    let image = ext4_4k();
    let mut alloc = TestAllocator::new(&image);
    let mut inode = image.new_file(true, 3);
    let got = allocate(&image, &mut alloc, &mut inode, 0, 100, true);
    assert_eq!(got.len, 100);
    let mark = |alloc: &mut TestAllocator, inode: &mut Inode, lblk, len| {
        with_ctx(&image, alloc, |ctx| {
            mapping::mark_written(ctx, INO, inode, lblk, len)
        })
        .unwrap();
        check_invariants(&image, alloc, INO, inode)
    };
    let walk = mark(&mut alloc, &mut inode, 40, 10);
    assert_eq!(
        runs(&walk),
        vec![(0, 40, true), (40, 10, false), (50, 50, true)]
    );
    let walk = mark(&mut alloc, &mut inode, 50, 50);
    assert_eq!(runs(&walk), vec![(0, 40, true), (40, 60, false)]);
    let walk = mark(&mut alloc, &mut inode, 0, 40);
    assert_eq!(runs(&walk), vec![(0, 100, false)]);
    assert_eq!(walk.data[&0].0, got.physical);
    // Marking written blocks and holes again changes nothing.
    let walk = mark(&mut alloc, &mut inode, 0, 1000);
    assert_eq!(runs(&walk), vec![(0, 100, false)]);
    // A written neighbour on the left absorbs a converted piece.
    allocate(&image, &mut alloc, &mut inode, 100, 20, true);
    let walk = mark(&mut alloc, &mut inode, 100, 5);
    assert_eq!(runs(&walk), vec![(0, 105, false), (105, 15, true)]);
    truncate_to_zero(&image, &mut alloc, &mut inode);
    image.close();
}

#[test]
fn extents_stop_at_their_length_limits() {
    if !common::require_tool("mke2fs") {
        return;
    }
    // 1 GiB of 4 KiB blocks, sparse on disk. With flex_bg, backups only in
    // groups 1 and 7 (sparse_super2) and no journal in the middle, groups
    // 2..=6 are entirely free: physically contiguous runs far longer than
    // one extent.
    let dir = tempfile::tempdir().unwrap();
    let args = [
        "-t",
        "ext4",
        "-b",
        "4096",
        "-O",
        "sparse_super2,^has_journal",
    ];
    let path = common::mkfs(dir.path(), "long", 1024, &args);
    let image = Image::file(&path);
    let mut alloc = TestAllocator::new(&image);
    let mut inode = image.new_file(true, 9);
    let goal = image.geo.group_first_block(2);
    let written = allocate_all(&image, &mut alloc, &mut inode, 0, 70_000, goal, false);
    let lens: Vec<u32> = written.iter().map(|e| e.len).collect();
    assert_eq!(lens, vec![32768, 32768, 70_000 - 65536]);
    assert_eq!(
        written[1].physical,
        written[0].physical + 32768,
        "contiguous yet separate"
    );
    let unwritten = allocate_all(&image, &mut alloc, &mut inode, 100_000, 70_000, goal, true);
    let lens: Vec<u32> = unwritten.iter().map(|e| e.len).collect();
    assert_eq!(lens, vec![32767, 32767, 70_000 - 2 * 32767]);
    let walk = check_invariants(&image, &alloc, INO, &inode);
    assert_eq!(walk.runs.len(), 6, "{:?}", runs(&walk));
    with_ctx(&image, &mut alloc, |ctx| {
        mapping::mark_written(ctx, INO, &mut inode, 100_000, 70_000)
    })
    .unwrap();
    let walk = check_invariants(&image, &alloc, INO, &inode);
    assert!(walk.runs.iter().all(|r| !r.unwritten && r.len <= 32768));
    assert_eq!(walk.data.len(), 140_000);
    truncate_to_zero(&image, &mut alloc, &mut inode);
    image.close();
}

#[test]
fn corrupt_extent_block_is_reported() {
    if !common::require_tool("mke2fs") {
        return;
    }
    let image = ext4_1k();
    let mut alloc = TestAllocator::new(&image);
    let mut inode = image.new_file(true, 11);
    for i in 0..10 {
        allocate(&image, &mut alloc, &mut inode, 2 * i, 1, false);
    }
    let walk = check_invariants(&image, &alloc, INO, &inode);
    let [leaf] = walk.meta[..] else {
        panic!("expected one leaf block: {:?}", walk.meta);
    };
    image.close();
    // Through a fresh cache (nothing verified yet) the tree reads back.
    let reopened = Image::open(image.dev.clone());
    assert!(matches!(lookup(&reopened, &inode, 2), Lookup::Mapped(_)));
    // A wrong generation gives a different checksum seed: refused.
    let mut other = inode.clone();
    other.generation ^= 1;
    let reopened = Image::open(image.dev.clone());
    let error = mapping::lookup(&reopened.geo, &reopened.cache, INO, &other, 0).unwrap_err();
    assert!(error.is_corruption(), "{error}");
    // Flip a bit of an extent's length in the leaf, behind the cache: a
    // fresh cache refuses the block.
    let bs = image.geo.block_size as u64;
    let mut bytes = vec![0u8; bs as usize];
    image.dev.read_at(leaf * bs, &mut bytes).unwrap();
    bytes[12 + 12 + 4] ^= 0x02;
    image.dev.write_at(leaf * bs, &bytes).unwrap();
    let reopened = Image::open(image.dev.clone());
    let error = mapping::lookup(&reopened.geo, &reopened.cache, INO, &inode, 2).unwrap_err();
    assert!(error.is_corruption(), "{error}");
    assert!(error.to_string().contains("checksum"), "{error}");
    reopened.close();
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    /// Garbage in the extent root and in the block it points at: every
    /// operation answers Ok or Corrupt, and never panics or hangs.
    #[test]
    fn garbage_extent_trees_never_panic(
        root in prop::collection::vec(any::<u8>(), 60),
        block in prop::collection::vec(any::<u8>(), 1024),
        depth in 0u16..3,
        entries in 0u16..5,
        lblk in 0u64..100,
    ) {
        if !common::require_tool("mke2fs") { return Ok(()); }
        let image = small(true);
        let mut alloc = TestAllocator::new(&image);
        alloc.lenient = true;
        let mut inode = image.new_file(true, 0);
        inode.block.copy_from_slice(&root);
        // Often well-formed headers, so the walk goes past the first check.
        inode.block[..8].copy_from_slice(&[0x0A, 0xF3, entries as u8, 0, 4, 0, depth as u8, 0]);
        let target = 5000u64;
        inode.block[16..20].copy_from_slice(&(target as u32).to_le_bytes());
        inode.block[20..22].copy_from_slice(&[0, 0]);
        let mut bytes = block.clone();
        bytes[..8].copy_from_slice(&[0x0A, 0xF3, entries as u8 * 20, 0, 84, 0, depth.saturating_sub(1) as u8, 0]);
        image.dev.write_at(target * 1024, &bytes).unwrap();
        inode.blocks = 1 << 20;
        let _ = mapping::lookup(&image.geo, &image.cache, INO, &inode, lblk);
        let _ = mapping::for_each_block(&image.geo, &image.cache, INO, &inode, &mut |_| Ok(()));
        let mut copy = inode.clone();
        let _ = with_ctx(&image, &mut alloc, |ctx| mapping::punch(ctx, INO, &mut copy, lblk, Some(lblk + 50)));
        let mut copy = inode.clone();
        let _ = with_ctx(&image, &mut alloc, |ctx| mapping::mark_written(ctx, INO, &mut copy, 0, 1000));
        let mut copy = inode.clone();
        let _ = with_ctx(&image, &mut alloc, |ctx| mapping::allocate(ctx, INO, &mut copy, lblk, 3, 0, false));
        image.close();
    }

}

proptest! {
    // Each case may walk tens of thousands of garbage indirect blocks.
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Garbage block-map pointers and indirect blocks: same promise.
    #[test]
    fn garbage_block_maps_never_panic(
        root in prop::collection::vec(0u32..12000, 15),
        block in prop::collection::vec(0u32..12000, 256),
        lblk in prop::sample::select(vec![0u64, 5, 12, 100, 268, 300, 65804, 70000]),
    ) {
        if !common::require_tool("mke2fs") { return Ok(()); }
        let image = small(false);
        let mut alloc = TestAllocator::new(&image);
        alloc.lenient = true;
        let mut inode = image.new_file(false, 0);
        for (slot, pointer) in root.iter().enumerate() {
            let pointer = if slot >= 12 { 9000 + slot as u32 } else { *pointer };
            inode.block[slot * 4..slot * 4 + 4].copy_from_slice(&pointer.to_le_bytes());
        }
        let bytes: Vec<u8> = block.iter().flat_map(|p| p.to_le_bytes()).collect();
        for indirect in [9012u64, 9013, 9014] {
            image.dev.write_at(indirect * 1024, &bytes).unwrap();
        }
        let _ = mapping::lookup(&image.geo, &image.cache, INO, &inode, lblk);
        let _ = mapping::for_each_block(&image.geo, &image.cache, INO, &inode, &mut |_| Ok(()));
        let mut copy = inode.clone();
        let _ = with_ctx(&image, &mut alloc, |ctx| mapping::punch(ctx, INO, &mut copy, lblk, None));
        let mut copy = inode.clone();
        let _ = with_ctx(&image, &mut alloc, |ctx| mapping::allocate(ctx, INO, &mut copy, lblk, 3, 0, false));
        image.close();
    }
}

#[test]
fn tree_loses_levels_it_no_longer_needs() {
    if !common::require_tool("mke2fs") {
        return;
    }
    let image = ext4_1k();
    let mut alloc = TestAllocator::new(&image);
    let mut inode = image.new_file(true, 21);
    let mut count = 0;
    while extent::depth(&inode) < 2 {
        allocate(&image, &mut alloc, &mut inode, 2 * count, 1, false);
        count += 1;
    }
    // Leave five extents: they no longer fit the root, one leaf remains.
    punch(&image, &mut alloc, &mut inode, 10, None);
    let walk = check_invariants(&image, &alloc, INO, &inode);
    assert_eq!(
        (extent::depth(&inode), walk.runs.len(), walk.meta.len()),
        (1, 5, 1)
    );
    // Four fit the root again: the tree is a bare root.
    punch(&image, &mut alloc, &mut inode, 8, Some(9));
    let walk = check_invariants(&image, &alloc, INO, &inode);
    assert_eq!(
        (extent::depth(&inode), walk.runs.len(), walk.meta.len()),
        (0, 4, 0)
    );
    truncate_to_zero(&image, &mut alloc, &mut inode);
    image.close();
}
