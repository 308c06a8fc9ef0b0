//! Attacks on the six DLM lock modes (`Resource`), their conversions, the
//! lock value block, blocking notifications and multi-resource locks, on the
//! in-process backend.
//!
//! Tests whose name starts with `regression_` each reproduce a defect an
//! outside review found (the smallest reproduction; its doc comment says
//! why it happened and how it is fixed): they pass now and guard the fix.
//! `held_` and `stress_` tests are attacks that held from the start.
//!
//! Some attacks need an answer "in flight": the operation applied in the
//! store while its caller has not resumed yet, which is what every real
//! backend's round trip is. The memory backend answers synchronously, so
//! `Gated` wraps it: it delegates every primitive to a `MemoryBackend` and
//! can stop one session's next call of one primitive *after* the store
//! applied it (a trap), or yield after every call (for cancellation at
//! every await point).
//!
//! One test binary, a module per family: `regressions`, `held` (attacks
//! that held), `stress` (randomized, with a checker), `deadlock_oracle`,
//! `handover`; `gated` is the trapping backend they share.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::future::Future;
use std::pin::pin;
use std::sync::{Arc, Mutex as Std};
use std::time::Duration;

use futures::poll;
use lockline::async_trait;
use lockline::backend::{
    AppendRequest, Appended, Backend, BackendSession, Conflicts, Departure, Earlier, Entry, Queue, QueueUpdate,
    WAITING_EX,
};
use lockline::{
    Client, EntryKind, Error, LockMode, MemoryBackend, ModeContender, Resource, ResourceGuard, Session, SessionOptions,
    SessionState, Write,
};
use tokio::sync::{oneshot, watch};
use tokio::time::Instant;

use LockMode::*;

mod cancelled_conversions;
mod deadlock_oracle;
mod gated;
mod handover;
mod held;
mod regressions;
mod stress;
mod try_deadlocks;
mod value_block_races;

use gated::*;
use stress::Rng;

// ---------------------------------------------------------------------------
// Helpers.

const PATIENCE: Duration = Duration::from_secs(10);
/// How long a test gives something that should happen at once (a grant, a
/// notification, a deadlock error) before calling it a hang.
const SHORT: Duration = Duration::from_secs(2);

async fn bounded<T>(what: &str, future: impl Future<Output = T>) -> T {
    match tokio::time::timeout(PATIENCE, future).await {
        Ok(value) => value,
        Err(_) => panic!("{what}: no outcome within {PATIENCE:?}"),
    }
}

async fn lock(resource: &Resource, mode: LockMode) -> ResourceGuard {
    bounded("lock", resource.lock(mode))
        .await
        .unwrap_or_else(|e| panic!("lock {} in {mode}: {e}", resource.name()))
}

async fn listed(resource: &Resource) -> Vec<ModeContender> {
    bounded("contenders", resource.contenders()).await.expect("contenders")
}

/// The granted modes of a queue are pairwise compatible.
fn compatible_holders(queue: &[ModeContender]) -> Result<(), String> {
    let granted: Vec<(&str, LockMode)> = queue
        .iter()
        .filter_map(|c| c.granted.map(|g| (c.key.as_str(), g)))
        .collect();
    for (i, (ka, a)) in granted.iter().enumerate() {
        for (kb, b) in &granted[i + 1..] {
            if !a.compatible(*b) {
                return Err(format!("{ka} granted {a} beside {kb} granted {b}"));
            }
        }
    }
    Ok(())
}

fn modes(queue: &[ModeContender]) -> Vec<(Option<LockMode>, LockMode)> {
    queue.iter().map(|c| (c.granted, c.requested)).collect()
}

async fn memory_sessions(n: usize) -> (MemoryBackend, Vec<(Client, Session)>) {
    let store = MemoryBackend::new();
    let mut out = Vec::new();
    for _ in 0..n {
        let client = Client::new(store.clone());
        let session = client.session().await.expect("session");
        out.push((client, session));
    }
    (store, out)
}

/// Waits until `resource`'s queue satisfies `predicate` (the store offers no
/// event for "somebody else's entry changed"; a bounded poll of one read).
async fn until_queue(resource: &Resource, what: &str, mut predicate: impl FnMut(&[ModeContender]) -> bool) {
    bounded(what, async {
        loop {
            if predicate(&listed(resource).await) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
}

/// A client of its own on `backend`, and a session of it with a lock-delay
/// of `delay`.
async fn delayed_session(backend: impl Backend, delay: Duration) -> (Client, Session) {
    let client = Client::new(backend);
    let session = client
        .session_with(SessionOptions::new().with_lock_delay(delay))
        .await
        .unwrap();
    (client, session)
}

/// The queue the lock-delay hand-over attacks start from, each session on a
/// client of its own on `backend`: A holds PR on `name`; X, with a
/// lock-delay of `delay`, waits for EX; Y waits for EX behind X.
struct ReaderThenDelayedWriter {
    /// A's, X's and Y's clients.
    clients: [Client; 3],
    a: Session,
    x: Session,
    y: Session,
    /// A's PR guard.
    reader: ResourceGuard,
    /// X's request: when it ended, and how.
    waiting: tokio::task::JoinHandle<(Instant, lockline::Result<ResourceGuard>)>,
    /// Y's request.
    behind: tokio::task::JoinHandle<lockline::Result<ResourceGuard>>,
}

async fn reader_then_delayed_writer(
    backend: impl Backend + Clone,
    name: &str,
    delay: Duration,
) -> ReaderThenDelayedWriter {
    let ca = Client::new(backend.clone());
    let a = ca.session().await.unwrap();
    let (cx, x) = delayed_session(backend.clone(), delay).await;
    let cy = Client::new(backend);
    let y = cy.session().await.unwrap();
    let reader = lock(&a.resource(name).unwrap(), Pr).await;
    let rx = x.resource(name).unwrap();
    let waiting = tokio::spawn(async move {
        let outcome = rx.lock(Ex).await;
        (Instant::now(), outcome)
    });
    bounded("X waits", cx.wait_for_stats(|st| st.waits >= 1)).await;
    let ry = y.resource(name).unwrap();
    let behind = tokio::spawn(async move { ry.lock(Ex).await });
    bounded("Y waits", cy.wait_for_stats(|st| st.waits >= 1)).await;
    ReaderThenDelayedWriter {
        clients: [ca, cx, cy],
        a,
        x,
        y,
        reader,
        waiting,
        behind,
    }
}
