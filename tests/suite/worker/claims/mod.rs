//! Races 1 and 2 against the database directly: claims partition the work, skip locked rows,
//! retake expired leases exactly once, and late results never overwrite a newer claim. Each
//! file holds one concern; parking at every edge of a claim is in `crate::parking`.

mod backlog_plan;
mod claiming;
mod recording;
