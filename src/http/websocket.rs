//! `/graphql/ws`: GraphQL over WebSocket in both protocols (`graphql-transport-ws` and the
//! legacy `graphql-ws`), authenticated by the `connection_init` payload; a missing, wrong or
//! revoked key closes the socket with 4403, and a `graphql-transport-ws` client that breaks
//! the protocol's rules gets the protocol's close code (see `ws_gate`). Sockets are pinged,
//! and one whose peer has gone without closing is dropped.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_graphql::Data;
use async_graphql_axum::{GraphQLProtocol, GraphQLWebSocket};
use axum::extract::ws::rejection::WebSocketUpgradeRejection;
use axum::extract::ws::{close_code, CloseFrame, Message, WebSocket};
use axum::extract::{State, WebSocketUpgrade};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse as _, Response};
use futures_util::{SinkExt as _, StreamExt as _};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tokio_util::sync::{CancellationToken, PollSender};

use super::ws_auth::PayloadKey;
use super::ws_close::{fitted, refusal, ClientEnd};
use super::ws_gate::{Admission, Gate};
use super::ws_protocol;
use super::HttpState;
use crate::auth::revocation::KeyInUse;
use crate::error::Error;
use crate::schema::{ApiError, CodedExecutor, RunningOperations};
use crate::state::AppState;

/// Once the key is found revoked, how long the session may take to send the errors that end
/// its subscriptions before the socket is closed. It reads nothing more from the client.
const REVOKED_FLUSH: Duration = Duration::from_millis(200);

/// Messages the GraphQL session may queue ahead of the socket.
const OUTGOING_BUFFER: usize = 16;

/// The close code `graphql-transport-ws` gives a missing, wrong or revoked key (used for the
/// legacy protocol too, after its `connection_error`).
const FORBIDDEN: u16 = 4403;

/// An operation started before `connection_init` was accepted.
const UNAUTHORIZED: u16 = 4401;

/// The close code `graphql-transport-ws` gives a socket that sent no accepted
/// `connection_init` within the init timeout (used for the legacy protocol too).
const INIT_TIMEOUT: u16 = 4408;

/// Upgrades to a GraphQL WebSocket session; it ends when the client leaves, the key is
/// revoked or the process shuts down.
pub async fn upgrade(
    State(state): State<HttpState>,
    headers: HeaderMap,
    upgrade: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> Response {
    let upgrade = match upgrade {
        Ok(upgrade) => upgrade,
        // `HEAD`, which the `GET` route takes too, is answered as a `GET` that asks for no
        // upgrade is (RFC 9110, section 9.3.2), not refused as a method the route does not
        // allow: its `405`s name `GET` and `HEAD`.
        Err(WebSocketUpgradeRejection::MethodNotGet(_)) => {
            return (
                StatusCode::BAD_REQUEST,
                "Connection header did not include 'upgrade'",
            )
                .into_response();
        }
        Err(rejection) => return rejection.into_response(),
    };
    let Some((chosen, protocol)) = ws_protocol::chosen(&headers).await else {
        return (
            StatusCode::BAD_REQUEST,
            "a GraphQL WebSocket needs a subprotocol Courier speaks: send \
             Sec-WebSocket-Protocol: graphql-transport-ws (or the legacy graphql-ws)\n",
        )
            .into_response();
    };
    // Clients that can set headers on the upgrade request may authenticate there;
    // `connection_init` takes precedence.
    let upgrade_authorization = super::authorization(&headers).map(str::to_owned);
    // A message may be as large as a request body over HTTP, and no larger.
    let largest = state.app.config.max_body_bytes;
    upgrade
        .protocols([chosen])
        .max_message_size(largest)
        .max_frame_size(largest)
        .on_upgrade(move |socket| {
            Session {
                state,
                protocol,
                protocol_name: chosen,
                upgrade_authorization,
            }
            .serve(socket)
        })
}

/// What `connection_init` settled.
enum Init {
    /// Authenticated: the session holds its key until it ends.
    Accepted(KeyInUse),
    /// Refused: the socket closes with this frame.
    Refused(CloseFrame),
}

/// Where a session stands, as seen by the pump between it and the socket.
enum Phase {
    /// No `connection_init` accepted yet.
    AwaitingInit,
    /// The session ended before `connection_init` settled.
    Abandoned,
    /// `connection_init` was refused.
    Refused(CloseFrame),
    /// Authenticated under this key.
    Active(KeyInUse),
    /// The key was revoked: the subscriptions' last errors go out until `until`. The key is
    /// still held, so an operation that slipped in ends at once too.
    Revoked { _key: KeyInUse, until: Instant },
}

impl Phase {
    /// Resolves when the session's key is found revoked.
    async fn revoked(&self) {
        match self {
            Phase::Active(key) => key.revoked().await,
            _ => std::future::pending().await,
        }
    }

    /// Resolves when a revoked session must close.
    async fn flushed(&self) {
        match self {
            Phase::Revoked { until, .. } => tokio::time::sleep_until(*until).await,
            _ => std::future::pending().await,
        }
    }
}

/// How long the last message and the close frame may take to go out.
const FAREWELL_WITHIN: Duration = Duration::from_secs(1);

/// How the socket ends.
enum Ending {
    /// With this close frame, after an optional last text message.
    Close(Option<String>, CloseFrame),
    /// Without a close frame of ours (the client left), for this reason.
    Drop(&'static str),
    /// The client ended it: with its close frame (answered by the socket itself), or
    /// without one (told as 1005, or 1006 when the connection broke).
    Left(CloseFrame),
}

/// One WebSocket session, before it starts.
struct Session {
    state: HttpState,
    protocol: GraphQLProtocol,
    /// The subprotocol it speaks, by name.
    protocol_name: &'static str,
    /// The `Authorization` header of the upgrade request, if any.
    upgrade_authorization: Option<String>,
}

impl Session {
    /// Whether the session speaks the legacy `graphql-ws`.
    fn legacy(&self) -> bool {
        self.protocol_name == ws_protocol::LEGACY
    }

    /// Runs the GraphQL session over `socket`. Everything it sends passes through a pump
    /// that can rewrite its close frame (a refused `connection_init` closes with 4403, not
    /// async-graphql's 1002) and close the socket itself when the key is revoked.
    async fn serve(self, socket: WebSocket) {
        let protocol = self.protocol_name;
        let opened = Instant::now();
        tracing::info!(protocol, "WebSocket opened");
        let ping_every = Duration::from_millis(self.state.app.config.ws_ping_ms);
        // A peer that sends nothing back (not even a pong) for this long, or does not take
        // what is sent to it for as long, is gone: it is dropped.
        let gone_after = ping_every.saturating_mul(2);
        // When the client was last heard from, in milliseconds since `opened`.
        let heard = Arc::new(AtomicU64::new(0));
        let hearing = heard.clone();
        let (mut outgoing, incoming) = socket.split();
        // After a revocation the client is heard no more; the session only finishes sending.
        let deaf = CancellationToken::new();
        // The rules the session does not enforce (see `ws_gate`).
        let operations = RunningOperations::default();
        let (gate, mut violation) = Gate::new(self.legacy(), operations.clone());
        let rules = gate.clone();
        let client_end = Arc::new(Mutex::new(ClientEnd::Open));
        let ended_by_client = client_end.clone();
        let (to_client, mut from_session) = mpsc::channel(OUTGOING_BUFFER);
        // The gate's own answers go out as the session's do, in turn with them.
        let answers = to_client.clone();
        let incoming = incoming
            .filter(move |message| {
                hearing.store(millis_since(opened), Ordering::Relaxed);
                let refused = message.as_ref().err().and_then(refusal);
                match message {
                    Ok(Message::Close(frame)) => {
                        let mut end = ended_by_client
                            .lock()
                            .unwrap_or_else(PoisonError::into_inner);
                        *end = ClientEnd::Closed(frame.clone());
                    }
                    Err(_) if refused.is_none() => {
                        let mut end = ended_by_client
                            .lock()
                            .unwrap_or_else(PoisonError::into_inner);
                        *end = ClientEnd::Broken;
                    }
                    _ => {}
                }
                let admission = match (message, refused) {
                    (Ok(message), _) => rules.admit(message),
                    (Err(_), Some(close)) => {
                        rules.refuse(close);
                        Admission::Hold
                    }
                    (Err(_), None) => Admission::Read,
                };
                let answers = answers.clone();
                async move {
                    match admission {
                        Admission::Read => true,
                        Admission::Hold => false,
                        Admission::Answer(answer) => {
                            // Only gone with the session itself.
                            let _ = answers.send(answer).await;
                            false
                        }
                    }
                }
            })
            .take_until(deaf.clone().cancelled_owned())
            .chain(after_input(deaf.clone()));
        let (init_settled, mut init) = oneshot::channel();
        let app = self.state.app.clone();
        let upgrade_authorization = self.upgrade_authorization.clone();
        let session = GraphQLWebSocket::new_with_pair(
            PollSender::new(to_client),
            incoming,
            CodedExecutor {
                schema: self.state.schema.clone(),
                db: self.state.app.db.clone(),
            },
            self.protocol,
        )
        .on_connection_init(move |payload| {
            connection_init(
                app,
                payload,
                upgrade_authorization,
                operations,
                init_settled,
            )
        })
        .serve();
        tokio::pin!(session);
        let init_timeout = Duration::from_millis(self.state.app.config.ws_init_timeout_ms);
        let init_deadline = tokio::time::sleep(init_timeout);
        tokio::pin!(init_deadline);
        let shutdown = self.state.app.shutdown.clone();
        let mut phase = Phase::AwaitingInit;
        let mut session_running = true;
        let mut ping = tokio::time::interval_at(opened + ping_every, ping_every);
        ping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);

        let ending = loop {
            let awaiting_init = matches!(phase, Phase::AwaitingInit);
            tokio::select! {
                // Settle the init before reading what the session sent after it.
                biased;
                // 1001 Going Away: a client tells a shutdown from a network failure, and
                // may reconnect to another process at once.
                () = shutdown.cancelled() => break Ending::Close(None, CloseFrame {
                    code: close_code::AWAY,
                    reason: "the server is shutting down".into(),
                }),
                Ok(close) = &mut violation => break Ending::Close(None, close),
                settled = &mut init, if awaiting_init => {
                    // The session read nothing while the key was checked: the client counts
                    // as heard from now, not from its `connection_init`.
                    heard.store(millis_since(opened), Ordering::Relaxed);
                    phase = match settled {
                        Ok(Init::Accepted(key)) => Phase::Active(key),
                        Ok(Init::Refused(close)) => Phase::Refused(close),
                        Err(_) => Phase::Abandoned,
                    };
                }
                () = phase.revoked() => {
                    deaf.cancel();
                    if let Phase::Active(key) = std::mem::replace(&mut phase, Phase::Abandoned) {
                        let until = Instant::now() + REVOKED_FLUSH;
                        phase = Phase::Revoked { _key: key, until };
                    }
                }
                () = phase.flushed() => break self.revoked_ending(),
                () = &mut init_deadline, if awaiting_init => {
                    break Ending::Close(None, CloseFrame {
                        code: INIT_TIMEOUT,
                        reason: "Connection initialisation timeout".into(),
                    });
                }
                () = &mut session, if session_running => session_running = false,
                _ = ping.tick() => {
                    let last_heard = Duration::from_millis(heard.load(Ordering::Relaxed));
                    // Until the init settles, the session reads nothing (not even pongs)
                    // while it checks the key; the init's own deadline bounds that wait.
                    if !awaiting_init && opened.elapsed().saturating_sub(last_heard) >= gone_after {
                        break Ending::Drop("the client stopped answering pings");
                    }
                    let pinged = outgoing.send(Message::Ping(axum::body::Bytes::new()));
                    match tokio::time::timeout(gone_after, pinged).await {
                        Ok(Ok(())) => {}
                        Ok(Err(_)) => break Ending::Drop("the client went away"),
                        Err(_) => break Ending::Drop("the client stopped reading"),
                    }
                }
                message = from_session.recv() => match (message, &phase) {
                    (Some(Message::Close(_)), Phase::Refused(close)) => {
                        break Ending::Close(None, close.clone());
                    }
                    (Some(Message::Close(frame)), _) => {
                        let frame = self.spoken(frame).map(fitted);
                        let _ = outgoing.send(Message::Close(frame)).await;
                        break Ending::Drop("closed by the session");
                    }
                    (Some(message), _) => {
                        let Some(message) = gate.relay(message) else { continue };
                        match tokio::time::timeout(gone_after, outgoing.send(message)).await {
                            Ok(Ok(())) => {}
                            Ok(Err(_)) => break Ending::Drop("the client went away"),
                            Err(_) => break Ending::Drop("the client stopped reading"),
                        }
                    }
                    // The session is over and everything it sent is out.
                    (None, Phase::Refused(close)) => break Ending::Close(None, close.clone()),
                    (None, Phase::Revoked { .. }) => break self.revoked_ending(),
                    // Ended by the client: its close frame, a broken connection, or the
                    // legacy `connection_terminate` (a normal close, not a dropped one).
                    (None, _) => {
                        let end = std::mem::take(
                            &mut *client_end.lock().unwrap_or_else(PoisonError::into_inner),
                        );
                        break end.frame().map(Ending::Left).unwrap_or_else(|| Ending::Close(None, CloseFrame {
                            code: close_code::NORMAL,
                            reason: "Normal Closure".into(),
                        }));
                    }
                },
            }
        };
        let duration_ms = opened.elapsed().as_millis();
        match ending {
            Ending::Close(last, close) => {
                tracing::info!(protocol, code = close.code, reason = %close.reason, duration_ms, "WebSocket closed");
                // A client that reads nothing must not hold the socket (or a shutdown) open.
                let farewell = async {
                    if let Some(last) = last {
                        let _ = outgoing.send(Message::Text(last.into())).await;
                    }
                    let _ = outgoing.send(Message::Close(Some(fitted(close)))).await;
                };
                let _ = tokio::time::timeout(FAREWELL_WITHIN, farewell).await;
            }
            Ending::Drop(reason) => {
                tracing::info!(protocol, reason, duration_ms, "WebSocket closed");
            }
            Ending::Left(close) => {
                tracing::info!(protocol, code = close.code, reason = %close.reason, duration_ms,
                    by = "client", "WebSocket closed");
            }
        }
    }

    /// The session's own close frame in this session's protocol: async-graphql closes a
    /// message it cannot read with 1002, which `graphql-transport-ws` spells 4400; and an
    /// operation started before `connection_init` (which only the legacy protocol lets
    /// reach it) with 1011, an internal error's code, where the client's mistake gets
    /// 4401 Unauthorized, as on `graphql-transport-ws`.
    fn spoken(&self, frame: Option<CloseFrame>) -> Option<CloseFrame> {
        frame.map(|frame| match frame.code {
            close_code::PROTOCOL if !self.legacy() => CloseFrame {
                code: 4400,
                reason: frame.reason,
            },
            close_code::ERROR if frame.reason.starts_with("The handshake is not completed") => {
                CloseFrame {
                    code: UNAUTHORIZED,
                    reason: "Unauthorized".into(),
                }
            }
            _ => frame,
        })
    }

    /// How a session whose key was revoked ends: the legacy protocol first gets a
    /// `connection_error` saying why; both get 4403.
    fn revoked_ending(&self) -> Ending {
        let reason = Error::KeyRevoked.to_string();
        let last = self.legacy().then(|| {
            serde_json::json!({ "type": "connection_error", "payload": { "message": reason } })
                .to_string()
        });
        Ending::Close(
            last,
            CloseFrame {
                code: FORBIDDEN,
                reason: format!("Forbidden: {reason}").into(),
            },
        )
    }
}

/// Milliseconds from `start` to now.
fn millis_since(start: Instant) -> u64 {
    u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// Authenticates `connection_init` and tells the pump how it went. A missing, wrong or
/// revoked key is refused with 4403; a key that could not be checked (the database did
/// not answer) with 1011, which invites a retry. The connection's data holds the caller
/// and the count of its running `operations`, whose streams give their places back.
async fn connection_init(
    app: AppState,
    payload: serde_json::Value,
    upgrade_authorization: Option<String>,
    operations: RunningOperations,
    settled: oneshot::Sender<Init>,
) -> async_graphql::Result<Data> {
    let authorization = match super::ws_auth::authorization_of(&payload) {
        PayloadKey::Given(authorization) => Some(authorization),
        PayloadKey::Absent => upgrade_authorization,
        // Refused like a wrong key, whatever the upgrade request carried.
        PayloadKey::Malformed => None,
    };
    let lookup = app.keys.authenticate(&app.db, authorization.as_deref());
    match app.db.within_deadline(lookup).await {
        Ok(identity) => {
            let _ = settled.send(Init::Accepted(
                app.revocations
                    .register(identity.key_id, identity.expires_at),
            ));
            let mut data = Data::default();
            data.insert(identity);
            data.insert(operations);
            Ok(data)
        }
        Err(err) => {
            let close = match err {
                Error::Unauthenticated | Error::KeyRevoked => CloseFrame {
                    code: FORBIDDEN,
                    reason: "Forbidden".into(),
                },
                Error::Unavailable(_) => CloseFrame {
                    code: close_code::AGAIN,
                    reason: "database unavailable; try again later".into(),
                },
                _ => CloseFrame {
                    code: close_code::ERROR,
                    reason: "internal error".into(),
                },
            };
            let _ = settled.send(Init::Refused(close));
            Err(ApiError::from(err).into())
        }
    }
}

/// What the session reads once the client's messages stop: nothing more, ever, when they
/// stopped because the key was revoked (the session only finishes sending); the end, when
/// the client closed its side, so the session and its subscriptions end with it (a peer
/// that left without a close frame is not kept, and counted, until an event happens to
/// need its socket).
fn after_input(
    deaf: CancellationToken,
) -> impl futures_util::Stream<Item = Result<Message, axum::Error>> {
    futures_util::stream::poll_fn(move |_| {
        if deaf.is_cancelled() {
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(None)
        }
    })
}
