//! The image tools' verbs: `cp`, `tar` and the coreutils-like verbs on
//! `IMAGE:PATH`, each opening its image through the library (no FUSE, no
//! loop device, no root) and closing it clean. The work is the library's
//! (`jext4::engine::tools`, the crate's API); this parses, prints and sets the exit
//! status as the coreutils namesakes do.

use super::verbs;
use clap::{Args, Subcommand};
use jext4::Image;
use jext4::engine::fs::{AtimePolicy, MountOptions};
use jext4::engine::tools::{ImagePath, Progress};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// Options every verb takes.
#[derive(Args, Clone, Debug, Default)]
pub struct ImageArgs {
    /// The image that `:PATH` arguments name (an NBD URI, or any image
    /// whose name the IMAGE:PATH form cannot carry).
    #[arg(long, value_name = "IMAGE", global = true)]
    pub image: Option<PathBuf>,
    /// Bound on the engine's metadata cache (the mount's cache_size).
    #[arg(long, value_name = "SIZE", global = true, value_parser = cache_size)]
    pub cache_size: Option<u64>,
    /// Seconds between journal commits while the verb runs (the mount's
    /// commit=); the image is committed once more when it is closed.
    #[arg(long, value_name = "SECONDS", global = true)]
    pub commit: Option<u64>,
    /// Open the image from the superblock copy at N KiB (the mount's sb=,
    /// the kernel's unit): a backup's block × block size / 1024, e.g.
    /// 131072 for block 32768 of a 4 KiB-block filesystem.
    #[arg(long, value_name = "N", global = true, value_parser = sb)]
    pub sb: Option<u64>,
    /// The image's external journal (the mount's journal_path=): a device
    /// or an image file. Found by its UUID among block devices otherwise.
    #[arg(long, value_name = "PATH", global = true)]
    pub journal: Option<PathBuf>,
}

fn cache_size(text: &str) -> Result<u64, String> {
    jext4::engine::fuse::parse_size(text).map_err(|e| e.to_string())
}

pub(crate) fn sb(text: &str) -> Result<u64, String> {
    jext4::engine::fuse::parse_sb(text).map_err(|e| e.to_string())
}

#[derive(Subcommand)]
pub enum ToolCommand {
    /// Copy files and trees into an image or out of one, with cp's rules for
    /// where they land (IMAGE:PATH names a path inside an image).
    Cp(CpArgs),
    /// Extract a tar archive into an image (-x) or create one from it (-c).
    Tar(super::tar::TarArgs),
    /// List directory contents.
    Ls(verbs::LsArgs),
    /// Print files' contents.
    Cat(verbs::PathsArgs),
    /// Show entries' status.
    Stat(verbs::PathsArgs),
    /// Make directories.
    Mkdir(verbs::MkdirArgs),
    /// Remove files or directories.
    Rm(verbs::RmArgs),
    /// Move (rename) files.
    Mv(verbs::MvArgs),
    /// Make links between files.
    Ln(verbs::LnArgs),
    /// Change file mode bits.
    Chmod(verbs::ChmodArgs),
    /// Change file owner and group.
    Chown(verbs::ChownArgs),
    /// Change file timestamps, creating files that do not exist.
    Touch(verbs::TouchArgs),
    /// Get, set, list or remove extended attributes.
    Xattr(verbs::XattrArgs),
    /// fs-verity: make files verity files (enable), print their digests
    /// as `fsverity digest` does (measure).
    Verity(verbs::VerityArgs),
    /// Quotas: report each id's usage and limits (as `repquota -n`), set
    /// an id's limits (as `setquota`).
    Quota(verbs::QuotaArgs),
    /// Run verbs read one per line from standard input, in one open of IMAGE.
    Shell(verbs::ShellArgs),
}

#[derive(Args, Debug)]
pub struct CpArgs {
    /// Copy directories recursively.
    #[arg(short = 'r', short_alias = 'R', long = "recursive")]
    pub recursive: bool,
    /// Keep everything: modes, owners, nanosecond times, hard links,
    /// symlinks, devices, FIFOs, holes, xattrs and ACLs (implies -r).
    #[arg(short = 'a', long = "archive")]
    pub archive: bool,
    /// Say what is being done.
    #[arg(short = 'v', long)]
    pub verbose: bool,
    /// Give every entry this owner (numbers).
    #[arg(long, value_name = "UID:GID", value_parser = owner)]
    pub owner: Option<(u32, u32)>,
    /// No time later than this (seconds since the epoch); SOURCE_DATE_EPOCH
    /// is used when this is not given.
    #[arg(long, value_name = "SECONDS")]
    pub mtime: Option<i64>,
    /// Threads feeding the engine (default: the CPU count).
    #[arg(short = 'j', long = "jobs", value_name = "N")]
    pub jobs: Option<usize>,
    /// Sources, then the destination.
    #[arg(required = true, num_args = 2.., value_name = "SRC... DEST")]
    pub paths: Vec<String>,
    #[command(flatten)]
    pub common: ImageArgs,
}

/// `UID:GID`, numbers.
pub fn owner(text: &str) -> Result<(u32, u32), String> {
    let (uid, gid) = text
        .split_once(':')
        .ok_or_else(|| format!("'{text}': expected UID:GID"))?;
    let number = |part: &str| {
        part.parse::<u32>()
            .map_err(|_| format!("'{part}' is not a number (expected UID:GID)"))
    };
    Ok((number(uid)?, number(gid)?))
}

/// The images a command works on, opened once each and closed clean at
/// the end (the journal committed and checkpointed, needs_recovery clear).
pub struct Session {
    /// The shell's image, or `--image`: what `:PATH` (and, in the shell, a
    /// plain path) names.
    pub default_image: Option<PathBuf>,
    /// In the shell, a path without `IMAGE:` is in the default image.
    pub plain_paths_in_image: bool,
    pub cache_size: Option<u64>,
    pub commit: Option<u64>,
    /// The superblock copy to open images from (`--sb`).
    pub sb: Option<u64>,
    /// The external journal of the images (`--journal`).
    pub journal: Option<PathBuf>,
    /// What messages start with: "jext4 " (then the verb's name), or in
    /// the shell "jext4 shell: line N: ".
    pub label: String,
    images: Vec<(PathBuf, Image)>,
}

impl Session {
    pub fn new(common: &ImageArgs) -> Session {
        Session {
            default_image: common.image.clone(),
            plain_paths_in_image: false,
            cache_size: common.cache_size,
            commit: common.commit,
            sb: common.sb,
            journal: common.journal.clone(),
            label: "jext4 ".into(),
            images: Vec::new(),
        }
    }

    /// `arg` as a path inside an image.
    pub fn image_path(&self, arg: &str) -> Option<ImagePath> {
        ImagePath::parse(arg, self.default_image.as_deref()).or_else(|| {
            match (&self.default_image, self.plain_paths_in_image) {
                (Some(image), true) => ImagePath::parse(&format!(":{arg}"), Some(image)),
                _ => None,
            }
        })
    }

    /// `arg` as cp reads it: an image path only when written `IMAGE:PATH`
    /// or `:PATH` (in the shell too, a plain path is on the host).
    pub fn cp_path(&self, arg: &str) -> Option<ImagePath> {
        ImagePath::parse(arg, self.default_image.as_deref())
    }

    /// The open image at `path`, opened now if it is not yet.
    pub fn image(&mut self, path: &Path) -> Result<&Image, String> {
        if let Some(at) = self.images.iter().position(|(p, _)| p == path) {
            return Ok(&self.images[at].1);
        }
        let mut options = MountOptions {
            // The tools read without changing what they read.
            atime: AtimePolicy::Never,
            // A verb that only reads works on an image jext4 only reads.
            read_only_fallback: true,
            ..MountOptions::default()
        };
        if let Some(size) = self.cache_size {
            options.cache_size = size;
        }
        if let Some(seconds) = self.commit {
            options.commit_interval = Duration::from_secs(seconds);
        }
        if let Some(sb) = self.sb {
            options.sb = sb;
        }
        options.journal_path = self.journal.clone();
        let image = Image::options()
            .mount_options(options)
            .umask(0)
            .open(path)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        self.images.push((path.to_path_buf(), image));
        Ok(&self.images.last().expect("just pushed").1)
    }

    /// Close every image: commit, checkpoint, mark clean.
    pub fn close(self) -> Result<(), String> {
        let mut first_error = Ok(());
        for (path, image) in self.images {
            if let Err(error) = image.close() {
                first_error = first_error.and(Err(format!("{}: {error}", path.display())));
            }
        }
        first_error
    }
}

/// The engine's warnings and errors (a corruption found, an image opened
/// read-only because of a feature) reach the verb's stderr, a line each,
/// as `jext4: MESSAGE`; `JEXT4_LOG` chooses other levels.
fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("JEXT4_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    // Another subscriber already set (a test harness) keeps its own.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .event_format(ToolLine)
        .try_init();
}

/// `jext4: MESSAGE` (the engine's fields after it), the way the verbs'
/// own messages read.
struct ToolLine;

impl<S, N> tracing_subscriber::fmt::FormatEvent<S, N> for ToolLine
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    N: for<'a> tracing_subscriber::fmt::FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        context: &tracing_subscriber::fmt::FmtContext<'_, S, N>,
        mut writer: tracing_subscriber::fmt::format::Writer<'_>,
        event: &tracing::Event<'_>,
    ) -> fmt::Result {
        write!(writer, "jext4: ")?;
        context
            .field_format()
            .format_fields(writer.by_ref(), event)?;
        writeln!(writer)
    }
}

/// Run one verb as a command of its own; its exit status.
pub fn run(command: ToolCommand) -> std::process::ExitCode {
    init_logging();
    let common = match &command {
        ToolCommand::Cp(args) => args.common.clone(),
        other => verbs::common_of(other),
    };
    let mut session = Session::new(&common);
    if let ToolCommand::Shell(args) = &command {
        return std::process::ExitCode::from(verbs::shell(args, &common));
    }
    let status = dispatch(&mut session, command);
    let closed = session.close();
    std::process::ExitCode::from(match closed {
        Ok(()) => status,
        Err(message) => {
            eprintln!("jext4: {message}");
            1
        }
    })
}

/// One verb in `session`: its exit status (messages already printed).
pub fn dispatch(session: &mut Session, command: ToolCommand) -> u8 {
    match command {
        ToolCommand::Cp(args) => cp(session, &args),
        other => verbs::run(session, other),
    }
}

/// `jext4 cp`: where each source lands follows cp (DEST an existing
/// directory: inside it; one source and DEST absent: DEST itself; several
/// sources: DEST must be a directory).
fn cp(session: &mut Session, args: &CpArgs) -> u8 {
    let (dest_arg, sources) = args.paths.split_last().expect("clap requires two paths");
    let options = jext4::engine::tools::CopyOptions {
        preserve: args.archive,
        owner: args.owner,
        clamp_time: args.mtime.or_else(source_date_epoch),
        threads: args
            .jobs
            .unwrap_or_else(jext4::engine::tools::default_threads)
            .max(1),
        umask: jext4::engine::tools::host::umask(),
    };
    let recursive = args.recursive || args.archive;
    let mut progress = Progress::default();
    if args.verbose {
        progress.verbose = Some(Box::new(|from: &str, to: &str| match from {
            "" => println!("'{to}'"),
            from => println!("'{from}' -> '{to}'"),
        }));
    }
    let dest = session.cp_path(dest_arg);
    let mut status = 0;
    let outcome = match &dest {
        Some(dest) => copy_sources_in(session, sources, dest, recursive, &options, &progress),
        None => copy_sources_out(
            session,
            sources,
            Path::new(dest_arg),
            recursive,
            &options,
            &progress,
        ),
    };
    match outcome {
        Ok(reports) => {
            for report in reports {
                for skipped in &report.skipped {
                    eprintln!("{}cp: {skipped}", session.label);
                    status = 1;
                }
                for what in &report.not_kept {
                    eprintln!("{}cp: not kept: {what}", session.label);
                }
            }
        }
        Err(message) => {
            eprintln!("{}cp: {message}", session.label);
            status = 1;
        }
    }
    status
}

pub fn source_date_epoch() -> Option<i64> {
    std::env::var("SOURCE_DATE_EPOCH").ok()?.trim().parse().ok()
}

/// The host sources into the image: one report per source copied.
fn copy_sources_in(
    session: &mut Session,
    sources: &[String],
    dest: &ImagePath,
    recursive: bool,
    options: &jext4::engine::tools::CopyOptions,
    progress: &Progress,
) -> Result<Vec<jext4::engine::tools::Report>, String> {
    if let Some(source) = sources.iter().find(|s| session.cp_path(s).is_some()) {
        return Err(format!(
            "'{source}': copying from an image into an image is not supported (use mv, or tar -c | tar -x)"
        ));
    }
    let image = session.image(&dest.image)?;
    let dest_attr = stat_path(image, dest.trimmed());
    let dest_is_dir =
        matches!(&dest_attr, Ok(attr) if attr.kind == jext4::engine::fs::FileKind::Directory);
    if sources.len() > 1 && !dest_is_dir {
        return Err(format!("target '{}' is not a directory", display(dest)));
    }
    let mut reports = Vec::new();
    let mut failed = Vec::new();
    with_progress(progress, || {
        for source in sources {
            let host = Path::new(source);
            let meta = std::fs::symlink_metadata(host);
            if let Ok(meta) = &meta
                && meta.is_dir()
                && !recursive
            {
                failed.push(format!("-r not specified; omitting directory '{source}'"));
                continue;
            }
            let target = match dest_is_dir {
                // cp's "DIR/.": the directory's contents go into the target
                // itself (Path::file_name would skip the ".").
                true if names_dot(source) => dest.trimmed().to_string(),
                true => {
                    let name = host.file_name().map(|n| n.to_string_lossy().into_owned());
                    let Some(name) = name else {
                        failed.push(format!("cannot copy '{source}': it has no name"));
                        continue;
                    };
                    jext4::engine::tools::imagepath::join(&dest.path, &name)
                }
                false => {
                    if dest.path.ends_with('/') && !matches!(&meta, Ok(m) if m.is_dir()) {
                        failed.push(format!(
                            "cannot create regular file '{}': Not a directory",
                            display(dest)
                        ));
                        continue;
                    }
                    dest.trimmed().to_string()
                }
            };
            match jext4::engine::tools::copy_in(image, host, &target, options, progress) {
                Ok(report) => reports.push(report),
                Err(failure) => {
                    failed.push(format!("{}:{failure}", dest.image.display()));
                    // The image is full or cannot be written: stop here.
                    break;
                }
            }
        }
    });
    match failed.is_empty() {
        true => Ok(reports),
        false => {
            for report in &reports {
                for skipped in &report.skipped {
                    eprintln!("{}cp: {skipped}", session.label);
                }
            }
            Err(failed.join(&format!("\n{}cp: ", session.label)))
        }
    }
}

/// Image sources onto the host.
fn copy_sources_out(
    session: &mut Session,
    sources: &[String],
    dest: &Path,
    recursive: bool,
    options: &jext4::engine::tools::CopyOptions,
    progress: &Progress,
) -> Result<Vec<jext4::engine::tools::Report>, String> {
    let parsed: Vec<ImagePath> = sources
        .iter()
        .map(|s| {
            session
                .image_path(s)
                .ok_or_else(|| format!("neither '{s}' nor '{}' is an IMAGE:PATH", dest.display()))
        })
        .collect::<Result<_, _>>()?;
    let dest_is_dir = dest.is_dir();
    if parsed.len() > 1 && !dest_is_dir {
        return Err(format!("target '{}' is not a directory", dest.display()));
    }
    let mut reports = Vec::new();
    let mut failed = Vec::new();
    for source in &parsed {
        let image = session.image(&source.image)?;
        let attr = match lstat_path(image, source.trimmed()) {
            Ok(attr) => attr,
            Err(error) => {
                failed.push(format!(
                    "cannot stat '{}': {}",
                    display(source),
                    jext4::engine::tools::describe(&error)
                ));
                continue;
            }
        };
        if attr.kind == jext4::engine::fs::FileKind::Directory && !recursive {
            failed.push(format!(
                "-r not specified; omitting directory '{}'",
                display(source)
            ));
            continue;
        }
        let target = match dest_is_dir {
            true if names_dot(&source.path) => dest.to_path_buf(),
            true => dest.join(jext4::engine::tools::imagepath::file_name(&source.path)),
            false => dest.to_path_buf(),
        };
        let result = with_progress(progress, || {
            jext4::engine::tools::copy_out(image, source.trimmed(), &target, options, progress)
        });
        match result {
            Ok(report) => reports.push(report),
            Err(failure) => failed.push(format!("{}:{failure}", source.image.display())),
        }
    }
    match failed.is_empty() {
        true => Ok(reports),
        false => Err(failed.join(&format!("\n{}cp: ", session.label))),
    }
}

/// Whether a source's last component, as written, is "." (`DIR/.`, `.`):
/// cp copies such a directory's contents into the target directory
/// itself, not into a new entry of it.
fn names_dot(source: &str) -> bool {
    let trimmed = source.trim_end_matches('/');
    trimmed == "." || trimmed.ends_with("/.")
}

/// `IMAGE:PATH` as the user wrote it.
pub fn display(path: &ImagePath) -> String {
    format!("{}:{}", path.image.display(), path.path)
}

/// Run `work` with a progress bar on standard error when it is a terminal
/// and the work lasts more than a second.
pub fn with_progress<R>(progress: &Progress, work: impl FnOnce() -> R) -> R {
    use std::io::IsTerminal;
    if !std::io::stderr().is_terminal() || progress.verbose.is_some() {
        return work();
    }
    let done = AtomicBool::new(false);
    std::thread::scope(|scope| {
        scope.spawn(|| {
            let started = std::time::Instant::now();
            let mut bar: Option<indicatif::ProgressBar> = None;
            while !done.load(Ordering::Acquire) {
                std::thread::sleep(Duration::from_millis(100));
                if bar.is_none() && started.elapsed() >= Duration::from_secs(1) {
                    let new = indicatif::ProgressBar::new_spinner();
                    new.set_style(
                        indicatif::ProgressStyle::with_template("{spinner} {elapsed} {msg}")
                            .expect("a valid template"),
                    );
                    bar = Some(new);
                }
                if let Some(bar) = &bar {
                    let entries = progress.entries.load(Ordering::Relaxed);
                    let bytes = progress.bytes.load(Ordering::Relaxed);
                    let seconds = started.elapsed().as_secs_f64().max(0.001);
                    bar.set_message(format!(
                        "{entries} entries, {}, {}/s",
                        indicatif::HumanBytes(bytes),
                        indicatif::HumanBytes((bytes as f64 / seconds) as u64)
                    ));
                    bar.tick();
                }
            }
            if let Some(bar) = bar {
                bar.finish_and_clear();
            }
        });
        let result = work();
        done.store(true, Ordering::Release);
        result
    })
}

/// `stat` of an image path, as the engine's attributes (what the listing
/// and `stat` formats print).
pub(super) fn stat_path(
    image: &Image,
    path: impl AsRef<std::path::Path>,
) -> Result<jext4::engine::fs::Attr, jext4::Error> {
    image.metadata(path).map(|metadata| metadata.attr().clone())
}

/// `lstat` of an image path, as the engine's attributes.
pub(super) fn lstat_path(
    image: &Image,
    path: impl AsRef<std::path::Path>,
) -> Result<jext4::engine::fs::Attr, jext4::Error> {
    image
        .symlink_metadata(path)
        .map(|metadata| metadata.attr().clone())
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_verb_is_known_not_to_be_a_mount_helper_call() {
        use clap::CommandFactory;
        let command = super::super::Cli::command();
        command.clone().debug_assert();
        for verb in command.get_subcommands() {
            assert!(
                jext4::engine::fuse::helper::SUBCOMMANDS.contains(&verb.get_name()),
                "jext4 {} would be taken for a mount helper call",
                verb.get_name()
            );
        }
    }
}
