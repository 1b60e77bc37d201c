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


(Path(__file__).parent / "_generated").mkdir(exist_ok=True)
(Path(__file__).parent / "_generated" / "configuration.md").write_text(_configuration_reference())
