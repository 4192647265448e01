"""Shared plumbing: running commands with timeouts, one-line logging, failures."""

import os
import signal
import subprocess
import sys
import time

STARTED = time.monotonic()


# The check verdict of a filesystem that has no image (the FUSE floor).
NOT_CHECKED = "no image"


class Failure(Exception):
    """A workload, mount or check failed; the message is one line for the log."""


class Unavailable(Exception):
    """A filesystem cannot be tested in this run (binary missing, mount refused)."""


def log(message):
    elapsed = time.monotonic() - STARTED
    print(f"[{int(elapsed) // 60:3d}:{int(elapsed) % 60:02d}] {message}", flush=True)


FAILURES = []


def fail_line(message):
    """Prints and records one failure line; bench/run exits non-zero if any."""
    FAILURES.append(message)
    log(f"FAIL {message}")


def last_line(text, limit=300):
    lines = [line.strip() for line in (text or "").strip().splitlines() if line.strip()]
    return lines[-1][:limit] if lines else ""


def first_line(text, limit=300):
    lines = [line.strip() for line in (text or "").strip().splitlines() if line.strip()]
    return lines[0][:limit] if lines else ""


def run(argv, timeout=None, cwd=None, check=True, input_text=None, env=None):
    """Runs argv in its own process group; returns CompletedProcess with text
    stdout/stderr. On timeout the whole group is killed and Failure raised;
    with check, a non-zero exit raises Failure naming the command and its
    last line of stderr."""
    argv = [str(arg) for arg in argv]
    process = subprocess.Popen(
        argv,
        cwd=cwd,
        env=env,
        stdin=subprocess.PIPE if input_text is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = process.communicate(input_text, timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_group(process.pid)
        try:
            process.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            pass  # stuck in the kernel (a hung FUSE server); cleanup aborts the connection
        raise Failure(f"{os.path.basename(argv[0])} timed out after {timeout:.0f} s")
    result = subprocess.CompletedProcess(argv, process.returncode, stdout, stderr)
    if check and result.returncode != 0:
        detail = last_line(stderr) or last_line(stdout)
        # A summary last line ("tar: Exiting with failure status due to
        # previous errors") says nothing: name the first complaint too.
        first = first_line(stderr)
        if first and first != detail:
            detail = f"{first} … {detail}"
        raise Failure(f"{' '.join(argv[:3])}... exited {result.returncode}: {detail}")
    return result


def kill_group(pgid):
    """Kills a process group that this harness started (its leader's pid)."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def median(values):
    ordered = sorted(values)
    n = len(ordered)
    if n == 0:
        return None
    middle = n // 2
    return ordered[middle] if n % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def die(message):
    print(f"bench/run: {message}", file=sys.stderr)
    sys.exit(2)
