#!/usr/bin/env python3
"""Records llama.cpp's logits on Rill's test models (from `scripts/make-test-models.py`) into
compact fixtures, `crates/rill-engine/tests/fixtures/reference/<model>.json`, each tied to its
model file by SHA-256. Rill's parity test (`tests/families.rs`) compares against them, so CI
needs no llama.cpp. Needs llama-cpp-python (`pip install llama-cpp-python==0.3.36`: a build of
about ten minutes, cached by pip afterwards).

    python3 scripts/record-reference-logits.py [MODEL.gguf ...]

Per model:
- teacher-forced: a fixed chat text of at least 64 tokens, tokenized by llama.cpp; for each
  position, the 64 likeliest next tokens with their logits, the gap between the top two, and
  the norm of the whole logit vector;
- greedy: 32 tokens generated greedily after the text's first turn, with the top-two gap at
  each step (a gap under 0.1 is a near-tie, where either choice is right);
- for a mixture of experts: the experts llama.cpp's router chose for every position of the
  text in every layer, and their weights (its `ffn_moe_topk` and `ffn_moe_weights_norm`, or
  gpt-oss's `ffn_moe_weights_softmax`, tensors, read through the graph's evaluation callback as
  `llama-eval-callback` prints them).
It also refuses a model whose distributions are flat (top-1 probability near 1/vocabulary) or
whose greedy text repeats its prompt: a parity check on such a model has no teeth.
"""

import ctypes
import hashlib
import json
import re
import sys
from pathlib import Path

import gguf
import numpy as np
import llama_cpp.llama_cpp as low
from llama_cpp import Llama

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "crates/rill-engine/tests/fixtures/reference"
TOP = 64
QUESTION = "Write a short poem about the sea, the wind and the ships that sail at night."
# The chat text's turn markers: ChatML's (plain text where the vocabulary lacks them), and
# Phi-3's own, whose special tokens take the whitespace after them in llama.cpp's tokenizer.
PROMPTS = {
    "phi3": f"<|user|>\n{QUESTION}<|end|>\n<|assistant|>\n",
    # gpt-oss's harmony, the answer in its final channel.
    "gpt-oss": f"<|start|>user<|message|>{QUESTION}<|end|><|start|>assistant<|channel|>final"
               "<|message|>",
}
CHATML = f"<|im_start|>user\n{QUESTION}<|im_end|>\n<|im_start|>assistant\n"
ANSWER = ("The sea is wide and the wind is strong, and every wave sings a song of long ago. "
          "The ships go out when the stars are bright, their lanterns swinging through the night, "
          "and sailors dream of home.")


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


class GgmlTensor(ctypes.Structure):
    """The head of ggml's `struct ggml_tensor` (ggml/include/ggml.h of the same source), up to
    its name."""
    _fields_ = [
        ("type", ctypes.c_int),
        ("buffer", ctypes.c_void_p),
        ("ne", ctypes.c_int64 * 4),
        ("nb", ctypes.c_size_t * 4),
        ("op", ctypes.c_int),
        ("op_params", ctypes.c_int32 * 16),
        ("flags", ctypes.c_int32),
        ("src", ctypes.c_void_p * 10),
        ("view_src", ctypes.c_void_p),
        ("view_offs", ctypes.c_size_t),
        ("data", ctypes.c_void_p),
        ("name", ctypes.c_char * 64),
    ]


EvalCallback = ctypes.CFUNCTYPE(ctypes.c_bool, ctypes.POINTER(GgmlTensor), ctypes.c_bool,
                                ctypes.c_void_p)
# The chosen experts' weights: renormalised (Qwen3 MoE), or a softmax over the chosen (gpt-oss).
WANTED = re.compile(
    rb"^(ffn_moe_probs|ffn_moe_topk|ffn_moe_weights_norm|ffn_moe_weights_softmax)-(\d+)$")


def read_2d(t: GgmlTensor, ctype) -> list:
    """A computed CPU tensor of ne = [k, rows] (or [1, k, rows]) as rows of k values, by its
    strides (ffn_moe_topk is a view of the argsort's first k columns)."""
    ne, nb = list(t.ne), list(t.nb)
    if ne[0] == 1:  # [1, k, rows]
        ne, nb = ne[1:] + [1], nb[1:] + [nb[3]]
    size = ctypes.sizeof(ctype)
    rows = []
    for r in range(ne[1]):
        base = t.data + r * nb[1]
        rows.append([ctype.from_address(base + i * nb[0]).value for i in range(ne[0])])
        assert nb[0] == size
    return rows


def plain_buffers(model_default):
    """Model parameters without the CPU backend's repacked weights (its "extra" buffer types,
    AMX and AVX-512 panels), for a mixture of experts: with them, this version's expert
    products crash (a segmentation fault in `llama_decode`) on a CPU with AMX."""
    def params():
        p = model_default()
        p.use_extra_bufts = False
        return p
    return params


def is_mixture(path: Path) -> bool:
    fields = gguf.GGUFReader(path).fields
    arch = bytes(fields["general.architecture"].parts[-1]).decode()
    return f"{arch}.expert_count" in fields


def routes(path: Path, tokens: list) -> list:
    """Per layer, per position of `tokens` (one batch): llama.cpp's chosen experts and their
    weights."""
    seen = {}

    def callback(tp, ask, _):
        t = tp.contents
        found = WANTED.match(t.name)
        if ask:
            return bool(found)
        if found:
            kind, layer = found.group(1).decode(), int(found.group(2))
            ctype = ctypes.c_int32 if kind == "ffn_moe_topk" else ctypes.c_float
            seen[(kind, layer)] = read_2d(t, ctype)
        return True

    cb = EvalCallback(callback)
    default, model_default = low.llama_context_default_params, low.llama_model_default_params

    def with_callback():
        params = default()
        params.cb_eval = ctypes.cast(cb, type(params.cb_eval))
        params.cb_eval_user_data = None
        return params

    low.llama_context_default_params = with_callback
    low.llama_model_default_params = plain_buffers(model_default)
    try:
        # Every row's logits: otherwise the last layer runs only the rows it outputs.
        m = Llama(model_path=str(path), n_ctx=1024, n_batch=1024, n_ubatch=1024,
                  logits_all=True, n_threads=2, seed=0, verbose=False)
    finally:
        low.llama_context_default_params = default
        low.llama_model_default_params = model_default
    m.eval(tokens)
    layers = sorted({layer for _, layer in seen})
    out = []
    for layer in layers:
        experts = seen[("ffn_moe_topk", layer)]
        weights = seen.get(("ffn_moe_weights_norm", layer)) or seen[("ffn_moe_weights_softmax", layer)]
        assert len(experts) == len(tokens), (layer, len(experts))
        probs = seen[("ffn_moe_probs", layer)]
        out.append({"experts": experts,
                    "weights": [[round(w, 6) for w in row] for row in weights],
                    "probs": [[round(p, 6) for p in row] for row in probs]})
    del m
    return out


def record(path: Path) -> dict:
    mixture = is_mixture(path)
    model_default = low.llama_model_default_params
    if mixture:
        low.llama_model_default_params = plain_buffers(model_default)
    try:
        m = Llama(model_path=str(path), n_ctx=1024, logits_all=True, n_threads=2, seed=0,
                  verbose=False)
    finally:
        low.llama_model_default_params = model_default
    PROMPT = PROMPTS.get(m.metadata.get("general.architecture"), CHATML)
    prompt = m.tokenize(PROMPT.encode(), add_bos=False, special=True)
    tokens = m.tokenize((PROMPT + ANSWER).encode(), add_bos=False, special=True)
    assert len(tokens) >= 65, f"{path.name}: only {len(tokens)} tokens"
    m.reset()
    m.eval(tokens)
    logits = np.array(m.scores[: len(tokens)], dtype=np.float32)
    positions = []
    for row in logits:
        top = np.argsort(-row, kind="stable")[:TOP]
        positions.append({
            "ids": top.tolist(),
            "logits": [round(float(row[i]), 5) for i in top],
            "gap": round(float(row[top[0]] - row[top[1]]), 5),
            "norm": round(float(np.linalg.norm(row)), 4),
        })
    probs = np.exp(logits - logits.max(1, keepdims=True))
    probs /= probs.sum(1, keepdims=True)
    top1 = float(np.median(probs.max(1)))
    vocab = logits.shape[1]
    assert top1 > 100 / vocab, f"{path.name}: flat distributions (median top-1 {top1})"

    # Greedy after the prompt, one token at a time, with each step's top-two gap.
    m.reset()
    m.eval(prompt)
    greedy, gaps = [], []
    for _ in range(32):
        row = np.array(m.scores[m.n_tokens - 1], dtype=np.float32)
        order = np.argsort(-row, kind="stable")
        greedy.append(int(order[0]))
        gaps.append(round(float(row[order[0]] - row[order[1]]), 5))
        m.eval([int(order[0])])
    echo = sum(t in prompt for t in greedy) / len(greedy)
    assert echo < 0.5, f"{path.name}: the greedy text repeats the prompt ({echo:.0%} of its tokens)"
    extra = {}
    if mixture:
        extra["routes"] = routes(path, tokens)
        assert extra["routes"], f"{path.name}: no routes seen"
    return {
        "about": "llama.cpp's logits (llama-cpp-python 0.3.36) on this test model, recorded by "
                 "scripts/record-reference-logits.py",
        "model": path.name,
        "sha256": sha256(path),
        "vocab": vocab,
        "median_top1_probability": round(top1, 4),
        "text": PROMPT + ANSWER,
        "tokens": tokens,
        "prompt_tokens": len(prompt),
        "positions": positions,
        "greedy": greedy,
        "greedy_gaps": gaps,
        **extra,
    }


def main():
    models = [Path(a) for a in sys.argv[1:]] or sorted((ROOT / "models/test-models").glob("*.gguf"))
    OUT.mkdir(parents=True, exist_ok=True)
    for path in models:
        doc = record(path)
        out = OUT / (path.stem + ".json")
        out.write_text(json.dumps(doc, separators=(",", ":")) + "\n")
        print(f"{out}: {len(doc['positions'])} positions, median top-1 p {doc['median_top1_probability']}")


if __name__ == "__main__":
    main()
