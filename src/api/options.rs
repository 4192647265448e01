//! The builders: `ImageOptions` (how an image is opened: the engine's
//! `MountOptions` under names a library user knows), `OpenOptions` (how a
//! file is opened, std's builder) and `DirBuilder` (how a directory is
//! made, std's too).
//!
//! The file and directory builders take std's extension traits for the
//! Unix bits (`std::os::unix::fs::OpenOptionsExt::mode`,
//! `DirBuilderExt::mode`), so that code written against std's builders
//! reads the same against these.

use super::Image;
use crate::error::{Error, Result};
use crate::fs::MountOptions;
use std::path::Path;
use std::time::Duration;

/// The umask an image applies when none is given: the usual one, so that
/// `create_file` makes files 0644 and `create_dir` directories 0755.
pub(super) const UMASK_DEFAULT: u32 = 0o022;

/// How to open an image: `Image::options()` returns one, each setter
/// changes one option, `open` (or `open_device`) opens the image.
///
/// ```
/// use std::time::Duration;
/// # let path = std::env::temp_dir().join(format!("jext4-doc-image-options-{}.img", std::process::id()));
/// # let made = std::process::Command::new("mke2fs").args(["-q", "-F", "-t", "ext4"]).arg(&path).arg("8M").output()?;
/// # assert!(made.status.success(), "mke2fs: {made:?}");
/// let image = jext4::Image::options()
///     .cache_size(64 << 20)
///     .commit_interval(Duration::from_secs(1))
///     .umask(0o077)
///     .open(&path)?;
/// image.write("/private", "only mine\n")?;
/// assert_eq!(image.metadata("/private")?.mode() & 0o777, 0o600);
/// # std::fs::remove_file(&path)?;
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct ImageOptions {
    pub(super) mount: MountOptions,
    pub(super) umask: u32,
}

impl Default for ImageOptions {
    fn default() -> Self {
        ImageOptions {
            mount: MountOptions::default(),
            umask: UMASK_DEFAULT,
        }
    }
}

impl ImageOptions {
    /// The defaults: read-write, the engine's default cache and a commit
    /// every 5 seconds, fast commits where the image has them, umask 022.
    pub fn new() -> Self {
        ImageOptions::default()
    }

    /// Open read-only: nothing is written, not even a journal replay
    /// (an image that needs recovery is replayed in memory only).
    pub fn read_only(&mut self, read_only: bool) -> &mut Self {
        self.mount.read_only = read_only;
        self
    }

    /// Bound on the metadata buffer cache, in bytes (at least 1 MiB).
    pub fn cache_size(&mut self, bytes: u64) -> &mut Self {
        self.mount.cache_size = bytes;
        self
    }

    /// Time between background commits (`-o commit=`): what a crash can
    /// lose of what was not synced. Whole seconds, 1 s to about 99 days.
    pub fn commit_interval(&mut self, interval: Duration) -> &mut Self {
        self.mount.commit_interval = interval;
        self
    }

    /// Fast commits for `sync_all`/`sync_data`: `None` where the image
    /// has the fast_commit feature (the default), `Some(false)` never,
    /// `Some(true)` required (opening an image without the feature fails).
    pub fn fast_commit(&mut self, fast_commit: Option<bool>) -> &mut Self {
        self.mount.fast_commit = fast_commit;
        self
    }

    /// Every operation durable when it returns (`-o sync`).
    pub fn sync(&mut self, sync: bool) -> &mut Self {
        self.mount.sync = sync;
        self
    }

    /// Directory changes durable when they return (`-o dirsync`).
    pub fn dirsync(&mut self, dirsync: bool) -> &mut Self {
        self.mount.dirsync = dirsync;
        self
    }

    /// Commit blocks with a checksum instead of a flush before them
    /// (`-o journal_async_commit`).
    pub fn journal_async_commit(&mut self, async_commit: bool) -> &mut Self {
        self.mount.journal_async_commit = async_commit;
        self
    }

    /// Delayed allocation (`-o delalloc`): blocks are chosen when data is
    /// written out rather than when it is written.
    pub fn delalloc(&mut self, delalloc: bool) -> &mut Self {
        self.mount.delalloc = delalloc;
        self
    }

    /// Journal file data as well as metadata (`-o data=journal`): every
    /// write is logged before it reaches its blocks, so that a crash
    /// leaves each write's bytes all old or all new. `false` is
    /// data=ordered. Unset, the image's default mount options decide
    /// (`tune2fs -o journal_data`), as in the kernel.
    pub fn data_journal(&mut self, journal: bool) -> &mut Self {
        self.mount.data_journal = Some(journal);
        self
    }

    /// Enforce the quota limits of users, groups and projects (`-o
    /// usrquota,grpquota,prjquota`): a change that would take an id past
    /// its limits is EDQUOT, unless the image's caller is uid 0. Off by
    /// default, as in the kernel (usage is kept either way).
    pub fn quota_limits(&mut self, user: bool, group: bool, project: bool) -> &mut Self {
        self.mount.quota_limits = [user, group, project];
        self
    }

    /// The external journal's device or image file (`-o journal_path=`),
    /// for an image whose journal is on a device of its own; without it
    /// the journal is looked for among the block devices, by the number
    /// and UUID the image records.
    pub fn journal_path(&mut self, path: impl AsRef<Path>) -> &mut Self {
        self.mount.journal_path = Some(path.as_ref().to_path_buf());
        self
    }

    /// The file-mode creation mask of the image's operations, as a
    /// process's umask: `create_file`, `create_dir` and `OpenOptions` with
    /// a mode clear these bits (unless the directory has a default ACL,
    /// which decides instead, as in the kernel). 0o022 by default; 0 makes
    /// every mode given the mode used.
    pub fn umask(&mut self, umask: u32) -> &mut Self {
        self.umask = umask & 0o777;
        self
    }

    /// Every engine option at once (the command line's `-o` parser builds
    /// these); the setters above change the same fields. Unstable: the
    /// engine's type.
    #[doc(hidden)]
    pub fn mount_options(&mut self, options: MountOptions) -> &mut Self {
        self.mount = options;
        self
    }

    /// Open the image file, block device or NBD URI (`nbd://host/export`,
    /// `nbd+unix:///export?socket=path`) at `path` with these options.
    pub fn open(&self, path: impl AsRef<Path>) -> Result<Image> {
        self.mount.validate()?;
        let fs = crate::fs::Fs::open(path.as_ref(), self.mount.clone())?;
        Ok(Image::from_parts(
            fs,
            super::image::process_caller(),
            self.umask,
        ))
    }

    /// Open the image on `device` (an in-memory image, an NBD client,
    /// a device of your own) with these options.
    pub fn open_device(&self, device: Box<dyn crate::dev::BlockDevice>) -> Result<Image> {
        self.mount.validate()?;
        let fs = crate::fs::Fs::mount(device.into(), self.mount.clone())?;
        Ok(Image::from_parts(
            fs,
            super::image::process_caller(),
            self.umask,
        ))
    }
}

/// How to open a file, as `std::fs::OpenOptions`: pass it to
/// `Image::open_with`.
///
/// The access mode and the creation flags mean what they mean to
/// `open(2)`: `write` or `append` to write, `create` to make a missing
/// file, `create_new` to fail with `AlreadyExists` if it exists,
/// `truncate` to empty it (with `write`). The mode of a created file is
/// 0o666 unless `std::os::unix::fs::OpenOptionsExt::mode` says otherwise,
/// less the image's umask.
///
/// ```
/// use std::io::Write;
/// use std::os::unix::fs::OpenOptionsExt;
/// # let path = std::env::temp_dir().join(format!("jext4-doc-open-options-{}.img", std::process::id()));
/// # let made = std::process::Command::new("mke2fs").args(["-q", "-F", "-t", "ext4"]).arg(&path).arg("8M").output()?;
/// # assert!(made.status.success(), "mke2fs: {made:?}");
/// let image = jext4::Image::open(&path)?;
/// image.create_dir_all("/var/log")?;
/// let mut log = image.open_with(
///     "/var/log/app.log",
///     jext4::OpenOptions::new().append(true).create(true).mode(0o640),
/// )?;
/// log.write_all(b"started\n")?;
/// # std::fs::remove_file(&path)?;
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct OpenOptions {
    pub(super) read: bool,
    pub(super) write: bool,
    pub(super) append: bool,
    pub(super) truncate: bool,
    pub(super) create: bool,
    pub(super) create_new: bool,
    pub(super) mode: u32,
    pub(super) custom_flags: i32,
}

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions::new()
    }
}

impl OpenOptions {
    /// Every option off (and mode 0o666), as std's: set at least one of
    /// `read`, `write` and `append`.
    pub fn new() -> Self {
        OpenOptions {
            read: false,
            write: false,
            append: false,
            truncate: false,
            create: false,
            create_new: false,
            mode: 0o666,
            custom_flags: 0,
        }
    }

    /// Open for reading.
    pub fn read(&mut self, read: bool) -> &mut Self {
        self.read = read;
        self
    }

    /// Open for writing (at the file's own position, from 0).
    pub fn write(&mut self, write: bool) -> &mut Self {
        self.write = write;
        self
    }

    /// Open for writing at the end: every `write` goes after the data
    /// there is at the time (`O_APPEND`); implies `write`.
    pub fn append(&mut self, append: bool) -> &mut Self {
        self.append = append;
        self
    }

    /// Empty the file when it opens (needs `write`; not with `append`).
    pub fn truncate(&mut self, truncate: bool) -> &mut Self {
        self.truncate = truncate;
        self
    }

    /// Create the file if it does not exist (needs `write` or `append`).
    pub fn create(&mut self, create: bool) -> &mut Self {
        self.create = create;
        self
    }

    /// Create the file, failing with `AlreadyExists` if the name exists
    /// (even as a dangling symbolic link); `create` and `truncate` are
    /// then ignored.
    pub fn create_new(&mut self, create_new: bool) -> &mut Self {
        self.create_new = create_new;
        self
    }

    /// Open the file at `path` of `image` with these options (std's
    /// `OpenOptions::open`, with the image named).
    pub fn open_in(&self, image: &Image, path: impl AsRef<Path>) -> Result<super::File> {
        image.open_with(path, self)
    }

    /// Whether the file is opened for writing.
    pub(super) fn writes(&self) -> bool {
        self.write || self.append
    }

    /// std's checks (sys/pal/unix/fs.rs, `get_access_mode` and
    /// `get_creation_mode`): the errors come before the path is looked at.
    pub(super) fn check(&self) -> Result<()> {
        if !self.read && !self.writes() {
            return Err(Error::Invalid(
                "open with neither read, write nor append".into(),
            ));
        }
        if !self.writes() && (self.truncate || self.create || self.create_new) {
            return Err(Error::Invalid(
                "truncate, create or create_new without write or append".into(),
            ));
        }
        if self.append && self.truncate && !self.create_new {
            return Err(Error::Invalid("truncate together with append".into()));
        }
        Ok(())
    }
}

impl std::os::unix::fs::OpenOptionsExt for OpenOptions {
    /// The permission bits of a file that `create`/`create_new` makes,
    /// before the image's umask (0o666 by default).
    fn mode(&mut self, mode: u32) -> &mut Self {
        self.mode = mode;
        self
    }

    /// `open(2)` flags besides the access mode: `O_NOFOLLOW` (a final
    /// symbolic link fails with ELOOP) and `O_EXCL` (as `create_new`) are
    /// honoured; the others (`O_SYNC`, `O_DIRECT`, …) have no meaning
    /// here and are ignored.
    fn custom_flags(&mut self, flags: i32) -> &mut Self {
        self.custom_flags = flags;
        self
    }
}

/// How to create a directory, as `std::fs::DirBuilder`: pass it to
/// `Image::create_dir_with`. The mode (`DirBuilderExt::mode`, 0o777 by
/// default) loses the image's umask.
#[derive(Debug, Clone)]
pub struct DirBuilder {
    pub(super) recursive: bool,
    pub(super) mode: u32,
}

impl Default for DirBuilder {
    fn default() -> Self {
        DirBuilder::new()
    }
}

impl DirBuilder {
    /// Not recursive, mode 0o777.
    pub fn new() -> Self {
        DirBuilder {
            recursive: false,
            mode: 0o777,
        }
    }

    /// Create missing parents too, and accept a directory that exists
    /// (`create_dir_all`).
    pub fn recursive(&mut self, recursive: bool) -> &mut Self {
        self.recursive = recursive;
        self
    }
}

impl std::os::unix::fs::DirBuilderExt for DirBuilder {
    /// The permission bits of the directories made, before the umask.
    fn mode(&mut self, mode: u32) -> &mut Self {
        self.mode = mode;
        self
    }
}

/// How `Image::enable_verity_with` builds a file's Merkle tree, as
/// `FS_IOC_ENABLE_VERITY`'s `struct fsverity_enable_arg` says it (and
/// `fsverity enable --block-size --salt --signature`). SHA-256 is the one
/// hash.
///
/// ```
/// let mut options = jext4::VerityOptions::new();
/// options.block_size(1024).salt(b"pepper");
/// # let _ = options;
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VerityOptions {
    pub(super) params: crate::engine::fs::VerityParams,
}

impl VerityOptions {
    /// The defaults: Merkle blocks of 4 KiB (or the filesystem's block
    /// below that), no salt, no signature.
    pub fn new() -> Self {
        VerityOptions::default()
    }

    /// The Merkle tree's block size: a power of two from 1 KiB to the
    /// filesystem's block and the page (4 KiB); others are EINVAL.
    pub fn block_size(&mut self, block_size: u32) -> &mut Self {
        self.params.block_size = Some(block_size);
        self
    }

    /// A salt hashed before every block (at most 32 bytes; more is
    /// EMSGSIZE): the file's digest changes with it.
    pub fn salt(&mut self, salt: &[u8]) -> &mut Self {
        self.params.salt = salt.to_vec();
        self
    }

    /// A built-in signature (a PKCS#7 blob, at most 16,128 bytes), kept
    /// after the descriptor as a kernel without
    /// `CONFIG_FS_VERITY_BUILTIN_SIGNATURES` keeps it: jext4 holds no
    /// keyring and does not check it. It is not part of the digest.
    pub fn signature(&mut self, signature: &[u8]) -> &mut Self {
        self.params.signature = signature.to_vec();
        self
    }
}
