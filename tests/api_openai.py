"""Structured output and tool calls through the official `openai` Python client, against
`rill serve` (SmolLM2: a template without tools, so they are described in its system message
and called in the Hermes format).

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
    body = bad_request(tools=[{"type": "retrieval"}])
    assert body["param"] == "tools[0]", body
    body = bad_request(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "nope"}})
    assert body["param"] == "tool_choice" and "nope" in body["message"], body
    body = bad_request(tool_choice="required")
    assert body["param"] == "tool_choice", body
    body = bad_request(tools=TOOLS, tool_choice="required", response_format={"type": "json_object"})
    assert body["param"] == "tool_choice", body
    try:
        client.chat.completions.create(model=MODEL, max_tokens=10, messages=[
            {"role": "user", "content": "hi"}, {"role": "tool", "content": "18 C"}])
        raise AssertionError("a tool message without tool_call_id was accepted")
    except openai.BadRequestError as e:
        assert e.body["param"] == "messages[1].tool_call_id", e.body


WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "The weather forecast of a city.",
                                      "parameters": WEATHER}},
    {"type": "function", "function": {"name": "get_time", "description": "The local time in a city.",
                                      "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                     "required": ["city"]}}},
]
WEATHER_ASK = [{"role": "user", "content": "What will the weather be in Paris for the next 3 days?"}]
NAMED = {"type": "function", "function": {"name": "get_weather"}}


def call_weather(seed, **kw):
    return client.chat.completions.create(
        model=MODEL, messages=WEATHER_ASK, tools=TOOLS, tool_choice=NAMED,
        temperature=1.0, max_tokens=120, seed=seed, **kw,
    )


def test_a_named_tool_choice_gives_a_valid_call_whole_and_streamed():
    whole = call_weather(11).choices[0]
    assert whole.finish_reason == "tool_calls", whole
    assert whole.message.content is None, whole.message
    [call] = whole.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather", call
    assert len(call.id) >= 9, call.id
    jsonschema.validate(json.loads(call.function.arguments), WEATHER)

    calls, finish = {}, None
    for chunk in call_weather(11, stream=True):
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        finish = choice.finish_reason or finish
        assert not choice.delta.content, choice.delta
        for d in choice.delta.tool_calls or []:
            c = calls.setdefault(d.index, {"id": None, "name": None, "arguments": ""})
            if d.id:
                assert c["id"] is None, "a call's id comes once"
                c["id"] = d.id
            if d.function and d.function.name:
                assert c["name"] is None and c["arguments"] == "", "the name comes first, once"
                c["name"] = d.function.name
            if d.function and d.function.arguments:
                c["arguments"] += d.function.arguments
    assert finish == "tool_calls"
    assert list(calls) == [0], calls
    assert calls[0]["name"] == call.function.name and calls[0]["arguments"] == call.function.arguments, (calls, call)
    print(f"a forced call, whole and streamed: {call.function.name}({call.function.arguments})")


def test_required_calls_validate_against_their_own_tool():
    for seed in range(6):
        c = client.chat.completions.create(
            model=MODEL, messages=WEATHER_ASK, tools=TOOLS, tool_choice="required",
            parallel_tool_calls=False, temperature=1.0, max_tokens=120, seed=seed,
        ).choices[0]
        assert c.finish_reason == "tool_calls", c
        [call] = c.message.tool_calls
        schema = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}[call.function.name]
        jsonschema.validate(json.loads(call.function.arguments), schema)


def test_a_tool_result_fed_back_gives_a_final_answer():
    first = call_weather(5).choices[0].message
    [call] = first.tool_calls
    messages = WEATHER_ASK + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": call.id, "type": "function",
             "function": {"name": call.function.name, "arguments": call.function.arguments}}]},
        {"role": "tool", "tool_call_id": call.id,
         "content": json.dumps({"forecast": ["sunny, 24 C", "cloudy, 19 C", "rain, 15 C"]})},
    ]
    r = client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS,
                                       temperature=0, max_tokens=80)
    c = r.choices[0]
    assert c.finish_reason == "stop", c
    assert not c.message.tool_calls, c.message
    assert c.message.content and c.message.content.strip(), c.message
    print(f"after the result ({c.finish_reason}): {c.message.content!r}")


def test_legacy_completions_give_logprobs_as_the_official_client_reads_them():
    """Issue 40: `/v1/completions` takes `logprobs` as OpenAI's integer (0-5) and answers with
    `tokens`, `token_logprobs`, `top_logprobs` and `text_offset`, whole and streamed."""
    r = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=6,
                                  temperature=0, logprobs=3)
    c = r.choices[0]
    lp = c.logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 6, lp
    assert "".join(lp.tokens) == c.text, (lp.tokens, c.text)
    for token, own, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert own <= 0 and len(top) == 3, (token, own, top)
        # Greedy: the drawn token is the likeliest of the alternatives.
        assert abs(max(top.values()) - own) < 1e-6, (token, own, top)
    assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset)
    streamed = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=6,
                                         temperature=0, logprobs=3, stream=True)
    tokens = [t for chunk in streamed if chunk.choices and chunk.choices[0].logprobs
              for t in chunk.choices[0].logprobs.tokens]
    assert tokens == lp.tokens, (tokens, lp.tokens)
    for bad in (6, -1):
        try:
            client.completions.create(model=MODEL, prompt="Hi", max_tokens=2, logprobs=bad)
        except openai.BadRequestError as e:
            assert "logprobs" in str(e.body), e.body
        else:
            raise AssertionError(f"logprobs={bad} was accepted")


if __name__ == "__main__":
    tests = [(n, f) for n, f in sorted(globals().items()) if n.startswith("test_")]
    for name, f in tests:
        f()
        print(f"ok {name}")
    print(f"{len(tests)} passed")
