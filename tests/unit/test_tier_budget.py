"""The quick tier's budget per test (tests/conftest.py): a test over it that is not marked slow is
named at the end of the session, and with CDC_TIER_BUDGET_STRICT the session fails."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _session(folder: Path, strict: bool) -> subprocess.CompletedProcess:
    (folder / "test_timed.py").write_text(
        "import time\n\nimport pytest\n\n\n"
        "def test_over_the_budget():\n    time.sleep(0.6)\n\n\n"
        "@pytest.mark.slow\ndef test_marked_slow():\n    time.sleep(0.6)\n\n\n"
        "def test_quick():\n    pass\n"
    )
    env = {**os.environ, "CDC_QUICK_TEST_BUDGET_SECONDS": "0.3", "CDC_TIER_BUDGET_STRICT": "1" if strict else ""}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tests.conftest", "-p", "no:randomly", "-q", "-p", "no:cacheprovider",
         str(folder / "test_timed.py")],
        cwd=str(ROOT), env=env, capture_output=True, text=True, timeout=300,
    )


def test_a_quick_test_over_its_budget_is_named_and_fails_a_strict_session():
    import shutil
    import uuid

    folder = ROOT / ".cdc-local" / f"budget-{uuid.uuid4().hex[:8]}"  # (the conftest's marks need the checkout)
    folder.mkdir(parents=True)
    try:
        _check(folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _check(tmp_path: Path) -> None:
    lenient = _session(tmp_path, strict=False)
    assert lenient.returncode == 0, lenient.stdout + lenient.stderr
    named = [ln for ln in lenient.stdout.splitlines() if "not marked slow" in ln]
    assert len(named) == 1 and "test_over_the_budget" in named[0], lenient.stdout
    strict = _session(tmp_path, strict=True)
    assert strict.returncode == 1 and "CDC_TIER_BUDGET_STRICT" in strict.stdout, strict.stdout


def test_every_path_of_the_second_stream_exists():
    """`make test` runs STREAM_2's paths in a session of their own and the rest beside it: a path
    renamed away would leave its tests to the first stream silently, or fail the second's start."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("run_tests", ROOT / "scripts" / "run_tests.py")
    run_tests = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(run_tests)
    missing = [p for p in run_tests.STREAM_2 if not (ROOT / "tests" / p).exists()]
    assert run_tests.STREAM_2 and missing == []
