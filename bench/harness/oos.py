"""The out-of-space workloads of issue 10, after the Tux3 post (Daniel
Phillips, 2015; ../../shared/background/004): each runs on a small image in
RAM (/dev/shm, as the post's loopback mounts on tmpfs) so that the volume
fills in seconds, and reports, beside its time, how full `df` says the
volume is at the end: a filesystem that stops early (a false ENOSPC) shows
it there.

- blurt: the post's load generator in its shell loop (9 × 9 steps of 1,000
  tasks each rewriting a 40 × 1 KiB file), on a volume the live data fills
  to ~85 %: the rewrites test that space freed by truncation comes back.
- timetofail: dd the volume full, give 2 MiB back, then untar a source
  tree into it and time until tar gives up.
- ddfull: 200 MiB dd (then sync) into a far-from-full, a getting-full
  (300 MiB free) and a just-over-full (190 MiB free) volume; "free" is
  what dd gave back after filling the volume to ENOSPC.
- unpackmany: untar a source tree into 10, then 40 directories of a volume
  that the 40 copies bring near full.
"""

import os
import shutil
import time

from util import Failure, last_line, run
from workloads import Metric, Untar, Workload, driver

MIB = 1 << 20


def statvfs_mib(directory):
    """(free MiB for root, percent used as df(1) computes it)."""
    stats = os.statvfs(directory)
    used = stats.f_blocks - stats.f_bfree
    # df: used / (used + available), rounded up.
    denominator = used + stats.f_bavail
    percent = -(-used * 100 // denominator) if denominator else 100
    return stats.f_bfree * stats.f_frsize / MIB, percent


def df_percent(directory):
    run(["sync"], timeout=600)
    return statvfs_mib(directory)[1]


def fill(directory, leave_mib):
    """dd zeros into directory/filler until ENOSPC (as root: every block
    this filesystem lets root have, however it reserves), then give back
    leave_mib MiB by truncating the filler, and sync."""
    target = directory / "filler"
    result = run(["dd", "if=/dev/zero", f"of={target}", "bs=1M"], timeout=900, check=False)
    if "No space left on device" not in result.stderr:
        raise Failure(f"filling the volume: dd: {last_line(result.stderr)}")
    run(["sync"], timeout=600)
    size = target.stat().st_size
    if size < leave_mib * MIB:
        raise Failure(f"filling the volume: only {size / MIB:.0f} MiB fitted, {leave_mib} MiB wanted back")
    os.truncate(target, size - leave_mib * MIB)
    run(["sync"], timeout=600)


def empty(directory):
    """Removes everything under directory and syncs, so the next case starts
    from the same free space on every filesystem."""
    for entry in directory.iterdir():
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()
    run(["sync"], timeout=600)


class OutOfSpace(Workload):
    """A workload whose image lives in RAM and has its own size."""

    ram_image = True
    opt_in = True
    packages = []
    tools = ["dd", "tar"]

    def image_bytes(self, ctx):
        return ctx.sizes[self.name + "_image_mib"] * MIB


class Blurt(OutOfSpace):
    name = "blurt"
    title = "blurt: 9 × 9 steps of 1,000 tasks each rewriting a 40 × 1 KiB file, then syncfs"
    origin = "the Tux3 out-of-space post (blurt.c and its shell loop)"
    metrics = [
        Metric("seconds", "seconds", "s", "lower"),
        Metric("steps", "steps done", "steps", "higher"),
        Metric("df_percent", "df use %", "%", "higher"),
    ]
    ratio_metrics = ["seconds"]
    tools = []

    def run(self, ctx, directory):
        passes, tasks = ctx.sizes["blurt_passes"], ctx.sizes["blurt_tasks"]
        figures = driver(
            ctx, "blurt", directory, "--passes", passes, "--directories", 9,
            "--tasks", tasks, "--writes", 40, timeout=1800,
        )
        return [{
            "case": f"{passes} × 9 steps × {tasks} tasks, {ctx.sizes['blurt_image_mib']} MiB volume",
            "params": {"passes": passes, "tasks": tasks},
            "values": {
                "seconds": figures["seconds"],
                "steps": figures["steps_done"],
                "df_percent": df_percent(directory),
            },
            "extra": {
                "loop_seconds": figures["loop_seconds"],
                "full_at_step": figures["full_at_step"],
                "enospc_tasks": figures["enospc_tasks"],
            },
        }]


class TimeToFail(OutOfSpace, Untar):
    name = "timetofail"
    title = "time to fail: dd until full, free 2 MiB, then untar until tar gives up"
    origin = "the Tux3 out-of-space post"
    metrics = [Metric("seconds", "seconds", "s", "lower"), Metric("df_percent", "df use %", "%", "higher")]
    ratio_metrics = ["seconds"]

    def prepare(self, ctx):
        self.cut_members(ctx, [ctx.sizes["timetofail_member"]])

    def run(self, ctx, directory):
        member = ctx.sizes["timetofail_member"]
        fill(directory, 2)
        target = directory / "tree"
        target.mkdir()
        began = time.monotonic()
        result = run(["tar", "-xf", self.tarball(ctx, member), "-C", target], timeout=900, check=False)
        seconds = time.monotonic() - began
        if result.returncode == 0:
            raise Failure(f"tar of {member} fitted in a volume 2 MiB short of full")
        if "No space left on device" not in result.stderr:
            raise Failure(f"tar failed, but not for lack of space: {last_line(result.stderr)}")
        return [{
            "case": f"{member.split('/', 1)[-1]} into {ctx.sizes['timetofail_image_mib']} MiB, 2 MiB free",
            "params": {"member": member},
            "values": {"seconds": seconds, "df_percent": df_percent(directory)},
            "extra": {"tar_exit": result.returncode, "enospc_lines": result.stderr.count("No space left")},
        }]


class DdFull(OutOfSpace):
    name = "ddfull"
    title = "dd into nearly full volumes: 200 MiB dd + sync"
    origin = "the Tux3 out-of-space post's dd table"
    metrics = [Metric("seconds", "seconds", "s", "lower"), Metric("df_percent", "df use %", "%", "higher")]
    ratio_metrics = ["seconds"]
    tools = ["dd"]

    def run(self, ctx, directory):
        dd_mib = ctx.sizes["ddfull_mib"]
        cases = [("far from full", None), ("getting full", dd_mib * 3 // 2), ("just over full", dd_mib * 19 // 20)]
        results = []
        for label, leave_mib in cases:
            if leave_mib is not None:
                fill(directory, leave_mib)
            target = directory / "dd"
            began = time.monotonic()
            result = run(["dd", "if=/dev/zero", f"of={target}", "bs=1M", f"count={dd_mib}"], timeout=600, check=False)
            run(["sync"], timeout=600)
            seconds = time.monotonic() - began
            enospc = "No space left on device" in result.stderr
            if result.returncode != 0 and not enospc:
                raise Failure(f"dd ({label}): {last_line(result.stderr)}")
            if enospc and leave_mib is None:
                raise Failure(f"dd of {dd_mib} MiB into a far-from-full volume: ENOSPC")
            results.append({
                "case": f"{label} ({leave_mib} MiB free)" if leave_mib else label,
                "params": {"free_mib_before": leave_mib},
                "values": {"seconds": seconds, "df_percent": df_percent(directory)},
                "extra": {"enospc": enospc, "written_mib": target.stat().st_size / MIB},
            })
            empty(directory)
        return results


class UnpackMany(OutOfSpace, Untar):
    name = "unpackmany"
    title = "unpack many copies: untar a source tree into N directories, then sync"
    origin = "the Tux3 out-of-space post (10× and 40× to ram)"
    metrics = [Metric("seconds", "seconds", "s", "lower"), Metric("df_percent", "df use %", "%", "higher")]
    ratio_metrics = ["seconds"]

    def prepare(self, ctx):
        self.cut_members(ctx, [ctx.sizes["unpackmany_member"]])

    def run(self, ctx, directory):
        member = ctx.sizes["unpackmany_member"]
        tarball = self.tarball(ctx, member)
        results = []
        for copies in ctx.sizes["unpackmany_copies"]:
            began = time.monotonic()
            failed = None
            for copy in range(copies):
                target = directory / f"copy{copy:02}"
                target.mkdir()
                result = run(["tar", "-xf", tarball, "-C", target], timeout=900, check=False)
                if result.returncode != 0:
                    failed = f"tar of copy {copy + 1} of {copies}: {last_line(result.stderr)}"
                    break
            run(["sync"], timeout=600)
            seconds = time.monotonic() - began
            percent = df_percent(directory)
            result = {
                "case": f"{copies} copies of {member.split('/', 1)[-1]}",
                "params": {"copies": copies},
                "values": {"seconds": seconds, "df_percent": percent},
                "extra": {},
            }
            if failed:
                # A volume sized for 40 copies that a filesystem cannot hold
                # is a finding, not a harness failure: the row says so.
                result["values"] = {}
                result["extra"] = {"failed": f"{failed} (df {percent} %)"}
            results.append(result)
            empty(directory)
        return results


WORKLOADS = [Blurt(), TimeToFail(), DdFull(), UnpackMany()]
