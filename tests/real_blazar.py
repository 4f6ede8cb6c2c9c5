"""The real Blazar 18, run by ``/work/shared/blazar/run_blazar.sh`` (``BLAZAR_STATE``, default
``/tmp/blazar-ref``, says where its venv and logs live). Without it the tests that need it skip,
except under CI=true, where they fail."""

from __future__ import annotations

import fcntl
import os
import subprocess
from collections.abc import Mapping
from pathlib import Path

import pytest

RUN_BLAZAR = Path("/work/shared/blazar/run_blazar.sh")
INSTALL_SECONDS = 600


def state() -> Path:
    return Path(os.environ.get("BLAZAR_STATE", "/tmp/blazar-ref"))


def unavailable(why: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true but the real Blazar cannot run: {why}")
    pytest.skip(f"the real Blazar 18 cannot run here ({why})")


def start(port: int, database: Path, env: Mapping[str, str]) -> None:
    """Blazar's API and manager on ``port`` over the SQLite file ``database``; skips (or fails,
    under CI=true) when it cannot run.

    The script installs Blazar's venv on its first run. That run is tried once more when it
    fails: once, on a fresh machine, the venv came out without pip and every test of a module
    skipped, while the next module's run made it whole. Runs hold a file lock, so that no
    two pytest processes build the same venv at once."""
    if not RUN_BLAZAR.exists():
        unavailable(f"{RUN_BLAZAR} is missing")
    where = state()
    where.mkdir(parents=True, exist_ok=True)
    failed: list[str] = []
    with open(where.with_name(where.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for _ in range(2):
            started = subprocess.run(
                ["bash", str(RUN_BLAZAR), str(port), str(database)],
                env={**env, "BLAZAR_STATE": str(where)},
                capture_output=True,
                text=True,
                timeout=INSTALL_SECONDS,
                check=False,
            )
            if started.returncode == 0:
                return
            failed.append(" | ".join(started.stderr.strip().splitlines()[-3:]) or "no output")
    unavailable("; then ".join(failed))


def stop(port: int, env: Mapping[str, str]) -> None:
    subprocess.run(
        ["bash", str(RUN_BLAZAR), "stop", str(port)],
        env={**env, "BLAZAR_STATE": str(state())},
        check=False,
        timeout=60,
    )
