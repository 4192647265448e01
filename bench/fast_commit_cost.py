#!/usr/bin/env python3
"""What an fsync costs with fast commits: jext4 with full commits, jext4
with fast commits and kernel ext4 with fast commits, on the same kind of
loop device, in one run.

    sudo bench/fast_commit_cost.py [--runs 3] [--appends 2000] [--files 2000]
                                   [--size 1G] [--workdir /var/tmp/jext4-fc-cost]
                                   [--jext4-binary PATH]

Every filesystem gets a fresh `mkfs.ext4 -O fast_commit` image of --size in
--workdir, attached to a loop device (so that /sys/block/loopN/stat counts
what reaches the device), and mounted:
  jext4-full   jext4 mount -o fast_commit=off /dev/loopN (full commits)
  jext4-fc     jext4 mount /dev/loopN (fast commits, the default)
  ext4-fc      the kernel's ext4 on /dev/loopN

Workloads:
  append  --appends times: append 1 KiB to one file and fsync it. Bytes
          written to the device and device flushes per fsync (from the loop
          device's stat: sectors written, flush requests), and fsyncs per
          second.
  create  --files times: create a file, write 4 KiB, fsync, close (single
          thread): files per second.

Figures are medians over --runs rounds; within a round the filesystems run
one after another, in an order rotated from round to round. Each image is
checked with `e2fsck -fn` after unmounting. jext4's own counters (`jext4
stats`: fast commits, full commits, bytes and flushes per fast commit) are
printed for the jext4 rows of the last round.
"""

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def run(argv, check=True):
    result = subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=600)
    if check and result.returncode != 0:
        sys.exit(f"{' '.join(map(str, argv))} exited {result.returncode}: {result.stderr.strip()}")
    return result


def parse_size(text):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    if text[-1].upper() in units:
        return int(text[:-1]) * units[text[-1].upper()]
    return int(text)


def median(values):
    ordered = sorted(values)
    middle = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[middle]
    return (ordered[middle - 1] + ordered[middle]) / 2


def device_stat(loop):
    """(sectors written, flush requests) of a block device so far
    (Documentation/block/stat.rst: fields 7 and 16)."""
    fields = Path(f"/sys/block/{Path(loop).name}/stat").read_text().split()
    return int(fields[6]), int(fields[15])


class Mounted:
    """A fresh fast_commit image on a loop device, mounted by `kind`."""

    def __init__(self, kind, args):
        self.kind = kind
        self.args = args
        self.image = args.workdir / f"{kind}.img"
        self.point = args.workdir / f"{kind}.mnt"
        self.point.mkdir(parents=True, exist_ok=True)
        with open(self.image, "wb") as image:
            image.truncate(args.size)
        run(["mkfs.ext4", "-F", "-q", "-O", "fast_commit", self.image])
        self.loop = run(["losetup", "-f", "--show", self.image]).stdout.strip()
        if kind == "ext4-fc":
            run(["mount", "-t", "ext4", self.loop, self.point])
        else:
            options = ["-o", "fast_commit=off"] if kind == "jext4-full" else []
            run([args.binary, "mount", *options, self.loop, self.point])

    def stats(self):
        """jext4's counters (`jext4 stats`), refreshed by the server every
        2 s."""
        if self.kind == "ext4-fc":
            return {}
        time.sleep(2.5)
        text = run([self.args.binary, "stats", self.point]).stdout
        pairs = (line.split(" ", 1) for line in text.splitlines() if " " in line)
        return {name: value for name, value in pairs}

    def close(self):
        if self.kind == "ext4-fc":
            run(["umount", self.point])
        else:
            run([self.args.binary, "umount", self.point])
        run(["losetup", "-d", self.loop])
        verdict = run(["e2fsck", "-fn", self.image], check=False)
        if verdict.returncode != 0:
            sys.exit(f"{self.kind}: e2fsck -fn after the run:\n{verdict.stdout}")
        self.image.unlink()


def append_loop(mounted, args):
    path = mounted.point / "log"
    block = os.urandom(1024)
    fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_APPEND, 0o644)
    try:
        os.fsync(fd)
        sectors, flushes = device_stat(mounted.loop)
        began = time.monotonic()
        for _ in range(args.appends):
            os.write(fd, block)
            os.fsync(fd)
        seconds = time.monotonic() - began
        sectors_after, flushes_after = device_stat(mounted.loop)
    finally:
        os.close(fd)
    return {
        "bytes/fsync": (sectors_after - sectors) * 512 / args.appends,
        "flushes/fsync": (flushes_after - flushes) / args.appends,
        "fsyncs/s": args.appends / seconds,
    }


def create_loop(mounted, args):
    directory = mounted.point / "create"
    directory.mkdir()
    os.sync()
    block = os.urandom(4096)
    began = time.monotonic()
    for index in range(args.files):
        fd = os.open(directory / f"f{index:06}", os.O_CREAT | os.O_WRONLY, 0o644)
        try:
            os.write(fd, block)
            os.fsync(fd)
        finally:
            os.close(fd)
    return {"files/s": args.files / (time.monotonic() - began)}


KINDS = ["jext4-full", "jext4-fc", "ext4-fc"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--appends", type=int, default=2000)
    parser.add_argument("--files", type=int, default=2000)
    parser.add_argument("--size", type=parse_size, default=parse_size("1G"))
    parser.add_argument("--workdir", type=Path, default=Path("/var/tmp/jext4-fc-cost"))
    parser.add_argument("--jext4-binary", type=Path, dest="binary")
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("fast_commit_cost.py needs root (loop devices and mounts)")
    args.binary = args.binary or REPO / "target" / "release" / "jext4"
    if not args.binary.exists():
        run(["cargo", "build", "--release", "--bin", "jext4"])
    args.workdir.mkdir(parents=True, exist_ok=True)
    results = {kind: {} for kind in KINDS}
    counters = {}
    for round_index in range(args.runs):
        order = KINDS[round_index % 3:] + KINDS[: round_index % 3]
        for kind in order:
            mounted = Mounted(kind, args)
            try:
                figures = append_loop(mounted, args)
                figures.update(create_loop(mounted, args))
                counters[kind] = mounted.stats()
            finally:
                mounted.close()
            for name, value in figures.items():
                results[kind].setdefault(name, []).append(value)
            print(f"round {round_index + 1} {kind:11} " + ", ".join(
                f"{name} {value:.1f}" for name, value in figures.items()), flush=True)
    names = list(results[KINDS[0]])
    print(f"\nmedians of {args.runs} rounds ({args.appends} 1 KiB appends + fsync; "
          f"{args.files} creates + 4 KiB write + fsync)")
    print(f"{'':11}" + "".join(f" {name:>14}" for name in names))
    for kind in KINDS:
        print(f"{kind:11}" + "".join(f" {median(results[kind][name]):14.1f}" for name in names))
    base = {name: median(results["ext4-fc"][name]) for name in names}
    for kind in ("jext4-full", "jext4-fc"):
        print(f"{kind} / ext4-fc: " + ", ".join(
            f"{name} {median(results[kind][name]) / base[name]:.2f}x" for name in names))
    for kind in ("jext4-full", "jext4-fc"):
        wanted = ["journal_commits", "fast_commits", "fast_commit_bytes_per_commit",
                  "fast_commit_flushes_per_commit", "fast_commit_fallbacks"]
        found = ", ".join(f"{name} {counters[kind][name]}" for name in wanted
                          if name in counters.get(kind, {}))
        print(f"{kind} (last round, jext4 stats): {found or 'full commits only'}")


if __name__ == "__main__":
    main()
