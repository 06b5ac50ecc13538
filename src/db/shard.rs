//! Choosing the shard of a sharded counter row for one write: successive writes of a
//! process take successive shards, so two batches it writes at once never wait for each
//! other's row (a random shard each made them collide one time in the number of shards);
//! the sequence starts at random, so processes rarely move in step.

use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::OnceLock;

/// The shard, of `shards` (at least 1), for the next write.
pub fn next(shards: i16) -> i16 {
    static NEXT: OnceLock<AtomicU16> = OnceLock::new();
    let counter = NEXT.get_or_init(|| AtomicU16::new(rand::random::<u16>()));
    shard_of(counter.fetch_add(1, Ordering::Relaxed), shards)
}

/// The shard of the write numbered `turn`, of `shards` (at least 1).
fn shard_of(turn: u16, shards: i16) -> i16 {
    let shards = u16::try_from(shards.max(1)).unwrap_or(1);
    i16::try_from(turn % shards).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::{next, shard_of};

    #[test]
    fn successive_writes_take_successive_shards() {
        let shards: Vec<i16> = (65_530..=65_535u16)
            .chain(0..3)
            .map(|t| shard_of(t, 8))
            .collect();
        // The counter wraps from 65,535 to 0, which 8 divides: the round stays unbroken.
        assert_eq!(shards, [2, 3, 4, 5, 6, 7, 0, 1, 2]);
        assert_eq!(shard_of(7, 1), 0);
        assert_eq!(shard_of(7, 0), 0, "no shards is read as one");
    }

    #[test]
    fn a_shard_is_always_in_range() {
        for _ in 0..100 {
            assert!((0..16).contains(&next(16)));
        }
    }
}
