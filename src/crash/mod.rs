//! Crash states: every disk a power cut during a workload could leave
//! behind, and the proof that each one recovers clean and loses nothing
//! acknowledged (in the spirit of CrashMonkey/B3 and dm-log-writes, inside
//! jext4 so that it runs in CI).
//!
//! - `workloads` + `driver`: application-shaped programs run in-process on
//!   the engine over a recording device (`dev::recording`), marking each
//!   operation's start and acknowledgement, with a `model` of what the
//!   filesystem said after each operation; `import` drives the image tools'
//!   tree copy instead, with an oracle of its own;
//! - `states`: the crash-state generator (flush epochs, subsets, torn
//!   writes), deterministic given a seed;
//! - `oracle`: the durability and atomicity checks against the model;
//! - `runner`: recording, planning and checking, with jext4's recovery on
//!   every state and e2fsck and the kernel on samples (see its preamble);
//! - `logwrites`: the log in dm-log-writes format, for other tools;
//! - `overlay`: crash images, each a copy-on-write `dev::overlay` of its
//!   epoch's shared image, and the files that show them; `tools`: mke2fs,
//!   e2fsck, loop mounts.
//!
//! `jext4 crashtest` is the front end; `crate::faults` breaks the journal
//! on purpose to show that the oracle notices.

pub mod driver;
pub mod import;
pub mod logwrites;
pub mod model;
pub mod oracle;
pub mod overlay;
pub mod runner;
pub mod states;
pub mod tools;
pub mod workloads;

/// The deterministic generator (`engine::rng`), where the workloads and
/// the tests have always found it.
pub use crate::engine::rng;
pub use runner::{Config, Failure, Progress, Sampling, Summary, run};
pub use workloads::{WORKLOADS, Workload};
