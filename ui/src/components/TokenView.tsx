import { useEffect, useRef, useState } from "react";
import type { CandidateText, TokenProbs } from "../lib/ipc";

/** Whitespace made visible, so a candidate " the" differs from "the" and a newline shows. */
export function showToken(text: string): string {
  return text.replace(/ /g, "␣").replace(/\n/g, "⏎").replace(/\t/g, "⇥") || "∅";
}

export const percent = (p: number) => (p >= 0.995 ? "100%" : p >= 0.1 ? `${(p * 100).toFixed(0)}%` : `${(p * 100).toFixed(1)}%`);

/** Background for a token the model gave probability `p`: clear when sure, warmer when not. */
export function tint(p: number): string {
  const hue = Math.round(Math.max(0, Math.min(1, p)) * 120);
  const alpha = (0.08 + (1 - p) * 0.32).toFixed(2);
  return `hsla(${hue}, 75%, 50%, ${alpha})`;
}

/** The probability the model gave the token that was drawn. */
export function drawnProbability(t: TokenProbs): number {
  return t.candidates.find((c) => c.id === t.id)?.raw ?? 0;
}

/** One token's candidates as bars: the model's probability (light) and the probability after
 * the sampling settings (solid), the drawn one marked. */
export function CandidateBars({ token }: { token: TokenProbs }) {
  return (
    <table className="bars" data-testid="candidate-bars">
      <thead>
        <tr>
          <th>token</th>
          <th colSpan={2}>
            <span className="key raw" /> model <span className="key sampled" /> after sampling
          </th>
        </tr>
      </thead>
      <tbody>
        {token.candidates.map((c: CandidateText) => (
          <tr key={c.id} className={c.id === token.id ? "drawn" : ""} data-testid="candidate-row" data-raw={c.raw} data-sampled={c.sampled}>
            <td className="tok-label">
              <code>{showToken(c.text)}</code>
              {c.id === token.id && <span className="drawn-mark"> ◀ drawn</span>}
            </td>
            <td className="bar-cell">
              <div className="bar raw" style={{ width: `${c.raw * 100}%` }} />
              <div className="bar sampled" style={{ width: `${c.sampled * 100}%` }} />
            </td>
            <td className="bar-value">
              {percent(c.raw)} → {percent(c.sampled)}
            </td>
          </tr>
        ))}
      </tbody>
    </table>
  );
}

/** An answer as its tokens, each tinted by the probability the model gave it; hover or click
 * one to see what else it could have been. */
export default function TokenView({ tokens, streaming }: { tokens: TokenProbs[]; streaming: boolean }) {
  const [open, setOpen] = useState<{ index: number; pinned: boolean } | null>(null);
  const [at, setAt] = useState<{ left: number; top: number }>({ left: 0, top: 0 });
  const box = useRef<HTMLDivElement>(null);

  useEffect(() => {
    if (!open?.pinned) return;
    const close = (e: KeyboardEvent) => e.key === "Escape" && setOpen(null);
    window.addEventListener("keydown", close);
    return () => window.removeEventListener("keydown", close);
  }, [open?.pinned]);

  const show = (index: number, el: HTMLElement, pinned: boolean) => {
    const outer = box.current?.getBoundingClientRect();
    const r = el.getBoundingClientRect();
    if (outer) setAt({ left: Math.max(0, Math.min(r.left - outer.left, outer.width - 320)), top: r.bottom - outer.top + 4 });
    setOpen({ index, pinned });
  };

  const token = open ? tokens[open.index] : undefined;
  return (
    <div className="tokens" data-testid="token-view" ref={box} onMouseLeave={() => open && !open.pinned && setOpen(null)}>
      {tokens.map((t, i) =>
        t.text ? (
          <span
            key={i}
            className={`tok ${open?.index === i ? "open" : ""}`}
            data-testid="token"
            data-p={drawnProbability(t)}
            style={{ background: tint(drawnProbability(t)) }}
            tabIndex={0}
            onMouseEnter={(e) => !open?.pinned && show(i, e.currentTarget, false)}
            onClick={(e) => (open?.pinned && open.index === i ? setOpen(null) : show(i, e.currentTarget, true))}
            onKeyDown={(e) => e.key === "Enter" && show(i, e.currentTarget, true)}
          >
            {t.text}
          </span>
        ) : null,
      )}
      {streaming && <span className="cursor">▍</span>}
      {token && (
        <div className="popover" data-testid="popover" role="dialog" aria-label="Token probabilities" style={{ left: at.left, top: at.top }}>
          <div className="popover-head">
            <code>{showToken(token.text)}</code> drawn with the model's {percent(drawnProbability(token))}
            {open?.pinned && (
              <button type="button" aria-label="Close" onClick={() => setOpen(null)}>
                ×
              </button>
            )}
          </div>
          <CandidateBars token={token} />
        </div>
      )}
    </div>
  );
}
