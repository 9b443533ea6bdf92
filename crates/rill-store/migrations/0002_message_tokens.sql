-- An answer's tokens with their likeliest candidates and probabilities (raw and after
-- sampling), when the app asked the engine for them: a JSON array, one entry per token.
-- Kept apart from `messages` so lists and searches never read it.
CREATE TABLE message_tokens (
    message_id INTEGER PRIMARY KEY REFERENCES messages(id) ON DELETE CASCADE,
    tokens     TEXT    NOT NULL
);
