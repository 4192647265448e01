//! The layers under the API, for the FUSE server, the `jext4` command,
//! the benchmarks and the tests: **unstable**, outside semver. Anything
//! here may change or go in any release; a program that wants to stay
//! compiling uses the crate root (`Image`, `File`, …) instead.
//!
//! Bottom up (see docs/ARCHITECTURE.md): `dev` (block devices) → `cache`
//! (metadata buffers) → `journal` (JBD2 transactions) → `format` (on-disk
//! structures) → `fs` (`Fs`, the filesystem operations) → the front ends,
//! `fuse` (feature `fuse`) and the crate's API; `tools` (tree and tar
//! copies), `crash` (crash states, feature `crashtest`) and the helpers
//! `bytes`, `lock`, `faults`, `hash` and `rng` beside them.
//!
//! Each layer keeps its folder (`src/dev/`, `src/fs/`, …); this file only
//! gathers them under one name, so that the crate root shows the API.

#[path = "bytes.rs"]
pub mod bytes;
#[path = "cache/mod.rs"]
pub mod cache;
#[cfg(feature = "crashtest")]
#[path = "crash/mod.rs"]
pub mod crash;
#[path = "dev/mod.rs"]
pub mod dev;
#[path = "faults.rs"]
pub mod faults;
#[path = "format/mod.rs"]
pub mod format;
#[path = "fs/mod.rs"]
pub mod fs;
#[cfg(feature = "fuse")]
#[path = "fuse/mod.rs"]
pub mod fuse;
#[path = "hash.rs"]
pub mod hash;
#[path = "journal/mod.rs"]
pub mod journal;
#[path = "lock.rs"]
pub mod lock;
#[path = "rng.rs"]
pub mod rng;
#[path = "tools/mod.rs"]
pub mod tools;
