//! A server killed and restarted under a held and a queued lock: without
//! persistence every session is lost; with an append-only file the queue
//! survives.

use super::*;

/// What a lock's waiter answers.
type Waiter = tokio::task::JoinHandle<lockline::Result<lockline::MutexGuard>>;

/// On `server`, one session of a client holds `name` and another waits for
/// it (both with a TTL of `ttl_ms`); then the server is killed and
/// restarted. Returns the client, both sessions, the holder's guard and the
/// waiter.
async fn restarted_under_a_queue(
    server: &mut RedisServer,
    name: &str,
    ttl_ms: u64,
) -> (Client, Session, Session, lockline::MutexGuard, Waiter) {
    let client = Client::new(Redis::new(server.url()));
    let (a, b) = (
        client.session_with(options(ttl_ms)).await.expect("session"),
        client.session_with(options(ttl_ms)).await.expect("session"),
    );
    let held = a.mutex(name).expect("mutex").lock().await.expect("lock");
    let waiter = {
        let mutex = b.mutex(name).expect("mutex");
        tokio::spawn(async move { mutex.lock().await })
    };
    lockline::conformance::until("the waiter queues", || client.stats().waits >= 1).await;
    server.member().kill().expect("kill redis");
    server.restart().expect("restart redis");
    (client, a, b, held, waiter)
}

/// A server restarted without persistence has forgotten every session:
/// holders hear `lost()`, waiters fail with `SessionLost`, nothing hangs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_without_persistence_loses_every_session() {
    let mut server = RedisServer::start().expect("start redis");
    let (client, a, b, held, waiter) = restarted_under_a_queue(&mut server, "restart", 3000).await;
    bounded("the holder hears of it", held.lost()).await;
    assert!(!held.is_held());
    match bounded("the waiter fails", waiter).await.expect("task") {
        Err(Error::SessionLost { .. }) => {}
        other => panic!("a waiter of a forgotten session must fail with SessionLost, got {other:?}"),
    }
    assert_eq!(a.state(), SessionState::Lost);
    assert_eq!(b.state(), SessionState::Lost);
    // A new session works on the restarted server.
    let fresh = client.session_with(options(3000)).await.expect("a new session");
    let again = fresh.mutex("restart").expect("mutex").lock().await.expect("lock again");
    again.release().await.expect("release");
}

/// With an append-only file the queue survives a restart within the TTL:
/// the holder keeps its lock and the waiter is granted after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_aof_the_queue_survives_a_restart() {
    let mut server = RedisServer::start_with(&RedisOptions {
        append_only: true,
        ..RedisOptions::default()
    })
    .expect("start redis");
    let (_client, a, _b, held, waiter) = restarted_under_a_queue(&mut server, "aof", 6000).await;
    // Renewals go on against the restarted server: the holder's entry, read
    // back from the append-only file, has its TTL raised again (the server
    // is another process, with no event to await: look every 20 ms).
    let mut side = support::side(&server.url()).await;
    let restored: i64 = side.pttl(held.key()).await.expect("pttl");
    assert!(restored > 0, "the entry did not survive the restart");
    bounded("a renewal on the restarted server", async {
        loop {
            let left: i64 = side.pttl(held.key()).await.expect("pttl");
            if left > restored {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert_eq!(a.state(), SessionState::Live);
    assert!(held.is_held(), "the holder lost a lock the server kept");
    assert!(!waiter.is_finished(), "the waiter was granted while the lock was held");
    let token = held.token();
    held.release().await.expect("release");
    let granted = bounded("the waiter is granted", waiter)
        .await
        .expect("task")
        .expect("lock");
    assert!(granted.token() > token);
    granted.release().await.expect("release");
}

/// How a server comes to no longer have a session's key.
#[derive(Clone, Copy, Debug)]
enum Forgets {
    /// Killed and restarted without persistence.
    Restart,
    /// The same, for a user that may not run `INFO` (the server's epoch
    /// is unknown to the client).
    RestartWithoutInfo,
    /// Made a replica of an empty server (the full sync drops every key)
    /// and promoted again: the same process, whose client connections
    /// stay open, with a new replication id.
    DemotedAndPromoted,
    /// `FLUSHALL`: the same process and epoch.
    Flushed,
}

const NO_INFO_USER: [&str; 9] = ["ACL", "SETUSER", "locker", "on", ">pw", "~*", "&*", "+@all", "-info"];

/// A session (TTL 30 s: its first renewal is 10 s away) takes and releases
/// a lock on `server`, which then forgets it `how`. Returns the client and
/// the session.
async fn forgotten_session(server: &mut RedisServer, how: Forgets) -> (Client, Session) {
    let url = match how {
        Forgets::RestartWithoutInfo => {
            server.cli(&NO_INFO_USER).expect("acl");
            format!("redis://locker:pw@127.0.0.1:{}", server.port())
        }
        _ => server.url(),
    };
    let client = Client::new(Redis::new(url));
    let session = client.session_with(options(30_000)).await.expect("session");
    warm_up(&session).await;
    match how {
        Forgets::Restart | Forgets::RestartWithoutInfo => {
            server.member().kill().expect("kill redis");
            server.restart().expect("restart redis");
            if let Forgets::RestartWithoutInfo = how {
                // The user went with the data; an ACL file would bring it back.
                server.cli(&NO_INFO_USER).expect("acl again");
            }
        }
        Forgets::DemotedAndPromoted => {
            let empty = RedisServer::start().expect("start the other redis");
            server
                .cli(&["REPLICAOF", "127.0.0.1", &empty.port().to_string()])
                .expect("replicaof");
            // The sync is the other server's doing, with no event to await
            // here: its state is polled.
            lockline::conformance::until("the full sync", || {
                let info = server.cli(&["INFO", "replication"]).unwrap_or_default();
                info.contains("master_link_status:up") && server.cli(&["DBSIZE"]).unwrap_or_default().trim() == "0"
            })
            .await;
            server.cli(&["REPLICAOF", "NO", "ONE"]).expect("promote");
        }
        Forgets::Flushed => {
            server.cli(&["FLUSHALL"]).expect("flushall");
        }
    }
    (client, session)
}

/// Every key of `server`.
async fn every_key(server: &RedisServer) -> Vec<String> {
    let mut side = support::side(&server.url()).await;
    support::scan(&mut side, "*").await
}

/// A session the server no longer has asks for a lock before any renewal
/// found its key gone. The append script checks the session key (on a
/// single node), so the request is refused with `SessionLost` and nothing
/// is written: a grant there would last only until that renewal, whose
/// removal of the entry would hand the lock on at the moment the holder
/// hears `lost()`. A session opened afterwards is granted the lock at once.
async fn a_forgotten_session_is_refused_its_next_lock(how: Forgets) {
    let mut server = RedisServer::start().expect("start redis");
    let (client, forgotten) = forgotten_session(&mut server, how).await;
    let asked = bounded("the forgotten session's lock", async {
        forgotten.mutex("after").expect("mutex").lock().await
    })
    .await;
    match asked {
        Err(Error::SessionLost { .. }) => {}
        Ok(guard) => panic!(
            "{how:?}: the server granted a lock (token {}) to a session it does not have",
            guard.token()
        ),
        Err(other) => panic!("{how:?}: expected SessionLost, got {other:?}"),
    }
    assert_eq!(forgotten.state(), SessionState::Lost);
    bounded("the lost session's cleanup", forgotten.flush()).await;
    let keys = every_key(&server).await;
    assert!(
        keys.iter().all(|key| !key.contains("after")),
        "{how:?}: the refused request left {keys:?}"
    );
    let fresh = client.session_with(options(3000)).await.expect("a new session");
    let granted = bounded("a new session's lock", async {
        fresh.mutex("after").expect("mutex").lock().await
    })
    .await
    .expect("lock");
    granted.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_the_restarted_server_forgot_is_refused_its_next_lock() {
    a_forgotten_session_is_refused_its_next_lock(Forgets::Restart).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_forgotten_by_a_server_that_refuses_info_is_refused_its_next_lock() {
    a_forgotten_session_is_refused_its_next_lock(Forgets::RestartWithoutInfo).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_forgotten_by_a_demoted_and_promoted_server_is_refused_its_next_lock() {
    a_forgotten_session_is_refused_its_next_lock(Forgets::DemotedAndPromoted).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_forgotten_by_a_flush_is_refused_its_next_lock() {
    a_forgotten_session_is_refused_its_next_lock(Forgets::Flushed).await;
}

/// Acquires under way when the server restarts without persistence: 32 of
/// them asked at once right after the restart (the first goes on the dead
/// connection and backs off, its append unanswered), and 8 retrying
/// through an outage of 1.5 s (a fault's length). Each fails with
/// `SessionLost`, and the loss's cleanup leaves nothing on the server: no
/// entry, and no tombstone for an append never answered (the session key
/// is deleted first, and the append script refuses any append of the
/// session from then on).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquires_under_way_through_a_restart_leave_nothing() {
    let mut server = RedisServer::start().expect("start redis");
    let client = Client::new(Redis::new(server.url()));
    let at_once = client.session_with(options(30_000)).await.expect("session");
    let retrying = client.session_with(options(3000)).await.expect("session");
    for session in [&at_once, &retrying] {
        warm_up(session).await;
    }
    let spawn = |session: &Session, name: String| {
        let mutex = session.mutex(&name).expect("mutex");
        tokio::spawn(async move { mutex.lock().await })
    };
    server.member().kill().expect("kill redis");
    let through: Vec<_> = (0..8).map(|i| spawn(&retrying, format!("retrying{i}"))).collect();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    server.restart().expect("restart redis");
    let after: Vec<_> = (0..32).map(|i| spawn(&at_once, format!("at-once{i}"))).collect();
    for task in through.into_iter().chain(after) {
        match bounded("an acquire", task).await.expect("task") {
            Err(Error::SessionLost { .. }) => {}
            Ok(guard) => panic!("a forgotten session was granted {}", guard.key()),
            Err(other) => panic!("expected SessionLost, got {other:?}"),
        }
    }
    for session in [&at_once, &retrying] {
        assert_eq!(session.state(), SessionState::Lost);
        bounded("the lost session's cleanup", session.flush()).await;
    }
    let keys = every_key(&server).await;
    assert!(
        keys.iter()
            .all(|key| !key.contains("retrying") && !key.contains("at-once")),
        "the refused acquires left {keys:?}"
    );
}

/// Every key of lock `name` on `server` but its counter and the counter's
/// epoch (which are never deleted) and the marks of entries lost with their
/// session (`{n}:l:<attempt>`, kept a minute for a waiter's lock-delay).
async fn lock_keys(server: &RedisServer, name: &str) -> Vec<String> {
    let mut side = support::side(&server.url()).await;
    support::scan(&mut side, &format!("{{{name}}}*"))
        .await
        .into_iter()
        .filter(|key| !key.ends_with(":seq") && !key.ends_with(":run") && !key.contains("}:l:"))
        .collect()
}

/// An acquire's first append lands but its answer is dropped; the session
/// key then goes alone (an eviction, an operator's `DEL`), and the retry is
/// refused. The acquire fails with `SessionLost`, and the loss's cleanup
/// removes what the first try left: nothing blocks the lock for a TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_landed_first_try_is_removed_when_its_retry_finds_the_session_gone() {
    let server = RedisServer::start().expect("start redis");
    let (proxy, far) = through_a_proxy(&server);
    let session = far.session_with(options(30_000)).await.expect("session");
    warm_up(&session).await;
    proxy.set_responses_dropped(true);
    let acquire = {
        let mutex = session.mutex("retried").expect("mutex");
        tokio::spawn(async move { mutex.lock().await })
    };
    lockline::conformance::until("the first try lands", || {
        !server
            .cli(&["KEYS", "{retried}:e:*"])
            .unwrap_or_default()
            .trim()
            .is_empty()
    })
    .await;
    let mut side = support::side(&server.url()).await;
    let _: i64 = side
        .del(format!("lockline:session:{}", session.id()))
        .await
        .expect("del");
    proxy.set_responses_dropped(false);
    match bounded("the acquire", acquire).await.expect("task") {
        Err(Error::SessionLost { .. }) => {}
        other => panic!("expected SessionLost, got {:?}", other.map(|guard| guard.token())),
    }
    // Returns once the server has deleted every entry the session listed.
    let _ = bounded("close", session.close()).await;
    let left = lock_keys(&server, "retried").await;
    assert!(left.is_empty(), "the landed first try left {left:?}");
    let other = Client::new(Redis::new(server.url()))
        .session_with(options(3000))
        .await
        .expect("session");
    let free = other
        .mutex("retried")
        .expect("mutex")
        .try_lock()
        .await
        .expect("try_lock");
    assert!(free.is_some(), "the lock stayed taken");
}

/// With replica acknowledgement the append script runs in a pipeline; a
/// session the primary no longer has is still refused with `SessionLost`
/// (not a pipeline's generic failure), and lost at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_replica_acks_a_forgotten_session_is_refused_with_session_lost() {
    let primary = RedisServer::start().expect("start redis");
    let _replica = RedisServer::start_with(&RedisOptions {
        replica_of: Some(primary.port()),
        ..RedisOptions::default()
    })
    .expect("start the replica");
    lockline::conformance::until("the replica is up", || {
        primary
            .cli(&["INFO", "replication"])
            .unwrap_or_default()
            .contains("connected_slaves:1")
    })
    .await;
    let client = Client::new(Redis::new(primary.url()).with_replica_acks(1, Duration::from_millis(500)));
    let session = client.session_with(options(30_000)).await.expect("session");
    warm_up(&session).await;
    primary.cli(&["FLUSHALL"]).expect("flushall");
    match bounded("the lock", async {
        session.mutex("after").expect("mutex").lock().await
    })
    .await
    {
        Err(Error::SessionLost { .. }) => {}
        other => panic!("expected SessionLost, got {:?}", other.map(|guard| guard.token())),
    }
    assert_eq!(session.state(), SessionState::Lost);
    let _ = bounded("close", session.close()).await;
    let left = lock_keys(&primary, "after").await;
    assert!(left.is_empty(), "the refused request left {left:?}");
}

/// A session closed while one of its appends is on its way: the append
/// lands and is answered after the close's deletion of the session key was
/// sent behind it. The acquire fails, and nothing is left: the entry is
/// removed by its order, with no tombstone (no append of it is still on its
/// way).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_close_behind_an_append_in_flight_leaves_nothing() {
    let server = RedisServer::start().expect("start redis");
    let (proxy, far) = through_a_proxy(&server);
    let session = far.session_with(options(30_000)).await.expect("session");
    warm_up(&session).await;
    proxy.set_requests_held(true);
    let acquire = {
        let mutex = session.mutex("behind").expect("mutex");
        tokio::spawn(async move { mutex.lock().await })
    };
    lockline::conformance::until("the append is sent", || proxy.held_request_bytes() > 0).await;
    let sent = proxy.held_request_bytes();
    let close = {
        let session = session.clone();
        tokio::spawn(async move { session.close().await })
    };
    lockline::conformance::until("the close is sent behind it", || proxy.held_request_bytes() > sent).await;
    proxy.set_requests_held(false);
    let acquired = bounded("the acquire", acquire).await.expect("task");
    assert!(
        acquired.is_err(),
        "a closed session was granted {:?}",
        acquired.map(|g| g.token())
    );
    bounded("the close", close).await.expect("task").expect("close");
    bounded("the session's cleanup", session.flush()).await;
    let left = lock_keys(&server, "behind").await;
    assert!(left.is_empty(), "the close left {left:?}");
}

/// A server that takes a script's keys from one slot only (here a one-node
/// Redis Cluster, with every slot, addressed as a single node; a proxy may
/// do the same) refuses the session key beside the lock's keys. The first
/// append goes again without it, and every later one is sent without it:
/// locks in every recipe work, and nothing is left once they are released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_refuses_keys_of_two_slots_is_appended_to_without_the_session_key() {
    let server = RedisServer::start_with(&RedisOptions {
        cluster: true,
        ..RedisOptions::default()
    })
    .expect("start a cluster node");
    server
        .cli(&["CLUSTER", "ADDSLOTSRANGE", "0", "16383"])
        .expect("addslots");
    lockline::conformance::until("the one-node cluster is up", || {
        server
            .cli(&["CLUSTER", "INFO"])
            .unwrap_or_default()
            .contains("cluster_state:ok")
    })
    .await;
    let client = Client::new(Redis::new(server.url()));
    let session = client.session_with(options(30_000)).await.expect("session");
    for round in 0..2 {
        let held = bounded("a mutex", session.mutex("one-slot").expect("mutex").lock())
            .await
            .unwrap_or_else(|e| panic!("round {round}: {e:?}"));
        held.release().await.expect("release");
        let ex = bounded(
            "an EX lock",
            session
                .resource("one-slot-modes")
                .expect("resource")
                .lock(lockline::LockMode::Ex),
        )
        .await
        .unwrap_or_else(|e| panic!("round {round}: {e:?}"));
        ex.release().await.expect("release");
    }
    assert_eq!(session.state(), SessionState::Live);
    for name in ["one-slot", "one-slot-modes"] {
        let left: Vec<String> = lock_keys(&server, name)
            .await
            .into_iter()
            .filter(|key| !key.ends_with(":b"))
            .collect();
        assert!(left.is_empty(), "{left:?}");
    }
}

/// Takes and releases a lock on `session`: its connection to the server is
/// made and used before the fault.
async fn warm_up(session: &Session) {
    let warm = session.mutex("warm").expect("mutex").lock().await.expect("lock");
    warm.release().await.expect("release");
}
