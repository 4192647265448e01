//! `kill -9` in the middle of `jext4 cp -a`: the image replays — by
//! e2fsck and by jext4, to the same state — consistent; every file in it
//! holds its source's bytes (a file cut short by the kill holds a prefix
//! of them, never other bytes); and running the same `cp -a` again
//! completes the copy.

// The jext4 binary, or the mounts and helpers of tests/common that use it.
#![cfg(feature = "cli")]

mod common;
#[path = "tools_support/mod.rs"]
mod tools_support;

use std::io::BufRead;
use std::process::Command;
use tools_support::{assert_same, jext4_tool, snapshot};

#[test]
fn a_killed_import_replays_clean_and_a_second_run_completes_it() {
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("tree");
    for directory in 0..24 {
        let sub = source.join(format!("dir{directory:02}"));
        std::fs::create_dir_all(&sub).unwrap();
        for file in 0..120 {
            let seed = (directory * 131 + file) as u8;
            let bytes: Vec<u8> = (0..(file % 7 + 1) * 9000)
                .map(|i| (i as u8) ^ seed)
                .collect();
            std::fs::write(sub.join(format!("file{file:03}")), bytes).unwrap();
        }
    }
    tools_support::settle_times(&source);
    // A small journal: it fills and commits many times during the copy.
    let image = common::mkfs(
        dir.path(),
        "killed",
        256,
        &["-t", "ext4", "-b", "1024", "-J", "size=1"],
    );
    // Into the root: the tree lands in /tree on every run (cp's rule for
    // an existing directory), so the second run merges into the first's.
    let dest = format!("{}:/", image.display());
    let mut child = Command::new(common::server::JEXT4)
        .args(["cp", "-a", "-v", "-j", "2", source.to_str().unwrap(), &dest])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Kill it half-way: after as many entries as half the tree (cp -v
    // says each one as it is done).
    let mut said = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    for _ in 0..1500 {
        said.next().unwrap().unwrap();
    }
    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
    let status = child.wait().unwrap();
    assert!(
        status.code().is_none(),
        "the copy ended before the kill ({status}): the tree is too small to catch it"
    );
    let crash = dir.path().join("crash.img");
    std::fs::copy(&image, &crash).unwrap();
    // e2fsck's and jext4's replays, on copies, agree and are clean.
    let replayed = common::server::replay_both(&crash);
    let (code, _, _) = jext4_tool(&["stat", &format!("{}:/tree", replayed.display())]);
    assert_eq!(
        code, 0,
        "no commit before the kill: the journal did not fill"
    );
    // What survived is the source's bytes, whole or cut short.
    let out = dir.path().join("survived");
    let (code, _, stderr) = jext4_tool(&[
        "cp",
        "-a",
        &format!("{}:/tree", replayed.display()),
        out.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{stderr}");
    let mut whole = 0;
    for entry in tools_support::walk(&out) {
        if !entry.is_file() {
            continue;
        }
        let relative = entry.strip_prefix(&out).unwrap();
        let ours = std::fs::read(&entry).unwrap();
        let theirs = std::fs::read(source.join(relative)).unwrap();
        assert!(
            theirs.starts_with(&ours),
            "{} holds bytes its source does not",
            relative.display()
        );
        whole += usize::from(ours.len() == theirs.len());
    }
    println!("{whole} files whole after the kill");
    // The same copy again, on the image the kill left (jext4 replays it
    // on open), completes it.
    let (code, _, stderr) = jext4_tool(&["cp", "-a", source.to_str().unwrap(), &dest]);
    assert_eq!(code, 0, "the second run: {stderr}");
    common::assert_fsck_clean(&image);
    let done = dir.path().join("done");
    let (code, _, stderr) =
        jext4_tool(&["cp", "-a", &format!("{dest}tree"), done.to_str().unwrap()]);
    assert_eq!(code, 0, "{stderr}");
    assert_same(&snapshot(&source), &snapshot(&done));
}
