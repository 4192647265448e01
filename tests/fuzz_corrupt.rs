//! Corrupt images must never crash or hang the engine (issue 2, "Bad
//! input"): small real images (tests/fuzz_support/seeds.rs) are damaged
//! structure by structure — superblock, group descriptors, bitmaps, inodes,
//! extent and indirect blocks, directory leaves, htree nodes, xattr blocks,
//! symlink and orphan-file blocks, free space, random bytes anywhere, whole
//! blocks zeroed or duplicated, the image cut short — with their checksums
//! recomputed (most of the time, so that damage reaches the structural
//! checks) or left stale. Each image is mounted, walked and changed through
//! `jext4::engine::fs::walk::exercise` in a watched thread.
//!
//! A run fails on: a panic; a run that does not end within the watchdog's
//! time (a hang); corruption reported while the filesystem stays writable;
//! a stale checksum over data every walk reads that goes unreported;
//! damage to free space that changes what the walk sees; data written and
//! read back differently.
//!
//! Running it:
//! - CI, bounded: `cargo test --release --test fuzz_corrupt` runs
//!   `JEXT4_FUZZ_ITERATIONS` images (default 3000, about a minute on an
//!   idle core; 500 in debug builds).
//! - Long run: `JEXT4_FUZZ_ITERATIONS=1000000 cargo test --release --test
//!   fuzz_corrupt -- --nocapture mutated` (progress every 1000 images);
//!   `JEXT4_FUZZ_SEED=<n>` starts another deterministic sequence.
//! - Replay one image of a failure report: `JEXT4_FUZZ_SEED=<n>
//!   JEXT4_FUZZ_ONLY=<iteration> cargo test --release --test fuzz_corrupt
//!   -- --nocapture mutated`.
//! - Coverage-guided: the `cargo fuzz` target in `fuzz/` (see
//!   fuzz/README.md) uses the same seeds, maps and mutations.
//!
//! Seeds are cached under target/fuzz-seeds (delete them to rebuild); the
//! kernel-filled ones need root and loop mounts and are skipped without.

mod fuzz_support;

use fuzz_support::map::{ImageMap, Kind};
use fuzz_support::mutate::{self, Action, FieldValue, Mutation, Rng, Source};
use fuzz_support::seeds::{self, SEEDS, SeedSpec};
use fuzz_support::{Failure, Outcome, run_image, run_watched};
use jext4::Location;
use jext4::engine::fs::walk::{Budget, Stats};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

struct Seed {
    spec: SeedSpec,
    bytes: Vec<u8>,
    map: ImageMap,
    /// What a walk of the undamaged image sees.
    pristine: Stats,
    /// The CPU time of that walk.
    pristine_cpu: Duration,
}

fn budget() -> Budget {
    Budget::default()
}

/// Images of the bounded run: 3000 in release builds (about a minute on
/// one idle core); a debug build (overflow checks and debug assertions on,
/// about six times slower) runs 500 so that a plain `cargo test` stays
/// reasonable.
const DEFAULT_ITERATIONS: u64 = if cfg!(debug_assertions) { 500 } else { 3000 };

fn watchdog() -> Duration {
    if cfg!(debug_assertions) {
        Duration::from_secs(60)
    } else {
        Duration::from_secs(10)
    }
}

/// The seeds this machine can make, each walked once undamaged.
fn seeds() -> &'static [Seed] {
    static SEEDS_LOADED: OnceLock<Vec<Seed>> = OnceLock::new();
    SEEDS_LOADED.get_or_init(|| {
        keep_large_allocations();
        SEEDS
            .iter()
            .filter_map(|spec| {
                let bytes = seeds::load_or_make(spec)?;
                let map = ImageMap::build(&bytes);
                let outcome = run_image(bytes.clone(), budget());
                Some(Seed {
                    spec: *spec,
                    pristine: outcome.stats,
                    pristine_cpu: outcome.cpu,
                    bytes,
                    map,
                })
            })
            .collect()
    })
}

/// Every image is a fresh copy of 8-16 MiB; glibc would map each from the
/// kernel and fault every page in again, which costs more than the walk.
/// Keeping large blocks in the heap lets the copies reuse warm memory.
fn keep_large_allocations() {
    // SAFETY: mallopt only tunes the allocator; any values are accepted.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 64 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 1 << 30);
    }
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().map(|value| {
        value
            .parse()
            .unwrap_or_else(|_| panic!("{name} must be a number"))
    })
}

#[test]
fn undamaged_seeds_walk_clean() {
    let seeds = seeds();
    if seeds.is_empty() {
        fuzz_support::skip("no seed image could be made here");
        return;
    }
    for seed in seeds {
        let name = seed.spec.name;
        let outcome = run_image(seed.bytes.clone(), budget());
        assert!(outcome.mount_error.is_none(), "{name}: {outcome:?}");
        let stats = &outcome.stats;
        assert_eq!(stats.read_errors, 0, "{name}: {stats:#?}");
        // Only fallocate on block-mapped files may fail (as in the kernel).
        let unexpected = stats
            .change_error_list
            .iter()
            .filter(|error| !error.starts_with("fallocate: operation not supported"));
        assert_eq!(unexpected.count(), 0, "{name}: {stats:#?}");
        assert!(stats.inconsistencies.is_empty(), "{name}: {stats:#?}");
        assert!(!stats.budget_exhausted, "{name}: {stats:#?}");
        assert!(!outcome.read_only_after, "{name}");
        assert!(outcome.unmount_error.is_none(), "{name}: {outcome:?}");
        // The walk is deterministic, so unused-space checks can compare.
        assert_eq!(stats.digest, seed.pristine.digest, "{name}");
        assert!(
            stats.regular_files > 600 && stats.symlinks >= 3,
            "{name}: {stats:#?}"
        );
        assert!(stats.xattrs >= 6, "{name}: {stats:#?}");
        let kinds = seed.map.kinds();
        for kind in [Kind::DirLeaf, Kind::DxRoot, Kind::XattrBlock] {
            assert!(kinds.contains(&kind), "{name}: no {kind:?} in {kinds:?}");
        }
        assert_eq!(
            kinds.contains(&Kind::DxNode),
            seed.spec.two_level_htree,
            "{name}: htree levels"
        );
        let mapped = [Kind::ExtentBlock, Kind::IndirectBlock];
        assert!(
            mapped.iter().any(|kind| kinds.contains(kind)),
            "{name}: no mapping blocks"
        );
    }
}

/// CPU time beyond which a run counts as a loop that ends too late. The
/// walk is bounded by its budget, so damage may make it do more work than
/// on the undamaged image, but not vastly more.
fn slow_limit(seed: &Seed) -> Duration {
    seed.pristine_cpu * 20 + Duration::from_millis(250)
}

/// Read errors other than corruption and I/O that damage may explain: an
/// inode number reached by a name but freed (getattr by number answers
/// ESTALE, as for a stale handle), and a name whose bytes changed so that
/// its hash no longer leads to its htree leaf (the kernel misses it too).
const EXPLAINED_READ_ERRORS: &[&str] = &[
    "getattr: stale file handle",
    "lookup: no such file or directory",
];

/// Whether a mutation left a stale checksum over bytes of a structure
/// every walk reads (and no other mutation of the same structure
/// recomputed it): then the walk must report corruption.
fn stale_checksum_left(seed: &Seed, mutations: &[Mutation], image: &[u8]) -> bool {
    let map = &seed.map;
    // Whether `fixer` made the checksum `stale` broke right again: it
    // recomputed it (same bytes, or a bitmap of the descriptor's group,
    // whose fix rewrites the descriptor), or copied a whole structure with
    // its own valid checksum over it.
    let recomputes = |stale: &Mutation, fixer: &Mutation| {
        let (a, b) = (&map.targets[stale.target], &map.targets[fixer.target]);
        let same_bytes = a.offset < b.offset + b.len && b.offset < a.offset + a.len;
        let bitmap_of_group = a.kind == Kind::GroupDesc
            && matches!(b.kind, Kind::BlockBitmap | Kind::InodeBitmap)
            && a.owner == b.owner;
        let copied_over = matches!(fixer.action, Action::CopyFrom { .. });
        (fixer.fix_checksum && (same_bytes || bitmap_of_group)) || (copied_over && same_bytes)
    };
    mutations.iter().enumerate().any(|(i, m)| {
        m.must_be_detected(map, &seed.bytes, image)
            && !mutations
                .iter()
                .enumerate()
                .any(|(j, other)| j != i && recomputes(m, other))
    })
}

/// Whether every mutation hit only space nothing uses: then the walk must
/// see exactly what it sees on the undamaged image.
fn unused_space_only(seed: &Seed, mutations: &[Mutation]) -> bool {
    mutations.iter().all(|m| {
        seed.map.targets[m.target].kind.is_unused_space()
            && !matches!(m.action, Action::CopyFrom { .. })
    })
}

/// What went wrong with one image, or `None`.
fn judge(seed: &Seed, mutations: &[Mutation], image: &[u8], outcome: &Outcome) -> Option<String> {
    let stats = &outcome.stats;
    if outcome.cpu > slow_limit(seed) {
        return Some(format!(
            "took {:?} of CPU, the undamaged image {:?}: a loop that should have stopped early",
            outcome.cpu, seed.pristine_cpu
        ));
    }
    if !stats.inconsistencies.is_empty() {
        return Some(format!("inconsistent answers: {:?}", stats.inconsistencies));
    }
    let unexplained: Vec<&String> = stats
        .other_read_errors
        .iter()
        .filter(|error| !EXPLAINED_READ_ERRORS.iter().any(|ok| error.starts_with(ok)))
        .collect();
    if !unexplained.is_empty() {
        return Some(format!(
            "reads failed with errors other than EUCLEAN/EIO: {unexplained:?}"
        ));
    }
    if outcome.saw_corruption() && !outcome.read_only_after {
        return Some("corruption reported but the filesystem stayed writable".into());
    }
    let stale = stale_checksum_left(seed, mutations, image);
    // A mount refused for another reason (a feature we do not support)
    // read nothing.
    let refused = outcome
        .mount_error
        .as_ref()
        .is_some_and(|e| !e.is_corruption());
    if stale && !refused && !outcome.saw_corruption() {
        return Some(format!(
            "a stale checksum over a structure every walk reads went unreported ({stats:?})"
        ));
    }
    if unused_space_only(seed, mutations)
        && (outcome.mount_error.is_some()
            || stats.read_errors > 0
            || stats.digest != seed.pristine.digest)
    {
        return Some(format!(
            "damage to unused space changed the walk: mount {:?}, {} read errors {:?}",
            outcome.mount_error, stats.read_errors, stats.other_read_errors
        ));
    }
    None
}

#[derive(Default)]
struct Tally {
    images: u64,
    mount_errors: u64,
    corruption_seen: u64,
    clean_walks: u64,
    checksum_fixed: u64,
    stale_checksums: u64,
    unused_space: u64,
    /// CPU time of the runs, which machine load does not inflate.
    cpu: Duration,
    other_read_errors: std::collections::BTreeMap<String, u64>,
}

impl Tally {
    fn add(&mut self, seed: &Seed, mutations: &[Mutation], image: &[u8], outcome: &Outcome) {
        self.images += 1;
        self.cpu += outcome.cpu;
        self.stale_checksums += stale_checksum_left(seed, mutations, image) as u64;
        self.unused_space += unused_space_only(seed, mutations) as u64;
        self.mount_errors += outcome.mount_error.is_some() as u64;
        self.corruption_seen += outcome.saw_corruption() as u64;
        self.clean_walks +=
            (outcome.mount_error.is_none() && outcome.stats.read_errors == 0) as u64;
        self.checksum_fixed += mutations.iter().any(|m| m.fix_checksum) as u64;
        for error in &outcome.stats.other_read_errors {
            let key: String = error.chars().take(60).collect();
            *self.other_read_errors.entry(key).or_default() += 1;
        }
    }
}

impl Tally {
    fn print(&self, seeds: usize, seconds: f64) {
        eprintln!(
            "{} images in {seconds:.1} s ({:.1}/s; {:.1} per CPU second) over {seeds} seeds: \
             {} mount errors, {} saw corruption, {} walked without error, {} with checksums \
             recomputed, {} with stale checksums that had to be reported, {} damaged only \
             unused space",
            self.images,
            self.images as f64 / seconds,
            self.images as f64 / self.cpu.as_secs_f64(),
            self.mount_errors,
            self.corruption_seen,
            self.clean_walks,
            self.checksum_fixed,
            self.stale_checksums,
            self.unused_space,
        );
        for (error, count) in &self.other_read_errors {
            eprintln!("  {count:6} × {error}");
        }
    }
}

fn mutations_for(seed: &Seed, rng: &mut Rng) -> Vec<Mutation> {
    let count = if Source::chance(rng, 20) {
        2 + rng.below(3) as usize
    } else {
        1
    };
    mutate::choose(&seed.map, rng, count)
}

#[test]
fn mutated_images_never_panic_or_hang() {
    let seeds = seeds();
    if seeds.is_empty() {
        fuzz_support::skip("no seed image could be made here");
        return;
    }
    let base = env_u64("JEXT4_FUZZ_SEED").unwrap_or(0x006a_6578_7434);
    let iterations = env_u64("JEXT4_FUZZ_ITERATIONS").unwrap_or(DEFAULT_ITERATIONS);
    let only = env_u64("JEXT4_FUZZ_ONLY");
    let range = match only {
        Some(iteration) => iteration..iteration + 1,
        None => 0..iterations,
    };
    let mut failures = Vec::new();
    let mut tally = Tally::default();
    let started = Instant::now();
    for iteration in range {
        let verdict = run_iteration(seeds, base, iteration, only.is_some(), &mut tally);
        match verdict {
            Verdict::Passed => {}
            Verdict::Failed(report) => failures.push(report),
            Verdict::Hung(report) => {
                failures.push(report);
                break; // the hung thread keeps a core busy
            }
        }
        if failures.len() >= 20 {
            break;
        }
        if (iteration + 1) % 1000 == 0 {
            eprintln!(
                "{} images, {:.1}/s, {} failures",
                tally.images,
                tally.images as f64 / started.elapsed().as_secs_f64(),
                failures.len()
            );
        }
    }
    tally.print(seeds.len(), started.elapsed().as_secs_f64());
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

enum Verdict {
    Passed,
    Failed(String),
    Hung(String),
}

/// Damage one image the way `iteration` of sequence `base` says, run it
/// watched, and judge it.
fn run_iteration(
    seeds: &[Seed],
    base: u64,
    iteration: u64,
    verbose: bool,
    tally: &mut Tally,
) -> Verdict {
    let mut rng = Rng::new(base ^ iteration.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let seed = &seeds[(iteration % seeds.len() as u64) as usize];
    let mutations = mutations_for(seed, &mut rng);
    let mut image = seed.bytes.clone();
    for mutation in &mutations {
        mutate::apply(&seed.map, &mut image, mutation);
    }
    let described: Vec<String> = mutations.iter().map(|m| m.describe(&seed.map)).collect();
    if verbose {
        eprintln!(
            "iteration {iteration} on {}: {described:#?}",
            seed.spec.name
        );
    }
    let report = |problem: String| {
        format!(
            "JEXT4_FUZZ_SEED={base} JEXT4_FUZZ_ONLY={iteration} (seed image {}):\n  {}\n  => {problem}",
            seed.spec.name,
            described.join("\n  ")
        )
    };
    match run_watched(image.clone(), budget(), watchdog()) {
        Ok(outcome) => {
            if verbose {
                eprintln!("{outcome:#?}");
            }
            tally.add(seed, &mutations, &image, &outcome);
            match judge(seed, &mutations, &image, &outcome) {
                Some(problem) => Verdict::Failed(report(problem)),
                None => Verdict::Passed,
            }
        }
        Err(Failure::Panic(message)) => Verdict::Failed(report(format!("panic: {message}"))),
        Err(Failure::Hang(after)) => {
            Verdict::Hung(report(format!("no answer after {after:?} (hang)")))
        }
    }
}

// ---------------------------------------------------------------------------
// Fixed cases: the judge's own rules on chosen mutations, then regressions
// (each a bug the run above found) as structural mutations of seeds that
// jext4 fills itself, so that no root is needed.

#[test]
fn stale_checksums_are_reported_as_corruption() {
    // must_be_detected() holds for each: the judge fails them unless the
    // walk reports corruption.
    let seed = "ext4-1k-jext4";
    regression(seed, Kind::DirLeaf, "/dir1", 0, "d[2].name_len", 1, false);
    regression(seed, Kind::Inode, "/small", 0, "i_uid", 7, false);
    regression(
        seed,
        Kind::ExtentBlock,
        "/fragmented",
        0,
        "e[3].logical",
        0,
        false,
    );
    regression(
        seed,
        Kind::XattrBlock,
        "/dir1/f1",
        0,
        "e[0].e_value_size",
        3,
        false,
    );
    regression(seed, Kind::DxRoot, "/htree", 0, "dx[1].hash", 0, false);
}

fn seed_named(name: &str) -> Option<&'static Seed> {
    let seed = seeds().iter().find(|seed| seed.spec.name == name);
    if seed.is_none() {
        fuzz_support::skip(&format!("seed {name} is not available here"));
    }
    seed
}

/// Apply `field := value` to the `nth` `kind` target of `owner` in seed
/// `seed_name`, with or without checksum repair, run it watched, and judge
/// it as the run above would.
fn regression(
    seed_name: &str,
    kind: Kind,
    owner: &str,
    nth: usize,
    field: &str,
    value: u64,
    fix: bool,
) -> Option<Outcome> {
    let seed = seed_named(seed_name)?;
    let map = &seed.map;
    let target = map
        .find(kind, owner, nth)
        .unwrap_or_else(|| panic!("no {kind:?} #{nth} of {owner} in {seed_name}"));
    let field = map.targets[target]
        .fields
        .iter()
        .position(|f| f.name == field)
        .unwrap_or_else(|| panic!("no field {field} in {}", map.targets[target].describe()));
    let value = FieldValue::Absolute(value);
    let action = Action::SetField { field, value };
    Some(run_case(seed, target, action, fix))
}

/// Run one mutation of `seed` watched, and judge it as the run above would.
fn run_case(seed: &Seed, target: usize, action: Action, fix_checksum: bool) -> Outcome {
    let map = &seed.map;
    let mutation = Mutation {
        target,
        action,
        fix_checksum,
    };
    let mut image = seed.bytes.clone();
    mutate::apply(map, &mut image, &mutation);
    let outcome = match run_watched(image.clone(), budget(), watchdog()) {
        Ok(outcome) => outcome,
        Err(failure) => panic!("{}: {failure:?}", mutation.describe(map)),
    };
    if let Some(problem) = judge(seed, std::slice::from_ref(&mutation), &image, &outcome) {
        panic!("{}: {problem}", mutation.describe(map));
    }
    outcome
}

/// The orphans a seed left pending, in list order from s_last_orphan.
fn orphan_chain(seed: &Seed) -> Vec<u32> {
    let mut chain = Vec::new();
    let mut ino = jext4::engine::format::get_u32(&seed.bytes, 1024 + 0xE8);
    while ino != 0 && chain.len() < 16 {
        chain.push(ino);
        let at = seed.map.inode_offset(ino);
        ino = jext4::engine::format::get_u32(&seed.bytes, at + 0x14); // i_dtime
    }
    chain
}

#[test]
fn orphan_list_cycles_are_cut_at_once() {
    // Found while hunting unbounded loops for this fuzz: an orphan list
    // that came back to an inode it had passed was walked to the
    // million-step bound at mount, one inode read per step, before being
    // reported (0.2 s in release builds, seconds in debug builds). Now
    // the list is cut where it comes back, as the kernel's orphan cleanup
    // ends it, and every orphan on it is released: the mount goes on.
    let Some(seed) = seed_named("ext4-1k-orphans-jext4") else {
        return;
    };
    let chain = orphan_chain(seed);
    assert!(
        chain.len() >= 3,
        "the seed should leave three orphans: {chain:?}"
    );
    let (first, last) = (chain[0], chain[chain.len() - 1]);
    for (owner, points_to) in [(first, first), (last, first)] {
        let owner = format!("<orphan {owner}>");
        let name = seed.spec.name;
        let outcome = regression(
            name,
            Kind::Inode,
            &owner,
            0,
            "i_dtime",
            points_to as u64,
            true,
        )
        .expect("the seed was found above");
        assert!(outcome.mount_error.is_none(), "{outcome:?}");
        let limit = seed.pristine_cpu * 3 + Duration::from_millis(30);
        assert!(
            outcome.cpu < limit,
            "took {:?} (limit {limit:?})",
            outcome.cpu
        );
    }
}

#[test]
fn large_inode_tables_do_not_overflow_the_geometry() {
    // Found reviewing the geometry arithmetic, reproduced with the geometry
    // reshaping mutation: 32 KiB blocks, 2^18 inodes
    // of 32 KiB per group pass the superblock's own checks, and the inode
    // table size (inodes per group x inode size) overflowed 32 bits (a
    // panic in debug builds, a wrong size in release builds).
    let Some(seed) = seed_named("ext4-1k-jext4") else {
        return;
    };
    let target = seed
        .map
        .find(Kind::Superblock, "the filesystem", 0)
        .unwrap();
    let block_size: u64 = 32 << 10;
    let blocks_count = seed.bytes.len() as u64 / block_size;
    // (offset, width, value) in the superblock: s_log_block_size,
    // s_log_cluster_size, s_first_data_block, s_blocks_per_group,
    // s_clusters_per_group, s_inodes_per_group, s_inode_size,
    // s_blocks_count_lo, s_inodes_count (one group).
    let writes = vec![
        (0x18, 4, 5),
        (0x1C, 4, 5),
        (0x14, 4, 0),
        (0x20, 4, 8 * block_size),
        (0x24, 4, 8 * block_size),
        (0x28, 4, 1 << 18),
        (0x58, 2, block_size),
        (0x04, 4, blocks_count),
        (0x00, 4, 1 << 18),
    ];
    let outcome = run_case(seed, target, Action::Geometry { writes }, true);
    assert!(outcome.mount_error.is_some(), "{outcome:?}");
}

#[test]
fn extent_blocks_with_less_room_than_the_block_can_be_changed() {
    // Found reviewing the extent writer's assertions, reproduced here: the
    // kernel accepts a tree block whose eh_max is below the block's
    // capacity (only a larger one is corrupt, __ext4_ext_check), and so
    // does our decoder, but writing such a block back tripped a debug
    // assertion that eh_max equals the capacity (a panic in debug builds).
    // The change phase writes, truncates and punches /fragmented.
    let seed = "ext4-1k-jext4";
    for (nth, eh_max) in [(0, 80), (1, 84), (2, 83)] {
        regression(
            seed,
            Kind::ExtentBlock,
            "/fragmented",
            nth,
            "eh_max",
            eh_max,
            true,
        );
    }
}

#[test]
fn listed_xattr_names_read_back_or_are_corruption() {
    // Found by the long debug run (JEXT4_FUZZ_SEED=77, image 884): an
    // entry whose name index moved from the default ACL (empty name) to
    // trusted.* was listed as "trusted.", and getxattr of that name failed
    // with EINVAL instead of the walk seeing EUCLEAN. Likewise a user.*
    // entry moved to the access ACL index listed a name no getxattr takes.
    let seed = "ext4-1k-jext4";
    let field = "ibody.e[0].e_name_index";
    for (owner, index) in [("/dir1", 4), ("/small", 2)] {
        let outcome = regression(seed, Kind::Inode, owner, 0, field, index, true)
            .expect("the seed exists when regression() returns");
        assert!(outcome.stats.corruption_errors > 0, "{outcome:?}");
    }
}

#[test]
fn group_metadata_on_the_descriptor_table_is_refused() {
    // Found by the long release run (JEXT4_FUZZ_SEED=123, image 8465): on
    // ext2 (no checksums) a bit flip moved group 0's block bitmap onto the
    // descriptor table; allocations then set bits in the descriptors and
    // handed out blocks in use, and a file read back differently from
    // what was just written. ext4_check_descriptors refuses bitmaps and
    // inode tables on the superblock or descriptor table, and outside
    // their group without flex_bg; so does the mount now.
    let seed = "ext2-1k-jext4";
    let Some(seeded) = seed_named(seed) else {
        return;
    };
    let groups = seeded.map.geo.group_count;
    let group_size = seeded.map.geo.blocks_per_group as u64;
    for (field, value) in [
        ("bg_block_bitmap", 2),
        ("bg_inode_bitmap", 1),
        ("bg_inode_table", 2),
        ("bg_block_bitmap", 1 + group_size + 200),
    ] {
        let outcome = regression(seed, Kind::GroupDesc, "group 0", 0, field, value, true)
            .expect("the seed exists when seed_named() found it");
        assert!(
            outcome
                .mount_error
                .as_ref()
                .is_some_and(|e| e.is_corruption()),
            "{field} := {value} ({groups} groups): {outcome:?}"
        );
    }
}

#[test]
fn a_block_bitmap_pointer_to_the_wrong_block_is_corruption() {
    // Found with the descriptor case above: a block bitmap pointer moved
    // to another block of its group passes every descriptor check, and on
    // ext2 (no bitmap checksum) allocations then trusted whatever that
    // block held. Like ext4_valid_block_bitmap, the bitmap must mark the
    // group's own bitmaps and inode table in use.
    let seed = "ext2-1k-jext4";
    let Some(seeded) = seed_named(seed) else {
        return;
    };
    let geo = &seeded.map.geo;
    let group_end = geo.group_first_block(0) + geo.blocks_per_group as u64;
    let free_in_group_0 = seeded
        .map
        .targets
        .iter()
        .find(|t| t.kind == Kind::FreeBlock && t.block < group_end)
        .map(|t| t.block)
        .expect("group 0 has free blocks");
    let field = "bg_block_bitmap";
    let outcome = regression(
        seed,
        Kind::GroupDesc,
        "group 0",
        0,
        field,
        free_in_group_0,
        true,
    )
    .expect("the seed exists when seed_named() found it");
    assert!(outcome.mount_error.is_none(), "{outcome:?}");
    // Found at the bitmap itself, on first use, before any allocation from
    // it could hand out blocks in use.
    let at_bitmap = Location::Block {
        block: free_in_group_0,
    };
    assert_eq!(
        outcome.stats.first_corruption,
        Some(at_bitmap),
        "{outcome:?}"
    );
}

#[test]
fn an_inode_in_use_is_never_allocated_again() {
    // Found reviewing what the walk cannot see: an inode bitmap that marks
    // a live inode free (a flipped bit, on ext2 no checksum) let the next
    // create take that inode over, and the file that had it silently
    // became the new, empty one. Allocation now refuses an inode that
    // still has links, as corruption at that inode.
    let seed = "ext2-1k-jext4";
    let Some(seeded) = seed_named(seed) else {
        return;
    };
    let map = &seeded.map;
    let small = map.find(Kind::Inode, "/small", 0).expect("/small");
    let ino = map.targets[small].owner;
    let bitmap = map.find(Kind::InodeBitmap, "group 0", 0).unwrap();
    assert_eq!(map.geo.group_of_inode(ino), 0);
    let index = map.geo.inode_index_in_group(ino) as usize;
    let byte = seeded.bytes[map.targets[bitmap].offset + index / 8];
    let action = Action::SetByte {
        byte: index / 8,
        value: byte & !(1 << (index % 8)),
    };
    let outcome = run_case(seeded, bitmap, action, true);
    assert_eq!(
        outcome.stats.first_corruption,
        Some(Location::Inode { ino }),
        "{outcome:?}"
    );
}

#[test]
fn superblock_free_counts_come_from_the_descriptors() {
    // Found by the long debug run (JEXT4_FUZZ_SEED=555, image 900):
    // s_free_inodes_count at its maximum (checksum recomputed) made the
    // release of the first orphan at mount overflow it (a panic in debug
    // builds). Like the kernel, the mount now takes both free counts from
    // the group descriptors, whose counts are checked.
    let seed = "ext4-1k-orphans-jext4";
    for field in ["s_free_inodes_count", "s_free_blocks_count_hi"] {
        let max = 0xffff_ffff;
        let outcome = regression(
            seed,
            Kind::Superblock,
            "the filesystem",
            0,
            field,
            max,
            true,
        )
        .expect("the seed exists when regression() returns");
        assert!(outcome.mount_error.is_none(), "{field}: {outcome:?}");
    }
}
