//! A tenant's portal as the tenant grows in endpoints: a page of its deliveries (first 50,
//! the median of 11 after two that warm up) for each filter, asked with the tenant's own
//! key, on one `courier serve` with default settings (API only, so the deliveries stay as
//! submitted). Everything is made through the API: the tenant's endpoints, other endpoints
//! beside them, and deliveries to both, most to a few busy endpoints of each.

use std::time::Instant;

use futures_util::StreamExt as _;
use serde_json::{json, Value};

use crate::process::{admin_token, Scratch, Server};
use crate::workloads::graphql;

/// Timed pages of each filter (after two that warm up); the median is reported.
const TIMED_RUNS: usize = 11;

/// Endpoints beside the tenant's (no tenant), sharing the traffic.
const OTHERS: usize = 20;

/// Busy endpoints of the tenant: nine deliveries in ten of its share go to them.
const BUSY: usize = 20;

/// Requests in flight while building.
const CONCURRENCY: usize = 16;

/// The filters timed, by name (each a `DeliveryFilter`).
fn filters() -> Vec<(&'static str, Value)> {
    let hour_ago = (chrono::Utc::now() - chrono::Duration::hours(1)).to_rfc3339();
    vec![
        ("everything", json!({})),
        ("PENDING", json!({ "state": "PENDING" })),
        ("FAILED (none)", json!({ "state": "FAILED" })),
        ("an event type", json!({ "eventType": "order.paid" })),
        ("the last hour", json!({ "createdAfter": hour_ago })),
    ]
}

pub struct TenantPages {
    pub endpoints: usize,
    pub deliveries: usize,
    /// Median milliseconds per page, by filter.
    pub medians_ms: Vec<(String, f64)>,
}

/// A tenant of `endpoints` endpoints and `deliveries` deliveries (half of them its own),
/// and the time a page of each filter takes.
pub async fn measure(server_url: &str, endpoints: usize, deliveries: usize) -> TenantPages {
    let scratch = Scratch::create(server_url, "tenants").await;
    let admin = admin_token(&scratch.url);
    let server = Server::start(
        &scratch.url,
        &[
            ("COURIER_WORKER_CONCURRENCY", "0".into()),
            ("COURIER_ALLOW_PRIVATE_DESTINATIONS", "true".into()),
        ],
    );
    let client = reqwest::Client::new();
    let ask = |token: String, query: &'static str, variables: Value| {
        let (client, server) = (&client, &server);
        async move {
            let body = graphql(client, server, &token, query, variables).await;
            assert!(body["errors"].is_null(), "{body}");
            body
        }
    };
    let tenant = ask(
        admin.clone(),
        "mutation { createTenant(input: {name: \"bench\"}) { id } }",
        json!({}),
    )
    .await["data"]["createTenant"]["id"]
        .as_str()
        .expect("a tenant")
        .to_owned();
    let key = ask(
        admin.clone(),
        "mutation($tenant: ID!) { createApiKey(input: {name: \"portal\", role: PARTNER, tenantId: $tenant}) { token } }",
        json!({ "tenant": tenant }),
    )
    .await["data"]["createApiKey"]["token"]
        .as_str()
        .expect("a token")
        .to_owned();
    let create = |n: usize, tenant: Option<String>| {
        let admin = admin.clone();
        let ask = &ask;
        async move {
            let body = ask(
                admin,
                "mutation($url: String!, $tenant: ID) { createEndpoint(input: {name: \"bench\", url: $url, tenantId: $tenant}) { endpoint { id } } }",
                json!({ "url": format!("http://127.0.0.1:9/hook/{n}"), "tenant": tenant }),
            )
            .await;
            body["data"]["createEndpoint"]["endpoint"]["id"]
                .as_str()
                .expect("an endpoint")
                .to_owned()
        }
    };
    let theirs: Vec<String> = futures_util::stream::iter(0..endpoints)
        .map(|n| create(n, Some(tenant.clone())))
        .buffered(CONCURRENCY)
        .collect()
        .await;
    let others: Vec<String> = futures_util::stream::iter(0..OTHERS)
        .map(|n| create(endpoints + n, None))
        .buffered(CONCURRENCY)
        .collect()
        .await;
    // Half the deliveries to the others; of the tenant's half, nine in ten to its busy
    // endpoints and the rest spread over all of its endpoints.
    let target = |n: usize| -> &String {
        if n.is_multiple_of(2) {
            &others[(n / 2) % others.len()]
        } else if n % 20 == 1 {
            &theirs[(n / 20) % theirs.len()]
        } else {
            &theirs[(n / 2) % BUSY.min(theirs.len())]
        }
    };
    futures_util::stream::iter(0..deliveries)
        .for_each_concurrent(CONCURRENCY, |n| {
            let endpoint = target(n).clone();
            let admin = admin.clone();
            let ask = &ask;
            async move {
                ask(
                    admin,
                    "mutation($input: SubmitInput!) { submit(input: $input) { created } }",
                    json!({ "input": {
                        "endpointId": endpoint,
                        "payload": { "n": n },
                        "eventType": if n.is_multiple_of(3) { "order.paid" } else { "order.shipped" },
                    } }),
                )
                .await;
            }
        })
        .await;
    let mut medians_ms = Vec::new();
    for (name, filter) in filters() {
        let mut took = Vec::with_capacity(TIMED_RUNS);
        for run in 0..TIMED_RUNS + 2 {
            let started = Instant::now();
            ask(
                key.clone(),
                "query($filter: DeliveryFilter) { deliveries(first: 50, filter: $filter) { edges { node { id state createdAt endpoint { id } } } pageInfo { hasNextPage } } }",
                json!({ "filter": filter }),
            )
            .await;
            if run >= 2 {
                took.push(started.elapsed().as_secs_f64() * 1000.0);
            }
        }
        took.sort_by(f64::total_cmp);
        medians_ms.push((name.to_owned(), took[took.len() / 2]));
    }
    server.stop();
    scratch.drop_now().await;
    TenantPages {
        endpoints,
        deliveries,
        medians_ms,
    }
}
