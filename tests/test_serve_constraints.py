"""Constrained chat completions, as llama-server takes them: a GBNF ``grammar``,
``response_format`` with a JSON schema (kvagent's own converter, ``runtime/serve/json_schema``)
or ``json_object``, and kvagent's ``"kvagent": {"action_grammar": PROFILE}`` — on the forged
model with random weights, whose free text never parses, every constrained answer does.  And
a thin ``KvAgent(server=URL)`` client never loads libllama."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from pathlib import Path

import jsonschema
import openai
import pytest

from runtime.bench.trajectory import screenshot
from runtime.profiles import get as get_profile
from runtime.serve.json_schema import SchemaError, json_object_gbnf, schema_gbnf
from serve_helpers import kvagent_serve

ROOT = Path(__file__).resolve().parents[1]

SCHEMAS = [
    {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
                                      "age": {"type": "integer"},
                                      "tags": {"type": "array", "items": {"enum": ["a", "b"]},
                                               "maxItems": 3},
                                      "ok": {"type": ["boolean", "null"]}},
     "required": ["name", "ok"]},
    {"type": "array", "items": {"type": "number"}, "minItems": 1, "maxItems": 4},
    {"type": "object", "properties": {"x": {"const": 3}, "y": {"type": "object"}}},
    {"enum": ["left", "right", 7, None]},
]


@pytest.fixture(scope="module")
def client(forged, tmp_path_factory):
    m = forged("qwen35")
    tmp = tmp_path_factory.mktemp("serve-constraints")
    with kvagent_serve(m.model_path.parent, tmp, "--max-episodes", "2",
                       "--max-completion-tokens", "160") as s:
        c = openai.OpenAI(base_url=f"{s.url}/v1", api_key="unused", max_retries=0,
                          timeout=120)
        yield c, s.model


def test_the_schema_converter_makes_grammars_llama_cpp_parses() -> None:
    from cachepolicy.engine.grammar_check import gbnf_problem

    for schema in SCHEMAS:
        assert gbnf_problem(schema_gbnf(schema)) is None, schema
    assert gbnf_problem(json_object_gbnf()) is None
    for unsupported in ({"$ref": "#/x"}, {"type": "string", "pattern": "a+"},
                        {"anyOf": [{"type": "string"}]}, {"type": "integer", "minimum": 0},
                        {"type": "object", "properties": {"a": {"type": "date"}}},
                        {"type": "object", "required": ["missing"], "properties": {}}):
        with pytest.raises(SchemaError):
            schema_gbnf(unsupported)
    deep: dict = {"type": "object"}
    for _ in range(40):
        deep = {"type": "array", "items": deep}
    with pytest.raises(SchemaError, match="deeper"):
        schema_gbnf(deep)


def _ask(c: openai.OpenAI, model: str, seed: int, *, ends: bool = True,
         **extra: object) -> str:
    r = c.chat.completions.create(
        model=model, max_tokens=160, temperature=1.0, seed=seed,
        messages=[{"role": "user", "content": "Answer in JSON."}], extra_body=extra)
    assert r.choices[0].finish_reason == "stop" or not ends, r
    return r.choices[0].message.content or ""


def test_answers_keep_to_the_json_schema(client) -> None:
    c, model = client
    for i, schema in enumerate(SCHEMAS):
        for seed in range(2):
            text = _ask(c, model, 10 * i + seed, response_format={
                "type": "json_schema", "json_schema": {"name": f"s{i}", "schema": schema}})
            jsonschema.validate(json.loads(text), schema)
    # any JSON object: unbounded, so random weights may nest until max_tokens — a prefix of one
    text = _ask(c, model, 1, ends=False, response_format={"type": "json_object"})
    assert text.startswith("{") and not text.startswith("{}{")


def test_a_gbnf_grammar_and_a_profiles_action_grammar(client) -> None:
    c, model = client
    assert _ask(c, model, 3, grammar='root ::= ("yes" | "no") "."') in ("yes.", "no.")
    shot = screenshot(0, 320, 240)
    profile = get_profile("qwen3vl")
    free = c.chat.completions.create(model=model, max_tokens=60, temperature=1.0, seed=5,
                                     messages=[{"role": "user", "content": [
                                         {"type": "text", "text": "Click the terminal."},
                                         {"type": "image_url", "image_url": {
                                             "url": "data:image/png;base64,"
                                                    + base64.b64encode(shot).decode()}}]}])
    assert not profile.parse(free.choices[0].message.content or "", (320, 240)).ok
    for seed in range(3):  # constrained: every answer is a tool call the profile reads
        r = c.chat.completions.create(
            model=model, max_tokens=160, temperature=1.0, seed=seed,
            messages=[{"role": "user", "content": [
                {"type": "text", "text": "Click the terminal."},
                {"type": "image_url", "image_url": {
                    "url": "data:image/png;base64," + base64.b64encode(shot).decode()}}]}],
            extra_body={"kvagent": {"action_grammar": "qwen3vl"}})
        text = r.choices[0].message.content or ""
        assert profile.parse(text, (320, 240)).ok, text


def test_a_thin_client_loads_no_llama_cpp(client) -> None:
    """``import runtime.osworld`` and a ``KvAgent(server=URL)`` stepping against the server:
    ``llama_cpp`` is never imported in that process."""
    c, _ = client
    url = str(c.base_url).removesuffix("/v1/").removesuffix("/v1")
    code = f"""
import sys
import runtime.osworld
from runtime.bench.trajectory import screenshot
from runtime.osworld import KvAgent
agent = KvAgent(server={url!r}, screen_size=(320, 240))
agent.reset()
response, actions = agent.predict("Open the terminal.", {{"screenshot": screenshot(0, 320, 240)}})
agent.close()
assert actions, response
loaded = sorted(m for m in sys.modules if m.split(".")[0] == "llama_cpp")
print("llama_cpp modules:", loaded)
sys.exit(1 if loaded else 0)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr[-3000:]
    assert "llama_cpp modules: []" in out.stdout
