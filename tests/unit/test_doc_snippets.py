"""Every fenced code block of README.md and docs/*.md is checked, so an example that no longer
works fails `make test` (marker unit: no database, no Spark, no network).

What each block's language gets:

- ``python``: compiled, then executed in a fresh namespace in a temporary working directory.
- ``bash``, ``sh``, ``shell``, ``console``: each command line that runs ``airflow-cdc ...`` or
  ``airflow cdc ...`` is parsed by the real argument parser (``airflow_provider_cdc.cli._parser``),
  so an unknown subcommand, flag or choice fails; the conf of ``airflow dags trigger cdc_snapshot...
  -c '{...}'`` is validated by the snapshot DAG's own conf parser
  (``pipeline.snapshot_conf.parse_snapshot_conf``). Other commands (``make``, ``export``,
  ``airflow dags ...``) are not run.
- ``json``, ``yaml``: parsed; a document with a ``sources`` key is a sources config and goes
  through its validator (``sources_config.parse_sources``), the one the DAG file uses.
- ``sql``: parsed by sqlglot in one of the PostgreSQL, MySQL, Spark or Trino dialects: a loose
  syntax check (sqlglot accepts statements it does not know, such as ``CREATE PUBLICATION``, as
  commands), nothing is run.
- ``text``: not checked (program output, diagrams). A block without a language, or with one not
  listed here, fails: mark it ``text`` or add a checker.
- MyST directives (```` ```{toctree} ````, ``{include}``, ``{eval-rst}``) are left to the Sphinx
  build (tests/unit/test_docs.py).

Two HTML comments (they render as nothing on GitHub and in the site) before a block change that:

    <!-- doc-test: with-lake -->

runs the ``python`` block in a working directory holding ``lake/cdc``, a small pipeline data
location: the Delta mirror of table ``public.orders`` for the sources ``shop`` and
``cdc_source`` (a copy of tests/fixtures/mirror_v1, columns ``id`` and ``v``) and its event
log, three events of key 42 with ``after.amount`` (a Delta table, as the sink writes it); and

    <!-- doc-test: skip (why) -->

for a block that needs what a unit test does not have (a live database, a Spark session, a
package the provider does not install).

A skipped ``python`` block is still compiled; a skipped shell block's ``airflow-cdc`` lines are
still parsed. The reason is required, and the number of skips is capped (``MAX_SKIPS``) so that
skipping stays the exception.
"""

from __future__ import annotations

import json
import os
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SKIP_RE = re.compile(r"<!--\s*doc-test:\s*skip\s*\((?P<why>[^)]+)\)\s*-->")
LAKE_RE = re.compile(r"<!--\s*doc-test:\s*with-lake\s*-->")
FENCE_RE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>.*)$")
SHELL = {"bash", "sh", "shell", "console"}
CHECKED = {"python", "json", "yaml", "yml", "sql", "text"} | SHELL
MAX_SKIPS = 4


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # 1-based line of the opening fence
    lang: str
    code: str
    skip: str | None  # the reason of a doc-test skip marker
    lake: bool = False  # a doc-test with-lake marker: run beside lake/cdc (make_lake)

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def doc_files() -> list[Path]:
    docs = sorted(p for p in (ROOT / "docs").glob("*.md"))
    return [ROOT / "README.md", *docs]


def blocks_of(path: Path) -> list[Block]:
    """The fenced blocks of a Markdown file (CommonMark fences, indented ones in lists too)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    out: list[Block] = []
    i = 0
    while i < len(lines):
        m = FENCE_RE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence, info = m.group("indent"), m.group("fence"), m.group("info").strip()
        start = i
        body: list[str] = []
        i += 1
        while i < len(lines):
            close = FENCE_RE.match(lines[i])
            if close and close.group("fence")[0] == fence[0] and len(close.group("fence")) >= len(fence) \
                    and not close.group("info").strip():
                break
            body.append(lines[i][len(indent):] if lines[i].startswith(indent) else lines[i].lstrip())
            i += 1
        else:
            raise AssertionError(f"{path.relative_to(ROOT)}:{start + 1}: code block never closed")
        i += 1
        skip, lake = None, False
        j = start - 1
        while j >= 0 and not lines[j].strip():
            j -= 1
        if j >= 0:
            sm = SKIP_RE.search(lines[j])
            if sm:
                skip = sm.group("why").strip()
            lake = bool(LAKE_RE.search(lines[j]))
        lang = info.split()[0].lower() if info else ""
        out.append(Block(path, start + 1, lang, "\n".join(body) + "\n", skip, lake))
    return out


ALL_BLOCKS = [b for f in doc_files() for b in blocks_of(f)]
CODE_BLOCKS = [b for b in ALL_BLOCKS if not b.lang.startswith("{")]  # MyST directives: Sphinx's


# --- the checkers ------------------------------------------------------------------------------
def shell_commands(code: str, console: bool) -> list[list[str]]:
    """Each simple command of a shell block as its words (continuations joined, comments and
    console prompts dropped, split at ; && || | $( and backticks)."""
    text = code.replace("\\\n", " ")
    commands: list[list[str]] = []
    for raw in text.splitlines():
        line = raw.strip()
        if console:
            if not line.startswith("$ "):
                continue  # output
            line = line[2:]
        if not line or line.startswith("#"):
            continue
        lex = shlex.shlex(line, posix=True, punctuation_chars=";&|()`")
        lex.whitespace_split = True
        lex.commenters = "#"
        current: list[str] = []
        for tok in lex:
            if tok and set(tok) <= set(";&|()`"):
                if current:
                    commands.append(current)
                current = []
                continue
            current.append(tok)
        if current:
            commands.append(current)
    return commands


def cdc_args(words: list[str]) -> list[str] | None:
    """The arguments of an ``airflow-cdc``/``airflow cdc`` command (after env assignments and
    ``until``/``if``/``do``...), else None."""
    while words and (re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0]) or words[0] in
                     ("until", "while", "if", "then", "do", "!", "time", "exec")):
        words = words[1:]
    if words[:1] == ["airflow-cdc"]:
        return words[1:]
    if words[:2] == ["airflow", "cdc"]:
        return words[2:]
    return None


def trigger_conf(words: list[str]) -> dict | None:
    """The conf of ``airflow dags trigger cdc_snapshot[__source] -c '{...}'``, else None."""
    if words[:3] != ["airflow", "dags", "trigger"] or len(words) < 4 or not words[3].startswith("cdc_snapshot"):
        return None
    for flag in ("-c", "--conf"):
        if flag in words:
            return json.loads(words[words.index(flag) + 1])
    return None


def check_shell(block: Block) -> None:
    from airflow_provider_cdc.cli import _parser
    from airflow_provider_cdc.pipeline.snapshot_conf import parse_snapshot_conf

    for words in shell_commands(block.code, console=block.lang == "console"):
        args = cdc_args(words)
        if args is not None:
            try:
                _parser().parse_args(args)
            except SystemExit as exc:
                pytest.fail(f"{block.where}: `{shlex.join(words)}` is refused by airflow-cdc's parser (exit {exc.code})")
            continue
        conf = trigger_conf(words)
        if conf is not None:
            parse_snapshot_conf(conf, default_tables=["public.orders"])


def check_sources_config(doc: object, block: Block) -> None:
    if isinstance(doc, dict) and "sources" in doc:
        from airflow_provider_cdc.sources_config import parse_sources

        parse_sources(doc, origin=block.where, env={})


def make_lake(root: Path) -> None:
    """``root/lake/cdc``: a data location with the mirror of public.orders (sources shop and
    cdc_source) and its event log (three events of key 42, written by the event-log sink: a
    Delta table)."""
    import shutil

    import pyarrow as pa

    from airflow_provider_cdc.core.position import Position
    from airflow_provider_cdc.core.schema import Column, TableName, TableSchema, encode_row
    from airflow_provider_cdc.sinks.base import EVENT_SCHEMA
    from airflow_provider_cdc.sinks.event_log import EventLogSink
    from airflow_provider_cdc.storage.layout import schema_path

    data_dir = root / "lake" / "cdc"
    table = TableName("public", "orders")
    schema = TableSchema(table, (Column("id", "int64"), Column("amount", "float64")), ("id",))
    for source in ("shop", "cdc_source"):
        shutil.copytree(ROOT / "tests" / "fixtures" / "mirror_v1", data_dir / "output" / source / "mirror" / "public.orders")
        staged = Path(schema_path(str(data_dir), source, table))
        staged.parent.mkdir(parents=True, exist_ok=True)
        staged.write_text(schema.to_json())
        pos = [Position(i).encode() for i in (1, 2, 3)]
        rows = [("r", {"id": 42, "amount": 1.5}), ("u", {"id": 42, "amount": 2.5}), ("d", None)]
        EventLogSink(str(data_dir), source).write(pa.Table.from_pylist([
            {"position": p, "table": table.id, "op": op, "key": "[42]", "before": None,
             "after": None if after is None else encode_row(after), "ts_ms": i, "watermark": None,
             "snapshot": op == "r", "batch": f"c-{pos[0]}-{pos[-1]}"}
            for i, (p, (op, after)) in enumerate(zip(pos, rows, strict=True))], schema=EVENT_SCHEMA))


def check_python(block: Block, tmp_path: Path) -> None:
    compiled = compile(block.code, block.where, "exec")
    if block.skip:
        return
    if block.lake:
        make_lake(tmp_path)
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        exec(compiled, {"__name__": "__doc_snippet__"})  # noqa: S102 - the documentation's own example
    finally:
        os.chdir(cwd)


def check_sql(block: Block) -> None:
    import sqlglot

    errors = []
    for dialect in ("postgres", "mysql", "spark", "trino"):
        try:
            sqlglot.parse(block.code, read=dialect)
            return
        except Exception as exc:  # noqa: BLE001 - any parse error: try the next dialect
            errors.append(f"{dialect}: {exc}")
    pytest.fail(f"{block.where}: SQL parses in no dialect:\n" + "\n".join(errors))


def check(block: Block, tmp_path: Path) -> None:
    if block.lang not in CHECKED:
        pytest.fail(f"{block.where}: code block with language {block.lang or '(none)'!r}: give it one of "
                    f"{sorted(CHECKED)} (``text`` for output and diagrams)")
    if block.lang == "python":
        check_python(block, tmp_path)
    elif block.lang in SHELL:
        check_shell(block)
    elif block.lang == "json":
        check_sources_config(json.loads(block.code), block)
    elif block.lang in ("yaml", "yml"):
        import yaml

        check_sources_config(yaml.safe_load(block.code), block)
    elif block.lang == "sql":
        check_sql(block)


# --- the tests ---------------------------------------------------------------------------------
@pytest.mark.parametrize("block", CODE_BLOCKS, ids=[b.where for b in CODE_BLOCKS])
def test_code_block(block: Block, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("CDC_TABLES", raising=False)
    check(block, tmp_path)


def test_the_docs_have_code_blocks_and_skips_are_few_and_give_a_reason() -> None:
    assert len(CODE_BLOCKS) > 40, "the block parser found too few blocks: is it broken?"
    langs = {b.lang for b in CODE_BLOCKS}
    assert {"python", "bash", "json", "yaml", "sql"} <= langs, langs
    skipped = [b.where for b in CODE_BLOCKS if b.skip]
    assert len(skipped) <= MAX_SKIPS, f"{len(skipped)} skipped blocks (at most {MAX_SKIPS}): {skipped}"
    for f in doc_files():
        text = f.read_text(encoding="utf-8")
        bad = [m.group(0) for m in re.finditer(r"<!--\s*doc-test[^>]*-->", text)
               if not (SKIP_RE.fullmatch(m.group(0)) or LAKE_RE.fullmatch(m.group(0)))]
        assert not bad, (f"{f.relative_to(ROOT)}: malformed doc-test marker(s) {bad}: write "
                         "<!-- doc-test: skip (why) --> or <!-- doc-test: with-lake -->")


def test_the_checkers_catch_broken_examples(tmp_path: Path) -> None:
    """A broken example fails: an unknown flag, an unknown subcommand, a bad conf, a bad sources
    config, broken Python, a block without a language."""
    from airflow_provider_cdc.core.errors import ConfigurationError

    def block(lang: str, code: str) -> Block:
        return Block(ROOT / "README.md", 1, lang, code, None)

    with pytest.raises(pytest.fail.Exception, match="refused by airflow-cdc's parser"):
        check(block("bash", "airflow-cdc verify --table public.orders --no-such-flag\n"), tmp_path)
    with pytest.raises(pytest.fail.Exception, match="refused by airflow-cdc's parser"):
        check(block("bash", "until airflow cdc no-such-command; do sleep 1; done\n"), tmp_path)
    with pytest.raises(ConfigurationError, match="unknown conf key"):
        check(block("bash", "airflow dags trigger cdc_snapshot -c '{\"action\": \"start\", \"tabels\": []}'\n"), tmp_path)
    with pytest.raises(ConfigurationError):
        check(block("yaml", "sources:\n  shop:\n    tables: [public.orders]\n    no_such_key: 1\n"), tmp_path)
    with pytest.raises(NameError):
        check(block("python", "undefined_name\n"), tmp_path)
    with pytest.raises(pytest.fail.Exception, match="language"):
        check(block("", "anything\n"), tmp_path)
    check(block("bash", "airflow-cdc snapshot pause --table public.orders  # a comment\n"), tmp_path)
