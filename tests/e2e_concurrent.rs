//! Several processes' worth of threads changing one jext4 mount at once
//! (the FUSE server runs several workers): creates, writes, appends,
//! renames across shared directories, links, unlinks of open files,
//! mkdir/rmdir, xattrs, while another thread walks the tree. Afterwards
//! e2fsck is clean and the kernel reads what jext4 showed.

// The jext4 binary, or the mounts and helpers of tests/common that use it.
#![cfg(feature = "cli")]

mod common;

use jext4::engine::rng::Rng;

use common::e2e::{self, JextMount, KernelMount};
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

const WORKERS: u64 = 4;
const STEPS: u64 = 3000;

/// One worker's steps. Errors a concurrent change explains (the name went
/// away or appeared meanwhile, a directory became non-empty) are expected;
/// anything else fails the test.
fn worker(root: &Path, id: u64) {
    let mut rng = Rng::derive(id, "worker");
    let own = root.join(format!("w{id}"));
    let shared = root.join("shared");
    fs::create_dir_all(&own).unwrap();
    let mut open_unlinked = Vec::new();
    for step in 0..STEPS {
        let pick = |rng: &mut Rng, dir: &Path| dir.join(format!("f{}", rng.below(40)));
        let own_file = pick(&mut rng, &own);
        let shared_file = pick(&mut rng, &shared);
        let result: std::io::Result<()> = match rng.below(12) {
            0 | 1 => fs::write(&own_file, e2e::pattern(step, rng.below(20_000) as usize)),
            2 => fs::OpenOptions::new()
                .append(true)
                .create(true)
                .open(&shared_file)
                .and_then(|mut file| file.write_all(&e2e::pattern(step, 3000))),
            3 => fs::rename(&own_file, &shared_file),
            4 => fs::rename(&shared_file, &own_file),
            5 => fs::remove_file(&shared_file),
            6 => fs::hard_link(&own_file, pick(&mut rng, &shared)),
            7 => fs::create_dir(own.join(format!("d{}", rng.below(5))))
                .and_then(|()| fs::write(own.join(format!("d{}/x", rng.below(5))), b"x")),
            8 => fs::remove_dir(own.join(format!("d{}", rng.below(5)))),
            9 => e2e::set_xattr(
                &own_file,
                "user.step",
                &e2e::pattern(step, rng.below(300) as usize),
            ),
            10 => fs::OpenOptions::new()
                .read(true)
                .open(&own_file)
                .and_then(|file| {
                    fs::remove_file(&own_file)?;
                    open_unlinked.push(file);
                    if open_unlinked.len() > 5 {
                        open_unlinked.remove(0);
                    }
                    Ok(())
                }),
            _ => fs::OpenOptions::new()
                .write(true)
                .open(&own_file)
                .and_then(|file| file.set_len(rng.below(30_000))),
        };
        if let Err(error) = result {
            let expected = matches!(
                error.raw_os_error(),
                Some(libc::ENOENT | libc::EEXIST | libc::ENOTEMPTY | libc::ENODATA)
            );
            assert!(expected, "worker {id} step {step}: {error}");
        }
    }
}

fn walker(root: PathBuf, stop: Arc<AtomicBool>) -> usize {
    let mut walks = 0;
    while !stop.load(Ordering::Acquire) {
        let mut pending = vec![root.clone()];
        while let Some(dir) = pending.pop() {
            let Ok(entries) = fs::read_dir(&dir) else {
                continue;
            };
            for entry in entries.flatten() {
                let path = entry.path();
                match fs::symlink_metadata(&path) {
                    Ok(meta) if meta.is_dir() => pending.push(path),
                    Ok(meta) if meta.is_file() => {
                        let _ = fs::read(&path);
                    }
                    _ => {}
                }
            }
        }
        walks += 1;
    }
    walks
}

#[test]
fn e2e_concurrent() {
    if !e2e::require_e2e() {
        return;
    }
    let scratch = e2e::scratch("concurrent");
    let image = common::mkfs(scratch.path(), "concurrent", 128, &["-t", "ext4"]);
    let mnt = scratch.path().join("mnt");
    let mount = JextMount::mount(&image, &mnt, "threads=8");
    fs::create_dir(mnt.join("shared")).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let walking = {
        let (root, stop) = (mnt.clone(), Arc::clone(&stop));
        std::thread::spawn(move || walker(root, stop))
    };
    let workers: Vec<_> = (0..WORKERS)
        .map(|id| {
            let root = mnt.clone();
            std::thread::spawn(move || worker(&root, id))
        })
        .collect();
    for handle in workers {
        handle.join().expect("a worker failed");
    }
    stop.store(true, Ordering::Release);
    let walks = walking.join().expect("the walker failed");
    e2e::syncfs(&mnt);
    let seen_by_jext4 = e2e::snapshot(&mnt);
    mount.unmount();
    e2e::fsck_clean(&image, "after concurrent changes");
    let kernel = KernelMount::mount(&image, &mnt, true);
    let seen_by_kernel = e2e::snapshot(&mnt);
    kernel.unmount();
    e2e::assert_same(&seen_by_jext4, &seen_by_kernel, ("jext4", "kernel"));
    eprintln!(
        "concurrent: {WORKERS} workers × {STEPS} steps, {walks} walks, {} names at the end",
        seen_by_jext4.len()
    );
}
