//! A session renews a mutex holder's plain key (the key redis-py's `Lock`
//! takes) with a script called by its hash, sending the script itself only
//! when the server does not know it. A server that lost its script cache (a
//! restart, `SCRIPT FLUSH`) must not make renewals fail: the holder keeps its
//! lock and its plain key.

use std::time::Duration;

use lockline::conformance::bounded;
use lockline::{Client, SessionOptions};
use lockline_redis::Redis;
use lockline_testkit::RedisServer;

mod support;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewals_go_on_after_the_server_forgets_its_scripts() {
    let server = RedisServer::start().expect("redis");
    let session = Client::new(Redis::new(server.url()))
        .session_with(SessionOptions::new().with_ttl(Duration::from_secs(2)))
        .await
        .expect("session");
    let guard = session.mutex("flushed").expect("mutex").lock().await.expect("lock");
    let mut side = support::side(&server.url()).await;
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut side)
        .await
        .expect("SCRIPT FLUSH");
    // Renewals made since the flush, counted by the server: calls of a
    // script by its hash (failed ones included).
    let evalsha_calls = |side: &mut redis::aio::MultiplexedConnection| {
        let mut side = side.clone();
        async move {
            let info: String = redis::cmd("INFO")
                .arg("commandstats")
                .query_async(&mut side)
                .await
                .expect("INFO");
            info.lines()
                .find_map(|l| l.strip_prefix("cmdstat_evalsha:calls="))
                .and_then(|rest| rest.split(',').next())
                .and_then(|n| n.parse::<u64>().ok())
                .unwrap_or(0)
        }
    };
    let flushed_at = evalsha_calls(&mut side).await;
    // Four renewals span more than the 2 s TTL: without working renewals
    // the plain key and the entry would have expired by then.
    bounded("four renewals after the flush", async {
        while evalsha_calls(&mut side).await < flushed_at + 4 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    let pttl: i64 = redis::cmd("PTTL")
        .arg("flushed")
        .query_async(&mut side)
        .await
        .expect("PTTL");
    assert!(pttl > 0, "the plain key expired: renewals failed after the flush");
    assert!(guard.is_held());
    guard.release().await.expect("release");
}
