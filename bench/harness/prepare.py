"""What a run needs before measuring: Debian packages, the driver and jext4
binaries, and the description of the machine that goes into the results."""

import os
import platform
import shutil
from pathlib import Path

from util import Failure, fail_line, last_line, log, run

# Each tool, and the Debian package that ships it.
PACKAGE_OF = {
    "e2fsck": "e2fsprogs",
    "mkfs.xfs": "xfsprogs",
    "mkfs.btrfs": "btrfs-progs",
    "fuse2fs": "fuse2fs",
    "fusermount3": "fuse3",
    "fio": "fio",
    "dbench": "dbench",
    "fs_mark": "fsmark",
    "db_bench": "rocksdb-tools",
    "xz": "xz-utils",
    "genext2fs": "genext2fs",
    "e2cp": "e2tools",
    "e2mkdir": "e2tools",
}
KERNEL_SOURCE = "/usr/src/linux-source-6.1.tar.xz"


def missing_packages(tools, want_source, want_plots):
    packages = sorted({PACKAGE_OF[tool] for tool in tools if tool in PACKAGE_OF and not shutil.which(tool)})
    if want_source and not os.path.exists(KERNEL_SOURCE):
        packages.append("linux-source-6.1")
    if want_plots and run(["/usr/bin/python3", "-c", "import matplotlib"], check=False).returncode != 0:
        packages.append("python3-matplotlib")
    return packages


def install(packages):
    """apt-get installs what is missing; one failure line if it cannot."""
    if not packages:
        return
    log(f"installing {' '.join(packages)}")
    environment = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    try:
        run(["apt-get", "update", "-qq"], timeout=600, env=environment)
        process = run(["apt-get", "install", "-y", "-qq", *packages], timeout=1200, check=False, env=environment)
    except Failure as error:
        fail_line(f"apt-get: {error}")
        return
    if process.returncode != 0:
        fail_line(f"apt-get install {' '.join(packages)} exited {process.returncode}: {last_line(process.stderr)}")


def cargo_build(repo, args, what):
    """Builds with cargo in release mode; returns None or a one-line reason."""
    cargo = shutil.which("cargo") or str(Path.home() / ".cargo" / "bin" / "cargo")
    if not os.path.exists(cargo):
        return "cargo not found"
    log(f"building {what} (cargo build --release {' '.join(args)})")
    try:
        result = run([cargo, "build", "--release", "--quiet", *args], cwd=repo, timeout=1800, check=False)
    except Failure as error:
        return f"build of {what} failed: {error}"
    if result.returncode != 0:
        errors = [line for line in result.stderr.splitlines() if line.startswith("error")]
        return f"build of {what} failed: {(errors or [last_line(result.stderr)])[0][:200]}"
    return None


def _version(argv, pattern_line=0):
    try:
        result = run(argv, timeout=30, check=False)
    except (Failure, OSError):
        return "missing"
    lines = (result.stdout + result.stderr).strip().splitlines()
    return lines[pattern_line].strip() if lines else "unknown"


def _package_version(package):
    try:
        result = run(["dpkg-query", "-W", "-f", "${Version}", package], timeout=30, check=False)
    except (Failure, OSError):
        return "unknown"
    return result.stdout.strip() if result.returncode == 0 else "not installed"


def machine(repo):
    cpu = "unknown"
    with open("/proc/cpuinfo") as cpuinfo:
        for line in cpuinfo:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    with open("/proc/meminfo") as meminfo:
        memory_kib = int(meminfo.readline().split()[1])
    commit = run(["git", "rev-parse", "--short", "HEAD"], cwd=repo, check=False).stdout.strip()
    dirty = run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=repo, check=False).stdout.strip()
    versions = {
        package: _package_version(package)
        for package in ["e2fsprogs", "xfsprogs", "fuse2fs", "fuse3", "libfuse2", "fio", "dbench", "fsmark", "rocksdb-tools"]
    }
    versions["mke2fs"] = _version(["mke2fs", "-V"])
    versions["mkfs.xfs"] = _version(["mkfs.xfs", "-V"])
    return {
        "nproc": os.cpu_count(),
        "memory_gib": round(memory_kib / 1024 / 1024, 1),
        "kernel": platform.release(),
        "cpu": cpu,
        "os": _version(["sh", "-c", ". /etc/os-release && echo $PRETTY_NAME"]),
        "jext4_commit": commit + ("-dirty" if dirty else ""),
        "versions": versions,
    }
