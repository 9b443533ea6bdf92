// The panel's "Speed up" setting: speculative decoding, off, by prompt lookup, or with a draft
// model chosen from the models on this machine (the same family's smallest is suggested). The
// text is the same either way; only how soon it comes changes.
import { useEffect, useState } from "react";
import { api, type LocalModel, type PanelSettings } from "../lib/ipc";

interface Props {
  settings: PanelSettings;
  set: (patch: Partial<PanelSettings>) => void;
}

/** Models that can draft for the loaded one: its architecture (a draft must share the
 * vocabulary; the engine checks that exactly when it loads), smallest first, the loaded file
 * itself last. */
export function draftCandidates(local: LocalModel[], loaded: { path: string; architecture: string } | null): LocalModel[] {
  if (!loaded) return [];
  return local
    .filter((m) => m.runs && m.architecture === loaded.architecture)
    .sort((a, b) => Number(a.path === loaded.path) - Number(b.path === loaded.path) || a.file_bytes - b.file_bytes);
}

export function SpeedUp({ settings, set }: Props) {
  const mode = settings.speed_up ?? "off";
  const [candidates, setCandidates] = useState<LocalModel[] | null>(null);
  useEffect(() => {
    if (mode !== "draft" || candidates) return;
    api.models().then((m) => setCandidates(draftCandidates(m.local, m.loaded))).catch(() => setCandidates([]));
  }, [mode, candidates]);
  const choose = (speed_up: "off" | "lookup" | "draft") => {
    if (speed_up !== "draft") return set({ speed_up, draft_model: null });
    // The choice is sent once a model is picked (the list loads first).
    api.models().then((m) => {
      const list = draftCandidates(m.local, m.loaded);
      setCandidates(list);
      set({ speed_up, draft_model: settings.draft_model ?? list[0]?.path ?? null });
    });
  };
  return (
    <>
      <label className="param" title="Speculative decoding: something cheap proposes the next tokens and the model checks several per pass. The same text, sooner.">
        <span className="label">Speed up</span>
        <select data-testid="param-speed-up" value={mode} onChange={(e) => choose(e.target.value as "off" | "lookup" | "draft")}>
          <option value="off">Off</option>
          <option value="lookup">Lookup (repeats from the conversation)</option>
          <option value="draft">Draft model (a smaller model of the same family)</option>
        </select>
      </label>
      {mode === "draft" && (
        <label className="param" title="A smaller model of the same family proposes; the engine refuses a file of another vocabulary.">
          <span className="label">Draft model</span>
          <select data-testid="param-draft-model" value={settings.draft_model ?? ""} onChange={(e) => set({ draft_model: e.target.value })}>
            {!settings.draft_model && <option value="">choose a model</option>}
            {(candidates ?? []).map((m) => (
              <option key={m.path} value={m.path}>
                {m.name} · {m.quantization} · {(m.file_bytes / 1e9).toFixed(2)} GB
              </option>
            ))}
          </select>
          {candidates?.length === 0 && <span className="hint">No model of this family on this machine: download a small one first.</span>}
        </label>
      )}
    </>
  );
}
