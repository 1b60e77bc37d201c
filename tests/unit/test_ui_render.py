"""The CDC page's HTML (ui/page.py) from a status overview: hostile names and errors are
escaped, states are words (not colour alone), the actions follow the status and the right."""

from __future__ import annotations

from html.parser import HTMLParser

from airflow_provider_cdc.ui.page import lag_chart, refresh_seconds, render

EVIL = "<script>alert(1)</script>'\"&"


class _Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict]] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))


def _overview(status: str, **snap) -> list[dict]:
    return [{"source": EVIL, "snapshot_dag": "cdc_snapshot", "applied": {"mirror": {"position": "0/1", "at": 1.0}},
             "lag": {"bytes": 10, "seconds": 2.0, "holder": EVIL, "risk": None, "at": 5.0,
                     "history": [[1.0, 0, 0.0], [2.0, 5, 4.0], [3.0, 10, 2.0]]},
             "tables": [{"table": f"s.{EVIL}", "verify": None, "mirror": None,
                         "snapshot": {"status": status, "snapshot_id": "S", "error": EVIL if status == "failed" else None,
                                      "ranges": 2, "ranges_done": 1, "rows": 10, "chunks": 1, "rows_per_second": 5.0,
                                      "fraction": 0.5, "ranges_list": [], **snap}}]}]


def test_untrusted_names_and_errors_are_escaped_everywhere():
    html = render(_overview("failed"), user=EVIL, can_act={EVIL: True})
    assert "<script>" not in html and "&lt;script&gt;" in html
    p = _Tags()
    p.feed(html)
    assert [t for t, _ in p.tags if t == "script"] == []
    hidden = {a["name"]: a["value"] for t, a in p.tags if t == "input" and a.get("type") == "hidden" and a["name"] != "action"}
    assert hidden == {"source": EVIL, "table": f"s.{EVIL}"}  # attribute values round-trip exactly


def test_actions_follow_the_status_and_the_users_right():
    def buttons(status: str, can_act: bool) -> list[str]:
        p = _Tags()
        p.feed(render(_overview(status), user="u", can_act={EVIL: can_act}))
        return [a["value"] for t, a in p.tags if t == "input" and a.get("name") == "action"]

    assert buttons("running", True) == ["pause", "stop", "verify"]
    assert buttons("paused", True) == ["resume", "stop", "verify"]
    assert buttons("done", True) == ["verify"]
    assert buttons("running", False) == []


def test_states_and_figures_are_words_and_the_chart_says_its_range():
    html = render(_overview("running", seconds_left=125, rows_planned=20), user="u", can_act={})
    assert ">running<" in html and "50% read" in html and "rows 10 of ~20" in html and "time left 2 min 05 s" in html
    assert "aria-valuenow='50'" in html
    chart = lag_chart([[0.0, 0, 0.0], [3600.0, 10, 30.0]])
    assert "role='img'" in chart and "at most 30 s" in chart and "30 s</text>" in chart
    chart = lag_chart([[0.0, 0, 0.0], [3600.0, 2_500_000, 30.0]], unit="bytes")
    assert "capture lag in bytes" in chart and "2.5M bytes</text>" in chart
    assert html.count("<svg") == 2  # seconds and bytes
    assert "Not enough lag readings" in lag_chart([[0.0, 0, 0.0]])


def test_the_page_reloads_itself_without_script_and_without_the_actions_message():
    """A snapshot runs for hours: the page reloads itself (a meta refresh to its own address,
    the one source it shows, never the message of an action just done); ``?refresh=0`` stops it."""
    def meta(html: str) -> list[str]:
        p = _Tags()
        p.feed(html)
        return [a["content"] for t, a in p.tags if t == "meta" and a.get("http-equiv") == "refresh"]

    html = render(_overview("running"), user="u", can_act={}, flash="pause queued", only=EVIL, refresh=60)
    assert meta(html) == ["60; url=./?source=%3Cscript%3Ealert%281%29%3C%2Fscript%3E%27%22%26"]
    assert "reloads itself every 1 min 00 s" in html and "<script" not in html
    assert meta(render(_overview("running"), user="u", can_act={}, refresh=0)) == []
    assert meta(render(_overview("running"), user="u", can_act={}, refresh=30)) == ["30; url=./?refresh=30"]
    assert [refresh_seconds(x) for x in (None, 0, -5, 3, 45, 10**6)] == [60, 0, 0, 10, 45, 3600]


def test_malformed_values_unknown_sources_and_refused_tables_are_marked_and_never_acted_on():
    """Issue 46: values read back from Variables are untrusted. One of the wrong type is shown
    MALFORMED where it is (the rest of the page still shows); a source only a Variable names and
    a table outside its source's scope are shown with why, without buttons."""
    sources = [
        {"source": "shop", "known": True, "snapshot_dag": "cdc_snapshot", "verify_dag": "cdc_verify", "applied": {},
         "lag": {"malformed": "the capture lag reading has values of the wrong type: bytes"},
         "tables": [
             {"table": "public.orders", "verify": {"malformed": "the verify record has values of the wrong type: at"},
              "mirror": None, "snapshot": {"status": "malformed", "error": "Variable k: not a snapshot progress"}},
             {"table": "public.outside", "refused": "table public.outside is not captured by source 'shop'",
              "verify": None, "mirror": None, "snapshot": {"status": "done", "snapshot_id": "S"}},
             {"table": "public.odd", "verify": None, "mirror": {"version": "x"}, "snapshot": {"status": "done",
                                                                                              "rows_planned": "?"}},
         ]},
        {"source": "ghost", "known": False, "unknown": "source 'ghost' is named only by Variables",
         "snapshot_dag": None, "verify_dag": None, "lag": None, "applied": {},
         "tables": [{"table": "public.orders", "verify": None, "mirror": None, "snapshot": {"status": "running"}}]},
    ]
    html = render(sources, user="u", can_act={"shop": True, "ghost": True})
    assert html.count("data-testid='malformed'") == 4  # lag, the progress, the verify, a row that cannot render
    assert "data-testid='unknown-source'" in html and "named only by Variables" in html
    assert "refused: table public.outside is not captured" in html
    p = _Tags()
    p.feed(html)
    acted = [(a.get("value")) for t, a in p.tags if t == "input" and a.get("name") == "source"]
    assert acted == ["shop"]  # one verify button: public.orders of the known source only


def test_errors_are_shown_without_row_values():
    html = render(_overview("failed", error='duplicate key\nDETAIL:  Key (card)=(4111-1111-1111-1111) exists.'),
                  user="u", can_act={})
    assert "4111" not in html and "row values dropped" in html
