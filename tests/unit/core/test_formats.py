"""core/formats.py: every persisted format is stamped with its version, read back at it,
migrated through the registered steps, and refused with a message naming where and what to do."""

from __future__ import annotations

import pytest

from airflow_provider_cdc.core.formats import ALL, MIRROR, Format, FormatError

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("fmt", ALL, ids=lambda f: f.name)
def test_a_stamped_document_reads_back(fmt):
    doc = fmt.stamp({"a": 1, fmt.key: "stale"})
    assert next(iter(doc)) == fmt.key and fmt.read(doc, "here") == doc


@pytest.mark.parametrize("fmt", ALL, ids=lambda f: f.name)
def test_a_newer_version_names_where_and_says_upgrade(fmt):
    with pytest.raises(FormatError, match=rf"^file x: this {fmt.name} has format version {fmt.version + 1}, written "
                                          r"by a newer .*Upgrade airflow-provider-cdc"):
        fmt.read({fmt.key: fmt.version + 1}, "file x")


@pytest.mark.parametrize("doc", [{}, {"version": 0}, {"version": "two"}, {"version": True}, [], None])
def test_an_unversioned_or_unknown_document_is_refused(doc):
    fmt = Format("thing", 1, "delete it")
    with pytest.raises(FormatError, match="^the file: this thing has .* does not read .*Delete it$"):
        fmt.read(doc, "the file")


def test_older_versions_go_through_the_registered_migrations():
    fmt = Format("thing", 3, "delete it", migrations={1: lambda d: {**d, "version": 2, "b": d["a"]},
                                                       2: lambda d: {**d, "version": 3, "c": d["b"] + 1}})
    assert fmt.read({"version": 1, "a": 1}, "x") == {"version": 3, "a": 1, "b": 1, "c": 2}
    assert fmt.read({"version": 2, "b": 5}, "x") == {"version": 3, "b": 5, "c": 6}


def test_a_table_property_holds_the_version_as_text():
    assert MIRROR.read({"cdc.format_version": str(MIRROR.version)}, "t")["cdc.format_version"] == str(MIRROR.version)
