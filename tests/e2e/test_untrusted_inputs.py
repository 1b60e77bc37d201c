"""Variables, XCom and database errors as untrusted input (issue 46, invariant I15), on this
Airflow's real metadata database and, for the error, a real snapshot DAG run on PostgreSQL:

- a snapshot id read back from a Variable (``'../x'``) never becomes a path;
- a source name read back from a Variable (``'/etc'``, or any absolute folder) never becomes a
  path: ``status`` once read ``/etc/_applied/events.json`` for it;
- a data location with credentials in its URI is refused, saying where they go;
- a database error that carries row values (PostgreSQL's DETAIL) and a masked secret is stored
  in the snapshot's progress without either.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from airflow_provider_cdc import airflow_variables
from airflow_provider_cdc.core.errors import ConfigurationError
from airflow_provider_cdc.core.progress import SnapshotProgress
from airflow_provider_cdc.core.ranges import ChunkRange


@pytest.fixture
def variables_cleanup():
    from airflow.models.variable import Variable

    keys: list[str] = []
    yield keys
    for key in keys:
        Variable.delete(key)


def test_a_snapshot_id_from_a_variable_that_is_no_id_never_becomes_a_path(tmp_path, unique_name, variables_cleanup):
    from airflow.models.variable import Variable

    source, table = f"cdc_ui_{unique_name}", "public.orders"
    p = SnapshotProgress.start(source, "snap-1", {table: [ChunkRange()]}, now=1000.0)
    raw = json.loads(p.to_json())
    raw["snapshot_id"] = "../x"  # a Variable anyone may write
    key = airflow_variables.variable_key(source, table)
    variables_cleanup.append(key)
    Variable.set(key, json.dumps(raw))
    data = tmp_path / "data"
    assert airflow_variables.load(source, table, str(data)) is None  # the Variable is a copy, never read back
    assert not (data / "control").exists() and not (tmp_path / "x").exists()  # nothing written
    # status shows it as malformed, reading nothing for it
    from airflow_provider_cdc.status import list_progress, progress_summary

    Variable.set(key, json.dumps(raw))
    [(src, tid, progress)] = list_progress(source)
    assert (src, tid) == (source, table)
    summary = progress_summary(tid, progress, data_dir=str(data))
    assert summary["status"] == "malformed" and "is not a snapshot id" in summary["error"]


def test_a_source_name_from_a_variable_is_never_joined_into_a_path(tmp_path, unique_name, monkeypatch,
                                                                   variables_cleanup):
    """A folder outside the data location holds an ``_applied`` marker; a lag and a progress
    Variable name that folder as their source. Before, the page and ``status`` read the marker
    (``{data_dir}/output/{source}`` with an absolute source is that folder)."""
    from airflow.models.variable import Variable

    from airflow_provider_cdc.status import list_progress, overview

    outside = tmp_path / f"etc_{unique_name}"
    (outside / "_applied").mkdir(parents=True)
    (outside / "_applied" / "events.json").write_text(json.dumps({"position": "0" * 40, "readable": "SECRET/1"}))
    monkeypatch.setenv("CDC_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("CDC_SOURCE_CONN_ID", str(outside))  # even where the environment names it
    name = str(outside)
    lag = airflow_variables.lag_key(f"etc_{unique_name}")
    prog = airflow_variables.variable_key(f"etc_{unique_name}", "public.orders")
    variables_cleanup.extend([lag, prog])
    Variable.set(lag, json.dumps({"source": name, "bytes": 1, "seconds": 0.0, "at": 1.0, "history": []}))
    p = SnapshotProgress.start("placeholder", "snap-1", {"public.orders": [ChunkRange()]}, now=1.0)
    Variable.set(prog, json.dumps({**json.loads(p.to_json()), "source": name}))
    items = [i for i in list_progress() if i[1] == "public.orders" and i[0] != "placeholder"]
    mine = [i for i in items if "is not a source name" in str(i[2].get("malformed"))]
    assert mine and all(src != name for src, _t, _p in mine)  # attributed to its key's name, marked
    seen = [s for s in overview() if s["source"] in (name, f"etc_{unique_name}")]
    assert seen and all(not s["known"] and s["applied"] == {} for s in seen), seen
    assert "SECRET/1" not in json.dumps(overview())


def test_a_data_location_with_credentials_in_its_uri_is_refused(tmp_path):
    from airflow_provider_cdc.settings import load
    from airflow_provider_cdc.sources_config import parse_sources

    for uri in ("s3://k:s@b/", "s3://AKIAXXXX:wJalr/xyz@bucket/cdc", "gs://user@bucket/x",
                "abfss://key:secret@acct.dfs.core.windows.net/cdc", "abfss://lake@acct.dfs.core.windows.net/x@y",
                "abfss://lake@user:pw@acct.dfs.core.windows.net/cdc", "s3://lake@acct.dfs.core.windows.net/cdc"):
        with pytest.raises(ConfigurationError, match="holds credentials in the URI") as err:
            load({"CDC_DATA_DIR": uri})
        assert "CDC_STORAGE_CONN_ID" in str(err.value) and ":s@" not in str(err.value) and "wJalr" not in str(err.value)
    with pytest.raises(ConfigurationError, match="source 'shop', key 'data_dir'.*holds credentials in the URI"):
        parse_sources({"sources": {"shop": {"conn_id": "c", "tables": ["public.t"], "data_dir": "s3://k:s@b/"}}}, env={})
    assert load({"CDC_DATA_DIR": "s3://bucket/cdc"}).data_dir == "s3://bucket/cdc"
    # Azure names the container in the user part: its normal URIs are locations, not credentials
    for uri in ("abfss://lake@acct.dfs.core.windows.net/cdc", "abfs://raw-data@acct01.dfs.core.usgovcloudapi.net/"):
        assert load({"CDC_DATA_DIR": uri}).data_dir == uri


@pytest.mark.parametrize("pipeline", ["pg"], indirect=True)
def test_a_database_error_carrying_row_values_is_stored_without_them(pipeline, pg_uri, unique_name):
    """The chunk task fails for good with PostgreSQL's own error for a duplicate key (its DETAIL
    names the key's value) and a secret registered with Airflow's masker in its text (the fault
    is injected: a chunk read does not fail so on demand). The snapshot's progress (the register
    and its Variable, what the page and status show) keeps the error without either."""
    import psycopg2
    from airflow.models.variable import Variable
    from airflow.sdk.log import mask_secret

    from airflow_provider_cdc.pipeline import snapshot as snapshot_mod
    from tools import workload as w

    from .helpers import SNAPSHOT_CONF

    p = pipeline
    secret = f"tok-{unique_name}-s3cr3t"
    card = f"4111-{unique_name}"
    conn = w.connect(pg_uri)
    side = f"cards_{unique_name}"
    try:
        with conn.cursor() as cur:
            cur.execute(f'CREATE TABLE "{side}" (card text PRIMARY KEY)')
            cur.execute(f'INSERT INTO "{side}" VALUES (%s)', (card,))
        conn.commit()
        with pytest.raises(psycopg2.IntegrityError) as real:
            with conn.cursor() as cur:
                cur.execute(f'INSERT INTO "{side}" VALUES (%s)', (card,))
        conn.rollback()
        assert card in str(real.value)  # PostgreSQL's DETAIL: Key (card)=(4111-...) already exists.
        error = type(real.value)(f"{real.value}while holding {secret}")

        def failing_chunk(*_args, **_kwargs):
            mask_secret(secret)  # as Airflow does for a connection's password read in the task
            raise error

        p.mp.setattr(snapshot_mod, "snapshot_chunk", failing_chunk)
        p.run("cdc_snapshot", {"action": "start", "tables": [p.table.id], **SNAPSHOT_CONF}, expect="failed")
    finally:
        with conn.cursor() as cur:
            cur.execute(f'DROP TABLE IF EXISTS "{side}"')
        conn.commit()
        conn.close()
    stored = p.progress()
    assert str(stored.status) == "failed" and "duplicate key value violates unique constraint" in stored.error
    assert card not in stored.error and "row values dropped" in stored.error, stored.error
    assert secret not in stored.error and "***" in stored.error, stored.error
    published = Variable.get(airflow_variables.variable_key(p.source, p.table.id))
    assert card not in published and secret not in published
    assert Path(p.data_dir).exists()


def test_status_marks_what_it_cannot_use_and_what_the_scope_refuses(tmp_path, unique_name, monkeypatch, capsys,
                                                                      variables_cleanup):
    """``airflow cdc status`` reads the same Variables: a lag reading of the wrong type is said to
    be malformed (it was a crash), and a table outside its source's scope is said refused, with
    the scope's message, without reading its files."""
    from airflow.models.variable import Variable

    from airflow_provider_cdc import cli

    source = f"cdc_st_{unique_name}"
    monkeypatch.setenv("CDC_SOURCE_CONN_ID", source)
    monkeypatch.setenv("CDC_TABLES", "public.orders")
    monkeypatch.setenv("CDC_DATA_DIR", str(tmp_path / "data"))
    for table in ("public.orders", "public.secrets"):
        airflow_variables.publish(source, table, SnapshotProgress.start(source, "snap-1", {table: [ChunkRange()]}, now=1.0))
        variables_cleanup.append(airflow_variables.variable_key(source, table))
    variables_cleanup.append(airflow_variables.lag_key(source))
    Variable.set(airflow_variables.lag_key(source), json.dumps({"source": source, "bytes": "lots", "at": 1.0}))
    assert cli.run(["status", "--source", source]) == 1  # a malformed reading: not healthy, said
    out = capsys.readouterr().out
    assert "NOT HEALTHY (exit 1): lag reading of" in out, out
    [orders] = [ln for ln in out.splitlines() if ln.startswith(f"{source}:public.orders")]
    [secrets] = [ln for ln in out.splitlines() if ln.startswith(f"{source}:public.secrets")]
    assert "refused" not in orders
    assert "refused: table public.secrets is not captured by source" in secrets
    assert "MALFORMED: the capture lag reading has values of the wrong type: bytes" in out
