-- Issue 13. Who writes a streaming answer: the process (`writer_pid`), which writer within it
-- (`writer_token`), and when it last said it is alive (`writer_seen_at`, Unix ms, every second
-- while the answer streams or is paused). On open, an answer left `streaming` becomes
-- `interrupted` only when its writer is gone; another program opening the same file no longer
-- relabels the live answers of the app.
ALTER TABLE messages ADD COLUMN writer_pid INTEGER;
ALTER TABLE messages ADD COLUMN writer_token INTEGER;
ALTER TABLE messages ADD COLUMN writer_seen_at INTEGER;

-- Search indexes an answer when it stops streaming, not at every 250 ms flush: re-indexing the
-- whole growing text each time was quadratic in its length. A streaming answer is found once it
-- ends (done, stopped, interrupted, error).
DROP TRIGGER messages_fts_insert;
DROP TRIGGER messages_fts_delete;
DROP TRIGGER messages_fts_update;

CREATE TRIGGER messages_fts_insert AFTER INSERT ON messages WHEN new.status != 'streaming' BEGIN
    INSERT INTO messages_fts(rowid, content) VALUES (new.id, new.content);
END;

CREATE TRIGGER messages_fts_delete AFTER DELETE ON messages WHEN old.status != 'streaming' BEGIN
    INSERT INTO messages_fts(messages_fts, rowid, content) VALUES ('delete', old.id, old.content);
END;

-- What the index holds for a row is its content while it is not streaming: take the old text
-- out when it was indexed and changes (or starts streaming again), put the new text in when it
-- is not streaming and is new to the index.
CREATE TRIGGER messages_fts_update AFTER UPDATE OF content, status ON messages
WHEN NOT (old.status = 'streaming' AND new.status = 'streaming') BEGIN
    INSERT INTO messages_fts(messages_fts, rowid, content)
        SELECT 'delete', old.id, old.content
        WHERE old.status != 'streaming' AND (new.status = 'streaming' OR new.content IS NOT old.content);
    INSERT INTO messages_fts(rowid, content)
        SELECT new.id, new.content
        WHERE new.status != 'streaming' AND (old.status = 'streaming' OR new.content IS NOT old.content);
END;

-- The index as these triggers keep it: streaming rows out.
INSERT INTO messages_fts(messages_fts) VALUES ('delete-all');
INSERT INTO messages_fts(rowid, content) SELECT id, content FROM messages WHERE status != 'streaming';
