//! Subscriptions run in process, on an app's schema, without a socket.

use std::time::Duration;

use futures_util::stream::BoxStream;
use futures_util::StreamExt as _;

use super::TestApp;

/// `query` run as an admin's subscription on `app`'s schema, in process, once its first
/// poll has subscribed (and, nothing having happened yet, told nothing).
pub async fn subscribed_in_process(
    app: &TestApp,
    query: &str,
) -> BoxStream<'static, async_graphql::Response> {
    let token = app.admin_token().await;
    subscribed_as(app, &token, query).await
}

/// [`subscribed_in_process`] under the key `token`.
pub async fn subscribed_as(
    app: &TestApp,
    token: &str,
    query: &str,
) -> BoxStream<'static, async_graphql::Response> {
    let caller = courier::auth::authenticate(&app.state.db, Some(&format!("Bearer {token}")))
        .await
        .expect("caller");
    let schema = courier::schema::build(Some(app.state.clone()));
    let mut stream = schema
        .execute_stream(async_graphql::Request::new(query).data(caller))
        .boxed();
    assert!(
        tokio::time::timeout(Duration::from_millis(200), stream.next())
            .await
            .is_err(),
        "subscribed, nothing yet"
    );
    stream
}

/// The data of the next item `stream` tells within `within`, which must carry no error
/// (`what` names the item in a failure's message).
pub async fn next_told(
    stream: &mut BoxStream<'static, async_graphql::Response>,
    within: Duration,
    what: &str,
) -> serde_json::Value {
    let response = tokio::time::timeout(within, stream.next())
        .await
        .unwrap_or_else(|_| panic!("{what}: not answered in time"))
        .unwrap_or_else(|| panic!("{what}: the stream ended"));
    assert!(response.errors.is_empty(), "{what}: {:?}", response.errors);
    response.data.into_json().expect("json")
}
