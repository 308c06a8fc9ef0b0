//! etcd errors mapped onto lockline's by meaning.

use etcd_client::Error as EtcdError;
use lockline::Error;

pub(crate) const BACKEND: &str = "etcd";

/// Maps an etcd client error: unreachable or overloaded cluster → `Unavailable`,
/// a lease the server no longer has → `SessionLost`, refused credentials →
/// `AuthenticationFailed`, anything else → `Backend`. An error about a
/// specific key goes through [`map_on`] instead, which names it.
pub(crate) fn map(error: EtcdError, session: Option<&str>) -> Error {
    map_on(error, session, "call", "")
}

/// As [`map`], for a request that did `operation` on `key`: a permission the
/// user's roles do not grant becomes `PermissionDenied` naming both.
pub(crate) fn map_on(error: EtcdError, session: Option<&str>, operation: &'static str, key: &str) -> Error {
    let text = error.to_string();
    if let Some(session) = session {
        if text.contains("requested lease not found") {
            return Error::SessionLost {
                session: session.to_owned(),
            };
        }
    }
    if let EtcdError::GRpcStatus(status) = &error {
        if is_stale_auth(status.message()) {
            // The cluster's users or roles changed after this client got its
            // token: the same request succeeds once the client authenticates
            // again (the session does that on seeing this error).
            return Error::unavailable(
                BACKEND,
                format!(
                    "{}: the cluster's users or roles changed since this client authenticated; authenticating again",
                    status.message()
                ),
            );
        }
        if status.message().contains("larger than max") || status.message().contains("request is too large") {
            return Error::InvalidOptions {
                reason: format!(
                    "{}the request is too large for the server ({}); etcd takes requests up to its \
                     --max-request-bytes (1.5 MiB by default)",
                    if key.is_empty() {
                        String::new()
                    } else {
                        format!("cannot {operation} {key:?}: ")
                    },
                    status.message().trim()
                ),
            };
        }
        if status.code() as i32 == PERMISSION_DENIED || status.message().contains("permission denied") {
            return denied(operation, key, status.message());
        }
        if let Some(reason) = refused_credentials(status.code() as i32, status.message()) {
            return Error::AuthenticationFailed {
                backend: BACKEND,
                reason,
            };
        }
    }
    let transient = match &error {
        // A connection broken mid-request (an HTTP/2 GOAWAY or protocol
        // error) is reported by the client as Internal: the request may be
        // tried again on a new connection.
        EtcdError::GRpcStatus(status) => {
            is_transient_code(status.code() as i32) || status.message().starts_with("h2 protocol error")
        }
        EtcdError::TransportError(_)
        | EtcdError::IoError(_)
        | EtcdError::WatchError(_)
        | EtcdError::LeaseKeepAliveError(_)
        | EtcdError::EndpointError(_) => true,
        _ => false,
    };
    let what = if key.is_empty() {
        String::new()
    } else {
        format!("cannot {operation} {key:?}: ")
    };
    if transient {
        let reason = format!("{what}{}", explain_tls(&error));
        Error::Unavailable {
            backend: BACKEND,
            reason,
            source: Some(Box::new(error)),
        }
    } else {
        let reason = format!("{what}{}", explain_tls(&error));
        Error::Backend {
            backend: BACKEND,
            reason,
            source: Box::new(error),
        }
    }
}

/// `PermissionDenied` for `operation` on `key`, with the server's words.
pub(crate) fn denied(operation: &'static str, key: &str, message: &str) -> Error {
    let needs = match operation {
        // An append reads, and a cancelled one writes, the attempt's marker.
        "queue on" | "leave the queue of" => "read-write on the lock's entries and markers: a prefix of the lock's \
            name such as `locks/` or the name itself (its markers are `NAME` + NUL + `lockline/...`, outside `NAME/`, \
            which alone is not enough), or, with Etcd::with_marker_prefix (--marker-prefix), on `NAME/` and on that \
            prefix"
            .to_owned(),
        // A lock-mode resource's entries are under `NAME/`, its value block
        // beside them.
        "read the queue of" => "read on a prefix of the resource's name such as `locks/` or the name itself (its \
            entries are under `NAME/`, its value block at `NAME` + NUL + `lockline/block`, outside `NAME/`)"
            .to_owned(),
        "update the queue of" => "read-write on a prefix of the resource's name such as `locks/` or the name \
            itself (its entries are under `NAME/`, its value block at `NAME` + NUL + `lockline/block`, outside \
            `NAME/`, which alone is not enough)"
            .to_owned(),
        "read" | "watch" => "read on this key's prefix".to_owned(),
        "revoke the lease of" => "write on every key on the lease (unrenewed, it expires within its TTL)".to_owned(),
        _ => "read-write on this key's prefix".to_owned(),
    };
    Error::PermissionDenied {
        backend: BACKEND,
        operation,
        key: key.to_owned(),
        reason: format!("{}; the user's roles need {needs}", message.trim()),
    }
}

/// What a watch cancelled by the server means: a permission the user lacks
/// is final, anything else may pass.
pub(crate) fn watch_broken(reason: String, key: &str) -> Error {
    if reason.contains("permission denied") {
        denied("watch", key, &reason)
    } else {
        Error::unavailable(BACKEND, format!("the watch on {key:?} was cancelled: {reason}"))
    }
}

/// Maps an error of connecting (which authenticates when a user is set).
pub(crate) fn map_connect(
    error: EtcdError,
    tls: Option<&lockline::Tls>,
    user: Option<&str>,
    endpoints: &[String],
) -> Error {
    match map(error, None) {
        Error::AuthenticationFailed { reason, .. } => Error::AuthenticationFailed {
            backend: BACKEND,
            reason: match user {
                Some(user) => format!("as user {user:?}: {reason}"),
                None => reason,
            },
        },
        other => first_request(other, tls, endpoints),
    }
}

/// Explains a connection dropped at the first request of a connection: that
/// is how a TLS mismatch shows when the handshake itself seemed to succeed
/// (TLS 1.3 servers refuse a missing client certificate only after it) or
/// never started (a plain-text client on a TLS port is answered with a reset).
pub(crate) fn first_request(error: Error, tls: Option<&lockline::Tls>, endpoints: &[String]) -> Error {
    let Error::Unavailable { reason: text, .. } = &error else {
        return error;
    };
    let dropped = [
        "connection closed",
        "ConnectionReset",
        "connection reset",
        "BrokenPipe",
        "broken pipe",
    ]
    .iter()
    .any(|w| text.contains(w));
    let hint = match tls {
        _ if !dropped || text.contains("TLS") => None,
        None => Some("the server dropped the connection at the first request (not an etcd server, or one that requires TLS: then use https:// endpoints and a CA, Etcd::with_tls, --cacert)"),
        Some(tls) if tls.client_pem().is_none() => Some(
            "the server dropped the connection right after the TLS handshake: it may require a client certificate (Tls::with_client_files, --cert and --key)"
        ),
        Some(_) => Some("the server dropped the connection right after the TLS handshake: it may not accept this client certificate (signed by a CA it does not trust, or expired)"),
    };
    match error {
        Error::Unavailable { reason, source, .. } => {
            // The client library names no endpoint when it cannot connect
            // ("tcp connect error: Connection refused"): say which were tried.
            let shown: Vec<String> = endpoints.iter().map(|e| crate::shown(e)).collect();
            let named = if shown.iter().any(|e| reason.contains(e.as_str())) {
                reason
            } else {
                format!("{}: {reason}", shown.join(","))
            };
            Error::Unavailable {
                backend: BACKEND,
                reason: match hint {
                    Some(hint) => format!("{hint}: {named}"),
                    None => named,
                },
                source,
            }
        }
        other => other,
    }
}

/// `Unavailable` for a connect that did not finish in time.
pub(crate) fn unreachable(endpoints: &[String], tls: bool) -> Error {
    let how = if tls { " (TLS handshake or authentication)" } else { "" };
    Error::unavailable(
        BACKEND,
        format!(
            "no answer from {} within the connect timeout{how}",
            endpoints.iter().map(|e| crate::shown(e)).collect::<Vec<_>>().join(", ")
        ),
    )
}

/// The server's words when it refused the credentials themselves (not one
/// operation): a wrong password, an unknown user, auth not enabled, no user
/// given where one is required.
fn refused_credentials(code: i32, message: &str) -> Option<String> {
    const REFUSALS: [&str; 6] = [
        "authentication failed",
        "invalid user ID or password",
        "authentication is not enabled",
        "user name is empty",
        "user name not found",
        "invalid auth token",
    ];
    let refused = code == UNAUTHENTICATED || REFUSALS.iter().any(|r| message.contains(r));
    refused.then(|| message.trim().to_owned())
}

/// The message of a transport error, with the TLS cause spelled out: tonic
/// reports a failed handshake as "transport error" and keeps the reason
/// (unknown issuer, a certificate required, ...) in its source chain.
fn explain_tls(error: &EtcdError) -> String {
    // A gRPC status prints its source with `Debug` (a dump of the transport
    // error's fields): take its message and the sources' own words instead.
    let (first, mut source) = match error {
        EtcdError::GRpcStatus(status) if std::error::Error::source(status).is_some() => {
            (status.message().to_owned(), std::error::Error::source(status))
        }
        _ => (error.to_string(), std::error::Error::source(error)),
    };
    let mut chain = vec![first];
    while let Some(cause) = source {
        let text = cause.to_string();
        if !chain.contains(&text) {
            chain.push(text);
        }
        source = cause.source();
    }
    let text = chain.join(": ");
    let tls_words = [
        "certificate",
        "Certificate",
        "tls",
        "TLS",
        "handshake",
        "InvalidContentType",
        "CorruptMessage",
        "peer sent no certificates",
        "alert",
    ];
    if tls_words.iter().any(|w| text.contains(w)) && !text.contains("TLS") {
        format!("TLS handshake failed: {text}")
    } else {
        text
    }
}

/// Whether etcd refused a request because its token predates a change of
/// users or roles ("revision of auth store is old"): Go's client
/// authenticates again and retries, and so does lockline.
pub(crate) fn is_stale_auth(message: &str) -> bool {
    message.contains("revision of auth store is old")
}

/// gRPC's PermissionDenied.
const PERMISSION_DENIED: i32 = 7;
/// gRPC's Unauthenticated.
const UNAUTHENTICATED: i32 = 16;

/// gRPC codes after which the same request may succeed: Cancelled (1), Unknown
/// (2, what a dropped connection often surfaces as), DeadlineExceeded (4),
/// ResourceExhausted (8), Aborted (10), Unavailable (14).
fn is_transient_code(code: i32) -> bool {
    matches!(code, 1 | 2 | 4 | 8 | 10 | 14)
}
