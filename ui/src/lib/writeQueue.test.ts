import { describe, expect, it } from "vitest";
import { writeQueue } from "./writeQueue";

/** A write that finishes only when the test says so, recording what it was given. */
function slowWrites() {
  const calls: [number, string][] = [];
  const finish: (() => void)[] = [];
  const write = (k: number, v: string) => {
    calls.push([k, v]);
    return new Promise<void>((resolve) => finish.push(resolve));
  };
  return { calls, finish, write };
}

const tick = () => new Promise((r) => setTimeout(r, 0));

describe("writeQueue", () => {
  it("sends one write at a time, and the newest value of a key waiting its turn wins", async () => {
    const { calls, finish, write } = slowWrites();
    const q = writeQueue(write);
    const first = q.put(1, "3");
    await tick();
    q.put(1, "30");
    const last = q.put(1, "300");
    await tick();
    expect(calls).toEqual([[1, "3"]]); // the others wait for the first
    finish[0]();
    await first;
    await tick();
    expect(calls).toEqual([[1, "3"], [1, "300"]]); // "30" was replaced before it was sent
    finish[1]();
    await last;
  });

  it("keeps different keys' writes apart and in order", async () => {
    const { calls, finish, write } = slowWrites();
    const q = writeQueue(write);
    q.put(1, "a");
    q.put(2, "b");
    q.put(1, "c");
    for (let i = 0; i < 3; i++) {
      await tick();
      finish[i]();
    }
    await q.settled();
    expect(calls).toEqual([[1, "a"], [2, "b"], [1, "c"]]);
  });

  it("settles only after the last write, and a failed write neither blocks the next nor settled()", async () => {
    const { calls, finish, write } = slowWrites();
    let failing = true;
    const q = writeQueue((k: number, v: string) => (failing ? ((failing = false), Promise.reject(new Error("refused"))) : write(k, v)));
    const refused = q.put(1, "bad");
    const next = q.put(2, "good");
    await expect(refused).rejects.toThrow("refused");
    let settled = false;
    q.settled().then(() => (settled = true));
    await tick();
    expect(calls).toEqual([[2, "good"]]);
    expect(settled).toBe(false);
    finish[0]();
    await next;
    await tick();
    expect(settled).toBe(true);
  });
});
