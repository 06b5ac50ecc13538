//! Revoked and expired API keys, felt by every process within a second: a watcher checks the
//! keys this process has in use, evicts revoked or expired ones from the key cache and ends
//! their sessions (an expiry, a portal link's, is judged by the database's clock).
//!
//! Whatever wrote `api_keys.revoked_at` (this process, another one, plain SQL), the watcher
//! finds it on its next poll, every [`POLL_INTERVAL`]. On PostgreSQL a `NOTIFY` on
//! [`crate::bus::KEYS_CHANNEL`] (sent by [`crate::auth::revoke_api_key`], heard by [`crate::bus::listener`])
//! wakes it at once; that is only a hint, the poll is the guarantee.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::bus::Hint;
use tokio_util::sync::{CancellationToken, WaitForCancellationFuture};
use uuid::Uuid;

use crate::auth;
use crate::auth::cache::KeyCache;
use crate::db::Db;
use crate::error::error_chain;

/// How often the keys in use are checked when no hint arrives.
pub const POLL_INTERVAL: Duration = Duration::from_millis(500);

/// The keys this process's WebSocket sessions and subscriptions hold, each with a token
/// cancelled when the key is found revoked. A cheap clone.
#[derive(Clone, Debug, Default)]
pub struct Revocations {
    inner: Arc<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    in_use: Mutex<HashMap<Uuid, InUse>>,
    hint: Hint,
}

/// One key's users and the token they watch.
#[derive(Debug)]
struct InUse {
    revoked: CancellationToken,
    users: usize,
    /// Cancelled once the last user has gone (the entry dropped), so that the wait for an
    /// expiry ends with it.
    released: CancellationToken,
}

impl Drop for InUse {
    fn drop(&mut self) {
        self.released.cancel();
    }
}

impl Revocations {
    /// Records that a session or subscription acts under `key_id` until the guard drops.
    /// A key already found revoked hands back its cancelled token, so a late user ends at once.
    /// A key that expires (`expires_at`, by the database's clock: a portal link's) is found
    /// revoked when it does, to the millisecond, not at the watcher's next check.
    pub fn register(&self, key_id: Uuid, expires_at: Option<DateTime<Utc>>) -> KeyInUse {
        let mut in_use = self.lock();
        let entry = in_use.entry(key_id).or_insert_with(|| {
            let (revoked, released) = (CancellationToken::new(), CancellationToken::new());
            if let Some(expires_at) = expires_at {
                revoke_at(revoked.clone(), released.clone(), expires_at);
            }
            InUse {
                revoked,
                users: 0,
                released,
            }
        });
        entry.users += 1;
        KeyInUse {
            key_id,
            revoked: entry.revoked.clone(),
            revocations: self.clone(),
        }
    }

    /// Asks the watcher to check now instead of at its next poll (e.g. a `NOTIFY` arrived).
    pub fn hint(&self) {
        self.inner.hint.give();
    }

    /// The hint [`Revocations::hint`] gives, for the listener to give when a `NOTIFY` arrives.
    pub fn hints(&self) -> Hint {
        self.inner.hint.clone()
    }

    /// Keys in use and not yet found revoked.
    fn live_keys(&self) -> Vec<Uuid> {
        self.lock()
            .iter()
            .filter(|(_, entry)| !entry.revoked.is_cancelled())
            .map(|(id, _)| *id)
            .collect()
    }

    /// Makes this process refuse key `id`, just revoked by one of its own requests, at
    /// once: out of `keys`, its sessions ended. (The other processes learn of it from the
    /// database, within a second.)
    pub fn revoked_here(&self, keys: &KeyCache, id: Uuid) {
        keys.evict(&[id]);
        self.revoke(&[id]);
    }

    /// Ends every session and subscription acting under one of `revoked`.
    fn revoke(&self, revoked: &[Uuid]) {
        let in_use = self.lock();
        for id in revoked {
            if let Some(entry) = in_use.get(id) {
                entry.revoked.cancel();
            }
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<Uuid, InUse>> {
        // The map stays consistent even if a holder panicked: every update is one statement.
        self.inner
            .in_use
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Cancels `revoked` at `expires_at` by the database's clock (as this process measured it,
/// within its measurement's error; the watcher's check asks the database itself), unless
/// `released` is cancelled first.
fn revoke_at(revoked: CancellationToken, released: CancellationToken, expires_at: DateTime<Utc>) {
    let left = (expires_at - crate::db::now()).to_std().unwrap_or_default();
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        // No runtime to wait on: the watcher finds the expiry on its next check.
        return;
    };
    runtime.spawn(async move {
        tokio::select! {
            () = tokio::time::sleep(left) => revoked.cancel(),
            () = revoked.cancelled() => {}
            () = released.cancelled() => {}
        }
    });
}

/// A session's or subscription's hold on its key: [`KeyInUse::revoked`] resolves once the
/// key is found revoked. Dropping it releases the key.
#[derive(Debug)]
pub struct KeyInUse {
    key_id: Uuid,
    revoked: CancellationToken,
    revocations: Revocations,
}

impl KeyInUse {
    /// Resolves when the key is found revoked.
    pub fn revoked(&self) -> WaitForCancellationFuture<'_> {
        self.revoked.cancelled()
    }

    /// Whether the key has been found revoked.
    pub fn is_revoked(&self) -> bool {
        self.revoked.is_cancelled()
    }
}

impl Drop for KeyInUse {
    fn drop(&mut self) {
        let mut in_use = self.revocations.lock();
        if let Some(entry) = in_use.get_mut(&self.key_id) {
            entry.users = entry.users.saturating_sub(1);
            if entry.users == 0 {
                in_use.remove(&self.key_id);
            }
        }
    }
}

/// Checks the keys in use (cached and held by sessions) every [`POLL_INTERVAL`] and on
/// every hint, until `shutdown`. A revoked key leaves the cache and its sessions end.
pub async fn watch(
    db: Db,
    keys: Arc<KeyCache>,
    revocations: Revocations,
    shutdown: CancellationToken,
) {
    let mut poll = tokio::time::interval(POLL_INTERVAL);
    poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            _ = poll.tick() => {}
            () = revocations.inner.hint.taken() => {}
        }
        let held = revocations.live_keys();
        keys.note_in_use(&db, &held);
        let mut in_use = keys.key_ids();
        in_use.extend(held);
        in_use.sort_unstable();
        in_use.dedup();
        if in_use.is_empty() {
            continue;
        }
        // Within the work deadline, so a silent database neither stalls the checks for
        // long nor holds up a shutdown.
        match db.within_deadline(auth::revoked_among(&db, &in_use)).await {
            Ok(revoked) if revoked.is_empty() => {}
            Ok(revoked) => {
                // Evict first: a session opened from a stale cache entry after this point
                // is still caught, by the next poll.
                keys.evict(&revoked);
                revocations.revoke(&revoked);
                for key_id in &revoked {
                    tracing::info!(%key_id, "API key revoked or expired: its sessions end");
                }
            }
            Err(err) => {
                tracing::warn!(error = %error_chain(&err), "checking for revoked API keys failed")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_revoked_key_ends_every_holder_and_is_released_by_the_last() {
        let revocations = Revocations::default();
        let key = Uuid::now_v7();
        let other = Uuid::now_v7();
        let first = revocations.register(key, None);
        let second = revocations.register(key, None);
        let bystander = revocations.register(other, None);
        let mut live = revocations.live_keys();
        live.sort_unstable();
        let mut expected = vec![key, other];
        expected.sort_unstable();
        assert_eq!(live, expected);

        revocations.revoke(&[key]);
        assert!(first.is_revoked() && second.is_revoked());
        assert!(!bystander.is_revoked());
        assert_eq!(revocations.live_keys(), vec![other], "no need to ask again");

        let late = revocations.register(key, None);
        assert!(
            late.is_revoked(),
            "a late holder of a revoked key ends at once"
        );
        drop((first, second, late));
        let fresh = revocations.register(key, None);
        assert!(
            !fresh.is_revoked(),
            "once released, the key is looked at afresh"
        );
    }

    #[tokio::test]
    async fn an_expiring_key_is_found_revoked_when_it_expires() {
        let revocations = Revocations::default();
        let expires_at = crate::db::now() + chrono::Duration::milliseconds(50);
        let held = revocations.register(Uuid::now_v7(), Some(expires_at));
        assert!(!held.is_revoked());
        tokio::time::timeout(Duration::from_secs(5), held.revoked())
            .await
            .expect("revoked at its expiry, without the watcher");
        let past = revocations.register(Uuid::now_v7(), Some(crate::db::now()));
        tokio::time::timeout(Duration::from_secs(5), past.revoked())
            .await
            .expect("an expired key at once");
    }

    #[tokio::test]
    async fn the_wait_for_an_expiry_ends_with_the_last_user() {
        let revocations = Revocations::default();
        let key = Uuid::now_v7();
        let far = crate::db::now() + chrono::Duration::hours(24);
        let tasks = || {
            tokio::runtime::Handle::current()
                .metrics()
                .num_alive_tasks()
        };
        for _ in 0..100 {
            drop(revocations.register(key, Some(far)));
        }
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while tasks() > 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(tasks(), 0, "no wait outlives the key's last user");
    }
}
