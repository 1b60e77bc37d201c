"""The capture's background segment writer (pipeline/capture.py SegmentWriter): segments are
written in order, one at a time beside the decode of the next, a write's error reaches the
capture before its offset may move, and a submit waits for the write before it (two segments
in memory at most). Interleavings forced with the writer's pause hook and events, no sleeps."""

from __future__ import annotations

import threading

import pytest

from airflow_provider_cdc.pipeline.capture import SegmentWriter


def _gated():
    """A pause hook that holds each write until the test lets it go, and says when one waits."""
    waiting, go = threading.Semaphore(0), threading.Semaphore(0)

    def pause() -> None:
        waiting.release()
        assert go.acquire(timeout=30), "the test never let the write go"

    return pause, waiting, go


def test_segments_are_written_in_order_and_written_returns_once_all_are_durable():
    out: list[str] = []
    pause, waiting, go = _gated()
    w = SegmentWriter(lambda name: out.append(name) or f"loc/{name}", pause=pause)
    w.submit("a")
    assert waiting.acquire(timeout=30)  # a's write started and is held
    done = []
    t = threading.Thread(target=lambda: done.append(w.written()))
    t.start()
    t.join(0.2)
    assert t.is_alive() and not done  # the caller may not commit its offset yet
    go.release()
    t.join(30)
    assert done == [["loc/a"]] and out == ["a"]
    w.submit("b")
    assert waiting.acquire(timeout=30)
    go.release()
    w.submit("c")  # waits for b's write first
    assert waiting.acquire(timeout=30)
    go.release()
    assert w.written() == ["loc/b", "loc/c"] and out == ["a", "b", "c"]
    assert w.written() == []
    w.close()


def test_a_submit_waits_for_the_write_before_it_two_segments_in_memory_at_most():
    pause, waiting, go = _gated()
    w = SegmentWriter(lambda name: name, pause=pause)
    w.submit("first")
    assert waiting.acquire(timeout=30)
    second = threading.Thread(target=w.submit, args=("second",))
    second.start()
    second.join(0.2)
    assert second.is_alive()  # held while the first is written: no queue of segments grows
    go.release()
    second.join(30)
    assert not second.is_alive()
    assert waiting.acquire(timeout=30)
    go.release()
    assert w.written() == ["first", "second"]
    w.close()


def test_a_failed_write_is_raised_to_the_capture_and_nothing_after_it_is_reported_written():
    def write(name: str) -> str:
        if name == "bad":
            raise OSError("disk full")
        return name

    w = SegmentWriter(write)
    w.submit("good")
    w.submit("bad")
    with pytest.raises(OSError, match="disk full"):
        w.submit("after")  # raised at the next submit (inside the read), or at written()
    w.close()
    w2 = SegmentWriter(write)
    w2.submit("bad")
    with pytest.raises(OSError, match="disk full"):
        w2.written()
    w2.close()


def test_a_write_runs_in_the_submitters_context():
    import contextvars

    var: contextvars.ContextVar[str] = contextvars.ContextVar("storage_settings_of_a_task", default="none")
    var.set("this task's")
    w = SegmentWriter(lambda _name: var.get())
    w.submit("x")
    assert w.written() == ["this task's"]
    w.close()
