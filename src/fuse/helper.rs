//! Mounting like any filesystem: `mount -t fuse.jext4 IMAGE DIR -o OPTS`,
//! `/etc/fstab` lines and systemd mount units.
//!
//! mount(8) runs the helper `/sbin/mount.fuse.jext4` if there is one, else
//! `mount.fuse3` (libfuse's util/mount.fuse.c), which runs
//! `jext4 IMAGE DIR -o OPTS` through `/bin/sh`, with `jext4` found on PATH.
//! Either way jext4 is called without its `mount` subcommand, in the mount
//! helper convention: `SOURCE DIR [-sfnv] [-N NAMESPACE] [-o OPTS]
//! [-t TYPE]`. This turns such a command line into `jext4 mount`'s.

/// Subcommands of the `jext4` command: an argument list starting with one
/// of them is not a mount helper call.
pub const SUBCOMMANDS: &[&str] = &[
    "mount",
    "umount",
    "sync",
    "stats",
    "recover",
    "logdump",
    "crashtest",
    "completions",
    "man",
    "help",
    // The image tools.
    "cp",
    "tar",
    "ls",
    "cat",
    "stat",
    "mkdir",
    "rm",
    "mv",
    "ln",
    "chmod",
    "chown",
    "touch",
    "xattr",
    "verity",
    "quota",
    "shell",
];

/// What a mount helper call asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HelperCall {
    /// Mount: the equivalent arguments of `jext4 mount` (after the program
    /// name).
    Mount(Vec<String>),
    /// `-f` ("fake"): do everything but the mount, i.e. nothing.
    Fake,
}

/// If `args` (the program name first) are a mount helper call, translate
/// them; `None` for an ordinary `jext4` command line. Errors name what is
/// not understood.
pub fn helper_call(args: &[String]) -> Option<Result<HelperCall, String>> {
    let program = args.first()?;
    let called_as_helper = std::path::Path::new(program)
        .file_name()
        .is_some_and(|name| name.to_string_lossy().starts_with("mount."));
    let first = args.get(1)?;
    let looks_like_helper =
        !first.starts_with('-') && !SUBCOMMANDS.contains(&first.as_str()) && args.len() >= 3;
    if !called_as_helper && !looks_like_helper {
        return None;
    }
    Some(translate(&args[1..]))
}

fn translate(args: &[String]) -> Result<HelperCall, String> {
    let mut positional = Vec::new();
    let mut options = Vec::new();
    let mut fake = false;
    let mut rest = args.iter();
    while let Some(arg) = rest.next() {
        match arg.as_str() {
            "-o" => options.push(
                rest.next()
                    .ok_or("mount helper: -o needs a value")?
                    .to_string(),
            ),
            // The type is ours; namespaces are not supported.
            "-t" => {
                rest.next().ok_or("mount helper: -t needs a value")?;
            }
            "-N" => return Err("mount helper: -N (mount namespaces) is not supported".into()),
            // sloppy, no mtab, verbose: nothing to do for a FUSE mount.
            "-s" | "-n" | "-v" => {}
            "-f" => fake = true,
            flag if flag.starts_with('-') => {
                return Err(format!("mount helper: unknown flag {flag}"));
            }
            value => positional.push(value.to_string()),
        }
    }
    let [image, mountpoint] = positional.as_slice() else {
        return Err(format!(
            "mount helper: expected IMAGE MOUNTPOINT, got {positional:?}"
        ));
    };
    if fake {
        return Ok(HelperCall::Fake);
    }
    let mut mount = vec!["mount".to_string()];
    for list in options {
        mount.push("-o".into());
        mount.push(list);
    }
    mount.push(image.clone());
    mount.push(mountpoint.clone());
    Ok(HelperCall::Mount(mount))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Vec<String> {
        list.iter().map(|arg| arg.to_string()).collect()
    }

    #[test]
    fn translates_helper_calls_and_leaves_commands_alone() {
        // mount.fuse3 runs "jext4 IMAGE DIR -o OPTS".
        assert_eq!(
            helper_call(&args(&["jext4", "/i.img", "/mnt", "-o", "rw,dev,suid"])),
            Some(Ok(HelperCall::Mount(args(&[
                "mount",
                "-o",
                "rw,dev,suid",
                "/i.img",
                "/mnt"
            ]))))
        );
        // mount(8) runs /sbin/mount.fuse.jext4 with helper flags.
        assert_eq!(
            helper_call(&args(&[
                "/sbin/mount.fuse.jext4",
                "/i.img",
                "/mnt",
                "-n",
                "-o",
                "ro",
                "-t",
                "fuse.jext4"
            ])),
            Some(Ok(HelperCall::Mount(args(&[
                "mount", "-o", "ro", "/i.img", "/mnt"
            ]))))
        );
        assert_eq!(
            helper_call(&args(&["mount.fuse.jext4", "/i.img", "/mnt", "-f"])),
            Some(Ok(HelperCall::Fake))
        );
        assert!(matches!(
            helper_call(&args(&["mount.fuse.jext4", "/i.img", "/mnt", "-N", "x"])),
            Some(Err(_))
        ));
        assert!(matches!(
            helper_call(&args(&["mount.fuse.jext4", "/i.img"])),
            Some(Err(_))
        ));
        // Ordinary commands are not helper calls.
        assert_eq!(helper_call(&args(&["jext4", "mount", "a", "b"])), None);
        assert_eq!(helper_call(&args(&["jext4", "stats", "/mnt"])), None);
        assert_eq!(helper_call(&args(&["jext4", "--help"])), None);
        assert_eq!(helper_call(&args(&["jext4"])), None);
    }
}
