//! Who asks for an operation: the credentials the engine needs for the
//! decisions the kernel leaves to the filesystem — ownership of new inodes,
//! blocks reserved for root, the umask of a new inode whose directory has no
//! default ACL, whether setting an access ACL keeps the setgid bit, and
//! whether a write or truncate keeps setuid and setgid (CAP_FSETID, with
//! FUSE_HANDLE_KILLPRIV_V2).
//!
//! Permission checks themselves are the kernel's (FUSE `default_permissions`
//! with `FUSE_POSIX_ACL`); the library API makes none.

/// The kernel's CAP_FSETID (linux/capability.h): keep setgid on a file whose
/// group the caller is not in.
const CAP_FSETID: u32 = 4;

/// CAP_SYS_RESOURCE: quota limits do not apply (the kernel's
/// `ignore_hardlimit`).
const CAP_SYS_RESOURCE: u32 = 24;

/// CAP_SYS_ADMIN: quotactl's limits and reports.
const CAP_SYS_ADMIN: u32 = 21;

/// CAP_LINUX_IMMUTABLE: `chattr +i` and `+a`.
const CAP_LINUX_IMMUTABLE: u32 = 9;

/// Identity of the caller of one operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caller {
    /// File-system uid and gid (FUSE requests carry the fsuid and fsgid).
    pub uid: u32,
    pub gid: u32,
    /// The file-mode creation mask: applied to a new inode's mode when its
    /// directory has no default ACL, ignored when it has one
    /// (posix_acl_create). FUSE passes it with create, mknod and mkdir.
    pub umask: u16,
    /// The calling thread, whose supplementary groups and capabilities
    /// `/proc/<tid>/status` reports; `None` means this thread (the library).
    pub tid: Option<u32>,
    /// Whether the caller holds CAP_FSETID, when the front end was told
    /// (a FUSE write without FUSE_WRITE_KILL_SUIDGID); `None`: ask `/proc`.
    pub fsetid: Option<bool>,
}

impl Caller {
    /// Root in this process, no umask: recovery, tests, internal work.
    pub const ROOT: Caller = Caller {
        uid: 0,
        gid: 0,
        umask: 0,
        tid: None,
        fsetid: None,
    };

    /// A caller with the given ids, no umask, in this process.
    pub const fn new(uid: u32, gid: u32) -> Caller {
        Caller {
            uid,
            gid,
            umask: 0,
            tid: None,
            fsetid: None,
        }
    }

    /// The kernel's `in_group_or_capable`: is `gid` the caller's group or
    /// one of its supplementary groups, or may it keep setgid anyway
    /// (CAP_FSETID)? Read from `/proc` as libfuse's `fuse_req_getgroups`
    /// does; a thread that is gone counts as neither (setgid is cleared: the
    /// safe side).
    pub fn in_group_or_capable(&self, gid: u32) -> bool {
        if self.gid == gid || self.fsetid == Some(true) {
            return true;
        }
        self.status()
            .is_some_and(|status| status_in_group_or_capable(&status, gid))
    }

    /// Does the caller hold CAP_FSETID (a write or truncate keeps setuid
    /// and setgid: the kernel's `setattr_should_drop_suidgid`)? A thread
    /// that is gone does not (the bits are cleared: the safe side).
    pub fn capable_fsetid(&self) -> bool {
        match self.fsetid {
            Some(capable) => capable,
            None => self
                .status()
                .is_some_and(|status| status_capable(&status, CAP_FSETID)),
        }
    }

    /// May the caller go past quota limits (CAP_SYS_RESOURCE, the kernel's
    /// `ignore_hardlimit`)? A front end's caller is asked through `/proc`
    /// (a thread that is gone may not: the safe side); a library caller
    /// (`tid` None) is who it says it is: uid 0 may, as `mke2fs -d` and
    /// the image tools write an image whatever its limits.
    pub fn capable_sys_resource(&self) -> bool {
        self.capable(CAP_SYS_RESOURCE)
    }

    /// May the caller administer the filesystem's quotas (CAP_SYS_ADMIN,
    /// as quotactl's Q_SETQUOTA asks)? Asked as `capable_sys_resource`.
    pub fn capable_sys_admin(&self) -> bool {
        self.capable(CAP_SYS_ADMIN)
    }

    /// May the caller set or clear a file's immutable and append-only
    /// flags (CAP_LINUX_IMMUTABLE, as `fileattr_set_prepare` asks)?
    pub fn capable_linux_immutable(&self) -> bool {
        self.capable(CAP_LINUX_IMMUTABLE)
    }

    fn capable(&self, capability: u32) -> bool {
        match self.tid {
            None => self.uid == 0,
            Some(_) => self
                .status()
                .is_some_and(|status| status_capable(&status, capability)),
        }
    }

    fn status(&self) -> Option<String> {
        let path = match self.tid {
            Some(tid) => format!("/proc/{tid}/status"),
            None => "/proc/thread-self/status".to_string(),
        };
        std::fs::read_to_string(path).ok()
    }
}

/// `in_group_or_capable` from the text of a `/proc/<tid>/status`.
fn status_in_group_or_capable(status: &str, gid: u32) -> bool {
    let field = |name: &str| {
        status
            .lines()
            .find_map(|line| line.strip_prefix(name))
            .map(str::trim)
    };
    let in_groups = field("Groups:").is_some_and(|groups| {
        groups
            .split_whitespace()
            .any(|group| group.parse() == Ok(gid))
    });
    in_groups || status_capable(status, CAP_FSETID)
}

/// Whether the effective capabilities in a `/proc/<tid>/status` hold
/// `capability`.
fn status_capable(status: &str, capability: u32) -> bool {
    status
        .lines()
        .find_map(|line| line.strip_prefix("CapEff:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .is_some_and(|caps| caps & (1 << capability) != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_groups_and_capabilities_from_status() {
        let user = "Name:\tsh\nGroups:\t3001 3003 \nCapEff:\t0000000000000000\n";
        assert!(status_in_group_or_capable(user, 3003));
        assert!(!status_in_group_or_capable(user, 300));
        let root = "Groups:\nCapEff:\t000001ffffffffff\n";
        assert!(status_in_group_or_capable(root, 12345));
        let only_fsetid = "Groups:\t1\nCapEff:\t0000000000000010\n";
        assert!(status_in_group_or_capable(only_fsetid, 7));
        assert!(!status_in_group_or_capable("", 7));
        assert!(status_capable(only_fsetid, CAP_FSETID));
        assert!(!status_capable(user, CAP_FSETID));
        assert!(status_capable(root, CAP_SYS_RESOURCE));
        assert!(!status_capable(only_fsetid, CAP_SYS_RESOURCE));
        // The caller's own group needs no /proc at all.
        let caller = Caller {
            tid: Some(u32::MAX),
            ..Caller::new(5, 6)
        };
        assert!(caller.in_group_or_capable(6));
        assert!(!caller.in_group_or_capable(7));
        assert!(!caller.capable_fsetid());
        // What the front end was told wins over /proc.
        let told = Caller {
            fsetid: Some(true),
            ..caller
        };
        assert!(told.capable_fsetid());
        assert!(told.in_group_or_capable(7));
    }
}
