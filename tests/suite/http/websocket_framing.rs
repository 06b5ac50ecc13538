//! A WebSocket frame that breaks RFC 6455 is answered with a close frame naming why, as
//! section 7.4.1 asks, on both protocols: text that is not UTF-8 with 1007, an unmasked
//! frame, reserved bits set or an unknown opcode with 1002. Frames written by hand over
//! raw TCP, as no client library would send them.

use std::time::Duration;

use serde_json::json;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

use crate::support::{Backend, TestApp, TestDb};

/// Generous: this proves the server answers, never how fast.
const WITHIN: Duration = Duration::from_secs(10);

/// The mask every frame written here is sent with.
const MASK: [u8; 4] = [0x11, 0x22, 0x33, 0x44];

/// A frame with the first byte `head` (FIN, reserved bits, opcode) and `payload` (under 126
/// bytes), masked as a client must mask, or not.
fn frame(head: u8, payload: &[u8], masked: bool) -> Vec<u8> {
    assert!(payload.len() < 126);
    let mut frame = vec![head];
    if masked {
        frame.push(0x80 | payload.len() as u8);
        frame.extend_from_slice(&MASK);
        frame.extend(payload.iter().enumerate().map(|(i, b)| b ^ MASK[i % 4]));
    } else {
        frame.push(payload.len() as u8);
        frame.extend_from_slice(payload);
    }
    frame
}

/// Reads one whole frame from the server: its opcode and payload; `None` once the
/// connection is closed.
async fn read_frame(stream: &mut TcpStream) -> Option<(u8, Vec<u8>)> {
    let mut head = [0u8; 2];
    tokio::time::timeout(WITHIN, stream.read_exact(&mut head))
        .await
        .expect("a frame in time")
        .ok()?;
    let len = match head[1] & 0x7f {
        126 => {
            let mut len = [0u8; 2];
            stream.read_exact(&mut len).await.ok()?;
            u16::from_be_bytes(len) as usize
        }
        127 => {
            let mut len = [0u8; 8];
            stream.read_exact(&mut len).await.ok()?;
            u64::from_be_bytes(len) as usize
        }
        len => len as usize,
    };
    let mut payload = vec![0u8; len];
    stream.read_exact(&mut payload).await.ok()?;
    Some((head[0] & 0x0f, payload))
}

/// A socket on `protocol`, upgraded and initialised with `token` (frames written by hand).
async fn initialised(app: &TestApp, protocol: &str, token: &str) -> TcpStream {
    let mut stream = TcpStream::connect(app.addr).await.expect("connect");
    let upgrade = format!(
        "GET /graphql/ws HTTP/1.1\r\nhost: courier\r\nupgrade: websocket\r\n\
         connection: upgrade\r\nsec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
         sec-websocket-version: 13\r\nsec-websocket-protocol: {protocol}\r\n\r\n"
    );
    stream.write_all(upgrade.as_bytes()).await.expect("upgrade");
    let mut answer = Vec::new();
    while !answer.ends_with(b"\r\n\r\n") {
        let mut byte = [0u8; 1];
        tokio::time::timeout(WITHIN, stream.read_exact(&mut byte))
            .await
            .expect("an answer in time")
            .expect("the upgrade's answer");
        answer.push(byte[0]);
    }
    let answer = String::from_utf8_lossy(&answer).into_owned();
    assert!(answer.starts_with("HTTP/1.1 101"), "{answer}");
    let init = json!({ "type": "connection_init",
                       "payload": { "Authorization": format!("Bearer {token}") } });
    stream
        .write_all(&frame(0x81, init.to_string().as_bytes(), true))
        .await
        .expect("connection_init");
    let (opcode, ack) = read_frame(&mut stream).await.expect("an answer to init");
    assert_eq!(opcode, 1, "{protocol}");
    assert!(
        String::from_utf8_lossy(&ack).contains("connection_ack"),
        "{protocol}: {}",
        String::from_utf8_lossy(&ack)
    );
    stream
}

/// The code of the close frame the server sends before closing (frames before it skipped);
/// `None` if it closed without one.
async fn close_code(stream: &mut TcpStream) -> Option<u16> {
    while let Some((opcode, payload)) = read_frame(stream).await {
        if opcode == 8 {
            return payload
                .get(..2)
                .map(|code| u16::from_be_bytes([code[0], code[1]]));
        }
    }
    None
}

#[tokio::test]
async fn a_frame_breaking_the_protocol_is_answered_with_a_close_naming_why() {
    let db = TestDb::new(Backend::Sqlite).await;
    let app = TestApp::spawn(&db).await;
    let admin = app.admin_token().await;
    let ping = br#"{"type":"ping"}"#;
    let cases: [(&str, Vec<u8>, u16); 4] = [
        (
            "text that is not UTF-8",
            frame(0x81, b"{\"\xff\xfe\"}", true),
            1007,
        ),
        ("an unmasked frame", frame(0x81, ping, false), 1002),
        ("a reserved bit set", frame(0xc1, ping, true), 1002),
        ("an unknown opcode", frame(0x83, ping, true), 1002),
    ];
    for protocol in ["graphql-transport-ws", "graphql-ws"] {
        for (what, bad, code) in &cases {
            let mut stream = initialised(&app, protocol, &admin).await;
            stream.write_all(bad).await.expect("send the bad frame");
            assert_eq!(
                close_code(&mut stream).await,
                Some(*code),
                "{protocol}: {what}"
            );
        }
    }
    // The process serves the next client.
    initialised(&app, "graphql-transport-ws", &admin).await;
}
