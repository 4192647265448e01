//! The recording in the format of Linux's dm-log-writes target, so that
//! its userspace tools (xfstests `src/log-writes/replay-log`) and ours read
//! the same logs.
//!
//! Layout, in units of `sectorsize` (512 here), all integers little-endian
//! (xfstests `src/log-writes/log-writes.h`):
//!
//! ```text
//! sector 0       log_write_super: magic u64 = 0x6a736677736872, version u64 = 1,
//!                nr_entries u64, sectorsize u32; the rest of the sector zero
//! then, for each of the nr_entries entries, in order:
//!   1 sector     log_write_entry: sector u64 (where the write lands, in
//!                sectorsize units), nr_sectors u64, flags u64, data_len u64;
//!                for a MARK, data_len bytes of text follow the 32-byte header
//!                in the same sector; the rest of the sector zero
//!   nr_sectors   the written bytes (writes only; a DISCARD carries none)
//! flags: FLUSH 1, FUA 2, DISCARD 4, MARK 8, METADATA 16
//! ```
//!
//! What we write: a `Record::Write` is an entry with flags 0 and its data;
//! a `Record::Flush` is an entry with flags FLUSH and no sectors; a
//! `Record::Sync` (a barrier over some ranges) is written as a FLUSH; a
//! `Record::Mark` is an entry with flags MARK and its text (at most 480
//! bytes). What we read besides: an entry with FLUSH and data (the kernel's
//! pre-flush write) is a flush then a write; a FUA write is a write then a
//! flush (stronger than FUA, which makes only its own write durable); a
//! DISCARD becomes a write of zeros; METADATA is ignored. A recording with
//! persistent-memory stores and fences (ByteLog) cannot be written: the
//! format has nothing finer than a sector and no fence.

use crate::dev::Record;
use std::io::{self, Read, Write};

pub const MAGIC: u64 = 0x006a_7366_7773_6872;
pub const VERSION: u64 = 1;
pub const SECTOR_SIZE: usize = 512;

pub mod flags {
    pub const FLUSH: u64 = 1 << 0;
    pub const FUA: u64 = 1 << 1;
    pub const DISCARD: u64 = 1 << 2;
    pub const MARK: u64 = 1 << 3;
    pub const METADATA: u64 = 1 << 4;
}

/// Size of `log_write_entry`: four u64.
const ENTRY_HEADER_SIZE: usize = 32;
/// Longest mark text that fits beside its header.
pub const MAX_MARK_LEN: usize = SECTOR_SIZE - ENTRY_HEADER_SIZE;
/// Bound on one entry's data when reading (a corrupt count must not make us
/// allocate without limit): 1 GiB.
const MAX_ENTRY_SECTORS: u64 = (1 << 30) / SECTOR_SIZE as u64;

fn invalid(detail: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, detail.into())
}

fn entry_header(sector: u64, nr_sectors: u64, flags: u64, data_len: u64) -> [u8; SECTOR_SIZE] {
    let mut header = [0u8; SECTOR_SIZE];
    for (index, value) in [sector, nr_sectors, flags, data_len]
        .into_iter()
        .enumerate()
    {
        header[index * 8..index * 8 + 8].copy_from_slice(&value.to_le_bytes());
    }
    header
}

fn le64(bytes: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"))
}

/// Write `records` as a dm-log-writes log.
pub fn write_log(out: &mut dyn Write, records: &[Record]) -> io::Result<()> {
    let mut superblock = [0u8; SECTOR_SIZE];
    superblock[0..8].copy_from_slice(&MAGIC.to_le_bytes());
    superblock[8..16].copy_from_slice(&VERSION.to_le_bytes());
    superblock[16..24].copy_from_slice(&(records.len() as u64).to_le_bytes());
    superblock[24..28].copy_from_slice(&(SECTOR_SIZE as u32).to_le_bytes());
    out.write_all(&superblock)?;
    for record in records {
        match record {
            Record::Write { offset, data } => {
                if offset % SECTOR_SIZE as u64 != 0 || data.len() % SECTOR_SIZE != 0 {
                    return Err(invalid(format!("unaligned write at byte {offset}")));
                }
                let sectors = (data.len() / SECTOR_SIZE) as u64;
                out.write_all(&entry_header(offset / SECTOR_SIZE as u64, sectors, 0, 0))?;
                out.write_all(data)?;
            }
            // The format has no ranged barrier: a `Sync` is written as a
            // flush, which claims more durable than it made (a reader of
            // the log tries fewer states, never impossible ones).
            Record::Flush | Record::Sync { .. } => {
                out.write_all(&entry_header(0, 0, flags::FLUSH, 0))?
            }
            Record::Store { offset, .. } | Record::Fence { offset, .. } => {
                return Err(invalid(format!(
                    "a cache-line store or fence at byte {offset} (ByteLog) has no \
                     dm-log-writes form"
                )));
            }
            Record::Mark(text) => {
                if text.len() > MAX_MARK_LEN {
                    return Err(invalid(format!("mark longer than {MAX_MARK_LEN} bytes")));
                }
                let mut header = entry_header(0, 0, flags::MARK, text.len() as u64);
                header[ENTRY_HEADER_SIZE..ENTRY_HEADER_SIZE + text.len()]
                    .copy_from_slice(text.as_bytes());
                out.write_all(&header)?;
            }
        }
    }
    out.flush()
}

/// Read a dm-log-writes log (any sector size) back into records.
pub fn read_log(input: &mut dyn Read) -> io::Result<Vec<Record>> {
    let mut start = [0u8; 28];
    input.read_exact(&mut start)?;
    if le64(&start, 0) != MAGIC {
        return Err(invalid("not a dm-log-writes log (bad magic)"));
    }
    if le64(&start, 8) != VERSION {
        return Err(invalid(format!("log version {}", le64(&start, 8))));
    }
    let entries = le64(&start, 16);
    let sector_size = u32::from_le_bytes(start[24..28].try_into().expect("4 bytes")) as usize;
    if !(SECTOR_SIZE..=65536).contains(&sector_size) || !sector_size.is_power_of_two() {
        return Err(invalid(format!("sector size {sector_size}")));
    }
    skip(input, sector_size - start.len())?;
    let mut records = Vec::new();
    let mut sector = vec![0u8; sector_size];
    for index in 0..entries {
        input.read_exact(&mut sector)?;
        read_entry(input, &sector, sector_size, &mut records)
            .map_err(|error| invalid(format!("entry {index}: {error}")))?;
    }
    Ok(records)
}

/// Decode one entry whose header sector is `header`, reading its data.
fn read_entry(
    input: &mut dyn Read,
    header: &[u8],
    sector_size: usize,
    records: &mut Vec<Record>,
) -> io::Result<()> {
    let (sector, sectors, entry_flags, data_len) = (
        le64(header, 0),
        le64(header, 8),
        le64(header, 16),
        le64(header, 24),
    );
    if sectors > MAX_ENTRY_SECTORS {
        return Err(invalid(format!("{sectors} sectors")));
    }
    let offset = sector
        .checked_mul(sector_size as u64)
        .ok_or_else(|| invalid("sector out of range"))?;
    let bytes = sectors as usize * sector_size;
    if entry_flags & flags::MARK != 0 {
        let len = data_len as usize;
        if len > sector_size - ENTRY_HEADER_SIZE {
            return Err(invalid(format!("mark of {len} bytes")));
        }
        let text = &header[ENTRY_HEADER_SIZE..ENTRY_HEADER_SIZE + len];
        records.push(Record::Mark(String::from_utf8_lossy(text).into_owned()));
        return Ok(());
    }
    if entry_flags & flags::DISCARD != 0 {
        if bytes > 0 {
            records.push(Record::Write {
                offset,
                data: vec![0; bytes],
            });
        }
        return Ok(());
    }
    if entry_flags & flags::FLUSH != 0 {
        records.push(Record::Flush);
    }
    if bytes > 0 {
        let mut data = vec![0u8; bytes];
        input.read_exact(&mut data)?;
        records.push(Record::Write { offset, data });
        if entry_flags & flags::FUA != 0 {
            records.push(Record::Flush);
        }
    }
    Ok(())
}

fn skip(input: &mut dyn Read, bytes: usize) -> io::Result<()> {
    let copied = io::copy(&mut input.take(bytes as u64), &mut io::sink())?;
    if copied != bytes as u64 {
        return Err(io::Error::from(io::ErrorKind::UnexpectedEof));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Vec<Record> {
        vec![
            Record::Mark("jext4-crashtest start".into()),
            Record::Write {
                offset: 4096,
                data: (0..4096).map(|i| i as u8).collect(),
            },
            Record::Flush,
            Record::Write {
                offset: 512,
                data: vec![9; 512],
            },
            Record::Mark("op 0 1 ack".into()),
        ]
    }

    #[test]
    fn round_trip() {
        let mut bytes = Vec::new();
        write_log(&mut bytes, &sample()).unwrap();
        // Super + 5 headers + 8 + 1 data sectors.
        assert_eq!(bytes.len(), (1 + 5 + 8 + 1) * SECTOR_SIZE);
        assert_eq!(read_log(&mut bytes.as_slice()).unwrap(), sample());
    }

    #[test]
    fn kernel_flags_are_understood() {
        let mut bytes = vec![0u8; SECTOR_SIZE];
        bytes[0..8].copy_from_slice(&MAGIC.to_le_bytes());
        bytes[8..16].copy_from_slice(&VERSION.to_le_bytes());
        bytes[16..24].copy_from_slice(&3u64.to_le_bytes());
        bytes[24..28].copy_from_slice(&512u32.to_le_bytes());
        // A pre-flush write with FUA, a discard, a metadata write.
        bytes.extend_from_slice(&entry_header(2, 1, flags::FLUSH | flags::FUA, 0));
        bytes.extend_from_slice(&[5; 512]);
        bytes.extend_from_slice(&entry_header(4, 2, flags::DISCARD, 0));
        bytes.extend_from_slice(&entry_header(8, 1, flags::METADATA, 0));
        bytes.extend_from_slice(&[6; 512]);
        let records = read_log(&mut bytes.as_slice()).unwrap();
        let write = |offset, byte, len| Record::Write {
            offset,
            data: vec![byte; len],
        };
        assert_eq!(
            records,
            vec![
                Record::Flush,
                write(1024, 5, 512),
                Record::Flush,
                write(2048, 0, 1024),
                write(4096, 6, 512),
            ]
        );
    }

    #[test]
    fn damage_is_an_error_not_a_panic() {
        let mut bytes = Vec::new();
        write_log(&mut bytes, &sample()).unwrap();
        for cut in [0, 27, 600, bytes.len() - 1] {
            assert!(read_log(&mut &bytes[..cut]).is_err(), "cut at {cut}");
        }
        let mut huge = bytes.clone();
        // The first entry's nr_sectors.
        huge[SECTOR_SIZE + 8..SECTOR_SIZE + 16].copy_from_slice(&u64::MAX.to_le_bytes());
        huge[SECTOR_SIZE + 16..SECTOR_SIZE + 24].copy_from_slice(&0u64.to_le_bytes());
        assert!(read_log(&mut huge.as_slice()).is_err());
        let mut bad_magic = bytes;
        bad_magic[0] ^= 1;
        assert!(read_log(&mut bad_magic.as_slice()).is_err());
    }
}
