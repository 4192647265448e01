//! fs-verity (`mke2fs -O verity`): jext4 enables verity on files of every
//! tree shape (empty, under a block, one block, one level, two levels) at
//! 1 KiB and 4 KiB blocks, and the digest it reports is the one
//! `fsverity digest` computes from the same content (fsverity-utils, the
//! oracle: this machine's kernel has no CONFIG_FS_VERITY); every file
//! reads back as written, through the library and through a mount, and
//! `e2fsck -fn` (which knows verity inodes' blocks past their end) is
//! clean. A block changed on disk is EIO for the block's reads only, the
//! filesystem staying writable; writes and truncates of a verity file are
//! EPERM, and enable refuses what the kernel refuses.

// The jext4 binary, or the mounts and helpers of tests/common that use it.
#![cfg(feature = "cli")]

mod common;

use common::e2e::{self, JextMount};
use jext4::Image;
use std::path::Path;

const SIZES: &[usize] = &[0, 100, 1024, 4096, 5_000, 1 << 20, (1 << 20) + 1, 5_000_000];

/// `fsverity digest` of `file` with Merkle blocks of `block_size`: the
/// `sha256:HEX` it prints.
fn fsverity_digest(file: &Path, block_size: u32) -> String {
    let block = format!("--block-size={block_size}");
    let output = e2e::run_ok("fsverity", &["digest", &block, e2e::path_str(file)]);
    String::from_utf8_lossy(&output.stdout)
        .split_whitespace()
        .next()
        .unwrap()
        .to_string()
}

fn hex(digest: &[u8; 32]) -> String {
    let text: String = digest.iter().map(|byte| format!("{byte:02x}")).collect();
    format!("sha256:{text}")
}

/// `path`'s digest in the image is what `fsverity digest` prints for
/// `data`, written to `host`, with `merkle`-byte Merkle blocks.
fn assert_fsverity_digest(
    image: &Image,
    path: &str,
    data: &[u8],
    host: &Path,
    merkle: u32,
    what: &str,
) {
    std::fs::write(host, data).unwrap();
    assert_eq!(
        hex(&image.verity_digest(path).unwrap()),
        fsverity_digest(host, merkle),
        "{what}"
    );
}

fn verity_image(dir: &Path, name: &str, block_size: &str) -> std::path::PathBuf {
    common::mkfs(
        dir,
        name,
        64,
        &["-t", "ext4", "-b", block_size, "-O", "verity"],
    )
}

#[test]
fn digests_are_fsverity_utils_digests_and_files_read_back() {
    if !e2e::require_e2e() || !common::require_tool("fsverity") {
        return;
    }
    for block_size in ["1024", "4096"] {
        let scratch = e2e::scratch(&format!("verity-{block_size}"));
        let image = verity_image(scratch.path(), "verity", block_size);
        // Merkle blocks of 4 KiB, or the filesystem's block below that.
        let merkle = block_size.parse::<u32>().unwrap().min(4096);
        let opened = Image::open(&image).unwrap();
        let mut contents = Vec::new();
        for (index, &size) in SIZES.iter().enumerate() {
            let data = e2e::pattern(index as u64 + 40, size);
            let name = format!("/f{index}");
            opened.write(&name, &data).unwrap();
            opened.enable_verity(&name).unwrap();
            let host = scratch.path().join(format!("f{index}"));
            assert_fsverity_digest(
                &opened,
                &name,
                &data,
                &host,
                merkle,
                &format!("{block_size}-byte blocks, {size} bytes: digest"),
            );
            assert_eq!(opened.read(&name).unwrap(), data, "{size} bytes read back");
            contents.push((name, data));
        }
        opened.close().unwrap();
        e2e::fsck_clean(&image, "after enabling verity");

        // Again after a fresh open, and through a mount.
        let opened = Image::open_read_only(&image).unwrap();
        for (name, data) in &contents {
            assert_eq!(&opened.read(name).unwrap(), data, "{name} after reopening");
        }
        drop(opened);
        let mnt = scratch.path().join("mnt");
        let mount = JextMount::mount(&image, &mnt, "");
        for (name, data) in &contents {
            let path = mnt.join(name.trim_start_matches('/'));
            assert_eq!(&std::fs::read(&path).unwrap(), data, "{name} through FUSE");
            let written = std::fs::OpenOptions::new()
                .append(true)
                .open(&path)
                .and_then(|mut file| std::io::Write::write_all(&mut file, b"more"));
            assert_eq!(
                written.map_err(|e| e.raw_os_error()),
                Err(Some(libc::EPERM)),
                "{name}: a write through FUSE"
            );
        }
        mount.unmount();
        e2e::fsck_clean(&image, "after the mount");
    }
}

#[test]
fn a_changed_block_is_eio_and_verity_files_stay_read_only() {
    if !e2e::require_e2e() {
        return;
    }
    let scratch = e2e::scratch("verity-damage");
    let image = verity_image(scratch.path(), "verity-damage", "4096");
    let opened = Image::open(&image).unwrap();
    let data = e2e::pattern(7, 1 << 20);
    opened.write("/big", &data).unwrap();
    opened.enable_verity("/big").unwrap();
    opened.write("/plain", "not verity\n").unwrap();
    opened.create_dir("/dir").unwrap();

    // What the kernel refuses.
    let errno = |error: jext4::Error| error.raw_os_error();
    assert_eq!(
        opened.enable_verity("/big").map_err(errno),
        Err(Some(libc::EEXIST))
    );
    assert_eq!(
        opened.enable_verity("/dir").map_err(errno),
        Err(Some(libc::EISDIR))
    );
    assert_eq!(
        opened.verity_digest("/plain").map_err(errno),
        Err(Some(libc::ENODATA))
    );
    let appended = opened
        .open_with("/big", jext4::OpenOptions::new().append(true))
        .and_then(|mut file| Ok(std::io::Write::write_all(&mut file, b"x")?));
    assert_eq!(
        appended.map_err(|e| e.raw_os_error()),
        Err(Some(libc::EPERM))
    );
    let truncated = opened
        .open_with("/big", jext4::OpenOptions::new().write(true))
        .and_then(|file| file.set_len(10));
    assert_eq!(
        truncated.map_err(|e| e.raw_os_error()),
        Err(Some(libc::EPERM))
    );
    // Its mode and xattrs still change, as in the kernel.
    opened
        .set_permissions("/big", std::os::unix::fs::PermissionsExt::from_mode(0o600))
        .unwrap();
    opened.close().unwrap();

    // One byte of data block 100 changed on disk.
    let output = e2e::run_ok("debugfs", &["-R", "bmap /big 100", e2e::path_str(&image)]);
    let block: u64 = String::from_utf8_lossy(&output.stdout)
        .trim()
        .parse()
        .unwrap();
    let mut bytes = std::fs::read(&image).unwrap();
    bytes[(block * 4096 + 7) as usize] ^= 0x40;
    std::fs::write(&image, &bytes).unwrap();

    let opened = Image::open(&image).unwrap();
    let error = opened.read("/big").unwrap_err();
    assert_eq!(error.raw_os_error(), Some(libc::EIO), "{error}");
    // As std::io::Error: EIO's kind, the detail kept inside.
    let io_error = std::io::Error::from(error);
    assert_eq!(
        io_error.kind(),
        std::io::Error::from_raw_os_error(libc::EIO).kind()
    );
    assert!(io_error.to_string().contains("Merkle tree"), "{io_error}");
    // The rest of the file and the filesystem are fine, and writable.
    let mut file = opened.open_file("/big").unwrap();
    let mut first = vec![0u8; 4096 * 100];
    std::io::Read::read_exact(&mut file, &mut first).unwrap();
    assert_eq!(first, data[..first.len()]);
    drop(file);
    opened
        .write("/after", "written after the damage\n")
        .unwrap();
    opened.close().unwrap();
    e2e::fsck_clean(&image, "after the damage (data blocks are not e2fsck's)");
}

#[test]
fn enable_needs_the_feature_as_in_the_kernel() {
    if !e2e::require_e2e() {
        return;
    }
    let scratch = e2e::scratch("verity-feature");
    let image = common::mkfs(scratch.path(), "no-verity", 32, &["-t", "ext4"]);
    let opened = Image::open(&image).unwrap();
    opened.write("/f", "data\n").unwrap();
    let error = opened.enable_verity("/f").unwrap_err();
    assert_eq!(error.raw_os_error(), Some(libc::EOPNOTSUPP));
    assert!(error.to_string().contains("tune2fs -O verity"), "{error}");
    opened.close().unwrap();
}

/// fsverity-utils itself through a mount: `fsverity enable` and `fsverity
/// measure` reach jext4 as FS_IOC_ENABLE_VERITY and FS_IOC_MEASURE_VERITY
/// (the kernel's FUSE passes both), and the digest is the one `fsverity
/// digest` computes from a copy on the host.
#[test]
fn fsverity_enable_and_measure_work_through_a_mount() {
    if !e2e::require_e2e() || !common::require_tool("fsverity") {
        return;
    }
    let scratch = e2e::scratch("verity-fuse");
    let image = verity_image(scratch.path(), "verity-fuse", "4096");
    let mnt = scratch.path().join("mnt");
    let mount = JextMount::mount(&image, &mnt, "");
    let data = e2e::pattern(3, 300_000);
    let file = mnt.join("file");
    std::fs::write(&file, &data).unwrap();
    let host = scratch.path().join("host");
    std::fs::write(&host, &data).unwrap();
    e2e::run_ok("fsverity", &["enable", e2e::path_str(&file)]);
    let output = e2e::run_ok("fsverity", &["measure", e2e::path_str(&file)]);
    let measured = String::from_utf8_lossy(&output.stdout).into_owned();
    assert_eq!(
        measured.split_whitespace().next().unwrap(),
        fsverity_digest(&host, 4096),
        "fsverity measure through the mount"
    );
    // Again: EEXIST, as the kernel.
    let again = std::process::Command::new("fsverity")
        .args(["enable", e2e::path_str(&file)])
        .output()
        .unwrap();
    assert!(!again.status.success());
    assert!(
        String::from_utf8_lossy(&again.stderr).contains("File exists"),
        "{}",
        String::from_utf8_lossy(&again.stderr)
    );
    assert_eq!(std::fs::read(&file).unwrap(), data);
    mount.unmount();
    e2e::fsck_clean(&image, "after fsverity enable through the mount");
    let opened = Image::open_read_only(&image).unwrap();
    assert_eq!(
        hex(&opened.verity_digest("/file").unwrap()),
        fsverity_digest(&host, 4096)
    );
}

/// A verity file's descriptor is kept between reads; a new verity file
/// given the freed number of an old one is read with its own (digest and
/// bytes as fsverity-utils and the source say), never the old one's.
#[test]
fn a_freed_number_reused_by_a_new_verity_file_reads_its_own_tree() {
    if !e2e::require_e2e() || !common::require_tool("fsverity") {
        return;
    }
    let scratch = e2e::scratch("verity-reuse");
    let image = verity_image(scratch.path(), "verity", "4096");
    let opened = Image::open(&image).unwrap();
    let mut numbers = Vec::new();
    for (index, size) in [(1u64, 300_000usize), (2, 70_000)] {
        let data = e2e::pattern(index + 90, size);
        opened.write("/file", &data).unwrap();
        opened.enable_verity("/file").unwrap();
        let host = scratch.path().join(format!("file{index}"));
        std::fs::write(&host, &data).unwrap();
        for _ in 0..2 {
            assert_eq!(
                hex(&opened.verity_digest("/file").unwrap()),
                fsverity_digest(&host, 4096),
                "file {index}: digest"
            );
            assert_eq!(opened.read("/file").unwrap(), data, "file {index}: bytes");
        }
        numbers.push(opened.metadata("/file").unwrap().ino());
        opened.remove_file("/file").unwrap();
        // Durable: the freed number may be handed out again.
        opened.sync().unwrap();
    }
    assert_eq!(
        numbers[0], numbers[1],
        "the second file did not reuse the number"
    );
    opened.close().unwrap();
    e2e::fsck_clean(&image, "after the reuse");
}

/// With delayed allocation, a file's data may still be held in memory when
/// verity is enabled on it: it is written out first (not refused as a
/// write racing the enable, ETXTBSY), and the tree covers it. Also on an
/// inline_data image, whose small files move out of the inode first.
#[test]
fn enable_writes_out_held_and_inline_data_first() {
    if !common::require_tool("fsverity") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    for (name, features) in [("held", "verity"), ("inline", "verity,inline_data")] {
        let image = common::mkfs(
            dir.path(),
            name,
            32,
            &["-t", "ext4", "-b", "1024", "-O", features],
        );
        let opened = Image::options().delalloc(true).open(&image).unwrap();
        for (index, &size) in [1usize, 100, 700, 5000].iter().enumerate() {
            let data = e2e::pattern(index as u64 + 7, size);
            let path = format!("/f{index}");
            opened.write(&path, &data).unwrap();
            opened.enable_verity(&path).unwrap();
            let host = dir.path().join(format!("{name}-f{index}"));
            let what = format!("{name}: {size} bytes");
            assert_fsverity_digest(&opened, &path, &data, &host, 1024, &what);
            assert_eq!(opened.read(&path).unwrap(), data, "{name}: {size} bytes");
        }
        opened.close().unwrap();
        common::assert_fsck_clean(&image);
    }
}

/// Salts, Merkle block sizes and signatures, as `fsverity enable
/// --block-size --salt --signature` takes them: through the library,
/// `jext4 verity enable` and fsverity-utils itself through a mount (the
/// kernel's FUSE passes the salt and the signature after the struct),
/// each file's digest is what `fsverity digest` prints for the same
/// content, block size and salt; it reads back verified after reopening;
/// e2fsck is clean. Parameters the kernel refuses are refused with its
/// errno.
#[test]
fn salts_block_sizes_and_signatures_as_fsverity_utils_has_them() {
    if !e2e::require_e2e() || !common::require_tool("fsverity") {
        return;
    }
    let scratch = e2e::scratch("verity-params");
    let image = verity_image(scratch.path(), "verity-params", "4096");
    let digest_of = |host: &Path, block: u32, salt: &str| -> String {
        let block = format!("--block-size={block}");
        let salt = format!("--salt={salt}");
        let mut args = vec!["digest", &block];
        if salt != "--salt=" {
            args.push(&salt);
        }
        args.push(e2e::path_str(host));
        let output = e2e::run_ok("fsverity", &args);
        String::from_utf8_lossy(&output.stdout)
            .split_whitespace()
            .next()
            .unwrap()
            .to_string()
    };
    let signature = scratch.path().join("file.sig");
    std::fs::write(&signature, e2e::pattern(77, 3_900)).unwrap();
    // (name, size, Merkle block, salt in hex, signed)
    let cases: &[(&str, usize, u32, &str, bool)] = &[
        ("/salted", 300_000, 4096, "deadbeef", false),
        ("/small-blocks", 5_000_000, 1024, "", false),
        (
            "/both",
            70_000,
            2048,
            "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff",
            false,
        ),
        ("/signed", 100_000, 4096, "01", true),
    ];
    let opened = Image::open(&image).unwrap();
    for &(name, size, block, salt, signed) in cases {
        let data = e2e::pattern(size as u64, size);
        opened.write(name, &data).unwrap();
        let mut options = jext4::VerityOptions::new();
        options.block_size(block).salt(&hex_bytes(salt));
        if signed {
            options.signature(&std::fs::read(&signature).unwrap());
        }
        opened.enable_verity_with(name, &options).unwrap();
        let host = scratch.path().join(name.trim_start_matches('/'));
        std::fs::write(&host, &data).unwrap();
        assert_eq!(
            hex(&opened.verity_digest(name).unwrap()),
            digest_of(&host, block, salt),
            "{name}: digest"
        );
    }
    // Refused as the kernel refuses them.
    opened.write("/refused", b"x").unwrap();
    let errno = |result: jext4::Result<()>| result.map_err(|error| error.errno());
    let mut bad = jext4::VerityOptions::new();
    bad.block_size(3000);
    assert_eq!(
        errno(opened.enable_verity_with("/refused", &bad)),
        Err(libc::EINVAL)
    );
    bad.block_size(8192);
    assert_eq!(
        errno(opened.enable_verity_with("/refused", &bad)),
        Err(libc::EINVAL)
    );
    let mut bad = jext4::VerityOptions::new();
    bad.salt(&[1; 33]);
    assert_eq!(
        errno(opened.enable_verity_with("/refused", &bad)),
        Err(libc::EMSGSIZE)
    );
    let mut bad = jext4::VerityOptions::new();
    bad.signature(&vec![1; 16_129]);
    assert_eq!(
        errno(opened.enable_verity_with("/refused", &bad)),
        Err(libc::EMSGSIZE)
    );
    opened.close().unwrap();
    e2e::fsck_clean(&image, "after salted and signed verity files");

    // The CLI.
    let data = e2e::pattern(5, 200_000);
    let host = scratch.path().join("cli");
    std::fs::write(&host, &data).unwrap();
    let target = format!("{}:/cli", e2e::path_str(&image));
    e2e::run_ok(e2e::JEXT4, &["cp", e2e::path_str(&host), &target]);
    e2e::run_ok(
        e2e::JEXT4,
        &[
            "verity",
            "enable",
            "--block-size",
            "1024",
            "--salt",
            "c0ffee",
            &target,
        ],
    );
    let measured = e2e::run_ok(e2e::JEXT4, &["verity", "measure", &target]);
    assert_eq!(
        String::from_utf8_lossy(&measured.stdout)
            .split_whitespace()
            .next()
            .unwrap(),
        digest_of(&host, 1024, "c0ffee"),
        "jext4 verity enable --block-size 1024 --salt c0ffee"
    );

    // fsverity-utils through the mount.
    let mnt = scratch.path().join("mnt");
    let mount = JextMount::mount(&image, &mnt, "");
    let file = mnt.join("through-fuse");
    std::fs::write(&file, &data).unwrap();
    let sig = format!("--signature={}", e2e::path_str(&signature));
    e2e::run_ok(
        "fsverity",
        &[
            "enable",
            "--block-size=2048",
            "--salt=abcd",
            &sig,
            e2e::path_str(&file),
        ],
    );
    let output = e2e::run_ok("fsverity", &["measure", e2e::path_str(&file)]);
    assert_eq!(
        String::from_utf8_lossy(&output.stdout)
            .split_whitespace()
            .next()
            .unwrap(),
        digest_of(&host, 2048, "abcd"),
        "fsverity enable --block-size=2048 --salt=abcd --signature through the mount"
    );
    mount.unmount();
    e2e::fsck_clean(
        &image,
        "after fsverity enable with parameters through the mount",
    );

    let opened = Image::open_read_only(&image).unwrap();
    for &(name, size, _, _, _) in cases {
        assert_eq!(
            opened.read(name).unwrap(),
            e2e::pattern(size as u64, size),
            "{name}"
        );
    }
    assert_eq!(opened.read("/through-fuse").unwrap(), data);
    assert_eq!(opened.read("/cli").unwrap(), data);
}

fn hex_bytes(text: &str) -> Vec<u8> {
    (0..text.len())
        .step_by(2)
        .map(|at| u8::from_str_radix(&text[at..at + 2], 16).unwrap())
        .collect()
}
