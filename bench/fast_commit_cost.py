#!/usr/bin/env python3
"""What an fsync costs with fast commits: jext4 with full commits, jext4
with fast commits and kernel ext4 with fast commits, on the same kind of
loop device, in one run; beside them the raw loop device, and optionally
an older jext4 build (before/after of a change to the fsync path).

    sudo bench/fast_commit_cost.py [--runs 3] [--appends 2000] [--files 2000]
                                   [--threads 1,4,8,16] [--seconds 1.5]
                                   [--size 1G] [--workdir /var/tmp/jext4-fc-cost]
                                   [--jext4-binary PATH] [--before-binary PATH]
                                   [--shm-dir /dev/shm/jext4-fc-cost]

Every filesystem gets a fresh `mkfs.ext4 -O fast_commit` image of --size in
--workdir, attached to a loop device (so that /sys/block/loopN/stat counts
what reaches the device), and mounted:
  raw          no filesystem: the loop device itself (append only)
  jext4-full   jext4 mount -o fast_commit=off /dev/loopN (full commits)
  jext4-fc     jext4 mount /dev/loopN (fast commits, the default)
  jext4-before the --before-binary, as jext4-fc (only with that option)
  ext4-fc      the kernel's ext4 on /dev/loopN
and, on an image file in --shm-dir (tmpfs: memory, no loop device):
  jext4-bytelog  jext4 mount -o bytelog IMAGE (ByteLog: fast commits through
               an mmap of the area, persisted with msync — on tmpfs that
               costs next to nothing, which is what memory-semantic storage
               would give)
  jext4-fc-shm   jext4 mount IMAGE (block fast commits on the same medium:
               what ByteLog itself changes, apart from the medium)

Workloads:
  append    --appends times: append 1 KiB to one file and fdatasync it.
            Latency p50 and p99 (µs), bytes written to the device and device
            flushes per fdatasync (from the loop device's stat: sectors
            written, flush requests; not for the --shm-dir rows, whose
            fast-commit bytes come from `jext4 stats`). On `raw`: pwrite 1 KiB at the next
            offset of the device and fdatasync it (what the device's own
            fdatasync costs on the same backing file).
  create    --files times: create a file, write 4 KiB, fsync, close (single
            thread): files per second.
  metafsync jext4-bench-driver metafsync at each of --threads (create, write
            4 KiB, fsync, close, unlink per thread in its own directory, for
            --seconds): operations per second.

Figures are medians over --runs rounds; within a round the filesystems run
one after another, in an order rotated from round to round. Each image is
checked with `e2fsck -fn` after unmounting. jext4's own counters (`jext4
stats`: fast commits, full commits, bytes and flushes per fast commit) are
printed for the jext4 rows of the last round.
"""

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def run(argv, check=True):
    argv = [a for a in argv if a is not None]
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
        in_memory = kind in SHM_KINDS
        self.image = (args.shm_dir if in_memory else args.workdir) / f"{kind}.img"
        self.point = args.workdir / f"{kind}.mnt"
        self.point.mkdir(parents=True, exist_ok=True)
        self.image.parent.mkdir(parents=True, exist_ok=True)
        with open(self.image, "wb") as image:
            image.truncate(args.size)
        if kind != "raw":
            run(["mkfs.ext4", "-F", "-q", "-O", "fast_commit", self.image])
        self.loop = None
        if not in_memory:
            self.loop = run(["losetup", "-f", "--show", self.image]).stdout.strip()
        if kind == "ext4-fc":
            run(["mount", "-t", "ext4", self.loop, self.point])
        elif kind != "raw":
            options = {"jext4-full": ["-o", "fast_commit=off"],
                       "jext4-bytelog": ["-o", "bytelog"]}.get(kind, [])
            run([self.binary, "mount", *options, self.loop or self.image, self.point])

    @property
    def binary(self):
        return self.args.before_binary if self.kind == "jext4-before" else self.args.binary

    def stats(self):
        """jext4's counters (`jext4 stats`), refreshed by the server every
        2 s."""
        if self.kind in ("ext4-fc", "raw"):
            return {}
        time.sleep(2.5)
        text = run([self.binary, "stats", self.point]).stdout
        pairs = (line.split(" ", 1) for line in text.splitlines() if " " in line)
        return {name: value for name, value in pairs}

    def close(self):
        if self.kind == "ext4-fc":
            run(["umount", self.point])
        elif self.kind != "raw":
            run([self.binary, "umount", self.point])
        if self.loop:
            run(["losetup", "-d", self.loop])
        if self.kind == "raw":
            self.image.unlink()
            return
        verdict = run(["e2fsck", "-fn", self.image], check=False)
        if verdict.returncode != 0:
            sys.exit(f"{self.kind}: e2fsck -fn after the run:\n{verdict.stdout}")
        self.image.unlink()


def percentile(ordered, fraction):
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def append_loop(mounted, args):
    """1 KiB appends, each followed by fdatasync; on `raw` 1 KiB pwrites
    at consecutive offsets of the loop device."""
    block = os.urandom(1024)
    raw = mounted.kind == "raw"
    if raw:
        fd = os.open(mounted.loop, os.O_WRONLY)
    else:
        fd = os.open(mounted.point / "log", os.O_CREAT | os.O_WRONLY | os.O_APPEND, 0o644)
    latencies = []
    try:
        os.fsync(fd)
        sectors, flushes = device_stat(mounted.loop) if mounted.loop else (0, 0)
        for index in range(args.appends):
            began = time.perf_counter_ns()
            if raw:
                os.pwrite(fd, block, index * len(block))
            else:
                os.write(fd, block)
            os.fdatasync(fd)
            latencies.append(time.perf_counter_ns() - began)
        sectors_after, flushes_after = device_stat(mounted.loop) if mounted.loop else (0, 0)
    finally:
        os.close(fd)
    latencies.sort()
    device = {
        "bytes/fsync": (sectors_after - sectors) * 512 / args.appends,
        "flushes/fsync": (flushes_after - flushes) / args.appends,
    } if mounted.loop else {}
    return {
        **device,
        "fsyncs/s": args.appends / (sum(latencies) / 1e9),
        "p50 µs": percentile(latencies, 0.5) / 1000,
        "p99 µs": percentile(latencies, 0.99) / 1000,
    }


def metafsync(mounted, args):
    figures = {}
    for threads in args.threads:
        out = run([args.driver, "metafsync", "--dir", mounted.point / f"meta{threads}",
                   "--threads", threads, "--seconds", args.seconds]).stdout
        figures[f"meta{threads} ops/s"] = json.loads(out.strip().splitlines()[-1])["ops_per_sec"]
    return figures


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


KINDS = ["raw", "jext4-full", "jext4-fc", "ext4-fc", "jext4-bytelog", "jext4-fc-shm"]
# Kinds whose image is a file in --shm-dir, mounted without a loop device.
SHM_KINDS = ("jext4-bytelog", "jext4-fc-shm")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--appends", type=int, default=2000)
    parser.add_argument("--files", type=int, default=2000)
    parser.add_argument("--size", type=parse_size, default=parse_size("1G"))
    parser.add_argument("--workdir", type=Path, default=Path("/var/tmp/jext4-fc-cost"))
    parser.add_argument("--threads", default="1,4,8,16",
                        help="metafsync thread counts, comma-separated (empty: none)")
    parser.add_argument("--seconds", type=float, default=1.5)
    parser.add_argument("--jext4-binary", type=Path, dest="binary")
    parser.add_argument("--before-binary", type=Path,
                        help="an older jext4 build to compare, mounted as jext4-before")
    parser.add_argument("--shm-dir", type=Path, default=Path("/dev/shm/jext4-fc-cost"),
                        help="where the images of jext4-bytelog and jext4-fc-shm go (tmpfs)")
    args = parser.parse_args()
    args.threads = [int(t) for t in args.threads.split(",") if t]
    kinds = KINDS + (["jext4-before"] if args.before_binary else [])
    if os.geteuid() != 0:
        sys.exit("fast_commit_cost.py needs root (loop devices and mounts)")
    args.binary = args.binary or REPO / "target" / "release" / "jext4"
    if not args.binary.exists():
        run(["cargo", "build", "--release", "--bin", "jext4"])
    args.driver = args.binary.parent / "jext4-bench-driver"
    if args.threads and not args.driver.exists():
        run(["cargo", "build", "--release", "-p", "jext4-bench-driver"])
    args.workdir.mkdir(parents=True, exist_ok=True)
    results = {kind: {} for kind in kinds}
    counters = {}
    for round_index in range(args.runs):
        shift = round_index % len(kinds)
        order = kinds[shift:] + kinds[:shift]
        for kind in order:
            mounted = Mounted(kind, args)
            try:
                figures = append_loop(mounted, args)
                if kind != "raw":
                    figures.update(create_loop(mounted, args))
                    figures.update(metafsync(mounted, args))
                counters[kind] = mounted.stats()
            finally:
                mounted.close()
            for name, value in figures.items():
                results[kind].setdefault(name, []).append(value)
            print(f"round {round_index + 1} {kind:11} " + ", ".join(
                f"{name} {value:.1f}" for name, value in figures.items()), flush=True)
    names = list(results["ext4-fc"])
    print(f"\nmedians of {args.runs} rounds ({args.appends} 1 KiB appends + fdatasync; "
          f"{args.files} creates + 4 KiB write + fsync; metafsync {args.seconds} s)")
    print(f"{'':12}" + "".join(f" {name:>14}" for name in names))
    for kind in kinds:
        print(f"{kind:12}" + "".join(
            f" {median(results[kind][name]):14.1f}" if name in results[kind] else f" {'':>14}"
            for name in names))
    base = {name: median(results["ext4-fc"][name]) for name in names}
    jext4_kinds = [kind for kind in kinds if kind.startswith("jext4")]
    for kind in jext4_kinds:
        print(f"{kind} / ext4-fc: " + ", ".join(
            f"{name} {median(results[kind][name]) / base[name]:.2f}x" for name in names
            if name in results[kind] and base[name]))
    raw_p50 = median(results["raw"]["p50 µs"])
    print("append p50 / raw device p50: " + ", ".join(
        f"{kind} {median(results[kind]['p50 µs']) / raw_p50:.2f}x"
        for kind in kinds if kind != "raw"))
    for kind in jext4_kinds:
        wanted = ["journal_commits", "fast_commits", "fast_commit_bytes_per_commit",
                  "fast_commit_flushes_per_commit", "fast_commit_fallbacks",
                  "bytelog_persist_method", "bytelog_persists_per_commit"]
        found = ", ".join(f"{name} {counters[kind][name]}" for name in wanted
                          if name in counters.get(kind, {}))
        print(f"{kind} (last round, jext4 stats): {found or 'full commits only'}")


if __name__ == "__main__":
    main()
