//! Journal bugs the crash-state harness found, each kept as the short
//! workload that reproduces it, checked in every crash state.

#![cfg(feature = "crashtest")]

mod common;

use jext4::engine::crash::driver::Lane;
use jext4::engine::crash::workloads::{Scenario, Workload};
use jext4::engine::crash::{Config, Sampling, run};

fn check(workload: &'static Workload, block_size: u32, states: usize) {
    if !common::require_tool("mke2fs") || !common::require_tool("e2fsck") {
        return;
    }
    let mut config = Config::new(vec![workload], block_size, states, 7);
    config.sampling = Sampling {
        fsck_every: 1,
        replay_every: 1,
        kernel_every: 0,
    };
    let summary = run(&config, &mut |_| {}).unwrap();
    assert!(summary.states > 0);
    let failures: Vec<String> = summary.failures.iter().map(|f| f.to_string()).collect();
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

fn single(name: &str, run: fn(&mut Lane)) -> Vec<Scenario> {
    vec![Scenario {
        name: name.into(),
        lanes: vec!["/".into()],
        setup: Box::new(|_| {}),
        run: Box::new(move |lanes| run(&mut lanes[0])),
        fill_leaving_bytes: None,
        barrier_latency: std::time::Duration::ZERO,
        oracle: None,
    }]
}

/// A directory's blocks are journaled metadata: freeing them must revoke
/// them (the kernel frees directory and symlink blocks with
/// EXT4_FREE_BLOCKS_METADATA). They were freed as data, so replaying the
/// transaction that logged the directory block wrote it over the block's
/// next owner — here a slow symlink's target, written in place.
fn freed_directory_block_reused_by_a_symlink(lane: &mut Lane) {
    for round in 0..4 {
        let dir = format!("d{round}");
        let _ = lane.mkdir(&dir);
        let _ = lane.create(&format!("{dir}/entry"));
        let _ = lane.sync();
        let _ = lane.unlink(&format!("{dir}/entry"));
        let _ = lane.rmdir(&dir);
        let _ = lane.sync();
        let _ = lane.symlink(&"t".repeat(180 + round), &format!("link{round}"));
        let _ = lane.sync();
    }
}

static FREED_DIRECTORY_BLOCK: Workload = Workload {
    name: "freed-directory-block",
    about: "a directory block freed, then reused by a slow symlink",
    tear: false,
    states_per_scenario: 0,
    scenarios: |_, _| {
        single(
            "mkdir/rmdir/symlink",
            freed_directory_block_reused_by_a_symlink,
        )
    },
};

#[test]
fn freed_directory_blocks_are_revoked_1k() {
    check(&FREED_DIRECTORY_BLOCK, 1024, 60);
}

#[test]
fn freed_directory_blocks_are_revoked_4k() {
    check(&FREED_DIRECTORY_BLOCK, 4096, 60);
}
