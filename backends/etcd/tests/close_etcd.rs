//! `Session::close` on etcd revokes the lease, which deletes every entry of
//! the session at once. The session's own watches (one per held lock) must
//! be gone before that: a session holding 100,000 locks was otherwise sent
//! 100,000 small deletion events at once, which the HTTP/2 layer took for a
//! flood of small frames and answered by closing the connection, losing the
//! revoke's answer (`scale_etcd` measures that case).

use lockline::Client;
use lockline_etcd::etcd_client::{self, EventType, WatchOptions};
use lockline_etcd::{watch_events, Etcd};
use lockline_testkit::EtcdCluster;

const LOCKS: usize = 200;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closing_session_hears_none_of_its_own_deletions() {
    let cluster = EtcdCluster::start().expect("start etcd");
    let session = Client::new(Etcd::new(cluster.endpoints()))
        .session()
        .await
        .expect("session");
    let mut guards = Vec::with_capacity(LOCKS);
    for i in 0..LOCKS {
        guards.push(
            session
                .mutex(&format!("close/{i}"))
                .expect("mutex")
                .lock()
                .await
                .expect("lock"),
        );
    }
    // Another client sees every deletion the revoke makes.
    let mut plain = etcd_client::Client::connect(cluster.endpoints(), None)
        .await
        .expect("plain client");
    let mut deletions = plain
        .watch("close/", Some(WatchOptions::new().with_prefix()))
        .await
        .expect("watch");
    let sent = |cluster: &EtcdCluster| -> u64 {
        let metrics = cluster.metrics(0).expect("metrics");
        metrics
            .lines()
            .find_map(|l| l.strip_prefix("etcd_debugging_mvcc_events_total "))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .expect("etcd_debugging_mvcc_events_total") as u64
    };
    let before = watch_events(&session).expect("an etcd session");
    let sent_before = sent(&cluster);
    session.close().await.expect("close");
    // Each lock has an entry, and no hand-over marker: no contender with a
    // lock-delay flagged these locks, so the close wrote no `closing` into
    // one before the revoke. The revoke deletes the entries.
    let mut deleted = 0;
    while deleted < LOCKS {
        let response = deletions.message().await.expect("watch answers").expect("watch open");
        deleted += response
            .events()
            .iter()
            .filter(|e| e.event_type() == EventType::Delete)
            .count();
    }
    // By now the revoke's events have gone out to every watcher left.
    let heard = watch_events(&session).expect("an etcd session") - before;
    assert_eq!(heard, 0, "the closing session took in {heard} of its own deletions");
    // The server sent each event to the other client only: the deletions
    // of the entries, and nothing for markers.
    let sent = sent(&cluster) - sent_before;
    assert_eq!(
        sent, LOCKS as u64,
        "the server sent {sent} events for {LOCKS} deletions"
    );
    for guard in &guards {
        assert!(!guard.is_held());
    }
}
