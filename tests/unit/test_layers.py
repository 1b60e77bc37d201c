"""The package's layers (docs/DESIGN.md, Layout): imports point down only, and no module imports
itself back through others (no import cycle), counting imports inside functions too.

    core  <-  storage  <-  dialects, sinks  <-  pipeline, export  <-  Airflow glue

Read from the source with ``ast``: nothing is imported, so a test module can not hide an
arrow by importing things first.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

PKG = "airflow_provider_cdc"
ROOT = Path(__file__).resolve().parents[2]

#: layer of each top-level part of the package (higher may import lower or equal-rank
#: parts named in SIDEWAYS, never higher)
LAYERS = {
    "core": 0,
    "storage": 1,
    "dialects": 2,
    "sinks": 2,
    "export": 3,  # other formats of the lake's outputs (Debezium JSON), read from the event log
    "pipeline": 3,
    # Airflow glue, in its own order
    "settings": 4,
    "airflow_variables": 4,
    "sources_config": 4,  # many sources' settings: the settings of each
    "error_text": 4,  # error text as it may be stored or shown (Airflow's secrets masker)
    "hooks": 5,
    "assets": 5,
    "lineage": 5,  # the operators' OpenLineage datasets
    "status": 5,  # what `airflow cdc status` and the UI page read
    "triggers": 6,
    "doctor": 6,  # what `airflow cdc doctor` checks on a source before its first run
    "sensors": 7,  # a sensor runs the pipeline's capture itself when asked to
    "operators": 7,
    "cli": 8,
    "ui": 8,  # the CDC page: an Airflow plugin over status
    "dag_builders": 8,
    "__init__": 8,
}
#: imports between parts of one layer that are allowed (from -> to)
SIDEWAYS: set[tuple[str, str]] = {("sources_config", "settings")}
#: modules that must not import Airflow, Spark or a database driver, whatever their layer
NO_AIRFLOW = ("core", "storage", "dialects", "sinks", "export", "pipeline", "settings", "sources_config")
AIRFLOW_ROOTS = ("airflow",)
PURE_FORBIDDEN = ("airflow", "pyspark", "psycopg2", "pymysql", "pymysqlreplication", "deltalake", "MySQLdb")


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, absolute module) of every import in the file, at any depth."""
    mod = _module(path)
    pkg = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            out.append((node.lineno, target))
            # `from . import storage`: the names may be modules themselves
            out += [(node.lineno, f"{target}.{a.name}") for a in node.names if a.name != "*"]
    return out


def _files() -> dict[str, Path]:
    return {_module(p): p for p in sorted((ROOT / PKG).rglob("*.py"))}


def _part(module: str) -> str:
    rest = module.split(".")[1:]
    return rest[0] if rest else "__init__"


def _edges() -> dict[str, set[str]]:
    """Module -> the package modules it imports (names that are not modules dropped)."""
    files = _files()
    edges: dict[str, set[str]] = {m: set() for m in files}
    for m, path in files.items():
        for _line, target in _imports(path):
            while target and target not in files:
                target = target.rpartition(".")[0]
            # a package's own ancestors are imported by Python anyway: not an arrow
            if target and target != m and target.startswith(PKG) and not m.startswith(target + "."):
                edges[m].add(target)
    return edges


def test_every_part_of_the_package_has_a_layer():
    parts = {_part(m) for m in _files()}
    assert parts <= set(LAYERS), f"give these parts a layer in LAYERS: {sorted(parts - set(LAYERS))}"


def test_imports_point_down_only():
    bad = []
    for m, targets in _edges().items():
        for t in targets:
            a, b = _part(m), _part(t)
            if a == b or (a, b) in SIDEWAYS:
                continue
            if LAYERS[b] >= LAYERS[a]:
                bad.append(f"{m} ({a}, layer {LAYERS[a]}) imports {t} ({b}, layer {LAYERS[b]})")
    assert not bad, "imports that point up or sideways:\n" + "\n".join(sorted(bad))


def test_no_import_cycles():
    edges = _edges()
    state: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for t in sorted(edges[m]):
            # a package importing its own submodule counts: a chain from that submodule back to
            # the package is a cycle at import time (verify -> verify.table -> multiset -> snapshot
            # -> verify was one)
            if state.get(t) == 1:
                cycles.append(stack[stack.index(t):] + [t])
            elif t not in state:
                visit(t)
        stack.pop()
        state[m] = 2

    for m in sorted(edges):
        if m not in state:
            visit(m)
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_lower_layers_import_no_airflow_spark_or_driver():
    bad = []
    for m, path in _files().items():
        part = _part(m)
        if part not in NO_AIRFLOW:
            continue
        forbidden = PURE_FORBIDDEN if part == "core" else AIRFLOW_ROOTS
        for line, target in _imports(path):
            if target.split(".")[0] in forbidden:
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {target}")
    assert not bad, "\n".join(bad)


def test_the_checker_sees_an_upward_import_and_a_cycle(tmp_path, monkeypatch):
    """The checks above can fail: a core module importing an operator is reported."""
    pkg = tmp_path / PKG
    (pkg / "core").mkdir(parents=True)
    (pkg / "operators").mkdir()
    for p in (pkg, pkg / "core", pkg / "operators"):
        (p / "__init__.py").write_text("")
    (pkg / "core" / "a.py").write_text("from ..operators import b\n")
    (pkg / "operators" / "b.py").write_text("def f():\n    from ..core import a\n")
    monkeypatch.setattr(__import__(__name__, fromlist=["ROOT"]), "ROOT", tmp_path)
    with pytest.raises(AssertionError, match=r"core\.a \(core, layer 0\) imports .*operators\.b"):
        test_imports_point_down_only()
    with pytest.raises(AssertionError, match="import cycles"):
        test_no_import_cycles()


def test_spark_job_files_import_the_package_absolutely():
    """spark-submit runs a job file as a script (no parent package): a relative import
    there fails only at submit time, so it is refused here."""
    for job in ("merge_job", "apply_job"):
        path = ROOT / PKG / "pipeline" / "spark" / f"{job}.py"
        relative = [n.lineno for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.ImportFrom) and n.level]
        assert not relative, f"{path.name}: relative imports on lines {relative}; import airflow_provider_cdc.… instead"


def test_the_arrow_engine_needs_nothing_of_the_spark_engine():
    """The in-process engine runs where Spark is not installed: what both engines share lives
    below them (storage, sinks), never in pipeline/spark."""
    path = ROOT / PKG / "pipeline" / "arrow_engine.py"
    spark = [f"line {line}: {t}" for line, t in _imports(path) if t.startswith(f"{PKG}.pipeline.spark")]
    assert not spark, "pipeline/arrow_engine.py imports the Spark engine: " + ", ".join(spark)


def test_no_test_module_is_imported():
    """Shared test code lives in helper modules (tests/e2e/helpers.py, tests/integration/helpers.py,
    staged_scenario.py...): importing a test module runs its collection-time code twice and
    makes its tests run wherever it is imported."""
    bad = []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or "", *(a.name for a in node.names)] if isinstance(node, ast.ImportFrom) else [])
            if any(part.startswith("test_") for name in names for part in name.split(".")):
                bad.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not bad, "imports of test modules: " + ", ".join(bad)
