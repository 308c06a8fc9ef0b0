//! An append that reaches the server after its acquire was cancelled and
//! cleaned up (held in the network, its connection given up and the append
//! retried on a new one) creates nothing: the abandonment left a tombstone
//! for the attempt. Nor does the session spin on a leftover of its own.
//! (Found by review, as on etcd: `late_append_etcd.rs`.)

use std::time::{Duration, Instant};

use lockline::conformance::{bounded, until};
use lockline::{Client, SessionOptions};
use lockline_redis::Redis;
use lockline_testkit::{RedisServer, TcpProxy};

mod support;

fn evalsha_calls(server: &RedisServer) -> u64 {
    let info = server.cli(&["info", "commandstats"]).unwrap();
    for line in info.lines() {
        if let Some(rest) = line.strip_prefix("cmdstat_evalsha:calls=") {
            return rest.split(',').next().unwrap().parse().unwrap();
        }
    }
    0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_first_append_of_a_dropped_mutex_lock() {
    let server = RedisServer::start().expect("redis");
    let proxy = TcpProxy::start(&format!("127.0.0.1:{}", server.port())).expect("proxy");
    let ttl = Duration::from_secs(8);
    let client = Client::new(Redis::new(format!("redis://{}", proxy.address())));
    let session = client
        .session_with(
            SessionOptions::new()
                .with_ttl(ttl)
                .with_request_timeout(Duration::from_secs(2)),
        )
        .await
        .expect("session");
    let direct = Client::new(Redis::new(server.url()));
    let holder = direct.session_with(SessionOptions::new().with_ttl(ttl)).await.unwrap();
    let other = direct.session_with(SessionOptions::new().with_ttl(ttl)).await.unwrap();
    let name = "late";
    let held = holder.mutex(name).unwrap().lock().await.unwrap();

    proxy.set_requests_held(true);
    let s2 = session.clone();
    let acquire = tokio::spawn(async move { s2.mutex(name).unwrap().lock().await.map(|_| ()) });
    until("the first append is sent", || proxy.held_request_bytes() > 0).await;
    proxy.orphan_connections();
    proxy.set_requests_held(false);
    let mutex = other.mutex(name).unwrap();
    // Another process's state, with no event to await: look every 20 ms.
    bounded("the retried append lands", async {
        while mutex.contenders().await.unwrap().len() < 2 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    lockline::conformance::wait_for_stats(&client, |s| s.waits >= 1).await;
    acquire.abort();
    let _ = acquire.await;
    bounded("cleanup", session.flush()).await;
    assert_eq!(
        mutex.contenders().await.unwrap().len(),
        1,
        "cleanup left the retried entry"
    );
    proxy.deliver_orphans();
    until("the server answers the late append", || proxy.orphan_answer_bytes() > 0).await;
    let mut side = support::side(&server.url()).await;
    assert_eq!(
        support::scan(&mut side, "{late}:e:*").await,
        vec![held.key().to_owned()],
        "the late append created an entry"
    );

    // The same session locks again: does it spin on its own untracked leftover?
    let again = {
        let s = session.clone();
        tokio::spawn(async move {
            let t = Instant::now();
            let g = s.mutex(name).unwrap().lock().await;
            (t.elapsed(), g.map(|g| g.token()))
        })
    };
    held.release().await.unwrap();
    let before = evalsha_calls(&server);
    let (waited, got) = bounded("same session regranted", again).await.unwrap();
    let during = evalsha_calls(&server) - before;
    let got = got.expect("lock");
    assert!(
        waited < ttl,
        "the same session waited {waited:?}: a leftover blocked it"
    );
    assert!(got.get() > 0);
    let other_wait = Instant::now();
    let g2 = bounded("other session granted", mutex.lock()).await.unwrap();
    assert!(other_wait.elapsed() < ttl, "kept waiting {:?}", other_wait.elapsed());
    g2.release().await.unwrap();
    bounded("flush", session.flush()).await;
    let left = support::scan(&mut side, "{late}:e:*").await;
    assert!(during < 200, "the waiter spun: {during} script calls");
    assert!(left.is_empty(), "entries left: {left:?}");
}
