"""Images through the official `openai` Python client, against `rill serve` on the Gemma 3 test
model with its test projector (issue 42): a base64 image as an `image_url` content part,
answered whole and streamed (the same text), and the errors a client meets (a web address, bytes
that are not an image).

Usage: python3 tests/api_images.py BASE_URL IMAGE   (crates/rill-cli/tests/images.rs runs it)

Prints, last, one JSON line with the answer, which the Rust test compares with `rill run --image`.
"""

import base64
import json
import sys

import openai

BASE, IMAGE = sys.argv[1], sys.argv[2]
client = openai.OpenAI(base_url=BASE + "/v1", api_key="unused", max_retries=0, timeout=600)
MODEL = client.models.list().data[0].id
URL = "data:image/jpeg;base64," + base64.b64encode(open(IMAGE, "rb").read()).decode()


def ask(url, **extra):
    parts = [{"type": "image_url", "image_url": {"url": url}},
             {"type": "text", "text": "What is in this picture?"}]
    return client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": parts}], temperature=0,
        max_tokens=12, **extra)


whole = ask(URL)
text = whole.choices[0].message.content
assert text and whole.usage.completion_tokens > 0, whole
# The image's 16 rows and their markers count as prompt tokens.
assert whole.usage.prompt_tokens > 16, whole.usage

streamed = "".join(c.choices[0].delta.content or "" for c in ask(URL, stream=True) if c.choices)
assert streamed == text, (streamed, text)

for url, want in [("https://example.com/cat.jpg", "does not fetch"),
                  ("data:image/png;base64," + base64.b64encode(b"not an image").decode(), "image")]:
    try:
        ask(url)
        raise AssertionError(f"{url[:40]} was accepted")
    except openai.BadRequestError as e:
        assert want in str(e), e

print(json.dumps({"content": text}))
