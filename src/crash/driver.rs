//! The workload driver: lanes that run operations on the engine in-process
//! (over the recording device), mark each operation's start and
//! acknowledgement in the recording, and keep the model up to date.
//!
//! An operation's life: `op L j begin` is marked; the engine call runs; if
//! it was a sync-type call that returned Ok, `op L j ack` is marked at once;
//! then the lane re-reads what the operation touched (the subtrees it
//! names, their parent directories, and every inode that was reachable
//! there before) and records the differences. The mount uses `noatime`, so
//! these reads write nothing.
//!
//! Errors that a workload provokes on purpose (no space, no such file, not
//! empty, …) are outcomes like any other. Device errors and corruption are
//! not: the first one is kept in `fatal` and the run fails.

use super::model::{LaneModel, Persist, Stat, TreeSource, Xattrs, join, read_node, read_subtree};
use super::oracle::{ack_mark, begin_mark};
use super::rng::{Rng, mix};
use crate::dev::RecordingDevice;
use crate::error::{Error, Result};
use crate::format::superblock::ROOT_INO;
use crate::fs::{Caller, FileKind, Fs, RenameFlags, SetAttr, XattrMode};
use std::collections::HashSet;
use std::sync::Arc;

/// Components followed when resolving one path (the workloads' trees are
/// shallow; a corrupt tree must not loop).
const MAX_DEPTH: usize = 64;

/// Read access to an engine by path, without following symlinks.
pub struct FsSource<'a>(pub &'a Fs);

impl FsSource<'_> {
    fn resolve(&self, path: &str) -> Result<u32> {
        let mut ino = ROOT_INO;
        for (depth, name) in path.split('/').filter(|n| !n.is_empty()).enumerate() {
            if depth >= MAX_DEPTH {
                return Err(Error::NameTooLong);
            }
            ino = self.0.lookup(ino, name.as_bytes())?.ino;
        }
        Ok(ino)
    }
}

fn text(error: Error) -> String {
    error.to_string()
}

impl TreeSource for FsSource<'_> {
    fn stat(&self, path: &str) -> std::result::Result<Option<Stat>, String> {
        let ino = match self.resolve(path) {
            Ok(ino) => ino,
            Err(Error::NotFound | Error::NotDirectory) => return Ok(None),
            Err(error) => return Err(text(error)),
        };
        let attr = self.0.getattr(ino).map_err(text)?;
        Ok(Some(Stat {
            ino,
            kind: attr.kind,
            size: attr.size,
            perm: attr.perm,
            nlink: attr.nlink,
        }))
    }

    fn list(&self, path: &str) -> std::result::Result<Vec<String>, String> {
        let ino = self.resolve(path).map_err(text)?;
        let entries = self.0.entries(ino).map_err(text)?;
        Ok(entries
            .into_iter()
            .map(|entry| String::from_utf8_lossy(&entry.name).into_owned())
            .collect())
    }

    fn read(&self, path: &str, size: u64) -> std::result::Result<Vec<u8>, String> {
        let ino = self.resolve(path).map_err(text)?;
        self.0.read(ino, 0, size as usize).map_err(text)
    }

    fn read_link(&self, path: &str) -> std::result::Result<Vec<u8>, String> {
        let ino = self.resolve(path).map_err(text)?;
        self.0.readlink(ino).map_err(text)
    }

    fn xattrs(&self, path: &str) -> std::result::Result<Xattrs, String> {
        let ino = self.resolve(path).map_err(text)?;
        let mut pairs = Vec::new();
        for name in self.0.listxattr(ino).map_err(text)? {
            let value = self.0.getxattr(ino, &name).map_err(text)?;
            pairs.push((name, value));
        }
        pairs.sort();
        Ok(pairs)
    }
}

fn is_fatal(error: &Error) -> bool {
    matches!(
        error,
        Error::Io(_) | Error::Corrupt { .. } | Error::ReadOnly | Error::Unsupported(_)
    )
}

fn parent(rel: &str) -> &str {
    rel.rfind('/').map_or("", |at| &rel[..at])
}

/// One thread of a workload, owning the subtree at `root`.
pub struct Lane {
    pub id: u32,
    /// Absolute path of the lane's subtree ("/" or "/t0").
    pub root: String,
    pub rng: Rng,
    fs: Arc<Fs>,
    device: Arc<RecordingDevice>,
    /// None during setup: operations run but are neither marked nor modeled.
    model: Option<LaneModel>,
    data_seed: u64,
    setup_ops: u32,
    /// The next operation writes file data (`OpInfo::data_write`).
    data_write_next: bool,
    pub fatal: Option<String>,
}

impl Lane {
    pub fn new(id: u32, root: &str, seed: u64, fs: Arc<Fs>, device: Arc<RecordingDevice>) -> Self {
        Lane {
            id,
            root: root.to_string(),
            rng: Rng::derive(seed, &format!("lane {id}")),
            fs,
            device,
            model: None,
            data_seed: mix(seed ^ 0x6a65_7874_3464_6174),
            setup_ops: 0,
            data_write_next: false,
            fatal: None,
        }
    }

    /// End of setup: the current tree is op 0 of the model.
    pub fn start_model(&mut self, exclude: Vec<String>) -> std::result::Result<(), String> {
        let initial = read_subtree(&FsSource(&self.fs), &self.root, "", &exclude)?;
        self.model = Some(LaneModel::new(self.id, &self.root, exclude, initial));
        Ok(())
    }

    pub fn into_model(self) -> Option<LaneModel> {
        self.model
    }

    pub fn fs(&self) -> &Fs {
        &self.fs
    }

    /// The engine, shared: for a workload that drives the library (the
    /// image tools) rather than single operations.
    pub fn engine(&self) -> Arc<Fs> {
        Arc::clone(&self.fs)
    }

    /// The recording device, for a workload that marks its own events.
    pub fn device(&self) -> Arc<RecordingDevice> {
        Arc::clone(&self.device)
    }

    fn abs(&self, rel: &str) -> String {
        join(&self.root, rel)
    }

    fn ino(&self, rel: &str) -> Result<u32> {
        FsSource(&self.fs).resolve(&self.abs(rel))
    }

    fn parent_and_name<'p>(&self, rel: &'p str) -> Result<(u32, &'p [u8])> {
        let name = rel.rsplit('/').next().unwrap_or(rel);
        Ok((self.ino(parent(rel))?, name.as_bytes()))
    }

    /// Deterministic bytes for op `op` at file offset `offset`: never all
    /// zeros in a sector, never the stale pattern, distinct per op.
    pub fn data(&self, op: u32, offset: u64, len: usize) -> Vec<u8> {
        let key = self.data_seed ^ (self.id as u64) << 56 ^ (op as u64) << 24;
        (offset..offset + len as u64)
            .map(|position| mix(key ^ (position / 8)).to_le_bytes()[(position % 8) as usize] | 1)
            .collect()
    }

    /// The op number the next operation gets (for data patterns).
    fn next_op(&self) -> u32 {
        match &self.model {
            Some(model) => model.last_op() + 1,
            None => self.setup_ops + 1,
        }
    }

    /// Run one operation: mark it, run `body`, mark its acknowledgement,
    /// re-read what it touched.
    fn step(
        &mut self,
        what: impl FnOnce() -> String,
        touched: &[&str],
        body: impl FnOnce(&Lane) -> Result<Option<Persist>>,
    ) -> Result<()> {
        let Some(mut model) = self.model.take() else {
            self.setup_ops += 1;
            self.data_write_next = false;
            return body(self).map(|_| ());
        };
        let op = model.begin(what());
        if std::mem::take(&mut self.data_write_next) {
            model.mark_data_write(op);
        }
        let before = reachable_inodes(&model, touched);
        self.device.mark(begin_mark(self.id, op));
        let result = body(self);
        if let Ok(Some(_)) = &result {
            self.device.mark(ack_mark(self.id, op));
        }
        if let Err(error) = self.observe(&mut model, op, touched, before) {
            let what = &model.ops[op as usize].what;
            self.fatal
                .get_or_insert(format!("op {op} ({what}): re-reading the tree: {error}"));
        }
        if let Ok(Some(persist)) = &result {
            model.acknowledge(op, *persist);
        }
        if let Err(error) = &result
            && is_fatal(error)
        {
            let what = &model.ops[op as usize].what;
            self.fatal
                .get_or_insert(format!("op {op} ({what}): {error}"));
        }
        self.model = Some(model);
        result.map(|_| ())
    }

    /// Re-read the touched subtrees, their parents, and inodes that were
    /// reachable there before (a hard link elsewhere sees the change).
    fn observe(
        &self,
        model: &mut LaneModel,
        op: u32,
        touched: &[&str],
        before: HashSet<u32>,
    ) -> std::result::Result<(), String> {
        let source = FsSource(&self.fs);
        let mut snapshots = Vec::new();
        let mut seen = HashSet::new();
        for rel in touched {
            let snapshot = read_subtree(&source, &self.root, rel, &model.exclude)?;
            seen.extend(snapshot.inodes.keys().copied());
            snapshots.push((rel.to_string(), snapshot));
        }
        model.finish(op, snapshots);
        let mut shallow: Vec<String> = touched.iter().map(|rel| parent(rel).to_string()).collect();
        for ino in before.difference(&seen) {
            if let Some(path) = model
                .paths()
                .find(|(_, history)| history.latest().is_some_and(|entry| entry.ino == *ino))
                .map(|(path, _)| path.clone())
            {
                shallow.push(path);
            }
        }
        shallow.sort();
        shallow.dedup();
        for rel in shallow {
            model.finish_inodes(op, read_node(&source, &self.root, &rel)?);
        }
        Ok(())
    }
}

/// Inodes named under the touched subtrees before an operation.
fn reachable_inodes(model: &LaneModel, touched: &[&str]) -> HashSet<u32> {
    model
        .paths()
        .filter(|(path, history)| {
            history.latest().is_some()
                && touched.iter().any(|rel| {
                    rel.is_empty() || path.as_str() == *rel || path.starts_with(&format!("{rel}/"))
                })
        })
        .filter_map(|(_, history)| history.latest().map(|entry| entry.ino))
        .collect()
}

/// The operations.
impl Lane {
    pub fn create(&mut self, rel: &str) -> Result<()> {
        self.step(
            || format!("create {rel}"),
            &[rel],
            |lane| {
                let (dir, name) = lane.parent_and_name(rel)?;
                lane.fs.create(dir, name, 0o644, Caller::ROOT)?;
                Ok(None)
            },
        )
    }

    pub fn mkdir(&mut self, rel: &str) -> Result<()> {
        self.step(
            || format!("mkdir {rel}"),
            &[rel],
            |lane| {
                let (dir, name) = lane.parent_and_name(rel)?;
                lane.fs.mkdir(dir, name, 0o755, Caller::ROOT)?;
                Ok(None)
            },
        )
    }

    pub fn symlink(&mut self, target: &str, rel: &str) -> Result<()> {
        self.step(
            || format!("symlink {rel} -> {target}"),
            &[rel],
            |lane| {
                let (dir, name) = lane.parent_and_name(rel)?;
                lane.fs
                    .symlink(dir, name, target.as_bytes(), Caller::ROOT)?;
                Ok(None)
            },
        )
    }

    /// Write `len` bytes of this op's pattern at `offset`.
    pub fn write(&mut self, rel: &str, offset: u64, len: usize) -> Result<()> {
        let data = self.data(self.next_op(), offset, len);
        self.data_write_next = true;
        self.step(
            || format!("write {rel} {offset}+{len}"),
            &[rel],
            |lane| {
                let ino = lane.ino(rel)?;
                lane.fs.write(ino, offset, &data, Caller::ROOT)?;
                Ok(None)
            },
        )
    }

    pub fn append(&mut self, rel: &str, len: usize) -> Result<()> {
        let size = match self.ino(rel) {
            Ok(ino) => self.fs.getattr(ino)?.size,
            Err(_) => 0,
        };
        self.write(rel, size, len)
    }

    pub fn truncate(&mut self, rel: &str, size: u64) -> Result<()> {
        self.step(
            || format!("truncate {rel} {size}"),
            &[rel],
            |lane| {
                let ino = lane.ino(rel)?;
                lane.fs.truncate(ino, size, Caller::ROOT)?;
                Ok(None)
            },
        )
    }

    pub fn fallocate(&mut self, rel: &str, offset: u64, len: u64, mode: u32) -> Result<()> {
        self.step(
            || format!("fallocate {rel} {offset}+{len} mode {mode:#x}"),
            &[rel],
            |lane| {
                let ino = lane.ino(rel)?;
                lane.fs.fallocate(ino, offset, len, mode, Caller::ROOT)?;
                Ok(None)
            },
        )
    }

    pub fn link(&mut self, from: &str, to: &str) -> Result<()> {
        self.step(
            || format!("link {from} {to}"),
            &[to, from],
            |lane| {
                let ino = lane.ino(from)?;
                let (dir, name) = lane.parent_and_name(to)?;
                lane.fs.link(ino, dir, name, Caller::ROOT)?;
                Ok(None)
            },
        )
    }

    pub fn unlink(&mut self, rel: &str) -> Result<()> {
        self.step(
            || format!("unlink {rel}"),
            &[rel],
            |lane| {
                let (dir, name) = lane.parent_and_name(rel)?;
                lane.fs.unlink(dir, name, Caller::ROOT)?;
                Ok(None)
            },
        )
    }

    pub fn rmdir(&mut self, rel: &str) -> Result<()> {
        self.step(
            || format!("rmdir {rel}"),
            &[rel],
            |lane| {
                let (dir, name) = lane.parent_and_name(rel)?;
                lane.fs.rmdir(dir, name, Caller::ROOT)?;
                Ok(None)
            },
        )
    }

    pub fn rename(&mut self, from: &str, to: &str) -> Result<()> {
        self.step(
            || format!("rename {from} {to}"),
            &[from, to],
            |lane| {
                let (old_dir, old_name) = lane.parent_and_name(from)?;
                let (new_dir, new_name) = lane.parent_and_name(to)?;
                lane.fs.rename(
                    old_dir,
                    old_name,
                    new_dir,
                    new_name,
                    RenameFlags::default(),
                    Caller::ROOT,
                )?;
                Ok(None)
            },
        )
    }

    pub fn set_xattr(&mut self, rel: &str, name: &str, len: usize) -> Result<()> {
        let value = self.data(self.next_op(), 0, len);
        self.set_xattr_value(rel, name, value)
    }

    /// `set_xattr` with a value that depends on `key` and `len` alone:
    /// files given the same key hold equal values (which, in EA inodes,
    /// share one).
    pub fn set_shared_xattr(&mut self, rel: &str, name: &str, len: usize, key: u32) -> Result<()> {
        // Op numbers count up from 0; keys count down from the top.
        let value = self.data(u32::MAX - key, 0, len);
        self.set_xattr_value(rel, name, value)
    }

    fn set_xattr_value(&mut self, rel: &str, name: &str, value: Vec<u8>) -> Result<()> {
        let len = value.len();
        self.step(
            || format!("setxattr {rel} {name} ({len} bytes)"),
            &[rel],
            |lane| {
                let ino = lane.ino(rel)?;
                lane.fs
                    .setxattr(ino, name.as_bytes(), &value, XattrMode::Any, Caller::ROOT)?;
                Ok(None)
            },
        )
    }

    /// fs-verity on `rel` (its Merkle tree built, then the flag set), with
    /// `params` (a Merkle block size, a salt, a signature).
    pub fn enable_verity(&mut self, rel: &str, params: &crate::fs::VerityParams) -> Result<()> {
        self.step(
            || format!("enable verity {rel}"),
            &[rel],
            |lane| {
                let ino = lane.ino(rel)?;
                lane.fs.enable_verity_with(ino, Caller::ROOT, params)?;
                Ok(None)
            },
        )
    }

    pub fn remove_xattr(&mut self, rel: &str, name: &str) -> Result<()> {
        self.step(
            || format!("removexattr {rel} {name}"),
            &[rel],
            |lane| {
                let ino = lane.ino(rel)?;
                lane.fs.removexattr(ino, name.as_bytes(), Caller::ROOT)?;
                Ok(None)
            },
        )
    }

    pub fn chmod(&mut self, rel: &str, mode: u16) -> Result<()> {
        self.step(
            || format!("chmod {rel} {mode:o}"),
            &[rel],
            |lane| {
                let ino = lane.ino(rel)?;
                let changes = SetAttr {
                    mode: Some(mode),
                    ..SetAttr::default()
                };
                lane.fs.setattr(ino, &changes, Caller::ROOT)?;
                Ok(None)
            },
        )
    }

    /// open(2): returns the inode, for `close`. Changes nothing on disk,
    /// not an op.
    pub fn open(&mut self, rel: &str) -> Result<u32> {
        let ino = self.ino(rel)?;
        self.fs.open_file(ino)?;
        Ok(ino)
    }

    /// The last close of an inode opened by `open`: frees it if its last
    /// name went meanwhile. No name changes: not an op of the model.
    pub fn close(&mut self, ino: u32) -> Result<()> {
        self.fs.release_file(ino)
    }

    /// Read a whole file (varmail's reads); changes nothing, not an op.
    pub fn read(&mut self, rel: &str) -> Result<Vec<u8>> {
        let ino = self.ino(rel)?;
        let size = self.fs.getattr(ino)?.size;
        self.fs.read(ino, 0, size as usize)
    }

    /// fsync(2) of a file or a directory.
    pub fn fsync(&mut self, rel: &str) -> Result<()> {
        self.step(
            || format!("fsync {rel}"),
            &[],
            |lane| {
                let ino = lane.ino(rel)?;
                // FUSE sends a directory's fsync as FSYNCDIR.
                if lane.fs.getattr(ino)?.kind == FileKind::Directory {
                    lane.fs.fsync_dir(ino)?;
                    return Ok(Some(Persist::FsyncDir(ino)));
                }
                lane.fs.fsync(ino, false)?;
                Ok(Some(Persist::Fsync(ino)))
            },
        )
    }

    pub fn fdatasync(&mut self, rel: &str) -> Result<()> {
        self.step(
            || format!("fdatasync {rel}"),
            &[],
            |lane| {
                let ino = lane.ino(rel)?;
                lane.fs.fsync(ino, true)?;
                Ok(Some(Persist::Fdatasync(ino)))
            },
        )
    }

    pub fn sync(&mut self) -> Result<()> {
        self.step(
            || "sync".to_string(),
            &[],
            |lane| {
                lane.fs.sync()?;
                Ok(Some(Persist::Sync))
            },
        )
    }

    /// Whether a path exists now.
    pub fn exists(&self, rel: &str) -> bool {
        self.ino(rel).is_ok()
    }

    /// File size now (0 if missing).
    pub fn size(&self, rel: &str) -> u64 {
        self.ino(rel)
            .and_then(|ino| self.fs.getattr(ino))
            .map_or(0, |attr| attr.size)
    }
}
