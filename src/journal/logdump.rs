//! `jext4 logdump`: print the journal — its superblock, then every block of
//! the log from `s_start` with the tags, revoke records and commit records
//! it holds — in the spirit of `debugfs -R logdump`.
//!
//! The walk follows the log the way recovery's scan does (same wrap, same
//! end conditions: no magic, an unexpected tid, an unknown block type) but
//! never stops on a bad checksum: it prints whether each checksum matches,
//! so that a damaged journal can be looked at. Like every walk over on-disk
//! data it is bounded by the journal size. Then the fast-commit area: its
//! records, decoded, with whether each TAIL's CRC matches.

use super::format::{
    BlockHeader, CommitBlock, JournalSuperblock, LogFormat, LogLayout, block_type, checksum_type,
    compat, descriptor_tags, fast_commit_head_tid, incompat, revoke_count, revoke_records,
    tag_flag, verify_block_tail, verify_commit_block, verify_data_block,
};
use super::recovery::JournalArea;
use crate::error::Result;
use crate::format::bytelog::{Anchor, read_window};
use crate::format::fast_commit::{Record, area_records};
use std::io::Write;

/// Print the journal of `area` to `out`. Fails (after printing what it
/// could) when the journal superblock is unusable.
pub fn logdump(area: &JournalArea, out: &mut dyn Write) -> Result<()> {
    let block = area.read_superblock_block()?;
    let superblock = JournalSuperblock::decode(&block)?;
    print_superblock(&superblock, out)?;
    let layout = match superblock.check(area.fs_block_size, area.blocks.len() as u64) {
        Ok(layout) => layout,
        Err(error) => {
            writeln!(out, "Journal superblock is unusable: {error}")?;
            return Err(error);
        }
    };
    let format = superblock.log_format();
    let dump = Dump {
        area,
        format: &format,
        layout,
    };
    if superblock.start == 0 {
        writeln!(
            out,
            "Journal is empty (s_start 0); next transaction {}",
            superblock.sequence
        )?;
    } else {
        dump.walk(superblock.start as u64, superblock.sequence, out)?;
    }
    dump.fast_commit_area(out)
}

fn print_superblock(superblock: &JournalSuperblock, out: &mut dyn Write) -> Result<()> {
    writeln!(out, "Journal superblock (version {}):", superblock.version)?;
    writeln!(
        out,
        "  block size {}, {} blocks, log from block {}",
        superblock.block_size, superblock.max_len, superblock.first
    )?;
    writeln!(
        out,
        "  sequence {}, start {}, errno {}",
        superblock.sequence, superblock.start, superblock.errno
    )?;
    writeln!(
        out,
        "  features: compat {:#x} ({}), incompat {:#x} ({}), ro_compat {:#x}",
        superblock.compat(),
        feature_names(superblock.compat(), COMPAT_NAMES),
        superblock.incompat(),
        feature_names(superblock.incompat(), INCOMPAT_NAMES),
        superblock.ro_compat()
    )?;
    writeln!(out, "  uuid {}", hex(&superblock.uuid))?;
    if superblock.has_csum_v2or3() {
        let kind = if superblock.checksum_type == checksum_type::CRC32C {
            "crc32c".to_string()
        } else {
            format!("type {}", superblock.checksum_type)
        };
        writeln!(
            out,
            "  checksum {kind} {:#010x} ({})",
            superblock.stored_checksum(),
            verdict(superblock.checksum_matches())
        )?;
    }
    if superblock.incompat() & incompat::FAST_COMMIT != 0 {
        writeln!(
            out,
            "  fast-commit blocks {}",
            superblock.fast_commit_blocks()
        )?;
    }
    Ok(())
}

const COMPAT_NAMES: &[(u32, &str)] = &[(compat::CHECKSUM, "checksum")];
const INCOMPAT_NAMES: &[(u32, &str)] = &[
    (incompat::REVOKE, "revoke"),
    (incompat::BIT64, "64bit"),
    (incompat::ASYNC_COMMIT, "async_commit"),
    (incompat::CSUM_V2, "checksum_v2"),
    (incompat::CSUM_V3, "checksum_v3"),
    (incompat::FAST_COMMIT, "fast_commit"),
];

fn feature_names(bits: u32, names: &[(u32, &str)]) -> String {
    let mut listed: Vec<String> = names
        .iter()
        .filter(|(mask, _)| bits & mask != 0)
        .map(|(_, name)| name.to_string())
        .collect();
    let unknown = names.iter().fold(bits, |rest, (mask, _)| rest & !mask);
    if unknown != 0 {
        listed.push(format!("unknown {unknown:#x}"));
    }
    listed.join(" ")
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

fn verdict(good: bool) -> &'static str {
    if good { "ok" } else { "BAD" }
}

struct Dump<'a> {
    area: &'a JournalArea,
    format: &'a LogFormat,
    layout: LogLayout,
}

impl Dump<'_> {
    /// The kernel's single-subtraction wrap.
    fn wrap(&self, index: u64) -> u64 {
        let (first, last) = (self.layout.first as u64, self.layout.last as u64);
        if index >= last {
            index - (last - first)
        } else {
            index
        }
    }

    fn read(&self, index: u64) -> Result<Option<Vec<u8>>> {
        if index >= self.layout.total as u64 {
            return Ok(None);
        }
        self.area.read_block(index).map(Some)
    }

    fn walk(&self, start: u64, first_tid: u32, out: &mut dyn Write) -> Result<()> {
        writeln!(
            out,
            "Journal starts at block {start}, transaction {first_tid}"
        )?;
        let mut index = start;
        let mut tid = first_tid;
        for _ in 0..=self.layout.total {
            let Some(block) = self.read(index)? else {
                writeln!(out, "Block {index} is outside the journal: end of journal.")?;
                return Ok(());
            };
            let Some(header) = BlockHeader::decode(&block) else {
                writeln!(out, "No magic number at block {index}: end of journal.")?;
                return Ok(());
            };
            if header.sequence != tid {
                writeln!(
                    out,
                    "Found sequence {} (not {tid}) at block {index}: end of journal.",
                    header.sequence
                )?;
                return Ok(());
            }
            index = match header.block_type {
                block_type::DESCRIPTOR => self.descriptor(index, tid, &block, out)?,
                block_type::REVOKE => self.revoke(index, tid, &block, out)?,
                block_type::COMMIT => {
                    self.commit(index, &block, out)?;
                    tid = tid.wrapping_add(1);
                    self.wrap(index + 1)
                }
                other => {
                    writeln!(out, "Unexpected block type {other} at block {index}.")?;
                    return Ok(());
                }
            };
        }
        writeln!(out, "The log is longer than the journal: stopped.")?;
        Ok(())
    }

    /// Print a descriptor and its tags; returns the position after the
    /// blocks it describes.
    fn descriptor(&self, index: u64, tid: u32, block: &[u8], out: &mut dyn Write) -> Result<u64> {
        let tail = if self.format.has_csum_v2or3() {
            format!(
                " (checksum {})",
                verdict(verify_block_tail(self.format, block))
            )
        } else {
            String::new()
        };
        writeln!(out, "Block {index}: descriptor, transaction {tid}{tail}")?;
        let mut next = self.wrap(index + 1);
        for tag in descriptor_tags(self.format, block) {
            let logged_at = next;
            next = self.wrap(next + 1);
            let checksum = match self.read(logged_at)? {
                Some(data) if self.format.has_csum_v2or3() => {
                    format!(
                        ", checksum {}",
                        verdict(verify_data_block(self.format, &tag, tid, &data))
                    )
                }
                Some(_) => String::new(),
                None => ", outside the journal".to_string(),
            };
            writeln!(
                out,
                "  FS block {} logged at journal block {logged_at} (flags {:#x}{}){checksum}",
                tag.fs_block,
                tag.flags,
                flag_names(tag.flags)
            )?;
        }
        Ok(next)
    }

    fn revoke(&self, index: u64, tid: u32, block: &[u8], out: &mut dyn Write) -> Result<u64> {
        let tail = if self.format.has_csum_v2or3() {
            format!(
                ", checksum {}",
                verdict(verify_block_tail(self.format, block))
            )
        } else {
            String::new()
        };
        match revoke_records(self.format, block) {
            Some(records) => {
                writeln!(
                    out,
                    "Block {index}: revoke, transaction {tid}, {} records{tail}",
                    records.len()
                )?;
                for record in records {
                    writeln!(out, "  Revoke FS block {record}")?;
                }
            }
            None => writeln!(
                out,
                "Block {index}: revoke, transaction {tid}, invalid r_count {}{tail}",
                revoke_count(block)
            )?,
        }
        Ok(self.wrap(index + 1))
    }

    fn commit(&self, index: u64, block: &[u8], out: &mut dyn Write) -> Result<()> {
        let commit = CommitBlock::decode(block);
        let checksum = if self.format.has_csum_v2or3() {
            format!(
                ", checksum {}",
                verdict(verify_commit_block(self.format, block))
            )
        } else if self.format.has_checksum_v1() {
            format!(
                ", crc32 type {} size {} value {:#010x}",
                commit.checksum_type, commit.checksum_size, commit.checksum
            )
        } else {
            String::new()
        };
        writeln!(
            out,
            "Block {index}: commit, transaction {}, time {}.{:09}{checksum}",
            commit.sequence, commit.commit_sec, commit.commit_nsec
        )?;
        Ok(())
    }

    /// The area's header line, then (when it opens with a HEAD) every
    /// record up to the first that does not decode: the fast commits of
    /// the HEAD's transaction, and whatever older ones follow them.
    fn fast_commit_area(&self, out: &mut dyn Write) -> Result<()> {
        let Some((first, end)) = self.layout.fast_commit else {
            return Ok(());
        };
        let head = if first < end {
            fast_commit_head_tid(&self.area.read_block(first as u64)?)
        } else {
            None
        };
        let Some(head_tid) = head else {
            writeln!(out, "Fast-commit area: blocks {first}..{end}, no records")?;
            return Ok(());
        };
        writeln!(
            out,
            "Fast-commit area: blocks {first}..{end}, head for transaction {head_tid}"
        )?;
        let blocks = (first..end)
            .map(|index| self.area.read_block(index as u64))
            .collect::<Result<Vec<_>>>()?;
        // INODE records are at most an inode; the journal does not know
        // the filesystem's inode size, a block bounds it.
        let inode_size = self.format.block_size.min(u16::MAX as usize) as u16;
        for entry in area_records(&blocks, inode_size) {
            if entry.record == Record::Pad {
                continue;
            }
            let check = match entry.crc_ok {
                Some(true) => ", crc ok",
                Some(false) => ", crc BAD",
                None => "",
            };
            writeln!(
                out,
                "  Block {} +{}: {}{check}",
                first + entry.block,
                entry.offset,
                entry.record
            )?;
            if let Record::Anchor(anchor) = &entry.record {
                list_window(out, &blocks, anchor, head_tid, inode_size)?;
            }
        }
        Ok(())
    }
}

/// The records of a ByteLog window (`blocks`: the fast-commit area), or
/// why replay would refuse it.
fn list_window(
    out: &mut dyn Write,
    blocks: &[Vec<u8>],
    anchor: &Anchor,
    tid: u32,
    inode_size: u16,
) -> Result<()> {
    let ring: Vec<u8> = blocks
        .get(anchor.ring_block as usize..)
        .unwrap_or_default()
        .concat();
    let window = ring.get(anchor.head as usize..anchor.tail as usize);
    let records = match window {
        Some(window) => read_window(window, anchor, tid, inode_size),
        None => Err("window outside the area".to_string()),
    };
    match records {
        Ok(records) => {
            for record in records {
                writeln!(out, "      ring: {record}")?;
            }
        }
        Err(why) => writeln!(out, "      ring: refused for transaction {tid}: {why}")?,
    }
    Ok(())
}

fn flag_names(flags: u16) -> String {
    let names = [
        (tag_flag::ESCAPE, "escape"),
        (tag_flag::SAME_UUID, "same_uuid"),
        (tag_flag::DELETED, "deleted"),
        (tag_flag::LAST_TAG, "last_tag"),
    ];
    names
        .iter()
        .filter(|(mask, _)| flags & mask != 0)
        .map(|(_, name)| format!(" {name}"))
        .collect::<Vec<_>>()
        .concat()
}
