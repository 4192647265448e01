//! The log block builders of `journal::format` (what the writer will use)
//! make journals that e2fsck replays: a journal is written with them into a
//! mke2fs image, for every checksum and tag layout, and replayed by
//! `e2fsck -E journal_only` and by jext4, with the same result and the
//! expected blocks at home.

mod common;

use common::journal::*;
use jext4::engine::format::superblock::incompat as fs_incompat;
use jext4::engine::journal::format::{
    DescriptorBuilder, JournalSuperblock, LogFormat, checksum_type, compat, crc32_be,
    encode_commit_block, encode_revoke_blocks, incompat,
};
use jext4::engine::journal::recovery::JournalArea;
use std::path::Path;

/// Writes log blocks one after another from `s_first`.
struct LogWriter<'a> {
    area: &'a JournalArea,
    format: LogFormat,
    uuid: [u8; 16],
    next: u64,
    commit_sec: u64,
}

impl LogWriter<'_> {
    fn put(&mut self, block: &[u8]) {
        let offset = self.area.blocks[self.next as usize] * self.area.fs_block_size as u64;
        self.area.dev.write_at(offset, block).unwrap();
        self.next += 1;
    }

    /// A transaction logging `writes` (home, content), revoking `revokes`,
    /// committed or not.
    fn transaction(&mut self, tid: u32, writes: &[(u64, Vec<u8>)], revokes: &[u64], commit: bool) {
        let mut crc = !0u32;
        let mut pending = writes.iter().peekable();
        while pending.peek().is_some() {
            let mut descriptor = DescriptorBuilder::new(&self.format, tid, self.uuid);
            let mut logged = Vec::new();
            while !descriptor.is_full() {
                let Some((home, content)) = pending.next() else {
                    break;
                };
                let mut copy = content.clone();
                descriptor.add(*home, &mut copy);
                logged.push(copy);
            }
            let descriptor = descriptor.finish();
            crc = crc32_be(crc, &descriptor);
            self.put(&descriptor);
            for copy in logged {
                crc = crc32_be(crc, &copy);
                self.put(&copy);
            }
        }
        for block in encode_revoke_blocks(&self.format, tid, revokes) {
            self.put(&block);
        }
        if commit {
            self.commit_sec += 5;
            let block = encode_commit_block(&self.format, tid, self.commit_sec, 7, crc);
            self.put(&block);
        }
    }
}

fn content(block_size: usize, seed: u64, magic: bool) -> Vec<u8> {
    let mut bytes: Vec<u8> = (0..block_size)
        .map(|i| (i as u64 * 7 + seed) as u8)
        .collect();
    if magic {
        bytes[..4].copy_from_slice(&0xC03B_3998u32.to_be_bytes());
    }
    bytes
}

/// Write a four-transaction journal with the builders into `image`
/// (features as given), set needs_recovery, and return the expected home
/// contents.
fn build_journal(
    image: &Path,
    compat_features: u32,
    incompat_features: u32,
) -> Vec<(u64, Vec<u8>)> {
    let area = file_area(image);
    let block_size = area.fs_block_size as usize;
    let mut superblock = JournalSuperblock::decode(&area.read_block(0).unwrap()).unwrap();
    superblock.feature_compat = compat_features;
    superblock.feature_incompat = incompat_features;
    superblock.checksum_type = if incompat_features & (incompat::CSUM_V2 | incompat::CSUM_V3) != 0 {
        checksum_type::CRC32C
    } else {
        0
    };
    superblock.sequence = 0xFFFF_FFFE; // the tids wrap inside this log
    superblock.start = superblock.first;
    let free = free_blocks(image, 200, 1500);
    let mut writer = LogWriter {
        area: &area,
        format: superblock.log_format(),
        uuid: superblock.uuid,
        next: superblock.first as u64,
        commit_sec: 1_700_000_000,
    };
    let first: Vec<(u64, Vec<u8>)> = free[..150]
        .iter()
        .enumerate()
        .map(|(i, &home)| (home, content(block_size, i as u64, i % 17 == 0)))
        .collect();
    let tid = superblock.sequence;
    writer.transaction(tid, &first, &[], true);
    writer.transaction(tid.wrapping_add(1), &[], &free[..40], true);
    let rewrite = vec![(free[0], content(block_size, 999, true))];
    writer.transaction(tid.wrapping_add(2), &rewrite, &[], true);
    let lost = vec![(free[160], content(block_size, 5, false))];
    writer.transaction(tid.wrapping_add(3), &lost, &[], false);
    area.dev
        .write_at(area.blocks[0] * block_size as u64, superblock.encode())
        .unwrap();
    let mut fs = fs_superblock(image);
    fs.feature_incompat |= fs_incompat::RECOVER;
    area.dev.write_at(1024, fs.encode()).unwrap();
    area.dev.flush().unwrap();
    let mut expected = rewrite;
    expected.extend(first[40..].iter().cloned());
    expected
}

#[test]
fn journals_built_with_the_format_builders_replay_under_e2fsck() {
    if !common::require_tool("debugfs") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let revoke = incompat::REVOKE;
    let layouts: &[(&str, &[&str], u32, u32)] = &[
        ("plain-32", &["-t", "ext3", "-b", "1024"], 0, revoke),
        (
            "v1-32",
            &["-t", "ext3", "-b", "1024"],
            compat::CHECKSUM,
            revoke,
        ),
        (
            "plain-64",
            &["-t", "ext4", "-b", "4096"],
            0,
            revoke | incompat::BIT64,
        ),
        (
            "v2-32",
            &["-t", "ext4", "-b", "1024"],
            0,
            revoke | incompat::CSUM_V2,
        ),
        (
            "v2-64",
            &["-t", "ext4", "-b", "1024"],
            0,
            revoke | incompat::CSUM_V2 | incompat::BIT64,
        ),
        (
            "v3-32",
            &["-t", "ext4", "-b", "4096"],
            0,
            revoke | incompat::CSUM_V3,
        ),
        (
            "v3-64",
            &["-t", "ext4", "-b", "1024"],
            0,
            revoke | incompat::CSUM_V3 | incompat::BIT64,
        ),
    ];
    for (name, mkfs, compat_features, incompat_features) in layouts {
        let image = common::mkfs(dir.path(), name, 16, mkfs);
        let expected = build_journal(&image, *compat_features, *incompat_features);
        let (report, ours) = recover_both(&image);
        assert_eq!(report.problem, None, "{name}");
        assert_eq!(report.failed_commit, None, "{name}");
        assert_eq!(report.transactions_replayed, 3, "{name}: {report:?}");
        assert_eq!(report.end_tid, 1, "{name}: tids wrapped from 0xfffffffe");
        assert_eq!(report.blocks_replayed, 150 - 40 + 1, "{name}");
        let bytes = std::fs::read(&ours).unwrap();
        let block_size = fs_superblock(&ours).block_size() as usize;
        for (home, content) in &expected {
            let at = *home as usize * block_size;
            assert!(
                bytes[at..at + block_size] == content[..],
                "{name}: block {home}"
            );
        }
    }
}
