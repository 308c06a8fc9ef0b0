//! The errors of every lockline call, named by what happened, and the
//! parsing of a lock mode's short name, which fails with one of them.

use std::str::FromStr;
use std::time::Duration;

use crate::LockMode;

/// A boxed error from a backend's client library, kept as the `source` of an [`Error`].
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// The result type of every fallible lockline call.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What went wrong, named by what happened rather than by the transport.
///
/// Backends map their clients' errors onto these variants by meaning: an expired
/// ZooKeeper session or a revoked etcd lease becomes [`Error::SessionLost`], a
/// cluster that cannot be reached within the deadline becomes
/// [`Error::Unavailable`]. Anything else keeps its cause in [`Error::Backend`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The lock name cannot be used: empty, too long, holding characters a
    /// backend cannot store, or already used on the server by a recipe this one
    /// cannot queue with (a semaphore and a mutex on one name, a Curator or
    /// kazoo semaphore's directory). Also a key given to
    /// [`write_if_held`](crate::MutexGuard::write_if_held) or
    /// [`Session::read`](crate::Session::read) that the backend cannot store
    /// (empty; on ZooKeeper not an absolute path, a trailing or doubled `/`),
    /// or that lies under the lock's own entries.
    ///
    /// The check against other recipes is made from what a contender reads while
    /// it queues; a contender refused this way has left the queue.
    #[error("invalid name {name:?}: {reason}")]
    InvalidName {
        /// The name as the caller gave it.
        name: String,
        /// Why it was refused.
        reason: String,
    },

    /// Session or recipe options out of range (a zero or absurd TTL, a safety
    /// margin larger than the TTL, zero semaphore permits, ...).
    #[error("invalid options: {reason}")]
    InvalidOptions {
        /// Why they were refused.
        reason: String,
    },

    /// A bounded wait ran out before the lock was granted. The contender has
    /// left the queue.
    ///
    /// Locks are not re-entrant: a session that already holds (or waits for)
    /// a name and asks for it again waits behind itself. When that is what
    /// blocked the wait, `held_by_this_session` is set and the message says so.
    #[error(
        "timed out after {waited:?} waiting for {name:?}{}",
        if *held_by_this_session {
            ": it is held by this session, or already awaited by it (locks are not re-entrant)"
        } else {
            ""
        }
    )]
    Timeout {
        /// The lock name.
        name: String,
        /// How long the caller waited.
        waited: Duration,
        /// Whether the holder (or waiter) it queued behind is this same
        /// session: a nested acquire that cannot succeed until the outer
        /// guard is released.
        held_by_this_session: bool,
    },

    /// The session expired (or was revoked) on the server: everything it held
    /// may now be held by someone else.
    #[error("session {session} lost")]
    SessionLost {
        /// The session's id.
        session: String,
    },

    /// The lock's entry was deleted by someone else while it was held: the lock
    /// may now be held by another contender.
    #[error("lock entry {key:?} was deleted by someone else")]
    LockLost {
        /// The entry's key or path.
        key: String,
    },

    /// The session was closed by its owner; it cannot be used any more.
    #[error("session {session} is closed")]
    Closed {
        /// The session's id.
        session: String,
    },

    /// The cluster could not be reached within the connect or request deadline.
    ///
    /// The message says what failed and why: the endpoints or the request,
    /// the deadline, the client library's or the server's words ("etcd
    /// unavailable: no answer from http://10.0.0.1:2379 within the connect
    /// timeout"). When the cause is a TLS failure (a certificate refused
    /// either way, plain text against a TLS port) the message says TLS.
    #[error("{backend} unavailable: {reason}")]
    Unavailable {
        /// The backend's name (`etcd`, `zookeeper`, `memory`).
        backend: &'static str,
        /// What failed and why, in words fit for a log line.
        reason: String,
        /// The client library's error, when there is one.
        #[source]
        source: Option<BoxError>,
    },

    /// The server refused the credentials the backend was configured with: a
    /// wrong etcd user name or password, a ZooKeeper SASL login or `addauth`
    /// the server rejected. Returned at once and never retried: the same
    /// credentials will be refused again. The message never holds a password.
    ///
    /// A TLS handshake failure (wrong CA, missing or expired client
    /// certificate, plain text against a TLS port) is not this error but
    /// [`Error::Unavailable`], whose message says TLS: on the wire it cannot be
    /// told apart from a server that is not there.
    #[error("{backend} authentication failed: {reason}")]
    AuthenticationFailed {
        /// The backend's name (`etcd`, `zookeeper`).
        backend: &'static str,
        /// What the server said, with the user name when there is one.
        reason: String,
    },

    /// The server refused an operation because the session's identity has no
    /// right to it: an etcd role without read-write on the key's prefix, a
    /// ZooKeeper node whose ACL does not grant this identity. Returned at once
    /// and never retried; an acquire refused when it queues leaves no entry
    /// behind. A session refused the removal of one of its own entries
    /// (rights revoked while it held or waited) is given up: declared
    /// [`SessionState::Lost`](crate::SessionState::Lost), so that the server
    /// deletes its entries instead of leaving a lock's queue blocked.
    #[error("{backend} permission denied: cannot {operation} {key:?}: {reason}")]
    PermissionDenied {
        /// The backend's name (`etcd`, `zookeeper`).
        backend: &'static str,
        /// What was refused, as a verb phrase (`queue on`, `read`, `delete`).
        operation: &'static str,
        /// The key, path or prefix the operation was on.
        key: String,
        /// What the server said.
        reason: String,
    },

    /// An up-conversion of a [`Resource`](crate::Resource) lock would wait for
    /// ever: it closes a cycle of conversions and requests that each wait on
    /// another (two PR holders both converting to EX). Detected when the
    /// conversion is asked for, from the one read it makes; the conversion
    /// that closes the cycle fails, and the lock keeps the mode it held (or
    /// is demoted to NL, see
    /// [`Resource::demote_on_deadlock`](crate::Resource::demote_on_deadlock)).
    #[error("converting {name:?} from {from} to {to} would deadlock: {held} is now held")]
    Deadlock {
        /// The resource's name.
        name: String,
        /// The mode held when the conversion was asked for.
        from: crate::LockMode,
        /// The mode asked for.
        to: crate::LockMode,
        /// The mode the lock is held in now.
        held: crate::LockMode,
    },

    /// An operation that the mode a [`Resource`](crate::Resource) lock is
    /// held in does not allow: writing the lock value block below PW,
    /// fenced writes below CW.
    #[error("{operation} needs a lock held in {needs}; {name:?} is held in {held}")]
    WrongMode {
        /// The resource's name.
        name: String,
        /// What was asked (`set the lock value block`, `fenced writes`).
        operation: &'static str,
        /// The modes that allow it.
        needs: &'static str,
        /// The mode the lock is held in.
        held: crate::LockMode,
    },

    /// The backend does not offer this operation: an out-of-tree backend
    /// written before the operation existed (every backend of this
    /// repository offers every operation).
    #[error("the {backend} backend does not support {operation}")]
    Unsupported {
        /// The backend's name.
        backend: &'static str,
        /// What was asked (`fenced writes`, `reads`).
        operation: &'static str,
    },

    /// Any other error reported by a backend. The message holds the client
    /// library's (and the server's) words.
    #[error("{backend} error: {reason}")]
    Backend {
        /// The backend's name (`etcd`, `zookeeper`, `memory`).
        backend: &'static str,
        /// What failed, in words fit for a log line.
        reason: String,
        /// The client library's error.
        #[source]
        source: BoxError,
    },
}

/// An error and its causes in one line, each cause once: client libraries
/// often say "transport error" and keep the reason ("connection refused")
/// in their sources.
pub(crate) fn describe(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let words = cause.to_string();
        if !words.is_empty() && !text.contains(&words) {
            text.push_str(": ");
            text.push_str(&words);
        }
        source = cause.source();
    }
    text
}

impl Error {
    /// Wraps a client library's error as [`Error::Backend`]; the message
    /// holds its words and those of its causes.
    pub fn backend(backend: &'static str, source: impl Into<BoxError>) -> Self {
        let source = source.into();
        Error::Backend {
            backend,
            reason: describe(source.as_ref()),
            source,
        }
    }

    /// [`Error::Unavailable`] with `reason` saying what failed and why, and no
    /// client-library error behind it.
    pub fn unavailable(backend: &'static str, reason: impl Into<String>) -> Self {
        Error::Unavailable {
            backend,
            reason: reason.into(),
            source: None,
        }
    }

    /// [`Error::Unavailable`] caused by a client library's error: `context`
    /// says what was being done ("connecting to 127.0.0.1:2181"), and the
    /// message adds the error's words and those of its causes.
    pub fn unavailable_because(
        backend: &'static str,
        context: impl std::fmt::Display,
        source: impl Into<BoxError>,
    ) -> Self {
        let source = source.into();
        Error::Unavailable {
            backend,
            reason: format!("{context}: {}", describe(source.as_ref())),
            source: Some(source),
        }
    }

    /// Whether a retry of the same call may succeed (the cluster was unreachable
    /// or a request failed in transit), as opposed to a caller's mistake or a
    /// final state such as a lost session.
    pub fn is_transient(&self) -> bool {
        matches!(self, Error::Unavailable { .. })
    }

    /// Whether the server refused the caller's identity or rights
    /// ([`Error::AuthenticationFailed`], [`Error::PermissionDenied`]): final,
    /// never retried, and the refused request changed nothing.
    pub fn is_refusal(&self) -> bool {
        matches!(
            self,
            Error::AuthenticationFailed { .. } | Error::PermissionDenied { .. }
        )
    }
}

// A lock mode's short name is parsed here, beside the error it fails with:
// `Error` names lock modes, so `error` depends on `lock_mode` and not the
// other way round.
impl FromStr for LockMode {
    type Err = Error;

    fn from_str(text: &str) -> Result<Self, Error> {
        LockMode::ALL
            .into_iter()
            .find(|m| m.label().eq_ignore_ascii_case(text))
            .ok_or_else(|| Error::InvalidOptions {
                reason: format!("unknown lock mode {text:?}: expected one of NL, CR, CW, PR, PW, EX"),
            })
    }
}

#[cfg(test)]
mod tests {
    use crate::LockMode;

    #[test]
    fn names_parse_back() {
        for mode in LockMode::ALL {
            assert_eq!(mode.label().parse::<LockMode>().ok(), Some(mode));
            assert_eq!(mode.label().to_lowercase().parse::<LockMode>().ok(), Some(mode));
        }
        assert!("XX".parse::<LockMode>().is_err());
    }
}
