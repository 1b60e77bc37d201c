"""OpenLineage for the CDC operators: what a run read and wrote, as the OpenLineage provider's
listener collects it from ``get_openlineage_facets_on_complete``, with datasets named by
OpenLineage's conventions (docs/DESIGN.md, "What operators and consumers see"). Without that
provider, or with it switched off, nothing here is imported.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from typing import Any
from urllib.parse import urlsplit

from .core.schema import TableName, TableSchema
from .dialects.base import ConnectionParams
from .dialects.registry import get_profile
from .sinks.registry import location_sinks

log = logging.getLogger(__name__)

def source_namespace(params: ConnectionParams) -> str:
    profile = get_profile(params.scheme)
    return f"{profile.lineage_scheme}://{params.host}:{params.port or profile.default_port}"


def source_name(params: ConnectionParams, table: TableName) -> str:
    return get_profile(params.scheme).lineage_name(params.database, table)


def location(uri: str) -> tuple[str, str]:
    """(namespace, name) of a location of the storage layer."""
    parts = urlsplit(uri)
    if parts.scheme and parts.scheme != "file" and len(parts.scheme) > 1:
        return f"{parts.scheme}://{parts.netloc}", parts.path.lstrip("/")
    return "file", os.path.abspath(parts.path if parts.scheme == "file" else uri)


def staged_schema(data_dir: str, source: str, table: TableName) -> TableSchema | None:
    """The table's schema as staged (None before the first capture or plan staged it)."""
    from . import storage
    from .storage.layout import schema_path

    try:
        return TableSchema.from_json(storage.read_text(schema_path(data_dir, source, table)))
    except OSError:
        return None


def _schema_facet(fields: Iterable[tuple[str, str]]):
    from openlineage.client.facet_v2 import schema_dataset

    return schema_dataset.SchemaDatasetFacet(
        fields=[schema_dataset.SchemaDatasetFacetFields(name=n, type=t) for n, t in fields]
    )


def source_input(params: ConnectionParams, table: TableName, schema: TableSchema | None):
    from openlineage.client.event_v2 import InputDataset

    facets = (
        {}
        if schema is None
        else {"schema": _schema_facet((c.name, c.source_type or c.type) for c in schema.columns)}
    )
    return InputDataset(namespace=source_namespace(params), name=source_name(params, table), facets=facets)


def location_dataset(uri: str, *, output: bool, facets: dict | None = None):
    from openlineage.client.event_v2 import InputDataset, OutputDataset

    namespace, name = location(uri)
    cls = OutputDataset if output else InputDataset
    return cls(namespace=namespace, name=name, facets=facets or {})


def sink_outputs(
    params: ConnectionParams,
    data_dir: str,
    source: str,
    table: TableName,
    schema: TableSchema | None,
    sinks: Iterable[str],
) -> list:
    """The event log's and the mirror's datasets of ``table`` (those among ``sinks``), each with
    its schema and the column lineage from the source table."""
    from openlineage.client.facet_v2 import column_lineage_dataset as cl

    from .sinks.event_log import table_dir
    from .storage.layout import mirror_dir

    where = {"events": table_dir(data_dir, source, table), "mirror": mirror_dir(data_dir, source, table)}
    out = []
    for sink in sinks:
        if sink not in where:
            continue
        facets: dict[str, Any] = {}
        if schema is not None:
            ns, name = source_namespace(params), source_name(params, table)
            facets["schema"] = _schema_facet((c.name, c.type) for c in schema.columns)
            facets["columnLineage"] = cl.ColumnLineageDatasetFacet(
                fields={
                    c.name: cl.Fields(
                        inputFields=[cl.InputField(namespace=ns, name=name, field=c.name)],
                        transformationType="IDENTITY",
                        transformationDescription="copied unchanged",
                    )
                    for c in schema.columns
                }
            )
        out.append(location_dataset(where[sink], output=True, facets=facets))
    return out


def operator_lineage(inputs: list, outputs: list):
    from airflow.providers.openlineage.extractors import OperatorLineage

    return OperatorLineage(inputs=inputs, outputs=outputs)


def available() -> bool:
    """Whether OpenLineage is on: its provider installed and a transport configured (else the
    listener never asks, and the operators collect nothing for it)."""
    try:
        from airflow.providers.openlineage.conf import is_disabled
    except ImportError:
        return False
    return not is_disabled()


def tables_lineage(
    params: ConnectionParams,
    data_dir: str,
    source: str,
    tables: Iterable[TableName],
    *,
    staging: str | None,
    staging_is_output: bool,
    sinks: Iterable[str] = (),
):
    """An operator's lineage: the source tables (with their staged schemas) and ``staging`` (a
    location) as inputs, or ``staging`` as the output; the tables' event log and mirror among
    ``sinks`` as outputs. None without the OpenLineage provider."""
    if not available():
        return None
    sinks = location_sinks(sinks)  # (the postgres sink writes a database, no location)
    inputs, outputs = [], []
    for table in sorted(set(tables), key=lambda t: t.id):
        schema = staged_schema(data_dir, source, table)
        inputs.append(source_input(params, table, schema))
        outputs += sink_outputs(params, data_dir, source, table, schema, sinks)
    if staging is not None:
        (outputs if staging_is_output else inputs).append(location_dataset(staging, output=staging_is_output))
    return operator_lineage(inputs, outputs)
