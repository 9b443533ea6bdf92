import { memo, useEffect, useMemo, useState } from "react";
import { api, type TokenProbs, type ViewMessage } from "../lib/ipc";
import type { LiveAnswer } from "../lib/live";
import { markdownBlocks, renderMarkdown } from "../lib/markdown";
import Sparkline from "./Sparkline";
import ThinkingBlock from "./ThinkingBlock";
import { CallCards, ResultCard } from "./ToolCards";
import TokenView from "./TokenView";
import DraftedText from "./DraftedText";
import ImageThumbs from "./ImageThumbs";

/** Stored answers' token probabilities, fetched once per message when first shown. */
const storedTokens = new Map<number, TokenProbs[] | null>();

function useStoredTokens(id: number, wanted: boolean): TokenProbs[] | null | undefined {
  const [tokens, setTokens] = useState(storedTokens.get(id));
  useEffect(() => {
    if (!wanted || storedTokens.has(id)) return;
    let alive = true;
    api.messageTokens(id).then(
      (t) => {
        storedTokens.set(id, t);
        if (alive) setTokens(t);
      },
      () => alive && setTokens(null),
    );
    return () => {
      alive = false;
    };
  }, [id, wanted]);
  return tokens;
}

interface Props {
  message: ViewMessage;
  live: LiveAnswer | undefined;
  isLast: boolean;
  onStop: (id: number) => void;
  onPause: (id: number) => void;
  onResume: (id: number) => void;
  onRegenerate: (id: number) => void;
  onContinue: (id: number) => void;
  onEdit: (id: number, text: string) => void;
  onBranch: (id: number) => void;
  /** Show answers as tokens tinted by probability, with a popover of candidates. */
  showProbs: boolean;
  /** Tint the tokens a draft proposed and the model drew (while the answer is live). */
  tintDrafts?: boolean;
  onExportProbs: (id: number) => void;
  /** The chat asks for structured output: answers are JSON, shown formatted. */
  structured?: boolean;
  /** For a tool result: the name of the function whose call it answers. */
  callName?: string;
}

/** A JSON answer, indented; `null` while it is not (yet) whole JSON. */
export function formattedJson(text: string): string | null {
  const t = text.trim();
  if (!t.startsWith("{") && !t.startsWith("[")) return null;
  try {
    return JSON.stringify(JSON.parse(t), null, 2);
  } catch {
    return null;
  }
}

/** Copy buttons and links inside rendered markdown, handled by delegation: sanitised HTML
 * carries no handlers of its own, and links never navigate the app's window. An http(s) link
 * goes to the app, which asks the user to confirm its address and opens it in the system
 * browser; any other scheme stays inert. */
export function onMarkdownClick(e: React.MouseEvent<HTMLElement>) {
  const target = e.target as HTMLElement;
  const copy = target.closest("button[data-copy]");
  if (copy) {
    const code = copy.parentElement?.querySelector("code")?.textContent ?? "";
    navigator.clipboard?.writeText(code).then(() => {
      copy.textContent = "Copied";
      setTimeout(() => (copy.textContent = "Copy"), 1200);
    });
    return;
  }
  const link = target.closest("a");
  if (link) {
    e.preventDefault();
    const href = link.getAttribute("href") ?? "";
    if (/^https?:\/\//i.test(href.trim())) api.openLink(href.trim()).catch(() => {});
  }
}

/** One top-level markdown block, rendered again only when its text changes: as an answer
 * streams, that is its last block alone (`markdownBlocks`). `display: contents`, so the page
 * lays out as if the blocks were one. */
const MarkdownBlock = memo(function MarkdownBlock({ source }: { source: string }) {
  return <div className="md-block" dangerouslySetInnerHTML={{ __html: renderMarkdown(source) }} />;
});

function Stats({ m, live }: { m: ViewMessage; live: LiveAnswer | undefined }) {
  const tokens = live && !live.final ? live.completionTokens : m.completion_tokens;
  const tps = live && !live.final ? live.tokensPerSecond : m.decode_tps;
  const ttft = m.ttft_ms;
  // Speculative decoding: the draft tokens the model took, of those proposed.
  const { draft_proposed: proposed, draft_accepted: accepted } = live?.final ?? m;
  if (tokens == null && tps == null) return null;
  return (
    <span className="stats" data-testid="stats">
      {tokens != null && `${tokens} tokens`}
      {tps != null && tps > 0 && ` · ${tps.toFixed(1)} tok/s`}
      {ttft != null && ` · TTFT ${Math.round(ttft)} ms`}
      {proposed != null && proposed > 0 && (
        <span data-testid="draft-stats" title="Speculative decoding: proposed tokens the model drew">
          {` · drafts ${accepted ?? 0}/${proposed} accepted`}
        </span>
      )}
    </span>
  );
}

function MessageView({ message, live, isLast, onStop, onPause, onResume, onRegenerate, onContinue, onEdit, onBranch, showProbs, tintDrafts, onExportProbs, structured, callName }: Props) {
  const m = message;
  const text = live ? live.text : m.content;
  const status = live && !live.final ? live.status : live?.final?.status ?? m.status;
  const running = status === "streaming" || status === "queued" || status === "paused";
  const assistant = m.role === "assistant";
  const stored = useStoredTokens(m.id, showProbs && assistant && !running && !live?.tokens.length);
  const tokens = live?.tokens.length ? live.tokens : stored;
  const asTokens = showProbs && assistant && !!tokens?.length;
  const json = useMemo(() => (structured && assistant && !asTokens ? formattedJson(text) : null), [structured, assistant, asTokens, text]);
  const asDrafts = !!tintDrafts && assistant && !asTokens && !!live?.drafted.length;
  const asJson = structured && assistant && !asTokens && !asDrafts;
  const asMarkdown = assistant && !asTokens && !asJson && !asDrafts;
  const blocks = useMemo(() => (asMarkdown ? markdownBlocks(text) : []), [asMarkdown, text]);
  const reasoning = live ? live.reasoning : m.reasoning ?? "";
  const thought = live && !live.final ? live.thinking : null;
  const thinkingNow = running && thought !== null && thought.since !== null && thought.ms === null;
  const [editing, setEditing] = useState(false);
  const [draft, setDraft] = useState(m.content);
  const index = m.siblings.indexOf(m.id);

  return (
    <article
      className={`message ${m.role} ${status}`}
      data-testid="message"
      data-role={m.role}
      data-status={status}
      data-id={m.id}
      aria-label={`${m.role === "user" ? "You" : m.role === "tool" ? "Tool result" : "Assistant"}${running ? " (writing)" : ""}`}
    >
      {assistant && reasoning && (
        <ThinkingBlock
          text={reasoning}
          thinking={thinkingNow}
          tokens={thought ? thought.tokens : (live?.final ?? m).reasoning_tokens}
          ms={thought ? thought.ms : (live?.final ?? m).reasoning_ms}
        />
      )}
      {!!m.images?.length && <ImageThumbs hashes={m.images} />}
      {editing ? (
        <div className="edit">
          <textarea aria-label="Edit message" value={draft} onChange={(e) => setDraft(e.target.value)} />
          <button type="button" className="primary" onClick={() => (setEditing(false), onEdit(m.id, draft))}>
            Save & send
          </button>
          <button type="button" onClick={() => setEditing(false)}>
            Cancel
          </button>
        </div>
      ) : m.role === "tool" ? (
        <ResultCard content={text} name={callName} callId={m.tool_call_id} />
      ) : asTokens && tokens ? (
        <TokenView tokens={tokens} streaming={status === "streaming"} />
      ) : asDrafts && live ? (
        <DraftedText text={text} spans={live.drafted} />
      ) : asJson ? (
        <pre className="json-answer" data-testid="json-answer" data-valid={json !== null}>
          <code>{json ?? text}</code>
        </pre>
      ) : assistant && !text && m.tool_calls?.length ? null : assistant ? (
        <div className="md" onClick={onMarkdownClick}>
          {blocks.map((source, i) => (
            <MarkdownBlock key={i} source={source} />
          ))}
        </div>
      ) : (
        <div className="plain">{text}</div>
      )}
      {assistant && !!m.tool_calls?.length && <CallCards calls={m.tool_calls} />}
      {status === "queued" && <div className="muted">Waiting for memory… (position {(live?.queuePosition ?? 0) + 1})</div>}
      {(m.error || live?.error) && status === "error" && <div className="error">{live?.error ?? m.error}</div>}
      <footer className="message-bar">
        {m.siblings.length > 1 && (
          <span className="branches" aria-label="Branches">
            <button type="button" aria-label="Previous branch" disabled={index <= 0} onClick={() => onBranch(m.siblings[index - 1])}>
              ‹
            </button>
            {index + 1}/{m.siblings.length}
            <button
              type="button"
              aria-label="Next branch"
              disabled={index >= m.siblings.length - 1}
              onClick={() => onBranch(m.siblings[index + 1])}
            >
              ›
            </button>
          </span>
        )}
        {m.role === "assistant" && <Stats m={live?.final ? { ...m, ...live.final, siblings: m.siblings } : m} live={live} />}
        {running && live && live.rates.length > 1 && <Sparkline values={live.rates} label="tokens per second" />}
        {status === "stopped" && <span className="muted">stopped</span>}
        {status === "interrupted" && <span className="muted">interrupted</span>}
        <span className="spacer" />
        {running && (
          <>
            {status === "paused" ? (
              <button type="button" data-testid="resume" aria-label="Resume" onClick={() => onResume(m.id)}>
                Resume
              </button>
            ) : (
              <button type="button" data-testid="pause" aria-label="Pause" onClick={() => onPause(m.id)}>
                Pause
              </button>
            )}
            <button type="button" data-testid="stop" aria-label="Stop" onClick={() => onStop(m.id)}>
              Stop
            </button>
          </>
        )}
        {!running && m.role === "assistant" && (status === "stopped" || status === "interrupted") && (
          <button type="button" aria-label="Continue" onClick={() => onContinue(m.id)}>
            Continue
          </button>
        )}
        {!running && m.role === "assistant" && isLast && (
          <button type="button" data-testid="regenerate" aria-label="Regenerate" onClick={() => onRegenerate(m.id)}>
            Regenerate
          </button>
        )}
        {!running && m.role === "user" && (
          <button type="button" aria-label="Edit" onClick={() => (setDraft(m.content), setEditing(true))}>
            Edit
          </button>
        )}
        {!running && assistant && (tokens?.length ?? 0) > 0 && (
          <button type="button" aria-label="Export with probabilities" onClick={() => onExportProbs(m.id)}>
            Export probabilities
          </button>
        )}
        {!running && (
          <button type="button" aria-label="Copy message" onClick={() => navigator.clipboard?.writeText(text)}>
            Copy
          </button>
        )}
      </footer>
    </article>
  );
}

export default memo(MessageView);
