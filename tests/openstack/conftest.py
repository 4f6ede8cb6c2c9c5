"""The real OpenStack rig (../shared/openstack: Keystone, Nova, Placement on loopback), started once
per test run with Blazar's Nova filter. Tests here skip with one line when it cannot start, except
under ``CI=true`` (or ``OSTEST_REQUIRED=1``), where they fail. ``OSTEST_KEEP=1`` leaves it running
for the next run (which then starts in 0.1 s, seeing this run's data)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

RIG = Path(os.environ.get("OSTEST_RIG", Path(__file__).resolve().parents[3] / "shared/openstack"))
BASE = os.environ.get("OSTEST_BASE", "/tmp/os-local")
REQUIRED = os.environ.get("CI") == "true" or os.environ.get("OSTEST_REQUIRED") == "1"


def _unavailable(message: str) -> None:
    if REQUIRED:
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


@pytest.fixture(scope="session")
def openstack_env() -> Iterator[dict[str, str]]:
    """Start the rig once; yield ``BASE/ostest.env`` as a dict (OS_AUTH_URL, NOVA_URL, ...)."""
    if not (RIG / "start.sh").is_file():
        _unavailable(f"OpenStack rig not found at {RIG} (set OSTEST_RIG)")
    if os.geteuid() != 0:
        _unavailable("the OpenStack rig needs root (apt-get, rabbitmq-server); skipping")
    env = dict(os.environ, BLAZAR_FILTER="1", NOVA_NOTIFICATIONS="messagingv2")
    try:
        proc = subprocess.run(
            [str(RIG / "start.sh"), BASE], capture_output=True, text=True, timeout=900, env=env
        )
    except subprocess.TimeoutExpired:
        subprocess.run([str(RIG / "stop.sh"), BASE], capture_output=True, check=False)
        _unavailable("the OpenStack rig's start.sh did not finish within 900 s")
        raise  # unreachable: _unavailable raises
    if proc.returncode != 0:
        _unavailable(
            f"the OpenStack rig's start.sh failed (exit {proc.returncode}):\n"
            f"{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
        )
    lines = Path(BASE, "ostest.env").read_text().splitlines()
    yield dict(line.split("=", 1) for line in lines if "=" in line)
    if os.environ.get("OSTEST_KEEP") != "1":
        subprocess.run([str(RIG / "stop.sh"), BASE], capture_output=True, timeout=300, check=False)
