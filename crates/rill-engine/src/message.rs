//! A conversation's vocabulary: [`Message`], its [`Role`], the [`ToolCall`]s an assistant
//! message made and the images ([`ImageData`]) a message carries. Plain data at the ground of
//! the crate, read by the chat template, the tool formats and the request alike (re-exported
//! by [`crate::template`] and [`crate::tools`]).

use std::sync::Arc;

use serde::{Deserialize, Serialize};

/// Who said a message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    System,
    User,
    Assistant,
    /// A tool's result, answering the call named by the message's `tool_call_id`.
    Tool,
}

impl Role {
    /// The role's name in templates and in OpenAI's API.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
        }
    }
}

/// A function call that an assistant message made.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    /// The arguments as JSON text, as OpenAI's API carries them.
    pub arguments: String,
}

/// Token ids at and above this stand for an image's rows in a prompt (issue 42): no
/// vocabulary comes near 2³¹ tokens. An image's rows all carry the same id, made from its
/// content ([`ImageData::placeholder`]), so prefix reuse compares images by what they show.
pub const IMAGE_PLACEHOLDER: u32 = 0x8000_0000;

/// Where an image stands in a rendered prompt: text no message writes (llama.cpp's media
/// marker), replaced by the image's tokens once the template has run.
pub const IMAGE_MARKER: &str = "<__media__>";

/// An image attached to a message: the file's bytes as the user sent them (JPEG, PNG or WebP;
/// checked and decoded when a model reads them, `vision/picture.rs`).
#[derive(Clone, PartialEq, Eq)]
pub struct ImageData(Arc<[u8]>);

impl ImageData {
    pub fn new(bytes: impl Into<Arc<[u8]>>) -> Self {
        ImageData(bytes.into())
    }

    pub fn bytes(&self) -> &[u8] {
        &self.0
    }

    /// The identity of the content: FNV-1a over the bytes, 64 bits (stable across runs and
    /// versions, as std's hasher is not promised to be).
    pub fn id(&self) -> u64 {
        content_id(&self.0)
    }

    /// The token id its rows carry in a prompt.
    pub fn placeholder(&self) -> u32 {
        placeholder(self.id())
    }
}

/// Largest image a data URL may carry (20 MB, `vision::picture::MAX_BYTES`).
const MAX_IMAGE_BYTES: usize = 20 << 20;

impl ImageData {
    /// The image of a `data:` URL (`data:image/png;base64,…`), as OpenAI's `image_url` content
    /// parts carry one. A web address is refused: Rill does not fetch from the network on a
    /// model's behalf.
    pub fn from_url(url: &str) -> Result<ImageData, String> {
        use base64::Engine;
        let url = url.trim();
        if url.starts_with("http://") || url.starts_with("https://") {
            return Err(
                "images are sent as data: URLs (base64); Rill does not fetch images \
                        from the network"
                    .into(),
            );
        }
        let Some(rest) = url.strip_prefix("data:") else {
            return Err("an image URL must be a data: URL (data:image/png;base64,…)".into());
        };
        let Some((head, data)) = rest.split_once(',') else {
            return Err("the data: URL has no `,` before its data".into());
        };
        if !head.ends_with(";base64") {
            return Err("the data: URL's image must be base64 (`;base64,`)".into());
        }
        // Four characters carry three bytes: refuse a body past the limit before decoding.
        if data.len() / 4 * 3 > MAX_IMAGE_BYTES + 3 {
            return Err(format!("the image is over {} MB", MAX_IMAGE_BYTES >> 20));
        }
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(data.trim())
            .map_err(|e| format!("the data: URL's base64 is damaged: {e}"))?;
        Ok(ImageData::new(bytes))
    }

    /// The image as a `data:` URL, its type read from its first bytes.
    pub fn to_url(&self) -> String {
        use base64::Engine;
        format!(
            "data:{};base64,{}",
            self.media_type(),
            base64::engine::general_purpose::STANDARD.encode(self.bytes())
        )
    }

    /// The media type its first bytes say (`image/png`, `image/jpeg`, `image/webp`), else
    /// `application/octet-stream`.
    pub fn media_type(&self) -> &'static str {
        match self.bytes() {
            [0x89, b'P', b'N', b'G', ..] => "image/png",
            [0xff, 0xd8, 0xff, ..] => "image/jpeg",
            [b'R', b'I', b'F', b'F', _, _, _, _, b'W', b'E', b'B', b'P', ..] => "image/webp",
            _ => "application/octet-stream",
        }
    }
}

/// FNV-1a over `bytes`, 64 bits.
pub fn content_id(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// The placeholder id of the image whose content id is `id`.
pub fn placeholder(id: u64) -> u32 {
    IMAGE_PLACEHOLDER | ((id ^ (id >> 32)) as u32 & !IMAGE_PLACEHOLDER)
}

impl std::fmt::Debug for ImageData {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ImageData({} bytes, {:016x})", self.0.len(), self.id())
    }
}

/// One turn of a conversation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Message {
    pub role: Role,
    pub content: String,
    /// The calls an assistant message made.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    /// For a [`Role::Tool`] message: the call it answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// An assistant message's reasoning (a thinking model's thoughts, kept apart from its
    /// content). Templates see it as `reasoning_content` (Qwen3, DeepSeek) and `thinking`
    /// (gpt-oss) and decide whether the model reads it again; most drop it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning: Option<String>,
    /// Images the message shows the model, before its text, in order (issue 42). Carried by
    /// each front end in its own form (a file, a data URL, a row of the store), not in this
    /// type's JSON.
    #[serde(skip)]
    pub images: Vec<ImageData>,
}

impl Message {
    pub fn new(role: Role, content: impl Into<String>) -> Self {
        Message {
            role,
            content: content.into(),
            tool_calls: Vec::new(),
            tool_call_id: None,
            reasoning: None,
            images: Vec::new(),
        }
    }
    /// A tool's result for the call `id`.
    pub fn tool(id: impl Into<String>, content: impl Into<String>) -> Self {
        Message {
            tool_call_id: Some(id.into()),
            ..Self::new(Role::Tool, content)
        }
    }

    pub fn system(content: impl Into<String>) -> Self {
        Self::new(Role::System, content)
    }
    pub fn user(content: impl Into<String>) -> Self {
        Self::new(Role::User, content)
    }
    pub fn assistant(content: impl Into<String>) -> Self {
        Self::new(Role::Assistant, content)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_image_goes_through_a_data_url_and_back() {
        let png = ImageData::new(b"\x89PNG\r\n\x1a\nrest of a png".to_vec());
        let url = png.to_url();
        assert!(url.starts_with("data:image/png;base64,"), "{url}");
        assert_eq!(ImageData::from_url(&url).unwrap(), png);
        assert_eq!(
            png.placeholder(),
            ImageData::from_url(&url).unwrap().placeholder()
        );
        assert!(png.placeholder() >= IMAGE_PLACEHOLDER);
        let jpeg = ImageData::new(vec![0xff, 0xd8, 0xff, 0xe0]);
        assert_eq!(jpeg.media_type(), "image/jpeg");
        assert_ne!(jpeg.placeholder(), png.placeholder());
    }

    #[test]
    fn urls_that_are_not_images_are_refused_by_name() {
        let err = ImageData::from_url("https://example.com/cat.png").unwrap_err();
        assert!(err.contains("does not fetch"), "{err}");
        assert!(ImageData::from_url("file:///etc/passwd").is_err());
        assert!(ImageData::from_url("data:image/png,rawtext")
            .unwrap_err()
            .contains("base64"));
        assert!(ImageData::from_url("data:image/png;base64,@@@@")
            .unwrap_err()
            .contains("damaged"));
        let huge = format!("data:image/png;base64,{}", "A".repeat(30 << 20));
        assert!(ImageData::from_url(&huge).unwrap_err().contains("20 MB"));
    }
}
