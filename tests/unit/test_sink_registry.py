"""The sink registry (sinks/registry.py): one place, by name; build_sinks uses it."""

from __future__ import annotations

import pytest

from airflow_provider_cdc.core.errors import ConfigurationError
from airflow_provider_cdc.pipeline.spark.common import build_sinks
from airflow_provider_cdc.sinks import registry
from airflow_provider_cdc.sinks.base import DRIVER, Sink

pytestmark = pytest.mark.unit


class Nothing(Sink):
    name = "nothing_unit"

    def __init__(self, context):
        self.context = context

    def write(self, events) -> None:
        pass


def test_the_package_sinks_are_registered_by_name():
    assert registry.names()[:3] == ["events", "mirror", "postgres"]
    assert registry.entry("mirror").claims_fence and not registry.entry("events").claims_fence


def test_a_registered_sink_is_built_by_name_and_an_unknown_name_is_refused(tmp_path):
    registry.register(Nothing.name, Nothing)
    try:
        with pytest.raises(ConfigurationError, match="registered already"):
            registry.register(Nothing.name, Nothing)
        (sink,) = build_sinks(Nothing.name, data_dir=str(tmp_path), source="s", database="db", require_schema=True)
        assert isinstance(sink, Nothing) and sink.placement == DRIVER and not sink.needs_truncates
        assert (sink.context.data_dir, sink.context.source, sink.context.database) == (str(tmp_path), "s", "db")
        assert sink.context.require_schema and sink.context.fence is None
    finally:
        registry.unregister(Nothing.name)
    with pytest.raises(ConfigurationError, match=r"unknown sink 'nothing_unit' in --sinks; known: events, mirror"):
        build_sinks(Nothing.name, data_dir=str(tmp_path), source="s", database=None, require_schema=False)


def test_the_postgres_sink_without_a_target_is_refused_by_its_factory(tmp_path):
    with pytest.raises(ConfigurationError, match="CDC_POSTGRES_SINK_CONN_ID"):
        build_sinks("events,postgres", data_dir=str(tmp_path), source="s", database=None, require_schema=False)


def test_the_sinks_under_the_data_location_are_the_registrys_word_not_a_list_of_names():
    """Lineage, status and the apply task ask the registry which sinks write under the data
    location (the postgres sink writes a database): a new location sink is one register()."""
    assert registry.location_sinks() == ["events", "mirror"]
    assert registry.location_sinks(["postgres", "mirror", "events", "unknown"]) == ["mirror", "events"]
    registry.register(Nothing.name, Nothing, in_data_location=True)
    try:
        assert registry.location_sinks([Nothing.name, "postgres"]) == [Nothing.name]
        assert Nothing.name in registry.location_sinks()
    finally:
        registry.unregister(Nothing.name)


def test_what_a_sink_can_hold_stop_and_maintain_is_its_entrys_word(tmp_path):
    """The snapshot's plan, the apply and the maintenance task ask the registry, not a sink's
    name: a sink brings its schema check, whether it stops tables on a schema change, and its
    background maintenance with its register()."""
    from airflow_provider_cdc.core.schema import Column, TableName, TableSchema

    clashing = TableSchema(TableName("public", "t"), (Column("id", "int64"), Column("ID", "int64")), ("id",))
    with pytest.raises(ConfigurationError, match="differ only in case"):
        registry.check_schema(["events", "mirror"], clashing)
    registry.check_schema(["events", "postgres"], clashing)  # they hold it
    assert registry.table_stopping(["events", "mirror", "postgres"]) == ["mirror"]
    done = []

    def refuse(schema):
        raise ConfigurationError(f"{Nothing.name} cannot hold {schema.table}")

    registry.register(Nothing.name, Nothing, check_schema=refuse, stops_tables=True,
                      maintain=lambda d, s: done.append((d, s)))
    try:
        with pytest.raises(ConfigurationError, match="nothing_unit cannot hold public.t"):
            registry.check_schema(["events", Nothing.name], clashing)
        assert registry.table_stopping([Nothing.name, "events"]) == [Nothing.name]
        registry.maintain(["postgres", Nothing.name], str(tmp_path), "s")
        assert done == [(str(tmp_path), "s")]
    finally:
        registry.unregister(Nothing.name)


def test_a_sinks_own_options_come_from_its_entry_from_settings_to_a_job_and_back(tmp_path):
    """The 'postgres' sink's target is its own (sinks/postgres_target.py): resolved from the
    task's settings in the worker, handed to a spark-submit without its password (a 0600
    passfile), read back by the job; the operators and build_sinks know no sink by name."""
    import argparse
    import os
    import stat

    settings = {"postgres_sink_conn_id": "pg_target", "postgres_sink_schema": "lake"}
    asked = []

    def connection(conn_id):
        asked.append(conn_id)
        return {"host": "db", "port": "5432", "dbname": "d", "user": "u", "password": "p:w"}

    options = registry.resolve_options(["events", "mirror", "postgres"], settings.get, connection)
    assert list(options) == ["postgres"] and asked == ["pg_target"]
    assert options["postgres"]["pg_uri"]["password"] == "p:w" and options["postgres"]["pg_schema"] == "lake"
    with pytest.raises(ConfigurationError, match="CDC_POSTGRES_SINK_CONN_ID"):
        registry.resolve_options(["postgres"], {}.get, connection)

    args = registry.job_arguments(options, str(tmp_path))
    assert "p:w" not in " ".join(args)  # a command line is public
    passfile = tmp_path / "pgpass"
    assert stat.S_IMODE(os.stat(passfile).st_mode) == 0o600 and passfile.read_text() == "*:*:*:*:p\\:w\n"
    assert f"passfile='{passfile}'" in args[args.index("--pg-uri") + 1]

    parser = argparse.ArgumentParser()
    parser.add_argument("--sinks")
    registry.add_job_arguments(parser)
    back = registry.options_from_job(["mirror", "postgres"], parser.parse_args(["--sinks", "postgres", *args]))
    assert back == {"postgres": {"pg_uri": args[args.index("--pg-uri") + 1], "pg_schema": "lake"}}
    with pytest.raises(ConfigurationError, match="visible to every user"):
        registry.options_from_job(["postgres"], parser.parse_args(["--pg-uri", "host=db password=x"]))


def test_a_snapshot_s_convergence_and_upkeep_are_each_sinks_word():
    """What a finished snapshot does to a sink's rows (convergence: rows older than the mark that
    no chunk re-emitted; upkeep: the mirror folds its tombstones) is registered with the sink:
    the snapshot controller names no sink, and a sink without the hooks is left alone."""
    from airflow_provider_cdc.core.schema import TableName

    calls = []
    registry.register(
        Nothing.name, Nothing,
        converge=lambda d, s, t, at, **kw: calls.append(("converge", t.id, at, kw)) or 3,
        after_snapshot=lambda d, s, t, **kw: calls.append(("after", t.id, kw)),
    )
    try:
        t = TableName("s", "t")
        assert registry.converge([Nothing.name, "events"], "/d", "src", t, "p1", reason="r", within=None) == 3
        registry.after_snapshot([Nothing.name, "events"], "/d", "src", t, budget_rows=5, retention_hours=1.0)
        assert calls == [
            ("converge", "s.t", "p1", {"reason": "r", "within": None}),
            ("after", "s.t", {"budget_rows": 5, "retention_hours": 1.0}),
        ]
        assert registry.entry("mirror").converge is not None and registry.entry("events").converge is None
    finally:
        registry.unregister(Nothing.name)


def test_sinks_write_a_group_side_by_side_and_a_failure_is_raised_once_every_sink_finished():
    """write_to_sinks runs the sinks at once (a barrier both must reach: one after the other, it
    breaks); a sink that fails does not cut the other's write short, and its error is raised
    only after that write finished (a retry then replays the group into both, I3)."""
    import threading

    from airflow_provider_cdc.sinks.base import write_to_sinks

    both = threading.Barrier(2, timeout=10)
    finished = []

    class Failing(Nothing):
        def write(self, events) -> None:
            both.wait()
            raise RuntimeError("the events sink failed")

    class Slow(Nothing):
        def write(self, events) -> None:
            both.wait()
            finished.append(threading.current_thread().name)

    with pytest.raises(RuntimeError, match="the events sink failed"):
        write_to_sinks([Failing(None), Slow(None)], [])
    assert len(finished) == 1 and finished[0].startswith("sink")

    class Alone(Nothing):
        def write(self, events) -> None:
            finished.append(threading.current_thread().name)

    write_to_sinks([Alone(None)], [])  # one sink: written in the caller's thread
    assert finished[1] == threading.current_thread().name
