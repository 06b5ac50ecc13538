//! A short-lived cache of authenticated API keys: a busy client costs one key lookup per
//! `COURIER_AUTH_CACHE_MS`, not one per request. Only valid keys are cached, so a new key
//! works at once; a revoked key is evicted by [`crate::auth::revocation`] within a second on every
//! process, and would in any case expire with the TTL.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use uuid::Uuid;

use crate::auth::usage::KeyUsage;
use crate::auth::{self, Identity};
use crate::db::Db;
use crate::error::{Error, Result};

/// Entries kept at most; past this the cache starts over (keys are few in practice).
const MAX_ENTRIES: usize = 10_000;

/// Authenticated keys by token hash, each with when it was looked up.
#[derive(Debug)]
pub struct KeyCache {
    ttl: Duration,
    entries: Mutex<Entries>,
    usage: KeyUsage,
}

/// Evictions remembered, to tell which keys a lookup under way was overtaken by; a lookup
/// that started before the oldest remembered is not cached.
const REMEMBERED_EVICTIONS: usize = 256;

/// The cache's entries, how many keys have been evicted, and the latest of them: a lookup
/// that the eviction of its key overtook is not cached, since it may have read the key
/// before its revocation committed.
#[derive(Debug, Default)]
struct Entries {
    by_hash: HashMap<String, (Identity, Instant)>,
    evictions: u64,
    /// The latest evictions: each one's number (from 1) and key.
    recent: VecDeque<(u64, Uuid)>,
}

impl Entries {
    /// Whether key `key_id` may have been evicted after `evictions_before` evictions.
    fn evicted_since(&self, key_id: Uuid, evictions_before: u64) -> bool {
        let forgotten = self
            .recent
            .front()
            .is_some_and(|(oldest, _)| *oldest > evictions_before + 1);
        forgotten
            || self
                .recent
                .iter()
                .any(|(number, evicted)| *number > evictions_before && *evicted == key_id)
    }
}

impl KeyCache {
    /// A cache keeping identities for `ttl` (zero: no caching).
    pub fn new(ttl: Duration) -> Self {
        KeyCache {
            ttl,
            entries: Mutex::new(Entries::default()),
            usage: KeyUsage::default(),
        }
    }

    /// Resolves an `Authorization` header value to the caller, from the cache when fresh,
    /// and notes the key's use (see [`KeyUsage`]).
    pub async fn authenticate(&self, db: &Db, authorization: Option<&str>) -> Result<Identity> {
        let identity = self.lookup(db, authorization).await?;
        self.usage.touch(db, identity.key_id);
        Ok(identity)
    }

    /// Notes that the keys `key_ids` hold open sessions (WebSockets, subscriptions): they
    /// are in use as long as those last, not only when they authenticated.
    pub fn note_in_use(&self, db: &Db, key_ids: &[Uuid]) {
        for key_id in key_ids {
            self.usage.touch(db, *key_id);
        }
    }

    async fn lookup(&self, db: &Db, authorization: Option<&str>) -> Result<Identity> {
        if self.ttl.is_zero() {
            return auth::authenticate(db, authorization).await;
        }
        let token = authorization
            .and_then(auth::bearer_token)
            .ok_or(Error::Unauthenticated)?;
        let hash = auth::hash_token(token);
        if let Some(identity) = self.fresh(&hash) {
            return Ok(identity);
        }
        let evictions_before = self.evictions();
        let identity = auth::authenticate_hash(db, &hash).await?;
        self.remember(hash, &identity, evictions_before);
        Ok(identity)
    }

    /// How many evictions there have been, to hand to [`KeyCache::remember`].
    fn evictions(&self) -> Option<u64> {
        self.entries.lock().map(|entries| entries.evictions).ok()
    }

    /// Caches `identity`, looked up by token hash `hash`, unless its key was evicted since
    /// [`KeyCache::evictions`] answered `evictions_before`.
    fn remember(&self, hash: String, identity: &Identity, evictions_before: Option<u64>) {
        let Some(evictions_before) = evictions_before else {
            return;
        };
        if let Ok(mut entries) = self.entries.lock() {
            if entries.evicted_since(identity.key_id, evictions_before) {
                return;
            }
            if entries.by_hash.len() >= MAX_ENTRIES {
                entries.by_hash.clear();
            }
            entries
                .by_hash
                .insert(hash, (identity.clone(), Instant::now()));
        }
    }

    /// The keys of the fresh entries (the ones a request may still be admitted by);
    /// expired entries are dropped on the way.
    pub fn key_ids(&self) -> Vec<Uuid> {
        let Ok(mut entries) = self.entries.lock() else {
            return Vec::new();
        };
        entries
            .by_hash
            .retain(|_, (_, looked_up)| looked_up.elapsed() < self.ttl);
        entries
            .by_hash
            .values()
            .map(|(identity, _)| identity.key_id)
            .collect()
    }

    /// Forgets every entry of the keys in `revoked`, so their next request is looked up,
    /// and keeps a lookup already under way from caching what it read.
    pub fn evict(&self, revoked: &[Uuid]) {
        if let Ok(mut entries) = self.entries.lock() {
            for key_id in revoked {
                entries.evictions += 1;
                let number = entries.evictions;
                entries.recent.push_back((number, *key_id));
                if entries.recent.len() > REMEMBERED_EVICTIONS {
                    entries.recent.pop_front();
                }
            }
            entries
                .by_hash
                .retain(|_, (identity, _)| !revoked.contains(&identity.key_id));
        }
    }

    fn fresh(&self, hash: &str) -> Option<Identity> {
        let entries = self.entries.lock().ok()?;
        let (identity, looked_up) = entries.by_hash.get(hash)?;
        // An expiring key (a portal link's) is looked up again once it may have expired,
        // by the database's clock as measured here; the lookup asks the database itself.
        let expired = identity
            .expires_at
            .is_some_and(|expires_at| expires_at <= crate::db::now());
        (looked_up.elapsed() < self.ttl && !expired).then(|| identity.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::Role;

    fn identity() -> Identity {
        Identity {
            key_id: Uuid::now_v7(),
            role: Role::Admin,
            scope: Vec::new(),
            tenant: None,
            expires_at: None,
        }
    }

    #[test]
    fn a_lookup_an_eviction_overtook_is_not_cached() {
        let cache = KeyCache::new(Duration::from_secs(60));
        let (read, revoked) = (identity(), identity());
        let before = cache.evictions();
        cache.remember("a".to_owned(), &read, before);
        assert!(
            cache.fresh("a").is_some(),
            "a lookup nothing overtook is cached"
        );

        // A lookup reads key `revoked` before its revocation commits; the revoking
        // request evicts it; then the lookup finishes.
        let before = cache.evictions();
        cache.evict(&[revoked.key_id]);
        cache.remember("b".to_owned(), &revoked, before);
        assert!(
            cache.fresh("b").is_none(),
            "what a lookup read before an eviction is not cached after it"
        );
        assert!(cache.fresh("a").is_some(), "other keys stay cached");

        // Another key's eviction does not keep a lookup from being cached.
        let looked_up = identity();
        let before = cache.evictions();
        cache.evict(&[identity().key_id]);
        cache.remember("c".to_owned(), &looked_up, before);
        assert!(
            cache.fresh("c").is_some(),
            "overtaken by another key's eviction"
        );

        // Past what is remembered, a lookup is not cached.
        let before = cache.evictions();
        let many: Vec<Uuid> = (0..=REMEMBERED_EVICTIONS).map(|_| Uuid::now_v7()).collect();
        cache.evict(&many);
        cache.remember("d".to_owned(), &identity(), before);
        assert!(
            cache.fresh("d").is_none(),
            "overtaken by more than is remembered"
        );
    }
}
