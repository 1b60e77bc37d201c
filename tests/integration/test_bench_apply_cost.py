"""``python -m bench apply_cost`` at a tiny size: mirrors built in the compacted layout, one
apply round each in its own process, every changed key read back right, and the round's
bytes following the changes: the larger mirror's round writes no more than a few times the
smaller one's (bytes, not time)."""

from __future__ import annotations

import re

from bench import bench_apply_cost as b


def test_bench_apply_cost_runs_and_reads_every_change_back(capsys, tmp_path):
    rc = b.main(["--rows", "20000,200000", "--changes", "400", "--unit", "20000", "--keep", str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 0, out
    lines = [line for line in out.splitlines() if re.match(r"\s+[\d,]+ rows,\s+\d+ buckets: apply", line)]
    assert len(lines) == 2 and all(line.endswith("| 0 wrong") for line in lines), out
    assert "16 buckets" in lines[1], out  # 200,000 rows at a unit of 20,000: the roots split once
    mb = [float(re.search(r"([\d.]+) MB in", line).group(1)) for line in lines]
    assert mb[1] < 3 * mb[0], out  # ten times the table, not ten times the bytes
