//! The `graphql-transport-ws` rules async-graphql's session does not enforce, checked on
//! each client message before the session reads it: a message that is not a known one is
//! closed with 4400 (a `subscribe` without an id or a query too), a `subscribe` before
//! `connection_init` with 4401 (one sent right
//! after `connection_init`, before its `connection_ack`, waits for the init to settle, as
//! async-graphql has always let it; a refused init closes with 4403), and a `subscribe`
//! reusing the id of a subscription still running with 4409. An operation refused before
//! it ran (a document that does not parse or validate, variables that do not fit) is
//! answered with the protocol's `error` message rather than async-graphql's `next` and
//! `complete`, on the legacy `graphql-ws` protocol too (its `data` and `complete` become
//! its `error`); and an operation the client completed gets no `complete` back. A message
//! naming a member twice in one object (two `Authorization` entries in `connection_init`,
//! say) is closed with 4400 on both protocols, as is, on the legacy protocol, a message that
//! is not one of its own (async-graphql closed it with 1002 and the parser's words); the
//! legacy protocol has none of the other rules. On both, a connection runs at most
//! [`MAX_SUBSCRIPTIONS_PER_CONNECTION`] operations at once ([`RunningOperations`], given
//! back as the session drops each one's stream): one started past them is answered with
//! an `error` (`BAD_USER_INPUT`) here, in the order the client sent them, and never
//! reaches the session.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};

use axum::extract::ws::{CloseFrame, Message};
use tokio::sync::oneshot;

use crate::schema::{RunningOperations, MAX_SUBSCRIPTIONS_PER_CONNECTION};

/// `graphql-transport-ws`: a message the server cannot understand.
const INVALID_MESSAGE: u16 = 4400;
/// `graphql-transport-ws`: a `subscribe` before the connection was initialised.
const UNAUTHORIZED: u16 = 4401;
/// `graphql-transport-ws`: a `subscribe` whose id is already running.
const SUBSCRIBER_EXISTS: u16 = 4409;

/// What the client and the session have said so far, as far as the rules need it.
#[derive(Debug, Default)]
struct Seen {
    /// Whether the client sent `connection_init`.
    initialised: bool,
    /// The ids of the subscriptions running.
    running: HashSet<String>,
    /// The ids of the running operations that have had a `next` message.
    answered: HashSet<String>,
    /// The ids of the operations answered with `error`, whose `complete` is not sent.
    refused: HashSet<String>,
    /// The ids of the operations the client completed while they ran, with how many
    /// times: the session echoes a `complete` for each, which is not sent ("no further
    /// events relevant to the original subscription"; a client reusing the id would take
    /// it for its new operation's end).
    stopped: HashMap<String, u32>,
}

/// What becomes of a client's message (see [`Gate::admit`]).
#[derive(Debug)]
pub enum Admission {
    /// The session reads it.
    Read,
    /// It is held back: it broke a rule, and the socket is closing.
    Hold,
    /// It is answered with this message, sent as the session's are, and not read: an
    /// operation past [`MAX_SUBSCRIPTIONS_PER_CONNECTION`].
    Answer(Message),
}

/// The rules of one session: [`Gate::admit`] checks what the client sends,
/// [`Gate::relay`] notes what the session sends.
#[derive(Debug, Clone)]
pub struct Gate {
    /// Whether the session speaks the legacy `graphql-ws` protocol.
    legacy: bool,
    /// How an operation's result message starts: `next` (`graphql-transport-ws`) or the
    /// legacy protocol's `data`.
    result_head: &'static str,
    seen: Arc<Mutex<Seen>>,
    violation: Arc<Mutex<Option<oneshot::Sender<CloseFrame>>>>,
    /// The operations the connection runs, counted where each starts.
    operations: RunningOperations,
}

impl Gate {
    /// A gate for a session in `graphql-transport-ws` (or, if `legacy`, `graphql-ws`) whose
    /// running operations `operations` counts, and where the close frame of the first
    /// broken rule arrives.
    pub fn new(
        legacy: bool,
        operations: RunningOperations,
    ) -> (Gate, oneshot::Receiver<CloseFrame>) {
        let (tell, told) = oneshot::channel();
        let gate = Gate {
            legacy,
            result_head: if legacy {
                r#"{"type":"data","id":"#
            } else {
                r#"{"type":"next","id":"#
            },
            seen: Arc::default(),
            violation: Arc::new(Mutex::new(Some(tell))),
            operations,
        };
        (gate, told)
    }

    /// Whether the session may read `message`. A message that breaks a rule is held back
    /// (and every one after it: the socket is closing), and its close frame is sent once;
    /// an operation past the connection's most is answered here.
    pub fn admit(&self, message: &Message) -> Admission {
        // The session reads a binary frame as it reads a text one: it is held to the same
        // rules (one that is not UTF-8 is no message).
        let text = match message {
            Message::Text(text) => text.as_str(),
            Message::Binary(bytes) => std::str::from_utf8(bytes).unwrap_or("\u{fffd}"),
            _ => return Admission::Read,
        };
        match self.check(text) {
            Ok(Some(answer)) => Admission::Answer(answer),
            Ok(None) => Admission::Read,
            Err(close) => {
                self.refuse(close);
                Admission::Hold
            }
        }
    }

    /// Whether the session may read `message` (see [`Gate::admit`]).
    #[cfg(test)]
    fn admits(&self, message: &Message) -> bool {
        matches!(self.admit(message), Admission::Read)
    }

    /// Closes the socket with `close`, unless a rule broken earlier already did: for what
    /// the transport refused before any message reached the gate (one over the size limit).
    pub fn refuse(&self, close: CloseFrame) {
        let tell = self
            .violation
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(tell) = tell {
            let _ = tell.send(close);
        }
    }

    /// What of `message`, from the session, goes to the client, noting what it says: an
    /// operation's first `next` (legacy: `data`) carrying only errors without a path
    /// (raised before execution) becomes an `error` message, and that operation's
    /// `complete` is held back, as `graphql-transport-ws` says; a `complete` or `error`
    /// ends the operation.
    pub fn relay(&self, message: Message) -> Option<Message> {
        let Message::Text(text) = &message else {
            return Some(message);
        };
        // Every server message starts with its type (async-graphql serialises the tag
        // first), so a `next` past an operation's first costs a prefix check and a lookup.
        let text = text.as_str();
        if text.starts_with(self.result_head) {
            if result_id(text, self.result_head)
                .is_some_and(|id| self.seen().answered.contains(&id))
            {
                return Some(message);
            }
            let Ok(next) = serde_json::from_str::<Next>(text) else {
                return Some(message);
            };
            let mut seen = self.seen();
            if !seen.answered.insert(next.id.clone()) {
                return Some(message);
            }
            let Some(errors) = next.payload.refusal() else {
                return Some(message);
            };
            seen.running.remove(&next.id);
            seen.answered.remove(&next.id);
            seen.refused.insert(next.id.clone());
            let error = serde_json::json!({ "type": "error", "id": next.id, "payload": errors });
            return Some(Message::Text(error.to_string().into()));
        }
        if text.starts_with(r#"{"type":"complete""#) || text.starts_with(r#"{"type":"error""#) {
            let Ok(Ended { id }) = serde_json::from_str::<Ended>(text) else {
                return Some(message);
            };
            let mut seen = self.seen();
            // The echo of one of the client's own `complete`s: the operation it ended was
            // ended then, and one that reuses the id since is left running.
            if text.starts_with(r#"{"type":"complete""#) {
                if let Some(echoes) = seen.stopped.get_mut(&id) {
                    *echoes -= 1;
                    if *echoes == 0 {
                        seen.stopped.remove(&id);
                    }
                    return None;
                }
            }
            seen.running.remove(&id);
            seen.answered.remove(&id);
            if seen.refused.remove(&id) {
                return None;
            }
        }
        Some(message)
    }

    fn seen(&self) -> std::sync::MutexGuard<'_, Seen> {
        self.seen.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Checks `text` against the rules: `Ok` with the answer to send instead of reading it,
    /// if any; `Err` with the close frame of a rule it breaks.
    fn check(&self, text: &str) -> Result<Option<Message>, CloseFrame> {
        let invalid = |why: &str| CloseFrame {
            code: INVALID_MESSAGE,
            reason: format!("Invalid message received: {why}").into(),
        };
        if super::unique_members::first_repeated_member(text).is_some() {
            return Err(invalid("a member named twice in one object"));
        }
        let value: serde_json::Value =
            serde_json::from_str(text).map_err(|_| invalid("not JSON"))?;
        let kind = value
            .get("type")
            .and_then(|kind| kind.as_str())
            .ok_or_else(|| invalid("no type"))?;
        let id = || {
            value
                .get("id")
                .and_then(|id| id.as_str())
                .filter(|id| !id.is_empty())
                .ok_or_else(|| invalid("no id"))
        };
        let query = || {
            let Some(payload) = value.get("payload").filter(|p| p.is_object()) else {
                return Err(invalid("no payload"));
            };
            if !payload.get("query").is_some_and(|query| query.is_string()) {
                return Err(invalid("no query in the payload"));
            }
            // The request's other members, when given, of their types.
            let of_type = |member: &str, fits: fn(&serde_json::Value) -> bool| {
                payload
                    .get(member)
                    .is_none_or(|given| given.is_null() || fits(given))
            };
            if !of_type("variables", serde_json::Value::is_object)
                || !of_type("extensions", serde_json::Value::is_object)
                || !of_type("operationName", serde_json::Value::is_string)
            {
                return Err(invalid("a payload member of the wrong type"));
            }
            Ok(())
        };
        if self.legacy {
            // Its own messages, each whole; the session enforces its order. A `start`
            // reusing a running id replaces that operation, in the same slot.
            return match kind {
                "connection_init" | "connection_terminate" => Ok(None),
                "start" => {
                    let id = id()?;
                    query()?;
                    Ok(self.start(id))
                }
                "stop" => id().map(|_| None),
                _ => Err(invalid("unknown type")),
            };
        }
        match kind {
            "connection_init" => {
                self.seen().initialised = true;
                Ok(None)
            }
            "ping" | "pong" => Ok(None),
            "subscribe" => {
                let id = id()?;
                query()?;
                let mut seen = self.seen();
                if !seen.initialised {
                    return Err(CloseFrame {
                        code: UNAUTHORIZED,
                        reason: "Unauthorized".into(),
                    });
                }
                if seen.running.contains(id) {
                    return Err(CloseFrame {
                        code: SUBSCRIBER_EXISTS,
                        reason: format!("Subscriber for {id} already exists").into(),
                    });
                }
                let answer = self.start(id);
                if answer.is_none() {
                    seen.running.insert(id.to_owned());
                }
                Ok(answer)
            }
            "complete" => {
                let id = id()?;
                let mut seen = self.seen();
                if seen.running.remove(id) {
                    seen.answered.remove(id);
                    *seen.stopped.entry(id.to_owned()).or_default() += 1;
                }
                Ok(None)
            }
            _ => Err(invalid("unknown type")),
        }
    }

    /// Operation `id` takes a place among the connection's running operations, unless it
    /// runs its most already: then the `error` that answers it instead (its type first, as
    /// the session writes its own).
    fn start(&self, id: &str) -> Option<Message> {
        if self.operations.try_start() {
            return None;
        }
        let payload = serde_json::json!([{
            "message": format!(
                "at most {MAX_SUBSCRIPTIONS_PER_CONNECTION} subscriptions may run on one \
                 connection; complete one first"
            ),
            "extensions": { "code": "BAD_USER_INPUT" },
        }]);
        let id = serde_json::Value::from(id);
        Some(Message::Text(
            format!(r#"{{"type":"error","id":{id},"payload":{payload}}}"#).into(),
        ))
    }
}

/// The id of a result message as async-graphql writes it (`{"type":"next","id":"…",…`,
/// `head` being all before the id's value), read without reading its payload.
fn result_id(text: &str, head: &str) -> Option<String> {
    let rest = text.strip_prefix(head)?;
    serde::Deserialize::deserialize(&mut serde_json::Deserializer::from_str(rest)).ok()
}

/// A `next` (or `data`) message, as far as [`Gate::relay`] reads it.
#[derive(serde::Deserialize)]
struct Next {
    id: String,
    payload: Payload,
}

/// A `next` message's response.
#[derive(serde::Deserialize)]
struct Payload {
    #[serde(default)]
    data: Option<serde::de::IgnoredAny>,
    #[serde(default)]
    errors: Vec<serde_json::Value>,
}

impl Payload {
    /// The errors, if the response is a refusal before execution: no data, and no error
    /// that names a field's path (an execution error always does).
    fn refusal(self) -> Option<Vec<serde_json::Value>> {
        let before_execution = self.data.is_none()
            && !self.errors.is_empty()
            && self.errors.iter().all(|error| error.get("path").is_none());
        before_execution.then_some(self.errors)
    }
}

/// A `complete` or `error` message's id.
#[derive(serde::Deserialize)]
struct Ended {
    id: String,
}

#[cfg(test)]
mod tests;
