"""The documentation site (docs/) builds with Sphinx with warnings as errors, and its
configuration reference, generated from settings.OPTIONS, names every setting."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


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
