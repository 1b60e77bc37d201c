"""Names derived from source, table and run names never collide (issue 31): slot and
publication names, the capture lock, the snapshot Variable keys and the round files; and
the local publish is durable (its folder fsynced) before the capture confirms its offset."""

from __future__ import annotations

import itertools
import os

import pytest

from airflow_provider_cdc.dialects import get_dialect
from airflow_provider_cdc.dialects.base import ConnectionParams
from airflow_provider_cdc.dialects.postgres import SLOT_NAME_RE, default_object_name

pytestmark = pytest.mark.unit


# --- slot and publication names ------------------------------------------------------------
def test_folded_source_names_get_different_slots():
    assert default_object_name("orders-eu") != default_object_name("orders_eu")
    assert default_object_name("Orders") != default_object_name("orders")
    assert default_object_name("x" * 80) != default_object_name("x" * 81)  # cut short: the hash tells them apart


def test_a_valid_source_name_keeps_its_slot():
    """Existing deployments keep their slots: a name that is a valid slot name as it is stays."""
    for source in ("orders_eu", "cdc_source", "shop", "a1_b2", "x" * 59):
        assert default_object_name(source) == f"cdc_{source}"


def test_a_kept_name_never_equals_a_hashed_one():
    hashed = default_object_name("orders-eu")
    lookalike = hashed.removeprefix("cdc_")  # a source named like another's hashed slot
    assert default_object_name(lookalike) != hashed


def test_derived_names_are_valid_and_distinct():
    alphabet = ["a", "A", "_", "-", ".", "1", "é"]
    names = ["".join(p) for n in (1, 2, 3) for p in itertools.product(alphabet, repeat=n)] + ["x" * 100, "X" * 100]
    slots = [default_object_name(n) for n in names]
    assert all(SLOT_NAME_RE.match(s) for s in slots)
    assert len(set(slots)) == len(names)


# --- the capture lock ------------------------------------------------------------------------
def _pg(source: str, **options):
    return get_dialect(ConnectionParams("postgres"), source=source, **options)


def test_the_postgres_capture_lock_is_keyed_by_the_slot():
    """Two sources configured with one slot take one lock; another slot, another lock."""
    from airflow_provider_cdc.pipeline.locks import lock_key, lock_name

    a, b, c = _pg("a", slot_name="shared"), _pg("b", slot_name="shared"), _pg("c")
    assert lock_key(a, "/one") == lock_key(b, "/two")
    assert lock_key(a, "/one") != lock_key(c, "/one")
    assert lock_key(_pg("orders-eu"), "/d") != lock_key(_pg("orders_eu"), "/d")
    assert len(lock_name(lock_key(a, "/d") + "x" * 100)) <= 64  # MySQL's limit


def test_the_mysql_capture_lock_is_keyed_by_the_staged_offset():
    from airflow_provider_cdc.pipeline.locks import lock_key

    def my(source, **o):
        return get_dialect(ConnectionParams("mysql"), source=source, **o)

    assert lock_key(my("a", server_id=7), "/d") == lock_key(my("a", server_id=8), "/d")
    assert lock_key(my("a"), "/d") != lock_key(my("b"), "/d")
    assert lock_key(my("a"), "/d") != lock_key(my("a"), "/e")


def test_run_capture_takes_the_lock_of_the_slot_the_connection_names(monkeypatch):
    """The slot may be named in the connection's extra: the lock must be keyed by the
    slot the capture will confirm, not by the source's name."""
    from contextlib import contextmanager

    from airflow_provider_cdc.pipeline import capture

    taken = []

    @contextmanager
    def fake_lock(params, key, source=None):
        taken.append(key)
        yield False  # held elsewhere: run_capture returns before connecting

    class Hook:
        def __init__(self, source):
            self.source = source

        def connection_params(self):
            return ConnectionParams("postgres")

        def get_dialect(self):
            return _pg(self.source, slot_name="shared_slot")

    monkeypatch.setattr(capture, "capture_lock", fake_lock)
    assert capture.run_capture(Hook("a"), "/d") is None
    assert capture.run_capture(Hook("b"), "/d") is None
    assert taken[0] == taken[1] == "slot.shared_slot"


def test_the_postgres_lock_has_64_bits():
    from airflow_provider_cdc.dialects.postgres import PostgresDialect

    assert "hashtext" not in PostgresDialect.lock_acquire_sql  # 32 bits: unrelated slots could share a lock
    assert "%s" in PostgresDialect.lock_acquire_sql and "%s" in PostgresDialect.lock_release_sql


# --- snapshot Variable keys --------------------------------------------------------------------
def test_variable_keys_are_injective():
    from airflow_provider_cdc.airflow_variables import variable_key

    assert variable_key("a__b", "c.d") != variable_key("a", "b__c.d")
    assert len({variable_key("a_", "_b.c"), variable_key("a", "__b.c"), variable_key("a__", "b.c"),
                variable_key("a", "___b.c"), variable_key("a___", ".c")}) == 5
    parts = ["".join(p) for n in (1, 2, 3, 4) for p in itertools.product(["a", "_", "."], repeat=n)]
    keys = {(s, t): variable_key(s, t) for s in parts for t in parts}
    assert len(set(keys.values())) == len(keys)


def test_plain_names_keep_their_variable_key():
    from airflow_provider_cdc.airflow_variables import variable_key

    assert variable_key("src", "public.orders") == "cdc_snapshot__src__public.orders"
    assert variable_key("shop_pg", "s.t__x") == "cdc_snapshot__shop_pg__s.t__x"


# --- round files -------------------------------------------------------------------------------
def test_round_files_are_keyed_by_the_exact_run_id():
    from airflow_provider_cdc.storage.layout import live_round_path, round_path

    runs = ["x:1", "x+1", "x_1", "x 1", "x.live", "x", ".x", "_x", "manual__2024-01-01T00:00:00+00:00"]
    paths = [round_path("/d", "s", r) for r in runs]
    lives = [live_round_path(p) for p in paths]
    assert len(set(paths + lives)) == 2 * len(runs)
    assert all(not os.path.basename(p).startswith((".", "_")) for p in paths)  # never a hidden file


# --- durable publish ---------------------------------------------------------------------------
def test_a_local_publish_fsyncs_the_file_and_then_its_folder(tmp_path, monkeypatch):
    from airflow_provider_cdc import storage

    events: list[tuple[str, str]] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def replace(a, b):
        events.append(("replace", str(b)))
        real_replace(a, b)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    target = tmp_path / "staging" / "src" / "changelog" / "seg-1-2.parquet"  # folders made by the publish
    storage.write_bytes(str(target), b"segment")
    assert target.read_bytes() == b"segment"
    at = events.index(("replace", str(target)))
    assert events[at - 1][0] == "fsync" and events[at - 1][1].endswith(".tmp")  # the data first
    after = {path for kind, path in events[at + 1:] if kind == "fsync"}
    # the rename, and each folder the publish created, are durable in their parent folders
    assert {str(target.parent), str(target.parent.parent), str(tmp_path / "staging"), str(tmp_path)} <= after

    events.clear()
    storage.write_bytes(str(target.with_name("seg-3-4.parquet")), b"next")  # folder exists: that folder alone
    assert [p for k, p in events if k == "fsync"][1:] == [str(target.parent)]


def test_a_failed_publish_leaves_nothing(tmp_path):
    from airflow_provider_cdc import storage

    with pytest.raises(RuntimeError):
        with storage.atomic_output(str(tmp_path / "f.json")) as (fs, tmp):
            with fs.open_output_stream(tmp) as f:
                f.write(b"half")
            raise RuntimeError("writer died")
    assert os.listdir(tmp_path) == []
