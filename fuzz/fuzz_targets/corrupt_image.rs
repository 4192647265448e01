//! Coverage-guided twin of `tests/fuzz_corrupt.rs`: the fuzzer's input
//! bytes choose a seed image and the mutations to apply to it (through the
//! same maps and mutators, included from tests/fuzz_support), and the
//! damaged image is mounted, walked and changed. libFuzzer itself catches
//! panics (as crashes) and hangs (`-timeout=`).

#![no_main]

#[path = "../../tests/fuzz_support/mod.rs"]
// Its skip re-export is for the test harness (dead code is allowed inside).
#[allow(unused_imports)]
mod fuzz_support;

use fuzz_support::map::ImageMap;
use fuzz_support::mutate::{self, Bytes, Source};
use fuzz_support::seeds::{self, SEEDS};
use jext4::engine::fs::walk::Budget;
use libfuzzer_sys::fuzz_target;
use std::sync::OnceLock;

struct Seed {
    bytes: Vec<u8>,
    map: ImageMap,
}

fn seeds() -> &'static [Seed] {
    static LOADED: OnceLock<Vec<Seed>> = OnceLock::new();
    LOADED.get_or_init(|| {
        let loaded: Vec<Seed> = SEEDS
            .iter()
            .filter_map(seeds::load_or_make)
            .map(|bytes| Seed {
                map: ImageMap::build(&bytes),
                bytes,
            })
            .collect();
        assert!(
            !loaded.is_empty(),
            "no seed image in {} and none could be made",
            seeds::seed_dir().display()
        );
        loaded
    })
}

fn budget() -> Budget {
    Budget::default()
}

fuzz_target!(|data: &[u8]| {
    let seeds = seeds();
    let mut source = Bytes::new(data);
    let seed = &seeds[source.below(seeds.len() as u64) as usize];
    let count = 1 + source.below(4) as usize;
    let mutations = mutate::choose(&seed.map, &mut source, count);
    let mut image = seed.bytes.clone();
    for mutation in &mutations {
        mutate::apply(&seed.map, &mut image, mutation);
    }
    let described: Vec<String> = mutations.iter().map(|m| m.describe(&seed.map)).collect();
    if std::env::var_os("JEXT4_FUZZ_VERBOSE").is_some() {
        eprintln!("{described:#?}");
    }
    let outcome = fuzz_support::run_image(image, budget());
    if std::env::var_os("JEXT4_FUZZ_VERBOSE").is_some() {
        eprintln!("{outcome:#?}");
    }
    assert!(
        !outcome.saw_corruption() || outcome.read_only_after,
        "corruption reported but the filesystem stayed writable: {described:?}"
    );
    assert!(
        outcome.stats.inconsistencies.is_empty(),
        "{:?}: {described:?}",
        outcome.stats.inconsistencies
    );
});
