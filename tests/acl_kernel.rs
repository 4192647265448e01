//! POSIX ACLs enforced as the kernel enforces them (issue 12, point 1): the
//! ACL matrix of `tests/acl_support/matrix.sh` — named users and groups,
//! the mask, deny entries, default ACLs two levels deep, chmod after
//! setfacl, the umask with and without a default ACL, setgid directories —
//! run as unprivileged users on a jext4 FUSE mount (allow_other) and on a
//! kernel ext4 loop mount of an identical image. Every step's output and
//! exit status, every resulting mode and every `getfacl` must be the same.

// The jext4 binary, or the mounts and helpers of tests/common that use it.
#![cfg(feature = "cli")]

mod common;

use common::e2e::{self, JextMount, KernelMount};
use std::os::unix::fs::DirBuilderExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::process::Command;

const MATRIX: &str = include_str!("acl_support/matrix.sh");

/// Run the matrix with `root` as the filesystem to work in; its transcript.
fn run_matrix(script: &Path, root: &Path) -> String {
    let output = Command::new("sh")
        .arg(script)
        .arg(root)
        .output()
        .expect("running the ACL matrix");
    assert!(
        output.status.success(),
        "the matrix script itself failed on {}:\n{}",
        root.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// The first lines where the transcripts part, with some context.
fn first_differences(jext4: &str, kernel: &str) -> String {
    let (left, right): (Vec<&str>, Vec<&str>) = (jext4.lines().collect(), kernel.lines().collect());
    let Some(at) = (0..left.len().max(right.len())).find(|&i| left.get(i) != right.get(i)) else {
        return String::new();
    };
    let from = at.saturating_sub(12);
    let window =
        |lines: &[&str]| lines[from.min(lines.len())..(at + 8).min(lines.len())].join("\n");
    format!(
        "first difference at line {}:\n--- jext4\n{}\n--- kernel ext4\n{}",
        at + 1,
        window(&left),
        window(&right)
    )
}

#[test]
fn acl_matrix_matches_kernel() {
    if !e2e::require_e2e() {
        return;
    }
    for tool in ["getfacl", "getfattr", "python3"] {
        assert!(
            common::require_tool(tool),
            "{tool} is needed by the ACL matrix"
        );
    }
    let scratch = e2e::scratch("acl");
    let script = scratch.path().join("matrix.sh");
    std::fs::write(&script, MATRIX).unwrap();
    let image = common::mkfs(scratch.path(), "acl", 32, &["-t", "ext4"]);
    let reference = scratch.path().join("kernel.img");
    std::fs::copy(&image, &reference).unwrap();

    let mnt = scratch.path().join("jext4");
    let mount = JextMount::mount(&image, &mnt, "allow_other");
    let jext4 = run_matrix(&script, &mnt);
    mount.unmount();
    e2e::fsck_clean(&image, "after the ACL matrix on jext4");

    let kmnt = scratch.path().join("kernel");
    let kernel_mount = KernelMount::mount(&reference, &kmnt, false);
    let kernel = run_matrix(&script, &kmnt);
    kernel_mount.unmount();

    let cases = kernel.lines().filter(|l| l.starts_with("== ")).count();
    let steps = kernel.lines().filter(|l| l.starts_with("-> ")).count();
    eprintln!("ACL matrix: {cases} cases, {steps} steps as unprivileged users");
    assert!(steps >= 100, "the matrix ran only {steps} steps:\n{kernel}");
    // The reference itself must show ACLs at work, or the comparison
    // proves nothing: a deny entry refusing, a grant beyond the mode.
    for expected in [
        "cat: deny: Permission denied\n-> bob cat deny: 1",
        "shared\n-> bob cat allow: 0",
        "default:user:2002:rwx",
    ] {
        assert!(
            kernel.contains(expected),
            "kernel transcript lacks {expected:?}"
        );
    }
    assert!(
        jext4 == kernel,
        "jext4 and kernel ext4 disagree on ACLs; {}",
        first_differences(&jext4, &kernel)
    );
}

/// What `stat` and `getfacl` say of every file under `root`.
fn describe_tree(root: &Path) -> String {
    let listing = e2e::run_ok(
        "sh",
        &[
            "-c",
            "cd \"$1\" && find . -mindepth 1 | sort | while read -r p; do stat -c '%n %A %u:%g' \"$p\"; done; getfacl -R -n -P .",
            "sh",
            e2e::path_str(root),
        ],
    );
    String::from_utf8_lossy(&listing.stdout).into_owned()
}

/// The library API inherits default ACLs and keeps mode and ACL in step
/// exactly as the kernel does for a process whose umask is 0 (the library
/// takes modes as given).
#[test]
fn library_acls_match_kernel() {
    use jext4::engine::format::acl::{AclEntry, UNDEFINED_ID, encode_xattr, tag};
    if !e2e::require_e2e() {
        return;
    }
    let entry = |tag, perm, id| AclEntry { tag, perm, id };
    let default = encode_xattr(&[
        entry(tag::USER_OBJ, 7, UNDEFINED_ID),
        entry(tag::USER, 7, 2002),
        entry(tag::GROUP_OBJ, 5, UNDEFINED_ID),
        entry(tag::GROUP, 6, 3003),
        entry(tag::MASK, 7, UNDEFINED_ID),
        entry(tag::OTHER, 1, UNDEFINED_ID),
    ]);
    let access = encode_xattr(&[
        entry(tag::USER_OBJ, 6, UNDEFINED_ID),
        entry(tag::USER, 6, 2003),
        entry(tag::GROUP_OBJ, 4, UNDEFINED_ID),
        entry(tag::MASK, 6, UNDEFINED_ID),
        entry(tag::OTHER, 0, UNDEFINED_ID),
    ]);
    let scratch = e2e::scratch("acl-library");
    let image = common::mkfs(scratch.path(), "library", 16, &["-t", "ext4"]);
    let reference = scratch.path().join("kernel.img");
    std::fs::copy(&image, &reference).unwrap();

    let lib = jext4::Image::options().umask(0).open(&image).unwrap();
    lib.create_dir_with("/top", jext4::DirBuilder::new().mode(0o755))
        .unwrap();
    lib.set_xattr("/top", "system.posix_acl_default", &default)
        .unwrap();
    lib.create_dir_with("/top/mid", jext4::DirBuilder::new().mode(0o777))
        .unwrap();
    lib.create_dir_with("/top/mid/low", jext4::DirBuilder::new().mode(0o750))
        .unwrap();
    lib.open_with(
        "/top/file",
        jext4::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .mode(0o666),
    )
    .unwrap();
    lib.open_with(
        "/top/mid/low/file",
        jext4::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .mode(0o640),
    )
    .unwrap();
    lib.symlink("file", "/top/mid/link").unwrap();
    lib.open_with(
        "/plain",
        jext4::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .mode(0o600),
    )
    .unwrap();
    lib.set_xattr("/plain", "system.posix_acl_access", &access)
        .unwrap();
    let chmod = jext4::engine::fs::SetAttr {
        mode: Some(0o750),
        ..Default::default()
    };
    lib.set_attr("/plain", &chmod).unwrap();
    lib.close().unwrap();
    e2e::fsck_clean(&image, "after the library's ACL work");

    let kmnt = scratch.path().join("kernel");
    let kernel_mount = KernelMount::mount(&reference, &kmnt, false);
    let hex = |value: &[u8]| value.iter().map(|b| format!("{b:02x}")).collect::<String>();
    let steps = format!(
        "import os\n\
         os.umask(0)\n\
         os.chdir({root:?})\n\
         os.mkdir('top', 0o755)\n\
         os.setxattr('top', 'system.posix_acl_default', bytes.fromhex('{default}'))\n\
         os.mkdir('top/mid', 0o777)\n\
         os.mkdir('top/mid/low', 0o750)\n\
         os.close(os.open('top/file', os.O_CREAT | os.O_WRONLY, 0o666))\n\
         os.close(os.open('top/mid/low/file', os.O_CREAT | os.O_WRONLY, 0o640))\n\
         os.symlink('file', 'top/mid/link')\n\
         os.close(os.open('plain', os.O_CREAT | os.O_WRONLY, 0o600))\n\
         os.setxattr('plain', 'system.posix_acl_access', bytes.fromhex('{access}'))\n\
         os.chmod('plain', 0o750)\n",
        root = e2e::path_str(&kmnt),
        default = hex(&default),
        access = hex(&access),
    );
    e2e::run_ok("python3", &["-c", &steps]);
    let kernel = describe_tree(&kmnt);
    kernel_mount.unmount();

    let lmnt = scratch.path().join("library");
    let library_mount = KernelMount::mount(&image, &lmnt, true);
    let library = describe_tree(&lmnt);
    library_mount.unmount();
    assert!(kernel.contains("default:user:2002:rwx"), "{kernel}");
    assert_eq!(
        library, kernel,
        "the library's ACLs differ from the kernel's"
    );
}
