//! casefold (`mke2fs -O casefold`, `chattr +F`): in a casefolded directory
//! names match whatever their case, by the kernel's utf8-12.1 folding,
//! and the htree orders them by the hash of their folded bytes. This
//! kernel has no CONFIG_UNICODE (it refuses these images), so e2fsprogs is
//! the oracle: `e2fsck -fn` checks every casefolded directory's hash
//! order (and, in strict mode, that each name is UTF-8 and that no two
//! fold alike), `debugfs dx_hash -c -e utf8` hashes a name as e2fsprogs
//! folds it, and `e2fsck -fD` indexes a directory e2fsprogs filled.
//!
//! - The folded hash of tricky names is the one e2fsprogs computes.
//! - A library workload in a +F directory (enough names for an htree)
//!   finds, refuses, renames and removes names by other spellings, its
//!   subdirectories inherit +F, and e2fsck finds the image clean.
//! - Strict mode refuses names that are not UTF-8 (EINVAL), only there.
//! - The +F flag changes as the kernel lets it (empty directories only).
//! - A directory e2fsprogs filled and indexed answers every spelling.
//! - Through a mount: `chattr +F`, `lsattr`, and no stale names cached.

// The jext4 binary, or the mounts and helpers of tests/common that use it.
#![cfg(feature = "cli")]

mod common;

use common::server::{Server, fuse_available};
use jext4::engine::format::casefold;
use jext4::engine::format::htree::{hash_version, name_hash};
use jext4::{CASEFOLD_FL, Image};
use std::io::ErrorKind;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::Command;

const STRICT: &[&str] = &[
    "-t",
    "ext4",
    "-b",
    "1024",
    "-E",
    "encoding=utf8,encoding_flags=strict",
];
const RELAXED: &[&str] = &["-t", "ext4", "-b", "4096", "-O", "casefold"];
const INLINE: &[&str] = &["-t", "ext4", "-b", "4096", "-O", "casefold,inline_data"];

/// Names whose folding exercises every rule: full folds (ß, ﬁ), canonical
/// decomposition (Å, Ω), marks reordered, ignorables dropped, Hangul,
/// Greek with two marks, the Kelvin sign, Turkic İ, and a character past
/// Unicode 12.1 (kept as it is).
const TRICKY: &[&str] = &[
    "README.txt",
    "Straße",
    "STRASSE",
    "ﬁle",
    "\u{212B}ngström",
    "Ångström",
    "A\u{30A}ngstro\u{308}m",
    "a\u{301}\u{328}",
    "a\u{328}\u{301}",
    "soft\u{AD}hyphen",
    "zero\u{200B}width",
    "한국어",
    "\u{0390}",
    "\u{212A}elvin",
    "\u{130}stanbul",
    "\u{A7C0}later",
    "ΣΊΣΥΦΟΣ",
    "Ǆemal",
];

/// The image's directory hash seed, as dumpe2fs prints it and as words.
fn hash_seed(image: &Path) -> (String, [u32; 4]) {
    let output = Command::new("dumpe2fs")
        .arg("-h")
        .arg(image)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&output.stdout);
    let uuid = text
        .lines()
        .find_map(|line| line.strip_prefix("Directory Hash Seed:"))
        .expect("a hash seed")
        .trim()
        .to_string();
    let hex = uuid.replace('-', "");
    let bytes: Vec<u8> = (0..16)
        .map(|at| u8::from_str_radix(&hex[2 * at..2 * at + 2], 16).unwrap())
        .collect();
    let words = std::array::from_fn(|word| {
        u32::from_le_bytes(bytes[4 * word..4 * word + 4].try_into().unwrap())
    });
    (uuid, words)
}

#[test]
fn folded_hashes_are_the_ones_e2fsprogs_computes() {
    let dir = tempfile::tempdir().unwrap();
    let image = common::mkfs(dir.path(), "hashes", 8, STRICT);
    // debugfs 1.47.0's dx_hash takes a zero seed unless given one.
    let (uuid, seed) = hash_seed(&image);
    let commands: String = TRICKY
        .iter()
        .map(|name| format!("dx_hash -c -e utf8 -h half_md4 -s {uuid} {name}\n"))
        .collect();
    let script = dir.path().join("commands");
    std::fs::write(&script, commands).unwrap();
    let output = Command::new("debugfs")
        .arg("-f")
        .arg(&script)
        .arg(&image)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&output.stdout);
    let hashes: Vec<u32> = text
        .lines()
        .filter_map(|line| line.split(" is 0x").nth(1))
        .map(|hex| u32::from_str_radix(hex.split_whitespace().next().unwrap(), 16).unwrap())
        .collect();
    assert_eq!(hashes.len(), TRICKY.len(), "debugfs said:\n{text}");
    for (name, expected) in TRICKY.iter().zip(hashes) {
        let folded = casefold::fold(name.as_bytes()).unwrap();
        // mke2fs makes signed hashes on x86 (signed_directory_hash).
        let ours = name_hash(hash_version::HALF_MD4, &seed, &folded)
            .unwrap()
            .major;
        assert_eq!(ours, expected, "hash of {name:?} (folded {folded:?})");
    }
    // And the names that must fold alike do.
    let fold = |name: &str| casefold::fold(name.as_bytes()).unwrap();
    assert_eq!(fold("Straße"), fold("STRASSE"));
    assert_eq!(fold("\u{212B}ngström"), fold("A\u{30A}ngstro\u{308}m"));
    assert_eq!(fold("a\u{301}\u{328}"), fold("a\u{328}\u{301}"));
    assert_eq!(fold("soft\u{AD}hyphen"), b"softhyphen");
}

/// Make `path` a new casefolded directory (+F).
fn casefolded_dir(image: &Image, path: &str) {
    image.create_dir(path).unwrap();
    let flags = image.flags(path).unwrap();
    image.set_flags(path, flags | CASEFOLD_FL).unwrap();
}

/// Another spelling of `name`: upper case where it has one, else lower.
fn respelled(name: &str) -> String {
    let upper = name.to_uppercase();
    if upper != name {
        upper
    } else {
        name.to_lowercase()
    }
}

fn workload(image: &Image, count: usize) {
    casefolded_dir(image, "/ci");
    let names: Vec<String> = (0..count)
        .map(|index| match index % 4 {
            0 => format!("File{index}.TXT"),
            1 => format!("Straße{index}"),
            2 => format!("Ångström{index}"),
            _ => format!("한국어{index}"),
        })
        .collect();
    for (index, name) in names.iter().enumerate() {
        image
            .write(format!("/ci/{name}"), format!("contents of {index}"))
            .unwrap();
    }
    for (index, name) in names.iter().enumerate() {
        let other = match index % 4 {
            1 => respelled(name).replace("SS", "ss"),
            2 => format!("A\u{30A}ngstro\u{308}m{index}"),
            _ => respelled(name),
        };
        assert_eq!(
            image.read_to_string(format!("/ci/{other}")).unwrap(),
            format!("contents of {index}"),
            "{name} as {other}"
        );
        let error = image.create_dir(format!("/ci/{other}")).unwrap_err();
        assert_eq!(error.kind(), ErrorKind::AlreadyExists, "{other}");
    }
    // Renamed and removed through other spellings; the listing keeps the
    // spellings the names were stored under.
    image.rename("/ci/file0.txt", "/ci/Renamed").unwrap();
    image.remove_file("/ci/STRASSE1").unwrap();
    image.hard_link("/ci/FILE4.txt", "/ci/LINK").unwrap();
    let mut listed: Vec<String> = image
        .read_dir("/ci")
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    listed.sort();
    let mut expected: Vec<String> = names[2..].to_vec();
    expected.extend(["Renamed".to_string(), "LINK".to_string()]);
    expected.sort();
    assert_eq!(listed, expected);
    assert!(!image.try_exists("/ci/straße1").unwrap());
    assert_eq!(
        image.read_to_string("/ci/renamed").unwrap(),
        "contents of 0"
    );
    // A rename to another spelling of the same name is the same file: as
    // in the kernel, nothing changes.
    image.rename("/ci/link", "/ci/Link").unwrap();
    assert!(
        image
            .read_dir("/ci")
            .unwrap()
            .any(|entry| entry.unwrap().file_name() == "LINK")
    );
    // Subdirectories inherit +F, files do not.
    image.create_dir("/ci/Sub").unwrap();
    image.write("/ci/SUB/Inner", "x").unwrap();
    assert_eq!(image.flags("/ci/sub").unwrap() & CASEFOLD_FL, CASEFOLD_FL);
    assert_eq!(image.flags("/ci/sub/INNER").unwrap() & CASEFOLD_FL, 0);
    image.remove_file("/ci/sub/inner").unwrap();
    image.remove_dir("/ci/SUB").unwrap();
    // Outside, case still matters.
    image.write("/Plain", "p").unwrap();
    assert!(!image.try_exists("/plain").unwrap());
}

#[test]
fn names_match_whatever_their_case() {
    for (variant, args, count) in [("strict-1k", STRICT, 600), ("relaxed-4k", RELAXED, 300)] {
        let dir = tempfile::tempdir().unwrap();
        let path = common::mkfs(dir.path(), variant, 32, args);
        let image = Image::open(&path).unwrap();
        workload(&image, count);
        image.close().unwrap();
        common::assert_fsck_clean(&path);
        // The directory grew an index e2fsck checked.
        let output = Command::new("debugfs")
            .args(["-R", "htree_dump /ci"])
            .arg(&path)
            .output()
            .unwrap();
        let dump = String::from_utf8_lossy(&output.stdout);
        assert!(
            dump.contains("Number of entries"),
            "{variant}: no htree:\n{dump}"
        );
    }
}

#[test]
fn inline_casefolded_directories_match_names_too() {
    let dir = tempfile::tempdir().unwrap();
    let path = common::mkfs(dir.path(), "inline", 16, INLINE);
    let image = Image::open(&path).unwrap();
    casefolded_dir(&image, "/ci");
    image.write("/ci/Small", "s").unwrap();
    assert_eq!(image.read_to_string("/ci/SMALL").unwrap(), "s");
    // A write to another spelling opens the file.
    image.write("/ci/small", "t").unwrap();
    assert_eq!(image.read_to_string("/ci/Small").unwrap(), "t");
    // Grown out of the inode, it still answers.
    for index in 0..40 {
        image.write(format!("/ci/Entry{index}"), "e").unwrap();
    }
    assert!(image.try_exists("/ci/ENTRY39").unwrap() && image.try_exists("/ci/small").unwrap());
    image.remove_file("/ci/sMaLl").unwrap();
    image.close().unwrap();
    common::assert_fsck_clean(&path);
}

#[test]
fn strict_mode_refuses_names_that_are_not_utf8() {
    let bad = std::ffi::OsStr::from_bytes(b"bad\xff");
    for (variant, args, refused) in [("strict", STRICT, true), ("relaxed", RELAXED, false)] {
        let dir = tempfile::tempdir().unwrap();
        let path = common::mkfs(dir.path(), variant, 16, args);
        let image = Image::open(&path).unwrap();
        casefolded_dir(&image, "/ci");
        let inside = PathBuf::from("/ci").join(bad);
        let result = image.write(&inside, "x");
        if refused {
            let error = result.unwrap_err();
            assert_eq!(
                error.raw_os_error(),
                Some(libc::EINVAL),
                "{variant}: {error}"
            );
            let error = image.metadata(&inside).unwrap_err();
            assert_eq!(
                error.raw_os_error(),
                Some(libc::EINVAL),
                "{variant}: lookup"
            );
        } else {
            result.unwrap();
            // Not UTF-8: it matches only itself.
            assert!(image.try_exists(&inside).unwrap());
            let other = PathBuf::from("/ci").join(std::ffi::OsStr::from_bytes(b"BAD\xff"));
            assert!(!image.try_exists(&other).unwrap());
        }
        // Outside a casefolded directory any name goes.
        image.write(PathBuf::from("/").join(bad), "x").unwrap();
        image.close().unwrap();
        common::assert_fsck_clean(&path);
    }
}

#[test]
fn the_flag_changes_where_the_kernel_lets_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = common::mkfs(dir.path(), "flags", 16, RELAXED);
    let image = Image::open(&path).unwrap();
    image.create_dir("/full").unwrap();
    image.write("/full/a", "a").unwrap();
    image.write("/file", "f").unwrap();
    let errno = |result: jext4::Result<()>| result.unwrap_err().raw_os_error();
    let flags = image.flags("/full").unwrap();
    assert_eq!(
        errno(image.set_flags("/full", flags | CASEFOLD_FL)),
        Some(libc::ENOTEMPTY)
    );
    let flags = image.flags("/file").unwrap();
    assert_eq!(
        errno(image.set_flags("/file", flags | CASEFOLD_FL)),
        Some(libc::EOPNOTSUPP)
    );
    // Emptied, it may; and back.
    image.remove_file("/full/a").unwrap();
    let flags = image.flags("/full").unwrap();
    image.set_flags("/full", flags | CASEFOLD_FL).unwrap();
    assert_eq!(image.flags("/full").unwrap() & CASEFOLD_FL, CASEFOLD_FL);
    image.set_flags("/full", flags).unwrap();
    assert_eq!(image.flags("/full").unwrap() & CASEFOLD_FL, 0);
    image.close().unwrap();
    common::assert_fsck_clean(&path);
    // Without the feature there is no +F.
    let plain = common::mkfs(dir.path(), "plain", 16, &["-t", "ext4"]);
    let image = Image::open(&plain).unwrap();
    image.create_dir("/d").unwrap();
    let flags = image.flags("/d").unwrap();
    assert_eq!(
        errno(image.set_flags("/d", flags | CASEFOLD_FL)),
        Some(libc::EOPNOTSUPP)
    );
    image.close().unwrap();
}

/// Run debugfs with `commands` (one per line) on `image`, writable.
fn debugfs_write(image: &Path, commands: &str) {
    let script = image.with_extension("debugfs");
    std::fs::write(&script, commands).unwrap();
    let output = Command::new("debugfs")
        .arg("-w")
        .arg("-f")
        .arg(&script)
        .arg(image)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn a_directory_e2fsprogs_indexed_answers_every_spelling() {
    let dir = tempfile::tempdir().unwrap();
    let path = common::mkfs(dir.path(), "e2fsprogs", 16, STRICT);
    // An empty directory made casefolded (flags: extents | casefold),
    // filled by debugfs, then indexed by e2fsck -fD, which hashes the
    // names folded.
    let mut commands = String::from("mkdir ci\nsif ci flags 0x40080000\ncd ci\n");
    let names: Vec<String> = (0..300).map(|index| format!("Straße-Ω{index}")).collect();
    for name in &names {
        commands.push_str(&format!("write /dev/null {name}\n"));
    }
    debugfs_write(&path, &commands);
    let output = Command::new("e2fsck")
        .args(["-fyD"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(
        output.status.code().unwrap() <= 1,
        "{}",
        String::from_utf8_lossy(&output.stdout)
    );
    common::assert_fsck_clean(&path);
    let image = Image::open(&path).unwrap();
    for name in &names {
        // Ω (U+03A9) as the Ohm sign U+2126, which decomposes to it, and
        // the rest in upper case.
        let other = name.to_uppercase().replace('Ω', "\u{2126}");
        assert!(
            image.try_exists(format!("/ci/{other}")).unwrap(),
            "{name} as {other}"
        );
    }
    for index in 0..100 {
        image.write(format!("/ci/NEW{index}"), "n").unwrap();
    }
    image.remove_file("/ci/strasse-ω7").unwrap();
    image.close().unwrap();
    common::assert_fsck_clean(&path);
}

#[test]
fn casefold_through_a_mount() {
    if !fuse_available() || !common::require_tool("chattr") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = common::mkfs(dir.path(), "mounted", 32, RELAXED);
    let server = Server::start(&image, "");
    let root = server.mountpoint.clone();
    let run = |program: &str, args: &[&Path]| {
        let output = Command::new(program)
            .args(args)
            .env("LC_ALL", "C")
            .output()
            .unwrap();
        (
            output.status.code().unwrap(),
            String::from_utf8_lossy(&output.stdout).into_owned()
                + &String::from_utf8_lossy(&output.stderr),
        )
    };
    let ci = root.join("ci");
    std::fs::create_dir(&ci).unwrap();
    // A miss before +F must not be remembered after it.
    assert!(!ci.join("hello").exists());
    let (code, text) = run("chattr", &[Path::new("+F"), &ci]);
    assert_eq!(code, 0, "chattr +F: {text}");
    let (code, text) = run("lsattr", &[Path::new("-d"), &ci]);
    assert_eq!(code, 0, "{text}");
    assert!(
        text.split_whitespace().next().unwrap().contains('F'),
        "lsattr: {text}"
    );
    std::fs::write(ci.join("Hello"), b"hi").unwrap();
    assert_eq!(std::fs::read(ci.join("hello")).unwrap(), b"hi");
    assert_eq!(std::fs::read(ci.join("HELLO")).unwrap(), b"hi");
    // Every spelling looked up is forgotten when the name goes.
    std::fs::rename(ci.join("HELLO"), ci.join("Bye")).unwrap();
    for gone in ["Hello", "hello", "HELLO"] {
        assert!(!ci.join(gone).exists(), "{gone} after the rename");
    }
    assert_eq!(std::fs::read(ci.join("bye")).unwrap(), b"hi");
    let error = std::fs::create_dir(ci.join("BYE")).unwrap_err();
    assert_eq!(error.kind(), ErrorKind::AlreadyExists);
    let listed: Vec<_> = std::fs::read_dir(&ci)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(listed, ["Bye"]);
    // Not on a directory with names in it.
    let (code, text) = run("chattr", &[Path::new("-F"), &ci]);
    assert_ne!(code, 0, "chattr -F on a full directory");
    assert!(text.contains("Directory not empty"), "{text}");
    std::fs::remove_file(ci.join("BYE")).unwrap();
    drop(server.unmount());
    common::assert_fsck_clean(&image);
}

/// The committed tables are what `scripts/utf8data.py` makes from the
/// Unicode Character Database (Debian's unicode-data): nobody edited them
/// by hand, and the cut back to 12.1 still holds.
#[test]
fn the_tables_are_what_the_generator_makes() {
    if !Path::new("/usr/share/unicode/DerivedAge.txt").exists() {
        common::skip("the Unicode Character Database (package unicode-data) is not installed");
        return;
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let output = Command::new("python3")
        .arg(root.join("scripts/utf8data.py"))
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let committed = std::fs::read(root.join("src/format/casefold/data.rs")).unwrap();
    assert!(
        output.stdout == committed,
        "src/format/casefold/data.rs differs from what scripts/utf8data.py makes"
    );
}

/// An image shaped like Android's `/data` (quota with project ids,
/// casefold in strict mode, verity, encrypt, stable_inodes, 512-byte
/// inodes), which no other userspace driver mounts: jext4 runs a workload
/// of every kind through the library — a casefolded tree with a project
/// and a verity file — and e2fsck, which checks the quota counts and the
/// folded hashes, finds the image clean.
#[test]
fn an_android_data_shaped_image_takes_a_workload() {
    let dir = tempfile::tempdir().unwrap();
    let path = common::mkfs(
        dir.path(),
        "android",
        64,
        &[
            "-t",
            "ext4",
            "-I",
            "512",
            "-O",
            "quota,project,casefold,verity,encrypt,stable_inodes",
            "-E",
            "encoding=utf8,encoding_flags=strict",
        ],
    );
    let image = Image::open(&path).unwrap();
    image.create_dir("/media").unwrap();
    let flags = image.flags("/media").unwrap();
    image
        .set_flags("/media", flags | CASEFOLD_FL | jext4::PROJINHERIT_FL)
        .unwrap();
    image
        .fs()
        .set_fs_xattr(
            image.metadata("/media").unwrap().ino() as u32,
            0x200, // FS_XFLAG_PROJINHERIT
            1055,
            jext4::engine::fs::Caller::ROOT,
        )
        .unwrap();
    for index in 0..200 {
        image
            .write(
                format!("/media/Photo{index}.JPG"),
                vec![index as u8; 3000 + index],
            )
            .unwrap();
    }
    image.create_dir("/media/DCIM").unwrap();
    image
        .write("/media/dcim/Clip.mp4", vec![7u8; 100_000])
        .unwrap();
    assert_eq!(image.read("/media/PHOTO7.jpg").unwrap(), vec![7u8; 3007]);
    image.write("/app.apk", vec![9u8; 70_000]).unwrap();
    image.enable_verity("/app.apk").unwrap();
    image.remove_file("/media/photo3.jpg").unwrap();
    image.close().unwrap();
    common::assert_fsck_clean(&path);
}
