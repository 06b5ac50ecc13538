//! `/graphql` over HTTP, per the GraphQL-over-HTTP specification: POST for everything,
//! GET for queries (or GraphiQL for a browser), media types negotiated, 4xx for requests that cannot run.

use async_graphql::parser::types::OperationType;
use async_graphql::{ServerError, Value, Variables};
use axum::extract::{RawQuery, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode, Version};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use super::negotiate::{self, MediaType};
use super::HttpState;
use crate::auth::Identity;
use crate::error::{error_chain, Error};
use crate::schema::ensure_codes;
use crate::schema::in_time::{execute_in_time, server_error};
use crate::schema::json;
use crate::schema::limits;
use crate::schema::loaders::RequestLoaders;
use crate::schema::observed::CallerTrace;
use crate::telemetry;

/// The body of a GraphQL POST: `query` is required, `variables` must be an object.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireRequest {
    #[serde(default)]
    query: Option<String>,
    #[serde(default)]
    operation_name: Option<String>,
    #[serde(default)]
    variables: Option<serde_json::Map<String, serde_json::Value>>,
    /// Held to its type, a map, and read for one member: Courier defines no request
    /// extensions, and answers a persisted query's hash alone as not supported.
    #[serde(default)]
    extensions: Option<serde_json::Map<String, serde_json::Value>>,
}

/// The answer to a request that sends a persisted query's hash instead of its text
/// (Apollo's automatic persisted queries): the message Apollo Client's persisted-query link
/// looks for, after which it sends the text itself. Courier keeps no persisted queries.
pub const PERSISTED_QUERY_NOT_SUPPORTED: &str = "PersistedQueryNotSupported";

impl WireRequest {
    /// The request, or, without a `query`, what to answer.
    fn into_request(self) -> Result<async_graphql::Request, &'static str> {
        let Some(query) = self.query else {
            let persisted = self
                .extensions
                .is_some_and(|extensions| extensions.contains_key("persistedQuery"));
            return Err(if persisted {
                PERSISTED_QUERY_NOT_SUPPORTED
            } else {
                "the body is not a GraphQL request: it has no `query`"
            });
        };
        let mut request = async_graphql::Request::new(query);
        if let Some(name) = self.operation_name {
            request = request.operation_name(name);
        }
        if let Some(variables) = self.variables {
            // Converted directly, not through serde, so every number keeps its exact text.
            let variables = json::to_graphql(&serde_json::Value::Object(variables));
            request = request.variables(Variables::from_value(variables));
        }
        Ok(request)
    }
}

/// `POST /graphql`.
pub async fn post(
    state: State<HttpState>,
    version: Version,
    headers: HeaderMap,
    body: axum::body::Body,
) -> Response {
    varies_by_accept(answer_post(state, version, headers, body).await)
}

/// `GET /graphql`: GraphiQL for a browser or a bare GET; otherwise a query from the URL (a
/// client that asks for JSON and sends none gets `BAD_USER_INPUT`, not the page).
pub async fn get(state: State<HttpState>, headers: HeaderMap, query: RawQuery) -> Response {
    varies_by_accept(answer_get(state, headers, query).await)
}

/// `response`, saying that what `/graphql` answers depends on `Accept` (the page or a
/// query's result; which media type, and so which status): a cache must not hand one
/// client's answer to a client that asked for another.
pub(super) fn varies_by_accept(mut response: Response) -> Response {
    response
        .headers_mut()
        .append(header::VARY, HeaderValue::from_static("accept"));
    response
}

/// [`post`]'s answer.
async fn answer_post(
    State(state): State<HttpState>,
    version: Version,
    headers: HeaderMap,
    body: axum::body::Body,
) -> Response {
    let limit = state.app.config.max_body_bytes;
    let Some(media) = negotiate::response_media_type(&headers) else {
        return super::body::refuse_unread(not_acceptable(), body, limit, version, &headers).await;
    };
    // A missing or wrong key is 401 whatever else is wrong with the request (but for a
    // declared length over the limit, 413 at once), before its body is read: a caller
    // without a key holds no connection while a body arrives.
    let identity = match authenticate(&state, &headers).await {
        Ok(identity) => identity,
        Err(err) => {
            let refused = auth_error(media, err);
            return super::body::refuse_unread(refused, body, limit, version, &headers).await;
        }
    };
    if !negotiate::is_json_request(&headers) {
        let refused = request_error(
            media,
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "BAD_USER_INPUT",
            "content-type must be application/json, in UTF-8",
        );
        return super::body::refuse_unread(refused, body, limit, version, &headers).await;
    }
    if !negotiate::is_unencoded(&headers) {
        let mut refused = request_error(
            media,
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "BAD_USER_INPUT",
            "content-encoding is not supported: send the body unencoded",
        );
        // RFC 9110, section 12.5.3: the codings that would have been accepted.
        refused.headers_mut().insert(
            header::ACCEPT_ENCODING,
            HeaderValue::from_static("identity"),
        );
        return super::body::refuse_unread(refused, body, limit, version, &headers).await;
    }
    let within = std::time::Duration::from_millis(state.app.config.body_timeout_ms);
    let body = match super::body::read(body, limit, within).await {
        Ok(body) => body,
        Err(unreadable) => {
            let (status, message) = unreadable.refusal();
            return request_error(media, status, "BAD_USER_INPUT", message);
        }
    };
    // JSON is UTF-8 throughout, members the request does not use included.
    let Ok(body) = std::str::from_utf8(&body) else {
        return request_error(
            media,
            StatusCode::BAD_REQUEST,
            "BAD_USER_INPUT",
            "the body is not a GraphQL request: it is not UTF-8",
        );
    };
    // A byte-order mark some clients write before the JSON is read past (RFC 8259, 8.1).
    let body = body.strip_prefix('\u{feff}').unwrap_or(body);
    if let Some(refused) = repeated_member(media, body) {
        return refused;
    }
    let request = match serde_json::from_str::<WireRequest>(body).map(WireRequest::into_request) {
        Ok(Ok(request)) => request,
        Ok(Err(message)) => {
            return request_error(media, StatusCode::BAD_REQUEST, "BAD_USER_INPUT", message);
        }
        Err(err) => {
            let message = if body.trim_ascii_start().starts_with('[') {
                "batched requests are not supported: send one GraphQL request (a JSON object) per POST".to_owned()
            } else {
                format!("the body is not a GraphQL request: {err}")
            };
            return request_error(media, StatusCode::BAD_REQUEST, "BAD_USER_INPUT", &message);
        }
    };
    execute(&state, media, traced(request.data(identity), &headers)).await
}

/// [`get`]'s answer.
async fn answer_get(
    State(state): State<HttpState>,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
) -> Response {
    let query = query.unwrap_or_default();
    let has_query = query.split('&').any(|pair| pair.starts_with("query="));
    // A persisted query's hash, sent without its text: a GraphQL client, whatever it accepts.
    let persisted = !has_query
        && url::form_urlencoded::parse(query.as_bytes())
            .any(|(key, value)| key == "extensions" && value.contains("\"persistedQuery\""));
    if negotiate::wants_html(&headers)
        || (!has_query && !persisted && !negotiate::names_json(&headers))
    {
        return graphiql();
    }
    let Some(media) = negotiate::response_media_type(&headers) else {
        return not_acceptable();
    };
    if !has_query {
        // A GraphQL client asked for JSON without a document: a request, not a page.
        let message = if persisted {
            PERSISTED_QUERY_NOT_SUPPORTED
        } else {
            "a GET request needs a `query` parameter"
        };
        return request_error(media, StatusCode::BAD_REQUEST, "BAD_USER_INPUT", message);
    }
    let identity = match authenticate(&state, &headers).await {
        Ok(identity) => identity,
        Err(err) => return auth_error(media, err),
    };
    let refused = url::form_urlencoded::parse(query.as_bytes())
        .filter(|(key, _)| key == "variables" || key == "extensions")
        .find_map(|(_, json)| repeated_member(media, &json));
    if let Some(refused) = refused {
        return refused;
    }
    let mut request = match async_graphql::http::parse_query_string(&query) {
        Ok(request) => with_operation_name(request, &query),
        Err(err) => {
            return request_error(
                media,
                StatusCode::BAD_REQUEST,
                "BAD_USER_INPUT",
                &format!("the query string is not a GraphQL request: {err}"),
            );
        }
    };
    // The document is checked before it is parsed here (see `schema::limits`).
    if let Err(err) = limits::scan_text(&request.query) {
        // Named as on every other transport: `extensions.limit` says which limit.
        let body = serde_json::json!({ "errors": [err.to_server_error()] });
        return (
            StatusCode::BAD_REQUEST,
            [(header::CONTENT_TYPE, media.content_type())],
            body.to_string(),
        )
            .into_response();
    }
    if selects_mutation(&mut request) {
        let mut response = request_error(
            media,
            StatusCode::METHOD_NOT_ALLOWED,
            "BAD_USER_INPUT",
            "mutations must be sent with POST",
        );
        response
            .headers_mut()
            .insert(header::ALLOW, HeaderValue::from_static("POST"));
        return response;
    }
    execute(&state, media, traced(request.data(identity), &headers)).await
}

/// `request` with the trace context its caller sent (see [`CallerTrace`]), while tracing is on.
fn traced(request: async_graphql::Request, headers: &HeaderMap) -> async_graphql::Request {
    match telemetry::context::from_headers(headers) {
        Some(caller) => request.data(CallerTrace(caller)),
        None => request,
    }
}

/// `request` with the operation named by the query string's `operationName`, the name
/// GraphQL over HTTP gives it: async-graphql's parser reads only `operation_name`.
fn with_operation_name(request: async_graphql::Request, query: &str) -> async_graphql::Request {
    if request.operation_name.is_some() {
        return request;
    }
    let named = url::form_urlencoded::parse(query.as_bytes())
        .find(|(key, _)| key == "operationName")
        .map(|(_, name)| name.into_owned())
        .filter(|name| !name.is_empty());
    match named {
        Some(name) => request.operation_name(name),
        None => request,
    }
}

/// Whether the operation a GET would run is a mutation (GET must not change anything).
fn selects_mutation(request: &mut async_graphql::Request) -> bool {
    let name = request.operation_name.clone();
    let Ok(document) = request.parsed_query() else {
        return false;
    };
    document.operations.iter().any(|(op_name, op)| {
        op.node.ty == OperationType::Mutation
            && (name.is_none() || op_name.map(|n| n.as_str()) == name.as_deref())
    })
}

async fn authenticate(state: &HttpState, headers: &HeaderMap) -> Result<Identity, Error> {
    let authorization = super::authorization(headers);
    let db = &state.app.db;
    db.within_deadline(state.app.keys.authenticate(db, authorization))
        .await
}

async fn execute(state: &HttpState, media: MediaType, request: async_graphql::Request) -> Response {
    // A caching set of loaders for this request alone (see `schema::loaders`).
    let request = request.data(RequestLoaders::default());
    let mut response = execute_in_time(&state.schema, &state.app.db, request).await;
    // Parse and validation failures (and the depth/complexity limits) never reach a resolver:
    // they come back with no data and no error path. Such a request could not be executed.
    let not_executed = response.data == Value::Null
        && !response.errors.is_empty()
        && response.errors.iter().all(|error| error.path.is_empty());
    // A document refused by a limit is refused whatever the media type; other requests that
    // could not run get 4xx only in `application/graphql-response+json`, as the spec says.
    let refused = response.errors.iter().any(limits::is_limit_refusal);
    let status = if refused || (not_executed && media == MediaType::GraphqlResponse) {
        StatusCode::BAD_REQUEST
    } else {
        StatusCode::OK
    };
    ensure_codes(&mut response);
    // A key found gone while the request ran (deleted before this process's revocation
    // check noticed): the 401 a missing key gets, and nothing of what was read.
    if response
        .errors
        .iter()
        .any(|error| error_code(error) == Some(Error::Unauthenticated.code()))
    {
        return auth_error(media, Error::Unauthenticated);
    }
    let body = if not_executed {
        serde_json::to_vec(&serde_json::json!({ "errors": response.errors }))
    } else {
        serde_json::to_vec(&response)
    };
    let mut http = match body {
        Ok(body) => (status, [(header::CONTENT_TYPE, media.content_type())], body).into_response(),
        Err(err) => {
            tracing::error!(error = %error_chain(&err), "serialising a GraphQL response failed");
            return StatusCode::INTERNAL_SERVER_ERROR.into_response();
        }
    };
    retry_later_if_asked(&mut http, &response.errors);
    http.headers_mut().extend(response.http_headers);
    http
}

/// The `extensions.code` of `error`, if it has one.
fn error_code(error: &ServerError) -> Option<&str> {
    match error.extensions.as_ref()?.get("code")? {
        Value::String(code) => Some(code),
        _ => None,
    }
}

/// The HTTP side of an error that says when to come back (`extensions.retryAfter`), for
/// either media type and the one place a response gets `Retry-After`: the header, and for
/// an unavailable database a 503 as well (the request may not have run, and the same
/// request may succeed later). A rate-limited request keeps its status.
fn retry_later_if_asked(http: &mut Response, errors: &[ServerError]) {
    let asked = errors.iter().find_map(|error| {
        let extensions = error.extensions.as_ref()?;
        let secs = match extensions.get("retryAfter")? {
            Value::Number(secs) => secs.as_u64()?,
            _ => return None,
        };
        let unavailable = error_code(error) == Some("SERVICE_UNAVAILABLE");
        Some((unavailable, secs))
    });
    match asked {
        Some((true, secs)) => retry_later(http, secs),
        Some((false, secs)) => {
            http.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        None => {}
    }
}

/// HTTP 503 with `Retry-After: secs`.
fn retry_later(http: &mut Response, secs: u64) {
    *http.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
    http.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from(secs));
}

/// The refusal of a request whose JSON `json` names a member twice in one object (see
/// [`super::unique_members`]), if it does.
fn repeated_member(media: MediaType, json: &str) -> Option<Response> {
    let name = super::unique_members::first_repeated_member(json)?;
    let shown: String = name.chars().take(64).collect();
    let ellipsis = if shown.len() < name.len() { "..." } else { "" };
    Some(request_error(
        media,
        StatusCode::BAD_REQUEST,
        "BAD_USER_INPUT",
        &format!("the request names \"{shown}{ellipsis}\" twice in one JSON object: each member may be named once"),
    ))
}

/// A response for a request that was refused before execution.
pub(super) fn request_error(
    media: MediaType,
    status: StatusCode,
    code: &str,
    message: &str,
) -> Response {
    let body = serde_json::json!({
        "errors": [{ "message": message, "extensions": { "code": code } }]
    });
    (
        status,
        [(header::CONTENT_TYPE, media.content_type())],
        body.to_string(),
    )
        .into_response()
}

fn auth_error(media: MediaType, err: Error) -> Response {
    match err {
        Error::Unauthenticated => {
            // HTTP authentication failed, whatever the media type: 401, as the README promises.
            let mut response = request_error(
                media,
                StatusCode::UNAUTHORIZED,
                err.code(),
                &err.to_string(),
            );
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            response
        }
        Error::Unavailable(_) => {
            let errors = [server_error(err)];
            let body = serde_json::json!({ "errors": errors }).to_string();
            let mut response = (
                StatusCode::SERVICE_UNAVAILABLE,
                [(header::CONTENT_TYPE, media.content_type())],
                body,
            )
                .into_response();
            retry_later_if_asked(&mut response, &errors);
            response
        }
        other => {
            // The key could not be checked for another reason: logged in full, reported
            // generically, and still a condition the client may retry, not a bad request.
            tracing::error!(error = %error_chain(&other), "authenticating a request failed");
            request_error(
                media,
                StatusCode::SERVICE_UNAVAILABLE,
                "INTERNAL_SERVER_ERROR",
                "internal error",
            )
        }
    }
}

fn not_acceptable() -> Response {
    (
        StatusCode::NOT_ACCEPTABLE,
        format!(
            "acceptable response types: {}, {}",
            negotiate::GRAPHQL_RESPONSE_JSON,
            negotiate::APPLICATION_JSON
        ),
    )
        .into_response()
}

/// GraphiQL, served from the binary (see `console`): open `/graphql#token=<API token>`.
fn graphiql() -> Response {
    super::console::graphiql()
}
