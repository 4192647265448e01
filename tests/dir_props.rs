//! Short random operation sequences against a model, across formats
//! (metadata_csum, no checksums, no dir_index, 64 KiB blocks): every result
//! matches the model after every step, and a listing resumed from any
//! cookie of an unchanged directory returns exactly the rest of it.

mod dir_common;

use dir_common::{MemEnv, assert_listing, geometry_for, list_all};
use jext4::Error;
use jext4::engine::format::Geometry;
use jext4::engine::format::dir::{self, FT_REG_FILE};
use proptest::prelude::*;
use std::collections::BTreeMap;
use std::sync::OnceLock;

const VARIANTS: &[&[&str]] = &[
    &["-t", "ext4", "-b", "1024"],
    &["-t", "ext2", "-b", "1024"],
    &["-t", "ext4", "-b", "4096", "-O", "^dir_index"],
    &["-t", "ext2", "-b", "65536"],
];

fn geometry(variant: usize) -> &'static Geometry {
    static GEOMETRIES: OnceLock<Vec<Geometry>> = OnceLock::new();
    &GEOMETRIES.get_or_init(|| VARIANTS.iter().map(|args| geometry_for(args, 64)).collect())
        [variant]
}

/// Name `id`: lengths spread over 1..=255 so that a few dozen fill a block.
fn name(id: usize) -> Vec<u8> {
    let len = 1 + (id * 37) % 255;
    let mut name = format!("{id}").into_bytes();
    name.extend((name.len()..len).map(|i| b'a' + ((i * 7 + id) % 26) as u8));
    name
}

#[derive(Debug, Clone)]
enum Op {
    Add(usize),
    Remove(usize),
    Replace(usize, u32),
    SetParent(u32),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0usize..300).prop_map(Op::Add),
        2 => (0usize..300).prop_map(Op::Remove),
        1 => (0usize..300, 11u32..200).prop_map(|(id, ino)| Op::Replace(id, ino)),
        1 => (11u32..200).prop_map(Op::SetParent),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(40))]

    #[test]
    fn operations_match_model(variant in 0..VARIANTS.len(), ops in prop::collection::vec(op(), 1..250)) {
        let geo = geometry(variant);
        let blocks = 4096 * 1024 / geo.block_size as u64 * 4;
        let env = MemEnv::new(geo, blocks.max(64));
        let mut d = env.dir(geo, 12, 0xabcd, blocks.max(64));
        let mut model: BTreeMap<Vec<u8>, u32> = BTreeMap::new();
        let mut parent = 2;
        let handle = env.journal.start(4).unwrap();
        dir::init_dir(&mut d, &handle, 12, parent).unwrap();
        handle.stop().unwrap();
        for (step, op) in ops.iter().enumerate() {
            let handle = env.journal.start(16).unwrap();
            let touched = match *op {
                Op::Add(id) => {
                    if let std::collections::btree_map::Entry::Vacant(slot) = model.entry(name(id)) {
                        let ino = 11 + step as u32;
                        dir::add_entry(&mut d, &handle, &name(id), ino, FT_REG_FILE).unwrap();
                        slot.insert(ino);
                    }
                    Some(id)
                }
                Op::Remove(id) => {
                    match dir::remove_entry(&mut d, &handle, &name(id)) {
                        Ok(old) => prop_assert_eq!(Some(old.ino), model.remove(&name(id))),
                        Err(Error::NotFound) => prop_assert!(!model.contains_key(&name(id))),
                        Err(other) => panic!("{other}"),
                    }
                    Some(id)
                }
                Op::Replace(id, ino) => {
                    match dir::replace_entry(&mut d, &handle, &name(id), ino, FT_REG_FILE) {
                        Ok(old) => prop_assert_eq!(Some(old.ino), model.insert(name(id), ino)),
                        Err(Error::NotFound) => prop_assert!(!model.contains_key(&name(id))),
                        Err(other) => panic!("{other}"),
                    }
                    Some(id)
                }
                Op::SetParent(ino) => {
                    dir::set_parent(&mut d, &handle, ino).unwrap();
                    parent = ino;
                    None
                }
            };
            handle.stop().unwrap();
            if let Some(id) = touched {
                let found = dir::lookup(&mut d, &name(id)).unwrap().map(|l| l.ino);
                prop_assert_eq!(found, model.get(&name(id)).copied());
            }
            prop_assert_eq!(dir::parent(&mut d).unwrap(), parent);
            prop_assert_eq!(dir::is_empty(&mut d).unwrap(), model.is_empty());
        }
        let stats = dir::check(&mut d).unwrap();
        prop_assert_eq!(stats.entries, model.len() as u64 + 2);
        for (name, ino) in &model {
            prop_assert_eq!(dir::lookup(&mut d, name).unwrap().map(|l| l.ino), Some(*ino));
        }
        assert_listing(&mut d, &model, parent);
        // Resuming from the k-th cookie of an unchanged directory gives
        // exactly the entries after the k-th.
        let all = list_all(&mut d);
        for k in (0..all.len()).step_by(1 + all.len() / 7) {
            let mut rest = Vec::new();
            dir::read_entries(&mut d, all[k].1, &mut |entry, cookie| {
                rest.push((entry.clone(), cookie));
                true
            })
            .unwrap();
            prop_assert_eq!(&rest[..], &all[k + 1..]);
        }
    }
}
