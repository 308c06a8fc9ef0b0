//! A waiter opens two watches (on the entry it waits for, and on its own
//! entry) after the read that showed both entries. A watch the server started
//! no later than that read needs no read of its own; one started later does,
//! since the entry may have gone in between. These tests delete the entries
//! at every moment of that set-up, many times over, and require the wait to
//! end each time: granted when the predecessor went, an error when its own
//! entry went. A deletion missed in the gap would hang the waiter.

use std::time::Duration;

use lockline::{Client, Error};
use lockline_etcd::etcd_client::{self, EventType, WatchOptions};
use lockline_etcd::Etcd;
use lockline_testkit::EtcdCluster;

const ROUNDS: u64 = 120;

/// Up to ~2 ms, a different pause each round (no randomness: reproducible).
fn pause(round: u64) -> Duration {
    Duration::from_micros((round * 7919) % 2000)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_predecessor_released_while_the_wait_sets_up_is_never_waited_on() {
    let cluster = EtcdCluster::start().expect("start etcd");
    let client = Client::new(Etcd::new(cluster.endpoints()));
    let (holder, waiter) = (
        client.session().await.expect("session"),
        client.session().await.expect("session"),
    );
    for round in 0..ROUNDS {
        let name = format!("setup/{round}");
        let held = holder.mutex(&name).expect("mutex").lock().await.expect("lock");
        let mutex = waiter.mutex(&name).expect("mutex");
        let waiting = tokio::spawn(async move { mutex.lock_timeout(Duration::from_secs(10)).await });
        tokio::time::sleep(pause(round)).await;
        held.release().await.expect("release");
        let granted = waiting
            .await
            .expect("task")
            .unwrap_or_else(|e| panic!("round {round}: the waiter missed its predecessor's release: {e}"));
        granted.release().await.expect("release");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiters_own_entry_deleted_while_the_wait_sets_up_ends_the_wait() {
    let cluster = EtcdCluster::start().expect("start etcd");
    let client = Client::new(Etcd::new(cluster.endpoints()));
    let holder = client.session().await.expect("session");
    let mut plain = etcd_client::Client::connect(cluster.endpoints(), None)
        .await
        .expect("plain client");
    for round in 0..ROUNDS {
        let name = format!("own/{round}");
        let _held = holder.mutex(&name).expect("mutex").lock().await.expect("lock");
        // A session per round: its entry is deleted under it, which the
        // session itself survives, but each round starts clean.
        let waiter = client.session().await.expect("session");
        let key = format!("{name}/{}", waiter.id());
        let mut watch = plain
            .watch(key.as_str(), Some(WatchOptions::new()))
            .await
            .expect("watch");
        let mutex = waiter.mutex(&name).expect("mutex");
        let waiting = tokio::spawn(async move { mutex.lock_timeout(Duration::from_secs(10)).await });
        // The waiter's entry is created: delete it a moment later.
        'created: while let Some(response) = watch.message().await.expect("watch answers") {
            if response.events().iter().any(|e| e.event_type() == EventType::Put) {
                break 'created;
            }
        }
        tokio::time::sleep(pause(round)).await;
        plain.delete(key.as_str(), None).await.expect("delete");
        match waiting.await.expect("task") {
            Err(Error::LockLost { .. }) => {}
            Err(Error::Timeout { .. }) => panic!("round {round}: the waiter missed the deletion of its own entry"),
            other => panic!("round {round}: expected LockLost, got {other:?}"),
        }
        waiter.close().await.expect("close");
    }
}
