//! etcd errors mapped onto lockline's by meaning.

use etcd_client::Error as EtcdError;
use lockline::Error;

pub(crate) const BACKEND: &str = "etcd";

/// Maps an etcd client error: unreachable or overloaded cluster → `Unavailable`,
/// a lease the server no longer has → `SessionLost`, anything else → `Backend`.
pub(crate) fn map(error: EtcdError, session: Option<&str>) -> Error {
    let text = error.to_string();
    if let Some(session) = session {
        if text.contains("requested lease not found") {
            return Error::SessionLost {
                session: session.to_owned(),
            };
        }
    }
    let transient = match &error {
        EtcdError::GRpcStatus(status) => is_transient_code(status.code() as i32),
        EtcdError::TransportError(_)
        | EtcdError::IoError(_)
        | EtcdError::WatchError(_)
        | EtcdError::LeaseKeepAliveError(_)
        | EtcdError::EndpointError(_) => true,
        _ => false,
    };
    if transient {
        Error::Unavailable {
            backend: BACKEND,
            source: Some(Box::new(error)),
        }
    } else {
        Error::backend(BACKEND, error)
    }
}

/// gRPC codes after which the same request may succeed: Cancelled (1), Unknown
/// (2, what a dropped connection often surfaces as), DeadlineExceeded (4),
/// ResourceExhausted (8), Aborted (10), Unavailable (14).
fn is_transient_code(code: i32) -> bool {
    matches!(code, 1 | 2 | 4 | 8 | 10 | 14)
}
