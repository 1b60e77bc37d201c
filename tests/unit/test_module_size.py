"""No module of the package over 600 lines and no function over 80 (issue 60: a newcomer reads a
module in one sitting and a function in one screen).

The modules and functions still past the limit are listed with their size today as a ceiling:
none may grow, no other may pass the limit, and one that is split below it leaves the list (the
test says so), so the list only shrinks. Read with ``ast``; nothing is imported.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

PKG = Path(__file__).resolve().parents[2] / "airflow_provider_cdc"
MODULE_LINES, FUNCTION_LINES = 600, 80

#: module -> its lines today (to be split by purpose): none left over the limit
LONG_MODULES: dict[str, int] = {}

#: module:function -> its lines today (to be split by purpose): none left over the limit
LONG_FUNCTIONS: dict[str, int] = {}

def _sizes() -> tuple[dict[str, int], dict[str, int]]:
    modules: dict[str, int] = {}
    functions: dict[str, int] = {}
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG).as_posix()
        text = path.read_text()
        modules[rel] = len(text.splitlines())
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                name = f"{rel}:{node.name}"
                functions[name] = max(functions.get(name, 0), node.end_lineno - node.lineno + 1)
    return modules, functions

def _check(sizes: dict[str, int], listed: dict[str, int], limit: int, what: str) -> list[str]:
    problems = []
    for name, n in sorted(sizes.items()):
        ceiling = listed.get(name)
        if ceiling is None and n > limit:
            problems.append(f"{name}: {n} lines, over the {what} limit of {limit}: split it by purpose")
        elif ceiling is not None and n > ceiling:
            problems.append(f"{name}: {n} lines, grew past its listed {ceiling}: split it, do not grow it")
    for name, ceiling in sorted(listed.items()):
        if sizes.get(name, 0) <= limit:
            problems.append(f"{name} is at or under the {what} limit now: remove it from the list")
        elif sizes[name] < ceiling:
            problems.append(f"{name}: {sizes[name]} lines, below its listed {ceiling}: lower the ceiling")
    return problems

def test_no_module_passes_600_lines_or_grows_past_its_ceiling():
    modules, _ = _sizes()
    assert _check(modules, LONG_MODULES, MODULE_LINES, "module") == []

def test_no_function_passes_80_lines_or_grows_past_its_ceiling():
    _, functions = _sizes()
    assert _check(functions, LONG_FUNCTIONS, FUNCTION_LINES, "function") == []

def test_the_check_sees_a_new_long_module_a_grown_one_and_one_split_below_the_limit():
    sizes = {"a.py": 700, "b.py": 650, "c.py": 500, "d.py": 620}
    listed = {"b.py": 640, "c.py": 900, "d.py": 630}
    got = _check(sizes, listed, 600, "module")
    assert [p.split(":")[0].split(" ")[0] for p in got] == ["a.py", "b.py", "c.py", "d.py"]
