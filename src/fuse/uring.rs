//! The FUSE-over-io_uring transport (kernel `Documentation/filesystems/
//! fuse-io-uring.rst`, facts from `fs/fuse/dev_uring.c`).
//!
//! After FUSE_INIT has granted FUSE_OVER_IO_URING, the server registers
//! ring entries on the `/dev/fuse` descriptor with IORING_OP_URING_CMD
//! (FUSE_IO_URING_CMD_REGISTER): each entry is a header buffer (`struct
//! fuse_uring_req_header`) and a payload buffer of at least the largest
//! request, for one queue id. The kernel keeps one queue per possible CPU
//! and sends a request to the queue of the CPU its caller runs on; it
//! switches from `/dev/fuse` to the ring once every queue has an entry.
//! A request arrives as the completion of an entry's command; the answer
//! goes back, and the entry is offered for the next request, with one
//! FUSE_IO_URING_CMD_COMMIT_AND_FETCH — one system call per request where
//! `/dev/fuse` takes a write and a read.
//!
//! Threads: each queue is served by `threads_per_queue` threads, each with
//! its own io_uring (single issuer, task work deferred to its waits) and
//! `entries_per_thread` entries, bound to the queue's CPU. A thread
//! answers its entries one after the other, so a request that blocks (an
//! fsync waiting for its commit) holds only that thread's entries; the
//! kernel hands new requests to the entry that became free last. While
//! requests keep coming, the thread that answered last polls its ring
//! instead of sleeping (`pace.rs` says why and when).
//!
//! Buffers are bounded and counted: a payload and a header per entry, for
//! queues × threads × entries, and one answer buffer per thread; `jext4
//! stats` shows their total.
//! A request whose answer needs the payload its arguments still occupy (a
//! write's data, a lookup's name) is answered into the thread's answer
//! buffer and copied over once the handler is done; the others (reads,
//! readdir) are answered in place.
//!
//! Teardown: unmounting aborts the connection, and the kernel completes
//! every entry with ENOTCONN; a thread whose entries are all gone ends.
//! Its waits also time out every second to notice `Ring::stop` (the server
//! ending for another reason). A panic while handling a request is caught:
//! the engine aborts its journal (as in the `/dev/fuse` workers) and the
//! request is answered EIO; the thread keeps serving its queue, since a
//! queue without entries would leave its CPU's callers waiting for ever.

use super::FuseAdapter;
use super::answer::{
    Answer, AttrAnswer, CreateAnswer, DataAnswer, DirectoryAnswer, DirectoryPlusAnswer,
    EmptyAnswer, EntryAnswer, IoctlAnswer, LseekAnswer, OpenAnswer, Origin, StatfsAnswer,
    StatfsFigures, WriteAnswer, XattrAnswer,
};
use super::metrics::Operation;
use super::pace::{Look, Pace};
use super::wire::{self, Dirent, Encoder, InHeader, Request};
use fuser::{Errno, FileAttr, FileHandle, FileType, FopenFlags, Generation, INodeNo, SessionACL};
use io_uring::{IoUring, cqueue, opcode, squeue, types};
use std::ffi::OsStr;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// `enum fuse_uring_cmd`.
const FUSE_IO_URING_CMD_REGISTER: u32 = 1;
const FUSE_IO_URING_CMD_COMMIT_AND_FETCH: u32 = 2;

/// Where the kernel says whether it offers FUSE over io_uring.
pub const ENABLE_PARAMETER: &str = "/sys/module/fuse/parameters/enable_uring";

/// The answer buffer of a thread: the largest answer to a request whose
/// arguments occupy the payload is an extended attribute's value
/// (XATTR_SIZE_MAX, 64 KiB); the others are a few hundred bytes at most.
const ANSWER_BUFFER_SIZE: usize = (64 << 10) + 4096;

/// How long a thread waits before looking at the stop flag again.
const WAIT: Duration = Duration::from_secs(1);
/// How long the threads may take to register their entries.
const REGISTER_TIMEOUT: Duration = Duration::from_secs(10);

/// Whether this kernel offers FUSE over io_uring now: `Err` says why not.
pub fn kernel_offers() -> Result<(), String> {
    match std::fs::read_to_string(ENABLE_PARAMETER) {
        Ok(value) if value.trim() == "Y" => Ok(()),
        Ok(_) => Err(format!(
            "the kernel does not offer FUSE over io_uring ({ENABLE_PARAMETER} is N; as root: echo Y > {ENABLE_PARAMETER})"
        )),
        Err(_) => Err(format!(
            "this kernel has no FUSE over io_uring ({ENABLE_PARAMETER} is missing: CONFIG_FUSE_IO_URING)"
        )),
    }
}

/// The kernel's queue count: one per possible CPU (`num_possible_cpus()`).
/// The ring serves nothing until every queue has an entry, so a count
/// too small would hang the mount: without the sysfs file, the CPUs the
/// C library counts configured.
pub fn possible_cpus() -> usize {
    let Ok(text) = std::fs::read_to_string("/sys/devices/system/cpu/possible") else {
        // SAFETY: sysconf has no preconditions.
        return (unsafe { libc::sysconf(libc::_SC_NPROCESSORS_CONF) }).max(1) as usize;
    };
    let count: usize = text
        .trim()
        .split(',')
        .filter_map(|range| match range.split_once('-') {
            Some((first, last)) => {
                Some(last.parse::<usize>().ok()? + 1 - first.parse::<usize>().ok()?)
            }
            None => range.parse::<usize>().ok().map(|_| 1),
        })
        .sum();
    count.max(1)
}

/// The ring's shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingShape {
    pub queues: usize,
    pub threads_per_queue: usize,
    pub entries_per_thread: usize,
    pub payload_size: usize,
}

impl RingShape {
    pub fn threads(&self) -> usize {
        self.queues * self.threads_per_queue
    }

    /// Every buffer the ring holds: the entries' headers and payloads and
    /// each thread's answer buffer.
    pub fn buffer_bytes(&self) -> u64 {
        let entries = (self.threads() * self.entries_per_thread) as u64;
        entries * (self.payload_size + wire::RING_HEADER_SIZE) as u64
            + (self.threads() * ANSWER_BUFFER_SIZE) as u64
    }
}

/// Who may ask (fuser's rule for `/dev/fuse`, kept the same here): without
/// allow_other only the mount's owner (and root with allow_root), except
/// for requests the kernel may send on behalf of nobody in particular.
#[derive(Debug, Clone, Copy)]
pub struct Access {
    pub acl: SessionACL,
    pub owner: u32,
}

impl Access {
    fn allows(&self, header: &InHeader, request: &Request<'_>) -> bool {
        let refused = match self.acl {
            SessionACL::All => false,
            SessionACL::RootAndOwner => header.uid != self.owner && header.uid != 0,
            SessionACL::Owner => header.uid != self.owner,
        };
        !refused
            || matches!(
                request,
                Request::Destroy
                    | Request::Read { .. }
                    | Request::Readdir { .. }
                    | Request::Readdirplus { .. }
                    | Request::Forget
                    | Request::Write { .. }
                    | Request::Fsync { .. }
                    | Request::Fsyncdir
                    | Request::Release
                    | Request::Releasedir
            )
    }
}

/// The running ring: its threads and what they count.
pub struct Ring {
    threads: Vec<std::thread::JoinHandle<()>>,
    stop: Arc<AtomicBool>,
    pub requests: Arc<AtomicU64>,
    pub pace: Arc<Pace>,
}

/// What a queue thread starts with.
struct QueueThread {
    qid: u16,
    /// The thread's index within its queue.
    index: usize,
    fd: Arc<OwnedFd>,
    adapter: Arc<FuseAdapter>,
    access: Access,
    shape: RingShape,
    stop: Arc<AtomicBool>,
    requests: Arc<AtomicU64>,
    pace: Arc<Pace>,
}

impl Ring {
    /// Start the queue threads on the connection `device` and register
    /// their entries; fails (and stops what started) if the kernel refuses
    /// any of them.
    pub fn start(
        device: BorrowedFd<'_>,
        adapter: Arc<FuseAdapter>,
        access: Access,
        shape: RingShape,
        spin: Duration,
    ) -> Result<Ring, String> {
        let fd = Arc::new(
            device
                .try_clone_to_owned()
                .map_err(|error| format!("duplicating /dev/fuse: {error}"))?,
        );
        let stop = Arc::new(AtomicBool::new(false));
        let requests = Arc::new(AtomicU64::new(0));
        let pace = Arc::new(Pace::new(shape.queues, spin));
        let (report, registered) = std::sync::mpsc::channel();
        let mut ring = Ring {
            threads: Vec::new(),
            stop: Arc::clone(&stop),
            requests: Arc::clone(&requests),
            pace: Arc::clone(&pace),
        };
        for qid in 0..shape.queues {
            for index in 0..shape.threads_per_queue {
                let queue = QueueThread {
                    qid: qid as u16,
                    index,
                    fd: Arc::clone(&fd),
                    adapter: Arc::clone(&adapter),
                    access,
                    shape,
                    stop: Arc::clone(&stop),
                    requests: Arc::clone(&requests),
                    pace: Arc::clone(&pace),
                };
                let report = report.clone();
                let spawned = std::thread::Builder::new()
                    .name(format!("jext4-uring-{qid}.{index}"))
                    .spawn(move || queue.run(report));
                match spawned {
                    Ok(handle) => ring.threads.push(handle),
                    Err(error) => {
                        ring.stop();
                        return Err(format!("starting an io_uring queue thread: {error}"));
                    }
                }
            }
        }
        drop(report);
        ring.await_registration(registered)
    }

    fn await_registration(
        self,
        registered: std::sync::mpsc::Receiver<Result<(), String>>,
    ) -> Result<Ring, String> {
        let deadline = Instant::now() + REGISTER_TIMEOUT;
        for _ in 0..self.threads.len() {
            let left = deadline.saturating_duration_since(Instant::now());
            let outcome = registered.recv_timeout(left).unwrap_or_else(|_| {
                Err("the io_uring queue threads did not register in time".into())
            });
            if let Err(why) = outcome {
                self.stop();
                return Err(why);
            }
        }
        Ok(self)
    }

    /// Stop the threads (their waits end within a second, or at once when
    /// the connection is gone), wait for them, and check that nothing of
    /// the ring is left (its threads and io_uring descriptors).
    pub fn stop(self) {
        self.stop.store(true, Ordering::Release);
        for thread in self.threads {
            if thread.join().is_err() {
                tracing::error!("an io_uring queue thread ended with a panic");
            }
        }
        // A joined thread is gone for Rust once its exit cleared its tid,
        // but the kernel lists it in /proc/self/task until it has released
        // the task, a moment later: wait that moment out (bounded) before
        // calling anything left behind.
        let deadline = Instant::now() + LEFTOVER_GRACE;
        let (mut rings, mut threads) = leftovers();
        while rings + threads > 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
            (rings, threads) = leftovers();
        }
        if rings + threads > 0 {
            tracing::error!(
                rings,
                threads,
                "the io_uring transport left descriptors or threads behind"
            );
        } else {
            tracing::info!("the io_uring transport stopped: no thread or ring left");
        }
    }
}

/// How long a joined queue thread may still show in /proc/self/task.
const LEFTOVER_GRACE: Duration = Duration::from_secs(1);

/// io_uring descriptors this process holds, and queue threads still alive.
fn leftovers() -> (usize, usize) {
    let rings = std::fs::read_dir("/proc/self/fd")
        .into_iter()
        .flatten()
        .flatten()
        .filter(|entry| {
            std::fs::read_link(entry.path())
                .is_ok_and(|target| target.as_os_str() == "anon_inode:[io_uring]")
        })
        .count();
    let threads = std::fs::read_dir("/proc/self/task")
        .into_iter()
        .flatten()
        .flatten()
        .filter(|task| {
            std::fs::read_to_string(task.path().join("comm"))
                .is_ok_and(|name| name.starts_with("jext4-uring"))
        })
        .count();
    (rings, threads)
}

/// One ring entry's buffers, which the kernel reads and writes while the
/// entry is registered with it. They are reached only through raw
/// pointers, and turned into slices only between the completion that hands
/// the entry to this thread and the submission that gives it back.
struct RingEntry {
    header: *mut u8,
    payload: *mut u8,
    payload_size: usize,
    /// The two segments REGISTER names: header, payload.
    iov: Box<[libc::iovec; 2]>,
}

impl RingEntry {
    fn new(payload_size: usize) -> RingEntry {
        let header = Box::into_raw(vec![0u8; wire::RING_HEADER_SIZE].into_boxed_slice()) as *mut u8;
        let payload = Box::into_raw(vec![0u8; payload_size].into_boxed_slice()) as *mut u8;
        let iov = Box::new([
            libc::iovec {
                iov_base: header.cast(),
                iov_len: wire::RING_HEADER_SIZE,
            },
            libc::iovec {
                iov_base: payload.cast(),
                iov_len: payload_size,
            },
        ]);
        RingEntry {
            header,
            payload,
            payload_size,
            iov,
        }
    }
}

impl Drop for RingEntry {
    fn drop(&mut self) {
        // SAFETY: both came from Box::into_raw of boxed slices of these
        // lengths, and the kernel no longer uses them: an entry is dropped
        // only after its ring was closed (which cancels its command) or its
        // command completed for good.
        unsafe {
            drop(Box::from_raw(std::ptr::slice_from_raw_parts_mut(
                self.header,
                wire::RING_HEADER_SIZE,
            )));
            drop(Box::from_raw(std::ptr::slice_from_raw_parts_mut(
                self.payload,
                self.payload_size,
            )));
        }
    }
}

/// A FUSE command SQE: `struct fuse_uring_cmd_req` in the command area,
/// the entry's iovecs in `addr`, their count (2) in `len`.
fn command(
    fd: i32,
    cmd_op: u32,
    qid: u16,
    commit_id: u64,
    entry: &RingEntry,
    index: usize,
) -> squeue::Entry128 {
    let mut cmd = [0u8; 80];
    cmd[8..16].copy_from_slice(&commit_id.to_ne_bytes());
    cmd[16..18].copy_from_slice(&qid.to_ne_bytes());
    let sqe = opcode::UringCmd80::new(types::Fd(fd), cmd_op)
        .cmd(cmd)
        .addr(Some(entry.iov.as_ptr() as u64))
        .build()
        .user_data(index as u64);
    with_length(sqe, 2)
}

/// The io-uring crate sets no `len` for URING_CMD; FUSE needs it.
fn with_length(sqe: squeue::Entry128, length: u32) -> squeue::Entry128 {
    const { assert!(std::mem::size_of::<squeue::Entry128>() == 128) };
    // SAFETY: Entry128 is repr(C): a 64-byte struct io_uring_sqe followed
    // by the 64 bytes of the big SQE, plain data in both directions;
    // `len` is the u32 at byte 24 of struct io_uring_sqe
    // (include/uapi/linux/io_uring.h).
    let mut raw: [u8; 128] = unsafe { std::mem::transmute(sqe) };
    raw[24..28].copy_from_slice(&length.to_ne_bytes());
    // SAFETY: as above, any bytes make a valid Entry128.
    unsafe { std::mem::transmute::<[u8; 128], squeue::Entry128>(raw) }
}

/// Errors of a wait that the next wait retries: its timeout, a signal,
/// completions the ring could not take yet.
fn is_transient(error: &std::io::Error) -> bool {
    matches!(
        error.raw_os_error(),
        Some(libc::ETIME | libc::EINTR | libc::EBUSY | libc::EAGAIN)
    )
}

/// Errors with which the kernel gives an entry back for good: the
/// connection is gone or being torn down.
fn is_teardown(error: i32) -> bool {
    matches!(
        error,
        libc::ENOTCONN | libc::ECONNABORTED | libc::ECANCELED | libc::ENODEV
    )
}

impl QueueThread {
    fn run(self, report: std::sync::mpsc::Sender<Result<(), String>>) {
        bind_to_cpu(self.qid as usize);
        let mut ring = match self.ring() {
            Ok(ring) => ring,
            Err(why) => {
                let _ = report.send(Err(why));
                return;
            }
        };
        let entries: Vec<RingEntry> = (0..self.shape.entries_per_thread)
            .map(|_| RingEntry::new(self.shape.payload_size))
            .collect();
        let registered = self.register(&mut ring, &entries);
        let failed = registered.is_err();
        let _ = report.send(registered);
        if !failed {
            self.serve(&mut ring, &entries);
        }
        // The entries outlive every command the ring still holds: dropping
        // the ring first cancels them.
        drop(ring);
        drop(entries);
    }

    fn ring(&self) -> Result<IoUring<squeue::Entry128, cqueue::Entry>, String> {
        let size = (self.shape.entries_per_thread as u32)
            .next_power_of_two()
            .max(2);
        IoUring::<squeue::Entry128, cqueue::Entry>::builder()
            .setup_single_issuer()
            .setup_defer_taskrun()
            // The kernel then flags deferred work (a request to copy in)
            // in the shared ring, which a poller reads without a call.
            .setup_taskrun_flag()
            .build(size)
            .map_err(|error| format!("creating an io_uring: {error}"))
    }

    /// Register every entry; an entry the kernel refuses completes at once
    /// with its error (a registered one completes only with a request).
    fn register(
        &self,
        ring: &mut IoUring<squeue::Entry128, cqueue::Entry>,
        entries: &[RingEntry],
    ) -> Result<(), String> {
        let fd = self.fd.as_raw_fd();
        for (index, entry) in entries.iter().enumerate() {
            let sqe = command(fd, FUSE_IO_URING_CMD_REGISTER, self.qid, 0, entry, index);
            // SAFETY: the entry's iovecs and buffers live until the ring is
            // dropped (`run`), which cancels the command.
            unsafe { ring.submission().push(&sqe) }
                .map_err(|_| "the io_uring submission queue is full".to_string())?;
        }
        ring.submit()
            .map_err(|error| format!("registering FUSE io_uring entries: {error}"))?;
        let refused = ring
            .completion()
            .find(|completion| completion.result() < 0)
            .map(|completion| completion.result());
        match refused {
            Some(error) => Err(format!(
                "the kernel refused a FUSE io_uring entry for queue {}: {}",
                self.qid,
                std::io::Error::from_raw_os_error(-error)
            )),
            None => Ok(()),
        }
    }

    /// Answer requests until the kernel has taken back every entry or the
    /// ring is stopped.
    fn serve(&self, ring: &mut IoUring<squeue::Entry128, cqueue::Entry>, entries: &[RingEntry]) {
        let mut live = entries.len();
        let mut answers = vec![0u8; ANSWER_BUFFER_SIZE];
        let mut ready = Vec::with_capacity(entries.len());
        let timeout = types::Timespec::from(WAIT);
        let wait = types::SubmitArgs::new().timespec(&timeout);
        // Whether this thread answered a request since it last waited.
        let mut answered = false;
        while live > 0 && !self.stop.load(Ordering::Acquire) {
            if !self.next_completions(ring, &wait, answered) {
                return;
            }
            answered = false;
            ready.clear();
            ready.extend(
                ring.completion()
                    .map(|completion| (completion.user_data() as usize, completion.result())),
            );
            for &(index, result) in &ready {
                let Some(entry) = entries.get(index) else {
                    debug_assert!(false, "a completion for entry {index} of {}", entries.len());
                    continue;
                };
                if result < 0 {
                    live -= 1;
                    if !is_teardown(-result) {
                        tracing::error!(qid = self.qid, error = %std::io::Error::from_raw_os_error(-result), "the kernel gave back a FUSE io_uring entry");
                    }
                    continue;
                }
                self.pace.note_request();
                let commit_id = self.answer(entry, &mut answers);
                answered = true;
                let sqe = command(
                    self.fd.as_raw_fd(),
                    FUSE_IO_URING_CMD_COMMIT_AND_FETCH,
                    self.qid,
                    commit_id,
                    entry,
                    index,
                );
                // SAFETY: as in `register`; the queue has room for every
                // entry and at most one command per entry is queued.
                if unsafe { ring.submission().push(&sqe) }.is_err() {
                    debug_assert!(false, "no room for a commit");
                    live -= 1;
                }
            }
        }
    }

    /// Send the answers queued so far and wait for completions: polling
    /// while the filesystem is busy and this thread has its queue's turn
    /// to poll (`pace.rs`), sleeping otherwise (at most `wait`). False on
    /// an error that ends the thread.
    fn next_completions(
        &self,
        ring: &mut IoUring<squeue::Entry128, cqueue::Entry>,
        wait: &types::SubmitArgs<'_, '_>,
        answered: bool,
    ) -> bool {
        if answered
            && self
                .pace
                .poll(self.qid as usize, self.index, || self.look(ring))
        {
            return true;
        }
        let waited = if ring.completion().is_empty() {
            ring.submitter().submit_with_args(1, wait)
        } else {
            ring.submitter().submit()
        };
        match waited {
            Ok(_) => true,
            Err(error) if is_transient(&error) => true,
            Err(error) => {
                tracing::error!(%error, qid = self.qid, "waiting on the FUSE io_uring");
                false
            }
        }
    }

    /// One look of a poll (`Pace::poll`): send the answers queued so far
    /// (with the kernel's deferred work flagged — a new request to copy
    /// in — run it: GETEVENTS), then see whether a completion is there.
    fn look(&self, ring: &mut IoUring<squeue::Entry128, cqueue::Entry>) -> Look {
        let pending = !ring.submission().is_empty() || ring.submission().taskrun();
        if pending
            && let Err(error) = ring.submitter().submit_and_wait(0)
            && !is_transient(&error)
        {
            return Look::Stop;
        }
        if !ring.completion().is_empty() {
            Look::Request
        } else if self.stop.load(Ordering::Acquire) {
            Look::Stop
        } else {
            Look::Nothing
        }
    }

    /// Handle the request the kernel put in `entry`; returns its commit id.
    fn answer(&self, entry: &RingEntry, answers: &mut [u8]) -> u64 {
        // SAFETY: the kernel handed the entry to this thread (its command
        // completed) and gets it back only with the next submission, after
        // these slices are gone; the buffers are live allocations of these
        // sizes (`RingEntry::new`), each reached only through this entry.
        let (header, payload) = unsafe {
            (
                std::slice::from_raw_parts_mut(entry.header, wire::RING_HEADER_SIZE),
                std::slice::from_raw_parts_mut(entry.payload, entry.payload_size),
            )
        };
        let (in_out, rest) = header.split_at_mut(wire::RING_OP_IN_OFFSET);
        let (op_in, ring_in_out) =
            rest.split_at_mut(wire::RING_ENT_IN_OUT_OFFSET - wire::RING_OP_IN_OFFSET);
        let commit_id = u64::from_ne_bytes(ring_in_out[8..16].try_into().expect("8 bytes"));
        let payload_size =
            u32::from_ne_bytes(ring_in_out[16..20].try_into().expect("4 bytes")) as usize;
        let outcome = match InHeader::decode(in_out) {
            Some(header) => {
                self.requests.fetch_add(1, Ordering::AcqRel);
                let payload_size = payload_size.min(payload.len());
                self.handle(&header, op_in, payload, payload_size, answers)
            }
            None => Outcome::error(libc::EIO),
        };
        wire::out_header(in_out, outcome.length, outcome.error, commit_id);
        ring_in_out[16..20].copy_from_slice(&(outcome.length as u32).to_ne_bytes());
        commit_id
    }

    /// Decode and answer one request, catching any panic (a bug): the
    /// adapter's handlers catch their own and abort the journal; this
    /// covers decoding and encoding.
    fn handle(
        &self,
        header: &InHeader,
        op_in: &[u8],
        payload: &mut [u8],
        payload_size: usize,
        answers: &mut [u8],
    ) -> Outcome {
        let handled = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            crate::faults::panic_point(crate::faults::PanicPoint::UringQueue);
            if takes_payload(header.opcode) {
                // The arguments stay in the payload while the handler runs:
                // answer aside, then copy.
                let mut outcome = Outcome::default();
                match Request::decode(header.opcode, op_in, &payload[..payload_size]) {
                    Ok(request) => {
                        self.dispatch(header, request, RingAnswer::new(answers, &mut outcome))
                    }
                    Err(_) => outcome = Outcome::error(libc::EINVAL),
                }
                payload[..outcome.length].copy_from_slice(&answers[..outcome.length]);
                outcome
            } else {
                let mut outcome = Outcome::default();
                match Request::decode(header.opcode, op_in, &[]) {
                    Ok(request) => {
                        self.dispatch(header, request, RingAnswer::new(payload, &mut outcome))
                    }
                    Err(_) => outcome = Outcome::error(libc::EINVAL),
                }
                outcome
            }
        }));
        handled.unwrap_or_else(|panic| {
            let why = crate::error::panic_message(&*panic);
            self.adapter
                .abort(&format!("a panic in the FUSE io_uring queue thread: {why}"));
            Outcome::error(libc::EIO)
        })
    }

    fn dispatch(&self, header: &InHeader, request: Request<'_>, answer: RingAnswer<'_>) {
        if !self.access.allows(header, &request) {
            return answer.error(Errno::from_i32(libc::EACCES));
        }
        let origin = Origin {
            uid: header.uid,
            gid: header.gid,
            pid: header.pid,
        };
        let node = INodeNo(header.nodeid);
        dispatch(&self.adapter, &origin, node, request, answer);
    }
}

/// The opcodes whose arguments reach into the payload buffer.
fn takes_payload(opcode: u32) -> bool {
    // LOOKUP, SYMLINK, MKNOD, MKDIR, UNLINK, RMDIR, RENAME, LINK, WRITE,
    // SETXATTR, GETXATTR, REMOVEXATTR, CREATE, RENAME2 (linux/fuse.h).
    matches!(opcode, 1 | 6 | 8..=13 | 16 | 21 | 22 | 24 | 35 | 45)
}

/// Hand a decoded request to the adapter's handler.
fn dispatch(
    adapter: &FuseAdapter,
    origin: &Origin,
    node: INodeNo,
    request: Request<'_>,
    answer: RingAnswer<'_>,
) {
    match request {
        Request::Lookup { name } => adapter.lookup(node, name, answer),
        Request::Getattr => adapter.getattr(node, answer),
        Request::Setattr(changes) => adapter.setattr(origin, node, &changes, answer),
        Request::Readlink => adapter.readlink(node, answer),
        Request::Symlink { name, target } => {
            adapter.symlink(origin, node, name, std::path::Path::new(target), answer)
        }
        Request::Mknod {
            name,
            mode,
            umask,
            rdev,
        } => adapter.mknod(origin, node, name, mode, umask, rdev, answer),
        Request::Mkdir { name, mode, umask } => {
            adapter.mkdir(origin, node, name, mode, umask, answer)
        }
        Request::Unlink { name } => adapter.unlink(origin, node, name, answer),
        Request::Rmdir { name } => adapter.rmdir(origin, node, name, answer),
        Request::Rename {
            name,
            newparent,
            newname,
            flags,
        } => adapter.rename(
            origin,
            node,
            name,
            INodeNo(newparent),
            newname,
            fuser::RenameFlags::from_bits_retain(flags),
            answer,
        ),
        Request::Link { oldnodeid, newname } => {
            adapter.link(origin, INodeNo(oldnodeid), node, newname, answer)
        }
        Request::Open { flags } => adapter.open(node, flags, answer),
        Request::Read { offset, size } => adapter.read(node, offset, size, answer),
        Request::Write {
            offset,
            data,
            write_flags,
        } => adapter.write(
            origin,
            node,
            offset,
            data,
            fuser::WriteFlags::from_bits_retain(write_flags),
            answer,
        ),
        Request::Statfs => adapter.statfs(node, answer),
        Request::Release => adapter.release(node, answer),
        Request::Fsync { datasync } => adapter.fsync(node, datasync, answer),
        Request::Setxattr { name, value, flags } => {
            adapter.setxattr(origin, node, name, value, flags, answer)
        }
        Request::Getxattr { name, size } => adapter.getxattr(node, name, size, answer),
        Request::Listxattr { size } => adapter.listxattr(node, size, answer),
        Request::Removexattr { name } => adapter.removexattr(origin, node, name, answer),
        Request::Flush => adapter.flush(answer),
        Request::Opendir => adapter.opendir(node, answer),
        Request::Readdir { offset, size } => adapter.readdir(node, offset, answer.limited(size)),
        Request::Readdirplus { offset, size } => {
            adapter.readdirplus(node, offset, answer.limited(size))
        }
        Request::Releasedir => adapter.releasedir(node, answer),
        Request::Fsyncdir => adapter.fsyncdir(node, answer),
        Request::Access => adapter.access(node, answer),
        Request::Create { name, mode, umask } => {
            adapter.create(origin, node, name, mode, umask, answer)
        }
        Request::Ioctl {
            cmd,
            data,
            out_size,
        } => adapter.ioctl(origin, node, cmd, data, out_size, answer),
        Request::Fallocate {
            offset,
            length,
            mode,
        } => adapter.fallocate(origin, node, offset, length, mode, answer),
        Request::Lseek { offset, whence } => adapter.lseek(node, offset, whence, answer),
        Request::Destroy => {
            adapter.count(Operation::Destroy);
            EmptyAnswer::ok(answer)
        }
        Request::Forget | Request::Unsupported => {
            adapter.count_failure(Operation::Other);
            answer.error(Errno::from_i32(libc::ENOSYS))
        }
    }
}

/// How a request was answered: the out header's error and the length of
/// the answer's arguments in the payload.
#[derive(Debug, Default, Clone, Copy)]
struct Outcome {
    error: i32,
    length: usize,
}

impl Outcome {
    fn error(errno: i32) -> Outcome {
        Outcome {
            error: -errno,
            length: 0,
        }
    }
}

/// The answer to one ring request, encoded into `buffer` (the entry's
/// payload or the thread's answer buffer). Dropped unanswered, it answers
/// EIO.
struct RingAnswer<'b> {
    encoder: Encoder<'b>,
    outcome: &'b mut Outcome,
    /// The most the kernel takes back (readdir's size).
    limit: usize,
    answered: bool,
}

impl<'b> RingAnswer<'b> {
    fn new(buffer: &'b mut [u8], outcome: &'b mut Outcome) -> Self {
        let limit = buffer.len();
        RingAnswer {
            encoder: Encoder::new(buffer),
            outcome,
            limit,
            answered: false,
        }
    }

    fn limited(mut self, size: u32) -> Self {
        self.limit = self.limit.min(size as usize);
        self
    }

    /// The encoded arguments are the answer (false: they did not fit,
    /// which no request the kernel sizes can cause).
    fn finish(mut self, encoded: bool) {
        debug_assert!(encoded, "a FUSE answer outgrew the ring entry's payload");
        *self.outcome = if encoded {
            Outcome {
                error: 0,
                length: self.encoder.len(),
            }
        } else {
            Outcome::error(libc::EIO)
        };
        self.answered = true;
    }
}

impl Drop for RingAnswer<'_> {
    fn drop(&mut self) {
        if !self.answered {
            *self.outcome = Outcome::error(libc::EIO);
        }
    }
}

impl Answer for RingAnswer<'_> {
    fn error(mut self, errno: Errno) {
        *self.outcome = Outcome::error(i32::from(errno));
        self.answered = true;
    }
}

impl EmptyAnswer for RingAnswer<'_> {
    fn ok(self) {
        self.finish(true)
    }
}

impl EntryAnswer for RingAnswer<'_> {
    fn entry(mut self, ttl: &Duration, attr: &FileAttr, generation: Generation) {
        let encoded = self.encoder.entry(ttl, attr, generation);
        self.finish(encoded)
    }
}

impl AttrAnswer for RingAnswer<'_> {
    fn attr(mut self, ttl: &Duration, attr: &FileAttr) {
        let encoded = self.encoder.attr_out(ttl, attr);
        self.finish(encoded)
    }
}

impl DataAnswer for RingAnswer<'_> {
    fn data(mut self, data: &[u8]) {
        let encoded = self.encoder.put(data);
        self.finish(encoded)
    }
}

impl OpenAnswer for RingAnswer<'_> {
    fn opened(mut self, fh: FileHandle, flags: FopenFlags) {
        let encoded = self.encoder.open_out(fh.0, flags.bits());
        self.finish(encoded)
    }
}

impl WriteAnswer for RingAnswer<'_> {
    fn written(mut self, size: u32) {
        let encoded = self.encoder.size_out(size);
        self.finish(encoded)
    }
}

impl CreateAnswer for RingAnswer<'_> {
    fn created(
        mut self,
        ttl: &Duration,
        attr: &FileAttr,
        generation: Generation,
        fh: FileHandle,
        flags: FopenFlags,
    ) {
        let encoded =
            self.encoder.entry(ttl, attr, generation) && self.encoder.open_out(fh.0, flags.bits());
        self.finish(encoded)
    }
}

impl StatfsAnswer for RingAnswer<'_> {
    fn statfs(mut self, figures: &StatfsFigures) {
        let encoded = self.encoder.statfs_out(figures);
        self.finish(encoded)
    }
}

impl XattrAnswer for RingAnswer<'_> {
    fn size(mut self, size: u32) {
        let encoded = self.encoder.size_out(size);
        self.finish(encoded)
    }

    fn data(mut self, data: &[u8]) {
        let encoded = self.encoder.put(data);
        self.finish(encoded)
    }
}

impl LseekAnswer for RingAnswer<'_> {
    fn offset(mut self, offset: i64) {
        let encoded = self.encoder.offset_out(offset);
        self.finish(encoded)
    }
}

impl IoctlAnswer for RingAnswer<'_> {
    fn ioctl(mut self, result: i32, data: &[u8]) {
        let encoded = self.encoder.ioctl_out(result, data);
        self.finish(encoded)
    }
}

impl DirectoryAnswer for RingAnswer<'_> {
    fn add(&mut self, ino: INodeNo, offset: u64, kind: FileType, name: &OsStr) -> bool {
        let dirent = Dirent {
            ino,
            offset,
            kind,
            name,
        };
        !self.encoder.dirent(self.limit, &dirent)
    }

    fn ok(self) {
        self.finish(true)
    }
}

impl DirectoryPlusAnswer for RingAnswer<'_> {
    fn add(
        &mut self,
        offset: u64,
        name: &OsStr,
        ttl: &Duration,
        attr: &FileAttr,
        generation: Generation,
    ) -> bool {
        let dirent = Dirent {
            ino: attr.ino,
            offset,
            kind: attr.kind,
            name,
        };
        !self
            .encoder
            .direntplus(self.limit, &dirent, ttl, attr, generation)
    }

    fn ok(self) {
        self.finish(true)
    }
}

/// Run the calling thread on `cpu` only: the kernel sends this queue the
/// requests of callers running there. A CPU that is not online leaves the
/// thread unbound.
fn bind_to_cpu(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is the empty set; CPU_SET writes within
    // it for cpu < CPU_SETSIZE, checked first.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if cpu >= libc::CPU_SETSIZE as usize {
            return;
        }
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            tracing::debug!(cpu, error = %std::io::Error::last_os_error(), "io_uring queue thread left unbound");
        }
    }
}
