#!/usr/bin/env python3
"""Rill beside llama.cpp's own `llama-bench` on the 1B-shape benchmark models of each family
(`scripts/make-bench-models.py`), same file, same threads: prefill of 512 tokens and decode of
128, as `rill bench` and `llama-bench -p 512 -n 128` measure them. Runs alternate between the
two engines, model by model; each figure is the median of `--rounds` rounds. Prints a Markdown
table for BENCHMARKS.md.

    python3 scripts/bench-families.py [--rill target/release/rill] [--rounds 3] MODEL.gguf ...

llama-bench comes from `scripts/build-llama-bench.sh`.
"""

import argparse
import json
import statistics
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def rill_once(rill: str, model: str, threads: int) -> tuple[float, float]:
    out = subprocess.run([rill, "bench", "--model", model, "--threads", str(threads), "--json"],
                         check=True, capture_output=True, text=True).stdout
    r = json.loads(out)
    return r["prefill_tps"], r["decode_tps"]


def llama_once(bench: str, model: str, threads: int) -> tuple[float, float]:
    out = subprocess.run([bench, "-m", model, "-t", str(threads), "-p", "512", "-n", "128", "-r", "1",
                          "-o", "json"], check=True, capture_output=True, text=True).stdout
    rows = json.loads(out)
    pp = next(r["avg_ts"] for r in rows if r["n_prompt"] > 0)
    tg = next(r["avg_ts"] for r in rows if r["n_gen"] > 0)
    return pp, tg


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("models", nargs="+")
    ap.add_argument("--rill", default=str(ROOT / "target/release/rill"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    bench = subprocess.run(["bash", str(ROOT / "scripts/build-llama-bench.sh")], check=True,
                           capture_output=True, text=True).stdout.strip() + "/llama-bench"
    print("| model | llama.cpp prefill | Rill prefill | ratio | llama.cpp decode | Rill decode | ratio |")
    print("|---|---|---|---|---|---|---|")
    for model in a.models:
        ours, theirs = [], []
        for _ in range(a.rounds):
            theirs.append(llama_once(bench, model, a.threads))
            ours.append(rill_once(a.rill, model, a.threads))
        lp = statistics.median(t[0] for t in theirs)
        lt = statistics.median(t[1] for t in theirs)
        rp = statistics.median(o[0] for o in ours)
        rt = statistics.median(o[1] for o in ours)
        print(f"| {Path(model).name} | {lp:.1f} | {rp:.1f} | {rp / lp:.2f}x | {lt:.1f} | {rt:.1f} | {rt / lt:.2f}x |",
              flush=True)


if __name__ == "__main__":
    main()
