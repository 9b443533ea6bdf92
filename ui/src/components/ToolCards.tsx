// Tool calls as cards: an assistant's calls (the function's name and its arguments) and a
// tool's result (the content a client sent back for a call), for conversations an API client
// had with the model and saved with `--save`. Arguments and results are shown as indented JSON
// when they are JSON, as text otherwise; never as HTML.
import type { ToolCall } from "../lib/ipc";

/** `value` as indented JSON text; a string that holds JSON is read first. */
export function pretty(value: unknown): string {
  if (typeof value === "string") {
    try {
      return JSON.stringify(JSON.parse(value), null, 2);
    } catch {
      return value;
    }
  }
  return JSON.stringify(value, null, 2);
}

export function CallCards({ calls }: { calls: ToolCall[] }) {
  return (
    <div className="tool-calls">
      {calls.map((c) => (
        <div key={c.id} className="tool-card call" data-testid="tool-call" data-call-id={c.id}>
          <div className="tool-card-head">
            <span className="tool-kind">Call</span> <code data-testid="tool-call-name">{c.name}</code>
          </div>
          <pre data-testid="tool-call-arguments">
            <code>{pretty(c.arguments)}</code>
          </pre>
        </div>
      ))}
    </div>
  );
}

export function ResultCard({ content, name, callId }: { content: string; name: string | undefined; callId: string | null | undefined }) {
  return (
    <div className="tool-card result" data-testid="tool-result" data-call-id={callId ?? ""}>
      <div className="tool-card-head">
        <span className="tool-kind">Result</span>
        {name && (
          <>
            {" of "}
            <code>{name}</code>
          </>
        )}
      </div>
      <pre>
        <code>{pretty(content)}</code>
      </pre>
    </div>
  );
}
