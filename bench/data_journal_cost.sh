#!/usr/bin/env bash
# What data=journal costs, jext4 (FUSE over /dev/fuse) against kernel ext4
# (a loop mount) in the same run, each with data=ordered and data=journal:
# - seqw: 256 MiB written with dd conv=fsync;
# - randw: 2,000 random 4 KiB pwrites into a 64 MiB file, each followed by
#   fdatasync (a database's pages).
# Images are 1 GiB files in /dev/shm (the device out of the way); three
# runs each, sorted (the middle one is the median); e2fsck -fn after each;
# the jext4 server's peak RSS (VmHWM) last.
# Usage: sudo bench/data_journal_cost.sh [PATH-TO-JEXT4]
set -euo pipefail
jext4=${1:-target/release/jext4}
work=$(mktemp -d /dev/shm/jext4-dj.XXXXXX)
trap 'mountpoint -q "$work/m" && umount "$work/m"; rm -rf "$work"' EXIT
mkdir -p "$work/m"

seqw() { dd if=/dev/zero of="$1/f" bs=1M count=256 conv=fsync status=none; }
randw() {
    python3 - "$1/g" <<'PY'
import os, random, sys
fd = os.open(sys.argv[1], os.O_RDWR)
rng = random.Random(1)
page = os.urandom(4096)
for _ in range(2000):
    os.pwrite(fd, page, rng.randrange(0, 16384) * 4096)
    os.fdatasync(fd)
os.close(fd)
PY
}

# One run: prints seconds, and for jext4 the server's VmHWM in KiB.
run() {
    local fs=$1 options=$2 workload=$3 rss=-
    rm -f "$work/img"
    truncate -s 1G "$work/img"
    mkfs.ext4 -q -F "$work/img"
    if [ "$fs" = jext4 ]; then
        "$jext4" mount ${options:+-o "$options"} "$work/img" "$work/m"
    else
        mount -o "loop${options:+,$options}" "$work/img" "$work/m"
    fi
    if [ "$workload" = randw ]; then
        head -c 64M /dev/zero > "$work/m/g"
        sync -f "$work/m/g"
    fi
    local start end
    start=$(date +%s.%N)
    "$workload" "$work/m"
    end=$(date +%s.%N)
    if [ "$fs" = jext4 ]; then
        local pid
        pid=$(pgrep -n -f "$work/img")
        rss=$(awk '/VmHWM/ {print $2}' "/proc/$pid/status")
        "$jext4" umount "$work/m"
    else
        umount "$work/m"
    fi
    e2fsck -fn "$work/img" > /dev/null 2>&1 || echo "e2fsck found errors: $fs $options $workload" >&2
    printf '%.3f %s\n' "$(echo "$end - $start" | bc)" "$rss"
}

for workload in seqw randw; do
    for config in kernel: kernel:data=journal jext4: jext4:data=journal; do
        fs=${config%%:*}
        options=${config#*:}
        runs=$(for _ in 1 2 3; do run "$fs" "$options" "$workload"; done | sort -n)
        echo "$workload $fs ${options:-data=ordered}: s $(echo "$runs" | awk '{print $1}' | tr '\n' ' ')rss_kib $(echo "$runs" | awk '{print $2}' | sort -n | tail -1)"
    done
done
