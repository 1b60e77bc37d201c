"""A table refreshed whole (snapshot-only; the way tables without a key reach the lake): a plain
Delta table at ``layout.refreshed_dir`` holding the source table's columns as the mirror types
them, nothing else. Each refresh is ONE commit that removes every file of the version before
and adds the files of one consistent read of the source table, so a reader (Spark, duckdb,
deltalake, polars, Trino) sees the old rows or the new ones, never half of a refresh, and time
travel shows each refresh as a version. Duplicate rows are kept as they are.

Fencing: a refresh claims an epoch (table property ``cdc.refresh_epoch``, a commit of its
own) before it reads; its commit is written put-if-absent as the next version and only while
the table's epoch is still its own, so a refresh that a newer one superseded (a zombie task,
a retry that overtook it) cannot publish: it discards its files instead. Replaced files stay
for the mirror's retention (readers of the version before keep working) and are vacuumed by
the next refresh. Design: docs/DESIGN.md, "Tables without a key".
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Sequence

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import DeltaTable
from deltalake.exceptions import CommitFailedError, TableNotFoundError

from .. import storage
from ..core import arrow_types as at
from ..core.errors import FencedError, StateError
from ..core.schema import TableSchema
from . import delta_log
from .mirror_table import commit_attempts, log_properties

log = logging.getLogger(__name__)

EPOCH_PROPERTY = "cdc.refresh_epoch"
#: what the last refresh read: rows, its snapshot's position mark and when it was published
ROWS_PROPERTY = "cdc.refresh_rows"
MARK_PROPERTY = "cdc.refresh_mark"
AT_PROPERTY = "cdc.refreshed_at"
ROW_GROUP_ROWS = 65_536


def table_schema(schema: TableSchema) -> pa.Schema:
    """The refreshed table's columns: the source's, typed as the mirror types them (the mirror's
    column checks included: no two names equal but for case)."""
    mirror = at.mirror_schema(schema)
    return pa.schema([mirror.field(c.name) for c in schema.columns])


def _open(uri: str) -> DeltaTable | None:
    try:
        return DeltaTable(uri, storage_options=storage.delta_storage_options(uri))
    except TableNotFoundError:
        return None


def claim(uri: str, schema: pa.Schema, retention_hours: float) -> int:
    """A new refresh epoch of the table at ``uri`` (created with ``schema`` when missing): every
    refresh that claimed before is fenced out of publishing from now on."""
    for _attempt in commit_attempts(f"refreshed table {uri}: an epoch"):
        dt = _open(uri)
        if dt is None:
            storage.makedirs(uri)
            try:
                DeltaTable.create(
                    uri,
                    schema,
                    mode="error",
                    configuration={
                        **log_properties(retention_hours),
                        # statistics are the package's (row counts): a value no Python date holds
                        # would make deltalake's reader fail on statistics of typed columns
                        "delta.dataSkippingNumIndexedCols": "0",
                        EPOCH_PROPERTY: "1",
                    },
                    raise_if_key_not_exists=False,
                    storage_options=storage.delta_storage_options(uri),
                )
                return 1
            except Exception:
                if _open(uri) is None:  # not another refresh's create: a real failure
                    raise
                continue  # created meanwhile by another refresh: claim on top of it
        # the claim is a commit of its own, put-if-absent as the next version: of two refreshes
        # claiming at once exactly one gets each epoch
        version = delta_log.latest_version(uri)
        state = delta_log.log_state(uri, version)
        have = dict((state.metadata or {}).get("configuration") or {})
        epoch = int(have.get(EPOCH_PROPERTY, "0")) + 1
        try:
            commit_actions(
                uri, version, state, {**have, EPOCH_PROPERTY: str(epoch)}, None, [], "SET TBLPROPERTIES"
            )
            return epoch
        except CommitFailedError:
            continue
    raise AssertionError("unreachable")


def commit_actions(
    uri: str,
    version: int,
    state: delta_log.LogState,
    configuration: dict[str, str],
    schema_string: str | None,
    actions: list[dict],
    operation: str,
) -> int:
    """Commit ``actions`` as version ``version + 1`` (put-if-absent: CommitFailedError when another
    writer took it), with a ``metaData`` action when the configuration or the schema change."""
    metadata = dict(state.metadata or {})
    have = dict(metadata.get("configuration") or {})
    head: list[dict] = [
        {
            "commitInfo": {
                "timestamp": int(time.time() * 1000),
                "operation": operation,
                "engineInfo": "airflow-provider-cdc refresh",
            }
        }
    ]
    if configuration != have or (schema_string and metadata.get("schemaString") != schema_string):
        metadata.update(configuration=configuration, partitionColumns=[])  # (the log reader turns [] into {})
        if schema_string:
            metadata["schemaString"] = schema_string
        head.append({"metaData": metadata})
    delta_log.write_commit(uri, version + 1, head + actions)
    delta_log.after_commit(uri, version + 1, configuration)
    return version + 1


def write_files(uri: str, schema: TableSchema, staged: Sequence[str]) -> list[dict]:
    """The staged chunk files of one read (storage/staged.py) as the table's data files, not
    visible until :func:`publish`: each file's typed images converted to the table's columns
    (:func:`table_schema`), row group by row group (memory holds one). Returns their ``add``
    actions. A value a column cannot hold raises ConfigurationError naming table and column."""
    want = table_schema(schema)
    adds = []
    for path in staged:
        sfs, sp = storage.filesystem(path)
        with sfs.open_input_file(sp) as f:
            rel, rows, size = _write_file(uri, schema, want, pq.ParquetFile(f), path)
        adds.append(
            {
                "path": rel,
                "partitionValues": {},
                "size": int(size),
                "modificationTime": int(time.time() * 1000),
                "dataChange": True,
                "stats": json.dumps({"numRecords": rows}),
            }
        )
    return adds


def _write_file(uri: str, schema: TableSchema, want: pa.Schema, src: pq.ParquetFile, path: str):
    """One staged file as one data file of the table: (its path in the table, rows, bytes)."""
    have, text = at.metadata_schema(src.schema_arrow.metadata)
    if have is None:
        raise StateError(f"table {schema.table}: the staged file {path} names no schema; refresh again")
    rel = f"part-{uuid.uuid4().hex}.parquet"
    fs, p = storage.filesystem(storage.join(uri, rel))
    rows = 0
    with pq.ParquetWriter(p, want, filesystem=fs) as out:
        for batch in src.iter_batches(batch_size=ROW_GROUP_ROWS, columns=["after"]):
            arrays = at.struct_columns(batch.column(0), have, text, schema)
            out.write_table(pa.Table.from_arrays(arrays, schema=want), row_group_size=ROW_GROUP_ROWS)
            rows += batch.num_rows
    return rel, rows, fs.get_file_info(p).size


def discard(uri: str, adds: Sequence[dict]) -> None:
    for a in adds:
        try:
            storage.delete(storage.join(uri, a["path"]))
        except FileNotFoundError:
            pass


def publish(uri: str, epoch: int, adds: Sequence[dict], want: pa.Schema, props: dict[str, str]) -> int:
    """Replace every file of the table by ``adds`` in one commit while ``epoch`` is still the
    table's (:class:`FencedError` otherwise, the files discarded); the table's columns become
    ``want`` in the same commit when they differ. Returns the version committed."""
    try:
        for _attempt in commit_attempts(f"refreshed table {uri}: the refresh"):
            version = delta_log.latest_version(uri)
            state = delta_log.log_state(uri, version)
            have = dict((state.metadata or {}).get("configuration") or {})
            if have.get(EPOCH_PROPERTY) != str(epoch):
                raise FencedError(
                    f"refreshed table {uri}: a newer refresh (epoch {have.get(EPOCH_PROPERTY)}) claimed it "
                    f"after this one (epoch {epoch}): this refresh publishes nothing"
                )
            now = int(time.time() * 1000)
            removes = [
                {
                    "remove": {
                        "path": path,
                        "deletionTimestamp": now,
                        "dataChange": True,
                        "extendedFileMetadata": True,
                        "partitionValues": add.get("partitionValues") or {},
                        "size": add.get("size", 0),
                    }
                }
                for path, add in state.adds.items()
            ]
            try:
                return commit_actions(
                    uri,
                    version,
                    state,
                    {**have, **props},
                    schema_string(want),
                    removes + [{"add": a} for a in adds],
                    "WRITE",
                )
            except CommitFailedError:
                continue
    except BaseException:
        discard(uri, adds)
        raise
    raise AssertionError("unreachable")


def schema_string(schema: pa.Schema) -> str:
    from deltalake import Schema

    return Schema.from_arrow(schema).to_json()


def vacuum(uri: str, retention_hours: float) -> int:
    """Remove files replaced more than ``retention_hours`` ago (readers of older versions are
    done by then); the number removed."""
    dt = _open(uri)
    if dt is None:
        return 0
    removed = dt.vacuum(
        retention_hours=max(0, int(retention_hours)), dry_run=False, enforce_retention_duration=False
    )
    return len(removed)


def last_refresh(uri: str) -> dict[str, str] | None:
    """What the last published refresh recorded (rows, mark, when), None before the first."""
    dt = _open(uri)
    if dt is None:
        return None
    props = dict(dt.metadata().configuration or {})
    if AT_PROPERTY not in props:
        return None
    return {k: props[k] for k in (ROWS_PROPERTY, MARK_PROPERTY, AT_PROPERTY) if k in props}
