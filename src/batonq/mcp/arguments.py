"""Tool arguments, taken strictly: a tool accepts the names its input schema
advertises (a name and its alias, e.g. ``lease_seconds`` or ``lease_s``) and
nothing else, and a value it cannot take is answered with a sentence that says
what to send, e.g. "lease_seconds must be between 1 and 3600 (got 7200)".

An argument the tool would silently ignore is worse than an error: an agent
that writes ``delay: 3600`` believes its task waits an hour.
"""

from __future__ import annotations

import json
from typing import Any

from annotated_types import Ge, Gt, Le, Lt
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.mcpserver.tools import Tool
from pydantic import AliasChoices, BaseModel, ValidationError
from pydantic.fields import FieldInfo
from pydantic_core import ErrorDetails

from batonq.mcp.caller import caller_of

__all__ = ["StrictTool"]

_KINDS = {
    "int": "a whole number",
    "float": "a number",
    "bool": "true or false",
    "string": "a string",
}


class StrictTool(Tool):
    """A tool that refuses arguments it does not take and explains bad values."""

    @classmethod
    def strict(cls, fn: Any, **options: Any) -> StrictTool:
        tool = cls.from_function(fn, **options)
        assert isinstance(tool, StrictTool)
        tool.parameters = _advertised(tool.parameters, tool.fn_metadata.arg_model)
        return tool

    async def run(
        self, arguments: dict[str, Any], context: Context[Any, Any], convert_result: bool = False
    ) -> Any:
        self.check(arguments)
        # The gate: a tool is declared in batonq.access.DOORS, or no one may call it.
        caller_of(context).admit(self.name, arguments.get("action"))
        return await super().run(arguments, context, convert_result=convert_result)

    def check(self, arguments: dict[str, Any]) -> None:
        """Raise a ToolError that says what is wrong with ``arguments``: an
        unknown name, two names for one argument, or values (each one). The
        SDK validates them again after this; a small model, a small cost."""
        model = self.fn_metadata.arg_model
        owner = {name: field for field, info in model.model_fields.items() for name in _names(field, info)}
        unknown = [name for name in arguments if name not in owner]
        if unknown:
            listed = ", ".join(repr(name) for name in unknown)
            raise ToolError(
                f"unknown argument{'s' if len(unknown) > 1 else ''} {listed}: {self.name} takes "
                f"{_accepted(model)}"
            )
        given: dict[str, str] = {}
        for name in arguments:
            if (other := given.setdefault(owner[name], name)) != name:
                raise ToolError(f"{other} and {name} are the same argument: give only one of them")
        try:
            self.fn_metadata.validate_arguments(arguments)
        except ValidationError as error:
            raise ToolError("; ".join(_sentence(e, model) for e in error.errors())) from None


def _names(field: str, info: FieldInfo) -> list[str]:
    """The names a field is accepted under, the advertised one first."""
    alias = info.validation_alias
    if isinstance(alias, AliasChoices):
        return [choice for choice in alias.choices if isinstance(choice, str)]
    return [alias if isinstance(alias, str) else field]


def _accepted(model: type[BaseModel]) -> str:
    if not model.model_fields:
        return "no arguments"
    described = []
    for field, info in model.model_fields.items():
        first, *others = _names(field, info)
        described.append(first + "".join(f" (or {other})" for other in others))
    return ", ".join(described)


def _advertised(schema: dict[str, Any], model: type[BaseModel]) -> dict[str, Any]:
    """The input schema with every alias as a property too, and no others."""
    properties = dict(schema.get("properties", {}))
    for field, info in model.model_fields.items():
        first, *others = _names(field, info)
        for other in others:
            properties[other] = {**properties[first], "description": f"Another name for {first}."}
    return {**schema, "properties": properties, "additionalProperties": False}


def _shown(value: Any) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 60 else text[:57] + "..."


def _bounds(info: FieldInfo | None) -> tuple[Any, Any]:
    low: Any = None
    high: Any = None
    for rule in info.metadata if info is not None else ():
        if isinstance(rule, Ge):
            low = rule.ge
        elif isinstance(rule, Gt):
            low = rule.gt
        elif isinstance(rule, Le):
            high = rule.le
        elif isinstance(rule, Lt):
            # Bounds here are on whole numbers: lt=2**31 reads as at most 2**31 - 1.
            high = rule.lt - 1 if isinstance(rule.lt, int) else rule.lt
    return low, high


def _field(model: type[BaseModel], name: str) -> FieldInfo | None:
    for field, info in model.model_fields.items():
        if name in _names(field, info):
            return info
    return None


def _sentence(error: ErrorDetails, model: type[BaseModel]) -> str:
    """One validation error as a sentence a caller can act on."""
    name = str(error["loc"][0]) if error["loc"] else "the arguments"
    kind, got, ctx = error["type"], _shown(error.get("input")), error.get("ctx") or {}
    if kind == "missing":
        return f"{name} is required"
    if kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
        low, high = _bounds(_field(model, name))
        if low is not None and high is not None:
            return f"{name} must be between {low} and {high} (got {got})"
        limit = "at least" if kind.startswith("greater") else "at most"
        return f"{name} must be {limit} {low if low is not None else high} (got {got})"
    if kind == "string_pattern_mismatch" and name == "queue":
        return (
            f"queue must be a queue name: 1-128 characters from a-z 0-9 _ . : -, starting with a letter "
            f"or digit (got {got})"
        )
    if kind == "string_too_long":
        return f"{name} must be at most {ctx.get('max_length')} characters"
    if kind == "string_too_short":
        shortest = ctx.get("min_length")
        if shortest == 1:
            return f"{name} must not be empty"
        return f"{name} must be {shortest} characters or more"
    if kind == "literal_error":
        return f"{name} must be {ctx.get('expected')} (got {got})"
    if kind == "int_from_float":
        return f"{name} must be a whole number (got {got})"
    for prefix, wanted in _KINDS.items():
        if kind.startswith(prefix + "_"):
            return f"{name} must be {wanted} (got {got})"
    return f"{name}: {error['msg']} (got {got})"
