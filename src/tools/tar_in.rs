//! A tar archive into an image (`jext4 tar -x -f ARCHIVE IMAGE:DEST`).
//!
//! ustar, GNU and pax archives through the `tar` crate, which joins GNU
//! long names and pax headers to their members; what it leaves to us:
//! - pax attributes: `SCHILY.xattr.NAME` (every xattr), `SCHILY.acl.access`
//!   and `SCHILY.acl.default` (ACLs as GNU tar's `--acls` writes them),
//!   `mtime`/`atime` with nanoseconds, `uid`/`gid` beyond the header's;
//! - GNU sparse members: the pax 1.0 form (`GNU.sparse.major=1`,
//!   `GNU.sparse.name`, `GNU.sparse.realsize`; the member's data starts
//!   with the map — a count, then offset and size pairs, one number a line,
//!   padded to 512 bytes — and the regions follow), which GNU tar writes
//!   with `--sparse` in pax archives; old GNU sparse members (type `S`),
//!   which the crate expands, get their zero blocks back as holes;
//! - gzip, xz and zstd compression, recognised by their magic numbers.
//!
//! Members are relative to `DEST` as with `tar -C DEST`; a member that
//! would leave it (`..`) is skipped and reported. Directories get their
//! modes, owners and times at the end, as `tar` does.

use super::{CopyOptions, Failure, Notes, Progress, Report, acl_text, clamp, is_fatal};
use crate::api::Image;
use crate::error::Error;
use crate::format::inode::Timestamp;
use crate::fs::{Caller, FileKind, Fs, SetAttr, TimeSet, XattrMode};
use std::collections::HashMap;
use std::io::{self, BufRead, BufReader, Read};
use std::path::{Component, Path};

/// The data moved at a time.
const CHUNK_BYTES: usize = 1 << 20;

/// Chunks of the plain tar stream decompressed ahead of the extraction
/// (each `CHUNK_BYTES`): enough to ride over a large member's writes,
/// few enough that memory stays small.
const READ_AHEAD_CHUNKS: usize = 4;

/// The archive's compression, from its first bytes (gzip 1f 8b; xz
/// FD '7zXZ' 00; zstd 28 B5 2F FD): a reader of the plain tar stream.
pub fn decompressed<'r>(input: impl Read + 'r) -> io::Result<Box<dyn Read + 'r>> {
    let mut buffered = BufReader::with_capacity(CHUNK_BYTES, input);
    let head = buffered.fill_buf()?.to_vec();
    Ok(if head.starts_with(&[0x1f, 0x8b]) {
        Box::new(flate2::read::MultiGzDecoder::new(buffered))
    } else if head.starts_with(&[0xfd, b'7', b'z', b'X', b'Z', 0]) {
        Box::new(xz2::read::XzDecoder::new_multi_decoder(buffered))
    } else if head.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
        Box::new(zstd::stream::read::Decoder::with_buffer(buffered)?)
    } else {
        Box::new(buffered)
    })
}

/// Extract the tar archive `input` (compressed or not) under `dest`, an
/// existing directory of `image`. Options as `copy_in`'s (`preserve`
/// keeps owners, as `tar --same-owner`; modes and times are always kept,
/// as tar does; `threads` is unused: an archive is one stream).
///
/// The archive is read and decompressed by a thread of its own, a few
/// chunks ahead of the extraction — as GNU tar runs `xz -d` in another
/// process — so that decompressing and writing the image overlap.
pub fn unpack(
    image: &Image,
    input: impl Read + Send,
    dest: &str,
    options: &CopyOptions,
    progress: &Progress,
) -> Result<Report, Failure> {
    let root = image.inode_of(dest, true).map_err(|error| Failure {
        path: dest.to_string(),
        error,
    })?;
    let (sender, receiver) = std::sync::mpsc::sync_channel(READ_AHEAD_CHUNKS);
    std::thread::scope(|scope| {
        scope.spawn(move || read_ahead(input, sender));
        let reader = ChunkReader {
            chunks: receiver,
            chunk: Vec::new(),
            at: 0,
        };
        extract_all(image, reader, root, dest, options, progress)
    })
}

/// The plain tar stream of `input`, chunk by chunk, until its end, an
/// error, or the extraction stops taking chunks.
fn read_ahead(input: impl Read, chunks: std::sync::mpsc::SyncSender<io::Result<Vec<u8>>>) {
    let mut reader = match decompressed(input) {
        Ok(reader) => reader,
        Err(error) => {
            let _ = chunks.send(Err(error));
            return;
        }
    };
    loop {
        let mut chunk = vec![0; CHUNK_BYTES];
        let read = match read_full(&mut reader, &mut chunk) {
            Ok(read) => read,
            Err(error) => {
                let _ = chunks.send(Err(error));
                return;
            }
        };
        chunk.truncate(read);
        if read == 0 || chunks.send(Ok(chunk)).is_err() {
            return;
        }
    }
}

/// The reading end of `read_ahead`: an empty chunk, or none, is the end.
struct ChunkReader {
    chunks: std::sync::mpsc::Receiver<io::Result<Vec<u8>>>,
    chunk: Vec<u8>,
    at: usize,
}

impl Read for ChunkReader {
    fn read(&mut self, buffer: &mut [u8]) -> io::Result<usize> {
        if self.at == self.chunk.len() {
            match self.chunks.recv() {
                Ok(chunk) => {
                    self.chunk = chunk?;
                    self.at = 0;
                }
                Err(_) => return Ok(0),
            }
        }
        let count = buffer.len().min(self.chunk.len() - self.at);
        buffer[..count].copy_from_slice(&self.chunk[self.at..self.at + count]);
        self.at += count;
        Ok(count)
    }
}

/// Every member of the plain tar stream `reader` under `root` (`dest`).
fn extract_all(
    image: &Image,
    reader: ChunkReader,
    root: u32,
    dest: &str,
    options: &CopyOptions,
    progress: &Progress,
) -> Result<Report, Failure> {
    let failure = |path: &str, error| Failure {
        path: path.to_string(),
        error,
    };
    let mut archive = tar::Archive::new(reader);
    let mut unpacker = Unpacker {
        image,
        fs: image.fs(),
        options,
        progress,
        notes: Notes::default(),
        caller: super::privileged(image.caller()),
        root,
        dest: super::imagepath::trim_slashes(dest).to_string(),
        directories: Vec::new(),
        buffer: vec![0; CHUNK_BYTES],
    };
    // Raw: the crate's own pax parsing splits records at every newline,
    // which ACL texts and binary xattr values hold; the extension members
    // are read here instead (pax 'x', GNU long names 'L' and 'K').
    let entries = archive
        .entries()
        .map_err(|e| failure("archive", e.into()))?
        .raw(true);
    let mut extensions = Extensions::default();
    for entry in entries {
        let mut entry = entry.map_err(|e| failure("archive", e.into()))?;
        let read_all = |entry: &mut tar::Entry<'_, _>| {
            let mut bytes = Vec::new();
            entry.read_to_end(&mut bytes).map(|_| bytes)
        };
        let kind = entry.header().entry_type();
        let extension = match kind {
            tar::EntryType::XHeader => read_all(&mut entry).map(|b| extensions.pax = parse_pax(&b)),
            tar::EntryType::XGlobalHeader => read_all(&mut entry).map(drop),
            tar::EntryType::GNULongName => {
                read_all(&mut entry).map(|b| extensions.name = Some(trim_nul(b)))
            }
            tar::EntryType::GNULongLink => {
                read_all(&mut entry).map(|b| extensions.link = Some(trim_nul(b)))
            }
            _ => {
                unpacker.member(&mut entry, std::mem::take(&mut extensions))?;
                continue;
            }
        };
        extension.map_err(|e| failure("archive", e.into()))?;
    }
    unpacker.finish_directories()?;
    Ok(unpacker.notes.into_report(progress))
}

struct Unpacker<'a> {
    image: &'a Image,
    fs: &'a Fs,
    options: &'a CopyOptions,
    progress: &'a Progress,
    notes: Notes,
    caller: Caller,
    root: u32,
    dest: String,
    /// Directories made or met, with their member's attributes.
    directories: Vec<(u32, String, Attributes)>,
    buffer: Vec<u8>,
}

/// What a member says of itself beyond its type and data.
#[derive(Clone, Default)]
struct Attributes {
    mode: u16,
    uid: u32,
    gid: u32,
    mtime: (i64, u32),
    atime: Option<(i64, u32)>,
    xattrs: Vec<(Vec<u8>, Vec<u8>)>,
}

/// What extension members said of the next member.
#[derive(Default)]
struct Extensions {
    pax: HashMap<String, Vec<u8>>,
    /// GNU long name ('L') and long link target ('K').
    name: Option<Vec<u8>>,
    link: Option<Vec<u8>>,
}

/// pax records, `LEN key=value\n` each: the length says where a record
/// ends, so values may hold newlines (ACL texts) and any byte.
fn parse_pax(mut data: &[u8]) -> HashMap<String, Vec<u8>> {
    let mut records = HashMap::new();
    while let Some(space) = data.iter().position(|&b| b == b' ') {
        let Some(length) = std::str::from_utf8(&data[..space])
            .ok()
            .and_then(|l| l.parse::<usize>().ok())
        else {
            break;
        };
        if length <= space + 1 || length > data.len() || data[length - 1] != b'\n' {
            break;
        }
        let record = &data[space + 1..length - 1];
        if let Some(equals) = record.iter().position(|&b| b == b'=') {
            let key = String::from_utf8_lossy(&record[..equals]).into_owned();
            records.insert(key, record[equals + 1..].to_vec());
        }
        data = &data[length..];
    }
    records
}

/// A GNU long name without the NULs that pad it.
fn trim_nul(mut bytes: Vec<u8>) -> Vec<u8> {
    while bytes.last() == Some(&0) {
        bytes.pop();
    }
    bytes
}

/// A pax 1.0 sparse member: its real name and size.
struct Sparse {
    name: String,
    size: u64,
}

impl Unpacker<'_> {
    fn member<R: Read>(
        &mut self,
        entry: &mut tar::Entry<'_, R>,
        extensions: Extensions,
    ) -> Result<(), Failure> {
        let pax = extensions.pax;
        let sparse = pax_sparse(&pax);
        let raw_name = match (&sparse, pax.get("path"), &extensions.name) {
            (Some(sparse), _, _) => sparse.name.clone(),
            (None, Some(path), _) => String::from_utf8_lossy(path).into_owned(),
            (None, None, Some(name)) => String::from_utf8_lossy(name).into_owned(),
            (None, None, None) => String::from_utf8_lossy(&entry.path_bytes()).into_owned(),
        };
        let link = pax
            .get("linkpath")
            .cloned()
            .or(extensions.link)
            .or_else(|| entry.link_name_bytes().map(|link| link.into_owned()));
        let Some(relative) = relative_path(&raw_name) else {
            return self.skip(
                &raw_name,
                "member leaves the destination",
                Error::Invalid(raw_name.clone()),
            );
        };
        let path = match relative.as_str() {
            "" => self.dest.clone(),
            rel => super::imagepath::join(&self.dest, rel),
        };
        let attributes = attributes(entry.header(), &pax);
        let result = self.extract(entry, &relative, &path, &attributes, sparse, link);
        match result {
            Ok(()) => {
                self.progress.entry();
                if let Some(report) = &self.progress.verbose {
                    report(&raw_name, &path);
                }
                Ok(())
            }
            Err(error) if is_fatal(&error) && !matches!(error, Error::Io(_)) => {
                Err(Failure { path, error })
            }
            // A read error of the archive stops it too: the stream is lost.
            Err(Error::Io(error)) => Err(Failure {
                path: format!("archive member {raw_name}"),
                error: Error::Io(error),
            }),
            Err(error) => self.skip(&path, "cannot create", error),
        }
    }

    fn skip(&self, path: &str, action: &'static str, error: Error) -> Result<(), Failure> {
        self.notes.skip(path.into(), action, error);
        Ok(())
    }

    fn extract<R: Read>(
        &mut self,
        entry: &mut tar::Entry<'_, R>,
        relative: &str,
        path: &str,
        attributes: &Attributes,
        sparse: Option<Sparse>,
        link: Option<Vec<u8>>,
    ) -> Result<(), Error> {
        use tar::EntryType;
        let kind = entry.header().entry_type();
        if relative.is_empty() {
            // "./": the destination itself takes its attributes.
            if kind == EntryType::Directory {
                self.directories
                    .push((self.root, path.to_string(), attributes.clone()));
            }
            return Ok(());
        }
        let (parent, name) = self.parent(relative)?;
        let owner = self.owner(attributes);
        let ino = match kind {
            EntryType::Directory => {
                let ino = match self.fs.mkdir(parent, &name, attributes.mode | 0o700, owner) {
                    Ok(attr) => attr.ino,
                    Err(Error::Exists) => match self.fs.lookup(parent, &name)? {
                        attr if attr.kind == FileKind::Directory => attr.ino,
                        _ => {
                            self.fs.unlink(parent, &name, self.caller)?;
                            self.fs
                                .mkdir(parent, &name, attributes.mode | 0o700, owner)?
                                .ino
                        }
                    },
                    Err(error) => return Err(error),
                };
                self.directories
                    .push((ino, path.to_string(), attributes.clone()));
                return Ok(());
            }
            EntryType::Link => {
                let target = link.ok_or(Error::Invalid("hard link without a target".into()))?;
                let target = relative_path(&String::from_utf8_lossy(&target)).ok_or(
                    Error::Invalid("hard link target leaves the destination".into()),
                )?;
                let ino = self
                    .image
                    .inode_of(super::imagepath::join(&self.dest, &target), false)?;
                self.replace(parent, &name)?;
                self.fs.link(ino, parent, &name, self.caller)?;
                return Ok(());
            }
            EntryType::Symlink => {
                let target = link.ok_or(Error::Invalid("symlink without a target".into()))?;
                self.replace(parent, &name)?;
                self.fs.symlink(parent, &name, &target, owner)?.ino
            }
            EntryType::Char | EntryType::Block | EntryType::Fifo => {
                let header = entry.header();
                let major = header.device_major().ok().flatten().unwrap_or(0);
                let minor = header.device_minor().ok().flatten().unwrap_or(0);
                let type_bits = match kind {
                    EntryType::Char => libc::S_IFCHR,
                    EntryType::Block => libc::S_IFBLK,
                    _ => libc::S_IFIFO,
                } as u16;
                self.replace(parent, &name)?;
                let rdev = libc::makedev(major, minor);
                self.fs
                    .mknod(parent, &name, type_bits | attributes.mode, rdev, owner)?
                    .ino
            }
            EntryType::Regular | EntryType::Continuous | EntryType::GNUSparse => {
                self.replace(parent, &name)?;
                let ino = self.fs.create(parent, &name, attributes.mode, owner)?.ino;
                match sparse {
                    Some(sparse) => self.sparse_data(entry, ino, &sparse)?,
                    None if kind == EntryType::GNUSparse => self.old_sparse_data(entry, ino)?,
                    None => {
                        self.data(entry, ino, 0, u64::MAX)?;
                    }
                }
                ino
            }
            other => {
                return Err(Error::NotSupported).inspect_err(|_| {
                    self.notes
                        .not_kept(format!("members of tar type {other:?}"));
                });
            }
        };
        self.set_attributes(ino, kind == tar::EntryType::Symlink, attributes)
    }

    /// The directory holding `relative` (made, 0755, when missing) and the
    /// last name.
    fn parent(&mut self, relative: &str) -> Result<(u32, Vec<u8>), Error> {
        let mut current = self.root;
        let mut parts: Vec<&str> = relative.split('/').collect();
        let name = parts
            .pop()
            .expect("split yields one part")
            .as_bytes()
            .to_vec();
        for part in parts {
            current = match self.fs.lookup(current, part.as_bytes()) {
                Ok(attr) if attr.kind == FileKind::Directory => attr.ino,
                Ok(_) => return Err(Error::NotDirectory),
                Err(Error::NotFound) => {
                    self.fs
                        .mkdir(current, part.as_bytes(), 0o755, self.caller)?
                        .ino
                }
                Err(error) => return Err(error),
            };
        }
        Ok((current, name))
    }

    /// Make room for a new non-directory, as tar unlinks before it
    /// extracts; an existing directory stays (and the member fails).
    fn replace(&self, parent: u32, name: &[u8]) -> Result<(), Error> {
        match self.fs.lookup(parent, name) {
            Ok(attr) if attr.kind == FileKind::Directory => Err(Error::IsDirectory),
            Ok(_) => self.fs.unlink(parent, name, self.caller),
            Err(Error::NotFound) => Ok(()),
            Err(error) => Err(error),
        }
    }

    /// Copy up to `limit` bytes of the member into `ino` from `offset`.
    /// Returns the offset reached.
    fn data(
        &mut self,
        input: &mut impl Read,
        ino: u32,
        mut offset: u64,
        limit: u64,
    ) -> Result<u64, Error> {
        let mut left = limit;
        while left > 0 {
            let want = (self.buffer.len() as u64).min(left) as usize;
            let read = read_full(input, &mut self.buffer[..want])?;
            if read == 0 {
                break;
            }
            write_all(self.fs, ino, offset, &self.buffer[..read], self.caller)?;
            self.progress.bytes(read as u64);
            offset += read as u64;
            left -= read as u64;
        }
        Ok(offset)
    }

    /// A pax 1.0 sparse member's regions at their offsets, then its size.
    fn sparse_data(
        &mut self,
        input: &mut impl Read,
        ino: u32,
        sparse: &Sparse,
    ) -> Result<(), Error> {
        let (map, consumed) = read_sparse_map(input)?;
        // The map is padded to a 512-byte boundary.
        let padding = consumed.next_multiple_of(512) - consumed;
        io::copy(&mut input.take(padding as u64), &mut io::sink())?;
        for (offset, length) in map {
            let reached = self.data(input, ino, offset, length)?;
            if reached < offset + length {
                return Err(Error::Io(io::Error::from(io::ErrorKind::UnexpectedEof)));
            }
        }
        self.fs.truncate(ino, sparse.size, self.caller)?;
        Ok(())
    }

    /// An old GNU sparse member (type 'S', `tar --sparse` in GNU format):
    /// the regions the header maps, one after another in the data. A map
    /// continued in extension blocks (more than four regions) is refused:
    /// the archive crate reads such members only its own way.
    fn old_sparse_data(
        &mut self,
        entry: &mut tar::Entry<'_, impl Read>,
        ino: u32,
    ) -> Result<(), Error> {
        let header = entry
            .header()
            .as_gnu()
            .ok_or(Error::Invalid("sparse member without a GNU header".into()))?;
        if header.is_extended() {
            return Err(Error::Unsupported(
                "old GNU sparse member with more than four regions (write the archive with \
                 tar --format=posix --sparse)"
                    .into(),
            ));
        }
        let size = header.real_size()?;
        let regions: Vec<(u64, u64)> = header
            .sparse
            .iter()
            .filter(|region| !region.is_empty())
            .map(|region| Ok((region.offset()?, region.length()?)))
            .collect::<io::Result<_>>()?;
        for (offset, length) in regions {
            let reached = self.data(entry, ino, offset, length)?;
            if reached < offset + length {
                return Err(Error::Io(io::Error::from(io::ErrorKind::UnexpectedEof)));
            }
        }
        self.fs.truncate(ino, size, self.caller)?;
        Ok(())
    }

    /// Mode, owner, times and xattrs of a member that is not a directory.
    fn set_attributes(
        &self,
        ino: u32,
        symlink: bool,
        attributes: &Attributes,
    ) -> Result<(), Error> {
        let changes = self.changes(symlink, attributes);
        self.fs.setattr(ino, &changes, self.caller)?;
        for (name, value) in &attributes.xattrs {
            match self
                .fs
                .setxattr(ino, name, value, XattrMode::Any, self.caller)
            {
                Err(error) if is_fatal(&error) && !matches!(error, Error::NoSpace) => {
                    return Err(error);
                }
                Err(error) => self.notes.not_kept(format!(
                    "extended attribute {}: {}",
                    String::from_utf8_lossy(name),
                    super::describe(&error)
                )),
                Ok(()) => {}
            }
        }
        Ok(())
    }

    fn changes(&self, symlink: bool, attributes: &Attributes) -> SetAttr {
        let limit = self.options.clamp_time;
        let mtime = clamp(attributes.mtime, limit);
        let atime = clamp(attributes.atime.unwrap_or(attributes.mtime), limit);
        let owner = self.owner(attributes);
        SetAttr {
            mode: (!symlink).then_some(attributes.mode),
            uid: Some(owner.uid),
            gid: Some(owner.gid),
            atime: Some(TimeSet::At(super::timestamp(atime))),
            mtime: Some(TimeSet::At(super::timestamp(mtime))),
            ctime: limit.map(|limit| {
                let now = Timestamp::now();
                super::timestamp(clamp((now.sec, now.nsec), Some(limit)))
            }),
            ..SetAttr::default()
        }
    }

    /// Whose a new entry is: the member's owner with `preserve` (tar's
    /// --same-owner), the `--owner` given, or the caller's.
    fn owner(&self, attributes: &Attributes) -> Caller {
        let (uid, gid) = match (self.options.owner, self.options.preserve) {
            (Some(owner), _) => owner,
            (None, true) => (attributes.uid, attributes.gid),
            (None, false) => (self.caller.uid, self.caller.gid),
        };
        Caller {
            uid,
            gid,
            ..self.caller
        }
    }

    fn finish_directories(&mut self) -> Result<(), Failure> {
        let directories = std::mem::take(&mut self.directories);
        for (ino, path, attributes) in directories.iter().rev() {
            let result = self.set_attributes(*ino, false, attributes);
            match result {
                Err(error) if is_fatal(&error) => {
                    return Err(Failure {
                        path: path.clone(),
                        error,
                    });
                }
                Err(error) => self
                    .notes
                    .skip(path.into(), "cannot set attributes of", error),
                Ok(()) => {}
            }
        }
        Ok(())
    }
}

/// `name` relative to the destination: leading `/` and `./` dropped, ""
/// for the destination itself; None when it climbs out with `..`.
fn relative_path(name: &str) -> Option<String> {
    let mut parts = Vec::new();
    for component in Path::new(name).components() {
        match component {
            Component::Normal(part) => parts.push(part.to_string_lossy().into_owned()),
            Component::ParentDir => return None,
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
    }
    Some(parts.join("/"))
}

/// The member's attributes: the header's, overridden by its pax records.
fn attributes(header: &tar::Header, pax: &HashMap<String, Vec<u8>>) -> Attributes {
    let text = |key: &str| pax.get(key).and_then(|v| std::str::from_utf8(v).ok());
    let number = |key: &str| text(key).and_then(|v| v.parse::<u32>().ok());
    let mut xattrs = Vec::new();
    for (key, value) in pax {
        if let Some(name) = key.strip_prefix("SCHILY.xattr.") {
            xattrs.push((name.as_bytes().to_vec(), value.clone()));
        }
    }
    for (key, name) in [
        ("SCHILY.acl.access", "system.posix_acl_access"),
        ("SCHILY.acl.default", "system.posix_acl_default"),
    ] {
        if let Some(value) = text(key).and_then(|t| acl_text::from_text(t).ok()) {
            xattrs.push((name.as_bytes().to_vec(), value));
        }
    }
    xattrs.sort();
    Attributes {
        mode: (header.mode().unwrap_or(0o644) & 0o7777) as u16,
        uid: number("uid").unwrap_or_else(|| header.uid().unwrap_or(0) as u32),
        gid: number("gid").unwrap_or_else(|| header.gid().unwrap_or(0) as u32),
        mtime: text("mtime")
            .and_then(pax_time)
            .unwrap_or((header.mtime().unwrap_or(0) as i64, 0)),
        atime: text("atime").and_then(pax_time),
        xattrs,
    }
}

/// A pax time: seconds with an optional fraction (`1700000000.123456789`).
fn pax_time(text: &str) -> Option<(i64, u32)> {
    let (seconds, fraction) = text.split_once('.').unwrap_or((text, ""));
    let seconds: i64 = seconds.parse().ok()?;
    let digits: String = fraction.chars().take(9).collect();
    let nanoseconds = match digits.is_empty() {
        true => 0,
        false => digits.parse::<u32>().ok()? * 10u32.pow(9 - digits.len() as u32),
    };
    // A negative time with a fraction counts the fraction back from it.
    match (seconds < 0 || text.starts_with('-'), nanoseconds) {
        (true, n) if n > 0 => Some((seconds - 1, 1_000_000_000 - n)),
        _ => Some((seconds, nanoseconds)),
    }
}

/// The GNU pax 1.0 sparse records of a member, if it has them.
fn pax_sparse(pax: &HashMap<String, Vec<u8>>) -> Option<Sparse> {
    let text = |key: &str| pax.get(key).and_then(|v| String::from_utf8(v.clone()).ok());
    if text("GNU.sparse.major")?.trim() != "1" {
        return None;
    }
    Some(Sparse {
        name: text("GNU.sparse.name")?,
        size: text("GNU.sparse.realsize")?.trim().parse().ok()?,
    })
}

/// The map at the start of a pax 1.0 sparse member's data: (offset,
/// length) pairs, and the bytes it took.
fn read_sparse_map(input: &mut impl Read) -> Result<(Vec<(u64, u64)>, usize), Error> {
    /// A bound on the regions of one file, so a damaged map cannot ask
    /// for unbounded memory.
    const REGIONS_MAX: u64 = 1 << 24;
    let mut consumed = 0;
    let mut next_number = |input: &mut dyn Read| -> Result<u64, Error> {
        let mut digits = String::new();
        loop {
            let mut byte = [0u8];
            input.read_exact(&mut byte)?;
            consumed += 1;
            match byte[0] {
                b'\n' => break,
                b @ b'0'..=b'9' if digits.len() < 20 => digits.push(b as char),
                _ => return Err(Error::Invalid("bad GNU sparse map".into())),
            }
        }
        digits
            .parse()
            .map_err(|_| Error::Invalid("bad GNU sparse map".into()))
    };
    let count = next_number(input)?;
    if count > REGIONS_MAX {
        return Err(Error::Invalid(format!("GNU sparse map of {count} regions")));
    }
    let mut map = Vec::with_capacity(count as usize);
    for _ in 0..count {
        let offset = next_number(input)?;
        let length = next_number(input)?;
        map.push((offset, length));
    }
    Ok((map, consumed))
}

fn read_full(input: &mut impl Read, buffer: &mut [u8]) -> io::Result<usize> {
    let mut filled = 0;
    while filled < buffer.len() {
        match input.read(&mut buffer[filled..]) {
            Ok(0) => break,
            Ok(read) => filled += read,
            Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
            Err(error) => return Err(error),
        }
    }
    Ok(filled)
}

/// `data` written whole at `offset`, or ENOSPC.
fn write_all(fs: &Fs, ino: u32, offset: u64, data: &[u8], caller: Caller) -> Result<(), Error> {
    let written = fs.write(ino, offset, data, caller)?;
    if written < data.len() {
        return Err(Error::NoSpace);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn member_names_stay_under_the_destination() {
        assert_eq!(relative_path("./a/b").as_deref(), Some("a/b"));
        assert_eq!(relative_path("/etc/passwd").as_deref(), Some("etc/passwd"));
        assert_eq!(relative_path("./").as_deref(), Some(""));
        assert_eq!(relative_path("a/../../x"), None);
    }

    #[test]
    fn pax_records_may_hold_newlines() {
        let data = b"29 SCHILY.acl.access=u::r\nx\n\n11 path=ab\n";
        let records = parse_pax(data);
        assert_eq!(records["SCHILY.acl.access"], b"u::r\nx\n");
        assert_eq!(records["path"], b"ab");
        assert!(parse_pax(b"99 path=short\n").is_empty());
    }

    #[test]
    fn pax_times_keep_nanoseconds() {
        assert_eq!(
            pax_time("1700000000.123456789"),
            Some((1_700_000_000, 123_456_789))
        );
        assert_eq!(pax_time("1700000000.5"), Some((1_700_000_000, 500_000_000)));
        assert_eq!(pax_time("12"), Some((12, 0)));
        assert_eq!(pax_time("-1.25"), Some((-2, 750_000_000)));
    }

    #[test]
    fn the_sparse_map_is_read_to_its_end() {
        let mut input: &[u8] = b"2\n0\n4096\n1048576\n8192\nDATA";
        let (map, consumed) = read_sparse_map(&mut input).unwrap();
        assert_eq!(map, [(0, 4096), (1_048_576, 8192)]);
        assert_eq!(consumed, 22);
        assert_eq!(input, b"DATA");
        assert!(read_sparse_map(&mut &b"1\nx\n"[..]).is_err());
    }
}
