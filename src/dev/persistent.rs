//! Persistent memory: byte-addressable, durable access to a range of a
//! device, for ByteLog (`journal::bytelog`).
//!
//! The contract, in cache lines of 64 bytes: `store` copies whole lines
//! into the mapping; nothing stored is durable until a `persist` covering
//! it returns; until then any subset of the lines stored since the last
//! `persist` over them may be durable after a power cut (a CPU writes
//! lines back in any order). `persist` is the RFC's `arch_wb_cache_pmem` +
//! `pmem_wmb`: write the range's lines back and fence.
//!
//! Implementations:
//! - a file on a DAX filesystem, mapped with `MAP_SYNC`: stores land in
//!   persistent memory through the CPU cache, and `persist` writes each
//!   line back (`clwb`, else `clflushopt`, else `clflush`) then `sfence`s —
//!   no system call;
//! - any other file or block device, mapped `MAP_SHARED`: `persist` is
//!   `msync(MS_SYNC)` over the pages holding the range — a write-back and a
//!   device flush, the documented slow fallback (on /dev/shm it costs
//!   nothing, and is not durable across a reboot either);
//! - memory (tests), and the recording device, which logs every line and
//!   every persist so that crash states can be built at line granularity.
//!
//! Stores and block writes (`BlockDevice::write_at`) are never mixed on the
//! same bytes while either is not durable: what goes through a mapping goes
//! only through it (the crash-state generator checks this).

use std::io;

/// The unit of persistence.
pub const CACHE_LINE: u64 = 64;

/// How `persist` makes lines durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PersistMethod {
    /// Cache-line write-back and a store fence on a `MAP_SYNC` mapping;
    /// the instruction used.
    CacheLineWriteBack(&'static str),
    /// `msync(MS_SYNC)` on an ordinary shared mapping.
    Msync,
    /// Nothing to do: the bytes live in memory (tests, crash recording).
    Memory,
}

impl std::fmt::Display for PersistMethod {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PersistMethod::CacheLineWriteBack(instruction) => {
                write!(f, "{instruction} + sfence (MAP_SYNC)")
            }
            PersistMethod::Msync => write!(f, "msync"),
            PersistMethod::Memory => write!(f, "memory"),
        }
    }
}

/// A mapped, durable byte range of a device (offsets relative to it).
pub trait PersistentMemory: Send + Sync {
    /// Bytes mapped.
    fn len(&self) -> u64;

    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn method(&self) -> PersistMethod;

    /// Copy `bytes` (whole lines) to `offset` (a line boundary). Not
    /// durable until a `persist` covers it.
    fn store(&self, offset: u64, bytes: &[u8]) -> io::Result<()>;

    /// Make every line stored in `[offset, offset + len)` durable.
    fn persist(&self, offset: u64, len: u64) -> io::Result<()>;
}

/// Checks shared by every implementation: whole lines, inside the mapping.
pub(crate) fn check_lines(offset: u64, len: u64, mapped: u64) -> io::Result<()> {
    debug_assert_eq!(offset % CACHE_LINE, 0, "store at byte {offset}");
    debug_assert_eq!(len % CACHE_LINE, 0, "store of {len} bytes");
    match offset.checked_add(len) {
        Some(end) if end <= mapped => Ok(()),
        _ => Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!("persistent memory access at byte {offset} (+{len}) beyond {mapped}"),
        )),
    }
}

/// A shared mapping of part of a file or block device.
pub(crate) struct FileMapping {
    /// Start of the mapping (page aligned).
    base: *mut u8,
    mapped_len: usize,
    /// Where the range asked for starts inside the mapping.
    delta: usize,
    len: u64,
    page: usize,
    method: PersistMethod,
}

// SAFETY: the mapping is plain shared memory owned by this value until
// drop; stores go through raw copies (callers serialise writers: one fast
// commit at a time), and nothing hands out references into it.
unsafe impl Send for FileMapping {}
// SAFETY: as above; concurrent readers of the file go through the kernel
// (pread), never through this pointer.
unsafe impl Sync for FileMapping {}

impl FileMapping {
    /// Map bytes `[offset, offset + len)` of `fd` for reading and writing:
    /// with `MAP_SYNC` where the file is on a DAX filesystem, else as an
    /// ordinary shared mapping persisted with `msync`.
    pub(crate) fn new(fd: std::os::unix::io::RawFd, offset: u64, len: u64) -> io::Result<Self> {
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
        let start = offset / page as u64 * page as u64;
        let delta = (offset - start) as usize;
        let mapped_len = delta + len as usize;
        let map = |flags: libc::c_int| {
            // SAFETY: a fresh mapping (no fixed address) of a descriptor we
            // own; the result is checked against MAP_FAILED.
            let base = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    mapped_len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    flags,
                    fd,
                    start as libc::off_t,
                )
            };
            if base == libc::MAP_FAILED {
                Err(io::Error::last_os_error())
            } else {
                Ok(base as *mut u8)
            }
        };
        let (base, method) = match sync_mapping(&map) {
            Some((base, instruction)) => (base, PersistMethod::CacheLineWriteBack(instruction)),
            None => (map(libc::MAP_SHARED)?, PersistMethod::Msync),
        };
        Ok(FileMapping {
            base,
            mapped_len,
            delta,
            len,
            page,
            method,
        })
    }
}

/// A `MAP_SYNC` mapping and the write-back instruction to use, where the
/// filesystem offers DAX and the CPU a cache-line write-back.
#[cfg(target_arch = "x86_64")]
fn sync_mapping(
    map: &dyn Fn(libc::c_int) -> io::Result<*mut u8>,
) -> Option<(*mut u8, &'static str)> {
    let instruction = write_back_instruction();
    // EOPNOTSUPP (no DAX) or EINVAL (an old kernel): the msync fallback.
    let base = map(libc::MAP_SHARED_VALIDATE | libc::MAP_SYNC).ok()?;
    Some((base, instruction))
}

#[cfg(not(target_arch = "x86_64"))]
fn sync_mapping(
    _map: &dyn Fn(libc::c_int) -> io::Result<*mut u8>,
) -> Option<(*mut u8, &'static str)> {
    None
}

/// CPUID leaf 7: EBX bit 24 is CLWB, bit 23 CLFLUSHOPT; CLFLUSH is in
/// every x86-64.
#[cfg(target_arch = "x86_64")]
fn write_back_instruction() -> &'static str {
    // CPUID exists on every x86-64 processor (a safe intrinsic).
    let leaf = core::arch::x86_64::__cpuid_count(7, 0);
    if leaf.ebx & (1 << 24) != 0 {
        "clwb"
    } else if leaf.ebx & (1 << 23) != 0 {
        "clflushopt"
    } else {
        "clflush"
    }
}

/// Write back the line at `line` with `instruction`.
///
/// # Safety
/// `line` must point into a live mapping.
#[cfg(target_arch = "x86_64")]
unsafe fn write_back(instruction: &str, line: *const u8) {
    // SAFETY: the caller's pointer is valid; these instructions only
    // write the line back (clwb may keep it cached), they change no memory.
    unsafe {
        match instruction {
            "clwb" => {
                core::arch::asm!("clwb [{0}]", in(reg) line, options(nostack, preserves_flags))
            }
            "clflushopt" => {
                core::arch::asm!("clflushopt [{0}]", in(reg) line, options(nostack, preserves_flags))
            }
            _ => core::arch::x86_64::_mm_clflush(line),
        }
    }
}

impl PersistentMemory for FileMapping {
    fn len(&self) -> u64 {
        self.len
    }

    fn method(&self) -> PersistMethod {
        self.method
    }

    fn store(&self, offset: u64, bytes: &[u8]) -> io::Result<()> {
        check_lines(offset, bytes.len() as u64, self.len)?;
        // SAFETY: the range was checked to lie inside the mapping, which
        // lives as long as `self`; `bytes` cannot overlap it (it is ours).
        unsafe {
            std::ptr::copy_nonoverlapping(
                bytes.as_ptr(),
                self.base.add(self.delta + offset as usize),
                bytes.len(),
            );
        }
        Ok(())
    }

    fn persist(&self, offset: u64, len: u64) -> io::Result<()> {
        check_lines(offset, len, self.len)?;
        let start = self.delta + offset as usize;
        match self.method {
            #[cfg(target_arch = "x86_64")]
            PersistMethod::CacheLineWriteBack(instruction) => {
                for at in (start..start + len as usize).step_by(CACHE_LINE as usize) {
                    // SAFETY: `at` lies inside the mapping (checked above).
                    unsafe { write_back(instruction, self.base.add(at)) };
                }
                // SAFETY: a store fence has no preconditions.
                unsafe { core::arch::x86_64::_mm_sfence() };
                Ok(())
            }
            _ => {
                let first_page = start / self.page * self.page;
                let end = start + len as usize;
                // SAFETY: msync over pages of our own mapping.
                let rc = unsafe {
                    libc::msync(
                        self.base.add(first_page) as *mut libc::c_void,
                        end - first_page,
                        libc::MS_SYNC,
                    )
                };
                if rc != 0 {
                    return Err(io::Error::last_os_error());
                }
                Ok(())
            }
        }
    }
}

impl Drop for FileMapping {
    fn drop(&mut self) {
        // SAFETY: unmapping the mapping this value owns, once.
        unsafe { libc::munmap(self.base as *mut libc::c_void, self.mapped_len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::FileExt;
    use std::os::unix::io::AsRawFd;

    #[test]
    fn a_file_mapping_stores_what_the_file_then_reads() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("image");
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        file.set_len(64 << 10).unwrap();
        // An offset that is not a page boundary.
        let mapping = FileMapping::new(file.as_raw_fd(), 5 * 1024, 8 * 1024).unwrap();
        assert_eq!(mapping.len(), 8 * 1024);
        mapping.store(128, &[0xAB; 128]).unwrap();
        mapping.persist(128, 128).unwrap();
        let mut back = [0u8; 128];
        file.read_exact_at(&mut back, 5 * 1024 + 128).unwrap();
        assert_eq!(back, [0xAB; 128]);
        assert!(mapping.store(8 * 1024 - 64, &[1; 128]).is_err());
    }

    /// The write-back instructions run (no DAX here: on an ordinary shared
    /// mapping they write lines back to the page cache, which is enough to
    /// show they are encoded right and fence correctly).
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn every_write_back_instruction_the_cpu_has_runs() {
        let dir = tempfile::tempdir().unwrap();
        let file = tempfile::tempfile_in(dir.path()).unwrap();
        file.set_len(16 << 10).unwrap();
        let leaf = core::arch::x86_64::__cpuid_count(7, 0);
        let mut instructions = vec!["clflush"];
        if leaf.ebx & (1 << 23) != 0 {
            instructions.push("clflushopt");
        }
        if leaf.ebx & (1 << 24) != 0 {
            instructions.push("clwb");
        }
        assert!(instructions.contains(&write_back_instruction()));
        for (index, instruction) in instructions.into_iter().enumerate() {
            let mut mapping = FileMapping::new(file.as_raw_fd(), 4096, 8192).unwrap();
            mapping.method = PersistMethod::CacheLineWriteBack(instruction);
            let byte = 0x10 + index as u8;
            mapping.store(192, &[byte; 256]).unwrap();
            mapping.persist(192, 256).unwrap();
            let mut back = [0u8; 256];
            file.read_exact_at(&mut back, 4096 + 192).unwrap();
            assert_eq!(back, [byte; 256], "{instruction}");
        }
    }
}
