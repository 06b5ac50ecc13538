//! What a WebSocket's closing looks like: a close frame's reason cut to what a control
//! frame carries, the transport's refusal of a message for its size told apart, and how
//! the client ended its side.

use axum::extract::ws::CloseFrame;

/// Whether the transport refused a message for its size (over `COURIER_MAX_BODY_BYTES`).
pub(super) fn too_big(err: &axum::Error) -> bool {
    use tokio_tungstenite::tungstenite::error::{CapacityError, Error as WsError};
    std::error::Error::source(err)
        .and_then(|source| source.downcast_ref::<WsError>())
        .is_some_and(|err| matches!(err, WsError::Capacity(CapacityError::MessageTooLong { .. })))
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
