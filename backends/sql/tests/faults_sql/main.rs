//! The SQL backend when things go wrong, on PostgreSQL and on MariaDB: a
//! killed holder, a silently partitioned one, a paused one with a fenced
//! transaction open, a database restart, a crowd of cancelled waiters.
//!
//! One test binary, a module per family: `departures` (killed and silent
//! holders, lock-delay), `appends` (cancelled and retried), `fenced_transactions`,
//! `restarts` (and the restart grace), `reset_grace`, `value_block` (after a
//! crash).

use std::time::{Duration, Instant};

use lockline::backend::{AppendRequest, Conflicts};
use lockline::conformance::{bounded, until};
use lockline::{Client, EntryKind, Error, LockMode, Session, SessionState};
use lockline_sql::Sql;
use lockline_testkit::TcpProxy;

#[macro_use]
#[path = "../support/mod.rs"]
mod support;

use support::db::{spawn_probe, Db};
use support::options;

mod appends;
mod departures;
mod fenced_transactions;
mod reset_grace;
mod restarts;
mod value_block;

/// Crashes and restarts the database off the async workers.
async fn crash_and_restart(mut db: Db) -> Db {
    let restarted = tokio::task::spawn_blocking(move || {
        db.crash_and_restart();
        db
    });
    bounded("the database restarts", restarted).await.expect("restart")
}

/// What a timed waiter's task answers: when it was granted, and its guard.
type Granted = tokio::task::JoinHandle<(Instant, lockline::Result<lockline::MutexGuard>)>;

/// Spawns a waiter for `name` on `session`, a session of `client`, and
/// returns once `client` counts a wait: its task answers when it was
/// granted, with its guard.
async fn timed_waiter(client: &Client, session: &Session, name: &str) -> Granted {
    let mutex = session.mutex(name).expect("mutex");
    let waiter = tokio::spawn(async move {
        let guard = mutex.lock().await;
        (Instant::now(), guard)
    });
    lockline::conformance::wait_for_stats(client, |s| s.waits >= 1).await;
    waiter
}
