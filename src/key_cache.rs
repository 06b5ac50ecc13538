//! A short-lived cache of authenticated API keys: a busy client costs one key lookup per
//! `COURIER_AUTH_CACHE_MS`, not one per request. Only valid keys are cached, so a new key
//! works at once; a revoked key stops working within the TTL on every process.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

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
}

impl KeyCache {
    /// A cache keeping identities for `ttl` (zero: no caching).
    pub fn new(ttl: Duration) -> Self {
        KeyCache {
            ttl,
            entries: Mutex::new(HashMap::new()),
        }
    }

    /// Resolves an `Authorization` header value to the caller, from the cache when fresh.
    pub async fn authenticate(&self, db: &Db, authorization: Option<&str>) -> Result<Identity> {
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

    fn fresh(&self, hash: &str) -> Option<Identity> {
        let entries = self.entries.lock().ok()?;
        let (identity, looked_up) = entries.get(hash)?;
        (looked_up.elapsed() < self.ttl).then(|| identity.clone())
    }
}
