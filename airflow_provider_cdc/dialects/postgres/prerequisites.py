"""What a PostgreSQL source must have before anything is created: server settings, version,
the role's privileges, and readable tables; the default slot and publication names; the
dialect's ``prerequisites``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ...core.errors import SourceError
from ...core.schema import TableName

if TYPE_CHECKING:
    from .offsets import PgOffsets
    from .server import PgServer
    from .watermarks import PgWatermarkTable


MIN_SERVER_VERSION = 130000  # pg_replication_slots.wal_status
STANDBY_DECODING_VERSION = 160000  # logical decoding on a hot standby


# --- prerequisites (a pure check, testable with any settings row) -------------------------


@dataclass(frozen=True)
class PgSettings:
    wal_level: str
    max_replication_slots: int
    max_wal_senders: int
    slots_used: int
    slot_exists: bool
    user: str
    replication_role: bool
    superuser: bool
    server_version_num: int
    publication_exists: bool
    all_tables: bool  # the dialect would create FOR ALL TABLES
    in_recovery: bool = False  # a hot standby (capture from a standby: PostgreSQL 16+)
    hot_standby_feedback: bool = True


def prerequisite_problems(s: PgSettings, slot_name: str) -> list[str]:
    """Every unmet CDC prerequisite, each with its fix."""
    problems = []
    if s.server_version_num < MIN_SERVER_VERSION:
        problems.append(
            f"server version {s.server_version_num} is too old: PostgreSQL 13 or newer is required"
        )
    if s.in_recovery and s.server_version_num < STANDBY_DECODING_VERSION:
        problems.append(
            f"this server is a hot standby, and PostgreSQL {s.server_version_num // 10000} cannot "
            "decode logically on "
            "a standby (16 and newer can): point the source's connection at the primary, and name the "
            "standby as "
            "chunk_conn_id to read chunks there"
        )
    if s.wal_level != "logical":
        problems.append(
            f"wal_level is {s.wal_level!r}: run ALTER SYSTEM SET wal_level = logical (or set it in "
            "postgresql.conf) and restart the server"
            + (
                " (on this hot standby and on its primary: decoding on a standby needs both)"
                if s.in_recovery
                else ""
            )
        )
    if s.in_recovery and not s.hot_standby_feedback:
        problems.append(
            "hot_standby_feedback is off on this hot standby: the primary's vacuum would then remove "
            "catalog rows the "
            "slot still needs, and the standby invalidates the slot (rows_removed). Run on the "
            "standby: ALTER SYSTEM "
            "SET hot_standby_feedback = on; SELECT pg_reload_conf() (and give it a physical slot on "
            "the primary, "
            "primary_slot_name, so the feedback outlives a reconnect)"
        )
    if not (s.replication_role or s.superuser):
        problems.append(
            f"user {s.user!r} may not use replication slots: ALTER ROLE {s.user} WITH REPLICATION "
            "(or, on a managed service, grant its replication role, e.g. rds_replication)"
        )
    if not s.slot_exists:
        if s.max_replication_slots == 0:
            problems.append(
                "max_replication_slots is 0: set it to at least 1 (plus one per other consumer) and restart"
            )
        elif s.slots_used >= s.max_replication_slots:
            problems.append(
                f"all {s.max_replication_slots} replication slots are in use and slot {slot_name!r} "
                "does not exist: "
                "raise max_replication_slots and restart, or drop an unused slot (pg_drop_replication_slot)"
            )
    if s.max_wal_senders < 1:
        problems.append(
            "max_wal_senders is 0: set it to at least 1 (capture streams through a WAL sender) and restart"
        )
    if not s.publication_exists and s.all_tables and not s.superuser and not s.in_recovery:
        problems.append(
            f"user {s.user!r} is not a superuser, so it cannot create a publication FOR ALL TABLES: "
            "set CDC_TABLES "
            "to the tables to capture instead (CDC_CAPTURE_ALL_TABLES unset), or have a superuser create the "
            "publication"
        )
    return problems


# --- the dialect --------------------------------------------------------------------------

SLOT_NAME_RE = re.compile(r"^[a-z0-9_]{1,63}$")


_HASHED_NAME_RE = re.compile(r"__[0-9a-f]{12}$")


def default_object_name(source: str) -> str:
    """``cdc_<source>`` when that is a valid slot name (lowercase letters, digits, ``_``, at
    most 63 characters), so existing slots keep their names. Any other source is folded to
    what a slot name allows, cut short, and ends in ``__`` + 12 hex digits of a hash of the
    exact source name: ``orders-eu`` and ``orders_eu`` no longer share a slot. A source whose
    name already ends like such a hash is hashed too, so a kept name never equals a folded one."""
    name = "cdc_" + source
    if SLOT_NAME_RE.match(name) and not _HASHED_NAME_RE.search(name):
        return name
    import hashlib

    digest = hashlib.sha256(source.encode("utf-8")).hexdigest()[:12]
    folded = "cdc_" + re.sub(r"[^a-z0-9_]", "_", source.lower())
    return f"{folded[: 63 - 14]}__{digest}"


class PgPrerequisites:
    """Checks of the source, read-only: nothing is created before every one holds."""

    def __init__(
        self,
        server: PgServer,
        offsets: PgOffsets,
        watermark_rows: PgWatermarkTable,
        *,
        all_tables: bool,
        watermark_tables: Callable[[], list[TableName]],
    ) -> None:
        self.server = server
        self.offsets = offsets
        self.watermark_rows = watermark_rows
        self.all_tables = all_tables  # the opt-in to every table of the database
        self.watermark_tables = watermark_tables  # the tables the watermark strategy writes

    def read_settings(self) -> PgSettings:
        row = self.server.query(
            "SELECT current_setting('wal_level'), current_setting('max_replication_slots')::int, "
            "current_setting('max_wal_senders')::int, (SELECT count(*) FROM pg_replication_slots), "
            "EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = %s), current_user, "
            "r.rolreplication, r.rolsuper, current_setting('server_version_num')::int, "
            "EXISTS (SELECT 1 FROM pg_publication WHERE pubname = %s), "
            "pg_is_in_recovery(), current_setting('hot_standby_feedback')::bool "
            "FROM pg_roles r WHERE r.rolname = current_user",
            (self.offsets.slot_name, self.offsets.publication_name),
        )[0]
        return PgSettings(
            *row[:10],
            all_tables=self.all_tables and not self.offsets.tables,
            in_recovery=bool(row[10]),
            hot_standby_feedback=bool(row[11]),
        )

    def check(self) -> None:
        """Every unmet prerequisite at once. On a hot standby (capture from a standby,
        PostgreSQL 16+) also: nothing may be written there (watermark_strategy 'log'), and the
        publication must already carry the scope (it is created on the primary)."""
        settings = self.read_settings()
        problems = prerequisite_problems(settings, self.offsets.slot_name)
        problems += self.privilege_problems(settings)
        if settings.in_recovery:
            if self.watermark_tables():  # a standby takes no writes
                problems.append(self.watermark_rows.standby_watermark_problem)
            pub = self.offsets.standby_publication_problem()
            if pub:
                problems.append(pub)
        if problems:
            where = f"{self.server.params.host}:{self.server.params.port}/{self.server.params.database}"
            raise SourceError(
                f"PostgreSQL at {where} is not ready for CDC:\n" + "\n".join(f"- {p}" for p in problems)
            )

    def privilege_problems(self, s: PgSettings | None = None) -> list[str]:
        """Every grant the configured set-up lacks, each as the statement that gives it (the docs' connections
        page, "Security" lists both set-ups: the provider creates publication and watermark table, or an
        administrator did, and the provider then needs no ownership and runs no DDL)."""
        s = s or self.read_settings()
        if s.superuser:
            return []
        role = self.server.quote_ident(s.user)
        db_create = self.server.query("SELECT has_database_privilege(current_database(), 'CREATE')")[0][0]
        wms = self.watermark_tables()  # watermark strategy "log": no watermark table
        problems = self._watermark_table_problems(role, wms, db_create)
        scope = list(self.offsets.tables or [])
        rows = self._scope_privileges(scope)
        for t in scope:
            sel, usage, _owner = rows.get(t, (True, True, True))  # a missing table is named by describe_table
            if not usage:
                problems.append(f"GRANT USAGE ON SCHEMA {self.server.quote_ident(t.schema)} TO {role}")
            if not sel:
                problems.append(f"GRANT SELECT ON {self.server.quote_table(t)} TO {role}")
        problems += self._publication_problems(s, scope, wms, rows, db_create)
        return problems

    def _watermark_table_problems(self, role: str, wms: list[TableName], db_create: bool) -> list[str]:
        """The grants the role lacks to use the watermark table, or to create it when it does not exist."""
        problems = []
        wm = self.watermark_rows.table
        wm_row = (
            []
            if not wms
            else self.server.query(
                "SELECT has_table_privilege(c.oid, 'SELECT'), has_table_privilege(c.oid, 'UPDATE'), "
                "has_schema_privilege(n.oid, 'USAGE') FROM pg_class c JOIN pg_namespace n ON n.oid = "
                "c.relnamespace "
                "WHERE n.nspname = %s AND c.relname = %s AND c.relkind IN ('r', 'p')",
                (wm.schema, wm.name),
            )
        )
        if wm_row:
            if not wm_row[0][2]:
                problems.append(
                    f"GRANT USAGE ON SCHEMA {self.server.quote_ident(wm.schema)} TO {role} (the "
                    "watermark table's schema)"
                )
            if not (wm_row[0][0] and wm_row[0][1]):
                problems.append(
                    f"GRANT SELECT, UPDATE ON {self.server.quote_table(wm)} TO {role} (the watermark table: "
                    "DBLog's watermarks are UPDATEs of its one row)"
                )
        elif wms:
            nsp = self.server.query(
                "SELECT has_schema_privilege(n.oid, 'CREATE') FROM pg_namespace n WHERE n.nspname = %s",
                (wm.schema,),
            )
            if (nsp and not nsp[0][0]) or (not nsp and not db_create):
                what = (
                    f"SCHEMA {self.server.quote_ident(wm.schema)}"
                    if nsp
                    else "DATABASE " + self.server.quote_ident(self.server.params.database or "postgres")
                )
                problems.append(
                    f"GRANT CREATE ON {what} TO {role}, so the provider can create the watermark table "
                    f"{wm}, or have an administrator create it (the docs' connections page, 'Grants')"
                )
        return problems

    def _scope_privileges(self, scope: list[TableName]) -> dict[TableName, tuple[bool, bool, bool]]:
        """The scope's existing tables -> (SELECT on it, USAGE on its schema, the role owns it)."""
        return {
            TableName(sch, name): (sel, usage, owner)
            for sch, name, sel, usage, owner in self.server.query(
                "SELECT n.nspname, c.relname, has_table_privilege(c.oid, 'SELECT'), "
                "has_schema_privilege(n.oid, 'USAGE'), pg_has_role(c.relowner, 'USAGE') "
                "FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE c.relkind IN ('r', 'p') AND (n.nspname, c.relname) IN (SELECT * FROM "
                "unnest(%s::text[], %s::text[]))",
                ([t.schema for t in scope] or [""], [t.name for t in scope] or [""]),
            )
        }

    def _publication_problems(
        self,
        s: PgSettings,
        scope: list[TableName],
        wms: list[TableName],
        rows: dict[TableName, tuple[bool, bool, bool]],
        db_create: bool,
    ) -> list[str]:
        """What keeps the role from adding the scope to the publication, or from creating it."""
        problems = []
        pub = self.server.query(
            "SELECT p.puballtables, pg_has_role(p.pubowner, 'USAGE') FROM pg_publication p WHERE "
            "p.pubname = %s",
            (self.offsets.publication_name,),
        )
        if s.in_recovery:
            pass  # a standby's publication is the primary's: check_prerequisites names what it lacks
        elif pub and not pub[0][0] and scope:
            published = {
                TableName(a, b)
                for a, b in self.server.query(
                    "SELECT schemaname, tablename FROM pg_publication_tables WHERE pubname = %s",
                    (self.offsets.publication_name,),
                )
            }
            missing = [t for t in [*scope, *wms] if t not in published and (t in rows or t in wms)]
            not_owned = [t for t in missing if t not in wms and not rows[t][2]]
            if missing and (not pub[0][1] or not_owned):
                problems.append(
                    f"publication {self.offsets.publication_name!r} lacks "
                    f"{', '.join(map(str, missing))} and role {s.user!r} "
                    "may not add them (PostgreSQL demands ownership of the publication and of each "
                    "table): have an "
                    "administrator run ALTER PUBLICATION "
                    f"{self.server.quote_ident(self.offsets.publication_name)} ADD TABLE "
                    f"{self.server.qlist(missing)}"
                )
        elif not pub and scope:
            not_owned = [t for t in scope if t in rows and not rows[t][2]]
            if not db_create or not_owned:
                why = (
                    [] if db_create else [f"CREATE on database {self.server.params.database or 'postgres'!r}"]
                )
                if not_owned:
                    why.append(f"ownership of {', '.join(map(str, not_owned))}")
                problems.append(
                    f"publication {self.offsets.publication_name!r} does not exist and role {s.user!r} "
                    "cannot create it (it "
                    f"needs {' and '.join(why)}): have an administrator run CREATE PUBLICATION "
                    f"{self.server.quote_ident(self.offsets.publication_name)} FOR TABLE "
                    f"{self.server.qlist([*scope, *wms])} WITH "
                    "(publish_via_partition_root = true) (the docs' connections page, 'Grants', set-up 2)"
                )
        return problems

    def check_readable(self, table: TableName) -> None:
        row = self.server.query(
            "SELECT has_schema_privilege(n.oid, 'USAGE'), has_table_privilege(c.oid, 'SELECT'), current_user "
            "FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s AND "
            "c.relname = %s",
            (table.schema, table.name),
        )
        if row and not (row[0][0] and row[0][1]):
            role = self.server.quote_ident(row[0][2])
            grant = (
                f"GRANT USAGE ON SCHEMA {self.server.quote_ident(table.schema)} TO {role}"
                if not row[0][0]
                else f"GRANT SELECT ON {self.server.quote_table(table)} TO {role}"
            )
            raise SourceError(f"role {row[0][2]!r} may not read table {table}: {grant}")
