//! What a WebSocket's closing looks like: a close frame's reason cut to what a control
//! frame carries, the close answering a message the transport refused, and how the
//! client ended its side.

use axum::extract::ws::{close_code, CloseFrame};

/// The close that answers a message the transport refused (RFC 6455 section 7.4.1): 1009
/// for one over `COURIER_MAX_BODY_BYTES`, 1007 for text that is not UTF-8, 1002 for a frame
/// that breaks the protocol (unmasked, reserved bits set, an unknown opcode, a stray
/// continuation, a fragmented or oversized control frame). `None` when the connection
/// itself broke, when nothing can be sent.
pub(super) fn refusal(err: &axum::Error) -> Option<CloseFrame> {
    use tokio_tungstenite::tungstenite::error::{CapacityError, Error as WsError, ProtocolError};
    let err = std::error::Error::source(err)?.downcast_ref::<WsError>()?;
    let (code, reason) = match err {
        WsError::Capacity(CapacityError::MessageTooLong { .. }) => {
            (close_code::SIZE, "Message Too Big")
        }
        WsError::Utf8(_) => (close_code::INVALID, "Invalid frame payload data"),
        WsError::Protocol(
            ProtocolError::ResetWithoutClosingHandshake
            | ProtocolError::ReceivedAfterClosing
            | ProtocolError::SendAfterClosing,
        ) => return None,
        WsError::Protocol(_) => (close_code::PROTOCOL, "Protocol error"),
        _ => return None,
    };
    Some(CloseFrame {
        code,
        reason: reason.into(),
    })
}

/// How the client ended its side, as far as its messages told.
#[derive(Debug, Default)]
pub(super) enum ClientEnd {
    /// It has not (yet) ended it.
    #[default]
    Open,
    /// It sent a close frame (perhaps without a code).
    Closed(Option<CloseFrame>),
    /// The connection broke without a close frame.
    Broken,
}

impl ClientEnd {
    /// The close a session the client ended is told with (1005 for a close frame without a
    /// code, 1006 for a broken connection, as RFC 6455 reports them): `None` when the client
    /// did not end it (a legacy `connection_terminate` ends the session without a close).
    pub(super) fn frame(self) -> Option<CloseFrame> {
        match self {
            ClientEnd::Open => None,
            ClientEnd::Closed(Some(frame)) => Some(frame),
            ClientEnd::Closed(None) => Some(CloseFrame {
                code: 1005,
                reason: "No Status Received".into(),
            }),
            ClientEnd::Broken => Some(CloseFrame {
                code: 1006,
                reason: "Abnormal Closure".into(),
            }),
        }
    }
}

/// The most bytes a close frame's reason may take: a control frame carries at most 125
/// (RFC 6455, section 5.5), two of them the code. A longer one makes a client fail the
/// connection instead of reading the code.
const MAX_CLOSE_REASON: usize = 123;

/// `frame` with its reason cut, on a character boundary, to what a close frame can carry:
/// reasons can echo what the client sent (a parse error, a reused operation id).
pub(super) fn fitted(frame: CloseFrame) -> CloseFrame {
    let reason = frame.reason.as_str();
    if reason.len() <= MAX_CLOSE_REASON {
        return frame;
    }
    let mut end = MAX_CLOSE_REASON;
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    CloseFrame {
        code: frame.code,
        reason: reason[..end].to_owned().into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn close_reasons_fit_a_control_frame() {
        let long = CloseFrame {
            code: 4409,
            reason: format!("Subscriber for {} already exists", "é".repeat(100)).into(),
        };
        let fitted = fitted(long);
        assert_eq!(fitted.code, 4409);
        assert!(fitted.reason.len() <= MAX_CLOSE_REASON, "{}", fitted.reason);
        assert!(fitted.reason.as_str().starts_with("Subscriber for é"));
        let short = fitted_reason("Normal Closure");
        assert_eq!(short, "Normal Closure");
    }

    fn fitted_reason(reason: &str) -> String {
        fitted(CloseFrame {
            code: 1000,
            reason: reason.to_owned().into(),
        })
        .reason
        .to_string()
    }
}
