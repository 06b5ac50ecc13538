//! Ordered delivery: deliveries to one endpoint whose submissions share an ordering key are
//! attempted one at a time, in the order the submissions committed, on any number of
//! processes; other keys and unkeyed deliveries flow beside them. The logic on both
//! backends ([`lines`]), where a hand-off starts looking ([`bounds`]), how soon a settled
//! head's successor goes out ([`hand_on`]), a replay while the head is in flight
//! ([`in_flight_head`]), then a silent worker's head and racing
//! submitters on PostgreSQL ([`across_instances`]). Helpers are in `support::ordering`.

mod across_instances;
mod bounds;
mod hand_on;
mod in_flight_head;
mod lines;
mod replays_at_once;
