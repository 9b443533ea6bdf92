import { Fragment, useCallback, useEffect, useRef, useState } from "react";
import { api, errorText, type PanelSettings, type Preview, type PreviewToken } from "../lib/ipc";
import { percent, showToken } from "./TokenView";

/** Why a candidate gets nothing after sampling. */
function cutBy(p: Preview, c: PreviewToken, index: number, settings: PanelSettings): string | null {
  if (c.sampled > 0) return null;
  if (settings.temperature === 0) return "temperature 0";
  if (c.softened === 0) return "top-k";
  if (index >= p.after_top_p) return "top-p";
  if (c.softened < p.min_p_floor) return "min-p";
  return "cut";
}

/**
 * The distribution the chat's next answer starts from, redrawn as the sliders move: the model's
 * probability (light) and what is left after temperature, top-k, top-p and min-p (solid), with
 * the top-p cut drawn and each cut token labelled with what cut it. The engine keeps the
 * prompt's logits, so a slider moving costs a resample, not a forward pass.
 */
export default function NextTokenChart({
  conversation,
  settings,
  turn,
  answering,
}: {
  conversation: number;
  settings: PanelSettings;
  turn: string;
  /** An answer is being written in this chat: its prompt is the preview's, so asking now would
   * compute it twice. The chart waits for the answer to end. */
  answering: boolean;
}) {
  const [preview, setPreview] = useState<Preview | null>(null);
  const [error, setError] = useState<string | null>(null);
  // One request at a time, the newest settings next: a slider dragged while the first preview
  // of a long prompt runs through the model must not queue that prompt once per step.
  const mounted = useRef(true);
  const inFlight = useRef(false);
  const next = useRef<{ conversation: number; settings: PanelSettings } | null>(null);
  useEffect(() => {
    mounted.current = true;
    return () => {
      mounted.current = false;
    };
  }, []);
  const pump = useCallback(() => {
    const ask = next.current;
    if (inFlight.current || !ask) return;
    next.current = null;
    inFlight.current = true;
    api
      .previewNext(ask.conversation, ask.settings)
      .then(
        (p) => {
          if (!mounted.current) return;
          setPreview(p);
          setError(null);
        },
        (e) => mounted.current && setError(errorText(e)),
      )
      .finally(() => {
        inFlight.current = false;
        if (mounted.current) pump();
      });
  }, []);

  useEffect(() => {
    if (answering) return;
    next.current = { conversation, settings };
    pump();
  }, [conversation, settings, turn, answering, pump]);

  if (error) return <p className="muted small">Next token: {error}</p>;
  if (!preview) return <p className="muted small" data-testid="preview-empty">Ask something to see the distribution the answer starts from.</p>;
  // Bars are scaled to the largest value shown, so a flat distribution is still readable; the
  // percentages are absolute.
  const scale = 100 / Math.max(1e-6, ...preview.candidates.map((c) => Math.max(c.raw, c.sampled)));
  const topPCut = preview.after_top_p < preview.candidates.length && settings.top_p < 1 && settings.temperature > 0;
  return (
    <div className={`next-token ${answering ? "stale" : ""}`} data-testid="preview-chart" aria-label="Next-token distribution">
      <h3>
        Next token{" "}
        <span className="muted small">
          {answering ? "(updates when the answer ends)" : preview.message ? "of a regenerated answer" : "of the answer"}
        </span>
      </h3>
      <table className="bars">
        <tbody>
          {preview.candidates.map((c, i) => {
            const cut = cutBy(preview, c, i, settings);
            return (
              <Fragment key={c.id}>
                {topPCut && i === preview.after_top_p && (
                  <tr className="cut-line" data-testid="top-p-cut">
                    <td colSpan={3}>top-p {settings.top_p} cuts here</td>
                  </tr>
                )}
                <tr className={cut ? "cut" : ""} data-testid="preview-row" data-raw={c.raw} data-sampled={c.sampled}>
                  <td className="tok-label">
                    <code>{showToken(c.text)}</code>
                  </td>
                  <td className="bar-cell">
                    <div className="bar raw" style={{ width: `${c.raw * scale}%` }} />
                    <div className="bar sampled" style={{ width: `${c.sampled * scale}%` }} />
                  </td>
                  <td className="bar-value">{cut ? `${percent(c.raw)} → cut (${cut})` : `${percent(c.raw)} → ${percent(c.sampled)}`}</td>
                </tr>
              </Fragment>
            );
          })}
        </tbody>
      </table>
      <p className="muted small" data-testid="preview-kept">
        {preview.kept === 1 ? "1 token can be drawn" : `${preview.kept.toLocaleString()} tokens can be drawn`}
        {preview.min_p_floor > 0 && ` · min-p keeps tokens above ${percent(preview.min_p_floor)} after temperature`}
      </p>
    </div>
  );
}
