//! Writing attributes with `format::xattr::set` over images the kernel
//! prepared, checked three ways: against an in-memory model after every
//! step (proptest), by `e2fsck -fn` on the written image, and by the kernel
//! reading (and changing) what we wrote through a loop mount.
//!
//! The prepared images hold two empty files, a directory, and three files
//! with identical attributes in a block that the kernel shares between them
//! (h_refcount 3), so copy-on-write and shared releases are exercised.

mod common;
mod xattr_support;

use jext4::Error;
use jext4::engine::format::acl::{self, AclEntry, UNDEFINED_ID, tag};
use jext4::engine::format::xattr::SetMode;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use xattr_support::{Image, Mount, inode_number, kernel_get, kernel_list, kernel_set, run};

const VARIANTS: &[(&str, &[&str])] = &[
    ("ext4-4k-256", &["-t", "ext4", "-b", "4096", "-I", "256"]),
    ("ext4-1k-256", &["-t", "ext4", "-b", "1024", "-I", "256"]),
    ("ext3-1k-128", &["-t", "ext3", "-b", "1024", "-I", "128"]),
];

const FILES: &[&str] = &["f0", "f1", "d0", "s0", "s1", "s2"];
const SHARED: &[&str] = &["s0", "s1", "s2"];
const NAMES: &[&[u8]] = &[
    b"user.a",
    b"user.bb",
    b"user.ccc",
    b"trusted.t",
    b"security.selinux",
    b"user.a_rather_long_attribute_name",
    b"user.shared",
    b"user.other",
    b"gnu.translator",
];
const ACL_ACCESS: &[u8] = b"system.posix_acl_access";
const ACL_DEFAULT: &[u8] = b"system.posix_acl_default";

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| seed.wrapping_add((i * 13) as u8))
        .collect()
}

/// The values the kernel gave the shared files.
fn shared_values() -> Vec<(&'static [u8], Vec<u8>)> {
    vec![
        (b"user.shared", pattern(5, 300)),
        (b"user.other", pattern(6, 150)),
    ]
}

struct Base {
    variant: &'static str,
    bytes: Vec<u8>,
    inos: Vec<u32>,
    block_size: usize,
}

/// mke2fs, then let the kernel create the files (and the shared block).
fn base_image(variant: &'static str, args: &[&str]) -> Option<Base> {
    let dir = tempfile::tempdir().unwrap();
    let image = common::mkfs(dir.path(), variant, 16, args);
    let mount = Mount::new(&image, &dir.path().join("mnt"))?;
    for &file in FILES {
        let path = mount.path(file);
        if file.starts_with('d') {
            std::fs::create_dir(&path).unwrap();
        } else {
            std::fs::write(&path, b"").unwrap();
        }
        if SHARED.contains(&file) {
            for (name, value) in shared_values() {
                kernel_set(&path, name, &value).unwrap();
            }
        }
    }
    let inos = FILES.iter().map(|f| inode_number(&mount.path(f))).collect();
    mount.unmount();
    common::assert_fsck_clean(&image);
    let bytes = std::fs::read(&image).unwrap();
    let block_size = Image::from_bytes(bytes.clone()).geo.block_size as usize;
    Some(Base {
        variant,
        bytes,
        inos,
        block_size,
    })
}

fn entry(tag: u16, perm: u16, id: u32) -> AclEntry {
    AclEntry { tag, perm, id }
}

/// ACL values in the VFS format: `None` removes, the first is empty (which
/// also removes), the others are real ACLs.
fn acl_value(which: usize) -> Option<Vec<u8>> {
    let acls: [&[AclEntry]; 3] = [
        &[],
        &[
            entry(tag::USER_OBJ, 6, UNDEFINED_ID),
            entry(tag::GROUP_OBJ, 4, UNDEFINED_ID),
            entry(tag::OTHER, 4, UNDEFINED_ID),
        ],
        &[
            entry(tag::USER_OBJ, 7, UNDEFINED_ID),
            entry(tag::USER, 6, 1000),
            entry(tag::USER, 4, 1001),
            entry(tag::GROUP_OBJ, 5, UNDEFINED_ID),
            entry(tag::GROUP, 1, 100),
            entry(tag::MASK, 7, UNDEFINED_ID),
            entry(tag::OTHER, 0, UNDEFINED_ID),
        ],
    ];
    which.checked_sub(1).map(|i| acl::encode_xattr(acls[i]))
}

#[derive(Debug, Clone)]
enum Op {
    Set {
        file: usize,
        name: usize,
        len: usize,
        seed: u8,
        mode: u8,
    },
    Remove {
        file: usize,
        name: usize,
    },
    Acl {
        file: usize,
        default: bool,
        which: usize,
    },
}

fn op_strategy(max_len: usize) -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0..FILES.len(), 0..NAMES.len(), 0..=max_len, any::<u8>(), 0..3u8).prop_map(
            |(file, name, len, seed, mode)| Op::Set { file, name, len, seed, mode }
        ),
        3 => (0..FILES.len(), 0..NAMES.len()).prop_map(|(file, name)| Op::Remove { file, name }),
        1 => (0..FILES.len(), any::<bool>(), 0..4usize)
            .prop_map(|(file, default, which)| Op::Acl { file, default, which }),
    ]
}

type Model = Vec<BTreeMap<Vec<u8>, Vec<u8>>>;

fn initial_model() -> Model {
    FILES
        .iter()
        .map(|file| {
            let mut attributes = BTreeMap::new();
            if SHARED.contains(file) {
                for (name, value) in shared_values() {
                    attributes.insert(name.to_vec(), value);
                }
            }
            attributes
        })
        .collect()
}

fn mode_of(mode: u8) -> SetMode {
    [SetMode::Any, SetMode::Create, SetMode::Replace][mode as usize]
}

/// Apply `op` to the image and to the model; the two must agree on the
/// outcome.
fn apply(image: &mut Image, base: &Base, model: &mut Model, op: &Op) -> Result<(), TestCaseError> {
    match *op {
        Op::Set {
            file,
            name,
            len,
            seed,
            mode,
        } => {
            let (name, value, mode) = (NAMES[name], pattern(seed, len), mode_of(mode));
            let result = image.set(base.inos[file], name, Some(&value), mode);
            let present = model[file].contains_key(name);
            let expected = match (present, mode) {
                (true, SetMode::Create) => Err("exists"),
                (false, SetMode::Replace) => Err("no attribute"),
                _ => Ok(()),
            };
            prop_assert_eq!(outcome(&result), expected, "{:?}", op);
            if result.is_ok() {
                model[file].insert(name.to_vec(), value);
            }
        }
        Op::Remove { file, name } => {
            let result = image.set(base.inos[file], NAMES[name], None, SetMode::Any);
            let removed = model[file].remove(NAMES[name]);
            let expected = if removed.is_some() {
                Ok(())
            } else {
                Err("no attribute")
            };
            prop_assert_eq!(outcome(&result), expected, "{:?}", op);
        }
        Op::Acl {
            file,
            default,
            which,
        } => {
            let name = if default { ACL_DEFAULT } else { ACL_ACCESS };
            let value = acl_value(which);
            let result = image.set(base.inos[file], name, value.as_deref(), SetMode::Create);
            let non_empty = value.filter(|v| v.len() > 4);
            if default && !FILES[file].starts_with('d') {
                let expected = if non_empty.is_some() {
                    Err("denied")
                } else {
                    Ok(())
                };
                prop_assert_eq!(outcome(&result), expected, "{:?}", op);
                return Ok(());
            }
            // The VFS ignores XATTR_CREATE for ACLs; removing an absent one succeeds.
            prop_assert_eq!(outcome(&result), Ok(()), "{:?}", op);
            match non_empty {
                Some(value) => model[file].insert(name.to_vec(), value),
                None => model[file].remove(name),
            };
        }
    }
    Ok(())
}

fn outcome(result: &Result<(), Error>) -> Result<(), &'static str> {
    match result {
        Ok(()) => Ok(()),
        Err(Error::Exists) => Err("exists"),
        Err(Error::NoAttribute) => Err("no attribute"),
        Err(Error::PermissionDenied) => Err("denied"),
        Err(Error::NoSpace) => Err("no space"),
        Err(other) => panic!("unexpected error {other}"),
    }
}

/// Every file reads back exactly as the model says.
fn check_reads(image: &Image, base: &Base, model: &Model) -> Result<(), TestCaseError> {
    for (file, attributes) in model.iter().enumerate() {
        let ino = base.inos[file];
        for &name in NAMES.iter().chain([ACL_ACCESS, ACL_DEFAULT].iter()) {
            let ours = image.get(ino, name).unwrap();
            prop_assert_eq!(
                ours.as_ref(),
                attributes.get(name),
                "{} {:?}",
                FILES[file],
                name
            );
        }
        let listed: BTreeSet<Vec<u8>> = image.list(ino).unwrap().into_iter().collect();
        let modelled: BTreeSet<Vec<u8>> = attributes.keys().cloned().collect();
        prop_assert_eq!(listed, modelled, "{}", FILES[file]);
    }
    Ok(())
}

/// i_blocks, h_refcount and the bitmap agree with who references what.
fn check_accounting(
    image: &Image,
    base: &Base,
    initial: &[(u64, u64)],
    ever_used: &BTreeSet<u64>,
) -> Result<(), TestCaseError> {
    let sectors = base.block_size as u64 / 512;
    let mut references: BTreeMap<u64, u32> = BTreeMap::new();
    for (file, &ino) in base.inos.iter().enumerate() {
        let inode = image.inode(ino);
        let (blocks, acl) = initial[file];
        let data_sectors = blocks - if acl != 0 { sectors } else { 0 };
        let expected = data_sectors + if inode.file_acl != 0 { sectors } else { 0 };
        prop_assert_eq!(inode.blocks, expected, "i_blocks of {}", FILES[file]);
        if inode.file_acl != 0 {
            *references.entry(inode.file_acl).or_default() += 1;
        }
    }
    for (&block, &count) in &references {
        let buffer = image.cache.read(block).unwrap();
        let refcount = u32::from_le_bytes(buffer.read()[4..8].try_into().unwrap());
        prop_assert_eq!(refcount, count, "h_refcount of block {}", block);
        prop_assert!(image.alloc.is_in_use(block), "block {} in use", block);
    }
    for block in ever_used.difference(&references.keys().copied().collect()) {
        prop_assert!(!image.alloc.is_in_use(*block), "block {} was freed", block);
    }
    Ok(())
}

fn run_case(base: &Base, ops: &[Op]) -> Result<(), TestCaseError> {
    let mut image = Image::from_bytes(base.bytes.clone());
    let mut model = initial_model();
    let initial: Vec<(u64, u64)> = base
        .inos
        .iter()
        .map(|&ino| {
            let inode = image.inode(ino);
            (inode.blocks, inode.file_acl)
        })
        .collect();
    let mut ever_used: BTreeSet<u64> = initial.iter().map(|&(_, acl)| acl).collect();
    ever_used.remove(&0);
    for op in ops {
        apply(&mut image, base, &mut model, op)?;
        check_reads(&image, base, &model)?;
        for &ino in &base.inos {
            let acl = image.inode(ino).file_acl;
            if acl != 0 {
                ever_used.insert(acl);
            }
        }
    }
    check_accounting(&image, base, &initial, &ever_used)?;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("written.img");
    std::fs::write(&path, image.finish()).unwrap();
    let (code, report) = common::fsck(&path);
    prop_assert_eq!(
        code,
        0,
        "{}: e2fsck after {:?}:\n{}",
        base.variant,
        ops,
        report
    );
    Ok(())
}

#[test]
fn set_and_remove_follow_the_model() {
    if !common::require_tool("mke2fs") {
        return;
    }
    for &(variant, args) in VARIANTS {
        let Some(base) = base_image(variant, args) else {
            return;
        };
        // Values small enough that every name fits in one block together:
        // NoSpace never happens here (it has its own test).
        let max_len = if base.block_size >= 4096 { 300 } else { 36 };
        let mut runner = TestRunner::new(Config {
            cases: 24,
            ..Config::default()
        });
        let strategy = proptest::collection::vec(op_strategy(max_len), 1..40);
        runner
            .run(&strategy, |ops| run_case(&base, &ops))
            .unwrap_or_else(|failure| panic!("{variant}: {failure}"));
    }
}

fn position(file: &str) -> usize {
    FILES.iter().position(|f| *f == file).unwrap()
}

/// Set through the image and record in the model; must succeed.
fn put(image: &mut Image, base: &Base, model: &mut Model, file: &str, name: &[u8], value: &[u8]) {
    let at = position(file);
    image
        .set(base.inos[at], name, Some(value), SetMode::Any)
        .unwrap_or_else(|e| panic!("{}: set {file} {name:?}: {e}", base.variant));
    model[at].insert(name.to_vec(), value.to_vec());
}

fn remove(image: &mut Image, base: &Base, model: &mut Model, file: &str, name: &[u8]) {
    let at = position(file);
    image
        .set(base.inos[at], name, None, SetMode::Any)
        .unwrap_or_else(|e| panic!("{}: remove {file} {name:?}: {e}", base.variant));
    model[at].remove(name);
}

fn refcount(image: &Image, block: u64) -> u32 {
    let buffer = image.cache.read(block).unwrap();
    u32::from_le_bytes(buffer.read()[4..8].try_into().unwrap())
}

/// Spill to the block and back, a value too large for anything, and
/// attributes in the body and in a block.
fn exercise_spill(image: &mut Image, base: &Base, model: &mut Model) {
    let f0 = base.inos[position("f0")];
    let has_body = image.geo.inode_size > 128;
    put(image, base, model, "f0", b"user.a", b"small");
    assert_eq!(image.inode(f0).file_acl == 0, has_body, "{}", base.variant);
    put(image, base, model, "f0", b"user.bb", &pattern(1, 200));
    let block = image.inode(f0).file_acl;
    assert_ne!(block, 0, "{}: 200 bytes do not fit the body", base.variant);
    put(image, base, model, "f0", b"user.bb", b"tiny");
    if has_body {
        // Back in the body; the emptied block is freed.
        assert_eq!(image.inode(f0).file_acl, 0, "{}", base.variant);
        assert!(!image.alloc.is_in_use(block), "{}", base.variant);
        assert_eq!(image.inode(f0).blocks, 0, "{}", base.variant);
    }
    for i in 0..10u8 {
        let name = format!("user.n{i}");
        put(image, base, model, "f0", name.as_bytes(), &pattern(i, 24));
    }
    assert_ne!(image.inode(f0).file_acl, 0, "{}: spilled", base.variant);
    if has_body {
        let inode = image.inode(f0);
        let magic = &inode.inline_xattr_area()[..4];
        assert_eq!(magic, &0xEA02_0000u32.to_le_bytes(), "{}", base.variant);
    }
    let huge = vec![7u8; base.block_size];
    let result = image.set(f0, b"user.huge", Some(&huge), SetMode::Any);
    assert!(
        matches!(result, Err(Error::NoSpace)),
        "{}: {result:?}",
        base.variant
    );
}

/// Copy-on-write of the kernel's shared block, a shared release, then an
/// in-place change and a free once the block is ours alone.
fn exercise_sharing(image: &mut Image, base: &Base, model: &mut Model) {
    let ino = |file| base.inos[position(file)];
    let shared = image.inode(ino("s0")).file_acl;
    assert_eq!(refcount(image, shared), 3, "{}", base.variant);
    put(image, base, model, "s0", b"user.other", b"changed");
    assert_ne!(
        image.inode(ino("s0")).file_acl,
        shared,
        "{}: copied",
        base.variant
    );
    assert_eq!(refcount(image, shared), 2, "{}", base.variant);
    image.release_block(ino("s2")).unwrap();
    model[position("s2")].clear();
    assert_eq!(image.inode(ino("s2")).file_acl, 0);
    assert_eq!(refcount(image, shared), 1, "{}", base.variant);
    assert!(image.alloc.is_in_use(shared));
    put(image, base, model, "s1", b"user.other", b"in place");
    assert_eq!(
        image.inode(ino("s1")).file_acl,
        shared,
        "{}: in place",
        base.variant
    );
    remove(image, base, model, "s1", b"user.shared");
    if image.geo.inode_size > 128 {
        // user.other moved to the body, so the block emptied and was freed.
        assert_eq!(image.inode(ino("s1")).file_acl, 0, "{}", base.variant);
        assert!(!image.alloc.is_in_use(shared), "{}", base.variant);
    }
}

fn exercise_acls_and_namespaces(image: &mut Image, base: &Base, model: &mut Model) {
    let rich = acl_value(3).unwrap();
    put(image, base, model, "f1", ACL_ACCESS, &rich);
    put(image, base, model, "d0", ACL_DEFAULT, &rich);
    put(image, base, model, "d0", ACL_ACCESS, &acl_value(2).unwrap());
    let f1 = base.inos[position("f1")];
    let denied = image.set(f1, ACL_DEFAULT, Some(&rich), SetMode::Any);
    assert!(matches!(denied, Err(Error::PermissionDenied)), "{denied:?}");
    put(image, base, model, "f1", b"gnu.translator", b"/hurd/null");
    put(image, base, model, "f1", b"trusted.t", b"t");
    put(
        image,
        base,
        model,
        "f1",
        b"security.selinux",
        b"system_u:object_r:etc_t:s0\0",
    );
    put(image, base, model, "d0", b"user.a", &pattern(9, 100));
    for bad in [&b"system.data"[..], b"foo.bar"] {
        let result = image.set(f1, bad, Some(b"x"), SetMode::Any);
        assert!(matches!(result, Err(Error::NotSupported)), "{result:?}");
    }
}

type Listing = Vec<(Vec<u8>, Vec<u8>)>;

/// Our view of every file: names in our order, with values.
fn our_listing(image: &Image, base: &Base, model: &Model) -> Vec<Listing> {
    base.inos
        .iter()
        .enumerate()
        .map(|(file, &ino)| {
            let names = image.list(ino).unwrap();
            let listing: Listing = names
                .into_iter()
                .map(|name| {
                    let value = image.get(ino, &name).unwrap().unwrap();
                    (name, value)
                })
                .collect();
            let as_map: BTreeMap<_, _> = listing.iter().cloned().collect();
            assert_eq!(as_map, model[file], "{}: {}", base.variant, FILES[file]);
            listing
        })
        .collect()
}

fn kernel_listing(mount: &Mount) -> Vec<Listing> {
    FILES
        .iter()
        .map(|file| {
            let path = mount.path(file);
            kernel_list(&path)
                .into_iter()
                .map(|name| {
                    let value = kernel_get(&path, &name).unwrap();
                    (name, value)
                })
                .collect()
        })
        .collect()
}

fn tool_output(program: &str, args: &[&str]) -> String {
    let output = run(program, args);
    assert!(output.status.success(), "{program} {args:?}: {output:?}");
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// The kernel (and getfacl/getfattr) read what we wrote, then change it.
fn kernel_checks(base: &Base, written: &Path, ours: &[Listing]) -> bool {
    let dir = written.parent().unwrap().join("mnt");
    let Some(mount) = Mount::new(written, &dir) else {
        return false;
    };
    assert_eq!(
        kernel_listing(&mount),
        ours,
        "{}: kernel view",
        base.variant
    );
    let f1 = mount.path("f1");
    let acl = tool_output("getfacl", &["-n", "-p", f1.to_str().unwrap()]);
    for line in [
        "user:1000:rw-",
        "user:1001:r--",
        "group:100:--x",
        "mask::rwx",
    ] {
        assert!(
            acl.contains(line),
            "{}: getfacl shows {line}:\n{acl}",
            base.variant
        );
    }
    let d0 = mount.path("d0");
    let default_acl = tool_output("getfacl", &["-n", "-p", "-d", d0.to_str().unwrap()]);
    assert!(default_acl.contains("user:1000:rw-"), "{default_acl}");
    let dump = tool_output(
        "getfattr",
        &["-d", "-m", "-", mount.path("f0").to_str().unwrap()],
    );
    assert!(
        dump.contains("user.n9=") && dump.contains("user.a=\"small\""),
        "{dump}"
    );
    // The kernel finds every entry of our blocks (its block lookup relies on
    // their sort order) and frees our block once empty.
    for (name, _) in &ours[position("f0")] {
        xattr_support::kernel_remove(&mount.path("f0"), name).unwrap_or_else(|errno| {
            panic!("{}: kernel remove {name:?}: errno {errno}", base.variant)
        });
    }
    kernel_set(&mount.path("s0"), b"user.kernel", &pattern(3, 500)).unwrap();
    mount.unmount();
    true
}

#[test]
fn kernel_reads_and_changes_what_we_wrote() {
    if !common::require_tool("mke2fs") || !common::require_tool("getfacl") {
        return;
    }
    for &(variant, args) in VARIANTS {
        let Some(base) = base_image(variant, args) else {
            return;
        };
        let mut image = Image::from_bytes(base.bytes.clone());
        let mut model = initial_model();
        exercise_spill(&mut image, &base, &mut model);
        exercise_sharing(&mut image, &base, &mut model);
        exercise_acls_and_namespaces(&mut image, &base, &mut model);
        let ours = our_listing(&image, &base, &model);
        let dir = tempfile::tempdir().unwrap();
        let written = dir.path().join("written.img");
        std::fs::write(&written, image.finish()).unwrap();
        common::assert_fsck_clean(&written);
        if !kernel_checks(&base, &written, &ours) {
            return;
        }
        common::assert_fsck_clean(&written);
        let image = Image::open(&written);
        let f0 = base.inos[position("f0")];
        assert_eq!(image.list(f0).unwrap(), Vec::<Vec<u8>>::new());
        assert_eq!(
            image.inode(f0).file_acl,
            0,
            "{variant}: the kernel freed our block"
        );
        let s0 = base.inos[position("s0")];
        assert_eq!(
            image.get(s0, b"user.kernel").unwrap(),
            Some(pattern(3, 500))
        );
    }
}
