"""The dialect contract a caller reads in one screen: base.Dialect's docstring lists, by
capability, every member a module outside dialects/ uses (issue 60). Callers use nothing else,
every listed name has a caller, and a dialect made of base.Dialect alone (the fake database of
fake_database.py) answers each one."""

from __future__ import annotations

import ast
import collections
import inspect
import re
from pathlib import Path

import pytest

from airflow_provider_cdc.dialects.base import Dialect

from .fake_database import fake_dialect

pytestmark = pytest.mark.unit

PKG = Path(__file__).resolve().parents[2] / "airflow_provider_cdc"


def contract() -> dict[str, list[str]]:
    """The docstring's table: capability -> names (a parenthesis is a pointer, not a name)."""
    lines = inspect.cleandoc(Dialect.__doc__ or "").splitlines()
    rules = [i for i, line in enumerate(lines) if line.startswith("====")]
    groups: dict[str, list[str]] = {}
    label = ""
    for line in lines[rules[0] + 1 : rules[1]]:
        label = line[:14].strip() or label  # an empty label continues the row above
        groups.setdefault(label, []).extend(re.findall(r"[a-z_]+", re.sub(r"\(.*?\)", "", line[14:])))
    return groups


def _dialect_call(node: ast.AST) -> bool:
    if not isinstance(node, ast.Call):
        return False
    f = node.func
    return "dialect" in (f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")).lower()


def dialect_uses(root: Path) -> dict[str, set[str]]:
    """name -> modules outside dialects/ that use it on a dialect: a variable named ``dialect``,
    an attribute ``.dialect``, or a name bound to what a ``*dialect*(...)`` call returned."""
    uses: dict[str, set[str]] = collections.defaultdict(set)
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel.startswith("dialects/"):
            continue
        tree = ast.parse(path.read_text(), str(path))
        names = {"dialect"}
        for n in ast.walk(tree):
            if isinstance(n, ast.withitem) and _dialect_call(n.context_expr) and isinstance(n.optional_vars, ast.Name):
                names.add(n.optional_vars.id)
            if isinstance(n, ast.Assign) and _dialect_call(n.value):
                names.update(t.id for t in n.targets if isinstance(t, ast.Name))
        for n in ast.walk(tree):
            if isinstance(n, ast.Attribute):
                v = n.value
                if (isinstance(v, ast.Name) and v.id in names) or (isinstance(v, ast.Attribute) and v.attr == "dialect"):
                    uses[n.attr].add(rel)
    return uses


def test_the_contract_fits_one_screen_and_names_each_member_once():
    groups = contract()
    names = [n for ns in groups.values() for n in ns]
    assert len(groups) <= 10 and len(Dialect.__doc__.splitlines()) <= 40
    assert len(names) == len(set(names)), [n for n in names if names.count(n) > 1]
    assert "digests" in groups["verify"] and "read_log" in groups["the log"]


def test_callers_use_only_the_contract():
    listed = {n for ns in contract().values() for n in ns}
    outside = {n: sorted(m) for n, m in dialect_uses(PKG).items() if n not in listed}
    assert outside == {}, "list the member in base.Dialect's docstring (and declare it there) or stop using it"


def test_every_listed_member_has_a_caller_outside_the_dialects():
    sources = [p.read_text() for p in PKG.rglob("*.py") if not p.relative_to(PKG).as_posix().startswith("dialects/")]
    unused = sorted(n for ns in contract().values() for n in ns
                    if not any(re.search(rf"\.{n}\b", s) for s in sources))
    assert unused == [], "no caller uses these: take them off the contract (they may stay a dialect's hook)"


@pytest.mark.usefixtures("fakedb")
def test_a_dialect_of_base_alone_answers_every_listed_member():
    """Declared on base.Dialect (abstract, or with a default): no caller needs to know which
    database it has, and a new one inherits an answer for what it does not hold."""
    d = fake_dialect()
    missing = sorted(n for ns in contract().values() for n in ns if not hasattr(d, n))
    assert missing == []


def test_the_checker_sees_a_use_outside_the_contract(tmp_path):
    (tmp_path / "glue.py").write_text(
        "def f(hook):\n    with hook.get_dialect() as d:\n        d.load_offset('x')\n        d.wal_geometry()\n"
        "    dialect = 1\n    return dialect.slot_name, other.wal_geometry\n")
    (tmp_path / "dialects").mkdir()
    (tmp_path / "dialects" / "x.py").write_text("def g(dialect):\n    return dialect.wal_geometry\n")
    assert dict(dialect_uses(tmp_path)) == {"load_offset": {"glue.py"}, "wal_geometry": {"glue.py"},
                                            "slot_name": {"glue.py"}}
