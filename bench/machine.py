"""What the figures were measured on: CPUs, CPU model, Python, OS."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any


def cpu_model() -> str:
    """The first ``model name`` of /proc/cpuinfo (Linux), else whatever platform knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "Model", "cpu model"):
                return value.strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def nproc() -> int:
    """CPUs this process may run on (what ``nproc`` prints)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def code_version() -> str:
    """The commit of the checkout the benchmark runs from, ``+dirty`` if ``src/`` has changes."""
    root = Path(__file__).resolve().parent.parent

    def git(*args: str) -> str:
        done = subprocess.run(
            ["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10
        )
        return done.stdout.strip() if done.returncode == 0 else ""

    try:
        commit = git("rev-parse", "--short", "HEAD")
        dirty = git("status", "--porcelain", "--", "src")
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    if not commit:
        return "unknown"
    return f"{commit}+dirty" if dirty else commit


def load_average() -> str:
    """1, 5 and 15 minute load averages: other work on the machine skews every figure."""
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "unknown"


def describe() -> dict[str, Any]:
    return {
        "nproc": nproc(),
        "cpu_model": cpu_model(),
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "python_executable": sys.executable,
        "os": f"{platform.system()} {platform.release()}",
        "hostname": platform.node(),
        "climate_commit": code_version(),
        "load_average_at_start": load_average(),
    }
