"""Placeholder demo until the DAGs exist: runs the changelog smoke check.

It is NOT the snapshot demo yet: it writes rows and watermarks to the local PostgreSQL
and prints what the logical slot returns.
"""

from __future__ import annotations

import os
import uuid

import psycopg2


def main() -> None:
    uri = os.environ.get("CDC_TEST_PG_URI", "postgresql://postgres@127.0.0.1:55432/cdc_test")
    print("PLACEHOLDER demo: changelog smoke check only (snapshot demo comes with the DAGs)")
    slot = f"demo_{uuid.uuid4().hex[:8]}"
    conn = psycopg2.connect(uri)
    conn.autocommit = True
    cur = conn.cursor()
    cur.execute("CREATE TABLE IF NOT EXISTS demo_smoke (id int PRIMARY KEY, v text)")
    cur.execute("SELECT pg_create_logical_replication_slot(%s, 'test_decoding')", (slot,))
    try:
        cur.execute("INSERT INTO demo_smoke VALUES (1, 'a') ON CONFLICT (id) DO UPDATE SET v = excluded.v")
        cur.execute("SELECT data FROM pg_logical_slot_get_changes(%s, NULL, NULL)", (slot,))
        for (data,) in cur.fetchall():
            print(" ", data)
    finally:
        cur.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
        conn.close()


if __name__ == "__main__":
    main()
