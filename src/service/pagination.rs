//! Keyset pagination: page sizes bounded, cursors opaque and validated.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use chrono::{DateTime, Datelike as _, SecondsFormat, Utc};
use uuid::Uuid;

use crate::error::{Error, Result};
use crate::service::time_range;

/// Page size when the client gives none.
pub const DEFAULT_PAGE_SIZE: usize = 20;
/// Largest page a client may ask for.
pub const MAX_PAGE_SIZE: usize = 100;

/// Prefix inside every cursor, so cursors can change shape later without ambiguity.
const CURSOR_VERSION: &str = "v1:";

/// Which listing a cursor belongs to: a cursor of one is refused by another, rather than
/// answered with a page that means nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listed {
    /// `endpoints`, and a tenant's.
    Endpoints,
    /// `deliveries`, and an event's.
    Deliveries,
    /// `apiKeys`.
    ApiKeys,
    /// `tenants`.
    Tenants,
}

impl Listed {
    /// The mark a cursor of this listing carries.
    fn mark(self) -> &'static str {
        match self {
            Listed::Endpoints => "e:",
            Listed::Deliveries => "d:",
            Listed::ApiKeys => "k:",
            Listed::Tenants => "t:",
        }
    }
}

/// A validated page request: how many rows, and the id to continue after.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageRequest {
    /// Rows wanted (0..=MAX_PAGE_SIZE).
    pub first: usize,
    /// Continue strictly after this id, in the listing's order.
    pub after: Option<Uuid>,
    /// The creation time of the row `after` names, when its cursor carries it (a delivery's
    /// does): a listing ordered by creation time goes on from there without reading that
    /// row, which may be gone by then (retention).
    pub after_at: Option<DateTime<Utc>>,
}

/// Where a page ends, as its last row's cursor tells it: the row's id, and, for a row that
/// can be listed by creation time, that time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Position {
    /// The row's id.
    pub id: Uuid,
    /// Its creation time, for a listing that can be ordered by it.
    pub at: Option<DateTime<Utc>>,
}

impl From<Uuid> for Position {
    fn from(id: Uuid) -> Self {
        Position { id, at: None }
    }
}

impl PageRequest {
    /// Validates the Relay `first` / `after` arguments of a page of `listed`.
    pub fn new(listed: Listed, first: Option<i32>, after: Option<&str>) -> Result<Self> {
        let first = match first {
            None => DEFAULT_PAGE_SIZE,
            Some(n) if n < 0 => return Err(Error::bad_input("first must not be negative")),
            Some(n) if n as usize > MAX_PAGE_SIZE => {
                return Err(Error::bad_input(format!(
                    "first must be at most {MAX_PAGE_SIZE}"
                )));
            }
            Some(n) => n as usize,
        };
        let after = after
            .map(|cursor| decode_cursor(listed, cursor))
            .transpose()?;
        Ok(PageRequest {
            first,
            after: after.map(|position| position.id),
            after_at: after.and_then(|position| position.at),
        })
    }

    /// Rows to fetch: one more than wanted, to learn whether a next page exists.
    pub fn fetch_limit(&self) -> u64 {
        self.first as u64 + 1
    }
}

/// What a connection field with this `first` costs per unit of its selection, for the
/// query budget: the rows it may return (an out-of-range value is refused at execution,
/// so it is costed as the largest page it could have been).
pub fn page_cost(first: Option<i32>) -> usize {
    match first {
        None => DEFAULT_PAGE_SIZE,
        Some(n) => usize::try_from(n).map_or(1, |n| n.clamp(1, MAX_PAGE_SIZE)),
    }
}

/// One page of rows in listing order.
#[derive(Debug, Clone)]
pub struct Page<T> {
    /// The rows.
    pub items: Vec<T>,
    /// Whether rows follow the last one.
    pub has_next_page: bool,
}

impl<T> Page<T> {
    /// Trims a result fetched with [`PageRequest::fetch_limit`] to the page.
    pub fn from_overfetch(mut items: Vec<T>, request: &PageRequest) -> Self {
        let has_next_page = items.len() > request.first;
        items.truncate(request.first);
        Page {
            items,
            has_next_page,
        }
    }
}

/// Separates a cursor's id from the creation time it carries.
const AT: char = '@';

/// The opaque cursor for a row of `listed` at `position`.
pub fn encode_cursor(listed: Listed, position: Position) -> String {
    let mut text = format!("{CURSOR_VERSION}{}{}", listed.mark(), position.id);
    if let Some(at) = position.at {
        // Every digit of the time, as stored: a rounded one would pass over rows.
        text.push(AT);
        text.push_str(&at.to_rfc3339_opts(SecondsFormat::AutoSi, true));
    }
    URL_SAFE_NO_PAD.encode(text)
}

/// Reads a cursor made by [`encode_cursor`] for `listed` (or, from before cursors were
/// marked, for any listing; or, from before they carried a time, without one); anything
/// else is `BAD_USER_INPUT`.
pub fn decode_cursor(listed: Listed, cursor: &str) -> Result<Position> {
    let invalid = || Error::bad_input("after is not a valid cursor");
    let bytes = URL_SAFE_NO_PAD.decode(cursor).map_err(|_| invalid())?;
    let text = std::str::from_utf8(&bytes).map_err(|_| invalid())?;
    let id = text.strip_prefix(CURSOR_VERSION).ok_or_else(invalid)?;
    let id = match id.split_once(':') {
        Some((mark, id)) if format!("{mark}:") == listed.mark() => id,
        Some(_) => return Err(Error::bad_input("after is a cursor of another listing")),
        None => id,
    };
    let (id, at) = match id.split_once(AT) {
        Some((id, at)) => {
            let at = DateTime::parse_from_rfc3339(at).map_err(|_| invalid())?;
            let at = at.with_timezone(&Utc);
            // A year no filter may name either (see `time_range`): never one of Courier's.
            if !time_range::YEARS.contains(&at.year()) {
                return Err(invalid());
            }
            (id, Some(at))
        }
        None => (id, None),
    };
    let id = Uuid::parse_str(id).map_err(|_| invalid())?;
    Ok(Position { id, at })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_round_trip_and_garbage_is_refused() {
        let id = Uuid::now_v7();
        let cursor = encode_cursor(Listed::Deliveries, id.into());
        assert_eq!(
            decode_cursor(Listed::Deliveries, &cursor).ok(),
            Some(id.into())
        );
        // With a creation time, every digit of it.
        let at = DateTime::parse_from_rfc3339("2026-12-07T08:15:30.123456789Z")
            .expect("a time")
            .with_timezone(&Utc);
        let position = Position { id, at: Some(at) };
        let cursor = encode_cursor(Listed::Deliveries, position);
        assert_eq!(
            decode_cursor(Listed::Deliveries, &cursor).ok(),
            Some(position)
        );
        for bad_time in [
            "yesterday",
            "0000-12-31T23:00:00Z",
            "9999-12-31T23:00:00-02:00",
        ] {
            let cursor = URL_SAFE_NO_PAD.encode(format!("{CURSOR_VERSION}d:{id}@{bad_time}"));
            assert!(
                decode_cursor(Listed::Deliveries, &cursor).is_err(),
                "{bad_time} accepted"
            );
        }
        // Another listing's cursor is refused, saying so.
        let foreign = decode_cursor(Listed::Endpoints, &cursor).map_err(|err| err.to_string());
        assert_eq!(
            foreign,
            Err("after is a cursor of another listing".to_owned())
        );
        // A cursor from before they were marked still reads.
        let unmarked = URL_SAFE_NO_PAD.encode(format!("{CURSOR_VERSION}{id}"));
        assert_eq!(
            decode_cursor(Listed::Tenants, &unmarked).ok(),
            Some(id.into())
        );
        for garbage in [
            "",
            "!!!",
            "djE6bm90LWEtdXVpZA",
            &URL_SAFE_NO_PAD.encode(id.to_string()),
        ] {
            assert!(
                decode_cursor(Listed::Deliveries, garbage).is_err(),
                "{garbage} accepted"
            );
        }
    }

    #[test]
    fn page_sizes_are_bounded() {
        assert_eq!(
            PageRequest::new(Listed::Endpoints, None, None)
                .map(|p| p.first)
                .ok(),
            Some(DEFAULT_PAGE_SIZE)
        );
        assert!(PageRequest::new(Listed::Endpoints, Some(-1), None).is_err());
        assert!(PageRequest::new(Listed::Endpoints, Some(MAX_PAGE_SIZE as i32 + 1), None).is_err());
        assert_eq!(
            PageRequest::new(Listed::Endpoints, Some(0), None)
                .map(|p| p.first)
                .ok(),
            Some(0)
        );
    }

    #[test]
    fn overfetch_reveals_the_next_page() {
        let request = PageRequest {
            first: 2,
            after: None,
            after_at: None,
        };
        let page = Page::from_overfetch(vec![1, 2, 3], &request);
        assert_eq!(page.items, vec![1, 2]);
        assert!(page.has_next_page);
        let page = Page::from_overfetch(vec![1, 2], &request);
        assert!(!page.has_next_page);
    }
}
