//! Full-text search over every message, its content and its reasoning (SQLite FTS5, BM25
//! ranking, a snippet from the column that matched best).

use crate::{Result, SearchHit, Store};

/// Turns what a user types into an FTS5 query: every word must appear (quoted, so `"`, `-`,
/// `AND` or `:` in the text are words, not syntax), and the last one may be a prefix, for
/// search-as-you-type.
pub fn fts_query(input: &str) -> Option<String> {
    let words: Vec<String> = input
        .split_whitespace()
        .map(|w| format!("\"{}\"", w.replace('"', "\"\"")))
        .collect();
    if words.is_empty() {
        return None;
    }
    let mut q = words.join(" ");
    q.push('*');
    Some(q)
}

impl Store {
    /// The best `limit` messages matching `query`, best first.
    pub async fn search(&self, query: &str, limit: u32) -> Result<Vec<SearchHit>> {
        let Some(q) = fts_query(query) else {
            return Ok(Vec::new());
        };
        Ok(sqlx::query_as(
            "SELECT m.conversation_id, m.id AS message_id, c.title, m.role,
                    snippet(messages_fts, -1, '[', ']', '…', 12) AS snippet,
                    bm25(messages_fts) AS rank
             FROM messages_fts
             JOIN messages m ON m.id = messages_fts.rowid
             JOIN conversations c ON c.id = m.conversation_id
             WHERE messages_fts MATCH ?
             ORDER BY rank
             LIMIT ?",
        )
        .bind(q)
        .bind(limit)
        .fetch_all(self.pool())
        .await?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_text_never_becomes_fts_syntax() {
        assert_eq!(fts_query("  "), None);
        assert_eq!(
            fts_query("rust borrow").as_deref(),
            Some("\"rust\" \"borrow\"*")
        );
        assert_eq!(
            fts_query("a\"b NOT c:").as_deref(),
            Some("\"a\"\"b\" \"NOT\" \"c:\"*")
        );
    }
}
