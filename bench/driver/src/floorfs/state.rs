//! The floor's tree in a file, so that a benchmark can unmount and mount
//! again (to start with the kernel's caches empty, as `walk` does) and
//! find the tree it left: written at unmount when asked, read at start.
//! Little-endian, in the tree's own terms; only named nodes are kept (the
//! new connection has no lookups and no open files).

use std::collections::{BTreeMap, HashMap};
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::FileType;

use super::tree::{Content, Directory, Node, Tree};

const MAGIC: &[u8; 8] = b"FLOORFS1";

pub fn save(tree: &Tree, path: &Path) -> io::Result<()> {
    let mut out = BufWriter::new(std::fs::File::create(path)?);
    out.write_all(MAGIC)?;
    put_u64(&mut out, tree.next_ino)?;
    put_u64(&mut out, tree.capacity_blocks)?;
    let named: Vec<_> = tree
        .nodes
        .iter()
        .filter(|(_, node)| node.nlink > 0)
        .collect();
    put_u64(&mut out, named.len() as u64)?;
    for (&ino, node) in named {
        put_u64(&mut out, ino)?;
        save_node(&mut out, node)?;
    }
    // Read back on this machine by the next server: no need to sync it.
    out.flush()
}

fn save_node(out: &mut impl Write, node: &Node) -> io::Result<()> {
    let (tag, rdev) = match &node.content {
        Content::File(_) => (0, 0),
        Content::Directory(_) => (1, 0),
        Content::Symlink(_) => (2, 0),
        Content::Special(kind, rdev) => (3 + special_code(*kind), *rdev),
    };
    out.write_all(&[tag])?;
    out.write_all(&node.mode.to_le_bytes())?;
    for value in [node.uid, node.gid, node.nlink, rdev] {
        out.write_all(&value.to_le_bytes())?;
    }
    for time in [node.atime, node.mtime, node.ctime] {
        put_time(out, time)?;
    }
    match &node.content {
        Content::File(bytes) | Content::Symlink(bytes) => put_bytes(out, bytes)?,
        Content::Directory(directory) => {
            put_u64(out, directory.parent)?;
            put_u64(out, directory.next_cookie)?;
            put_u64(out, directory.by_cookie.len() as u64)?;
            for (&cookie, (name, ino)) in &directory.by_cookie {
                put_u64(out, cookie)?;
                put_u64(out, *ino)?;
                put_bytes(out, name)?;
            }
        }
        Content::Special(..) => {}
    }
    put_u64(out, node.xattrs.len() as u64)?;
    for (name, value) in &node.xattrs {
        put_bytes(out, name)?;
        put_bytes(out, value)?;
    }
    Ok(())
}

pub fn load(path: &Path) -> io::Result<Tree> {
    let mut input = BufReader::new(std::fs::File::open(path)?);
    let mut magic = [0; 8];
    input.read_exact(&mut magic)?;
    if &magic != MAGIC {
        return Err(invalid(format!("{}: not a floorfs tree", path.display())));
    }
    let next_ino = get_u64(&mut input)?;
    let capacity_blocks = get_u64(&mut input)?;
    let count = get_u64(&mut input)?;
    let mut nodes = HashMap::new();
    let mut used_blocks = 0;
    for _ in 0..count {
        let ino = get_u64(&mut input)?;
        let node = load_node(&mut input)?;
        used_blocks += node.blocks();
        nodes.insert(ino, node);
    }
    Ok(Tree {
        nodes,
        next_ino,
        used_blocks,
        capacity_blocks,
    })
}

fn load_node(input: &mut impl Read) -> io::Result<Node> {
    let tag = get_array::<1>(input)?[0];
    let mode = u16::from_le_bytes(get_array(input)?);
    let mut words = [0u32; 4];
    for word in &mut words {
        *word = u32::from_le_bytes(get_array(input)?);
    }
    let [uid, gid, nlink, rdev] = words;
    let (atime, mtime, ctime) = (get_time(input)?, get_time(input)?, get_time(input)?);
    let content = match tag {
        0 => Content::File(get_bytes(input)?),
        1 => Content::Directory(load_directory(input)?),
        2 => Content::Symlink(get_bytes(input)?),
        code @ 3..=6 => Content::Special(special_kind(code - 3), rdev),
        other => return Err(invalid(format!("unknown node tag {other}"))),
    };
    let mut xattrs = BTreeMap::new();
    for _ in 0..get_u64(input)? {
        xattrs.insert(get_bytes(input)?, get_bytes(input)?);
    }
    Ok(Node {
        content,
        mode,
        uid,
        gid,
        nlink,
        atime,
        mtime,
        ctime,
        xattrs,
        lookups: 0,
        opens: 0,
    })
}

fn load_directory(input: &mut impl Read) -> io::Result<Directory> {
    let mut directory = Directory::new(get_u64(input)?);
    directory.next_cookie = get_u64(input)?;
    for _ in 0..get_u64(input)? {
        let (cookie, ino) = (get_u64(input)?, get_u64(input)?);
        let name = get_bytes(input)?;
        directory.by_name.insert(name.clone(), (ino, cookie));
        directory.by_cookie.insert(cookie, (name, ino));
    }
    Ok(directory)
}

/// The kinds `Content::Special` holds (mknod makes a regular file a
/// `Content::File`).
const SPECIAL_KINDS: [FileType; 4] = [
    FileType::NamedPipe,
    FileType::CharDevice,
    FileType::BlockDevice,
    FileType::Socket,
];

fn special_code(kind: FileType) -> u8 {
    let code = SPECIAL_KINDS.iter().position(|&known| known == kind);
    debug_assert!(code.is_some(), "{kind:?} is not a special file");
    code.unwrap_or(0) as u8
}

fn special_kind(code: u8) -> FileType {
    SPECIAL_KINDS[code as usize]
}

fn invalid(message: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, message)
}

fn put_u64(out: &mut impl Write, value: u64) -> io::Result<()> {
    out.write_all(&value.to_le_bytes())
}

fn put_bytes(out: &mut impl Write, bytes: &[u8]) -> io::Result<()> {
    put_u64(out, bytes.len() as u64)?;
    out.write_all(bytes)
}

/// Seconds and nanoseconds from the epoch; times before it (tar keeps
/// them) as negative seconds.
fn put_time(out: &mut impl Write, time: SystemTime) -> io::Result<()> {
    let (seconds, nanos) = match time.duration_since(UNIX_EPOCH) {
        Ok(after) => (after.as_secs() as i64, after.subsec_nanos()),
        Err(before) => {
            let before = before.duration();
            let whole = before.as_secs() as i64 + i64::from(before.subsec_nanos() > 0);
            (
                -whole,
                (1_000_000_000 - before.subsec_nanos()) % 1_000_000_000,
            )
        }
    };
    out.write_all(&seconds.to_le_bytes())?;
    out.write_all(&nanos.to_le_bytes())
}

fn get_array<const N: usize>(input: &mut impl Read) -> io::Result<[u8; N]> {
    let mut bytes = [0; N];
    input.read_exact(&mut bytes)?;
    Ok(bytes)
}

fn get_u64(input: &mut impl Read) -> io::Result<u64> {
    Ok(u64::from_le_bytes(get_array(input)?))
}

fn get_bytes(input: &mut impl Read) -> io::Result<Vec<u8>> {
    let length = get_u64(input)?;
    let mut bytes = Vec::new();
    input.take(length).read_to_end(&mut bytes)?;
    if bytes.len() as u64 != length {
        return Err(invalid("a truncated floorfs tree".into()));
    }
    Ok(bytes)
}

fn get_time(input: &mut impl Read) -> io::Result<SystemTime> {
    let seconds = i64::from_le_bytes(get_array(input)?);
    let nanos = u32::from_le_bytes(get_array(input)?);
    let base = if seconds >= 0 {
        UNIX_EPOCH + Duration::from_secs(seconds as u64)
    } else {
        UNIX_EPOCH - Duration::from_secs(seconds.unsigned_abs())
    };
    Ok(base + Duration::from_nanos(u64::from(nanos)))
}

#[cfg(test)]
mod tests {
    use super::super::tree::{BLOCK_SIZE, Maker, ROOT};
    use super::*;

    #[test]
    fn a_saved_tree_loads_as_it_was_without_its_nameless_nodes() {
        let mut tree = Tree::new(1 << 20, 0, 0);
        let maker = Maker {
            uid: 7,
            gid: 8,
            mode: 0o640,
        };
        let file = tree
            .make(ROOT, b"f", Content::File(Vec::new()), &maker)
            .unwrap()
            .ino
            .0;
        tree.write(file, 0, &[3; 5000], false).unwrap();
        let old = UNIX_EPOCH - Duration::from_millis(1500);
        tree.node_mut(file).unwrap().mtime = old;
        tree.setxattr(file, b"user.a", b"value", 0).unwrap();
        let dir = Content::Directory(Directory::new(ROOT));
        tree.make(ROOT, b"d", dir, &maker).unwrap();
        let gone = tree
            .make(ROOT, b"gone", Content::Symlink(b"x".to_vec()), &maker)
            .unwrap();
        tree.unlink(ROOT, b"gone").unwrap();
        let path = tempfile::NamedTempFile::new().unwrap();
        save(&tree, path.path()).unwrap();
        let loaded = load(path.path()).unwrap();
        assert!(!loaded.nodes.contains_key(&gone.ino.0));
        assert_eq!(loaded.used_blocks, 1 + 2 + 1);
        assert_eq!(loaded.next_ino, tree.next_ino);
        let node = loaded.node(file).unwrap();
        assert!(matches!(&node.content, Content::File(data) if data.len() == 5000));
        assert_eq!(
            (node.mode, node.uid, node.gid, node.mtime),
            (0o640, 7, 8, old)
        );
        assert_eq!(loaded.getxattr(file, b"user.a").unwrap(), b"value");
        let listed: Vec<_> = loaded
            .directory(ROOT)
            .unwrap()
            .by_cookie
            .values()
            .cloned()
            .collect();
        assert_eq!(
            listed,
            tree.directory(ROOT)
                .unwrap()
                .by_cookie
                .values()
                .cloned()
                .collect::<Vec<_>>()
        );
        assert_eq!(loaded.capacity_blocks * BLOCK_SIZE, 1 << 20);
    }
}
