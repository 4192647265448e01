//! Every crash-test workload at 1 KiB and 4 KiB blocks, on plain images
//! and on fast_commit images (fsync writes fast commits); at 4 KiB with
//! delayed allocation (`-o delalloc`, with and without fast commits) and
//! on meta_bg images with several meta groups (`META_BG_STATES`); and with
//! the journal on a device of its own (`EXTERNAL_JOURNAL_STATES`, 1 KiB,
//! and 4 KiB with fast commits); on inline_data images
//! (`INLINE_DATA_STATES`, 1 KiB) and on quota images (`QUOTA_STATES`, 4
//! KiB), and a few on casefold images whose every directory is +F
//! (`CASEFOLD_STATES`, mod `casefold`) and on bigalloc images
//! (`BIGALLOC_STATES`, mod `bigalloc`): each planned crash state recovers (jext4,
//! and e2fsck and the kernel on samples) to a clean filesystem that keeps
//! everything acknowledged. The other block size of each mode is the long
//! run's (`jext4 crashtest --block-size 1024 --delalloc`, `--meta-bg`,
//! `--block-size 4096 --inline-data`, `--block-size 1024 --quota`).
//!
//! The CI budget (about 15,400 states planned in all): `STATES` states per
//! workload and block size, `FAST_COMMIT_STATES` on fast_commit and
//! delalloc images but for the per-directory workloads (multi-threaded,
//! across directories), which get `STATES` there too; `jext4 crashtest
//! --workload all --states 10000 [--fast-commit]` is the long run (docs/
//! testing.md, "Crash states").

#![cfg(feature = "crashtest")]

mod common;

use jext4::engine::crash::workloads::find;
use jext4::engine::crash::{Config, run};

const STATES: usize = 150;
const FAST_COMMIT_STATES: usize = 60;
/// On meta_bg images: the descriptors' other places, not other commits.
const META_BG_STATES: usize = 60;
/// With an external journal: the second device's barriers and the
/// journal's place on it, not other commits.
const EXTERNAL_JOURNAL_STATES: usize = 30;
/// On inline_data images: inline files and directories, and their moves
/// to blocks, not other commits.
const INLINE_DATA_STATES: usize = 40;
/// On quota images: every state's usage counts, which e2fsck checks.
const QUOTA_STATES: usize = 40;
/// On casefold images: every state's htree hashes of folded names.
const CASEFOLD_STATES: usize = 40;
/// With data=journal: logged data, whole versions of every file.
const DATA_JOURNAL_STATES: usize = 60;
/// On bigalloc images: every state's cluster bitmaps and i_blocks.
const BIGALLOC_STATES: usize = 60;
/// The per-directory workloads get the full budget on fast_commit images
/// too: they are there for per-directory commits.
const PER_DIRECTORY: &[&str] = &[
    "spool8",
    "compaction",
    "varmail8",
    "acedirs",
    "openunlink",
    "dirsync",
];

fn check(workload: &str, block_size: u32, fast_commit: bool) {
    check_with(workload, block_size, fast_commit, false);
}

fn check_with(workload: &str, block_size: u32, fast_commit: bool, delalloc: bool) {
    check_images(workload, block_size, fast_commit, delalloc, Images::Plain);
}

fn check_meta_bg(workload: &str, block_size: u32) {
    check_images(workload, block_size, false, false, Images::MetaBg);
}

fn check_quota(workload: &str, block_size: u32) {
    check_images(workload, block_size, false, false, Images::Quota);
}

fn check_casefold(workload: &str, block_size: u32) {
    check_images(workload, block_size, false, false, Images::Casefold);
}

fn check_data_journal(workload: &str, block_size: u32) {
    check_images(workload, block_size, false, false, Images::DataJournal);
}

fn check_bigalloc(workload: &str, block_size: u32) {
    check_images(workload, block_size, false, false, Images::Bigalloc);
}

fn check_inline_data(workload: &str, block_size: u32) {
    check_images(workload, block_size, false, false, Images::InlineData);
}

fn check_external_journal(workload: &str, block_size: u32, fast_commit: bool) {
    check_images(
        workload,
        block_size,
        fast_commit,
        false,
        Images::ExternalJournal,
    );
}

/// The images' shape besides the block size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Images {
    Plain,
    MetaBg,
    ExternalJournal,
    InlineData,
    Quota,
    Casefold,
    /// Plain images, recorded with `-o data=journal`.
    DataJournal,
    /// bigalloc, clusters of 4 blocks.
    Bigalloc,
}

fn check_images(
    workload: &str,
    block_size: u32,
    fast_commit: bool,
    delalloc: bool,
    images: Images,
) {
    if !common::require_tool("mke2fs") || !common::require_tool("e2fsck") {
        return;
    }
    let meta_bg = images == Images::MetaBg;
    let states = if meta_bg {
        META_BG_STATES
    } else if images == Images::ExternalJournal {
        EXTERNAL_JOURNAL_STATES
    } else if images == Images::InlineData {
        INLINE_DATA_STATES
    } else if images == Images::Quota {
        QUOTA_STATES
    } else if images == Images::Casefold {
        CASEFOLD_STATES
    } else if images == Images::DataJournal {
        DATA_JOURNAL_STATES
    } else if images == Images::Bigalloc {
        BIGALLOC_STATES
    } else if (fast_commit || delalloc) && !PER_DIRECTORY.contains(&workload) {
        FAST_COMMIT_STATES
    } else {
        STATES
    };
    let mut config = Config::new(vec![find(workload).unwrap()], block_size, states, 1);
    config.fast_commit = fast_commit;
    config.delalloc = delalloc;
    config.meta_bg = meta_bg;
    config.external_journal = images == Images::ExternalJournal;
    config.inline_data = images == Images::InlineData;
    config.quota = images == Images::Quota;
    config.casefold = images == Images::Casefold;
    config.data_journal = images == Images::DataJournal;
    config.bigalloc = images == Images::Bigalloc;
    // A failing state's disks and log, to look at with `jext4 logdump`.
    config.keep = std::env::var_os("JEXT4_CRASH_KEEP").map(Into::into);
    let summary = run(&config, &mut |_| {}).unwrap();
    let failures: Vec<String> = summary.failures.iter().map(|f| f.to_string()).collect();
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    // Enough states were really tried, and e2fsck saw every one.
    assert!(
        summary.states >= states / 2,
        "only {} states",
        summary.states
    );
    assert_eq!(summary.fsck_runs, summary.states);
    assert!(summary.replay_runs + summary.replay_skipped > 0);
    match (&summary.kernel_skipped, images) {
        // A kernel without CONFIG_QUOTA or CONFIG_UNICODE (this
        // machine's) refuses quota and casefold images: e2fsck, which
        // recounts every id and rehashes every folded name, is the oracle
        // there.
        (Some(why), Images::Quota | Images::Casefold) => {
            eprintln!("{workload}: no kernel replay of {images:?} images: {why}")
        }
        (Some(why), _) => {
            common::skip(&format!("kernel replay: {why}"));
        }
        (None, _) => {}
    }
    eprintln!(
        "{workload} {block_size}{}{}{}: {} states, {} e2fsck replays ({} left to the kernel), {} kernel replays{} in {:.1?}",
        if fast_commit { " fast commits" } else { "" },
        if delalloc { " delalloc" } else { "" },
        match images {
            Images::Plain => "",
            Images::MetaBg => " meta_bg",
            Images::ExternalJournal => " external journal",
            Images::InlineData => " inline_data",
            Images::Quota => " quota",
            Images::Casefold => " casefold",
            Images::DataJournal => " data=journal",
            Images::Bigalloc => " bigalloc",
        },
        summary.states,
        summary.replay_runs,
        summary.replay_skipped,
        summary.kernel_runs,
        summary
            .kernel_skipped
            .or(summary.kernel_verity_skipped)
            .map_or(String::new(), |why| format!(" (kernel skipped: {why})")),
        summary.elapsed
    );
}

macro_rules! workload_tests {
    ($($name:ident: $workload:literal,)*) => {
        mod at_1k {
            $(#[test] fn $name() { super::check($workload, 1024, false) })*
        }
        mod at_4k {
            $(#[test] fn $name() { super::check($workload, 4096, false) })*
        }
        mod fast_commit_at_1k {
            $(#[test] fn $name() { super::check($workload, 1024, true) })*
        }
        mod fast_commit_at_4k {
            $(#[test] fn $name() { super::check($workload, 4096, true) })*
        }
        mod delalloc_at_4k {
            $(#[test] fn $name() { super::check_with($workload, 4096, true, true) })*
        }
        mod delalloc_plain_at_4k {
            $(#[test] fn $name() { super::check_with($workload, 4096, false, true) })*
        }
        mod meta_bg_at_4k {
            $(#[test] fn $name() { super::check_meta_bg($workload, 4096) })*
        }
        mod external_journal_at_1k {
            $(#[test] fn $name() { super::check_external_journal($workload, 1024, false) })*
        }
        mod external_journal_fast_commit_at_4k {
            $(#[test] fn $name() { super::check_external_journal($workload, 4096, true) })*
        }
        mod inline_data_at_1k {
            $(#[test] fn $name() { super::check_inline_data($workload, 1024) })*
        }
        mod quota_at_4k {
            $(#[test] fn $name() { super::check_quota($workload, 4096) })*
        }
    };
}

/// fs-verity's enable (its tree written past the end, then the flag):
/// plain and fast-commit images at both block sizes, not every mode.
mod verity {
    #[test]
    fn at_1k() {
        super::check("verity", 1024, false)
    }
    #[test]
    fn at_4k() {
        super::check("verity", 4096, false)
    }
    #[test]
    fn fast_commit_at_4k() {
        super::check("verity", 4096, true)
    }
}

/// casefold images (utf8, strict; the root +F, so every directory is):
/// the workloads with many names in one directory (htrees of folded
/// hashes) and the ones that rename and link across directories.
mod casefold {
    #[test]
    fn smallwriters_at_1k() {
        super::check_casefold("smallwriters", 1024)
    }
    #[test]
    fn untar_at_4k() {
        super::check_casefold("untar", 4096)
    }
    #[test]
    fn dirsync_at_1k() {
        super::check_casefold("dirsync", 1024)
    }
    #[test]
    fn acedirs_at_4k() {
        super::check_casefold("acedirs", 4096)
    }
}

/// bigalloc: files sharing clusters between extents, holes punched and
/// files truncated inside clusters, directories growing block by block
/// within theirs.
mod bigalloc {
    #[test]
    fn overwrite_at_1k() {
        super::check_bigalloc("overwrite", 1024)
    }
    #[test]
    fn random_at_4k() {
        super::check_bigalloc("random", 4096)
    }
    #[test]
    fn untar_at_1k() {
        super::check_bigalloc("untar", 1024)
    }
    #[test]
    fn xattrs_at_4k() {
        super::check_bigalloc("xattrs", 4096)
    }
    #[test]
    fn spool8_at_1k() {
        super::check_bigalloc("spool8", 1024)
    }
    #[test]
    fn random_delalloc_at_4k() {
        super::check_images("random", 4096, false, true, super::Images::Bigalloc)
    }
    #[test]
    fn smallwriters_delalloc_at_1k() {
        super::check_images("smallwriters", 1024, false, true, super::Images::Bigalloc)
    }
}

/// In-place rewrites across block edges (ordered: sectors of several
/// versions may mix), and with data=journal (each file one version
/// whole): the overwrite workload and the ones with the most data
/// writes, and verity's trees past the end.
mod data_journal {
    #[test]
    fn overwrite_ordered_at_1k() {
        super::check("overwrite", 1024, false)
    }
    #[test]
    fn overwrite_at_1k() {
        super::check_data_journal("overwrite", 1024)
    }
    #[test]
    fn overwrite_at_4k() {
        super::check_data_journal("overwrite", 4096)
    }
    #[test]
    fn random_at_4k() {
        super::check_data_journal("random", 4096)
    }
    #[test]
    fn msgjournal_at_1k() {
        super::check_data_journal("msgjournal", 1024)
    }
    #[test]
    fn verity_at_1k() {
        super::check_data_journal("verity", 1024)
    }
}

workload_tests! {
    mailspool: "mailspool",
    lsm: "lsm",
    varmail: "varmail",
    msgjournal: "msgjournal",
    untar: "untar",
    xattrs: "xattrs",
    smallwriters: "smallwriters",
    random: "random",
    ace2: "ace2",
    ace3: "ace3",
    spool8: "spool8",
    compaction: "compaction",
    varmail8: "varmail8",
    acedirs: "acedirs",
    openunlink: "openunlink",
    dirsync: "dirsync",
    import: "import",
}
