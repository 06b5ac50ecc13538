//! Parking, one rule tested in one place: a disabled endpoint's deliveries have no due
//! time, whether they were waiting, claimed, released, expired or submitted while the
//! disable was being written; and resuming once it is re-enabled.

mod claims;
mod races;
mod resume;
