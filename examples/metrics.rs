//! Serves lockline's metrics for Prometheus while a few workers take turns
//! on a lock over the in-process memory backend.
//!
//! ```sh
//! cargo run --example metrics --features metrics -- 127.0.0.1:9898 30
//! curl -s http://127.0.0.1:9898/metrics | grep ^lockline_
//! ```
//!
//! The first argument is the address to listen on (default
//! `127.0.0.1:9898`), the second how many seconds to run (default 30).
//! Every second one worker gives up waiting (a timeout) and one holder's
//! session is expired under it (a loss), so every kind of metric moves.

use std::net::SocketAddr;
use std::time::Duration;

use lockline::{Client, MemoryBackend};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let addr: SocketAddr = args.next().as_deref().unwrap_or("127.0.0.1:9898").parse()?;
    let seconds: u64 = args.next().as_deref().unwrap_or("30").parse()?;

    // The recorder first: a client registers its metrics at its first use.
    PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), lockline::metrics::BUCKETS)?
        .with_http_listener(addr)
        .install()?;
    lockline::metrics::describe();
    println!("serving metrics on http://{addr}/metrics for {seconds} s");

    let store = MemoryBackend::new();
    let client = Client::new(store.clone());
    let end = tokio::time::Instant::now() + Duration::from_secs(seconds);

    // Three workers take turns on one lock, holding it a few milliseconds.
    let mut workers = Vec::new();
    for _ in 0..3 {
        let client = client.clone();
        workers.push(tokio::spawn(async move {
            let session = client.session().await?;
            let mutex = session.mutex("jobs/nightly")?;
            while tokio::time::Instant::now() < end {
                let guard = mutex.lock().await?;
                tokio::time::sleep(Duration::from_millis(5)).await; // the work
                guard.release().await?;
            }
            session.close().await
        }));
    }

    // Once a second: a timeout behind a long holder, then that holder's loss.
    let mut ticks = tokio::time::interval(Duration::from_secs(1));
    while tokio::time::Instant::now() < end {
        ticks.tick().await;
        let holder = client.session().await?;
        let guard = holder.mutex("jobs/hourly")?.lock().await?;
        let other = client.session().await?;
        let waited = other
            .mutex("jobs/hourly")?
            .lock_timeout(Duration::from_millis(50))
            .await;
        assert!(matches!(waited, Err(lockline::Error::Timeout { .. })));
        store.expire(holder.id());
        guard.lost().await;
        other.close().await?;
    }
    for worker in workers {
        worker.await??;
    }
    Ok(())
}
