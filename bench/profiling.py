"""Optional sampling profile of the server while it admits leases (py-spy, attached by pid).

py-spy samples every thread of the server (FastAPI runs sync endpoints on worker threads, so
cProfile on the main thread would see only the event loop). The raw output is one collapsed stack
per line (``frame;frame;... count``); this module folds it into self and inclusive time per
function.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


def py_spy_executable() -> str | None:
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.exists() else shutil.which("py-spy")


@dataclass
class Profile:
    """Where a sampled process spent its (non-idle) time."""

    samples: int = 0
    threads: Counter[str] = field(default_factory=Counter)
    """Samples per thread name, before any filtering."""
    self_counts: Counter[str] = field(default_factory=Counter)
    inclusive_counts: Counter[str] = field(default_factory=Counter)
    package_counts: Counter[str] = field(default_factory=Counter)
    """Self time per package (``climate.<subpackage>``, ``sqlalchemy``, ``json``...)."""

    def top(self, which: str, n: int, *, within: str = "") -> list[tuple[str, int, float]]:
        """The ``n`` heaviest functions (those whose path contains ``within``), with shares."""
        counts = self.self_counts if which == "self" else self.inclusive_counts
        total = self.samples or 1
        ranked = [(name, c) for name, c in counts.most_common() if within in name]
        return [(name, c, 100.0 * c / total) for name, c in ranked[:n]]

    def as_dict(self, n: int = 25) -> dict[str, Any]:
        def rows(which: str, within: str = "") -> list[dict[str, Any]]:
            return [
                {"function": f, "samples": c, "percent": p}
                for f, c, p in self.top(which, n, within=within)
            ]

        return {
            "samples": self.samples,
            "threads": dict(self.threads),
            "self": rows("self"),
            "inclusive": rows("inclusive"),
            "inclusive_climate": rows("inclusive", "(climate/"),
            "inclusive_api": rows("inclusive", "(climate/api/"),
            "self_by_package": [
                {"package": name, "samples": c, "percent": 100.0 * c / (self.samples or 1)}
                for name, c in self.package_counts.most_common(n)
            ],
        }


def _frame_name(frame: str) -> str:
    # py-spy raw frames look like "function (path/to/file.py:123)"; drop the line number and
    # shorten the path to what follows site-packages/ or src/.
    name, _, where = frame.partition(" (")
    path = where.rstrip(")").rsplit(":", 1)[0]
    for marker in ("site-packages/", "/src/", "lib/python3"):
        if marker in path:
            path = path.split(marker, 1)[1]
            break
    return f"{name} ({path})" if path else name


def _package(name: str) -> str:
    """``climate.planner`` for ``f (climate/planner/x.py)``, ``sqlalchemy`` for
    ``f (sqlalchemy/orm/session.py)``, ``json`` for ``f (json/encoder.py)``."""
    path = name.rpartition(" (")[2].rstrip(")")
    parts = path.removesuffix(".py").split("/")
    if parts[0] == "climate" and len(parts) > 2:
        return ".".join(parts[:2])
    return parts[0] or "(unknown)"


def read_collapsed(path: Path, *, only_threads_with: str = "") -> Profile:
    """Fold py-spy ``--format raw`` output; keep stacks containing ``only_threads_with``."""
    profile = Profile()
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        raw_frames = stack.split(";")
        thread = next((f for f in raw_frames if f.startswith("thread ")), "thread (unnamed)")
        profile.threads[thread.partition(": ")[2] or thread] += count
        if only_threads_with and only_threads_with not in stack:
            continue
        frames = [_frame_name(f) for f in raw_frames if not f.startswith(("process ", "thread "))]
        if not frames:
            continue
        profile.samples += count
        profile.self_counts[frames[-1]] += count
        profile.package_counts[_package(frames[-1])] += count
        for name in set(frames):
            profile.inclusive_counts[name] += count
    return profile


@contextlib.contextmanager
def sampled(pid: int, out: Path, rate: int = 200, *, idle: bool = False) -> Iterator[Path]:
    """Record ``pid`` with py-spy for the duration of the block; yields the raw output path.
    With ``idle`` threads waiting (on a lock, a socket) are sampled too: where wall time goes."""
    exe = py_spy_executable()
    if exe is None:
        raise SystemExit("--profile needs py-spy: .venv/bin/pip install py-spy")
    out.parent.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(
        [
            exe,
            "record",
            "--pid",
            str(pid),
            "--rate",
            str(rate),
            "--format",
            "raw",
            "--threads",
            "--nonblocking",
            "--output",
            str(out),
            *(["--idle"] if idle else []),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    time.sleep(1.0)  # let py-spy attach before the measured work starts
    if proc.poll() is not None:
        err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
        raise SystemExit(f"py-spy could not attach to pid {pid}: {err.strip()}")
    try:
        yield out
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
