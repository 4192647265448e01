//! The coreutils-like verbs on `IMAGE:PATH` (`ls`, `cat`, `stat`,
//! `mkdir`, `rm`, `mv`, `ln`, `chmod`, `chown`, `touch`, `xattr`) and
//! `shell`, which reads them one per line. Messages and exit statuses are
//! those of the coreutils namesakes (in the C locale), the argument quoted
//! as it was given.

use super::tools::{ImageArgs, Session, ToolCommand, display, lstat_path, stat_path};
use clap::{Args, Parser};
use jext4::Error;
use jext4::Image;
use jext4::engine::format::inode::Timestamp;
use jext4::engine::format::quota::QuotaType;
use jext4::engine::fs::{Attr, FileKind, QuotaLimits, QuotaReport, SetAttr, TimeSet};
use jext4::engine::tools::imagepath::{file_name, join};
use jext4::engine::tools::{ImagePath, describe};
use std::io::Write;

#[derive(Args, Debug)]
pub struct PathsArgs {
    #[arg(required = true, value_name = "IMAGE:PATH")]
    pub paths: Vec<String>,
    #[command(flatten)]
    pub common: ImageArgs,
}

#[derive(Args, Debug)]
pub struct LsArgs {
    /// Long listing: mode, links, owner and group (numbers), size, mtime.
    #[arg(short = 'l')]
    pub long: bool,
    /// Do not ignore entries starting with '.'.
    #[arg(short = 'a', long = "all")]
    pub all: bool,
    /// List subdirectories recursively.
    #[arg(short = 'R', long = "recursive")]
    pub recursive: bool,
    /// List directories themselves, not their contents.
    #[arg(short = 'd', long = "directory")]
    pub directory: bool,
    #[arg(required = true, value_name = "IMAGE:PATH")]
    pub paths: Vec<String>,
    #[command(flatten)]
    pub common: ImageArgs,
}

#[derive(Args, Debug)]
pub struct MkdirArgs {
    /// No error if existing, make parent directories as needed.
    #[arg(short = 'p', long = "parents")]
    pub parents: bool,
    /// Set the mode (octal) of the new directories.
    #[arg(short = 'm', long = "mode", value_name = "MODE")]
    pub mode: Option<String>,
    #[arg(required = true, value_name = "IMAGE:PATH")]
    pub paths: Vec<String>,
    #[command(flatten)]
    pub common: ImageArgs,
}

#[derive(Args, Debug)]
pub struct RmArgs {
    /// Remove directories and their contents recursively.
    #[arg(short = 'r', short_alias = 'R', long = "recursive")]
    pub recursive: bool,
    /// Ignore nonexistent files, never fail on them.
    #[arg(short = 'f', long = "force")]
    pub force: bool,
    /// Remove empty directories.
    #[arg(short = 'd', long = "dir")]
    pub dir: bool,
    #[arg(value_name = "IMAGE:PATH")]
    pub paths: Vec<String>,
    #[command(flatten)]
    pub common: ImageArgs,
}

#[derive(Args, Debug)]
pub struct MvArgs {
    /// Sources, then the destination (all in one image).
    #[arg(required = true, num_args = 2.., value_name = "SRC... DEST")]
    pub paths: Vec<String>,
    #[command(flatten)]
    pub common: ImageArgs,
}

#[derive(Args, Debug)]
pub struct LnArgs {
    /// Make a symbolic link instead of a hard link.
    #[arg(short = 's', long = "symbolic")]
    pub symbolic: bool,
    /// Remove an existing destination first.
    #[arg(short = 'f', long = "force")]
    pub force: bool,
    /// The target (for -s, the text the link holds), then the link.
    #[arg(required = true, num_args = 2, value_name = "TARGET LINK")]
    pub paths: Vec<String>,
    #[command(flatten)]
    pub common: ImageArgs,
}

#[derive(Args, Debug)]
pub struct VerityArgs {
    #[arg(value_enum)]
    pub action: VerityAction,
    #[arg(required = true, value_name = "IMAGE:PATH")]
    pub paths: Vec<String>,
    /// enable: the Merkle tree's block size (a power of two from 1024 to
    /// the filesystem's block and 4096; default 4096 or the block), as
    /// `fsverity enable --block-size`.
    #[arg(long, value_name = "BYTES")]
    pub block_size: Option<u32>,
    /// enable: a salt hashed before every block, in hex (at most 32
    /// bytes), as `fsverity enable --salt`.
    #[arg(long, value_name = "HEX", value_parser = parse_hex)]
    pub salt: Option<HexBytes>,
    /// enable: a built-in signature file (PKCS#7 DER, at most 16128
    /// bytes), stored as a kernel without built-in signature checking
    /// stores it (jext4 does not check it), as `fsverity enable
    /// --signature`.
    #[arg(long, value_name = "FILE")]
    pub signature: Option<std::path::PathBuf>,
    #[command(flatten)]
    pub common: ImageArgs,
}

/// Bytes given in hex (one value: clap would take a `Vec` for many).
#[derive(Debug, Clone)]
pub struct HexBytes(pub Vec<u8>);

/// `--salt`: hex digits, two a byte.
fn parse_hex(text: &str) -> Result<HexBytes, String> {
    if !text.len().is_multiple_of(2) {
        return Err(format!("'{text}': an odd number of hex digits"));
    }
    (0..text.len())
        .step_by(2)
        .map(|at| {
            u8::from_str_radix(&text[at..at + 2], 16).map_err(|_| format!("'{text}': not hex"))
        })
        .collect::<Result<Vec<u8>, String>>()
        .map(HexBytes)
}

#[derive(clap::ValueEnum, Clone, Copy, Debug)]
pub enum VerityAction {
    /// Build the Merkle tree (SHA-256) and make the file read-only and
    /// verified (needs the verity feature: `tune2fs -O verity`).
    Enable,
    /// Print `sha256:DIGEST PATH`, as `fsverity digest` prints it.
    Measure,
}

#[derive(Args, Debug)]
pub struct QuotaArgs {
    #[command(subcommand)]
    pub action: QuotaAction,
    #[command(flatten)]
    pub common: ImageArgs,
}

/// Which quota file: one of -u, -g, -P (user by default for a report).
#[derive(Args, Debug, Clone)]
#[group(multiple = false)]
pub struct QuotaKind {
    /// User quotas.
    #[arg(short = 'u', long = "user")]
    pub user: bool,
    /// Group quotas.
    #[arg(short = 'g', long = "group")]
    pub group: bool,
    /// Project quotas.
    #[arg(short = 'P', long = "project")]
    pub project: bool,
}

impl QuotaKind {
    fn qtype(&self) -> QuotaType {
        match (self.group, self.project) {
            (true, _) => QuotaType::Group,
            (_, true) => QuotaType::Project,
            _ => QuotaType::User,
        }
    }
}

#[derive(clap::Subcommand, Debug)]
pub enum QuotaAction {
    /// Print every id's usage and limits, with repquota -n's columns
    /// (space in KiB).
    Report {
        #[command(flatten)]
        kind: QuotaKind,
        #[arg(value_name = "IMAGE")]
        image: std::path::PathBuf,
    },
    /// Set an id's limits, in setquota's order: space soft and hard limits
    /// in KiB, then inode soft and hard limits (0: none).
    Set {
        #[command(flatten)]
        kind: QuotaKind,
        #[arg(value_name = "IMAGE")]
        image: std::path::PathBuf,
        /// The user, group or project id.
        id: u32,
        block_soft: u64,
        block_hard: u64,
        inode_soft: u64,
        inode_hard: u64,
    },
    /// Set how long a usage may stay past a soft limit, in seconds, in
    /// setquota -t's order: the block grace time, then the inode grace
    /// time.
    Grace {
        #[command(flatten)]
        kind: QuotaKind,
        #[arg(value_name = "IMAGE")]
        image: std::path::PathBuf,
        block_grace: u32,
        inode_grace: u32,
    },
}

#[derive(Args, Debug)]
pub struct ChmodArgs {
    /// Octal (0755) or symbolic (u+x,go-w) mode.
    pub mode: String,
    #[arg(required = true, value_name = "IMAGE:PATH")]
    pub paths: Vec<String>,
    #[command(flatten)]
    pub common: ImageArgs,
}

#[derive(Args, Debug)]
#[command(disable_help_flag = true)]
pub struct ChownArgs {
    /// Print help (-h is chown's --no-dereference).
    #[arg(long, action = clap::ArgAction::Help)]
    pub help: Option<bool>,
    /// Do not follow a final symbolic link.
    #[arg(short = 'h', long = "no-dereference")]
    pub no_dereference: bool,
    /// OWNER[:GROUP], names (from this host's user database) or numbers.
    pub owner: String,
    #[arg(required = true, value_name = "IMAGE:PATH")]
    pub paths: Vec<String>,
    #[command(flatten)]
    pub common: ImageArgs,
}

#[derive(Args, Debug)]
pub struct TouchArgs {
    /// Do not create files that do not exist.
    #[arg(short = 'c', long = "no-create")]
    pub no_create: bool,
    /// Use this time instead of now: @SECONDS since the epoch.
    #[arg(short = 'd', long = "date", value_name = "@SECONDS")]
    pub date: Option<String>,
    #[arg(required = true, value_name = "IMAGE:PATH")]
    pub paths: Vec<String>,
    #[command(flatten)]
    pub common: ImageArgs,
}

#[derive(Args, Debug)]
pub struct XattrArgs {
    /// get NAME PATH | set NAME VALUE PATH | list PATH | remove NAME PATH
    #[arg(value_name = "ACTION")]
    pub action: String,
    #[arg(required = true, value_name = "ARGS")]
    pub args: Vec<String>,
    #[command(flatten)]
    pub common: ImageArgs,
}

#[derive(Args, Debug)]
pub struct ShellArgs {
    /// Keep going after a line fails.
    #[arg(short = 'k', long = "keep-going")]
    pub keep_going: bool,
    /// The image every line works on (plain paths are inside it; `cp`
    /// takes host paths plainly and image paths as `:PATH`).
    #[arg(id = "shell_image", value_name = "IMAGE")]
    pub image: std::path::PathBuf,
    #[command(flatten)]
    pub common: ImageArgs,
}

pub fn common_of(command: &ToolCommand) -> ImageArgs {
    match command {
        ToolCommand::Cp(args) => args.common.clone(),
        ToolCommand::Tar(args) => args.common.clone(),
        ToolCommand::Ls(args) => args.common.clone(),
        ToolCommand::Cat(args) | ToolCommand::Stat(args) => args.common.clone(),
        ToolCommand::Mkdir(args) => args.common.clone(),
        ToolCommand::Rm(args) => args.common.clone(),
        ToolCommand::Mv(args) => args.common.clone(),
        ToolCommand::Ln(args) => args.common.clone(),
        ToolCommand::Chmod(args) => args.common.clone(),
        ToolCommand::Chown(args) => args.common.clone(),
        ToolCommand::Touch(args) => args.common.clone(),
        ToolCommand::Xattr(args) => args.common.clone(),
        ToolCommand::Verity(args) => args.common.clone(),
        ToolCommand::Quota(args) => args.common.clone(),
        ToolCommand::Shell(args) => args.common.clone(),
    }
}

/// Prints a verb's messages as `jext4 VERB: ...` (or, in the shell,
/// `jext4 shell: line N: VERB: ...`) and keeps its exit status.
struct Verb<'s> {
    session: &'s mut Session,
    name: &'static str,
    status: u8,
}

impl<'s> Verb<'s> {
    fn say(&mut self, status: u8, message: String) {
        eprintln!("{}{}: {message}", self.session.label, self.name);
        self.status = self.status.max(status);
    }

    /// The image and path an argument names; a message and None if it
    /// names none.
    fn open(&mut self, arg: &str) -> Option<(ImagePath, &Image)> {
        let Some(path) = self.session.image_path(arg) else {
            self.say(
                1,
                format!("'{arg}': not an IMAGE:PATH (no image file before a colon)"),
            );
            return None;
        };
        match self.session.image(&path.image) {
            Ok(_) => {}
            Err(message) => {
                eprintln!("{}{}: {message}", self.session.label, self.name);
                self.status = 1;
                return None;
            }
        }
        let image = self.session.image(&path.image).ok()?;
        Some((path, image))
    }
}

/// One verb other than cp in `session`: its exit status.
pub fn run(session: &mut Session, command: ToolCommand) -> u8 {
    let name = verb_name(&command);
    let mut verb = Verb {
        session,
        name,
        status: 0,
    };
    match command {
        ToolCommand::Tar(args) => verb.status = super::tar::tar(verb.session, &args),
        ToolCommand::Ls(args) => ls(&mut verb, &args),
        ToolCommand::Cat(args) => cat(&mut verb, &args.paths),
        ToolCommand::Stat(args) => stat(&mut verb, &args.paths),
        ToolCommand::Mkdir(args) => mkdir(&mut verb, &args),
        ToolCommand::Rm(args) => rm(&mut verb, &args),
        ToolCommand::Mv(args) => mv(&mut verb, &args.paths),
        ToolCommand::Ln(args) => ln(&mut verb, &args),
        ToolCommand::Chmod(args) => chmod(&mut verb, &args),
        ToolCommand::Chown(args) => chown(&mut verb, &args),
        ToolCommand::Touch(args) => touch(&mut verb, &args),
        ToolCommand::Xattr(args) => xattr(&mut verb, &args),
        ToolCommand::Verity(args) => verity(&mut verb, &args),
        ToolCommand::Quota(args) => quota(&mut verb, &args.action),
        ToolCommand::Cp(_) | ToolCommand::Shell(_) => {
            verb.say(1, "not available here".into());
        }
    }
    verb.status
}

fn verb_name(command: &ToolCommand) -> &'static str {
    match command {
        ToolCommand::Cp(_) => "cp",
        ToolCommand::Tar(_) => "tar",
        ToolCommand::Ls(_) => "ls",
        ToolCommand::Cat(_) => "cat",
        ToolCommand::Stat(_) => "stat",
        ToolCommand::Mkdir(_) => "mkdir",
        ToolCommand::Rm(_) => "rm",
        ToolCommand::Mv(_) => "mv",
        ToolCommand::Ln(_) => "ln",
        ToolCommand::Chmod(_) => "chmod",
        ToolCommand::Chown(_) => "chown",
        ToolCommand::Touch(_) => "touch",
        ToolCommand::Xattr(_) => "xattr",
        ToolCommand::Verity(_) => "verity",
        ToolCommand::Quota(_) => "quota",
        ToolCommand::Shell(_) => "shell",
    }
}

fn is_dir(attr: &Attr) -> bool {
    attr.kind == FileKind::Directory
}

// ---- ls ----

fn ls(verb: &mut Verb<'_>, args: &LsArgs) {
    let mut files = Vec::new();
    let mut directories = Vec::new();
    for arg in &args.paths {
        let Some((path, image)) = verb.open(arg) else {
            continue;
        };
        match stat_path(image, path.trimmed()) {
            Ok(attr) if is_dir(&attr) && !args.directory => directories.push((arg.clone(), path)),
            Ok(attr) => files.push((arg.clone(), path, attr)),
            Err(error) => verb.say(2, format!("cannot access '{arg}': {}", describe(&error))),
        }
    }
    let mut out = std::io::stdout().lock();
    files.sort_by(|a, b| a.0.cmp(&b.0));
    for (arg, path, attr) in &files {
        let image = verb.session.image(&path.image).expect("opened above");
        let _ = writeln!(
            out,
            "{}",
            ls_line(image, args.long, arg, path.trimmed(), attr)
        );
    }
    directories.sort_by(|a, b| a.0.cmp(&b.0));
    let headers = args.recursive || files.len() + directories.len() > 1;
    let mut first = files.is_empty();
    // Depth first, without recursion (-R): (shown name, image path).
    let mut pending: Vec<(String, ImagePath)> = directories.into_iter().rev().collect();
    while let Some((shown, path)) = pending.pop() {
        let image = verb.session.image(&path.image).expect("opened above");
        let listing = ls_directory(image, args, &path);
        if !first {
            let _ = writeln!(out);
        }
        first = false;
        if headers {
            let _ = writeln!(out, "{shown}:");
        }
        match listing {
            Ok((lines, subdirectories)) => {
                for line in lines {
                    let _ = writeln!(out, "{line}");
                }
                for name in subdirectories.into_iter().rev() {
                    let child = ImagePath {
                        image: path.image.clone(),
                        path: join(&path.path, &name),
                    };
                    pending.push((join_shown(&shown, &name), child));
                }
            }
            Err(error) => {
                drop(out);
                verb.say(
                    2,
                    format!("cannot open directory '{shown}': {}", describe(&error)),
                );
                out = std::io::stdout().lock();
            }
        }
    }
}

fn join_shown(shown: &str, name: &str) -> String {
    match shown.ends_with('/') {
        true => format!("{shown}{name}"),
        false => format!("{shown}/{name}"),
    }
}

/// One directory's lines, and its subdirectories to descend into (-R).
fn ls_directory(
    image: &Image,
    args: &LsArgs,
    path: &ImagePath,
) -> Result<(Vec<String>, Vec<String>), Error> {
    let mut names = Vec::new();
    for entry in image.read_dir(path.trimmed())? {
        let name = entry?.file_name().to_string_lossy().into_owned();
        if args.all || !name.starts_with('.') {
            names.push(name);
        }
    }
    if args.all {
        names.push(".".into());
        names.push("..".into());
    }
    names.sort();
    let mut lines = Vec::new();
    let mut subdirectories = Vec::new();
    let mut total_blocks = 0;
    for name in &names {
        let child = join(&path.path, name);
        let attr = lstat_path(image, &child)?;
        total_blocks += attr.blocks / 2;
        if args.recursive && is_dir(&attr) && name != "." && name != ".." {
            subdirectories.push(name.clone());
        }
        lines.push(ls_line(image, args.long, name, &child, &attr));
    }
    if args.long {
        lines.insert(0, format!("total {total_blocks}"));
    }
    Ok((lines, subdirectories))
}

fn ls_line(image: &Image, long: bool, shown: &str, path: &str, attr: &Attr) -> String {
    if !long {
        return shown.to_string();
    }
    let size = match attr.kind {
        FileKind::CharDevice | FileKind::BlockDevice => format!(
            "{}, {}",
            libc::major(attr.rdev as libc::dev_t),
            libc::minor(attr.rdev as libc::dev_t)
        ),
        _ => attr.size.to_string(),
    };
    let mut line = format!(
        "{} {} {} {} {} {} {shown}",
        mode_string(attr),
        attr.nlink,
        attr.uid,
        attr.gid,
        size,
        long_iso(attr.mtime.sec)
    );
    if attr.kind == FileKind::Symlink
        && let Ok(target) = image.read_link(path)
    {
        line.push_str(&format!(" -> {}", target.to_string_lossy()));
    }
    line
}

/// `drwxr-sr-t`, as ls -l and stat print it.
fn mode_string(attr: &Attr) -> String {
    let kind = match attr.kind {
        FileKind::Regular => '-',
        FileKind::Directory => 'd',
        FileKind::Symlink => 'l',
        FileKind::CharDevice => 'c',
        FileKind::BlockDevice => 'b',
        FileKind::Fifo => 'p',
        FileKind::Socket => 's',
    };
    let perm = attr.perm;
    let bit = |mask: u16, c: char| if perm & mask != 0 { c } else { '-' };
    let special = |exec: u16, special: u16, set: char| match (perm & exec != 0, perm & special != 0)
    {
        (true, true) => set,
        (false, true) => set.to_ascii_uppercase(),
        (true, false) => 'x',
        (false, false) => '-',
    };
    [
        kind,
        bit(0o400, 'r'),
        bit(0o200, 'w'),
        special(0o100, 0o4000, 's'),
        bit(0o040, 'r'),
        bit(0o020, 'w'),
        special(0o010, 0o2000, 's'),
        bit(0o004, 'r'),
        bit(0o002, 'w'),
        special(0o001, 0o1000, 't'),
    ]
    .iter()
    .collect()
}

/// `YYYY-MM-DD HH:MM` in UTC (ls --time-style=long-iso).
fn long_iso(seconds: i64) -> String {
    let (date, time) = civil(seconds);
    format!("{date} {}", &time[..5])
}

/// (`YYYY-MM-DD`, `HH:MM:SS`) in UTC, from days since the epoch (Howard
/// Hinnant's civil_from_days).
fn civil(seconds: i64) -> (String, String) {
    let days = seconds.div_euclid(86_400);
    let rest = seconds.rem_euclid(86_400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + (month <= 2) as i64;
    (
        format!("{year:04}-{month:02}-{day:02}"),
        format!("{:02}:{:02}:{:02}", rest / 3600, rest / 60 % 60, rest % 60),
    )
}

// ---- cat, stat ----

fn cat(verb: &mut Verb<'_>, paths: &[String]) {
    const CHUNK_BYTES: usize = 1 << 20;
    for arg in paths {
        let Some((path, image)) = verb.open(arg) else {
            continue;
        };
        let copied = (|| -> Result<(), Error> {
            let mut file = image.open_file(path.trimmed())?;
            let mut out = std::io::stdout().lock();
            let mut buffer = vec![0u8; CHUNK_BYTES];
            loop {
                let got = std::io::Read::read(&mut file, &mut buffer)?;
                if got == 0 {
                    break;
                }
                out.write_all(&buffer[..got])?;
            }
            out.flush()?;
            Ok(())
        })();
        if let Err(error) = copied {
            verb.say(1, format!("{arg}: {}", describe(&error)));
        }
    }
}

fn stat(verb: &mut Verb<'_>, paths: &[String]) {
    for arg in paths {
        let Some((path, image)) = verb.open(arg) else {
            continue;
        };
        match lstat_path(image, path.trimmed()) {
            Ok(attr) => {
                let mut shown = arg.clone();
                if attr.kind == FileKind::Symlink
                    && let Ok(target) = image.read_link(path.trimmed())
                {
                    shown = format!("{arg} -> {}", target.to_string_lossy());
                }
                print!("{}", stat_text(&shown, &attr));
            }
            Err(error) => verb.say(1, format!("cannot statx '{arg}': {}", describe(&error))),
        }
    }
}

/// stat(1)'s default output, owners as numbers, times in UTC.
fn stat_text(shown: &str, attr: &Attr) -> String {
    let kind = match attr.kind {
        FileKind::Regular if attr.size == 0 => "regular empty file",
        FileKind::Regular => "regular file",
        FileKind::Directory => "directory",
        FileKind::Symlink => "symbolic link",
        FileKind::CharDevice => "character special file",
        FileKind::BlockDevice => "block special file",
        FileKind::Fifo => "fifo",
        FileKind::Socket => "socket",
    };
    let time = |t: Timestamp| {
        let (date, clock) = civil(t.sec);
        format!("{date} {clock}.{:09} +0000", t.nsec)
    };
    format!(
        "  File: {shown}\n  Size: {:<10}\tBlocks: {:<10} IO Block: {:<6} {kind}\n\
         Inode: {:<11} Links: {}\n\
         Access: ({:04o}/{})  Uid: ({:>5})   Gid: ({:>5})\n\
         Access: {}\nModify: {}\nChange: {}\n Birth: {}\n",
        attr.size,
        attr.blocks,
        attr.blksize,
        attr.ino,
        attr.nlink,
        attr.perm,
        mode_string(attr),
        attr.uid,
        attr.gid,
        time(attr.atime),
        time(attr.mtime),
        time(attr.ctime),
        // stat(1)'s "-" where statx gives no birth time: inodes without
        // room for crtime (128-byte inodes, ext2 and ext3 images).
        match attr.crtime == Timestamp::default() {
            true => "-".to_string(),
            false => time(attr.crtime),
        },
    )
}

// ---- mkdir, rm, mv, ln ----

fn mkdir(verb: &mut Verb<'_>, args: &MkdirArgs) {
    let mode = match &args.mode {
        None => 0o777 & !jext4::engine::tools::host::umask(),
        Some(text) => match parse_mode(text, 0o777 & !jext4::engine::tools::host::umask()) {
            Some(mode) => mode,
            None => return verb.say(1, format!("invalid mode '{text}'")),
        },
    };
    for arg in &args.paths {
        let Some((path, image)) = verb.open(arg) else {
            continue;
        };
        let made = match args.parents {
            // Parents 0755, as before the std-shaped API (the CLI's image
            // has no umask).
            true => image
                .create_dir_with(
                    path.trimmed(),
                    std::os::unix::fs::DirBuilderExt::mode(
                        jext4::DirBuilder::new().recursive(true),
                        0o755,
                    ),
                )
                .and_then(|()| match stat_path(image, path.trimmed()) {
                    Ok(attr) if is_dir(&attr) => Ok(()),
                    Ok(_) => Err(Error::Exists),
                    Err(error) => Err(error),
                }),
            false => image.create_dir_with(
                path.trimmed(),
                std::os::unix::fs::DirBuilderExt::mode(&mut jext4::DirBuilder::new(), mode.into()),
            ),
        };
        if let Err(error) = made {
            verb.say(
                1,
                format!("cannot create directory '{arg}': {}", describe(&error)),
            );
        }
    }
}

fn rm(verb: &mut Verb<'_>, args: &RmArgs) {
    if args.paths.is_empty() && !args.force {
        return verb.say(1, "missing operand".into());
    }
    for arg in &args.paths {
        let Some((path, image)) = verb.open(arg) else {
            continue;
        };
        let name = file_name(&path.path);
        if name == "." || name == ".." {
            verb.say(
                1,
                format!("refusing to remove '.' or '..' directory: skipping '{arg}'"),
            );
            continue;
        }
        if path.trimmed() == "/" {
            verb.say(
                1,
                format!("it is dangerous to operate recursively on '{arg}'"),
            );
            continue;
        }
        let removed = match lstat_path(image, path.trimmed()) {
            Ok(attr) if is_dir(&attr) && args.recursive => image.remove_dir_all(path.trimmed()),
            Ok(attr) if is_dir(&attr) && args.dir => image.remove_dir(path.trimmed()),
            Ok(attr) if is_dir(&attr) => Err(Error::IsDirectory),
            Ok(_) => image.remove_file(path.trimmed()),
            Err(error) => Err(error),
        };
        match removed {
            Err(Error::NotFound) if args.force => {}
            Err(error) => verb.say(1, format!("cannot remove '{arg}': {}", describe(&error))),
            Ok(()) => {}
        }
    }
}

/// Where a source lands given a destination that may be a directory.
fn into_directory(image: &Image, dest: &ImagePath, source: &ImagePath) -> String {
    match stat_path(image, dest.trimmed()) {
        Ok(attr) if is_dir(&attr) => join(&dest.path, file_name(&source.path)),
        _ => dest.trimmed().to_string(),
    }
}

fn mv(verb: &mut Verb<'_>, paths: &[String]) {
    let (dest_arg, sources) = paths.split_last().expect("clap requires two paths");
    let Some((dest, image)) = verb.open(dest_arg) else {
        return;
    };
    let dest_is_dir = matches!(stat_path(image, dest.trimmed()), Ok(attr) if is_dir(&attr));
    if sources.len() > 1 && !dest_is_dir {
        return verb.say(1, format!("target '{dest_arg}' is not a directory"));
    }
    for arg in sources {
        let Some((source, image)) = verb.open(arg) else {
            continue;
        };
        if source.image != dest.image {
            verb.say(
                1,
                format!("cannot move '{arg}' to another image (use cp, then rm)"),
            );
            continue;
        }
        if let Err(error) = lstat_path(image, source.trimmed()) {
            verb.say(1, format!("cannot stat '{arg}': {}", describe(&error)));
            continue;
        }
        let target = into_directory(image, &dest, &source);
        if let Err(error) = image.rename(source.trimmed(), &target) {
            let shown = display(&ImagePath {
                image: dest.image.clone(),
                path: target,
            });
            verb.say(
                1,
                format!("cannot move '{arg}' to '{shown}': {}", describe(&error)),
            );
        }
    }
}

fn ln(verb: &mut Verb<'_>, args: &LnArgs) {
    let (target_arg, link_arg) = (&args.paths[0], &args.paths[1]);
    let Some((link, _)) = verb.open(link_arg) else {
        return;
    };
    // A symbolic link's target is text, kept as given; a hard link's is
    // an entry of the same image.
    let target = match args.symbolic {
        true => target_arg
            .split_once(':')
            .filter(|_| ImagePath::parse(target_arg, None).is_some())
            .map_or(target_arg.clone(), |(_, path)| path.to_string()),
        false => match verb.session.image_path(target_arg) {
            Some(path) => path.path,
            None => return verb.say(1, format!("'{target_arg}': not an IMAGE:PATH")),
        },
    };
    let image = verb.session.image(&link.image).expect("opened above");
    let source = ImagePath {
        image: link.image.clone(),
        path: target.clone(),
    };
    let at = into_directory(image, &link, &source);
    if args.force {
        let _ = image.remove_file(&at);
    }
    let made = match args.symbolic {
        true => image.symlink(&target, &at).map(|_| ()),
        false => match lstat_path(image, &target) {
            Err(error) => {
                return verb.say(
                    1,
                    format!("failed to access '{target_arg}': {}", describe(&error)),
                );
            }
            Ok(_) => image.hard_link(&target, &at).map(|_| ()),
        },
    };
    if let Err(error) = made {
        let kind = if args.symbolic {
            "symbolic link"
        } else {
            "hard link"
        };
        let shown = if at == link.trimmed() {
            link_arg.clone()
        } else {
            display(&ImagePath {
                image: link.image.clone(),
                path: at,
            })
        };
        verb.say(
            1,
            format!("failed to create {kind} '{shown}': {}", describe(&error)),
        );
    }
}

// ---- verity ----

fn verity(verb: &mut Verb<'_>, args: &VerityArgs) {
    let mut params = jext4::engine::fs::VerityParams {
        block_size: args.block_size,
        salt: args.salt.clone().map(|salt| salt.0).unwrap_or_default(),
        signature: Vec::new(),
    };
    if let Some(path) = &args.signature {
        match std::fs::read(path) {
            Ok(signature) => params.signature = signature,
            Err(error) => {
                verb.say(1, format!("'{}': {error}", path.display()));
                return;
            }
        }
    }
    for arg in &args.paths {
        let Some((path, image)) = verb.open(arg) else {
            continue;
        };
        let done = image
            .inode_of(path.trimmed(), true)
            .and_then(|ino| match args.action {
                VerityAction::Enable => image.fs().enable_verity_with(ino, image.caller(), &params),
                VerityAction::Measure => image.fs().verity_digest(ino).map(|digest| {
                    let text = jext4::engine::format::verity::digest_text(&digest);
                    println!("{text} {}", path.trimmed());
                }),
            });
        match done {
            Err(jext4::Error::NoAttribute) => {
                verb.say(1, format!("'{arg}': not a verity file"));
            }
            Err(error) => verb.say(1, format!("'{arg}': {}", describe(&error))),
            Ok(()) => {}
        }
    }
}

// ---- quota ----

fn quota(verb: &mut Verb<'_>, action: &QuotaAction) {
    let (target, qtype) = match action {
        QuotaAction::Report { kind, image }
        | QuotaAction::Set { kind, image, .. }
        | QuotaAction::Grace { kind, image, .. } => (image, kind.qtype()),
    };
    // A directory is a mount point (or a directory on a mount): its server
    // is asked through ioctls, FUSE passing no quotactl.
    if target.is_dir() {
        return quota_on_mount(verb, action, target, qtype);
    }
    let image = match verb.session.image(target) {
        Ok(image) => image,
        Err(message) => return verb.say(1, message),
    };
    let done = match action {
        QuotaAction::Report { .. } => image
            .fs()
            .quota_report(qtype)
            .map(|report| print_quota_report(target, qtype, &report)),
        QuotaAction::Set { id, .. } => image.fs().set_quota_limits(qtype, *id, limits_of(action)),
        QuotaAction::Grace {
            block_grace,
            inode_grace,
            ..
        } => image
            .fs()
            .set_quota_grace(qtype, *block_grace, *inode_grace),
    };
    match done {
        Err(Error::NotSupported) => verb.say(1, no_such_quotas(target, qtype)),
        Err(error) => verb.say(1, format!("{}: {}", target.display(), describe(&error))),
        Ok(()) => {}
    }
}

/// The limits a `quota set` gives.
fn limits_of(action: &QuotaAction) -> QuotaLimits {
    match action {
        QuotaAction::Set {
            block_soft,
            block_hard,
            inode_soft,
            inode_hard,
            ..
        } => QuotaLimits {
            space_soft: *block_soft,
            space_hard: *block_hard,
            inode_soft: *inode_soft,
            inode_hard: *inode_hard,
        },
        _ => QuotaLimits::default(),
    }
}

fn no_such_quotas(target: &std::path::Path, qtype: QuotaType) -> String {
    format!(
        "{}: the filesystem keeps no {} quotas",
        target.display(),
        qtype.name()
    )
}

/// `quota` on a mount: the same requests, through its server.
fn quota_on_mount(
    verb: &mut Verb<'_>,
    action: &QuotaAction,
    mountpoint: &std::path::Path,
    qtype: QuotaType,
) {
    use jext4::engine::fuse::control;
    let done = match action {
        QuotaAction::Report { .. } => control::quota_report(mountpoint, qtype)
            .map(|report| print_quota_report(mountpoint, qtype, &report)),
        QuotaAction::Set { id, .. } => {
            control::quota_set(mountpoint, qtype, *id, &limits_of(action))
        }
        QuotaAction::Grace {
            block_grace,
            inode_grace,
            ..
        } => control::quota_grace(mountpoint, qtype, *block_grace, *inode_grace),
    };
    let Err(error) = done else {
        return;
    };
    let message = match error.raw_os_error() {
        Some(libc::EOPNOTSUPP) => no_such_quotas(mountpoint, qtype),
        Some(libc::ENOTTY) => format!("{}: not on a jext4 mount", mountpoint.display()),
        Some(errno) => format!(
            "{}: {}",
            mountpoint.display(),
            jext4::engine::tools::strerror(errno)
        ),
        None => format!("{}: {error}", mountpoint.display()),
    };
    verb.say(1, message)
}

/// repquota -n's report: a header, then one line per id.
fn print_quota_report(image: &std::path::Path, qtype: QuotaType, report: &QuotaReport) {
    let days = |seconds: u32| match seconds {
        0 => "0seconds".to_string(),
        s if s % 86400 == 0 => format!("{}days", s / 86400),
        s if s % 3600 == 0 => format!("{}hours", s / 3600),
        s => format!("{s}seconds"),
    };
    println!(
        "*** Report for {} quotas on device {}",
        qtype.name(),
        image.display()
    );
    println!(
        "Block grace time: {}; Inode grace time: {}",
        days(report.info.block_grace),
        days(report.info.inode_grace)
    );
    println!("                        Block limits                File limits");
    let label = match qtype {
        QuotaType::User => "User",
        QuotaType::Group => "Group",
        QuotaType::Project => "Project",
    };
    println!("{label:<16}used    soft    hard  grace    used  soft  hard  grace");
    println!("{}", "-".repeat(70));
    for entry in &report.entries {
        let used = entry.space.div_ceil(1024);
        let over_space = entry.space_soft > 0 && used > entry.space_soft;
        let over_inodes = entry.inode_soft > 0 && entry.inodes > entry.inode_soft;
        let line = format!(
            "{:<10}{}{} {:>7} {:>7} {:>7} {:>6} {:>7} {:>5} {:>5} {:>6}",
            format!("#{}", entry.id),
            if over_space { '+' } else { '-' },
            if over_inodes { '+' } else { '-' },
            used,
            entry.space_soft,
            entry.space_hard,
            grace_left(entry.block_time),
            entry.inodes,
            entry.inode_soft,
            entry.inode_hard,
            grace_left(entry.inode_time),
        );
        println!("{}", line.trim_end());
    }
}

/// What repquota prints of a grace deadline: nothing when none runs,
/// "none" once it passed, else the time left.
fn grace_left(deadline: u64) -> String {
    if deadline == 0 {
        return String::new();
    }
    let now = Timestamp::now().sec.max(0) as u64;
    match deadline.checked_sub(now) {
        None | Some(0) => "none".into(),
        Some(left) if left >= 86400 => format!("{}days", left.div_ceil(86400)),
        Some(left) => format!("{:02}:{:02}", left / 3600, left % 3600 / 60),
    }
}

// ---- chmod, chown, touch ----

fn chmod(verb: &mut Verb<'_>, args: &ChmodArgs) {
    if parse_mode(&args.mode, 0).is_none() {
        verb.say(1, format!("invalid mode: '{}'", args.mode));
        eprintln!("Try 'chmod --help' for more information.");
        return;
    }
    for arg in &args.paths {
        let Some((path, image)) = verb.open(arg) else {
            continue;
        };
        let changed = image.inode_of(path.trimmed(), true).and_then(|ino| {
            let attr = image.fs().getattr(ino)?;
            let mode = parse_mode(&args.mode, attr.perm).expect("checked above");
            let changes = SetAttr {
                mode: Some(mode),
                ..SetAttr::default()
            };
            image.fs().setattr(ino, &changes, image.caller())
        });
        if let Err(error) = changed {
            verb.say(1, format!("cannot access '{arg}': {}", describe(&error)));
        }
    }
}

/// An octal mode, or a symbolic one (`u+x,go-w,a=rX`) applied to `current`.
fn parse_mode(text: &str, current: u16) -> Option<u16> {
    if !text.is_empty() && text.chars().all(|c| c.is_digit(8)) {
        return u16::from_str_radix(text, 8)
            .ok()
            .filter(|mode| *mode <= 0o7777);
    }
    let mut mode = current;
    for clause in text.split(',') {
        let operator_at = clause.find(['+', '-', '='])?;
        let (who, rest) = clause.split_at(operator_at);
        let mut who_mask = 0u16;
        for c in who.chars() {
            who_mask |= match c {
                'u' => 0o4700,
                'g' => 0o2070,
                'o' => 0o1007,
                'a' => 0o7777,
                _ => return None,
            };
        }
        if who.is_empty() {
            who_mask = 0o7777;
        }
        let operator = rest.chars().next()?;
        let mut bits = 0u16;
        for c in rest[1..].chars() {
            bits |= match c {
                'r' => 0o444,
                'w' => 0o222,
                'x' => 0o111,
                'X' if mode & 0o111 != 0 => 0o111,
                'X' => 0,
                's' => 0o6000,
                't' => 0o1000,
                _ => return None,
            };
        }
        let bits = bits & who_mask;
        mode = match operator {
            '+' => mode | bits,
            '-' => mode & !bits,
            _ => (mode & !who_mask) | bits,
        };
    }
    Some(mode)
}

fn chown(verb: &mut Verb<'_>, args: &ChownArgs) {
    let (user, group) = match args.owner.split_once(':') {
        Some((user, group)) => (user, Some(group)),
        None => (args.owner.as_str(), None),
    };
    let uid = match user {
        "" => None,
        user => match host_id(user, true) {
            Some(uid) => Some(uid),
            None => return verb.say(1, format!("invalid user: '{}'", args.owner)),
        },
    };
    let gid = match group {
        None | Some("") => None,
        Some(group) => match host_id(group, false) {
            Some(gid) => Some(gid),
            None => return verb.say(1, format!("invalid group: '{}'", args.owner)),
        },
    };
    for arg in &args.paths {
        let Some((path, image)) = verb.open(arg) else {
            continue;
        };
        let changed = image
            .inode_of(path.trimmed(), !args.no_dereference)
            .and_then(|ino| {
                let changes = SetAttr {
                    uid,
                    gid,
                    ..SetAttr::default()
                };
                image.fs().setattr(ino, &changes, image.caller())
            });
        if let Err(error) = changed {
            verb.say(1, format!("cannot access '{arg}': {}", describe(&error)));
        }
    }
}

/// A user or group by number, or by name in this host's database.
fn host_id(name: &str, user: bool) -> Option<u32> {
    if let Ok(number) = name.parse() {
        return Some(number);
    }
    let c = std::ffi::CString::new(name).ok()?;
    // SAFETY: getpwnam/getgrnam with a valid C string; the record is read
    // at once, before any other call could reuse the static buffer.
    unsafe {
        match user {
            true => libc::getpwnam(c.as_ptr()).as_ref().map(|p| p.pw_uid),
            false => libc::getgrnam(c.as_ptr()).as_ref().map(|g| g.gr_gid),
        }
    }
}

fn touch(verb: &mut Verb<'_>, args: &TouchArgs) {
    let when = match &args.date {
        None => TimeSet::Now,
        Some(text) => match text.strip_prefix('@').and_then(|s| s.parse::<i64>().ok()) {
            Some(sec) => TimeSet::At(Timestamp { sec, nsec: 0 }),
            None => return verb.say(1, format!("invalid date format '{text}' (use @SECONDS)")),
        },
    };
    for arg in &args.paths {
        let Some((path, image)) = verb.open(arg) else {
            continue;
        };
        let changes = SetAttr {
            atime: Some(when),
            mtime: Some(when),
            ..SetAttr::default()
        };
        let touched = match image.inode_of(path.trimmed(), true) {
            Ok(ino) => image
                .fs()
                .setattr(ino, &changes, image.caller())
                .map(|_| ()),
            Err(Error::NotFound) if args.no_create => Ok(()),
            Err(Error::NotFound) => {
                let mode = 0o666 & !jext4::engine::tools::host::umask();
                let mut options = jext4::OpenOptions::new();
                options.write(true).create(true);
                std::os::unix::fs::OpenOptionsExt::mode(&mut options, mode.into());
                image.open_with(path.trimmed(), &options).and_then(|file| {
                    let ino = image.inode_of(path.trimmed(), true)?;
                    drop(file);
                    image
                        .fs()
                        .setattr(ino, &changes, image.caller())
                        .map(|_| ())
                })
            }
            Err(error) => Err(error),
        };
        if let Err(error) = touched {
            verb.say(1, format!("cannot touch '{arg}': {}", describe(&error)));
        }
    }
}

// ---- xattr ----

fn xattr(verb: &mut Verb<'_>, args: &XattrArgs) {
    let wanted = match args.action.as_str() {
        "get" | "remove" => 2,
        "set" => 3,
        "list" => 1,
        other => {
            return verb.say(
                1,
                format!("unknown action '{other}' (get, set, list, remove)"),
            );
        }
    };
    if args.args.len() != wanted {
        return verb.say(1, format!("{} takes {wanted} arguments", args.action));
    }
    let arg = args.args.last().expect("checked above");
    let Some((path, image)) = verb.open(arg) else {
        return;
    };
    let at = path.trimmed();
    let name = &args.args[0];
    let done = match args.action.as_str() {
        "get" => image.xattr(at, name).and_then(|value| {
            let value = value.ok_or(Error::NoAttribute)?;
            let mut out = std::io::stdout().lock();
            let _ = out.write_all(&value);
            if value.last() != Some(&b'\n') && std::str::from_utf8(&value).is_ok() {
                let _ = out.write_all(b"\n");
            }
            Ok(())
        }),
        "set" => image.set_xattr(at, name, args.args[1].as_bytes()),
        "remove" => image.remove_xattr(at, name),
        _ => image.list_xattr(at).map(|names| {
            for name in names {
                println!("{}", name.to_string_lossy());
            }
        }),
    };
    if let Err(error) = done {
        verb.say(1, format!("{arg}: {}", describe(&error)));
    }
}

// ---- shell ----

/// A line of the shell, parsed as the verbs are on the command line.
#[derive(Parser)]
#[command(name = "jext4", no_binary_name = true)]
struct ShellLine {
    #[command(subcommand)]
    verb: ToolCommand,
}

/// `jext4 shell IMAGE`: verbs one per line from standard input in one
/// open of the image; a failing line is reported with its number and the
/// rest are not run, unless `-k`.
pub fn shell(args: &ShellArgs, common: &ImageArgs) -> u8 {
    use std::io::{BufRead, IsTerminal};
    let mut session = Session::new(common);
    session.default_image = Some(args.image.clone());
    session.plain_paths_in_image = true;
    if let Err(message) = session.image(&args.image) {
        eprintln!("jext4 shell: {message}");
        return 1;
    }
    let interactive = std::io::stdin().is_terminal();
    let mut status = 0;
    let mut lines = std::io::stdin().lock().lines();
    for number in 1.. {
        if interactive {
            eprint!("jext4> ");
        }
        let line = match lines.next() {
            None => break,
            Some(Ok(line)) => line,
            Some(Err(error)) => {
                eprintln!("jext4 shell: standard input: {error}");
                status = 1;
                break;
            }
        };
        session.label = format!("jext4 shell: line {number}: ");
        let line_status = shell_line(&mut session, &line);
        if line_status != 0 {
            status = 1;
            if !args.keep_going && !interactive {
                eprintln!("jext4 shell: line {number} failed; the rest are not run (-k goes on)");
                break;
            }
        }
    }
    match session.close() {
        Ok(()) => status,
        Err(message) => {
            eprintln!("jext4 shell: {message}");
            1
        }
    }
}

fn shell_line(session: &mut Session, line: &str) -> u8 {
    let words = match split_words(line) {
        Ok(words) => words,
        Err(message) => {
            eprintln!("{}{message}", session.label);
            return 1;
        }
    };
    if words.is_empty() || words[0].starts_with('#') {
        return 0;
    }
    match ShellLine::try_parse_from(&words) {
        Ok(ShellLine {
            verb: ToolCommand::Shell(_),
        }) => {
            eprintln!("{}shell: not inside a shell", session.label);
            1
        }
        Ok(parsed) => super::tools::dispatch(session, parsed.verb),
        Err(error) => {
            let text = error.to_string();
            // --help and --version are answers, not failures.
            match error.use_stderr() {
                true => {
                    let first = text
                        .lines()
                        .next()
                        .unwrap_or("")
                        .trim_start_matches("error: ");
                    eprintln!("{}{first}", session.label);
                    1
                }
                false => {
                    print!("{text}");
                    0
                }
            }
        }
    }
}

/// Words of a line, with '...' and "..." quoting and backslash escapes,
/// as a POSIX shell splits a simple command.
fn split_words(line: &str) -> Result<Vec<String>, String> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            ' ' | '\t' if in_word => {
                words.push(std::mem::take(&mut word));
                in_word = false;
            }
            ' ' | '\t' => {}
            '\'' => {
                in_word = true;
                loop {
                    match chars.next() {
                        Some('\'') => break,
                        Some(c) => word.push(c),
                        None => return Err("unterminated '".into()),
                    }
                }
            }
            '"' => {
                in_word = true;
                loop {
                    match chars.next() {
                        Some('"') => break,
                        Some('\\') => word.push(chars.next().ok_or("unterminated \"")?),
                        Some(c) => word.push(c),
                        None => return Err("unterminated \"".into()),
                    }
                }
            }
            '\\' => {
                in_word = true;
                word.push(chars.next().unwrap_or('\\'));
            }
            c => {
                in_word = true;
                word.push(c);
            }
        }
    }
    if in_word {
        words.push(word);
    }
    Ok(words)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_parse_as_chmod_reads_them() {
        assert_eq!(parse_mode("755", 0), Some(0o755));
        assert_eq!(parse_mode("4755", 0), Some(0o4755));
        assert_eq!(parse_mode("u+x", 0o644), Some(0o744));
        assert_eq!(parse_mode("go-w,a+X", 0o777), Some(0o755));
        assert_eq!(parse_mode("a=r", 0o777), Some(0o444));
        assert_eq!(parse_mode("u+s", 0o755), Some(0o4755));
        assert_eq!(parse_mode("zz", 0), None);
        assert_eq!(parse_mode("99", 0), None);
    }

    #[test]
    fn lines_split_as_a_shell_splits_them() {
        assert_eq!(
            split_words(r#"xattr set user.a "two words" 'it''s' a\ b"#).unwrap(),
            ["xattr", "set", "user.a", "two words", "its", "a b"]
        );
        assert!(split_words("echo 'open").is_err());
        assert_eq!(civil(0), ("1970-01-01".into(), "00:00:00".into()));
        assert_eq!(civil(951_782_400).0, "2000-02-29");
    }
}
