"""`make test`: the whole suite as two pytest sessions side by side, then the 30 slowest tests.

Why two: on the 2-core machines CI runs on, one session left the CPU about 40% idle (Airflow's
polling, the deployment's scheduler, database round trips), and the run took 85-95 minutes of
CI's 90. The suite is split by folders and modules into two streams that share nothing they
could trip each other on:

- each has its own Airflow metadata database (stream 2 a copy of the one setup.sh migrated: SQLite
  takes one writer), its own pytest temporary folder (/tmp/cdc-test-stream-N, short for the
  private servers' sockets), its own S3 server and Spark cluster (session fixtures, free ports);
- the shared database servers see only each test's own tables, slots and roles (unique names);
- no test changes a setting of a shared server: the ones that need max_slot_wal_keep_size set
  (integration/test_log_retention) start a server of their own, as the failover tests do.

Stream 2 runs STREAM_2: the deployment tier (its own deployment and Airflow home), then the
integration and unit tiers and one e2e module; stream 1 runs the rest (the e2e tier).
``CDC_TEST_STREAMS=1`` runs one session, as before. Each stream's output goes to
.cdc-local/test-stream-N.log; stream 1's is printed live, stream 2's after it ends. The exit
status is the first failing stream's.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOCAL = ROOT / ".cdc-local"

#: what stream 2 runs (paths under tests/); stream 1 runs the rest, the e2e tier. Chosen from the
#: tiers' times side by side (2026-11-30, `CI=true make test`: stream 1, e2e, 2,639 s; stream 2,
#: deployment + integration + unit, 2,366 s): the e2e tier's object-storage module (139 s) runs in
#: stream 2 so that both end together.
STREAM_2 = ("deployment", "integration", "unit", "e2e/test_object_storage.py")


def _airflow_home_copy(env: dict) -> dict:
    """Stream 2's environment: a copy of the migrated metadata database (SQLite takes one writer)."""
    src = Path(env.get("AIRFLOW_HOME", LOCAL / "airflow"))
    dst = LOCAL / "airflow-stream-2"
    shutil.rmtree(dst, ignore_errors=True)
    dst.mkdir(parents=True)
    for name in ("airflow.cfg", "airflow.db", "webserver_config.py"):
        if (src / name).exists():
            shutil.copy2(src / name, dst / name)
    return {
        **env,
        "AIRFLOW_HOME": str(dst),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{dst / 'airflow.db'}",
    }


#: the consumer tier's own virtualenvs (PyFlink, the Delta readers), about a minute of pip on a new
#: checkout: built in the background while the streams start (their first minutes leave a core
#: idle: the deployment's start, the first DAG parses), not inside a test in the middle of the run.
#: The scripts take a lock, so the tests' own call waits for a build in progress, then finds it done.
WARM_UP = ("flink_env.sh", "delta_readers_env.sh")


def _warm_up(args: list[str]) -> list[subprocess.Popen]:
    """Start WARM_UP unless the run picks its tests (-k, -m, a path): it may not need them."""
    if any(a in ("-k", "-m") or a.startswith(("-k", "-m", "tests")) for a in args):
        return []
    log = open(LOCAL / "consumer-venvs.log", "w")  # noqa: SIM115 - kept open for the children
    return [subprocess.Popen([str(ROOT / "scripts" / s)], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=log)
            for s in WARM_UP]


def _slowest(xml_files: list[Path], n: int = 30) -> list[tuple[float, str]]:
    cases = []
    for f in xml_files:
        if not f.exists():
            continue
        for case in ET.parse(f).iter("testcase"):
            name = f"{case.get('classname', '')}::{case.get('name')}"
            cases.append((float(case.get("time") or 0), name))
    return sorted(cases, reverse=True)[:n]


def _failures(xml_files: list[Path], lines: int = 30) -> list[tuple[str, str]]:
    """Each failed or erred test with the end of its report, for the run's last screen: CI shows a
    run's head and tail, and stream 2's tracebacks are printed in the middle."""
    found = []
    for f in xml_files:
        if not f.exists():
            continue
        for case in ET.parse(f).iter("testcase"):
            for bad in (*case.findall("failure"), *case.findall("error")):
                text = (bad.text or bad.get("message") or "").rstrip().splitlines()
                name = f"{case.get('classname', '')}::{case.get('name')} ({bad.tag})"
                found.append((name, "\n".join(text[-lines:])))
    return found


def main(argv: list[str]) -> int:
    args = list(argv)
    env = dict(os.environ)
    streams = int(env.get("CDC_TEST_STREAMS", "2"))
    started = time.time()
    LOCAL.mkdir(exist_ok=True)
    if streams < 2:
        return subprocess.call([sys.executable, "-m", "pytest", "tests", "--durations=30", *args], cwd=ROOT)
    second = [f"tests/{p}" for p in STREAM_2]
    xml = [LOCAL / f"test-stream-{i}.xml" for i in (1, 2)]
    logs = [LOCAL / f"test-stream-{i}.log" for i in (1, 2)]

    def session(i: int, paths: list[str]) -> list[str]:
        return [
            sys.executable,
            "-m",
            "pytest",
            "-o",
            "junit_family=xunit1",
            *args,
            *paths,
            f"--basetemp=/tmp/cdc-test-stream-{i}",
            f"--junitxml={xml[i - 1]}",
        ]

    cmd1 = session(1, ["tests", *(f"--ignore={p}" for p in second)])
    cmd2 = session(2, second)
    print(
        f"run_tests: two sessions side by side; stream 2 ({', '.join(STREAM_2)}) logs to {logs[1]}",
        flush=True,
    )
    warming = _warm_up(args)
    with open(logs[1], "w") as log2:
        p2 = subprocess.Popen(
            cmd2, cwd=ROOT, env=_airflow_home_copy(env), stdout=log2, stderr=subprocess.STDOUT
        )
        with open(logs[0], "w") as log1:
            p1 = subprocess.Popen(
                cmd1,
                cwd=ROOT,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                bufsize=1,
            )
            for line in p1.stdout:  # live, and kept
                sys.stdout.write(line)
                log1.write(line)
            rc1 = p1.wait()
        rc2 = p2.wait()
    for w in warming:
        w.wait()
    print(f"\n===== stream 2 ({logs[1]}) =====", flush=True)
    sys.stdout.write(logs[1].read_text(errors="replace"))
    print("\n===== the 30 slowest tests of both streams (setup, call and teardown) =====")
    for seconds, name in _slowest(xml):
        print(f"{seconds:8.1f}s {name}")
    failed = _failures(xml)
    if failed:
        whole = f"whole ones in {logs[0].name} / {logs[1].name}"
        print(f"\n===== {len(failed)} failed: the end of each report ({whole}) =====")
        for name, text in failed:
            print(f"--- {name}\n{text}")
    print(
        f"run_tests: stream 1 exit {rc1}, stream 2 exit {rc2}; {time.time() - started:.0f} s in all",
        flush=True,
    )
    # 5: "no tests collected", a stream that PYTEST_ARGS (-k, -m) left empty
    return next((rc for rc in (rc1, rc2) if rc not in (0, 5)), 0 if 0 in (rc1, rc2) else 5)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
