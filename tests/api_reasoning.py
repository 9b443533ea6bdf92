"""A thinking model's reasoning through the official `openai` Python client, against `rill serve`
on the qwen2 test model under llama.cpp's DeepSeek-R1-Distill-Qwen template (which opens the
thinking block itself when `enable_thinking` is true; a random-weight model never closes it, so
a thinking budget of 16 does).

With `--harmony`, against the gpt-oss test model under the real gpt-oss template: its analysis
channel is the reasoning and its final channel the content. gpt-oss always reasons (its
efforts are low, medium and high, the template's default medium, which `rill run` gets too),
so thinking is asked for as effort `medium` and there is no "off" to check.

Usage: python3 tests/api_reasoning.py BASE_URL [--harmony]
(crates/rill-cli/tests/thinking.rs and harmony.rs run it)

Prints, last, one JSON line with the whole answer's reasoning and content, which the Rust test
compares with `rill run --json` and with the saved answer.
"""

import json
import sys

import openai

BASE = sys.argv[1]
HARMONY = "--harmony" in sys.argv[2:]
client = openai.OpenAI(base_url=BASE + "/v1", api_key="unused", max_retries=0, timeout=600)
MODEL = client.models.list().data[0].id
ASK = [{"role": "user", "content": "What is 17 times 3?"}]


def ask(think, **extra):
    return client.chat.completions.create(
        model=MODEL, messages=ASK, temperature=0, max_tokens=40,
        extra_body={"thinking_budget": 16, **think}, **extra)


# Thinking asked for as the template's variable, and as OpenAI's reasoning effort.
ON = {"reasoning_effort": "medium"} if HARMONY else {"chat_template_kwargs": {"enable_thinking": True}}
MARKUP = ["<|channel|>", "<|message|>", "<|start|>", "<|end|>"] if HARMONY else ["think>"]
whole = ask(ON)
message = whole.choices[0].message
reasoning = getattr(message, "reasoning_content", None)
assert reasoning and reasoning.strip(), message
assert message.content and message.content.strip(), message
assert not any(m in reasoning or m in message.content for m in MARKUP), message
assert whole.usage.completion_tokens_details.reasoning_tokens == 16, whole.usage
assert whole.usage.completion_tokens == 40, whole.usage
assert whole.choices[0].finish_reason == "length"

stream = ask({"reasoning_effort": "medium"}, stream=True, stream_options={"include_usage": True})
reasoning_parts, content_parts, usage = [], [], None
for chunk in stream:
    if chunk.usage:
        usage = chunk.usage
    if chunk.choices:
        delta = chunk.choices[0].delta
        reasoning_parts.append(getattr(delta, "reasoning_content", None) or "")
        content_parts.append(delta.content or "")
assert "".join(reasoning_parts) == reasoning, ("".join(reasoning_parts), reasoning)
assert "".join(content_parts) == message.content, ("".join(content_parts), message.content)
# The thinking streams first, then the answer: no reasoning after the first content.
first = next(i for i, c in enumerate(content_parts) if c)
assert not any(reasoning_parts[first:]), reasoning_parts
assert sum(1 for r in reasoning_parts if r) > 1, "the reasoning streamed in pieces"
assert usage.completion_tokens_details.reasoning_tokens == 16, usage

# Effort `none` turns thinking off: no reasoning, and no reasoning tokens counted.
if not HARMONY:
    off = ask({"reasoning_effort": "none"})
    assert not getattr(off.choices[0].message, "reasoning_content", None), off.choices[0].message
    assert off.choices[0].message.content, off.choices[0].message
    assert off.usage.completion_tokens_details is None, off.usage

print(f"reasoning {reasoning!r}, then content {message.content!r}: whole and streamed alike")
print(json.dumps({"reasoning": reasoning, "content": message.content}))
