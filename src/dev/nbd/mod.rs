//! An NBD client as a block device: images served by nbdkit, qemu-nbd
//! (qcow2 and the rest of qemu's formats) or any NBD server, on a Unix
//! socket or over TCP, without the kernel's `nbd` module and without root.
//! TLS is not supported (`nbds://` is refused by the URI parser).
//!
//! Ordering. The journal needs one thing from a device: `flush` makes every
//! write that completed before it durable. NBD gives exactly that:
//! `NBD_CMD_FLUSH` covers every write the server replied to before it
//! (proto.md, "Ordering of messages and writes"). With several connections
//! that holds across them only when the server says
//! `NBD_FLAG_CAN_MULTI_CONN`; without it, one connection carries everything.
//!
//! Write-behind. `write_at` sends the write and returns without waiting for
//! the reply (a disk's volatile cache does the same; `BlockDevice` promises
//! nothing before `flush`), so the round trip of one write overlaps the
//! next. The device keeps each write until its reply: a read or write that
//! overlaps one still in flight first waits for it (the server may reorder
//! requests, even on one connection); `flush` first waits for the reply of
//! every write issued before it, then sends `NBD_CMD_FLUSH`. A write the
//! server fails is reported by the next write or flush, and every later
//! write and flush fails too: the filesystem above turns read-only. At most
//! `WINDOW_WRITES` writes and `WINDOW_BYTES` bytes are in flight per
//! connection. Reads wait for their data, of course.
//!
//! Plugging. Before any of that, aligned writes are held back in the plug
//! (`plug.rs`): merged with their neighbours, replaced when written again,
//! and read from there, until a flush, a request that needs the server's
//! order, or `PLUG_MAX_BYTES` sends them. On a small machine each request's
//! wake-ups cost more than its bytes. When all a flush has to make durable
//! is one request held in the plug, it goes with `NBD_CMD_FLAG_FUA` and no
//! `NBD_CMD_FLUSH` follows: one round trip instead of two for an fsync of
//! an overwrite, and for a fast commit's TAIL.
//!
//! Connections. The device opens `x-connections` of them (4 by default)
//! when the server allows several; a request takes whichever is free. Each
//! connection is used by one thread at a time (its slot's lock), which
//! sends and reads replies on it.
//!
//! Lost connections. A transport failure (the server died, restarted or
//! closed the socket) leads to a reconnect, retried with backoff for
//! `x-reconnect-timeout` (30 s by default). A write the server acknowledged
//! but no flush covered yet may be lost if the server restarted (its cache
//! went with it), so the device keeps those writes — the *replay log* — and
//! writes them again on the new connections, then the writes still in
//! flight, in the order they were issued; then the interrupted request is
//! sent again. Before any of it, the export must still hold the identity
//! bytes the filesystem gave (`expect_identity`: its UUID): a server that
//! came back serving another image is never written to — that error is
//! final. A write sent twice is harmless (block writes are idempotent)
//! and a flush sent again covers everything replayed. The replay log is
//! bounded: past `REPLAY_LOG_MAX_BYTES` the device flushes on its own,
//! which empties it. After the timeout the device gives up for good: every
//! request fails with one message, and the filesystem turns read-only.
//!
//! Locks, outermost first: `plug` (held while it is sent, so that a read
//! finds a write either in the plug or in flight) → `gate` (read: using a connection; write: a
//! reconnect, which so has every connection to itself) → one slot of
//! `slots` → `partial` is taken before both (read-modify-write below the
//! server's minimum block) → `pending`, `replay`, `failed`, `dead` (leaves,
//! never held across I/O).

mod plug;
mod protocol;
pub mod uri;

use super::{BlockDevice, check_range};
use parking_lot::{Mutex, MutexGuard, RwLock};
use plug::{Coverage, PLUG_MAX_BYTES, Plug};
use protocol::{Connection, ExportInfo, RequestError};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::io;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};
pub use uri::{NbdUri, is_nbd_uri};

/// Writes acknowledged but not yet covered by a flush are kept for a
/// replay after a reconnect, up to this many bytes; then the device
/// flushes by itself.
pub const REPLAY_LOG_MAX_BYTES: usize = 32 << 20;
/// Writes in flight per connection, at most (count and bytes).
const WINDOW_WRITES: usize = 64;
const WINDOW_BYTES: usize = 8 << 20;
/// First and longest pause between two reconnect attempts.
const BACKOFF_FIRST: Duration = Duration::from_millis(50);
const BACKOFF_MAX: Duration = Duration::from_secs(1);
/// Our requests are sector-aligned; a server minimum below that is met.
const ALIGNMENT_FLOOR: u64 = super::SECTOR_SIZE;

/// Writes acknowledged since the last flush that covered them, in the
/// order of their replies.
#[derive(Default)]
struct ReplayLog {
    /// (acknowledgement number, byte offset, data)
    writes: VecDeque<(u64, u64, Vec<u8>)>,
    bytes: usize,
    next_ack: u64,
}

impl ReplayLog {
    fn push(&mut self, offset: u64, data: Vec<u8>) {
        self.bytes += data.len();
        self.writes.push_back((self.next_ack, offset, data));
        self.next_ack += 1;
    }

    /// A flush sent when `next_ack` was `mark` succeeded: every write
    /// acknowledged before it is durable.
    fn covered_up_to(&mut self, mark: u64) {
        while let Some((ack, _, data)) = self.writes.front() {
            if *ack >= mark {
                break;
            }
            self.bytes -= data.len();
            self.writes.pop_front();
        }
        debug_assert!(!self.writes.is_empty() || self.bytes == 0);
    }
}

/// A write sent and not yet answered.
struct InFlight {
    /// Issue order, device-wide.
    sequence: u64,
    offset: u64,
    data: Vec<u8>,
    /// Sent with `NBD_CMD_FLAG_FUA`: durable once answered, so never kept
    /// for a replay.
    fua: bool,
}

/// One connection and what is in flight on it.
#[derive(Default)]
struct Slot {
    /// `None`: broken, to be reopened by the next reconnect.
    connection: Option<Connection>,
    /// By cookie.
    writes: HashMap<u64, InFlight>,
    bytes: usize,
}

/// Every write in flight: sequence → (slot, first byte, end byte).
type Pending = BTreeMap<u64, (usize, u64, u64)>;

/// Why a request could not be carried out on a connection.
enum Failure {
    /// The connection broke (or the server broke the protocol): reconnect.
    Transport(io::Error),
    /// The server answered the request with an `NBD_E*` error.
    Server(u32),
}

impl From<io::Error> for Failure {
    fn from(error: io::Error) -> Failure {
        Failure::Transport(error)
    }
}

pub struct NbdDevice {
    uri: NbdUri,
    export: ExportInfo,
    read_only: bool,
    /// Request size limit and alignment, from the server's constraints.
    max_request: u64,
    alignment: u64,
    slots: Vec<Mutex<Slot>>,
    next_slot: AtomicUsize,
    gate: RwLock<()>,
    /// Counts reconnects, so that threads that failed together reconnect
    /// once.
    generation: AtomicU64,
    next_sequence: AtomicU64,
    pending: Mutex<Pending>,
    replay: Mutex<ReplayLog>,
    partial: Mutex<()>,
    /// Aligned writes not sent yet.
    plug: Mutex<Plug>,
    /// Bytes the export must hold for a reconnect to write to it
    /// (`BlockDevice::expect_identity`): offset and bytes.
    identity: Mutex<Option<(u64, Vec<u8>)>>,
    /// A write the server failed: every later write and flush fails so.
    failed: Mutex<Option<String>>,
    /// Set when reconnecting gave up: why, for every later request.
    dead: Mutex<Option<String>>,
    /// When the current outage began: the first reconnect since the last
    /// request that succeeded. The reconnect timeout runs from here, so a
    /// server that accepts connections and then never answers (or drops
    /// each one) is given up on as surely as one that refuses them.
    outage: Mutex<Option<Instant>>,
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
        let mut connections = vec![first];
        for _ in 1..count {
            let (connection, again) =
                Connection::open(uri).map_err(|error| connect_error(uri, error))?;
            check_same_export(uri, &export, &again)?;
            connections.push(connection);
        }
        tracing::info!(
            uri = %uri,
            size = export.size,
            flags = format_args!("{:#x}", export.flags),
            min_block = export.min_block,
            connections = count,
            "NBD export connected"
        );
        let slots = connections
            .into_iter()
            .map(|connection| {
                Mutex::new(Slot {
                    connection: Some(connection),
                    ..Slot::default()
                })
            })
            .collect();
        Ok(NbdDevice {
            uri: uri.clone(),
            export,
            read_only: read_only || server_read_only,
            max_request,
            alignment,
            slots,
            next_slot: AtomicUsize::new(0),
            gate: RwLock::new(()),
            generation: AtomicU64::new(0),
            next_sequence: AtomicU64::new(0),
            pending: Mutex::new(Pending::new()),
            replay: Mutex::new(ReplayLog::default()),
            partial: Mutex::new(()),
            plug: Mutex::new(Plug::default()),
            identity: Mutex::new(None),
            failed: Mutex::new(None),
            dead: Mutex::new(None),
            outage: Mutex::new(None),
        })
    }

    /// What the server said about the export.
    pub fn export_info(&self) -> ExportInfo {
        self.export
    }

    /// Connections in use (more than one only with `CAN_MULTI_CONN`).
    pub fn connection_count(&self) -> usize {
        self.slots.len()
    }

    /// Reconnects so far.
    pub fn reconnects(&self) -> u64 {
        self.generation.load(Ordering::Relaxed)
    }

    /// Bytes written that no flush has covered yet (held in the plug, in
    /// flight or acknowledged).
    pub fn unflushed_bytes(&self) -> usize {
        let plugged = self.plug.lock().bytes();
        let in_flight: usize = self.slots.iter().map(|slot| slot.lock().bytes).sum();
        self.replay.lock().bytes + in_flight + plugged
    }

    /// Send what the plug holds (its lock held throughout: a reader that
    /// does not find a write in the plug finds it in flight).
    fn unplug(&self) -> io::Result<()> {
        let mut plug = self.plug.lock();
        self.unplug_locked(&mut plug)
    }

    fn unplug_locked(&self, plug: &mut Plug) -> io::Result<()> {
        if plug.is_empty() {
            return Ok(());
        }
        for (offset, data) in plug.take(self.max_request as usize) {
            self.write_aligned(offset, &data, 0)?;
        }
        Ok(())
    }

    fn check_dead(&self) -> io::Result<()> {
        match self.dead.lock().clone() {
            Some(why) => Err(io::Error::new(io::ErrorKind::NotConnected, why)),
            None => Ok(()),
        }
    }

    fn check_failed(&self) -> io::Result<()> {
        self.check_dead()?;
        match self.failed.lock().clone() {
            Some(why) => Err(io::Error::other(why)),
            None => Ok(()),
        }
    }

    /// A free slot if there is one, else the next in turn (waiting).
    fn take_slot(&self) -> (usize, MutexGuard<'_, Slot>) {
        let count = self.slots.len();
        let start = self.next_slot.fetch_add(1, Ordering::Relaxed);
        for step in 0..count {
            let index = (start + step) % count;
            if let Some(slot) = self.slots[index].try_lock() {
                return (index, slot);
            }
        }
        let index = start % count;
        (index, self.slots[index].lock())
    }

    /// A reply for a write: forget the write; keep its data for a replay,
    /// or remember the server's error.
    fn complete_write(&self, slot: &mut Slot, cookie: u64, error: u32) -> Result<(), Failure> {
        if error == protocol::ESHUTDOWN && slot.writes.contains_key(&cookie) {
            // The server is going away: the write stays in flight, for the
            // reconnect to send again.
            return Err(Failure::Transport(io::Error::other(
                "the server is shutting down (NBD_ESHUTDOWN)",
            )));
        }
        let Some(write) = slot.writes.remove(&cookie) else {
            return Err(Failure::Transport(protocol::protocol_error(format!(
                "the server answered cookie {cookie}, which is not in flight"
            ))));
        };
        slot.bytes -= write.data.len();
        self.pending.lock().remove(&write.sequence);
        if error == 0 {
            if !write.fua {
                self.replay.lock().push(write.offset, write.data);
            }
        } else {
            let what = format!("write at byte {} (+{})", write.offset, write.data.len());
            let why = server_error(&self.uri, &what, error).to_string();
            self.failed.lock().get_or_insert(why);
        }
        Ok(())
    }

    /// Read replies on `slot` until the one for `cookie` (whose data, if a
    /// read, lands in `into`); write replies met on the way are completed.
    fn await_reply(
        &self,
        slot: &mut Slot,
        cookie: u64,
        mut into: Option<&mut [u8]>,
    ) -> Result<(), Failure> {
        loop {
            let connection = slot.connection.as_mut().expect("a live connection");
            let (replied, error) = connection.receive_reply()?;
            if replied == cookie {
                if error != 0 {
                    return Err(Failure::Server(error));
                }
                if let Some(into) = into.as_deref_mut() {
                    connection.receive_payload(into)?;
                }
                return Ok(());
            }
            self.complete_write(slot, replied, error)?;
        }
    }

    /// Read one reply on `slot` (which must have writes in flight).
    fn reap_one(&self, slot: &mut Slot) -> Result<(), Failure> {
        debug_assert!(!slot.writes.is_empty());
        let connection = slot.connection.as_mut().expect("a live connection");
        let (replied, error) = connection.receive_reply()?;
        self.complete_write(slot, replied, error)
    }

    /// Run `body` on a live connection; on a transport failure, reconnect
    /// (within the timeout) and run it again. `Ok(Err(errno))`: the server
    /// answered with an error.
    fn with_connection<T>(
        &self,
        mut body: impl FnMut(usize, &mut Slot) -> Result<T, Failure>,
    ) -> io::Result<Result<T, u32>> {
        loop {
            self.check_dead()?;
            let (generation, result) = {
                let _gate = self.gate.read();
                let generation = self.generation.load(Ordering::Acquire);
                let (index, mut slot) = self.take_slot();
                let result = if slot.connection.is_some() {
                    body(index, &mut slot)
                } else {
                    Err(Failure::Transport(io::Error::new(
                        io::ErrorKind::NotConnected,
                        "connection lost",
                    )))
                };
                if matches!(result, Err(Failure::Transport(_)))
                    || matches!(result, Err(Failure::Server(protocol::ESHUTDOWN)))
                {
                    slot.connection = None;
                }
                (generation, result)
            };
            match result {
                Ok(value) => {
                    self.end_outage();
                    return Ok(Ok(value));
                }
                Err(Failure::Server(protocol::ESHUTDOWN)) => {
                    let cause = io::Error::other("the server is shutting down (NBD_ESHUTDOWN)");
                    self.reconnect(generation, &cause)?;
                }
                Err(Failure::Server(errno)) => return Ok(Err(errno)),
                Err(Failure::Transport(cause)) => self.reconnect(generation, &cause)?,
            }
        }
    }

    /// A request succeeded: the connection works again.
    fn end_outage(&self) {
        let mut outage = self.outage.lock();
        if let Some(began) = outage.take() {
            tracing::debug!(uri = %self.uri, after = ?began.elapsed(), "NBD server answering again");
        }
    }

    /// Wait for the reply of every write issued before `sequence`.
    fn settle(&self, sequence: u64) -> io::Result<()> {
        loop {
            let oldest = self
                .pending
                .lock()
                .first_key_value()
                .map(|(s, v)| (*s, v.0));
            let Some((oldest, index)) = oldest.filter(|(oldest, _)| *oldest < sequence) else {
                return Ok(());
            };
            self.check_dead()?;
            let (generation, result) = {
                let _gate = self.gate.read();
                let generation = self.generation.load(Ordering::Acquire);
                let mut slot = self.slots[index].lock();
                let still_there = slot.writes.values().any(|w| w.sequence == oldest);
                let result = match (&slot.connection, still_there) {
                    (_, false) => Ok(()),
                    (None, true) => Err(Failure::Transport(io::Error::new(
                        io::ErrorKind::NotConnected,
                        "connection lost",
                    ))),
                    (Some(_), true) => self.reap_one(&mut slot),
                };
                if result.is_err() {
                    slot.connection = None;
                }
                (generation, result)
            };
            if let Err(Failure::Transport(cause)) = result {
                self.reconnect(generation, &cause)?;
            }
        }
    }

    /// Wait for the writes in flight that overlap `offset..offset+len`.
    fn settle_overlapping(&self, offset: u64, len: u64) -> io::Result<()> {
        let end = offset + len;
        let newest = self
            .pending
            .lock()
            .iter()
            .rev()
            .find(|(_, (_, from, to))| *from < end && offset < *to)
            .map(|(sequence, _)| *sequence);
        match newest {
            Some(sequence) => self.settle(sequence + 1),
            None => Ok(()),
        }
    }

    /// Reopen every connection and write again, through the first, the
    /// acknowledged but unflushed writes and then those in flight; one
    /// thread does it for all that failed in the same generation. Gives up
    /// after the URI's timeout, for good.
    fn reconnect(&self, seen_generation: u64, cause: &io::Error) -> io::Result<()> {
        let _gate = self.gate.write();
        if self.generation.load(Ordering::Acquire) != seen_generation {
            return Ok(()); // another thread reconnected meanwhile
        }
        self.check_dead()?;
        let timeout = self.uri.reconnect_timeout;
        tracing::warn!(
            uri = %self.uri,
            %cause,
            "NBD connection lost; reconnecting for up to {timeout:?}"
        );
        let started = *self.outage.lock().get_or_insert_with(Instant::now);
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
                // Closed, so that a server waiting for its clients to leave
                // (nbdkit after SIGTERM) can exit.
                for slot in &self.slots {
                    slot.lock().connection = None;
                }
                return Err(io::Error::new(io::ErrorKind::NotConnected, why));
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(BACKOFF_MAX);
        }
    }

    /// Under the write gate. Returns the writes replayed.
    fn reopen_all(&self) -> io::Result<usize> {
        let mut fresh = Vec::with_capacity(self.slots.len());
        for _ in 0..self.slots.len() {
            let (connection, export) = Connection::open(&self.uri)?;
            check_same_export(&self.uri, &self.export, &export)?;
            fresh.push(connection);
        }
        self.check_identity(&mut fresh[0])?;
        let mut slots: Vec<MutexGuard<'_, Slot>> = self.slots.iter().map(|s| s.lock()).collect();
        let mut in_flight: Vec<&InFlight> =
            slots.iter().flat_map(|slot| slot.writes.values()).collect();
        in_flight.sort_by_key(|write| write.sequence);
        let mut replay = self.replay.lock();
        let writes = replay
            .writes
            .iter()
            .map(|(_, offset, data)| (*offset, data))
            .chain(in_flight.iter().map(|write| (write.offset, &write.data)));
        let mut count = 0;
        for (offset, data) in writes {
            fresh[0]
                .request(protocol::CMD_WRITE, offset, Some(data))
                .map_err(|error| match error {
                    RequestError::Transport(error) => error,
                    RequestError::Server(errno) => server_error(
                        &self.uri,
                        &format!("replayed write at byte {offset}"),
                        errno,
                    ),
                })?;
            count += 1;
        }
        // Everything in flight was just acknowledged on the new connection.
        let mut answered: Vec<InFlight> = slots
            .iter_mut()
            .flat_map(|slot| {
                slot.bytes = 0;
                slot.writes.drain().map(|(_, write)| write)
            })
            .collect();
        answered.sort_by_key(|write| write.sequence);
        for write in answered {
            replay.push(write.offset, write.data);
        }
        self.pending.lock().clear();
        for (slot, connection) in slots.iter_mut().zip(fresh) {
            if let Some(old) = slot.connection.replace(connection) {
                old.disconnect();
            }
        }
        Ok(count)
    }

    /// Before anything is written again after a reconnect: the export must
    /// still hold the identity bytes, or another medium answers at the
    /// address now (a server restarted on another image) and nothing may be
    /// written to it. An error here is final.
    fn check_identity(&self, connection: &mut Connection) -> io::Result<()> {
        let Some((offset, expected)) = self.identity.lock().clone() else {
            return Ok(());
        };
        let (start, length) = self.aligned_around(offset, expected.len());
        let mut whole = vec![0u8; length as usize];
        connection
            .read(start, &mut whole)
            .map_err(|error| match error {
                RequestError::Transport(error) => error,
                RequestError::Server(errno) => {
                    server_error(&self.uri, &format!("read at byte {start}"), errno)
                }
            })?;
        let at = (offset - start) as usize;
        if whole[at..at + expected.len()] != expected[..] {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "{}: the export now holds another image (bytes {offset}..{} differ from \
                     the mounted filesystem's identity): nothing more is written to it",
                    self.uri,
                    offset + expected.len() as u64
                ),
            ));
        }
        Ok(())
    }

    /// The aligned requests that make up an access of `len` bytes at
    /// `offset` (both aligned): (offset, length) pieces of at most
    /// `max_request` bytes.
    fn pieces(&self, offset: u64, len: u64) -> impl Iterator<Item = (u64, u64)> + '_ {
        debug_assert!(offset.is_multiple_of(self.alignment) && len.is_multiple_of(self.alignment));
        (0..len.div_ceil(self.max_request)).map(move |index| {
            let start = index * self.max_request;
            (offset + start, self.max_request.min(len - start))
        })
    }

    fn is_aligned(&self, offset: u64, len: usize) -> bool {
        offset.is_multiple_of(self.alignment) && (len as u64).is_multiple_of(self.alignment)
    }

    /// The smallest aligned range around `offset..offset+len`.
    fn aligned_around(&self, offset: u64, len: usize) -> (u64, u64) {
        let start = offset / self.alignment * self.alignment;
        let end = (offset + len as u64).div_ceil(self.alignment) * self.alignment;
        (start, end - start)
    }

    fn read_aligned(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.settle_overlapping(offset, buf.len() as u64)?;
        for (at, length) in self.pieces(offset, buf.len() as u64) {
            let into = &mut buf[(at - offset) as usize..(at - offset + length) as usize];
            let answer = self.with_connection(|_, slot| {
                let connection = slot.connection.as_mut().expect("a live connection");
                let cookie =
                    connection.send_request(protocol::CMD_READ, 0, at, length as u32, None)?;
                self.await_reply(slot, cookie, Some(&mut *into))
            })?;
            if let Err(errno) = answer {
                return Err(server_error(
                    &self.uri,
                    &format!("read at byte {at} (+{length})"),
                    errno,
                ));
            }
        }
        Ok(())
    }

    /// Send the writes; returns the sequence of the last one.
    fn write_aligned(&self, offset: u64, buf: &[u8], flags: u16) -> io::Result<u64> {
        self.settle_overlapping(offset, buf.len() as u64)?;
        let mut last = 0;
        for (at, length) in self.pieces(offset, buf.len() as u64) {
            let data = &buf[(at - offset) as usize..(at - offset + length) as usize];
            let mut sent = false;
            let answer = self.with_connection(|index, slot| {
                if !sent {
                    let connection = slot.connection.as_mut().expect("a live connection");
                    let sequence = self.next_sequence.fetch_add(1, Ordering::AcqRel);
                    let cookie = connection.send_request(
                        protocol::CMD_WRITE,
                        flags,
                        at,
                        length as u32,
                        Some(data),
                    )?;
                    // From here on the write is the device's to deliver: a
                    // reconnect sends it again.
                    sent = true;
                    last = sequence;
                    self.pending
                        .lock()
                        .insert(sequence, (index, at, at + length));
                    slot.bytes += data.len();
                    let write = InFlight {
                        sequence,
                        offset: at,
                        data: data.to_vec(),
                        fua: flags & protocol::CMD_FLAG_FUA != 0,
                    };
                    slot.writes.insert(cookie, write);
                }
                while slot.writes.len() > WINDOW_WRITES || slot.bytes > WINDOW_BYTES {
                    self.reap_one(slot)?;
                }
                Ok(())
            })?;
            debug_assert!(answer.is_ok(), "writes are answered through `failed`");
        }
        Ok(last)
    }

    fn write_with(&self, offset: u64, buf: &[u8], flags: u16) -> io::Result<u64> {
        if self.read_only {
            return Err(io::Error::from_raw_os_error(libc::EROFS));
        }
        check_range(offset, buf.len(), self.export.size)?;
        self.check_failed()?;
        // A FUA write, or one below the server's block: in the server's
        // order, after everything held back.
        self.unplug()?;
        let sequence = if self.is_aligned(offset, buf.len()) {
            self.write_aligned(offset, buf, flags)?
        } else {
            // The server's blocks are larger than ours: read, patch, write.
            // One at a time, so that two writers of neighbouring small
            // blocks in one server block cannot undo each other.
            let _partial = self.partial.lock();
            let (start, length) = self.aligned_around(offset, buf.len());
            let mut whole = vec![0u8; length as usize];
            self.read_aligned(start, &mut whole)?;
            let at = (offset - start) as usize;
            whole[at..at + buf.len()].copy_from_slice(buf);
            self.write_aligned(start, &whole, flags)?
        };
        self.bound_replay_log()?;
        Ok(sequence)
    }

    /// Past `REPLAY_LOG_MAX_BYTES` of acknowledged writes, flush (which
    /// empties the replay log).
    fn bound_replay_log(&self) -> io::Result<()> {
        if self.replay.lock().bytes > REPLAY_LOG_MAX_BYTES {
            self.flush()?;
        }
        Ok(())
    }

    /// A write held back in the plug; sent when the plug is full.
    fn write_plugged(&self, offset: u64, buf: &[u8]) -> io::Result<()> {
        if self.read_only {
            return Err(io::Error::from_raw_os_error(libc::EROFS));
        }
        check_range(offset, buf.len(), self.export.size)?;
        self.check_failed()?;
        {
            let mut plug = self.plug.lock();
            plug.insert(offset, buf);
            if plug.bytes() <= PLUG_MAX_BYTES {
                return Ok(());
            }
            self.unplug_locked(&mut plug)?;
        }
        self.bound_replay_log()
    }

    /// A write that is durable when this returns: `NBD_CMD_FLAG_FUA` where
    /// the server offers it, else a write and a flush.
    pub fn write_at_durable(&self, offset: u64, buf: &[u8]) -> io::Result<()> {
        if self.export.has(protocol::FLAG_SEND_FUA) {
            let generation = self.generation.load(Ordering::Acquire);
            let sequence = self.write_with(offset, buf, protocol::CMD_FLAG_FUA)?;
            if !self.settle_fua(sequence, generation)? {
                self.flush()?;
            }
            Ok(())
        } else {
            self.write_at(offset, buf)?;
            self.flush()
        }
    }

    /// A flush in one round trip where that is enough: when everything
    /// written and not yet durable is held in the plug as one request, it
    /// goes with `NBD_CMD_FLAG_FUA` — durable once answered — and no
    /// `NBD_CMD_FLUSH` follows. An fsync that wrote one block (an
    /// overwrite, a fast commit's TAIL) then costs one request instead of
    /// two. Returns whether it did the flush's work.
    fn flush_by_fua(&self) -> io::Result<bool> {
        if !self.export.has(protocol::FLAG_SEND_FUA) {
            return Ok(false);
        }
        let generation = self.generation.load(Ordering::Acquire);
        let sequence = {
            let mut plug = self.plug.lock();
            // Writes that returned before this flush are in the plug, in
            // flight or acknowledged: only the first may be left.
            let alone = plug.is_one_request(self.max_request as usize)
                && self.pending.lock().is_empty()
                && self.replay.lock().writes.is_empty();
            if !alone {
                return Ok(false);
            }
            let mut writes = plug.take(self.max_request as usize);
            debug_assert_eq!(writes.len(), 1);
            let (offset, data) = writes.pop().expect("one request");
            self.write_aligned(offset, &data, protocol::CMD_FLAG_FUA)?
        };
        self.settle_fua(sequence, generation)
    }

    /// Wait for the FUA write `sequence`, sent when the reconnect count was
    /// `generation`. Returns whether it is durable: false when a reconnect
    /// came between, which sends writes in flight again without FUA, so a
    /// flush must follow.
    fn settle_fua(&self, sequence: u64, generation: u64) -> io::Result<bool> {
        self.settle(sequence + 1)?;
        self.check_failed()?;
        Ok(self.generation.load(Ordering::Acquire) == generation)
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
            let answer = self.with_connection(|_, slot| {
                let connection = slot.connection.as_mut().expect("a live connection");
                let cookie =
                    connection.send_request(protocol::CMD_TRIM, 0, at, length as u32, None)?;
                self.await_reply(slot, cookie, None)
            })?;
            if let Err(errno) = answer {
                return Err(server_error(
                    &self.uri,
                    &format!("trim at byte {at} (+{length})"),
                    errno,
                ));
            }
        }
        Ok(())
    }
}

impl BlockDevice for NbdDevice {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        check_range(offset, buf.len(), self.export.size)?;
        {
            let mut plug = self.plug.lock();
            match plug.read(offset, buf) {
                Coverage::Full => return Ok(()),
                Coverage::None => {}
                Coverage::Partial => self.unplug_locked(&mut plug)?,
            }
        }
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
        if self.is_aligned(offset, buf.len()) {
            return self.write_plugged(offset, buf);
        }
        self.write_with(offset, buf, 0).map(|_| ())
    }

    /// Wait for every write issued before, then `NBD_CMD_FLUSH`, which
    /// covers every write acknowledged before it on any connection (one
    /// connection, or `CAN_MULTI_CONN`).
    fn flush(&self) -> io::Result<()> {
        if self.read_only || self.flush_by_fua()? {
            return Ok(());
        }
        self.unplug()?;
        self.settle(self.next_sequence.load(Ordering::Acquire))?;
        self.check_failed()?;
        if !self.export.has(protocol::FLAG_SEND_FLUSH) {
            // No write cache to flush, says the server: acknowledged
            // writes are as durable as they will get.
            let mut replay = self.replay.lock();
            let next = replay.next_ack;
            replay.covered_up_to(next);
            return Ok(());
        }
        let mark = std::cell::Cell::new(0);
        let answer = self.with_connection(|_, slot| {
            // Taken for each attempt: after a reconnect the replayed writes
            // are acknowledged again, before this flush.
            mark.set(self.replay.lock().next_ack);
            let connection = slot.connection.as_mut().expect("a live connection");
            let cookie = connection.send_request(protocol::CMD_FLUSH, 0, 0, 0, None)?;
            self.await_reply(slot, cookie, None)
        })?;
        if let Err(errno) = answer {
            let error = server_error(&self.uri, "flush", errno);
            self.failed.lock().get_or_insert(error.to_string());
            return Err(error);
        }
        self.replay.lock().covered_up_to(mark.get());
        Ok(())
    }

    /// NBD has no ranged barrier: the plugged writes are sent (the
    /// ranges' among them) so their transfer is paid for now, and
    /// `write_durable` keeps the trait's write and full `flush`.
    fn write_back(&self, _ranges: &[(u64, u64)]) -> io::Result<()> {
        if self.read_only {
            return Ok(());
        }
        self.unplug()
    }

    fn size_bytes(&self) -> u64 {
        self.export.size
    }

    fn is_read_only(&self) -> bool {
        self.read_only
    }

    fn expect_identity(&self, offset: u64, bytes: &[u8]) {
        debug_assert!(offset + bytes.len() as u64 <= self.export.size);
        *self.identity.lock() = Some((offset, bytes.to_vec()));
    }
}

impl Drop for NbdDevice {
    /// Wait for the writes in flight, then a soft disconnect on every
    /// connection (proto.md: the client ends transmission with
    /// `NBD_CMD_DISC`).
    fn drop(&mut self) {
        let _ = self.unplug();
        let _ = self.settle(self.next_sequence.load(Ordering::Acquire));
        for slot in &self.slots {
            if let Some(connection) = slot.lock().connection.take() {
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
