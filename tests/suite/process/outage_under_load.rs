//! A database that refuses connections for a few seconds while requests keep coming, as a
//! restart or a failover under load does: requests meanwhile are answered unavailable at
//! once, and the process serves again as soon as the database accepts connections, while
//! the load goes on.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use reqwest::{Method, StatusCode};
use serde_json::json;

use crate::support::gatekeeper::Gatekeeper;
use crate::support::{Backend, TestApp, TestDb};

/// One request of the load: when it was sent, how long it took, and its status (0: none).
type Answered = (Instant, Duration, u16);

/// Sends `per_second` reads of the database to `app` until `stop`, each in its own task,
/// and returns what each got.
fn load(
    app: &TestApp,
    token: &str,
    per_second: u32,
    stop: tokio_util::sync::CancellationToken,
) -> tokio::task::JoinHandle<Vec<Answered>> {
    let url = app.url("/graphql");
    let token = token.to_owned();
    let client = crate::support::http_client();
    tokio::spawn(async move {
        let answers: Arc<Mutex<Vec<Answered>>> = Arc::default();
        let mut tick = tokio::time::interval(Duration::from_secs(1) / per_second);
        let mut sent = Vec::new();
        while !stop.is_cancelled() {
            tick.tick().await;
            let (client, url, token, answers) =
                (client.clone(), url.clone(), token.clone(), answers.clone());
            sent.push(tokio::spawn(async move {
                let started = Instant::now();
                let status = client
                    .request(Method::POST, url)
                    .bearer_auth(token)
                    .json(&json!({ "query": "{ endpoints(first: 1) { edges { cursor } } }" }))
                    .timeout(Duration::from_secs(15))
                    .send()
                    .await
                    .map_or(0, |response| response.status().as_u16());
                let answer = (started, started.elapsed(), status);
                answers.lock().expect("answers").push(answer);
            }));
        }
        for request in sent {
            let _ = request.await;
        }
        let answers = answers.lock().expect("answers").clone();
        answers
    })
}

/// At 150 requests a second on a pool of four, the database refuses connections for five
/// seconds (every connection of the process terminated). Before, the pool opened each new
/// connection within what was left of the longest-waiting request's wait, too little for
/// a TLS handshake once the queue had formed: every request answered 503, each after 3 s,
/// for as long as the load lasted. Now the requests during the refusal are turned away at
/// once, and those sent a few seconds after it ends are served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_refusal_under_load_ends_when_the_database_accepts_again() {
    let db = TestDb::new(Backend::Postgres).await;
    let app = TestApp::spawn_on(db.connect(4).await, |config| {
        config.worker_concurrency = 0;
        config.auth_cache_ms = 60_000;
    })
    .await;
    let admin = app.admin_token().await;
    let gatekeeper = Gatekeeper::of(&db).await;

    let stop = tokio_util::sync::CancellationToken::new();
    let answers = load(&app, &admin, 150, stop.clone());
    tokio::time::sleep(Duration::from_secs(2)).await;
    gatekeeper.refuse().await;
    let refused_at = Instant::now();
    tokio::time::sleep(Duration::from_secs(5)).await;
    gatekeeper.allow().await;
    let allowed_at = Instant::now();
    tokio::time::sleep(Duration::from_secs(10)).await;
    stop.cancel();
    let answers = answers.await.expect("the load");

    let during: Vec<&Answered> = answers
        .iter()
        .filter(|(sent, _, _)| *sent > refused_at + Duration::from_secs(1) && *sent < allowed_at)
        .collect();
    let mut took: Vec<Duration> = during.iter().map(|(_, took, _)| *took).collect();
    took.sort();
    let median = took.get(took.len() / 2).copied().unwrap_or_default();
    assert!(
        during
            .iter()
            .all(|(_, _, status)| *status == StatusCode::SERVICE_UNAVAILABLE.as_u16()),
        "refused meanwhile: {:?}",
        during.iter().map(|answer| answer.2).collect::<Vec<_>>()
    );
    assert!(
        median < Duration::from_millis(500),
        "answered unavailable at once, not after a wait: median {median:?}"
    );
    let after: Vec<&Answered> = answers
        .iter()
        .filter(|(sent, _, _)| *sent > allowed_at + Duration::from_secs(4))
        .collect();
    let served = after
        .iter()
        .filter(|(_, _, status)| *status == StatusCode::OK.as_u16())
        .count();
    assert!(
        !after.is_empty() && served * 10 >= after.len() * 9,
        "{served} of {} requests served from 4 s after the database accepted connections again",
        after.len()
    );
    app.stop().await;
}
