//! Fair share and flow control per endpoint, one set of rules in one place: how many
//! requests a claim may start for each endpoint (its in-flight cap, its rate limit, a
//! `Retry-After` pause, and an even share of the claim), and when the endpoint's turn comes
//! round again. Every statement that can make an endpoint's work due wakes its turn here.
//!
//! Each endpoint has an `endpoint_flow` row. Claims lock the rows of ready endpoints
//! (`turn_at` passed) `FOR UPDATE SKIP LOCKED`, longest waiting first, so claims for one
//! endpoint take turns across every process, and an endpoint served goes to the back of the
//! line: round robin across endpoints, due order within one. What is in flight is counted
//! from the endpoint's `processing` rows whose lease still runs, read by a statement that
//! starts after the lock is held (so it sees every claim committed before), never by a
//! counter in one process. The rate limit is a GCRA: the row's theoretical arrival time
//! advances by one interval per request started, on the database's clock.
//!
//! An endpoint whose turn is set in the future (nothing due, or full) is woken by whatever
//! makes its work due or frees a slot, in that statement's transaction ([`wake`]); a claim
//! that put an endpoint to sleep looks again once it has committed ([`sweep`] of those
//! endpoints), which closes the window where a submission commits between the claim's
//! snapshot and its commit; and every worker sweeps all endpoints now and then as a backstop.

mod statements;

use chrono::{DateTime, Duration, Utc};
use uuid::Uuid;

pub use self::statements::{
    sweep, wake, wake_endpoints, CAP_CHANGED, FLOW_RESTARTED, HOLD_TURN, INSERT_FLOW,
    PAUSE_ENDPOINT, PAUSE_TURN, RATE_CHANGED,
};

/// Fewest requests in flight an endpoint may be given.
pub const MIN_MAX_IN_FLIGHT: i32 = 1;
/// Most requests in flight an endpoint may be given.
pub const MAX_MAX_IN_FLIGHT: i32 = 1000;
/// Lowest rate limit, in requests per second.
pub const MIN_RATE_LIMIT: i32 = 1;
/// Highest rate limit, in requests per second.
pub const MAX_RATE_LIMIT: i32 = 100_000;
/// The longest pause a `Retry-After` can impose.
pub const MAX_PAUSE: std::time::Duration = std::time::Duration::from_secs(3600);

/// Starts are spaced this much wider than `1 / rate`, so that a receiver, which sees them
/// with a few milliseconds of network and scheduling jitter, never counts `rate + 1` in a
/// one-second window.
const RATE_SPACING: f64 = 1.05;
/// How far ahead of its schedule the limiter lets starts go, so that high rates are served
/// in batches (a claim may start several at once) without ever exceeding the rate by more
/// than this much of a second's worth.
const RATE_BURST: Duration = Duration::milliseconds(50);

/// A per-endpoint rate limit (requests started per second), as a GCRA.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rate(u32);

impl Rate {
    /// The limit of `per_second` starts (at least one).
    pub fn new(per_second: u32) -> Self {
        Rate(per_second.max(1))
    }

    /// The time between two starts.
    pub fn interval(self) -> Duration {
        let micros = (RATE_SPACING * 1_000_000.0 / f64::from(self.0)).ceil() as i64;
        Duration::microseconds(micros.max(1))
    }

    /// How far ahead of the schedule a start may go.
    pub fn tolerance(self) -> Duration {
        (RATE_BURST - self.interval()).max(Duration::zero())
    }

    /// Starts allowed at `now`, given the theoretical arrival time `tat`.
    pub fn allowance(self, tat: Option<DateTime<Utc>>, now: DateTime<Utc>) -> u32 {
        let base = tat.map_or(now, |tat| tat.max(now));
        let slack = now + self.tolerance() - base;
        if slack < Duration::zero() {
            return 0;
        }
        let interval = self.interval().num_microseconds().unwrap_or(1).max(1);
        let slack = slack.num_microseconds().unwrap_or(i64::MAX);
        u32::try_from(slack / interval + 1).unwrap_or(u32::MAX)
    }

    /// The theoretical arrival time after `starts` more starts at `now`.
    pub fn advance(
        self,
        tat: Option<DateTime<Utc>>,
        now: DateTime<Utc>,
        starts: u32,
    ) -> DateTime<Utc> {
        let base = tat.map_or(now, |tat| tat.max(now));
        base + self.interval() * i32::try_from(starts).unwrap_or(i32::MAX)
    }

    /// When the next start is allowed, given the theoretical arrival time `tat`.
    pub fn next_start(self, tat: DateTime<Utc>) -> DateTime<Utc> {
        tat - self.tolerance()
    }
}

/// Where one endpoint stands when a claim has locked its turn.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Standing {
    /// The endpoint.
    pub endpoint_id: Uuid,
    /// Disabled endpoints get nothing (their deliveries are parked).
    pub disabled: bool,
    /// Its cap on requests in flight (its own, or the default).
    pub max_in_flight: u32,
    /// Its rate limit, if any.
    pub rate: Option<Rate>,
    /// Its limiter's theoretical arrival time.
    pub rate_tat: Option<DateTime<Utc>>,
    /// Until when a `Retry-After` pauses it.
    pub paused_until: Option<DateTime<Utc>>,
    /// When a claim last started something for it.
    pub served_at: Option<DateTime<Utc>>,
}

impl Standing {
    /// The most this endpoint could start now, before the claim's share: nothing while
    /// disabled or paused, what its rate limit allows, and never more than its cap.
    fn potential(&self, now: DateTime<Utc>, limit: u32) -> u32 {
        if self.disabled || self.paused_until.is_some_and(|until| until > now) {
            return 0;
        }
        let allowed = self
            .rate
            .map_or(limit, |rate| rate.allowance(self.rate_tat, now));
        allowed.min(limit).min(self.max_in_flight)
    }
}

/// How many deliveries a claim of `limit` asks of each endpoint in `standings` (in turn
/// order): what each could start now, but no more than an even share of the claim among
/// the endpoints that could start anything, so one endpoint's backlog never fills a claim
/// while another waits, and no more than the `room` it has left of the process's slots
/// (see [`crate::worker::share`]). The endpoint's free slots are counted by the claim
/// itself. A claim locks at most `limit` endpoints, so the wants add up to at most `limit`.
pub fn wants(
    standings: &[Standing],
    now: DateTime<Utc>,
    limit: u32,
    room: impl Fn(Uuid) -> u32,
) -> Vec<u32> {
    let potential: Vec<u32> = standings
        .iter()
        .map(|s| s.potential(now, limit).min(room(s.endpoint_id)))
        .collect();
    let active = potential.iter().filter(|&&p| p > 0).count().max(1);
    let share = (limit / u32::try_from(active).unwrap_or(u32::MAX)).max(1);
    potential.into_iter().map(|p| p.min(share)).collect()
}

/// What the claim left behind for one endpoint, read after it in the same transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Facts {
    /// Deliveries this claim started.
    pub taken: u32,
    /// The earliest due time among its waiting and in-flight deliveries (an in-flight
    /// one's lease expiry), if it has any.
    pub due_at: Option<DateTime<Utc>>,
    /// Requests in flight to it now, this claim's included.
    pub in_flight: i64,
    /// The earliest lease expiry among them: it has a free slot by then at the latest.
    pub lease_min: Option<DateTime<Utc>>,
}

/// An endpoint's flow row after a claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Turn {
    /// When it is next worth a look; `None`: nothing is due until something wakes it.
    pub turn_at: Option<DateTime<Utc>>,
    /// The limiter's new theoretical arrival time.
    pub rate_tat: Option<DateTime<Utc>>,
    /// Until when a pause or the rate limit holds it back, whatever is due.
    pub blocked_until: Option<DateTime<Utc>>,
    /// When a claim last started something for it.
    pub served_at: Option<DateTime<Utc>>,
}

impl Turn {
    /// Whether the endpoint is ready for another claim at once.
    pub fn ready(&self, now: DateTime<Utc>) -> bool {
        self.turn_at.is_some_and(|at| at <= now)
    }

    /// Whether it sleeps until something wakes it or its earliest lease runs out (nothing
    /// due, or full), rather than until a pause or the rate limit lets it go.
    pub fn asleep(&self, now: DateTime<Utc>) -> bool {
        let floor = self.blocked_until.map_or(now, |until| until.max(now));
        self.turn_at.is_none_or(|at| at > floor)
    }
}

/// The turn rule: an endpoint is next ready at the latest of when its work is next due,
/// when it was last served (now, if this claim served it: it goes behind every endpoint
/// already waiting; if not, it keeps its place), the end of a pause or of its rate limit's
/// wait, and, while it is full, its earliest lease expiry (recording an outcome wakes it
/// sooner). Disabled, or with nothing due: not until woken.
pub fn next_turn(standing: &Standing, facts: &Facts, now: DateTime<Utc>) -> Turn {
    let rate_tat = match standing.rate {
        Some(rate) if facts.taken > 0 => Some(rate.advance(standing.rate_tat, now, facts.taken)),
        Some(_) => standing.rate_tat,
        None => None,
    };
    let rate_wait = standing
        .rate
        .zip(rate_tat)
        .map(|(rate, tat)| rate.next_start(tat))
        .filter(|at| *at > now);
    let pause = standing.paused_until.filter(|until| *until > now);
    let blocked_until = pause.max(rate_wait);
    let full = facts.in_flight >= i64::from(standing.max_in_flight);
    let served_at = if facts.taken > 0 {
        Some(now)
    } else {
        standing.served_at
    };
    let turn_at = match facts.due_at {
        Some(due_at) if !standing.disabled => {
            let mut at = due_at.max(served_at.unwrap_or(now));
            if let Some(blocked) = blocked_until {
                at = at.max(blocked);
            }
            if let (true, Some(lease)) = (full, facts.lease_min) {
                at = at.max(lease);
            }
            Some(at)
        }
        _ => None,
    };
    Turn {
        turn_at,
        rate_tat,
        blocked_until,
        served_at,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn at(ms: i64) -> DateTime<Utc> {
        Utc.timestamp_millis_opt(1_800_000_000_000 + ms).unwrap()
    }

    fn standing(rate: Option<u32>, cap: u32) -> Standing {
        Standing {
            endpoint_id: Uuid::now_v7(),
            disabled: false,
            max_in_flight: cap,
            rate: rate.map(Rate::new),
            rate_tat: None,
            paused_until: None,
            served_at: Some(at(-10_000)),
        }
    }

    #[test]
    fn a_limiter_never_starts_more_than_its_rate_in_any_second() {
        for per_second in [1, 2, 5, 7, 10, 50, 100, 1000, 100_000] {
            let rate = Rate::new(per_second);
            let mut tat = None;
            let mut starts = Vec::new();
            // Ask every millisecond for as many as allowed, for three seconds.
            for ms in 0..3000 {
                let now = at(ms);
                let allowed = rate.allowance(tat, now).min(100_000);
                if allowed > 0 {
                    starts.extend(std::iter::repeat_n(ms, allowed as usize));
                    tat = Some(rate.advance(tat, now, allowed));
                }
            }
            // Starts are in time order: the most in any window [t, t + 1s).
            let mut most = 0;
            let mut first = 0;
            for (last, &ms) in starts.iter().enumerate() {
                while starts[first] + 1000 <= ms {
                    first += 1;
                }
                most = most.max(last - first + 1);
            }
            assert!(
                most as u64 <= u64::from(per_second),
                "{per_second}/s: {most} starts in one second"
            );
            // And it is not far below the rate either.
            let total = starts.len() as f64 / 3.0;
            assert!(
                total >= f64::from(per_second) * 0.9 - 1.0,
                "{per_second}/s: {total}/s"
            );
        }
    }

    #[test]
    fn a_burst_is_bounded_by_the_tolerance() {
        let rate = Rate::new(1000);
        assert_eq!(rate.allowance(None, at(0)), 47);
        assert_eq!(Rate::new(5).allowance(None, at(0)), 1);
        assert_eq!(Rate::new(5).tolerance(), Duration::zero());
        let tat = Rate::new(5).advance(None, at(0), 1);
        assert_eq!(Rate::new(5).allowance(Some(tat), at(100)), 0);
        assert_eq!(Rate::new(5).allowance(Some(tat), at(210)), 1);
    }

    #[test]
    fn a_claim_shares_its_slots_evenly_among_endpoints_that_can_take_them() {
        let now = at(0);
        let mut paused = standing(None, 32);
        paused.paused_until = Some(at(5000));
        let mut disabled = standing(None, 32);
        disabled.disabled = true;
        let busy = standing(None, 32);
        let small_cap = standing(None, 2);
        let limited = standing(Some(5), 32);
        let standings = [paused, disabled, busy, small_cap, limited];
        assert_eq!(
            wants(&standings, now, 64, |_| u32::MAX),
            vec![0, 0, 21, 2, 1]
        );
        assert_eq!(
            wants(&standings[2..3], now, 64, |_| u32::MAX),
            vec![32],
            "one endpoint: its cap"
        );
        assert_eq!(
            wants(&standings[2..3], now, 10, |_| u32::MAX),
            vec![10],
            "one endpoint: the claim"
        );
        // As many endpoints as slots (a claim never locks more): one each.
        let many: Vec<Standing> = (0..4).map(|_| standing(None, 32)).collect();
        assert_eq!(wants(&many, now, 4, |_| u32::MAX), vec![1; 4]);
        // An endpoint holding most of this process's slots asks only for the room it has
        // left, and counts for nothing in the share once it has none.
        let (hog, other) = (standing(None, 1000), standing(None, 32));
        let hog_id = hog.endpoint_id;
        let both = [hog, other];
        let room = |left: u32| move |id: Uuid| if id == hog_id { left } else { u32::MAX };
        assert_eq!(wants(&both, now, 16, room(3)), vec![3, 8]);
        assert_eq!(wants(&both, now, 16, room(0)), vec![0, 16]);
    }

    #[test]
    fn an_endpoint_served_goes_behind_those_waiting_and_a_full_one_waits_for_a_slot() {
        let now = at(0);
        let open = standing(None, 4);
        let more_due = Facts {
            taken: 2,
            due_at: Some(at(-500)),
            in_flight: 2,
            lease_min: Some(at(60_000)),
        };
        let turn = next_turn(&open, &more_due, now);
        assert_eq!(turn.turn_at, Some(now));
        assert_eq!(turn.served_at, Some(now));
        assert!(turn.ready(now) && !turn.asleep(now));
        // Not served by this claim (its rows were held elsewhere): it keeps its place.
        let kept = next_turn(
            &open,
            &Facts {
                taken: 0,
                ..more_due
            },
            now,
        );
        assert_eq!(kept.turn_at, Some(at(-500)));
        assert_eq!(kept.served_at, Some(at(-10_000)));

        let full = Facts {
            in_flight: 4,
            ..more_due
        };
        let turn = next_turn(&open, &full, now);
        assert_eq!(turn.turn_at, Some(at(60_000)));
        assert!(turn.asleep(now));

        let idle = Facts {
            taken: 1,
            due_at: None,
            in_flight: 0,
            lease_min: None,
        };
        assert_eq!(next_turn(&open, &idle, now).turn_at, None);
        let later = Facts {
            due_at: Some(at(3_000)),
            ..idle
        };
        assert_eq!(next_turn(&open, &later, now).turn_at, Some(at(3_000)));

        let mut disabled = open.clone();
        disabled.disabled = true;
        assert_eq!(next_turn(&disabled, &more_due, now).turn_at, None);
    }

    #[test]
    fn pauses_and_rate_limits_hold_the_turn_back() {
        let now = at(0);
        let mut paused = standing(None, 4);
        paused.paused_until = Some(at(30_000));
        let due = Facts {
            taken: 0,
            due_at: Some(at(-1)),
            in_flight: 0,
            lease_min: None,
        };
        let turn = next_turn(&paused, &due, now);
        assert_eq!(turn.turn_at, Some(at(30_000)));
        assert_eq!(turn.blocked_until, Some(at(30_000)));
        assert!(!turn.asleep(now), "a pause is a wait, not a sleep");

        let limited = standing(Some(5), 4);
        let turn = next_turn(&limited, &Facts { taken: 1, ..due }, now);
        assert_eq!(turn.rate_tat, Some(at(210)));
        assert_eq!(turn.turn_at, Some(at(210)));
        assert!(!turn.asleep(now));
    }
}
