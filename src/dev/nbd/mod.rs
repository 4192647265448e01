//! An NBD client as a block device: images served by nbdkit, qemu-nbd
//! (qcow2 and the rest of qemu's formats) or any NBD server, on a Unix
//! socket or over TCP, without the kernel's `nbd` module and without root.
//! TLS is not supported (`nbds://` is refused by the URI parser).
//!
//! Ordering. The journal needs one thing from a device: `flush` makes every
//! write that completed before it durable. NBD gives exactly that:
//! `NBD_CMD_FLUSH` covers every write the server replied to before it
//! (proto.md, "Ordering of messages and writes"), and `write_at` returns
//! only after the reply. With several connections that holds across them
//! only when the server says `NBD_FLAG_CAN_MULTI_CONN`; without it, one
//! connection carries everything.
//!
//! Connections. Each carries one request at a time (no pipelining); the
//! device opens `x-connections` of them (4 by default) when the server
//! allows several, and a request takes whichever is free.
//!
//! Lost connections. A request that fails on the transport (the server
//! died, restarted or closed the socket) is sent again after a reconnect,
//! retried with backoff for `x-reconnect-timeout` (30 s by default). A write
//! the server acknowledged but that no flush has covered yet may be lost if
//! the server restarted (its cache went with it), so the device keeps those
//! writes — the *replay log* — and writes them again on the new connection
//! before anything else, then re-sends the requests that got no reply. A
//! write sent twice is harmless (block writes are idempotent) and a flush
//! sent again covers everything replayed. The replay log is bounded: past
//! `REPLAY_LOG_MAX_BYTES` the device flushes on its own, which empties it.
//! After the timeout the device gives up for good: every request fails with
//! one message, and the filesystem above turns read-only.
//!
//! Errors the server returns (`NBD_EIO`, `NBD_ENOSPC`, ...) are not
//! retried: they reach the caller as I/O errors that name the request.
//!
//! Locks, outermost first: `gate` (read: one request in flight; write: a
//! reconnect, which thereby has every connection to itself) → a slot of
//! `connections` → `partial` (read-modify-write of blocks smaller than the
//! server's minimum block) → `replay` (leaf). `dead` is a leaf too.

mod protocol;
pub mod uri;

use super::{BlockDevice, check_range};
use parking_lot::{Mutex, RwLock};
use protocol::{Connection, ExportInfo, RequestError};
use std::io;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};
pub use uri::{NbdUri, is_nbd_uri};

/// Writes acknowledged but not yet covered by a flush are kept for a
/// replay after a reconnect, up to this many bytes; then the device
/// flushes by itself.
pub const REPLAY_LOG_MAX_BYTES: usize = 32 << 20;
/// First and longest pause between two reconnect attempts.
const BACKOFF_FIRST: Duration = Duration::from_millis(50);
const BACKOFF_MAX: Duration = Duration::from_secs(1);
/// Our requests are sector-aligned; a server minimum below that is met.
const ALIGNMENT_FLOOR: u64 = super::SECTOR_SIZE;

/// Writes acknowledged since the last flush that covered them, in the
/// order of their replies.
#[derive(Default)]
struct ReplayLog {
    /// (sequence number, byte offset, data)
    writes: std::collections::VecDeque<(u64, u64, Vec<u8>)>,
    bytes: usize,
    next_sequence: u64,
}

impl ReplayLog {
    fn push(&mut self, offset: u64, data: &[u8]) {
        self.writes
            .push_back((self.next_sequence, offset, data.to_vec()));
        self.next_sequence += 1;
        self.bytes += data.len();
    }

    /// A flush sent when `next_sequence` was `mark` succeeded: every write
    /// acknowledged before it is durable.
    fn covered_up_to(&mut self, mark: u64) {
        while let Some((sequence, _, data)) = self.writes.front() {
            if *sequence >= mark {
                break;
            }
            self.bytes -= data.len();
            self.writes.pop_front();
        }
        debug_assert!(!self.writes.is_empty() || self.bytes == 0);
    }
}

pub struct NbdDevice {
    uri: NbdUri,
    export: ExportInfo,
    read_only: bool,
    /// Request size limit and alignment, from the server's constraints.
    max_request: u64,
    alignment: u64,
    /// `None`: broken, to be reopened by the next reconnect.
    connections: Vec<Mutex<Option<Connection>>>,
    next_connection: AtomicUsize,
    gate: RwLock<()>,
    /// Counts reconnects, so that threads that failed together reconnect
    /// once.
    generation: AtomicU64,
    replay: Mutex<ReplayLog>,
    partial: Mutex<()>,
    /// Set when reconnecting gave up: why, for every later request.
    dead: Mutex<Option<String>>,
}

impl NbdDevice {
    /// Connect to the export `uri` names. `read_only` is the caller's
    /// wish; an export the server marks read-only is read-only whatever
    /// was asked (`is_read_only` says so).
    pub fn open(uri: &NbdUri, read_only: bool) -> io::Result<NbdDevice> {
        let (first, export) = Connection::open(uri).map_err(|error| connect_error(uri, error))?;
        let server_read_only = export.has(protocol::FLAG_READ_ONLY);
        if server_read_only && !read_only {
            tracing::warn!(uri = %uri, "the NBD export is read-only: opening it read-only");
        }
        let alignment = (export.min_block as u64).max(ALIGNMENT_FLOOR);
        let max_request = export.max_payload as u64 / alignment * alignment;
        if max_request == 0 || export.size % alignment != 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "{uri}: unusable export: size {} and maximum request {} with minimum block {}",
                    export.size, export.max_payload, export.min_block
                ),
            ));
        }
        let count = if export.has(protocol::FLAG_CAN_MULTI_CONN) {
            uri.connections
        } else {
            1
        };
        let mut connections = vec![Mutex::new(Some(first))];
        for _ in 1..count {
            let (connection, again) =
                Connection::open(uri).map_err(|error| connect_error(uri, error))?;
            check_same_export(uri, &export, &again)?;
            connections.push(Mutex::new(Some(connection)));
        }
        tracing::info!(
            uri = %uri,
            size = export.size,
            flags = format_args!("{:#x}", export.flags),
            min_block = export.min_block,
            connections = count,
            "NBD export connected"
        );
        Ok(NbdDevice {
            uri: uri.clone(),
            export,
            read_only: read_only || server_read_only,
            max_request,
            alignment,
            connections,
            next_connection: AtomicUsize::new(0),
            gate: RwLock::new(()),
            generation: AtomicU64::new(0),
            replay: Mutex::new(ReplayLog::default()),
            partial: Mutex::new(()),
            dead: Mutex::new(None),
        })
    }

    /// What the server said about the export.
    pub fn export_info(&self) -> ExportInfo {
        self.export
    }

    /// Connections in use (more than one only with `CAN_MULTI_CONN`).
    pub fn connection_count(&self) -> usize {
        self.connections.len()
    }

    /// Reconnects so far.
    pub fn reconnects(&self) -> u64 {
        self.generation.load(Ordering::Relaxed)
    }

    /// Bytes of acknowledged writes no flush has covered yet.
    pub fn unflushed_bytes(&self) -> usize {
        self.replay.lock().bytes
    }

    /// One request, carried to its reply: on a lost connection, reconnect
    /// (within the timeout) and send it again. `on_success` runs before the
    /// request's connection is released, still inside the gate, so that a
    /// reconnect sees its effect (the replay log) complete.
    fn round_trip(
        &self,
        what: &dyn Fn() -> String,
        mut send: impl FnMut(&mut Connection) -> Result<(), RequestError>,
        mut on_success: impl FnMut(),
    ) -> io::Result<()> {
        loop {
            if let Some(why) = self.dead.lock().clone() {
                return Err(io::Error::new(io::ErrorKind::NotConnected, why));
            }
            let (generation, result) = {
                let _gate = self.gate.read();
                let generation = self.generation.load(Ordering::Acquire);
                let mut slot = self.take_connection();
                let result = match slot.as_mut() {
                    Some(connection) => send(connection),
                    None => Err(RequestError::Transport(io::Error::new(
                        io::ErrorKind::NotConnected,
                        "connection lost",
                    ))),
                };
                match &result {
                    Ok(()) => on_success(),
                    Err(RequestError::Transport(_))
                    | Err(RequestError::Server(protocol::ESHUTDOWN)) => {
                        *slot = None;
                    }
                    Err(RequestError::Server(_)) => {}
                }
                (generation, result)
            };
            match result {
                Ok(()) => return Ok(()),
                Err(RequestError::Server(protocol::ESHUTDOWN)) => {
                    let cause = io::Error::other("the server is shutting down (NBD_ESHUTDOWN)");
                    self.reconnect(generation, &cause)?;
                }
                Err(RequestError::Server(errno)) => {
                    return Err(server_error(&self.uri, &what(), errno));
                }
                Err(RequestError::Transport(cause)) => self.reconnect(generation, &cause)?,
            }
        }
    }

    /// A free connection if there is one, else the next in turn (waiting).
    fn take_connection(&self) -> parking_lot::MutexGuard<'_, Option<Connection>> {
        let count = self.connections.len();
        let start = self.next_connection.fetch_add(1, Ordering::Relaxed);
        for step in 0..count {
            if let Some(slot) = self.connections[(start + step) % count].try_lock() {
                return slot;
            }
        }
        self.connections[start % count].lock()
    }

    /// Reopen every connection and replay the unflushed writes; one thread
    /// does it for all that failed in the same generation. Gives up after
    /// the URI's timeout, for good.
    fn reconnect(&self, seen_generation: u64, cause: &io::Error) -> io::Result<()> {
        let _gate = self.gate.write();
        if self.generation.load(Ordering::Acquire) != seen_generation {
            return Ok(()); // another thread reconnected meanwhile
        }
        if let Some(why) = self.dead.lock().clone() {
            return Err(io::Error::new(io::ErrorKind::NotConnected, why));
        }
        let timeout = self.uri.reconnect_timeout;
        tracing::warn!(
            uri = %self.uri,
            %cause,
            "NBD connection lost; reconnecting for up to {timeout:?}"
        );
        let started = Instant::now();
        let mut pause = BACKOFF_FIRST;
        loop {
            let error = match self.reopen_all() {
                Ok(replayed) => {
                    self.generation.fetch_add(1, Ordering::AcqRel);
                    tracing::info!(
                        uri = %self.uri,
                        after = ?started.elapsed(),
                        replayed_writes = replayed,
                        "NBD connection restored"
                    );
                    return Ok(());
                }
                Err(error) => error,
            };
            let final_error =
                protocol::is_refusal(&error) || error.kind() == io::ErrorKind::InvalidData;
            if final_error || started.elapsed() + pause > timeout {
                let why = format!(
                    "NBD server {} lost ({cause}); gave up reconnecting after {:.1?} \
                     (x-reconnect-timeout={}): {error}",
                    self.uri,
                    started.elapsed(),
                    timeout.as_secs()
                );
                tracing::warn!("{why}");
                *self.dead.lock() = Some(why.clone());
                return Err(io::Error::new(io::ErrorKind::NotConnected, why));
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(BACKOFF_MAX);
        }
    }

    /// Under the write gate: open every connection anew and write the
    /// replay log through the first. Returns the writes replayed.
    fn reopen_all(&self) -> io::Result<usize> {
        let mut fresh = Vec::with_capacity(self.connections.len());
        for _ in 0..self.connections.len() {
            let (connection, export) = Connection::open(&self.uri)?;
            check_same_export(&self.uri, &self.export, &export)?;
            fresh.push(connection);
        }
        let replay = self.replay.lock();
        for (_, offset, data) in &replay.writes {
            fresh[0]
                .request(
                    protocol::CMD_WRITE,
                    0,
                    *offset,
                    data.len() as u32,
                    Some(data),
                    None,
                )
                .map_err(|error| match error {
                    RequestError::Transport(error) => error,
                    RequestError::Server(errno) => server_error(
                        &self.uri,
                        &format!("replayed write at byte {offset}"),
                        errno,
                    ),
                })?;
        }
        for (slot, connection) in self.connections.iter().zip(fresh) {
            if let Some(old) = slot.lock().replace(connection) {
                old.disconnect();
            }
        }
        Ok(replay.writes.len())
    }

    /// The aligned requests that make up an access of `len` bytes at
    /// `offset` (both aligned): (offset, length) pieces of at most
    /// `max_request` bytes.
    fn pieces(&self, offset: u64, len: u64) -> impl Iterator<Item = (u64, u64)> + '_ {
        debug_assert!(offset % self.alignment == 0 && len % self.alignment == 0);
        (0..len.div_ceil(self.max_request)).map(move |index| {
            let start = index * self.max_request;
            (offset + start, self.max_request.min(len - start))
        })
    }

    fn is_aligned(&self, offset: u64, len: usize) -> bool {
        offset % self.alignment == 0 && len as u64 % self.alignment == 0
    }

    /// The smallest aligned range around `offset..offset+len`.
    fn aligned_around(&self, offset: u64, len: usize) -> (u64, u64) {
        let start = offset / self.alignment * self.alignment;
        let end = (offset + len as u64).div_ceil(self.alignment) * self.alignment;
        (start, end - start)
    }

    fn read_aligned(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        for (at, length) in self.pieces(offset, buf.len() as u64) {
            let into = &mut buf[(at - offset) as usize..(at - offset + length) as usize];
            let what = || format!("read at byte {at} (+{length})");
            let mut slice = Some(into);
            self.round_trip(
                &what,
                |connection| {
                    let into = slice.as_deref_mut().expect("read buffer");
                    connection.request(protocol::CMD_READ, 0, at, length as u32, None, Some(into))
                },
                || {},
            )?;
        }
        Ok(())
    }

    fn write_aligned(&self, offset: u64, buf: &[u8], flags: u16) -> io::Result<()> {
        for (at, length) in self.pieces(offset, buf.len() as u64) {
            let data = &buf[(at - offset) as usize..(at - offset + length) as usize];
            let what = || format!("write at byte {at} (+{length})");
            self.round_trip(
                &what,
                |connection| {
                    connection.request(
                        protocol::CMD_WRITE,
                        flags,
                        at,
                        length as u32,
                        Some(data),
                        None,
                    )
                },
                // Even a FUA write is logged: an older write of the same
                // block still in the log must not be replayed over it.
                || self.replay.lock().push(at, data),
            )?;
        }
        if self.replay.lock().bytes > REPLAY_LOG_MAX_BYTES {
            self.flush()?;
        }
        Ok(())
    }

    fn write_with(&self, offset: u64, buf: &[u8], flags: u16) -> io::Result<()> {
        if self.read_only {
            return Err(io::Error::from_raw_os_error(libc::EROFS));
        }
        check_range(offset, buf.len(), self.export.size)?;
        if self.is_aligned(offset, buf.len()) {
            return self.write_aligned(offset, buf, flags);
        }
        // The server's blocks are larger than ours: read, patch, write. One
        // at a time, so that two writers of neighbouring small blocks in
        // one server block cannot undo each other.
        let _partial = self.partial.lock();
        let (start, length) = self.aligned_around(offset, buf.len());
        let mut whole = vec![0u8; length as usize];
        self.read_aligned(start, &mut whole)?;
        let at = (offset - start) as usize;
        whole[at..at + buf.len()].copy_from_slice(buf);
        self.write_aligned(start, &whole, flags)
    }

    /// A write that is durable when this returns: `NBD_CMD_FLAG_FUA` where
    /// the server offers it, else a write and a flush.
    pub fn write_at_durable(&self, offset: u64, buf: &[u8]) -> io::Result<()> {
        if self.export.has(protocol::FLAG_SEND_FUA) {
            self.write_with(offset, buf, protocol::CMD_FLAG_FUA)
        } else {
            self.write_with(offset, buf, 0)?;
            self.flush()
        }
    }

    /// `NBD_CMD_TRIM`: a hint that the range's content is no longer
    /// needed; nothing happens when the server does not offer it. The
    /// range then reads as anything until written again.
    pub fn trim(&self, offset: u64, len: u64) -> io::Result<()> {
        if self.read_only {
            return Err(io::Error::from_raw_os_error(libc::EROFS));
        }
        check_range(offset, len as usize, self.export.size)?;
        if !self.export.has(protocol::FLAG_SEND_TRIM) {
            return Ok(());
        }
        // Only whole server blocks can be trimmed.
        let start = offset.div_ceil(self.alignment) * self.alignment;
        let end = (offset + len) / self.alignment * self.alignment;
        if end <= start {
            return Ok(());
        }
        // A replayed write must not resurrect what was trimmed after it.
        self.flush()?;
        for (at, length) in self.pieces(start, end - start) {
            let what = || format!("trim at byte {at} (+{length})");
            self.round_trip(
                &what,
                |connection| {
                    connection.request(protocol::CMD_TRIM, 0, at, length as u32, None, None)
                },
                || {},
            )?;
        }
        Ok(())
    }
}

impl BlockDevice for NbdDevice {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        check_range(offset, buf.len(), self.export.size)?;
        if self.is_aligned(offset, buf.len()) {
            return self.read_aligned(offset, buf);
        }
        let (start, length) = self.aligned_around(offset, buf.len());
        let mut whole = vec![0u8; length as usize];
        self.read_aligned(start, &mut whole)?;
        let at = (offset - start) as usize;
        buf.copy_from_slice(&whole[at..at + buf.len()]);
        Ok(())
    }

    fn write_at(&self, offset: u64, buf: &[u8]) -> io::Result<()> {
        self.write_with(offset, buf, 0)
    }

    /// `NBD_CMD_FLUSH`, covering every write acknowledged before it on any
    /// connection (one connection, or `CAN_MULTI_CONN`).
    fn flush(&self) -> io::Result<()> {
        if self.read_only {
            return Ok(());
        }
        if !self.export.has(protocol::FLAG_SEND_FLUSH) {
            // No write cache to flush, says the server: acknowledged
            // writes are as durable as they will get.
            let mut replay = self.replay.lock();
            let next = replay.next_sequence;
            replay.covered_up_to(next);
            return Ok(());
        }
        let what = || "flush".to_string();
        let mark = std::cell::Cell::new(0);
        self.round_trip(
            &what,
            |connection| {
                // Taken for each attempt: after a reconnect the replayed
                // writes are acknowledged again, before this flush.
                mark.set(self.replay.lock().next_sequence);
                connection.request(protocol::CMD_FLUSH, 0, 0, 0, None, None)
            },
            || self.replay.lock().covered_up_to(mark.get()),
        )
    }

    fn size_bytes(&self) -> u64 {
        self.export.size
    }

    fn is_read_only(&self) -> bool {
        self.read_only
    }
}

impl Drop for NbdDevice {
    /// A soft disconnect on every connection (proto.md: the client ends
    /// transmission with `NBD_CMD_DISC`).
    fn drop(&mut self) {
        for slot in &self.connections {
            if let Some(connection) = slot.lock().take() {
                connection.disconnect();
            }
        }
    }
}

/// The first connection failed: say what was tried, in one line.
fn connect_error(uri: &NbdUri, error: io::Error) -> io::Error {
    let what = match error.kind() {
        io::ErrorKind::ConnectionRefused | io::ErrorKind::NotFound => {
            format!(
                "cannot connect to NBD server at {}: {error}",
                uri.endpoint()
            )
        }
        _ if protocol::is_refusal(&error) => format!("NBD server at {}: {error}", uri.endpoint()),
        _ => format!("NBD server at {}: {error}", uri.endpoint()),
    };
    io::Error::new(error.kind(), what)
}

/// A new connection must find the export as the first one did.
fn check_same_export(uri: &NbdUri, first: &ExportInfo, again: &ExportInfo) -> io::Result<()> {
    if first.size != again.size
        || first.has(protocol::FLAG_READ_ONLY) != again.has(protocol::FLAG_READ_ONLY)
    {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "{uri}: the export changed (size {} → {}, flags {:#x} → {:#x})",
                first.size, again.size, first.flags, again.flags
            ),
        ));
    }
    Ok(())
}

/// An error the server returned for a request, naming both.
fn server_error(uri: &NbdUri, what: &str, errno: u32) -> io::Error {
    let name = match errno {
        1 => "NBD_EPERM",
        5 => "NBD_EIO",
        12 => "NBD_ENOMEM",
        22 => "NBD_EINVAL",
        28 => "NBD_ENOSPC",
        75 => "NBD_EOVERFLOW",
        95 => "NBD_ENOTSUP",
        108 => "NBD_ESHUTDOWN",
        _ => "unknown NBD error",
    };
    let description = io::Error::from_raw_os_error(errno as i32);
    io::Error::other(format!(
        "NBD server {uri} failed the {what}: {name} ({description})"
    ))
}
