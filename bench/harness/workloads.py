"""The workloads of issue 5, each naming its origin. A workload runs all its
cases on one freshly made and mounted filesystem and returns one result per
case: {"case": label, "params": {...}, "values": {metric: figure}, "extra": {...}}.

Sizes live in SIZES, one column for --quick and one for the full run; README
explains why they are what they are (the full run fits in 30 minutes on 2 cores).
"""

import json
import os
import re
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from util import Failure, fail_line, last_line, log, run

SIZES = {
    "quick": {
        "image_gib": 1,
        # (label, tar member, rounds it runs in: None = every round)
        "untar": [("kernel/ subtree", "linux-source-6.1/kernel", None)],
        # The image workloads (imaging.py), as untar's cases.
        "import": [("kernel/ subtree", "linux-source-6.1/kernel", None)],
        "copy": [("kernel/ subtree", "linux-source-6.1/kernel")],
        "metafsync_threads": [1, 2],
        "varmail_threads": [1, 2],
        "varmail_files": 200,
        "spool_threads": [1, 8],
        "dirs_threads": [1, 2],
        "stream_mib": 64,
        "seconds": 0.3,
        "lsm_table_kib": 256,
        "journal_count": 100,
        "journal_seconds": 0.25,
        "writers": 100,
        "fio_seq_mib": 32,
        "fio_seq_small_mib": 8,
        "fio_rand_mib": 32,
        "fio_rand_seconds": 1,
        "walk_member": "linux-source-6.1/kernel",
        "statstorm_threads": 4,
        "statstorm_rounds": 3,
        "dbbench_num": 200,
        "fsmark_files": 100,
        "dbench_seconds": 1,
        "dbench_clients": 2,
        # Out-of-space workloads (oos.py): images in RAM, sized per workload.
        "blurt_image_mib": 320,
        "blurt_passes": 1,
        "blurt_tasks": 100,
        "timetofail_image_mib": 320,
        "timetofail_member": "linux-source-6.1/kernel",
        "ddfull_image_mib": 512,
        "ddfull_mib": 50,
        "unpackmany_image_mib": 320,
        "unpackmany_member": "linux-source-6.1/kernel",
        "unpackmany_copies": [2, 5],
    },
    "full": {
        "image_gib": 4,
        # The whole tree runs in the first round only: fuse2fs alone needs
        # 1.5–3 minutes for it, three rounds of it would not fit in 30 minutes.
        "untar": [
            ("whole tree", "linux-source-6.1", 1),
            ("drivers/net subtree", "linux-source-6.1/drivers/net", None),
        ],
        "copy": [("drivers/net subtree", "linux-source-6.1/drivers/net")],
        # The image workloads (imaging.py): the whole tree in every round
        # but for the slow ones (fuse2fs, genext2fs: first round only).
        "import": [
            ("whole tree", "linux-source-6.1", 1),
            ("drivers/net subtree", "linux-source-6.1/drivers/net", None),
        ],
        "metafsync_threads": [1, 2, 4, 8, 16],
        "varmail_threads": [1, 4, 16],
        "varmail_files": 1000,
        "spool_threads": [1, 8],
        # The per-directory sweeps (issue 9): one directory (tree) per thread.
        "dirs_threads": [1, 2, 4, 8, 16],
        "stream_mib": 400,
        "seconds": 1.5,
        "lsm_table_kib": 1024,
        "journal_count": 5000,
        "journal_seconds": 1.0,
        "writers": 1000,
        "fio_seq_mib": 1024,
        "fio_seq_small_mib": 256,
        "fio_rand_mib": 128,
        "fio_rand_seconds": 3,
        # The metadata walk and the stat storm run over the untar subtree
        # (6,069 entries): untarred, synced and remounted before each case.
        "walk_member": "linux-source-6.1/drivers/net",
        "statstorm_threads": 4,
        "statstorm_rounds": 4,
        "dbbench_num": 1000,
        "fsmark_files": 500,
        "dbench_seconds": 5,
        "dbench_clients": 4,
        # Out-of-space workloads (oos.py): images in RAM, sized per workload.
        # blurt: each step adds 1,000 × 40 KiB = 39 MiB of live data, so the
        # loop meets the wall in its first pass, at step 7 or 8 (the issue's
        # "loop to the wall"). At 448 MiB the loop completes, rewriting at
        # ~85 % full, but fuse2fs needs ~10 minutes and jext4 over 17 (see
        # README): too long for three rounds.
        "blurt_image_mib": 320,
        "blurt_passes": 9,
        "blurt_tasks": 1000,
        # xfs refuses volumes under 300 MiB; drivers/net (128 MiB) overflows it.
        "timetofail_image_mib": 320,
        "timetofail_member": "linux-source-6.1/drivers/net",
        # 200 MiB is a quarter of the volume far from full; the two nearly
        # full cases fill it first (fuse2fs writes ~26 MB/s: keep it small).
        "ddfull_image_mib": 768,
        "ddfull_mib": 200,
        # kernel/ takes ~12.7 MiB at 4 KiB blocks: 40 copies fill ~95 %.
        "unpackmany_image_mib": 560,
        "unpackmany_member": "linux-source-6.1/kernel",
        "unpackmany_copies": [10, 40],
    },
}

DBENCH_LOADFILE = "/usr/share/dbench/client.txt"
KERNEL_SOURCE = Path("/usr/src/linux-source-6.1.tar.xz")


@dataclass
class Metric:
    key: str
    label: str
    unit: str
    better: str  # "higher" or "lower"


@dataclass
class Context:
    quick: bool
    driver: Path
    cache: Path
    sizes: dict = field(default_factory=dict)
    round: int = 0
    # The mounted filesystem's FUSE request counters, for jext4 (a callable
    # returning {"fuse_requests": n, "fuse_op_lookup": n, ...} or None).
    request_counts: object = None
    # All of jext4's counters (`jext4 stats --json`), for jext4; else None.
    stats: object = None
    # Unmount and mount the filesystem again (empties its caches).
    remount: object = None
    # The run's working directory (images, mountpoints), for the image
    # workloads, which mount by themselves.
    workdir: Path = None
    # A library-form run (imaging.Jext4Lib): the image the driver opens
    # with --image, and the driver's peak RSS over the run.
    library_image: Path = None
    library_peak_kib: int = None


def read_request_counts(ctx):
    return ctx.request_counts() if ctx.request_counts else None


def requests_per_file(before, after, tree):
    """What the FUSE server was asked while a tree was made, per entry of the
    tree (files, directories and symlinks): {} where nobody counted."""
    if before is None or after is None:
        return {}
    files = sum(len(dirs) + len(names) for _, dirs, names in os.walk(tree))
    if files == 0:
        return {}
    asked = {key: after[key] - before.get(key, 0) for key in after}
    by_operation = {
        key.removeprefix("fuse_op_"): round(count / files, 2)
        for key, count in sorted(asked.items(), key=lambda item: -item[1])
        if key.startswith("fuse_op_") and count > 0
    }
    figures = {
        "files": files,
        "requests_per_file": round(asked["fuse_requests"] / files, 2),
        "requests_by_operation_per_file": by_operation,
    }
    # Where the server's time went, µs per file: in the engine and in the
    # transport (the handlers' time outside the engine: /dev/fuse's reply
    # write; a ring answer is sent with the next fetch, outside it), and
    # the CPU time of the serving threads (engine and transport, whatever
    # the load: what compares the transports).
    for key, name in (
        ("fuse_engine_us", "engine_us_per_file"),
        ("fuse_transport_us", "transport_us_per_file"),
        ("fuse_threads_cpu_us", "server_cpu_us_per_file"),
    ):
        if key in asked:
            figures[name] = round(asked[key] / files, 1)
    return figures


class Workload:
    name = ""
    title = ""
    origin = ""
    metrics = []
    ratio_metrics = None  # default: every metric
    plot = None  # "threads" or "cdf"
    packages = []
    tools = []
    opt_in = False  # run only when named with --only
    ram_image = False  # the image lives in /dev/shm instead of the workdir

    def image_bytes(self, ctx):
        return ctx.sizes["image_gib"] << 30

    def prepare(self, ctx):
        """One-time set-up outside any measurement (e.g. tarballs)."""

    def run(self, ctx, directory):
        raise NotImplementedError


def driver(ctx, subcommand, directory, *args, timeout=300):
    """Runs one jext4-bench-driver workload and returns its JSON line;
    through jext4's library (`--image`) when ctx.library_image is set
    (directory is then a path inside the image)."""
    if ctx.library_image:
        import imaging

        return imaging.library_driver(ctx, subcommand, directory, args, timeout)
    result = run([ctx.driver, subcommand, "--dir", directory, *args], timeout=timeout)
    line = last_line(result.stdout, limit=10**7)
    try:
        return json.loads(line)
    except json.JSONDecodeError:
        raise Failure(f"driver {subcommand} printed no JSON result: {line[:200]}")


class Untar(Workload):
    name = "untar"
    title = "untar: Linux 6.1 source, tar -x then sync"
    origin = "the Hurd journal's headline workload; Debian's linux-source-6.1"
    metrics = [Metric("seconds", "seconds", "s", "lower")]
    packages = ["linux-source-6.1"]
    tools = ["tar"]

    def tarball(self, ctx, member):
        name = member.replace("/", "_") + ".tar"
        return ctx.cache / name

    def prepare(self, ctx):
        self.cut_members(ctx, [member for _, member, _ in ctx.sizes["untar"]])

    def cut_members(self, ctx, members):
        """Decompresses the kernel source once and cuts the subtrees out, so the
        measurement is the filesystem's work, not xz's (cached under the workdir)."""
        whole = ctx.cache / "linux-source-6.1.tar"
        if not whole.exists():
            if not KERNEL_SOURCE.exists():
                raise Failure(f"{KERNEL_SOURCE} missing (apt-get install linux-source-6.1)")
            log(f"decompressing {KERNEL_SOURCE} into {whole} (once)")
            partial = whole.with_suffix(".part")
            run(["sh", "-c", f"xz -dc -T2 '{KERNEL_SOURCE}' > '{partial}'"], timeout=600)
            partial.rename(whole)
        for member in members:
            tarball = self.tarball(ctx, member)
            if tarball.exists():
                continue
            log(f"cutting {member} out of the source into {tarball} (once)")
            scratch = ctx.cache / "scratch"
            shutil.rmtree(scratch, ignore_errors=True)
            scratch.mkdir()
            run(["tar", "-xf", whole, "-C", scratch, member], timeout=600)
            partial = tarball.with_suffix(".part")
            run(["tar", "-cf", partial, "-C", scratch, member.split("/")[0]], timeout=600)
            partial.rename(tarball)
            shutil.rmtree(scratch, ignore_errors=True)

    def run(self, ctx, directory):
        results = []
        for label, member, rounds in ctx.sizes["untar"]:
            if rounds is not None and ctx.round >= rounds:
                continue
            target = directory / ("untar-" + re.sub(r"\W+", "-", label))
            target.mkdir()
            before = read_request_counts(ctx)
            began = time.monotonic()
            run(["tar", "-xf", self.tarball(ctx, member), "-C", target], timeout=900)
            extracted = time.monotonic()
            run(["sync"], timeout=600)
            ended = time.monotonic()
            requests = requests_per_file(before, read_request_counts(ctx), target)
            results.append({
                "case": label,
                "params": {"member": member},
                "values": {"seconds": ended - began},
                "extra": {"sync_seconds": ended - extracted, **requests},
            })
        return results


class CopyTree(Untar):
    """cp -a of an extracted tree (from the host's page cache) into the
    filesystem, then sync: the "copy a real tree" of issue 2. Unlike untar it
    reads and writes through separate processes' buffers and sets every
    mode, owner and timestamp with separate calls (cp -a preserves them)."""

    name = "copy"
    title = "copy: cp -a of a Linux 6.1 source subtree, then sync"
    origin = "issue 2 (copy a real tree); Debian's linux-source-6.1"
    tools = ["tar", "cp"]

    def source(self, ctx, member):
        return ctx.cache / ("tree-" + member.replace("/", "_"))

    def prepare(self, ctx):
        Untar.prepare(self, ctx)
        for _, member in ctx.sizes["copy"]:
            self.extract(ctx, member)

    def extract(self, ctx, member):
        """The member extracted from the whole tarball under the cache, once."""
        tree = self.source(ctx, member)
        if tree.exists():
            return
        log(f"extracting {member} into {tree} (once)")
        partial = tree.with_suffix(".part")
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir()
        run(["tar", "-xf", ctx.cache / "linux-source-6.1.tar", "-C", partial, member], timeout=900)
        partial.rename(tree)

    def run(self, ctx, directory):
        results = []
        for label, member in ctx.sizes["copy"]:
            source = self.source(ctx, member) / member.split("/")[0]
            # Warm the page cache so the source side costs the same for all.
            run(["tar", "-cf", "/dev/null", "-C", source.parent, source.name], timeout=600)
            target = directory / ("copy-" + re.sub(r"\W+", "-", label))
            before = read_request_counts(ctx)
            began = time.monotonic()
            run(["cp", "-a", source, target], timeout=900)
            copied = time.monotonic()
            run(["sync"], timeout=600)
            ended = time.monotonic()
            requests = requests_per_file(before, read_request_counts(ctx), target)
            results.append({
                "case": label,
                "params": {"member": member},
                "values": {"seconds": ended - began},
                "extra": {"sync_seconds": ended - copied, **requests},
            })
        return results


class MetaWalk(Untar):
    """Walks of a tree the filesystem holds but has not cached: the tree is
    untarred and synced (not measured), then before each case the
    filesystem is remounted, and the case is timed: `find` printing each
    entry's size, mode, owner and time (an lstat per entry), `du -s`,
    `ls -lR`."""

    name = "walk"
    title = "metadata walk after a remount: find + stat, du -s, ls -lR"
    origin = "issue 11 (a cold walk of an untarred tree); Debian's linux-source-6.1"
    tools = ["tar", "find", "du", "ls"]

    def prepare(self, ctx):
        self.cut_members(ctx, [ctx.sizes["walk_member"]])

    def populate(self, ctx, directory):
        """Untar the walk's tree and sync; returns the directory tar wrote into."""
        target = directory / "tree"
        target.mkdir()
        run(["tar", "-xf", self.tarball(ctx, ctx.sizes["walk_member"]), "-C", target], timeout=900)
        run(["sync"], timeout=600)
        return target

    def cases(self, tree):
        return [
            ("find + stat", ["find", tree, "-printf", "%s %m %u %T@\n"]),
            ("du -s", ["du", "-s", tree]),
            ("ls -lR", ["ls", "-lR", tree]),
        ]

    def run(self, ctx, directory):
        tree = self.populate(ctx, directory)
        member = ctx.sizes["walk_member"]
        results = []
        for label, argv in self.cases(tree):
            ctx.remount()
            before = read_request_counts(ctx)
            began = time.monotonic()
            run(argv, timeout=900)
            ended = time.monotonic()
            requests = requests_per_file(before, read_request_counts(ctx), tree)
            results.append({
                "case": f"{label}, {member.split('/', 1)[1]}",
                "params": {"member": member, "command": label},
                "values": {"seconds": ended - began},
                "extra": requests,
            })
        return results


class StatStorm(MetaWalk):
    """`git status` on a tree nobody changed: lstat every file the index
    lists (on several threads, as git's preload does), then read every
    directory (the untracked-files scan); the first round right after a
    remount, then warm rounds. The list is tar's, made outside the
    measurement."""

    name = "statstorm"
    title = "stat storm: git status-like lstat of every file (threads) and readdir of every directory"
    origin = "issue 11 (git status); jext4-bench-driver statstorm"
    tools = ["tar"]
    metrics = [Metric("seconds", "seconds", "s", "lower")]

    def listing(self, ctx):
        return ctx.cache / ("listing-" + ctx.sizes["walk_member"].replace("/", "_") + ".txt")

    def prepare(self, ctx):
        MetaWalk.prepare(self, ctx)
        listing = self.listing(ctx)
        if not listing.exists():
            output = run(["tar", "-tf", self.tarball(ctx, ctx.sizes["walk_member"])], timeout=600).stdout
            listing.write_text(output)

    def run(self, ctx, directory):
        tree = self.populate(ctx, directory)
        ctx.remount()
        threads, rounds = ctx.sizes["statstorm_threads"], ctx.sizes["statstorm_rounds"]
        before = read_request_counts(ctx)
        figures = driver(
            ctx, "statstorm", tree, "--list", self.listing(ctx), "--threads", threads, "--rounds", rounds
        )
        requests = requests_per_file(before, read_request_counts(ctx), tree)
        member = ctx.sizes["walk_member"].split("/", 1)[1]
        return [
            {
                "case": f"cold (after a remount), {threads} threads, {member}",
                "params": {"threads": threads, "round": "cold"},
                "values": {"seconds": figures["cold_seconds"]},
                "extra": {"files": figures["files"], "directories": figures["directories"], **requests},
            },
            {
                "case": f"warm (median of {rounds - 1} rounds), {threads} threads, {member}",
                "params": {"threads": threads, "round": "warm"},
                "values": {"seconds": figures["warm_seconds"]},
                "extra": {"rounds": figures["rounds"]},
            },
        ]


class ThreadSweep(Workload):
    """A driver workload run at several thread counts, in ops/s."""

    plot = "threads"
    metrics = [Metric("ops_per_sec", "ops/s", "ops/s", "higher")]
    subcommand = ""
    threads_key = ""

    def extra_args(self, ctx):
        return []

    def run(self, ctx, directory):
        results = []
        for threads in ctx.sizes[self.threads_key]:
            own = directory / f"{self.name}-{threads}"
            args = ["--threads", threads, "--seconds", ctx.sizes["seconds"], *self.extra_args(ctx)]
            figures = driver(ctx, self.subcommand, own, *args)
            results.append({
                "case": f"{threads} thread{'s' if threads > 1 else ''}",
                "params": {"threads": threads},
                "values": {"ops_per_sec": figures["ops_per_sec"]},
                "extra": {"operations": figures["operations"]},
            })
        return results


# The server refreshes what `jext4 stats` reads every 2 s.
STATS_REFRESH_SECONDS = 2.2
FAST_COMMIT_COUNTERS = [
    "fast_commits", "fast_commit_directory_transactions", "fast_commit_flushes",
    "fast_commit_fallbacks", "full_commits", "dir_tx_coalesced", "dir_tx_conflicts_waited",
    "dir_tx_conflicts_shadowed", "dir_tx_lockup_waits", "dir_tx_lockup_micros",
]


def fast_commit_counters(ctx):
    """jext4's fast-commit counters now (after the server's next refresh), or
    None for other filesystems and mounts without fast commits."""
    if not ctx.stats:
        return None
    time.sleep(STATS_REFRESH_SECONDS)
    stats = ctx.stats() or {}
    if "fast_commits" not in stats:
        return None
    return {key: stats.get(key, 0) for key in FAST_COMMIT_COUNTERS}


def fast_commit_figures(before, after, operations):
    """What a case cost in fast commits: the compound degree (directory
    transactions per write of the area), flushes per fast commit, and per
    operation; {} where nobody counted."""
    if before is None or after is None:
        return {}
    delta = {key: after[key] - before[key] for key in FAST_COMMIT_COUNTERS}
    writes = delta["fast_commits"]
    figures = {"jext4_" + key: value for key, value in delta.items()}
    if writes:
        figures["compound_degree"] = round(delta["fast_commit_directory_transactions"] / writes, 2)
        figures["flushes_per_fast_commit"] = round(delta["fast_commit_flushes"] / writes, 2)
    if operations:
        figures["fast_commit_flushes_per_op"] = round(delta["fast_commit_flushes"] / operations, 3)
    return figures


class DirsSweep(ThreadSweep):
    """A driver workload at several thread counts, each thread its own
    directory tree (the DJFS paper's property D): N single-threaded driver
    processes at once, ops/s summed; with jext4's fast-commit figures."""

    threads_key = "dirs_threads"

    def run(self, ctx, directory):
        results = []
        for threads in ctx.sizes[self.threads_key]:
            before = fast_commit_counters(ctx)
            own = directory / f"{self.name}-{threads}"
            args = ["--threads", 1, "--seconds", ctx.sizes["seconds"], *self.extra_args(ctx)]
            figures = driver_processes(ctx, self.subcommand, [own / f"t{i}" for i in range(threads)], *args)
            operations = sum(figure["operations"] for figure in figures)
            seconds = max(figure["seconds"] for figure in figures)
            results.append({
                "case": f"{threads} thread{'s' if threads > 1 else ''}",
                "params": {"threads": threads},
                "values": {"ops_per_sec": operations / seconds},
                "extra": {"operations": operations,
                          **fast_commit_figures(before, fast_commit_counters(ctx), operations)},
            })
        return results


def driver_processes(ctx, subcommand, directories, *args, timeout=300):
    """Runs one jext4-bench-driver process per directory, all at once, and
    returns their JSON lines."""
    import subprocess
    processes = []
    for directory in directories:
        directory.mkdir(parents=True, exist_ok=True)
        argv = [str(ctx.driver), subcommand, "--dir", str(directory), *[str(arg) for arg in args]]
        processes.append(subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    figures = []
    for process in processes:
        stdout, stderr = process.communicate(timeout=timeout)
        if process.returncode != 0:
            raise Failure(f"driver {subcommand} exited {process.returncode}: {last_line(stderr)}")
        try:
            figures.append(json.loads(last_line(stdout, limit=10**7)))
        except json.JSONDecodeError:
            raise Failure(f"driver {subcommand} printed no JSON result: {last_line(stdout)[:200]}")
    return figures


class VarmailDirs(DirsSweep):
    name = "varmail-dirs"
    title = "varmail, one directory per thread: create/append/fsync/read/delete"
    origin = "filebench's varmail as the DJFS paper runs it (dedicated directories); ops = flowops"
    subcommand = "varmail"

    def extra_args(self, ctx):
        return ["--files", ctx.sizes["varmail_files"] // 4]


class EximDirs(DirsSweep):
    name = "exim-dirs"
    title = "mail spool, one spool tree per thread: Exim receive, deliver, retire"
    origin = "DJFS paper's Exim workload, each instance in its own directory; ops = messages"
    subcommand = "exim"


class LsmDirs(DirsSweep):
    name = "lsm-dirs"
    title = "LSM compaction, one database directory per thread"
    origin = "DJFS paper's RocksDB compaction pattern, each instance in its own directory; ops = outputs"
    subcommand = "lsm"

    def extra_args(self, ctx):
        return ["--table-kib", ctx.sizes["lsm_table_kib"]]


class MetaFsyncDirs(DirsSweep):
    name = "metafsync-dirs"
    title = "metadata + fsync with jext4's fast-commit figures: create, write 4 KiB, fsync, unlink, own directory"
    origin = "ext4 ByteLog RFC's meta_create_unlink_fsyncN; DJFS's MDTest"
    subcommand = "metafsync"


class FsMarkDirs(Workload):
    """fs_mark -S 1 with one directory per thread."""

    name = "fsmark-dirs"
    title = "fs_mark -S 1 (fsync each file), 4 KiB files, one directory per thread"
    origin = "Debian's fsmark; DJFS's MDTest shape"
    plot = "threads"
    metrics = [Metric("files_per_sec", "files/s", "files/s", "higher")]
    packages = ["fsmark"]
    tools = ["fs_mark"]

    def run(self, ctx, directory):
        results = []
        for threads in ctx.sizes["dirs_threads"]:
            before = fast_commit_counters(ctx)
            target = directory / f"fsmark-{threads}"
            dirs = []
            for index in range(threads):
                (target / f"t{index}").mkdir(parents=True)
                dirs += ["-d", f"t{index}"]
            files = ctx.sizes["fsmark_files"]
            # Relative names: fs_mark 3.3 overflows a buffer on long paths.
            argv = ["fs_mark", *dirs, "-n", files, "-s", 4096, "-S", 1, "-t", 1, "-L", 1]
            output = run(argv, timeout=900, cwd=target).stdout
            rows = [line.split() for line in output.splitlines() if re.match(r"^\s*\d+\s+\d+\s+\d+\s+[\d.]+", line)]
            if not rows:
                raise Failure(f"fs_mark: no result row: {last_line(output)}")
            rate = float(rows[-1][3])
            results.append({
                "case": f"{threads} thread{'s' if threads > 1 else ''}",
                "params": {"threads": threads},
                "values": {"files_per_sec": rate},
                "extra": fast_commit_figures(before, fast_commit_counters(ctx), files * threads),
            })
        return results


class Stream(Workload):
    """Issue 9's streaming case (the driver's `stream`)."""

    name = "stream"
    title = "create + 1 KiB write + fsync in a/ while b/ streams a file unsynced"
    origin = "issue 9: an fsync must not pay for another directory's unsynced data"
    metrics = [
        Metric("p99_us", "a/ p99 µs", "µs", "lower"),
        Metric("p50_us", "a/ p50 µs", "µs", "lower"),
        Metric("fsyncs_during_stream", "a/ fsyncs during the stream", "fsyncs", "higher"),
    ]

    def run(self, ctx, directory):
        mib = ctx.sizes["stream_mib"]
        before = fast_commit_counters(ctx)
        figures = driver(ctx, "stream", directory / "stream", "--stream-mib", mib, timeout=900)
        return [{
            "case": f"{mib} MiB streamed",
            "params": {"stream_mib": mib},
            "values": {key: figures[key] for key in ("p99_us", "p50_us", "fsyncs_during_stream")},
            "extra": {key: figures[key] for key in ("p999_us", "max_us", "fsyncs", "stream_seconds")}
            | fast_commit_figures(before, fast_commit_counters(ctx), figures["fsyncs"]),
        }]


class MetaFsync(ThreadSweep):
    name = "metafsync"
    title = "metadata + fsync: N threads, own directory each: create, write 4 KiB, fsync, unlink"
    origin = "ext4 ByteLog RFC's meta_create_unlink_fsyncN; DJFS's MDTest"
    subcommand = "metafsync"
    library = True  # jext4-lib runs it through the library (--image)
    threads_key = "metafsync_threads"


class Varmail(ThreadSweep):
    name = "varmail"
    title = "varmail: create/append/fsync/read/delete in one shared directory"
    origin = "filebench's varmail personality (DJFS and FastCommit papers); ops = filebench flowops"
    subcommand = "varmail"
    library = True  # jext4-lib runs it through the library (--image)
    threads_key = "varmail_threads"

    def extra_args(self, ctx):
        return ["--files", ctx.sizes["varmail_files"]]


class Exim(ThreadSweep):
    name = "exim"
    title = "mail spool: Exim receive (-D, -H by rename, fsyncs), deliver (mailbox append + fsync), retire"
    origin = "DJFS paper's Exim workload; ops = messages"
    subcommand = "exim"
    threads_key = "spool_threads"


class Lsm(ThreadSweep):
    name = "lsm"
    title = "LSM compaction: write + fsync table, fsync dir, MANIFEST append + fsync, unlink inputs"
    origin = "DJFS paper's RocksDB compaction pattern; ops = compaction outputs"
    subcommand = "lsm"
    threads_key = "spool_threads"

    def extra_args(self, ctx):
        return ["--table-kib", ctx.sizes["lsm_table_kib"]]


class MessageJournal(Workload):
    name = "msgjournal"
    title = "message journal: append + fdatasync latency (µs)"
    origin = "LMAX's journaller; HdrHistogram"
    plot = "cdf"
    metrics = [
        Metric("p50_us", "p50", "µs", "lower"),
        Metric("p99_us", "p99", "µs", "lower"),
        Metric("p99_9_us", "p99.9", "µs", "lower"),
        Metric("p99_99_us", "p99.99", "µs", "lower"),
        Metric("max_us", "max", "µs", "lower"),
    ]
    ratio_metrics = ["p99_99_us", "max_us"]

    def run(self, ctx, directory):
        results = []
        for record_bytes in (1024, 4096):
            for layout in ("fresh", "fallocate", "zerofill"):
                for reader in (False, True):
                    args = [
                        "--record-bytes", record_bytes, "--layout", layout,
                        "--count", ctx.sizes["journal_count"],
                        "--seconds", ctx.sizes["journal_seconds"],
                    ] + (["--reader"] if reader else [])
                    figures = driver(ctx, "msgjournal", directory, *args)
                    who = "writer + reader" if reader else "writer"
                    result = {
                        "case": f"{record_bytes // 1024} KiB, {layout}, {who}",
                        "params": {"record_bytes": record_bytes, "layout": layout, "reader": reader},
                        "values": {},
                        "extra": {},
                    }
                    if "unsupported" in figures:
                        result["extra"]["unsupported"] = figures["unsupported"]
                    else:
                        result["values"] = {metric.key: figures[metric.key] for metric in self.metrics}
                        result["extra"] = {
                            "appends": figures["appends"],
                            "appends_per_sec": figures["appends_per_sec"],
                            "cdf": figures["cdf"],
                        }
                    results.append(result)
        return results


class SmallWriters(Workload):
    name = "smallwriters"
    title = "many small writers: P processes each writing 40 × 1 KiB to its own file, then syncfs"
    origin = "Tux3's test"
    metrics = [Metric("seconds", "seconds", "s", "lower")]

    def run(self, ctx, directory):
        procs = ctx.sizes["writers"]
        figures = driver(ctx, "smallwriters", directory, "--procs", procs, "--writes", 40, "--record-bytes", 1024)
        return [{
            "case": f"{procs} processes",
            "params": {"procs": procs},
            "values": {"seconds": figures["seconds"]},
            "extra": {"write_seconds": figures["write_seconds"]},
        }]


class Fio(Workload):
    name = "fio"
    title = "fio: buffered sequential and 4 KiB random I/O (MB/s)"
    origin = "fio (Debian)"
    metrics = [Metric("mb_per_sec", "MB/s", "MB/s", "higher")]
    packages = ["fio"]
    tools = ["fio"]

    def jobs(self, ctx):
        seq, rand, seconds = ctx.sizes["fio_seq_mib"], ctx.sizes["fio_rand_mib"], ctx.sizes["fio_rand_seconds"]
        small = ctx.sizes["fio_seq_small_mib"]
        return [
            (f"sequential write {seq} MiB, 1 MiB blocks", "write", "seq.dat", "1M", seq, None, True),
            (f"sequential read {seq} MiB, 1 MiB blocks", "read", "seq.dat", "1M", seq, None, False),
            (f"sequential write {small} MiB, 4 KiB blocks", "write", "seq4k.dat", "4k", small, None, True),
            (f"sequential read {small} MiB, 4 KiB blocks", "read", "seq4k.dat", "4k", small, None, False),
            (f"random write 4 KiB in {rand} MiB", "randwrite", "rand.dat", "4k", rand, seconds, True),
            (f"random read 4 KiB in {rand} MiB", "randread", "rand.dat", "4k", rand, seconds, False),
        ]

    def run(self, ctx, directory):
        results = []
        for label, rw, filename, block, mib, seconds, writes in self.jobs(ctx):
            argv = [
                "fio", "--name=" + rw, "--directory=" + str(directory), "--filename=" + filename,
                "--rw=" + rw, "--bs=" + block, f"--size={mib}M", "--ioengine=psync", "--direct=0",
                "--fallocate=none", "--output-format=json",
            ]
            if seconds:
                argv.append(f"--runtime={seconds}")
            if writes:
                argv.append("--end_fsync=1")
            output = run(argv, timeout=600).stdout
            try:
                job = json.loads(output[output.index("{"):])["jobs"][0]
            except (ValueError, KeyError, IndexError):
                raise Failure(f"fio {rw}: unreadable JSON output: {last_line(output)}")
            side = "write" if "write" in rw else "read"
            results.append({
                "case": label,
                "params": {"rw": rw},
                "values": {"mb_per_sec": job[side]["bw_bytes"] / 1e6},
                "extra": {"iops": job[side]["iops"]},
            })
        return results


class Apps(Workload):
    name = "apps"
    title = "real applications: RocksDB db_bench fillsync, fs_mark -S 1, dbench NetBench"
    origin = "Debian's rocksdb-tools, fsmark, dbench (client.txt loadfile)"
    metrics = [Metric("figure", "figure", "", "higher")]
    packages = ["rocksdb-tools", "fsmark", "dbench"]
    tools = ["db_bench", "fs_mark", "dbench"]

    def run(self, ctx, directory):
        """Runs the three tools independently: one failing does not hide the others."""
        sizes = ctx.sizes
        tools = [
            (f"db_bench fillsync, {sizes['dbbench_num']} synced puts (ops/s)", "db_bench", self.db_bench),
            (f"fs_mark -S 1, {sizes['fsmark_files']} × 4 KiB files (files/s)", "fs_mark", self.fs_mark),
            (
                f"dbench NetBench, {sizes['dbench_clients']} clients, {sizes['dbench_seconds']} s (MB/s)",
                "dbench",
                self.dbench,
            ),
        ]
        results = []
        for case, name, tool in tools:
            result = {"case": case, "params": {"tool": name}, "values": {}, "extra": {}}
            try:
                figure, extra = tool(ctx, directory)
                result["values"], result["extra"] = {"figure": figure}, extra
            except Failure as error:
                fail_line(f"{directory.name} apps {name}: {error}")
                result["extra"] = {"failed": str(error)}
            results.append(result)
        return results

    def db_bench(self, ctx, directory):
        num = ctx.sizes["dbbench_num"]
        argv = ["db_bench", "--benchmarks=fillsync", f"--db={directory / 'rocksdb'}", f"--num={num}", "--threads=1"]
        output = run(argv, timeout=600).stdout
        match = re.search(r"^fillsync\s*:\s*([\d.]+) micros/op\s+([\d.]+) ops/sec", output, re.M)
        if not match:
            raise Failure(f"db_bench: no fillsync result line: {last_line(output)}")
        return float(match.group(2)), {"micros_per_op": float(match.group(1))}

    def fs_mark(self, ctx, directory):
        files = ctx.sizes["fsmark_files"]
        target = directory / "fsmark"
        target.mkdir()
        # fs_mark 3.3 overflows a buffer when the directory path plus its
        # 40-byte file names pass ~80 bytes: run it inside the directory.
        argv = ["fs_mark", "-d", ".", "-n", files, "-s", 4096, "-S", 1, "-t", 1, "-L", 1]
        output = run(argv, timeout=600, cwd=target).stdout
        rows = [line.split() for line in output.splitlines() if re.match(r"^\s*\d+\s+\d+\s+\d+\s+[\d.]+", line)]
        if not rows:
            raise Failure(f"fs_mark: no result row: {last_line(output)}")
        return float(rows[-1][3]), {}

    def dbench(self, ctx, directory):
        seconds, clients = ctx.sizes["dbench_seconds"], ctx.sizes["dbench_clients"]
        target = directory / "dbench"
        target.mkdir()
        argv = ["dbench", "-t", seconds, "-D", target, "-c", DBENCH_LOADFILE, clients]
        output = run(argv, timeout=seconds + 300).stdout
        match = re.search(r"Throughput ([\d.]+) MB/sec", output)
        if not match:
            raise Failure(f"dbench: no throughput line: {last_line(output)}")
        return float(match.group(1)), {}


# oos.py and imaging.py build on the classes above (deliberate imports at
# the end).
from imaging import WORKLOADS as IMAGE  # noqa: E402
from oos import WORKLOADS as OUT_OF_SPACE  # noqa: E402

DIRS = [Stream(), MetaFsyncDirs(), FsMarkDirs(), VarmailDirs(), EximDirs(), LsmDirs()]
for _workload in DIRS:
    _workload.opt_in = True

ALL = [
    Untar(), CopyTree(), MetaWalk(), StatStorm(), MetaFsync(), Varmail(), Exim(), Lsm(), MessageJournal(), SmallWriters(), Fio(), Apps(),
    *OUT_OF_SPACE, *DIRS, *IMAGE,
]
DRIVER_WORKLOADS = {
    "metafsync", "varmail", "exim", "lsm", "msgjournal", "smallwriters", "blurt", "statstorm",
    "stream", "metafsync-dirs", "varmail-dirs", "exim-dirs", "lsm-dirs",
}
# `--only oos`: the out-of-space group; `--only dirs`: the per-directory
# group of issue 9 (both opt-in: not part of a default run).
GROUPS = {
    "oos": [w.name for w in OUT_OF_SPACE],
    "dirs": [w.name for w in DIRS],
    # `--only image`: the image tools against their peers (issue 25).
    "image": [w.name for w in IMAGE],
}
