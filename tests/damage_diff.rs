//! Damaged images, with the kernel as the oracle (issue 24): for each
//! damage kind (tests/damage_support/damage.rs) a base image is damaged
//! from a seed, then the same workload runs through a kernel loop mount
//! (`errors=remount-ro`) and through a jext4 FUSE mount, each on its own
//! copy, and `e2fsck -fn` checks both results. jext4 fails a kind when it
//! leaves a problem kind the kernel's run does not, lists less than the
//! kernel without an error, lists a name twice, panics, hangs, changes
//! the image on a read-only mount, or returns a corruption error its log
//! does not name with a location (tests/damage_support/runner.rs).
//!
//! Running it:
//! - CI: `cargo test --profile ci --test damage_diff`, one test per kind
//!   on the fixed seed `CI_SEED`, and the undamaged control on every
//!   variant.
//! - Long run: `JEXT4_DAMAGE_SEEDS=200 cargo test --profile ci --test
//!   damage_diff -- --ignored --nocapture`, every kind on seeds 0..200
//!   (two to five seconds per image, by the machine's load), a table at
//!   the end;
//!   `JEXT4_DAMAGE_KINDS=htree_limit,orphan_loop` narrows it and
//!   `JEXT4_DAMAGE_SEED_BASE=N` starts at seed N.
//! - Replay one: `JEXT4_DAMAGE_SEED_BASE=17 JEXT4_DAMAGE_SEEDS=1
//!   JEXT4_DAMAGE_KINDS=htree_count cargo test --profile ci --test
//!   damage_diff -- --ignored --nocapture`; `JEXT4_E2E_KEEP=1` keeps the
//!   images (damaged, and after each run) in the scratch directory named
//!   on stderr.
//!
//! Base images are cached under target/tmp/damage-bases. Needs root, FUSE
//! and loop devices; skipped with the reason otherwise (failed under
//! `JEXT4_NO_SKIP`).

// The jext4 binary, or the mounts and helpers of tests/common that use it.
#![cfg(feature = "cli")]

mod common;
mod damage_support;
// The fuzzer's image map and checksum fixer locate and seal byte edits.
// Its skip re-export is unused here, and it includes common/skip.rs by
// path, as `common` does.
#[allow(unused_imports, clippy::duplicate_mod)]
mod fuzz_support;

use common::e2e;
use common::workload::env_number;
use damage_support::damage::{self, Kind};
use damage_support::runner::{self, Run};

/// The seed every CI run uses.
const CI_SEED: u64 = 1;

fn check(kind: Kind) {
    check_seeds(kind, &[CI_SEED]);
}

fn check_seeds(kind: Kind, seeds: &[u64]) {
    if !e2e::require_e2e() {
        return;
    }
    let scratch = scratch(&format!("damage-{}", kind.name()));
    for &seed in seeds {
        let dir = scratch.path().join(seed.to_string());
        std::fs::create_dir_all(&dir).unwrap();
        let run = runner::run_one(kind, seed, &dir);
        println!("{}", runner::report(&run));
        assert!(run.passed(), "{}", failure(&run));
    }
}

/// The control, on every variant: undamaged images must pass every
/// check, so a failure of a damage kind is the damage's doing.
#[test]
fn undamaged() {
    let seeds: Vec<u64> = (0..damage::EVERY_VARIANT.len() as u64).collect();
    check_seeds(Kind::Undamaged, &seeds);
}

/// The findings again (the report above has the whole run), and both
/// e2fsck outputs in full.
fn failure(run: &Run) -> String {
    let findings: Vec<String> = run
        .findings
        .iter()
        .map(|found| format!("[{}] {}", found.check, found.text))
        .collect();
    format!(
        "jext4 does worse than the kernel on {} (seed {}, {}):\n{}\n\ne2fsck -fn after jext4's run:\n{}\ne2fsck -fn after the kernel's run:\n{}",
        run.damage.kind.name(),
        run.damage.seed,
        run.damage.variant.name(),
        findings.join("\n"),
        run.jext4.fsck.text,
        run.kernel.fsck.text
    )
}

macro_rules! kind_tests {
    ($($test:ident => $kind:ident,)*) => {
        $(
            #[test]
            fn $test() {
                check(Kind::$kind);
            }
        )*
    };
}

kind_tests! {
    htree_limit => HtreeLimit,
    htree_count => HtreeCount,
    htree_hash_order => HtreeHashOrder,
    htree_depth => HtreeDepth,
    htree_bad_block => HtreeBadBlock,
    bitmap_frees_in_use => BitmapFreesInUse,
    bitmap_frees_metadata => BitmapFreesMetadata,
    inode_bitmap_frees_in_use => InodeBitmapFreesInUse,
    bitmap_frees_inode_table => BitmapFreesInodeTable,
    bitmaps_share_block => BitmapsShareBlock,
    bitmap_checksum => BitmapChecksum,
    entry_past_initialised => EntryPastInitialised,
    entry_past_inodes_count => EntryPastInodesCount,
    huge_size => HugeSize,
    name_with_slash => NameWithSlash,
    name_with_nul => NameWithNul,
    extent_leaf_checksum => ExtentLeafChecksum,
    extent_leaf_magic => ExtentLeafMagic,
    orphan_loop => OrphanLoop,
    xattr_shared_beyond_refcount => XattrSharedBeyondRefcount,
    ext2_no_xattr_foreign_owner => Ext2NoXattrForeignOwner,
    blocks_in_journal => BlocksInJournal,
}

/// Seed 101 frees /tree/medium's bit on ext2: the walk leaves the file
/// named by the kernel's FUSE client, so jext4's allocator, which passes
/// over numbers a front end names, used to skip it and leave the bitmap
/// wrong, where the kernel meets the live inode and sets its bit back.
#[test]
fn inode_bitmap_frees_a_named_inode_on_ext2() {
    check_seeds(Kind::InodeBitmapFreesInUse, &[101]);
}

/// Seed 134 points group 2's inode bitmap into its own inode table on
/// ext2: the group is not allocated from, and `rm` of a file there used to
/// remove the name, then fail to free into the group, leaving an inode
/// with no links and its blocks allocated (no journal to discard the
/// half); it now checks before it changes anything.
#[test]
fn rm_on_ext2_checks_before_it_frees() {
    check_seeds(Kind::BitmapsShareBlock, &[134]);
}

/// Seeds 182 and 189 free, in group 0's bitmap, blocks of group 2's inode
/// table (flex_bg packs it there), the count raised to match: the kernel
/// checks nothing there, and its `rm` freed into group 0; jext4 rejected
/// the bitmap when `rm` freed into it and aborted the journal. The group
/// is now kept out of allocation and frees go through.
#[test]
fn frees_go_into_a_bitmap_that_marks_another_groups_table_free() {
    check_seeds(Kind::BitmapFreesInodeTable, &[182, 189]);
}

/// Every kind on many seeds, a table at the end (see the module comment).
#[test]
#[ignore = "long run: JEXT4_DAMAGE_SEEDS=200 cargo test --profile ci --test damage_diff -- --ignored --nocapture"]
fn long_run() {
    if !e2e::require_e2e() {
        return;
    }
    let seeds = env_number("JEXT4_DAMAGE_SEEDS", 20);
    let first = env_number("JEXT4_DAMAGE_SEED_BASE", 0);
    let kinds: Vec<Kind> = match std::env::var("JEXT4_DAMAGE_KINDS") {
        Ok(list) => list
            .split(',')
            .map(|name| {
                Kind::from_name(name.trim())
                    .unwrap_or_else(|| panic!("no damage kind {name:?}; kinds: {:?}", names()))
            })
            .collect(),
        Err(_) => damage::ALL.to_vec(),
    };
    let scratch = scratch("damage-long");
    let mut runs = Vec::new();
    for seed in first..first + seeds {
        for &kind in &kinds {
            let dir = scratch.path().join(format!("{}-{seed}", kind.name()));
            std::fs::create_dir_all(&dir).unwrap();
            let run = runner::run_one(kind, seed, &dir);
            println!("{}", runner::report(&run));
            if run.passed() && std::env::var_os("JEXT4_E2E_KEEP").is_none() {
                let _ = std::fs::remove_dir_all(&dir);
            }
            runs.push(run);
        }
    }
    let table = runner::table(&runs);
    println!("{table}");
    let failed = runs.iter().filter(|run| !run.passed()).count();
    assert_eq!(
        failed,
        0,
        "{failed} of {} runs failed (the table above)",
        runs.len()
    );
}

/// The scratch directory, named on stderr when `JEXT4_E2E_KEEP` keeps it.
fn scratch(name: &str) -> tempfile::TempDir {
    let dir = e2e::scratch(name);
    if std::env::var_os("JEXT4_E2E_KEEP").is_some() {
        eprintln!("images kept in {}", dir.path().display());
    }
    dir
}

fn names() -> Vec<String> {
    damage::ALL.iter().map(|kind| kind.name()).collect()
}
