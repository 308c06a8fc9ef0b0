//! How much one session holding many locks costs the client.
//!
//! ```text
//! cargo run --release -p lockline-redis --example scale_redis [-- LOCKS]
//! ```
//!
//! Starts a throwaway `redis-server`, opens one session, acquires LOCKS
//! (default 10,000) mutexes on it, and prints the time that took and the
//! process's resident memory per held lock (`VmRSS` before and after). The
//! session renews all of them in one pipelined round trip per keepalive
//! interval; the program waits one interval and checks they are all held.

use std::time::{Duration, Instant};

use lockline::{Client, SessionOptions};
use lockline_redis::Redis;
use lockline_testkit::{rss_kib, RedisServer};

type BoxResult<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

#[tokio::main]
async fn main() -> BoxResult<()> {
    let locks: usize = match std::env::args().nth(1) {
        Some(n) => n.parse().map_err(|_| format!("LOCKS must be a number, not {n:?}"))?,
        None => 10_000,
    };
    let server = RedisServer::start()?;
    let client = Client::new(Redis::new(server.url()));
    let ttl = Duration::from_secs(10);
    let session = client.session_with(SessionOptions::new().with_ttl(ttl)).await?;
    let mutexes = (0..locks)
        .map(|i| session.mutex(&format!("scale/{i}")))
        .collect::<lockline::Result<Vec<_>>>()?;
    let before = rss_kib();
    let started = Instant::now();
    let mut guards = Vec::with_capacity(locks);
    for mutex in &mutexes {
        guards.push(mutex.lock().await?);
    }
    let took = started.elapsed();
    let after = rss_kib();
    println!(
        "{locks} locks acquired on one session in {took:.2?} ({:.0}/s)",
        locks as f64 / took.as_secs_f64()
    );
    println!(
        "client RSS: {before} KiB before, {after} KiB after: {:.2} KiB per held lock",
        after.saturating_sub(before) as f64 / locks as f64
    );
    tokio::time::sleep(SessionOptions::new().with_ttl(ttl).keepalive_interval() * 2).await;
    let held = guards.iter().filter(|g| g.is_held()).count();
    println!("after two keepalive intervals: {held} of {locks} still held");
    let started = Instant::now();
    session.close().await?;
    println!("close (every entry deleted) in {:.2?}", started.elapsed());
    Ok(())
}
