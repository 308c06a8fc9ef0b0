//! A primary and its replica: the primary is killed and the replica
//! promoted. What Redis's asynchronous replication allows, and what lockline
//! promises anyway: the old holder is told `lost()` before anyone is granted
//! on the promoted replica, tokens keep growing where the counter was
//! replicated, and a resource fenced with the tokens turns the stale holder
//! away.

use std::time::{Duration, Instant};

use lockline::conformance::bounded;
use lockline::{Client, Error, SessionOptions};
use lockline_redis::Redis;
use lockline_testkit::{RedisOptions, RedisServer};

fn options() -> SessionOptions {
    SessionOptions::new()
        .with_ttl(Duration::from_secs(3))
        .with_connect_timeout(Duration::from_secs(2))
        .with_request_timeout(Duration::from_secs(1))
}

/// A resource that remembers the highest token it accepted and refuses lower
/// ones (Kleppmann's fencing).
#[derive(Default)]
struct Fenced {
    highest: u64,
    writes: Vec<(u64, &'static str)>,
}

impl Fenced {
    fn write(&mut self, token: u64, what: &'static str) -> bool {
        if token < self.highest {
            return false;
        }
        self.highest = token;
        self.writes.push((token, what));
        true
    }
}

fn replica_of(primary: &RedisServer) -> RedisServer {
    let replica = RedisServer::start_with(&RedisOptions {
        replica_of: Some(primary.port()),
        ..RedisOptions::default()
    })
    .expect("start the replica");
    let deadline = Instant::now() + Duration::from_secs(20);
    while !replica
        .cli(&["info", "replication"])
        .is_ok_and(|info| info.contains("master_link_status:up"))
    {
        assert!(Instant::now() < deadline, "the replica did not sync");
        std::thread::sleep(Duration::from_millis(50));
    }
    replica
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_failover_the_old_holder_is_told_first_and_fenced_out() {
    let mut primary = RedisServer::start().expect("start the primary");
    let replica = replica_of(&primary);
    // Every write waits for the replica: the grant and the counter are there
    // before the holder is told it holds.
    let acked = Redis::new(primary.url()).with_replica_acks(1, Duration::from_secs(1));
    let old = Client::new(acked).session_with(options()).await.expect("session");
    let held = old.mutex("failover").expect("mutex").lock().await.expect("lock");
    let old_token = held.token().get();
    let mut resource = Fenced::default();
    assert!(resource.write(old_token, "old holder, before the failover"));

    primary.member().kill().expect("kill the primary");
    replica.cli(&["replicaof", "no", "one"]).expect("promote the replica");

    let promoted = Client::new(Redis::new(replica.url()));
    let new = promoted
        .session_with(options())
        .await
        .expect("session on the promoted replica");
    let mutex = new.mutex("failover").expect("mutex");
    let waiter = tokio::spawn(async move {
        let guard = mutex.lock().await;
        (Instant::now(), guard)
    });
    bounded("the old holder is told", held.lost()).await;
    let told_at = Instant::now();
    let (granted_at, guard) = bounded("a holder on the promoted replica", waiter).await.expect("task");
    let guard = guard.expect("lock");
    assert!(
        told_at <= granted_at,
        "the new holder was granted {:?} before the old one was told",
        told_at - granted_at
    );
    let new_token = guard.token().get();
    assert!(
        new_token > old_token,
        "the replicated counter goes on: {new_token} after {old_token}"
    );
    assert!(resource.write(new_token, "new holder"));
    // The old holder, paused through all of this, wakes and writes: fenced out.
    assert!(!resource.write(old_token, "old holder, after the failover"));
    assert_eq!(resource.writes.last(), Some(&(new_token, "new holder")));
    guard.release().await.expect("release");
}

/// Asking for replica acknowledgement with no replica attached: writes are
/// not confirmed, and say why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replica_acks_without_a_replica_are_unavailable() {
    let server = RedisServer::start().expect("start redis");
    let acked = Redis::new(server.url()).with_replica_acks(1, Duration::from_millis(100));
    let session = Client::new(acked).session_with(options()).await.expect("session");
    match session
        .mutex("unacked")
        .expect("mutex")
        .lock_timeout(Duration::from_secs(1))
        .await
    {
        Err(Error::Unavailable { reason, .. }) => assert!(reason.contains("replica"), "{reason}"),
        Err(Error::Timeout { .. }) => {}
        other => panic!("an unacknowledged append must not be a grant, got {other:?}"),
    }
    // The renewals are not confirmed either: the session is given up.
    bounded("the session is lost", session.lost()).await;
    assert!(matches!(
        Client::new(Redis::cluster([server.url()]).with_replica_acks(1, Duration::from_millis(100)))
            .session_with(options())
            .await,
        Err(Error::InvalidOptions { .. })
    ));
}
