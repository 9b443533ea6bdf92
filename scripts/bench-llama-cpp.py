#!/usr/bin/env python3
"""llama.cpp's figures for BENCHMARKS.md, measured like `rill bench` measures ours.

Same GGUF, same threads, the same text repeated to the same prompt length, greedy decoding
that ignores end-of-generation. Prints one JSON object in `rill bench --json`'s shape.
Needs `pip install llama-cpp-python` (it compiles llama.cpp, about 10 minutes here).

    python3 scripts/bench-llama-cpp.py MODEL.gguf [--threads 2] [--prompt-tokens 512] [--gen-tokens 128]
"""
import argparse
import json
import resource
import statistics
import time

from llama_cpp import Llama

TEXT = (
    "The river carried the light of the morning down from the hills, past the mills and the "
    "orchards, through the town where the market opened early and the bakers had already sold their first loaves. "
    "Children ran along the bank, counting boats, and an old ferryman told anyone who would listen how the water "
    "had risen in the spring of his youth, when the bridge was still made of wood and the lanterns burned oil. "
)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--gen-tokens", type=int, default=128)
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()

    # n_batch = n_ctx: llama-cpp-python sizes its logits buffer by n_batch unless logits_all is set.
    llm = Llama(a.model, n_ctx=1024, n_batch=1024, n_threads=a.threads, n_threads_batch=a.threads, verbose=False)
    base = llm.tokenize((TEXT * 4).encode(), add_bos=False)
    prompt = (base * (a.prompt_tokens // len(base) + 1))[: a.prompt_tokens]

    # Warm-up, as rill bench does.
    llm.reset()
    llm.eval(prompt[:16])

    prefill, decode, ttft, gaps = [], [], [], []
    for _ in range(a.runs):
        llm.reset()
        t0 = time.perf_counter()
        llm.eval(prompt)
        tok = int(llm.scores[llm.n_tokens - 1].argmax())
        t1 = time.perf_counter()
        prefill.append(len(prompt) / (t1 - t0))
        ttft.append((t1 - t0) * 1000)
        last = t1
        for _ in range(a.gen_tokens - 1):
            llm.eval([tok])
            tok = int(llm.scores[llm.n_tokens - 1].argmax())
            now = time.perf_counter()
            gaps.append((now - last) * 1000)
            last = now
        decode.append((a.gen_tokens - 1) / (last - t1))

    gaps.sort()
    print(json.dumps({
        "engine": "llama.cpp (llama-cpp-python)",
        "streams": 1,
        "prompt_tokens": a.prompt_tokens,
        "gen_tokens": a.gen_tokens,
        "prefill_tps": statistics.median(prefill),
        "decode_tps": statistics.median(decode),
        "ttft_ms": {"p50": statistics.median(ttft), "p95": max(ttft)},
        "itl_ms": {"p50": gaps[len(gaps) // 2], "p95": gaps[int(len(gaps) * 0.95)]},
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }))


if __name__ == "__main__":
    main()
