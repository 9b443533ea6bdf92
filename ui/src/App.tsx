import { useCallback, useEffect, useRef, useState } from "react";
import { api, errorText, type ModelInfo, type AppStatus, type Conversation, type ConversationView, type PanelSettings } from "./lib/ipc";
import { live } from "./lib/live";
import Sidebar from "./components/Sidebar";
import ChatView from "./components/ChatView";
import SamplingPanel from "./components/SamplingPanel";
import ModelManager from "./components/ModelManager";
import SettingsView from "./components/SettingsView";
import ActivityView from "./components/ActivityView";
import { useLive } from "./lib/useLive";

/** The file's name says what a user downloaded (metadata names are often internal). */
function modelLabel(m: ModelInfo): string {
  const file = m.path.split(/[\\/]/).pop() ?? m.name;
  return file.replace(/\.gguf$/i, "");
}

/** Opens the activity view; shows how many answers are being written. Its own component, so
 * the streaming tokens re-render this button, not the whole app. */
function ActivityButton({ onClick }: { onClick: () => void }) {
  const store = useLive();
  const running = store.all().filter((a) => a.status === "streaming" || a.status === "queued" || a.status === "paused").length;
  return (
    <button type="button" data-testid="activity" aria-label="Activity" onClick={onClick}>
      Activity{running > 0 && <span className="badge live-count">{running}</span>}
    </button>
  );
}

export default function App() {
  const [status, setStatus] = useState<AppStatus | null>(null);
  const [conversations, setConversations] = useState<Conversation[]>([]);
  const [current, setCurrent] = useState<number | null>(null);
  const [view, setView] = useState<ConversationView | null>(null);
  const [showModels, setShowModels] = useState(false);
  const [showSettings, setShowSettings] = useState(false);
  const [showActivity, setShowActivity] = useState(false);

  const [error, setError] = useState<string | null>(null);
  const searchRef = useRef<HTMLInputElement>(null);
  const composerRef = useRef<HTMLTextAreaElement>(null);

  const refreshList = useCallback(async () => {
    try {
      setConversations(await api.listConversations());
    } catch (e) {
      setError(errorText(e));
    }
  }, []);

  const refreshStatus = useCallback(async () => {
    try {
      setStatus(await api.status());
    } catch (e) {
      setError(errorText(e));
    }
  }, []);

  // The conversation in front, for callbacks that must not wait for a render to know it.
  const currentRef = useRef<number | null>(null);
  const openConversation = useCallback(async (id: number) => {
    currentRef.current = id;
    setCurrent(id);
    try {
      setView(await api.openConversation(id));
    } catch (e) {
      setError(errorText(e));
    }
  }, []);

  const reloadCurrent = useCallback(async () => {
    if (current !== null) {
      try {
        const v = await api.openConversation(current);
        setView((old) => (old && old.conversation.id !== current ? old : v));
      } catch (e) {
        setError(errorText(e));
      }
    }
  }, [current]);

  useEffect(() => {
    refreshStatus();
    refreshList();
  }, [refreshStatus, refreshList]);

  // The model loads in the background at start: ask again until it is there.
  useEffect(() => {
    if (status?.model) return;
    const t = setInterval(refreshStatus, 1000);
    return () => clearInterval(t);
  }, [status?.model, refreshStatus]);

  // An answer that ends changes its conversation (title, order, final text).
  useEffect(
    () =>
      live.onDone((a) => {
        refreshList();
        if (a.conversationId === current) reloadCurrent();
      }),
    [current, refreshList, reloadCurrent],
  );

  const newChat = useCallback(async () => {
    try {
      const c = await api.createConversation();
      await refreshList();
      await openConversation(c.id);
      composerRef.current?.focus();
    } catch (e) {
      setError(errorText(e));
    }
  }, [refreshList, openConversation]);

  // The first screen is a chat to type in, its composer focused (as LM Studio opens): the
  // newest conversation with no message yet, or a new one.
  const started = useRef(false);
  useEffect(() => {
    if (started.current) return;
    started.current = true;
    (async () => {
      const list = await api.listConversations();
      // The user may have opened or started a chat meanwhile: that one stays in front.
      if (currentRef.current !== null) return;
      const empty = [...list].sort((a, b) => b.updated_at - a.updated_at).find((c) => c.current_leaf_id === null);
      const id = empty ? empty.id : (await api.createConversation()).id;
      await refreshList();
      if (currentRef.current === null) await openConversation(id);
    })().catch((e) => setError(errorText(e)));
  }, [refreshList, openConversation]);

  useEffect(() => {
    const onKey = (e: KeyboardEvent) => {
      const mod = e.ctrlKey || e.metaKey;
      if (mod && e.key.toLowerCase() === "n") {
        e.preventDefault();
        newChat();
      } else if (mod && e.key.toLowerCase() === "k") {
        e.preventDefault();
        searchRef.current?.focus();
      }
    };
    window.addEventListener("keydown", onKey);
    return () => window.removeEventListener("keydown", onKey);
  }, [newChat]);

  const onSettings = useCallback(
    (settings: PanelSettings) => {
      if (!view) return;
      setView({ ...view, settings });
      // A refused change (a schema the engine cannot use) shows why, and the panel goes back
      // to what the chat keeps.
      api.setParams(view.conversation.id, settings).catch((e) => {
        setError(errorText(e));
        reloadCurrent();
      });
    },
    [view, reloadCurrent],
  );

  const noModel = status !== null && !status.model;

  return (
    <div className="app">
      <Sidebar
        conversations={conversations}
        current={current}
        searchRef={searchRef}
        onOpen={openConversation}
        onNew={newChat}
        onChanged={async (deleted) => {
          await refreshList();
          if (deleted !== undefined && deleted === current) {
            currentRef.current = null;
            setCurrent(null);
            setView(null);
          }
        }}
        onError={setError}
      />
      <main className="main">
        <header className="topbar">
          <button
            type="button"
            className="model-picker"
            data-testid="model-picker"
            aria-label="Choose a model"
            onClick={() => setShowModels(true)}
          >
            {status?.model ? modelLabel(status.model) : "No model loaded"}
          </button>
          <span className="spacer" />
          <ActivityButton onClick={() => (setShowSettings(false), setShowActivity(true))} />
          <button type="button" data-testid="settings" aria-label="Settings" onClick={() => (setShowActivity(false), setShowSettings(true))}>
            Settings
          </button>
          {error && (
            <div className="error-banner" role="alert">
              {error}
              <button type="button" aria-label="Dismiss the error" onClick={() => setError(null)}>
                ×
              </button>
            </div>
          )}
        </header>
        {showSettings ? (
          <SettingsView onClose={() => setShowSettings(false)} />
        ) : showActivity ? (
          <ActivityView
            onClose={() => setShowActivity(false)}
            onOpen={(id) => {
              setShowActivity(false);
              openConversation(id);
            }}
          />
        ) : showModels || noModel ? (
          <ModelManager
            welcome={noModel}
            loaded={status?.model ?? null}
            onClose={() => setShowModels(false)}
            onLoaded={async () => {
              setShowModels(false);
              await refreshStatus();
            }}
          />
        ) : view ? (
          <ChatView
            key={view.conversation.id}
            view={view}
            composerRef={composerRef}
            onView={setView}
            onSent={refreshList}
            onError={setError}
          />
        ) : (
          <div className="empty">
            <p>Start a conversation.</p>
            <button type="button" className="primary" onClick={newChat}>
              New chat <kbd>Ctrl+N</kbd>
            </button>
          </div>
        )}
      </main>
      {view && !showModels && !showSettings && !showActivity && !noModel && (
        <SamplingPanel
          key={view.conversation.id}
          conversation={view.conversation}
          settings={view.settings}
          onChange={onSettings}
          onSystemPrompt={(prompt) =>
            api
              .setSystemPrompt(view.conversation.id, prompt)
              .then(reloadCurrent)
              .catch((e) => setError(errorText(e)))
          }
          onError={setError}
          thinking={status?.model?.thinking ?? "none"}
          answering={view.messages[view.messages.length - 1]?.status === "streaming"}
          turn={`${view.messages.length}:${view.messages[view.messages.length - 1]?.id ?? 0}:${view.messages[view.messages.length - 1]?.status ?? ""}`}
        />
      )}
    </div>
  );
}
