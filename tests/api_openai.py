"""Structured output through the official `openai` Python client, against `rill serve`.

Usage: python3 tests/api_openai.py BASE_URL   (crates/rill-cli/tests/api_openai.rs runs it)

Every answer is checked with `jsonschema`, the reference validator, not with Rill's own code.
"""

import json
import sys
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import openai

BASE = sys.argv[1]
client = openai.OpenAI(base_url=BASE + "/v1", api_key="unused", max_retries=0, timeout=600)
MODEL = "SmolLM2-135M-Instruct.Q4_1"

# A nested object, an enum, an array with maxItems and required fields.
CITY = {
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "country": {"type": "string"},
        "population": {"type": "integer"},
        "climate": {"type": "string", "enum": ["tropical", "dry", "temperate", "continental", "polar"]},
        "landmarks": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
        "location": {
            "type": "object",
            "properties": {"latitude": {"type": "number"}, "longitude": {"type": "number"}},
            "required": ["latitude", "longitude"],
            "additionalProperties": False,
        },
    },
    "required": ["city", "country", "climate", "landmarks", "location"],
    "additionalProperties": False,
}
ASK = [{"role": "user", "content": "Describe Paris as a JSON object."}]


def city_format():
    return {"type": "json_schema", "json_schema": {"name": "city", "schema": CITY, "strict": True}}


def sample(seed):
    r = client.chat.completions.create(
        model=MODEL, messages=ASK, temperature=1.0, max_tokens=300, seed=seed,
        response_format=city_format(),
    )
    return r.choices[0]


def test_twenty_sampled_answers_validate():
    with ThreadPoolExecutor(4) as pool:
        choices = list(pool.map(sample, range(20)))
    for seed, c in enumerate(choices):
        # A cut answer is a failure: the constraint must steer towards closing the object.
        assert c.finish_reason == "stop", (seed, c.finish_reason, c.message.content)
        jsonschema.validate(json.loads(c.message.content), CITY)
    distinct = len({c.message.content for c in choices})
    assert distinct >= 10, f"temperature 1 gave only {distinct} distinct answers of 20"
    print(f"20 answers at temperature 1 validate ({distinct} distinct), e.g. {choices[0].message.content}")


def test_streamed_deltas_reassemble_into_the_whole_answer():
    whole = sample(7).message.content
    stream = client.chat.completions.create(
        model=MODEL, messages=ASK, temperature=1.0, max_tokens=300, seed=7,
        response_format=city_format(), stream=True,
    )
    parts, finish = [], None
    for chunk in stream:
        if chunk.choices:
            parts.append(chunk.choices[0].delta.content or "")
            finish = chunk.choices[0].finish_reason or finish
    assert "".join(parts) == whole, ("".join(parts), whole)
    assert finish == "stop"
    jsonschema.validate(json.loads(whole), CITY)


def test_json_object_gives_an_object():
    r = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Give me a JSON object about cats."}],
        temperature=0, max_tokens=200, response_format={"type": "json_object"},
    )
    assert r.choices[0].finish_reason == "stop", r.choices[0].message.content
    assert isinstance(json.loads(r.choices[0].message.content), dict)


def test_a_lark_grammar_through_extra_body():
    r = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Is Paris in France?"}],
        temperature=1.0, max_tokens=20, seed=3,
        extra_body={"grammar": 'start: ("yes" | "no") ", " ("definitely" | "probably")'},
    )
    text = r.choices[0].message.content
    first, second = text.split(", ")
    assert first in ("yes", "no") and second in ("definitely", "probably"), text


def bad_request(**kw):
    try:
        client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=10, **kw)
    except openai.BadRequestError as e:
        assert e.status_code == 400
        return e.body
    raise AssertionError(f"{kw} was accepted")


def test_what_cannot_be_honoured_is_a_400_that_names_it():
    body = bad_request(response_format={"type": "json_schema", "json_schema": {
        "name": "bad", "schema": {"type": "object", "properties": {"a": {"type": "nonsense"}}}}})
    assert body["param"] == "response_format" and "nonsense" in body["message"], body
    body = bad_request(response_format={"type": "xml"})
    assert body["param"] == "response_format" and "xml" in body["message"], body
    body = bad_request(extra_body={"grammar": "start: (unclosed"})
    assert body["param"] == "grammar", body
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    body = bad_request(tools=tools)
    assert body["param"] == "tools", body


if __name__ == "__main__":
    tests = [(n, f) for n, f in sorted(globals().items()) if n.startswith("test_")]
    for name, f in tests:
        f()
        print(f"ok {name}")
    print(f"{len(tests)} passed")
