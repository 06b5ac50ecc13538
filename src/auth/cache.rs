//! A short-lived cache of authenticated API keys: a busy client costs one key lookup per
//! `COURIER_AUTH_CACHE_MS`, not one per request. Only valid keys are cached, so a new key
//! works at once; a revoked key is evicted by [`crate::auth::revocation`] within a second on every
//! process, and would in any case expire with the TTL.

use std::collections::HashMap;
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
    entries: Mutex<HashMap<String, (Identity, Instant)>>,
    usage: KeyUsage,
}

impl KeyCache {
    /// A cache keeping identities for `ttl` (zero: no caching).
    pub fn new(ttl: Duration) -> Self {
        KeyCache {
            ttl,
            entries: Mutex::new(HashMap::new()),
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
        let identity = auth::authenticate_hash(db, &hash).await?;
        if let Ok(mut entries) = self.entries.lock() {
            if entries.len() >= MAX_ENTRIES {
                entries.clear();
            }
            entries.insert(hash, (identity.clone(), Instant::now()));
        }
        Ok(identity)
    }

    /// The keys of the fresh entries (the ones a request may still be admitted by);
    /// expired entries are dropped on the way.
    pub fn key_ids(&self) -> Vec<Uuid> {
        let Ok(mut entries) = self.entries.lock() else {
            return Vec::new();
        };
        entries.retain(|_, (_, looked_up)| looked_up.elapsed() < self.ttl);
        entries
            .values()
            .map(|(identity, _)| identity.key_id)
            .collect()
    }

    /// Forgets every entry of the keys in `revoked`, so their next request is looked up.
    pub fn evict(&self, revoked: &[Uuid]) {
        if let Ok(mut entries) = self.entries.lock() {
            entries.retain(|_, (identity, _)| !revoked.contains(&identity.key_id));
        }
    }

    fn fresh(&self, hash: &str) -> Option<Identity> {
        let entries = self.entries.lock().ok()?;
        let (identity, looked_up) = entries.get(hash)?;
        (looked_up.elapsed() < self.ttl).then(|| identity.clone())
    }
}
