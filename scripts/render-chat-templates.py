#!/usr/bin/env python3
"""Renders every chat template of llama.cpp's `models/templates/` with Python's jinja2, set up
as Hugging Face's `apply_chat_template` sets it up, over a fixed set of conversations, and
writes what it got to `crates/rill-engine/tests/fixtures/chat-templates.json`. Rill's test
(`tests/templates.rs`) renders the same with minijinja and must get the same bytes.

    python3 scripts/render-chat-templates.py [TEMPLATES_DIR]

Run it again only when the conversations or the templates change (the templates come from
`scripts/fetch-llama-cpp-assets.sh`). Needs jinja2 (`pip install jinja2`).
"""

import json
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import jinja2
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "crates/rill-engine/tests/fixtures/chat-templates.json"
# strftime_now's clock, fixed so the fixtures do not change with the day.
NOW = datetime(2026, 7, 4, 9, 30, 0)
BOS, EOS = "<BOS>", "<EOS>"

CONVERSATIONS = {
    "system-user": [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What is the capital of France?"},
    ],
    "multi-turn": [
        {"role": "user", "content": "Hi!"},
        {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": "Tell me a joke."},
    ],
    "user": [{"role": "user", "content": "Hello"}],
    # With TOOLS offered: a call (arguments as an object, as Hugging Face passes them; Rill's
    # API gets them as JSON text and parses them), its result, an answer, a new question.
    "tool-call": [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What's the weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call00001", "type": "function",
             "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}},
        ]},
        {"role": "tool", "tool_call_id": "call00001", "content": "{\"temperature\": 18, \"sky\": \"sunny\"}"},
        {"role": "assistant", "content": "It is 18 °C and sunny in Paris."},
        {"role": "user", "content": "And in Lyon?"},
    ],
    "tools-offered": [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What's the weather in Paris?"},
    ],
    # Answers that thought first, their reasoning apart (Rill gives it under both names that
    # templates read: `reasoning_content`, Qwen3's and DeepSeek's, and `thinking`, gpt-oss's);
    # the template decides what the model sees again (Qwen3 keeps only the last turn's).
    "reasoning": [
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4.", "reasoning_content": "Two and two make four.",
         "thinking": "Two and two make four."},
        {"role": "user", "content": "And 3+3?"},
        {"role": "assistant", "content": "6.", "reasoning_content": "Three and three make six.",
         "thinking": "Three and three make six."},
    ],
}
# The tools the tool conversations offer (OpenAI's shape).
TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather",
        "description": "The current weather of a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "The city's name"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    }},
]
WITH_TOOLS = {"tool-call", "tools-offered"}


class Generation(Extension):
    """HF's `{% generation %}…{% endgeneration %}` (assistant-mask tracking): renders its body."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return jinja2.nodes.Scope(body, lineno=lineno)


def environment():
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[Generation, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: NOW.strftime(fmt)
    return env


def main():
    if len(sys.argv) > 1:
        templates = Path(sys.argv[1])
    else:
        models = subprocess.run(
            ["bash", str(ROOT / "scripts/fetch-llama-cpp-assets.sh")], check=True, capture_output=True, text=True
        ).stdout.strip()
        templates = Path(models) / "templates"
    env = environment()
    cases = []
    for path in sorted(templates.glob("*.jinja")):
        source = path.read_text(encoding="utf-8")
        try:
            template = env.from_string(source)
        except jinja2.exceptions.TemplateError as e:
            cases.append({"template": path.name, "compile_error": str(e)})
            continue
        thinking = [None, True, False] if "enable_thinking" in source else [None]
        for name, messages in CONVERSATIONS.items():
            tools = TOOLS if name in WITH_TOOLS else None
            if tools and "tools" not in source:
                continue  # a template without tools renders these as any other conversation
            for add_generation_prompt in (True, False):
                for enable_thinking in thinking:
                    if enable_thinking is not None and not add_generation_prompt:
                        continue
                    kwargs = {"bos_token": BOS, "eos_token": EOS}
                    if enable_thinking is not None:
                        kwargs["enable_thinking"] = enable_thinking
                    case = {
                        "template": path.name,
                        "conversation": name,
                        "add_generation_prompt": add_generation_prompt,
                        "enable_thinking": enable_thinking,
                    }
                    try:
                        case["output"] = template.render(
                            messages=messages, tools=tools, documents=None,
                            add_generation_prompt=add_generation_prompt, **kwargs,
                        )
                    except Exception as e:  # a template may refuse a conversation
                        case["error"] = f"{type(e).__name__}: {e}"
                    cases.append(case)
    doc = {
        "about": "Chat templates of llama.cpp's models/templates rendered by Python jinja2 as Hugging Face "
                 "sets it up (scripts/render-chat-templates.py); Rill's renderer must give the same bytes.",
        "jinja2": jinja2.__version__,
        "now": NOW.isoformat(),
        "bos_token": BOS,
        "eos_token": EOS,
        "conversations": CONVERSATIONS,
        "tools": TOOLS,
        "with_tools": sorted(WITH_TOOLS),
        "cases": cases,
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(doc, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(f"{len(cases)} renderings of {len(list(templates.glob('*.jinja')))} templates -> {OUT}")


if __name__ == "__main__":
    main()
