"""Exports of the lake in other formats, read from the event log (Debezium JSON)."""
