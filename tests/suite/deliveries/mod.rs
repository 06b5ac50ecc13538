//! Reading and replaying deliveries: listings with filters and keyset pages, and replay
//! settled by one conditional update.

mod listings;
mod replay;
