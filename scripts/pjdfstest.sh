#!/usr/bin/env bash
# POSIX conformance: run the pjdfstest suite (crates.io) against a jext4
# FUSE mount, require zero failures, then require e2fsck -fn clean.
# Usage: [PJDFSTEST_TRANSPORT=dev|uring] scripts/pjdfstest.sh [PATH-TO-JEXT4-BINARY]
# PJDFSTEST_TRANSPORT=uring serves the mount through FUSE over io_uring: the
# kernel's module parameter is switched on for the run and restored after
# (a kernel without it has no FUSE over io_uring: the run is skipped).
# PJDFSTEST_FEATURES=inline_data,... adds mke2fs features to the image;
# PJDFSTEST_OPTIONS=data=journal,... adds mount options.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh
ensure_packages e2fsprogs fuse3
require_cargo

jext4=${1:-target/release/jext4}
[ -x "$jext4" ] || cargo build --release --quiet
tools=$PWD/target/tools
if [ ! -x "$tools/bin/pjdfstest" ]; then
    cargo install --quiet --locked pjdfstest --version 0.2.2 --root "$tools"
fi

work=$(mktemp -d /tmp/jext4-pjdfstest.XXXXXX)
# pjdfstest 0.2.2 miscomputes path lengths when its base path is exactly 31
# characters long; a fixed-length mount point under /mnt avoids that.
# PJDFSTEST_MNT picks another (not 31 characters long either), for two runs
# side by side.
mnt=${PJDFSTEST_MNT:-/mnt/jext4-pjdfstest}
mkdir -p "$mnt"
transport=${PJDFSTEST_TRANSPORT:-dev}
parameter=/sys/module/fuse/parameters/enable_uring
original=
cleanup() {
    mountpoint -q "$mnt" && { "$jext4" umount "$mnt" || fusermount3 -uz "$mnt"; } || true
    rm -rf "$work"
    if [ -n "$original" ]; then echo "$original" > "$parameter"; fi
}
trap cleanup EXIT
if [ "$transport" = uring ]; then
    if [ ! -e "$parameter" ]; then
        echo "pjdfstest over io_uring: SKIP: $parameter is missing (this kernel has no FUSE over io_uring)"
        exit 0
    fi
    original=$(cat "$parameter")
    echo Y > "$parameter"
fi

truncate -s 256M "$work/pjdfstest.img"
features=${PJDFSTEST_FEATURES:+-O $PJDFSTEST_FEATURES}
# shellcheck disable=SC2086 # features: -O and its list, or nothing
mkfs.ext4 -q -F $features "$work/pjdfstest.img"
# allow_other: the suite switches to unprivileged users.
"$jext4" mount -o "allow_other,fuse_transport=$transport${PJDFSTEST_OPTIONS:+,$PJDFSTEST_OPTIONS}" "$work/pjdfstest.img" "$mnt"
"$jext4" stats "$mnt" | grep -qx "fuse_transport $transport" || {
    echo "pjdfstest: the mount is not served through $transport" >&2
    exit 1
}
chmod 777 "$mnt"
(cd "$mnt" && "$tools/bin/pjdfstest" -c "$OLDPWD/tests/pjdfstest/jext4.toml" -p "$mnt") 2>&1 | tee "$work/pjdfstest.log" | grep -E "FAILED|Summary" || true
"$jext4" umount "$mnt"
summary=$(grep "^Summary" "$work/pjdfstest.log" || echo "Summary: missing")
echo "pjdfstest ($transport${PJDFSTEST_FEATURES:+, $PJDFSTEST_FEATURES}${PJDFSTEST_OPTIONS:+, -o $PJDFSTEST_OPTIONS}): $summary"
case "$summary" in
    "Summary: 0 failed,"*) ;;
    *) echo "pjdfstest reported failures" >&2; exit 1 ;;
esac
e2fsck -fn "$work/pjdfstest.img"
