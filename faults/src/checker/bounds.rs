//! What the checker needs besides the history ([`Bounds`]): the checked
//! window and the bounds and allowances of the backend under test.

use crate::clock::secs;
use crate::nemesis::{Fault, FaultKind};

/// What the checker needs besides the history.
#[derive(Debug, Clone, Copy)]
pub struct Bounds {
    /// The run's start (ns), for relative times in messages.
    pub start: u64,
    /// When the contenders were told to stop (ns): the end of the checked window.
    pub stop: u64,
    /// TTL + election time + slack (ns).
    pub recovery: u64,
    /// How long after its connections were reset (a cut, a crash of the
    /// server) a running holder may go on holding (ns): 0 where a reset frees
    /// nothing on the server (etcd, ZooKeeper: the session outlives its
    /// connection); on a backend whose server frees the lock with the
    /// connection, the time the holder takes to notice (its next request).
    pub reset_notice: u64,
    /// The faults that free a holder's lock on the server without its
    /// knowing, for which [`reset_notice`](Self::reset_notice) applies:
    /// PostgreSQL's resets of a holder's connections, a restart of a Redis
    /// server without persistence; none elsewhere.
    pub reset_kinds: &'static [FaultKind],
    /// Whether such a fault frees the locks when it ends (a Redis server
    /// back without its data) rather than when it begins (a reset).
    pub reset_at_end: bool,
    /// The longest outage of the server (ns, from its start to the server's
    /// serving again) of [`ride_out_kinds`](Self::ride_out_kinds) that must
    /// cost no session.
    pub ride_out: u64,
    /// The outages a session must ride out when short (a Redis restart with
    /// its data, a pause of the server, a reset of a holder's connections);
    /// none elsewhere.
    pub ride_out_kinds: &'static [FaultKind],
    /// The sessions' loss deadline (ns): how long after an outage's start a
    /// loss may still be due to it.
    pub loss_deadline: u64,
    /// The faults after which the server has forgotten every session (a
    /// Redis server restarted without persistence): each session open when
    /// one began must be declared lost, so that its contender gives it up,
    /// within the recovery bound of the server's return.
    pub forgets_sessions: &'static [FaultKind],
    /// The contenders' lock-delay (ns; 0: none, and nothing to check).
    pub lock_delay: u64,
}

impl Bounds {
    /// `t` (ns) in seconds since the run's start, for messages.
    pub(super) fn since_start(&self, t: u64) -> f64 {
        secs(t.saturating_sub(self.start))
    }

    /// A fault, its target and when it began, for messages.
    pub(super) fn fault_at(&self, fault: &Fault) -> String {
        format!(
            "{} {} at {:.3}s",
            fault.kind,
            fault.target,
            self.since_start(fault.start)
        )
    }
}
