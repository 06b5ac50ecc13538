//! The `graphql-transport-ws` rules async-graphql's session does not enforce, checked on
//! each client message before the session reads it: a message that is not a known one is
//! closed with 4400, a `subscribe` before `connection_init` with 4401 (one sent right
//! after `connection_init`, before its `connection_ack`, waits for the init to settle, as
//! async-graphql has always let it; a refused init closes with 4403), and a `subscribe`
//! reusing the id of a subscription still running with 4409. The legacy `graphql-ws`
//! protocol has no such rules and passes untouched.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, PoisonError};

use axum::extract::ws::{CloseFrame, Message};
use tokio::sync::oneshot;

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
}

/// The rules of one session: [`Gate::admit`] checks what the client sends,
/// [`Gate::sent`] notes what the session sends.
#[derive(Debug, Clone)]
pub struct Gate {
    seen: Arc<Mutex<Seen>>,
    violation: Arc<Mutex<Option<oneshot::Sender<CloseFrame>>>>,
}

impl Gate {
    /// A gate, and where the close frame of the first broken rule arrives.
    pub fn new() -> (Gate, oneshot::Receiver<CloseFrame>) {
        let (tell, told) = oneshot::channel();
        let gate = Gate {
            seen: Arc::default(),
            violation: Arc::new(Mutex::new(Some(tell))),
        };
        (gate, told)
    }

    /// Whether the session may read `message`. A message that breaks a rule is held back
    /// (and every one after it: the socket is closing), and its close frame is sent once.
    pub fn admit(&self, message: &Message) -> bool {
        let Message::Text(text) = message else {
            return true;
        };
        match self.check(text) {
            Ok(()) => true,
            Err(close) => {
                let tell = self
                    .violation
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .take();
                if let Some(tell) = tell {
                    let _ = tell.send(close);
                }
                false
            }
        }
    }

    /// Notes what the session sent: a subscription ended.
    pub fn sent(&self, message: &Message) {
        let Message::Text(text) = message else {
            return;
        };
        // Every server message starts with its type (async-graphql serialises the tag
        // first), so the many `next` messages cost a prefix check, not a parse.
        let text = text.as_str();
        if text.starts_with(r#"{"type":"complete""#) || text.starts_with(r#"{"type":"error""#) {
            let id = serde_json::from_str::<serde_json::Value>(text)
                .ok()
                .and_then(|value| {
                    value
                        .get("id")
                        .and_then(|id| id.as_str())
                        .map(str::to_owned)
                });
            if let Some(id) = id {
                self.seen().running.remove(&id);
            }
        }
    }

    fn seen(&self) -> std::sync::MutexGuard<'_, Seen> {
        self.seen.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn check(&self, text: &str) -> Result<(), CloseFrame> {
        let invalid = |why: &str| CloseFrame {
            code: INVALID_MESSAGE,
            reason: format!("Invalid message received: {why}").into(),
        };
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
        match kind {
            "connection_init" => {
                self.seen().initialised = true;
                Ok(())
            }
            "ping" | "pong" => Ok(()),
            "subscribe" => {
                let id = id()?;
                if value.get("payload").is_none_or(|p| !p.is_object()) {
                    return Err(invalid("no payload"));
                }
                let mut seen = self.seen();
                if !seen.initialised {
                    return Err(CloseFrame {
                        code: UNAUTHORIZED,
                        reason: "Unauthorized".into(),
                    });
                }
                if !seen.running.insert(id.to_owned()) {
                    return Err(CloseFrame {
                        code: SUBSCRIBER_EXISTS,
                        reason: format!("Subscriber for {id} already exists").into(),
                    });
                }
                Ok(())
            }
            "complete" => {
                let id = id()?;
                self.seen().running.remove(id);
                Ok(())
            }
            _ => Err(invalid("unknown type")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(value: serde_json::Value) -> Message {
        Message::Text(value.to_string().into())
    }

    fn subscribe(id: &str) -> Message {
        text(serde_json::json!({
            "type": "subscribe", "id": id, "payload": { "query": "subscription { x }" }
        }))
    }

    fn init() -> Message {
        text(serde_json::json!({ "type": "connection_init" }))
    }

    #[test]
    fn each_rule_closes_with_its_code() {
        let (gate, mut told) = Gate::new();
        assert!(!gate.admit(&subscribe("1")), "before connection_init");
        assert_eq!(told.try_recv().map(|close| close.code).ok(), Some(4401));

        // Sent right behind connection_init, before its ack: it waits for the init.
        let (gate, mut told) = Gate::new();
        assert!(gate.admit(&init()));
        assert!(gate.admit(&subscribe("1")));
        assert!(!gate.admit(&subscribe("1")), "the same id while it runs");
        assert_eq!(told.try_recv().map(|close| close.code).ok(), Some(4409));

        for garbage in ["{", "[]", r#"{"type":"launch"}"#, r#"{"type":"subscribe"}"#] {
            let (gate, mut told) = Gate::new();
            assert!(!gate.admit(&Message::Text(garbage.into())), "{garbage}");
            assert_eq!(told.try_recv().map(|close| close.code).ok(), Some(4400));
        }
    }

    #[test]
    fn an_id_is_free_again_once_its_subscription_ended() {
        let (gate, mut told) = Gate::new();
        assert!(gate.admit(&init()));
        assert!(gate.admit(&subscribe("a")));
        // As async-graphql writes them: the type first.
        gate.sent(&Message::Text(r#"{"type":"complete","id":"a"}"#.into()));
        assert!(gate.admit(&subscribe("a")), "ended by the server");
        assert!(gate.admit(&text(serde_json::json!({ "type": "complete", "id": "a" }))));
        assert!(gate.admit(&subscribe("a")), "ended by the client");
        gate.sent(&Message::Text(
            r#"{"type":"error","id":"a","payload":[]}"#.into(),
        ));
        assert!(gate.admit(&subscribe("a")), "ended in an error");
        assert!(told.try_recv().is_err(), "no rule was broken");
    }
}
