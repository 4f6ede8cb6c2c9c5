"""The import graph of climate: the layers and forbidden imports in pyproject's import-linter
contracts hold, and no module imports itself through others (a cycle)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parent.parent


def test_every_import_contract_is_kept() -> None:
    lint = Path(sys.executable).with_name("lint-imports")
    found = subprocess.run(
        [str(lint), "--no-cache", "--config", str(ROOT / "pyproject.toml")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert found.returncode == 0, found.stdout + found.stderr
    assert "0 broken" in found.stdout


def test_no_module_of_climate_imports_itself_through_others() -> None:
    graph = grimp.build_graph("climate", exclude_type_checking_imports=True)
    loops = sorted(
        (importer, imported)
        for importer in graph.modules
        for imported in graph.find_modules_directly_imported_by(importer)
        if graph.chain_exists(importer=imported, imported=importer)
    )
    assert loops == []
