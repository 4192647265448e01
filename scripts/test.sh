#!/usr/bin/env bash
# Everything CI runs: formatting, lints, unit and integration tests (real
# images, FUSE mounts, kernel loop mounts, e2fsck), POSIX conformance.
# Needs root for loop mounts and FUSE; installs what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh

ensure_packages e2fsprogs fuse3 attr acl xfsprogs python3
require_cargo

echo "== cargo fmt --check"
cargo fmt --check
echo "== cargo clippy"
cargo clippy --quiet --all-targets -- -D warnings
echo "== cargo test (profile ci: optimised, debug assertions on)"
cargo test --profile ci
echo "== pjdfstest"
scripts/pjdfstest.sh target/ci/jext4
echo "== all tests passed"
