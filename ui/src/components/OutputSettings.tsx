// The panel's settings for what an answer is made of: a thinking model's Think switch and
// thinking budget, and structured output (a JSON schema every answer must match, which the
// engine enforces token by token).
import { useEffect, useState } from "react";
import type { PanelSettings, Thinking } from "../lib/ipc";

interface ThinkingProps {
  /** How the loaded model's template thinks; nothing is shown for "none". */
  thinking: Thinking;
  settings: PanelSettings;
  set: (patch: Partial<PanelSettings>) => void;
}

export function ThinkingSettings({ thinking, settings, set }: ThinkingProps) {
  const [draft, setDraft] = useState(settings.thinking_budget == null ? "" : String(settings.thinking_budget));
  const [invalid, setInvalid] = useState(false);
  useEffect(() => setDraft(settings.thinking_budget == null ? "" : String(settings.thinking_budget)), [settings.thinking_budget]);
  if (thinking === "none") return null;
  const switchable = thinking === "optional" || thinking === "on_request";
  // Unset, the template decides: Qwen3 thinks, llama.cpp's DeepSeek-R1 template does not.
  const on = settings.think ?? thinking !== "on_request";
  return (
    <div className="param thinking-settings">
      <h3>Thinking</h3>
      {switchable && (
        <label className="check" title="The model reasons in a Thinking block before it answers.">
          <input type="checkbox" data-testid="param-think" checked={on} onChange={(e) => set({ think: e.target.checked })} />
          Think before answering
        </label>
      )}
      {on && (
        <>
          <label htmlFor="thinking-budget-field" title="Close the Thinking block after this many tokens; the model answers after it.">
            Thinking budget (tokens)
          </label>
          <input
            id="thinking-budget-field"
            type="number"
            data-testid="param-thinking-budget"
            aria-invalid={invalid}
            min={1}
            step={1}
            placeholder="no limit"
            value={draft}
            onChange={(e) => {
              const raw = e.target.value;
              setDraft(raw);
              if (raw.trim() === "") return setInvalid(false), set({ thinking_budget: null });
              const v = Number(raw);
              const ok = Number.isInteger(v) && v >= 1 && v <= 1_000_000;
              setInvalid(!ok);
              if (ok) set({ thinking_budget: v });
            }}
          />
          {invalid && <span className="error">Thinking budget: a whole number from 1</span>}
        </>
      )}
    </div>
  );
}

const EXAMPLE = `{
  "type": "object",
  "properties": {
    "answer": { "type": "string" }
  },
  "required": ["answer"]
}`;

interface StructuredProps {
  schema: Record<string, unknown> | null | undefined;
  onChange: (schema: Record<string, unknown> | null) => void;
}

/** A JSON schema for the chat's answers: typed, checked as JSON here, then by the engine
 * (whose refusal, naming the problem, shows as the app's error). */
export function StructuredOutput({ schema, onChange }: StructuredProps) {
  const saved = schema ? JSON.stringify(schema, null, 2) : "";
  const [draft, setDraft] = useState(saved || EXAMPLE);
  const [problem, setProblem] = useState<string | null>(null);
  useEffect(() => {
    if (saved) setDraft(saved);
  }, [saved]);
  const apply = () => {
    let value: unknown;
    try {
      value = JSON.parse(draft);
    } catch (e) {
      return setProblem(`not JSON: ${(e as Error).message}`);
    }
    if (value === null || typeof value !== "object" || Array.isArray(value)) return setProblem("a schema is a JSON object");
    setProblem(null);
    onChange(value as Record<string, unknown>);
  };
  return (
    <div className="param structured">
      <h3>Structured output</h3>
      <label className="check" title="Every answer is JSON that the schema accepts.">
        <input
          type="checkbox"
          data-testid="param-structured"
          checked={!!schema}
          onChange={(e) => (e.target.checked ? apply() : (setProblem(null), onChange(null)))}
        />
        Answer with JSON matching a schema
      </label>
      <textarea
        aria-label="JSON schema"
        data-testid="json-schema"
        rows={8}
        spellCheck={false}
        value={draft}
        onChange={(e) => setDraft(e.target.value)}
      />
      {problem && <span className="error">Schema: {problem}</span>}
      {schema && draft !== saved && (
        <button type="button" data-testid="json-schema-apply" onClick={apply}>
          Use this schema
        </button>
      )}
    </div>
  );
}
