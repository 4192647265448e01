//! External journals (`mke2fs -O journal_dev`, `mke2fs -J device=`): the
//! filesystem's superblock has `has_journal` with no journal inode, and
//! names the journal device by its UUID (`s_journal_uuid`) and the device
//! number it had (`s_journal_dev`). This module finds that device — the
//! path the caller names (`-o journal_path=`, the kernel's option), else
//! the device number, else any block device whose superblock carries the
//! UUID, as e2fsck finds it through blkid — and checks it as the kernel
//! does before it trusts it (`ext4_get_journal_blkdev`,
//! `ext4_open_dev_journal`): an ext4 superblock with `journal_dev`, the
//! UUID the filesystem names, the filesystem's block size, and a JBD2
//! superblock with one user, this filesystem.
//!
//! The journal layer sees the two devices as one (`dev::JoinedDevice`):
//! the journal device's blocks after the filesystem's, so that its log, its
//! replay and its barriers work as with an internal journal.

use crate::dev::{BlockDevice, Claim, JoinedDevice};
use crate::error::{Error, Location, Result};
use crate::format::superblock::{
    Geometry, JournalDeviceLabel, SUPERBLOCK_OFFSET, SUPERBLOCK_SIZE, Superblock, compat,
};
use crate::journal::recovery::JournalArea;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// An external journal device, found and checked against its filesystem.
#[derive(Clone)]
pub struct ExternalJournal {
    dev: Arc<dyn BlockDevice>,
    label: JournalDeviceLabel,
    /// What the device was found as, for messages.
    name: String,
    /// Its device number as the superblock records it, when it is a block
    /// device.
    number: Option<u32>,
}

impl std::fmt::Debug for ExternalJournal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExternalJournal")
            .field("name", &self.name)
            .field("label", &self.label)
            .finish()
    }
}

/// Whether the filesystem's journal is on a device of its own.
pub fn is_external(sb: &Superblock) -> bool {
    sb.has_compat(compat::HAS_JOURNAL) && sb.journal_inum == 0
}

/// A superblock that names a journal inode and an external journal's
/// UUID at once is refused: the kernel would use the inode, e2fsck the
/// device (it goes by the UUID), and which of the two logs holds the
/// filesystem's last changes only `e2fsck -f` can settle.
pub fn check_unambiguous(sb: &Superblock) -> Result<()> {
    if sb.has_compat(compat::HAS_JOURNAL) && sb.journal_inum != 0 && sb.journal_uuid != [0; 16] {
        return Err(Error::Unsupported(format!(
            "the superblock names both a journal inode ({}) and an external journal (UUID \
             {}): the kernel would use one and e2fsck the other; `e2fsck -f IMAGE` decides",
            sb.journal_inum,
            format_uuid(&sb.journal_uuid)
        )));
    }
    Ok(())
}

impl ExternalJournal {
    /// The journal device of the filesystem `sb` describes, when its
    /// journal is external: `path` if given, else found as the module's
    /// preamble says. None when the journal is internal (or there is none);
    /// a `path` for such a filesystem is refused, as the kernel refuses
    /// `journal_path=` with a journal inode.
    pub fn find(sb: &Superblock, path: Option<&Path>, read_only: bool) -> Result<Option<Self>> {
        check_unambiguous(sb)?;
        if !is_external(sb) {
            return match path {
                Some(path) => Err(Error::Invalid(format!(
                    "journal_path={}: the filesystem has {}, not an external journal",
                    path.display(),
                    match sb.has_compat(compat::HAS_JOURNAL) {
                        true => "its journal in an inode",
                        false => "no journal",
                    }
                ))),
                None => Ok(None),
            };
        }
        let journal = match path {
            Some(path) => Self::open(path, read_only)?,
            None => Self::search(sb, read_only)?,
        };
        journal.check_against(sb)?;
        Ok(Some(journal))
    }

    /// A journal device given as an open device (the crash tests'; a
    /// library caller's own storage), checked against `sb`.
    pub fn from_device(sb: &Superblock, dev: Arc<dyn BlockDevice>) -> Result<Self> {
        if !is_external(sb) {
            return Err(Error::Invalid(
                "a journal device was given, but the filesystem's journal is not external".into(),
            ));
        }
        let label = read_label(&*dev)?.ok_or_else(|| not_a_journal("the journal device"))?;
        let journal = ExternalJournal {
            dev,
            label,
            name: "the journal device".into(),
            number: None,
        };
        journal.check_against(sb)?;
        Ok(journal)
    }

    /// Open `path` and read its label.
    fn open(path: &Path, read_only: bool) -> Result<Self> {
        let claim = match read_only {
            true => Claim::Shared,
            false => Claim::Exclusive,
        };
        let name = path.display().to_string();
        let dev = crate::dev::open_image_claimed(path, read_only, claim)?;
        let label = read_label(&*dev)?.ok_or_else(|| not_a_journal(&name))?;
        let number = block_device_number(path);
        Ok(ExternalJournal {
            dev,
            label,
            name,
            number,
        })
    }

    /// The device number the superblock should record for this journal
    /// (`s_journal_dev`), when it records another: the kernel updates it
    /// when `journal_path=` names the journal elsewhere
    /// (`ext4_load_journal`), e2fsck when it finds the journal by UUID.
    pub fn number_to_record(&self, sb: &Superblock) -> Option<u32> {
        self.number.filter(|&number| number != sb.journal_dev)
    }

    /// The device the superblock names: its device number, then any block
    /// device carrying its UUID.
    fn search(sb: &Superblock, read_only: bool) -> Result<Self> {
        let wanted = sb.journal_uuid;
        let by_number = device_node(sb.journal_dev);
        let candidates = by_number.into_iter().chain(block_devices());
        for path in candidates {
            let Ok(label) = peek_label(&path) else {
                continue;
            };
            if label.is_some_and(|label| label.uuid == wanted) {
                return Self::open(&path, read_only);
            }
        }
        Err(Error::Unsupported(format!(
            "the journal is on an external device (UUID {}, device {}:{}) that was not \
             found: name it with -o journal_path=PATH (the tools' --journal PATH)",
            format_uuid(&wanted),
            decode_device_number(sb.journal_dev).0,
            decode_device_number(sb.journal_dev).1
        )))
    }

    /// The kernel's checks of the ext4 superblock of the device.
    fn check_against(&self, sb: &Superblock) -> Result<()> {
        if self.label.uuid != sb.journal_uuid {
            return Err(Error::Invalid(format!(
                "{} is the journal of another filesystem: its UUID is {}, the filesystem's \
                 journal is {} (the kernel: \"journal UUID does not match\")",
                self.name,
                format_uuid(&self.label.uuid),
                format_uuid(&sb.journal_uuid)
            )));
        }
        if self.label.block_size != sb.block_size() {
            return Err(Error::corrupt(
                Location::Journal { block: 0 },
                format!(
                    "{}: journal block size {} differs from the filesystem's {}",
                    self.name,
                    self.label.block_size,
                    sb.block_size()
                ),
            ));
        }
        let device_blocks = self.dev.size_bytes() / self.label.block_size as u64;
        if self.label.blocks_count > device_blocks || self.label.blocks_count <= 2 {
            return Err(Error::corrupt(
                Location::Journal { block: 0 },
                format!(
                    "{}: the journal device says {} blocks, the device holds {device_blocks}",
                    self.name, self.label.blocks_count
                ),
            ));
        }
        Ok(())
    }

    /// The journal as the journal layer addresses it: `fs_dev` and this
    /// device joined, the journal from its first block to its last. Also
    /// checks the JBD2 superblock's users, as e2fsck does: one, this
    /// filesystem (the kernel refuses a shared journal).
    pub(crate) fn area(
        &self,
        geo: &Geometry,
        fs_dev: &Arc<dyn BlockDevice>,
    ) -> Result<JournalArea> {
        let block_size = geo.block_size as u64;
        let home_end = fs_dev.size_bytes();
        let base = home_end.div_ceil(block_size) * block_size;
        let joined: Arc<dyn BlockDevice> = Arc::new(JoinedDevice::new(
            Arc::clone(fs_dev),
            Arc::clone(&self.dev),
            base,
        ));
        let area = JournalArea::external(
            joined,
            geo.block_size,
            base,
            self.label.blocks_count,
            self.label.jbd2_superblock_block(),
            home_end,
        );
        let journal =
            crate::journal::format::JournalSuperblock::decode(&area.read_superblock_block()?)?;
        let users = journal.users();
        if journal.version >= 2 && users != [geo.uuid] {
            return Err(Error::Invalid(format!(
                "{} is not this filesystem's journal: its users are [{}], the filesystem is {}",
                self.name,
                users.iter().map(format_uuid).collect::<Vec<_>>().join(", "),
                format_uuid(&geo.uuid)
            )));
        }
        Ok(area)
    }

    /// The journal device.
    pub fn device(&self) -> &Arc<dyn BlockDevice> {
        &self.dev
    }
}

fn not_a_journal(name: &str) -> Error {
    Error::Invalid(format!(
        "{name} is not an external journal device (no ext4 superblock with journal_dev; \
         `mke2fs -O journal_dev` makes one)"
    ))
}

/// The label of an external journal device, None if it is not one.
fn read_label(dev: &dyn BlockDevice) -> Result<Option<JournalDeviceLabel>> {
    if dev.size_bytes() < SUPERBLOCK_OFFSET + SUPERBLOCK_SIZE as u64 {
        return Ok(None);
    }
    let mut bytes = vec![0u8; SUPERBLOCK_SIZE];
    dev.read_at(SUPERBLOCK_OFFSET, &mut bytes)?;
    JournalDeviceLabel::decode(&bytes)
}

/// The label of the device at `path`, read without claiming it (a search
/// looks at every block device).
fn peek_label(path: &Path) -> Result<Option<JournalDeviceLabel>> {
    use std::io::{Read, Seek, SeekFrom};
    let mut file = std::fs::File::open(path)?;
    let mut bytes = vec![0u8; SUPERBLOCK_SIZE];
    file.seek(SeekFrom::Start(SUPERBLOCK_OFFSET))?;
    file.read_exact(&mut bytes)?;
    JournalDeviceLabel::decode(&bytes)
}

/// A device number as the superblock stores it: the kernel's
/// `new_encode_dev` (minor's low byte, then the major, then the minor's
/// upper bits: `major << 8 | minor` for small numbers, as mke2fs writes).
fn encode_device_number(major: u32, minor: u32) -> u32 {
    (minor & 0xff) | (major << 8) | ((minor & !0xff) << 12)
}

/// (major, minor) of a device number as the superblock stores it
/// (`new_decode_dev`).
fn decode_device_number(number: u32) -> (u32, u32) {
    (
        (number & 0xfff00) >> 8,
        (number & 0xff) | ((number >> 12) & 0xfff00),
    )
}

/// The device number of `path` when it is a block device.
fn block_device_number(path: &Path) -> Option<u32> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let meta = std::fs::metadata(path).ok()?;
    if !meta.file_type().is_block_device() {
        return None;
    }
    let rdev = meta.rdev();
    let (major, minor) = (libc::major(rdev), libc::minor(rdev));
    Some(encode_device_number(major, minor))
}

/// The device node of a device number as the superblock stores it, if
/// the system has it.
fn device_node(number: u32) -> Option<PathBuf> {
    if number == 0 {
        return None;
    }
    let (major, minor) = decode_device_number(number);
    let sys = format!("/sys/dev/block/{major}:{minor}/uevent");
    let uevent = std::fs::read_to_string(sys).ok()?;
    let name = uevent
        .lines()
        .find_map(|line| line.strip_prefix("DEVNAME="))?;
    Some(Path::new("/dev").join(name))
}

/// Every block device of the system (`/sys/class/block`).
fn block_devices() -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir("/sys/class/block") else {
        return Vec::new();
    };
    let mut paths: Vec<PathBuf> = entries
        .flatten()
        .map(|entry| Path::new("/dev").join(entry.file_name()))
        .collect();
    paths.sort();
    paths
}

/// A UUID as blkid and dumpe2fs print it.
pub(crate) fn format_uuid(uuid: &[u8; 16]) -> String {
    let hex: String = uuid.iter().map(|byte| format!("{byte:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuids_print_as_blkid_prints_them() {
        let uuid = [
            0x93, 0xcd, 0x4d, 0xd8, 0xf1, 0x99, 0x45, 0x76, 0xa2, 0xf5, 0xf6, 0xc2, 0x30, 0x6a,
            0xe0, 0xd2,
        ];
        assert_eq!(format_uuid(&uuid), "93cd4dd8-f199-4576-a2f5-f6c2306ae0d2");
    }

    #[test]
    fn a_device_number_without_a_node_finds_nothing() {
        assert_eq!(device_node(0), None);
        // Major 255 minor 255 names no block device here.
        assert_eq!(device_node(0xffff), None);
    }

    #[test]
    fn device_numbers_are_encoded_as_the_kernel_encodes_them() {
        // loop0, as mke2fs records it; a minor past 255 (loop300).
        assert_eq!(encode_device_number(7, 0), 0x0700);
        assert_eq!(decode_device_number(0x0700), (7, 0));
        let large = encode_device_number(7, 300);
        assert_eq!(large, 0x2c | 7 << 8 | 0x100 << 12);
        assert_eq!(decode_device_number(large), (7, 300));
        assert_eq!(decode_device_number(encode_device_number(259, 5)), (259, 5));
    }

    #[test]
    fn the_jbd2_superblock_follows_the_ext4_one() {
        let label = |block_size| JournalDeviceLabel {
            uuid: [0; 16],
            block_size,
            blocks_count: 1024,
        };
        assert_eq!(label(1024).jbd2_superblock_block(), 2);
        assert_eq!(label(4096).jbd2_superblock_block(), 1);
    }
}
