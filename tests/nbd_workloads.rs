//! The core workloads over NBD: every mkfs flavour (ext2, ext3,
//! ext4 at 1 KiB and 4 KiB blocks) through the library, and a FUSE mount,
//! over nbdkit's `memory` plugin, its `file` plugin (TCP) and `qemu-nbd`
//! serving a qcow2 image. After each: `e2fsck -fn` clean, and a kernel
//! loop mount of the image (downloaded from the memory plugin; converted to
//! raw for qcow2, after `qemu-img check`) shows the same tree. Then the
//! journal's kill -9 test with the image behind nbdkit.

// The jext4 binary, or the mounts and helpers of tests/common that use it.
#![cfg(feature = "cli")]

mod common;
mod tools_support;

use common::e2e::{self, KernelMount};
use common::nbd::{Listen, NbdServer, download, servers_available, upload};
use jext4::Image;
use std::collections::BTreeMap;
use std::os::unix::fs::FileExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

const FLAVOURS: &[&str] = &["ext2-1k", "ext3-4k", "ext4-1k", "ext4-4k"];
const IMAGE_MIB: u64 = 32;

#[derive(Debug, Clone, PartialEq, Eq)]
enum Entry {
    Dir,
    File(Vec<u8>),
    Symlink(Vec<u8>),
}

type Tree = BTreeMap<String, Entry>;

/// How the image reaches the server, and how it comes back to a local raw
/// file for e2fsck and the kernel.
#[derive(Clone, Copy, Debug)]
enum Backend {
    /// nbdkit memory, Unix socket: uploaded through jext4's client,
    /// downloaded the same way.
    Memory,
    /// nbdkit file, TCP: the local image file itself.
    File,
    /// qemu-nbd qcow2, Unix socket: converted both ways with qemu-img.
    Qcow2,
}

struct Served {
    server: NbdServer,
    raw: PathBuf,
    qcow2: Option<PathBuf>,
    backend: Backend,
}

fn serve(dir: &Path, name: &str, mkfs: &[&str], backend: Backend) -> Served {
    let raw = common::mkfs(dir, name, IMAGE_MIB, mkfs);
    match backend {
        Backend::Memory => {
            let size = format!("size={IMAGE_MIB}M");
            let server = NbdServer::nbdkit(dir, name, Listen::Unix, &["memory", &size]);
            upload(&raw, &server.uri);
            Served {
                server,
                raw,
                qcow2: None,
                backend,
            }
        }
        Backend::File => {
            let server = NbdServer::nbdkit(dir, name, Listen::Tcp, &["file", e2e::path_str(&raw)]);
            Served {
                server,
                raw,
                qcow2: None,
                backend,
            }
        }
        Backend::Qcow2 => {
            let qcow2 = raw.with_extension("qcow2");
            e2e::run_ok(
                "qemu-img",
                &[
                    "convert",
                    "-f",
                    "raw",
                    "-O",
                    "qcow2",
                    e2e::path_str(&raw),
                    e2e::path_str(&qcow2),
                ],
            );
            let server = NbdServer::qemu_nbd(dir, name, &qcow2, "qcow2");
            Served {
                server,
                raw,
                qcow2: Some(qcow2),
                backend,
            }
        }
    }
}

impl Served {
    /// Stop the server and bring the image back into `raw`.
    fn finish(self) -> PathBuf {
        let Served {
            server,
            raw,
            qcow2,
            backend,
        } = self;
        match backend {
            Backend::Memory => download(&server.uri, &raw, IMAGE_MIB << 20),
            Backend::File => {}
            Backend::Qcow2 => {
                drop(server);
                let qcow2 = qcow2.unwrap();
                let check = e2e::run("qemu-img", &["check", e2e::path_str(&qcow2)]);
                assert!(
                    check.status.success(),
                    "qemu-img check {}:\n{}{}",
                    qcow2.display(),
                    String::from_utf8_lossy(&check.stdout),
                    String::from_utf8_lossy(&check.stderr)
                );
                e2e::run_ok(
                    "qemu-img",
                    &[
                        "convert",
                        "-f",
                        "qcow2",
                        "-O",
                        "raw",
                        e2e::path_str(&qcow2),
                        e2e::path_str(&raw),
                    ],
                );
            }
        }
        raw
    }
}

/// A mixed workload through the library: directories, files from empty to
/// a few MiB (several extents or indirect blocks), symlinks, renames,
/// unlinks, fsyncs. Returns the tree it leaves.
fn library_workload(image: &Image, seed: u64) -> Tree {
    let mut rng = common::workload::Rng::new(seed);
    let mut tree = Tree::new();
    for dir in ["a", "a/b", "a/b/c", "d"] {
        image.create_dir(format!("/{dir}")).unwrap();
        tree.insert(dir.into(), Entry::Dir);
    }
    for n in 0..120 {
        let dir = ["a", "a/b", "a/b/c", "d"][n % 4];
        let path = format!("{dir}/f{n}");
        let len = match n % 10 {
            0 => 0,
            1 => 1 << 20,
            _ => rng.below(20_000) as usize,
        };
        let data = rng.bytes(len);
        let file = image
            .open_with(
                format!("/{path}"),
                jext4::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .create(true)
                    .mode(0o644),
            )
            .unwrap();
        // In pieces, so that files grow over several writes.
        for (index, piece) in data.chunks(256 * 1024).enumerate() {
            file.write_all_at(piece, index as u64 * 256 * 1024).unwrap();
        }
        if n % 7 == 0 {
            file.sync_all().unwrap();
        }
        tree.insert(path, Entry::File(data));
    }
    for n in (0..120).step_by(5) {
        let path = format!("{}/f{n}", ["a", "a/b", "a/b/c", "d"][n % 4]);
        let renamed = format!("d/r{n}");
        image
            .rename(format!("/{path}"), format!("/{renamed}"))
            .unwrap();
        let entry = tree.remove(&path).unwrap();
        tree.insert(renamed, entry);
    }
    for n in (3..120).step_by(11) {
        let path = format!("{}/f{n}", ["a", "a/b", "a/b/c", "d"][n % 4]);
        if tree.remove(&path).is_some() {
            image.remove_file(format!("/{path}")).unwrap();
        }
    }
    let long_target = "t/".repeat(40);
    for (name, target) in [("a/short", "b/c"), ("d/long", long_target.as_str())] {
        image.symlink(target, format!("/{name}")).unwrap();
        tree.insert(name.into(), Entry::Symlink(target.as_bytes().to_vec()));
    }
    image.sync().unwrap();
    tree
}

/// The tree under `root` as the kernel shows it (lost+found left out).
fn kernel_tree(root: &Path) -> Tree {
    let mut tree = Tree::new();
    let mut pending = vec![PathBuf::new()];
    while let Some(relative) = pending.pop() {
        for entry in std::fs::read_dir(root.join(&relative)).unwrap() {
            let entry = entry.unwrap();
            let path = relative.join(entry.file_name());
            let name = path.to_str().unwrap().to_string();
            if name == "lost+found" {
                continue;
            }
            let kind = entry.file_type().unwrap();
            let value = if kind.is_dir() {
                pending.push(path.clone());
                Entry::Dir
            } else if kind.is_symlink() {
                use std::os::unix::ffi::OsStrExt;
                Entry::Symlink(
                    std::fs::read_link(entry.path())
                        .unwrap()
                        .as_os_str()
                        .as_bytes()
                        .to_vec(),
                )
            } else {
                Entry::File(std::fs::read(entry.path()).unwrap())
            };
            tree.insert(name, value);
        }
    }
    tree
}

fn check_with_kernel(raw: &Path, expected: &Tree, what: &str) {
    e2e::fsck_clean(raw, what);
    let mountpoint = raw.with_extension("kernel");
    let kernel = KernelMount::mount(raw, &mountpoint, true);
    let seen = kernel_tree(&kernel.mountpoint);
    kernel.unmount();
    if &seen != expected {
        let missing: Vec<_> = expected
            .keys()
            .filter(|k| !seen.contains_key(*k))
            .take(5)
            .collect();
        let differing: Vec<_> = expected
            .iter()
            .filter(|(k, v)| seen.get(*k).is_some_and(|s| s != *v))
            .map(|(k, _)| k)
            .take(5)
            .collect();
        let extra: Vec<_> = seen
            .keys()
            .filter(|k| !expected.contains_key(*k))
            .take(5)
            .collect();
        panic!(
            "{what}: the kernel sees another tree: missing {missing:?}, differing {differing:?}, extra {extra:?}"
        );
    }
}

fn library_flavours(backend: Backend) {
    if !servers_available() || !e2e::require_e2e() {
        return;
    }
    let dir = e2e::scratch(&format!("nbd-library-{backend:?}").to_lowercase());
    for (index, flavour) in FLAVOURS.iter().enumerate() {
        let served = serve(dir.path(), flavour, common::variant_args(flavour), backend);
        let image = Image::open(&served.server.uri).unwrap_or_else(|e| panic!("{flavour}: {e}"));
        let tree = library_workload(&image, index as u64 + 1);
        image.close().unwrap();
        let raw = served.finish();
        check_with_kernel(&raw, &tree, &format!("{flavour} over {backend:?}"));
    }
}

#[test]
fn library_over_nbdkit_memory() {
    library_flavours(Backend::Memory);
}

#[test]
fn library_over_nbdkit_file_tcp() {
    library_flavours(Backend::File);
}

#[test]
fn library_over_qemu_nbd_qcow2() {
    library_flavours(Backend::Qcow2);
}

/// A FUSE mount of the export: a real tree copied in, then the e2e
/// snapshot of the mount against the kernel's view of the image.
fn fuse_mount(backend: Backend, flavour: &str) {
    if !servers_available() || !e2e::require_e2e() {
        return;
    }
    let dir = e2e::scratch(&format!("nbd-fuse-{backend:?}").to_lowercase());
    let served = serve(dir.path(), flavour, common::variant_args(flavour), backend);
    let (mount, mountpoint) = common::nbd::mount(dir.path(), &served.server.uri);
    e2e::copy_real_tree(&mountpoint.join("tree"), 800, 8 << 20);
    let data = e2e::pattern(7, 300_000);
    std::fs::write(mountpoint.join("fsynced"), &data).unwrap();
    std::fs::File::open(mountpoint.join("fsynced"))
        .unwrap()
        .sync_all()
        .unwrap();
    e2e::syncfs(&mountpoint);
    let written = e2e::snapshot(&mountpoint);
    mount.unmount();
    let raw = served.finish();
    e2e::fsck_clean(
        &raw,
        &format!("{flavour} over {backend:?} after a FUSE mount"),
    );
    let kernel = KernelMount::mount(&raw, &dir.path().join("kernel"), true);
    let seen = e2e::snapshot(&kernel.mountpoint);
    kernel.unmount();
    e2e::assert_same(&written, &seen, ("jext4 over NBD", "kernel"));
}

#[test]
fn fuse_mount_over_nbdkit_memory() {
    fuse_mount(Backend::Memory, "ext4-1k");
}

#[test]
fn fuse_mount_over_nbdkit_file_tcp() {
    fuse_mount(Backend::File, "ext3-4k");
}

#[test]
fn fuse_mount_over_qemu_nbd_qcow2() {
    fuse_mount(Backend::Qcow2, "ext4-4k");
}

/// tests/journal_kill.rs with the image behind nbdkit's file plugin: the
/// jext4 server is killed at a random moment of the mixed workload; what
/// it had sent is in nbdkit's file, and both replays (e2fsck's, jext4's)
/// must be clean, alike and hold every fsync'd name.
#[test]
fn kill9_over_nbd() {
    use common::server::{Server, replay_both};
    use common::workload::{self, Rng};
    if !servers_available() || !common::server::fuse_available() {
        return;
    }
    let dir = common::server::KeepOnPanic::new();
    let tarball = workload::doc_tarball(dir.path());
    let seed = workload::seed_from_env("JEXT4_KILL_SEED");
    let mut rng = Rng::new(seed ^ 0x6e6264);
    let rounds = workload::env_number("JEXT4_NBD_KILL_ROUNDS", 1);
    for round in 0..rounds {
        let image = common::mkfs(
            dir.path(),
            &format!("kill-{round}"),
            32,
            &["-t", "ext4", "-b", "1024"],
        );
        let nbd = NbdServer::nbdkit(
            dir.path(),
            &format!("kill-{round}"),
            Listen::Unix,
            &["file", e2e::path_str(&image)],
        );
        let server = Server::start_named(nbd.uri.as_ref(), &image, "commit=1");
        let running = workload::start(&server.mountpoint, &tarball, rng.next_u64(), round % 2 == 1);
        let delay = std::time::Duration::from_millis(300 + rng.below(1500));
        std::thread::sleep(delay);
        running.expect_kill();
        server.kill9().assert_killed();
        let outcome = running.join();
        drop(nbd);
        assert!(common::journal::dumpe2fs_needs_recovery(&image));
        let recovered = replay_both(&image);
        let checked = workload::verify_model(&recovered, "", &outcome.model);
        println!(
            "round {round} (seed {seed}): killed after {delay:?}; {}; {checked} names verified",
            outcome.summary()
        );
    }
}

/// Crash states through the recording layer on top of the NBD device: a
/// workload of fsync'd files and atomic replacements runs on the engine
/// over `RecordingDevice(NbdDevice)`; every write and flush the client
/// completed is logged. The export then holds exactly the base image with
/// every logged write applied in order; and each planned crash state (a
/// prefix ending at a flush, plus some of the next epoch's writes, some
/// torn) recovers with jext4 to a filesystem that holds every file
/// acknowledged before the state's closing flush, e2fsck-clean on a
/// sample.
#[test]
fn crash_states_recorded_over_nbd() {
    use jext4::engine::crash::states;
    use jext4::engine::dev::{BlockDevice, MemoryDevice, Record, RecordingDevice};
    use jext4::engine::fs::{Caller, Fs, MountOptions, RenameFlags};
    use std::sync::Arc;
    const ROOT: u32 = 2;
    if !servers_available() || !common::require_tool("e2fsck") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let raw = common::mkfs(dir.path(), "crash", 16, &["-t", "ext4", "-b", "1024"]);
    let base = std::fs::read(&raw).unwrap();
    let server = NbdServer::nbdkit(dir.path(), "crash", Listen::Unix, &["memory", "size=16M"]);
    upload(&raw, &server.uri);
    let nbd: Arc<dyn BlockDevice> = Arc::new(common::nbd::device(&server.uri));
    let device = Arc::new(RecordingDevice::new(nbd));
    let fs = Fs::mount(device.clone(), MountOptions::default()).unwrap();
    device.take_log(); // the mount's own writes: part of the base below
    let base = {
        let mut bytes = vec![0u8; base.len()];
        device.inner().read_at(0, &mut bytes).unwrap();
        bytes
    };
    let content = |n: usize| e2e::pattern(n as u64 + 100, 500 + n * 301 % 5000);
    for n in 0..30 {
        // Write to a temporary name, fsync, rename over the final name.
        device.mark(format!("begin {n}"));
        let temp = fs.create(ROOT, b"tmp", 0o644, Caller::ROOT).unwrap();
        fs.write(temp.ino, 0, &content(n), Caller::ROOT).unwrap();
        fs.fsync(temp.ino, false).unwrap();
        let name = format!("f{}", n % 12);
        fs.rename(
            ROOT,
            b"tmp",
            ROOT,
            name.as_bytes(),
            RenameFlags::default(),
            Caller::ROOT,
        )
        .unwrap();
        fs.fsync(ROOT, false).unwrap();
        device.mark(format!("ack {n}"));
    }
    fs.unmount().unwrap();
    let log = device.take_log();
    drop(fs);

    // The export holds what the log says the client wrote.
    let mut expected = base.clone();
    for record in &log {
        if let Record::Write { offset, data } = record {
            expected[*offset as usize..*offset as usize + data.len()].copy_from_slice(data);
        }
    }
    let served = dir.path().join("served.img");
    download(&server.uri, &served, expected.len() as u64);
    assert!(
        std::fs::read(&served).unwrap() == expected,
        "the export differs from the recorded writes"
    );

    let epochs = states::epochs(&log);
    let plan = states::plan(&log, 60, 7, true);
    assert!(plan.len() >= 40, "{} states planned", plan.len());
    for (checked, state) in plan.iter().enumerate() {
        let mut image = base.clone();
        let opening = epochs[state.epoch].start;
        let mut write = |offset: u64, data: &[u8]| {
            image[offset as usize..offset as usize + data.len()].copy_from_slice(data);
            Ok(())
        };
        for record in &log[..opening] {
            if let Record::Write { offset, data } = record {
                write(*offset, data).unwrap();
            }
        }
        states::apply(&log, state, &mut write).unwrap();
        // The newest acknowledged version of each name must be there.
        let mut want: BTreeMap<String, usize> = BTreeMap::new();
        for record in &log[..state.acked_before] {
            if let Record::Mark(mark) = record
                && let Some(n) = mark.strip_prefix("ack ")
            {
                let n: usize = n.parse().unwrap();
                want.insert(format!("f{}", n % 12), n);
            }
        }
        let begun: Vec<usize> = log[..state.begun_before]
            .iter()
            .filter_map(|record| match record {
                Record::Mark(mark) => mark.strip_prefix("begin ")?.parse().ok(),
                _ => None,
            })
            .collect();
        let memory = Arc::new(MemoryDevice::from_bytes(image));
        let fs = Fs::mount(memory.clone(), MountOptions::default())
            .unwrap_or_else(|e| panic!("state {}: recovery: {e}", state.describe()));
        for (name, n) in &want {
            let attr = fs.lookup(ROOT, name.as_bytes()).unwrap_or_else(|e| {
                panic!("state {}: {name} (ack {n}) missing: {e}", state.describe())
            });
            // A later replacement may show too if it had begun: its data
            // was fsync'd before its rename.
            let data = fs.read(attr.ino, 0, 1 << 20).unwrap();
            assert!(
                (*n..30)
                    .step_by(12)
                    .any(|version| (version == *n || begun.contains(&version))
                        && data == content(version)),
                "state {}: {name} is neither version {n} nor a later one",
                state.describe()
            );
        }
        fs.unmount().unwrap();
        drop(fs);
        if checked % 4 == 0 {
            let path = dir.path().join("state.img");
            std::fs::write(&path, memory.snapshot()).unwrap();
            e2e::fsck_clean(&path, &format!("state {}", state.describe()));
        }
    }
}

/// `jext4 stats` of an image that is not mounted: the superblocks'
/// figures, the same as dumpe2fs's, the same through an NBD URI as from
/// the file; an image a jext4 server holds is refused, naming it (its
/// on-disk figures lag the live mount's).
#[test]
fn stats_of_an_unmounted_image_file_and_uri() {
    if !servers_available() || !e2e::require_e2e() {
        return;
    }
    let dir = e2e::scratch("nbd-stats");
    let raw = common::mkfs(
        dir.path(),
        "img",
        IMAGE_MIB,
        &["-t", "ext4", "-b", "1024", "-O", "fast_commit"],
    );
    let stats = |target: &str| {
        let output = e2e::run(common::server::JEXT4, &["stats", target]);
        let text = String::from_utf8_lossy(&output.stdout).into_owned();
        let said = String::from_utf8_lossy(&output.stderr).into_owned();
        (output.status.success(), text, said)
    };
    let (ok, local, said) = stats(e2e::path_str(&raw));
    assert!(ok, "{said}");
    let field = |report: &str, name: &str| -> String {
        report
            .lines()
            .find_map(|line| line.strip_prefix(&format!("{name} ")))
            .unwrap_or_else(|| panic!("no {name} in:\n{report}"))
            .to_string()
    };
    let header = e2e::run_ok("dumpe2fs", &["-h", e2e::path_str(&raw)]);
    let header = String::from_utf8_lossy(&header.stdout).into_owned();
    let dumped = |name: &str| -> String {
        header
            .lines()
            .find_map(|line| line.strip_prefix(&format!("{name}:")))
            .unwrap_or_else(|| panic!("dumpe2fs says no {name}"))
            .trim()
            .to_string()
    };
    assert_eq!(field(&local, "mounted"), "false");
    assert_eq!(field(&local, "blocks_free"), dumped("Free blocks"));
    assert_eq!(field(&local, "inodes_free"), dumped("Free inodes"));
    assert_eq!(field(&local, "blocks_total"), dumped("Block count"));
    assert_eq!(field(&local, "needs_recovery"), "false");
    let features = field(&local, "features");
    for feature in dumped("Filesystem features").split_whitespace() {
        assert!(
            features.split(' ').any(|f| f == feature),
            "{feature} missing from {features}"
        );
    }
    assert!(
        field(&local, "journal_fast_commit_blocks")
            .parse::<u32>()
            .unwrap()
            > 0
    );

    let server = NbdServer::nbdkit(
        dir.path(),
        "stats",
        Listen::Unix,
        &["--readonly", "file", e2e::path_str(&raw)],
    );
    let (ok, remote, said) = stats(&server.uri);
    assert!(ok, "{said}");
    assert_eq!(remote, local, "the URI's report differs from the file's");
    drop(server);

    let mountpoint = dir.path().join("mnt");
    let mount = e2e::JextMount::mount(&raw, &mountpoint, "");
    let (ok, _, said) = stats(e2e::path_str(&raw));
    assert!(!ok, "stats of a mounted image's file succeeded");
    assert!(
        said.contains("in use by pid") && said.contains("MOUNTPOINT"),
        "{said}"
    );
    let (ok, live, said) = stats(e2e::path_str(&mountpoint));
    assert!(ok && field(&live, "mounted") == "true", "{said}");
    mount.unmount();
}

/// The image tools on an image behind NBD (`--image URI`, paths as
/// `:PATH`): the image tools' tree (every kind of entry `cp -a` keeps)
/// copied in with `cp -a` and a GNU tar archive of it unpacked with
/// `tar -x`, listed, read and removed, the tree copied back out; then the
/// image, downloaded, is `e2fsck -fn` clean and a kernel loop mount shows
/// the tree as the source has it.
#[test]
fn image_tools_over_nbd() {
    if !servers_available() || !e2e::require_e2e() {
        return;
    }
    let dir = e2e::scratch("nbd-tools");
    let served = serve(dir.path(), "tools", &["-t", "ext4"], Backend::Memory);
    let uri = served.server.uri.clone();
    let source = dir.path().join("source");
    tools_support::build_tree(&source.join("tree"));
    let wanted = tools_support::snapshot(&source.join("tree"));
    let archive = dir.path().join("tree.tar");
    e2e::run_ok(
        "tar",
        &[
            "-cf",
            e2e::path_str(&archive),
            "-C",
            e2e::path_str(&source),
            "tree",
        ],
    );
    let verb = |args: &[&str]| {
        let mut all = vec![args[0], "--image", &uri];
        all.extend_from_slice(&args[1..]);
        e2e::run(common::server::JEXT4, &all)
    };
    let verb_ok = |args: &[&str]| {
        let output = verb(args);
        assert!(
            output.status.success(),
            "jext4 {args:?} over NBD failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    };
    verb_ok(&["mkdir", "-p", ":/in/untar"]);
    verb_ok(&["cp", "-a", e2e::path_str(&source.join("tree")), ":/in/tree"]);
    verb_ok(&["tar", "-x", "-f", e2e::path_str(&archive), ":/in/untar"]);
    let listing = verb_ok(&["ls", ":/in"]);
    assert_eq!(listing.lines().collect::<Vec<_>>(), ["tree", "untar"]);
    let listing = verb_ok(&["ls", ":/in/untar"]);
    assert_eq!(listing.trim(), "tree");
    // A file of the tree, read back by cat, is the source's.
    let (name, bytes) = wanted
        .keys()
        .map(|relative| source.join("tree").join(relative))
        .find(|path| path.symlink_metadata().unwrap().is_file())
        .map(|path| (path.clone(), std::fs::read(&path).unwrap()))
        .expect("the tree has a file");
    let inside = format!(
        ":/in/tree/{}",
        name.strip_prefix(source.join("tree")).unwrap().display()
    );
    let cat = verb(&["cat", &inside]);
    assert!(cat.status.success());
    assert_eq!(cat.stdout, bytes, "cat {inside} over NBD");
    verb_ok(&["rm", "-r", ":/in/untar"]);
    let gone = verb(&["ls", ":/in/untar"]);
    assert_eq!(gone.status.code(), Some(2), "ls of a removed directory");
    assert!(
        String::from_utf8_lossy(&gone.stderr).contains("No such file or directory"),
        "{}",
        String::from_utf8_lossy(&gone.stderr)
    );
    let out = dir.path().join("out");
    std::fs::create_dir(&out).unwrap();
    verb_ok(&["cp", "-a", ":/in/tree", e2e::path_str(&out)]);
    tools_support::assert_same(&wanted, &tools_support::snapshot(&out.join("tree")));
    let raw = served.finish();
    e2e::fsck_clean(&raw, "after the image tools over NBD");
    let kernel = KernelMount::mount(&raw, &dir.path().join("kernel"), true);
    let seen = tools_support::snapshot(&kernel.mountpoint.join("in/tree"));
    kernel.unmount();
    tools_support::assert_same(&wanted, &seen);
}
