//! Directories written by our code in memory, checked against a model: a
//! map of name → inode. Large workloads grow htrees to two and three levels
//! with deletes and renames-over mixed in; after them every name is looked
//! up, readdir must list exactly the model, and `dir::check` walks the whole
//! structure (limits, counts, order, hash ranges of leaves, checksums
//! recomputed). Smaller tests cover readdir cookies while the directory
//! changes, legacy-hash collisions (continuation bits), the index-full
//! limit, and corrupt blocks.

mod dir_common;

use dir_common::{MemEnv, Rng, TestDir, assert_listing, geometry_for, list_in_chunks, random_name};
use jext4::Error;
use jext4::engine::format::Geometry;
use jext4::engine::format::dir::{self, DirStats, FT_REG_FILE};
use jext4::engine::format::htree::hash_version;
use std::collections::{BTreeMap, HashMap, HashSet};

const DIR_INO: u32 = 12;
const PARENT_INO: u32 = 2;

struct Workload {
    ops: u64,
    name_len: (usize, usize),
    remove_one_in: u64,
    seed: u64,
}

struct Run {
    env: MemEnv,
    dir: TestDir,
    model: BTreeMap<Vec<u8>, u32>,
}

fn new_dir(geo: &Geometry, device_blocks: u64) -> (MemEnv, TestDir) {
    let env = MemEnv::new(geo, device_blocks);
    let mut d = env.dir(geo, DIR_INO, 0x1234_5678, device_blocks);
    let handle = env.journal.start(4).unwrap();
    dir::init_dir(&mut d, &handle, DIR_INO, PARENT_INO).unwrap();
    handle.stop().unwrap();
    (env, d)
}

fn random_ino(geo: &Geometry, rng: &mut Rng) -> u32 {
    11 + rng.below(geo.inodes_count as u64 - 11) as u32
}

/// Run `work` against a fresh directory, checking every removal and
/// replacement against the model and sampling lookups as it goes.
fn run_workload(geo: &Geometry, device_blocks: u64, work: &Workload) -> Run {
    let (env, mut d) = new_dir(geo, device_blocks);
    let mut rng = Rng::new(work.seed);
    let mut model = BTreeMap::new();
    let mut live: Vec<Vec<u8>> = Vec::new();
    let mut gone: Vec<Vec<u8>> = Vec::new();
    for op in 0..work.ops {
        let handle = env.journal.start(16).unwrap();
        let choice = rng.below(work.remove_one_in);
        if choice == 0 && !live.is_empty() {
            let name = live.swap_remove(rng.below(live.len() as u64) as usize);
            let removed = dir::remove_entry(&mut d, &handle, &name).unwrap();
            assert_eq!(Some(removed.ino), model.remove(&name));
            gone.push(name);
        } else if choice == 1 && !live.is_empty() {
            let name = &live[rng.below(live.len() as u64) as usize];
            let ino = random_ino(geo, &mut rng);
            let old = dir::replace_entry(&mut d, &handle, name, ino, FT_REG_FILE).unwrap();
            assert_eq!(Some(old.ino), model.insert(name.clone(), ino));
        } else {
            let len = work.name_len.0
                + rng.below((work.name_len.1 - work.name_len.0 + 1) as u64) as usize;
            let name = random_name(&mut rng, len, op);
            let ino = random_ino(geo, &mut rng);
            let blocks_before = d.map.len();
            // The space budget's estimate (the test directory's blocks
            // need no mapping blocks): never below what the insert takes.
            let estimate = dir::add_entry_cost(&mut d, &name).unwrap();
            dir::add_entry(&mut d, &handle, &name, ino, FT_REG_FILE).unwrap();
            let appended = (d.map.len() - blocks_before) as u32;
            assert!(
                appended as u64 <= estimate,
                "{appended} new blocks, {estimate} estimated"
            );
            assert!(
                estimate <= dir::add_entry_max_new_blocks(geo) as u64,
                "{estimate} estimated"
            );
            assert!(model.insert(name.clone(), ino).is_none());
            live.push(name);
        }
        handle.stop().unwrap();
        if op % 613 == 0 && !live.is_empty() {
            let name = &live[rng.below(live.len() as u64) as usize];
            assert_eq!(
                dir::lookup(&mut d, name).unwrap().map(|l| l.ino),
                model.get(name).copied()
            );
            if let Some(name) = gone.last() {
                assert!(dir::lookup(&mut d, name).unwrap().is_none());
            }
        }
    }
    Run { env, dir: d, model }
}

/// Every model name found with its inode, removed names absent, listing =
/// model, structure sound; returns what `check` saw.
fn verify(run: &mut Run) -> DirStats {
    let d = &mut run.dir;
    for (name, ino) in &run.model {
        let found = dir::lookup(d, name).unwrap();
        assert_eq!(
            found.map(|l| l.ino),
            Some(*ino),
            "{:?}",
            String::from_utf8_lossy(name)
        );
    }
    for absent in [b"never-added".as_slice(), b"c0ffee", &[0xff; 255]] {
        assert!(dir::lookup(d, absent).unwrap().is_none());
    }
    assert_listing(d, &run.model, PARENT_INO);
    let stats = dir::check(d).unwrap();
    assert_eq!(stats.entries, run.model.len() as u64 + 2);
    assert_eq!(stats.blocks, d.map.len() as u64);
    assert_eq!(dir::is_empty(d).unwrap(), run.model.is_empty());
    assert_eq!(dir::parent(d).unwrap(), PARENT_INO);
    eprintln!("{stats:?}");
    stats
}

#[test]
fn htree_grows_to_three_levels_with_large_dir() {
    let geo = geometry_for(&["-t", "ext4", "-b", "1024", "-O", "large_dir"], 64);
    assert!(geo.metadata_csum);
    let work = Workload {
        ops: 100_000,
        name_len: (190, 255),
        remove_one_in: 6,
        seed: 1,
    };
    let mut run = run_workload(&geo, 120_000, &work);
    let stats = verify(&mut run);
    assert!(run.dir.indexed);
    assert_eq!(stats.levels, 3, "{stats:?}");
}

#[test]
fn htree_two_levels_short_names() {
    let geo = geometry_for(&["-t", "ext4", "-b", "1024"], 64);
    let work = Workload {
        ops: 100_000,
        name_len: (8, 40),
        remove_one_in: 5,
        seed: 2,
    };
    let mut run = run_workload(&geo, 40_000, &work);
    let stats = verify(&mut run);
    assert_eq!(stats.levels, 2, "{stats:?}");
}

#[test]
fn htree_without_filetype_or_checksums() {
    let geo = geometry_for(&["-t", "ext2", "-b", "4096", "-O", "^filetype"], 64);
    assert!(!geo.metadata_csum);
    let work = Workload {
        ops: 30_000,
        name_len: (1, 255),
        remove_one_in: 4,
        seed: 3,
    };
    let mut run = run_workload(&geo, 20_000, &work);
    let stats = verify(&mut run);
    assert!(stats.levels >= 1 && run.dir.indexed);
    // Without the filetype feature every entry reads back as unknown.
    let listed = dir_common::list_all(&mut run.dir);
    assert!(listed.iter().all(|(e, _)| e.file_type == 0));
}

/// 64 KiB blocks: a whole-block rec_len does not fit 16 bits (encoded as
/// 65535), which empty leaves and index nodes need.
#[test]
fn htree_with_64k_blocks() {
    let geo = geometry_for(&["-t", "ext2", "-b", "65536"], 64);
    let work = Workload {
        ops: 12_000,
        name_len: (60, 255),
        remove_one_in: 6,
        seed: 11,
    };
    let mut run = run_workload(&geo, 256, &work);
    let stats = verify(&mut run);
    assert!(run.dir.indexed && stats.leaves > 4, "{stats:?}");
}

#[test]
fn linear_directory_without_dir_index() {
    let geo = geometry_for(&["-t", "ext4", "-b", "1024", "-O", "^dir_index"], 64);
    let work = Workload {
        ops: 6_000,
        name_len: (4, 64),
        remove_one_in: 4,
        seed: 4,
    };
    let mut run = run_workload(&geo, 20_000, &work);
    let stats = verify(&mut run);
    assert!(
        !run.dir.indexed && stats.levels == 0 && stats.blocks > 10,
        "{stats:?}"
    );
}

#[test]
fn unsigned_tea_hash() {
    // What tune2fs -E hash_alg=tea and an unsigned-char creator would set.
    let mut geo = geometry_for(&["-t", "ext4", "-b", "1024"], 64);
    geo.def_hash_version = hash_version::TEA;
    geo.hash_unsigned = true;
    let work = Workload {
        ops: 20_000,
        name_len: (10, 60),
        remove_one_in: 5,
        seed: 5,
    };
    let mut run = run_workload(&geo, 20_000, &work);
    verify(&mut run);
}

/// Legacy-hash collisions: a directory of colliding pairs gets leaf splits
/// inside runs of equal hashes, so lookups must follow continuation bits.
#[test]
fn colliding_names_follow_continuation_bits() {
    let mut geo = geometry_for(&["-t", "ext4", "-b", "1024"], 64);
    geo.def_hash_version = hash_version::LEGACY;
    let version = if geo.hash_unsigned {
        hash_version::LEGACY_UNSIGNED
    } else {
        hash_version::LEGACY
    };
    let pairs = dir_common::colliding_pairs(version, &geo.hash_seed, 600);
    let (env, mut d) = new_dir(&geo, 10_000);
    let mut model = BTreeMap::new();
    let mut rng = Rng::new(6);
    for (a, b) in &pairs {
        let handle = env.journal.start(16).unwrap();
        for name in [a, b] {
            let ino = random_ino(&geo, &mut rng);
            dir::add_entry(&mut d, &handle, name, ino, FT_REG_FILE).unwrap();
            model.insert(name.clone(), ino);
        }
        handle.stop().unwrap();
    }
    let continued = dir_common::continuation_entries(&mut d);
    eprintln!("{continued} index entries with the continuation bit");
    assert!(continued > 0, "no split fell inside a collision run");
    let mut run = Run { env, dir: d, model };
    verify(&mut run);
    // Remove one of each pair; the other must stay reachable.
    let handle = run.env.journal.start(16).unwrap();
    for (a, _) in &pairs {
        dir::remove_entry(&mut run.dir, &handle, a).unwrap();
        run.model.remove(a);
    }
    handle.stop().unwrap();
    verify(&mut run);
}

/// Without large_dir the index stops at two levels: adding beyond that is
/// ENOSPC, and the directory stays whole.
#[test]
fn full_index_is_no_space_and_leaves_directory_intact() {
    let geo = geometry_for(&["-t", "ext4", "-b", "1024"], 64);
    let (env, mut d) = new_dir(&geo, 80_000);
    let mut model = BTreeMap::new();
    let mut rng = Rng::new(7);
    let mut refused = None;
    for tag in 0..80_000u64 {
        let name = random_name(&mut rng, 255, tag);
        let handle = env.journal.start(16).unwrap();
        let blocks_before = d.map.len();
        match dir::add_entry(&mut d, &handle, &name, 20, FT_REG_FILE) {
            Ok(()) => {
                model.insert(name, 20);
            }
            Err(Error::NoSpace) => {
                assert_eq!(
                    d.map.len(),
                    blocks_before,
                    "a refused add grew the directory"
                );
                refused = Some(tag);
                handle.stop().unwrap();
                break;
            }
            Err(other) => panic!("{other}"),
        }
        handle.stop().unwrap();
    }
    assert!(refused.is_some(), "two-level index never filled");
    let mut run = Run { env, dir: d, model };
    let stats = verify(&mut run);
    assert_eq!(stats.levels, 2);
}

/// Names present from the first readdir call to the last come exactly once,
/// though the directory gains and loses names (and splits leaves) between
/// calls; no name comes twice.
/// The directory changes between the first `rounds` calls only, so the
/// listing ends.
fn assert_stable_listing(
    geo: &Geometry,
    initial: u64,
    chunk: usize,
    rounds: usize,
    added: u64,
    removed: usize,
) {
    let (env, mut d) = new_dir(geo, 60_000);
    let mut rng = Rng::new(8);
    let mut volatile = Vec::new();
    let mut stable = HashSet::new();
    let handle = env.journal.start(16).unwrap();
    for tag in 0..initial {
        let len = 8 + rng.below(40) as usize;
        let name = random_name(&mut rng, len, tag);
        dir::add_entry(&mut d, &handle, &name, 20, FT_REG_FILE).unwrap();
        if tag % 4 == 0 {
            volatile.push(name);
        } else {
            stable.insert(name);
        }
    }
    handle.stop().unwrap();
    let journal = env.journal.clone();
    let mut next_tag = initial;
    let mut round = 0;
    let listed = list_in_chunks(&mut d, chunk, |d| {
        round += 1;
        if round > rounds {
            return;
        }
        let handle = journal.start(16).unwrap();
        for _ in 0..added {
            let len = 8 + rng.below(40) as usize;
            let name = random_name(&mut rng, len, next_tag);
            next_tag += 1;
            dir::add_entry(d, &handle, &name, 21, FT_REG_FILE).unwrap();
        }
        for _ in 0..removed.min(volatile.len()) {
            let name = volatile.swap_remove(rng.below(volatile.len() as u64) as usize);
            dir::remove_entry(d, &handle, &name).unwrap();
        }
        handle.stop().unwrap();
    });
    let mut counts: HashMap<&[u8], usize> = HashMap::new();
    for entry in &listed {
        *counts.entry(&entry.name).or_default() += 1;
    }
    eprintln!("listed {} names in chunks of {chunk}", listed.len());
    let twice: Vec<_> = counts.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "listed more than once: {}", twice.len());
    let missing = stable
        .iter()
        .filter(|n| !counts.contains_key(n.as_slice()))
        .count();
    assert_eq!(missing, 0, "stable names skipped");
    assert!(counts.contains_key(b".".as_slice()) && counts.contains_key(b"..".as_slice()));
    dir::check(&mut d).unwrap();
}

#[test]
fn cookies_survive_leaf_splits() {
    let geo = geometry_for(&["-t", "ext4", "-b", "1024"], 64);
    assert_stable_listing(&geo, 20_000, 64, 200, 150, 20);
}

#[test]
fn cookies_survive_conversion_to_htree() {
    let geo = geometry_for(&["-t", "ext4", "-b", "1024"], 64);
    // Six names fit one block; the second chunk already sees an htree.
    assert_stable_listing(&geo, 6, 3, 3, 60, 1);
}

#[test]
fn cookies_survive_linear_changes() {
    let geo = geometry_for(&["-t", "ext4", "-b", "1024", "-O", "^dir_index"], 64);
    assert_stable_listing(&geo, 2_000, 50, 30, 30, 5);
}

/// Random byte damage in a directory block: every operation returns (an
/// error or a result), none panics or loops. Without metadata_csum the
/// structure checks are all that stand between damage and a panic.
#[test]
fn corrupt_blocks_never_panic() {
    for args in [
        &["-t", "ext2", "-b", "1024"][..],
        &["-t", "ext4", "-b", "1024", "-O", "large_dir"][..],
    ] {
        let geo = geometry_for(args, 64);
        let work = Workload {
            ops: 3_000,
            name_len: (4, 120),
            remove_one_in: 5,
            seed: 9,
        };
        let run = run_workload(&geo, 8_000, &work);
        run.env.journal.sync().unwrap();
        let image = run.env.dev.snapshot();
        let names: Vec<_> = run.model.keys().take(200).cloned().collect();
        let mut rng = Rng::new(10);
        let mut detected = 0;
        for _ in 0..300 {
            let (env, mut d) = damaged_copy(&geo, &image, &run.dir, &mut rng);
            detected += exercise(&env, &mut d, &names) as usize;
        }
        eprintln!("{args:?}: damage detected in {detected} of 300 copies");
        assert!(
            detected > 10,
            "{args:?}: damage detected only {detected} times"
        );
    }
}

/// A copy of `image` with a few bytes of one of the directory's blocks changed.
fn damaged_copy(
    geo: &Geometry,
    image: &[u8],
    original: &TestDir,
    rng: &mut Rng,
) -> (MemEnv, TestDir) {
    let blocks = (image.len() / geo.block_size as usize) as u64;
    let env = MemEnv::new(geo, blocks);
    let mut bytes = image.to_vec();
    let bs = geo.block_size as usize;
    // Index blocks (block 0 and the nodes) are few but matter most: hit
    // them half of the time.
    let lblk = if rng.below(2) == 0 {
        rng.below(original.map.len().min(4) as u64) as usize
    } else {
        rng.below(original.map.len() as u64) as usize
    };
    let start = original.map[lblk] as usize * bs;
    for _ in 0..1 + rng.below(3) {
        let at = start + rng.below(bs as u64) as usize;
        bytes[at] = match rng.below(3) {
            0 => bytes[at] ^ (1 << rng.below(8)),
            1 => 0,
            _ => rng.next_u64() as u8,
        };
    }
    jext4::engine::dev::BlockDevice::write_at(&*env.dev, 0, &bytes).unwrap();
    let mut d = env.dir(geo, DIR_INO, original.seed, blocks);
    d.map = original.map.clone();
    d.indexed = original.indexed;
    let mut next = blocks - 2000;
    d.alloc = Box::new(move || {
        next += 1;
        Some(next)
    });
    (env, d)
}

/// Run every operation; true if any reported corruption.
fn exercise(env: &MemEnv, d: &mut TestDir, names: &[Vec<u8>]) -> bool {
    let mut corrupt = false;
    let mut note = |result: Result<(), Error>| {
        if let Err(error) = result {
            assert!(
                error.is_corruption()
                    || matches!(error, Error::Exists | Error::NotFound | Error::NoSpace),
                "unexpected error {error}"
            );
            corrupt |= error.is_corruption();
        }
    };
    for name in names.iter().take(50) {
        note(dir::lookup(d, name).map(drop));
    }
    note(dir::read_entries(d, 0, &mut |_, _| true));
    note(dir::check(d).map(drop));
    note(dir::is_empty(d).map(drop));
    note(dir::parent(d).map(drop));
    let handle = env.journal.start(16).unwrap();
    for tag in 0..40u64 {
        note(dir::add_entry(
            d,
            &handle,
            format!("new-{tag}-{}", "x".repeat(tag as usize * 5)).as_bytes(),
            30,
            1,
        ));
    }
    for name in names.iter().skip(50).take(20) {
        note(dir::remove_entry(d, &handle, name).map(drop));
    }
    note(dir::set_parent(d, &handle, 5));
    handle.stop().unwrap();
    corrupt
}

/// Damage to the htree index itself is noticed as corruption of the
/// directory block that holds it (checksums off, so the structure checks
/// alone must catch it), and lookups then read the leaves linearly: every
/// name is found with its inode, or its lookup fails with corruption (a
/// damaged node that no longer looks like one is read as a leaf) — never
/// a silent "not found".
#[test]
fn bad_index_fields_are_noticed_and_lookups_fall_back() {
    use jext4::Location;
    let geo = geometry_for(&["-t", "ext2", "-b", "1024"], 64);
    let work = Workload {
        ops: 30_000,
        name_len: (100, 200),
        remove_one_in: 50,
        seed: 12,
    };
    let mut run = run_workload(&geo, 40_000, &work);
    assert_eq!(dir::check(&mut run.dir).unwrap().levels, 2);
    run.env.journal.sync().unwrap();
    let image = run.env.dev.snapshot();
    let bs = geo.block_size as usize;
    let root = run.dir.map[0] as usize * bs;
    // The first interior node: the root's entry 0 points at it.
    let node_lblk = u32::from_le_bytes(image[root + 36..root + 40].try_into().unwrap()) as usize;
    let node = run.dir.map[node_lblk] as usize * bs;
    type Damage = Box<dyn Fn(&mut [u8])>;
    let cases: Vec<(&str, usize, Damage)> = vec![
        ("hash version", 0, Box::new(move |b| b[root + 28] = 7)),
        ("info length", 0, Box::new(move |b| b[root + 29] = 12)),
        ("indirect levels", 0, Box::new(move |b| b[root + 30] = 2)),
        (
            "root count above limit",
            0,
            Box::new(move |b| b[root + 34] = 200),
        ),
        (
            "root count zero",
            0,
            Box::new(move |b| b[root + 34..root + 36].fill(0)),
        ),
        ("root limit", 0, Box::new(move |b| b[root + 32] ^= 1)),
        (
            "pointer past i_size",
            0,
            Box::new(move |b| b[root + 39] = 0x0f),
        ),
        (
            "node count above limit",
            node_lblk,
            Box::new(move |b| b[node + 10..node + 12].fill(0xff)),
        ),
        (
            "node fake record",
            node_lblk,
            Box::new(move |b| b[node + 4] = 12),
        ),
    ];
    for (what, lblk, damage) in cases {
        let mut bytes = image.clone();
        damage(&mut bytes);
        let env = MemEnv::new(&geo, (bytes.len() / bs) as u64);
        jext4::engine::dev::BlockDevice::write_at(&*env.dev, 0, &bytes).unwrap();
        let mut d = env.dir(&geo, DIR_INO, run.dir.seed, 0);
        d.map = run.dir.map.clone();
        d.indexed = true;
        // Names from every part of the hash space: some paths avoid the
        // damaged node, but not all (each lookup after the damage is seen
        // reads every leaf, so not all of the 30,000).
        for (name, &ino) in run.model.iter().step_by(37) {
            match dir::lookup(&mut d, name) {
                Ok(Some(found)) => assert_eq!(found.ino, ino, "{what}"),
                Ok(None) => panic!("{what}: a name is silently missing"),
                Err(error) => assert!(error.is_corruption(), "{what}: {error}"),
            }
        }
        let expected = Location::InodeBlock {
            ino: DIR_INO,
            block: lblk as u64,
        };
        assert_eq!(d.index_damaged, Some(expected), "{what}");
    }
}
