//! The conformance suite on a 3-master Redis Cluster started on loopback.
//!
//! Every key of one lock shares its hash tag, so each script runs on one
//! node. The fenced-write cases write keys of other slots than the lock's,
//! which a cluster refuses in one script (CROSSSLOT): they are replaced by
//! `fenced_writes_take_keys_of_the_locks_slot` below, which writes keys
//! carrying the lock's hash tag and checks that others are refused.

use lockline::conformance::{bounded, Fixture};
use lockline::{Client, Error, Session, Write};
use lockline_redis::Redis;
use lockline_testkit::{free_port, RedisCluster};

mod support;

struct ClusterFixture {
    cluster: RedisCluster,
}

impl ClusterFixture {
    fn start() -> Self {
        ClusterFixture {
            cluster: RedisCluster::start(3).expect("start a Redis Cluster"),
        }
    }
}

#[lockline::async_trait]
impl Fixture for ClusterFixture {
    async fn client(&self) -> Client {
        Client::new(Redis::cluster(self.cluster.urls()))
    }

    async fn expire(&self, session: &Session) {
        support::expire(&self.cluster.urls(), session.id()).await;
    }
}

lockline::conformance_tests!(@cases ClusterFixture::start();
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
    leader_selector_survives_leader_kills,
    lock_delay_holds_back_after_an_involuntary_loss_only,
);

/// On a cluster a fenced write takes keys of the lock's slot (its hash tag
/// `{name}`); a key of another slot is refused as invalid, and nothing of
/// the batch is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fenced_writes_take_keys_of_the_locks_slot() {
    let fixture = ClusterFixture::start();
    let client = fixture.client().await;
    let session = bounded("session", client.session()).await.expect("session");
    let guard = bounded("lock", session.mutex("reports").expect("mutex").lock())
        .await
        .expect("lock");
    bounded(
        "write",
        guard.write_if_held([Write::put("{reports}/state", "1"), Write::put("{reports}/owner", "me")]),
    )
    .await
    .expect("keys of the lock's slot are written");
    assert_eq!(
        session.read("{reports}/state").await.expect("read").as_deref(),
        Some(&b"1"[..])
    );
    // Keys of another slot than the lock's: refused, nothing written.
    let other = (0..64).map(|i| format!("elsewhere-{i}")).collect::<Vec<_>>();
    match bounded(
        "a cross-slot write",
        guard.write_if_held(
            std::iter::once(Write::put("{reports}/state", "2")).chain(other.iter().map(|k| Write::put(k, "x"))),
        ),
    )
    .await
    {
        Err(Error::InvalidName { reason, .. }) => assert!(reason.contains("hash tag"), "{reason}"),
        other => panic!("a cross-slot fenced write must be refused, got {other:?}"),
    }
    assert_eq!(
        session.read("{reports}/state").await.expect("read").as_deref(),
        Some(&b"1"[..]),
        "a refused batch was partly written"
    );
    guard.release().await.expect("release");
}

/// The session's pub/sub connection is made to the first node that answers,
/// not only to the first URL given: with that seed node down (the command
/// connection goes through the others), a waiter's subscription still
/// reaches the cluster and the release wakes it, once (found by review:
/// waiters heard nothing and fell back to reading the queue on every failed
/// reconnection).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_seed_node_that_is_down_does_not_silence_releases() {
    let fixture = ClusterFixture::start();
    let dead = format!("redis://127.0.0.1:{}", free_port().expect("port"));
    let urls = std::iter::once(dead).chain(fixture.cluster.urls()).collect::<Vec<_>>();
    let client = Client::new(Redis::cluster(urls));
    let holder = bounded("session", client.session()).await.expect("session");
    let other = bounded("session", client.session()).await.expect("session");
    let held = bounded("lock", holder.mutex("seeds").expect("mutex").lock())
        .await
        .expect("lock");
    let waiter = {
        let mutex = other.mutex("seeds").expect("mutex");
        tokio::spawn(async move { mutex.lock().await })
    };
    client.wait_for_stats(|s| s.waits >= 1).await;
    let mut nodes = Vec::new();
    for url in fixture.cluster.urls() {
        nodes.push(support::side(&url).await);
    }
    bounded("the waiter's subscription on a node", async {
        loop {
            let mut subscribed = 0;
            for node in &mut nodes {
                let channels: Vec<String> = redis::cmd("PUBSUB")
                    .arg("CHANNELS")
                    .arg("{seeds}:c:*")
                    .query_async(node)
                    .await
                    .expect("PUBSUB CHANNELS");
                subscribed += channels.len();
            }
            if subscribed > 0 {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    })
    .await;
    let wakeups = client.stats().wakeups;
    held.release().await.expect("release");
    let guard = bounded("granted", waiter).await.expect("task").expect("lock");
    assert_eq!(client.stats().wakeups - wakeups, 1, "one wakeup for the one release");
    guard.release().await.expect("release");
}
