//! Skipping a test that cannot run here — or, under CI, failing it.
//! One definition, included by every support module that probes the
//! machine (`#[path]` where `common` is not in scope).

/// The environment variable `scripts/test.sh` (what `.ci/run` runs) sets:
/// there, a test that cannot run fails instead of skipping, so CI never
/// passes by skipping.
pub const NO_SKIP: &str = "JEXT4_NO_SKIP";

/// A test cannot run here for `reason`: it says so and the caller returns
/// (false), or, under `JEXT4_NO_SKIP`, it fails.
pub fn skip(reason: &str) -> bool {
    assert!(
        std::env::var_os(NO_SKIP).is_none(),
        "this test cannot run here and {NO_SKIP} forbids skipping: {reason}"
    );
    eprintln!("SKIP: {reason}");
    false
}
