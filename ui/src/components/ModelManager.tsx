import { useEffect, useState } from "react";
import { api, Channel, errorText, type CatalogueEntry, type DownloadEvent, type ModelInfo, type Models } from "../lib/ipc";

interface Props {
  welcome: boolean;
  loaded: ModelInfo | null;
  onClose: () => void;
  onLoaded: () => void;
}

interface Download {
  done: number;
  total: number;
  speed: number;
  error: string | null;
  running: boolean;
}

const CANCELLED = "Cancelled — start again to resume.";

export function formatBytes(n: number): string {
  if (n >= 1e9) return `${(n / 1e9).toFixed(1)} GB`;
  if (n >= 1e6) return `${(n / 1e6).toFixed(0)} MB`;
  if (n >= 1e3) return `${(n / 1e3).toFixed(0)} kB`;
  return `${n} B`;
}

export default function ModelManager({ welcome, loaded, onClose, onLoaded }: Props) {
  const [models, setModels] = useState<Models | null>(null);
  const [downloads, setDownloads] = useState<Record<string, Download>>({});
  const [busy, setBusy] = useState<string | null>(null);
  const [error, setError] = useState<string | null>(null);

  const refresh = () => api.models().then(setModels, (e) => setError(errorText(e)));
  useEffect(() => {
    refresh();
  }, []);

  const select = async (path: string) => {
    setBusy(path);
    setError(null);
    try {
      await api.selectModel(path);
      onLoaded();
    } catch (e) {
      setError(errorText(e));
    } finally {
      setBusy(null);
    }
  };

  // The app opens the file dialog itself; the page never names the file.
  const importFile = async () => {
    setBusy("import");
    setError(null);
    try {
      if (await api.importModel()) onLoaded();
    } catch (e) {
      setError(errorText(e));
    } finally {
      setBusy(null);
    }
  };

  const download = async (entry: CatalogueEntry) => {
    const update = (patch: Partial<Download>) =>
      setDownloads((d) => ({
        ...d,
        [entry.spec]: { ...(d[entry.spec] ?? { done: 0, total: entry.size_bytes, speed: 0, error: null, running: true }), ...patch },
      }));
    update({ running: true, error: null });
    const channel = new Channel<DownloadEvent>();
    channel.onmessage = (e) => {
      if (e.event === "progress") update({ done: e.data.done_bytes, total: e.data.total_bytes || entry.size_bytes, speed: e.data.bytes_per_second });
      else if (e.event === "error") update({ running: false, error: e.data.kind === "cancelled" ? CANCELLED : e.data.message });
    };
    try {
      await api.downloadModel(entry.spec, channel);
      update({ running: false });
      onLoaded();
    } catch (e) {
      const cancelled = (e as { kind?: string })?.kind === "cancelled";
      update({ running: false, error: cancelled ? CANCELLED : errorText(e) });
    }
  };

  const recommended = models?.catalogue.find((c) => c.recommended);

  return (
    <section className="models" aria-label="Models">
      {welcome ? (
        <div className="welcome">
          <h1>Welcome to Rill</h1>
          <p>Rill runs language models on this computer. Nothing you type leaves it. Pick a model to start:</p>
          {models && models.local.length > 0 && <p>Models found on this machine are listed below — or is one still loading? It will appear in a moment.</p>}
        </div>
      ) : (
        <div className="models-header">
          <h1>Models</h1>
          <button type="button" aria-label="Close the model manager" onClick={onClose}>
            Close
          </button>
        </div>
      )}
      {error && <div className="error" role="alert">{error}</div>}

      {welcome && recommended && (
        <CatalogueCard entry={recommended} download={downloads[recommended.spec]} onDownload={download} machineRam={models?.machine_ram_bytes ?? null} highlight />
      )}

      <div className="import">
        <button type="button" className={welcome ? "" : "primary"} onClick={importFile}>
          Import a GGUF file…
        </button>
        <span className="muted small">Used where it is, never copied.</span>
      </div>

      {models && models.local.length > 0 && (
        <>
          <h2>On this machine</h2>
          <ul className="model-list">
            {models.local.map((m) => (
              <li key={m.path}>
                <div>
                  <strong>{m.name}</strong> <span className="muted" data-testid="model-family">{m.family}</span>{" "}
                  {m.projector && (
                    <span className="badge" data-testid="vision-badge" title={`Reads images with ${m.projector}`}>
                      vision
                    </span>
                  )}{" "}
                  <span className="muted">{m.quantization} · {formatBytes(m.file_bytes)} · {m.context_length.toLocaleString()} ctx · {m.source}</span>
                  <div className="muted small path">{m.path}</div>
                </div>
                {loaded?.path === m.path ? (
                  <span className="badge">in use</span>
                ) : m.error ? (
                  <span className="muted small" data-testid="model-error">{m.error}</span>
                ) : !m.runs ? (
                  <span className="muted small">Rill does not run this file</span>
                ) : (
                  <button type="button" disabled={busy !== null} onClick={() => select(m.path)}>
                    {busy === m.path ? "Loading…" : "Use"}
                  </button>
                )}
              </li>
            ))}
          </ul>
        </>
      )}

      <h2>Download from Hugging Face</h2>
      <ul className="model-list">
        {models?.catalogue
          .filter((c) => !(welcome && c.recommended))
          .map((c) => (
            <li key={c.spec}>
              <CatalogueCard entry={c} download={downloads[c.spec]} onDownload={download} machineRam={models?.machine_ram_bytes ?? null} />
            </li>
          ))}
      </ul>
    </section>
  );
}

function CatalogueCard({
  entry,
  download,
  onDownload,
  machineRam,
  highlight = false,
}: {
  entry: CatalogueEntry;
  download: Download | undefined;
  onDownload: (e: CatalogueEntry) => void;
  /** This machine's memory, if known: a model that needs more is flagged before it is fetched. */
  machineRam: number | null;
  highlight?: boolean;
}) {
  const pct = download && download.total > 0 ? (100 * download.done) / download.total : 0;
  const tooBig = machineRam !== null && entry.ram_bytes > machineRam;
  return (
    <div className={`catalogue-card ${highlight ? "recommended" : ""}`}>
      <div>
        <strong>{entry.name}</strong> {entry.recommended && <span className="badge">recommended</span>}
        <div className="muted small">
          {entry.family}
          {entry.projector && " · reads images"} · {formatBytes(entry.size_bytes)} download · needs about {formatBytes(entry.ram_bytes)} of RAM
        </div>
        <div className="small">{entry.description}</div>
        {tooBig && (
          <div className="warning small" role="alert">
            This machine has {formatBytes(machineRam)} of RAM: the model will not fit, or will run from disk very slowly.
          </div>
        )}
      </div>
      {download?.running ? (
        <div className="download">
          <progress data-testid="download-progress" max={100} value={pct} aria-label={`Downloading ${entry.name}`} />
          <span className="small">
            {pct.toFixed(0)}% · {formatBytes(download.done)} of {formatBytes(download.total)} · {formatBytes(download.speed)}/s
          </span>
          <button type="button" aria-label={`Cancel the download of ${entry.name}`} onClick={() => api.cancelDownload(entry.spec)}>
            Cancel
          </button>
        </div>
      ) : (
        <div className="download">
          {download?.error && <span className="error small">{download.error}</span>}
          <button type="button" className={highlight ? "primary" : ""} onClick={() => onDownload(entry)}>
            {download?.error ? "Retry" : tooBig ? "Download anyway" : "Download"}
          </button>
        </div>
      )}
    </div>
  );
}
