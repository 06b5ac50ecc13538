//! Requests no route takes (an unknown path, or a method the path does not allow), refused
//! as a request refused before its body is read is: what arrives of the body is read past
//! first, so a client still sending it gets the answer rather than a reset, and a client
//! that waits for `100 Continue` is not asked for it (see [`super::body::refuse_unread`]).

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Version};
use axum::response::{IntoResponse as _, Response};

use super::body::refuse_unread;
use super::HttpState;

/// `404` for a path no route serves.
pub async fn not_found(
    State(state): State<HttpState>,
    version: Version,
    headers: HeaderMap,
    body: Body,
) -> Response {
    refuse(StatusCode::NOT_FOUND, &state, version, &headers, body).await
}

/// `405` for a method the path does not allow (the router adds the `Allow` header).
pub async fn method_not_allowed(
    State(state): State<HttpState>,
    version: Version,
    headers: HeaderMap,
    body: Body,
) -> Response {
    refuse(
        StatusCode::METHOD_NOT_ALLOWED,
        &state,
        version,
        &headers,
        body,
    )
    .await
}

async fn refuse(
    status: StatusCode,
    state: &HttpState,
    version: Version,
    headers: &HeaderMap,
    body: Body,
) -> Response {
    let limit = state.app.config.max_body_bytes;
    refuse_unread(status.into_response(), body, limit, version, headers).await
}
