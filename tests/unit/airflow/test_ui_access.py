"""The CDC page asks Airflow's auth manager about a DAG as Airflow's own routes do: with the team
that owns it (audit, issue 58: without it, multi-team isolation was skipped)."""

from __future__ import annotations


def test_the_page_passes_the_dags_team_to_the_auth_manager(monkeypatch):
    from airflow.api_fastapi import app as airflow_app
    from airflow.models.dag import DagModel

    from airflow_provider_cdc.ui import app

    asked = []

    class TeamAuth:  # the auth manager's one method the page calls: allows team_a's DAGs only
        def is_authorized_dag(self, *, method, details, user, access_entity=None):
            asked.append((method, details.id, details.team_name))
            return details.team_name == "team_a"

    monkeypatch.setattr(airflow_app, "get_auth_manager", lambda: TeamAuth())
    teams = {"cdc_snapshot__a": "team_a", "cdc_snapshot__b": "team_b"}
    monkeypatch.setattr(DagModel, "get_team_name", staticmethod(lambda dag_id: teams.get(dag_id)))
    assert app._may("user", "cdc_snapshot__a", act=True)
    assert not app._may("user", "cdc_snapshot__b", act=False)
    assert asked == [("POST", "cdc_snapshot__a", "team_a"), ("GET", "cdc_snapshot__b", "team_b")]
