//! Parsed documents kept by their text: clients send the same few operations over and over,
//! so a document that parsed and passed the limits once is not parsed (nor scanned and
//! counted) again. Bounded by count and by size, least recently used out first.

use std::num::NonZeroUsize;
use std::sync::{Arc, Mutex, PoisonError};

use async_graphql::parser::types::ExecutableDocument;
use lru::LruCache;

/// Documents kept.
const CAPACITY: usize = 256;

/// The longest document text kept, in bytes: longer ones are rare, and parsed each time.
pub const MAX_CACHED_BYTES: usize = 8 * 1024;

/// Parsed documents by their text, shared by every request of the process.
pub struct DocumentCache {
    entries: Mutex<LruCache<Arc<str>, Arc<ExecutableDocument>>>,
}

impl Default for DocumentCache {
    fn default() -> Self {
        Self::with_capacity(CAPACITY)
    }
}

impl DocumentCache {
    /// A cache of at most `capacity` documents (at least one).
    pub fn with_capacity(capacity: usize) -> Self {
        Self {
            entries: Mutex::new(LruCache::new(
                NonZeroUsize::new(capacity).unwrap_or(NonZeroUsize::MIN),
            )),
        }
    }

    /// The document parsed from `query` before, if it is still kept.
    pub fn get(&self, query: &str) -> Option<Arc<ExecutableDocument>> {
        self.entries
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(query)
            .cloned()
    }

    /// Keeps `document`, parsed from `query` and within the limits, unless `query` is too
    /// long to keep.
    pub fn insert(&self, query: &str, document: &ExecutableDocument) {
        if query.len() > MAX_CACHED_BYTES {
            return;
        }
        self.entries
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .put(Arc::from(query), Arc::new(document.clone()));
    }

    /// How many documents are kept.
    pub fn len(&self) -> usize {
        self.entries
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(query: &str) -> ExecutableDocument {
        async_graphql::parser::parse_query(query).expect("parses")
    }

    #[test]
    fn the_least_recently_used_goes_first_and_long_texts_are_not_kept() {
        let cache = DocumentCache::with_capacity(2);
        let (a, b, c) = ("{ a }", "{ b }", "{ c }");
        cache.insert(a, &parsed(a));
        cache.insert(b, &parsed(b));
        assert!(cache.get(a).is_some(), "a is now the most recent");
        cache.insert(c, &parsed(c));
        assert!(cache.get(b).is_none(), "b was the least recently used");
        assert!(cache.get(a).is_some() && cache.get(c).is_some());

        let long = format!("{{ a{} }}", "b".repeat(MAX_CACHED_BYTES));
        cache.insert(&long, &parsed(&long));
        assert!(cache.get(&long).is_none());
        assert_eq!(cache.len(), 2);
    }
}
