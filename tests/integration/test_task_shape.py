"""A task's fields, written in three places, are one shape: the engine's
``batonq.task_view``, ``models.Task`` (what the clients return) and
``schemas.TaskOut`` (what the HTTP API and the MCP server send)."""

from __future__ import annotations

import dataclasses
import types
import typing
from datetime import datetime
from typing import Any, Literal

import psycopg

from batonq import models, schemas

# PostgreSQL's types as the clients read them.
PYTHON_TYPES: dict[str, Any] = {
    "bigint": int,
    "integer": int,
    "text": str,
    "timestamp with time zone": datetime,
    "jsonb": Any,
}
# Ids travel as t_5521 over HTTP and MCP.
ID_FIELDS = {"id": "task_id", "parent_id": "parent_id", "root_id": "root_id"}


def _base(annotation: Any) -> tuple[Any, bool]:
    """``(type, nullable)`` of an annotation such as ``int | None``."""
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        kept = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
        return (kept[0] if len(kept) == 1 else annotation), len(kept) < len(typing.get_args(annotation))
    return annotation, False


def _model_fields() -> dict[str, Any]:
    hints = typing.get_type_hints(models.Task)
    return {f.name: hints[f.name] for f in dataclasses.fields(models.Task)}


def test_the_engines_task_view_and_models_task_have_the_same_fields_and_types(
    sql: psycopg.Connection[Any],
) -> None:
    view = sql.execute(
        """SELECT a.attname, format_type(a.atttypid, a.atttypmod)
             FROM pg_type t JOIN pg_attribute a ON a.attrelid = t.typrelid
            WHERE t.oid = 'batonq.task_view'::regtype AND a.attnum > 0 AND NOT a.attisdropped
            ORDER BY a.attnum"""
    ).fetchall()
    fields = _model_fields()
    assert [name for name, _ in view] == list(fields)
    for name, sql_type in view:
        python, _ = _base(fields[name])
        expected = PYTHON_TYPES[sql_type]
        if expected is Any:  # jsonb: any JSON value, or the list the engine keeps there
            assert python is Any or typing.get_origin(python) in (list, dict), name
        else:
            assert python is expected, (name, sql_type, python)


def test_task_out_has_models_task_fields_with_ids_as_references() -> None:
    out = {name: field.annotation for name, field in schemas.TaskOut.model_fields.items()}
    fields = _model_fields()
    assert set(out) == {ID_FIELDS.get(name, name) for name in fields}
    for name, annotation in fields.items():
        sent = out[ID_FIELDS.get(name, name)]
        python, nullable = _base(annotation)
        sent_base, sent_nullable = _base(sent)
        assert sent_nullable == nullable, name
        if name in ID_FIELDS:
            assert (python, sent_base) == (int, str), name
        elif name == "state":
            assert typing.get_origin(sent_base) is Literal
            assert typing.get_args(sent_base) == models.TASK_STATES
        else:
            assert sent_base == python, (name, sent_base, python)


def test_task_out_states_are_the_engines(sql: psycopg.Connection[Any]) -> None:
    """The hot table's states and the archive's, as their CHECKs name them."""
    definitions = " ".join(
        row[0]
        for row in sql.execute(
            """SELECT pg_get_constraintdef(c.oid) FROM pg_constraint c
                 JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = ANY (c.conkey)
                WHERE c.conrelid IN ('batonq.tasks'::regclass, 'batonq.archive'::regclass)
                  AND c.contype = 'c' AND a.attname = 'state'"""
        )
    )
    assert {state for state in models.TASK_STATES if f"'{state}'" in definitions} == set(models.TASK_STATES)
    assert definitions.count("'") == 2 * len(models.TASK_STATES)
