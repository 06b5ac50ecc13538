//! A set of endpoints, each kept until a moment of this process's clock: the endpoints this
//! process leaves alone for a while (a secret it could not open, an answer that asked to
//! wait), forgotten once their time is over.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use uuid::Uuid;

/// Endpoints, each until a moment.
#[derive(Debug, Default)]
pub struct EndpointsUntil(Mutex<HashMap<Uuid, Instant>>);

impl EndpointsUntil {
    /// Keeps `endpoint_id` for `wait` from now; a later moment already kept stands.
    pub fn keep(&self, endpoint_id: Uuid, wait: Duration) {
        let until = Instant::now() + wait;
        let mut kept = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let entry = kept.entry(endpoint_id).or_insert(until);
        *entry = (*entry).max(until);
    }

    /// Whether `endpoint_id` is kept now.
    pub fn contains(&self, endpoint_id: Uuid) -> bool {
        let kept = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        kept.get(&endpoint_id)
            .is_some_and(|until| *until > Instant::now())
    }

    /// The endpoints kept now (forgetting those whose time is over).
    pub fn snapshot(&self) -> Vec<Uuid> {
        let mut kept = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if kept.is_empty() {
            return Vec::new();
        }
        let now = Instant::now();
        kept.retain(|_, until| *until > now);
        kept.keys().copied().collect()
    }

    /// The moment `endpoint_id` is kept until, if it is.
    #[cfg(test)]
    pub fn until(&self, endpoint_id: Uuid) -> Option<Instant> {
        let kept = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        kept.get(&endpoint_id).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_endpoint_is_kept_for_its_time_and_a_later_time_stands() {
        let kept = EndpointsUntil::default();
        let (short, long, never) = (Uuid::now_v7(), Uuid::now_v7(), Uuid::now_v7());
        kept.keep(short, Duration::ZERO);
        kept.keep(long, Duration::from_secs(60));
        kept.keep(long, Duration::ZERO);
        assert!(!kept.contains(short), "a time of nothing is over");
        assert!(
            kept.contains(long),
            "a shorter time does not end a longer one"
        );
        assert!(!kept.contains(never));
        assert_eq!(kept.snapshot(), vec![long]);
        assert_eq!(kept.until(short), None, "forgotten by the snapshot");
    }
}
