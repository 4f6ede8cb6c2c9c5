"""Starting the real Blazar for the tests that compare with it (``tests/real_blazar.py``), with
a stand-in for its launcher script."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import real_blazar

# Fails as many times as the file ``failures`` says, then succeeds; counts its runs in ``runs``.
LAUNCHER = """
here=$(dirname "$0")
echo run >> "$here/runs"
left=$(cat "$here/failures")
if [ "$left" -gt 0 ]; then
  echo $((left - 1)) > "$here/failures"
  echo "installing ..." >&2
  echo "venv/bin/pip: No such file or directory" >&2
  exit 127
fi
echo "READY http://127.0.0.1:$1/v1"
"""


def _launcher(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failures: int) -> Path:
    script = tmp_path / "run_blazar.sh"
    script.write_text(LAUNCHER)
    (tmp_path / "failures").write_text(str(failures))
    monkeypatch.setattr(real_blazar, "RUN_BLAZAR", script)
    monkeypatch.setenv("BLAZAR_STATE", str(tmp_path / "state"))
    return tmp_path / "runs"


def test_a_launch_that_fails_once_is_tried_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = _launcher(tmp_path, monkeypatch, failures=1)
    real_blazar.start(1234, tmp_path / "blazar.sqlite", {})
    assert runs.read_text().split() == ["run", "run"]


def test_a_launch_that_fails_twice_fails_under_ci_naming_both_errors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = _launcher(tmp_path, monkeypatch, failures=2)
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception) as failed:
        real_blazar.start(1234, tmp_path / "blazar.sqlite", {})
    assert runs.read_text().split() == ["run", "run"]
    assert str(failed.value).count("venv/bin/pip: No such file or directory") == 2


def test_a_launch_that_fails_twice_skips_outside_ci(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _launcher(tmp_path, monkeypatch, failures=2)
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="cannot run here"):
        real_blazar.start(1234, tmp_path / "blazar.sqlite", {})
