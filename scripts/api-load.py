#!/usr/bin/env python3
"""A bounded load run against a local OpenAI-compatible server (loopback only), for BENCHMARKS.md.

    python3 scripts/api-load.py --url http://127.0.0.1:8080 --clients 16 --seconds 60 [--pid PID]

Each client loops: a streamed chat completion (max 32 tokens), timing the first token. Stops
after --seconds (requests under way finish) and prints one JSON object. Standard library only.
"""
import argparse
import http.client
import json
import statistics
import threading
import time
import urllib.parse


def one_request(host, port, i):
    body = json.dumps({
        "messages": [{"role": "user", "content": f"Give me fact number {i} about rivers."}],
        "max_tokens": 32, "temperature": 0.7, "stream": True,
    })
    conn = http.client.HTTPConnection(host, port, timeout=300)
    start = time.perf_counter()
    conn.request("POST", "/v1/chat/completions", body, {"content-type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        resp.read()
        conn.close()
        raise RuntimeError(f"HTTP {resp.status}")
    ttft, tokens, done = None, 0, False
    for raw in resp:
        line = raw.decode().strip()
        if not line.startswith("data: "):
            continue
        data = line[6:]
        if data == "[DONE]":
            done = True
            break
        chunk = json.loads(data)
        if chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
            tokens += 1
            if ttft is None:
                ttft = (time.perf_counter() - start) * 1000
    conn.close()
    if not done:
        raise RuntimeError("stream ended without [DONE]")
    return ttft or 0.0, tokens


def rss_mb(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--pid", type=int)
    a = ap.parse_args()
    u = urllib.parse.urlparse(a.url)
    assert u.hostname in ("127.0.0.1", "localhost", "::1"), "loopback only"

    lock = threading.Lock()
    ttfts, errors, tokens, completed = [], [], [0], [0]
    rss_samples = []
    deadline = time.perf_counter() + a.seconds

    def client(c):
        i = 0
        while time.perf_counter() < deadline:
            try:
                t, n = one_request(u.hostname, u.port, c * 1000 + i)
                with lock:
                    ttfts.append(t)
                    tokens[0] += n
                    completed[0] += 1
            except Exception as e:  # counted, reported
                with lock:
                    errors.append(str(e))
            i += 1

    started = time.perf_counter()
    threads = [threading.Thread(target=client, args=(c,)) for c in range(a.clients)]
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        if a.pid:
            rss_samples.append(rss_mb(a.pid))
        time.sleep(1)
    wall = time.perf_counter() - started
    ttfts.sort()
    print(json.dumps({
        "clients": a.clients, "seconds": round(wall, 1), "completed": completed[0], "errors": len(errors),
        "error_kinds": sorted(set(errors))[:5],
        "ttft_ms": {"p50": statistics.median(ttfts) if ttfts else None,
                    "p95": ttfts[int(len(ttfts) * 0.95)] if ttfts else None},
        "tokens_per_s": round(tokens[0] / wall, 1),
        "server_peak_rss_mb": {"first": rss_samples[0], "last": rss_samples[-1]} if rss_samples else None,
    }))


if __name__ == "__main__":
    main()
