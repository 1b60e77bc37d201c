"""Killing a task kills its Spark work: a merge/apply task killed with ``kill -9`` (no
``on_kill`` runs) must not leave its spark-submit JVM or its Python driver writing beside
the retry. A real spark-submit, started by our operators' hook from a stand-in task
process that is then SIGKILLed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux only")


def _pids_with(marker: str) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if marker in cmd and int(d.name) != os.getpid():
            out.append(int(d.name))
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_kill_9_of_the_task_ends_its_spark_submit_and_driver(tmp_path):
    marker = f"cdc_kill_probe_{uuid.uuid4().hex[:8]}"
    app = tmp_path / f"{marker}.py"
    running = tmp_path / "running"
    app.write_text(textwrap.dedent(f"""
        import time
        from airflow_provider_cdc.pipeline.spark.common import die_with_parent
        die_with_parent()  # as the merge and apply jobs do under spark-submit
        open({str(running)!r}, "w").write("driver up")
        time.sleep(600)
    """))
    task = tmp_path / "task.py"
    task.write_text(textwrap.dedent(f"""
        from airflow_provider_cdc.operators.spark_jobs import ChangelogApplyOperator
        op = ChangelogApplyOperator(task_id="apply", data_dir={str(tmp_path)!r}, source="s", local_max_rows=0,
                                    conf={{"spark.ui.enabled": "false"}})
        op._get_hook().submit({str(app)!r})
    """))
    proc = subprocess.Popen([sys.executable, str(task)], start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not running.exists():
            assert proc.poll() is None, f"the stand-in task exited early ({proc.returncode})"
            assert time.monotonic() < deadline, "the Spark driver did not start within 120 s"
            time.sleep(0.2)
        spark = [p for p in _pids_with(marker) if p != proc.pid]
        assert spark, "no spark-submit / driver process found"
        os.kill(proc.pid, signal.SIGKILL)  # kill -9: no on_kill, no cleanup in the task
        proc.wait()
        deadline = time.monotonic() + 30
        while [p for p in spark if _alive(p)] and time.monotonic() < deadline:
            time.sleep(0.2)
        left = [p for p in spark if _alive(p)]
        assert not left, f"Spark processes outlived their killed task: {left}"
    finally:
        for p in _pids_with(marker):
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
