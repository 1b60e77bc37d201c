"""Shuffle partitions of the Spark jobs: 2 per core, and enough that a partition holds about
SHUFFLE_PARTITION_ROWS rows (a 5,000,000-row round in 4 partitions ran out of heap)."""

import pytest

from airflow_provider_cdc.pipeline.spark.common import SHUFFLE_PARTITION_ROWS, shuffle_partitions_for

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("cores", "rows", "expected"),
    [
        (2, None, 4),  # apply: input size unknown -> per core
        (2, 1_000, 4),  # a small round: per core (not Spark's 200)
        (2, 500_000, 5),
        (2, 5_000_000, 50),  # the round that ran out of heap with 4
        (64, 5_000_000, 128),  # a cluster: its cores decide
        (0, 0, 2),
    ],
)
def test_shuffle_partitions_for(cores, rows, expected):
    assert shuffle_partitions_for(cores, rows) == expected


def test_a_partition_never_holds_much_more_than_the_bound():
    for rows in (1, 99_999, 100_001, 3_333_333, 12_345_678):
        assert rows / shuffle_partitions_for(2, rows) <= SHUFFLE_PARTITION_ROWS
