//! ZooKeeper errors mapped onto lockline's by meaning.

use lockline::Error;
use zookeeper_client::Error as ZkError;

pub(crate) const BACKEND: &str = "zookeeper";

/// Maps a ZooKeeper client error: expiry → `SessionLost`, a closed client →
/// `Closed`, connection trouble → `Unavailable`, anything else → `Backend`.
pub(crate) fn map(error: ZkError, session: &str) -> Error {
    match error {
        ZkError::SessionExpired | ZkError::AuthFailed => Error::SessionLost {
            session: session.to_owned(),
        },
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
        | ZkError::Custom(_) => Error::Unavailable {
            backend: BACKEND,
            source: Some(Box::new(error)),
        },
        other => Error::backend(BACKEND, other),
    }
}
