"""The typed values that cross a snapshot's tasks (core/plans.py): the JSON shapes of the plan and
the work item stay what the tasks exchange and the stored plans hold, and every field is
checked with the one definition of its bounds."""

from __future__ import annotations

import json

import pytest

from airflow_provider_cdc.core.errors import ConfigurationError
from airflow_provider_cdc.core.planning import SnapshotRequest
from airflow_provider_cdc.core.plans import CONF_KEYS, THROTTLE_KEYS, SnapshotPlan, WorkItem
from airflow_provider_cdc.core.ranges import ChunkRange
from airflow_provider_cdc.core.throttle import Throttle

pytestmark = pytest.mark.unit

PLAN = {"table": "public.orders", "snapshot_id": "S1", "ranges": [{"start": None, "end": [50]}, {"start": [50], "end": None}],
        "upper_bound": [100], "where": "status = 'x'", "converge_watermark": "w1", "converge_visibility": None,
        "read_floor": None, "chunk_size": 10, "parallelism": 2, "delay_seconds": 0.5}


def test_a_plan_and_its_work_items_keep_their_json_shapes():
    plan = SnapshotPlan.from_dict(json.loads(json.dumps(PLAN)))
    assert plan.ranges == (ChunkRange(None, (50,)), ChunkRange((50,), None)) and plan.upper_bound == (100,)
    assert plan.to_dict() == PLAN
    work = [w.to_dict() for w in plan.work_items([1])]
    assert work == [{"table": "public.orders", "snapshot_id": "S1", "range_index": 1, "ranges_total": 2,
                     "range": {"start": [50], "end": None}, "upper_bound": [100], "where": "status = 'x'",
                     "chunk_size": 10, "delay_seconds": 0.5, "parallelism": 2}]
    assert WorkItem.from_dict(json.loads(json.dumps(work[0]))) == plan.work_items([1])[0]


def test_a_plan_from_before_a_field_existed_takes_its_default():
    plan = SnapshotPlan.from_dict({"table": "public.orders", "snapshot_id": "S1", "ranges": [{"start": None, "end": None}]})
    assert (plan.throttle, plan.read_floor) == (Throttle(None, 0.0, 1), None)


@pytest.mark.parametrize(("field", "value", "match"), [
    ("chunk_size", 0, "the work item's chunk_size must be a whole number from 1 to 10000000"),
    ("chunk_size", "100", "the work item's chunk_size must be a whole number"),
    ("delay_seconds", -1, "the work item's delay_seconds must be a number of seconds from 0"),
])
def test_a_work_item_is_checked_with_the_settings_bounds(field, value, match):
    item = {"table": "public.orders", "snapshot_id": "S1", "range_index": 0, "ranges_total": 1,
            "range": {"start": None, "end": None}, field: value}
    with pytest.raises(ConfigurationError, match=match):
        WorkItem.from_dict(item)


def test_one_list_of_conf_keys():
    assert CONF_KEYS == ("action", "tables", "key_ranges", "keys", "where", "chunk_size", "parallelism", "delay_seconds")
    assert set(Throttle.FIELDS) == set(THROTTLE_KEYS) == {f for f in Throttle.__dataclass_fields__}
    assert SnapshotRequest.FIELDS == ("tables", "keys", "ranges", "where", "chunk_size", "parallelism", "delay_seconds")


def test_a_resume_changes_the_chunk_size_and_the_pause_it_gives_and_never_the_parallelism():
    plan = SnapshotPlan.from_dict(PLAN)
    conf = Throttle(chunk_size=None, delay_seconds=3, parallelism=8)
    assert plan.resumed(conf, {"chunk_size"}).throttle == Throttle(None, 0.5, 2)  # "auto": adaptive again
    assert plan.resumed(conf, {"delay_seconds", "parallelism"}).throttle == Throttle(10, 3.0, 2)
    assert plan.resumed(conf, set()) == plan


def test_a_refresh_takes_the_throttle_its_conf_does_not_give_from_the_snapshot_before():
    before = Throttle(500, 2.0, 4)
    assert Throttle(99).inherit(before, {"chunk_size"}) == Throttle(99, 2.0, 4)
    assert Throttle().inherit(before, ()) == before
    assert Throttle(delay_seconds=0).inherit(before, {"delay_seconds", "parallelism"}) == Throttle(500, 0.0, 1)
