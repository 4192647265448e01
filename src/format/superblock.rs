//! The superblock (1024 bytes at byte 1024), its feature flags, and the
//! geometry derived from it.
//!
//! `Superblock` keeps the raw bytes it was decoded from, so that fields this
//! crate does not interpret (error records, quota inodes, encryption salt)
//! survive a rewrite bit for bit; `encode` writes back only the fields we
//! change, then the checksum.

use super::casefold;
use super::csum::{self, crc32c_raw};
use super::{get_u8, get_u16, get_u32, get_u64, put_u16, put_u32, put_u64};
use crate::ensure_format;
use crate::error::{Error, Location, Result};

pub const SUPERBLOCK_OFFSET: u64 = 1024;
/// The unit of the kernel's `sb=` mount option and of `s_sb_block`: a
/// superblock's byte offset over 1 KiB, whatever the filesystem's block size
/// (fs/ext4/super.c, `ext4_load_super`: `s_sb_block * EXT4_MIN_BLOCK_SIZE`).
pub const SB_OPTION_UNIT: u64 = 1024;
/// `sb=1`, the kernel's default: the primary superblock.
pub const PRIMARY_SB_OPTION: u64 = SUPERBLOCK_OFFSET / SB_OPTION_UNIT;
pub const SUPERBLOCK_SIZE: usize = 1024;
pub const EXT4_MAGIC: u16 = 0xEF53;

pub const ROOT_INO: u32 = 2;
pub const RESIZE_INO: u32 = 7;
pub const JOURNAL_INO: u32 = 8;
pub const GOOD_OLD_FIRST_INO: u32 = 11;
pub const GOOD_OLD_INODE_SIZE: u16 = 128;

/// `s_state` bits.
pub const STATE_VALID: u16 = 0x0001;
pub const STATE_ERROR: u16 = 0x0002;
pub const STATE_ORPHANS: u16 = 0x0004;

/// `s_flags` bits: which directory hash variant the creator's `char` used.
pub const FLAGS_SIGNED_HASH: u32 = 0x0001;
pub const FLAGS_UNSIGNED_HASH: u32 = 0x0002;

/// `s_default_mount_opts` bits (EXT4_DEFM_*) jext4 honours.
pub mod default_mount {
    /// The data journaling mode's two bits (EXT4_DEFM_JMODE).
    pub const JMODE: u32 = 0x0060;
    /// data=journal (EXT4_DEFM_JMODE_DATA); 0x0040 is ordered and 0x0060
    /// writeback.
    pub const JMODE_DATA: u32 = 0x0020;
}

pub mod compat {
    pub const DIR_PREALLOC: u32 = 0x0001;
    pub const IMAGIC_INODES: u32 = 0x0002;
    pub const HAS_JOURNAL: u32 = 0x0004;
    pub const EXT_ATTR: u32 = 0x0008;
    pub const RESIZE_INODE: u32 = 0x0010;
    pub const DIR_INDEX: u32 = 0x0020;
    pub const SPARSE_SUPER2: u32 = 0x0200;
    pub const FAST_COMMIT: u32 = 0x0400;
    pub const STABLE_INODES: u32 = 0x0800;
    pub const ORPHAN_FILE: u32 = 0x1000;
}

pub mod ro_compat {
    pub const SPARSE_SUPER: u32 = 0x0001;
    pub const LARGE_FILE: u32 = 0x0002;
    pub const BTREE_DIR: u32 = 0x0004;
    pub const HUGE_FILE: u32 = 0x0008;
    pub const GDT_CSUM: u32 = 0x0010;
    pub const DIR_NLINK: u32 = 0x0020;
    pub const EXTRA_ISIZE: u32 = 0x0040;
    pub const HAS_SNAPSHOT: u32 = 0x0080;
    pub const QUOTA: u32 = 0x0100;
    pub const BIGALLOC: u32 = 0x0200;
    pub const METADATA_CSUM: u32 = 0x0400;
    pub const REPLICA: u32 = 0x0800;
    pub const READONLY: u32 = 0x1000;
    pub const PROJECT: u32 = 0x2000;
    pub const SHARED_BLOCKS: u32 = 0x4000;
    pub const VERITY: u32 = 0x8000;
    pub const ORPHAN_PRESENT: u32 = 0x10000;
}

pub mod incompat {
    pub const COMPRESSION: u32 = 0x0001;
    pub const FILETYPE: u32 = 0x0002;
    pub const RECOVER: u32 = 0x0004;
    pub const JOURNAL_DEV: u32 = 0x0008;
    pub const META_BG: u32 = 0x0010;
    pub const EXTENTS: u32 = 0x0040;
    pub const BIT64: u32 = 0x0080;
    pub const MMP: u32 = 0x0100;
    pub const FLEX_BG: u32 = 0x0200;
    pub const EA_INODE: u32 = 0x0400;
    pub const DIRDATA: u32 = 0x1000;
    pub const CSUM_SEED: u32 = 0x2000;
    pub const LARGEDIR: u32 = 0x4000;
    pub const INLINE_DATA: u32 = 0x8000;
    pub const ENCRYPT: u32 = 0x10000;
    pub const CASEFOLD: u32 = 0x20000;
    /// jext4's ByteLog (docs/durability.md, "ByteLog"): set while a `-o bytelog` mount
    /// is live or its fast commits await replay, cleared by a clean
    /// unmount and by recovery. The kernel and e2fsck know no such bit and
    /// refuse the image meanwhile — as they must: they cannot replay the
    /// ring. (The RFC's INCOMPAT_DAX_FC_BYTELOG has no published value; the
    /// highest bit keeps clear of the ones the kernel hands out in order.)
    pub const BYTELOG: u32 = 0x8000_0000;
}

/// INCOMPAT features this build reads and writes. `RECOVER` is handled
/// separately (it means "journal needs replay", not a format change).
pub const INCOMPAT_SUPPORTED: u32 = incompat::FILETYPE
    | incompat::RECOVER
    | incompat::EXTENTS
    | incompat::BIT64
    | incompat::FLEX_BG
    | incompat::META_BG
    | incompat::MMP
    | incompat::CSUM_SEED
    | incompat::LARGEDIR
    | incompat::EA_INODE
    | incompat::INLINE_DATA
    | incompat::CASEFOLD
    | incompat::ENCRYPT
    | incompat::BYTELOG;

/// RO_COMPAT features this build keeps consistent when writing. Any other
/// bit allows read-only mounts only.
pub const RO_COMPAT_SUPPORTED: u32 = ro_compat::SPARSE_SUPER
    | ro_compat::LARGE_FILE
    | ro_compat::HUGE_FILE
    | ro_compat::GDT_CSUM
    | ro_compat::DIR_NLINK
    | ro_compat::EXTRA_ISIZE
    | ro_compat::METADATA_CSUM
    | ro_compat::ORPHAN_PRESENT
    | ro_compat::PROJECT
    | ro_compat::QUOTA
    | ro_compat::BIGALLOC
    | ro_compat::VERITY;

fn feature_names(kind: &str, bits: u32) -> Vec<String> {
    let table: &[(u32, &str)] = match kind {
        "compat" => &[
            (compat::DIR_PREALLOC, "dir_prealloc"),
            (compat::IMAGIC_INODES, "imagic_inodes"),
            (compat::HAS_JOURNAL, "has_journal"),
            (compat::EXT_ATTR, "ext_attr"),
            (compat::RESIZE_INODE, "resize_inode"),
            (compat::DIR_INDEX, "dir_index"),
            (compat::SPARSE_SUPER2, "sparse_super2"),
            (compat::FAST_COMMIT, "fast_commit"),
            (compat::STABLE_INODES, "stable_inodes"),
            (compat::ORPHAN_FILE, "orphan_file"),
        ],
        "incompat" => &[
            (incompat::COMPRESSION, "compression"),
            (incompat::FILETYPE, "filetype"),
            (incompat::RECOVER, "needs_recovery"),
            (incompat::JOURNAL_DEV, "journal_dev"),
            (incompat::META_BG, "meta_bg"),
            (incompat::EXTENTS, "extent"),
            (incompat::BIT64, "64bit"),
            (incompat::MMP, "mmp"),
            (incompat::FLEX_BG, "flex_bg"),
            (incompat::EA_INODE, "ea_inode"),
            (incompat::DIRDATA, "dirdata"),
            (incompat::CSUM_SEED, "metadata_csum_seed"),
            (incompat::LARGEDIR, "large_dir"),
            (incompat::INLINE_DATA, "inline_data"),
            (incompat::ENCRYPT, "encrypt"),
            (incompat::CASEFOLD, "casefold"),
            (incompat::BYTELOG, "bytelog"),
        ],
        _ => &[
            (ro_compat::SPARSE_SUPER, "sparse_super"),
            (ro_compat::LARGE_FILE, "large_file"),
            (ro_compat::BTREE_DIR, "btree_dir"),
            (ro_compat::HUGE_FILE, "huge_file"),
            (ro_compat::GDT_CSUM, "uninit_bg"),
            (ro_compat::DIR_NLINK, "dir_nlink"),
            (ro_compat::EXTRA_ISIZE, "extra_isize"),
            (ro_compat::HAS_SNAPSHOT, "snapshot"),
            (ro_compat::QUOTA, "quota"),
            (ro_compat::BIGALLOC, "bigalloc"),
            (ro_compat::METADATA_CSUM, "metadata_csum"),
            (ro_compat::REPLICA, "replica"),
            (ro_compat::READONLY, "read-only"),
            (ro_compat::PROJECT, "project"),
            (ro_compat::SHARED_BLOCKS, "shared_blocks"),
            (ro_compat::VERITY, "verity"),
            (ro_compat::ORPHAN_PRESENT, "orphan_present"),
        ],
    };
    let mut names = Vec::new();
    for bit in 0..32 {
        let mask = 1u32 << bit;
        if bits & mask != 0 {
            match table.iter().find(|(m, _)| *m == mask) {
                Some((_, name)) => names.push((*name).to_string()),
                None => names.push(format!("{kind}_feature_{bit}")),
            }
        }
    }
    names
}

// Field offsets (ext2_fs.h, struct ext2_super_block).
const S_INODES_COUNT: usize = 0x00;
const S_BLOCKS_COUNT_LO: usize = 0x04;
const S_R_BLOCKS_COUNT_LO: usize = 0x08;
const S_FREE_BLOCKS_COUNT_LO: usize = 0x0C;
const S_FREE_INODES_COUNT: usize = 0x10;
const S_FIRST_DATA_BLOCK: usize = 0x14;
const S_LOG_BLOCK_SIZE: usize = 0x18;
const S_LOG_CLUSTER_SIZE: usize = 0x1C;
const S_BLOCKS_PER_GROUP: usize = 0x20;
const S_CLUSTERS_PER_GROUP: usize = 0x24;
const S_INODES_PER_GROUP: usize = 0x28;
const S_MTIME: usize = 0x2C;
const S_WTIME: usize = 0x30;
const S_MNT_COUNT: usize = 0x34;
const S_MAGIC: usize = 0x38;
const S_STATE: usize = 0x3A;
const S_ERRORS: usize = 0x3C;
const S_CREATOR_OS: usize = 0x48;
const S_REV_LEVEL: usize = 0x4C;
const S_DEF_RESUID: usize = 0x50;
const S_DEF_RESGID: usize = 0x52;
const S_FIRST_INO: usize = 0x54;
const S_INODE_SIZE: usize = 0x58;
const S_FEATURE_COMPAT: usize = 0x5C;
const S_FEATURE_INCOMPAT: usize = 0x60;
const S_FEATURE_RO_COMPAT: usize = 0x64;
const S_UUID: usize = 0x68;
const S_VOLUME_NAME: usize = 0x78;
const S_LAST_MOUNTED: usize = 0x88;
const S_RESERVED_GDT_BLOCKS: usize = 0xCE;
const S_JOURNAL_UUID: usize = 0xD0;
const S_JOURNAL_INUM: usize = 0xE0;
const S_JOURNAL_DEV: usize = 0xE4;
const S_LAST_ORPHAN: usize = 0xE8;
const S_HASH_SEED: usize = 0xEC;
const S_DEF_HASH_VERSION: usize = 0xFC;
const S_DESC_SIZE: usize = 0xFE;
const S_DEFAULT_MOUNT_OPTS: usize = 0x100;
const S_FIRST_META_BG: usize = 0x104;
const S_JNL_BLOCKS: usize = 0x10C;
const S_BLOCKS_COUNT_HI: usize = 0x150;
const S_R_BLOCKS_COUNT_HI: usize = 0x154;
const S_FREE_BLOCKS_HI: usize = 0x158;
const S_MIN_EXTRA_ISIZE: usize = 0x15C;
const S_WANT_EXTRA_ISIZE: usize = 0x15E;
const S_FLAGS: usize = 0x160;
const S_MMP_UPDATE_INTERVAL: usize = 0x166;
const S_MMP_BLOCK: usize = 0x168;
const S_LOG_GROUPS_PER_FLEX: usize = 0x174;
const S_CHECKSUM_TYPE: usize = 0x175;
const S_KBYTES_WRITTEN: usize = 0x178;
const S_OVERHEAD_CLUSTERS: usize = 0x248;
const S_BACKUP_BGS: usize = 0x24C;
const S_CHECKSUM_SEED: usize = 0x270;
const S_WTIME_HI: usize = 0x274;
const S_MTIME_HI: usize = 0x275;
const S_ENCODING: usize = 0x27C;
const S_ENCODING_FLAGS: usize = 0x27E;
const S_ORPHAN_FILE_INUM: usize = 0x280;
const S_USR_QUOTA_INUM: usize = 0x240;
const S_GRP_QUOTA_INUM: usize = 0x244;
const S_PRJ_QUOTA_INUM: usize = 0x26C;
// The error record (ext4.h, EXT4_S_ERR_START..EXT4_S_ERR_END, then the
// time and code bytes after s_checksum_seed).
const S_ERROR_COUNT: usize = 0x194;
const S_ERROR_FUNC_LEN: usize = 32;

/// Where one of the two error records lies (`s_first_error_*`,
/// `s_last_error_*`).
struct ErrorSlot {
    time: usize,
    time_hi: usize,
    ino: usize,
    block: usize,
    function: usize,
    line: usize,
    errcode: usize,
}

const FIRST_ERROR: ErrorSlot = ErrorSlot {
    time: 0x198,
    time_hi: 0x278,
    ino: 0x19C,
    block: 0x1A0,
    function: 0x1A8,
    line: 0x1C8,
    errcode: 0x27A,
};

const LAST_ERROR: ErrorSlot = ErrorSlot {
    time: 0x1CC,
    time_hi: 0x279,
    ino: 0x1D0,
    block: 0x1D8,
    function: 0x1E0,
    line: 0x1D4,
    errcode: 0x27B,
};

impl ErrorSlot {
    /// Write `record`, at `time` (40 bits), into this slot of `raw`.
    fn store(&self, raw: &mut [u8], record: &ErrorRecord<'_>, time: i64) {
        put_u32(raw, self.time, time as u32);
        raw[self.time_hi] = (time >> 32) as u8;
        put_u32(raw, self.ino, record.ino);
        put_u64(raw, self.block, record.block);
        let function = &mut raw[self.function..self.function + S_ERROR_FUNC_LEN];
        function.fill(0);
        let name = record.function.as_bytes();
        let kept = name.len().min(S_ERROR_FUNC_LEN);
        function[..kept].copy_from_slice(&name[..kept]);
        put_u32(raw, self.line, record.line);
        raw[self.errcode] = record.errcode;
    }
}
const S_CHECKSUM: usize = 0x3FC;

#[derive(Clone)]
pub struct Superblock {
    raw: Box<[u8; SUPERBLOCK_SIZE]>,
    /// The byte offset this copy was read from, where `write_to` puts it
    /// back: the primary's, or a backup's when mounted with `sb=` (the
    /// kernel writes its superblock to the buffer it read, `s_sbh`).
    origin: u64,
    pub inodes_count: u32,
    pub blocks_count: u64,
    pub reserved_blocks_count: u64,
    pub free_blocks_count: u64,
    pub free_inodes_count: u32,
    pub first_data_block: u32,
    pub log_block_size: u32,
    pub log_cluster_size: u32,
    pub blocks_per_group: u32,
    pub clusters_per_group: u32,
    pub inodes_per_group: u32,
    pub mount_time: i64,
    pub write_time: i64,
    pub mount_count: u16,
    pub state: u16,
    pub errors: u16,
    pub creator_os: u32,
    pub rev_level: u32,
    pub def_resuid: u16,
    pub def_resgid: u16,
    pub first_ino: u32,
    pub inode_size: u16,
    pub feature_compat: u32,
    pub feature_incompat: u32,
    pub feature_ro_compat: u32,
    pub uuid: [u8; 16],
    pub volume_name: [u8; 16],
    pub last_mounted: [u8; 64],
    pub reserved_gdt_blocks: u16,
    pub journal_uuid: [u8; 16],
    pub journal_inum: u32,
    pub journal_dev: u32,
    pub last_orphan: u32,
    pub hash_seed: [u32; 4],
    pub def_hash_version: u8,
    pub desc_size: u16,
    /// `s_default_mount_opts` (`default_mount`): what a mount without
    /// the options uses (`tune2fs -o`).
    pub default_mount_opts: u32,
    pub first_meta_bg: u32,
    pub jnl_blocks: [u32; 17],
    pub min_extra_isize: u16,
    pub want_extra_isize: u16,
    pub flags: u32,
    pub log_groups_per_flex: u8,
    pub checksum_type: u8,
    pub kbytes_written: u64,
    pub backup_bgs: [u32; 2],
    /// Clusters that never hold file data, when mke2fs recorded them
    /// (`s_overhead_clusters`; 0: not recorded).
    pub overhead_clusters: u32,
    pub checksum_seed: u32,
    pub orphan_file_inum: u32,
    /// casefold: the character encoding of casefolded directories' names
    /// (`casefold::Encoding`) and its flags.
    pub encoding: u16,
    pub encoding_flags: u16,
    /// The quota files' inodes, user, group and project (0: none).
    pub quota_inums: [u32; 3],
    /// Seconds between updates of the MMP block (`mmp` feature).
    pub mmp_update_interval: u16,
    /// The MMP block (`mmp` feature).
    pub mmp_block: u64,
}

impl std::fmt::Debug for Superblock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Superblock")
            .field("blocks_count", &self.blocks_count)
            .field("inodes_count", &self.inodes_count)
            .field("block_size", &self.block_size())
            .finish_non_exhaustive()
    }
}

fn seconds_with_hi(lo: u32, hi: u8) -> i64 {
    lo as i64 | ((hi as i64) << 32)
}

impl Superblock {
    /// Where the UUID lies on the device, and its bytes: what tells this
    /// filesystem's medium from another (`BlockDevice::expect_identity`).
    pub fn identity(&self) -> (u64, [u8; 16]) {
        (self.origin + S_UUID as u64, self.uuid)
    }

    /// The byte offset of the copy this was read from (`SUPERBLOCK_OFFSET`
    /// for the primary).
    pub fn origin(&self) -> u64 {
        self.origin
    }

    /// Decode and validate the 1024 superblock bytes. Checks what must hold
    /// before anything else can be computed from the superblock (magic,
    /// sizes, counts that other arithmetic divides by); feature support is
    /// judged separately by `check_features`.
    pub fn decode(bytes: &[u8]) -> Result<Self> {
        let location = Location::Superblock;
        ensure_format!(bytes.len() >= SUPERBLOCK_SIZE, location, "short superblock");
        let raw: Box<[u8; SUPERBLOCK_SIZE]> =
            Box::new(bytes[..SUPERBLOCK_SIZE].try_into().unwrap());
        let magic = get_u16(&raw[..], S_MAGIC);
        ensure_format!(
            magic == EXT4_MAGIC,
            location,
            "bad magic {magic:#06x} (not an ext2/3/4 filesystem)"
        );
        let incompat = get_u32(&raw[..], S_FEATURE_INCOMPAT);
        if incompat & incompat::JOURNAL_DEV != 0 {
            // mke2fs -O journal_dev: an ext4 superblock that only names the
            // journal (its JBD2 superblock follows in the next block); every
            // filesystem field is zero.
            return Err(Error::Unsupported(
                "this is an ext4 external journal device (journal_dev), not a filesystem: \
                 mount the filesystem whose journal it holds"
                    .into(),
            ));
        }
        let ro_compat = get_u32(&raw[..], S_FEATURE_RO_COMPAT);
        let bit64 = incompat & incompat::BIT64 != 0;
        let hi = |offset: usize| {
            if bit64 {
                get_u32(&raw[..], offset) as u64
            } else {
                0
            }
        };
        let rev_level = get_u32(&raw[..], S_REV_LEVEL);
        let dynamic = rev_level >= 1;
        let sb = Superblock {
            origin: SUPERBLOCK_OFFSET,
            inodes_count: get_u32(&raw[..], S_INODES_COUNT),
            blocks_count: get_u32(&raw[..], S_BLOCKS_COUNT_LO) as u64 | hi(S_BLOCKS_COUNT_HI) << 32,
            reserved_blocks_count: get_u32(&raw[..], S_R_BLOCKS_COUNT_LO) as u64
                | hi(S_R_BLOCKS_COUNT_HI) << 32,
            free_blocks_count: get_u32(&raw[..], S_FREE_BLOCKS_COUNT_LO) as u64
                | hi(S_FREE_BLOCKS_HI) << 32,
            free_inodes_count: get_u32(&raw[..], S_FREE_INODES_COUNT),
            first_data_block: get_u32(&raw[..], S_FIRST_DATA_BLOCK),
            log_block_size: get_u32(&raw[..], S_LOG_BLOCK_SIZE),
            log_cluster_size: get_u32(&raw[..], S_LOG_CLUSTER_SIZE),
            blocks_per_group: get_u32(&raw[..], S_BLOCKS_PER_GROUP),
            clusters_per_group: get_u32(&raw[..], S_CLUSTERS_PER_GROUP),
            inodes_per_group: get_u32(&raw[..], S_INODES_PER_GROUP),
            mount_time: seconds_with_hi(get_u32(&raw[..], S_MTIME), get_u8(&raw[..], S_MTIME_HI)),
            write_time: seconds_with_hi(get_u32(&raw[..], S_WTIME), get_u8(&raw[..], S_WTIME_HI)),
            mount_count: get_u16(&raw[..], S_MNT_COUNT),
            state: get_u16(&raw[..], S_STATE),
            errors: get_u16(&raw[..], S_ERRORS),
            creator_os: get_u32(&raw[..], S_CREATOR_OS),
            rev_level,
            def_resuid: get_u16(&raw[..], S_DEF_RESUID),
            def_resgid: get_u16(&raw[..], S_DEF_RESGID),
            first_ino: if dynamic {
                get_u32(&raw[..], S_FIRST_INO)
            } else {
                GOOD_OLD_FIRST_INO
            },
            inode_size: if dynamic {
                get_u16(&raw[..], S_INODE_SIZE)
            } else {
                GOOD_OLD_INODE_SIZE
            },
            feature_compat: if dynamic {
                get_u32(&raw[..], S_FEATURE_COMPAT)
            } else {
                0
            },
            feature_incompat: if dynamic { incompat } else { 0 },
            feature_ro_compat: if dynamic { ro_compat } else { 0 },
            uuid: raw[S_UUID..S_UUID + 16].try_into().unwrap(),
            volume_name: raw[S_VOLUME_NAME..S_VOLUME_NAME + 16].try_into().unwrap(),
            last_mounted: raw[S_LAST_MOUNTED..S_LAST_MOUNTED + 64].try_into().unwrap(),
            reserved_gdt_blocks: get_u16(&raw[..], S_RESERVED_GDT_BLOCKS),
            journal_uuid: raw[S_JOURNAL_UUID..S_JOURNAL_UUID + 16].try_into().unwrap(),
            journal_inum: get_u32(&raw[..], S_JOURNAL_INUM),
            journal_dev: get_u32(&raw[..], S_JOURNAL_DEV),
            last_orphan: get_u32(&raw[..], S_LAST_ORPHAN),
            hash_seed: std::array::from_fn(|i| get_u32(&raw[..], S_HASH_SEED + 4 * i)),
            def_hash_version: get_u8(&raw[..], S_DEF_HASH_VERSION),
            desc_size: get_u16(&raw[..], S_DESC_SIZE),
            default_mount_opts: get_u32(&raw[..], S_DEFAULT_MOUNT_OPTS),
            first_meta_bg: get_u32(&raw[..], S_FIRST_META_BG),
            jnl_blocks: std::array::from_fn(|i| get_u32(&raw[..], S_JNL_BLOCKS + 4 * i)),
            min_extra_isize: get_u16(&raw[..], S_MIN_EXTRA_ISIZE),
            want_extra_isize: get_u16(&raw[..], S_WANT_EXTRA_ISIZE),
            flags: get_u32(&raw[..], S_FLAGS),
            log_groups_per_flex: get_u8(&raw[..], S_LOG_GROUPS_PER_FLEX),
            checksum_type: get_u8(&raw[..], S_CHECKSUM_TYPE),
            kbytes_written: get_u64(&raw[..], S_KBYTES_WRITTEN),
            backup_bgs: [
                get_u32(&raw[..], S_BACKUP_BGS),
                get_u32(&raw[..], S_BACKUP_BGS + 4),
            ],
            overhead_clusters: get_u32(&raw[..], S_OVERHEAD_CLUSTERS),
            checksum_seed: get_u32(&raw[..], S_CHECKSUM_SEED),
            orphan_file_inum: get_u32(&raw[..], S_ORPHAN_FILE_INUM),
            encoding: get_u16(&raw[..], S_ENCODING),
            encoding_flags: get_u16(&raw[..], S_ENCODING_FLAGS),
            quota_inums: [
                get_u32(&raw[..], S_USR_QUOTA_INUM),
                get_u32(&raw[..], S_GRP_QUOTA_INUM),
                get_u32(&raw[..], S_PRJ_QUOTA_INUM),
            ],
            mmp_update_interval: get_u16(&raw[..], S_MMP_UPDATE_INTERVAL),
            mmp_block: get_u64(&raw[..], S_MMP_BLOCK),
            raw,
        };
        sb.validate()?;
        Ok(sb)
    }

    fn validate(&self) -> Result<()> {
        let location = Location::Superblock;
        ensure_format!(
            self.log_block_size <= 6,
            location,
            "block size 2^(10+{}) is out of range",
            self.log_block_size
        );
        let block_size = 1024u64 << self.log_block_size;
        self.validate_clusters(block_size)?;
        ensure_format!(
            self.inodes_per_group >= 1 && self.inodes_per_group as u64 <= 8 * block_size,
            location,
            "inodes per group {} does not fit one bitmap block",
            self.inodes_per_group
        );
        ensure_format!(
            self.inode_size >= GOOD_OLD_INODE_SIZE
                && self.inode_size.is_power_of_two()
                && self.inode_size as u64 <= block_size,
            location,
            "inode size {} is invalid",
            self.inode_size
        );
        ensure_format!(
            self.blocks_count > self.first_data_block as u64,
            location,
            "block count {} is too small",
            self.blocks_count
        );
        // mke2fs starts a bigalloc filesystem at block 0 whatever the block
        // size: cluster 0 holds the boot block and the superblock.
        let bigalloc = self.has_ro_compat(ro_compat::BIGALLOC);
        let expected_first = if block_size == 1024 && !bigalloc {
            1
        } else {
            0
        };
        ensure_format!(
            self.first_data_block == expected_first,
            location,
            "first data block {} for block size {block_size}",
            self.first_data_block
        );
        let groups = (self.blocks_count - self.first_data_block as u64)
            .div_ceil(self.blocks_per_group as u64);
        ensure_format!(
            groups * self.inodes_per_group as u64 == self.inodes_count as u64,
            location,
            "inode count {} is not {groups} groups of {}",
            self.inodes_count,
            self.inodes_per_group
        );
        ensure_format!(
            self.first_ino >= GOOD_OLD_FIRST_INO && self.first_ino < self.inodes_count,
            location,
            "first inode {} out of range",
            self.first_ino
        );
        if self.has_incompat(incompat::MMP) {
            ensure_format!(
                self.mmp_block > self.first_data_block as u64 && self.mmp_block < self.blocks_count,
                location,
                "MMP block {} is outside the filesystem",
                self.mmp_block
            );
        }
        if self.feature_incompat & incompat::BIT64 != 0 {
            ensure_format!(
                self.desc_size >= 64 && self.desc_size.is_power_of_two() && self.desc_size <= 1024,
                location,
                "group descriptor size {} is invalid",
                self.desc_size
            );
        }
        if self.has_incompat(incompat::META_BG) {
            let descriptor_blocks =
                (groups as u32).div_ceil((block_size as u32) / self.desc_size());
            // ext4_fill_super: "first meta block group too large".
            ensure_format!(
                self.first_meta_bg <= descriptor_blocks,
                location,
                "first meta block group {} is past the {descriptor_blocks} descriptor blocks",
                self.first_meta_bg
            );
        }
        if self.has_ro_compat(ro_compat::METADATA_CSUM) {
            ensure_format!(
                self.checksum_type == 1,
                location,
                "unknown checksum type {}",
                self.checksum_type
            );
            let stored = get_u32(&self.raw[..], S_CHECKSUM);
            let computed = crc32c_raw(!0, &self.raw[..S_CHECKSUM]);
            ensure_format!(
                stored == computed,
                location,
                "checksum mismatch (stored {stored:#010x}, computed {computed:#010x})"
            );
        }
        Ok(())
    }

    /// The group sizes in blocks and in clusters, as ext4_fill_super checks
    /// them: one bitmap block holds a bit per cluster of a group, and with
    /// bigalloc a group's blocks are its clusters times the cluster ratio.
    fn validate_clusters(&self, block_size: u64) -> Result<()> {
        let location = Location::Superblock;
        let bigalloc = self.has_ro_compat(ro_compat::BIGALLOC);
        let bitmap_bits = if bigalloc {
            // EXT4_MAX_CLUSTER_LOG_SIZE: clusters of at most 2^30 bytes.
            ensure_format!(
                self.log_cluster_size >= self.log_block_size && self.log_cluster_size <= 20,
                location,
                "cluster size 2^(10+{}) is out of range for block size {block_size}",
                self.log_cluster_size
            );
            let ratio = self.cluster_ratio() as u64;
            ensure_format!(
                self.clusters_per_group as u64 * ratio == self.blocks_per_group as u64,
                location,
                "blocks per group {} and clusters per group {} disagree",
                self.blocks_per_group,
                self.clusters_per_group
            );
            self.clusters_per_group
        } else {
            self.blocks_per_group
        };
        ensure_format!(
            bitmap_bits >= 8 && bitmap_bits as u64 <= 8 * block_size,
            location,
            "{} per group {bitmap_bits} does not fit one bitmap block",
            if bigalloc { "clusters" } else { "blocks" }
        );
        Ok(())
    }

    /// Blocks per cluster: `2^(s_log_cluster_size - s_log_block_size)` with
    /// bigalloc, else 1.
    pub fn cluster_ratio(&self) -> u32 {
        if self.has_ro_compat(ro_compat::BIGALLOC) {
            1 << self
                .log_cluster_size
                .saturating_sub(self.log_block_size)
                .min(20)
        } else {
            1
        }
    }

    /// Refuse features this build cannot handle. Returns `Ok(true)` if the
    /// filesystem may be mounted read-write, `Ok(false)` if only read-only,
    /// and an error naming the feature if not at all.
    pub fn check_features(&self) -> Result<bool> {
        let unknown_incompat = self.feature_incompat & !INCOMPAT_SUPPORTED;
        if unknown_incompat != 0 {
            let names = feature_names("incompat", unknown_incompat).join(", ");
            let hint = if unknown_incompat & incompat::JOURNAL_DEV != 0 {
                " (this is an external journal device, not a filesystem)"
            } else {
                ""
            };
            return Err(Error::Unsupported(format!(
                "filesystem uses feature {names}, which jext4 does not support{hint}"
            )));
        }
        if self.has_ro_compat(ro_compat::BIGALLOC) && !self.has_incompat(incompat::EXTENTS) {
            // ext4_check_feature_compatibility refuses the mount, as mke2fs
            // refuses to make one: a block map cannot keep clusters.
            return Err(Error::Unsupported(
                "can't support bigalloc feature without extents feature".into(),
            ));
        }
        self.casefold_encoding()?;
        Ok(self.read_only_features().is_empty())
    }

    /// With casefold, the encoding of casefolded directories' names (an
    /// unknown one is refused: its names could not be looked up).
    pub fn casefold_encoding(&self) -> Result<Option<casefold::Encoding>> {
        if !self.has_incompat(incompat::CASEFOLD) {
            return Ok(None);
        }
        casefold::Encoding::from_superblock(self.encoding, self.encoding_flags)
            .map(Some)
            .map_err(Error::Unsupported)
    }

    /// Every feature set, by the names mke2fs and dumpe2fs use: compat,
    /// then incompat, then ro_compat.
    pub fn feature_list(&self) -> Vec<String> {
        let mut names = feature_names("compat", self.feature_compat);
        names.extend(feature_names("incompat", self.feature_incompat));
        names.extend(feature_names("ro_compat", self.feature_ro_compat));
        names
    }

    /// Names of RO_COMPAT features that force a read-only mount.
    pub fn read_only_features(&self) -> Vec<String> {
        feature_names("ro_compat", self.feature_ro_compat & !RO_COMPAT_SUPPORTED)
    }

    pub fn has_compat(&self, mask: u32) -> bool {
        self.feature_compat & mask != 0
    }
    pub fn has_incompat(&self, mask: u32) -> bool {
        self.feature_incompat & mask != 0
    }
    pub fn has_ro_compat(&self, mask: u32) -> bool {
        self.feature_ro_compat & mask != 0
    }

    pub fn block_size(&self) -> u32 {
        1024 << self.log_block_size
    }

    pub fn group_count(&self) -> u32 {
        (self.blocks_count - self.first_data_block as u64).div_ceil(self.blocks_per_group as u64)
            as u32
    }

    /// Write the mutable fields back into the preserved raw bytes and
    /// recompute the checksum. Returns the 1024 bytes to store.
    pub fn encode(&mut self) -> &[u8; SUPERBLOCK_SIZE] {
        let bit64 = self.has_incompat(incompat::BIT64);
        let raw = &mut self.raw[..];
        put_u32(raw, S_FREE_BLOCKS_COUNT_LO, self.free_blocks_count as u32);
        if bit64 {
            put_u32(raw, S_FREE_BLOCKS_HI, (self.free_blocks_count >> 32) as u32);
        }
        put_u32(raw, S_FREE_INODES_COUNT, self.free_inodes_count);
        put_u32(raw, S_MTIME, self.mount_time as u32);
        raw[S_MTIME_HI] = (self.mount_time >> 32) as u8;
        put_u32(raw, S_WTIME, self.write_time as u32);
        raw[S_WTIME_HI] = (self.write_time >> 32) as u8;
        put_u16(raw, S_MNT_COUNT, self.mount_count);
        put_u16(raw, S_STATE, self.state);
        put_u32(raw, S_FEATURE_COMPAT, self.feature_compat);
        put_u32(raw, S_FEATURE_INCOMPAT, self.feature_incompat);
        put_u32(raw, S_FEATURE_RO_COMPAT, self.feature_ro_compat);
        raw[S_LAST_MOUNTED..S_LAST_MOUNTED + 64].copy_from_slice(&self.last_mounted);
        put_u32(raw, S_LAST_ORPHAN, self.last_orphan);
        put_u64(raw, S_KBYTES_WRITTEN, self.kbytes_written);
        if self.feature_ro_compat & ro_compat::METADATA_CSUM != 0 {
            let checksum = crc32c_raw(!0, &raw[..S_CHECKSUM]);
            put_u32(raw, S_CHECKSUM, checksum);
        }
        &self.raw
    }

    /// Make the journal the external device with UUID `journal_uuid` and
    /// device number `device` (as `mke2fs -J device=` and `tune2fs -J
    /// device=` record it: has_journal, no journal inode). `encode` keeps
    /// it (raw bytes).
    pub fn set_external_journal(&mut self, journal_uuid: [u8; 16], device: u32) {
        self.feature_compat |= compat::HAS_JOURNAL;
        self.journal_uuid = journal_uuid;
        self.journal_inum = 0;
        self.journal_dev = device;
        let raw = &mut self.raw[..];
        raw[S_JOURNAL_UUID..S_JOURNAL_UUID + 16].copy_from_slice(&journal_uuid);
        put_u32(raw, S_JOURNAL_INUM, 0);
        put_u32(raw, S_JOURNAL_DEV, device);
    }

    /// Count an error and record it as the last one (and the first, when
    /// none is recorded yet), as the kernel's `__save_error_info` does:
    /// what `dumpe2fs` prints under "FS Error count" and "First error".
    /// Sets the error state too. `encode` keeps the record (raw bytes).
    pub fn record_error(&mut self, record: &ErrorRecord<'_>) {
        self.state |= STATE_ERROR;
        let raw = &mut self.raw[..];
        let count = get_u32(raw, S_ERROR_COUNT);
        put_u32(raw, S_ERROR_COUNT, count.saturating_add(1));
        let time = record.time.clamp(0, (1 << 40) - 1);
        let first = get_u32(raw, FIRST_ERROR.time) == 0 && raw[FIRST_ERROR.time_hi] == 0;
        LAST_ERROR.store(raw, record, time);
        if first {
            FIRST_ERROR.store(raw, record, time);
        }
    }

    /// `s_error_count`: errors recorded since e2fsck last cleared them.
    pub fn error_count(&self) -> u32 {
        get_u32(&self.raw[..], S_ERROR_COUNT)
    }

    /// Group descriptor size in bytes (32 without the 64bit feature).
    pub fn desc_size(&self) -> u32 {
        if self.has_incompat(incompat::BIT64) {
            self.desc_size as u32
        } else {
            32
        }
    }
}

/// One error as the superblock records it (`s_{first,last}_error_*`).
#[derive(Debug, Clone, Copy)]
pub struct ErrorRecord<'a> {
    /// Seconds since the epoch.
    pub time: i64,
    /// The inode involved, or 0.
    pub ino: u32,
    /// The block involved, or 0.
    pub block: u64,
    /// Where the error was noticed (the kernel stores its function name;
    /// at most 32 bytes are kept).
    pub function: &'a str,
    pub line: u32,
    /// `EXT4_ERR_*` (`error_code`).
    pub errcode: u8,
}

/// The kernel's architecture-independent code for an errno
/// (`ext4_errno_to_code`, the `EXT4_ERR_*` values of ext4.h).
pub fn error_code(errno: i32) -> u8 {
    match errno {
        libc::EIO => 2,
        libc::ENOMEM => 3,
        libc::EBADMSG => 4,
        libc::EUCLEAN => 5,
        libc::ENOSPC => 6,
        libc::ENOKEY => 7,
        libc::EROFS => 8,
        libc::EFBIG => 9,
        libc::EEXIST => 10,
        libc::ERANGE => 11,
        libc::EOVERFLOW => 12,
        libc::EBUSY => 13,
        libc::ENOTDIR => 14,
        libc::ENOTEMPTY => 15,
        libc::ESHUTDOWN => 16,
        libc::EFAULT => 17,
        _ => 1,
    }
}

/// Read and decode the primary superblock of the filesystem on `dev`: the
/// one way any layer reads it from a device (a mount, recovery, the
/// journal commands, fast-commit replay), with `read_at`.
pub fn read_from(dev: &dyn crate::dev::BlockDevice) -> Result<Superblock> {
    read_at(dev, SUPERBLOCK_OFFSET)
}

/// The ext4 superblock of an external journal device (`mke2fs -O
/// journal_dev`): it only names the device — its UUID, which the
/// filesystem records as `s_journal_uuid`, its block size and its size —
/// and the JBD2 superblock follows it in the next block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JournalDeviceLabel {
    pub uuid: [u8; 16],
    pub block_size: u32,
    pub blocks_count: u64,
}

impl JournalDeviceLabel {
    /// Decode the 1024 bytes at byte 1024 of a device; None when they are
    /// not an external journal's (no ext4 magic, or no journal_dev flag).
    pub fn decode(bytes: &[u8]) -> Result<Option<Self>> {
        if bytes.len() < SUPERBLOCK_SIZE
            || get_u16(bytes, S_MAGIC) != EXT4_MAGIC
            || get_u32(bytes, S_FEATURE_INCOMPAT) & incompat::JOURNAL_DEV == 0
        {
            return Ok(None);
        }
        let location = Location::Superblock;
        let log_block_size = get_u32(bytes, S_LOG_BLOCK_SIZE);
        ensure_format!(
            log_block_size <= 6,
            location,
            "external journal device: block size 2^{} KiB",
            log_block_size
        );
        if get_u32(bytes, S_FEATURE_RO_COMPAT) & ro_compat::METADATA_CSUM != 0 {
            let stored = get_u32(bytes, S_CHECKSUM);
            ensure_format!(
                stored == crc32c_raw(!0, &bytes[..S_CHECKSUM]),
                location,
                "external journal device: superblock checksum mismatch"
            );
        }
        let high = match get_u32(bytes, S_FEATURE_INCOMPAT) & incompat::BIT64 {
            0 => 0,
            _ => get_u32(bytes, S_BLOCKS_COUNT_HI) as u64,
        };
        Ok(Some(JournalDeviceLabel {
            uuid: bytes[S_UUID..S_UUID + 16].try_into().unwrap(),
            block_size: 1024 << log_block_size,
            blocks_count: get_u32(bytes, S_BLOCKS_COUNT_LO) as u64 | high << 32,
        }))
    }

    /// The device block holding the JBD2 superblock: the one after the
    /// block holding this superblock (`ext4_get_journal_blkdev`: 1 with
    /// 4 KiB blocks, 2 with 1 KiB). The log follows it.
    pub fn jbd2_superblock_block(&self) -> u64 {
        SUPERBLOCK_OFFSET / self.block_size as u64 + 1
    }
}

/// Read and decode the superblock copy at byte `offset` of `dev`: the
/// primary at `SUPERBLOCK_OFFSET`, or the backup a mount names with `sb=`
/// (`offset = sb × SB_OPTION_UNIT`). Like the kernel's `ext4_load_super`,
/// any offset holding a superblock is taken; the copy remembers where it
/// came from, and `write_to` puts it back there.
pub fn read_at(dev: &dyn crate::dev::BlockDevice, offset: u64) -> Result<Superblock> {
    let fits = offset
        .checked_add(SUPERBLOCK_SIZE as u64)
        .is_some_and(|end| end <= dev.size_bytes());
    if !fits {
        let detail = if offset == SUPERBLOCK_OFFSET {
            "device too small to hold a superblock".to_string()
        } else {
            format!(
                "sb={} (byte {offset}) lies past the end of the device ({} bytes)",
                offset / SB_OPTION_UNIT,
                dev.size_bytes()
            )
        };
        return Err(Error::corrupt(Location::Superblock, detail));
    }
    let mut bytes = vec![0u8; SUPERBLOCK_SIZE];
    dev.read_at(offset, &mut bytes)?;
    let mut sb = Superblock::decode(&bytes).map_err(|error| {
        error.map_corrupt_detail(|detail| {
            let copy = match offset {
                SUPERBLOCK_OFFSET => String::new(),
                _ => format!(
                    "no superblock at sb={} (byte {offset}): ",
                    offset / SB_OPTION_UNIT
                ),
            };
            copy + &detail + &backup_hint(dev, offset)
        })
    })?;
    sb.origin = offset;
    Ok(sb)
}

/// The groups whose backups a hint looks for: the first of the sparse_super
/// series (1 and the powers of 3, 5 and 7), which every layout but
/// sparse_super2 keeps, in the order e2fsck would try them.
const HINT_BACKUP_GROUPS: [u64; 8] = [1, 3, 5, 7, 9, 25, 27, 49];

/// For a superblock copy (at byte `failed`) that does not decode: where a
/// backup is, and how to use it (e2fsck's "try running e2fsck with an
/// alternate superblock"). Nothing of the failed copy can be trusted, so
/// each block size from 1 KiB to 64 KiB is tried with mke2fs's geometry (8
/// × block size blocks per group; group 0 starts at block 1 with 1 KiB
/// blocks), and a candidate counts only when it says that geometry itself.
fn backup_hint(dev: &dyn crate::dev::BlockDevice, failed: u64) -> String {
    for log_block_size in 0..=6u32 {
        let block_size = 1024u64 << log_block_size;
        let first_data_block = u64::from(block_size == 1024);
        for group in HINT_BACKUP_GROUPS {
            let block = first_data_block + group * 8 * block_size;
            let offset = block * block_size;
            if offset != failed && backup_at(dev, offset, block_size) {
                let sb_option = offset / SB_OPTION_UNIT;
                return format!(
                    "; a backup superblock is at block {block} ({block_size}-byte blocks): \
                     mount from it with `-o sb={sb_option}` (the kernel's option; `--sb \
                     {sb_option}` for the image tools), or repair the primary with \
                     `e2fsck -b {block} -B {block_size} IMAGE`"
                );
            }
        }
    }
    String::new()
}

/// Whether a superblock of `block_size`-byte blocks with mke2fs's group
/// size decodes at byte `offset` of `dev`.
fn backup_at(dev: &dyn crate::dev::BlockDevice, offset: u64, block_size: u64) -> bool {
    let mut bytes = vec![0u8; SUPERBLOCK_SIZE];
    if offset + SUPERBLOCK_SIZE as u64 > dev.size_bytes()
        || dev.read_at(offset, &mut bytes).is_err()
    {
        return false;
    }
    Superblock::decode(&bytes).is_ok_and(|backup| {
        backup.block_size() as u64 == block_size && backup.blocks_per_group as u64 == 8 * block_size
    })
}

/// Encode `sb` and write it straight back to the copy it was read from on
/// `dev`, then flush: for the moments no journal carries it (mount,
/// unmount, recovery).
pub fn write_to(dev: &dyn crate::dev::BlockDevice, sb: &mut Superblock) -> Result<()> {
    let origin = sb.origin;
    dev.write_at(origin, sb.encode())?;
    dev.flush()?;
    Ok(())
}

/// The fixed shape of a mounted filesystem, derived once from the
/// superblock. Nothing here changes while mounted.
#[derive(Debug, Clone)]
pub struct Geometry {
    /// The byte offset of the superblock copy mounted: the primary's, or
    /// the backup named by `sb=`, which the descriptor table follows.
    pub superblock_offset: u64,
    pub block_size: u32,
    pub log_block_size: u32,
    pub blocks_count: u64,
    pub first_data_block: u32,
    pub blocks_per_group: u32,
    pub inodes_per_group: u32,
    pub inodes_count: u32,
    pub group_count: u32,
    pub inode_size: u16,
    pub first_ino: u32,
    pub desc_size: u32,
    pub descs_per_block: u32,
    /// Blocks of the group descriptor table (without reserved GDT blocks),
    /// wherever they lie.
    pub gdt_blocks: u32,
    /// With meta_bg (`s_first_meta_bg`): descriptor blocks before this one
    /// follow the superblock as one table; block `M` from here on lies in
    /// meta group `M` (groups `M*N .. M*N+N-1`, `N = descs_per_block`), at
    /// the start of its first group. `gdt_blocks` without meta_bg.
    pub first_meta_bg: u32,
    /// Blocks per cluster (bigalloc), a power of two; 1 without.
    pub cluster_ratio: u32,
    /// Bits of the block bitmap: one per cluster of the group.
    pub clusters_per_group: u32,
    pub reserved_gdt_blocks: u32,
    pub inode_table_blocks: u32,
    pub groups_per_flex: u32,
    pub feature_compat: u32,
    pub feature_incompat: u32,
    pub feature_ro_compat: u32,
    pub uuid: [u8; 16],
    pub metadata_csum: bool,
    pub gdt_csum: bool,
    /// Seed for all metadata_csum checksums.
    pub csum_seed: u32,
    pub hash_seed: [u32; 4],
    pub def_hash_version: u8,
    /// Directory hashes use unsigned `char` (s_flags).
    pub hash_unsigned: bool,
    pub want_extra_isize: u16,
    pub sparse_super2_backups: [u32; 2],
    pub journal_inum: u32,
    pub orphan_file_inum: u32,
    /// The quota files' inodes with the quota feature, user, group and
    /// project (0: that type has none; the project file needs the project
    /// feature too).
    pub quota_inums: [u32; 3],
    /// casefold: the encoding of casefolded directories' names (None
    /// without the feature; an unknown encoding is refused at mount).
    pub encoding: Option<casefold::Encoding>,
}

impl Geometry {
    pub fn from_superblock(sb: &Superblock) -> Self {
        let block_size = sb.block_size();
        let desc_size = sb.desc_size();
        let group_count = sb.group_count();
        let descs_per_block = block_size / desc_size;
        let metadata_csum = sb.has_ro_compat(ro_compat::METADATA_CSUM);
        let stored_seed = sb
            .has_incompat(incompat::CSUM_SEED)
            .then_some(sb.checksum_seed);
        let want_extra_isize = if sb.inode_size > GOOD_OLD_INODE_SIZE {
            // 32 bytes covers every field up to i_projid; honour a larger
            // request from the superblock when the inode has room.
            let wanted = sb.want_extra_isize.max(sb.min_extra_isize).max(32);
            wanted.min(sb.inode_size - GOOD_OLD_INODE_SIZE)
        } else {
            0
        };
        Geometry {
            superblock_offset: sb.origin,
            block_size,
            log_block_size: sb.log_block_size,
            blocks_count: sb.blocks_count,
            first_data_block: sb.first_data_block,
            blocks_per_group: sb.blocks_per_group,
            inodes_per_group: sb.inodes_per_group,
            inodes_count: sb.inodes_count,
            group_count,
            inode_size: sb.inode_size,
            first_ino: sb.first_ino,
            desc_size,
            descs_per_block,
            gdt_blocks: group_count.div_ceil(descs_per_block),
            first_meta_bg: if sb.has_incompat(incompat::META_BG) {
                sb.first_meta_bg.min(group_count.div_ceil(descs_per_block))
            } else {
                group_count.div_ceil(descs_per_block)
            },
            cluster_ratio: sb.cluster_ratio(),
            clusters_per_group: sb.blocks_per_group / sb.cluster_ratio(),
            reserved_gdt_blocks: if sb.has_compat(compat::RESIZE_INODE) {
                sb.reserved_gdt_blocks as u32
            } else {
                0
            },
            // In 64 bits: validate() allows up to 8 x block size inodes of
            // up to block size bytes, 2^33 bytes with 32 KiB blocks.
            inode_table_blocks: (sb.inodes_per_group as u64 * sb.inode_size as u64)
                .div_ceil(block_size as u64) as u32,
            groups_per_flex: if sb.has_incompat(incompat::FLEX_BG) && sb.log_groups_per_flex < 31 {
                1 << sb.log_groups_per_flex
            } else {
                1
            },
            feature_compat: sb.feature_compat,
            feature_incompat: sb.feature_incompat,
            feature_ro_compat: sb.feature_ro_compat,
            uuid: sb.uuid,
            metadata_csum,
            gdt_csum: !metadata_csum && sb.has_ro_compat(ro_compat::GDT_CSUM),
            csum_seed: if metadata_csum {
                csum::fs_seed(&sb.uuid, stored_seed)
            } else {
                0
            },
            hash_seed: sb.hash_seed,
            def_hash_version: sb.def_hash_version,
            hash_unsigned: sb.flags & FLAGS_UNSIGNED_HASH != 0,
            want_extra_isize,
            sparse_super2_backups: sb.backup_bgs,
            journal_inum: if sb.has_compat(compat::HAS_JOURNAL) {
                sb.journal_inum
            } else {
                0
            },
            orphan_file_inum: if sb.has_compat(compat::ORPHAN_FILE) {
                sb.orphan_file_inum
            } else {
                0
            },
            encoding: sb.casefold_encoding().unwrap_or(None),
            quota_inums: match sb.has_ro_compat(ro_compat::QUOTA) {
                true => {
                    let project = sb.has_ro_compat(ro_compat::PROJECT);
                    [
                        sb.quota_inums[0],
                        sb.quota_inums[1],
                        if project { sb.quota_inums[2] } else { 0 },
                    ]
                }
                false => [0; 3],
            },
        }
    }

    pub fn has_compat(&self, mask: u32) -> bool {
        self.feature_compat & mask != 0
    }
    pub fn has_incompat(&self, mask: u32) -> bool {
        self.feature_incompat & mask != 0
    }
    pub fn has_ro_compat(&self, mask: u32) -> bool {
        self.feature_ro_compat & mask != 0
    }

    /// Whether group metadata checksums (either kind) are kept: this also
    /// enables the lazy-init flags and `bg_itable_unused`.
    pub fn has_group_csum(&self) -> bool {
        self.metadata_csum || self.gdt_csum
    }

    pub fn group_of_block(&self, block: u64) -> u32 {
        ((block - self.first_data_block as u64) / self.blocks_per_group as u64) as u32
    }

    pub fn group_first_block(&self, group: u32) -> u64 {
        self.first_data_block as u64 + group as u64 * self.blocks_per_group as u64
    }

    /// Blocks in `group` (the last group may be short).
    pub fn blocks_in_group(&self, group: u32) -> u32 {
        let first = self.group_first_block(group);
        (self.blocks_count - first).min(self.blocks_per_group as u64) as u32
    }

    pub fn group_of_inode(&self, ino: u32) -> u32 {
        (ino - 1) / self.inodes_per_group
    }

    pub fn inode_index_in_group(&self, ino: u32) -> u32 {
        (ino - 1) % self.inodes_per_group
    }

    pub fn is_valid_ino(&self, ino: u32) -> bool {
        ino >= 1 && ino <= self.inodes_count
    }

    /// Whether `group` holds a backup of the superblock and descriptors.
    pub fn group_has_super(&self, group: u32) -> bool {
        if group == 0 {
            return true;
        }
        if self.has_compat(compat::SPARSE_SUPER2) {
            return self.sparse_super2_backups.contains(&group);
        }
        if group <= 1 || !self.has_ro_compat(ro_compat::SPARSE_SUPER) {
            return true;
        }
        if group & 1 == 0 {
            return false;
        }
        is_power_of(group, 3) || is_power_of(group, 5) || is_power_of(group, 7)
    }

    /// Whether descriptor block `index` lies in its meta group (meta_bg)
    /// rather than in the table after the superblock.
    fn in_meta_group(&self, index: u32) -> bool {
        index >= self.first_meta_bg
    }

    /// Descriptor blocks at the start of `group`, primary or backup, as the
    /// kernel's `ext4_bg_num_gdb` counts them: the whole table (the blocks
    /// before `s_first_meta_bg` with meta_bg) in a group with a superblock
    /// copy; in the meta_bg layout, one block in the first, second and
    /// last group of each meta group.
    pub fn group_gdt_blocks(&self, group: u32) -> u32 {
        let index = group / self.descs_per_block;
        if self.in_meta_group(index) {
            let first = index * self.descs_per_block;
            let last = first + self.descs_per_block - 1;
            u32::from(group == first || group == first + 1 || group == last)
        } else if self.group_has_super(group) {
            self.first_meta_bg
        } else {
            0
        }
    }

    /// Blocks at the start of `group` used by the superblock backup, the
    /// descriptor blocks and the reserved descriptor blocks
    /// (`ext4_num_base_meta_clusters`, in blocks: reserved GDT blocks
    /// follow only a table outside the meta_bg layout), and the boot block
    /// before a 1 KiB filesystem's superblock when group 0 starts at block
    /// 0 (bigalloc).
    pub fn group_overhead_blocks(&self, group: u32) -> u32 {
        let boot = u32::from(
            group == 0 && self.primary_superblock_location().0 > self.first_data_block as u64,
        );
        boot + self.group_base_meta_blocks(group)
    }

    /// The superblock copy, descriptor blocks and reserved descriptor
    /// blocks at the start of `group`, as the kernel's
    /// `ext4_num_base_meta_blocks` counts them (what its system zone holds
    /// for every group): `group_overhead_blocks` without the boot block.
    pub fn group_base_meta_blocks(&self, group: u32) -> u32 {
        let has_super = u32::from(self.group_has_super(group));
        let descriptors = self.group_gdt_blocks(group);
        let reserved = if has_super == 1 && !self.in_meta_group(group / self.descs_per_block) {
            self.reserved_gdt_blocks
        } else {
            0
        };
        has_super + descriptors + reserved
    }

    /// The block and byte offset of descriptor `group` in the copy the
    /// mount uses (the kernel's `descriptor_loc`, e2fsprogs'
    /// `ext2fs_descriptor_block_loc2`): in the table after the superblock
    /// mounted (the primary, or the `sb=` backup: `descriptor_loc` counts
    /// from `logical_sb_block`), or with meta_bg at the start of the first
    /// group of its meta group, after that group's superblock copy if it
    /// has one.
    pub fn group_desc_location(&self, group: u32) -> (u64, usize) {
        let index = group / self.descs_per_block;
        let offset = (group % self.descs_per_block * self.desc_size) as usize;
        if !self.in_meta_group(index) {
            return (self.superblock_location().0 + 1 + index as u64, offset);
        }
        // The meta groups' blocks stay where the primary layout has them
        // when a backup superblock is mounted, as in the kernel.
        let first = index * self.descs_per_block;
        let block = if first == 0 {
            self.primary_superblock_location().0 + 1
        } else {
            self.group_first_block(first) + u64::from(self.group_has_super(first))
        };
        debug_assert!(block < self.blocks_count, "descriptor block past the end");
        (block, offset)
    }

    /// The backup copies of the meta_bg descriptor blocks: in the second
    /// and the last group of each meta group, after the group's superblock
    /// copy if it has one (e2fsprogs' `ext2fs_super_and_bgd_loc2`).
    pub fn meta_bg_backup_desc_blocks(&self) -> Vec<u64> {
        let per_block = self.descs_per_block;
        let mut blocks = Vec::new();
        if per_block < 2 {
            // One descriptor a block: each group holds its own, no backups.
            return blocks;
        }
        for index in self.first_meta_bg..self.gdt_blocks {
            let first = index * per_block;
            let mut backups = vec![first + 1, first + per_block - 1];
            backups.dedup();
            for group in backups {
                if group != first && group < self.group_count {
                    let has_super = u64::from(self.group_has_super(group));
                    blocks.push(self.group_first_block(group) + has_super);
                }
            }
        }
        blocks
    }

    /// Where `group_desc_location` would put descriptor `group` without
    /// meta_bg: the fault `MetaBgFlatDescriptor` writes there.
    pub fn flat_group_desc_location(&self, group: u32) -> (u64, usize) {
        let index = group / self.descs_per_block;
        let offset = (group % self.descs_per_block * self.desc_size) as usize;
        (self.superblock_location().0 + 1 + index as u64, offset)
    }

    /// The block and byte offset holding the superblock copy mounted: the
    /// primary, or with `sb=` the backup, which the kernel reads and writes
    /// in its place (`ext4_load_super`'s `logical_sb_block`, `s_sbh`) and
    /// which the descriptor table follows (`descriptor_loc`).
    pub fn superblock_location(&self) -> (u64, usize) {
        let block = self.superblock_offset / self.block_size as u64;
        let offset = (self.superblock_offset % self.block_size as u64) as usize;
        (block, offset)
    }

    /// The block and byte offset of the primary superblock, which fixes the
    /// layout of group 0 whichever copy is mounted.
    pub fn primary_superblock_location(&self) -> (u64, usize) {
        let block = SUPERBLOCK_OFFSET / self.block_size as u64;
        let offset = (SUPERBLOCK_OFFSET % self.block_size as u64) as usize;
        (block, offset)
    }

    /// Whether the superblock mounted is a backup (`sb=` other than 1).
    pub fn mounted_from_backup(&self) -> bool {
        self.superblock_offset != SUPERBLOCK_OFFSET
    }

    /// Bytes of the block bitmap that carry bits (and the checksum covers):
    /// one bit per cluster.
    pub fn block_bitmap_bytes(&self) -> usize {
        (self.clusters_per_group / 8) as usize
    }

    /// Whether clusters are larger than blocks (bigalloc).
    pub fn bigalloc(&self) -> bool {
        self.cluster_ratio > 1
    }

    /// Bytes per cluster (per block without bigalloc).
    pub fn cluster_bytes(&self) -> u64 {
        self.block_size as u64 * self.cluster_ratio as u64
    }

    /// The first block of the cluster `block` lies in (itself without
    /// bigalloc). Clusters start at block 0 (ext4's EXT4_PBLK_CMASK).
    pub fn cluster_start(&self, block: u64) -> u64 {
        block - block % self.cluster_ratio as u64
    }

    /// The block bitmap bit of `group` that `block` (inside it) falls on:
    /// its cluster's number from the group's first block.
    pub fn block_bit(&self, group: u32, block: u64) -> usize {
        debug_assert!(block >= self.group_first_block(group));
        ((block - self.group_first_block(group)) / self.cluster_ratio as u64) as usize
    }

    /// The first block of the cluster bit `bit` of `group` stands for.
    pub fn bit_block(&self, group: u32, bit: usize) -> u64 {
        self.group_first_block(group) + bit as u64 * self.cluster_ratio as u64
    }

    /// The clusters of `group`: the bits of its block bitmap that stand for
    /// blocks (a short last group counts only its whole clusters).
    pub fn clusters_in_group(&self, group: u32) -> u32 {
        self.blocks_in_group(group) / self.cluster_ratio
    }

    pub fn inode_bitmap_bytes(&self) -> usize {
        (self.inodes_per_group / 8) as usize
    }
}

fn is_power_of(mut n: u32, base: u32) -> bool {
    while n > 1 {
        if !n.is_multiple_of(base) {
            return false;
        }
        n /= base;
    }
    n == 1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sparse_super_groups() {
        let mut sb = vec![0u8; 1024];
        put_u16(&mut sb, S_MAGIC, EXT4_MAGIC);
        put_u32(&mut sb, S_REV_LEVEL, 1);
        put_u32(&mut sb, S_LOG_BLOCK_SIZE, 2);
        put_u32(&mut sb, S_BLOCKS_COUNT_LO, 32768 * 100);
        put_u32(&mut sb, S_BLOCKS_PER_GROUP, 32768);
        put_u32(&mut sb, S_CLUSTERS_PER_GROUP, 32768);
        put_u32(&mut sb, S_INODES_PER_GROUP, 8192);
        put_u32(&mut sb, S_INODES_COUNT, 8192 * 100);
        put_u32(&mut sb, S_FIRST_INO, 11);
        put_u16(&mut sb, S_INODE_SIZE, 256);
        put_u32(&mut sb, S_FEATURE_RO_COMPAT, ro_compat::SPARSE_SUPER);
        let superblock = Superblock::decode(&sb).unwrap();
        let geometry = Geometry::from_superblock(&superblock);
        let with_super: Vec<u32> = (0..100).filter(|g| geometry.group_has_super(*g)).collect();
        assert_eq!(with_super, vec![0, 1, 3, 5, 7, 9, 25, 27, 49, 81]);
    }

    /// Mounted from group 1's backup (`sb=257`), the superblock is read
    /// and written there and the flat descriptor table follows it, while
    /// the meta groups' blocks and group 0's layout stay where the primary
    /// has them (the kernel's `descriptor_loc`).
    #[test]
    fn a_backup_superblock_moves_the_flat_table_only() {
        let mut superblock = Superblock::decode(&small_groups(64, 0, 0)).unwrap();
        let primary = Geometry::from_superblock(&superblock);
        assert!(!primary.mounted_from_backup());
        superblock.origin = 257 * SB_OPTION_UNIT;
        let backup = Geometry::from_superblock(&superblock);
        assert!(backup.mounted_from_backup());
        assert_eq!(backup.superblock_location(), (257, 0));
        assert_eq!(backup.primary_superblock_location(), (1, 0));
        assert_eq!(primary.group_desc_location(17), (3, 64));
        assert_eq!(backup.group_desc_location(17), (259, 64));
        assert_eq!(
            backup.group_overhead_blocks(0),
            primary.group_overhead_blocks(0)
        );
        assert_eq!(superblock.identity().0, 257 * 1024 + S_UUID as u64);

        let mut meta = Superblock::decode(&small_groups(64, incompat::META_BG, 0)).unwrap();
        let primary = Geometry::from_superblock(&meta);
        meta.origin = 257 * SB_OPTION_UNIT;
        let backup = Geometry::from_superblock(&meta);
        for group in [0, 17, 40, 63] {
            assert_eq!(
                backup.group_desc_location(group),
                primary.group_desc_location(group),
                "meta_bg descriptor of group {group}"
            );
        }
    }

    /// A 1 KiB-block superblock of `groups` groups of 256 blocks, 64-byte
    /// descriptors (16 to a block), with `incompat` and `ro_compat` set.
    fn small_groups(groups: u32, incompat_bits: u32, ro_compat_bits: u32) -> Vec<u8> {
        let mut sb = vec![0u8; 1024];
        put_u16(&mut sb, S_MAGIC, EXT4_MAGIC);
        put_u32(&mut sb, S_REV_LEVEL, 1);
        put_u32(&mut sb, S_FIRST_DATA_BLOCK, 1);
        put_u32(&mut sb, S_BLOCKS_COUNT_LO, 1 + 256 * groups);
        put_u32(&mut sb, S_BLOCKS_PER_GROUP, 256);
        put_u32(&mut sb, S_CLUSTERS_PER_GROUP, 256);
        put_u32(&mut sb, S_INODES_PER_GROUP, 64);
        put_u32(&mut sb, S_INODES_COUNT, 64 * groups);
        put_u32(&mut sb, S_FIRST_INO, 11);
        put_u16(&mut sb, S_INODE_SIZE, 256);
        put_u16(&mut sb, S_DESC_SIZE, 64);
        put_u32(&mut sb, S_FEATURE_INCOMPAT, incompat::BIT64 | incompat_bits);
        put_u32(
            &mut sb,
            S_FEATURE_RO_COMPAT,
            ro_compat::SPARSE_SUPER | ro_compat_bits,
        );
        sb
    }

    /// Where descriptors are with s_first_meta_bg = 2 of 4 descriptor
    /// blocks (what the kernel's online resize leaves when it switches to
    /// meta_bg): blocks 0 and 1 after the superblock, blocks 2 and 3 at the
    /// start of groups 32 and 48 — as descriptor_loc, ext4_bg_num_gdb and
    /// ext2fs_super_and_bgd_loc2 place them.
    #[test]
    fn meta_bg_descriptors_lie_in_their_meta_groups() {
        let mut bytes = small_groups(64, incompat::META_BG, 0);
        put_u32(&mut bytes, S_FIRST_META_BG, 2);
        let geo = Geometry::from_superblock(&Superblock::decode(&bytes).unwrap());
        assert_eq!(
            (geo.descs_per_block, geo.gdt_blocks, geo.first_meta_bg),
            (16, 4, 2)
        );
        assert_eq!(geo.group_desc_location(0), (2, 0));
        assert_eq!(geo.group_desc_location(17), (3, 64));
        assert_eq!(geo.group_desc_location(32), (1 + 32 * 256, 0));
        assert_eq!(geo.group_desc_location(50), (1 + 48 * 256, 128));
        let gdt: Vec<u32> = [0, 1, 2, 3, 25, 32, 33, 40, 47, 48, 49, 63]
            .iter()
            .map(|&group| geo.group_gdt_blocks(group))
            .collect();
        assert_eq!(gdt, [2, 2, 0, 2, 2, 1, 1, 0, 1, 1, 1, 1]);
        // Superblock copy, descriptor block; no reserved GDT blocks.
        assert_eq!(geo.group_overhead_blocks(25), 3);
        assert_eq!(geo.group_overhead_blocks(33), 1);
        assert_eq!(geo.group_overhead_blocks(40), 0);
        assert_eq!(geo.group_overhead_blocks(49), 2);
        assert_eq!(
            geo.meta_bg_backup_desc_blocks(),
            [1 + 33 * 256, 1 + 47 * 256, 2 + 49 * 256, 1 + 63 * 256]
        );
        assert_eq!(geo.flat_group_desc_location(50), (5, 128));
    }

    /// Without meta_bg the table follows the superblock whole, backed up
    /// in every group with a superblock copy.
    #[test]
    fn without_meta_bg_the_table_follows_each_superblock() {
        let geo = Geometry::from_superblock(&Superblock::decode(&small_groups(64, 0, 0)).unwrap());
        assert_eq!(geo.first_meta_bg, geo.gdt_blocks);
        assert_eq!(geo.group_desc_location(50), (5, 128));
        assert_eq!(geo.group_gdt_blocks(49), 4);
        assert_eq!(geo.group_gdt_blocks(48), 0);
        assert_eq!(geo.group_overhead_blocks(0), 5);
        assert!(geo.meta_bg_backup_desc_blocks().is_empty());
    }

    #[test]
    fn a_first_meta_group_past_the_table_is_corruption() {
        let mut bytes = small_groups(64, incompat::META_BG, 0);
        put_u32(&mut bytes, S_FIRST_META_BG, 5);
        let error = Superblock::decode(&bytes).unwrap_err().to_string();
        assert!(error.contains("first meta block group 5"), "{error}");
    }

    /// bigalloc: the bitmap counts clusters, groups are clusters times the
    /// ratio, and the filesystem starts at block 0 even with 1 KiB blocks
    /// (the superblock then lies in block 1, the table after it).
    #[test]
    fn bigalloc_groups_count_clusters() {
        let mut bytes = small_groups(4, 0, ro_compat::BIGALLOC);
        put_u32(&mut bytes, S_FIRST_DATA_BLOCK, 0);
        put_u32(&mut bytes, S_BLOCKS_COUNT_LO, 4 * 4096);
        put_u32(&mut bytes, S_BLOCKS_PER_GROUP, 4096);
        put_u32(&mut bytes, S_CLUSTERS_PER_GROUP, 256);
        put_u32(&mut bytes, S_LOG_CLUSTER_SIZE, 4);
        let geo = Geometry::from_superblock(&Superblock::decode(&bytes).unwrap());
        assert_eq!((geo.cluster_ratio, geo.clusters_per_group), (16, 256));
        assert_eq!(geo.block_bitmap_bytes(), 32);
        assert_eq!(geo.group_desc_location(0), (2, 0));
        // Boot block, superblock, one descriptor block.
        assert_eq!(geo.group_overhead_blocks(0), 3);
        put_u32(&mut bytes, S_CLUSTERS_PER_GROUP, 255);
        let error = Superblock::decode(&bytes).unwrap_err().to_string();
        assert!(error.contains("disagree"), "{error}");
    }

    #[test]
    fn rejects_bad_magic_and_names_unknown_features() {
        let sb = vec![0u8; 1024];
        assert!(Superblock::decode(&sb).unwrap_err().is_corruption());
        let names = feature_names("incompat", incompat::INLINE_DATA | incompat::ENCRYPT);
        assert_eq!(names, vec!["inline_data", "encrypt"]);
    }
}
