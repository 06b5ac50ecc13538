//! Sets of endpoints for the set-listing tests: made through the API, named in SQL, and
//! paged through the service as a caller.

use courier::auth::{self, Identity};
use courier::service::deliveries::DeliveryFilter;
use courier::service::pagination::PageRequest;
use uuid::Uuid;

use super::fixtures::rows;
use super::TestApp;

/// `count` endpoints, created through the API, in `tenant` when given.
pub async fn endpoints(
    app: &TestApp,
    admin: &str,
    count: usize,
    tenant: Option<Uuid>,
) -> Vec<Uuid> {
    let mut ids = Vec::new();
    for _ in 0..count {
        let (id, _) = app.create_endpoint(admin, "https://example.com/set").await;
        ids.push(Uuid::parse_str(&id).expect("an endpoint id"));
    }
    if let Some(tenant) = tenant {
        rows(
            &app.state.db,
            &format!(
                "UPDATE endpoints SET tenant_id = $1 WHERE id IN ({})",
                quoted(&ids)
            ),
            vec![tenant.into()],
        )
        .await;
    }
    ids
}

/// `ids` as a list of SQL literals.
pub fn quoted(ids: &[Uuid]) -> String {
    ids.iter()
        .map(|id| format!("'{id}'"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Every page of `filter` for `who`, `first` at a time, to the end.
pub async fn walk(
    app: &TestApp,
    who: &Identity,
    filter: &DeliveryFilter,
    first: usize,
) -> Vec<Uuid> {
    let mut seen = Vec::new();
    let mut after = None;
    loop {
        let page = app
            .state
            .deliveries
            .list(
                who,
                filter.clone(),
                PageRequest {
                    first,
                    after,
                    after_at: None,
                },
            )
            .await
            .expect("a page");
        assert!(page.items.len() <= first);
        seen.extend(page.items.iter().map(|delivery| delivery.id));
        if !page.has_next_page {
            return seen;
        }
        assert_eq!(page.items.len(), first, "a full page before the last");
        after = seen.last().copied();
    }
}

/// The caller a token authenticates as.
pub async fn identity(app: &TestApp, token: String) -> Identity {
    auth::authenticate(&app.state.db, Some(&format!("Bearer {token}")))
        .await
        .expect("a caller")
}

/// A new tenant named `name`, made directly through the service: its id.
pub async fn new_tenant(app: &TestApp, name: &str) -> Uuid {
    courier::service::tenants::create(&app.state.db, name)
        .await
        .expect("a tenant")
        .id
}
