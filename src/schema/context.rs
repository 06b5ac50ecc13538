//! Helpers shared by resolvers: the caller's identity, the app state, and ID parsing.

use async_graphql::connection::{Connection, Edge};
use async_graphql::{Context, ID};
use uuid::Uuid;

use crate::auth::Identity;
use crate::error::Error;
use crate::service::pagination::{encode_cursor, Listed, Page, PageRequest, Position};
use crate::state::AppState;

/// The caller of this request; every operation needs one.
pub fn caller<'a>(ctx: &Context<'a>) -> Result<&'a Identity, Error> {
    ctx.data_opt::<Identity>().ok_or(Error::Unauthenticated)
}

/// The application state given to the schema.
pub fn state<'a>(ctx: &Context<'a>) -> Result<&'a AppState, Error> {
    ctx.data_opt::<AppState>()
        .ok_or(Error::Database(sea_orm::DbErr::Custom(
            "schema built without state".into(),
        )))
}

/// The DataLoaders given to the schema.
pub fn loaders<'a>(ctx: &Context<'a>) -> Result<&'a super::loaders::Loaders, Error> {
    if let Some(per_request) = ctx.data_opt::<super::loaders::RequestLoaders>() {
        return Ok(per_request.get(state(ctx)?));
    }
    ctx.data_opt::<super::loaders::Loaders>()
        .ok_or(Error::Database(sea_orm::DbErr::Custom(
            "schema built without loaders".into(),
        )))
}

/// Parses a GraphQL `ID` as a UUID in its hyphenated form, as Courier writes IDs (either
/// case); anything else, other spellings of a UUID included, is `BAD_USER_INPUT`.
pub fn parse_id(id: &ID, what: &str) -> Result<Uuid, Error> {
    let invalid = || Error::bad_input(format!("{what} is not a valid ID"));
    // The hyphenated form is the one 36 characters long (simple, braced and URN differ).
    if id.len() != 36 {
        return Err(invalid());
    }
    Uuid::parse_str(id.as_str()).map_err(|_| invalid())
}

/// A row that a foreign key guarantees is gone: an internal error, never the caller's fault.
pub fn missing(what: &str) -> Error {
    Error::Database(sea_orm::DbErr::RecordNotFound(format!(
        "{what} referenced by a foreign key"
    )))
}

/// One keyset page of `listed` as a Relay connection: each row wrapped as a node, with its
/// cursor (made from where the row stands, `position_of`).
pub fn relay_page<T, N: async_graphql::OutputType>(
    listed: Listed,
    page: Page<T>,
    request: &PageRequest,
    position_of: impl Fn(&T) -> Position,
    node: impl Fn(T) -> N,
) -> Connection<String, N> {
    let mut connection = Connection::new(request.after.is_some(), page.has_next_page);
    connection.edges.extend(
        page.items
            .into_iter()
            .map(|row| Edge::new(encode_cursor(listed, position_of(&row)), node(row))),
    );
    connection
}
