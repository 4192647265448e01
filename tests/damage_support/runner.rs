//! The differential run of one damaged image: the same workload through a
//! kernel loop mount (`errors=remount-ro`) and through a jext4 FUSE mount,
//! each on its own copy, then `e2fsck -fn` on both results; a read-only
//! jext4 mount walks a third copy, which must stay byte-identical. The
//! kernel, debugfs and e2fsck are the oracles:
//! - e2fsck: jext4 must leave no problem kind the kernel's run does not
//!   (see `compare_fsck` for damage the kernel's run repairs);
//! - listings: every name the kernel lists, jext4 lists, or it reports an
//!   error for that directory; a directory the kernel lists in full
//!   (every name debugfs lists) without an error, jext4 lists without one
//!   too (one bad entry fails its own lookup, DESIGN.md section 5); no name twice; a listed name stat-able
//!   or its error reported; the same lstat and content where both answer;
//!   names debugfs lists on the damaged image that both mounts miss are
//!   noted;
//! - no panic, no hang (every step has a time limit), the read-only copy
//!   unchanged, the data written read back as written;
//! - every error jext4 returns for what it found on disk is in its log,
//!   with a location, once (the same location and detail on two lines
//!   fails "log once").

use super::damage::{self, Damage, Kind};
use super::fsck;
use super::workload::{self, Outcome, Record, Walk, errno_name, is_corruption_errno};
use crate::common;
use crate::common::e2e::{JextMount, path_str, run};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::Path;
use std::time::{Duration, Instant};

/// One mount's run.
#[derive(Debug, Default)]
pub struct Side {
    pub mount_error: Option<String>,
    pub record: Record,
    pub unmount_error: Option<String>,
    /// The kernel's messages about its loop device, or jext4's server log.
    pub log: String,
    pub fsck: fsck::Report,
}

impl Side {
    fn walk(&self) -> Option<&Walk> {
        self.record.walk.as_ref()
    }

    fn step(&self, name: &str) -> Option<&Outcome> {
        self.record
            .steps
            .iter()
            .find(|(step, _)| step == name)
            .map(|(_, outcome)| outcome)
    }
}

/// A check that failed, in words for the report.
#[derive(Debug, Clone)]
pub struct Finding {
    pub check: &'static str,
    pub text: String,
}

#[derive(Debug)]
pub struct Run {
    pub damage: Damage,
    pub damaged_fsck: fsck::Report,
    /// Names debugfs lists on the damaged image, per directory.
    pub debugfs: BTreeMap<String, Vec<Vec<u8>>>,
    pub kernel: Side,
    pub jext4: Side,
    pub jext4_read_only: Side,
    pub findings: Vec<Finding>,
    pub notes: Vec<String>,
    pub elapsed: Duration,
}

impl Run {
    pub fn passed(&self) -> bool {
        self.findings.is_empty()
    }
}

/// Damage, run both sides, compare.
pub fn run_one(kind: Kind, seed: u64, dir: &Path) -> Run {
    let started = Instant::now();
    let damage = damage::make(kind, seed, dir);
    let damaged_fsck = fsck::check(&damage.image);
    let copy = |suffix: &str| {
        let path = damage.image.with_extension(format!("{suffix}.img"));
        std::fs::copy(&damage.image, &path).unwrap();
        path
    };
    let jext4_read_only = jext4_side(&copy("jext4-ro"), &damage, true);
    let kernel = kernel_side(&copy("kernel"), &damage);
    let jext4 = jext4_side(&copy("jext4"), &damage, false);
    let dirs: BTreeSet<String> = [&kernel, &jext4, &jext4_read_only]
        .iter()
        .filter_map(|side| side.walk())
        .flat_map(|walk| walk.dirs.keys().cloned())
        .chain(["/", "/big", "/tree", "/tree/names", "/tree/sub"].map(String::from))
        .collect();
    let debugfs = debugfs_listings(&damage.image, &dirs);
    let mut run = Run {
        damage,
        damaged_fsck,
        debugfs,
        kernel,
        jext4,
        jext4_read_only,
        findings: Vec::new(),
        notes: Vec::new(),
        elapsed: Duration::ZERO,
    };
    compare(&mut run);
    run.elapsed = started.elapsed();
    run
}

// ---------------------------------------------------------------------------
// The two mounts.

fn kernel_side(image: &Path, damage: &Damage) -> Side {
    let mut side = Side::default();
    let mount_point = workload::mount_point(image.parent().unwrap(), "kernel.mnt");
    let marker = format!("damage_diff: kernel run of {}", image.display());
    mark_kernel_log(&marker);
    let attach = run("losetup", &["-f", "--show", path_str(image)]);
    assert!(attach.status.success(), "losetup: {attach:?}");
    let device = String::from_utf8_lossy(&attach.stdout).trim().to_string();
    let mounted = run(
        "mount",
        &[
            "-t",
            "ext4",
            "-o",
            "errors=remount-ro",
            &device,
            path_str(&mount_point),
        ],
    );
    if mounted.status.success() {
        side.record = workload::run(&mount_point, &damage.plan);
        let hung = side
            .record
            .steps
            .iter()
            .any(|(_, outcome)| *outcome == Outcome::Hang);
        assert!(
            !hung,
            "the kernel's mount hung in the workload; the machine needs a look"
        );
        common::kernel_umount(&mount_point);
    } else {
        side.mount_error = Some(String::from_utf8_lossy(&mounted.stderr).trim().to_string());
    }
    let _ = run("losetup", &["-d", &device]);
    let name = device.trim_start_matches("/dev/");
    let messages = kernel_messages();
    let start = messages
        .iter()
        .rposition(|line| line.contains(&marker))
        .map_or(0, |at| at + 1);
    side.log = messages[start..]
        .iter()
        .filter(|line| {
            [")", "-", ":"]
                .iter()
                .any(|end| line.contains(&format!("{name}{end}")))
        })
        .cloned()
        .collect::<Vec<_>>()
        .join("\n");
    side.fsck = fsck::check(image);
    side
}

/// A line in the kernel's log, so that what follows it is this run's
/// (a count of lines would not do: the ring buffer drops old lines).
fn mark_kernel_log(marker: &str) {
    use std::io::Write as _;
    if let Ok(mut kmsg) = std::fs::OpenOptions::new().write(true).open("/dev/kmsg") {
        let _ = writeln!(kmsg, "{marker}");
    }
}

/// The kernel's log, without timestamps.
fn kernel_messages() -> Vec<String> {
    let output = run("dmesg", &[]);
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(|line| match line.find("] ") {
            Some(end) if line.starts_with('[') => line[end + 2..].to_string(),
            _ => line.to_string(),
        })
        .collect()
}

fn jext4_side(image: &Path, damage: &Damage, read_only: bool) -> Side {
    let mut side = Side::default();
    let name = if read_only {
        "jext4-ro.mnt"
    } else {
        "jext4.mnt"
    };
    let mount_point = workload::mount_point(image.parent().unwrap(), name);
    let options = if read_only {
        "ro,allow_other"
    } else {
        "allow_other"
    };
    let mount = match JextMount::try_mount(image, &mount_point, options) {
        Ok(mount) => mount,
        Err((output, log)) => {
            side.mount_error = Some(String::from_utf8_lossy(&output.stderr).trim().to_string());
            side.log = log;
            side.fsck = fsck::check(image);
            return side;
        }
    };
    if read_only {
        match workload::walk_only(&mount_point) {
            Ok(walk) => side.record.walk = Some(walk),
            Err(()) => side.record.steps.push(("walk".into(), Outcome::Hang)),
        }
    } else {
        side.record = workload::run(&mount_point, &damage.plan);
    }
    let hung = side
        .record
        .steps
        .iter()
        .any(|(_, outcome)| *outcome == Outcome::Hang);
    if hung {
        // The server does not answer: end it, so the stuck step's system
        // call returns and the mount can go.
        let pid = mount.server_pid();
        // SAFETY: kill(2) on the pid of the server this run started.
        unsafe { libc::kill(pid, libc::SIGKILL) };
        side.unmount_error = Some(format!("killed the server (pid {pid}) after a hang"));
        side.log = mount.server_log();
        drop(mount);
    } else {
        let output = std::process::Command::new(common::e2e::JEXT4)
            .args(["umount", "--timeout", "60"])
            .arg(&mount_point)
            .output()
            .expect("running jext4 umount");
        let log = mount.log.clone();
        if output.status.success() && !common::e2e::is_mount_point(&mount_point) {
            mount.forget();
        } else {
            side.unmount_error = Some(format!(
                "jext4 umount: {} {}",
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            ));
            drop(mount);
        }
        // Read after the server exited: its last lines are the unmount's.
        side.log = std::fs::read_to_string(&log).unwrap_or_default();
    }
    side.fsck = fsck::check(image);
    side
}

// ---------------------------------------------------------------------------
// debugfs's view of the damaged image.

/// `ls -p` of each directory, on the damaged image: `/ino/mode/uid/gid/
/// name/size/` per entry. A name may hold a '/', so it is what lies
/// between the fourth slash and the last two.
fn debugfs_listings(image: &Path, dirs: &BTreeSet<String>) -> BTreeMap<String, Vec<Vec<u8>>> {
    let script = image.with_extension("ls-cmds");
    let commands: String = dirs
        .iter()
        .map(|dir| format!("ls -p \"{dir}\"\n"))
        .collect();
    std::fs::write(&script, commands).unwrap();
    let output = run("debugfs", &["-f", path_str(&script), path_str(image)]);
    let mut listings = BTreeMap::new();
    let mut current: Option<String> = None;
    for line in output.stdout.split(|&byte| byte == b'\n') {
        if let Some(rest) = line.strip_prefix(b"debugfs: ls -p \"") {
            let dir = String::from_utf8_lossy(rest.strip_suffix(b"\"").unwrap_or(rest));
            current = Some(dir.into_owned());
            listings.insert(current.clone().unwrap(), Vec::new());
            continue;
        }
        let (Some(dir), Some(body)) = (&current, line.strip_prefix(b"/")) else {
            continue;
        };
        let mut fields = body.splitn(5, |&byte| byte == b'/');
        let ino_mode_uid_gid: Vec<_> = fields.by_ref().take(4).collect();
        let Some(rest) = fields.next() else { continue };
        // Inode 0: an unused record (the fake entries of htree nodes, the
        // empty blocks of lost+found), which no readdir returns.
        if ino_mode_uid_gid.first() == Some(&&b"0"[..]) {
            continue;
        }
        // rest = name/size/
        let Some(rest) = rest.strip_suffix(b"/") else {
            continue;
        };
        let Some(end) = rest.iter().rposition(|&byte| byte == b'/') else {
            continue;
        };
        let name = rest[..end].to_vec();
        if name != b"." && name != b".." {
            listings.get_mut(dir).unwrap().push(name);
        }
    }
    listings
}

// ---------------------------------------------------------------------------
// The comparison.

fn compare(run: &mut Run) {
    let mut findings = Vec::new();
    let mut notes = Vec::new();
    compare_mounts(run, &mut findings, &mut notes);
    if let Some(kernel_walk) = run.kernel.walk() {
        for (label, side) in [
            ("read-write", &run.jext4),
            ("read-only", &run.jext4_read_only),
        ] {
            if let Some(walk) = side.walk() {
                let views = Views {
                    kernel: kernel_walk,
                    ours: walk,
                    debugfs: &run.debugfs,
                };
                compare_walks(label, &views, &mut findings, &mut notes);
            }
        }
    }
    compare_debugfs(run, &mut findings, &mut notes);
    compare_fsck(run, &mut findings, &mut notes);
    check_log(run, &mut findings);
    if run.damaged_fsck.exit_code == 0 {
        compare_clean_image(run, &mut findings);
    }
    run.findings = findings;
    run.notes = notes;
}

fn finding(findings: &mut Vec<Finding>, check: &'static str, text: String) {
    findings.push(Finding { check, text });
}

fn compare_mounts(run: &Run, findings: &mut Vec<Finding>, notes: &mut Vec<String>) {
    for (label, side) in [
        ("read-write", &run.jext4),
        ("read-only", &run.jext4_read_only),
    ] {
        if let Some(error) = &side.mount_error {
            if run.kernel.mount_error.is_none() {
                finding(
                    findings,
                    "mount",
                    format!("jext4 refused the {label} mount the kernel made: {error}"),
                );
            } else {
                notes.push(format!(
                    "jext4 {label} mount refused, as the kernel's: {error}"
                ));
            }
        }
        if side.log.contains("panicked") {
            finding(findings, "panic", format!("the {label} server panicked"));
        }
        for (step, outcome) in &side.record.steps {
            if *outcome == Outcome::Hang {
                finding(findings, "hang", format!("{label}: step '{step}' hung"));
            }
        }
        if let Some(error) = &side.unmount_error {
            // `jext4 umount` exits 1 to report an aborted journal; the
            // kernel's umount says nothing, but its log does. An abort the
            // kernel made too is the same answer.
            let both_aborted =
                error.contains("journal aborted") && run.kernel.log.contains("Aborting journal");
            if both_aborted {
                notes.push(format!(
                    "{label}: journal aborted, as the kernel's: {error}"
                ));
            } else {
                finding(findings, "unmount", format!("{label}: {error}"));
            }
        }
    }
    if let Some(error) = &run.kernel.mount_error {
        notes.push(format!("the kernel refused the mount: {error}"));
    }
    let original = std::fs::read(&run.damage.image).unwrap();
    let read_only = run.damage.image.with_extension("jext4-ro.img");
    let after = std::fs::read(&read_only).unwrap();
    if original != after {
        let block_size = common::journal::fs_superblock(&run.damage.image).block_size() as usize;
        let blocks: Vec<usize> = (0..original.len() / block_size)
            .filter(|&block| {
                let range = block * block_size..(block + 1) * block_size;
                original[range.clone()] != after[range]
            })
            .take(8)
            .collect();
        finding(
            findings,
            "read-only",
            format!("the read-only mount changed the image (blocks {blocks:?} ...)"),
        );
    }
    if let Some(Outcome::Done(what)) = run.jext4.step(&read_back_step(run))
        && what.starts_with("WRONG")
    {
        finding(findings, "data", format!("jext4 read back {what}"));
    }
}

fn read_back_step(run: &Run) -> String {
    format!("read back {}/moved-in", run.damage.plan.target_dir)
}

fn show_name(name: &[u8]) -> String {
    format!("{:?}", String::from_utf8_lossy(name))
}

fn few<T: std::fmt::Display>(items: &[T]) -> String {
    let shown: Vec<String> = items.iter().take(5).map(|item| item.to_string()).collect();
    if items.len() > 5 {
        format!("{} and {} more", shown.join(", "), items.len() - 5)
    } else {
        shown.join(", ")
    }
}

/// What the kernel's walk, jext4's walk and debugfs saw.
struct Views<'a> {
    kernel: &'a Walk,
    ours: &'a Walk,
    debugfs: &'a BTreeMap<String, Vec<Vec<u8>>>,
}

fn compare_walks(label: &str, views: &Views, findings: &mut Vec<Finding>, notes: &mut Vec<String>) {
    compare_listings(label, views, findings, notes);
    compare_entries(label, views, findings, notes);
}

/// Directory by directory: names twice, readdir errors, names missing.
fn compare_listings(
    label: &str,
    views: &Views,
    findings: &mut Vec<Finding>,
    notes: &mut Vec<String>,
) {
    let (kernel, ours) = (views.kernel, views.ours);
    for (dir, theirs) in &kernel.dirs {
        let Some(listing) = ours.dirs.get(dir) else {
            continue; // not reached: the entry's own error was reported
        };
        let mut seen = BTreeSet::new();
        let twice: Vec<String> = listing
            .names
            .iter()
            .filter(|name| !seen.insert(name.as_slice()))
            .map(|name| show_name(name))
            .collect();
        if !twice.is_empty() {
            finding(
                findings,
                "listing",
                format!(
                    "{label}: {dir} lists {} name(s) twice: {}",
                    twice.len(),
                    few(&twice)
                ),
            );
        }
        if let Some(errno) = listing.error {
            // DESIGN.md section 5: one bad entry fails its own lookup,
            // not the whole listing (the kernel's readdir returns every
            // name; issue 24 point 5). Where the kernel's own listing is
            // short of debugfs's, an error is no worse than it: a note.
            if theirs.error.is_none() {
                let on_disk = views.debugfs.get(dir);
                let kernel_names: BTreeSet<&Vec<u8>> = theirs.names.iter().collect();
                let complete = on_disk
                    .is_none_or(|names| names.iter().all(|name| kernel_names.contains(name)));
                let text = format!(
                    "{label}: readdir {dir} fails with {} after {} names; the kernel lists {} without an error (debugfs {})",
                    errno_name(errno),
                    listing.names.len(),
                    theirs.names.len(),
                    on_disk.map_or(0, Vec::len)
                );
                if complete {
                    finding(findings, "readdir", text);
                } else {
                    notes.push(text);
                }
            }
            continue;
        }
        let missing: Vec<String> = theirs
            .names
            .iter()
            .filter(|name| !seen.contains(name.as_slice()))
            .map(|name| show_name(name))
            .collect();
        if !missing.is_empty() {
            finding(
                findings,
                "listing",
                format!(
                    "{label}: {dir} lists {} names without an error; the kernel lists {} more: {}",
                    listing.names.len(),
                    missing.len(),
                    few(&missing)
                ),
            );
        }
    }
}

/// Entry by entry: lstat and content where both mounts answer.
fn compare_entries(
    label: &str,
    views: &Views,
    findings: &mut Vec<Finding>,
    notes: &mut Vec<String>,
) {
    let (kernel, ours) = (views.kernel, views.ours);
    let mut unreadable = Vec::new();
    for (path, entry) in &ours.entries {
        let Some(theirs) = kernel.entries.get(path) else {
            continue;
        };
        match (&entry.stat, &theirs.stat) {
            (Err(libc::ENOENT), Ok(_)) => finding(
                findings,
                "listing",
                format!("{label}: {path} is listed but lstat says ENOENT (the kernel stats it)"),
            ),
            (Ok(ours), Ok(theirs)) if ours != theirs => finding(
                findings,
                "stat",
                format!("{label}: lstat {path}: jext4 {ours:?}, the kernel {theirs:?}"),
            ),
            (Ok(_), Err(errno)) => notes.push(format!(
                "{label}: jext4 stats {path}, the kernel says {}",
                errno_name(*errno)
            )),
            _ => {}
        }
        match (&entry.content, &theirs.content) {
            (Some(Ok(ours)), Some(Ok(theirs))) if ours != theirs => finding(
                findings,
                "data",
                format!(
                    "{label}: {path} reads {} bytes (crc {:#x}), the kernel {} bytes (crc {:#x})",
                    ours.0, ours.1, theirs.0, theirs.1
                ),
            ),
            (Some(Err(errno)), Some(Ok(_))) => {
                unreadable.push(format!("{path} ({})", errno_name(*errno)))
            }
            _ => {}
        }
    }
    if !unreadable.is_empty() {
        notes.push(format!(
            "{label}: jext4 cannot read what the kernel reads: {}",
            few(&unreadable)
        ));
    }
}

/// Names debugfs lists that a mount's error-free listing lacks.
fn compare_debugfs(run: &Run, findings: &mut Vec<Finding>, notes: &mut Vec<String>) {
    for (dir, names) in &run.debugfs {
        let kernel_listing = run
            .kernel
            .walk()
            .and_then(|walk| walk.dirs.get(dir))
            .filter(|listing| listing.error.is_none());
        if let Some(listing) = kernel_listing {
            let listed: BTreeSet<&Vec<u8>> = listing.names.iter().collect();
            let lost = names.iter().filter(|name| !listed.contains(name)).count();
            if lost > 0 {
                notes.push(format!(
                    "the kernel lists {dir} without an error but misses {lost} of the {} names debugfs lists",
                    names.len()
                ));
            }
        }
        let listed = |side: &Side| {
            side.walk()
                .and_then(|walk| walk.dirs.get(dir))
                .filter(|listing| listing.error.is_none())
                .map(|listing| listing.names.iter().cloned().collect::<BTreeSet<_>>())
        };
        let Some(ours) = listed(&run.jext4_read_only).or_else(|| listed(&run.jext4)) else {
            continue;
        };
        let missing: Vec<&Vec<u8>> = names.iter().filter(|name| !ours.contains(*name)).collect();
        if missing.is_empty() {
            continue;
        }
        let shown: Vec<String> = missing.iter().map(|name| show_name(name)).collect();
        match listed(&run.kernel) {
            // Missing from the kernel's listing too: compare_walks has
            // nothing to say, and the kernel shows no better is possible
            // through a mount; noted.
            Some(theirs) if missing.iter().all(|name| !theirs.contains(*name)) => {
                notes.push(format!(
                    "{dir}: debugfs lists {} name(s) neither mount lists: {}",
                    missing.len(),
                    few(&shown)
                ))
            }
            Some(_) => {} // reported against the kernel's listing already
            None => finding(
                findings,
                "listing",
                format!(
                    "{dir}: jext4 lists it without an error but misses {} name(s) debugfs lists (the kernel could not list it): {}",
                    missing.len(),
                    few(&shown)
                ),
            ),
        }
    }
}

/// Problem kinds, three ways: D on the damaged image, K after the
/// kernel's run, J after jext4's.
/// - A kind jext4's run brings (in J, not in D) must be in K too. When
///   the kernel's run brings kinds of its own as well (both hand out a
///   block the bitmap wrongly frees, and which file gets it decides the
///   kinds), neither image is plainly worse: then jext4 fails only by
///   bringing more kinds than the kernel, and the rest is a note.
/// - A kind of the damage that the kernel's run repaired (in D and J, not
///   in K) is a finding when the kernel's run brought no kind of its own
///   (K within D: its image is plainly better), a note otherwise.
fn compare_fsck(run: &Run, findings: &mut Vec<Finding>, notes: &mut Vec<String>) {
    let damaged = &run.damaged_fsck.kinds;
    let theirs = &run.kernel.fsck.kinds;
    let brought = |kinds: &BTreeMap<String, String>| -> Vec<String> {
        kinds
            .iter()
            .filter(|(kind, _)| !damaged.contains_key(*kind))
            .map(|(_, line)| line.clone())
            .collect()
    };
    let (kernel_brought, jext4_brought) = (brought(theirs), brought(&run.jext4.fsck.kinds));
    let extra: Vec<String> = run
        .jext4
        .fsck
        .kinds
        .iter()
        .filter(|(kind, _)| !theirs.contains_key(*kind) && !damaged.contains_key(*kind))
        .map(|(_, line)| format!("\"{line}\""))
        .collect();
    if !extra.is_empty() {
        if kernel_brought.is_empty() || jext4_brought.len() > kernel_brought.len() {
            for line in &extra {
                finding(
                    findings,
                    "e2fsck",
                    format!("jext4 leaves a problem the kernel's run does not: {line}"),
                );
            }
        } else {
            notes.push(format!(
                "both runs bring problems ({} kind(s) the kernel's, {} jext4's); jext4's own: {}",
                kernel_brought.len(),
                jext4_brought.len(),
                few(&extra)
            ));
        }
    }
    let repaired_by_kernel_only: Vec<&String> = run
        .jext4
        .fsck
        .kinds
        .iter()
        .filter(|(kind, _)| damaged.contains_key(*kind) && !theirs.contains_key(*kind))
        .map(|(_, line)| line)
        .collect();
    if repaired_by_kernel_only.is_empty() {
        return;
    }
    let lines: Vec<String> = repaired_by_kernel_only
        .iter()
        .map(|line| format!("\"{line}\""))
        .collect();
    if kernel_brought.is_empty() {
        finding(
            findings,
            "e2fsck",
            format!(
                "the kernel's run repairs what jext4's leaves: {}",
                few(&lines)
            ),
        );
    } else {
        notes.push(format!(
            "the kernel's run repairs {} but brings {} problem kind(s) of its own, e.g. \"{}\"",
            few(&lines),
            kernel_brought.len(),
            kernel_brought[0]
        ));
    }
}

/// Corruption errors jext4 returned must be in its log with a location;
/// the same error logged more than once is a finding too.
fn check_log(run: &Run, findings: &mut Vec<Finding>) {
    for (label, side) in [
        ("read-write", &run.jext4),
        ("read-only", &run.jext4_read_only),
    ] {
        let errors = corruption_errors(&side.record);
        let logged: Vec<&str> = side
            .log
            .lines()
            .filter(|line| line.contains("corrupt") || line.contains("Corrupt"))
            .collect();
        let located = logged.iter().any(|line| {
            ["inode ", "block ", "group ", "superblock"]
                .iter()
                .any(|place| line.contains(place))
        });
        if !errors.is_empty() && !located {
            finding(
                findings,
                "log",
                format!(
                    "{label}: jext4 returned {} without a located corruption line in its log",
                    few(&errors)
                ),
            );
        }
        let mut counts: BTreeMap<String, usize> = BTreeMap::new();
        for line in &logged {
            let key = line
                .find("location=")
                .map_or(line.to_string(), |at| line[at..].to_string());
            *counts.entry(key).or_default() += 1;
        }
        let repeated: Vec<String> = counts
            .iter()
            .filter(|(_, count)| **count > 1)
            .map(|(key, count)| format!("{count}x {key}"))
            .collect();
        if !repeated.is_empty() {
            finding(
                findings,
                "log once",
                format!("{label}: the log repeats {}", few(&repeated)),
            );
        }
    }
}

/// "walk: /tree/x lstat EUCLEAN" and "rm /tree/x: EUCLEAN" for each
/// corruption error of a run.
fn corruption_errors(record: &Record) -> Vec<String> {
    let mut errors = Vec::new();
    if let Some(walk) = &record.walk {
        for (dir, listing) in &walk.dirs {
            if let Some(errno) = listing.error.filter(|errno| is_corruption_errno(*errno)) {
                errors.push(format!("readdir {dir}: {}", errno_name(errno)));
            }
        }
        for (path, entry) in &walk.entries {
            let results = [
                entry.stat.as_ref().err(),
                entry
                    .content
                    .as_ref()
                    .and_then(|content| content.as_ref().err()),
                entry
                    .xattrs
                    .as_ref()
                    .and_then(|xattrs| xattrs.as_ref().err()),
            ];
            for errno in results.into_iter().flatten() {
                if is_corruption_errno(*errno) {
                    errors.push(format!("{path}: {}", errno_name(*errno)));
                }
            }
        }
    }
    for (step, outcome) in &record.steps {
        if let Outcome::Failed(errno) = outcome
            && is_corruption_errno(*errno)
        {
            errors.push(format!("{step}: {}", errno_name(*errno)));
        }
    }
    errors
}

/// On an image e2fsck finds clean, jext4 does everything the kernel does.
fn compare_clean_image(run: &Run, findings: &mut Vec<Finding>) {
    for (step, theirs) in &run.kernel.record.steps {
        let ours = run.jext4.step(step);
        if ours != Some(theirs) {
            finding(
                findings,
                "clean image",
                format!(
                    "step '{step}': jext4 {}, the kernel {}",
                    ours.map_or("did not run it".into(), Outcome::show),
                    theirs.show()
                ),
            );
        }
    }
    for (label, side) in [("kernel", &run.kernel), ("jext4", &run.jext4)] {
        if side.fsck.exit_code != 0 {
            finding(
                findings,
                "clean image",
                format!("e2fsck finds problems after the {label}'s run of a clean image"),
            );
        }
    }
}

// ---------------------------------------------------------------------------
// The report.

/// A walk in one line: names listed, directories and entries with errors.
fn walk_summary(walk: Option<&Walk>) -> String {
    let Some(walk) = walk else { return "-".into() };
    let names: usize = walk.dirs.values().map(|listing| listing.names.len()).sum();
    let mut errors: BTreeMap<String, usize> = BTreeMap::new();
    for listing in walk.dirs.values() {
        if let Some(errno) = listing.error {
            *errors
                .entry(format!("readdir {}", errno_name(errno)))
                .or_default() += 1;
        }
    }
    for entry in walk.entries.values() {
        if let Err(errno) = &entry.stat {
            *errors
                .entry(format!("lstat {}", errno_name(*errno)))
                .or_default() += 1;
        }
        if let Some(Err(errno)) = &entry.content {
            *errors
                .entry(format!("read {}", errno_name(*errno)))
                .or_default() += 1;
        }
        if let Some(Err(errno)) = &entry.xattrs {
            *errors
                .entry(format!("listxattr {}", errno_name(*errno)))
                .or_default() += 1;
        }
    }
    let errors: Vec<String> = errors
        .iter()
        .map(|(what, count)| format!("{count} {what}"))
        .collect();
    if errors.is_empty() {
        format!("{names} names")
    } else {
        format!("{names} names; {}", errors.join(", "))
    }
}

fn mount_summary(side: &Side) -> String {
    side.mount_error
        .as_ref()
        .map_or("ok".into(), |error| format!("refused: {error}"))
}

/// The detailed account of one run.
pub fn report(run: &Run) -> String {
    let damage = &run.damage;
    let mut text = String::new();
    let _ = writeln!(
        text,
        "== {} seed {} on {}: {} ({:.1} s)",
        damage.kind.name(),
        damage.seed,
        damage.variant.name(),
        damage.description,
        run.elapsed.as_secs_f64()
    );
    let _ = writeln!(
        text,
        "   e2fsck -fn of the damaged image: {}",
        kinds_summary(&run.damaged_fsck)
    );
    let width = 44;
    let _ = writeln!(text, "   {:<width$} {:<34} jext4", "step", "kernel");
    let row = |text: &mut String, step: &str, kernel: String, jext4: String| {
        let _ = writeln!(text, "   {step:<width$} {kernel:<34} {jext4}");
    };
    row(
        &mut text,
        "mount",
        mount_summary(&run.kernel),
        format!(
            "{} (read-only: {})",
            mount_summary(&run.jext4),
            mount_summary(&run.jext4_read_only)
        ),
    );
    row(
        &mut text,
        "walk",
        walk_summary(run.kernel.walk()),
        format!(
            "{} (read-only: {})",
            walk_summary(run.jext4.walk()),
            walk_summary(run.jext4_read_only.walk())
        ),
    );
    for step in step_names(run) {
        let show = |side: &Side| side.step(step).map_or("-".into(), Outcome::show);
        row(&mut text, step, show(&run.kernel), show(&run.jext4));
    }
    row(
        &mut text,
        "e2fsck -fn after",
        kinds_summary(&run.kernel.fsck),
        kinds_summary(&run.jext4.fsck),
    );
    log_lines(&mut text, run);
    for note in &run.notes {
        let _ = writeln!(text, "   note: {note}");
    }
    for found in &run.findings {
        let _ = writeln!(text, "   FAIL [{}] {}", found.check, found.text);
    }
    let _ = writeln!(
        text,
        "   verdict: {}",
        if run.passed() {
            "as good as the kernel"
        } else {
            "FAIL"
        }
    );
    text
}

/// The steps either side ran, in the order they ran.
fn step_names(run: &Run) -> Vec<&String> {
    let mut names: Vec<&String> = Vec::new();
    for (step, _) in run
        .jext4
        .record
        .steps
        .iter()
        .chain(&run.kernel.record.steps)
    {
        if !names.contains(&step) {
            names.push(step);
        }
    }
    names
}

/// The kernel's lines about its device; jext4's warnings and errors.
fn log_lines(text: &mut String, run: &Run) {
    for (label, log) in [
        ("kernel log", &run.kernel.log),
        ("jext4 log", &run.jext4.log),
    ] {
        let lines: Vec<&str> = log
            .lines()
            .filter(|line| label == "kernel log" || line.contains("ERROR") || line.contains("WARN"))
            .collect();
        if lines.is_empty() {
            continue;
        }
        let _ = writeln!(text, "   {label}:");
        for line in lines.iter().take(8) {
            let _ = writeln!(text, "     {}", line.trim());
        }
        if lines.len() > 8 {
            let _ = writeln!(text, "     ... {} more lines", lines.len() - 8);
        }
    }
}

fn kinds_summary(report: &fsck::Report) -> String {
    if report.kinds.is_empty() {
        return format!("clean (exit {})", report.exit_code);
    }
    format!(
        "{} problem kind(s), exit {}",
        report.kinds.len(),
        report.exit_code
    )
}

/// One line per run: kind, seed, variant, verdict, the checks that failed.
pub fn table(runs: &[Run]) -> String {
    let mut text = String::new();
    let _ = writeln!(
        text,
        "{:<30} {:>6} {:<16} {:<8} failed checks",
        "kind", "seed", "variant", "verdict"
    );
    for run in runs {
        let checks: BTreeSet<&str> = run.findings.iter().map(|found| found.check).collect();
        let _ = writeln!(
            text,
            "{:<30} {:>6} {:<16} {:<8} {}",
            run.damage.kind.name(),
            run.damage.seed,
            run.damage.variant.name(),
            if run.passed() { "ok" } else { "FAIL" },
            checks.into_iter().collect::<Vec<_>>().join(", ")
        );
    }
    text
}

/// The e2fsck lines jext4's run adds, for the report.
pub fn extra_fsck_lines(run: &Run) -> Vec<String> {
    run.jext4
        .fsck
        .kinds
        .iter()
        .filter(|(kind, _)| !run.kernel.fsck.kinds.contains_key(*kind))
        .map(|(_, line)| line.clone())
        .collect()
}
