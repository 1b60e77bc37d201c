"""The mirror's storage: key-hash buckets of a Delta table, each a base file plus change
files, and the one serialising commit (docs/DESIGN.md, "The mirror"). Its parts, whose names
this module still offers: the bucket tree (``bucket_tree.py``), a version's files
(``bucket_files.py``), the deletion vectors (``bucket_masks.py``) and merge-on-read resolution
(``row_versions.py``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Sequence

from .. import storage
from ..core.arrow_types import POSITION_COLUMN
from ..core.formats import MIRROR
from . import deletion_vectors as dvs
from .bucket_files import (  # noqa: F401 - their names, as delta_buckets had them
    MASKED_FORMAT,
    ROW_GROUP_ROWS,
    FileInfo,
    MirrorVersion,
    NewFile,
    Remask,
    _location,
    change_version,
    conform,
    discard,
    mirror_format,
    read_bucket,
    read_order,
    read_version,
    write_bucket_file,
)
from .bucket_masks import (  # noqa: F401 - their names, as delta_buckets had them
    _WINNER_SCHEMA,
    _first_of_runs,
    _remask_buckets,
    _winners,
    bucket_masks,
    stored_versions,
    write_change,
)
from .bucket_tree import (  # noqa: F401 - their names, as delta_buckets had them
    BASE_PREFIX,
    BUCKET_COLUMN,
    BUCKETS_PROPERTY,
    CHANGE_PREFIX,
    DEFAULT_BUCKETS,
    MAX_BUCKETS,
    WRITER_APP_ID,
    bucket_of,
    check_buckets,
    children_of,
    crc_of,
    level_of,
    node_id,
    node_of,
    nodes_of_keys,
    parent_of,
    split_nodes,
)
from .delta_log import after_commit, write_commit
from .row_versions import (  # noqa: F401 - their names, as delta_buckets had them
    admit,
    any_dropped,
    drop_rows,
    keys_within,
    live,
    newest,
    read_resolved_keys,
    resolve,
)


def commit(
    v: MirrorVersion,
    adds: Sequence[NewFile],
    removed: Iterable[str],
    *,
    operation: str,
    position: str | None = None,
) -> int:
    """Replace ``removed`` (paths of ``v``) by ``adds`` in one commit on top of ``v``, as the
    next ``cdc-mirror`` transaction, with the deletion vectors that keep exactly the live rows
    visible: a bucket that one writer appended one file to takes that writer's vectors (it read
    the bucket's winners of its keys); any other bucket the commit touches has its vectors
    worked out from its files (:func:`bucket_masks`). A mirror of format 1 is upgraded in the
    same commit (protocol, the ``deletionVectors`` feature, every bucket masked), so no version
    has the feature without the masks. The commit records the source position it brings the
    mirror to (``cdc.position`` in its commitInfo, :mod:`sinks.mirror_history`): ``position``,
    or for a write of rows (``upsert``, ``merge``) the newest position among them.
    CommitFailedError when another writer committed since; returns the version committed (-1:
    nothing to commit)."""
    removed = list(removed)
    if not adds and not removed and v.masked:
        return -1
    gone = set(removed)
    per_bucket: dict[int, list[NewFile]] = {}
    for a in adds:
        per_bucket.setdefault(a.bucket if v.bucketed else 0, []).append(a)
    owner = {p: b for b, ps in v.files.items() for p in ps}
    if v.masked:
        redo = {owner[p] for p in gone if p in owner}
        redo |= {b for b, ps in per_bucket.items() if len(ps) > 1 or ps[0].remasks is None}
    else:
        redo = {b for b, ps in v.files.items() if ps} | set(per_bucket)
    given = [a for b, ps in per_bucket.items() if b not in redo for a in ps]
    superseded = [a for b, ps in per_bucket.items() if b in redo for a in ps]  # vectors worked out again
    try:
        done, remasks = _remask_buckets(v, superseded, gone, redo)
    except BaseException:
        discard(v.table_uri, adds)
        raise
    remasks += [r for a in given for r in a.remasks or ()]
    final = [*given, *done]
    actions = _commit_actions(v, removed, remasks, final, operation=operation, position=position, adds=adds)
    try:
        write_commit(v.table_uri, v.version + 1, actions)
    except BaseException:
        discard(v.table_uri, final)
        raise
    discard_vectors(v.table_uri, superseded)
    _after_commit(v, v.version + 1)
    return v.version + 1


def _commit_actions(
    v: MirrorVersion,
    removed: list[str],
    remasks: list,
    final: list[NewFile],
    *,
    operation: str,
    position: str | None,
    adds: Sequence[NewFile],
) -> list[dict]:
    """The Delta actions of :func:`commit`: its commitInfo and txn, the format-1 upgrade, the
    removes, each re-masked file removed and added again with its new vector, and the adds."""
    now = int(time.time() * 1000)
    actions: list[dict] = [
        {
            "commitInfo": {
                "timestamp": now,
                "operation": "WRITE" if v.masked else "UPGRADE PROTOCOL",
                "operationParameters": {"mode": "Append"},
                "cdc.operation": operation,
                "engineInfo": "airflow-provider-cdc",
                **_position_info(operation, position, adds),
            }
        },
        {"txn": {"appId": WRITER_APP_ID, "version": v.txn + 1, "lastUpdated": now}},
    ]
    if not v.masked:
        actions += _upgrade_actions(v)
    part = (lambda p: {BUCKET_COLUMN: p.split("/", 1)[0].split("=", 1)[1]}) if v.bucketed else (lambda p: {})

    def remove(rel: str) -> dict:
        old = v.adds.get(rel, {})
        r = {
            "path": rel,
            "deletionTimestamp": now,
            "dataChange": True,
            "extendedFileMetadata": True,
            "partitionValues": old.get("partitionValues", part(rel)),
            "size": int(old.get("size", v.sizes.get(rel, 0))),
        }
        if old.get("deletionVector"):
            r["deletionVector"] = old["deletionVector"]
        return {"remove": r}

    actions += [remove(p) for p in removed]
    for r in remasks:
        old = dict(v.adds[r.path])
        actions.append(remove(r.path))
        old.pop("deletionVector", None)
        if r.dv:
            old["deletionVector"] = dict(r.dv)
        old["dataChange"] = True
        actions.append({"add": old})
    actions += [a.add(now) for a in final]
    return actions


#: the operations that bring the mirror's rows to a source position (mirror_history.py)
ROW_WRITES = ("upsert", "merge")


def _position_info(operation: str, position: str | None, adds: Sequence[NewFile]) -> dict:
    """``cdc.position``: the source position a commit brings the mirror to (none for
    maintenance, which changes no row's content)."""
    if position is None and operation in ROW_WRITES:
        tops = [json.loads(a.stats).get("maxValues", {}).get(POSITION_COLUMN) for a in adds]
        position = max((t for t in tops if t), default=None)
    return {} if position is None else {"cdc.position": position}


def discard_vectors(table_uri: str, files: Iterable[NewFile]) -> None:
    """Delete the vectors a writer wrote that its commit replaced (worked out again)."""
    for a in files:
        for rel in dvs.referenced_files([a.dv, *(r.dv for r in a.remasks or ())]):
            try:
                storage.delete(_location(table_uri, rel))
            except OSError:  # noqa: PERF203 - vacuum removes what is left
                pass


def _upgrade_actions(v: MirrorVersion) -> list[dict]:
    """The protocol and metadata of a format-1 mirror upgraded to deletion vectors (reader 3,
    writer 7 with the ``deletionVectors`` feature and those its old versions implied)."""
    proto = v.dt.protocol()
    implied_writer = {
        2: ["appendOnly", "invariants"],
        3: ["checkConstraints"],
        4: ["changeDataFeed", "generatedColumns"],
        5: ["columnMapping"],
        6: ["identityColumns"],
    }
    writer = set(proto.writer_features or [])
    if proto.min_writer_version < 7:
        for level, feats in implied_writer.items():
            if proto.min_writer_version >= level:
                writer.update(feats)
    reader = set(proto.reader_features or [])
    if proto.min_reader_version == 2:
        reader.add("columnMapping")
    writer.add("deletionVectors")
    reader.add("deletionVectors")
    md = v.dt.metadata()
    config = dict(md.configuration or {})
    config.update({DV_PROPERTY: "true", MIRROR.key: str(MIRROR.version)})
    meta = {
        "id": md.id,
        "format": {"provider": "parquet", "options": {}},
        "schemaString": v.dt.schema().to_json(),
        "partitionColumns": list(md.partition_columns or []),
        "configuration": config,
        "createdTime": md.created_time,
    }
    if md.name:
        meta["name"] = md.name
    if md.description:
        meta["description"] = md.description
    return [
        {
            "protocol": {
                "minReaderVersion": 3,
                "minWriterVersion": 7,
                "readerFeatures": sorted(reader),
                "writerFeatures": sorted(writer),
            }
        },
        {"metaData": meta},
    ]


#: the Delta table property that lets writers add deletion vectors
DV_PROPERTY = "delta.enableDeletionVectors"


def _after_commit(v: MirrorVersion, version: int) -> None:
    """What delta-rs's post-commit hook does after its own commits (delta_log.after_commit)."""
    after_commit(v.table_uri, version, v.props)
