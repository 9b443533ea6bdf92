import { useState } from "react";
import { usePoll } from "../lib/usePoll";
import { api, errorText, type ApiSettings, type ApiStatus } from "../lib/ipc";

/** App settings: the OpenAI-compatible API that serves the model in use to other programs. */
export default function SettingsView({ onClose }: { onClose: () => void }) {
  const [status, setStatus] = useState<ApiStatus | null>(null);
  const [draft, setDraft] = useState<ApiSettings | null>(null);
  const [error, setError] = useState<string | null>(null);
  const [busy, setBusy] = useState(false);

  usePoll(
    api.apiStatus,
    1500,
    (s) => {
      setStatus(s);
      setDraft((d) => d ?? s.settings);
    },
    (e) => setError(errorText(e)),
  );

  const apply = async (next: ApiSettings) => {
    setDraft(next);
    setBusy(true);
    setError(null);
    try {
      setStatus(await api.setApi(next));
    } catch (e) {
      setError(errorText(e));
      setDraft({ ...next, enabled: false });
    } finally {
      setBusy(false);
    }
  };

  if (!draft) return <section className="settings">Loading…</section>;
  const port = Number(draft.port);
  const portOk = Number.isInteger(port) && port > 0 && port < 65536;
  const beyondLoopback = draft.host !== "127.0.0.1" && draft.host !== "::1" && draft.host !== "localhost";

  return (
    <section className="settings" aria-label="Settings">
      <div className="models-header">
        <h1>Settings</h1>
        <button type="button" aria-label="Close the settings" onClick={onClose}>
          Close
        </button>
      </div>
      <h2>OpenAI-compatible API</h2>
      <p className="muted small">
        Other programs (editors, scripts, agents) can use the model in use here through <code>/v1/chat/completions</code>,{" "}
        <code>/v1/completions</code> and <code>/v1/models</code>. Their requests share the machine with your chats.
      </p>
      <label className="check">
        <input
          type="checkbox"
          data-testid="api-toggle"
          checked={draft.enabled}
          disabled={busy || !portOk || (beyondLoopback && !draft.api_key)}
          onChange={(e) => apply({ ...draft, enabled: e.target.checked })}
        />
        Serve the API
      </label>
      <div className="param-row settings-row">
        <label>
          Host
          <input aria-label="API host" value={draft.host} disabled={draft.enabled} onChange={(e) => setDraft({ ...draft, host: e.target.value })} />
        </label>
        <label>
          Port
          <input
            aria-label="API port"
            type="number"
            aria-invalid={!portOk}
            value={draft.port}
            disabled={draft.enabled}
            onChange={(e) => setDraft({ ...draft, port: Number(e.target.value) })}
          />
        </label>
        <label>
          API key
          <input
            aria-label="API key"
            type="password"
            placeholder={beyondLoopback ? "required beyond this machine" : "optional"}
            value={draft.api_key ?? ""}
            disabled={draft.enabled}
            onChange={(e) => setDraft({ ...draft, api_key: e.target.value || null })}
          />
        </label>
      </div>
      <label className="check">
        <input
          type="checkbox"
          aria-label="Keep API chats as conversations"
          checked={draft.save}
          disabled={draft.enabled}
          onChange={(e) => setDraft({ ...draft, save: e.target.checked })}
        />
        Keep API chats as conversations
      </label>
      {beyondLoopback && !draft.api_key && <p className="error small">Serving beyond this machine needs an API key.</p>}
      {error && (
        <p className="error" role="alert">
          {error}
        </p>
      )}
      <p data-testid="api-status" className={status?.address ? "ok" : "muted"}>
        {status?.address ? `Serving at ${status.address}/v1` : "Not serving."}
      </p>
      {status?.address && (
        <>
          <h3>Requests</h3>
          <table className="request-log" data-testid="api-log">
            <thead>
              <tr>
                <th>Time</th>
                <th>Request</th>
                <th>Status</th>
                <th>ms</th>
              </tr>
            </thead>
            <tbody>
              {status.requests.length === 0 && (
                <tr>
                  <td colSpan={4} className="muted">
                    None yet.
                  </td>
                </tr>
              )}
              {[...status.requests].reverse().map((r, i) => (
                <tr key={`${r.at_ms}-${i}`} className={r.status >= 400 ? "error" : ""}>
                  <td>{new Date(r.at_ms).toLocaleTimeString()}</td>
                  <td>
                    {r.method} {r.path}
                  </td>
                  <td>{r.status}</td>
                  <td>{Math.round(r.ms)}</td>
                </tr>
              ))}
            </tbody>
          </table>
        </>
      )}
    </section>
  );
}
