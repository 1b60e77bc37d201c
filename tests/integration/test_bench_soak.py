"""``python -m bench soak`` at a tiny size on the real PostgreSQL: rounds under a background
writer with staging retention, its report table, and a verify with 0 mismatched at the end."""

from __future__ import annotations

from bench import bench_soak as b


def test_bench_soak_runs_and_verifies_at_a_tiny_size(pg_uri, capsys):
    rc = b.main(["--uri", pg_uri, "--rounds", "6", "--report", "3,6", "--rows", "300", "--tps", "20",
                 "--horizon-seconds", "0"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "RESULT verify_ok=True mismatched=0" in out
    table = [line for line in out.splitlines() if line.startswith("| 3 |") or line.startswith("| 6 |")]
    assert len(table) == 2, out
