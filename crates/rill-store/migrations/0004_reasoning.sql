-- Issue 16. A thinking model's reasoning (its `<think>` block, gpt-oss's analysis channel),
-- kept beside the answer's content rather than in it: `reasoning` is its text, and
-- `reasoning_tokens` / `reasoning_ms` how many tokens it took and how long (the window's
-- "Thought for 12 s"). It is searched with the content, exported, and given back to the chat
-- template as the message's `reasoning_content` (the template decides whether the model sees
-- it again).
ALTER TABLE messages ADD COLUMN reasoning TEXT NOT NULL DEFAULT '';
ALTER TABLE messages ADD COLUMN reasoning_tokens INTEGER;
ALTER TABLE messages ADD COLUMN reasoning_ms REAL;

-- The search index gains the reasoning as a second column; its triggers follow 0003's rule
-- (a row is indexed once it stops streaming) for both columns.
DROP TRIGGER messages_fts_insert;
DROP TRIGGER messages_fts_delete;
DROP TRIGGER messages_fts_update;
DROP TABLE messages_fts;

CREATE VIRTUAL TABLE messages_fts USING fts5(
    content,
    reasoning,
    content = 'messages',
    content_rowid = 'id',
    tokenize = 'unicode61 remove_diacritics 2'
);

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

INSERT INTO messages_fts(rowid, content, reasoning)
    SELECT id, content, reasoning FROM messages WHERE status != 'streaming';
