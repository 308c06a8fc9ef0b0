//! The conformance suite on a 3-master Redis Cluster started on loopback.
//!
//! Every key of one lock shares its hash tag, so each script runs on one
//! node. The fenced-write cases write keys of other slots than the lock's,
//! which a cluster refuses in one script (CROSSSLOT): they are replaced by
//! `fenced_writes_take_keys_of_the_locks_slot` below, which writes keys
//! carrying the lock's hash tag and checks that others are refused; so is
//! the lock-mode case `lock_modes_fence_and_lose`, by
//! `lock_modes_fence_and_lose_in_the_locks_slot`.

use lockline::conformance::{bounded, Fixture};
use lockline::{Client, Error, LockMode, Session, Write};
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
    lock_modes_mixed_crowd_is_herd_free,
    lock_modes_multi_resource_all_or_nothing,
    lock_modes_lock_delay_after_an_involuntary_loss_only,
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
    lockline::conformance::wait_for_stats(&client, |s| s.waits >= 1).await;
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

/// `lock_modes_fence_and_lose` of the conformance suite, its fenced write
/// made to a key of the resource's slot (`{name}/state`): an up-conversion
/// to a writing mode takes a token above the writer that came and went,
/// sequencers name the mode and stop checking once released, a PW holder
/// writes fenced, no other recipe queues under the resource's name (nor it
/// under a mutex's), and a lost holder is told while another takes EX.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_modes_fence_and_lose_in_the_locks_slot() {
    let fixture = ClusterFixture::start();
    let (ca, cb) = (fixture.client().await, fixture.client().await);
    let a = bounded("session", ca.session()).await.expect("session");
    let b = bounded("session", cb.session()).await.expect("session");
    let name = "fence";
    let lock = |session: &Session, mode: LockMode| {
        let resource = session.resource(name).expect("resource");
        async move { bounded("lock in a mode", resource.lock(mode)).await.expect("lock") }
    };
    let mut reader = lock(&a, LockMode::Cr).await;
    let writer = lock(&b, LockMode::Pw).await;
    let seen = writer.token();
    let sequencer = writer.sequencer();
    assert_eq!(sequencer.to_string().split(':').nth(1), Some("lock-PW"));
    assert!(bounded("check", ca.check(&sequencer)).await.expect("check"));
    bounded("release", writer.release()).await.expect("release");
    assert!(!bounded("check", ca.check(&sequencer)).await.expect("check"));
    bounded("CR to PW", reader.convert(LockMode::Pw))
        .await
        .expect("convert");
    assert!(reader.token() > seen, "above the writer that came and went");
    bounded(
        "a PW fenced write",
        reader.write_if_held([Write::put("{fence}/state", "1")]),
    )
    .await
    .expect("PW writes while held");
    assert_eq!(a.read("{fence}/state").await.expect("read").as_deref(), Some(&b"1"[..]));
    match bounded("a mutex under the name", a.mutex(name).expect("mutex").try_lock()).await {
        Err(Error::InvalidName { .. }) => {}
        other => panic!("a mutex must not queue with lock modes: {other:?}"),
    }
    let mutex = bounded("lock", b.mutex("mutex-first").expect("mutex").lock())
        .await
        .expect("lock");
    match bounded(
        "a resource under a mutex's name",
        b.resource("mutex-first").expect("resource").try_lock(LockMode::Nl),
    )
    .await
    {
        Err(Error::InvalidName { .. }) => {}
        other => panic!("lock modes must not queue with a mutex: {other:?}"),
    }
    bounded("release", mutex.release()).await.expect("release");
    fixture.expire(&a).await;
    bounded("the lost holder is told", reader.lost()).await;
    assert!(!reader.is_held());
    let next = lock(&b, LockMode::Ex).await;
    bounded("release", next.release()).await.expect("release");
}
