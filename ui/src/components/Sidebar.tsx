import { useEffect, useState, type RefObject } from "react";
import { api, errorText, type Conversation, type SearchHit } from "../lib/ipc";
import { useLive } from "../lib/useLive";

interface Props {
  conversations: Conversation[];
  current: number | null;
  searchRef: RefObject<HTMLInputElement>;
  onOpen: (id: number) => void;
  onNew: () => void;
  onChanged: (deleted?: number) => void;
  onError: (e: string) => void;
}

export default function Sidebar({ conversations, current, searchRef, onOpen, onNew, onChanged, onError }: Props) {
  const live = useLive();
  const [query, setQuery] = useState("");
  const [hits, setHits] = useState<SearchHit[] | null>(null);
  const [renaming, setRenaming] = useState<number | null>(null);
  // Delete asks once more on the same button (a native confirm() is not available everywhere).
  const [confirming, setConfirming] = useState<number | null>(null);

  useEffect(() => {
    if (!query.trim()) {
      setHits(null);
      return;
    }
    const t = setTimeout(() => {
      api.search(query).then(setHits, (e) => onError(errorText(e)));
    }, 150);
    return () => clearTimeout(t);
  }, [query, onError]);

  const sorted = [...conversations].sort(
    (a, b) => Number(b.pinned) - Number(a.pinned) || b.updated_at - a.updated_at,
  );

  return (
    <nav className="sidebar" aria-label="Conversations">
      <div className="sidebar-top">
        <button type="button" className="primary" data-testid="new-chat" aria-label="New chat" onClick={onNew}>
          + New chat
        </button>
        <input
          ref={searchRef}
          type="search"
          data-testid="search"
          aria-label="Search conversations"
          placeholder="Search (Ctrl+K)"
          value={query}
          onChange={(e) => setQuery(e.target.value)}
          onKeyDown={(e) => e.key === "Escape" && setQuery("")}
        />
      </div>
      {hits ? (
        <ul className="search-hits" aria-label="Search results">
          {hits.length === 0 && <li className="muted">Nothing found.</li>}
          {hits.map((h) => (
            <li key={h.message_id}>
              <button
                type="button"
                onClick={() => {
                  setQuery("");
                  onOpen(h.conversation_id);
                }}
              >
                <strong>{h.title || "Untitled"}</strong>
                <span className="snippet">{h.snippet}</span>
              </button>
            </li>
          ))}
        </ul>
      ) : (
        <ul className="conversations">
          {sorted.map((c) => {
            const running = live.running(c.id);
            const partial = running[0]?.text.slice(-90);
            return (
              <li
                key={c.id}
                data-testid="conversation-item"
                data-id={c.id}
                data-live={running.length > 0 ? "true" : "false"}
                className={c.id === current ? "active" : ""}
              >
                {renaming === c.id ? (
                  <input
                    autoFocus
                    aria-label="New title"
                    defaultValue={c.title}
                    onKeyDown={async (e) => {
                      if (e.key === "Enter") {
                        await api.renameConversation(c.id, e.currentTarget.value).catch((x) => onError(errorText(x)));
                        setRenaming(null);
                        onChanged();
                      } else if (e.key === "Escape") setRenaming(null);
                    }}
                    onBlur={() => setRenaming(null)}
                  />
                ) : (
                  <button type="button" className="conv-open" aria-label={`Open ${c.title || "new chat"}`} onClick={() => onOpen(c.id)}>
                    <span className="conv-title">
                      {running.length > 0 && <span className="live-dot" aria-label="generating" />}
                      {c.pinned && <span aria-label="pinned">📌 </span>}
                      {c.title || "New chat"}
                    </span>
                    {partial && <span className="conv-partial">{partial}</span>}
                  </button>
                )}
                <span className="conv-actions">
                  <button type="button" aria-label={c.pinned ? "Unpin" : "Pin"} title={c.pinned ? "Unpin" : "Pin"}
                    onClick={() => api.setPinned(c.id, !c.pinned).then(() => onChanged(), (e) => onError(errorText(e)))}>
                    {c.pinned ? "★" : "☆"}
                  </button>
                  <button type="button" aria-label="Rename" title="Rename" onClick={() => setRenaming(c.id)}>
                    ✎
                  </button>
                  <button type="button" aria-label={confirming === c.id ? "Confirm delete" : "Delete"}
                    title={confirming === c.id ? "Click again to delete" : "Delete"}
                    className={confirming === c.id ? "danger" : ""}
                    onBlur={() => setConfirming(null)}
                    onClick={() => {
                      if (confirming !== c.id) return setConfirming(c.id);
                      setConfirming(null);
                      api.deleteConversation(c.id).then(() => onChanged(c.id), (e) => onError(errorText(e)));
                    }}>
                    {confirming === c.id ? "Delete?" : "🗑"}
                  </button>
                </span>
              </li>
            );
          })}
        </ul>
      )}
      <div className="sidebar-bottom">
        <button
          type="button"
          aria-label="Import a conversation"
          onClick={async () => {
            try {
              // The app opens the file dialog itself; the page never names the file.
              const id = await api.importConversation();
              if (id === null) return;
              onChanged();
              onOpen(id);
            } catch (e) {
              onError(errorText(e));
            }
          }}
        >
          Import…
        </button>
      </div>
    </nav>
  );
}
