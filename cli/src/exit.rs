//! `lockline`'s exit statuses (the 12x block is its own and stays stable),
//! and the one a failure of `lockline`'s own exits with.

use lockline::Error;

/// Exit status of `check` when the sequencer is not current (as test(1)'s
/// false).
pub(crate) const NOT_CURRENT: u8 = 1;
/// Exit status of `lock -n` when the lock is taken, unless
/// `--conflict-exit-code` says (as flock(1)'s `-E` default).
pub(crate) const DEFAULT_CONFLICT: u8 = 1;
/// Exit status when the lock (or leadership) was lost while held.
pub(crate) const LOST: u8 = 120;
/// Exit status when the server refused the credentials or a permission.
const REFUSED: u8 = 121;
/// Exit status when the cluster could not be reached within the deadline.
const UNAVAILABLE: u8 = 122;
/// Exit status for bad arguments or options.
pub(crate) const USAGE_ERROR: u8 = 123;
/// Exit status when `--timeout` ran out (as timeout(1)).
pub(crate) const TIMED_OUT: u8 = 124;
/// Exit status for any other failure of `lockline`'s own.
pub(crate) const FAILURE: u8 = 125;
/// Exit status when the command was found but could not be run (as a shell).
pub(crate) const CANNOT_RUN: u8 = 126;
/// Exit status when the command was not found (as a shell).
pub(crate) const NOT_FOUND: u8 = 127;

/// The exit status for a failure of `lockline`'s own.
pub(crate) fn failure_status(error: &Error) -> u8 {
    match error {
        Error::AuthenticationFailed { .. } | Error::PermissionDenied { .. } => REFUSED,
        Error::Unavailable { .. } => UNAVAILABLE,
        Error::InvalidName { .. } | Error::InvalidOptions { .. } => USAGE_ERROR,
        Error::Timeout { .. } => TIMED_OUT,
        _ => FAILURE,
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn statuses_of_lockline_failures_are_those_of_the_table() {
        use lockline::Error;
        let status = |error: Error| super::failure_status(&error);
        assert_eq!(
            status(Error::AuthenticationFailed {
                backend: "etcd",
                reason: "no".into()
            }),
            121
        );
        assert_eq!(
            status(Error::PermissionDenied {
                backend: "etcd",
                operation: "queue on",
                key: "k".into(),
                reason: "no".into()
            }),
            121
        );
        assert_eq!(
            status(Error::Unavailable {
                backend: "etcd",
                reason: "no member answered".into(),
                source: None
            }),
            122
        );
        assert_eq!(
            status(Error::InvalidName {
                name: "a//b".into(),
                reason: "r".into()
            }),
            123
        );
        assert_eq!(status(Error::InvalidOptions { reason: "r".into() }), 123);
        assert_eq!(
            status(Error::Timeout {
                name: "x".into(),
                waited: std::time::Duration::from_secs(1),
                held_by_this_session: false
            }),
            124
        );
        assert_eq!(status(Error::SessionLost { session: "s".into() }), 125);
        assert_eq!(status(Error::LockLost { key: "k".into() }), 125);
    }
}
