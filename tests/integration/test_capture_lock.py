"""One capture per source, enforced by the source database (locks.capture_lock)."""

from __future__ import annotations

import pytest

from airflow_provider_cdc.dialects.base import ConnectionParams
from airflow_provider_cdc.pipeline.locks import capture_lock, lock_name


@pytest.fixture(params=["postgres", "mysql"])
def params(request) -> ConnectionParams:
    uri = request.getfixturevalue("pg_uri" if request.param == "postgres" else "mysql_uri")
    return ConnectionParams.from_uri(uri)


def test_second_capture_of_a_source_is_refused_until_the_first_ends(params, unique_name):
    source = f"lock_{unique_name}"
    with capture_lock(params, source) as first:
        assert first is True
        with capture_lock(params, source) as second:  # another session: refused, not waiting
            assert second is False
        with capture_lock(params, f"{source}_other") as other:  # other sources are independent
            assert other is True
    with capture_lock(params, source) as again:
        assert again is True


def test_a_crashed_holder_releases_the_lock(params, unique_name):
    source = f"lock_{unique_name}"
    with pytest.raises(RuntimeError):
        with capture_lock(params, source) as got:
            assert got
            raise RuntimeError("capture died")
    with capture_lock(params, source) as got:
        assert got is True


def test_long_source_names_fit_mysql_lock_names():
    assert len(lock_name("x" * 200)) <= 64 and lock_name("x" * 200) != lock_name("y" * 200)


def test_two_sources_configured_with_one_slot_share_its_lock(pg_uri, unique_name, tmp_path):
    """The lock is keyed by the slot (locks.lock_key): two sources naming one slot never
    capture at once, whatever their names and data locations."""
    from airflow_provider_cdc.dialects import get_dialect
    from airflow_provider_cdc.pipeline.locks import lock_key

    params = ConnectionParams.from_uri(pg_uri)
    a = get_dialect(params, source=f"a_{unique_name}", slot_name=f"cdc_s_{unique_name}")
    b = get_dialect(params, source=f"b_{unique_name}", slot_name=f"cdc_s_{unique_name}")
    c = get_dialect(params, source=f"c_{unique_name}")
    with capture_lock(params, lock_key(a, str(tmp_path / "one"))) as first:
        assert first is True
        with capture_lock(params, lock_key(b, str(tmp_path / "two"))) as second:
            assert second is False
        with capture_lock(params, lock_key(c, str(tmp_path / "one"))) as other:
            assert other is True


@pytest.mark.parametrize("uri", ["postgresql://postgres@127.0.0.1:1/x", "mysql://root@127.0.0.1:1/x"])
def test_an_unreachable_server_is_named_by_its_source(uri):
    """Issue 58: the lock's own connection failed as "source 'default'"; it names the source."""
    from airflow_provider_cdc.core.errors import SourceUnreachableError
    from airflow_provider_cdc.dialects import ConnectionParams
    from airflow_provider_cdc.pipeline.locks import capture_lock

    with pytest.raises(SourceUnreachableError, match="^source 'shop': cannot connect"):
        with capture_lock(ConnectionParams.from_uri(uri), "k", "shop"):
            pass
