"""The operators whose jobs run through spark-submit (or in the worker for small inputs), one
import for DAG authors: the snapshot's merges (snapshot_merge.py), the changelog's apply
(changelog_apply.py) and what they share, the spark-submit and its credentials (spark_submit.py).
"""

from .changelog_apply import ChangelogApplyOperator, emit_freshness, raise_schema_stops
from .snapshot_merge import SnapshotMergeOperator, SnapshotMergeWhileReadingOperator
from .spark_submit import local_max_rows_from_env, postgres_sink_params

__all__ = [
    "ChangelogApplyOperator",
    "SnapshotMergeOperator",
    "SnapshotMergeWhileReadingOperator",
    "emit_freshness",
    "local_max_rows_from_env",
    "postgres_sink_params",
    "raise_schema_stops",
]
