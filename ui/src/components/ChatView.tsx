import { useCallback, useEffect, useLayoutEffect, useRef, useState, type RefObject } from "react";
import { useVirtualizer } from "@tanstack/react-virtual";
import { api, errorText, type Channel, type ChatEvent, type ContextUsage, type ConversationView } from "../lib/ipc";
import { live } from "../lib/live";
import { useLive } from "../lib/useLive";
import MessageView from "./MessageView";
import Composer from "./Composer";

interface Props {
  view: ConversationView;
  composerRef: RefObject<HTMLTextAreaElement>;
  onView: (v: ConversationView) => void;
  onSent: () => void;
  onError: (e: string) => void;
}

export default function ChatView({ view, composerRef, onView, onSent, onError }: Props) {
  const store = useLive();
  const id = view.conversation.id;
  const scrollRef = useRef<HTMLDivElement>(null);
  const atBottom = useRef(true);
  const [usage, setUsage] = useState<ContextUsage | null>(null);
  const [showProbs, setShowProbs] = useState(false);
  const [tintDrafts, setTintDrafts] = useState(false);
  const speculating = (view.settings.speed_up ?? "off") !== "off";
  const messages = view.messages;
  const running = store.running(id);
  // A tool result's card names the function it answers: calls by id, from the branch shown.
  const callNames = new Map(messages.flatMap((m) => (m.tool_calls ?? []).map((c) => [c.id, c.name] as const)));

  // Only the messages on screen are in the page: 10,000 messages open and scroll like 10.
  const virtualizer = useVirtualizer({
    count: messages.length,
    getScrollElement: () => scrollRef.current,
    estimateSize: () => 96,
    overscan: 8,
    getItemKey: (i) => messages[i].id,
  });

  const reload = useCallback(async () => {
    try {
      onView(await api.openConversation(id));
    } catch (e) {
      onError(errorText(e));
    }
  }, [id, onView, onError]);

  // The chat in front gets twice the share of the machine; it goes back to an equal share when
  // the user looks elsewhere.
  const runningIds = running.map((a) => a.id).join(",");
  useEffect(() => {
    const ids = runningIds ? runningIds.split(",").map(Number) : [];
    ids.forEach((a) => api.setPriority(a, 2).catch(() => {}));
    return () => ids.forEach((a) => api.setPriority(a, 1).catch(() => {}));
  }, [runningIds]);

  // An empty chat opens ready to type in.
  useEffect(() => {
    if (messages.length === 0) composerRef.current?.focus();
  }, []); // eslint-disable-line react-hooks/exhaustive-deps -- on opening only

  useEffect(() => {
    api.contextUsage(id).then(setUsage, () => setUsage(null));
  }, [id, messages.length, messages[messages.length - 1]?.status]);

  // Open at the end, and follow a streaming answer while the reader is at the bottom.
  useLayoutEffect(() => {
    if (messages.length && atBottom.current) virtualizer.scrollToIndex(messages.length - 1, { align: "end" });
  }, [messages.length, store.getVersion(), virtualizer]);

  const startAnswer = useCallback(
    async (start: (ch: Channel<ChatEvent>) => Promise<number>, initial = "", initialReasoning = "") => {
      try {
        atBottom.current = true;
        await live.start(id, initial, start, initialReasoning);
        await reload();
        onSent();
        return true;
      } catch (e) {
        onError(errorText(e));
        await reload();
        return false;
      }
    },
    [id, reload, onSent, onError],
  );

  const send = (text: string, images: string[]) =>
    startAnswer(async (ch) => (await api.sendMessage(id, text, images, ch)).answer_id);

  const stopAll = () => running.forEach((a) => api.stop(a.id).catch((e) => onError(errorText(e))));

  // The app asks where to save in a native dialog of its own; the page never names a path.
  const exportAs = (format: "json" | "markdown") => {
    api.exportConversation(id, format).catch((e) => onError(errorText(e)));
  };

  const exportProbs = (message: number) => {
    api.exportAnswer(message).catch((e) => onError(errorText(e)));
  };

  return (
    <section className="chat" aria-label="Conversation">
      <div className="chat-header">
        <h1 title={view.conversation.title || undefined}>{view.conversation.title || "New chat"}</h1>
        {view.settings.json_schema && (
          <span className="badge" data-testid="structured-badge" title="Every answer is JSON that the chat's schema accepts.">
            JSON
          </span>
        )}
        {view.settings.remote && (
          <span className="badge" title={view.settings.remote.url}>
            via {view.settings.remote.model}
          </span>
        )}
        {usage && (
          <span
            className={`context-meter ${usage.used_tokens > usage.context_length * 0.9 ? "full" : ""}`}
            title="When the conversation outgrows the context window, the oldest turns are left out of the prompt (the system prompt stays)."
            aria-label="Context used"
          >
            <meter min={0} max={usage.context_length} value={usage.used_tokens} />
            {usage.used_tokens.toLocaleString()} / {usage.context_length.toLocaleString()} tokens
          </span>
        )}
        <label className="check small" title="Show answers as tokens tinted by how likely the model found them; hover or click one for its candidates.">
          <input type="checkbox" data-testid="show-probs" checked={showProbs} onChange={(e) => setShowProbs(e.target.checked)} />
          Probabilities
        </label>
        {speculating && (
          <label className="check small" title="Tint the tokens a draft proposed and the model took, while an answer streams (speculative decoding).">
            <input type="checkbox" data-testid="tint-drafts" checked={tintDrafts} onChange={(e) => setTintDrafts(e.target.checked)} />
            Drafts
          </label>
        )}
        <button type="button" aria-label="Export as Markdown" onClick={() => exportAs("markdown")}>
          Export .md
        </button>
        <button type="button" aria-label="Export as JSON" onClick={() => exportAs("json")}>
          Export .json
        </button>
      </div>
      <div
        className="messages"
        ref={scrollRef}
        onScroll={(e) => {
          const el = e.currentTarget;
          atBottom.current = el.scrollHeight - el.scrollTop - el.clientHeight < 48;
        }}
      >
        {messages.length === 0 && <p className="empty muted">Ask anything. Enter sends, Shift+Enter adds a line.</p>}
        <div style={{ height: virtualizer.getTotalSize(), position: "relative" }}>
          {virtualizer.getVirtualItems().map((item) => {
            const m = messages[item.index];
            return (
              <div
                key={item.key}
                data-index={item.index}
                ref={virtualizer.measureElement}
                style={{ position: "absolute", top: 0, left: 0, width: "100%", transform: `translateY(${item.start}px)` }}
              >
                <MessageView
                  message={m}
                  live={store.get(m.id)}
                  isLast={item.index === messages.length - 1}
                  onStop={(mid) => api.stop(mid).catch((e) => onError(errorText(e)))}
                  onPause={(mid) => api.pause(mid).then(() => live.setPaused(mid, true), (e) => onError(errorText(e)))}
                  onResume={(mid) => api.resume(mid).then(() => live.setPaused(mid, false), (e) => onError(errorText(e)))}
                  onRegenerate={(mid) => startAnswer((ch) => api.regenerate(mid, ch))}
                  onContinue={(mid) => startAnswer((ch) => api.continueAnswer(mid, ch), m.content, m.reasoning ?? "")}
                  onEdit={(mid, text) => startAnswer(async (ch) => (await api.editMessage(mid, text, ch)).answer_id)}
                  onBranch={(mid) => api.switchBranch(mid).then(onView, (e) => onError(errorText(e)))}
                  showProbs={showProbs}
                  tintDrafts={tintDrafts}
                  onExportProbs={exportProbs}
                  structured={!!view.settings.json_schema}
                  callName={m.tool_call_id ? callNames.get(m.tool_call_id) : undefined}
                />
              </div>
            );
          })}
        </div>
      </div>
      <Composer inputRef={composerRef} running={running.length > 0} onSend={send} onStop={stopAll} onError={onError} />
    </section>
  );
}
