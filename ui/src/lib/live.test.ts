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
});
