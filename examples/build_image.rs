//! Build a small tree inside an existing ext2/3/4 image through the
//! library API: no FUSE, no root, no kernel mount.
//!
//! ```text
//! truncate -s 64M disk.img && mkfs.ext4 -q disk.img
//! cargo run --example build_image -- disk.img
//! e2fsck -fn disk.img
//! ```

use jext4::api::Image;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args()
        .nth(1)
        .ok_or("usage: build_image IMAGE (an ext2/3/4 image, e.g. made by mkfs.ext4)")?;
    let image = Image::open(&path)?;

    image.create_dir_all("/etc/app/conf.d")?;
    image.write_file("/etc/app/app.conf", b"listen = 0.0.0.0:8080\nworkers = 4\n")?;
    for n in 0..20 {
        let name = format!("/etc/app/conf.d/{n:02}-module.conf");
        image.write_file(&name, format!("module = {n}\n").as_bytes())?;
    }

    // A file written in place and made durable, then renamed over.
    {
        let file = image.create("/etc/app/state.tmp", 0o600)?;
        file.write_at(0, b"generation 2\n")?;
        file.sync_all()?;
    }
    image.write_file("/etc/app/state", b"generation 1\n")?;
    image.rename("/etc/app/state.tmp", "/etc/app/state")?;

    // Something bigger than one block, sparse in the middle.
    image.create_dir_all("/var/lib/app")?;
    {
        let file = image.create("/var/lib/app/data.bin", 0o644)?;
        let chunk: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        file.write_at(0, &chunk)?;
        file.write_at(10 << 20, &chunk)?;
    }
    image.symlink("../../../etc/app/app.conf", "/var/lib/app/config")?;

    let listing: Vec<String> = image
        .read_dir("/etc/app")?
        .into_iter()
        .map(|entry| String::from_utf8_lossy(&entry.name).into_owned())
        .collect();
    println!("/etc/app: {}", listing.join(" "));
    println!(
        "/etc/app/state: {}",
        String::from_utf8_lossy(&image.read_file("/etc/app/state")?).trim_end()
    );
    image.close()?;
    println!("{path}: tree written and image closed cleanly");
    Ok(())
}
