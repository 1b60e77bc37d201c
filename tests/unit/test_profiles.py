"""Each database is described once, behind its dialect (docs/DESIGN.md, "Adding a database").

Every registered database gives a complete, driver-free profile (dialects/registry.py), and no
module outside ``dialects/`` branches on a database's name: what differs between databases is
asked of the profile. The few comparisons that remain are allow-listed below, each with why.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from airflow_provider_cdc.core.schema import TableName
from airflow_provider_cdc.dialects.registry import PROFILES, profiles

from .profile_checks import check_complete_profile, check_names_belong_to_one_database

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "airflow_provider_cdc"


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_every_registered_database_gives_a_complete_profile(name):
    check_complete_profile(name)


def test_names_types_and_connectors_belong_to_one_database():
    check_names_belong_to_one_database()


def test_reading_every_profile_imports_no_driver():
    """Hooks, lineage, the sources config and DAG parsing read profiles: no driver may load."""
    code = ("import sys, json\n"
            "from airflow_provider_cdc.dialects.registry import profiles\n"
            "for p in profiles():\n"
            "    p.filter_rules, p.owned_objects('s', {}), p.cdc_option_keys\n"
            "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('psycopg2', 'pymysql', 'pymysqlreplication', 'MySQLdb'))))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT).stdout
    assert json.loads(out.strip().splitlines()[-1]) == []


# --- no module outside dialects/ branches on a database's name ---------------------------------

#: module (relative to the package) -> why it still compares a database's name
ALLOWED = {
    "hooks/task_errors.py": "classifies an exception by the driver module that raised it (psycopg2 or "
                            "pymysql): the driver's error types, read without importing either driver",
    "sinks/event_log.py": "MySQL/MariaDB-only staging detail of the event log (a connector named in the staged "
                          "schema); sinks sit beside dialects and may not import them",
    "export/debezium/fields.py": "MariaDB's JSON column is text to Debezium: a connector of the MySQL type map, "
                          "not a database",
}


def _names() -> set[str]:
    return {v for p in profiles() for a in ("names", "conn_types", "debezium_connectors") for v in getattr(p, a)}


def _branches(tree: ast.AST, names: set[str]) -> list[int]:
    """Lines comparing something with a database's name (``== "postgres"``, ``in ("mysql", ...)``)."""
    def named(node: ast.AST) -> bool:
        if isinstance(node, ast.Constant):
            return node.value in names
        if isinstance(node, ast.Tuple | ast.List | ast.Set):
            return any(named(e) for e in node.elts)
        return False

    return [n.lineno for n in ast.walk(tree)
            if isinstance(n, ast.Compare) and (named(n.left) or any(named(c) for c in n.comparators))]


def _package_branches(root: Path) -> dict[str, list[int]]:
    names = _names()
    out = {}
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel.startswith("dialects/"):
            continue
        lines = _branches(ast.parse(path.read_text(), str(path)), names)
        if lines:
            out[rel] = lines
    return out


def test_no_module_outside_dialects_branches_on_a_database_name():
    found = _package_branches(PKG)
    unexplained = {m: lines for m, lines in found.items() if m not in ALLOWED}
    assert not unexplained, ("ask the database's profile (dialects/registry.py get_profile) instead of comparing "
                             f"its name, or allow-list the module here with why: {unexplained}")
    stale = sorted(set(ALLOWED) - set(found))
    assert not stale, f"allow-listed modules that no longer compare a database name (remove them): {stale}"


def test_the_branch_check_sees_a_comparison(tmp_path):
    (tmp_path / "glue.py").write_text('def f(d):\n    if d.name == "postgres":\n        return 1\n'
                                      '    return d.scheme in ("mariadb", "x")\n')
    (tmp_path / "dialects").mkdir()
    (tmp_path / "dialects" / "x.py").write_text('y = 1 if "mysql" == "mysql" else 0\n')
    assert _package_branches(tmp_path) == {"glue.py": [2, 4]}


@pytest.mark.parametrize(("scheme", "port", "namespace", "name"), [
    ("postgres", None, "postgres://db.example:5432", "shop.public.orders"),
    ("postgres", 6543, "postgres://db.example:6543", "shop.public.orders"),
    ("mysql", None, "mysql://db.example:3306", "public.orders"),
    ("mariadb", 3307, "mysql://db.example:3307", "public.orders"),
])
def test_lineage_names_a_source_table_by_its_database_s_profile(scheme, port, namespace, name):
    from airflow_provider_cdc.dialects.base import ConnectionParams
    from airflow_provider_cdc.lineage import source_name, source_namespace

    params = ConnectionParams(scheme=scheme, host="db.example", port=port, database="shop")
    assert source_namespace(params) == namespace
    assert source_name(params, TableName("public", "orders")) == name


def test_every_registered_database_has_a_debezium_type_map_and_source_values():
    """Debezium's type mapping stays in export/debezium.py (its value helpers live there), keyed by
    the profile's name: a new database without one fails here, not in a user's export."""
    from airflow_provider_cdc.export import debezium

    assert set(debezium._FIELD_MAPS) == set(PROFILES) == set(debezium._SOURCE_VALUES)
    assert debezium.CONNECTORS == tuple(c for p in profiles() for c in p.debezium_connectors)


def _outside_dialects(root: Path, hit) -> dict[str, list[int]]:
    """Lines of every module outside dialects/ with an AST node ``hit`` says yes to."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel.startswith("dialects/"):
            continue
        lines = [n.lineno for n in ast.walk(ast.parse(path.read_text(), str(path))) if hit(n)]
        if lines:
            out[rel] = lines
    return out


def _dialect_probes(root: Path) -> dict[str, list[int]]:
    """``getattr(<a dialect>, "...")`` outside dialects/: a variable named dialect or d."""
    return _outside_dialects(root, lambda n: (
        isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in ("getattr", "hasattr")
        and bool(n.args) and isinstance(n.args[0], ast.Name) and n.args[0].id in ("dialect", "d")))


def test_no_module_outside_dialects_probes_a_dialect_for_an_attribute(tmp_path):
    """What a source holds (slot, publication, offset file, lock key...) is declared by
    dialects/base.Dialect with a default; callers use it, they do not probe (issue 60)."""
    assert _dialect_probes(PKG) == {}, "declare the attribute on dialects/base.Dialect and use it"
    (tmp_path / "glue.py").write_text('def f(dialect, d):\n    return getattr(dialect, "slot_name", None) or '
                                      'hasattr(d, "x") or getattr(other, "y", 1)\n')
    assert _dialect_probes(tmp_path) == {"glue.py": [2, 2]}


def _dialect_private_calls(root: Path) -> dict[str, list[int]]:
    """``<a dialect>._member`` outside dialects/: a variable named dialect, d or base."""
    return _outside_dialects(root, lambda n: (
        isinstance(n, ast.Attribute) and n.attr.startswith("_") and not n.attr.startswith("__")
        and isinstance(n.value, ast.Name) and n.value.id in ("dialect", "d", "base")))


def test_no_module_outside_dialects_uses_a_dialects_private_members(tmp_path):
    """doctor's checks are the dialects' own (Dialect.doctor_findings, begin_read_only,
    existing_tables): no caller reaches into a dialect's session or catalog (issue 60)."""
    assert _dialect_private_calls(PKG) == {}, "declare what the caller needs on dialects/base.Dialect"
    (tmp_path / "glue.py").write_text('def f(dialect, d):\n    dialect._query("x")\n    return d._relation(1), '
                                      'other._x, d.__class__\n')
    assert _dialect_private_calls(tmp_path) == {"glue.py": [2, 3]}
