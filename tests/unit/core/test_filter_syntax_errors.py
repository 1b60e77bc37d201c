"""A ``where`` conf with a syntax error says so in a user's terms (issue 47): the conf key, the
column, a caret under the place, what is wrong and what a filter looks like; never sqlglot's
internals (class names such as sqlglot.expressions.core.GT, "Required keyword")."""

from __future__ import annotations

import pytest

from airflow_provider_cdc.core.errors import ConfigurationError
from airflow_provider_cdc.core.planning import validate_where


@pytest.mark.parametrize(("where", "said", "column"), [
    ("amount >", "'>' is missing what comes after it", 8),
    ("amount > 5 AND (status = 1", "a '(' is not closed", 26),
    ("WHERE amount = 1", "'WHERE' is not expected there", 1),
    ("status = 'paid", "a quote is not closed", None),
])
def test_a_syntax_error_names_the_conf_key_the_place_and_what_is_wrong(where, said, column):
    with pytest.raises(ConfigurationError) as info:
        validate_where(where)
    text = str(info.value)
    head = text.splitlines()[0]
    assert head.startswith("conf key 'where' has a syntax error") and said in head, text
    if column is not None:
        assert f"at column {column}:" in head
        lines = text.splitlines()
        assert lines[1] == f"  {where}" and lines[2] == "  " + " " * (column - 1) + "^", text
    assert "e.g. amount > 100 AND status = 'paid'" in text
    for internal in ("sqlglot", "Required keyword", "expressions", "Error tokenizing", "<class"):
        assert internal not in text, text
    assert info.value.__cause__ is None and info.value.__suppress_context__  # no parser traceback under it
