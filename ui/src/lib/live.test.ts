import { beforeEach, describe, expect, it, vi } from "vitest";
import { mockIPC, clearMocks } from "@tauri-apps/api/mocks";
import type { Channel } from "@tauri-apps/api/core";
import { LiveStore } from "./live";
import type { ChatEvent } from "./ipc";

describe("LiveStore", () => {
  beforeEach(() => {
    clearMocks();
    mockIPC(() => null);
  });

  it("gathers a burst of tokens into one update per frame, in order", async () => {
    vi.useFakeTimers({ toFake: ["requestAnimationFrame", "setTimeout"] });
    const store = new LiveStore();
    let channel!: Channel<ChatEvent>;
    const id = await store.start(7, "", async (ch) => ((channel = ch), 42));
    const updates = vi.fn();
    store.subscribe(updates);
    for (const t of ["The", " capital", " is", " Paris."]) channel.onmessage({ event: "token", data: { text: t } });
    expect(store.get(id)!.text).toBe(""); // nothing shown before the frame
    vi.advanceTimersByTime(20);
    expect(store.get(id)!.text).toBe("The capital is Paris.");
    expect(updates).toHaveBeenCalledTimes(1);
    vi.useRealTimers();
  });

  it("marks the spans of text whose tokens a draft proposed, merged across tokens and frames", async () => {
    vi.useFakeTimers({ toFake: ["requestAnimationFrame", "setTimeout"] });
    const store = new LiveStore();
    let channel!: Channel<ChatEvent>;
    const id = await store.start(7, "Go: ", async (ch) => ((channel = ch), 42));
    const send = (text: string, drafted: boolean) => channel.onmessage({ event: "token", data: { text, drafted } });
    send("one", false);
    send(" two", true);
    send(" three", true);
    vi.advanceTimersByTime(20);
    send(" four", true);
    send(" five", false);
    send("", true); // a token whose text is held back marks nothing
    send(" six", true);
    vi.advanceTimersByTime(20);
    const a = store.get(id)!;
    expect(a.text).toBe("Go: one two three four five six");
    expect(a.drafted.map(([s, e]) => a.text.slice(s, e))).toEqual([" two three four", " six"]);
    vi.useRealTimers();
  });

  it("keeps events that arrive before the answer's id is known", async () => {
    const store = new LiveStore();
    const done = vi.fn();
    store.onDone(done);
    const id = await store.start(3, "", async (ch) => {
      ch.onmessage({ event: "started", data: { prompt_tokens: 5, reused_tokens: 0, dropped_messages: 0 } });
      ch.onmessage({ event: "token", data: { text: "Hi" } });
      ch.onmessage({
        event: "done",
        data: {
          message: {
            id: 9, conversation_id: 3, parent_id: 8, role: "assistant", content: "Hi", status: "done", model: null,
            prompt_tokens: 5, completion_tokens: 1, ttft_ms: 10, decode_tps: 0, error: null, created_at: 0, updated_at: 0,
          },
        },
      });
      return 9;
    });
    expect(id).toBe(9);
    expect(store.get(9)).toMatchObject({ text: "Hi", status: "done" });
    expect(store.running(3)).toEqual([]);
    expect(done).toHaveBeenCalledOnce();
  });

  it("keeps each token's candidates and samples the speed every half second", async () => {
    vi.useFakeTimers({ toFake: ["requestAnimationFrame", "setTimeout", "Date"] });
    const store = new LiveStore();
    let channel!: Channel<ChatEvent>;
    const id = await store.start(1, "", async (ch) => ((channel = ch), 5));
    const token = (text: string, n: number) => ({
      event: "token" as const,
      data: { text, probs: { id: n, text, candidates: [{ id: n, text, raw: 0.5, sampled: 1 }] } },
    });
    // A token every 50 ms: 20 tok/s.
    for (let i = 0; i < 40; i++) {
      channel.onmessage(token(`t${i}`, i));
      vi.advanceTimersByTime(50);
    }
    const a = store.get(id)!;
    expect(a.tokens.map((t) => t.id)).toEqual([...Array(40).keys()]);
    expect(a.tokens[3].candidates[0]).toMatchObject({ raw: 0.5, sampled: 1 });
    expect(a.rates.length).toBeGreaterThanOrEqual(3);
    for (const r of a.rates) expect(Math.abs(r - 20)).toBeLessThan(2.5);
    vi.useRealTimers();
  });
});
