import { useEffect, useState } from "react";
import NextTokenChart from "./NextTokenChart";
import { StructuredOutput, ThinkingSettings } from "./OutputSettings";
import { SpeedUp } from "./SpeedUp";
import { api, errorText, DEFAULT_SETTINGS, type Conversation, type PanelSettings, type Preset, type RemoteBackend, type Thinking } from "../lib/ipc";

interface Props {
  conversation: Conversation;
  settings: PanelSettings;
  onChange: (s: PanelSettings) => void;
  onSystemPrompt: (prompt: string | null) => void;
  onError: (e: string) => void;
  /** Changes when the chat's last message does (the preview's prompt changed). */
  turn: string;
  answering: boolean;
  /** How the loaded model thinks (its Think switch and budget show when it does). */
  thinking?: Thinking;
}

interface SliderProps {
  id: string;
  label: string;
  value: number;
  min: number;
  max: number;
  step: number;
  hint: string;
  onChange: (v: number) => void;
}

/** A slider and a number field bound to one value; the field refuses what the slider cannot
 * reach (NaN, out of range) and says why, instead of sending it. */
function Slider({ id, label, value, min, max, step, hint, onChange }: SliderProps) {
  const [draft, setDraft] = useState(String(value));
  const [invalid, setInvalid] = useState<string | null>(null);
  useEffect(() => setDraft(String(value)), [value]);
  const commit = (raw: string) => {
    setDraft(raw);
    const v = Number(raw);
    if (raw.trim() === "" || !Number.isFinite(v)) return setInvalid("a number, please");
    if (v < min || v > max) return setInvalid(`between ${min} and ${max}`);
    setInvalid(null);
    onChange(v);
  };
  return (
    <div className="param">
      <label htmlFor={`${id}-slider`} title={hint}>
        {label}
      </label>
      <div className="param-row">
        <input
          id={`${id}-slider`}
          type="range"
          data-testid={`param-${id}`}
          aria-label={label}
          min={min}
          max={max}
          step={step}
          value={value}
          onChange={(e) => commit(e.target.value)}
        />
        <input
          type="number"
          aria-label={`${label} value`}
          aria-invalid={invalid !== null}
          min={min}
          max={max}
          step={step}
          value={draft}
          onChange={(e) => commit(e.target.value)}
        />
      </div>
      {invalid && <span className="error">{label}: {invalid}</span>}
    </div>
  );
}

interface OptionalNumberProps {
  id: string;
  label: string;
  value: number | null;
  placeholder: string;
  min: number;
  onChange: (v: number | null) => void;
}

function OptionalNumber({ id, label, value, placeholder, min, onChange }: OptionalNumberProps) {
  const [draft, setDraft] = useState(value == null ? "" : String(value));
  const [invalid, setInvalid] = useState(false);
  useEffect(() => setDraft(value == null ? "" : String(value)), [value]);
  return (
    <div className="param">
      <label htmlFor={`${id}-field`}>{label}</label>
      <input
        id={`${id}-field`}
        type="number"
        data-testid={`param-${id}`}
        aria-invalid={invalid}
        min={min}
        step={1}
        placeholder={placeholder}
        value={draft}
        onChange={(e) => {
          const raw = e.target.value;
          setDraft(raw);
          if (raw.trim() === "") return setInvalid(false), onChange(null);
          const v = Number(raw);
          const ok = Number.isInteger(v) && v >= min && v <= Number.MAX_SAFE_INTEGER;
          setInvalid(!ok);
          if (ok) onChange(v);
        }}
      />
      {invalid && <span className="error">{label}: a whole number ≥ {min}</span>}
    </div>
  );
}

/** Where this chat's answers come from: this computer, or a remote OpenAI-compatible server
 * (vLLM, TGI, Ollama, llama.cpp, another Rill) when one machine is not enough. */
function Backend({ remote, onChange }: { remote: RemoteBackend | null | undefined; onChange: (r: RemoteBackend | null) => void }) {
  const [mode, setMode] = useState<"local" | "remote">(remote ? "remote" : "local");
  // The key is never sent back to the page: `has_key` says one is kept; typing a new one
  // replaces it, "Forget key" removes it.
  const [draft, setDraft] = useState<RemoteBackend>({ url: remote?.url ?? "http://127.0.0.1:8080", model: remote?.model ?? "", api_key: null });
  const same = remote && remote.url === draft.url.trim() && remote.model === draft.model.trim();
  const ok = /^https?:\/\//.test(draft.url.trim()) && draft.model.trim() !== "";
  return (
    <div className="param backend">
      <span className="label">Answers from</span>
      <label className="check">
        <input type="radio" name="backend" checked={mode === "local"} onChange={() => (setMode("local"), onChange(null))} />
        This computer
      </label>
      <label className="check">
        <input type="radio" name="backend" data-testid="backend-remote" checked={mode === "remote"} onChange={() => setMode("remote")} />
        A remote server (OpenAI-compatible)
      </label>
      {mode === "remote" && (
        <>
          <input aria-label="Server address" data-testid="remote-url" placeholder="http://host:8000" value={draft.url}
            onChange={(e) => setDraft({ ...draft, url: e.target.value })} />
          <input aria-label="Model on the server" data-testid="remote-model" placeholder="model name" value={draft.model}
            onChange={(e) => setDraft({ ...draft, model: e.target.value })} />
          <input aria-label="Server API key" data-testid="remote-key" type="password"
            placeholder={same && remote?.has_key ? "a key is kept (type to replace it)" : "API key (if it needs one)"}
            value={draft.api_key ?? ""}
            onChange={(e) => setDraft({ ...draft, api_key: e.target.value || null })} />
          <button type="button" data-testid="remote-use" disabled={!ok}
            onClick={() => (onChange({ url: draft.url.trim(), model: draft.model.trim(), api_key: draft.api_key }), setDraft({ ...draft, api_key: null }))}>
            {same && draft.api_key === null ? "In use" : "Use this server"}
          </button>
          {same && remote?.has_key && (
            <button type="button" data-testid="remote-forget-key" onClick={() => onChange({ url: remote.url, model: remote.model, api_key: "" })}>
              Forget key
            </button>
          )}
          <span className="muted small">Stop works; pause and live changes apply to this computer's answers only.</span>
        </>
      )}
    </div>
  );
}

export default function SamplingPanel({ conversation, settings, onChange, onSystemPrompt, onError, turn, answering, thinking = "none" }: Props) {
  const s = { ...DEFAULT_SETTINGS, ...settings };
  const set = (patch: Partial<PanelSettings>) => onChange({ ...s, ...patch });
  const [system, setSystem] = useState(conversation.system_prompt ?? "");
  const [presets, setPresets] = useState<Preset[]>([]);
  const [presetName, setPresetName] = useState("");

  useEffect(() => {
    api.presets().then(setPresets, (e) => onError(errorText(e)));
  }, [onError]);

  return (
    <aside className="panel" aria-label="Sampling settings">
      <Backend remote={settings.remote} onChange={(remote) => onChange({ ...s, remote })} />
      <h2>Sampling</h2>
      <p className="muted small">Changes apply to the running answer from its next token.</p>
      <Slider id="temperature" label="Temperature" value={s.temperature} min={0} max={2} step={0.05}
        hint="0 always picks the likeliest token; higher is more varied." onChange={(v) => set({ temperature: v })} />
      <Slider id="top-p" label="Top-p" value={s.top_p} min={0.01} max={1} step={0.01}
        hint="Sample from the smallest set of tokens whose probabilities add up to this." onChange={(v) => set({ top_p: v })} />
      <Slider id="top-k" label="Top-k" value={s.top_k ?? 0} min={0} max={200} step={1}
        hint="Sample from the k likeliest tokens; 0 turns it off." onChange={(v) => set({ top_k: v === 0 ? null : Math.round(v) })} />
      <Slider id="min-p" label="Min-p" value={s.min_p} min={0} max={1} step={0.01}
        hint="Drop tokens less likely than this fraction of the likeliest one." onChange={(v) => set({ min_p: v })} />
      <Slider id="repeat-penalty" label="Repeat penalty" value={s.repeat_penalty} min={1} max={2} step={0.01}
        hint="Makes recently used tokens less likely; 1 turns it off." onChange={(v) => set({ repeat_penalty: v })} />
      {!s.remote && <NextTokenChart conversation={conversation.id} settings={s} turn={turn} answering={answering} />}
      <OptionalNumber id="max-tokens" label="Max tokens" value={s.max_tokens} placeholder="no limit" min={1}
        onChange={(v) => set({ max_tokens: v })} />
      <OptionalNumber id="seed" label="Seed" value={s.seed} placeholder="random" min={0} onChange={(v) => set({ seed: v })} />
      <label className="check small" title="Keep each token's likeliest candidates with the answer (about 4% slower decoding).">
        <input type="checkbox" data-testid="param-token-probs" checked={s.token_probs !== false} onChange={(e) => set({ token_probs: e.target.checked })} />
        Keep token probabilities
      </label>
      {!s.remote && <SpeedUp settings={s} set={set} />}
      {!s.remote && <ThinkingSettings thinking={thinking} settings={s} set={set} />}
      <StructuredOutput schema={s.json_schema} onChange={(json_schema) => set({ json_schema })} />

      <div className="param">
        <label htmlFor="system-prompt">System prompt</label>
        <textarea
          id="system-prompt"
          data-testid="system-prompt"
          rows={4}
          placeholder="You are a helpful assistant."
          value={system}
          onChange={(e) => setSystem(e.target.value)}
          onBlur={() => system !== (conversation.system_prompt ?? "") && onSystemPrompt(system.trim() ? system : null)}
        />
      </div>

      <h3>Presets</h3>
      <ul className="presets">
        {presets.map((p) => (
          <li key={p.name}>
            <button type="button" aria-label={`Use preset ${p.name}`} onClick={() => onChange({ ...DEFAULT_SETTINGS, ...p.settings, remote: s.remote })}>
              {p.name}
            </button>
            <button type="button" aria-label={`Delete preset ${p.name}`}
              onClick={() => api.deletePreset(p.name).then(() => api.presets()).then(setPresets, (e) => onError(errorText(e)))}>
              ×
            </button>
          </li>
        ))}
      </ul>
      <div className="param-row">
        <input aria-label="Preset name" placeholder="Preset name" value={presetName} onChange={(e) => setPresetName(e.target.value)} />
        <button type="button" disabled={!presetName.trim()}
          onClick={() =>
            api.savePreset(presetName.trim(), { ...s, remote: null }).then(() => api.presets()).then((p) => (setPresets(p), setPresetName("")), (e) => onError(errorText(e)))
          }>
          Save
        </button>
      </div>
      <button type="button" onClick={() => onChange({ ...DEFAULT_SETTINGS, remote: s.remote })}>
        Reset to defaults
      </button>
    </aside>
  );
}
