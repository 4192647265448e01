//! `-o` mount options: the engine's (`fs::MountOptions`) and FUSE's own.
//! Every option is either understood or refused by name: a typo must not
//! silently mount with defaults.

use crate::error::{Error, Result};
use crate::fs::{AtimePolicy, CACHE_SIZE_MIN, COMMIT_INTERVAL_MAX, MountOptions, SB_OPTION_MAX};
use std::time::Duration;

/// Options that concern the FUSE mount rather than the engine.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FuseOptions {
    pub allow_other: bool,
    pub allow_root: bool,
    /// Devices and setuid bits are honoured only when asked for, as with
    /// any FUSE mount.
    pub dev: bool,
    pub suid: bool,
    pub noexec: bool,
    pub fsname: Option<String>,
    pub subtype: Option<String>,
    /// FUSE worker threads (the `/dev/fuse` transport).
    pub threads: usize,
    /// How requests travel between the kernel and the server.
    pub transport: FuseTransport,
    /// Threads serving each io_uring queue (one queue per CPU).
    pub uring_threads: usize,
    /// Ring entries each of those threads registers.
    pub uring_depth: usize,
    /// How long, in µs after the last request, an io_uring queue thread
    /// polls for the next one instead of sleeping (0: never polls).
    pub uring_spin_us: u64,
    /// The same for the `/dev/fuse` worker whose turn it is to read.
    pub dev_spin_us: u64,
}

/// `fuse_transport=`: FUSE over io_uring where the kernel offers it and
/// `/dev/fuse` otherwise (`auto`), or one of them only.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum FuseTransport {
    #[default]
    Auto,
    Dev,
    Uring,
}

impl FuseTransport {
    pub fn name(self) -> &'static str {
        match self {
            FuseTransport::Auto => "auto",
            FuseTransport::Dev => "dev",
            FuseTransport::Uring => "uring",
        }
    }
}

/// The defaults of the io_uring transport's shape (bench/README.md,
/// "FUSE transports", has the measurements they come from).
pub const URING_THREADS_DEFAULT: usize = 4;
pub const URING_DEPTH_DEFAULT: usize = 1;
/// The polling windows of both transports (`pace.rs`).
pub const SPIN_US_DEFAULT: u64 = 200;
/// A bound on the polling window: past a few milliseconds a poller only
/// burns a CPU between requests that come too rarely to gain from it.
pub const SPIN_US_MAX: u64 = 10_000;

/// Parse a size with an optional K, M, G or T suffix (powers of 1024).
pub fn parse_size(text: &str) -> Result<u64> {
    let text = text.trim();
    let (digits, shift) = match text.chars().last().map(|c| c.to_ascii_uppercase()) {
        Some('K') => (&text[..text.len() - 1], 10),
        Some('M') => (&text[..text.len() - 1], 20),
        Some('G') => (&text[..text.len() - 1], 30),
        Some('T') => (&text[..text.len() - 1], 40),
        _ => (text, 0),
    };
    let value: u64 = digits.parse().map_err(|_| {
        Error::Invalid(format!("'{text}' is not a size (examples: 65536, 64M, 1G)"))
    })?;
    value
        .checked_mul(1u64 << shift)
        .ok_or_else(|| Error::Invalid(format!("size '{text}' is too large")))
}

fn parse_number<T: std::str::FromStr>(name: &str, value: &str) -> Result<T> {
    value
        .parse()
        .map_err(|_| Error::Invalid(format!("mount option {name}={value}: not a number")))
}

/// A count within `bounds`, refused by name otherwise.
fn parse_bounded(
    name: &str,
    value: &str,
    bounds: std::ops::RangeInclusive<usize>,
) -> Result<usize> {
    let number: usize = parse_number(name, value)?;
    if !bounds.contains(&number) {
        return Err(Error::Invalid(format!(
            "mount option {name}={value}: must be between {} and {}",
            bounds.start(),
            bounds.end()
        )));
    }
    Ok(number)
}

/// `commit=SECONDS` as the kernel bounds it (fs/ext4/super.c): 0 means the
/// default (5), at most INT_MAX / HZ.
fn parse_commit(value: &str) -> Result<Duration> {
    // Parsed wide so that a huge value is told it is too big, not "not a
    // number"; anything above the bound is refused either way.
    let seconds: u64 = parse_number("commit", value)?;
    let max = COMMIT_INTERVAL_MAX.as_secs();
    match seconds {
        0 => Ok(MountOptions::default().commit_interval),
        seconds if seconds > max => Err(Error::Invalid(format!(
            "mount option commit={value}: the commit interval must be at most {max} seconds \
             (the kernel's INT_MAX / HZ)"
        ))),
        seconds => Ok(Duration::from_secs(seconds)),
    }
}

/// `sb=N`, the superblock copy to mount, as the kernel reads it
/// (fs/ext4/super.c: `fsparam_u32`, so C's base prefixes: `0x` hexadecimal,
/// a leading `0` octal): in 1 KiB units whatever the block size, a u32.
/// 0 is refused here, where the kernel would look for a superblock in the
/// boot block and not find one.
pub fn parse_sb(value: &str) -> Result<u64> {
    const UNIT: &str = "the superblock's offset in 1 KiB units: sb=8193 for block 8193 of a \
                        1 KiB-block filesystem, sb=131072 for block 32768 of a 4 KiB-block one";
    let (digits, radix) = match value
        .strip_prefix("0x")
        .or_else(|| value.strip_prefix("0X"))
    {
        Some(hex) => (hex, 16),
        None if value.len() > 1 && value.starts_with('0') => (&value[1..], 8),
        None => (value, 10),
    };
    if digits.is_empty() || !digits.chars().all(|c| c.is_digit(radix)) {
        return Err(Error::Invalid(format!(
            "mount option sb={value}: not a number ({UNIT})"
        )));
    }
    // Only an overflow can fail now: more than u64 is more than u32 too.
    let number = u64::from_str_radix(digits, radix).unwrap_or(u64::MAX);
    if number > SB_OPTION_MAX {
        return Err(Error::Invalid(format!(
            "mount option sb={value}: at most {SB_OPTION_MAX} (the kernel's sb= is 32 bits)"
        )));
    }
    if number == 0 {
        return Err(Error::Invalid(format!(
            "mount option sb={value}: offset 0 is the boot block, not a superblock (sb=1 is \
             the primary; {UNIT})"
        )));
    }
    Ok(number)
}

/// `cache_size=SIZE`: at least 1M, and no more than the machine's memory (a
/// bound on what the cache may pin, so a typo cannot promise more).
fn parse_cache_size(value: &str) -> Result<u64> {
    let size = parse_size(value).map_err(|error| match error {
        Error::Invalid(why) => Error::Invalid(format!("mount option cache_size={value}: {why}")),
        other => other,
    })?;
    if size < CACHE_SIZE_MIN {
        return Err(Error::Invalid(format!(
            "mount option cache_size={value}: must be at least 1M"
        )));
    }
    if let Some(memory) = physical_memory()
        && size > memory
    {
        return Err(Error::Invalid(format!(
            "mount option cache_size={value}: more than this machine's memory ({} MiB)",
            memory >> 20
        )));
    }
    Ok(size)
}

/// Total RAM, from sysinfo(2).
fn physical_memory() -> Option<u64> {
    // SAFETY: sysinfo fills the zeroed struct we pass and reads nothing.
    let mut info: libc::sysinfo = unsafe { std::mem::zeroed() };
    // SAFETY: as above; the pointer is to a live, writable struct.
    if unsafe { libc::sysinfo(&mut info) } != 0 {
        return None;
    }
    (info.totalram as u64).checked_mul(info.mem_unit.max(1) as u64)
}

/// Parse the comma-separated lists given with `-o` (possibly several).
pub fn parse_mount_options(lists: &[String]) -> Result<(MountOptions, FuseOptions)> {
    let mut engine = MountOptions {
        // A measurement switch, not a mount option: docs/out-of-space.md.
        space_budget: std::env::var_os("JEXT4_SPACE_BUDGET").is_none_or(|value| value != "off"),
        ..MountOptions::default()
    };
    let mut fuse = FuseOptions {
        threads: 4,
        uring_threads: URING_THREADS_DEFAULT,
        uring_depth: URING_DEPTH_DEFAULT,
        uring_spin_us: SPIN_US_DEFAULT,
        dev_spin_us: SPIN_US_DEFAULT,
        ..FuseOptions::default()
    };
    for option in lists.iter().flat_map(|list| list.split(',')).map(str::trim) {
        if option.is_empty() {
            continue;
        }
        let (name, value) = match option.split_once('=') {
            Some((name, value)) => (name, Some(value)),
            None => (option, None),
        };
        fn needs_value<'v>(name: &str, value: Option<&'v str>) -> Result<&'v str> {
            value.ok_or_else(|| {
                Error::Invalid(format!("mount option {name} needs a value ({name}=...)"))
            })
        }
        match (name, value) {
            ("ro", None) => engine.read_only = true,
            ("rw", None) => engine.read_only = false,
            ("sync", None) => engine.sync = true,
            ("async", None) => engine.sync = false,
            ("dirsync", None) => engine.dirsync = true,
            ("noatime", None) => engine.atime = AtimePolicy::Never,
            ("nodiratime", None) => engine.nodiratime = true,
            ("diratime", None) => engine.nodiratime = false,
            ("relatime", None) => engine.atime = AtimePolicy::Relatime,
            ("strictatime", None) | ("atime", None) => engine.atime = AtimePolicy::Strict,
            ("cache_size", value) => {
                engine.cache_size = parse_cache_size(needs_value(name, value)?)?
            }
            ("commit", value) => engine.commit_interval = parse_commit(needs_value(name, value)?)?,
            ("sb", value) => engine.sb = parse_sb(needs_value(name, value)?)?,
            ("errors", Some("remount-ro")) => {}
            ("errors", Some(other)) => {
                return Err(Error::Invalid(format!(
                    "errors={other} is not supported (jext4 always turns read-only on errors: errors=remount-ro)"
                )));
            }
            // File data always reaches its blocks before the commit that
            // maps them, so writeback gives ordered's guarantee too.
            ("data", Some("ordered" | "writeback")) => engine.data_journal = Some(false),
            ("data", Some("journal")) => engine.data_journal = Some(true),
            ("data", Some(other)) => {
                return Err(Error::Invalid(format!(
                    "data={other}: expected ordered, writeback or journal"
                )));
            }
            ("journal_async_commit", None) => engine.journal_async_commit = true,
            // Fast commits: on by default where the image has the feature.
            ("fast_commit", None | Some("on")) => engine.fast_commit = Some(true),
            ("fast_commit", Some("global")) => {
                engine.fast_commit = Some(true);
                engine.fast_commit_global = true;
            }
            ("bytelog", None) => engine.bytelog = true,
            ("delalloc", None) => engine.delalloc = true,
            // Quota limits, enforced only where asked, as the kernel's.
            ("quota" | "usrquota", None) => engine.quota_limits[0] = true,
            ("grpquota", None) => engine.quota_limits[1] = true,
            ("prjquota", None) => engine.quota_limits[2] = true,
            ("noquota", None) => engine.quota_limits = [false; 3],
            ("nodelalloc", None) => engine.delalloc = false,
            ("fast_commit", Some("off")) => engine.fast_commit = Some(false),
            ("fast_commit", Some(other)) => {
                return Err(Error::Invalid(format!(
                    "fast_commit={other}: expected on, off or global"
                )));
            }
            // The kernel's option: the external journal's device.
            ("journal_path", value) => {
                engine.journal_path = Some(needs_value(name, value)?.into());
            }
            ("noload", None) | ("norecovery", None) => {
                engine.noload = true;
                engine.read_only = true;
            }
            ("allow_other", None) => fuse.allow_other = true,
            ("allow_root", None) => fuse.allow_root = true,
            ("default_permissions", None) => {} // always on
            // What fstab lines and mount(8) carry for userspace (mount
            // helpers get them passed through): no meaning for the mount.
            (
                "defaults" | "auto" | "noauto" | "nofail" | "_netdev" | "user" | "users" | "nouser",
                None,
            ) => {}
            (name, _) if name.starts_with("x-") || name == "comment" => {}
            ("dev", None) => fuse.dev = true,
            ("nodev", None) => fuse.dev = false,
            ("suid", None) => fuse.suid = true,
            ("nosuid", None) => fuse.suid = false,
            ("exec", None) => fuse.noexec = false,
            ("noexec", None) => fuse.noexec = true,
            ("fsname", value) => fuse.fsname = Some(needs_value(name, value)?.to_string()),
            ("subtype", value) => fuse.subtype = Some(needs_value(name, value)?.to_string()),
            ("threads", value) => {
                fuse.threads = parse_bounded(name, needs_value(name, value)?, 1..=64)?
            }
            ("fuse_transport", value) => {
                fuse.transport = match needs_value(name, value)? {
                    "auto" => FuseTransport::Auto,
                    "dev" => FuseTransport::Dev,
                    "uring" => FuseTransport::Uring,
                    other => {
                        return Err(Error::Invalid(format!(
                            "mount option fuse_transport={other}: expected auto, dev or uring"
                        )));
                    }
                }
            }
            ("uring_threads", value) => {
                fuse.uring_threads = parse_bounded(name, needs_value(name, value)?, 1..=16)?
            }
            ("uring_depth", value) => {
                fuse.uring_depth = parse_bounded(name, needs_value(name, value)?, 1..=64)?
            }
            ("uring_spin", value) => {
                fuse.uring_spin_us =
                    parse_bounded(name, needs_value(name, value)?, 0..=SPIN_US_MAX as usize)? as u64
            }
            ("dev_spin", value) => {
                fuse.dev_spin_us =
                    parse_bounded(name, needs_value(name, value)?, 0..=SPIN_US_MAX as usize)? as u64
            }
            (_, Some(_)) if is_flag_option(name) => {
                return Err(Error::Invalid(format!(
                    "mount option {name} takes no value"
                )));
            }
            _ => return Err(Error::Invalid(format!("unknown mount option '{option}'"))),
        }
    }
    if fuse.allow_other && fuse.allow_root {
        return Err(Error::Invalid(
            "allow_other and allow_root exclude each other".into(),
        ));
    }
    Ok((engine, fuse))
}

fn is_flag_option(name: &str) -> bool {
    matches!(
        name,
        "ro" | "rw"
            | "sync"
            | "async"
            | "dirsync"
            | "noatime"
            | "relatime"
            | "strictatime"
            | "atime"
            | "allow_other"
            | "allow_root"
            | "dev"
            | "nodev"
            | "suid"
            | "nosuid"
            | "exec"
            | "noexec"
            | "journal_async_commit"
            | "noload"
            | "norecovery"
            | "quota"
            | "usrquota"
            | "grpquota"
            | "prjquota"
            | "noquota"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_lists_and_refuses_unknown_options() {
        let (engine, fuse) =
            parse_mount_options(&["ro,cache_size=64M".into(), "allow_other,commit=10".into()])
                .unwrap();
        assert!(engine.read_only);
        assert_eq!(engine.cache_size, 64 << 20);
        assert_eq!(engine.commit_interval, Duration::from_secs(10));
        assert!(fuse.allow_other);
        let error = parse_mount_options(&["rw,nosuchthing".into()]).unwrap_err();
        assert!(error.to_string().contains("nosuchthing"), "{error}");
        assert!(parse_mount_options(&["cache_size=lots".into()]).is_err());
        assert!(parse_mount_options(&["cache_size".into()]).is_err());
        assert!(parse_mount_options(&["ro=1".into()]).is_err());
        let journal = parse_mount_options(&["data=journal".into()]).unwrap();
        assert_eq!(journal.0.data_journal, Some(true));
        let ordered = parse_mount_options(&["data=ordered".into()]).unwrap();
        assert_eq!(ordered.0.data_journal, Some(false));
        assert_eq!(parse_mount_options(&[]).unwrap().0.data_journal, None);
        assert!(parse_mount_options(&["data=writeback".into()]).is_ok());
        let quota = |list: &str| parse_mount_options(&[list.into()]).map(|(e, _)| e.quota_limits);
        assert_eq!(quota("usrquota,prjquota").unwrap(), [true, false, true]);
        assert_eq!(quota("quota,grpquota").unwrap(), [true, true, false]);
        assert_eq!(quota("usrquota,noquota").unwrap(), [false; 3]);
        assert!(quota("usrquota=1").is_err());
        // Numbers bounded as the kernel bounds them, refused by name.
        for bad in [
            "commit=9223372036854775807",
            "commit=8589935",
            "commit=-1",
            "commit=4294967296",
            "cache_size=512K",
            "cache_size=16777215T",
            "threads=0",
            "threads=65",
            "uring_threads=0",
            "uring_threads=17",
            "uring_depth=0",
            "uring_depth=65",
            "uring_spin=10001",
            "uring_spin=-1",
            "uring_spin",
            "dev_spin=10001",
            "dev_spin=x",
            "dev_spin",
            "fuse_transport=fast",
            "fuse_transport",
            "sb",
            "sb=",
            "sb=abc",
            "sb=0",
            "sb=-1",
            "sb=0x",
            "sb=09",
            "sb=4294967296",
            "sb=99999999999999999999999",
        ] {
            let error = parse_mount_options(&[bad.into()]).unwrap_err();
            let name = bad.split('=').next().unwrap();
            assert!(error.to_string().contains(name), "{bad}: {error}");
        }
        let (engine, _) = parse_mount_options(&["commit=8589934".into()]).unwrap();
        assert_eq!(engine.commit_interval, COMMIT_INTERVAL_MAX);
        let (engine, _) = parse_mount_options(&["commit=0".into()]).unwrap();
        assert_eq!(engine.commit_interval, Duration::from_secs(5));
        let (engine, _) = parse_mount_options(&["noload,journal_async_commit".into()]).unwrap();
        assert!(engine.noload && engine.read_only && engine.journal_async_commit);
        assert_eq!(parse_size("1G").unwrap(), 1 << 30);
    }

    /// `sb=` in the kernel's unit (1 KiB) with C's base prefixes, as
    /// `fsparam_u32` reads it.
    #[test]
    fn sb_is_read_as_the_kernel_reads_it() {
        let (engine, _) = parse_mount_options(&[]).unwrap();
        assert_eq!(engine.sb, 1, "the primary by default");
        for (text, value) in [
            ("sb=131072", 131072),
            ("sb=8193", 8193),
            ("sb=0x2001", 8193),
            ("sb=020001", 8193),
            ("sb=4294967295", 4294967295),
        ] {
            let (engine, _) = parse_mount_options(&[text.into()]).unwrap();
            assert_eq!(engine.sb, value, "{text}");
            assert_eq!(engine.superblock_offset(), value * 1024, "{text}");
        }
        let zero = parse_sb("0").unwrap_err().to_string();
        assert!(
            zero.contains("boot block") && zero.contains("sb=1"),
            "{zero}"
        );
    }

    #[test]
    fn fuse_transport_is_auto_dev_or_uring() {
        let parse = |text: &str| parse_mount_options(&[text.into()]).map(|(_, fuse)| fuse);
        assert_eq!(parse("rw").unwrap().transport, FuseTransport::Auto);
        assert_eq!(
            parse("fuse_transport=dev").unwrap().transport,
            FuseTransport::Dev
        );
        let fuse = parse("fuse_transport=uring,uring_threads=3,uring_depth=4").unwrap();
        assert_eq!(
            (fuse.transport, fuse.uring_threads, fuse.uring_depth),
            (FuseTransport::Uring, 3, 4)
        );
        assert_eq!(
            (fuse.uring_spin_us, fuse.dev_spin_us),
            (SPIN_US_DEFAULT, SPIN_US_DEFAULT)
        );
        assert_eq!(parse("uring_spin=0").unwrap().uring_spin_us, 0);
        assert_eq!(parse("uring_spin=10000").unwrap().uring_spin_us, 10_000);
        let fuse = parse("dev_spin=0").unwrap();
        assert_eq!((fuse.dev_spin_us, fuse.uring_spin_us), (0, SPIN_US_DEFAULT));
        assert_eq!(parse("dev_spin=10000").unwrap().dev_spin_us, 10_000);
        let error = parse("fuse_transport=ring").unwrap_err().to_string();
        assert!(
            error.contains("fuse_transport=ring") && error.contains("auto, dev or uring"),
            "{error}"
        );
    }

    #[test]
    fn fast_commit_is_on_off_or_the_images_default() {
        let parse = |text: &str| parse_mount_options(&[text.into()]).map(|(engine, _)| engine);
        assert_eq!(parse("rw").unwrap().fast_commit, None);
        assert_eq!(parse("fast_commit").unwrap().fast_commit, Some(true));
        assert_eq!(parse("fast_commit=on").unwrap().fast_commit, Some(true));
        assert_eq!(parse("fast_commit=off").unwrap().fast_commit, Some(false));
        let global = parse("fast_commit=global").unwrap();
        assert_eq!(global.fast_commit, Some(true));
        assert!(global.fast_commit_global);
        assert!(!parse("fast_commit").unwrap().fast_commit_global);
        let error = parse("fast_commit=maybe").unwrap_err();
        assert!(error.to_string().contains("fast_commit=maybe"), "{error}");
    }
}
