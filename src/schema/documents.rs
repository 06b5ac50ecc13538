//! Parsed documents kept by their text: clients send the same few operations over and over,
//! so a document that parsed and passed the limits once is not parsed (nor scanned and
//! counted) again, and one that also passed validation is not validated whole again (see
//! [`KnownDocument::verdict`]). Bounded by count, by each text's length and by the texts'
//! total length (a parsed document takes many times its text: a run of one-letter fields
//! costs over a hundred bytes each), least recently used out first.

use std::num::NonZeroUsize;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use async_graphql::parser::types::ExecutableDocument;
use async_graphql::ValidationResult;
use lru::LruCache;

/// Documents kept.
const CAPACITY: usize = 256;

/// The longest document text kept, in bytes: longer ones are rare, and parsed each time.
pub const MAX_CACHED_BYTES: usize = 8 * 1024;

/// The most text kept in all, in bytes: what a client sending many distinct documents can
/// make the cache hold stays a few megabytes of parsed documents.
pub const MAX_TOTAL_BYTES: usize = 64 * 1024;

/// The parsed document a request runs, shared with the cache rather than copied: put in
/// the request's data for the extensions that read the document after it was parsed (see
/// `schema::field_order`).
pub struct ParsedDocument(pub Arc<ExecutableDocument>);

/// A document kept by its text.
pub struct KnownDocument {
    /// The document as parsed.
    pub document: Arc<ExecutableDocument>,
    /// What became of its validation's verdict, once a request of it passed validation
    /// (see `schema::verdicts`).
    verdict: OnceLock<Verdict>,
}

/// What became of a document's validation verdict.
#[derive(Debug, Clone, Copy)]
pub enum Verdict {
    /// Kept: what validation measured when a request of the document passed it, which
    /// holds for every request of it; only the arguments their variables fill are left to
    /// check (see `schema::argument_values`).
    Kept(ValidationResult),
    /// Not kept: a request could change the outcome, so each is validated whole.
    Withheld,
}

impl KnownDocument {
    /// What became of the document's verdict, once decided.
    pub fn verdict(&self) -> Option<&Verdict> {
        self.verdict.get()
    }

    /// Decides what becomes of the verdict, after a request of the document passed
    /// validation. Every request of the document decides the same: the first one stands.
    pub fn decide(&self, verdict: Verdict) {
        let _ = self.verdict.set(verdict);
    }
}

/// Parsed documents by their text, shared by every request of the process.
pub struct DocumentCache {
    entries: Mutex<Entries>,
}

/// The documents, and the length of their texts together.
struct Entries {
    documents: LruCache<Arc<str>, Arc<KnownDocument>>,
    bytes: usize,
}

impl Default for DocumentCache {
    fn default() -> Self {
        Self::with_capacity(CAPACITY)
    }
}

impl DocumentCache {
    /// A cache of at most `capacity` documents (at least one).
    pub fn with_capacity(capacity: usize) -> Self {
        let capacity = NonZeroUsize::new(capacity).unwrap_or(NonZeroUsize::MIN);
        Self {
            entries: Mutex::new(Entries {
                documents: LruCache::new(capacity),
                bytes: 0,
            }),
        }
    }

    /// The document parsed from `query` before, if it is still kept.
    pub fn get(&self, query: &str) -> Option<Arc<KnownDocument>> {
        self.entries
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .documents
            .get(query)
            .cloned()
    }

    /// Keeps `document`, parsed from `query` and within the limits, unless `query` is too
    /// long to keep; the least recently used go until the texts fit [`MAX_TOTAL_BYTES`].
    /// Returns the document as kept.
    pub fn insert(&self, query: &str, document: &ExecutableDocument) -> Option<Arc<KnownDocument>> {
        if query.len() > MAX_CACHED_BYTES {
            return None;
        }
        let mut entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((old, _)) = entries.documents.pop_entry(query) {
            entries.bytes -= old.len();
        }
        while entries.bytes + query.len() > MAX_TOTAL_BYTES {
            let Some((old, _)) = entries.documents.pop_lru() else {
                break;
            };
            entries.bytes -= old.len();
        }
        entries.bytes += query.len();
        let document = Arc::new(KnownDocument {
            document: Arc::new(document.clone()),
            verdict: OnceLock::new(),
        });
        if let Some((old, _)) = entries.documents.push(Arc::from(query), document.clone()) {
            // Full by count: the least recently used went.
            entries.bytes -= old.len();
        }
        Some(document)
    }

    /// How many documents are kept.
    pub fn len(&self) -> usize {
        self.entries
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .documents
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

    #[test]
    fn the_texts_together_stay_within_their_budget() {
        let cache = DocumentCache::default();
        let texts: Vec<String> = (0..20)
            .map(|n| format!("{{ f{n}{} }}", "x".repeat(MAX_CACHED_BYTES - 16)))
            .collect();
        for text in &texts {
            cache.insert(text, &parsed(text));
            cache.insert(text, &parsed(text));
        }
        let kept = MAX_TOTAL_BYTES / texts[0].len();
        assert_eq!(cache.len(), kept, "as many as fit, each counted once");
        assert!(texts[20 - kept..].iter().all(|t| cache.get(t).is_some()));
        assert!(cache.get(&texts[0]).is_none(), "the oldest went first");
    }
}
