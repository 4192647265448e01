"""The filesystems under test: how each is made, mounted, unmounted and checked.

Every filesystem gets an identical fresh sparse image file of the same size.
Kernel filesystems are mounted through a loop device; FUSE servers (fuse2fs,
jext4) open the image file themselves. The ext family is checked with
`e2fsck -fn` after unmounting, xfs with `xfs_repair -n`. The FUSE floor
(fusefloor) holds its tree in memory: its image size is its capacity, and
there is nothing to check.
"""

import contextlib
import copy
import json
import os
import re
import shutil
import threading
import time
from pathlib import Path

from util import NOT_CHECKED, Failure, Unavailable, last_line, log, run

MKFS_EXT4 = ["mkfs.ext4", "-F", "-q"]
MKFS_EXT2 = ["mkfs.ext2", "-F", "-q"]
# ext4 with every default feature but the journal: jext4-nojournal differs
# from jext4 in the journal alone.
MKFS_EXT4_NOJOURNAL = ["mkfs.ext4", "-F", "-q", "-O", "^has_journal"]
MKFS_XFS = ["mkfs.xfs", "-f", "-q"]
MKFS_BTRFS = ["mkfs.btrfs", "-f", "-q"]

UMOUNT_TIMEOUT = 300
MOUNT_TIMEOUT = 60


def mounted_at(mountpoint):
    """The fstype mounted exactly at mountpoint, or None (from /proc/self/mountinfo)."""
    target = str(mountpoint)
    with open("/proc/self/mountinfo") as mountinfo:
        for line in mountinfo:
            fields = line.split()
            separator = fields.index("-")
            point = fields[4].replace("\\040", " ")
            if point == target:
                return fields[separator + 1]
    return None


def mounts_under(directory):
    prefix = str(directory).rstrip("/") + "/"
    points = []
    with open("/proc/self/mountinfo") as mountinfo:
        for line in mountinfo:
            point = line.split()[4].replace("\\040", " ")
            if point.startswith(prefix):
                points.append(point)
    return points


def pid_alive(pid):
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("State:"):
                    return "Z" not in line.split()[1]
    except FileNotFoundError:
        return False
    return True


def find_server(image, mountpoint):
    """The pid of the FUSE server whose command line names both image and mountpoint."""
    wanted = {str(image), str(mountpoint)}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                argv = {arg.decode(errors="replace") for arg in cmdline.read().split(b"\0")}
        except OSError:
            continue
        resolved = {str(Path(arg).resolve()) for arg in argv if arg.startswith("/") or "/" in arg}
        if wanted <= (argv | resolved) and pid_alive(int(entry)):
            return int(entry)
    return None


def find_by_executable(binary):
    """The pid of a running process of this executable (fallback for servers
    that re-execute themselves with a command line not naming the mount)."""
    target = os.path.realpath(binary)
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                if os.path.realpath(f"/proc/{entry}/exe") == target and pid_alive(int(entry)):
                    return int(entry)
            except OSError:
                continue
    return None


def device_of(mountpoint):
    """The "major:minor" of the mount at mountpoint, read from mountinfo: a
    stat() of a hung FUSE mount would block."""
    target = str(mountpoint)
    with open("/proc/self/mountinfo") as mountinfo:
        for line in mountinfo:
            fields = line.split()
            if fields[4].replace("\\040", " ") == target:
                return fields[2]
    return None


def abort_fuse_connection(mountpoint):
    """Aborts the FUSE connection of a mount whose server hangs (fusectl: the
    connection is named by the mount's device minor), so that the unmount and
    every process blocked on the mount can finish."""
    device = device_of(mountpoint)
    if device is None:
        return
    connections = Path("/sys/fs/fuse/connections")
    if connections.is_dir() and not any(connections.iterdir()):
        _try(["mount", "-t", "fusectl", "none", connections], timeout=10)
    try:
        with open(connections / device.split(":")[1] / "abort", "w") as abort:
            abort.write("1")
        log(f"aborted the FUSE connection of {mountpoint}")
    except OSError as error:
        log(f"could not abort the FUSE connection of {mountpoint}: {error}")


def sparse_image(image, size_bytes):
    """A fresh sparse image file of `size_bytes`, in place of any old one."""
    image.unlink(missing_ok=True)
    with open(image, "wb") as sparse:
        sparse.truncate(size_bytes)


def binary_unavailable(fs):
    """Why a jext4 binary `fs` runs cannot: its build failed, or it is not
    there; None when it can."""
    if fs.build_error:
        return fs.build_error
    if not Path(fs.binary).is_file():
        return f"{fs.binary} not found (cargo build --release)"
    return None


class RssSampler(threading.Thread):
    """Samples a process's VmHWM (peak resident set) every `interval`
    seconds (a FUSE server's: 0.2 s)."""

    def __init__(self, pid, interval=0.2):
        super().__init__(daemon=True)
        self.pid = pid
        self.interval = interval
        self.peak_kib = 0
        self.halt = threading.Event()

    def sample(self):
        try:
            with open(f"/proc/{self.pid}/status") as status:
                for line in status:
                    if line.startswith(("VmHWM:", "VmRSS:")):
                        self.peak_kib = max(self.peak_kib, int(line.split()[1]))
        except (OSError, ValueError):
            pass

    def run(self):
        self.sample()
        while not self.halt.wait(self.interval):
            self.sample()

    def stop(self):
        self.sample()
        self.halt.set()


class Mount:
    """One live mount: what cleanup needs to undo it."""

    def __init__(self, fs, image, mountpoint):
        self.fs, self.image, self.mountpoint = fs, image, mountpoint
        self.loop = None
        self.pid = None
        self.process = None
        self.sampler = None

    @property
    def peak_rss_kib(self):
        return self.sampler.peak_kib if self.sampler else None


ACTIVE = []


class Filesystem:
    name = ""
    fuse = False
    optional = False  # a mount failure makes it "unavailable", not a failure
    opt_in = False  # run only when named with --fs
    ram_image = False  # the image is a file in /dev/shm (tmpfs), not in the workdir
    family = "ext"
    cpus = None  # CPUs the harness and all it starts are pinned to while it runs (FloorFs)

    def __init__(self, name, mkfs, description):
        self.name, self.mkfs, self.description = name, mkfs, description

    def unavailable_reason(self):
        return None

    def make(self, image, size_bytes):
        sparse_image(image, size_bytes)
        run(self.mkfs + [image], timeout=120)

    def mount(self, image, mountpoint):
        if mounted_at(mountpoint):
            raise Failure(f"{mountpoint} is already mounted")
        mountpoint.mkdir(parents=True, exist_ok=True)
        mount = Mount(self, image, mountpoint)
        ACTIVE.append(mount)
        try:
            self._mount(mount)
        except BaseException:
            cleanup_mount(mount, " after a failed mount")
            raise
        return mount

    def remount(self, mount):
        """Unmount and mount the same image again (the kernel's caches of
        it start empty); returns the new mount."""
        self.umount(mount)
        return self.mount(mount.image, mount.mountpoint)

    def umount(self, mount):
        """Unmounts cleanly or raises Failure; after a failure the mount stays
        in ACTIVE for cleanup_mount."""
        if mount.sampler:
            mount.sampler.stop()
        self._umount(mount)
        ACTIVE.remove(mount)

    def check(self, image):
        """e2fsck -fn verdict: 'clean' or 'errors (exit N): first complaint'."""
        result = run(["e2fsck", "-fn", image], timeout=600, check=False)
        if result.returncode == 0:
            return "clean"
        complaints = [
            line for line in result.stdout.splitlines()
            if line.strip() and not line.startswith(("Pass ", "e2fsck ")) and "files (" not in line
        ]
        first = complaints[0].strip() if complaints else last_line(result.stderr)
        return f"errors (exit {result.returncode}): {first[:200]}"


class KernelFs(Filesystem):
    def __init__(self, name, mkfs, fstype, description, opt_in=False):
        super().__init__(name, mkfs, description)
        self.fstype = fstype
        self.family = fstype if fstype in ("xfs", "btrfs") else "ext"
        self.opt_in = opt_in

    def _mount(self, mount):
        mount.loop = run(["losetup", "-f", "--show", mount.image], timeout=30).stdout.strip()
        run(["mount", "-t", self.fstype, mount.loop, mount.mountpoint], timeout=MOUNT_TIMEOUT)

    def _umount(self, mount):
        if mounted_at(mount.mountpoint):
            run(["umount", mount.mountpoint], timeout=UMOUNT_TIMEOUT)
        if mount.loop:
            run(["losetup", "-d", mount.loop], timeout=30)
            mount.loop = None

    def check(self, image):
        if self.family == "ext":
            return super().check(image)
        checker = ["xfs_repair", "-n"] if self.family == "xfs" else ["btrfs", "check", "--readonly"]
        result = run(checker + [image], timeout=600, check=False)
        if result.returncode == 0:
            return "clean"
        return f"errors (exit {result.returncode}): {last_line(result.stdout + result.stderr)}"


class FuseFs(Filesystem):
    fuse = True

    def _wait_mounted(self, mount, process=None):
        deadline = time.monotonic() + MOUNT_TIMEOUT
        while time.monotonic() < deadline:
            if mounted_at(mount.mountpoint):
                return
            if process is not None and process.poll() is not None:
                detail = last_line(process.stderr.read()) if process.stderr else ""
                raise Failure(f"{self.name} server exited {process.returncode} before mounting: {detail}")
            time.sleep(0.05)
        raise Failure(f"{self.name}: {mount.mountpoint} not mounted after {MOUNT_TIMEOUT} s")

    def _watch(self, mount):
        mount.pid = mount.pid or find_server(mount.image, mount.mountpoint)
        if mount.pid:
            mount.sampler = RssSampler(mount.pid)
            mount.sampler.start()

    def _wait_server_exit(self, mount):
        """A FUSE server writes its last state after the kernel lets go of the
        mount; the image is only complete once the server process is gone."""
        deadline = time.monotonic() + UMOUNT_TIMEOUT
        while mount.pid and pid_alive(mount.pid):
            if mount.process is not None and mount.process.poll() is not None:
                break
            if time.monotonic() > deadline:
                raise Failure(f"{self.name} server {mount.pid} still running {UMOUNT_TIMEOUT} s after unmount")
            time.sleep(0.05)


class Fuse2fs(FuseFs):
    """fuse2fs from e2fsprogs, run in the foreground so the harness owns its pid."""

    slow = True  # the image workloads' whole tree in the first round only

    def _mount(self, mount):
        import subprocess

        mount.process = subprocess.Popen(
            ["fuse2fs", "-f", "-o", "fakeroot", str(mount.image), str(mount.mountpoint)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        mount.pid = mount.process.pid
        self._wait_mounted(mount, mount.process)
        self._watch(mount)

    def _umount(self, mount):
        if mounted_at(mount.mountpoint):
            # umount(8) itself is quick for FUSE; the server's final writes
            # come after, and _wait_server_exit waits for those.
            run(["umount", mount.mountpoint], timeout=60)
        self._wait_server_exit(mount)
        if mount.process is not None:
            mount.process.wait(timeout=UMOUNT_TIMEOUT)
            if mount.process.returncode not in (0, None):
                detail = last_line(mount.process.stderr.read())
                raise Failure(f"fuse2fs exited {mount.process.returncode} after unmount: {detail}")


class Jext4(FuseFs):
    """jext4's own FUSE server: `jext4 mount IMAGE MOUNTPOINT` returns once
    mounted, `jext4 umount MOUNTPOINT` once the server has written everything
    and exited."""

    optional = True
    baseline = False  # served by --baseline-binary, not the build under test

    def __init__(self, name, mkfs, description, binary, options=None, opt_in=False):
        super().__init__(name, mkfs, description)
        self.binary = binary
        self.options = options
        if opt_in:
            # Only to switch it on: subclasses say opt_in = True as a class
            # attribute, which an instance attribute would hide.
            self.opt_in = True
        self.build_error = None

    def unavailable_reason(self):
        return binary_unavailable(self)

    def _mount(self, mount):
        argv = [self.binary, "mount"]
        if self.options:
            argv += ["-o", self.options]
        result = run(argv + [mount.image, mount.mountpoint], timeout=MOUNT_TIMEOUT, check=False)
        if result.returncode != 0:
            detail = last_line(result.stderr) or last_line(result.stdout)
            raise Unavailable(f"jext4 mount exited {result.returncode}: {detail}")
        if not mounted_at(mount.mountpoint):
            raise Unavailable(f"jext4 mount exited 0 but {mount.mountpoint} is not mounted")
        mount.pid = find_server(mount.image, mount.mountpoint) or find_by_executable(self.binary)
        self._watch(mount)

    def _umount(self, mount):
        if mounted_at(mount.mountpoint):
            run([self.binary, "umount", mount.mountpoint], timeout=UMOUNT_TIMEOUT)
        self._wait_server_exit(mount)

    def stats(self, mountpoint):
        """Every counter of `jext4 stats --json`; None when it fails."""
        result = run([self.binary, "stats", "--json", mountpoint], timeout=30, check=False)
        return json.loads(result.stdout) if result.returncode == 0 else None

    def request_counts(self, mountpoint):
        """The server's FUSE request counters (`jext4 stats`): the total and
        one count per operation; None when the server does not report them."""
        result = run([self.binary, "stats", "--json", mountpoint], timeout=30, check=False)
        if result.returncode != 0:
            return None
        stats = json.loads(result.stdout)
        if "fuse_requests" not in stats:
            return None
        return {
            key: value for key, value in stats.items()
            if key in ("fuse_requests", "fuse_engine_us", "fuse_transport_us", "fuse_threads_cpu_us", "fuse_uring_requests")
            or re.fullmatch(r"fuse_op_[a-z]+", key)
        }


class FloorFs(FuseFs):
    """floorfs (`jext4-bench-driver floorfs`): an in-memory FUSE server with
    no engine that the kernel asks what it asks jext4 (same mount options,
    capabilities, timeouts and open flags): the /dev/fuse floor of this
    machine. It holds no image: `make` only notes the size, which becomes
    its `--capacity`; the image path names the file its tree goes to over
    a remount (`--state`). Opt-in (`--fs fusefloor` or `--fs floor`).

    With `cpus`, the harness pins itself for the whole (round, workload)
    to those CPUs, so the server it starts and every workload process it
    runs inherit the mask, as under `taskset -c`. With `flush`, fsyncs
    wait for a group commit's two fdatasyncs of `<name>.flush`, a 1 MiB
    file next to the images (`--flush-file`): the floor of a server that
    flushes its disk per fsync."""

    opt_in = True

    def __init__(self, name, description, driver, cpus=None, threads=None, flush=False):
        super().__init__(name, [], description)
        self.driver = driver
        self.flush = flush
        self.cpus = cpus
        self.threads = threads  # None: floorfs's default, jext4's threads=
        self.capacity_bytes = None

    def unavailable_reason(self):
        if not Path("/dev/fuse").exists():
            return "no /dev/fuse"
        if not Path(self.driver).is_file():
            return f"{self.driver} not found (cargo build --release -p jext4-bench-driver)"
        if self.cpus and not set(self.cpus) <= os.sched_getaffinity(0):
            return f"CPUs {sorted(self.cpus)} are not all available to this process"
        return None

    def make(self, image, size_bytes):
        image.unlink(missing_ok=True)
        self.capacity_bytes = size_bytes

    def _mount(self, mount):
        import subprocess

        mount.server_log = mount.image.with_suffix(".log")
        flush_file = mount.image.parent / f"{self.name}.flush"
        with open(mount.server_log, "w") as server_log:
            mount.process = subprocess.Popen(
                [self.driver, "floorfs", "--capacity", str(self.capacity_bytes), "--state", str(mount.image),
                 *(["--threads", str(self.threads)] if self.threads else []),
                 *(["--flush-file", str(flush_file)] if self.flush else []), str(mount.mountpoint)],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=server_log, start_new_session=True,
            )
        mount.pid = mount.process.pid
        try:
            self._wait_mounted(mount, mount.process)
        except Failure as error:
            raise Failure(f"{error} {last_line(mount.server_log.read_text())}")
        self._watch(mount)

    def _umount(self, mount):
        if mounted_at(mount.mountpoint):
            run(["umount", mount.mountpoint], timeout=60)
        self._wait_server_exit(mount)
        mount.process.wait(timeout=UMOUNT_TIMEOUT)
        detail = last_line(mount.server_log.read_text())
        mount.server_log.unlink(missing_ok=True)
        if mount.process.returncode != 0:
            raise Failure(f"floorfs exited {mount.process.returncode} after unmount: {detail}")

    def remount(self, mount):
        # An existing state file asks the server to write its tree there at
        # unmount; the next server reads it back (and removes it).
        mount.image.touch()
        return super().remount(mount)

    def check(self, image):
        return NOT_CHECKED

    def request_counts(self, mountpoint):
        """floorfs's request counters, named as jext4's, read from the
        virtual attribute of the mount's root (that read is not counted)."""
        try:
            stats = json.loads(os.getxattr(mountpoint, "user.floorfs.stats"))
        except OSError:
            return None
        return {
            key: value for key, value in stats.items()
            if key in ("fuse_requests", "fuse_threads_cpu_us") or re.fullmatch(r"fuse_op_[a-z]+", key)
        }


URING_PARAMETER = Path("/sys/module/fuse/parameters/enable_uring")


class Jext4Uring(Jext4):
    """jext4 served through FUSE over io_uring (`-o fuse_transport=uring`).
    The kernel offers it only while its module parameter is on: it is
    switched on for the mount (FUSE_INIT) and restored right after; the
    connection keeps io_uring for its life."""

    def unavailable_reason(self):
        if not URING_PARAMETER.exists():
            return f"{URING_PARAMETER} is missing: this kernel has no FUSE over io_uring"
        return super().unavailable_reason()

    def _mount(self, mount):
        original = URING_PARAMETER.read_text().strip()
        URING_PARAMETER.write_text("Y")
        try:
            super()._mount(mount)
        finally:
            URING_PARAMETER.write_text(original)


class Jext4UringOptIn(Jext4Uring):
    """A variant of jext4-uring with one of its savers off, for a
    comparison in the same run: only when named with --fs."""

    opt_in = True


class Jext4Shm(Jext4):
    """jext4 on an image file in /dev/shm (issue 8): `-o bytelog` maps the
    fast-commit area and persists it with msync (the slow fallback where there
    is no pmem), and the same engine with block fast commits on the same
    medium is its peer, so that the medium is not what differs. Opt-in
    (`--fs bytelog`)."""

    opt_in = True
    ram_image = True


class Jext4Nbd(Jext4):
    """jext4 over NBD (issue 13): the same image file served by nbdkit's
    file plugin on a Unix socket or on 127.0.0.1, mounted by jext4's own
    userspace NBD client; or served by qemu-nbd to the kernel's nbd client
    (/dev/nbdN), which jext4 then opens as a block device. Opt-in (`--fs nbd`):
    the peer is `jext4` on the image file itself."""

    opt_in = True

    def __init__(self, name, description, binary, transport):
        super().__init__(name, MKFS_EXT4, description, binary)
        self.transport = transport
        self.kernel_reason = None

    def unavailable_reason(self):
        reason = super().unavailable_reason()
        if reason:
            return reason
        server = "qemu-nbd" if self.transport == "kernel" else "nbdkit"
        if not shutil.which(server):
            return f"{server} not installed (apt-get install nbdkit qemu-utils)"
        if self.transport == "kernel":
            if self.kernel_reason is None:
                probe = run(["modprobe", "nbd"], timeout=30, check=False)
                self.kernel_reason = "" if Path("/dev/nbd0").exists() else (
                    f"no kernel nbd module here (modprobe nbd: {last_line(probe.stderr) or 'no /dev/nbd0'})"
                )
            return self.kernel_reason or None
        return None

    def _serve(self, mount):
        """Start the NBD server for mount.image; returns what jext4 mounts."""
        import socket
        import subprocess

        if self.transport == "kernel":
            device = "/dev/nbd0"
            run(["qemu-nbd", "--format=raw", "--cache=writeback", "--connect", device, mount.image], timeout=60)
            mount.nbd_cleanup = ["qemu-nbd", "--disconnect", device]
            return device
        if self.transport == "unix":
            endpoint = str(mount.image.with_suffix(".sock"))
            Path(endpoint).unlink(missing_ok=True)
            listen, uri = ["--unix", endpoint], f"nbd+unix:///?socket={endpoint}"
        else:
            with socket.socket() as probe:
                probe.bind(("127.0.0.1", 0))
                port = probe.getsockname()[1]
            listen, uri = ["--ipaddr", "127.0.0.1", "--port", str(port)], f"nbd://127.0.0.1:{port}/"
        mount.nbd_server = subprocess.Popen(
            ["nbdkit", "--foreground", "--exit-with-parent", *listen, "file", str(mount.image)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
            start_new_session=True,
        )
        deadline = time.monotonic() + MOUNT_TIMEOUT
        while not self._listening(listen):
            if mount.nbd_server.poll() is not None or time.monotonic() > deadline:
                raise Unavailable(f"nbdkit did not start: {last_line(mount.nbd_server.stderr.read())}")
            time.sleep(0.02)
        return uri

    @staticmethod
    def _listening(listen):
        import socket

        try:
            if listen[0] == "--unix":
                with socket.socket(socket.AF_UNIX) as probe:
                    probe.connect(listen[1])
            else:
                socket.create_connection(("127.0.0.1", int(listen[3])), timeout=1).close()
            return True
        except OSError:
            return False

    def _mount(self, mount):
        target = self._serve(mount)
        argv = [self.binary, "mount"] + (["-o", self.options] if self.options else [])
        result = run(argv + [target, mount.mountpoint], timeout=MOUNT_TIMEOUT, check=False)
        if result.returncode != 0:
            raise Unavailable(f"jext4 mount {target} exited {result.returncode}: {last_line(result.stderr)}")
        mount.pid = find_server(target, mount.mountpoint)
        self._watch(mount)

    def _umount(self, mount):
        super()._umount(mount)
        stop_nbd(mount)


def stop_nbd(mount):
    """Stop the NBD server of a jext4-over-NBD mount (after jext4 exited)."""
    server = getattr(mount, "nbd_server", None)
    if server is not None and server.poll() is None:
        server.terminate()
        try:
            server.wait(timeout=30)
        except Exception:
            server.kill()
    mount.nbd_server = None
    if getattr(mount, "nbd_cleanup", None):
        _try(mount.nbd_cleanup)
        mount.nbd_cleanup = None


# The jext4 entries but jext4-uring name their transport: /dev/fuse,
# whatever the module parameter says.
DEV = "fuse_transport=dev"


def catalogue(repo):
    """Every filesystem bench/run knows, in report order."""
    binary = str(repo / "target" / "release" / "jext4")
    driver = str(repo / "target" / "release" / "jext4-bench-driver")
    return [
        KernelFs("ext4", MKFS_EXT4, "ext4", "kernel ext4, loop device, default mkfs and mount options"),
        KernelFs("ext4-fc", MKFS_EXT4 + ["-O", "fast_commit"], "ext4", "kernel ext4 with -O fast_commit"),
        KernelFs("ext2", MKFS_EXT2, "ext2", "kernel ext2 (no journal)"),
        KernelFs("xfs", MKFS_XFS, "xfs", "kernel xfs, loop device, defaults"),
        KernelFs("btrfs", MKFS_BTRFS, "btrfs", "kernel btrfs, loop device, defaults (btrfs-progs)", opt_in=True),
        Fuse2fs("fuse2fs", MKFS_EXT4, "fuse2fs -o fakeroot (e2fsprogs), ext4 image as for kernel ext4"),
        Jext4("jext4", MKFS_EXT4, "jext4 FUSE server through /dev/fuse, ext4 image as for kernel ext4", binary, DEV),
        Jext4Uring(
            "jext4-uring", MKFS_EXT4, "jext4 FUSE server through FUSE over io_uring, ext4 image as for kernel ext4",
            binary, "fuse_transport=uring",
        ),
        Jext4UringOptIn(
            "jext4-uring-nopoll", MKFS_EXT4,
            "jext4-uring whose queue threads never poll (-o uring_spin=0): what polling gains",
            binary, "fuse_transport=uring,uring_spin=0",
        ),
        Jext4("jext4-fc", MKFS_EXT4 + ["-O", "fast_commit"], "jext4 on an image as for ext4-fc: fsync writes fast commits, one transaction per directory", binary, DEV),
        Jext4(
            "jext4-fc-global", MKFS_EXT4 + ["-O", "fast_commit"],
            "jext4 -o fast_commit=global: fast commits of one scope for the whole filesystem (the kernel's single queue)",
            binary, DEV + ",fast_commit=global", opt_in=True,
        ),
        Jext4(
            "jext4-da", MKFS_EXT4,
            "jext4 -o delalloc: delayed allocation (writes into holes held in memory, blocks given at write-out)",
            binary, DEV + ",delalloc", opt_in=True,
        ),
        Jext4(
            "jext4-fc-da", MKFS_EXT4 + ["-O", "fast_commit"],
            "jext4-fc with -o delalloc",
            binary, DEV + ",delalloc", opt_in=True,
        ),
        Jext4("jext4-nojournal", MKFS_EXT4_NOJOURNAL, "jext4 on an ext4 image without a journal: same engine, same features, no journal", binary, DEV),
        Jext4Shm(
            "jext4-bytelog", MKFS_EXT4 + ["-O", "fast_commit"],
            "jext4 -o bytelog on an image file in /dev/shm: fast commits through a memory mapping (msync)",
            binary, DEV + ",bytelog",
        ),
        Jext4Shm(
            "jext4-fc-shm", MKFS_EXT4 + ["-O", "fast_commit"],
            "jext4 with block fast commits on an image file in /dev/shm: jext4-bytelog's medium",
            binary, DEV,
        ),
        Jext4Nbd("jext4-nbd-unix", "jext4's NBD client, nbdkit file plugin on a Unix socket, same image file", binary, "unix"),
        Jext4Nbd("jext4-nbd-tcp", "jext4's NBD client, nbdkit file plugin on 127.0.0.1", binary, "tcp"),
        Jext4Nbd("jext4-kernel-nbd", "jext4 on /dev/nbd0: the kernel's nbd client, qemu-nbd serving the image file", binary, "kernel"),
        FloorFs(
            "fusefloor",
            "in-memory FUSE server, no engine, plain fuser workers (without jext4's read turns and polling) "
            "(jext4-bench-driver floorfs: jext4's mount options, capabilities, timeouts and open flags)",
            driver,
        ),
        FloorFs(
            "fusefloor-1t",
            "fusefloor with one /dev/fuse worker (--threads 1) instead of jext4's four",
            driver, threads=1,
        ),
        FloorFs(
            "fusefloor-pinned",
            "fusefloor with the server and the workload pinned to CPU 0 (as taskset -c 0): "
            "the floor without cross-CPU wake-ups",
            driver, cpus={0},
        ),
        FloorFs(
            "fusefloor-flush",
            "fusefloor whose fsyncs wait for two fdatasyncs of a 1 MiB file next to the images, "
            "shared by every fsync that joined before they started (group commit): the floor of a journaling server",
            driver, flush=True,
        ),
    ]


def baselines(catalogue, binary):
    """`--baseline-binary`: jext4, jext4-uring and jext4-fc again, served by
    another build (main's, before a change), as the opt-in jext4-base,
    jext4-uring-base and jext4-fc-base: before and after interleaved in one
    run."""
    made = []
    for fs in catalogue:
        if fs.name in ("jext4", "jext4-uring", "jext4-fc"):
            base = copy.copy(fs)
            base.name = fs.name + "-base"
            base.description = f"{fs.description}; the baseline binary {binary}"
            base.binary = binary
            base.baseline = True
            base.opt_in = True
            made.append(base)
    return made


# `--fs nbd`: the opt-in NBD group with its local-file peer; `--fs oos`: the
# peers of the out-of-space workloads (issue 10, after the Tux3 post).
GROUPS = {
    "nbd": ["jext4", "jext4-nbd-unix", "jext4-nbd-tcp", "jext4-kernel-nbd"],
    # `--fs dirs`: issue 9's comparison — per-directory fast commits, one
    # global scope, and the kernel's peers.
    "dirs": ["ext4", "ext4-fc", "xfs", "jext4-fc", "jext4-fc-global"],
    "oos": ["ext4", "xfs", "btrfs", "fuse2fs", "jext4"],
    "bytelog": ["ext4-fc", "jext4-fc", "jext4-fc-shm", "jext4-bytelog"],
    # `--fs floor`: the FUSE floor beside jext4 and the kernel (issues 9-11).
    "floor": ["ext4", "ext4-fc", "jext4", "fusefloor", "fusefloor-1t", "fusefloor-pinned", "fusefloor-flush"],
    # `--fs image`: the image tools' peers (issue 25; the builders are in
    # imaging.py): `bench/run --only image --fs image`.
    "image": ["ext4", "ext4-fc", "fuse2fs", "jext4", "jext4-lib", "mke2fs-d", "genext2fs", "e2tools", "debugfs"],
    # `--fs lib`: metafsync and varmail through jext4's library against the
    # kernel and jext4's FUSE mount: `bench/run --only metafsync,varmail --fs lib`.
    "lib": ["ext4", "ext4-fc", "jext4-fc", "jext4-lib", "jext4-lib-fc"],
}


def ram_images(workdir):
    """Where RAM-backed images of this workdir live (/dev/shm, one directory
    per workdir so that concurrent runs with their own workdirs stay apart)."""
    return Path("/dev/shm") / ("jext4-bench-" + str(Path(workdir).resolve()).strip("/").replace("/", "-"))


@contextlib.contextmanager
def pinned(cpus):
    """Pin this process to `cpus` (None: leave it) while the block runs;
    what it starts meanwhile inherits the mask."""
    if not cpus:
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def cleanup_all(reason=""):
    """Undoes every mount and loop device this run made."""
    for mount in list(ACTIVE):
        cleanup_mount(mount, reason)


def cleanup_mount(mount, reason=""):
    """Undoes one mount whatever state it is in: unmount (lazily if busy),
    abort a hung FUSE connection, kill its server, detach its loop device."""
    point = mount.mountpoint
    if mount.sampler:
        mount.sampler.halt.set()
    if mounted_at(point):
        log(f"cleanup{reason}: unmounting {point}")
        # A hung FUSE server blocks even umount(8): give it a short while only.
        if not _try(["umount", point], timeout=10 if mount.fs.fuse else 60):
            if mount.fs.fuse:
                abort_fuse_connection(point)
            _try(["umount", "-l", point])
    if mount.fs.fuse and mount.pid and pid_alive(mount.pid):
        time.sleep(1)
        if pid_alive(mount.pid):
            log(f"cleanup{reason}: killing {mount.fs.name} server {mount.pid}")
            try:
                os.kill(mount.pid, 9)
            except ProcessLookupError:
                pass
    if mount.process is not None:
        try:
            mount.process.wait(timeout=30)
        except Exception:
            pass
    if mount.loop:
        _try(["losetup", "-d", mount.loop])
        mount.loop = None
    stop_nbd(mount)
    if mount in ACTIVE:
        ACTIVE.remove(mount)


def _try(argv, timeout=60):
    """Runs a cleanup command; True if it succeeded. Never raises."""
    try:
        return run(argv, timeout=timeout, check=False).returncode == 0
    except Failure:
        return False


def cleanup_stale(workdir):
    """Removes what a previous, killed run left under workdir: mounts and loop devices."""
    for point in mounts_under(workdir):
        log(f"stale mount {point}: lazily unmounting")
        abort_fuse_connection(point)
        _try(["umount", "-l", point])
    for images in (Path(workdir) / "images", ram_images(workdir)):
        if not images.is_dir():
            continue
        for image in images.iterdir():
            listing = run(["losetup", "-j", image], timeout=30, check=False).stdout
            for line in listing.splitlines():
                device = line.split(":")[0]
                log(f"stale loop device {device} on {image}: detaching")
                _try(["losetup", "-d", device])
