//! ZooKeeper errors mapped onto lockline's by meaning.

use lockline::Error;
use zookeeper_client::Error as ZkError;

pub(crate) const BACKEND: &str = "zookeeper";

/// Maps a ZooKeeper client error: expiry → `SessionLost`, rejected
/// credentials → `AuthenticationFailed`, an ACL refusal → `PermissionDenied`
/// (callers that know the operation use [`denied`]), a closed client →
/// `Closed`, connection trouble → `Unavailable`, anything else → `Backend`.
pub(crate) fn map(error: ZkError, session: &str) -> Error {
    match error {
        ZkError::SessionExpired => Error::SessionLost {
            session: session.to_owned(),
        },
        ZkError::AuthFailed => Error::AuthenticationFailed {
            backend: BACKEND,
            reason: format!("the server rejected the credentials of session {session} (AuthFailed)"),
        },
        ZkError::NoAuth => denied("access", "(unknown path)"),
        ZkError::ClientClosed => Error::Closed {
            session: session.to_owned(),
        },
        // `Custom` is how the client reports trouble on the wire (an I/O error,
        // a server that stopped answering): the request may succeed elsewhere.
        ZkError::ConnectionLoss
        | ZkError::Timeout
        | ZkError::NoHosts
        | ZkError::Throttled
        | ZkError::SessionMoved
        | ZkError::Custom(_) => Error::unavailable_because(BACKEND, format!("session {session}"), error),
        other => Error::backend(BACKEND, other),
    }
}

/// ZooKeeper's `NoAuth`: the node's (or, to create or delete, its parent's)
/// ACL does not grant this session's identities `operation`.
pub(crate) fn denied(operation: &'static str, path: &str) -> Error {
    Error::PermissionDenied {
        backend: BACKEND,
        operation,
        key: path.to_owned(),
        reason: "the ACL does not grant this session's identity (ZooKeeper NoAuth)".to_owned(),
    }
}
