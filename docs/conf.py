"""Sphinx configuration of the documentation site (``make docs``; built in CI with warnings as
errors by tests/unit/test_docs.py).

The configuration reference is generated here from the settings module (settings.OPTIONS), so
it cannot drift from what the package reads."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

project = "airflow-provider-cdc"
author = "the airflow-provider-cdc developers"
copyright = "2026, the airflow-provider-cdc developers"  # noqa: A001 - Sphinx's name

extensions = ["myst_parser", "sphinx.ext.autodoc", "sphinxarg.ext"]
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3
exclude_patterns = ["_build", "ui", "_generated"]  # _generated: included by its page
html_theme = "furo"
html_title = "airflow-provider-cdc"
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": False, "show-inheritance": False}
suppress_warnings = ["myst.domains"]  # sphinx-argparse's domain answers no "any" cross-reference


def _configuration_reference() -> str:
    from airflow_provider_cdc.settings import OPTIONS

    lines = [
        "# Configuration reference",
        "",
        "Every setting the package reads, generated from `airflow_provider_cdc/settings.py` when this",
        "site is built. Each is an environment variable (`CDC_...`), or the same key in the `[cdc]`",
        "section of `airflow.cfg` (the lower-case name without `CDC_`); a source of the sources",
        "config can set most of them for itself. A bad value fails with a message that names the",
        "setting and what it takes.",
        "",
        "| Setting | Default | What it does |",
        "|---|---|---|",
    ]
    for o in OPTIONS:
        default = "(unset)" if o.default is None else f"`{o.default}`"
        text = " ".join(str(o.description).split()).replace("|", "\\|")
        example = getattr(o, "example", None)
        if example:
            text += f" Example: `{example}`."
        lines.append(f"| `{o.var}` | {default} | {text} |")
    return "\n".join(lines) + "\n"


# --- the troubleshooting page's message index: every message the package raises on purpose ----
_NOT_OURS = {"ValueError", "AssertionError", "TypeError", "IndexError", "NotImplementedError", "RuntimeError",
             "KeyError", "OSError"}
_AREAS = (  # (area, module path prefixes), first match wins; the last is the rest
    ("Connections", ("dialects/base", "dialects/__init__", "hooks/")),
    ("PostgreSQL", ("dialects/postgres",)),
    ("MySQL and MariaDB", ("dialects/mysql",)),
    ("Settings and the sources config", ("settings.py", "sources_config.py", "core/spark_settings", "core/throttle")),
    ("Snapshots: confs, names and state", ("core/planning", "core/filters", "core/ranges", "core/schema", "core/scope",
                                           "core/sqlnames", "core/progress", "pipeline/snapshot", "airflow_variables",
                                           "pipeline/snapshot_state", "operators/snapshot", "pipeline/merge_while")),
    ("Outputs: event log, mirror, Debezium export", ("sinks/", "core/arrow_types")),
    ("Storage and data locations", ("storage/",)),
    ("Capture, merge, verify and the command line", ("",)),
)


def _message_start(node) -> str | None:
    """The literal text of a raise's message, ``…`` for each part filled in at run time."""
    import ast

    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "…" for v in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return (_message_start(node.left) or "…") + (_message_start(node.right) or "…")
    return None


def raised_messages() -> list[tuple[str, str, str]]:
    """(area, exception class, message start) of every ``raise SomethingError("...")`` of the
    package whose message is written in the raise (tests/unit/test_docs.py checks the page)."""
    import ast

    pkg = ROOT / "airflow_provider_cdc"
    found: list[tuple[str, str, str]] = []
    seen: set[tuple[str, str]] = set()
    for f in sorted(pkg.rglob("*.py")):
        rel = f.relative_to(pkg).as_posix()
        area = next(a for a, prefixes in _AREAS if rel.startswith(prefixes))
        for n in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
            if not (isinstance(n, ast.Raise) and isinstance(n.exc, ast.Call) and n.exc.args):
                continue
            fn = n.exc.func
            cls = fn.id if isinstance(fn, ast.Name) else fn.attr if isinstance(fn, ast.Attribute) else ""
            if not cls.endswith("Error") or cls in _NOT_OURS:
                continue
            msg = _message_start(n.exc.args[0])
            if not msg:
                continue
            msg = " ".join(msg.split())
            if len(msg.replace("…", "").strip(" .:;")) < 12:
                continue
            if len(msg) > 170:
                msg = msg[:170].rsplit(" ", 1)[0] + " …"
            if (cls, msg) not in seen:
                seen.add((cls, msg))
                found.append((area, cls, msg))
    return found


def _error_index() -> str:
    lines = [
        "The start of every message the package raises on purpose, by area, generated from the source",
        "when this site is built (`…`: a part filled in at run time; a long message is cut with ` …`).",
        "The exception class tells the kind: `ConfigurationError` (a setting, conf or connection: fix",
        "it), `SourceError` (the source cannot serve CDC as configured), `SourceUnreachableError` (the",
        "server refused or dropped the connection: retried), `SourceChangedError` (a",
        "failover: resync), `RetentionError` (log at risk), `StateError` (a snapshot or offset state",
        "forbids the step), `WatermarkError` / `NotReadyError` (a watermark not staged yet: retried),",
        "`FencedError` (a superseded writer: nothing to do), `SchemaChangeError` (re-snapshot the table).",
        "",
    ]
    messages = raised_messages()
    for area, _prefixes in _AREAS:
        items = sorted({(c, m) for a, c, m in messages if a == area}, key=lambda x: (x[0], x[1].lower()))
        if not items:
            continue
        lines += [f"## {area}", ""]
        for cls, msg in items:
            msg = msg.replace("``", "` `")
            pad = " " if msg.startswith("`") or msg.endswith("`") else ""
            lines.append(f"- {cls}: ``{pad}{msg}{pad}``")
        lines.append("")
    return "\n".join(lines)


(Path(__file__).parent / "_generated").mkdir(exist_ok=True)
(Path(__file__).parent / "_generated" / "configuration.md").write_text(_configuration_reference())
(Path(__file__).parent / "_generated" / "errors.md").write_text(_error_index())
