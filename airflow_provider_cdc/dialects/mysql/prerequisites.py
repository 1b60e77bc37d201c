"""What a MySQL or MariaDB source must have: binlog settings (per flavour, server.py), the role's
grants, readable tables, a primary that logs what a replica applies; the dialect's ``prerequisites``.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable, Sequence

import pymysql
import pymysql.cursors

from ...core.errors import SourceError, SourceUnreachableError
from ...core.schema import TableName
from .server import Flavour, MyServer, ReplicaStatusDenied

log = logging.getLogger(__name__)

#: table / database / column access denied, command denied: a missing grant
_ER_ACCESS_DENIED = frozenset({1142, 1044, 1143, 1227, 1045})


# --------------------------------------------------------------------------- prerequisites

REQUIRED_SETTINGS = {
    "log_bin": ("ON", "start the server with --log-bin (needs a restart)"),
    "binlog_format": ("ROW", "SET GLOBAL binlog_format = 'ROW' and binlog_format=ROW in the server config"),
    "binlog_row_image": (
        "FULL",
        "SET GLOBAL binlog_row_image = 'FULL' and binlog_row_image=FULL in the server config",
    ),
    "binlog_row_metadata": (
        "FULL",
        "SET GLOBAL binlog_row_metadata = 'FULL' and binlog_row_metadata=FULL in the server config "
        "(it applies to events written after it is set; needs MariaDB >= 10.5 or MySQL >= 8.0.14)",
    ),
}
_GRANT_RE = re.compile(r"^GRANT (?P<privs>.+?) ON (?P<on>\S+) TO ", re.IGNORECASE)


def held_privileges(grants: Iterable[str], on: Iterable[str]) -> set[str]:
    """The privileges (upper case, spaces folded) that lines of ``SHOW GRANTS`` give on any of
    ``on`` (``*.*``, ``db.*``; backticks ignored)."""
    targets, held = set(on), set()
    for line in grants:
        m = _GRANT_RE.match(line.strip())
        if m and m.group("on").replace("`", "") in targets:
            held.update(re.sub(r"\s+", " ", p.strip().upper()) for p in m.group("privs").split(","))
    return held


def prerequisite_problems(
    settings: dict[str, str | None], grants: Iterable[str], flavour: Flavour
) -> list[str]:
    """Every unmet CDC prerequisite with its fix. ``settings`` maps variable name (lower
    case) to its value (None = the server does not have it); ``grants`` are the lines of
    ``SHOW GRANTS FOR CURRENT_USER()``. Pure, so every branch is testable with values."""
    problems = []
    for var, (want, fix) in REQUIRED_SETTINGS.items():
        got = settings.get(var)
        if got is None:
            problems.append(f"{var} is not a variable of this server (want {want}): {fix}")
        elif str(got).upper() != want:
            problems.append(f"{var} is {got!r}, must be {want}: {fix}")
    for var, want, fix in flavour.optional_settings:
        got = settings.get(var)
        if got is not None and str(got).upper() != want:
            problems.append(
                f"{var} is {got!r}, must be {want} (compressed binlog events cannot be read): {fix}"
            )
    held = held_privileges(grants, ("*.*",))
    if "ALL PRIVILEGES" not in held and "ALL" not in held:
        missing = [" or ".join(group) for group in flavour.privileges if not held.intersection(group)]
        if missing:
            problems.append(
                f"the connection user lacks privilege(s) {', '.join(missing)} on *.*: {flavour.grant_hint}"
            )
    return problems


class MyPrerequisites:
    """Checks of the source, read-only: nothing is created before every one holds."""

    def __init__(
        self,
        server: MyServer,
        *,
        tables: frozenset[TableName] | None,
        watermark_table: TableName,
        watermark_tables: Callable[[], list[TableName]],
    ) -> None:
        self.server = server
        self.tables = tables  # the capture scope
        self.watermark_table = watermark_table
        self.watermark_tables = watermark_tables  # the tables the watermark strategy writes

    # --- prerequisites and metadata ---------------------------------------------------
    def check(self) -> None:
        names = [*REQUIRED_SETTINGS, *(v for v, _, _ in self.server.flavour.optional_settings)]
        # SHOW (not information_schema.GLOBAL_VARIABLES, which MySQL 8 removed) works on both
        rows = self.server.query(
            "SHOW GLOBAL VARIABLES WHERE Variable_name IN (" + ", ".join(["%s"] * len(names)) + ")", names
        )
        settings: dict[str, str | None] = {n: None for n in names}
        settings.update({name.lower(): value for name, value in rows})
        grants = [r[0] for r in self.server.query("SHOW GRANTS FOR CURRENT_USER()")]
        problems = prerequisite_problems(settings, grants, self.server.flavour) + self.privilege_problems(
            grants
        )
        problems += self.replica_problems()
        if problems:
            where = f"{self.server.params.host}:{self.server.params.port or 3306}"
            raise SourceError(
                f"{self.server.flavour.name} server {where} (source {self.server.source!r}) cannot "
                "serve CDC:\n- " + "\n- ".join(problems)
            )

    def replica_problems(self) -> list[str]:
        """A source that is itself a replica is captured from its own binlog, which holds what it
        applies from its primary only with ``log_slave_updates`` (MySQL: ``log_replica_updates``);
        without it capture there would see none of the primary's changes. Whether the server is
        a replica is ``SHOW SLAVE STATUS``'s (``SLAVE MONITOR``; MySQL ``REPLICATION CLIENT``); a
        role that may not ask is warned once, not refused."""
        rows = self.server.query(
            "SHOW GLOBAL VARIABLES WHERE Variable_name IN ('log_slave_updates', 'log_replica_updates')"
        )
        if any(str(v).upper() in ("ON", "1") for _, v in rows):
            return []
        if (
            self.server.flavour.name == "mariadb"
            and not self.server.query("SELECT @@global.gtid_slave_pos")[0][0]
        ):
            return []  # it never applied a primary's transaction (readable without SLAVE MONITOR)
        of = self.replica_of()
        if of is None:
            return []
        return [
            f"this server is a replica (of {of}) and log_slave_updates is OFF: what it applies from "
            "its primary "
            "is not in its own binlog, so capture here would see none of the primary's changes. Set "
            "log_slave_updates=ON in the replica's server config (needs a restart), or point the "
            "source at the "
            "primary"
        ]

    def replica_of(self) -> str | None:
        """``host:port`` of the primary this server replicates from; None when it does not (or
        the role may not ask: see :meth:`replica_problems`)."""
        try:
            row = self.server.slave_status()
        except ReplicaStatusDenied as exc:
            log.warning(
                "source %r: cannot tell whether the server is a replica (SHOW SLAVE STATUS: %s); if it is, "
                "it must run with log_slave_updates=ON. GRANT SLAVE MONITOR (MySQL: REPLICATION CLIENT) "
                "to have this checked",
                self.server.source,
                exc,
            )
            return None
        return None if row is None else f"{row.get('Master_Host')}:{row.get('Master_Port')}"

    def check_readable(self, table: TableName) -> None:
        try:
            self.server.query(f"SELECT 1 FROM {self.server.quote_table(table)} WHERE 1 = 0")  # noqa: S608
        except pymysql.err.MySQLError as exc:
            if exc.args and exc.args[0] in _ER_ACCESS_DENIED:
                raise SourceError(
                    f"user {self.server.params.user!r} may not read table {table} ({exc.args[-1]}): "
                    "GRANT SELECT ON "
                    f"{self.server.quote_table(table)} TO {self.server.params.user!r}"
                ) from None
            if exc.args and exc.args[0] in (1049, 1146):  # unknown database / table: describe_table names it
                return
            raise

    def privilege_problems(self, grants: Sequence[str]) -> list[str]:
        """The grants on the captured tables and the watermark table the user lacks, each as the
        statement that gives it; ``grants``: the lines of SHOW GRANTS that check_prerequisites read."""
        problems = []
        for table in sorted(self.tables or (), key=str):
            try:
                self.check_readable(table)
            except SourceUnreachableError:
                raise  # not a missing grant: the check cannot run now
            except SourceError as exc:
                problems.append(str(exc))
        if self.watermark_tables():  # watermark strategy "table"
            return problems + self.watermark_table_problems(grants)
        return problems + self.log_watermark_problems()

    def log_watermark_problems(self) -> list[str]:
        """Watermark strategy "log": no watermark table, a MariaDB snapshot position."""
        if self.server.flavour.name != "mariadb":
            return [
                "watermark_strategy 'log' needs MariaDB (its consistent snapshots report their binlog "
                "position); "
                f"this server is {self.server.flavour.name}: use watermark_strategy 'table'"
            ]
        return []

    def watermark_table_problems(self, grants: Sequence[str]) -> list[str]:
        """Watermark strategy "table": the watermark table's grants, or the grant to create it."""
        problems: list[str] = []
        wm, user = self.watermark_table, self.server.params.user
        try:
            self.server.query(f"SELECT `value` FROM {self.server.quote_table(wm)} WHERE 1 = 0")  # noqa: S608
        except pymysql.err.MySQLError as exc:
            if exc.args and exc.args[0] in _ER_ACCESS_DENIED:
                problems.append(
                    f"GRANT SELECT, UPDATE ON {self.server.quote_table(wm)} TO {user!r} (the watermark table)"
                )
            elif (
                exc.args
                and exc.args[0] in (1049, 1146)
                and not held_privileges(grants, ("*.*", f"{wm.schema}.*"))
                & {"CREATE", "ALL", "ALL PRIVILEGES"}
            ):
                problems.append(
                    f"the watermark table {wm} does not exist and user {user!r} may not create it: "
                    "GRANT CREATE ON "
                    f"{self.server.quote_ident(wm.schema)}.* TO {user!r}, or have an administrator "
                    "create it (the docs' "
                    "connections page, 'Grants', set-up 2)"
                )
        return problems
