//! Mount like any filesystem: `mount -t fuse.jext4 IMAGE DIR
//! -o OPTIONS` and an fstab line (`mount -T FSTAB DIR`) go through mount(8)
//! and libfuse's `mount.fuse3` helper, which runs `jext4 IMAGE DIR -o ...`
//! from the standard PATH. So that nothing is installed on the machine, the
//! steps run in a private mount namespace where /usr/local/bin is a
//! directory holding `jext4` (the binary under test); mounts made there are
//! seen there only. The type in /proc/self/mountinfo is `fuse.jext4`, the
//! options reach the server, `umount` works, and `jext4 stats --json`
//! reports the mount.

// The jext4 binary, or the mounts and helpers of tests/common that use it.
#![cfg(feature = "cli")]

mod common;

use common::e2e::{self, JEXT4};
use std::fs;

#[test]
fn mount_t_fuse_jext4_and_fstab_lines_work() {
    if !e2e::require_e2e() {
        return;
    }
    for tool in ["unshare", "mount.fuse3", "findmnt"] {
        assert!(
            common::require_tool(tool),
            "{tool} is needed (util-linux, fuse3)"
        );
    }
    let scratch = e2e::scratch("helper");
    let image = common::mkfs(scratch.path(), "helper", 16, &["-t", "ext4"]);
    let mnt = scratch.path().join("mnt");
    fs::create_dir(&mnt).unwrap();
    let bin = scratch.path().join("bin");
    fs::create_dir(&bin).unwrap();
    std::os::unix::fs::symlink(JEXT4, bin.join("jext4")).unwrap();
    let fstab = scratch.path().join("fstab");
    fs::write(
        &fstab,
        format!(
            "# an fstab line as a user would write it\n{} {} fuse.jext4 rw,noexec,nofail,x-systemd.automount,commit=10,noatime 0 0\n",
            image.display(),
            mnt.display()
        ),
    )
    .unwrap();
    let script = format!(
        r#"set -e
# Copies of other programs' FUSE and loop mounts would keep their
# filesystems alive after they unmount them: detach them, here only.
findmnt -rn -o TARGET,FSTYPE,SOURCE | awk '$2 ~ /^fuse(\.|blk|$)/ || $3 ~ /^\/dev\/loop/ {{ print $1 }}' |
    sort -r | while read -r target; do umount -l "$(printf '%b' "$target")" 2>/dev/null || true; done
mount --bind '{bin}' /usr/local/bin
mount -t fuse.jext4 '{image}' '{mnt}' -o sync,noatime
findmnt -n -o FSTYPE,SOURCE '{mnt}'
echo 'through mount -t' > '{mnt}/first'
jext4 stats --json '{mnt}'
umount '{mnt}'
mount -T '{fstab}' '{mnt}'
findmnt -n -o FSTYPE,OPTIONS '{mnt}'
cat '{mnt}/first'
echo 'through fstab' > '{mnt}/second'
umount '{mnt}'
mount -t fuse.jext4 -o ro '{image}' '{mnt}'
cat '{mnt}/second'
touch '{mnt}/refused' 2>&1 || true
umount '{mnt}'
jext4 mount '{image}' '{mnt}'
jext4 umount '{mnt}'
"#,
        bin = bin.display(),
        image = image.display(),
        mnt = mnt.display(),
        fstab = fstab.display(),
    );
    let output = e2e::run("unshare", &["-m", "sh", "-c", &script]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "the mount helper steps failed:\n{stdout}\n{stderr}"
    );
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(
        lines[0].split_whitespace().collect::<Vec<_>>(),
        ["fuse.jext4", e2e::path_str(&image)],
        "{stdout}"
    );
    assert!(
        lines[1].starts_with(r#"{"mounted": true, "#) && lines[1].contains(r#""read_only": false"#),
        "jext4 stats --json: {}",
        lines[1]
    );
    assert!(
        lines[2].starts_with("fuse.jext4") && lines[2].contains("noexec"),
        "the fstab mount: {stdout}"
    );
    assert_eq!(lines[3], "through mount -t");
    assert_eq!(lines[4], "through fstab");
    assert!(stdout.contains("Read-only file system"), "-o ro: {stdout}");
    assert!(!e2e::is_mount_point(&mnt));
    e2e::fsck_clean(&image, "after the mount helper steps");
}
