// The answers being written right now, in every conversation. Tokens arrive through one
// Channel per answer; they are gathered and shown once per animation frame, so a fast model
// costs one render a frame however many answers stream. The sidebar reads this to show which
// chats are generating and their growing text; the chat view overlays it on the stored message.
import { Channel, type ChatEvent, type Message, type TokenProbs } from "./ipc";

export type LiveStatus = "queued" | "streaming" | "paused" | "done" | "stopped" | "error";

export interface LiveAnswer {
  id: number;
  conversationId: number;
  text: string;
  status: LiveStatus;
  queuePosition: number | null;
  completionTokens: number;
  tokensPerSecond: number;
  error: string | null;
  final: Message | null;
  /** Tokens with their candidates, when the chat keeps token probabilities. */
  tokens: TokenProbs[];
  /** Tokens per second over the last half-second windows, oldest first (a sparkline). */
  rates: number[];
  /** A thinking model's reasoning so far, apart from `text`. */
  reasoning: string;
  thinking: Thought;
  /** Spans [start, end) of `text` whose tokens a draft proposed and the model drew
   * (speculative decoding), adjacent ones merged. */
  drafted: Span[];
}

export type Span = [number, number];

/** Adds `[start, end)` to `spans`, merged with the last one where they touch. */
function addSpan(spans: Span[], start: number, end: number) {
  const last = spans[spans.length - 1];
  if (last && last[1] === start) last[1] = end;
  else spans.push([start, end]);
}

/** How an answer's thinking goes: tokens of reasoning, when it began, and how long it took
 * once over (null while the model still thinks, or when it never did). */
export interface Thought {
  tokens: number;
  since: number | null;
  ms: number | null;
}

/** Window of one sparkline sample, and how many samples are kept. */
const RATE_WINDOW_MS = 500;
const RATE_SAMPLES = 60;

type Listener = () => void;

const now = () => Date.now();

const nextFrame: (f: () => void) => void =
  typeof requestAnimationFrame === "function" ? (f) => requestAnimationFrame(() => f()) : (f) => setTimeout(f, 16);

export class LiveStore {
  private answers = new Map<number, LiveAnswer>();
  private pending = new Map<number, string>();
  private pendingTokens = new Map<number, TokenProbs[]>();
  private pendingReasoning = new Map<number, string>();
  /** Drafted spans of the pending text, from its start. */
  private pendingDrafted = new Map<number, Span[]>();
  private thoughts = new Map<number, Thought>();
  /** Per answer: tokens seen, and the time and count at the start of the current window. */
  private counts = new Map<number, { seen: number; since: number; at: number }>();
  private scheduled = false;
  private listeners = new Set<Listener>();
  private doneListeners = new Set<(a: LiveAnswer) => void>();
  private version = 0;

  subscribe = (l: Listener) => {
    this.listeners.add(l);
    return () => {
      this.listeners.delete(l);
    };
  };

  /** Called with every answer that ends (done, stopped or failed). */
  onDone(l: (a: LiveAnswer) => void): () => void {
    this.doneListeners.add(l);
    return () => {
      this.doneListeners.delete(l);
    };
  }

  getVersion = () => this.version;

  get(id: number): LiveAnswer | undefined {
    return this.answers.get(id);
  }

  all(): LiveAnswer[] {
    return [...this.answers.values()];
  }

  /** The running answers of a conversation. */
  running(conversationId: number): LiveAnswer[] {
    return this.all().filter(
      (a) => a.conversationId === conversationId && (a.status === "streaming" || a.status === "queued" || a.status === "paused"),
    );
  }

  /**
   * Starts an answer: `start` gets the channel and resolves to the answer's message id. Events
   * that arrive before the id is known are kept and replayed, so no token is lost.
   */
  async start(
    conversationId: number,
    initialText: string,
    start: (ch: Channel<ChatEvent>) => Promise<number>,
    initialReasoning = "",
  ) {
    let id: number | null = null;
    const early: ChatEvent[] = [];
    const channel = new Channel<ChatEvent>();
    channel.onmessage = (e) => (id === null ? early.push(e) : this.apply(id, e));
    id = await start(channel);
    this.answers.set(id, {
      id,
      conversationId,
      text: initialText,
      status: "streaming",
      queuePosition: null,
      completionTokens: 0,
      tokensPerSecond: 0,
      error: null,
      final: null,
      tokens: [],
      rates: [],
      reasoning: initialReasoning,
      thinking: { tokens: 0, since: null, ms: null },
      drafted: [],
    });
    this.changed();
    for (const e of early) this.apply(id, e);
    return id;
  }

  /** The UI's own view of pause/resume (the engine has no event for them). */
  setPaused(id: number, paused: boolean) {
    const a = this.answers.get(id);
    if (a && (a.status === "streaming" || a.status === "paused")) {
      this.answers.set(id, { ...a, status: paused ? "paused" : "streaming" });
      this.changed();
    }
  }

  private apply(id: number, e: ChatEvent) {
    const a = this.answers.get(id);
    if (!a) return;
    switch (e.event) {
      case "token": {
        const before = this.pending.get(id) ?? "";
        this.pending.set(id, before + e.data.text);
        if (e.data.drafted && e.data.text) {
          const spans = this.pendingDrafted.get(id) ?? [];
          addSpan(spans, before.length, before.length + e.data.text.length);
          this.pendingDrafted.set(id, spans);
        }
        const reasoning = e.data.reasoning ?? "";
        const thought = this.thoughts.get(id) ?? { tokens: 0, since: null, ms: null };
        if (reasoning) {
          this.pendingReasoning.set(id, (this.pendingReasoning.get(id) ?? "") + reasoning);
          thought.tokens++;
          thought.since ??= now();
        }
        if (e.data.text && thought.since !== null && thought.ms === null) thought.ms = now() - thought.since;
        this.thoughts.set(id, thought);
        if (e.data.probs) {
          const list = this.pendingTokens.get(id) ?? [];
          list.push(e.data.probs);
          this.pendingTokens.set(id, list);
        }
        const c = this.counts.get(id);
        if (c) c.seen++;
        else this.counts.set(id, { seen: 1, since: 0, at: now() });
        this.schedule();
        return;
      }
      case "queued":
        this.answers.set(id, { ...a, status: "queued", queuePosition: e.data.position });
        break;
      case "started":
        this.answers.set(id, { ...a, status: a.status === "paused" ? "paused" : "streaming", queuePosition: null });
        break;
      case "stats":
        this.answers.set(id, {
          ...a,
          completionTokens: e.data.completion_tokens,
          tokensPerSecond: e.data.tokens_per_second,
        });
        break;
      case "done": {
        this.flush();
        const m = e.data.message;
        const status: LiveStatus = m.status === "stopped" ? "stopped" : m.status === "error" ? "error" : "done";
        const done = { ...this.answers.get(id)!, text: m.content, reasoning: m.reasoning ?? "", status, final: m, error: m.error };
        this.answers.set(id, done);
        this.changed();
        this.doneListeners.forEach((l) => l(done));
        return;
      }
      case "error": {
        this.flush();
        const failed = { ...this.answers.get(id)!, status: "error" as const, error: e.data.message };
        this.answers.set(id, failed);
        this.changed();
        this.doneListeners.forEach((l) => l(failed));
        return;
      }
    }
    this.changed();
  }

  private schedule() {
    if (this.scheduled) return;
    this.scheduled = true;
    nextFrame(() => this.flush());
  }

  private flush() {
    this.scheduled = false;
    if (this.pending.size === 0 && this.pendingReasoning.size === 0) return;
    const t = now();
    for (const [id, text] of this.pending) {
      const a = this.answers.get(id);
      if (!a) continue;
      const more = this.pendingTokens.get(id);
      let rates = a.rates;
      const c = this.counts.get(id);
      if (c && t - c.at >= RATE_WINDOW_MS) {
        rates = [...rates, ((c.seen - c.since) * 1000) / (t - c.at)].slice(-RATE_SAMPLES);
        c.since = c.seen;
        c.at = t;
      }
      const reasoning = a.reasoning + (this.pendingReasoning.get(id) ?? "");
      const thinking = { ...(this.thoughts.get(id) ?? a.thinking) };
      let drafted = a.drafted;
      const spans = this.pendingDrafted.get(id);
      if (spans) {
        drafted = drafted.map((s): Span => [s[0], s[1]]);
        for (const [start, end] of spans) addSpan(drafted, a.text.length + start, a.text.length + end);
      }
      this.answers.set(id, { ...a, text: a.text + text, reasoning, thinking, tokens: more ? [...a.tokens, ...more] : a.tokens, rates, drafted });
    }
    this.pending.clear();
    this.pendingTokens.clear();
    this.pendingReasoning.clear();
    this.pendingDrafted.clear();
    this.changed();
  }

  private changed() {
    this.version++;
    this.listeners.forEach((l) => l());
  }
}

export const live = new LiveStore();
