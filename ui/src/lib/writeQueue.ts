// Live settings reach the engine in the order the user made them. Every keystroke in a field
// and every step of a slider is a write; Tauri runs commands concurrently, so two writes sent
// at once may land in either order, and typing "300" could leave "30" saved. The queue sends
// one write at a time, keeps only the newest value for a key while an earlier write is in
// flight, and lets an answer wait until everything asked for is written.

export interface WriteQueue<K, V> {
  /** Writes `value` for `key` after the writes before it; resolves (or rejects) with its write. */
  put(key: K, value: V): Promise<void>;
  /** Resolves when every write asked for so far has finished, whether or not it failed. */
  settled(): Promise<void>;
}

export function writeQueue<K, V>(write: (key: K, value: V) => Promise<void>): WriteQueue<K, V> {
  let tail: Promise<void> = Promise.resolve();
  // The write waiting for its turn, whose value a newer one for the same key replaces.
  let waiting: { key: K; value: V; done: Promise<void> } | null = null;
  return {
    put(key, value) {
      if (waiting && waiting.key === key) {
        waiting.value = value;
        return waiting.done;
      }
      const entry = { key, value, done: Promise.resolve() };
      waiting = entry;
      entry.done = tail.then(() => {
        if (waiting === entry) waiting = null;
        return write(entry.key, entry.value);
      });
      tail = entry.done.catch(() => undefined);
      return entry.done;
    },
    settled: () => tail,
  };
}
