// A thinking model's reasoning above its answer: open while it streams ("Thinking…", with its
// token count growing), folded once the answer starts ("Thought for 12 s · 240 tokens"). The
// reader can open or fold it at any time; their choice holds until the next answer. The text
// is the model's, shown as plain text (never as HTML).
import { useEffect, useRef, useState } from "react";

interface Props {
  text: string;
  /** Still inside the block: the model is thinking now. */
  thinking: boolean;
  tokens: number | null | undefined;
  ms: number | null | undefined;
}

/** "12 s", "1 min 5 s", "0.4 s". */
export function duration(ms: number): string {
  const s = ms / 1000;
  if (s < 10) return `${Number(s.toFixed(1))} s`;
  if (s < 60) return `${Math.round(s)} s`;
  return `${Math.floor(s / 60)} min ${Math.round(s % 60)} s`;
}

export default function ThinkingBlock({ text, thinking, tokens, ms }: Props) {
  const [open, setOpen] = useState(thinking);
  // Opens when thinking starts, folds when it ends: unless the reader chose otherwise.
  const chosen = useRef(false);
  useEffect(() => {
    if (!chosen.current) setOpen(thinking);
  }, [thinking]);
  const count = tokens ? ` · ${tokens} token${tokens === 1 ? "" : "s"}` : "";
  const summary = thinking ? `Thinking…${count}` : ms != null ? `Thought for ${duration(ms)}${count}` : `Thoughts${count}`;
  return (
    <details
      className={`thinking${thinking ? " live" : ""}`}
      data-testid="thinking"
      data-state={thinking ? "thinking" : "done"}
      open={open}
      onToggle={(e) => {
        const now = (e.currentTarget as HTMLDetailsElement).open;
        if (now !== open) {
          chosen.current = true;
          setOpen(now);
        }
      }}
    >
      <summary data-testid="thinking-summary">{summary}</summary>
      <div className="thinking-text" data-testid="thinking-text">
        {text}
      </div>
    </details>
  );
}
