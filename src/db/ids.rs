//! New ids: UUIDv7, ordered by when they were made, which is the order of every newest-first
//! listing and its cursors. On PostgreSQL their time is the database's clock as this process
//! last measured it against its own (see [`super::measured`]), so that rows made by hosts
//! whose clocks disagree list in the order the database saw them; on SQLite (one host) it is
//! this host's clock.

use std::sync::Mutex;
use std::time::UNIX_EPOCH;

use uuid::timestamp::context::ContextV7;
use uuid::{Timestamp, Uuid};

/// Keeps the ids this process makes in order, within a millisecond too.
static CONTEXT: Mutex<ContextV7> = Mutex::new(ContextV7::new());

/// A new id, stamped now on the database's clock (see the module docs).
pub fn new_id() -> Uuid {
    let now = super::measured::database_now();
    let since_epoch = now.duration_since(UNIX_EPOCH).unwrap_or_default();
    Uuid::new_v7(Timestamp::from_unix(
        &CONTEXT,
        since_epoch.as_secs(),
        since_epoch.subsec_nanos(),
    ))
}

#[cfg(test)]
mod tests {
    use std::time::SystemTime;

    use super::*;

    #[test]
    fn ids_follow_the_measured_clock_and_stay_in_order() {
        let before = new_id();
        // The database ten minutes behind this host: ids made now still sort after those
        // made before (the order within the process holds), and carry the database's time.
        super::super::measured::set_offset_micros(-600_000_000);
        let after = new_id();
        super::super::measured::set_offset_micros(0);
        assert!(after > before);
        let stamped = |id: Uuid| {
            let (secs, _) = id.get_timestamp().expect("a v7 id").to_unix();
            secs
        };
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs();
        assert!(stamped(before).abs_diff(now) <= 1);
    }
}
