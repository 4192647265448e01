//! Real trees to copy in, snapshots of a tree (kinds, modes, owners, times,
//! contents, xattrs) and their comparison across mounts.

use super::*;

/// The source of "a real tree": directories of /usr/share/doc (or
/// /usr/include), taken whole and in name order until about `max_entries`
/// entries or `max_bytes` bytes.
pub fn real_tree_sources(max_entries: usize, max_bytes: u64) -> Vec<PathBuf> {
    let roots = ["/usr/share/doc", "/usr/include", "/usr/share/man"];
    let root = roots
        .iter()
        .map(Path::new)
        .find(|root| root.is_dir())
        .expect("no real tree to copy (/usr/share/doc, /usr/include)");
    let mut names: Vec<PathBuf> = fs::read_dir(root)
        .expect("listing the real tree")
        .filter_map(|entry| entry.ok().map(|entry| entry.path()))
        .collect();
    names.sort();
    let (mut entries, mut bytes) = (0usize, 0u64);
    let mut chosen = Vec::new();
    for path in names {
        let (count, size) = tree_size(&path);
        if entries + count > max_entries || bytes + size > max_bytes {
            continue;
        }
        entries += count;
        bytes += size;
        chosen.push(path);
        if entries >= max_entries * 9 / 10 {
            break;
        }
    }
    assert!(
        entries > 500,
        "the real tree is too small ({entries} entries)"
    );
    chosen
}

fn tree_size(root: &Path) -> (usize, u64) {
    let (mut count, mut bytes) = (0, 0);
    let mut pending = vec![root.to_path_buf()];
    while let Some(path) = pending.pop() {
        let Ok(meta) = fs::symlink_metadata(&path) else {
            continue;
        };
        count += 1;
        bytes += meta.len();
        if meta.is_dir()
            && let Ok(entries) = fs::read_dir(&path)
        {
            pending.extend(entries.filter_map(|e| e.ok().map(|e| e.path())));
        }
    }
    (count, bytes)
}

/// `cp -a` a real tree of about `max_entries` entries into `dest`.
pub fn copy_real_tree(dest: &Path, max_entries: usize, max_bytes: u64) -> usize {
    fs::create_dir_all(dest).expect("creating the copy's directory");
    let sources = real_tree_sources(max_entries, max_bytes);
    let mut args: Vec<&str> = vec!["-a"];
    args.extend(sources.iter().map(|p| path_str(p)));
    args.push(path_str(dest));
    run_ok("cp", &args);
    sources.iter().map(|p| tree_size(p).0).sum()
}

// ------------------------------------------------------------ snapshots

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    File,
    Dir,
    Symlink,
    Fifo,
    Socket,
    CharDevice,
    BlockDevice,
}

/// What a walk records about one name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    pub kind: Kind,
    /// Inode number (0 for the root, which FUSE calls 1 and ext4 2).
    pub ino: u64,
    /// Permission bits with setuid, setgid and sticky.
    pub mode: u32,
    pub nlink: u64,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    /// Allocated 512-byte units.
    pub blocks: u64,
    pub mtime: (i64, i64),
    pub rdev: u64,
    pub target: Option<Vec<u8>>,
    /// Size, count of non-zero 1 KiB pieces, and a hash over them with
    /// their offsets: equal for equal contents whatever the hole layout.
    pub content: Option<String>,
    pub xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
}

impl Node {
    fn fields(&self) -> Vec<(&'static str, String)> {
        let show = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
        let xattrs: Vec<String> = self
            .xattrs
            .iter()
            .map(|(name, value)| {
                let mut hasher = DefaultHasher::new();
                hasher.write(value);
                format!("{}({}b,{:x})", show(name), value.len(), hasher.finish())
            })
            .collect();
        vec![
            ("kind", format!("{:?}", self.kind)),
            ("ino", self.ino.to_string()),
            ("mode", format!("{:o}", self.mode)),
            ("nlink", self.nlink.to_string()),
            ("uid", self.uid.to_string()),
            ("gid", self.gid.to_string()),
            ("size", self.size.to_string()),
            ("blocks", self.blocks.to_string()),
            ("mtime", format!("{}.{:09}", self.mtime.0, self.mtime.1)),
            ("rdev", self.rdev.to_string()),
            (
                "target",
                self.target.as_deref().map(show).unwrap_or_default(),
            ),
            ("content", self.content.clone().unwrap_or_default()),
            ("xattrs", xattrs.join(" ")),
        ]
    }
}

/// Every name under a root, by relative path ("" is the root itself).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    pub nodes: BTreeMap<PathBuf, Node>,
}

impl Snapshot {
    pub fn get(&self, relative: &str) -> Option<&Node> {
        self.nodes.get(Path::new(relative))
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }
}

/// Walk `root` (without following symlinks) and record every name.
pub fn snapshot(root: &Path) -> Snapshot {
    let mut nodes = BTreeMap::new();
    let mut pending = vec![PathBuf::new()];
    // Bounded: each path is visited once; a walk of a million names means a loop.
    while let Some(relative) = pending.pop() {
        assert!(
            nodes.len() < 2_000_000,
            "snapshot of {} does not end",
            root.display()
        );
        let path = root.join(&relative);
        let node = node_of(&path, relative.as_os_str().is_empty());
        if node.kind == Kind::Dir {
            let entries = fs::read_dir(&path)
                .unwrap_or_else(|error| panic!("listing {}: {error}", path.display()));
            for entry in entries {
                let entry =
                    entry.unwrap_or_else(|error| panic!("listing {}: {error}", path.display()));
                pending.push(relative.join(entry.file_name()));
            }
        }
        nodes.insert(relative, node);
    }
    Snapshot { nodes }
}

fn node_of(path: &Path, is_root: bool) -> Node {
    let meta = fs::symlink_metadata(path)
        .unwrap_or_else(|error| panic!("lstat {}: {error}", path.display()));
    let file_type = meta.file_type();
    let kind = if file_type.is_file() {
        Kind::File
    } else if file_type.is_dir() {
        Kind::Dir
    } else if file_type.is_symlink() {
        Kind::Symlink
    } else if file_type.is_fifo() {
        Kind::Fifo
    } else if file_type.is_socket() {
        Kind::Socket
    } else if file_type.is_char_device() {
        Kind::CharDevice
    } else {
        Kind::BlockDevice
    };
    Node {
        kind,
        ino: if is_root { 0 } else { meta.ino() },
        mode: meta.mode() & 0o7777,
        nlink: meta.nlink(),
        uid: meta.uid(),
        gid: meta.gid(),
        size: meta.size(),
        blocks: meta.blocks(),
        mtime: (meta.mtime(), meta.mtime_nsec()),
        rdev: if matches!(kind, Kind::CharDevice | Kind::BlockDevice) {
            meta.rdev()
        } else {
            0
        },
        target: (kind == Kind::Symlink).then(|| {
            fs::read_link(path)
                .unwrap_or_else(|error| panic!("readlink {}: {error}", path.display()))
                .as_os_str()
                .as_bytes()
                .to_vec()
        }),
        content: (kind == Kind::File).then(|| content_digest(path)),
        xattrs: xattrs(path),
    }
}

const PIECE: usize = 1024;

/// Hash the non-zero 1 KiB pieces of a file with their offsets, reading only
/// what SEEK_DATA reports (multi-GiB sparse files stay cheap).
pub fn content_digest(path: &Path) -> String {
    let mut file =
        fs::File::open(path).unwrap_or_else(|error| panic!("open {}: {error}", path.display()));
    let size = file.metadata().expect("fstat").len();
    let fd = file.as_raw_fd();
    let mut hasher = DefaultHasher::new();
    let mut pieces = 0u64;
    let mut next_piece = 0u64; // first byte not yet hashed, piece aligned
    let mut position = 0u64;
    let mut buffer = vec![0u8; 1 << 20];
    while position < size {
        // SAFETY: lseek on a descriptor we own.
        let data = unsafe { libc::lseek(fd, position as i64, libc::SEEK_DATA) };
        let (data, hole) = if data < 0 {
            let error = std::io::Error::last_os_error();
            match error.raw_os_error() {
                Some(libc::ENXIO) => break,
                Some(libc::EINVAL) => (position, size),
                _ => panic!("SEEK_DATA on {}: {error}", path.display()),
            }
        } else {
            // SAFETY: as above.
            let hole = unsafe { libc::lseek(fd, data, libc::SEEK_HOLE) };
            assert!(hole >= data, "SEEK_HOLE on {} failed", path.display());
            (data as u64, (hole as u64).min(size))
        };
        let mut offset = (data / PIECE as u64 * PIECE as u64).max(next_piece);
        while offset < hole {
            let want = ((hole - offset) as usize).min(buffer.len());
            let got = read_at_full(&mut file, offset, &mut buffer[..want], path);
            if got == 0 {
                break;
            }
            for (index, piece) in buffer[..got].chunks(PIECE).enumerate() {
                if piece.iter().any(|&b| b != 0) {
                    hasher.write_u64(offset + (index * PIECE) as u64);
                    hasher.write(piece);
                    pieces += 1;
                }
            }
            offset += got as u64;
        }
        next_piece = offset.div_ceil(PIECE as u64) * PIECE as u64;
        position = hole.max(position + 1);
    }
    format!("{size}:{pieces}:{:016x}", hasher.finish())
}

fn read_at_full(file: &mut fs::File, offset: u64, buffer: &mut [u8], path: &Path) -> usize {
    use std::os::unix::fs::FileExt;
    let mut done = 0;
    while done < buffer.len() {
        match file.read_at(&mut buffer[done..], offset + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(error) if error.kind() == std::io::ErrorKind::Interrupted => {}
            Err(error) => panic!("read {} at {offset}: {error}", path.display()),
        }
    }
    done
}

/// All extended attributes of a name (not following symlinks).
pub fn xattrs(path: &Path) -> BTreeMap<Vec<u8>, Vec<u8>> {
    let c_path = CString::new(path.as_os_str().as_bytes()).expect("path without NUL");
    let mut names = vec![0u8; 64 * 1024];
    // SAFETY: the buffer is valid for its length; the path is NUL-terminated.
    let length = unsafe {
        libc::llistxattr(
            c_path.as_ptr(),
            names.as_mut_ptr() as *mut libc::c_char,
            names.len(),
        )
    };
    if length < 0 {
        let error = std::io::Error::last_os_error();
        if error.raw_os_error() == Some(libc::ENOTSUP) {
            return BTreeMap::new();
        }
        panic!("llistxattr {}: {error}", path.display());
    }
    names.truncate(length as usize);
    let mut result = BTreeMap::new();
    for name in names.split(|&b| b == 0).filter(|name| !name.is_empty()) {
        let value = get_xattr(path, name)
            .unwrap_or_else(|error| panic!("lgetxattr {} {name:?}: {error}", path.display()));
        result.insert(name.to_vec(), value);
    }
    result
}

pub fn get_xattr(path: &Path, name: &[u8]) -> std::io::Result<Vec<u8>> {
    let c_path = CString::new(path.as_os_str().as_bytes()).expect("path without NUL");
    let c_name = CString::new(name).expect("name without NUL");
    let mut value = vec![0u8; 64 * 1024];
    // SAFETY: valid NUL-terminated strings and a buffer of the given length.
    let length = unsafe {
        libc::lgetxattr(
            c_path.as_ptr(),
            c_name.as_ptr(),
            value.as_mut_ptr() as *mut libc::c_void,
            value.len(),
        )
    };
    if length < 0 {
        return Err(std::io::Error::last_os_error());
    }
    value.truncate(length as usize);
    Ok(value)
}

pub fn set_xattr(path: &Path, name: &str, value: &[u8]) -> std::io::Result<()> {
    let c_path = CString::new(path.as_os_str().as_bytes()).expect("path without NUL");
    let c_name = CString::new(name).expect("name without NUL");
    // SAFETY: valid NUL-terminated strings and a value of the given length.
    let result = unsafe {
        libc::lsetxattr(
            c_path.as_ptr(),
            c_name.as_ptr(),
            value.as_ptr() as *const libc::c_void,
            value.len(),
            0,
        )
    };
    if result < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

pub fn remove_xattr(path: &Path, name: &str) -> std::io::Result<()> {
    let c_path = CString::new(path.as_os_str().as_bytes()).expect("path without NUL");
    let c_name = CString::new(name).expect("name without NUL");
    // SAFETY: valid NUL-terminated strings.
    if unsafe { libc::lremovexattr(c_path.as_ptr(), c_name.as_ptr()) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// The differences between two snapshots, one line each (at most `limit`
/// lines, then a count of the rest).
pub fn diff(left: &Snapshot, right: &Snapshot, names: (&str, &str), limit: usize) -> Vec<String> {
    let mut lines = Vec::new();
    let mut total = 0;
    let mut note = |line: String| {
        total += 1;
        if lines.len() < limit {
            lines.push(line);
        }
    };
    for (path, node) in &left.nodes {
        let Some(other) = right.nodes.get(path) else {
            note(format!(
                "{}: only in {} ({:?})",
                path.display(),
                names.0,
                node.kind
            ));
            continue;
        };
        for ((field, a), (_, b)) in node.fields().into_iter().zip(other.fields()) {
            if a != b {
                note(format!(
                    "{}: {field} {}={a} {}={b}",
                    path.display(),
                    names.0,
                    names.1
                ));
            }
        }
    }
    for (path, node) in &right.nodes {
        if !left.nodes.contains_key(path) {
            note(format!(
                "{}: only in {} ({:?})",
                path.display(),
                names.1,
                node.kind
            ));
        }
    }
    if total > lines.len() {
        lines.push(format!("... and {} more differences", total - lines.len()));
    }
    lines
}

/// Panic with a readable diff unless the snapshots are equal.
pub fn assert_same(left: &Snapshot, right: &Snapshot, names: (&str, &str)) {
    let differences = diff(left, right, names, 60);
    assert!(
        differences.is_empty(),
        "{} and {} differ ({} vs {} names):\n{}",
        names.0,
        names.1,
        left.len(),
        right.len(),
        differences.join("\n")
    );
}
