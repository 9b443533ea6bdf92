import { useRef, useState } from "react";
import { api, errorText, type ActivityItem } from "../lib/ipc";
import { live } from "../lib/live";
import { usePoll } from "../lib/usePoll";
import Sparkline from "./Sparkline";

const POLL_MS = 500;
const SAMPLES = 40;

interface Row extends ActivityItem {
  rates: number[];
}

/** Every answer being written, in every chat: what the engine is doing for it, how fast, its
 * share of the machine; with pause, resume, priority and stop. */
export default function ActivityView({ onClose, onOpen }: { onClose: () => void; onOpen: (conversation: number) => void }) {
  const [rows, setRows] = useState<Row[]>([]);
  const [error, setError] = useState<string | null>(null);
  const last = useRef(new Map<number, { tokens: number; at: number; rates: number[] }>());

  usePoll(
    api.activity,
    POLL_MS,
    (items) => {
      const t = performance.now();
      const seen = last.current;
      const next: Row[] = items.map((a) => {
        const before = seen.get(a.message);
        let rates = before?.rates ?? [];
        if (before && t > before.at) {
          rates = [...rates, ((a.completion_tokens - before.tokens) * 1000) / (t - before.at)].slice(-SAMPLES);
        }
        seen.set(a.message, { tokens: a.completion_tokens, at: t, rates });
        return { ...a, rates };
      });
      for (const id of [...seen.keys()]) if (!items.some((a) => a.message === id)) seen.delete(id);
      setRows(next);
    },
    (e) => setError(errorText(e)),
  );

  const act = (p: Promise<unknown>) => p.catch((e) => setError(errorText(e)));

  return (
    <section className="activity" aria-label="Activity">
      <div className="models-header">
        <h1>Activity</h1>
        <button type="button" aria-label="Close the activity view" onClick={onClose}>
          Close
        </button>
      </div>
      <p className="muted small">
        Every answer being written shares this machine: each round of the engine gives every streaming answer a token (more
        for a higher priority) and feeds long prompts in chunks between them.
      </p>
      {error && <p className="error">{error}</p>}
      {rows.length === 0 ? (
        <p className="muted" data-testid="activity-empty">Nothing is being written.</p>
      ) : (
        <table className="activity-table">
          <thead>
            <tr>
              <th>Chat</th>
              <th>State</th>
              <th>Tokens</th>
              <th>tok/s</th>
              <th>Share</th>
              <th>Priority</th>
              <th />
            </tr>
          </thead>
          <tbody>
            {rows.map((r) => {
              const rate = r.rates.length ? r.rates[r.rates.length - 1] : 0;
              return (
                <tr key={r.message} data-testid="activity-row" data-state={r.state} data-message={r.message}>
                  <td>
                    <button type="button" className="link" onClick={() => onOpen(r.conversation)}>
                      {r.title || "New chat"}
                    </button>
                  </td>
                  <td data-testid="activity-state">
                    {r.state}
                    {r.state === "prefilling" && r.prompt_tokens > 0 && (
                      <progress max={r.prompt_tokens} value={r.prefilled} aria-label="Prompt read" />
                    )}
                  </td>
                  <td>{r.completion_tokens}</td>
                  <td className="rate">
                    {rate.toFixed(1)} <Sparkline values={r.rates} label={`tokens per second of ${r.title}`} />
                  </td>
                  <td>
                    <span className="share" title="Share of the machine's recent forward passes">
                      <span style={{ width: `${Math.round(r.share * 100)}%` }} />
                    </span>{" "}
                    {Math.round(r.share * 100)}%
                  </td>
                  <td>
                    {r.state === "remote" ? (
                      "—"
                    ) : (
                      <select
                        aria-label="Priority"
                        value={r.priority}
                        onChange={(e) => act(api.setPriority(r.message, Number(e.target.value)))}
                      >
                        {[1, 2, 3, 4].map((p) => (
                          <option key={p} value={p}>
                            {p}×
                          </option>
                        ))}
                      </select>
                    )}
                  </td>
                  <td className="row-actions">
                    {r.state === "paused" ? (
                      <button type="button" onClick={() => act(api.resume(r.message).then(() => live.setPaused(r.message, false)))}>
                        Resume
                      </button>
                    ) : (
                      r.state !== "remote" && (
                        <button type="button" onClick={() => act(api.pause(r.message).then(() => live.setPaused(r.message, true)))}>
                          Pause
                        </button>
                      )
                    )}
                    <button type="button" onClick={() => act(api.stop(r.message))}>
                      Stop
                    </button>
                  </td>
                </tr>
              );
            })}
          </tbody>
        </table>
      )}
    </section>
  );
}
