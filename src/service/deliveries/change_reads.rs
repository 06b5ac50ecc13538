//! One read of a delivery per state change, however many subscribers select it: every
//! subscriber of a change that asks for `delivery` waits on the same read, so a thousand
//! dashboards (or one client with many subscriptions) cost the database one query per
//! change, not one each.

use std::collections::HashMap;
use std::mem;
use std::sync::{Arc, Mutex, PoisonError};

use chrono::{DateTime, Utc};
use entity::webhook_delivery::{self, DeliveryState};
use tokio::sync::OnceCell;
use uuid::Uuid;

use crate::bus::StateChange;

/// Changes remembered per generation; a change is forgotten after two generations without
/// a subscriber asking for it (subscribers read a change within moments of each other).
const GENERATION: usize = 4096;

/// A change, as far as telling it from others goes.
type ChangeKey = (Uuid, DeliveryState, DateTime<Utc>);

/// What a read of a delivery found (shared by the subscribers of one change).
type SharedRead = Arc<OnceCell<Option<webhook_delivery::Model>>>;

/// The reads of recent changes, in two generations: the current one, and the one before,
/// from which a change asked for again moves back to the current.
#[derive(Debug, Default)]
struct Generations {
    current: HashMap<ChangeKey, SharedRead>,
    previous: HashMap<ChangeKey, SharedRead>,
}

/// The shared reads of deliveries by the change subscribers were told of.
#[derive(Debug, Clone, Default)]
pub struct ChangeReads(Arc<Mutex<Generations>>);

impl ChangeReads {
    /// The read of `change`'s delivery that every subscriber of it shares.
    pub fn read_of(&self, change: &StateChange) -> SharedRead {
        let key = (change.delivery_id, change.state, change.at);
        let mut generations = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(read) = generations.current.get(&key) {
            return read.clone();
        }
        let read = generations.previous.remove(&key).unwrap_or_default();
        if generations.current.len() >= GENERATION {
            generations.previous = mem::take(&mut generations.current);
        }
        generations.current.insert(key, read.clone());
        read
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn change(n: u128) -> StateChange {
        StateChange {
            delivery_id: Uuid::from_u128(n),
            endpoint_id: Uuid::nil(),
            previous_state: None,
            state: DeliveryState::Pending,
            at: DateTime::<Utc>::UNIX_EPOCH,
        }
    }

    #[test]
    fn subscribers_of_one_change_share_its_read_and_other_changes_do_not() {
        let reads = ChangeReads::default();
        let first = reads.read_of(&change(1));
        assert!(Arc::ptr_eq(&first, &reads.read_of(&change(1))));
        assert!(!Arc::ptr_eq(&first, &reads.read_of(&change(2))));
        let later = StateChange {
            state: DeliveryState::Processing,
            ..change(1)
        };
        assert!(!Arc::ptr_eq(&first, &reads.read_of(&later)));
    }

    #[test]
    fn memory_is_bounded_to_two_generations() {
        let reads = ChangeReads::default();
        let kept = reads.read_of(&change(0));
        for n in 1..=(3 * GENERATION as u128) {
            reads.read_of(&change(n));
        }
        let generations = reads.0.lock().unwrap_or_else(PoisonError::into_inner);
        assert!(generations.current.len() <= GENERATION);
        assert!(generations.previous.len() <= GENERATION);
        drop(generations);
        assert!(
            !Arc::ptr_eq(&kept, &reads.read_of(&change(0))),
            "a change long past is read afresh"
        );
    }
}
