//! The `jext4` command: mount and unmount images through FUSE; replay and
//! print journals; try every crash state of the crash-test workloads.

// The image tools' verbs live beside this file, in jext4/.
#[path = "jext4/tar.rs"]
mod tar;
#[path = "jext4/tools.rs"]
mod tools;
#[path = "jext4/verbs.rs"]
mod verbs;

use clap::{Parser, Subcommand};
use jext4::engine::fs::Fs;
use jext4::engine::fuse::{parse_mount_options, serve};
use std::io::{Read, Write};
use std::os::unix::io::FromRawFd;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

#[derive(Parser)]
#[command(
    name = "jext4",
    version,
    about = "ext2/ext3/ext4 in userspace, with a real journal"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Mount an image file or block device; returns once the mount is ready.
    Mount {
        /// Mount options, comma-separated (ro, rw, allow_other, cache_size=256M, commit=5, sync,
        /// sb=131072 to mount from a backup superblock, ...).
        #[arg(short = 'o', value_name = "OPTIONS")]
        options: Vec<String>,
        /// Stay attached to the terminal instead of running in the background.
        #[arg(short, long)]
        foreground: bool,
        /// Log file for the server (default: <runtime dir>/<mountpoint>.log when in the background).
        #[arg(long, value_name = "FILE")]
        log: Option<PathBuf>,
        image: PathBuf,
        mountpoint: PathBuf,
    },
    /// Replay the journal of an unmounted image in place (like `e2fsck -E journal_only`).
    Recover {
        image: PathBuf,
        /// Work from the superblock copy at N KiB (the mount's sb=), e.g.
        /// when the primary is damaged.
        #[arg(long, value_name = "N", value_parser = tools::sb)]
        sb: Option<u64>,
        /// The external journal's device or image (the mount's
        /// journal_path=); found by its UUID among block devices otherwise.
        #[arg(long, value_name = "PATH")]
        journal: Option<PathBuf>,
    },
    /// Print the journal's transactions, descriptor tags, revokes and commits.
    Logdump {
        image: PathBuf,
        /// Find the journal through the superblock copy at N KiB (the
        /// mount's sb=).
        #[arg(long, value_name = "N", value_parser = tools::sb)]
        sb: Option<u64>,
        /// The external journal's device or image (the mount's
        /// journal_path=).
        #[arg(long, value_name = "PATH")]
        journal: Option<PathBuf>,
    },
    /// Try the crash states of workloads: each must recover clean and lose
    /// nothing acknowledged (see docs/testing.md, "Crash states").
    Crashtest(CrashtestArgs),
    /// Print a mounted filesystem's statistics (state, cache, journal,
    /// write-ahead guard) — or, given an image file, block device or NBD
    /// URI that is not mounted, what its superblocks say.
    Stats {
        #[arg(value_name = "MOUNTPOINT|IMAGE")]
        mountpoint: PathBuf,
        /// One JSON object instead of `name value` lines.
        #[arg(long)]
        json: bool,
        /// Of an image: read the superblock copy at N KiB (the mount's sb=).
        #[arg(long, value_name = "N", value_parser = tools::sb)]
        sb: Option<u64>,
    },
    /// Commit everything written so far and wait until it is durable (all
    /// jext4 mounts, or the ones named). sync(1) cannot: the kernel never
    /// forwards sync(2) to a FUSE server.
    Sync { mountpoints: Vec<PathBuf> },
    #[command(flatten)]
    Tools(tools::ToolCommand),
    /// Print the shell completion script for bash, zsh, fish, elvish or
    /// powershell (see docs/install.md).
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Write the manual pages, jext4(1) and one per command
    /// (jext4-mount(1), ...), into DIR.
    Man {
        #[arg(value_name = "DIR")]
        dir: PathBuf,
    },
    /// Unmount; returns after the server has written everything and exited.
    Umount {
        mountpoint: PathBuf,
        /// Give up waiting for the server after this many seconds.
        #[arg(long, default_value_t = 600)]
        timeout: u64,
    },
}

#[derive(clap::Args)]
struct CrashtestArgs {
    /// A workload (see --list), or `all`.
    #[arg(long, default_value = "all")]
    workload: String,
    /// Crash states to check, shared between the workloads.
    #[arg(long, default_value_t = 2000)]
    states: usize,
    /// Seed of the workloads' choices and of the crash states.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Filesystem block size: 1024 or 4096.
    #[arg(long, default_value_t = 4096)]
    block_size: u32,
    /// Images with the fast_commit feature: fsync writes fast commits.
    #[arg(long)]
    fast_commit: bool,
    /// Fast commits through ByteLog (`-o bytelog` on fast_commit images),
    /// crash states at cache-line granularity; `jext4 recover` stands in
    /// for e2fsck's and the kernel's replay, which refuse such images.
    #[arg(long)]
    bytelog: bool,
    /// With --fast-commit: one transaction scope for the whole filesystem
    /// (`-o fast_commit=global`) instead of one per directory; the oracle
    /// then expects each lane's tree to be one op's.
    #[arg(long, requires = "fast_commit")]
    fast_commit_global: bool,
    /// Workloads run with delayed allocation (`-o delalloc`); the oracle
    /// then checks files' sizes with their bytes, as of their last
    /// write-out.
    #[arg(long)]
    delalloc: bool,
    /// Images with meta_bg (no resize_inode), 256-block groups and four
    /// group descriptors to a block: several meta groups in the image.
    #[arg(long)]
    meta_bg: bool,
    /// Images whose journal is on a device of its own (`mke2fs -J
    /// device=`); e2fsck and the kernel get it as a loop device.
    #[arg(long, conflicts_with = "bytelog")]
    external_journal: bool,
    /// Images with inline_data: small files and directories live in their
    /// inodes, and move to blocks as they grow (full commits only: jext4
    /// writes no fast commits there yet).
    #[arg(long, conflicts_with = "bytelog")]
    inline_data: bool,
    /// Images with user, group and project quotas (quota, project; large
    /// xattr values in EA inodes count for their owners): e2fsck checks
    /// every state's usage counts (full commits only: jext4 writes no fast
    /// commits there yet).
    #[arg(long, conflicts_with = "bytelog")]
    quota: bool,
    /// Images with casefold (utf8, strict) and a casefolded root, which
    /// every directory the workloads make inherits: e2fsck checks every
    /// state's htree hashes of folded names.
    #[arg(long)]
    casefold: bool,
    /// Workloads run with file data journaled (`-o data=journal`); the
    /// oracle then holds each file to one version whole, never a mix of
    /// an overwrite's old and new blocks.
    #[arg(long, conflicts_with_all = ["bytelog", "fast_commit", "delalloc"])]
    data_journal: bool,
    /// Images with bigalloc (clusters of 4 blocks): e2fsck checks every
    /// state's cluster bitmaps and cluster allocation rules (full commits
    /// only: jext4 writes no fast commits there yet).
    #[arg(long, conflicts_with_all = ["bytelog", "fast_commit"])]
    bigalloc: bool,
    /// Check only this state of each workload (as a failure names it).
    #[arg(long)]
    state: Option<usize>,
    /// Keep each failing state's disk, the base image and the log
    /// (dm-log-writes format) in this directory.
    #[arg(long, value_name = "DIR")]
    keep: Option<PathBuf>,
    /// Run e2fsck -fn after jext4's recovery on every N-th state (0: never).
    #[arg(long, default_value_t = 1, value_name = "N")]
    fsck_every: usize,
    /// Replay with e2fsck -E journal_only, then check, every N-th state.
    #[arg(long, default_value_t = 4, value_name = "N")]
    replay_every: usize,
    /// Replay with a kernel loop mount, then check, every N-th state (needs root).
    #[arg(long, default_value_t = 100, value_name = "N")]
    kernel_every: usize,
    /// List the workloads and exit.
    #[arg(long)]
    list: bool,
}

fn main() -> ExitCode {
    // `mount -t fuse.jext4`, fstab and systemd call jext4 as a mount helper.
    let args: Vec<String> = std::env::args().collect();
    let cli = match jext4::engine::fuse::helper::helper_call(&args) {
        None => Cli::parse(),
        Some(Ok(jext4::engine::fuse::helper::HelperCall::Mount(mount))) => {
            Cli::parse_from(std::iter::once("jext4".to_string()).chain(mount))
        }
        Some(Ok(jext4::engine::fuse::helper::HelperCall::Fake)) => return ExitCode::SUCCESS,
        Some(Err(message)) => {
            eprintln!("jext4: {message}");
            return ExitCode::FAILURE;
        }
    };
    let result = match cli.command {
        Command::Crashtest(args) => return crashtest(&args),
        Command::Tools(command) => return tools::run(command),
        Command::Mount {
            options,
            foreground,
            log,
            image,
            mountpoint,
        } => mount(&options, foreground, log, &image, &mountpoint),
        Command::Umount {
            mountpoint,
            timeout,
        } => umount(&mountpoint, Duration::from_secs(timeout)),
        Command::Recover { image, sb, journal } => recover(&image, sb, journal.as_deref()),
        Command::Stats {
            mountpoint,
            json,
            sb,
        } => stats(&mountpoint, json, sb),
        Command::Sync { mountpoints } => sync(&mountpoints),
        Command::Completions { shell } => {
            let mut command = <Cli as clap::CommandFactory>::command();
            clap_complete::generate(shell, &mut command, "jext4", &mut std::io::stdout());
            Ok(())
        }
        Command::Man { dir } => man_pages(&dir),
        Command::Logdump { image, sb, journal } => {
            let stdout = std::io::stdout();
            let sb = sb.unwrap_or(jext4::engine::format::superblock::PRIMARY_SB_OPTION);
            match jext4::engine::fs::logdump_image_from(
                &image,
                sb,
                journal.as_deref(),
                &mut stdout.lock(),
            ) {
                // The reader stopped early (| head): not an error.
                Err(jext4::Error::Io(error)) if error.kind() == std::io::ErrorKind::BrokenPipe => {
                    Ok(())
                }
                result => result.map_err(|e| format!("{}: {e}", image.display())),
            }
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("jext4: {message}");
            ExitCode::FAILURE
        }
    }
}

/// `jext4 man DIR`: jext4.1 and a page per command, as `man` finds them
/// under `DIR` when it is a `man1` directory.
fn man_pages(dir: &Path) -> Result<(), String> {
    let command = <Cli as clap::CommandFactory>::command();
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    clap_mangen::generate_to(command, dir).map_err(|e| format!("{}: {e}", dir.display()))
}

fn crashtest_config(args: &CrashtestArgs) -> Result<jext4::engine::crash::Config, String> {
    use jext4::engine::crash::{Config, Sampling, WORKLOADS, workloads};
    if args.block_size != 1024 && args.block_size != 4096 {
        return Err(format!(
            "--block-size {}: use 1024 or 4096",
            args.block_size
        ));
    }
    let chosen = if args.workload == "all" {
        WORKLOADS.iter().collect()
    } else {
        let names: Vec<&str> = WORKLOADS.iter().map(|w| w.name).collect();
        let workload = workloads::find(&args.workload).ok_or_else(|| {
            format!(
                "no workload {}; there are: all, {}",
                args.workload,
                names.join(", ")
            )
        })?;
        vec![workload]
    };
    let mut config = Config::new(chosen, args.block_size, args.states.max(1), args.seed);
    config.sampling = Sampling {
        fsck_every: args.fsck_every,
        replay_every: args.replay_every,
        kernel_every: args.kernel_every,
    };
    config.only_state = args.state;
    config.keep = args.keep.clone();
    config.fast_commit = args.fast_commit;
    config.bytelog = args.bytelog;
    config.fast_commit_global = args.fast_commit_global;
    config.delalloc = args.delalloc;
    config.meta_bg = args.meta_bg;
    config.inline_data = args.inline_data;
    config.quota = args.quota;
    config.casefold = args.casefold;
    config.data_journal = args.data_journal;
    config.bigalloc = args.bigalloc;
    config.external_journal = args.external_journal;
    Ok(config)
}

/// `jext4 crashtest`: progress on the terminal, failures as they come, and
/// one last line `crashtest: N states, F failures`; exit 1 on any failure.
fn crashtest(args: &CrashtestArgs) -> ExitCode {
    if args.list {
        for workload in jext4::engine::crash::WORKLOADS {
            println!("{:<14}{}", workload.name, workload.about);
        }
        return ExitCode::SUCCESS;
    }
    let config = match crashtest_config(args) {
        Ok(config) => config,
        Err(message) => {
            eprintln!("jext4: {message}");
            return ExitCode::FAILURE;
        }
    };
    let bar = indicatif::ProgressBar::new(config.states as u64);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{elapsed_precise} [{bar:30}] {pos}/{len} states, {msg}",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
        .progress_chars("=> "),
    );
    let mut failures = 0usize;
    let result = jext4::engine::crash::run(&config, &mut |progress| match progress {
        jext4::engine::crash::Progress::Scenario {
            workload, scenario, ..
        } => bar.set_message(format!("{workload}: {scenario}, {failures} failures")),
        jext4::engine::crash::Progress::State => bar.inc(1),
        jext4::engine::crash::Progress::Failure(failure) => {
            failures += 1;
            // Shown even when the bar is hidden (output is not a terminal).
            bar.suspend(|| eprintln!("{failure}\n"));
        }
    });
    bar.finish_and_clear();
    match result {
        Ok(summary) => {
            let counts: Vec<String> = summary
                .per_workload
                .iter()
                .map(|(name, states)| format!("{name} {states}"))
                .collect();
            println!("states per workload: {}", counts.join(", "));
            println!(
                "block size {}{}, seed {}: jext4 recovery and model check on every state; \
                 e2fsck -fn on {}, {} on {}{}, {} on {}{} ({:.1?})",
                config.block_size,
                match (
                    config.fast_commit,
                    config.bytelog,
                    config.fast_commit_global
                ) {
                    (_, true, _) => ", ByteLog fast commits per directory",
                    (true, false, false) => ", fast commits per directory",
                    (true, false, true) => ", fast commits of one global scope",
                    (false, false, _) => "",
                },
                config.seed,
                summary.fsck_runs,
                if config.bytelog {
                    "jext4 recover"
                } else {
                    "e2fsck replay"
                },
                summary.replay_runs,
                if summary.replay_skipped > 0 {
                    format!(
                        " (not on {} e2fsck 1.47 cannot replay)",
                        summary.replay_skipped
                    )
                } else {
                    String::new()
                } + &if summary.replay_orphans > 0 {
                    format!(
                        " ({} of them not compared byte for byte with jext4 recover: e2fsck released orphans in place)",
                        summary.replay_orphans
                    )
                } else {
                    String::new()
                },
                if config.bytelog {
                    "kernel refusal and read after recover"
                } else {
                    "kernel replay"
                },
                summary.kernel_runs,
                match (&summary.kernel_skipped, &summary.kernel_verity_skipped) {
                    (Some(why), _) => format!(" (kernel skipped: {why})"),
                    (None, Some(why)) =>
                        format!(" (kernel skipped for the verity workload: {why})"),
                    (None, None) => String::new(),
                },
                summary.elapsed
            );
            println!(
                "crashtest: {} states, {} failures",
                summary.states,
                summary.failures.len()
            );
            if summary.failures.is_empty() {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(message) => {
            eprintln!("jext4: crashtest: {message}");
            println!("crashtest: 0 states, 1 failures");
            ExitCode::FAILURE
        }
    }
}

/// The canonical path of a mount point, or a message saying what is wrong
/// with it — a dead FUSE mount (its server was killed) named as such, with
/// what to run.
fn canonical_mountpoint(mountpoint: &Path) -> Result<PathBuf, String> {
    let describe = |error: std::io::Error| {
        if is_dead_mount(&error) {
            dead_mount_message(mountpoint)
        } else {
            format!("mountpoint {}: {error}", mountpoint.display())
        }
    };
    let path = mountpoint.canonicalize().map_err(describe)?;
    // realpath(3) does not look inside the last component; stat does.
    std::fs::metadata(&path).map_err(describe)?;
    Ok(path)
}

/// What the kernel answers for a FUSE mount whose server is gone:
/// ENOTCONN, or ECONNABORTED for a request caught by the abort itself.
fn is_dead_mount(error: &std::io::Error) -> bool {
    matches!(
        error.raw_os_error(),
        Some(libc::ENOTCONN | libc::ECONNABORTED)
    )
}

/// Whether the mount at `mountpoint` is a FUSE mount whose server is gone.
/// statfs always reaches the server (stat may be answered from the
/// kernel's attribute cache).
fn mount_is_dead(mountpoint: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(path) = std::ffi::CString::new(mountpoint.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: statvfs fills the zeroed struct we pass.
    let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: a valid path and a pointer to a live struct.
    let result = unsafe { libc::statvfs(path.as_ptr(), &mut stat) };
    result != 0 && is_dead_mount(&std::io::Error::last_os_error())
}

fn dead_mount_message(mountpoint: &Path) -> String {
    format!(
        "{0} is a dead FUSE mount: its server is gone (killed?), the kernel still holds the mount. \
         Run `jext4 umount {0}` (or `fusermount3 -u {0}`), then mount again; the journal is replayed then",
        mountpoint.display()
    )
}

/// The pid a server wrote for `mountpoint`, if any.
fn server_pid(mountpoint: &Path) -> Option<i32> {
    serve::ServerRecord::read(mountpoint).map(|record| record.pid)
}

/// How long a mount waits for the previous server of its image or mount
/// point to finish an unmount (its last commit and checkpoint).
const PREVIOUS_SERVER_WAIT: Duration = Duration::from_secs(60);

/// After `fusermount3 -u` or `umount` the kernel has unmounted at once, but
/// the server is still writing its last commit and holds the image: wait
/// for it rather than refuse the image as in use (test suites and systemd
/// cycle mounts exactly like this).
fn wait_for_previous_server(image: &Path, mountpoint: &Path) -> Result<(), String> {
    let started = Instant::now();
    let mut announced = false;
    loop {
        let finishing = serve::finishing_servers(image, mountpoint);
        let Some(previous) = finishing.first() else {
            return Ok(());
        };
        // An unmount usually finishes within milliseconds: say nothing
        // then (mount(8) prints nothing either, and scripts such as
        // fstests compare what a mount prints); a longer write-back gets
        // a line.
        if !announced && started.elapsed() >= Duration::from_secs(1) {
            eprintln!(
                "jext4: waiting for the previous server (pid {}, unmounted from {}) to finish writing {}",
                previous.pid,
                previous.mountpoint.display(),
                previous.image.display()
            );
            announced = true;
        }
        if started.elapsed() > PREVIOUS_SERVER_WAIT {
            return Err(format!(
                "the previous server (pid {}) of {} is still writing after {}s",
                previous.pid,
                previous.image.display(),
                PREVIOUS_SERVER_WAIT.as_secs()
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `name value` lines as one JSON object: integers (the budget's balance
/// may be negative) and booleans as such, anything else as a string.
fn stats_json(report: &str) -> String {
    let fields: Vec<String> = report
        .lines()
        .filter_map(|line| line.split_once(' '))
        .map(|(name, value)| {
            let number = value.parse::<u64>().is_ok() || value.parse::<i64>().is_ok();
            let value = if value == "true" || value == "false" || number {
                value.to_string()
            } else {
                json_string(value)
            };
            format!("{}: {value}", json_string(name))
        })
        .collect();
    format!("{{{}}}", fields.join(", "))
}

fn json_string(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn stats(mountpoint: &Path, json: bool, sb: Option<u64>) -> Result<(), String> {
    let report = stats_report(mountpoint, sb)?;
    if json {
        println!("{}", stats_json(&report));
    } else {
        print!("{report}");
    }
    Ok(())
}

/// The report of `jext4 stats`, `mounted` first.
fn stats_report(mountpoint: &Path, sb: Option<u64>) -> Result<String, String> {
    let is_image = jext4::engine::dev::is_nbd_uri(&mountpoint.to_string_lossy())
        || std::fs::metadata(mountpoint).is_ok_and(|m| !m.is_dir());
    if is_image {
        // A live server's image lags its journal and cache: the figures
        // would be stale, so send the user to the live ones.
        let holders = jext4::engine::dev::exclusive::flock_holders(mountpoint);
        if let Some(holder) = holders.first() {
            return Err(format!(
                "{} is in use by {holder}: `jext4 stats MOUNTPOINT` gives its live statistics",
                mountpoint.display()
            ));
        }
        let sb = sb.unwrap_or(jext4::engine::format::superblock::PRIMARY_SB_OPTION);
        let report = jext4::engine::fs::image_stats_from(mountpoint, sb)
            .map_err(|error| format!("{}: {error}", mountpoint.display()))?;
        return Ok(format!("mounted false\n{report}"));
    }
    let mountpoint = canonical_mountpoint(mountpoint)?;
    // After an unmount the server's last report stays readable, marked as
    // such; a dead server's report is stale, and is refused.
    if sb.is_some() {
        return Err(format!(
            "{}: --sb reads a superblock copy of an image, not of a mount",
            mountpoint.display()
        ));
    }
    let mounted = serve::is_mount_point(&mountpoint);
    if mounted && mount_is_dead(&mountpoint) {
        return Err(dead_mount_message(&mountpoint));
    }
    if mounted {
        // Live, from the server itself.
        match jext4::engine::fuse::control::stats(&mountpoint) {
            Ok(report) => return Ok(format!("mounted true\n{report}")),
            // Not a jext4 mount: say so below.
            Err(error) if error.raw_os_error() == Some(libc::ENOTTY) => {}
            Err(error) => return Err(format!("{}: {error}", mountpoint.display())),
        }
    }
    let path = serve::runtime_file(&mountpoint, "stats");
    let report = std::fs::read_to_string(&path).map_err(|_| {
        format!(
            "{}: no statistics (not a jext4 mount?)",
            mountpoint.display()
        )
    })?;
    Ok(format!("mounted {mounted}\n{report}"))
}

/// `jext4 sync`: one commit-and-wait per mount, through the server.
fn sync(mountpoints: &[PathBuf]) -> Result<(), String> {
    let targets = if mountpoints.is_empty() {
        serve::jext4_mounts()
    } else {
        let mut targets = Vec::new();
        for mountpoint in mountpoints {
            targets.push(canonical_mountpoint(mountpoint)?);
        }
        targets
    };
    let mut failed = Vec::new();
    for mountpoint in &targets {
        if let Err(error) = jext4::engine::fuse::control::sync(mountpoint) {
            let why = match error.raw_os_error() {
                Some(libc::ENOTTY) => {
                    "its server does not answer `jext4 sync` (not jext4, or an older one)"
                        .to_string()
                }
                _ => error.to_string(),
            };
            failed.push(format!("{}: {why}", mountpoint.display()));
        }
    }
    if failed.is_empty() {
        Ok(())
    } else {
        Err(format!("sync failed: {}", failed.join("; ")))
    }
}

fn recover(image: &Path, sb: Option<u64>, journal: Option<&Path>) -> Result<(), String> {
    let sb = sb.unwrap_or(jext4::engine::format::superblock::PRIMARY_SB_OPTION);
    match jext4::engine::fs::recover_image_from(image, sb, journal)
        .map_err(|e| format!("{}: {e}", image.display()))?
    {
        None => println!("{}: the journal needs no recovery", image.display()),
        Some(recovered) => {
            let report = &recovered.journal;
            println!(
                "{}: replayed {} transactions ({} blocks, {} revoke records), journal reset at transaction {}",
                image.display(),
                report.transactions_replayed,
                report.blocks_replayed,
                report.revoke_records,
                report.next_tid
            );
            if recovered.orphans_released {
                println!(
                    "{}: released the orphan inodes the crash left",
                    image.display()
                );
            }
        }
    }
    Ok(())
}

fn init_logging(log: Option<&Path>) {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let filter = tracing_subscriber::EnvFilter::try_from_env("JEXT4_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_target(false);
    // fuser's refused answers to interrupts are not errors (fuse/interrupts.rs).
    let quiet = jext4::engine::fuse::interrupts::UnmatchedReplies;
    match log.and_then(|path| {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .ok()
    }) {
        Some(file) => builder
            .with_ansi(false)
            .with_writer(std::sync::Mutex::new(file))
            .finish()
            .with(quiet)
            .init(),
        None => builder
            .with_writer(std::io::stderr)
            .finish()
            .with(quiet)
            .init(),
    }
}

fn mount(
    options: &[String],
    foreground: bool,
    log: Option<PathBuf>,
    image: &Path,
    mountpoint: &Path,
) -> Result<(), String> {
    let (engine_options, fuse_options) = parse_mount_options(options).map_err(|e| e.to_string())?;
    if !jext4::engine::dev::is_nbd_uri(&image.to_string_lossy()) && !image.exists() {
        return Err(format!("{}: no such file or device", image.display()));
    }
    let mountpoint = canonical_mountpoint(mountpoint)?;
    if !mountpoint.is_dir() {
        return Err(format!(
            "mountpoint {} is not a directory",
            mountpoint.display()
        ));
    }
    if serve::is_mount_point(&mountpoint) {
        if mount_is_dead(&mountpoint) {
            return Err(dead_mount_message(&mountpoint));
        }
        return Err(format!("{} is already a mount point", mountpoint.display()));
    }
    wait_for_previous_server(image, &mountpoint)?;
    let runtime = serve::runtime_dir();
    std::fs::create_dir_all(&runtime).map_err(|e| format!("{}: {e}", runtime.display()))?;
    let log = log.or_else(|| (!foreground).then(|| serve::runtime_file(&mountpoint, "log")));
    if foreground {
        init_logging(log.as_deref());
        return run_server(engine_options, fuse_options, image, &mountpoint, || {});
    }
    // Background: the child serves; the parent waits on a pipe for "ready"
    // or for the error that stopped the mount, so that the command's exit
    // status says whether the mount happened.
    let mut fds = [0; 2];
    // SAFETY: pipe writes two descriptors into the array we pass.
    if unsafe { libc::pipe(fds.as_mut_ptr()) } != 0 {
        return Err(format!("pipe: {}", std::io::Error::last_os_error()));
    }
    // SAFETY: no other thread exists yet (nothing above spawns one), so the
    // child starts from a consistent copy of this single thread.
    match unsafe { libc::fork() } {
        -1 => Err(format!("fork: {}", std::io::Error::last_os_error())),
        0 => {
            // SAFETY: fds[0] is ours to close; setsid detaches the terminal.
            unsafe {
                libc::close(fds[0]);
                libc::setsid();
            }
            // SAFETY: fds[1] is an open descriptor owned by nobody else.
            let mut to_parent = unsafe { std::fs::File::from_raw_fd(fds[1]) };
            redirect_standard_streams();
            init_logging(log.as_deref());
            let result = run_server(engine_options, fuse_options, image, &mountpoint, || {
                let _ = to_parent.write_all(b"ready\n");
            });
            if let Err(message) = &result {
                let _ = to_parent.write_all(format!("error: {message}\n").as_bytes());
            }
            std::process::exit(if result.is_ok() { 0 } else { 1 });
        }
        _child => {
            // SAFETY: fds[1] belongs to the child now; fds[0] is ours.
            unsafe { libc::close(fds[1]) };
            let mut from_child = unsafe { std::fs::File::from_raw_fd(fds[0]) };
            let mut first_line = String::new();
            let mut byte = [0u8; 1];
            while let Ok(1) = from_child.read(&mut byte) {
                if byte[0] == b'\n' {
                    break;
                }
                first_line.push(byte[0] as char);
            }
            match first_line.as_str() {
                "ready" => Ok(()),
                "" => Err("the server exited before the mount was ready".into()),
                line => Err(line.trim_start_matches("error: ").to_string()),
            }
        }
    }
}

fn redirect_standard_streams() {
    let null = std::ffi::CString::new("/dev/null").unwrap();
    // SAFETY: open/dup2 on descriptors this process owns.
    unsafe {
        let fd = libc::open(null.as_ptr(), libc::O_RDWR);
        if fd >= 0 {
            libc::dup2(fd, 0);
            libc::dup2(fd, 1);
            libc::dup2(fd, 2);
            if fd > 2 {
                libc::close(fd);
            }
        }
    }
}

fn run_server(
    engine_options: jext4::engine::fs::MountOptions,
    fuse_options: jext4::engine::fuse::FuseOptions,
    image: &Path,
    mountpoint: &Path,
    ready: impl FnOnce(),
) -> Result<(), String> {
    let read_only = engine_options.read_only;
    serve::log_panics();
    // Before any thread starts (the engine starts its flusher), so that
    // every thread inherits the blocked signal mask.
    stop_on_signals(mountpoint.to_path_buf());
    let fs = Fs::open(image, engine_options).map_err(|e| format!("{}: {e}", image.display()))?;
    let source = std::path::absolute(image).unwrap_or_else(|_| image.to_path_buf());
    let config = serve::fuse_config(&fuse_options, read_only || fs.is_read_only(), &source);
    let record = serve::ServerRecord {
        pid: std::process::id() as i32,
        mountpoint: mountpoint.to_path_buf(),
        image: std::path::absolute(image).unwrap_or_else(|_| image.to_path_buf()),
    };
    let status_file = serve::runtime_file(mountpoint, "status");
    let _ = std::fs::remove_file(&status_file);
    let result = serve::serve(fs, mountpoint, &fuse_options, &config, || {
        let _ = record.write();
        tracing::info!(image = %image.display(), mountpoint = %mountpoint.display(), "mounted");
        // Test builds: panics a test asked for, once the mount is up.
        jext4::engine::faults::arm_panics_from_env();
        ready();
    });
    let status = match &result {
        Ok(()) => "ok\n".to_string(),
        Err(error) => format!("error: {error}\n"),
    };
    let _ = std::fs::write(&status_file, status);
    record.remove();
    match &result {
        Ok(()) => tracing::info!("unmounted cleanly"),
        Err(error) => tracing::error!(%error, "server stopped with an error"),
    }
    result.map_err(|e| e.to_string())
}

/// SIGINT and SIGTERM unmount the filesystem, which ends the session and
/// lets the server finish writing; they never kill it mid-write. While the
/// mount is busy (a file open, a working directory inside) the unmount is
/// retried every second until it is free, each retry logged; further
/// signals are logged too.
fn stop_on_signals(mountpoint: PathBuf) {
    // SAFETY: sigset manipulation on a local set; blocking the signals in
    // this thread before any other thread exists makes every later thread
    // inherit the mask, so only the waiting thread receives them.
    let set = unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    };
    let spawned = std::thread::Builder::new()
        .name("jext4-signals".into())
        .spawn(move || {
            let mut signal = 0;
            // SAFETY: sigwait on a valid set with a valid out-pointer.
            if unsafe { libc::sigwait(&set, &mut signal) } == 0 {
                tracing::info!(signal, "signal received: unmounting");
                unmount_when_free(&mountpoint, &set);
            }
        });
    if let Err(error) = spawned {
        tracing::error!(%error, "cannot watch for signals: SIGINT and SIGTERM will not unmount");
    }
}

/// Unmount now, or as soon as the mount is no longer busy.
fn unmount_when_free(mountpoint: &Path, set: &libc::sigset_t) {
    const RETRY: Duration = Duration::from_secs(1);
    for attempt in 1u64.. {
        match detach_once(mountpoint) {
            Detach::Done => return,
            Detach::Gone => {
                tracing::info!(mountpoint = %mountpoint.display(), "already unmounted");
                return;
            }
            Detach::Busy(why) => tracing::warn!(
                attempt,
                mountpoint = %mountpoint.display(),
                "cannot unmount yet ({why}): a file is open or a process works inside; \
                 retrying every second until the mount is free"
            ),
        }
        // Sleep a second, or less if another signal comes.
        let timeout = libc::timespec {
            tv_sec: RETRY.as_secs() as libc::time_t,
            tv_nsec: 0,
        };
        // SAFETY: sigtimedwait on a valid set, a null info pointer and a
        // valid timeout.
        let signal = unsafe { libc::sigtimedwait(set, std::ptr::null_mut(), &timeout) };
        if signal > 0 {
            tracing::info!(signal, "signal received again: still unmounting");
        }
    }
}

/// What one unmount attempt did.
enum Detach {
    Done,
    /// Nothing is mounted there any more (someone else unmounted).
    Gone,
    Busy(String),
}

/// One unmount attempt: the syscall as root, fusermount3 otherwise.
fn detach_once(mountpoint: &Path) -> Detach {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(mountpoint.as_os_str().as_bytes()).unwrap_or_default();
    // SAFETY: umount2 with a valid NUL-terminated path.
    if unsafe { libc::umount2(path.as_ptr(), 0) } == 0 {
        return Detach::Done;
    }
    let error = std::io::Error::last_os_error();
    match error.raw_os_error() {
        Some(libc::EINVAL | libc::ENOENT) if !serve::is_mount_point(mountpoint) => Detach::Gone,
        Some(libc::EPERM) => {
            // Not root: the setuid helper.
            match std::process::Command::new("fusermount3")
                .arg("-u")
                .arg(mountpoint)
                .output()
            {
                Ok(output) if output.status.success() => Detach::Done,
                Ok(output) => {
                    Detach::Busy(String::from_utf8_lossy(&output.stderr).trim().to_string())
                }
                Err(error) => Detach::Busy(format!("fusermount3: {error}")),
            }
        }
        _ => Detach::Busy(error.to_string()),
    }
}

/// Unmount a FUSE mount point (`jext4 umount`). A file closed just before
/// may still hold the mount: the kernel sends FUSE RELEASE asynchronously
/// and keeps the mount busy until the server answers it. So a busy mount
/// is retried for a short while before it is reported.
fn detach(mountpoint: &Path) -> Result<(), String> {
    let mut last = String::new();
    for _ in 0..50 {
        match detach_once(mountpoint) {
            Detach::Done | Detach::Gone => return Ok(()),
            Detach::Busy(why) => last = why,
        }
        std::thread::sleep(Duration::from_millis(40));
    }
    Err(last)
}

fn umount(mountpoint: &Path, timeout: Duration) -> Result<(), String> {
    let resolved = mountpoint
        .canonicalize()
        .and_then(|path| std::fs::metadata(&path).map(|_| path));
    let mountpoint = match resolved {
        Ok(path) => path,
        // A dead FUSE mount cannot be resolved, but it can be unmounted.
        Err(error) if is_dead_mount(&error) => {
            let path = std::path::absolute(mountpoint).map_err(|e| e.to_string())?;
            detach(&path).map_err(|why| format!("cannot unmount {}: {why}", path.display()))?;
            eprintln!(
                "jext4: unmounted the dead FUSE mount {}; its image may need its journal replayed \
                 (the next mount does it)",
                path.display()
            );
            return Ok(());
        }
        Err(error) => return Err(format!("{}: {error}", mountpoint.display())),
    };
    let pid = server_pid(&mountpoint);
    if !serve::is_mount_point(&mountpoint) {
        return Err(format!("{} is not mounted", mountpoint.display()));
    }
    if let Err(why) = detach(&mountpoint) {
        return Err(format!("cannot unmount {}: {why}", mountpoint.display()));
    }
    let Some(pid) = pid else {
        return Ok(()); // not ours, or started elsewhere: nothing to wait for
    };
    let started = Instant::now();
    while serve::process_alive(pid) {
        if started.elapsed() > timeout {
            return Err(format!(
                "server {pid} is still writing after {}s",
                timeout.as_secs()
            ));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let status_file = serve::runtime_file(&mountpoint, "status");
    let status = std::fs::read_to_string(&status_file).unwrap_or_default();
    let _ = std::fs::remove_file(&status_file);
    match status.trim() {
        "ok" | "" => Ok(()),
        error => Err(format!(
            "server reported: {}",
            error.trim_start_matches("error: ")
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::stats_json;

    #[test]
    fn stats_json_keeps_integers_and_booleans_as_such() {
        let report = "budget_blocks 12\nbudget_balance -5\nread_only false\nper_commit 0.50\nreason a \"b\"\n";
        assert_eq!(
            stats_json(report),
            r#"{"budget_blocks": 12, "budget_balance": -5, "read_only": false, "per_commit": "0.50", "reason": "a \"b\""}"#
        );
    }
}
