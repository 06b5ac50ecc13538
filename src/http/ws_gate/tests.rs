//! The rules of [`super::Gate`], message by message.

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
    let (gate, mut told) = Gate::new(false, RunningOperations::default());
    assert!(!gate.admits(&subscribe("1")), "before connection_init");
    assert_eq!(told.try_recv().map(|close| close.code).ok(), Some(4401));

    // Sent right behind connection_init, before its ack: it waits for the init.
    let (gate, mut told) = Gate::new(false, RunningOperations::default());
    assert!(gate.admits(&init()));
    assert!(gate.admits(&subscribe("1")));
    assert!(!gate.admits(&subscribe("1")), "the same id while it runs");
    assert_eq!(told.try_recv().map(|close| close.code).ok(), Some(4409));

    for garbage in ["{", "[]", r#"{"type":"launch"}"#, r#"{"type":"subscribe"}"#] {
        let (gate, mut told) = Gate::new(false, RunningOperations::default());
        assert!(!gate.admits(&Message::Text(garbage.into())), "{garbage}");
        assert_eq!(told.try_recv().map(|close| close.code).ok(), Some(4400));
    }
}

#[test]
fn the_legacy_protocol_takes_only_its_own_messages() {
    for message in [
        r#"{"type":"connection_init","payload":{}}"#,
        r#"{"type":"start","id":"1","payload":{"query":"subscription { x }"}}"#,
        r#"{"type":"stop","id":"1"}"#,
        r#"{"type":"connection_terminate"}"#,
    ] {
        let (gate, _told) = Gate::new(true, RunningOperations::default());
        assert!(gate.admits(&Message::Text(message.into())), "{message}");
    }
    for garbage in [
        "not json",
        r#"{"type":"wat"}"#,
        r#"{"type":"subscribe","id":"1","payload":{"query":"subscription { x }"}}"#,
        r#"{"id":"1","type":"start"}"#,
        r#"{"type":"start","payload":{"query":"subscription { x }"}}"#,
        r#"{"type":"stop"}"#,
        r#"{"type":"start","id":"1","payload":{"query":"{ x }","variables":5}}"#,
        r#"{"type":"start","id":"1","payload":{"query":"{ x }","operationName":5}}"#,
        r#"{"type":"start","id":"1","payload":{"query":"{ x }","extensions":[1]}}"#,
    ] {
        let (gate, mut told) = Gate::new(true, RunningOperations::default());
        assert!(!gate.admits(&Message::Text(garbage.into())), "{garbage}");
        assert_eq!(told.try_recv().map(|close| close.code).ok(), Some(4400));
    }
}

#[test]
fn a_member_named_twice_closes_on_both_protocols() {
    let twice = r#"{"type":"connection_init","payload":{"Authorization":"Bearer a","Authorization":"Bearer b"}}"#;
    for legacy in [false, true] {
        let (gate, mut told) = Gate::new(legacy, RunningOperations::default());
        assert!(
            !gate.admits(&Message::Text(twice.into())),
            "legacy: {legacy}"
        );
        assert_eq!(told.try_recv().map(|close| close.code).ok(), Some(4400));
        let (gate, mut told) = Gate::new(legacy, RunningOperations::default());
        assert!(!gate.admits(&Message::Binary(twice.as_bytes().to_vec().into())));
        assert_eq!(told.try_recv().map(|close| close.code).ok(), Some(4400));
        let (gate, _told) = Gate::new(legacy, RunningOperations::default());
        assert!(gate.admits(&init()), "legacy: {legacy}");
    }
}

#[test]
fn an_id_is_free_again_once_its_subscription_ended() {
    let (gate, mut told) = Gate::new(false, RunningOperations::default());
    assert!(gate.admits(&init()));
    assert!(gate.admits(&subscribe("a")));
    // As async-graphql writes them: the type first.
    let complete = Message::Text(r#"{"type":"complete","id":"a"}"#.into());
    assert!(gate.relay(complete).is_some());
    assert!(gate.admits(&subscribe("a")), "ended by the server");
    assert!(gate.admits(&text(serde_json::json!({ "type": "complete", "id": "a" }))));
    assert!(gate.admits(&subscribe("a")), "ended by the client");
    let error = Message::Text(r#"{"type":"error","id":"a","payload":[]}"#.into());
    assert!(gate.relay(error).is_some());
    assert!(gate.admits(&subscribe("a")), "ended in an error");
    assert!(told.try_recv().is_err(), "no rule was broken");
}

#[test]
fn an_operation_the_client_completed_gets_no_complete_back() {
    let (gate, _told) = Gate::new(false, RunningOperations::default());
    assert!(gate.admits(&init()));
    assert!(gate.admits(&subscribe("s")));
    assert!(gate.admits(&text(serde_json::json!({ "type": "complete", "id": "s" }))));
    // The id is reused at once; the session's echo for the old one is not sent.
    assert!(gate.admits(&subscribe("s")));
    assert_eq!(relayed(&gate, r#"{"type":"complete","id":"s"}"#), None);
    assert_eq!(
        relayed(
            &gate,
            r#"{"type":"next","id":"s","payload":{"data":{"x":1}}}"#
        )
        .map(|m| m["type"].clone()),
        Some("next".into())
    );
    // The new one's own end is sent.
    assert_eq!(
        relayed(&gate, r#"{"type":"complete","id":"s"}"#).map(|m| m["type"].clone()),
        Some("complete".into())
    );
    // Completed by the client again, while running under the reused id: its echo is
    // held back too, and the id is running until the client completes it.
    assert!(gate.admits(&subscribe("t")));
    assert!(gate.admits(&text(serde_json::json!({ "type": "complete", "id": "t" }))));
    assert!(gate.admits(&subscribe("t")));
    assert_eq!(relayed(&gate, r#"{"type":"complete","id":"t"}"#), None);
    assert!(gate.admits(&text(serde_json::json!({ "type": "complete", "id": "t" }))));
    assert_eq!(
        relayed(&gate, r#"{"type":"complete","id":"t"}"#),
        None,
        "no stray complete"
    );
    // A complete for what already ended is no echo to hold back.
    assert!(gate.admits(&text(serde_json::json!({ "type": "complete", "id": "s" }))));
    assert!(gate.admits(&subscribe("s")));
    assert_eq!(
        relayed(&gate, r#"{"type":"complete","id":"s"}"#).map(|m| m["type"].clone()),
        Some("complete".into())
    );
}

fn relayed(gate: &Gate, message: &str) -> Option<serde_json::Value> {
    let out = gate.relay(Message::Text(message.to_owned().into()))?;
    let Message::Text(text) = out else {
        panic!("text in, text out");
    };
    serde_json::from_str(text.as_str()).ok()
}

#[test]
fn a_next_messages_id_is_read_from_its_head() {
    let text = r#"{"type":"next","id":"a\"b","payload":{"data":{"x":[1,2]}}}"#;
    let head = r#"{"type":"next","id":"#;
    assert_eq!(result_id(text, head).as_deref(), Some("a\"b"));
    assert_eq!(result_id(r#"{"type":"complete","id":"a"}"#, head), None);
}

#[test]
fn a_refusal_before_execution_is_an_error_message() {
    let (gate, _told) = Gate::new(false, RunningOperations::default());
    assert!(gate.admits(&init()));
    assert!(gate.admits(&subscribe("v")));
    let refused = relayed(
        &gate,
        r#"{"type":"next","id":"v","payload":{"data":null,"errors":[{"message":"Unknown field","locations":[{"line":1,"column":16}]}]}}"#,
    );
    assert_eq!(
        refused,
        Some(serde_json::json!({ "type": "error", "id": "v",
            "payload": [{ "message": "Unknown field", "locations": [{ "line": 1, "column": 16 }] }] }))
    );
    assert_eq!(
        relayed(&gate, r#"{"type":"complete","id":"v"}"#),
        None,
        "no complete after an error"
    );
    assert!(gate.admits(&subscribe("v")), "the id is free again");

    // The legacy protocol's `data` and `complete` become its `error` too.
    let (gate, _told) = Gate::new(true, RunningOperations::default());
    let refused = relayed(
        &gate,
        r#"{"type":"data","id":"v","payload":{"errors":[{"message":"Unknown field"}]}}"#,
    );
    assert_eq!(
        refused,
        Some(serde_json::json!({ "type": "error", "id": "v",
            "payload": [{ "message": "Unknown field" }] }))
    );
    assert_eq!(relayed(&gate, r#"{"type":"complete","id":"v"}"#), None);

    // Errors raised while running (with a path), and data, stay `next` messages.
    for answer in [
        r#"{"type":"next","id":"v","payload":{"data":null,"errors":[{"message":"boom","path":["x"]}]}}"#,
        r#"{"type":"next","id":"v","payload":{"data":{"x":1}}}"#,
    ] {
        let (gate, _told) = Gate::new(false, RunningOperations::default());
        assert!(gate.admits(&init()));
        assert!(gate.admits(&subscribe("v")));
        assert_eq!(
            relayed(&gate, answer).map(|m| m["type"].clone()),
            Some("next".into())
        );
        assert_eq!(
            relayed(&gate, r#"{"type":"complete","id":"v"}"#).map(|m| m["type"].clone()),
            Some("complete".into())
        );
    }
}

#[test]
fn operations_past_the_most_are_answered_in_the_order_sent() {
    let answered = |admission: Admission, id: &str| match admission {
        Admission::Answer(Message::Text(text)) => {
            assert!(text.starts_with(r#"{"type":"error","#), "{text}");
            let answer: serde_json::Value = serde_json::from_str(&text).expect("JSON");
            assert_eq!(answer["id"], id, "{answer}");
            assert_eq!(answer["payload"][0]["extensions"]["code"], "BAD_USER_INPUT");
        }
        other => panic!("{id}: {other:?}"),
    };
    for legacy in [false, true] {
        let start = |id: &str| {
            let kind = if legacy { "start" } else { "subscribe" };
            text(serde_json::json!({
                "type": kind, "id": id, "payload": { "query": "subscription { x }" }
            }))
        };
        let operations = RunningOperations::default();
        let (gate, _told) = Gate::new(legacy, operations.clone());
        assert!(gate.admits(&init()));
        // Each admitted operation's stream holds its place, as the executor's do.
        let mut places = Vec::new();
        for n in 0..MAX_SUBSCRIPTIONS_PER_CONNECTION {
            assert!(gate.admits(&start(&n.to_string())), "{legacy} {n}");
            places.push(operations.held_until_dropped());
        }
        answered(gate.admit(&start("over")), "over");
        answered(gate.admit(&start("over again")), "over again");
        assert_eq!(operations.running(), MAX_SUBSCRIPTIONS_PER_CONNECTION);
        // A stream dropped, however its operation ended, frees its place.
        places.pop();
        assert!(gate.admits(&start("next")), "{legacy}");
        answered(gate.admit(&start("over")), "over");
    }
}

#[test]
fn an_id_completed_and_reused_stays_counted_and_its_echoes_are_held_back() {
    let (gate, mut told) = Gate::new(false, RunningOperations::default());
    assert!(gate.admits(&init()));
    let complete = || text(serde_json::json!({ "type": "complete", "id": "a" }));
    assert!(gate.admits(&subscribe("a")));
    assert!(gate.admits(&complete()));
    assert!(gate.admits(&subscribe("a")));
    assert!(gate.admits(&complete()));
    assert!(gate.admits(&subscribe("a")));
    // The session echoes both completes, in order, as the session writes them.
    let echo = || Message::Text(r#"{"type":"complete","id":"a"}"#.into());
    assert!(gate.relay(echo()).is_none(), "the first echo");
    assert!(gate.relay(echo()).is_none(), "the second echo");
    // The third `a` runs on: another with its id is refused.
    assert!(!gate.admits(&subscribe("a")));
    assert_eq!(told.try_recv().map(|close| close.code).ok(), Some(4409));
}
