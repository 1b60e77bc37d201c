"""The test suite's Spark JVMs: started in a third of the CPU time, for a suite that starts a
few hundred of them on two cores.

A Spark JVM of a test lives seconds and handles a few thousand rows: most of its CPU time is
the JIT's optimizing compiler (C2) and loading and verifying Spark's classes, not the job.
Measured on the CI machine's kind (2 cores, one spark-submit of a 20,000-row local job,
user+system CPU): 26-29 s with the JVM's defaults, 14-15 s with the client compiler alone and
the serial collector, 8.4-10 s with Spark's classes mapped from a class-data-sharing archive.

``python -m tools.spark_jvm DIR`` (`make test`) makes DIR/spark-classes.jsa once per Spark and
Java version: the classes a short local job loads, archived by the JVM at its exit
(``-XX:ArchiveClassesAtExit``). :func:`environment` gives the variables that make every Spark JVM
use it: the launcher's (``SPARK_LAUNCHER_OPTS``), the driver's of a spark-submit or of a session
in the process (``SPARK_SUBMIT_OPTS``) and a standalone cluster's daemons
(``SPARK_DAEMON_JAVA_OPTS``). Variables, not a ``SPARK_CONF_DIR``: that folder is on the JVM's
class path, and the JVM maps an archive only for the class path it was made with. A JVM that
cannot use the archive (another class path, another Java) runs without it, silently.

Only the test suite sets them (tests/conftest.py): the demo and the benchmarks run Spark as a
user's deployment would, and long jobs want the optimizing compiler.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

#: the client compiler only and the serial collector: a JVM of seconds on a 2-core machine
FAST_START = ("-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC")
ARCHIVE = "spark-classes.jsa"

#: the job whose classes the archive holds: a session, a Python-side DataFrame, Parquet both ways
_JOB = """
import sys
from pyspark.sql import SparkSession
s = SparkSession.builder.appName("cdc-spark-classes").getOrCreate()
df = s.range(0, 5000).selectExpr("id", "id % 7 AS g", "CAST(id AS STRING) AS v")
df.groupBy("g").count().collect()
df.write.mode("overwrite").parquet(sys.argv[1])
s.read.parquet(sys.argv[1]).where("g = 3").count()
s.stop()
"""


def _version_stamp() -> str:
    """What the archive was made for: pyspark's version and place (its jars are the class path)
    and Java's version. Another of any needs a new archive."""
    import pyspark

    java = subprocess.run([shutil.which("java") or "java", "-version"], capture_output=True, text=True, check=False)
    first = (java.stderr or java.stdout).partition("\n")[0]
    return f"pyspark {pyspark.__version__} at {Path(pyspark.__file__).parent}; {first}"


def environment(folder: Path) -> dict[str, str]:
    """The variables that start Spark's JVMs with FAST_START and the archive in ``folder`` (an
    archive not made yet is skipped by the JVM): set only where they are not set already."""
    opts = " ".join((*FAST_START, f"-XX:SharedArchiveFile={folder / ARCHIVE}", "-Xshare:auto"))
    return {"SPARK_LAUNCHER_OPTS": " ".join(FAST_START), "SPARK_SUBMIT_OPTS": opts, "SPARK_DAEMON_JAVA_OPTS": opts}


def make_archive(folder: Path) -> bool:
    """Run _JOB once with the archive written at its exit; True when the archive exists after."""
    stamp = folder / f"{ARCHIVE}.version"
    want = _version_stamp()
    if (folder / ARCHIVE).exists() and stamp.exists() and stamp.read_text() == want:
        return True
    (folder / ARCHIVE).unlink(missing_ok=True)
    submit = shutil.which("spark-submit")
    if submit is None:
        print("spark_jvm: spark-submit is not on PATH; no class archive (Spark JVMs start slower)", file=sys.stderr)
        return False
    print(f"spark_jvm: archiving Spark's classes for the test suite's JVMs in {folder / ARCHIVE} (once, ~30 s)",
          file=sys.stderr)
    with tempfile.TemporaryDirectory(prefix="cdc-spark-classes-") as tmp:
        job = Path(tmp) / "job.py"
        job.write_text(_JOB)
        # the class path of the tests' JVMs: no SPARK_CONF_DIR (see the module's docstring)
        env = {k: v for k, v in os.environ.items() if k != "SPARK_CONF_DIR"}
        env.update(environment(folder), SPARK_SUBMIT_OPTS=" ".join((*FAST_START, f"-XX:ArchiveClassesAtExit={folder / ARCHIVE}")))
        proc = subprocess.run(
            [submit, "--master", "local[2]", str(job), str(Path(tmp) / "out")],
            env=env, capture_output=True, text=True, timeout=600, check=False,
        )
    if proc.returncode != 0 or not (folder / ARCHIVE).exists():
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-20:])
        print(f"spark_jvm: the class archive was not made (exit {proc.returncode}); Spark JVMs start slower\n{tail}",
              file=sys.stderr)
        return False
    stamp.write_text(want)
    return True


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m tools.spark_jvm FOLDER (where the class archive goes)", file=sys.stderr)
        return 2
    folder = Path(argv[0]).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    make_archive(folder)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
