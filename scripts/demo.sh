#!/usr/bin/env bash
# The main job: build jext4, create an ext4 image with mkfs.ext4, mount it
# with jext4, write a real tree into it, unmount, and show that e2fsck (and,
# as root, the kernel) agree the result is a clean, faithful ext4 image.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh

ensure_packages e2fsprogs fuse3
require_cargo
cargo build --release --quiet
jext4=$PWD/target/release/jext4

work=$(mktemp -d /tmp/jext4-demo.XXXXXX)
image=$work/demo.img
mnt=$work/mnt
check=$work/check
mkdir -p "$mnt" "$check"
cleanup() {
    mountpoint -q "$mnt" && "$jext4" umount "$mnt" || true
    mountpoint -q "$check" && umount "$check" || true
}
trap cleanup EXIT

# A real tree to copy: this repository's sources and the system's docs.
source_tree=$work/tree
mkdir -p "$source_tree"
cp -a src tests "$source_tree/" 2>/dev/null || true
cp -a /usr/share/doc "$source_tree/doc"
files=$(find "$source_tree" -type f | wc -l)

echo "== creating a 512 MiB ext4 image: $image"
truncate -s 512M "$image"
mkfs.ext4 -q -F "$image"

echo "== mounting it with jext4 at $mnt"
"$jext4" mount "$image" "$mnt"
echo "== copying a tree of $files files into it"
time cp -a "$source_tree/." "$mnt/"
df -h "$mnt" | tail -1
echo "== unmounting (waits until everything is written)"
"$jext4" umount "$mnt"

echo "== e2fsck -fn $image"
e2fsck -fn "$image"

if [ "$(id -u)" -eq 0 ]; then
    echo "== reading the image back through the kernel (mount -o loop,ro) and comparing"
    mount -o loop,ro "$image" "$check"
    diff -r --no-dereference --exclude=lost+found "$source_tree" "$check" && echo "kernel view matches the source tree: $files files"
    umount "$check"
else
    echo "(not root: skipping the kernel loop-mount comparison)"
fi
rm -rf "$work"
echo "== done"
