// The app's commands, typed. Every call goes through Tauri's invoke; an answer's tokens come
// back through a Channel (see live.ts). Errors arrive as { kind, message }.
import { Channel, invoke } from "@tauri-apps/api/core";
import { writeQueue } from "./writeQueue";

export type Status = "streaming" | "done" | "stopped" | "interrupted" | "error";
export type Role = "system" | "user" | "assistant" | "tool";

/** A tool call an assistant made: its arguments as JSON (or the text the model wrote). */
export interface ToolCall {
  id: string;
  name: string;
  arguments: unknown;
}

export interface Conversation {
  id: number;
  title: string;
  title_by_user: boolean;
  created_at: number;
  updated_at: number;
  model: string | null;
  system_prompt: string | null;
  settings: Record<string, unknown>;
  pinned: boolean;
  archived: boolean;
  current_leaf_id: number | null;
}

export interface MessageStats {
  prompt_tokens: number | null;
  completion_tokens: number | null;
  ttft_ms: number | null;
  decode_tps: number | null;
  /** How many of the answer's tokens were reasoning, and how long it thought (ms). */
  reasoning_tokens?: number | null;
  reasoning_ms?: number | null;
  /** Speculative decoding: draft tokens proposed, and how many the model drew. */
  draft_proposed?: number | null;
  draft_accepted?: number | null;
}

/** The store flattens an answer's stats into the message. */
export interface Message extends MessageStats {
  id: number;
  conversation_id: number;
  parent_id: number | null;
  role: Role;
  content: string;
  /** A thinking model's reasoning, apart from its answer ("" when it had none). */
  reasoning?: string;
  /** An assistant's tool calls; a tool message's call (API conversations saved with --save). */
  tool_calls?: ToolCall[] | null;
  tool_call_id?: string | null;
  /** A user message's pictures, by the hash they are stored under (`api.messageImage`). */
  images?: string[];
  status: Status;
  model: string | null;
  error: string | null;
  created_at: number;
  updated_at: number;
}

export interface ViewMessage extends Message {
  siblings: number[];
}

export interface PanelSettings {
  temperature: number;
  top_k: number | null;
  top_p: number;
  min_p: number;
  repeat_penalty: number;
  repeat_last_n: number;
  presence_penalty: number;
  frequency_penalty: number;
  seed: number | null;
  max_tokens: number | null;
  /** Keep each answer token's likeliest candidates (popover, tinting, export). */
  token_probs?: boolean;
  /** Answer with a remote OpenAI-compatible server instead of this machine. */
  remote?: RemoteBackend | null;
  /** The Think switch, for models whose template has one (Qwen3); null: the template's own. */
  think?: boolean | null;
  /** Close a thinking model's block after this many tokens. */
  thinking_budget?: number | null;
  /** Structured output: every answer is JSON this schema accepts. */
  json_schema?: Record<string, unknown> | null;
  /** "Speed up": speculative decoding by prompt lookup or with a draft model (the same text,
   * sooner). */
  speed_up?: "off" | "lookup" | "draft";
  /** With "draft": the draft model's file, from the models list. */
  draft_model?: string | null;
}

export interface RemoteBackend {
  url: string;
  model: string;
  /** Only sent, never received: a key to keep for this server ("" forgets the kept one). The
   * app keeps keys in a file of their own, never in the conversation's settings. */
  api_key?: string | null;
  /** Whether a key is kept for this server. */
  has_key?: boolean;
}

export const DEFAULT_SETTINGS: PanelSettings = {
  temperature: 0.8,
  top_k: 40,
  top_p: 0.95,
  min_p: 0.05,
  repeat_penalty: 1.0,
  repeat_last_n: 64,
  presence_penalty: 0,
  frequency_penalty: 0,
  seed: null,
  max_tokens: null,
  token_probs: true,
};

export interface ConversationView {
  conversation: Conversation;
  settings: PanelSettings;
  messages: ViewMessage[];
}

export interface SearchHit {
  conversation_id: number;
  message_id: number;
  title: string;
  role: Role;
  snippet: string;
}

export interface ModelInfo {
  path: string;
  name: string;
  architecture: string;
  /** The family for people ("Qwen3", "Gemma 3"), or what the file is when Rill does not run it. */
  family: string;
  runs: boolean;
  quantization: string;
  parameters: number;
  file_bytes: number;
  context_length: number;
  has_chat_template: boolean;
  /** How its template lets it think: a Think switch on by default (Qwen3) or off by default,
   * always (QwQ, DeepSeek-R1), or not at all. */
  thinking?: Thinking;
}

export type Thinking = "none" | "optional" | "on_request" | "always";

export interface LocalModel extends ModelInfo {
  source: "models" | "imported" | "hf-cache";
  /** Why the file cannot be used (a damaged header, a chat template that fails), if it cannot. */
  error?: string;
  /** The vision projector (mmproj) beside it, when it reads images. */
  projector?: string;
}

export interface CatalogueEntry {
  name: string;
  family: string;
  /** The vision projector downloaded with it: the model reads images. */
  projector?: string;
  spec: string;
  description: string;
  size_bytes: number;
  ram_bytes: number;
  recommended: boolean;
}

export interface Models {
  loaded: ModelInfo | null;
  local: LocalModel[];
  catalogue: CatalogueEntry[];
  /** This machine's memory, where the app could read it. */
  machine_ram_bytes: number | null;
}

export interface AppStatus {
  model: ModelInfo | null;
  models_dir: string;
  database: string;
  live: number[];
  version: string;
}

export interface ContextUsage {
  used_tokens: number;
  context_length: number;
  overflow: string;
}

export type ChatEvent =
  | { event: "queued"; data: { position: number } }
  | { event: "started"; data: { prompt_tokens: number; reused_tokens: number; dropped_messages: number } }
  | { event: "token"; data: { text: string; reasoning?: string; probs?: TokenProbs; drafted?: boolean } }
  | { event: "stats"; data: { completion_tokens: number; tokens_per_second: number } }
  | { event: "done"; data: { message: Message } }
  | { event: "error"; data: { message: string } };

export type DownloadEvent =
  | { event: "progress"; data: { file: string; done_bytes: number; total_bytes: number; bytes_per_second: number } }
  | { event: "done"; data: { path: string } }
  | { event: "error"; data: { kind: string; message: string } };

/** A candidate for one answer token: the model's probability and the one drawn from. */
export interface CandidateText {
  id: number;
  text: string;
  raw: number;
  sampled: number;
}

/** One answer token with the candidates it was drawn from. */
export interface TokenProbs {
  id: number;
  text: string;
  candidates: CandidateText[];
}

export interface PreviewToken {
  id: number;
  text: string;
  raw: number;
  /** After penalties, temperature and top-k: what top-p and min-p see. */
  softened: number;
  /** After the whole pipeline: what a draw uses. */
  sampled: number;
}

/** The distribution the first token of the chat's next answer is drawn from. */
export interface Preview {
  message: number | null;
  candidates: PreviewToken[];
  after_top_k: number;
  after_top_p: number;
  min_p_floor: number;
  kept: number;
}

export type EngineState = "queued" | "prefilling" | "decoding" | "paused" | "finished" | "remote";

export interface ActivityItem {
  message: number;
  conversation: number;
  title: string;
  state: EngineState;
  priority: number;
  prompt_tokens: number;
  prefilled: number;
  completion_tokens: number;
  share: number;
}

export interface CommandError {
  kind: string;
  message: string;
}

export function errorText(e: unknown): string {
  if (e && typeof e === "object" && "message" in e) return String((e as CommandError).message);
  return String(e);
}

export interface ApiSettings {
  enabled: boolean;
  host: string;
  port: number;
  api_key: string | null;
  save: boolean;
}

export interface LoggedRequest {
  at_ms: number;
  method: string;
  path: string;
  status: number;
  ms: number;
}

export interface ApiStatus {
  settings: ApiSettings;
  address: string | null;
  requests: LoggedRequest[];
}

export interface Preset {
  name: string;
  settings: Partial<PanelSettings>;
}

export interface Sent {
  user: Message;
  answer_id: number;
}

const paramsWrites = writeQueue((conversation: number, settings: PanelSettings) =>
  invoke<void>("set_params", { conversation, settings }),
);

/** A command that starts an answer: it goes after the settings writes still queued, so the
 * answer starts with the settings the panel shows. */
async function answering<T>(cmd: string, args: Record<string, unknown>): Promise<T> {
  await paramsWrites.settled();
  return invoke<T>(cmd, args);
}

export const api = {
  status: () => invoke<AppStatus>("status"),
  listConversations: () => invoke<Conversation[]>("list_conversations"),
  createConversation: () => invoke<Conversation>("create_conversation"),
  renameConversation: (id: number, title: string) => invoke<void>("rename_conversation", { id, title }),
  setPinned: (id: number, pinned: boolean) => invoke<void>("set_pinned", { id, pinned }),
  deleteConversation: (id: number) => invoke<void>("delete_conversation", { id }),
  search: (query: string) => invoke<SearchHit[]>("search_conversations", { query }),
  // Files are chosen in native dialogs the app opens itself: the page never names a path.
  /** The path written, or null when the user cancelled the dialog. */
  exportConversation: (id: number, format: "json" | "markdown") =>
    invoke<string | null>("export_conversation", { id, format }),
  /** The new conversation's id, or null when the user cancelled the dialog. */
  importConversation: () => invoke<number | null>("import_conversation"),
  openConversation: (id: number) => invoke<ConversationView>("open_conversation", { id }),
  setSystemPrompt: (id: number, prompt: string | null) => invoke<void>("set_system_prompt", { id, prompt }),
  /** A live settings change, written after the ones before it (see writeQueue.ts). */
  setParams: (conversation: number, settings: PanelSettings) => paramsWrites.put(conversation, settings),
  contextUsage: (conversation: number) => invoke<ContextUsage>("context_usage", { conversation }),
  /** `images`: the question's pictures, as data URLs (PNG, JPEG or WebP). */
  sendMessage: (conversation: number, text: string, images: string[], onEvent: Channel<ChatEvent>) =>
    answering<Sent>("send_message", { conversation, text, images, onEvent }),
  /** A stored picture (a message's `images` names them by hash), as a data URL. */
  messageImage: (hash: string) => invoke<string>("message_image", { hash }),
  regenerate: (message: number, onEvent: Channel<ChatEvent>) => answering<number>("regenerate", { message, onEvent }),
  editMessage: (message: number, text: string, onEvent: Channel<ChatEvent>) =>
    answering<Sent>("edit_message", { message, text, onEvent }),
  switchBranch: (message: number) => invoke<ConversationView>("switch_branch", { message }),
  continueAnswer: (message: number, onEvent: Channel<ChatEvent>) =>
    answering<number>("continue_answer", { message, onEvent }),
  stop: (message: number) => invoke<void>("stop", { message }),
  pause: (message: number) => invoke<void>("pause", { message }),
  resume: (message: number) => invoke<void>("resume", { message }),
  setPriority: (message: number, priority: number) => invoke<void>("set_priority", { message, priority }),
  presets: () => invoke<Preset[]>("presets"),
  savePreset: (name: string, settings: PanelSettings) => invoke<void>("save_preset", { name, settings }),
  deletePreset: (name: string) => invoke<void>("delete_preset", { name }),
  apiStatus: () => invoke<ApiStatus>("api_status"),
  setApi: (settings: ApiSettings) => invoke<ApiStatus>("set_api", { settings }),
  models: () => invoke<Models>("models"),
  selectModel: (path: string) => invoke<ModelInfo>("select_model", { path }),
  /** The imported model, or null when the user cancelled the dialog. */
  importModel: () => invoke<ModelInfo | null>("import_model"),
  downloadModel: (spec: string, onProgress: Channel<DownloadEvent>) =>
    invoke<ModelInfo>("download_model", { spec, onProgress }),
  cancelDownload: (spec: string) => invoke<boolean>("cancel_download", { spec }),
  messageTokens: (message: number) => invoke<TokenProbs[] | null>("message_tokens", { message }),
  exportAnswer: (message: number) => invoke<string | null>("export_answer", { message }),
  /** Opens an http(s) link in the system browser after the user confirms it. */
  openLink: (url: string) => invoke<boolean>("open_link", { url }),
  previewNext: (conversation: number, settings: PanelSettings) =>
    invoke<Preview | null>("preview_next", { conversation, settings }),
  activity: () => invoke<ActivityItem[]>("activity"),
};

export { Channel };
