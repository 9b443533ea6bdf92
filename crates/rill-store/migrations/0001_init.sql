-- Conversations, messages as a tree, presets, settings, and full-text search over messages.
-- Times are Unix milliseconds.

CREATE TABLE conversations (
    id              INTEGER PRIMARY KEY,
    title           TEXT    NOT NULL DEFAULT '',
    -- 1 once the user renamed it: the title no longer follows the first message.
    title_by_user   INTEGER NOT NULL DEFAULT 0,
    created_at      INTEGER NOT NULL,
    updated_at      INTEGER NOT NULL,
    model           TEXT,
    system_prompt   TEXT,
    settings        TEXT    NOT NULL DEFAULT '{}',
    pinned          INTEGER NOT NULL DEFAULT 0,
    archived        INTEGER NOT NULL DEFAULT 0,
    -- The message the conversation currently ends at (the branch shown and continued).
    current_leaf_id INTEGER REFERENCES messages(id) ON DELETE SET NULL
);

CREATE TABLE messages (
    id                INTEGER PRIMARY KEY,
    conversation_id   INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
    parent_id         INTEGER REFERENCES messages(id) ON DELETE CASCADE,
    role              TEXT    NOT NULL CHECK (role IN ('system', 'user', 'assistant')),
    content           TEXT    NOT NULL DEFAULT '',
    status            TEXT    NOT NULL CHECK (status IN ('streaming', 'done', 'stopped', 'interrupted', 'error')),
    model             TEXT,
    settings          TEXT,
    prompt_tokens     INTEGER,
    completion_tokens INTEGER,
    ttft_ms           REAL,
    decode_tps        REAL,
    error             TEXT,
    created_at        INTEGER NOT NULL,
    updated_at        INTEGER NOT NULL
);

CREATE INDEX messages_by_conversation ON messages(conversation_id, id);
CREATE INDEX messages_by_parent ON messages(parent_id);
CREATE INDEX messages_streaming ON messages(status) WHERE status = 'streaming';
CREATE INDEX conversations_by_update ON conversations(archived, pinned DESC, updated_at DESC);

CREATE TABLE presets (
    id       INTEGER PRIMARY KEY,
    name     TEXT NOT NULL UNIQUE,
    settings TEXT NOT NULL
);

CREATE TABLE app_settings (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);

-- External-content FTS5 index over message text, kept in step by triggers.
CREATE VIRTUAL TABLE messages_fts USING fts5(
    content,
    content = 'messages',
    content_rowid = 'id',
    tokenize = 'unicode61 remove_diacritics 2'
);

CREATE TRIGGER messages_fts_insert AFTER INSERT ON messages BEGIN
    INSERT INTO messages_fts(rowid, content) VALUES (new.id, new.content);
END;

CREATE TRIGGER messages_fts_delete AFTER DELETE ON messages BEGIN
    INSERT INTO messages_fts(messages_fts, rowid, content) VALUES ('delete', old.id, old.content);
END;

CREATE TRIGGER messages_fts_update AFTER UPDATE OF content ON messages BEGIN
    INSERT INTO messages_fts(messages_fts, rowid, content) VALUES ('delete', old.id, old.content);
    INSERT INTO messages_fts(rowid, content) VALUES (new.id, new.content);
END;
