"""The CDC page in Airflow's UI: an Airflow plugin (plugin.py) serving a FastAPI app (app.py)
that renders what ``airflow cdc status`` reads (page.py, status.py)."""
