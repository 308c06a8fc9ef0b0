//! A cancelled acquire removes every entry its attempt made, also when the
//! attempt's *first* append arrives late: it was sent on a connection that
//! died, the acquire retried on a new connection, got its entry, queued, and
//! was then cancelled (dropped, timed out). The cleanup removes the known
//! entry and fences the attempt; then the first append reaches the server and
//! creates nothing. For every recipe kind.

use std::time::Duration;

use lockline::conformance::{bounded, until};
use lockline::{Client, SessionOptions};
use lockline_etcd::Etcd;
use lockline_testkit::{EtcdCluster, TcpProxy};

#[derive(Clone, Copy, Debug)]
enum How {
    Abort,
    Timeout,
}

/// One etcd member, a proxy in front of it, and a client and session
/// (TTL 30 s, request timeout 2 s) through the proxy.
async fn behind_a_proxy() -> (EtcdCluster, TcpProxy, Client, lockline::Session) {
    let cluster = EtcdCluster::start().expect("start etcd");
    let proxy = TcpProxy::start(&format!("127.0.0.1:{}", cluster.client_port(0))).expect("proxy");
    let client = Client::new(Etcd::new([format!("http://{}", proxy.address())]));
    let session = client
        .session_with(
            SessionOptions::new()
                .with_ttl(Duration::from_secs(30))
                .with_request_timeout(Duration::from_secs(2)),
        )
        .await
        .expect("session");
    (cluster, proxy, client, session)
}

async fn late_first_append(how: How, kind: &str) {
    let (cluster, proxy, client, session) = behind_a_proxy().await;
    let direct = Client::new(Etcd::new(cluster.endpoints()));
    let holder = direct.session().await.expect("session");
    let checker = direct.session().await.expect("session");
    let name = format!("late-retry/{kind}");
    // Someone holds the lock, so the acquire queues once it has its entry.
    let held = match kind {
        "read" => HeldBy::Write(holder.rwlock(&name).unwrap().write().await.unwrap()),
        "write" => HeldBy::Write(holder.rwlock(&name).unwrap().write().await.unwrap()),
        "semaphore" => HeldBy::Permit(holder.semaphore(&name, 1).unwrap().acquire().await.unwrap()),
        "election" => HeldBy::Leader(holder.election(&name).unwrap().campaign(b"h").await.unwrap()),
        _ => HeldBy::Mutex(holder.mutex(&name).unwrap().lock().await.unwrap()),
    };

    proxy.set_requests_held(true);
    let s2 = session.clone();
    let n2 = name.clone();
    let kind2 = kind.to_owned();
    let acquire = tokio::spawn(async move {
        match kind2.as_str() {
            "read" => {
                let rw = s2.rwlock(&n2).unwrap();
                match how {
                    How::Abort => rw.read().await.map(|_| ()),
                    _ => unreachable!(),
                }
            }
            "write" => {
                let rw = s2.rwlock(&n2).unwrap();
                match how {
                    How::Abort => rw.write().await.map(|_| ()),
                    How::Timeout => unreachable!(),
                }
            }
            "semaphore" => s2.semaphore(&n2, 1).unwrap().acquire().await.map(|_| ()),
            "election" => s2.election(&n2).unwrap().campaign(b"c").await.map(|_| ()),
            _ => {
                let m = s2.mutex(&n2).unwrap();
                match how {
                    How::Abort => m.lock().await.map(|_| ()),
                    How::Timeout => m.lock_timeout(Duration::from_secs(4)).await.map(|_| ()),
                }
            }
        }
    });
    until("the first append is sent", || proxy.held_requests() > 0).await;
    // The connection dies with the first append still in the network.
    proxy.orphan_connections();
    // The acquire retries on a new connection, whose bytes flow once released
    // (whether the retry is sent before or after the release does not matter).
    tokio::time::sleep(Duration::from_millis(200)).await;
    proxy.set_requests_held(false);
    let entries = checker.mutex(&name).unwrap();
    let rw = checker.rwlock(&name).unwrap();
    let count = || async {
        let a = entries.contenders().await.expect("list").len();
        let b = rw.contenders().await.expect("list").len();
        a.max(b)
    };
    // The retried append made the attempt's entry: it queues behind the holder.
    bounded("the retried append lands", async {
        while count().await < 2 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    match how {
        How::Abort => {
            // Queued behind the holder: cancel it there.
            lockline::conformance::wait_for_stats(&client, |s| s.waits >= 1).await;
            acquire.abort();
            let _ = acquire.await;
        }
        How::Timeout => {
            let outcome = bounded("the acquire ends", acquire).await.expect("task");
            assert!(outcome.is_err(), "{outcome:?}");
        }
    }
    bounded("cleanup", session.flush()).await;
    assert_eq!(count().await, 1, "the cleanup left the retried entry");
    // Now the first append reaches the server.
    proxy.deliver_orphans();
    // Its answer means the server has applied (or refused) it.
    until("the server answers the late append", || proxy.orphan_answer_bytes() > 0).await;
    match held {
        HeldBy::Mutex(g) => g.release().await.expect("release"),
        HeldBy::Write(g) => g.release().await.expect("release"),
        HeldBy::Permit(g) => g.release().await.expect("release"),
        HeldBy::Leader(g) => g.resign().await.expect("resign"),
    }
    holder.close().await.expect("close");
    let left = cluster.keys(&name).expect("keys");
    assert_eq!(
        count().await,
        0,
        "after every contender left, the late first append of a cancelled acquire is in the queue: {left:?}"
    );
}

enum HeldBy {
    Mutex(lockline::MutexGuard),
    Write(lockline::WriteGuard),
    Permit(lockline::Permit),
    Leader(lockline::Leadership),
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_first_append_of_a_dropped_mutex_lock() {
    late_first_append(How::Abort, "mutex").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_first_append_of_a_timed_out_mutex_lock() {
    late_first_append(How::Timeout, "mutex").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_first_append_of_a_dropped_write_lock() {
    late_first_append(How::Abort, "write").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_first_append_of_a_dropped_read_lock() {
    late_first_append(How::Abort, "read").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_first_append_of_a_dropped_semaphore_acquire() {
    late_first_append(How::Abort, "semaphore").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_first_append_of_a_dropped_campaign() {
    late_first_append(How::Abort, "election").await;
}

/// The same late first append after the acquire *succeeded*: the retry's
/// entry was granted and then released (by `release()`, or by dropping the
/// guard). The release fences the attempt as a whole, so the late append
/// makes nothing: no entry of a live session is left holding a lock nobody
/// holds (found by the queue rule's model).
async fn late_first_append_after_a_grant(drop_the_guard: bool) {
    let (cluster, proxy, _client, session) = behind_a_proxy().await;
    let direct = Client::new(Etcd::new(cluster.endpoints()));
    let checker = direct.session().await.expect("session");
    let name = "late-retry/granted";
    proxy.set_requests_held(true);
    let mutex = session.mutex(name).expect("mutex");
    let acquire = tokio::spawn(async move { mutex.lock().await });
    until("the first append is sent", || proxy.held_requests() > 0).await;
    // The connection dies with the first append still in the network; the
    // acquire retries on a new connection and is granted.
    proxy.orphan_connections();
    tokio::time::sleep(Duration::from_millis(200)).await;
    proxy.set_requests_held(false);
    let guard = bounded("the retried acquire is granted", acquire)
        .await
        .expect("task")
        .expect("lock");
    if drop_the_guard {
        drop(guard);
    } else {
        guard.release().await.expect("release");
    }
    bounded("cleanup", session.flush()).await;
    let entries = checker.mutex(name).expect("mutex");
    assert!(
        entries.contenders().await.expect("list").is_empty(),
        "the release left its entry"
    );
    // Now the first append reaches the server.
    proxy.deliver_orphans();
    until("the server answers the late append", || proxy.orphan_answer_bytes() > 0).await;
    let left = entries.contenders().await.expect("list");
    assert!(
        left.is_empty(),
        "the late first append of a released acquire is in the queue, holding the lock: {left:?} ({:?})",
        cluster.keys(name).expect("keys")
    );
    // And the session can take the lock again.
    let again = bounded("the lock again", session.mutex(name).expect("mutex").lock())
        .await
        .expect("lock");
    again.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_first_append_of_a_released_mutex_lock() {
    late_first_append_after_a_grant(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_first_append_of_a_dropped_granted_mutex_lock() {
    late_first_append_after_a_grant(true).await;
}
