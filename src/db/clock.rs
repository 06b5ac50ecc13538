//! Whose clock decides: on PostgreSQL every moment a statement compares or stores is taken
//! from the database's clock, so hosts whose clocks disagree can share one database; on
//! SQLite (one host by construction) it is this process's clock. This is the only place
//! that difference lives.
//!
//! Statements name moments with tokens, rendered per backend by [`Clock::statement`]:
//! - `{now}`: the statement's time (`statement_timestamp()` on PostgreSQL).
//! - `{after(X)}`: `X` after `{now}`, where `X` is a parameter or column bound with
//!   [`Clock::after`] (seconds on PostgreSQL, the moment itself on SQLite).
//! - `{window_start(X)}`: the start of the fixed window containing `{now}`, aligned to the
//!   Unix epoch, where `X` is bound with [`Clock::window`].
//! - `{due(X)}` and `{in_flight(X)}`: whether the delivery row `X` is due, or a request in
//!   flight, at `{now}` (the rule is [`super::due`]'s).

use std::time::Duration;

use chrono::{DateTime, SubsecRound, TimeZone, Utc};
use sea_orm::{DbBackend, Statement, Value};

/// The moments of one statement. Take one per statement with [`super::Db::clock`].
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    backend: DbBackend,
    /// This process's time when the clock was taken (used on SQLite only).
    local_now: DateTime<Utc>,
}

impl Clock {
    /// A clock for `backend`, reading this process's time once for SQLite.
    pub fn new(backend: DbBackend) -> Self {
        Clock {
            backend,
            local_now: Utc::now().trunc_subsecs(6),
        }
    }

    fn in_database(&self) -> bool {
        self.backend == DbBackend::Postgres
    }

    /// The value to bind for an `{after(X)}` that is `delay` after now.
    pub fn after(&self, delay: Duration) -> Value {
        if self.in_database() {
            Value::from(delay.as_secs_f64())
        } else {
            let delay = chrono::Duration::from_std(delay).unwrap_or(chrono::Duration::MAX);
            Value::from(
                self.local_now
                    .checked_add_signed(delay)
                    .unwrap_or(self.local_now),
            )
        }
    }

    /// The value to bind for an `{after(X)}` that is `delay` before now.
    pub fn before(&self, delay: Duration) -> Value {
        if self.in_database() {
            Value::from(-delay.as_secs_f64())
        } else {
            let delay = chrono::Duration::from_std(delay).unwrap_or(chrono::Duration::MAX);
            Value::from(
                self.local_now
                    .checked_sub_signed(delay)
                    .unwrap_or(self.local_now),
            )
        }
    }

    /// [`Clock::after`] for an optional delay: `None` binds NULL, so `{after(X)}` is NULL.
    pub fn after_opt(&self, delay: Option<Duration>) -> Value {
        match delay {
            Some(delay) => self.after(delay),
            None if self.in_database() => Value::Double(None),
            None => Value::ChronoDateTimeUtc(None),
        }
    }

    /// The value to bind for a `{window_start(X)}` of windows `window` long (at least a second).
    pub fn window(&self, window: Duration) -> Value {
        let secs = window.as_secs().max(1);
        if self.in_database() {
            Value::from(secs as f64)
        } else {
            Value::from(fixed_window_start(self.local_now, secs))
        }
    }

    /// `template` with its time tokens rendered for this backend, and `values` bound (plus,
    /// on SQLite, the process's time as one more parameter when `{now}` is used).
    pub fn statement(&self, template: &str, values: impl IntoIterator<Item = Value>) -> Statement {
        let mut values: Vec<Value> = values.into_iter().collect();
        let (sql, reads_now) = self.render_reading_now(template, values.len() + 1);
        if !self.in_database() && reads_now {
            values.push(Value::from(self.local_now));
        }
        Statement::from_sql_and_values(self.backend, sql, values)
    }

    /// Renders the tokens; on SQLite `{now}` becomes parameter `$now_index`.
    #[cfg(test)]
    fn render(&self, template: &str, now_index: usize) -> String {
        self.render_reading_now(template, now_index).0
    }

    /// `template` rendered for PostgreSQL, where every moment is the database's: the text
    /// is the same for every statement made from it, so a statement run often can have its
    /// text rendered once and kept (and bound with `Statement::from_sql_and_values` on
    /// [`DbBackend::Postgres`]).
    pub fn rendered_in_database(template: &str) -> String {
        Clock::new(DbBackend::Postgres)
            .render_reading_now(template, 0)
            .0
    }

    /// Renders the tokens, and says whether any of them reads the statement's time (on
    /// SQLite `{now}` becomes parameter `$now_index`, to be bound).
    fn render_reading_now(&self, template: &str, now_index: usize) -> (String, bool) {
        let now = if self.in_database() {
            "statement_timestamp()".to_owned()
        } else {
            format!("${now_index}")
        };
        let mut reads_now = false;
        let sql = super::sql::render(template, |name, arg| match (name, arg) {
            ("now", None) => {
                reads_now = true;
                Some(now.clone())
            }
            ("due" | "in_flight", Some(row)) => {
                reads_now = true;
                super::due::expand(name, row, &now)
            }
            ("after", Some(arg)) if self.in_database() => {
                Some(format!("({now} + make_interval(secs => {arg}))"))
            }
            ("window_start", Some(arg)) if self.in_database() => Some(format!(
                "date_bin(make_interval(secs => {arg}), {now}, TIMESTAMPTZ 'epoch')"
            )),
            ("after" | "window_start", Some(arg)) => Some(arg.to_owned()),
            _ => None,
        });
        (sql, reads_now)
    }
}

/// The start of the `secs`-long window containing `now`, aligned to the Unix epoch.
pub fn fixed_window_start(now: DateTime<Utc>, secs: u64) -> DateTime<Utc> {
    let secs = i64::try_from(secs.max(1)).unwrap_or(i64::MAX);
    let start = now.timestamp().div_euclid(secs) * secs;
    Utc.timestamp_opt(start, 0).single().unwrap_or(now)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEMPLATE: &str = "UPDATE t SET a = {now}, b = {after($2)}, c = {after(v.x)} \
         WHERE id IN ({ids}) AND w = {window_start($3)} AND d <= {now}";

    #[test]
    fn postgres_reads_the_database_clock() {
        let clock = Clock::new(DbBackend::Postgres);
        assert_eq!(
            clock.render(TEMPLATE, 4),
            "UPDATE t SET a = statement_timestamp(), \
             b = (statement_timestamp() + make_interval(secs => $2)), \
             c = (statement_timestamp() + make_interval(secs => v.x)) \
             WHERE id IN ({ids}) AND w = date_bin(make_interval(secs => $3), \
             statement_timestamp(), TIMESTAMPTZ 'epoch') AND d <= statement_timestamp()"
        );
        assert_eq!(clock.after(Duration::from_millis(1500)), Value::from(1.5));
        assert_eq!(clock.window(Duration::from_secs(60)), Value::from(60.0));
    }

    #[test]
    fn sqlite_binds_this_process_clock() {
        let clock = Clock::new(DbBackend::Sqlite);
        assert_eq!(
            clock.render(TEMPLATE, 4),
            "UPDATE t SET a = $4, b = $2, c = v.x WHERE id IN ({ids}) AND w = $3 AND d <= $4"
        );
        let statement = clock.statement("SELECT {now}, $1", [Value::from(7)]);
        assert_eq!(statement.sql, "SELECT $2, $1");
        assert_eq!(statement.values.map(|v| v.0.len()), Some(2));
        // The due rule reads the time too, and binds it.
        let statement = clock.statement("SELECT 1 FROM d WHERE {due(d)}", []);
        assert_eq!(
            statement.sql,
            "SELECT 1 FROM d WHERE d.state IN ('pending', 'processing') AND d.next_attempt_at <= $1"
        );
        assert_eq!(statement.values.map(|v| v.0.len()), Some(1));
        assert_eq!(
            clock.after(Duration::from_secs(60)),
            Value::from(clock.local_now + chrono::Duration::seconds(60))
        );
    }

    #[test]
    fn windows_are_aligned_and_contain_now() {
        let at = |h, m, s| {
            Utc.with_ymd_and_hms(2026, 11, 30, h, m, s)
                .single()
                .unwrap()
        };
        assert_eq!(fixed_window_start(at(12, 34, 56), 60), at(12, 34, 0));
        assert_eq!(fixed_window_start(at(12, 34, 0), 3600), at(12, 0, 0));
    }
}
