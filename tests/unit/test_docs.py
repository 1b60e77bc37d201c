"""The documentation site (docs/) builds with Sphinx with warnings as errors; its configuration
reference, generated from settings.OPTIONS, names every setting; its troubleshooting page lists
every message the package raises on purpose; the README's links to it resolve. (Every code
block of the README and the site is checked by test_doc_snippets.py.)"""

from __future__ import annotations

import html
import re
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow  # tens of seconds (pytest --durations)
def test_the_documentation_site_builds_without_warnings_and_lists_every_setting(tmp_path):
    from airflow_provider_cdc.settings import OPTIONS

    out = tmp_path / "html"
    proc = subprocess.run([sys.executable, "-m", "sphinx", "-W", "-q", "-b", "html", str(ROOT / "docs"), str(out)],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    reference = (out / "configuration.html").read_text()
    missing = [o.var for o in OPTIONS if o.var not in reference]
    assert not missing, f"settings missing from the configuration reference: {missing}"
    cli = (out / "cli.html").read_text()
    for command in ("status", "verify", "resync"):
        assert command in cli
    page = re.sub(r"<[^>]+>", "", (out / "troubleshooting.html").read_text())  # literals are a span a word
    troubleshooting = " ".join(html.unescape(page).split())
    messages = runpy.run_path(str(ROOT / "docs" / "conf.py"))["raised_messages"]()
    assert len(messages) > 200, "the message index found too few raises: is its parser broken?"
    missing = [m for _area, _cls, m in messages if m not in troubleshooting]
    assert not missing, f"messages missing from the troubleshooting page: {missing[:5]}"
    for page in ("connections", "howto", "outputs", "deployment", "security", "operations", "troubleshooting"):
        assert (out / f"{page}.html").is_file(), f"{page}.md is not built (is it in index.md's toctree?)"


def test_the_readme_is_a_front_page_whose_links_resolve():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.encode()) <= 15_000, f"README.md is {len(readme.encode())} bytes: keep it a front page"
    links = re.findall(r"\]\((docs/[^)#\s]+)", readme)
    assert links, "the README links to no docs page"
    broken = [link for link in links if not (ROOT / link).is_file()]
    assert not broken, f"README links to missing files: {broken}"
    for command in ("make demo", "make test"):
        assert command in readme


def test_every_constructor_argument_of_the_airflow_classes_has_a_param_line():
    """The API page renders ``:param name:`` lines of the class docstrings: an argument without
    one is missing from the docs. Arguments taken from a mixin (CdcSourceMixin) are listed too."""
    import ast
    from pathlib import Path

    def arguments(cls, classes, own=True):
        """``cls``'s constructor arguments, and those of the private base classes of its module
        (spark_submit._CdcJobOperator), which a public class takes as its own."""
        init = next((f for f in cls.body if isinstance(f, ast.FunctionDef) and f.name == "__init__"), None)
        args = init.args.args[1:] + init.args.kwonlyargs if init and (own or cls.name.startswith("_")) else []
        for base in cls.bases:  # a public base documents its own (a subclass may point to it)
            if isinstance(base, ast.Name) and base.id in classes and base.id.startswith("_"):
                args += arguments(classes[base.id], classes, own=False)
        return args

    root = Path(__file__).resolve().parents[2] / "airflow_provider_cdc"
    missing = []
    for part in ("operators", "sensors", "hooks", "triggers"):
        paths = [p for p in sorted((root / part).glob("*.py")) if p.name != "__init__.py"]
        trees = {p: ast.parse(p.read_text()) for p in paths}
        # a base class may live in another module of the part (spark_submit._CdcJobOperator)
        known = {c.name: c for t in trees.values() for c in t.body if isinstance(c, ast.ClassDef)}
        for path in paths:
            classes = {c.name: c for c in trees[path].body if isinstance(c, ast.ClassDef)}

            for cls in classes.values():
                if cls.name.startswith("_"):
                    continue
                doc = ast.get_docstring(cls) or ""
                for a in dict.fromkeys(a.arg for a in arguments(cls, known)):
                    if f":param {a}:" not in doc:
                        missing.append(f"{path.name} {cls.name}({a})")
    assert not missing, "arguments without a :param line: " + ", ".join(missing)
