//! How a run is set up ([`Config`]): its backend, length, seed, contenders,
//! TTL and fault kinds, the short runs of the test suite, and the bounds
//! derived from them (recovery, reset notice, ride-out).

use std::path::PathBuf;
use std::time::Duration;

use crate::nemesis::FaultKind;
use crate::Backend;

/// How a run is set up.
#[derive(Debug, Clone)]
pub struct Config {
    /// The backend.
    pub backend: Backend,
    /// How long the nemesis injects faults.
    pub duration: Duration,
    /// Seeds the schedule and the contenders' choices.
    pub seed: u64,
    /// How many contender processes.
    pub contenders: usize,
    /// The sessions' TTL.
    pub ttl: Duration,
    /// Added to TTL + election time for the recovery bound.
    pub slack: Duration,
    /// The program to run as `PROGRAM contender ...` (this crate's binary).
    pub program: PathBuf,
    /// Print the nemesis's actions as they happen.
    pub verbose: bool,
    /// The fault kinds the nemesis chooses from (every kind when empty).
    pub kinds: Vec<FaultKind>,
    /// Keep the contenders' logs and the history (`history.txt`) even when
    /// nothing is wrong (they are always kept when something is).
    pub keep_logs: bool,
    /// The contenders' lock-delay (zero: none). With one, the checker also
    /// checks that no contender already waiting when a holder lost the lock
    /// involuntarily was granted it sooner than the delay after the fault
    /// (unless a contender ahead of it gave up meanwhile, which hands on at
    /// once, as documented).
    pub lock_delay: Duration,
    /// Lock-mode contenders: each takes a lock-mode resource in random
    /// modes, converting while it holds, PW and EX holders writing the
    /// register in the lock's own store with `write_if_held`
    /// ([`contender::modes`](crate::contender::modes)); the checker then judges holders by their
    /// modes ([`checker`](crate::checker)).
    pub modes: bool,
}

impl Config {
    /// The short run of the test suite: 36 s of faults (six runs, each
    /// wanting the machine to itself, fit in about four minutes), 5
    /// contenders, TTL 3 s, recovery within TTL + election time + 6 s.
    pub fn short(backend: Backend, program: PathBuf) -> Self {
        Config {
            backend,
            duration: Duration::from_secs(36),
            seed: 1,
            contenders: 5,
            ttl: Duration::from_secs(3),
            // One request timeout (lockline's default 5 s: a request stuck on a
            // frozen member is given up only then) and 1 s for a loaded machine.
            slack: Duration::from_secs(6),
            program,
            verbose: true,
            kinds: Vec::new(),
            keep_logs: false,
            lock_delay: Duration::ZERO,
            modes: false,
        }
    }

    /// The lock-mode short run: 30 s of the backend's faults with lock-mode
    /// contenders (see [`Config::modes`]).
    pub fn short_modes(backend: Backend, program: PathBuf) -> Self {
        Config {
            duration: Duration::from_secs(30),
            modes: true,
            ..Config::short(backend, program)
        }
    }

    /// The lock-delay mode's short run: 40 s of the faults that take a
    /// holder's lock from it (pause, kill, blackhole, and on PostgreSQL a
    /// reset), with a lock-delay of 1.5 s.
    pub fn short_with_lock_delay(backend: Backend, program: PathBuf) -> Self {
        let kinds = [
            FaultKind::PauseHolder,
            FaultKind::KillHolder,
            FaultKind::BlackholeHolder,
            FaultKind::CutHolder,
        ];
        Config {
            duration: Duration::from_secs(40),
            // A reset frees a lock only where the connection holds it.
            kinds: kinds
                .into_iter()
                .filter(|&k| k != FaultKind::CutHolder || backend.is_sql())
                .collect(),
            lock_delay: Duration::from_millis(1500),
            ..Config::short(backend, program)
        }
    }

    /// The fault kinds the nemesis deals: those named, or the backend's
    /// defaults.
    pub fn kinds(&self) -> Vec<FaultKind> {
        if self.kinds.is_empty() {
            FaultKind::defaults(self.backend)
        } else {
            self.kinds.clone()
        }
    }

    /// TTL + election time + slack, and the lock-delay.
    pub fn recovery_bound(&self) -> Duration {
        self.ttl + self.backend.election_time() + self.slack + self.lock_delay
    }

    /// How long a holder whose connections were reset may go on holding
    /// once the server freed its lock (see [`Backend::reset_notice`]).
    pub fn reset_notice(&self) -> Duration {
        self.backend.reset_notice(self.ttl)
    }

    /// The longest outage (from the kill, the freeze or the cut to the
    /// server's serving again, or the connections' being let through) that
    /// no session may be lost to, on the kinds of
    /// [`Backend::rides_out`]: the loss deadline, less the keepalive
    /// interval (the last confirmed renewal may have been sent that long
    /// before the fault) and 0.4 s for the session to connect again and
    /// renew on a loaded machine. 1 s with a TTL of 3 s (deadline 2.4 s).
    pub fn ride_out(&self) -> Duration {
        let options = lockline::SessionOptions::new().with_ttl(self.ttl);
        options
            .loss_deadline()
            .saturating_sub(options.keepalive_interval())
            .saturating_sub(Duration::from_millis(400))
    }
}
