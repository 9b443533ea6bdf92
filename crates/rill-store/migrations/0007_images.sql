-- Issue 42. Images a user message shows the model. Each distinct image is kept once (`images`,
-- by the SHA-256 of its bytes), however many messages show it: a conversation that asks about
-- the same photo again, or an edit that branches, does not copy it. `message_images` says which
-- images a message shows, in order. An image no message shows any more is deleted with the last
-- conversation that showed it (`Store::delete_conversation`).
CREATE TABLE images (
    hash        TEXT    PRIMARY KEY,
    media_type  TEXT    NOT NULL,
    bytes       BLOB    NOT NULL,
    created_at  INTEGER NOT NULL
);

CREATE TABLE message_images (
    message_id  INTEGER NOT NULL REFERENCES messages(id) ON DELETE CASCADE,
    position    INTEGER NOT NULL,
    image_hash  TEXT    NOT NULL REFERENCES images(hash),
    PRIMARY KEY (message_id, position)
);

CREATE INDEX message_images_by_image ON message_images(image_hash);
