//! Prompt-prefix reuse: KV caches of finished answers, kept so that the next turn of the same
//! conversation (or any prompt sharing a prefix, such as a system prompt) prefills only its new
//! tokens. A new sequence takes the entry with the longest common prefix; the entry's cache is
//! moved, not copied, and cut back to the shared part, or to the longest part of it that its
//! windowed layers still reach (`KvCache::reachable`). Least recently used entries go first
//! when memory is needed.

use crate::model::KvCache;

struct Entry {
    tokens: Vec<u32>,
    cache: KvCache,
    last_used: u64,
}

#[derive(Default)]
pub(crate) struct PrefixCache {
    entries: Vec<Entry>,
    clock: u64,
}

/// Most entries kept, whatever the memory: a lookup compares against each.
const MAX_ENTRIES: usize = 32;

/// Whether `cache`, which holds `held`, holds `tokens` too: they begin `held`, and the cache
/// can be cut back to them (a windowed layer may have dropped what they need).
fn holds(held: &[u32], cache: &KvCache, tokens: &[u32]) -> bool {
    held.starts_with(tokens) && cache.reachable(tokens.len()) == tokens.len()
}

impl PrefixCache {
    /// Keeps `cache`, which holds the keys and values of `tokens`.
    pub fn insert(&mut self, tokens: Vec<u32>, cache: KvCache) {
        // Nothing to keep when an entry already holds these tokens and more, and can be cut
        // back to them.
        if tokens.is_empty()
            || self
                .entries
                .iter()
                .any(|e| holds(&e.tokens, &e.cache, &tokens))
        {
            return;
        }
        // An entry that is a prefix of the new one is superseded by it (when the new one can be
        // cut back to it).
        self.entries.retain(|e| !holds(&tokens, &cache, &e.tokens));
        self.clock += 1;
        self.entries.push(Entry {
            tokens,
            cache,
            last_used: self.clock,
        });
        if self.entries.len() > MAX_ENTRIES {
            self.evict_lru();
        }
    }

    /// Takes the cache sharing the longest prefix with `prompt`, cut to that prefix. At least
    /// one prompt token is left to run, since the answer needs the logits of the last one.
    pub fn take_longest(&mut self, prompt: &[u32]) -> Option<KvCache> {
        let (best, len) = self.longest(prompt)?;
        let mut entry = self.entries.swap_remove(best);
        entry.cache.truncate(len);
        Some(entry.cache)
    }

    /// A copy of the longest shared prefix's cache (as [`take_longest`](Self::take_longest)),
    /// leaving the entry whole: a preview looks at a conversation without taking its cache.
    pub fn copy_longest(&mut self, prompt: &[u32]) -> Option<KvCache> {
        let (best, len) = self.longest(prompt)?;
        self.clock += 1;
        let entry = &mut self.entries[best];
        entry.last_used = self.clock;
        match entry.cache.copy_prefix(len) {
            Ok(c) => Some(c),
            Err(e) => {
                tracing::warn!(error = %e, "could not copy a kept cache; computing afresh");
                None
            }
        }
    }

    /// The entry sharing the longest reachable prefix with `prompt`, and that length (leaving
    /// one token).
    fn longest(&self, prompt: &[u32]) -> Option<(usize, usize)> {
        let limit = prompt.len().saturating_sub(1);
        let (best, len) = self
            .entries
            .iter()
            .enumerate()
            .map(|(i, e)| {
                let shared = e.tokens.iter().zip(prompt).take_while(|(a, b)| a == b);
                (i, e.cache.reachable(shared.count().min(limit)))
            })
            .max_by_key(|&(_, len)| len)?;
        (len > 0).then_some((best, len))
    }

    /// Drops the least recently used entry; false when there is none.
    pub fn evict_lru(&mut self) -> bool {
        let Some(i) = self
            .entries
            .iter()
            .enumerate()
            .min_by_key(|(_, e)| e.last_used)
            .map(|(i, _)| i)
        else {
            return false;
        };
        self.entries.swap_remove(i);
        true
    }

    pub fn bytes(&self) -> usize {
        self.entries.iter().map(|e| e.cache.bytes()).sum()
    }
}
