//! Domain operations and their transactions. No GraphQL types here: resolvers call in, errors come out as [`crate::error::Error`].

pub mod endpoints;
pub mod pagination;
