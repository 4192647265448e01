//! The `jext4` command: mount and unmount images through FUSE; replay and
//! print journals; try every crash state of the crash-test workloads.

use clap::{Parser, Subcommand};
use jext4::fs::Fs;
use jext4::fuse::{parse_mount_options, serve};
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
        /// Mount options, comma-separated (ro, rw, allow_other, cache_size=256M, commit=5, sync, ...).
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
    Recover { image: PathBuf },
    /// Print the journal's transactions, descriptor tags, revokes and commits.
    Logdump { image: PathBuf },
    /// Try the crash states of workloads: each must recover clean and lose
    /// nothing acknowledged (see README "Crash states").
    Crashtest(CrashtestArgs),
    /// Print a mounted filesystem's statistics (cache, journal, write-ahead guard).
    Stats { mountpoint: PathBuf },
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
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Crashtest(args) => return crashtest(&args),
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
        Command::Recover { image } => recover(&image),
        Command::Stats { mountpoint } => stats(&mountpoint),
        Command::Logdump { image } => {
            let stdout = std::io::stdout();
            match jext4::fs::logdump_image(&image, &mut stdout.lock()) {
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

fn crashtest_config(args: &CrashtestArgs) -> Result<jext4::crash::Config, String> {
    use jext4::crash::{Config, Sampling, WORKLOADS, workloads};
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
    Ok(config)
}

/// `jext4 crashtest`: progress on the terminal, failures as they come, and
/// one last line `crashtest: N states, F failures`; exit 1 on any failure.
fn crashtest(args: &CrashtestArgs) -> ExitCode {
    if args.list {
        for workload in jext4::crash::WORKLOADS {
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
    let result = jext4::crash::run(&config, &mut |progress| match progress {
        jext4::crash::Progress::Scenario {
            workload, scenario, ..
        } => bar.set_message(format!("{workload}: {scenario}, {failures} failures")),
        jext4::crash::Progress::State => bar.inc(1),
        jext4::crash::Progress::Failure(failure) => {
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
                match (config.fast_commit, config.bytelog) {
                    (_, true) => ", ByteLog fast commits",
                    (true, false) => ", fast commits",
                    (false, false) => "",
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
                },
                if config.bytelog {
                    "kernel refusal and read after recover"
                } else {
                    "kernel replay"
                },
                summary.kernel_runs,
                summary
                    .kernel_skipped
                    .as_ref()
                    .map_or(String::new(), |why| format!(" (kernel skipped: {why})")),
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

fn stats(mountpoint: &Path) -> Result<(), String> {
    let mountpoint = mountpoint
        .canonicalize()
        .map_err(|e| format!("{}: {e}", mountpoint.display()))?;
    let path = serve::runtime_file(&mountpoint, "stats");
    let report = std::fs::read_to_string(&path).map_err(|_| {
        format!(
            "{}: no statistics (not a jext4 mount?)",
            mountpoint.display()
        )
    })?;
    print!("{report}");
    Ok(())
}

fn recover(image: &Path) -> Result<(), String> {
    match jext4::fs::recover_image(image).map_err(|e| format!("{}: {e}", image.display()))? {
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
    let filter = tracing_subscriber::EnvFilter::try_from_env("JEXT4_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_target(false);
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
            .init(),
        None => builder.with_writer(std::io::stderr).init(),
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
    if !jext4::dev::is_nbd_uri(&image.to_string_lossy()) && !image.exists() {
        return Err(format!("{}: no such file or device", image.display()));
    }
    let mountpoint = mountpoint
        .canonicalize()
        .map_err(|e| format!("mountpoint {}: {e}", mountpoint.display()))?;
    if !mountpoint.is_dir() {
        return Err(format!(
            "mountpoint {} is not a directory",
            mountpoint.display()
        ));
    }
    if serve::is_mount_point(&mountpoint) {
        return Err(format!("{} is already a mount point", mountpoint.display()));
    }
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
    engine_options: jext4::fs::MountOptions,
    fuse_options: jext4::fuse::FuseOptions,
    image: &Path,
    mountpoint: &Path,
    ready: impl FnOnce(),
) -> Result<(), String> {
    let read_only = engine_options.read_only;
    // Before any thread starts (the engine starts its flusher), so that
    // every thread inherits the blocked signal mask.
    stop_on_signals(mountpoint.to_path_buf());
    let fs = Fs::open(image, engine_options).map_err(|e| format!("{}: {e}", image.display()))?;
    let config = serve::fuse_config(&fuse_options, read_only || fs.is_read_only(), image);
    let pid_file = serve::runtime_file(mountpoint, "pid");
    let status_file = serve::runtime_file(mountpoint, "status");
    let _ = std::fs::remove_file(&status_file);
    let result = serve::serve(fs, mountpoint, &config, || {
        let _ = std::fs::write(&pid_file, format!("{}\n", std::process::id()));
        tracing::info!(image = %image.display(), mountpoint = %mountpoint.display(), "mounted");
        ready();
    });
    let status = match &result {
        Ok(()) => "ok\n".to_string(),
        Err(error) => format!("error: {error}\n"),
    };
    let _ = std::fs::write(&status_file, status);
    let _ = std::fs::remove_file(&pid_file);
    match &result {
        Ok(()) => tracing::info!("unmounted cleanly"),
        Err(error) => tracing::error!(%error, "server stopped with an error"),
    }
    result.map_err(|e| e.to_string())
}

/// SIGINT and SIGTERM unmount the filesystem, which ends the session and
/// lets the server finish writing; they never kill it mid-write.
fn stop_on_signals(mountpoint: PathBuf) {
    // SAFETY: sigset manipulation on a local set; blocking the signals in
    // this thread before any other thread exists makes every later thread
    // inherit the mask, so only the waiting thread receives them.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        std::thread::spawn(move || {
            let mut signal = 0;
            if libc::sigwait(&set, &mut signal) == 0 {
                tracing::info!(signal, "signal received: unmounting");
                detach(&mountpoint);
            }
        });
    }
}

/// Unmount a FUSE mount point: the syscall as root, fusermount3 otherwise.
fn detach(mountpoint: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(mountpoint.as_os_str().as_bytes()).unwrap_or_default();
    // A file closed just before the unmount may still hold the mount: the
    // kernel sends FUSE RELEASE asynchronously and keeps the mount busy until
    // the server answers it. So EBUSY is retried for a short while before it
    // is reported.
    for _ in 0..50 {
        // SAFETY: umount2 with a valid NUL-terminated path.
        if unsafe { libc::umount2(path.as_ptr(), 0) } == 0 {
            return true;
        }
        let error = std::io::Error::last_os_error().raw_os_error();
        if error == Some(libc::EBUSY) {
            std::thread::sleep(Duration::from_millis(40));
            continue;
        }
        if error == Some(libc::EPERM) {
            break; // not root: fusermount3 below
        }
        return false;
    }
    std::process::Command::new("fusermount3")
        .arg("-u")
        .arg(mountpoint)
        .status()
        .is_ok_and(|status| status.success())
}

/// A process that exists and is not a zombie (a foreground server whose
/// parent has not reaped it yet has finished its work).
fn process_alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the parenthesised command name.
        Ok(stat) => stat
            .rsplit_once(") ")
            .is_some_and(|(_, rest)| !rest.starts_with('Z')),
        Err(_) => false,
    }
}

fn umount(mountpoint: &Path, timeout: Duration) -> Result<(), String> {
    let mountpoint = mountpoint
        .canonicalize()
        .map_err(|e| format!("{}: {e}", mountpoint.display()))?;
    let pid: Option<i32> = std::fs::read_to_string(serve::runtime_file(&mountpoint, "pid"))
        .ok()
        .and_then(|text| text.trim().parse().ok());
    if !serve::is_mount_point(&mountpoint) {
        return Err(format!("{} is not mounted", mountpoint.display()));
    }
    if !detach(&mountpoint) {
        return Err(format!("cannot unmount {} (busy?)", mountpoint.display()));
    }
    let Some(pid) = pid else {
        return Ok(()); // not ours, or started elsewhere: nothing to wait for
    };
    let started = Instant::now();
    while process_alive(pid) {
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
