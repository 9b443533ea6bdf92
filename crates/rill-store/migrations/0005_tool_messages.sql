-- no-transaction
-- Issue 16. Tool calls as what they are: an assistant message's calls (`tool_calls`, a JSON
-- array of {"id", "name", "arguments"}) and a tool's result (role `tool`, answering the call
-- `tool_call_id`), so the window shows them as call cards and a conversation saved from the
-- API renders again through the model's own template. Until now a result was kept as a user
-- turn and calls as text.
--
-- SQLite cannot change a CHECK constraint in place, so `messages` is rebuilt as SQLite's
-- documentation says (https://www.sqlite.org/lang_altertable.html, "other kinds of table schema
-- changes"): foreign keys off outside the transaction, a new table, the rows copied with their
-- ids, the old one dropped (its indexes and triggers with it), the new one renamed, indexes and
-- triggers made again. Hence no transaction around the file: it has its own. Run again after a
-- crash between its commit and sqlx's record of it, it rebuilds once more, the same way.
PRAGMA foreign_keys = OFF;

BEGIN;

DROP TABLE IF EXISTS messages_new;

CREATE TABLE messages_new (
    id                INTEGER PRIMARY KEY,
    conversation_id   INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
    parent_id         INTEGER REFERENCES messages(id) ON DELETE CASCADE,
    role              TEXT    NOT NULL CHECK (role IN ('system', 'user', 'assistant', 'tool')),
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
    updated_at        INTEGER NOT NULL,
    writer_pid        INTEGER,
    writer_token      INTEGER,
    writer_seen_at    INTEGER,
    reasoning         TEXT    NOT NULL DEFAULT '',
    reasoning_tokens  INTEGER,
    reasoning_ms      REAL,
    tool_calls        TEXT,
    tool_call_id      TEXT
);

INSERT INTO messages_new (id, conversation_id, parent_id, role, content, status, model, settings,
        prompt_tokens, completion_tokens, ttft_ms, decode_tps, error, created_at, updated_at,
        writer_pid, writer_token, writer_seen_at, reasoning, reasoning_tokens, reasoning_ms)
    SELECT id, conversation_id, parent_id, role, content, status, model, settings,
        prompt_tokens, completion_tokens, ttft_ms, decode_tps, error, created_at, updated_at,
        writer_pid, writer_token, writer_seen_at, reasoning, reasoning_tokens, reasoning_ms
    FROM messages;

DROP TABLE messages;
ALTER TABLE messages_new RENAME TO messages;

CREATE INDEX messages_by_conversation ON messages(conversation_id, id);
CREATE INDEX messages_by_parent ON messages(parent_id);
CREATE INDEX messages_streaming ON messages(status) WHERE status = 'streaming';

-- The search index's triggers, as 0004 made them (the index itself is unchanged: same ids).
CREATE TRIGGER messages_fts_insert AFTER INSERT ON messages WHEN new.status != 'streaming' BEGIN
    INSERT INTO messages_fts(rowid, content, reasoning) VALUES (new.id, new.content, new.reasoning);
END;

CREATE TRIGGER messages_fts_delete AFTER DELETE ON messages WHEN old.status != 'streaming' BEGIN
    INSERT INTO messages_fts(messages_fts, rowid, content, reasoning)
        VALUES ('delete', old.id, old.content, old.reasoning);
END;

CREATE TRIGGER messages_fts_update AFTER UPDATE OF content, reasoning, status ON messages
WHEN NOT (old.status = 'streaming' AND new.status = 'streaming') BEGIN
    INSERT INTO messages_fts(messages_fts, rowid, content, reasoning)
        SELECT 'delete', old.id, old.content, old.reasoning
        WHERE old.status != 'streaming' AND (new.status = 'streaming'
            OR new.content IS NOT old.content OR new.reasoning IS NOT old.reasoning);
    INSERT INTO messages_fts(rowid, content, reasoning)
        SELECT new.id, new.content, new.reasoning
        WHERE new.status != 'streaming' AND (old.status = 'streaming'
            OR new.content IS NOT old.content OR new.reasoning IS NOT old.reasoning);
END;

COMMIT;

PRAGMA foreign_keys = ON;
