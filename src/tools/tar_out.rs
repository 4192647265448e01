//! An image tree as a tar archive (`jext4 tar -c -f ARCHIVE IMAGE:SRC`).
//!
//! pax archives (POSIX.1-2001) as GNU tar writes them with `--format=posix
//! --xattrs --acls --sparse`: members named relative to `SRC` as `tar -C
//! SRC .` names them (`./`, `./a`); a pax header before a member when it
//! needs one — a long or non-ASCII name or link target, nanosecond
//! `mtime` and `atime`, ids or sizes beyond the ustar fields, every xattr
//! as `SCHILY.xattr.NAME`, ACLs as `SCHILY.acl.access` and
//! `SCHILY.acl.default` text; sparse files in the GNU pax 1.0 form (the
//! map, then only the regions with data). Hard links after the first name
//! are link members. Entries come in name order, so the same tree gives
//! the same archive.

use super::{Failure, Notes, Progress, Report, acl_text, imagepath};
use crate::api::Image;
use crate::error::Error;
use crate::fs::{Attr, FileKind, Fs, SeekWhence};
use std::collections::HashMap;
use std::io::{self, Read, Write};

/// The ustar fields' limits: 100-byte names, 7 octal digits of ids, 11 of
/// size.
const NAME_MAX_USTAR: usize = 100;
const ID_MAX_USTAR: u32 = 0o7777777;
const SIZE_MAX_USTAR: u64 = 0o77777777777;

/// Write the tree at `source` in `image` to `output` as a tar archive.
pub fn pack(
    image: &Image,
    source: &str,
    output: impl Write,
    progress: &Progress,
) -> Result<Report, Failure> {
    let fail = |path: &str, error: Error| Failure {
        path: path.to_string(),
        error,
    };
    let fs = image.fs();
    let ino = image.inode_of(source, true).map_err(|e| fail(source, e))?;
    let attr = fs.getattr(ino).map_err(|e| fail(source, e))?;
    let mut packer = Packer {
        fs,
        builder: tar::Builder::new(output),
        links: HashMap::new(),
        progress,
        notes: Notes::default(),
        sparse_count: 0,
    };
    let top = match attr.kind {
        FileKind::Directory => "./".to_string(),
        _ => imagepath::file_name(source).to_string(),
    };
    let mut pending = vec![(attr, top, imagepath::trim_slashes(source).to_string())];
    while let Some((attr, name, path)) = pending.pop() {
        packer.member(&attr, &name).map_err(|e| fail(&path, e))?;
        if attr.kind == FileKind::Directory {
            packer
                .children(&attr, &name, &path, &mut pending)
                .map_err(|e| fail(&path, e))?;
        }
    }
    packer
        .builder
        .finish()
        .map_err(|e| fail("archive", e.into()))?;
    Ok(packer.notes.into_report(progress))
}

struct Packer<'a, W: Write> {
    fs: &'a Fs,
    builder: tar::Builder<W>,
    /// The first member name of each inode with several links.
    links: HashMap<u32, String>,
    progress: &'a Progress,
    notes: Notes,
    /// Sparse members so far, for their placeholder names.
    sparse_count: u64,
}

impl<W: Write> Packer<'_, W> {
    fn children(
        &self,
        attr: &Attr,
        name: &str,
        path: &str,
        pending: &mut Vec<(Attr, String, String)>,
    ) -> Result<(), Error> {
        let mut entries = self.fs.entries(attr.ino)?;
        entries.sort_by(|a, b| a.name.cmp(&b.name));
        for entry in entries.into_iter().rev() {
            let child = String::from_utf8_lossy(&entry.name).into_owned();
            let member = match name.ends_with('/') {
                true => format!("{name}{child}"),
                false => format!("{name}/{child}"),
            };
            pending.push((
                self.fs.getattr(entry.ino)?,
                member,
                imagepath::join(path, &child),
            ));
        }
        Ok(())
    }

    fn member(&mut self, attr: &Attr, name: &str) -> Result<(), Error> {
        let mut header = tar::Header::new_ustar();
        let mut pax: Vec<(String, Vec<u8>)> = Vec::new();
        let mut name = name.to_string();
        if attr.kind == FileKind::Directory && !name.ends_with('/') {
            name.push('/');
        }
        header.set_mode(attr.perm as u32);
        set_id(&mut pax, "uid", attr.uid, |id| header.set_uid(id as u64));
        set_id(&mut pax, "gid", attr.gid, |id| header.set_gid(id as u64));
        header.set_mtime(attr.mtime.sec.max(0) as u64);
        pax.push(("mtime".into(), pax_time(attr.mtime.sec, attr.mtime.nsec)));
        pax.push(("atime".into(), pax_time(attr.atime.sec, attr.atime.nsec)));
        self.xattrs(attr.ino, &mut pax)?;
        let mut data: Box<dyn Read + '_> = Box::new(io::empty());
        let mut size = 0;
        let first_name = match attr.kind != FileKind::Directory && attr.nlink > 1 {
            true => self.links.get(&attr.ino).cloned(),
            false => None,
        };
        if let Some(first) = first_name {
            header.set_entry_type(tar::EntryType::Link);
            set_link(&mut header, &mut pax, first.as_bytes());
        } else {
            if attr.kind != FileKind::Directory && attr.nlink > 1 {
                self.links.insert(attr.ino, name.clone());
            }
            match attr.kind {
                FileKind::Directory => header.set_entry_type(tar::EntryType::Directory),
                FileKind::Symlink => {
                    header.set_entry_type(tar::EntryType::Symlink);
                    set_link(&mut header, &mut pax, &self.fs.readlink(attr.ino)?);
                }
                FileKind::CharDevice | FileKind::BlockDevice | FileKind::Fifo => {
                    header.set_entry_type(match attr.kind {
                        FileKind::CharDevice => tar::EntryType::Char,
                        FileKind::BlockDevice => tar::EntryType::Block,
                        _ => tar::EntryType::Fifo,
                    });
                    let rdev = attr.rdev as libc::dev_t;
                    header.set_device_major(libc::major(rdev))?;
                    header.set_device_minor(libc::minor(rdev))?;
                }
                FileKind::Socket => {
                    // tar has no socket members (GNU tar skips them too).
                    self.notes
                        .not_kept("sockets (tar has no such member)".into());
                    return Ok(());
                }
                FileKind::Regular => {
                    header.set_entry_type(tar::EntryType::Regular);
                    let ranges = data_ranges(self.fs, attr)?;
                    let data_bytes: u64 = ranges.iter().map(|(start, end)| end - start).sum();
                    size = data_bytes;
                    let mut prefix = Vec::new();
                    if data_bytes < attr.size {
                        // GNU pax 1.0 sparse: the real name and size in
                        // pax records, a placeholder in the header.
                        pax.push(("GNU.sparse.major".into(), b"1".to_vec()));
                        pax.push(("GNU.sparse.minor".into(), b"0".to_vec()));
                        pax.push(("GNU.sparse.name".into(), name.clone().into_bytes()));
                        pax.push((
                            "GNU.sparse.realsize".into(),
                            attr.size.to_string().into_bytes(),
                        ));
                        self.sparse_count += 1;
                        let base = imagepath::file_name(&name);
                        name = format!("./GNUSparseFile.{}/{base}", self.sparse_count);
                        prefix = sparse_map(&ranges, attr.size);
                        size += prefix.len() as u64;
                    }
                    self.progress.bytes(data_bytes);
                    data = Box::new(io::Cursor::new(prefix).chain(ImageData {
                        fs: self.fs,
                        ino: attr.ino,
                        ranges,
                        next: 0,
                    }));
                }
            }
        }
        if size > SIZE_MAX_USTAR {
            pax.push(("size".into(), size.to_string().into_bytes()));
        }
        header.set_size(size);
        set_name(&mut header, &mut pax, &name);
        if !pax.is_empty() {
            self.pax_header(&name, &pax)?;
        }
        header.set_cksum();
        self.builder.append(&header, data)?;
        self.progress.entry();
        if let Some(report) = &self.progress.verbose {
            report("", &name);
        }
        Ok(())
    }

    /// Every xattr as a pax record; ACLs in GNU tar's text form.
    fn xattrs(&self, ino: u32, pax: &mut Vec<(String, Vec<u8>)>) -> Result<(), Error> {
        let names = match self.fs.listxattr(ino) {
            Err(Error::NotSupported) => return Ok(()),
            names => names?,
        };
        for name in names {
            let value = match self.fs.getxattr(ino, &name) {
                Ok(value) => value,
                Err(Error::NoAttribute) => continue,
                Err(error) => return Err(error),
            };
            let acl = match name.as_slice() {
                b"system.posix_acl_access" => Some("SCHILY.acl.access"),
                b"system.posix_acl_default" => Some("SCHILY.acl.default"),
                _ => None,
            };
            match acl {
                Some(key) => pax.push((key.into(), acl_text::to_text(&value)?.into_bytes())),
                None => pax.push((
                    format!("SCHILY.xattr.{}", String::from_utf8_lossy(&name)),
                    value,
                )),
            }
        }
        Ok(())
    }

    /// A pax extended header ('x') with `records`, for the member `name`.
    fn pax_header(&mut self, name: &str, records: &[(String, Vec<u8>)]) -> Result<(), Error> {
        let mut body = Vec::new();
        for (key, value) in records {
            body.extend(pax_record(key, value));
        }
        let mut header = tar::Header::new_ustar();
        header.set_entry_type(tar::EntryType::XHeader);
        header.set_mode(0o644);
        header.set_size(body.len() as u64);
        let base: String = imagepath::file_name(name).chars().take(80).collect();
        set_name_bytes(&mut header, format!("./PaxHeaders/{base}").as_bytes());
        header.set_cksum();
        self.builder.append(&header, body.as_slice())?;
        Ok(())
    }
}

/// `LEN key=value\n`, where LEN counts the whole record, itself included.
fn pax_record(key: &str, value: &[u8]) -> Vec<u8> {
    let rest = key.len() + value.len() + 3; // ' ', '=', '\n'
    let mut length = rest + 1;
    while length != rest + length.to_string().len() {
        length = rest + length.to_string().len();
    }
    let mut record = format!("{length} {key}=").into_bytes();
    record.extend_from_slice(value);
    record.push(b'\n');
    debug_assert_eq!(record.len(), length);
    record
}

fn pax_time(sec: i64, nsec: u32) -> Vec<u8> {
    format!("{sec}.{nsec:09}").into_bytes()
}

fn set_id(pax: &mut Vec<(String, Vec<u8>)>, key: &str, id: u32, set: impl FnOnce(u32)) {
    if id > ID_MAX_USTAR {
        pax.push((key.into(), id.to_string().into_bytes()));
        set(0);
    } else {
        set(id);
    }
}

/// The member name: in the header when it fits ustar, else a pax `path`
/// record and a truncated header name.
fn set_name(header: &mut tar::Header, pax: &mut Vec<(String, Vec<u8>)>, name: &str) {
    // Written as it is: set_path would drop the "./" tar -C DIR . writes.
    if name.len() > NAME_MAX_USTAR || !name.is_ascii() {
        pax.push(("path".into(), name.as_bytes().to_vec()));
    }
    set_name_bytes(header, &name.as_bytes()[..name.len().min(NAME_MAX_USTAR)]);
}

fn set_name_bytes(header: &mut tar::Header, name: &[u8]) {
    let field = &mut header.as_old_mut().name;
    field.fill(0);
    let length = name.len().min(field.len());
    field[..length].copy_from_slice(&name[..length]);
}

fn set_link(header: &mut tar::Header, pax: &mut Vec<(String, Vec<u8>)>, target: &[u8]) {
    let fits = target.len() <= NAME_MAX_USTAR
        && target.is_ascii()
        && header.set_link_name_literal(target).is_ok();
    if !fits {
        pax.push(("linkpath".into(), target.to_vec()));
        let field = &mut header.as_old_mut().linkname;
        field.fill(0);
        let length = target.len().min(field.len());
        field[..length].copy_from_slice(&target[..length]);
    }
}

/// Where a file's data is (SEEK_DATA/SEEK_HOLE in the image).
fn data_ranges(fs: &Fs, attr: &Attr) -> Result<Vec<(u64, u64)>, Error> {
    let mut ranges = Vec::new();
    let mut offset = 0;
    while offset < attr.size {
        let data = match fs.seek(attr.ino, offset, SeekWhence::Data) {
            Err(Error::Io(error)) if error.raw_os_error() == Some(libc::ENXIO) => break,
            data => data?,
        };
        let hole = fs.seek(attr.ino, data, SeekWhence::Hole)?.min(attr.size);
        if hole <= data {
            break;
        }
        ranges.push((data, hole));
        offset = hole;
    }
    Ok(ranges)
}

/// The GNU pax 1.0 sparse map: the count, then offset and size, one number
/// a line, padded with NULs to 512 bytes. A file that ends in a hole ends
/// its map with an empty region at its size, as GNU tar writes it (its
/// extraction sets the size from the last region).
fn sparse_map(ranges: &[(u64, u64)], size: u64) -> Vec<u8> {
    let mut regions: Vec<(u64, u64)> = ranges.to_vec();
    if ranges.last().is_none_or(|&(_, end)| end < size) {
        regions.push((size, size));
    }
    let mut map = format!("{}\n", regions.len());
    for (start, end) in regions {
        map.push_str(&format!("{start}\n{}\n", end - start));
    }
    let mut bytes = map.into_bytes();
    bytes.resize(bytes.len().next_multiple_of(512), 0);
    bytes
}

/// A file's data ranges read from the image one after another.
struct ImageData<'a> {
    fs: &'a Fs,
    ino: u32,
    ranges: Vec<(u64, u64)>,
    next: usize,
}

impl Read for ImageData<'_> {
    fn read(&mut self, buffer: &mut [u8]) -> io::Result<usize> {
        while let Some(&(start, end)) = self.ranges.get(self.next) {
            if start >= end {
                self.next += 1;
                continue;
            }
            let want = buffer.len().min((end - start) as usize).min(1 << 20);
            let bytes = self
                .fs
                .read(self.ino, start, want)
                .map_err(io::Error::other)?;
            if bytes.is_empty() {
                return Err(io::Error::from(io::ErrorKind::UnexpectedEof));
            }
            buffer[..bytes.len()].copy_from_slice(&bytes);
            self.ranges[self.next].0 += bytes.len() as u64;
            return Ok(bytes.len());
        }
        Ok(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pax_records_count_their_own_length() {
        assert_eq!(pax_record("path", b"a"), b"9 path=a\n");
        let long = vec![b'x'; 95];
        let record = pax_record("path", &long);
        assert!(
            record.starts_with(b"105 path="),
            "{}",
            String::from_utf8_lossy(&record)
        );
        assert_eq!(record.len(), 105);
        assert_eq!(
            &sparse_map(&[(0, 4096), (8192, 8202)], 8202)[..17],
            b"2\n0\n4096\n8192\n10\n"
        );
        assert_eq!(&sparse_map(&[], 100)[..8], b"1\n100\n0\n");
        assert_eq!(sparse_map(&[], 100).len(), 512);
    }
}
