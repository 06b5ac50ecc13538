//! Reading and replaying deliveries: listings with filters and keyset pages, replay
//! settled by one conditional update, and recovery after an outage (bulk replay, resend,
//! test events).

mod counts;
mod kept_plans;
mod listings;
mod plans;
mod recovery;
mod replay;
mod resend;
mod scoped_replay;
mod set_pages;
mod set_plans;
