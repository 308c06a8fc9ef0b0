//! Helpers shared by the Redis backend's tests.
#![allow(dead_code)]

use redis::AsyncCommands;

/// A plain connection to one node, for looking at what the backend wrote.
pub async fn side(url: &str) -> redis::aio::MultiplexedConnection {
    redis::Client::open(url)
        .expect("a Redis URL")
        .get_multiplexed_async_connection()
        .await
        .expect("connect a side client")
}

/// Every key on the node matching `pattern` (SCAN, never KEYS).
pub async fn scan(conn: &mut redis::aio::MultiplexedConnection, pattern: &str) -> Vec<String> {
    let mut keys: Vec<String> = Vec::new();
    let mut iter: redis::AsyncIter<String> = conn.scan_match(pattern).await.expect("scan");
    while let Some(key) = iter.next_item().await {
        keys.push(key.expect("a key"));
    }
    keys.sort();
    keys
}

/// Ends a session from outside, on every node given, as its TTL running out
/// would: its key and every entry it owns are deleted, nothing published.
pub async fn expire(urls: &[String], session: &str) {
    let mut deleted = false;
    for url in urls {
        let mut conn = side(url).await;
        // On a cluster only the node of the key's slot takes it (the others
        // answer MOVED).
        let removed: redis::RedisResult<i64> = conn.del(format!("lockline:session:{session}")).await;
        deleted |= removed.is_ok_and(|n| n == 1);
        for key in scan(&mut conn, "{*}:e:*").await {
            let owner: Option<String> = conn.hget(&key, "owner").await.expect("read an entry");
            if owner.as_deref() == Some(session) {
                let _: () = conn.del(&key).await.expect("delete an entry");
            }
        }
    }
    assert!(deleted, "no node held the session key of {session}");
}

/// Waits for a renewal of `key`, seen as its TTL raised again (the server is
/// another process, with no event to await: look every 20 ms).
pub async fn renewed(side: &mut redis::aio::MultiplexedConnection, key: &str) {
    lockline::conformance::bounded("a renewal", async {
        let mut last: i64 = side.pttl(key).await.expect("pttl");
        loop {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            let left: i64 = side.pttl(key).await.expect("pttl");
            if left > last {
                return;
            }
            last = left;
        }
    })
    .await;
}
