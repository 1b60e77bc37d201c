"""Issue 60's short paths, kept short: a run's ``chunk_size`` crosses at most five files of the
package after the edge that parses it (the conf, a DAG's throttle), in one form (a
``core.plans.Throttle``); and the watermark strategy is held by the dialect alone: it crosses
at most five files, no collaborator is handed the object, and the strategy calls nothing of
the dialect but its windows contract (no grant check or chunk read calling back into it)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

PACKAGE = Path(__file__).resolve().parents[2] / "airflow_provider_cdc"
#: where settings are parsed from what a user wrote (a run's conf, a DAG's or source's config,
#: a CLI flag), and verify, whose Throttle is its own setting (digest queries), not a snapshot's
EDGE = ("operators/", "cli/", "settings/", "dag_builders.py", "sources_config.py", "pipeline/verify/")
#: the Throttle's other fields: reading one of them is not on chunk_size's path
OTHER_FIELDS = {"parallelism", "delay_seconds"}


def _package_files() -> list[tuple[str, ast.Module]]:
    out = []
    for p in sorted(PACKAGE.rglob("*.py")):
        rel = p.relative_to(PACKAGE).as_posix()
        out.append((rel, ast.parse(p.read_text(), rel)))
    return out


def _carries_chunk_size(tree: ast.Module) -> bool:
    """The module names ``chunk_size`` or the Throttle that holds it (built, passed or read whole)."""
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    for n in ast.walk(tree):
        if isinstance(n, ast.Name) and n.id in ("chunk_size", "Throttle"):
            return True
        if isinstance(n, ast.arg) and n.arg == "chunk_size":
            return True
        if isinstance(n, ast.keyword) and n.arg in ("chunk_size", "throttle"):
            return True
        if isinstance(n, ast.Attribute) and n.attr == "chunk_size":
            return True
        if isinstance(n, ast.Attribute) and n.attr == "throttle":
            up = parents.get(n)
            if not (isinstance(up, ast.Attribute) and up.attr in OTHER_FIELDS):
                return True
    return False


def test_chunk_size_crosses_at_most_five_files_after_the_edge():
    files = [rel for rel, tree in _package_files() if not rel.startswith(EDGE) and _carries_chunk_size(tree)]
    print("chunk_size after the edge:", files)
    assert "core/plans.py" in files and "pipeline/snapshot_reads.py" in files  # the measure sees the path
    assert len(files) <= 5, f"chunk_size crosses {len(files)} files after the edge (at most 5): {files}"


#: the strategy in code: the object (``.watermarks``), its classes and table, the setting's name
STRATEGY_NAMES = {"WatermarkStrategy", "STRATEGIES", "WATERMARK_STRATEGIES", "watermark_strategy"}


def _carries_watermark_strategy(rel: str, tree: ast.Module) -> bool:
    """The module holds the strategy or the setting: a dialect's ``watermarks`` (``self`` is a
    dialect under dialects/ only: a staged segment's ``watermarks`` are its watermark rows), the
    strategy's names, an import of its module, or the setting's name as a whole string (an
    option read or declared; a message that names the setting is not on the path)."""
    holders = ("self", "d", "dialect") if rel.startswith("dialects/") else ("d", "dialect")
    for n in ast.walk(tree):
        if isinstance(n, ast.Attribute) and (
            n.attr in STRATEGY_NAMES
            or (n.attr == "watermarks" and isinstance(n.value, ast.Name) and n.value.id in holders)
        ):
            return True
        if isinstance(n, ast.Name) and n.id in STRATEGY_NAMES:
            return True
        if isinstance(n, ast.ImportFrom) and (n.module or "").endswith("watermark_strategy"):
            return True
        if isinstance(n, ast.Constant) and n.value == "watermark_strategy":
            return True
    return False


def test_the_watermark_strategy_crosses_at_most_five_files_after_the_edge():
    """Chosen in dialects/base.py from the connection's extra and held there: the collaborators
    and the doctor checks are handed its facts (``watermark_tables``, ``chunk_reads_snapshot``),
    the chunk step opens and closes its windows (pipeline/snapshot.py)."""
    files = [rel for rel, tree in _package_files() if not rel.startswith(EDGE) and _carries_watermark_strategy(rel, tree)]
    print("watermark_strategy after the edge:", files)
    assert {"dialects/base.py", "dialects/watermark_strategy.py", "pipeline/snapshot.py"} <= set(files)
    assert len(files) <= 5, f"the watermark strategy crosses {len(files)} files after the edge (at most 5): {files}"


def test_no_collaborator_is_handed_the_watermark_strategy():
    """``self.watermarks`` (the dialect's one strategy object) is never a call's argument: a
    collaborator that needs a fact of it is handed the dialect's fact (``watermark_tables``)."""
    handed = []
    for rel, tree in _package_files():
        for n in ast.walk(tree):
            if isinstance(n, ast.Call):
                for a in [*n.args, *(k.value for k in n.keywords)]:
                    if (
                        isinstance(a, ast.Attribute)
                        and a.attr == "watermarks"
                        and isinstance(a.value, ast.Name)
                        and a.value.id in ("self", "d", "dialect")  # (a capture result's are counts)
                    ):
                        handed.append(f"{rel}:{n.lineno}")
    assert not handed, f"the watermark strategy handed to a call at {handed}"


def test_the_watermark_strategy_calls_only_the_dialects_windows_contract():
    allowed = {"ensure_watermark_table", "write_watermark", "mark_position", "source", "watermark_table"}
    tree = ast.parse((PACKAGE / "dialects" / "watermark_strategy.py").read_text())
    used = {
        n.attr
        for n in ast.walk(tree)
        if isinstance(n, ast.Attribute)
        and isinstance(n.value, ast.Attribute)
        and n.value.attr == "dialect"
    }
    assert used, "the measure sees the strategy's calls"
    assert used <= allowed, f"the strategy reaches into the dialect beyond its windows contract: {used - allowed}"
