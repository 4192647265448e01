#!/usr/bin/env bash
# Build jext4 and install it under PREFIX (default /usr/local): the binary,
# its manual pages and its shell completions for bash, zsh and fish, all
# generated from the command-line definitions (`jext4 man`, `jext4
# completions`). DESTDIR is honoured, as packagers expect.
#   scripts/install.sh [PREFIX]
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh

prefix=${1:-/usr/local}
root=${DESTDIR:-}
require_cargo
cargo build --release --quiet --bin jext4
jext4=$PWD/target/release/jext4

install -D -m 755 "$jext4" "$root$prefix/bin/jext4"
man1=$root$prefix/share/man/man1
mkdir -p "$man1"
"$jext4" man "$man1"
install -d "$root$prefix/share/bash-completion/completions" \
    "$root$prefix/share/zsh/site-functions" \
    "$root$prefix/share/fish/vendor_completions.d"
"$jext4" completions bash >"$root$prefix/share/bash-completion/completions/jext4"
"$jext4" completions zsh >"$root$prefix/share/zsh/site-functions/_jext4"
"$jext4" completions fish >"$root$prefix/share/fish/vendor_completions.d/jext4.fish"
echo "installed jext4 $("$jext4" --version | cut -d' ' -f2) under $root$prefix" \
    "($(ls "$man1" | grep -c '^jext4') manual pages, bash/zsh/fish completions)"
