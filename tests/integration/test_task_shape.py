"""A task's fields are defined once, in ``models.Task``: the engine's
``batonq.task_view`` must have the same columns (read by name, in any
order), and the HTTP API and the MCP server send the fields their
metadata describes (``schemas.TaskOut`` is derived from them). The same
holds for a queue's counts and its settings."""

from __future__ import annotations

import dataclasses
import types
import typing
from datetime import datetime
from typing import Any

import psycopg
import pytest

from batonq import models, schemas
from batonq.service.app import create_app

# PostgreSQL's types as the clients read them.
PYTHON_TYPES: dict[str, Any] = {
    "bigint": int,
    "integer": int,
    "text": str,
    "boolean": bool,
    "double precision": float,
    "timestamp with time zone": datetime,
    "jsonb": Any,
}
# What each model is read from: a query whose columns are the model's fields.
ENGINE_ROWS = {
    models.Task: "SELECT (NULL::batonq.task_view).*",
    models.QueueStats: "SELECT * FROM batonq.queue_stats(NULL, NULL, 0, NULL)",
    models.QueueConfig: "SELECT * FROM batonq.list_queues(NULL) LIMIT 0",
    models.Schedule: "SELECT * FROM batonq.list_schedules(NULL) LIMIT 0",
}
# The JSON Schema types the API sends Python's as.
JSON_TYPES: dict[Any, dict[str, Any]] = {
    int: {"type": "integer"},
    str: {"type": "string"},
    bool: {"type": "boolean"},
    float: {"type": "number"},
    datetime: {"type": "string", "format": "date-time"},
}
DERIVED = {
    models.Task: "TaskOut",
    models.QueueStats: "QueueStatsOut",
    models.QueueConfig: "QueueSettingsOut",
    models.SetAsideWrite: "SetAsideOut",
    models.Edge: "EdgeOut",
    models.ApiKey: "KeyOut",
    models.NewKey: "NewKeyOut",
    models.AuditEntry: "AuditEntryOut",
    models.Schedule: "ScheduleOut",
}


def _base(annotation: Any) -> tuple[Any, bool]:
    """``(type, nullable)`` of an annotation such as ``int | None``."""
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        kept = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
        return (kept[0] if len(kept) == 1 else annotation), len(kept) < len(typing.get_args(annotation))
    return annotation, False


def _fields(model: type) -> dict[str, Any]:
    hints = typing.get_type_hints(model)
    return {f.name: hints[f.name] for f in dataclasses.fields(model)}


def _how(model: type) -> dict[str, models.Shown]:
    return {f.name: f.metadata.get(models.SHOWN, models.Shown()) for f in dataclasses.fields(model)}


@pytest.mark.parametrize("model", list(ENGINE_ROWS), ids=lambda m: m.__name__)
def test_the_engines_rows_have_the_models_fields_and_types(sql: psycopg.Connection[Any], model: type) -> None:
    """A column the model lacks, or a field the engine does not send, fails."""
    cursor = sql.execute(ENGINE_ROWS[model])
    assert cursor.description is not None
    columns = {
        column.name: sql.execute("SELECT format_type(%s, NULL)", (column.type_code,)).fetchone()[0]  # type: ignore[index]
        for column in cursor.description
    }
    fields = _fields(model)
    assert set(columns) == set(fields), "the engine's columns and the model's fields differ"
    for name, sql_type in columns.items():
        python, _ = _base(fields[name])
        expected = PYTHON_TYPES[sql_type]
        if expected is Any:  # jsonb: any JSON value, or the list or object the engine keeps there
            assert python is Any or typing.get_origin(python) in (list, dict), name
        else:
            assert python is expected, (name, sql_type, python)


def _sent(annotation: Any, how: models.Shown) -> dict[str, Any]:
    """The JSON Schema the API must give a field of this type."""
    python, nullable = _base(annotation)
    if how.ref:
        assert python is int, "a task id is an integer in Python"
        schema: dict[str, Any] = {"type": "string"}
    elif how.choices is not None:
        schema = {"type": "string", "enum": list(how.choices)}
    elif python is Any:
        schema = {}
    elif typing.get_origin(python) is list:
        (item,) = typing.get_args(python)
        schema = {"type": "array", "items": _sent(item, models.Shown())}
    elif typing.get_origin(python) is dict:
        schema = {"type": "object", "additionalProperties": True}
    else:
        schema = dict(JSON_TYPES[python])
    return {"anyOf": [schema, {"type": "null"}]} if nullable else schema


@pytest.fixture(scope="module")
def openapi_schemas() -> dict[str, Any]:
    app = create_app("postgresql://unused@127.0.0.1:1/unused", sweeper=False)
    schemas: dict[str, Any] = app.openapi()["components"]["schemas"]
    return schemas


@pytest.mark.parametrize("model", list(DERIVED), ids=lambda m: m.__name__)
def test_the_api_sends_the_models_fields_in_order_as_their_metadata_says(
    openapi_schemas: dict[str, Any], model: type
) -> None:
    """/openapi.json (whose bodies the MCP tools' schemas share) names each
    field as shown, in the model's order, with its type and description."""
    properties = openapi_schemas[DERIVED[model]]["properties"]
    how = _how(model)
    sent = {name: annotation for name, annotation in _fields(model).items() if how[name].sent}
    assert list(properties) == [how[name].name or name for name in sent]
    for name, annotation in sent.items():
        sent = dict(properties[how[name].name or name])
        assert sent.pop("title")
        assert sent.pop("description", None) == how[name].description, name
        assert sent == _sent(annotation, how[name]), name


def test_a_task_is_sent_with_its_ids_as_references() -> None:
    now = datetime.now().astimezone()
    values: dict[str, Any] = {name: None for name in _fields(models.Task)}
    values.update(id=7, queue="q", state="done", priority=0, payload={"a": 1}, attempts=1, max_attempts=3,
                  parent_id=5, root_id=5, run_at=now, created_at=now, errors=[], result=[1])  # fmt: skip
    sent = schemas.TaskOut.of(models.Task(**values)).model_dump(mode="json")
    assert (sent["task_id"], sent["parent_id"], sent["root_id"]) == ("t_7", "t_5", "t_5")
    assert "id" not in sent
    assert sent["payload"] == {"a": 1} and sent["result"] == [1]


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
