"""The refreshed table's writer (sinks/refreshed.py) on local disk and on a real S3 HTTP server:
epochs are claimed by put-if-absent commits (of two claims read at one version, one fails), a
refresh whose epoch was superseded cannot publish, and every published version reads, by
deltalake, as exactly the files of one refresh."""

from __future__ import annotations

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from deltalake.exceptions import CommitFailedError

from airflow_provider_cdc import storage
from airflow_provider_cdc.core.errors import FencedError
from airflow_provider_cdc.sinks import delta_log, refreshed

SCHEMA = pa.schema([("grp", pa.int64()), ("pad", pa.string())])


@pytest.fixture(params=["local", "s3"])
def uri(request, tmp_path, monkeypatch):
    if request.param == "local":
        return str(tmp_path / "refreshed" / "public.t")
    s3 = request.getfixturevalue("s3_server")
    for k, v in s3["env"].items():
        monkeypatch.setenv(k, v)
    return f"s3://{s3['bucket']}/r-{tmp_path.name}/public.t"


def _files(uri: str, rows: list[tuple]) -> list[dict]:
    """A data file of ``rows`` as a refresh writes it (not visible until published)."""
    import json
    import uuid

    import pyarrow.parquet as pq

    name = f"part-{uuid.uuid4().hex}.parquet"
    with storage.atomic_output(storage.join(uri, name)) as (fs, tmp):
        pq.write_table(pa.Table.from_pylist([dict(zip(SCHEMA.names, r, strict=True)) for r in rows], SCHEMA),
                       tmp, filesystem=fs)
    fs, path = storage.filesystem(storage.join(uri, name))
    return [{"path": name, "partitionValues": {}, "size": fs.get_file_info(path).size,
             "modificationTime": 0, "dataChange": True, "stats": json.dumps({"numRecords": len(rows)})}]


def _read(uri: str, version: int | None = None) -> list[tuple]:
    dt = DeltaTable(uri, version=version, storage_options=storage.delta_storage_options(uri))
    t = dt.to_pyarrow_table()
    return sorted(zip(t["grp"].to_pylist(), t["pad"].to_pylist(), strict=True))


def test_claims_are_unique_and_a_superseded_refresh_cannot_publish(uri):
    first = refreshed.claim(uri, SCHEMA, 1.0)
    assert first == 1
    v1 = refreshed.publish(uri, first, _files(uri, [(1, "a"), (1, "a")]), SCHEMA, {refreshed.ROWS_PROPERTY: "2"})
    assert _read(uri) == [(1, "a"), (1, "a")]
    # two claims that read the same version: the commit is put-if-absent, the second one fails
    version = delta_log.latest_version(uri)
    state = delta_log.log_state(uri, version)
    have = dict(state.metadata["configuration"])
    refreshed.commit_actions(uri, version, state, {**have, refreshed.EPOCH_PROPERTY: "2"}, None, [], "SET TBLPROPERTIES")
    with pytest.raises(CommitFailedError):
        refreshed.commit_actions(uri, version, state, {**have, refreshed.EPOCH_PROPERTY: "2"}, None, [], "SET TBLPROPERTIES")
    third = refreshed.claim(uri, SCHEMA, 1.0)
    assert third == 3
    stale = _files(uri, [(9, "stale")])
    with pytest.raises(FencedError, match="newer refresh"):
        refreshed.publish(uri, 2, stale, SCHEMA, {})
    assert not storage.exists(storage.join(uri, stale[0]["path"]))  # discarded
    # a new column in the same commit as the new files; the version before still reads as it was
    wider = pa.schema([*SCHEMA, ("extra", pa.int32())])
    done = {refreshed.ROWS_PROPERTY: "1", refreshed.AT_PROPERTY: "2026-11-29T08:00:00+00:00"}
    v3 = refreshed.publish(uri, third, _files(uri, [(2, "b")]), wider, done)
    assert v3 > v1 and _read(uri) == [(2, "b")] and _read(uri, v1) == [(1, "a"), (1, "a")]
    assert refreshed.last_refresh(uri) == done
