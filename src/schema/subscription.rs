//! GraphQL subscriptions: `deliveryStateChanged`, every committed state change a caller may see.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use async_graphql::{Context, Object, Subscription, ID};
use chrono::{DateTime, Utc};
use futures_util::Stream;
use tokio::sync::broadcast::error::{RecvError, TryRecvError};
use uuid::Uuid;

use super::context::{caller, missing, parse_id, state};
use super::delivery::{Delivery, DeliveryState};
use super::error::{ApiError, ApiResult};
use super::loaders::{Loaders, ReadAhead, Selected};
use crate::auth::revocation::KeyInUse;
use crate::auth::Identity;
use crate::bus::{ChangeMessage, StateChange};
use crate::error::{error_chain, Error};
use crate::metrics::Metrics;
use crate::service::access::Access;
use crate::service::deliveries::Deliveries;
use crate::state::AppState;
use entity::webhook_delivery;

/// How long a new subscription waits for this process to be listening for changes.
const LIVE_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// How often what a change needs read (is it in the caller's scope? the delivery, when
/// selected) is tried before the subscription ends as lagged, and the pause between tries.
const READ_TRIES: u32 = 3;
const READ_RETRY_AFTER: std::time::Duration = std::time::Duration::from_millis(250);

/// Most changes a subscriber that selects `delivery` takes from the broadcast at once when
/// several wait, to read their deliveries (and what it selects under them) in one
/// statement each: one read per change could not keep up with a thousand changes a second.
const READ_AHEAD: usize = 256;

/// Most subscriptions one WebSocket connection may run at once: room for a dashboard that
/// watches each of hundreds of endpoints on its own, while a client opening thousands more
/// (each answered on every change its caller may see) is refused before every change costs
/// thousands of answers for everyone else to wait on. Queries and mutations sent over the
/// connection count while they run. Enforced where the connection's messages are read, in
/// the order the client sent them (see `http::ws_gate`).
pub const MAX_SUBSCRIPTIONS_PER_CONNECTION: usize = 1_000;

/// The operations one WebSocket connection runs, in its connection data: a place is taken
/// where the operation's message is read, in the order the client sent them
/// ([`RunningOperations::try_start`]), and given back when the session drops the
/// operation's stream, however it ended ([`RunningOperations::held_until_dropped`]).
/// Counted by the streams themselves, not by ids, so no sequence of ids the client reuses
/// can make an operation go uncounted.
#[derive(Clone, Debug, Default)]
pub struct RunningOperations(Arc<AtomicUsize>);

impl RunningOperations {
    /// Takes a place for one more operation, unless [`MAX_SUBSCRIPTIONS_PER_CONNECTION`]
    /// run already.
    pub fn try_start(&self) -> bool {
        self.0
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |running| {
                (running < MAX_SUBSCRIPTIONS_PER_CONNECTION).then_some(running + 1)
            })
            .is_ok()
    }

    /// How many run.
    pub fn running(&self) -> usize {
        self.0.load(Ordering::Acquire)
    }

    /// The place an operation started with [`RunningOperations::try_start`] holds, given
    /// back when the returned guard is dropped (with the operation's stream).
    pub fn held_until_dropped(&self) -> OperationPlace {
        OperationPlace(self.0.clone())
    }
}

/// One running operation's place (see [`RunningOperations`]), given back on drop.
#[derive(Debug)]
pub struct OperationPlace(Arc<AtomicUsize>);

impl Drop for OperationPlace {
    fn drop(&mut self) {
        let _ = self
            .0
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |running| {
                running.checked_sub(1)
            });
    }
}

/// One committed change of a delivery's state, with its delivery when the subscription
/// selects it (read before the change is sent: see [`Watch::next`]), and the loaders primed
/// for what it selects under the delivery, read with the changes around it.
pub struct DeliveryStateChange {
    change: Arc<StateChange>,
    delivery: Option<Option<webhook_delivery::Model>>,
    read_ahead: Option<Arc<Loaders>>,
}

/// One committed change of a delivery's state.
#[Object]
impl DeliveryStateChange {
    /// The delivery that changed.
    async fn delivery_id(&self) -> ID {
        ID(self.change.delivery_id.to_string())
    }
    /// Its endpoint.
    async fn endpoint_id(&self) -> ID {
        ID(self.change.endpoint_id.to_string())
    }
    /// The state before; null when the delivery was just created.
    async fn previous_state(&self) -> Option<DeliveryState> {
        self.change.previous_state.map(Into::into)
    }
    /// The state after.
    async fn state(&self) -> DeliveryState {
        self.change.state.into()
    }
    /// When the change was made.
    async fn at(&self) -> DateTime<Utc> {
        self.change.at
    }
    /// The delivery as it is now (it may have moved on since this change; read once for
    /// every subscriber of the change; its endpoint, submission and attempts as they were
    /// when this change and those waiting with it were read).
    async fn delivery(&self, ctx: &Context<'_>) -> ApiResult<Delivery> {
        let found = match &self.delivery {
            Some(read) => read.clone(),
            None => state(ctx)?.deliveries.load_after(&self.change).await?,
        };
        Ok(Delivery::read_ahead(
            found.ok_or_else(|| missing("delivery"))?,
            ReadAhead::primed(self.read_ahead.clone()),
        ))
    }
}

/// Delivery subscriptions.
#[derive(Default)]
pub struct DeliverySubscription;

/// Delivery subscriptions.
#[Subscription]
impl DeliverySubscription {
    /// Every committed state change of every delivery the caller may see (of one endpoint,
    /// if given), in commit order per delivery: created (`previousState: null` ->
    /// `PENDING`), claimed (`PROCESSING`), `DELIVERED`, retry scheduled (`PENDING`),
    /// `FAILED`, replayed (`PENDING`). A subscriber that falls behind, or for which a
    /// change cannot be read (the database unavailable for a while), gets one
    /// `SUBSCRIPTION_LAGGED` error and the subscription ends: resubscribe and refetch.
    /// When the caller's API key is revoked, one `UNAUTHENTICATED` error ends it. One
    /// connection runs at most 1,000 subscriptions at once (`BAD_USER_INPUT` past that).
    async fn delivery_state_changed(
        &self,
        ctx: &Context<'_>,
        endpoint_id: Option<ID>,
    ) -> Result<impl Stream<Item = Result<DeliveryStateChange, ApiError>> + use<>, ApiError> {
        let caller = caller(ctx)?.clone();
        let endpoint = endpoint_id
            .as_ref()
            .map(|id| parse_id(id, "endpointId"))
            .transpose()?;
        let app = state(ctx)?;
        if let Some(endpoint) = endpoint {
            // An endpoint that does not exist never will (ids are minted by Courier).
            app.access.require_existing(&caller, endpoint).await?;
        }
        // Subscribe first, then check that this process hears every process's changes: a
        // listener lost in between leaves its gap marker in this receiver, where the other
        // order could check "live", miss the marker, and then silently miss events.
        let receiver = app.bus.subscribe();
        if !app.bus.wait_live(LIVE_WAIT).await {
            return Err(ApiError::from(Error::Lagged));
        }
        let delivery = ctx.look_ahead().field("delivery");
        let nested = Selected::of_delivery_fields(&delivery);
        let watch = Watch {
            deliveries: delivery.exists().then(|| app.deliveries.clone()),
            nested: nested.any().then(|| (app.clone(), nested)),
            read_ahead: None,
            receiver,
            ahead: VecDeque::new(),
            key: app.revocations.register(caller.key_id, caller.expires_at),
            access: app.access.clone(),
            caller,
            endpoint,
            metrics: app.metrics.clone(),
            finished: false,
            _open: OpenSubscription::new(app.metrics.clone()),
        };
        Ok(futures_util::stream::unfold(watch, Watch::next))
    }
}

/// One subscriber's position in the event broadcast.
struct Watch {
    receiver: tokio::sync::broadcast::Receiver<ChangeMessage>,
    /// What was taken from the broadcast ahead of telling it (see [`READ_AHEAD`]), in order.
    ahead: VecDeque<Result<ChangeMessage, RecvError>>,
    /// The caller's key, watched for revocation.
    key: KeyInUse,
    access: Access,
    caller: Identity,
    endpoint: Option<Uuid>,
    metrics: Arc<Metrics>,
    /// Where each change's delivery is read, when the subscription selects it.
    deliveries: Option<Deliveries>,
    /// What the subscription selects under `delivery` (its endpoint, submission or
    /// attempts), if anything: read for the changes waiting together (see
    /// [`Watch::read_ahead`]).
    nested: Option<(AppState, Selected)>,
    /// The loaders primed for the changes read ahead last, until they are all told.
    read_ahead: Option<Arc<Loaders>>,
    finished: bool,
    _open: OpenSubscription,
}

impl Watch {
    /// Whether the change is of the endpoint asked for and within the caller's scope.
    async fn wants(&self, change: &StateChange) -> Result<bool, Error> {
        if self
            .endpoint
            .is_some_and(|endpoint| endpoint != change.endpoint_id)
        {
            return Ok(false);
        }
        self.access
            .allows_streamed(&self.caller, change.endpoint_id)
            .await
    }

    /// The change as sent, if the subscriber wants it: with its delivery read when
    /// selected. Reads that fail are tried again a little later, up to [`READ_TRIES`]; an
    /// error then means the change cannot be told, and the subscription must end (a change
    /// left out, or sent as an error with nothing to say which delivery it was of, would be
    /// lost without the subscriber knowing).
    async fn told(&self, change: Arc<StateChange>) -> Result<Option<DeliveryStateChange>, Error> {
        let mut tries = 0;
        loop {
            tries += 1;
            let read = async {
                if !self.wants(&change).await? {
                    return Ok(None);
                }
                let delivery = match &self.deliveries {
                    Some(deliveries) => Some(deliveries.load_after(&change).await?),
                    None => None,
                };
                Ok(Some(delivery))
            };
            match read.await {
                Ok(None) => return Ok(None),
                Ok(Some(delivery)) => {
                    return Ok(Some(DeliveryStateChange {
                        change: change.clone(),
                        delivery,
                        read_ahead: self.read_ahead.clone(),
                    }))
                }
                Err(err) if tries >= READ_TRIES => return Err(err),
                Err(err) => {
                    tracing::debug!(error = %err, delivery_id = %change.delivery_id,
                        "reading a change for a subscriber failed; trying again");
                    tokio::time::sleep(READ_RETRY_AFTER).await;
                }
            }
        }
    }

    /// When the subscription selects `delivery` and more changes wait behind `first`: takes
    /// up to [`READ_AHEAD`] of them, in order, and reads the deliveries of those of the
    /// endpoint asked for in one statement; when it selects fields under the delivery,
    /// reads those for every delivery of the changes at hand (`first` alone included) in
    /// one statement per field, into loaders their changes carry. A read that fails is left
    /// to each change's own.
    async fn read_ahead(&mut self, first: Arc<StateChange>) {
        let Some(deliveries) = &self.deliveries else {
            return;
        };
        while self.ahead.len() < READ_AHEAD {
            match self.receiver.try_recv() {
                Ok(message) => self.ahead.push_back(Ok(message)),
                Err(TryRecvError::Lagged(missed)) => {
                    self.ahead.push_back(Err(RecvError::Lagged(missed)));
                    break;
                }
                Err(TryRecvError::Empty | TryRecvError::Closed) => break,
            }
        }
        if self.ahead.is_empty() && self.nested.is_none() {
            return;
        }
        // Only changes the subscriber may be told: of the endpoint asked for, and not known
        // to be outside its scope.
        let asked = |change: &StateChange| {
            self.endpoint
                .is_none_or(|endpoint| endpoint == change.endpoint_id)
                && self.access.may_allow(&self.caller, change.endpoint_id)
        };
        let changes: Vec<&StateChange> = std::iter::once(first.as_ref())
            .chain(self.ahead.iter().filter_map(|message| match message {
                Ok(ChangeMessage::Change(change)) => Some(change.as_ref()),
                _ => None,
            }))
            .filter(|change| asked(change))
            .collect();
        if let Err(err) = deliveries.read_changes_ahead(&changes).await {
            tracing::debug!(error = %err, "reading changes ahead failed; each is read alone");
            return;
        }
        let Some((app, nested)) = &self.nested else {
            return;
        };
        let loaders = Loaders::new(app, true);
        let rows = deliveries.changes_read(&changes);
        match loaders.prime_deliveries(&rows, nested).await {
            Ok(()) => self.read_ahead = Some(Arc::new(loaders)),
            Err(err) => tracing::debug!(error = %error_chain(&err),
                "reading what lies under changes ahead failed; each change reads its own"),
        }
    }

    async fn next(mut self) -> Option<(ApiResult<DeliveryStateChange>, Watch)> {
        if self.finished {
            return None;
        }
        loop {
            // A revocation wins over any event already waiting: nothing is sent after it.
            let received = match self.ahead.pop_front() {
                Some(_) if self.key.is_revoked() => None,
                Some(received) => Some(received),
                None => {
                    // What was read for the changes told so far goes with them: nothing of
                    // it is held while waiting.
                    self.read_ahead = None;
                    let received = tokio::select! {
                        biased;
                        () = self.key.revoked() => None,
                        received = self.receiver.recv() => Some(received),
                    };
                    if let Some(Ok(ChangeMessage::Change(change))) = &received {
                        self.read_ahead(change.clone()).await;
                    }
                    received
                }
            };
            let Some(received) = received else {
                self.finished = true;
                return Some((Err(ApiError::from(Error::KeyRevoked)), self));
            };
            match received {
                Ok(ChangeMessage::Change(change)) => match self.told(change).await {
                    // Reading it may have taken a while: a revocation meanwhile still wins.
                    Ok(Some(_)) if self.key.is_revoked() => {
                        self.finished = true;
                        return Some((Err(ApiError::from(Error::KeyRevoked)), self));
                    }
                    Ok(Some(told)) => return Some((Ok(told), self)),
                    Ok(None) => {}
                    Err(err) => {
                        tracing::warn!(error = %err,
                            "a change could not be read for a subscriber; its subscription ends as lagged");
                        self.finished = true;
                        self.metrics.lagged_subscribers.inc();
                        return Some((Err(ApiError::from(Error::Lagged)), self));
                    }
                },
                Ok(ChangeMessage::Gap) | Err(RecvError::Lagged(_)) => {
                    self.finished = true;
                    self.metrics.lagged_subscribers.inc();
                    return Some((Err(ApiError::from(Error::Lagged)), self));
                }
                Err(RecvError::Closed) => return None,
            }
        }
    }
}

/// Counts an open subscription for as long as it lives.
struct OpenSubscription(Arc<Metrics>);

impl OpenSubscription {
    fn new(metrics: Arc<Metrics>) -> Self {
        metrics.active_subscriptions.inc();
        OpenSubscription(metrics)
    }
}

impl Drop for OpenSubscription {
    fn drop(&mut self) {
        self.0.active_subscriptions.dec();
    }
}
