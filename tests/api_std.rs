//! The std-shaped library API (`jext4::Image`, `File`, `ReadDir`,
//! `Metadata`, `OpenOptions`) against real behaviour: mke2fs-made images,
//! contents and error kinds asserted, `e2fsck -fn` clean after each
//! workload; and a differential run of one sequence of operations through
//! `std::fs` on a kernel loop mount and through jext4 on a copy of the same
//! image, result for result and tree for tree.

// The jext4 binary, or the mounts and helpers of tests/common that use it.
#![cfg(feature = "cli")]

mod common;

use common::e2e::{self, KernelMount};
use jext4::{Image, OpenOptions};
use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::io::{self, ErrorKind, Read, Seek, SeekFrom, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, FileExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

/// `Image` and `File` can be shared between threads (and what they hand
/// out too): checked when this file compiles.
const _: () = {
    const fn shareable<T: Send + Sync>() {}
    shareable::<jext4::Image>();
    shareable::<jext4::File>();
    shareable::<jext4::ReadDir>();
    shareable::<jext4::DirEntry>();
    shareable::<jext4::Walk>();
    shareable::<jext4::Error>();
};

/// A fresh ext4 image of `size_mib` in a scratch directory (kept alive
/// by the returned guard).
fn fresh(name: &str, size_mib: u64) -> Option<(tempfile::TempDir, PathBuf)> {
    if !common::require_tool("mke2fs") || !common::require_tool("e2fsck") {
        return None;
    }
    let scratch = e2e::scratch(name);
    let image = common::mkfs(scratch.path(), name, size_mib, &["-t", "ext4"]);
    Some((scratch, image))
}

/// The errno behind an `io::Error` from the API: the OS error, or the
/// jext4 error it carries.
fn errno(error: &io::Error) -> Option<i32> {
    error.raw_os_error().or_else(|| {
        error
            .get_ref()
            .and_then(|inner| inner.downcast_ref::<jext4::Error>())
            .map(jext4::Error::errno)
    })
}

/// The issue's program (issue 27), unchanged but for the image path.
fn issue_program(path: &Path) -> io::Result<u64> {
    fn count(image: &jext4::Image, dir: &std::path::Path) -> io::Result<u64> {
        let mut n = 0;
        for entry in image.read_dir(dir)? {
            let entry = entry?;
            n += 1;
            if entry.file_type()?.is_dir() {
                n += count(image, &entry.path())?;
            }
        }
        Ok(n)
    }
    let image = jext4::Image::open(path)?;
    image.create_dir_all("/srv/www")?;
    image.write("/srv/www/index.html", b"<h1>hi</h1>\n")?;
    let mut log = image.open_with(
        "/srv/log",
        jext4::OpenOptions::new()
            .write(true)
            .create(true)
            .append(true),
    )?;
    log.write_all(b"started\n")?;
    log.sync_data()?;
    let mut page = String::new();
    image
        .open_file("/srv/www/index.html")?
        .read_to_string(&mut page)?;
    assert_eq!(page, "<h1>hi</h1>\n");
    let mut file = image.open_file("/srv/www/index.html")?;
    file.seek(SeekFrom::Start(4))?;
    let mut two = [0u8; 2];
    file.read_exact(&mut two)?;
    assert_eq!(&two, b"hi");
    file.read_exact_at(&mut two, 0)?;
    assert_eq!(&two, b"<h");
    let meta = image.metadata("/srv/www/index.html")?;
    println!(
        "{} bytes, mode {:o}, changed {:?}",
        meta.len(),
        meta.permissions().mode(),
        meta.modified()?
    );
    image.set_permissions(
        "/srv/www/index.html",
        std::fs::Permissions::from_mode(0o644),
    )?;
    match image.metadata("/srv/missing") {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        other => panic!("{:?}", other.map(|_| ())),
    }
    let entries = count(&image, std::path::Path::new("/"))?;
    drop((log, file));
    image.close()?;
    Ok(entries)
}

#[test]
fn the_issue_s_program_runs() {
    let Some((_scratch, path)) = fresh("api-issue", 16) else {
        return;
    };
    // lost+found, srv, srv/www, srv/www/index.html, srv/log.
    assert_eq!(issue_program(&path).unwrap(), 5);
    common::assert_fsck_clean(&path);
}

#[test]
fn files_read_write_seek_and_positioned_io() {
    let Some((_scratch, path)) = fresh("api-files", 16) else {
        return;
    };
    let image = Image::open(&path).unwrap();

    // create_file: write-only, 0666 less the umask.
    let mut file = image.create_file("/data").unwrap();
    file.write_all(b"hello world").unwrap();
    assert_eq!(file.stream_position().unwrap(), 11);
    let mut buf = [0u8; 4];
    let denied = file.read(&mut buf).unwrap_err();
    assert_eq!(denied.raw_os_error(), Some(libc::EBADF));
    file.seek(SeekFrom::Start(6)).unwrap();
    file.write_all(b"there").unwrap();
    assert_eq!(file.seek(SeekFrom::End(-5)).unwrap(), 6);
    assert_eq!(file.seek(SeekFrom::Current(2)).unwrap(), 8);
    let before_start = file.seek(SeekFrom::Current(-100)).unwrap_err();
    assert_eq!(before_start.kind(), ErrorKind::InvalidInput);
    assert_eq!(file.metadata().unwrap().len(), 11);
    assert_eq!(file.metadata().unwrap().permissions().mode() & 0o777, 0o644);
    file.sync_all().unwrap();
    file.sync_data().unwrap();
    drop(file);
    assert_eq!(image.read("/data").unwrap(), b"hello there");

    // Positioned I/O leaves the position alone.
    let mut file = image
        .open_with("/data", OpenOptions::new().read(true).write(true))
        .unwrap();
    file.write_all_at(b"J", 0).unwrap();
    let mut word = [0u8; 5];
    file.read_exact_at(&mut word, 6).unwrap();
    assert_eq!(&word, b"there");
    assert_eq!(file.stream_position().unwrap(), 0);
    let mut all = String::new();
    file.read_to_string(&mut all).unwrap();
    assert_eq!(all, "Jello there");
    assert_eq!(file.read(&mut word).unwrap(), 0, "at the end");
    assert_eq!(file.read_at(&mut word, 100).unwrap(), 0, "past the end");

    // set_len both ways; set_permissions on the open file.
    file.set_len(5).unwrap();
    assert_eq!(image.read("/data").unwrap(), b"Jello");
    file.set_len(8).unwrap();
    assert_eq!(image.read("/data").unwrap(), b"Jello\0\0\0");
    file.set_permissions(std::fs::Permissions::from_mode(0o600))
        .unwrap();
    assert_eq!(image.metadata("/data").unwrap().mode(), 0o100600);
    drop(file);
    let read_only = image.open_file("/data").unwrap();
    assert_eq!(
        read_only.set_len(0).unwrap_err().kind(),
        ErrorKind::InvalidInput
    );
    let mut writer = &read_only;
    assert_eq!(
        writer.write(b"x").unwrap_err().raw_os_error(),
        Some(libc::EBADF)
    );
    drop(read_only);

    // Append mode writes at the end whatever the position, and `&File`
    // reads and writes too.
    let mut log = image
        .open_with(
            "/log",
            OpenOptions::new().append(true).create(true).mode(0o640),
        )
        .unwrap();
    log.write_all(b"one\n").unwrap();
    log.seek(SeekFrom::Start(0)).unwrap();
    log.write_all(b"two\n").unwrap();
    (&log).write_all(b"three\n").unwrap();
    assert_eq!(image.read_to_string("/log").unwrap(), "one\ntwo\nthree\n");
    assert_eq!(image.metadata("/log").unwrap().permissions().mode(), 0o640);
    drop(log);

    // create_file truncates; write is std::fs::write.
    image.write("/data", "short").unwrap();
    assert_eq!(image.read("/data").unwrap(), b"short");
    image.create_file("/data").unwrap();
    assert_eq!(image.metadata("/data").unwrap().len(), 0);

    // A file written from several threads through one shared File.
    let shared = std::sync::Arc::new(image.create_file("/threads").unwrap());
    std::thread::scope(|scope| {
        for t in 0..4u8 {
            let file = shared.clone();
            scope.spawn(move || {
                for round in 0..16u64 {
                    let at = (round * 4 + u64::from(t)) * 512;
                    file.write_all_at(&[t + 1; 512], at).unwrap();
                }
            });
        }
    });
    drop(shared);
    let written = image.read("/threads").unwrap();
    assert_eq!(written.len(), 64 * 512);
    for (index, piece) in written.chunks(512).enumerate() {
        assert!(
            piece.iter().all(|&b| b == (index % 4) as u8 + 1),
            "piece {index}"
        );
    }

    image.close().unwrap();
    common::assert_fsck_clean(&path);
}

#[test]
fn open_errors_are_open_2_s() {
    let Some((_scratch, path)) = fresh("api-open", 16) else {
        return;
    };
    let image = Image::open(&path).unwrap();
    image.create_dir("/dir").unwrap();
    image.write("/dir/file", "x").unwrap();
    image.symlink("file", "/dir/link").unwrap();
    image.symlink("/loop-b", "/loop-a").unwrap();
    image.symlink("/loop-a", "/loop-b").unwrap();

    let kind = |result: jext4::Result<jext4::File>| result.map(|_| ()).unwrap_err();
    let error = kind(image.open_file("/missing"));
    assert_eq!(
        (error.kind(), error.raw_os_error()),
        (ErrorKind::NotFound, Some(libc::ENOENT))
    );
    let error = kind(image.create_file("/dir"));
    assert_eq!(
        (error.kind(), error.raw_os_error()),
        (ErrorKind::IsADirectory, Some(libc::EISDIR))
    );
    let error = kind(image.open_with("/dir/file", OpenOptions::new().write(true).create_new(true)));
    assert_eq!(
        (error.kind(), error.raw_os_error()),
        (ErrorKind::AlreadyExists, Some(libc::EEXIST))
    );
    // create_new refuses a dangling link too, without following it.
    image.symlink("/nowhere", "/dangling").unwrap();
    let error = kind(image.open_with("/dangling", OpenOptions::new().write(true).create_new(true)));
    assert_eq!(error.kind(), ErrorKind::AlreadyExists);
    let error = kind(image.open_file("/dir/file/below"));
    assert_eq!(error.kind(), ErrorKind::NotADirectory);
    let error = kind(image.open_file("/loop-a"));
    assert_eq!(error.raw_os_error(), Some(libc::ELOOP));
    assert_eq!(format!("{:?}", error.kind()), "FilesystemLoop");
    let error = kind(image.open_with(
        "/dir/link",
        OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW),
    ));
    assert_eq!(error.raw_os_error(), Some(libc::ELOOP));
    // std's option checks, before the path is looked at.
    for options in [
        OpenOptions::new().clone(),
        OpenOptions::new().read(true).create(true).clone(),
        OpenOptions::new().append(true).truncate(true).clone(),
    ] {
        let error = kind(image.open_with("/missing", &options));
        assert_eq!(error.kind(), ErrorKind::InvalidInput, "{options:?}");
    }
    // A directory opens for reading (as std's File::open); reading it is EISDIR.
    let mut dir = image.open_file("/dir").unwrap();
    let mut buf = [0u8; 8];
    assert_eq!(
        dir.read(&mut buf).unwrap_err().raw_os_error(),
        Some(libc::EISDIR)
    );
    dir.sync_all().unwrap();
    drop(dir);
    // Through a link.
    assert_eq!(image.read("/dir/link").unwrap(), b"x");
    // create through a link to a file opens the file.
    let mut through = image
        .open_with("/dir/link", OpenOptions::new().append(true).create(true))
        .unwrap();
    through.write_all(b"y").unwrap();
    drop(through);
    assert_eq!(image.read("/dir/file").unwrap(), b"xy");
    image.close().unwrap();
    common::assert_fsck_clean(&path);
}

#[test]
fn directories_list_stream_and_walk() {
    let Some((_scratch, path)) = fresh("api-dirs", 32) else {
        return;
    };
    let image = Image::open(&path).unwrap();
    image.create_dir_all("/a/b/c").unwrap();
    image.create_dir_all("/a/b/c").unwrap();
    image.create_dir_all("a/b/d/").unwrap();
    image.write("/a/f", "f").unwrap();
    image.symlink("b", "/a/to-b").unwrap();
    // create_dir_all through a link to a directory.
    image.create_dir_all("/a/to-b/e").unwrap();
    assert!(image.metadata("/a/b/e").unwrap().is_dir());
    assert_eq!(
        image.create_dir_all("/a/f").unwrap_err().kind(),
        ErrorKind::AlreadyExists
    );
    assert_eq!(
        image.create_dir_all("/a/f/g").unwrap_err().kind(),
        ErrorKind::NotADirectory
    );
    assert_eq!(
        image.create_dir("/a").unwrap_err().kind(),
        ErrorKind::AlreadyExists
    );
    assert_eq!(
        image.create_dir("/x/y").unwrap_err().kind(),
        ErrorKind::NotFound
    );
    image
        .create_dir_with("/private", jext4::DirBuilder::new().mode(0o700))
        .unwrap();
    assert_eq!(
        image.metadata("/private").unwrap().permissions().mode(),
        0o700
    );
    assert_eq!(image.metadata("/a").unwrap().permissions().mode(), 0o755);

    // read_dir: names, paths, types, no "." or "..".
    let mut seen = BTreeMap::new();
    for entry in image.read_dir("/a").unwrap() {
        let entry = entry.unwrap();
        assert_eq!(entry.path(), Path::new("/a").join(entry.file_name()));
        let metadata = entry.metadata().unwrap();
        assert_eq!(metadata.ino(), entry.ino());
        let kind = entry.file_type().unwrap();
        assert_eq!(
            kind.is_symlink(),
            metadata.is_symlink(),
            "DirEntry::metadata does not follow"
        );
        seen.insert(
            entry.file_name().into_string().unwrap(),
            (kind.is_dir(), kind.is_file(), kind.is_symlink()),
        );
    }
    let expected: BTreeMap<String, (bool, bool, bool)> = [
        ("b".to_string(), (true, false, false)),
        ("f".to_string(), (false, true, false)),
        ("to-b".to_string(), (false, false, true)),
    ]
    .into();
    assert_eq!(seen, expected);
    assert_eq!(
        image.read_dir("/a/f").unwrap_err().kind(),
        ErrorKind::NotADirectory
    );
    assert_eq!(
        image.read_dir("/none").unwrap_err().kind(),
        ErrorKind::NotFound
    );

    // A directory much bigger than one listing batch, with names that are
    // not UTF-8: each name once.
    image.create_dir("/big").unwrap();
    let count = 3000;
    for i in 0..count {
        let mut name = format!("/big/entry-{i:05}-").into_bytes();
        name.push(0xff);
        image.write(OsStr::from_bytes(&name), b"").unwrap();
    }
    let mut names = std::collections::HashSet::new();
    for entry in image.read_dir("/big").unwrap() {
        let name = entry.unwrap().file_name();
        assert_eq!(name.as_bytes().last(), Some(&0xff));
        assert!(names.insert(name), "a name listed twice");
    }
    assert_eq!(names.len(), count);

    // walk: depth first, a directory's entry before its contents.
    let walked: Vec<PathBuf> = image
        .walk("/a")
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .collect();
    assert_eq!(walked.len(), 6, "{walked:?}"); // b, b/c, b/d, b/e, f, to-b
    let position = |p: &str| {
        walked
            .iter()
            .position(|w| w == Path::new(p))
            .unwrap_or_else(|| panic!("{p} not walked: {walked:?}"))
    };
    assert!(position("/a/b") < position("/a/b/c"));
    assert!(position("/a/b") < position("/a/b/d"));
    // Depth first: b's subtree is contiguous.
    let b = position("/a/b");
    for inner in ["/a/b/c", "/a/b/d", "/a/b/e"] {
        assert!(position(inner) <= b + 3);
    }
    // The link is listed, not followed.
    let under_link = |w: &&PathBuf| w.starts_with("/a/to-b") && *w != Path::new("/a/to-b");
    assert!(!walked.iter().any(|w| under_link(&w)), "{walked:?}");

    // remove_dir / remove_dir_all.
    assert_eq!(
        image.remove_dir("/a/b").unwrap_err().kind(),
        ErrorKind::DirectoryNotEmpty
    );
    assert_eq!(
        image.remove_dir("/a/f").unwrap_err().kind(),
        ErrorKind::NotADirectory
    );
    assert_eq!(
        image.remove_file("/a/b").unwrap_err().kind(),
        ErrorKind::IsADirectory
    );
    image.remove_dir("/a/b/c").unwrap();
    image.remove_dir_all("/big").unwrap();
    assert!(!image.exists("/big"));
    assert_eq!(
        image.remove_dir_all("/a/f").unwrap_err().kind(),
        ErrorKind::NotADirectory
    );
    image.remove_dir_all("/a/to-b").unwrap(); // the link itself
    assert!(image.exists("/a/b/d"));
    image.remove_dir_all("/a").unwrap();
    assert!(!image.try_exists("/a").unwrap());
    image.close().unwrap();
    common::assert_fsck_clean(&path);
}

#[test]
fn names_links_times_owners_and_xattrs() {
    let Some((_scratch, path)) = fresh("api-names", 16) else {
        return;
    };
    let image = Image::open(&path).unwrap();
    image.write("/f", "content").unwrap();

    // Hard links and renames.
    image.hard_link("/f", "/g").unwrap();
    assert_eq!(image.metadata("/f").unwrap().nlink(), 2);
    assert_eq!(
        image.metadata("/f").unwrap().ino(),
        image.metadata("/g").unwrap().ino()
    );
    assert_eq!(
        image.hard_link("/f", "/g").unwrap_err().kind(),
        ErrorKind::AlreadyExists
    );
    image.create_dir("/d").unwrap();
    assert_eq!(
        image.hard_link("/d", "/d2").unwrap_err().raw_os_error(),
        Some(libc::EPERM)
    );
    image.rename("/g", "/d/g").unwrap();
    assert_eq!(image.read("/d/g").unwrap(), b"content");
    assert_eq!(
        image.rename("/missing", "/x").unwrap_err().kind(),
        ErrorKind::NotFound
    );
    assert_eq!(
        image.rename("/d", "/d/inside").unwrap_err().raw_os_error(),
        Some(libc::EINVAL)
    );
    image.write("/replaced", "old").unwrap();
    image.rename("/d/g", "/replaced").unwrap();
    assert_eq!(image.read("/replaced").unwrap(), b"content");

    // Symbolic links: stored as given, bytes.
    let target = OsStr::from_bytes(b"f\xe9");
    image.symlink(target, "/link").unwrap();
    assert_eq!(image.read_link("/link").unwrap(), Path::new(target));
    assert_eq!(
        image.read_link("/f").unwrap_err().kind(),
        ErrorKind::InvalidInput
    );
    image.symlink("f", "/good").unwrap();
    assert!(image.metadata("/good").unwrap().is_file());
    let link = image.symlink_metadata("/good").unwrap();
    assert!(link.is_symlink() && link.file_type().is_symlink());
    assert_eq!(link.len(), 1);
    assert_eq!(
        image.metadata("/link").unwrap_err().kind(),
        ErrorKind::NotFound
    );
    assert!(!image.exists("/link"));
    assert!(!image.try_exists("/link").unwrap());
    image.symlink("/loop", "/loop").unwrap();
    assert_eq!(
        image.try_exists("/loop").unwrap_err().raw_os_error(),
        Some(libc::ELOOP)
    );

    // Metadata fields.
    let metadata = image.metadata("/f").unwrap();
    assert!(metadata.is_file() && !metadata.is_dir() && !metadata.is_symlink());
    assert_eq!(metadata.len(), 7);
    assert_eq!(metadata.size(), 7);
    assert_eq!(metadata.mode() & 0o170000, libc::S_IFREG);
    // SAFETY: getuid/getgid have no preconditions.
    assert_eq!((metadata.uid(), metadata.gid()), unsafe {
        (libc::getuid(), libc::getgid())
    });
    assert!(metadata.blocks() >= 2);
    assert_eq!(metadata.blksize(), 1024);
    // crtime exists where the inode has room for it (256-byte inodes).
    let _ = metadata.created();
    let types = image.metadata("/d").unwrap().file_type();
    assert!(types.is_dir() && !types.is_block_device() && !types.is_char_device());
    assert!(!types.is_fifo() && !types.is_socket());

    // set_permissions (follows links), set_owner, set_times (nanoseconds).
    image
        .set_permissions("/good", std::fs::Permissions::from_mode(0o4750))
        .unwrap();
    assert_eq!(image.metadata("/f").unwrap().permissions().mode(), 0o4750);
    image.set_owner("/f", Some(1234), Some(5678)).unwrap();
    let owned = image.metadata("/f").unwrap();
    assert_eq!((owned.uid(), owned.gid()), (1234, 5678));
    image.set_owner("/f", None, Some(42)).unwrap();
    assert_eq!(
        (
            image.metadata("/f").unwrap().uid(),
            image.metadata("/f").unwrap().gid()
        ),
        (1234, 42)
    );
    let accessed = SystemTime::UNIX_EPOCH + Duration::new(1_000_000_000, 123_456_789);
    let modified = SystemTime::UNIX_EPOCH + Duration::new(1_500_000_000, 987_654_321);
    image.set_times("/good", accessed, modified).unwrap();
    let timed = image.metadata("/f").unwrap();
    assert_eq!(timed.accessed().unwrap(), accessed);
    assert_eq!(timed.modified().unwrap(), modified);
    assert_eq!(
        (timed.mtime(), timed.mtime_nsec()),
        (1_500_000_000, 987_654_321)
    );
    assert_eq!(
        (timed.atime(), timed.atime_nsec()),
        (1_000_000_000, 123_456_789)
    );
    assert!(timed.ctime() >= 1_700_000_000);
    let std_ext = std::os::unix::fs::MetadataExt::mtime(&timed);
    assert_eq!(std_ext, 1_500_000_000);

    // copy: contents and permission bits; a directory is refused.
    assert_eq!(image.copy("/f", "/copy").unwrap(), 7);
    assert_eq!(image.read("/copy").unwrap(), b"content");
    assert_eq!(
        image.metadata("/copy").unwrap().permissions().mode() & 0o777,
        0o750
    );
    assert_eq!(
        image.copy("/d", "/copy2").unwrap_err().kind(),
        ErrorKind::InvalidInput
    );

    // read_to_string refuses bytes that are not UTF-8.
    image.write("/binary", [0xffu8, 0xfe]).unwrap();
    assert_eq!(
        image.read_to_string("/binary").unwrap_err().kind(),
        ErrorKind::InvalidData
    );

    // Extended attributes.
    assert_eq!(image.xattr("/f", "user.none").unwrap(), None);
    image.set_xattr("/f", "user.colour", b"blue").unwrap();
    image.set_xattr("/f", "user.size", "large").unwrap();
    assert_eq!(
        image.xattr("/f", "user.colour").unwrap().as_deref(),
        Some(&b"blue"[..])
    );
    let mut names = image.list_xattr("/f").unwrap();
    names.sort();
    assert_eq!(names, ["user.colour", "user.size"]);
    image.remove_xattr("/f", "user.colour").unwrap();
    assert_eq!(
        image
            .remove_xattr("/f", "user.colour")
            .unwrap_err()
            .raw_os_error(),
        Some(libc::ENODATA)
    );
    assert_eq!(image.list_xattr("/f").unwrap(), ["user.size"]);

    image.remove_file("/copy").unwrap();
    assert_eq!(
        image.remove_file("/copy").unwrap_err().kind(),
        ErrorKind::NotFound
    );
    image.close().unwrap();
    common::assert_fsck_clean(&path);
}

#[test]
fn errors_convert_for_question_mark_with_std_s_kinds() {
    let Some((_scratch, path)) = fresh("api-errors", 8) else {
        return;
    };
    fn fill(image: &Image) -> io::Result<()> {
        let mut file = image.create_file("/fill")?;
        let chunk = vec![7u8; 1 << 20];
        loop {
            file.write_all(&chunk)?;
        }
    }
    let image = Image::open(&path).unwrap();
    let full = fill(&image).unwrap_err();
    assert_eq!(
        (full.kind(), full.raw_os_error()),
        (ErrorKind::StorageFull, Some(libc::ENOSPC))
    );
    // Deletions still work on a full volume.
    image.remove_file("/fill").unwrap();
    image.close().unwrap();
    common::assert_fsck_clean(&path);

    let image = Image::open_read_only(&path).unwrap();
    let error = image.write("/x", "x").unwrap_err();
    assert_eq!(
        (error.kind(), error.raw_os_error()),
        (ErrorKind::ReadOnlyFilesystem, Some(libc::EROFS))
    );
    let converted = io::Error::from(error);
    assert_eq!(converted.raw_os_error(), Some(libc::EROFS));
    assert_eq!(
        image.create_dir("/y").unwrap_err().kind(),
        ErrorKind::ReadOnlyFilesystem
    );
    assert!(
        image
            .read_dir("/")
            .unwrap()
            .any(|e| e.unwrap().file_name() == "lost+found")
    );
    // A bad option is InvalidInput, its reason kept.
    let bad = Image::options().cache_size(1).open(&path).unwrap_err();
    assert_eq!(bad.kind(), ErrorKind::InvalidInput);
    let as_io = io::Error::from(bad);
    assert!(as_io.to_string().contains("cache size"), "{as_io}");
    assert_eq!(errno(&as_io), Some(libc::EINVAL));
    drop(image);
}

#[test]
fn close_and_drop_unmount_cleanly() {
    let Some((_scratch, path)) = fresh("api-close", 16) else {
        return;
    };
    // A File outlives the Image it came from: the unmount waits for it.
    let image = Image::options()
        .commit_interval(Duration::from_secs(1))
        .open(&path)
        .unwrap();
    let mut file = image.create_file("/kept").unwrap();
    drop(image);
    file.write_all(b"after the image was dropped").unwrap();
    drop(file);
    common::assert_fsck_clean(&path);
    let image = Image::from_device(Box::new(
        jext4::engine::dev::FileDevice::open(&path, false).unwrap(),
    ))
    .unwrap();
    assert_eq!(image.read("/kept").unwrap(), b"after the image was dropped");

    // close() unmounts at once; what is still open answers EBADF.
    let mut file = image
        .open_with("/kept", OpenOptions::new().read(true).write(true))
        .unwrap();
    let listing = image.read_dir("/").unwrap();
    image.close().unwrap();
    let error = file.write(b"late").unwrap_err();
    assert_eq!(error.raw_os_error().or(errno(&error)), Some(libc::EBADF));
    assert_eq!(
        file.metadata().unwrap_err().kind(),
        io::Error::from_raw_os_error(libc::EBADF).kind()
    );
    let listed: Vec<_> = listing.collect();
    assert!(
        listed.iter().all(|entry| entry.is_err()),
        "a listing after close fails"
    );
    drop(file);
    common::assert_fsck_clean(&path);
    // The image is clean: no recovery needed.
    let output = std::process::Command::new("dumpe2fs")
        .arg("-h")
        .arg(&path)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(!text.contains("needs_recovery"), "{text}");
}

// ----- Differential: std::fs on a kernel mount against jext4 -----

/// One step of the differential sequence; paths are relative to the root.
#[derive(Debug, Clone)]
enum Op {
    CreateDir(&'static str),
    CreateDirAll(&'static str),
    Write(&'static [u8], &'static [u8]),
    Read(&'static str),
    ReadToString(&'static str),
    Append(&'static str, &'static str),
    CreateNew(&'static str),
    OpenWrite(&'static str),
    OpenNothing(&'static str),
    RemoveFile(&'static str),
    RemoveDir(&'static str),
    RemoveDirAll(&'static str),
    Rename(&'static str, &'static str),
    HardLink(&'static str, &'static str),
    Symlink(&'static str, &'static str),
    ReadLink(&'static str),
    Metadata(&'static str),
    SymlinkMetadata(&'static str),
    ReadDir(&'static str),
    SetPermissions(&'static str, u32),
    SetLen(&'static str, u64),
    Copy(&'static str, &'static str),
    Exists(&'static str),
}

fn sequence() -> Vec<Op> {
    use Op::*;
    vec![
        CreateDir("a"),
        CreateDir("a"),
        CreateDir("x/y"),
        CreateDirAll("a/b/c"),
        CreateDirAll("a/b/c"),
        Write(b"a/f", b"hello"),
        CreateDirAll("a/f/g"),
        CreateDirAll("a/f"),
        CreateDir("a/f"),
        Read("a/f"),
        Read("a"),
        Read("nope"),
        Read("a/f/x"),
        Append("a/log", "one\n"),
        Append("a/log", "two\n"),
        ReadToString("a/log"),
        CreateNew("a/f"),
        CreateNew("a/new"),
        OpenWrite("a"),
        OpenWrite("a/missing-dir/file"),
        OpenNothing("a/f"),
        Symlink("f", "a/lf"),
        ReadLink("a/lf"),
        Metadata("a/lf"),
        SymlinkMetadata("a/lf"),
        ReadLink("a/f"),
        Symlink("loop2", "loop1"),
        Symlink("loop1", "loop2"),
        Metadata("loop1"),
        Read("loop1"),
        Symlink("missing", "a/dangling"),
        Metadata("a/dangling"),
        SymlinkMetadata("a/dangling"),
        Exists("a/dangling"),
        Exists("loop1"),
        Exists("a/f"),
        HardLink("a/f", "a/f2"),
        Metadata("a/f"),
        HardLink("a", "a2"),
        HardLink("a/f", "a/log"),
        Rename("a/f2", "a/g"),
        Rename("a/g", "a/b"),
        Rename("a/b", "a/f"),
        Rename("a", "a/b/c/d"),
        Rename("nope", "z"),
        RemoveDir("a/b"),
        RemoveFile("a/b"),
        RemoveDir("a/f"),
        RemoveFile("a/nope"),
        SetPermissions("a/f", 0o600),
        Metadata("a/f"),
        SetPermissions("a/lf", 0o640),
        Metadata("a/f"),
        SetLen("a/f", 2),
        Read("a/f"),
        SetLen("a/f", 10),
        Read("a/f"),
        SetLen("a", 0),
        Copy("a/f", "a/copy"),
        Metadata("a/copy"),
        Copy("a", "a/c2"),
        Copy("nope", "a/c3"),
        Write(b"\xff\xfe", b"bytes"),
        Write(b"bad", b"\xff"),
        ReadToString("bad"),
        ReadDir(""),
        ReadDir("a"),
        ReadDir("a/f"),
        ReadDir("nope"),
        Metadata("a/g"),
        RemoveDirAll("a/f"),
        RemoveDirAll("a/lf"),
        RemoveDirAll("a/b"),
        Metadata("a/b"),
        ReadDir("a"),
        RemoveFile("a/g"),
        RemoveFile("a/new"),
    ]
}

/// What an operation answered, in a form both sides produce alike.
fn outcome<T: std::fmt::Debug>(result: io::Result<T>) -> String {
    match result {
        Ok(value) => format!("ok {value:?}"),
        Err(error) => format!("err {:?}", error.kind()),
    }
}

/// The attributes both sides must agree on.
fn described(
    is_dir: bool,
    is_file: bool,
    is_symlink: bool,
    len: u64,
    mode: u32,
    nlink: u64,
) -> String {
    // A directory's size is its blocks, an allocation detail.
    let len = if is_dir { 0 } else { len };
    format!("dir={is_dir} file={is_file} link={is_symlink} len={len} mode={mode:o} nlink={nlink}")
}

fn apply_std(root: &Path, op: &Op) -> String {
    use std::os::unix::fs::MetadataExt;
    let at = |p: &str| root.join(p);
    let describe = |m: std::fs::Metadata| {
        described(
            m.is_dir(),
            m.is_file(),
            m.is_symlink(),
            m.len(),
            m.mode(),
            m.nlink(),
        )
    };
    match op {
        Op::CreateDir(p) => outcome(std::fs::create_dir(at(p))),
        Op::CreateDirAll(p) => outcome(std::fs::create_dir_all(at(p))),
        Op::Write(p, data) => outcome(std::fs::write(root.join(OsStr::from_bytes(p)), data)),
        Op::Read(p) => outcome(std::fs::read(at(p))),
        Op::ReadToString(p) => outcome(std::fs::read_to_string(at(p))),
        Op::Append(p, data) => outcome(
            std::fs::OpenOptions::new()
                .append(true)
                .create(true)
                .open(at(p))
                .and_then(|mut f| f.write_all(data.as_bytes())),
        ),
        Op::CreateNew(p) => outcome(
            std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(at(p))
                .map(drop),
        ),
        Op::OpenWrite(p) => outcome(
            std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(false)
                .open(at(p))
                .map(drop),
        ),
        Op::OpenNothing(p) => outcome(std::fs::OpenOptions::new().open(at(p)).map(drop)),
        Op::RemoveFile(p) => outcome(std::fs::remove_file(at(p))),
        Op::RemoveDir(p) => outcome(std::fs::remove_dir(at(p))),
        Op::RemoveDirAll(p) => outcome(std::fs::remove_dir_all(at(p))),
        Op::Rename(a, b) => outcome(std::fs::rename(at(a), at(b))),
        Op::HardLink(a, b) => outcome(std::fs::hard_link(at(a), at(b))),
        Op::Symlink(target, link) => outcome(std::os::unix::fs::symlink(target, at(link))),
        Op::ReadLink(p) => outcome(std::fs::read_link(at(p))),
        Op::Metadata(p) => outcome(std::fs::metadata(at(p)).map(describe)),
        Op::SymlinkMetadata(p) => outcome(std::fs::symlink_metadata(at(p)).map(describe)),
        Op::ReadDir(p) => outcome(std::fs::read_dir(at(p)).and_then(|entries| {
            let mut names = entries
                .map(|e| e.map(|e| e.file_name()))
                .collect::<io::Result<Vec<_>>>()?;
            names.sort();
            Ok(names)
        })),
        Op::SetPermissions(p, mode) => outcome(std::fs::set_permissions(
            at(p),
            std::fs::Permissions::from_mode(*mode),
        )),
        Op::SetLen(p, len) => outcome(
            std::fs::OpenOptions::new()
                .write(true)
                .open(at(p))
                .and_then(|f| f.set_len(*len)),
        ),
        Op::Copy(a, b) => outcome(std::fs::copy(at(a), at(b))),
        Op::Exists(p) => outcome(std::fs::exists(at(p))),
    }
}

fn apply_jext4(image: &Image, op: &Op) -> String {
    let at = |p: &str| format!("/{p}");
    let describe = |m: jext4::Metadata| {
        described(
            m.is_dir(),
            m.is_file(),
            m.is_symlink(),
            m.len(),
            m.mode(),
            m.nlink(),
        )
    };
    fn io<T>(result: jext4::Result<T>) -> io::Result<T> {
        result.map_err(io::Error::from)
    }
    match op {
        Op::CreateDir(p) => outcome(io(image.create_dir(at(p)))),
        Op::CreateDirAll(p) => outcome(io(image.create_dir_all(at(p)))),
        Op::Write(p, data) => {
            let mut path = b"/".to_vec();
            path.extend_from_slice(p);
            outcome(io(image.write(OsStr::from_bytes(&path), data)))
        }
        Op::Read(p) => outcome(io(image.read(at(p)))),
        Op::ReadToString(p) => outcome(io(image.read_to_string(at(p)))),
        Op::Append(p, data) => outcome(
            io(image.open_with(at(p), OpenOptions::new().append(true).create(true)))
                .and_then(|mut f| f.write_all(data.as_bytes())),
        ),
        Op::CreateNew(p) => outcome(io(image
            .open_with(at(p), OpenOptions::new().write(true).create_new(true))
            .map(drop))),
        Op::OpenWrite(p) => outcome(io(image
            .open_with(at(p), OpenOptions::new().write(true).create(true))
            .map(drop))),
        Op::OpenNothing(p) => outcome(io(image.open_with(at(p), &OpenOptions::new()).map(drop))),
        Op::RemoveFile(p) => outcome(io(image.remove_file(at(p)))),
        Op::RemoveDir(p) => outcome(io(image.remove_dir(at(p)))),
        Op::RemoveDirAll(p) => outcome(io(image.remove_dir_all(at(p)))),
        Op::Rename(a, b) => outcome(io(image.rename(at(a), at(b)))),
        Op::HardLink(a, b) => outcome(io(image.hard_link(at(a), at(b)))),
        Op::Symlink(target, link) => outcome(io(image.symlink(target, at(link)))),
        Op::ReadLink(p) => outcome(io(image.read_link(at(p)))),
        Op::Metadata(p) => outcome(io(image.metadata(at(p)).map(describe))),
        Op::SymlinkMetadata(p) => outcome(io(image.symlink_metadata(at(p)).map(describe))),
        Op::ReadDir(p) => outcome(io(image.read_dir(at(p))).and_then(|entries| {
            let mut names = entries
                .map(|e| e.map(|e| e.file_name()))
                .collect::<io::Result<Vec<_>>>()?;
            names.sort();
            Ok(names)
        })),
        Op::SetPermissions(p, mode) => outcome(io(
            image.set_permissions(at(p), std::fs::Permissions::from_mode(*mode))
        )),
        Op::SetLen(p, len) => outcome(io(image
            .open_with(at(p), OpenOptions::new().write(true))
            .and_then(|f| f.set_len(*len)))),
        Op::Copy(a, b) => outcome(io(image.copy(at(a), at(b)))),
        Op::Exists(p) => outcome(io(image.try_exists(at(p)))),
    }
}

/// Every name under `root` with its attributes and contents, through std.
fn std_tree(root: &Path) -> BTreeMap<Vec<u8>, String> {
    use std::os::unix::fs::MetadataExt;
    let mut tree = BTreeMap::new();
    let mut pending = vec![PathBuf::new()];
    while let Some(relative) = pending.pop() {
        for entry in std::fs::read_dir(root.join(&relative)).unwrap() {
            let entry = entry.unwrap();
            let name = relative.join(entry.file_name());
            if name == Path::new("lost+found") {
                continue;
            }
            let m = entry.metadata().unwrap();
            let content = if m.is_file() {
                std::fs::read(entry.path()).unwrap()
            } else if m.is_symlink() {
                std::fs::read_link(entry.path())
                    .unwrap()
                    .into_os_string()
                    .into_encoded_bytes()
            } else {
                pending.push(name.clone());
                Vec::new()
            };
            let described = described(
                m.is_dir(),
                m.is_file(),
                m.is_symlink(),
                m.len(),
                m.mode(),
                m.nlink(),
            );
            tree.insert(
                name.into_os_string().into_encoded_bytes(),
                format!("{described} {content:?}"),
            );
        }
    }
    tree
}

/// The same through jext4's walk.
fn jext4_tree(image: &Image) -> BTreeMap<Vec<u8>, String> {
    let mut tree = BTreeMap::new();
    for entry in image.walk("/").unwrap() {
        let entry = entry.unwrap();
        let path = entry.path();
        let relative = path.strip_prefix("/").unwrap();
        if relative.starts_with("lost+found") {
            continue;
        }
        let m = entry.metadata().unwrap();
        let content = if m.is_file() {
            image.read(&path).unwrap()
        } else if m.is_symlink() {
            image
                .read_link(&path)
                .unwrap()
                .into_os_string()
                .into_encoded_bytes()
        } else {
            Vec::new()
        };
        let described = described(
            m.is_dir(),
            m.is_file(),
            m.is_symlink(),
            m.len(),
            m.mode(),
            m.nlink(),
        );
        tree.insert(
            relative.as_os_str().as_bytes().to_vec(),
            format!("{described} {content:?}"),
        );
    }
    tree
}

#[test]
fn differential_against_std_fs_on_a_kernel_mount() {
    if !e2e::require_e2e() {
        return;
    }
    let scratch = e2e::scratch("api-diff");
    let ours = common::mkfs(scratch.path(), "ours", 32, &["-t", "ext4"]);
    let kernel_image = scratch.path().join("kernel.img");
    std::fs::copy(&ours, &kernel_image).unwrap();
    // Both sides create with the same umask.
    // SAFETY: umask has no preconditions; this process creates no files
    // concurrently that depend on the old mask.
    unsafe { libc::umask(0o022) };

    let mount = KernelMount::mount(&kernel_image, &scratch.path().join("mnt"), false);
    let image = Image::open(&ours).unwrap();
    let mut differences = Vec::new();
    for (step, op) in sequence().iter().enumerate() {
        let kernel = apply_std(&mount.mountpoint, op);
        let jext4 = apply_jext4(&image, op);
        if kernel != jext4 {
            differences.push(format!(
                "step {step} {op:?}:\n  kernel: {kernel}\n  jext4:  {jext4}"
            ));
        }
    }
    let kernel_tree = std_tree(&mount.mountpoint);
    let jext4_tree = jext4_tree(&image);
    mount.unmount();
    image.close().unwrap();
    assert!(
        differences.is_empty(),
        "results differ:\n{}",
        differences.join("\n")
    );
    assert_eq!(jext4_tree, kernel_tree, "the trees differ");
    common::assert_fsck_clean(&ours);
    common::assert_fsck_clean(&kernel_image);

    // And the kernel reads what jext4 wrote as jext4 reads it.
    let remount = KernelMount::mount(&ours, &scratch.path().join("mnt2"), true);
    assert_eq!(std_tree(&remount.mountpoint), jext4_tree);
    remount.unmount();
}
