//! Database errors mapped onto lockline's by meaning.

use std::time::Duration;

use lockline::Error;

/// What a statement was doing, for messages: the operation and where.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Doing<'a> {
    pub(crate) backend: &'static str,
    pub(crate) what: &'a str,
    pub(crate) target: &'a str,
}

/// Maps an error of a statement to ours.
pub(crate) fn map(doing: Doing<'_>, error: sqlx::Error) -> Error {
    let Doing { backend, what, target } = doing;
    match &error {
        sqlx::Error::Database(db) => {
            let code = db.code().map(|c| c.into_owned()).unwrap_or_default();
            let message = db.message().to_owned();
            match code.as_str() {
                // invalid_password, invalid_authorization_specification;
                // MySQL's "Access denied for user" (28000 too).
                "28P01" | "28000" => Error::AuthenticationFailed {
                    backend,
                    reason: format!("{target} refused the credentials ({what}): {message}"),
                },
                // insufficient_privilege; MySQL's command/table/column
                // access denied errors (42000 with these words).
                "42501" => Error::PermissionDenied {
                    backend,
                    operation: "run",
                    key: what.to_owned(),
                    reason: privilege_hint(&message),
                },
                // Two connections on one backend (the functions of
                // ddl/postgres.sql raise it, a pooler named in its message).
                "LL001" => Error::InvalidOptions {
                    reason: format!("{what} on {target}: {message}"),
                },
                // The driver's prepared statements colliding on a server
                // backend another client prepared them on: two connections
                // share one backend.
                "42P05" | "26000" if message.contains("sqlx_s_") => Error::InvalidOptions {
                    reason: format!(
                        "{what} on {target}: {message}: two connections of lockline share one server backend: a \
                         transaction-pooling proxy (PgBouncer pool_mode=transaction or statement) is in front of \
                         the database; the locks of lockline belong to a connection, so it needs a direct \
                         connection or a session-mode pool"
                    ),
                },
                // PgBouncer refusing the per-connection settings lockline
                // sends at connect.
                "08P01" if message.contains("unsupported startup parameter") => Error::InvalidOptions {
                    reason: format!(
                        "{what} on {target}: {message}: a connection pooler (PgBouncer?) refused the settings lockline \
                         sends with each connection; lockline's locks belong to a connection, so it needs a direct \
                         connection or a session-mode pool (with ignore_startup_parameters = options)"
                    ),
                },
                // MariaDB/MySQL refusing KILL of another user's connection.
                "HY000" if message.contains("not owner of thread") => Error::PermissionDenied {
                    backend,
                    operation: "run",
                    key: what.to_owned(),
                    reason: format!(
                        "{message} (ending a silent holder's connection needs the same database user, or the CONNECTION ADMIN privilege)"
                    ),
                },
                "42000" if message.contains("denied") => Error::PermissionDenied {
                    backend,
                    operation: "run",
                    key: what.to_owned(),
                    reason: privilege_hint(&message),
                },
                // Server shutting down, too many connections, cannot
                // connect now, lock wait timeouts on a row, a killed
                // connection: a retry may succeed.
                // serialization_failure / deadlock_detected (InnoDB's
                // deadlock victim too): the statement was rolled back whole.
                "40001" | "40P01" | "57P01" | "57P02" | "57P03" | "53300" | "08006" | "08001" | "08004" | "55P03"
                | "HY000"
                    if transient_words(&message) || code != "HY000" =>
                {
                    Error::unavailable_because(backend, format!("{what} on {target}"), error)
                }
                _ => Error::Backend {
                    backend,
                    reason: format!("{what} on {target}: {message} (SQLSTATE {code})"),
                    source: Box::new(error),
                },
            }
        }
        sqlx::Error::Protocol(message) if message.contains("SSLRequest") => Error::unavailable_because(
            backend,
            format!(
                "{what} on {target}: the connection was closed during the handshake (is a PostgreSQL server up behind that address?)"
            ),
            error,
        ),
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed
        | sqlx::Error::Protocol(_) => Error::unavailable_because(backend, format!("{what} on {target}"), error),
        sqlx::Error::Configuration(_) => Error::InvalidOptions {
            reason: format!("{what} on {target}: {error}"),
        },
        _ => Error::Backend {
            backend,
            reason: format!("{what} on {target}: {error}"),
            source: Box::new(error),
        },
    }
}

/// Whether a MySQL `HY000` message says the server is going away or busy.
fn transient_words(message: &str) -> bool {
    let message = message.to_ascii_lowercase();
    [
        "lock wait timeout",
        "server shutdown",
        "gone away",
        "lost connection",
        "deadlock",
    ]
    .iter()
    .any(|w| message.contains(w))
}

/// The server's words, with the privilege lockline needs named where the
/// message is about one of the privileges it documents.
fn privilege_hint(message: &str) -> String {
    let lower = message.to_ascii_lowercase();
    let hint = if lower.contains("terminate") || lower.contains("signal") {
        " (ending a silent holder's connection needs the same database user, or membership in pg_signal_backend)"
    } else if lower.contains("kill") || lower.contains("thread") {
        " (ending a silent holder's connection needs the same database user, or the CONNECTION ADMIN privilege)"
    } else if lower.contains("schema") || lower.contains("create") {
        " (lockline creates its tables on first use, which needs CREATE on the schema; or create them with the DDL script)"
    } else if lower.contains("sequence") {
        " (the entries' id sequence needs USAGE and UPDATE)"
    } else {
        ""
    };
    format!("{message}{hint}")
}

/// Whether the error is the given SQLSTATE.
pub(crate) fn has_code(error: &sqlx::Error, wanted: &str) -> bool {
    matches!(error, sqlx::Error::Database(db) if db.code().as_deref() == Some(wanted))
}

/// Whether the error says the connection is gone (reset, closed, broken):
/// a session whose owning connection is gone has lost every guard.
pub(crate) fn connection_gone(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::Io(_) | sqlx::Error::Protocol(_) | sqlx::Error::Tls(_) => true,
        sqlx::Error::Database(db) => {
            matches!(
                db.code().as_deref(),
                // admin_shutdown, crash_shutdown, connection failure;
                // MySQL's communication errors (a packet too large: the
                // server closes the connection) and a killed connection.
                Some("57P01" | "57P02" | "08006" | "08003" | "08S01" | "70100")
            ) && !db
                .message()
                .to_ascii_lowercase()
                .contains("query execution was interrupted")
        }
        _ => false,
    }
}

/// Whether the server itself ended the connection and said so (an
/// administrator's termination, a crash of another backend, a killed
/// connection): it ends the statement in progress with its transaction,
/// so nothing of that statement was applied. A connection that merely broke
/// (reset, closed, a protocol error) says nothing of what the server did.
pub(crate) fn ended_by_the_server(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::Database(db) => matches!(db.code().as_deref(), Some("57P01" | "57P02" | "70100")),
        _ => false,
    }
}

/// A statement that got no answer within the request timeout.
pub(crate) fn timed_out(doing: Doing<'_>, timeout: Duration) -> Error {
    Error::unavailable(
        doing.backend,
        format!("{} on {}: no answer within {timeout:?}", doing.what, doing.target),
    )
}

/// Whether a statement gave up waiting for a row or named lock another
/// transaction holds (PostgreSQL `lock_timeout`, InnoDB's
/// `innodb_lock_wait_timeout`).
pub(crate) fn is_lock_timeout(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::Database(db) => {
            db.code().as_deref() == Some("55P03")
                || db.message().to_ascii_lowercase().contains("lock wait timeout exceeded")
        }
        _ => false,
    }
}

/// Whether a statement was ended by `KILL QUERY` (MariaDB/MySQL
/// `ER_QUERY_INTERRUPTED`, PostgreSQL `query_canceled`).
pub(crate) fn interrupted(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::Database(db) => {
            db.code().as_deref() == Some("57014")
                || db
                    .message()
                    .to_ascii_lowercase()
                    .contains("query execution was interrupted")
        }
        _ => false,
    }
}
