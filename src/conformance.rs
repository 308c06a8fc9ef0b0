//! The conformance suite: one set of behavioural cases that every backend must
//! pass (DESIGN §7), generic over a [`Fixture`].
//!
//! A backend's tests implement [`Fixture`] and expand [`conformance_tests!`](crate::conformance_tests),
//! which declares one `#[tokio::test]` per case so that a failure names its case:
//!
//! ```text
//! lockline::conformance_tests!(MyFixture::start().await);
//! ```
//!
//! Every case panics (fails) on a wrong behaviour: this module is a test
//! suite, compiled only with the `conformance` feature, and its `expect`s and
//! `panic!`s are its assertions. None waits by sleeping. Where
//! a case must wait for something to happen elsewhere ("the waiter has queued")
//! it awaits the event through [`Client::wait_for_stats`]; every wait is bounded
//! by [`BOUND`] so that a broken backend fails instead of hanging.
//!
//! The cases live in one file per family, all re-exported here: exclusion
//! and order (`exclusion`), cancellation, fencing and fenced writes
//! (`fencing`), loss, recipes, sequencers and lock-delay (`sequencers`),
//! multi-locks (`multi_lock`), options and names (`names`), and the lock
//! modes (`lock_modes`). This file holds the [`Fixture`] and the helpers
//! every family uses.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use async_trait::async_trait;

mod cancellation;
mod exclusion;
mod fencing;
mod lock_modes;
mod loss;
mod multi_lock;
mod names;
mod recipes;
mod sequencers;

pub use cancellation::*;
pub use exclusion::*;
pub use fencing::*;
pub use lock_modes::*;
pub use loss::*;
pub use multi_lock::*;
pub use names::*;
pub use recipes::*;
pub use sequencers::*;

use crate::{
    Client, ClientStats, Error, FencingToken, LeaderSelector, Mutex, MutexGuard, Session, SessionOptions, Term, Write,
};

/// The longest any single step of a case may take before the case fails.
pub const BOUND: Duration = Duration::from_secs(20);

/// Opens clients of one backend and can end a session from outside.
#[async_trait]
pub trait Fixture: Send + Sync + 'static {
    /// A new client on the cluster under test, as another process would open.
    async fn client(&self) -> Client;

    /// Session options for the cases. No case waits for a TTL to run out
    /// (expiry is forced with [`expire`](Self::expire)), so the TTL only
    /// sets how long a session may go unconfirmed before its client declares
    /// it lost: long enough that a server slowed by the cases running in
    /// parallel on a small machine does not lose sessions the case relies on
    /// (6 s was not, on 2 cores kept busy beside the whole suite: a
    /// ZooKeeper session over TLS and PostgreSQL sessions among 33 were
    /// lost mid-case).
    fn options(&self) -> SessionOptions {
        SessionOptions::new().with_ttl(Duration::from_secs(12))
    }

    /// Ends `session` on the server from outside, as an expiry would (etcd:
    /// revoke its lease from another client; ZooKeeper: close it from a second
    /// connection; memory: [`MemoryBackend::expire`](crate::MemoryBackend::expire)).
    async fn expire(&self, session: &Session);

    /// Resolves once the server holds `session`'s watch on the entry `key`,
    /// for a case that must not end that entry before its waiter's watch is
    /// set: the waiter counts as waiting just before it sends the request
    /// that sets the watch. A backend that cannot tell how an entry went
    /// that was already gone when the watch was asked for (ZooKeeper keeps
    /// no trace) takes that departure for a release; [`expire`](Self::expire)
    /// may also hold the waiter's request back until after the expiry. The
    /// default returns at once (etcd replays a deletion from its history).
    async fn watch_set(&self, session: &Session, key: &str) {
        let _ = (session, key);
    }
}

/// Bounds a step of a case; a step that takes longer than [`BOUND`] fails the case.
pub async fn bounded<T>(what: &str, step: impl Future<Output = T>) -> T {
    match tokio::time::timeout(BOUND, step).await {
        Ok(value) => value,
        Err(_) => panic!("{what}: did not happen within {BOUND:?}"),
    }
}

/// [`Client::wait_for_stats`] bounded by [`BOUND`]: a test's wait for an
/// event counted by the client ("the waiter has queued"). A predicate that
/// never holds (the waiter was granted at once, its holder gone before it
/// queued) fails the test, naming the line that waited, instead of hanging
/// it.
///
/// # Cancel safety
///
/// Cancel safe: it only observes.
#[track_caller]
pub fn wait_for_stats<'a>(
    client: &'a Client,
    predicate: impl FnMut(&ClientStats) -> bool + Send + 'a,
) -> impl Future<Output = ClientStats> + Send + 'a {
    let caller = std::panic::Location::caller();
    async move {
        match tokio::time::timeout(BOUND, client.wait_for_stats(predicate)).await {
            Ok(stats) => stats,
            // The suite's assertion, as in `bounded`: this module is compiled
            // for tests only (the `conformance` feature), where a panic fails
            // the case.
            Err(_) => panic!(
                "the client's counters did not reach what {caller} waits for within {BOUND:?}: {:?}",
                client.stats()
            ),
        }
    }
}

/// Waits until `condition` holds, probing every 5 ms, for at most [`BOUND`]:
/// for state that has no event to await (a test proxy's byte counters,
/// another process's files).
pub async fn until(what: &str, condition: impl Fn() -> bool) {
    bounded(what, async {
        while !condition() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
}

async fn session<F: Fixture>(fixture: &F, client: &Client) -> Session {
    bounded("open a session", client.session_with(fixture.options()))
        .await
        .expect("open a session")
}

async fn lock(mutex: &Mutex) -> MutexGuard {
    bounded("lock", mutex.lock()).await.expect("lock")
}

async fn keys(mutex: &Mutex) -> Vec<String> {
    bounded("list contenders", mutex.contenders())
        .await
        .expect("list contenders")
        .into_iter()
        .map(|e| e.key)
        .collect()
}

fn unique(name: &str) -> String {
    format!("conformance/{name}-{}", uuid::Uuid::new_v4().simple())
}

/// Spawns `acquire` (a `lock()`, `read()`, `campaign()`, ... on a session of
/// `client`) on its own task and returns once it is queued and waiting on its
/// predecessor, as `client`'s `waits` counter tells.
pub async fn spawn_queued<T, F>(client: &Client, acquire: F) -> tokio::task::JoinHandle<T>
where
    F: Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    let before = client.stats().waits;
    let task = tokio::spawn(acquire);
    bounded("the waiter queues", client.wait_for_stats(|s| s.waits > before)).await;
    task
}

async fn queue_waiter(client: &Client, mutex: Mutex) -> tokio::task::JoinHandle<crate::Result<MutexGuard>> {
    spawn_queued(client, async move { mutex.lock().await }).await
}

/// Polls a future once.
fn poll_once<F: Future + Unpin>(future: &mut F) -> Poll<F::Output> {
    let waker = futures_noop_waker();
    let mut cx = Context::from_waker(&waker);
    Pin::new(future).poll(&mut cx)
}

fn futures_noop_waker() -> std::task::Waker {
    std::task::Waker::noop().clone()
}

/// Declares one `#[tokio::test]` per conformance case, each with a fixture made
/// by the given expression (which may `.await`).
#[macro_export]
macro_rules! conformance_tests {
    ($fixture:expr) => {
        $crate::conformance_tests!(@cases $fixture;
            mutual_exclusion,
            fifo_order_and_increasing_tokens,
            one_wakeup_per_release,
            try_lock_leaves_no_entry,
            lock_timeout_leaves_no_entry,
            lock_timeout_zero_is_one_try,
            queue_lists_holder_then_waiters,
            cancelled_lock_leaves_no_entry,
            fenced_release_spares_newer_holder,
            fenced_remove_primitive,
            session_loss,
            same_session_contention,
            dropped_guard_releases,
            invalid_input_is_rejected,
            closed_session_rejects_use,
            readers_share_writers_exclude,
            waiting_writer_is_not_starved,
            rwlock_exclusion_under_load,
            semaphore_bound_is_never_exceeded,
            semaphore_waits_herd_free,
            cancelled_recipes_leave_no_entry,
            election_observe_and_session_loss,
            recipe_words_and_nested_names_are_separate_locks,
            fenced_write_lands_while_held,
            fenced_write_refused_after_session_loss,
            fenced_write_refused_after_entry_deleted,
            fenced_write_batch_is_all_or_nothing,
            leader_selector_survives_leader_kills,
            sequencers_are_current_only_while_held,
            multi_locks_are_all_or_nothing_and_never_deadlock,
            lock_modes_follow_the_matrix,
            lock_modes_never_bypass_a_waiter,
            lock_modes_convert_down_at_once,
            lock_modes_convert_up_with_priority,
            lock_modes_detect_conversion_deadlock,
            lock_modes_value_block,
            lock_modes_release_hands_over,
            lock_modes_waiter_dropped_as_it_is_handed_the_lock,
            lock_modes_tell_holders_they_block,
            lock_modes_leave_nothing_when_given_up,
            lock_modes_fence_and_lose,
            lock_modes_mixed_crowd_is_herd_free,
            lock_modes_multi_resource_all_or_nothing,
        );
    };
    (@cases $fixture:expr; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                let fixture = $fixture;
                $crate::conformance::$case(&fixture).await;
            }
        )*
    };
}
