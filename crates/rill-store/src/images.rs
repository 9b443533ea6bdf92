//! Images that user messages show the model (issue 42): each distinct image stored once, by
//! the SHA-256 of its bytes ([`StoredImage`]), and which images each message shows, in order.
//! A message's images are written with it, in its transaction; a [`Message`](crate::Message)
//! read back lists their hashes, and [`Store::image`] gives the bytes.

use sha2::{Digest, Sha256};
use sqlx::SqliteConnection;

use crate::{now_ms, Error, Result, Store};

/// An image as stored: its hash (SHA-256, hex), media type and bytes.
#[derive(Clone, Debug, PartialEq, Eq, sqlx::FromRow)]
pub struct StoredImage {
    pub hash: String,
    pub media_type: String,
    pub bytes: Vec<u8>,
}

/// The SHA-256 of `bytes`, as lowercase hex.
pub fn image_hash(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The media type an image's first bytes say (the formats the engine reads), else
/// `application/octet-stream`.
pub fn media_type(bytes: &[u8]) -> &'static str {
    match bytes {
        [0x89, b'P', b'N', b'G', ..] => "image/png",
        [0xff, 0xd8, 0xff, ..] => "image/jpeg",
        [b'R', b'I', b'F', b'F', _, _, _, _, b'W', b'E', b'B', b'P', ..] => "image/webp",
        _ => "application/octet-stream",
    }
}

/// Stores `images` (once each) and records them as message `id`'s, in order.
pub(crate) async fn attach(tx: &mut SqliteConnection, id: i64, images: &[Vec<u8>]) -> Result<()> {
    for (position, bytes) in images.iter().enumerate() {
        let hash = image_hash(bytes);
        sqlx::query(
            "INSERT OR IGNORE INTO images (hash, media_type, bytes, created_at) VALUES (?, ?, ?, ?)",
        )
        .bind(&hash)
        .bind(media_type(bytes))
        .bind(bytes.as_slice())
        .bind(now_ms())
        .execute(&mut *tx)
        .await?;
        sqlx::query(
            "INSERT INTO message_images (message_id, position, image_hash) VALUES (?, ?, ?)",
        )
        .bind(id)
        .bind(position as i64)
        .bind(&hash)
        .execute(&mut *tx)
        .await?;
    }
    Ok(())
}

/// Deletes the images no message shows any more.
pub(crate) async fn drop_unshown(tx: &mut SqliteConnection) -> Result<()> {
    sqlx::query(
        "DELETE FROM images WHERE NOT EXISTS
             (SELECT 1 FROM message_images WHERE image_hash = images.hash)",
    )
    .execute(&mut *tx)
    .await?;
    Ok(())
}

impl Store {
    /// The image stored under `hash`.
    pub async fn image(&self, hash: &str) -> Result<StoredImage> {
        sqlx::query_as("SELECT hash, media_type, bytes FROM images WHERE hash = ?")
            .bind(hash)
            .fetch_optional(self.pool())
            .await?
            .ok_or_else(|| Error::ImageNotFound(hash.to_owned()))
    }

    /// The hashes of the images message `id` shows, in order.
    pub async fn message_image_hashes(&self, id: i64) -> Result<Vec<String>> {
        let rows: Vec<(String,)> = sqlx::query_as(
            "SELECT image_hash FROM message_images WHERE message_id = ? ORDER BY position",
        )
        .bind(id)
        .fetch_all(self.pool())
        .await?;
        Ok(rows.into_iter().map(|r| r.0).collect())
    }
}
