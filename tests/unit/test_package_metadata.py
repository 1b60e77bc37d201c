"""The package's metadata tells the truth: every library the package imports is declared,
and python_requires is the Python the code is written for."""

from __future__ import annotations

import ast
import configparser
import importlib.metadata as md
import re
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "airflow_provider_cdc"


def _declared() -> set[str]:
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    out = set()
    for line in cfg["options"]["install_requires"].splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            out.add(_norm(re.match(r"[A-Za-z0-9_.\-]+", line).group(0)))
    return out


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def imported_modules(root: Path = PACKAGE) -> dict[str, set[str]]:
    """Top-level third-party modules imported anywhere in the package (inside functions too)."""
    found: dict[str, set[str]] = {}
    for f in root.rglob("*.py"):
        for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for n in names:
                top = n.split(".")[0]
                if top not in sys.stdlib_module_names and top != root.name:
                    found.setdefault(top, set()).add(str(f.relative_to(root.parent)))
    return found


def undeclared(modules: dict[str, set[str]], declared: set[str]) -> list[str]:
    dists = md.packages_distributions()
    missing = []
    for mod, files in sorted(modules.items()):
        if not {_norm(d) for d in dists.get(mod, [mod])} & declared:
            missing.append(f"{mod} (imported by {', '.join(sorted(files))}) is in no install_requires entry")
    return missing


def test_every_imported_library_is_declared():
    assert undeclared(imported_modules(), _declared()) == []


def test_the_check_finds_an_undeclared_import(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "m.py").write_text("import json\nimport numpy as np\n\ndef f():\n    from pyarrow import compute\n")
    mods = imported_modules(pkg)
    assert set(mods) == {"numpy", "pyarrow"}
    assert [m.split(" ")[0] for m in undeclared(mods, {"pyarrow"})] == ["numpy"]


def test_python_requires_is_the_python_the_code_is_written_for():
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    floor = re.fullmatch(r">=\s*3\.(\d+)", cfg["options"]["python_requires"].strip())
    target = re.search(r'target-version\s*=\s*"py3(\d+)"', (ROOT / "pyproject.toml").read_text())
    assert floor and target and int(floor.group(1)) == int(target.group(1)) == 11
