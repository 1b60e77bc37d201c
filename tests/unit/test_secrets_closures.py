"""Secrets never travel in Spark task closures, and storage settings handed over explicitly
never reach ``os.environ`` (issue 31, "Secrets out of sight"): what the driver ships to its
executors holds the storage's endpoint and region, never a key, and a PostgreSQL sink is
shipped without its password."""

from __future__ import annotations

import asyncio
import os

import pytest
from pyspark import cloudpickle

from airflow_provider_cdc import storage
from airflow_provider_cdc.core.errors import ConfigurationError
from airflow_provider_cdc.pipeline.spark import distributed
from airflow_provider_cdc.sinks.mirror_postgres import MirrorPostgresSink, public_dsn

KEY, SECRET, TOKEN = "AKIA-unit-key-31", "unit-secret-key-31", "unit-session-token-31"
GIVEN = {"AWS_ACCESS_KEY_ID": KEY, "AWS_SECRET_ACCESS_KEY": SECRET, "AWS_SESSION_TOKEN": TOKEN,
         "AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_REGION": "eu-west-3"}


@pytest.fixture
def clean_storage(monkeypatch):
    for k in storage.STORAGE_ENV:
        monkeypatch.delenv(k, raising=False)
    storage.use_settings(None)  # an earlier test of this process may have handed settings over
    yield
    storage.use_settings(None)


def _produce(unit):
    return []


def _then(events):
    return iter(())


@pytest.mark.parametrize("where", ["environment", "process"])
def test_the_closure_shipped_to_executors_holds_no_credential(clean_storage, monkeypatch, where):
    if where == "environment":
        for k, v in GIVEN.items():
            monkeypatch.setenv(k, v)
    else:
        storage.use_settings(GIVEN)
    shipped = storage.executor_settings()
    assert shipped == {"AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_REGION": "eu-west-3"}
    blob = cloudpickle.dumps(distributed._on_executors([("unit", 1)], _produce, _then))
    assert b"eu-west-3" in blob  # the settings are in it ...
    for secret in (KEY, SECRET, TOKEN):
        assert secret.encode() not in blob  # ... and no credential


def test_a_postgres_sink_is_shipped_without_its_password(tmp_path):
    sink = MirrorPostgresSink("postgresql://mirror:pg-unit-password-31@db.example:5433/lake?sslmode=require",
                              str(tmp_path), "src", target_schema="t")
    blob = cloudpickle.dumps(sink)
    assert b"pg-unit-password-31" not in blob
    shipped = cloudpickle.loads(blob)
    assert shipped.params == {"user": "mirror", "host": "db.example", "port": "5433", "dbname": "lake",
                              "sslmode": "require"}
    assert sink.params["password"] == "pg-unit-password-31"  # the driver's own sink keeps it


def test_a_command_line_connection_with_a_password_is_refused():
    with pytest.raises(ConfigurationError, match="password.*PGPASSFILE"):
        public_dsn({"host": "h", "password": "x"})


def test_scoped_settings_stay_in_their_task_and_out_of_os_environ(clean_storage):
    """Two triggers polling at once in one triggerer, each with its own connection: each sees
    its own credentials, never the other's, and the process environment stays as it was."""
    before = dict(os.environ)
    seen = {}

    def poll(name):
        seen[name] = storage.settings().get("AWS_SECRET_ACCESS_KEY")

    async def trigger(name):
        for _ in range(3):
            with storage.scoped_settings({**GIVEN, "AWS_SECRET_ACCESS_KEY": f"secret-of-{name}"}):
                await asyncio.to_thread(poll, name)
            await asyncio.sleep(0)

    async def both():
        await asyncio.gather(trigger("a"), trigger("b"))

    asyncio.run(both())
    assert seen == {"a": "secret-of-a", "b": "secret-of-b"}
    assert dict(os.environ) == before
    assert storage.settings() == {}


def test_credentials_never_mix_across_identities(clean_storage, monkeypatch):
    """A connection's key never pairs with the environment's token (the triggerer's old
    os.environ.update let one source's keys pair with another's session token)."""
    monkeypatch.setenv("AWS_SESSION_TOKEN", "the-hosts-token")
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    with storage.scoped_settings({"AWS_ACCESS_KEY_ID": KEY, "AWS_SECRET_ACCESS_KEY": SECRET}):
        got = storage.settings()
    assert got == {"AWS_ACCESS_KEY_ID": KEY, "AWS_SECRET_ACCESS_KEY": SECRET, "AWS_REGION": "us-east-1"}
    with storage.scoped_settings({"AWS_ENDPOINT_URL": "http://x"}):  # no credentials given: the host's
        assert storage.settings()["AWS_SESSION_TOKEN"] == "the-hosts-token"
