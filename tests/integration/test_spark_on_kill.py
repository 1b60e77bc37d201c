"""The graceful path of "killing a task kills its work": ``on_kill`` of the merge/apply
operators (what a task's SIGTERM runs) ends the spark-submit it started and returns only
once that JVM is gone; the job's Python driver, bound to the JVM as the jobs bind it,
follows. A real spark-submit through the operator's own execute path."""

from __future__ import annotations

import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from airflow_provider_cdc.operators.spark_jobs import ChangelogApplyOperator

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux /proc and PR_SET_PDEATHSIG")


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _wait_until(cond, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out after {timeout:.0f} s waiting for {what}"
        time.sleep(0.2)


def test_on_kill_ends_the_spark_submit_and_waits_for_it(tmp_path):
    pidfile = tmp_path / "driver.pid"
    app = tmp_path / "sleeper.py"
    app.write_text(textwrap.dedent(f"""
        import os, time
        from airflow_provider_cdc.pipeline.spark.common import die_with_parent
        die_with_parent()  # as the merge and apply jobs do under spark-submit
        open({str(pidfile)!r} + ".tmp", "w").write(str(os.getpid()))
        os.replace({str(pidfile)!r} + ".tmp", {str(pidfile)!r})
        time.sleep(600)
    """))
    op = ChangelogApplyOperator(task_id="apply", data_dir=str(tmp_path), source="s", local_max_rows=0,
                                conf={"spark.ui.enabled": "false"})
    op.application = str(app)  # the operator's own submit path, a stand-in application
    ended = []
    t = threading.Thread(target=lambda: ended.append(_run(op)), daemon=True)
    t.start()
    _wait_until(lambda: pidfile.exists() or not t.is_alive(), 120, "the Spark application to start")
    assert pidfile.exists(), f"spark-submit ended early: {ended}"
    jvm, driver = op._hook._submit_sp.pid, int(pidfile.read_text())
    assert _alive(jvm) and _alive(driver)

    op.on_kill()
    # on_kill returned: the JVM is gone already, and reaped (the hook alone only signals it)
    assert not _alive(jvm) and op._hook._submit_sp.returncode is not None
    _wait_until(lambda: not _alive(driver), 30, f"the Python driver (pid {driver}) to exit")
    t.join(timeout=30)
    assert ended and isinstance(ended[0], Exception)  # the submit saw its application killed


def _run(op):
    try:
        return op.spark_submit({}, [])
    except Exception as exc:  # noqa: BLE001 - the test inspects it
        return exc
