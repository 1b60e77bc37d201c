"""A snapshot's row filter (``where``) is untrusted input, not SQL to run.

Anyone who may trigger the snapshot DAG sets it, and chunk queries run with the capture
role's privileges; pasted into a statement, ``n < 100) OR (n > 0`` escaped its parentheses
and a function call or subquery reached the source. So the filter is parsed (sqlglot, in the
source's dialect), checked against an allowlist, and rendered back by this module: every
identifier quoted by the dialect's quoter, every literal bound as a parameter, every
sub-expression in parentheses. Allowed: the table's own columns (unqualified), string and
number literals, TRUE/FALSE, arithmetic (+ - * / %), comparisons (= <> != < <= > >=), AND / OR / NOT,
parentheses, ``IN (literals)``, ``BETWEEN``, ``LIKE`` (``ILIKE`` on PostgreSQL) and ``IS [NOT] NULL``.
Anything else is refused with a ConfigurationError naming the setting and the part.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from .errors import ConfigurationError
from .sqlnames import quote_mysql, quote_pg


@dataclass(frozen=True)
class FilterRules:
    """How one database reads and writes a filter: the sqlglot dialect it is parsed in
    (``read``), its identifier quoter and whether it has ``ILIKE``. A database's profile
    (dialects/<db>/profile.py) names its rules; core keeps the rules of the databases it
    knows by name because a snapshot request checks its filter here before the source's
    database is known (check_filter), and core imports no dialect."""

    read: str
    quote: Callable[[str], str]
    ilike: bool = False


#: the filter rules by dialect name (the values a profile's ``filter_rules`` points to)
DIALECTS: dict[str, FilterRules] = {
    "postgres": FilterRules("postgres", quote_pg, ilike=True),
    "mysql": FilterRules("mysql", quote_mysql),
}
ALLOWED = (
    "the table's columns, string and number literals, TRUE/FALSE, arithmetic (+ - * / %), "
    "comparisons (= <> != < <= > >=), "
    "AND/OR/NOT, parentheses, IN (literals), BETWEEN, LIKE (ILIKE on PostgreSQL) and IS [NOT] NULL"
)


def _parse(text: str, rules: FilterRules, setting: str):
    import sqlglot
    from sqlglot.errors import SqlglotError

    if not isinstance(text, str):
        raise ConfigurationError(f"filter {setting!r} must be a string, got {type(text).__name__}")
    if not text.strip():
        raise ConfigurationError(f"filter {setting!r} is empty; omit it or give a condition")
    try:
        trees = sqlglot.parse(text, read=rules.read)
    except SqlglotError as exc:
        raise ConfigurationError(syntax_error_text(text, setting, exc)) from None
    trees = [t for t in trees if t is not None]
    if len(trees) != 1:
        raise ConfigurationError(
            f"filter {setting!r} must be a single condition, not {len(trees)} statements: {text!r}"
        )
    return trees[0]


#: a sqlglot parse error's description -> what is wrong, in a user's terms ({at}: the token there)
_SYNTAX_WORDS = (
    ("Expecting )", "a '(' is not closed"),
    ("Required keyword: 'expression' missing", "{at} is missing what comes after it"),
    ("Required keyword: 'this' missing", "{at} is missing what comes before it"),
    ("Invalid expression / Unexpected token", "{at} is not expected there"),
)


def syntax_error_text(text: str, setting: str, exc: Exception) -> str:
    """A filter's syntax error named by its conf key and position, with a caret under it, and what a
    filter looks like; never the parser's internals (class names, token types)."""
    errors = getattr(exc, "errors", None) or []
    first = errors[0] if errors else {}
    col = first.get("col") if isinstance(first.get("col"), int) else None
    at = repr(first.get("highlight") or "")
    description = str(first.get("description") or "")
    what = next((w.format(at=at) for key, w in _SYNTAX_WORDS if description.startswith(key)), None)
    if not errors:  # the tokenizer: an unclosed quote, an unknown character
        what = (
            "a quote is not closed (text is in single quotes: status = 'paid')"
            if text.count("'") % 2
            else "it cannot be read as SQL"
        )
    what = what or "it is not valid SQL there"
    start = (
        max(1, col - len(first.get("highlight") or " ") + 1) if col else None
    )  # sqlglot's col: the token's end
    where = f" at column {start}" if start else ""
    pointer = f"\n  {text}\n  {' ' * (start - 1)}^" if start and "\n" not in text else ""
    return (
        f"conf key {setting!r} has a syntax error{where}: {what}.{pointer}\n"
        f"A filter is one row condition, e.g. amount > 100 AND status = 'paid'; it may use {ALLOWED}"
    )


class _Renderer:
    def __init__(self, rules: FilterRules, setting: str, columns: Iterable[str] | None) -> None:
        self.rules, self.setting = rules, setting
        self.dialect = rules.read
        self.quote = rules.quote
        self.columns = None if columns is None else list(columns)
        self.params: list[Any] = []
        self.used: list[str] = []

    def refuse(self, node, why: str) -> ConfigurationError:
        return ConfigurationError(
            f"filter {self.setting!r}: {node.sql(dialect=self.dialect)!r} is not allowed ({why}); a "
            f"filter may use {ALLOWED}"
        )

    def only(self, node, *keys: str) -> bool:
        """Refuse a node carrying anything this renderer would not render (an ESCAPE, a
        quantifier, a flag a newer sqlglot adds): nothing is silently dropped. Returns its
        ``negate`` flag (``IS NOT``, ``NOT LIKE``)."""
        for k, v in node.args.items():
            if k in keys or k == "negate" or v is None or v is False or v == [] or v == "":
                continue
            raise self.refuse(node, f"its part {k!r} is not supported")
        return bool(node.args.get("negate"))

    def neg(self, node, sql: str, *keys: str) -> str:
        return f"(NOT {sql})" if self.only(node, *keys) else sql

    def value(self, node) -> str:
        from sqlglot import exp

        if isinstance(node, exp.Literal):
            self.only(node, "this", "is_string")
            self.params.append(node.this if node.is_string else _number(node.this))
            return "%s"
        if isinstance(node, exp.Neg) and isinstance(node.this, exp.Literal) and not node.this.is_string:
            self.params.append(-_number(node.this.this))
            return "%s"
        if isinstance(node, exp.Boolean):
            self.only(node, "this")
            self.params.append(bool(node.this))
            return "%s"
        if isinstance(node, exp.Column):
            return self.column(node)
        if isinstance(node, exp.Paren):
            return self.value(node.this)
        # arithmetic on columns and literals (``id % 10 = 0``); '%' doubled: statements are %-formatted
        arith = {exp.Add: "+", exp.Sub: "-", exp.Mul: "*", exp.Div: "/", exp.Mod: "%%"}
        if type(node) in arith:
            # ``safe`` (x / 0 and x % 0 are NULL) and ``typed`` (integer division) describe the
            # parse dialect's own arithmetic (sqlglot sets them from the dialect, MySQL's '%'
            # since 30.x). The filter is rendered back for that same database, so its operator
            # keeps exactly those semantics: the flags are read, not dropped
            self.only(node, "this", "expression", "safe", "typed")
            return f"({self.value(node.this)} {arith[type(node)]} {self.value(node.expression)})"
        raise self.refuse(node, "only columns and literals may be compared")

    def column(self, node) -> str:
        from sqlglot import exp

        if node.table or not isinstance(node.this, exp.Identifier):
            raise self.refuse(node, "columns are named without a table or schema")
        self.only(node, "this")
        self.only(node.this, "this", "quoted")
        name = node.this.this
        if self.columns is not None and name not in self.columns:
            raise ConfigurationError(
                f"filter {self.setting!r} names column {name!r}, which the table does not have; "
                f"columns: {self.columns}"
            )
        self.used.append(name)
        return self.quote(name)

    def cond(self, node) -> str:
        from sqlglot import exp

        ops = {exp.EQ: "=", exp.NEQ: "<>", exp.GT: ">", exp.GTE: ">=", exp.LT: "<", exp.LTE: "<="}
        if isinstance(node, exp.Paren):
            return self.neg(node, self.cond(node.this), "this")
        if isinstance(node, exp.And | exp.Or):
            word = "AND" if isinstance(node, exp.And) else "OR"
            return self.neg(
                node, f"({self.cond(node.this)} {word} {self.cond(node.expression)})", "this", "expression"
            )
        if isinstance(node, exp.Not):
            self.only(node, "this")
            return f"(NOT {self.cond(node.this)})"
        if type(node) in ops:
            sql = f"({self.value(node.this)} {ops[type(node)]} {self.value(node.expression)})"
            return self.neg(node, sql, "this", "expression")
        if isinstance(node, exp.Is):
            if not isinstance(node.expression, exp.Null):
                raise self.refuse(node, "IS takes NULL only")
            return self.neg(node, f"({self.value(node.this)} IS NULL)", "this", "expression")
        if isinstance(node, exp.In):
            if not node.expressions:
                raise self.refuse(node, "IN takes a list of literals")
            left = self.value(node.this)
            items = []
            for e in node.expressions:
                if isinstance(e, exp.Column):
                    raise self.refuse(e, "IN takes a list of literals")
                items.append(self.value(e))
            return self.neg(node, f"({left} IN ({', '.join(items)}))", "this", "expressions")
        if isinstance(node, exp.Between):
            sql = (
                f"({self.value(node.this)} BETWEEN {self.value(node.args['low'])} AND "
                f"{self.value(node.args['high'])})"
            )
            return self.neg(node, sql, "this", "low", "high")
        if isinstance(node, exp.Like) or (isinstance(node, exp.ILike) and self.rules.ilike):
            word = "LIKE" if isinstance(node, exp.Like) else "ILIKE"
            pattern = node.expression
            if not (isinstance(pattern, exp.Literal) and pattern.is_string):
                raise self.refuse(node, f"{word} takes a string literal pattern")
            return self.neg(
                node, f"({self.value(node.this)} {word} {self.value(pattern)})", "this", "expression"
            )
        if isinstance(node, exp.Column | exp.Boolean):  # a boolean column or TRUE alone
            return f"({self.value(node)})"
        raise self.refuse(node, f"{type(node).__name__} is not a row condition this filter takes")


def _number(text: str) -> int | Decimal:
    try:
        return int(text)
    except ValueError:
        return Decimal(text)


def render_filter(
    text: str,
    dialect: str | FilterRules,
    *,
    setting: str = "where",
    columns: Iterable[str] | None = None,
) -> tuple[str, list[Any]]:
    """``(sql, params)`` of the filter for ``dialect`` (a name of DIALECTS, or a database's
    FilterRules): parenthesised, identifiers quoted (``%`` doubled, as the drivers %-format),
    literals as ``%s`` parameters in order. With ``columns``, every column must be one of them."""
    if isinstance(dialect, FilterRules):
        rules = dialect
    elif dialect in DIALECTS:
        rules = DIALECTS[dialect]
    else:
        raise ConfigurationError(
            f"no row filter rendering for dialect {dialect!r}; known: {sorted(DIALECTS)}"
        )
    r = _Renderer(rules, setting, columns)
    sql = r.cond(_parse(text, rules, setting))
    return sql, r.params


def check_filter(text: str, *, setting: str = "where") -> str:
    """The request-time check (the source's dialect not known yet): the filter must be
    allowed in at least one dialect. Returns it stripped; the plan checks it again against
    the table's columns in the source's dialect, and every query renders it again."""
    errors = []
    for dialect in DIALECTS:
        try:
            render_filter(text, dialect, setting=setting)
            return text.strip()
        except ConfigurationError as exc:
            errors.append(exc)
    raise errors[0]


RenderFilter = Callable[[str], tuple[str, list[Any]]]
