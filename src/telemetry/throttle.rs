//! Telling a recurring condition in the log at most once per interval, with how many times
//! it recurred meanwhile, so an outage or a dead collector is noticed without a flood.

use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// Tells at most once per interval, counting what it held back meanwhile.
#[derive(Debug)]
pub struct Throttle {
    every: Duration,
    state: Mutex<(Option<Instant>, u64)>,
}

impl Throttle {
    /// A throttle that lets one through per `every`.
    pub const fn new(every: Duration) -> Self {
        Throttle {
            every,
            state: Mutex::new((None, 0)),
        }
    }

    /// `Some(held back since the last one)` when this one is to be told, else `None`.
    pub fn tell(&self) -> Option<u64> {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let now = Instant::now();
        if state
            .0
            .is_some_and(|at| now.duration_since(at) < self.every)
        {
            state.1 += 1;
            return None;
        }
        let held_back = std::mem::take(&mut state.1);
        state.0 = Some(now);
        Some(held_back)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_throttle_tells_once_per_interval_with_what_it_held_back() {
        let throttle = Throttle::new(Duration::from_millis(200));
        assert_eq!(throttle.tell(), Some(0));
        assert_eq!(throttle.tell(), None);
        assert_eq!(throttle.tell(), None);
        std::thread::sleep(Duration::from_millis(250));
        assert_eq!(throttle.tell(), Some(2));
        assert_eq!(throttle.tell(), None);
    }
}
