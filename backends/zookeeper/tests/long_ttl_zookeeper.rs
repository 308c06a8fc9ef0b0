//! A TTL longer than the server's `maxSessionTimeout`: the server grants less,
//! and the session keeps its locks on what it granted instead of declaring
//! them lost halfway through it (found by review: a `--ttl 60` holder on a
//! server capped at 10 s was told its lock was lost after 5 s).

use std::time::Duration;

use lockline::{Client, SessionOptions, SessionState};
use lockline_testkit::{ZkEnsemble, ZkOptions};
use lockline_zookeeper::ZooKeeper;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ttl_above_the_servers_maximum_keeps_its_locks() {
    let max = Duration::from_secs(4);
    let ensemble = ZkEnsemble::start_with(
        1,
        &ZkOptions {
            session_timeout_range: (Duration::from_secs(1), max),
            ..ZkOptions::default()
        },
    )
    .expect("start ZooKeeper");
    let client = Client::new(ZooKeeper::new(ensemble.connect_string()));
    for ttl in [Duration::from_secs(12), Duration::from_secs(60)] {
        let session = client
            .session_with(SessionOptions::new().with_ttl(ttl))
            .await
            .expect("session");
        let guard = session.mutex("long-ttl").expect("mutex").lock().await.expect("lock");
        // What is tested is time passing: twice the server's maximum, held
        // by a healthy session, must not be reported as a loss.
        let lost = tokio::time::timeout(max * 2, guard.lost()).await;
        assert!(
            lost.is_err(),
            "a healthy holder with ttl {ttl:?} was told its lock was lost"
        );
        assert!(guard.is_held());
        assert_eq!(session.state(), SessionState::Live);
        guard.release().await.expect("release");
        session.close().await.expect("close");
    }
}
