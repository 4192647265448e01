//! Build a small tree inside an existing ext2/3/4 image through the
//! library API: no FUSE, no root, no kernel mount.
//!
//! ```text
//! truncate -s 64M disk.img && mkfs.ext4 -q disk.img
//! cargo run --example build_image -- disk.img
//! e2fsck -fn disk.img
//! ```

use jext4::{Image, OpenOptions};
use std::io::{Seek, SeekFrom, Write};
use std::os::unix::fs::{FileExt, OpenOptionsExt};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args()
        .nth(1)
        .ok_or("usage: build_image IMAGE (an ext2/3/4 image, e.g. made by mkfs.ext4)")?;
    let image = Image::open(&path)?;

    image.create_dir_all("/etc/app/conf.d")?;
    image.write("/etc/app/app.conf", b"listen = 0.0.0.0:8080\nworkers = 4\n")?;
    for n in 0..20 {
        let name = format!("/etc/app/conf.d/{n:02}-module.conf");
        image.write(&name, format!("module = {n}\n").as_bytes())?;
    }

    // A file written in place and made durable, then renamed over.
    {
        let mut file = image.open_with(
            "/etc/app/state.tmp",
            OpenOptions::new().write(true).create_new(true).mode(0o600),
        )?;
        file.write_all(b"generation 2\n")?;
        file.sync_all()?;
    }
    image.write("/etc/app/state", b"generation 1\n")?;
    image.rename("/etc/app/state.tmp", "/etc/app/state")?;

    // Something bigger than one block, sparse in the middle.
    image.create_dir_all("/var/lib/app")?;
    {
        let mut file = image.create_file("/var/lib/app/data.bin")?;
        let chunk: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        file.write_all(&chunk)?;
        file.seek(SeekFrom::Start(10 << 20))?;
        file.write_all(&chunk)?;
        // Positioned I/O leaves the position alone (rewrites the same bytes).
        file.write_all_at(&chunk[..6], 0)?;
    }
    image.symlink("../../../etc/app/app.conf", "/var/lib/app/config")?;

    let mut listing = Vec::new();
    for entry in image.read_dir("/etc/app")? {
        listing.push(entry?.file_name().to_string_lossy().into_owned());
    }
    println!("/etc/app: {}", listing.join(" "));
    println!(
        "/etc/app/state: {}",
        image.read_to_string("/etc/app/state")?.trim_end()
    );
    image.close()?;
    println!("{path}: tree written and image closed cleanly");
    Ok(())
}
