"""The image workloads (issue 25's "engine measured without FUSE"): a tree or
an archive written into a fresh image, or read out of one, by whatever can
do it, mounted or not.

Two kinds of writer take part:
- every filesystem of the catalogue that mounts (kernel ext4, ext4+fast
  commits, fuse2fs, jext4 through FUSE, ...): the image is made first, then
  timed from the mount to the end of the unmount (`cp -a` or `tar -x` in
  between), as a user would build an image with a loop mount;
- the builders below, which write the image file themselves (no loop
  device, no FUSE, no root needed): jext4's image tools (`jext4-lib`, the
  library behind `jext4 cp`/`jext4 tar`), `mke2fs -d` (mkfs included: it
  cannot add to an existing image), genext2fs (ext2, mkfs included) and
  e2tools (`e2mkdir`/`e2cp`, one process per entry, drivers/net only).

Each case gets an image of its own, checked (e2fsck -fn) after it; peak RSS
is the writer's own (the FUSE server's for a FUSE mount, the tool's for a
builder, none for a kernel mount, whose memory is the page cache).
"""

import json
import os
import shutil
import stat
import subprocess
import tempfile
import time

import filesystems as fsmod
from util import Failure, Unavailable, fail_line, last_line, log, run
from workloads import CopyTree, Metric, Untar

# A builder is given this long for one case (genext2fs on the whole tree
# takes minutes).
BUILD_TIMEOUT = 1800


def timed(argv, timeout=BUILD_TIMEOUT, env=None, output=None):
    """Runs argv to its end; returns (seconds, peak RSS KiB) of that one
    process. The peak is the process's VmHWM, sampled every 10 ms by a
    thread of its own while this one waits for the exit (so a short
    process is not charged the sampling interval): wait4's ru_maxrss would
    not do, since Linux carries the forking harness's own peak over into
    the child at exec. With `output` (an open file), the process's
    standard output goes there; its standard error goes to a file, read
    after the exit (a pipe could fill and block it)."""
    argv = [str(arg) for arg in argv]
    with tempfile.TemporaryFile() as errors:
        began = time.monotonic()
        process = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=output or subprocess.DEVNULL, stderr=errors,
            start_new_session=True, env=env,
        )
        sampler = fsmod.RssSampler(process.pid, interval=0.01)
        sampler.start()
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            raise Failure(f"{os.path.basename(argv[0])} timed out after {timeout:.0f} s")
        finally:
            sampler.halt.set()
        seconds = time.monotonic() - began
        sampler.join()
        if process.returncode != 0:
            errors.seek(0)
            detail = last_line(errors.read().decode(errors="replace"))
            raise Failure(f"{os.path.basename(argv[0])} exited {process.returncode}: {detail}")
    return seconds, sampler.peak_kib or None


def tree_counts(root):
    """(entries, bytes of regular files) under root, root excluded: the
    cheap check that an export brought everything out."""
    entries = size = 0
    for directory, dirs, files in os.walk(root):
        entries += len(dirs) + len(files)
        for name in files:
            status = os.lstat(os.path.join(directory, name))
            if stat.S_ISREG(status.st_mode):
                size += status.st_size
    return entries, size


SOURCE_COUNTS = {}


def source_counts(root):
    """tree_counts of a source tree, once per run."""
    if root not in SOURCE_COUNTS:
        SOURCE_COUNTS[root] = tree_counts(root)
    return SOURCE_COUNTS[root]


class Builder(fsmod.Filesystem):
    """Writes an image file without mounting it. Only the image workloads
    run on a builder; a builder that cannot do one says why (a case
    "not supported")."""

    builder = True
    optional = True
    opt_in = True  # named with --fs (or the group `--fs image`)

    def __init__(self, name, description, tools):
        super().__init__(name, fsmod.MKFS_EXT4, description)
        self.tools = tools

    def unavailable_reason(self):
        missing = [tool for tool in self.tools if not shutil.which(tool)]
        return f"{', '.join(missing)} not installed" if missing else None

    def mount(self, image, mountpoint):
        raise Unavailable(f"{self.name} writes images without mounting them")

    # Each returns (seconds, peak RSS KiB or None) or raises Unavailable
    # when the builder has no way to do it.
    def import_tree(self, ctx, source, image, image_bytes, case):
        raise Unavailable("cannot copy a tree into an image")

    def import_tar(self, ctx, tarball, image, image_bytes):
        raise Unavailable("cannot unpack an archive into an image")

    def export_tree(self, ctx, image, inside, out):
        raise Unavailable("cannot copy a tree out of an image")


class Jext4Lib(Builder):
    """jext4's image tools: the library, no FUSE, one process per verb; and
    the driver workloads that have a library form (`library = True`:
    `jext4-bench-driver WORKLOAD --image IMAGE`)."""

    library = True

    def __init__(self, name, mkfs, description, binary):
        super().__init__(name, description, [])
        self.mkfs = mkfs
        self.binary = binary

    build_error = None  # set by bench/run when its build failed

    def unavailable_reason(self):
        return fsmod.binary_unavailable(self)

    def import_tree(self, ctx, source, image, image_bytes, case):
        self.make(image, image_bytes)
        return timed([self.binary, "cp", "-a", source, f"{image}:/copy"])

    def import_tar(self, ctx, tarball, image, image_bytes):
        self.make(image, image_bytes)
        return timed([self.binary, "tar", "-x", "-f", tarball, f"{image}:/"])

    def export_tree(self, ctx, image, inside, out):
        return timed([self.binary, "cp", "-a", f"{image}:{inside}", out])


class Mke2fsD(Builder):
    """mke2fs -d: a new filesystem populated from a directory (it cannot
    add to an existing one, so mkfs is inside the time)."""

    def __init__(self):
        super().__init__("mke2fs-d", "mke2fs -t ext4 -d SOURCE (e2fsprogs; mkfs included), options as for kernel ext4", ["mke2fs"])

    def import_tree(self, ctx, source, image, image_bytes, case):
        fsmod.sparse_image(image, image_bytes)
        # -d takes the directory's contents as the root's: give it the
        # source's parent so the tree lands as one directory, as with cp.
        return timed(self.mkfs + ["-d", source.parent, image])


class Genext2fs(Builder):
    """genext2fs: an ext2 image built from a directory (no journal)."""

    slow = True  # whole tree in the first round only

    def __init__(self):
        super().__init__("genext2fs", "genext2fs -B 4096 -d SOURCE (ext2, mkfs included)", ["genext2fs"])

    def import_tree(self, ctx, source, image, image_bytes, case):
        image.unlink(missing_ok=True)
        entries, _ = source_counts(source.parent)
        blocks = image_bytes // 4096
        inodes = max(16384, entries * 2)
        return timed(["genext2fs", "-B", "4096", "-b", blocks, "-N", inodes, "-d", source.parent, image])


class E2tools(Builder):
    """e2tools: e2mkdir and e2cp, one process per directory and per file,
    as a script would drive them (drivers/net only: the whole tree would
    take an hour)."""

    only_cases = ("drivers/net subtree", "kernel/ subtree")

    def __init__(self):
        super().__init__("e2tools", "e2tools 0.1 (e2mkdir, e2cp -p: one process per entry), ext4 image as for kernel ext4", ["e2cp", "e2mkdir"])

    def import_tree(self, ctx, source, image, image_bytes, case):
        if case not in self.only_cases:
            raise Unavailable("one process per entry: drivers/net only")
        self.make(image, image_bytes)
        began = time.monotonic()
        top = "/copy"
        peak = timed(["e2mkdir", f"{image}:{top}"])[1] or 0
        for directory, dirs, files in os.walk(source):
            relative = os.path.relpath(directory, source)
            inside = top if relative == "." else f"{top}/{relative}"
            for name in sorted(dirs):
                peak = max(peak, timed(["e2mkdir", f"{image}:{inside}/{name}"])[1] or 0)
            for name in sorted(files):
                path = os.path.join(directory, name)
                if os.path.islink(path):
                    continue  # e2cp copies no symlinks
                peak = max(peak, timed(["e2cp", "-p", path, f"{image}:{inside}/{name}"])[1] or 0)
        return time.monotonic() - began, peak


class Debugfs(Builder):
    """debugfs -R rdump: e2fsprogs' way out of an image."""

    def __init__(self):
        super().__init__("debugfs", "debugfs -R 'rdump PATH OUT' (e2fsprogs), export only", ["debugfs"])

    def export_tree(self, ctx, image, inside, out):
        out.mkdir(parents=True, exist_ok=True)
        return timed(["debugfs", "-R", f"rdump {inside} {out}", image])


def builders(repo):
    binary = str(repo / "target" / "release" / "jext4")
    return [
        Jext4Lib(
            "jext4-lib", fsmod.MKFS_EXT4,
            "jext4's library, no mount, no FUSE (jext4 cp -a / tar -x; jext4-bench-driver --image), "
            "ext4 image as for kernel ext4",
            binary,
        ),
        Jext4Lib(
            "jext4-lib-fc", fsmod.MKFS_EXT4 + ["-O", "fast_commit"],
            "jext4-lib on an image as for ext4-fc: fsync writes fast commits, one transaction per directory",
            binary,
        ),
        Mke2fsD(), Genext2fs(), E2tools(), Debugfs(),
    ]


def is_builder(fs):
    return getattr(fs, "builder", False)


def applies(fs, workload):
    """Whether workload runs on fs: a builder has no mount, so it runs the
    image workloads and, where it has the library (jext4-lib), the driver
    workloads with a library form."""
    if not is_builder(fs):
        return True
    if getattr(workload, "whole_image", False):
        # Only the builders that have a way to do it (no rows of "cannot").
        method = workload.builder_method
        return getattr(type(fs), method) is not getattr(Builder, method)
    return getattr(workload, "library", False) and getattr(fs, "library", False)


def library_driver(ctx, subcommand, directory, args, timeout):
    """A driver workload through the library on ctx.library_image: its
    JSON line; the driver's peak RSS (KiB) goes to ctx.library_peak_kib."""
    with tempfile.TemporaryFile(mode="w+") as output:
        _, peak = timed(
            [ctx.driver, subcommand, "--image", ctx.library_image, "--dir", directory, *args],
            timeout=timeout, output=output,
        )
        output.seek(0)
        line = last_line(output.read(), limit=10**7)
    try:
        figures = json.loads(line)
    except json.JSONDecodeError:
        raise Failure(f"driver {subcommand} printed no JSON result: {line[:200]}")
    ctx.library_peak_kib = max(ctx.library_peak_kib or 0, peak or 0)
    return figures


def mounted(fs, ctx, image, body):
    """Mounts image on fs, runs body(mountpoint), unmounts: (seconds from
    the mount to the end of the unmount, the server's peak RSS KiB)."""
    mountpoint = ctx.workdir / "mnt" / fs.name
    began = time.monotonic()
    mount = fs.mount(image, mountpoint)
    try:
        body(mountpoint)
        fs.umount(mount)
    except BaseException:
        fsmod.cleanup_mount(mount, " after a failed image workload")
        raise
    return time.monotonic() - began, mount.peak_rss_kib


def warm(tree):
    """The source's data in the page cache, so that the source side costs
    the same for all (`tar -cf /dev/null` would read no data: GNU tar
    skips it for /dev/null)."""
    run(["sh", "-c", 'tar -cf - -C "$1" "$2" | cat >/dev/null', "warm", tree.parent, tree.name], timeout=900)


def drop_caches():
    """The export starts cold: the image file out of the page cache."""
    run(["sync"], timeout=600)
    with open("/proc/sys/vm/drop_caches", "w") as control:
        control.write("3")


def result(case, member, seconds, rss_kib, extra=None):
    values = {"seconds": seconds}
    if rss_kib:
        values["peak_rss_mib"] = rss_kib / 1024
    return {"case": case, "params": {"member": member}, "values": values, "extra": extra or {}}


def failed(case, member, reason):
    return {"case": case, "params": {"member": member}, "values": {}, "extra": {"failed": reason}}


def unsupported(case, member, reason):
    return {"case": case, "params": {"member": member}, "values": {}, "extra": {"unsupported": reason}}


class ImageWorkload(CopyTree):
    """One fresh image per case, made, written (or read) and checked here
    rather than by the runner's mount: see the module's doc."""

    whole_image = True
    opt_in = True
    metrics = [
        Metric("seconds", "seconds", "s", "lower"),
        Metric("peak_rss_mib", "peak RSS", "MiB", "lower"),
    ]
    ratio_metrics = ["seconds"]
    references = ("ext4", "mke2fs-d")
    tools = ["tar", "cp", "e2fsck"]

    def cases(self, ctx):
        return ctx.sizes["import"]

    def prepare(self, ctx):
        Untar.prepare(self, ctx)
        self.cut_members(ctx, [member for _, member, _ in self.cases(ctx)])
        for _, member, _ in self.cases(ctx):
            self.extract(ctx, member)

    def source_dir(self, ctx, member):
        """The tree itself (its last component is the member's)."""
        return self.source(ctx, member) / member

    def run_images(self, ctx, fs, image):
        """Every case on fs; returns (results, e2fsck verdicts)."""
        results, verdicts = [], []
        for label, member, rounds in self.cases(ctx):
            if rounds is not None and ctx.round >= rounds and getattr(fs, "slow", False):
                continue
            try:
                seconds, rss, extra = self.one(ctx, fs, image, label, member)
            except Unavailable as error:
                results.append(unsupported(label, member, str(error)))
                continue
            except Failure as error:
                # The other cases still run, and what is done is kept.
                fail_line(f"{fs.name} {self.name} {label} round {ctx.round + 1}: {error}")
                results.append(failed(label, member, str(error)))
                image.unlink(missing_ok=True)
                continue
            verdicts.append(fs.check(image))
            results.append(result(label, member, seconds, rss, extra))
            image.unlink(missing_ok=True)
        return results, verdicts


class Import(ImageWorkload):
    name = "import"
    builder_method = "import_tree"
    title = "import: cp -a of a Linux 6.1 tree into a fresh image (mount to unmount, or the tool's run)"
    origin = "issue 25 (image tools): image builders in CI and containers; Debian's linux-source-6.1"

    def one(self, ctx, fs, image, label, member):
        source = self.source_dir(ctx, member)
        warm(source)
        if is_builder(fs):
            seconds, rss = fs.import_tree(ctx, source, image, self.image_bytes(ctx), label)
        else:
            fs.make(image, self.image_bytes(ctx))
            seconds, rss = mounted(fs, ctx, image, lambda mnt: run(["cp", "-a", source, mnt / "copy"], timeout=BUILD_TIMEOUT))
        return seconds, rss, {}


class ImportTar(ImageWorkload):
    name = "import-tar"
    builder_method = "import_tar"
    references = ("ext4", "ext4-fc")
    title = "import-tar: tar -x of a Linux 6.1 tarball (uncompressed) into a fresh image"
    origin = "issue 25 (image tools); Debian's linux-source-6.1"

    def one(self, ctx, fs, image, label, member):
        tarball = self.tarball(ctx, member)
        run(["dd", f"if={tarball}", "of=/dev/null", "bs=1M"], timeout=900)  # warm, as for the tree
        if is_builder(fs):
            seconds, rss = fs.import_tar(ctx, tarball, image, self.image_bytes(ctx))
        else:
            fs.make(image, self.image_bytes(ctx))
            seconds, rss = mounted(fs, ctx, image, lambda mnt: run(["tar", "-xf", tarball, "-C", mnt], timeout=BUILD_TIMEOUT))
        return seconds, rss, {}


class Export(ImageWorkload):
    """The tree is put in by mke2fs -d (untimed, the same image for all),
    the page cache dropped, then the tree copied out to tmpfs."""

    name = "export"
    builder_method = "export_tree"
    title = "export: cp -a of a Linux 6.1 tree out of an image (cold cache) into tmpfs"
    origin = "issue 25 (image tools)"
    references = ("ext4", "debugfs")

    def one(self, ctx, fs, image, label, member):
        source = self.source_dir(ctx, member)
        if fs.family != "ext":
            raise Unavailable("the image is ext4 (made by mke2fs -d)")
        fsmod.sparse_image(image, self.image_bytes(ctx))
        run(fsmod.MKFS_EXT4 + ["-d", source.parent, image], timeout=BUILD_TIMEOUT)
        out = fsmod.ram_images(ctx.workdir) / "export"
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        inside = "/" + source.name
        drop_caches()
        try:
            if is_builder(fs):
                seconds, rss = fs.export_tree(ctx, image, inside, out)
            else:
                seconds, rss = mounted(fs, ctx, image, lambda mnt: run(["cp", "-a", mnt / source.name, out], timeout=BUILD_TIMEOUT))
            got = tree_counts(out / source.name)
            want = source_counts(source)
            if got != want:
                raise Failure(f"exported {got[0]} entries, {got[1]} bytes; the source has {want[0]}, {want[1]}")
        finally:
            shutil.rmtree(out, ignore_errors=True)
        return seconds, rss, {"entries": got[0]}


WORKLOADS = [Import(), ImportTar(), Export()]
