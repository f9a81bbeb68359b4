"""JSON schema → GBNF, for chat completions' ``response_format`` (the subset kvagent supports).

Supported: ``type`` object (``properties``, ``required``), array (``items``, ``minItems``,
``maxItems``), string (``minLength``, ``maxLength``; counts up to ``MAX_REPETITION``, 2000:
llama.cpp enforces no more), number, integer, boolean, null, a list of types;
``enum`` and ``const`` of JSON scalars; annotations (``title``, ``description``, ``$schema``,
``default``, ``examples``, ``additionalProperties``, ``strict``) are ignored.  Anything else
(``$ref``, ``pattern``, ``anyOf``, ``minimum``, ``format``, …) is refused with the keyword
and where it is, rather than silently not enforced.

The grammar writes objects' properties in the schema's order — required ones always,
optional ones when the model chooses — with one optional space as whitespace, and JSON
strings of printable characters and JSON escapes.  ``{"type": "object"}`` without
properties (and ``response_format: json_object``) admits any JSON object.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from runtime.serve.gbnf_cost import MAX_REPETITION

#: Nesting (schemas within schemas), properties per object and grammar size the converter
#: accepts: a schema is a request's input, its grammar is compiled per step.
MAX_DEPTH = 16
MAX_PROPERTIES = 64
MAX_GRAMMAR_CHARS = 64_000

_IGNORED = frozenset({"title", "description", "$schema", "$id", "default", "examples",
                      "additionalProperties", "strict", "$comment"})
_KNOWN = {
    "object": {"type", "properties", "required"},
    "array": {"type", "items", "minItems", "maxItems"},
    "string": {"type", "maxLength", "minLength"},
    "number": {"type"}, "integer": {"type"}, "boolean": {"type"}, "null": {"type"},
}

# Any JSON value (json_object, untyped schemas, object without properties).
_BASE = r'''ws ::= " "?
json-string ::= "\"" json-char* "\""
json-char ::= [^"\\\x00-\x1f\x7f] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4})
json-integer ::= "-"? ("0" | [1-9] [0-9]{0,15})
json-number ::= json-integer ("." [0-9]{1,16})? ([eE] [-+]? [0-9]{1,3})?
json-boolean ::= "true" | "false"
json-null ::= "null"
json-value ::= json-object | json-array | json-string | json-number | json-boolean | json-null
json-object ::= "{" ws (json-string ws ":" ws json-value ws ("," ws json-string ws ":" ws json-value ws)*)? "}"
json-array ::= "[" ws (json-value ws ("," ws json-value ws)*)? "]"
'''


class SchemaError(ValueError):
    """The schema is not JSON schema kvagent can enforce (the message says where)."""


def json_object_gbnf() -> str:
    """Any JSON object (``response_format: {"type": "json_object"}``)."""
    return "root ::= json-object\n" + _BASE


def schema_gbnf(schema: Any) -> str:
    """The GBNF of ``schema`` (``SchemaError`` for what it does not support)."""
    conv = _Converter()
    root = conv.visit(schema, "schema", 0)
    text = f"root ::= {root}\n" + "".join(f"{n} ::= {b}\n" for n, b in conv.rules) + _BASE
    if len(text) > MAX_GRAMMAR_CHARS:
        raise SchemaError(f"the schema's grammar has {len(text)} characters; the limit is "
                          f"{MAX_GRAMMAR_CHARS}")
    return text


def _literal(value: Any) -> str:
    """A GBNF literal matching ``value``'s JSON text exactly."""
    text = json.dumps(value, ensure_ascii=True)
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


class _Converter:
    def __init__(self) -> None:
        self.rules: list[tuple[str, str]] = []

    def rule(self, body: str) -> str:
        name = f"s{len(self.rules)}"
        self.rules.append((name, body))
        return name

    def visit(self, schema: Any, where: str, depth: int) -> str:
        if depth > MAX_DEPTH:
            raise SchemaError(f"{where}: nested deeper than {MAX_DEPTH}")
        if schema is True or (isinstance(schema, Mapping) and not set(schema) - _IGNORED):
            return "json-value"
        if not isinstance(schema, Mapping):
            raise SchemaError(f"{where}: a schema must be an object")
        if "enum" in schema or "const" in schema:
            return self._enum(schema, where)
        kind = schema.get("type")
        if isinstance(kind, list):
            if not kind or not all(isinstance(k, str) for k in kind):
                raise SchemaError(f"{where}.type: a type name or a list of them")
            alts = [self.visit({**schema, "type": k}, where, depth) for k in dict.fromkeys(kind)]
            return self.rule(" | ".join(alts))
        if kind not in _KNOWN:
            raise SchemaError(f"{where}.type: {kind!r} is not supported (one of "
                              f"{', '.join(_KNOWN)})")
        extra = sorted(set(schema) - _KNOWN[kind] - _IGNORED)
        if extra:
            raise SchemaError(f"{where}: {', '.join(extra)} not supported for type {kind} "
                              "(kvagent enforces type, properties, required, items, "
                              "min/maxItems, min/maxLength, enum and const)")
        if kind == "object":
            return self._object(schema, where, depth)
        if kind == "array":
            return self._array(schema, where, depth)
        if kind == "string":
            return self._string(schema, where)
        return f"json-{kind}"

    def _enum(self, schema: Mapping[str, Any], where: str) -> str:
        values = [schema["const"]] if "const" in schema else schema["enum"]
        if not isinstance(values, list) or not values or len(values) > 256:
            raise SchemaError(f"{where}.enum: a list of 1..256 values")
        for v in values:
            if not (v is None or isinstance(v, str | bool | int | float)):
                raise SchemaError(f"{where}.enum: only strings, numbers, booleans and null")
        return self.rule(" | ".join(_literal(v) for v in values))

    def _string(self, schema: Mapping[str, Any], where: str) -> str:
        lo, hi = schema.get("minLength", 0), schema.get("maxLength")
        _bounds(where, "minLength", lo, "maxLength", hi)
        if hi is None:
            return "json-string" if lo == 0 else self.rule(
                f'"\\"" json-char{{{lo},}} "\\""')
        return self.rule(f'"\\"" json-char{{{lo},{hi}}} "\\""')

    def _array(self, schema: Mapping[str, Any], where: str, depth: int) -> str:
        item = self.visit(schema.get("items", True), f"{where}.items", depth + 1)
        lo, hi = schema.get("minItems", 0), schema.get("maxItems")
        _bounds(where, "minItems", lo, "maxItems", hi)
        more = f'("," ws {item} ws)'
        if hi == 0:
            return self.rule('"[" ws "]"')
        tail = (f"{more}{{{max(lo - 1, 0)},{hi - 1}}}" if hi is not None
                else f"{more}{{{max(lo - 1, 0)},}}")
        body = f"{item} ws {tail}"
        # empty or not as two alternatives, not ``({body})?``: llama.cpp refuses a repetition
        # (``?``) of a group holding more than 2000 rules (the tail's, for a large maxItems)
        return self.rule(f'"[" ws {body} "]"' if lo >= 1
                         else f'"[" ws "]" | "[" ws {body} "]"')

    def _object(self, schema: Mapping[str, Any], where: str, depth: int) -> str:
        props = schema.get("properties")
        if props is None:
            return "json-object"
        if not isinstance(props, Mapping) or len(props) > MAX_PROPERTIES:
            raise SchemaError(f"{where}.properties: an object of at most {MAX_PROPERTIES}")
        required = schema.get("required", [])
        if not isinstance(required, list) or not all(r in props for r in required):
            raise SchemaError(f"{where}.required: names of its properties")
        pairs = []
        for name, sub in props.items():
            value = self.visit(sub, f"{where}.properties.{name}", depth + 1)
            pairs.append((name in required, f"{_literal(str(name))} ws \":\" ws {value} ws"))
        if not pairs:
            return self.rule('"{" ws "}"')
        # in the schema's order; a comma before every property but the first present
        need = [kv for req, kv in pairs if req]
        if need:  # the first property present is required (or comes before them)
            body, seen_required = "", False
            for req, kv in pairs:
                if not seen_required:
                    if req:
                        body += (kv if not body else f" {kv}")
                        seen_required = True
                    else:  # optional before the first required: it and a comma, or not
                        body += f'({kv} "," ws)? '
                else:
                    body += f' "," ws {kv}' if req else f' ("," ws {kv})?'
            return self.rule(f'"{{" ws {body} "}}"')
        alts = []
        for i, (_, kv) in enumerate(pairs):  # all optional: which one comes first
            rest = "".join(f' ("," ws {k})?' for _, k in pairs[i + 1:])
            alts.append(f"{kv}{rest}")
        return self.rule(f'"{{" ws ({" | ".join(alts)})? "}}"')


def _bounds(where: str, lo_key: str, lo: Any, hi_key: str, hi: Any) -> None:
    """``lo`` / ``hi`` (None: unbounded) as counts llama.cpp enforces exactly: it refuses a
    repetition ``{m,n}`` with m above ``MAX_REPETITION`` and reads n above it as no bound at
    all, so a larger value is refused here rather than silently not enforced."""
    for key, value in ((lo_key, lo), (hi_key, hi)):
        if value is None and key == hi_key:
            continue
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise SchemaError(f"{where}.{key}: a count (a non-negative integer)")
        if value > MAX_REPETITION:
            raise SchemaError(f"{where}.{key}: {value} is more than kvagent enforces (at "
                              f"most {MAX_REPETITION}, llama.cpp's limit on a repetition)")
    if hi is not None and hi < lo:
        raise SchemaError(f"{where}: {lo_key} {lo} is above {hi_key} {hi}")
