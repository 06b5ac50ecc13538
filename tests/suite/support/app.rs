//! An in-process Courier instance on port 0 with its own connection pool, and a GraphQL client for it.

use std::net::SocketAddr;

use courier::app::App;
use courier::auth::{self, Role};
use courier::config::ServeArgs;
use courier::db::Db;
use courier::state::AppState;
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::{PartitionProxy, TestDb};

/// A running app instance. Each one has its own pool, like a separate process would.
pub struct TestApp {
    /// `http://127.0.0.1:PORT`.
    pub base_url: String,
    /// Where it listens.
    pub addr: SocketAddr,
    /// Its state (database pool, config, metrics).
    pub state: AppState,
    shutdown: CancellationToken,
    handle: Option<JoinHandle<std::io::Result<()>>>,
    client: reqwest::Client,
}

impl TestApp {
    /// Starts an API-only instance (no worker) with private destinations allowed, for local receivers.
    pub async fn spawn(db: &TestDb) -> TestApp {
        Self::spawn_with(db, |_| {}).await
    }

    /// Starts an instance after `configure` adjusts the settings.
    pub async fn spawn_with(db: &TestDb, configure: impl FnOnce(&mut ServeArgs)) -> TestApp {
        Self::spawn_on(db.connect(5).await, configure).await
    }

    /// Starts an instance whose pool (of 5) reaches the database through `proxy`.
    pub async fn spawn_through(
        db: &TestDb,
        proxy: &PartitionProxy,
        configure: impl FnOnce(&mut ServeArgs),
    ) -> TestApp {
        let pool = Db::connect(&proxy.url_for(&db.url), 5)
            .await
            .expect("connect through the proxy");
        Self::spawn_on(pool, configure).await
    }

    /// Starts an instance over `pool` after `configure` adjusts the settings.
    pub async fn spawn_on(pool: Db, configure: impl FnOnce(&mut ServeArgs)) -> TestApp {
        let mut config = ServeArgs::from_env().expect("default settings parse");
        config.allow_private_destinations = true;
        config.worker_concurrency = 0;
        configure(&mut config);
        let shutdown = CancellationToken::new();
        let app = App::new(pool, config, shutdown.clone());
        let state = app.state().clone();
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind port 0");
        let addr = listener.local_addr().expect("local address");
        let handle = tokio::spawn(app.serve(listener));
        TestApp {
            base_url: format!("http://{addr}"),
            addr,
            state,
            shutdown,
            handle: Some(handle),
            client: super::http_client(),
        }
    }

    /// Creates an API key directly in the database and returns its token.
    pub async fn token(&self, role: Role, scope: &[Uuid]) -> String {
        let limits = auth::KeyLimits {
            endpoints: scope,
            ..Default::default()
        };
        auth::create_api_key(&self.state.db, "test", role, limits)
            .await
            .expect("create an API key")
            .token
    }

    /// An admin token.
    pub async fn admin_token(&self) -> String {
        self.token(Role::Admin, &[]).await
    }

    /// POSTs a GraphQL request and returns the JSON body (whatever the status).
    pub async fn graphql(&self, token: &str, query: &str, variables: Value) -> Value {
        self.post_graphql(
            Some(token),
            &json!({ "query": query, "variables": variables }),
        )
        .await
        .json()
        .await
        .expect("a JSON body")
    }

    /// POSTs `query` with `variables` as `token`, asking for
    /// `application/graphql-response+json` (so a request refused before it runs is a 400):
    /// the status and the body.
    pub async fn graphql_response(
        &self,
        token: &str,
        query: &str,
        variables: Value,
    ) -> (reqwest::StatusCode, Value) {
        let response = self
            .client
            .post(self.url("/graphql"))
            .bearer_auth(token)
            .header("accept", "application/graphql-response+json")
            .json(&json!({ "query": query, "variables": variables }))
            .send()
            .await
            .expect("the request was answered");
        let status = response.status();
        (status, response.json().await.expect("a JSON body"))
    }

    /// POSTs a JSON body to `/graphql` with an optional bearer token.
    pub async fn post_graphql(&self, token: Option<&str>, body: &Value) -> reqwest::Response {
        let mut request = self.client.post(self.url("/graphql")).json(body);
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        request.send().await.expect("the request was answered")
    }

    /// A request builder for any path.
    pub fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        self.client.request(method, self.url(path))
    }

    /// The value of the unlabelled metric `name` (e.g. `courier_deliveries_due`) in a
    /// `/metrics` answer, if it answered with one.
    pub async fn scraped(&self, name: &str) -> Option<i64> {
        let text = self
            .request(reqwest::Method::GET, "/metrics")
            .send()
            .await
            .ok()?
            .text()
            .await
            .ok()?;
        text.lines()
            .find_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
            .and_then(|value| value.trim().parse().ok())
    }

    /// `base_url` + `path`.
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base_url)
    }

    /// Creates an endpoint as admin and returns `(id, secret)`.
    pub async fn create_endpoint(&self, admin: &str, url: &str) -> (String, String) {
        let body = self
            .graphql(
                admin,
                "mutation($url: String!) { createEndpoint(input: {name: \"test\", url: $url}) { endpoint { id } secret } }",
                json!({ "url": url }),
            )
            .await;
        let created = &body["data"]["createEndpoint"];
        let id = created["endpoint"]["id"]
            .as_str()
            .unwrap_or_else(|| panic!("created: {body}"));
        let secret = created["secret"]
            .as_str()
            .unwrap_or_else(|| panic!("secret: {body}"));
        (id.to_owned(), secret.to_owned())
    }

    /// Begins to stop the instance (as a first SIGTERM does), without waiting: requests in
    /// flight go on, and [`TestApp::stop`] waits for the rest.
    pub fn begin_stop(&self) {
        self.shutdown.cancel();
    }

    /// Stops the instance and waits for its server to finish.
    pub async fn stop(mut self) {
        self.shutdown.cancel();
        if let Some(handle) = self.handle.take() {
            let _ = handle.await;
        }
    }
}

impl Drop for TestApp {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// `errors[0].extensions.code` of a GraphQL response, if any.
pub fn gql_error_code(body: &Value) -> Option<&str> {
    body["errors"][0]["extensions"]["code"].as_str()
}

/// The code of the first error of a response run in process, if any.
pub fn response_error_code(response: &async_graphql::Response) -> Option<String> {
    match response.errors.first()?.extensions.as_ref()?.get("code")? {
        async_graphql::Value::String(code) => Some(code.clone()),
        _ => None,
    }
}
