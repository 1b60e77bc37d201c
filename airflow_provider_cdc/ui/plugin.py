"""The Airflow plugin that puts the CDC page into Airflow's UI (registered through the
``airflow.plugins`` entry point of this package, so installing the provider is enough): the
api-server mounts the app at ``/cdc``, and "CDC" under Browse opens it inside the UI."""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin

from .app import app


class CdcUiPlugin(AirflowPlugin):
    name = "cdc_ui"
    fastapi_apps = [{"app": app, "url_prefix": "/cdc", "name": "CDC"}]
    external_views = [
        {
            "name": "CDC",
            "href": "/cdc/",  # the trailing slash: a bare /cdc is Airflow's own page
            "destination": "nav",
            "url_route": "cdc",  # shown in the UI at /plugin/cdc, in a frame of this origin
            "category": "browse",
        }
    ]
