//! Redis client errors mapped onto lockline's by meaning.

use lockline::Error;
use redis::{ErrorKind, RedisError};

pub(crate) const NAME: &str = "redis";

/// Maps an error of a request (`what`: the operation and key) to ours.
pub(crate) fn map(what: &str, target: &str, error: RedisError) -> Error {
    let code = error.code().map(str::to_owned);
    match (error.kind(), code.as_deref()) {
        (ErrorKind::AuthenticationFailed, _) | (_, Some("WRONGPASS" | "NOAUTH")) => Error::AuthenticationFailed {
            backend: NAME,
            reason: format!("{target} refused the credentials ({what}): {}", detail(&error)),
        },
        (_, Some("NOPERM")) => Error::PermissionDenied {
            backend: NAME,
            operation: "run",
            key: what.to_owned(),
            reason: detail(&error),
        },
        (_, Some("WRONGTYPE")) => Error::InvalidName {
            name: what.to_owned(),
            reason: format!(
                "a key of this lock exists on {target} with another type: {}",
                detail(&error)
            ),
        },
        (_, Some("CROSSSLOT")) => Error::InvalidName {
            name: what.to_owned(),
            reason: "on a Redis Cluster the keys of one fenced write must share the lock's hash tag {NAME}".into(),
        },
        _ if is_unavailable(&error) => Error::unavailable_because(NAME, format!("{what} on {target}"), error),
        _ => match Error::backend(NAME, error) {
            Error::Backend {
                backend,
                reason,
                source,
            } => Error::Backend {
                backend,
                reason: format!("{what} on {target}: {reason}"),
                source,
            },
            other => other,
        },
    }
}

/// Whether the error is the server's refusal with `code` (`NOSESSION`, the
/// append script's refusal of a session the server does not have;
/// `CROSSSLOT`), alone or inside a pipeline's failure (with replica
/// acknowledgement a script runs in a pipeline, and the client library
/// reports a failed command of it as the pipeline's).
pub(crate) fn refused_with(error: &RedisError, code: &str) -> bool {
    error.code() == Some(code) || error.to_string().contains(code)
}

/// Whether the error says the server could not be reached or answered late
/// (a retry may succeed), as opposed to a refusal.
pub(crate) fn is_unavailable(error: &RedisError) -> bool {
    error.is_io_error()
        || error.is_timeout()
        || error.is_connection_refusal()
        || error.is_connection_dropped()
        || error.is_cluster_error()
        || matches!(
            error.kind(),
            ErrorKind::ClusterConnectionNotFound | ErrorKind::Io | ErrorKind::Parse
        )
        || matches!(
            error.code(),
            Some("LOADING" | "MASTERDOWN" | "TRYAGAIN" | "CLUSTERDOWN" | "BUSY")
        )
}

fn detail(error: &RedisError) -> String {
    error.detail().map_or_else(|| error.to_string(), str::to_owned)
}

/// A reply that does not have the shape the script returns.
pub(crate) fn bad_reply(what: &str, reply: &redis::Value) -> Error {
    Error::Backend {
        backend: NAME,
        reason: format!("{what}: unexpected reply {reply:?}"),
        source: "unexpected reply".into(),
    }
}

/// A request that got no answer within the request timeout.
pub(crate) fn timed_out(what: &str, target: &str, timeout: std::time::Duration) -> Error {
    Error::unavailable(NAME, format!("{what} on {target}: no answer within {timeout:?}"))
}
