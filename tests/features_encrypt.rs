//! encrypt (fscrypt): jext4 has no keys, so an encrypted directory reads
//! as the kernel reads it without its key — names in their no-key form
//! (base64url of the hash and the ciphertext), symlinks likewise, file
//! contents and new names refused with ENOKEY — and everything else of
//! the image is used as usual. The kernel is the oracle: it makes an
//! encrypted tree with a key (FS_IOC_ADD_ENCRYPTION_KEY,
//! FS_IOC_SET_ENCRYPTION_POLICY), then twin copies of the image are
//! mounted without it, one by the kernel and one by jext4, and the same
//! operations must give the same answers, names byte for byte.

// The jext4 binary, or the mounts and helpers of tests/common that use it.
#![cfg(feature = "cli")]

mod common;

use common::journal::{Mount, kernel_available, kernel_lock};
use common::server::{Server, fuse_available};
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;

const FS_IOC_ADD_ENCRYPTION_KEY: libc::c_ulong = 0xC050_6617;
const FS_IOC_SET_ENCRYPTION_POLICY: libc::c_ulong = 0x800C_6613;

fn c_path(path: &Path) -> CString {
    CString::new(path.as_os_str().as_bytes()).unwrap()
}

/// Add a v2 key to the filesystem at `mount` and set it as `dir`'s policy
/// (AES-256-XTS contents, AES-256-CTS names, 32-byte name padding).
fn encrypt_dir(mount: &Path, dir: &Path) {
    let key: Vec<u8> = (0..64u8).map(|i| i.wrapping_mul(29) ^ 0xa5).collect();
    let mut arg = vec![0u8; 80];
    arg[0] = 2; // FSCRYPT_KEY_SPEC_TYPE_IDENTIFIER
    arg[40..44].copy_from_slice(&(key.len() as u32).to_le_bytes());
    arg.extend_from_slice(&key);
    let fd = unsafe { libc::open(c_path(mount).as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
    assert!(fd >= 0);
    let done = unsafe { libc::ioctl(fd, FS_IOC_ADD_ENCRYPTION_KEY as _, arg.as_mut_ptr()) };
    assert_eq!(done, 0, "add key: {}", std::io::Error::last_os_error());
    unsafe { libc::close(fd) };
    let mut policy = vec![2u8, 1, 4, 0x03, 0, 0, 0, 0];
    policy.extend_from_slice(&arg[8..24]);
    let fd = unsafe { libc::open(c_path(dir).as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
    assert!(fd >= 0);
    let done = unsafe { libc::ioctl(fd, FS_IOC_SET_ENCRYPTION_POLICY as _, policy.as_ptr()) };
    assert_eq!(done, 0, "set policy: {}", std::io::Error::last_os_error());
    unsafe { libc::close(fd) };
}

/// The tree the kernel writes with the key: short and long names (the
/// long ones past 149 bytes of ciphertext), a directory big enough for an
/// htree, short and long symlinks, a fifo, an empty directory.
fn write_encrypted_tree(root: &Path) {
    std::fs::write(root.join("plain.txt"), b"not encrypted").unwrap();
    let secret = root.join("secret");
    std::fs::create_dir(&secret).unwrap();
    encrypt_dir(root, &secret);
    std::fs::write(secret.join("hello.txt"), b"hello").unwrap();
    std::fs::write(secret.join("L".repeat(200)), b"long").unwrap();
    std::fs::create_dir(secret.join("empty")).unwrap();
    std::os::unix::fs::symlink("hello.txt", secret.join("link")).unwrap();
    std::os::unix::fs::symlink("t".repeat(300), secret.join("longlink")).unwrap();
    let fifo = c_path(&secret.join("fifo"));
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0);
    std::fs::create_dir(secret.join("many")).unwrap();
    for index in 0..300 {
        let name = format!("file-{index:03}-{}", "x".repeat(index % 180));
        std::fs::write(secret.join("many").join(name), format!("{index}")).unwrap();
    }
}

fn errno(result: std::io::Result<impl Sized>) -> String {
    match result {
        Ok(_) => "ok".into(),
        Err(error) => error
            .raw_os_error()
            .map_or(error.to_string(), |code| code.to_string()),
    }
}

/// What a mount without the key answers: every name, type, size and link
/// target under `secret`, then the refusals and what still works.
fn answers(root: &Path) -> Vec<String> {
    let secret = root.join("secret");
    let mut out = vec![format!(
        "plain: {:?}",
        std::fs::read(root.join("plain.txt")).unwrap()
    )];
    let mut names: Vec<_> = std::fs::read_dir(&secret)
        .unwrap()
        .map(|entry| entry.unwrap().file_name())
        .collect();
    names.sort();
    out.push(format!("names {names:?}"));
    let mut regular = None;
    let mut directory = None;
    for name in &names {
        let path = secret.join(name);
        let meta = std::fs::symlink_metadata(&path).unwrap();
        let kind = meta.file_type();
        let mut line = format!("{name:?} mode {:o} size {}", meta.mode(), meta.size());
        if kind.is_symlink() {
            line += &format!(" -> {:?}", std::fs::read_link(&path).unwrap());
        } else if kind.is_file() {
            line += &format!(" open {}", errno(std::fs::File::open(&path)));
            if meta.size() == 5 {
                regular = Some(path.clone());
            }
        } else if kind.is_fifo() {
            line += " fifo";
        } else if kind.is_dir() {
            let inner = std::fs::read_dir(&path).unwrap().count();
            line += &format!(" entries {inner}");
            if inner > 100 {
                let mut inner: Vec<_> = std::fs::read_dir(&path)
                    .unwrap()
                    .map(|entry| entry.unwrap().file_name())
                    .collect();
                inner.sort();
                // Each name found again by itself (the htree's lookups).
                for name in &inner {
                    assert!(
                        std::fs::symlink_metadata(path.join(name)).is_ok(),
                        "{name:?}"
                    );
                }
                line += &format!(" {:?}", &inner[..5]);
                directory = Some(path.clone());
            } else if inner == 0 {
                line += &format!(" rmdir {}", errno(std::fs::remove_dir(&path)));
            }
        }
        out.push(line);
    }
    let regular = regular.expect("hello.txt");
    let many = directory.expect("the large directory");
    out.push(format!(
        "create {}",
        errno(std::fs::write(secret.join("new"), b"n"))
    ));
    out.push(format!(
        "mkdir {}",
        errno(std::fs::create_dir(secret.join("newdir")))
    ));
    out.push(format!(
        "symlink {}",
        errno(std::os::unix::fs::symlink("x", secret.join("newlink")))
    ));
    out.push(format!(
        "link in {}",
        errno(std::fs::hard_link(
            root.join("plain.txt"),
            secret.join("plainlink")
        ))
    ));
    out.push(format!(
        "rename {}",
        errno(std::fs::rename(&regular, secret.join("renamed")))
    ));
    out.push(format!(
        "rename out {}",
        errno(std::fs::rename(&regular, root.join("out")))
    ));
    out.push(format!(
        "truncate {}",
        errno(std::fs::OpenOptions::new().write(true).open(&regular))
    ));
    out.push(format!(
        "chmod {}",
        errno(std::fs::set_permissions(
            &regular,
            std::os::unix::fs::PermissionsExt::from_mode(0o600)
        ))
    ));
    out.push(format!(
        "plaintext name {}",
        errno(std::fs::metadata(secret.join("hello.txt")))
    ));
    out.push(format!(
        "not a no-key name {}",
        errno(std::fs::metadata(secret.join("AB")))
    ));
    let victim = std::fs::read_dir(&many)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .file_name();
    out.push(format!(
        "unlink {}",
        errno(std::fs::remove_file(many.join(&victim)))
    ));
    out.push(format!(
        "after {}",
        std::fs::read_dir(&many).unwrap().count()
    ));
    out
}

#[test]
fn encrypted_directories_read_as_the_kernel_reads_them_without_the_key() {
    if !kernel_available() || !fuse_available() {
        return;
    }
    for block_size in ["4096", "1024"] {
        let dir = tempfile::tempdir().unwrap();
        let image = common::mkfs(
            dir.path(),
            "made",
            32,
            &["-t", "ext4", "-O", "encrypt", "-b", block_size],
        );
        {
            let _kernel = kernel_lock();
            let mount = Mount::new(&image, "rw").unwrap();
            write_encrypted_tree(&mount.point);
            mount.unmount();
        }
        common::assert_fsck_clean(&image);
        let twin = dir.path().join("twin.img");
        std::fs::copy(&image, &twin).unwrap();
        let kernel = {
            let _kernel = kernel_lock();
            let mount = Mount::new(&image, "rw").unwrap();
            let answers = answers(&mount.point);
            mount.unmount();
            answers
        };
        // The library lists the same names before anything changes.
        let library: Vec<_> = {
            let image = jext4::Image::open(&twin).unwrap();
            let mut names: Vec<_> = image
                .read_dir("/secret")
                .unwrap()
                .map(|entry| entry.unwrap().file_name())
                .collect();
            names.sort();
            image.close().unwrap();
            names
        };
        let server = Server::start(&twin, "");
        let ours = answers(&server.mountpoint);
        drop(server.unmount());
        for (theirs, mine) in kernel.iter().zip(&ours) {
            assert_eq!(
                theirs, mine,
                "{block_size}: kernel (left) and jext4 (right) differ"
            );
        }
        assert_eq!(kernel.len(), ours.len());
        assert_eq!(
            format!("names {library:?}"),
            kernel[1],
            "{block_size}: the library's listing"
        );
        common::assert_fsck_clean(&image);
        common::assert_fsck_clean(&twin);
    }
}
