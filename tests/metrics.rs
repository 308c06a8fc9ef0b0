//! The `metrics` feature, as a Prometheus server sees it: the exporter
//! installed as the process's recorder, scraped over HTTP after a known
//! sequence of grants, a handoff, a timeout, a cancellation and a loss.
#![cfg(feature = "metrics")]

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

use lockline::{Client, MemoryBackend};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};

/// One scrape: every sample by its name and labels (sorted, `k="v"`
/// joined by commas), e.g. `lockline_grants_total{backend="memory",recipe="mutex"}`.
#[derive(Debug)]
struct Scrape(BTreeMap<String, f64>);

impl Scrape {
    fn get(&self, series: &str) -> f64 {
        match self.0.get(series) {
            Some(value) => *value,
            None => panic!("no series {series} in the scrape:\n{self:#?}"),
        }
    }
}

/// Scrapes `addr` over HTTP, as Prometheus would.
async fn scrape(addr: SocketAddr) -> Scrape {
    let body = tokio::task::spawn_blocking(move || {
        let mut stream = TcpStream::connect(addr).expect("connect to the exporter");
        stream
            .write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")
            .expect("send the request");
        let mut response = String::new();
        stream.read_to_string(&mut response).expect("read the response");
        assert!(
            response.starts_with("HTTP/1.0 200") || response.starts_with("HTTP/1.1 200"),
            "{response}"
        );
        let (_, body) = response.split_once("\r\n\r\n").expect("a body");
        body.to_owned()
    })
    .await
    .expect("scrape task");
    let mut samples = BTreeMap::new();
    for line in body.lines().filter(|l| l.starts_with("lockline_")) {
        let (series, value) = line.rsplit_once(' ').expect("a sample line");
        let series = match series.split_once('{') {
            Some((name, labels)) => {
                let mut labels: Vec<&str> = labels.trim_end_matches('}').split(',').collect();
                labels.sort_unstable();
                format!("{name}{{{}}}", labels.join(","))
            }
            None => series.to_owned(),
        };
        samples.insert(series, value.parse().expect("a number"));
    }
    Scrape(samples)
}

fn free_port() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    listener.local_addr().expect("its address")
}

const MUTEX: &str = r#"backend="memory",recipe="mutex""#;

fn series(name: &str, extra: &str) -> String {
    let mut labels: Vec<&str> = MUTEX
        .split(',')
        .chain(extra.split(',').filter(|l| !l.is_empty()))
        .collect();
    labels.sort_unstable();
    format!("{name}{{{}}}", labels.join(","))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scrape_counts_grants_a_handoff_a_timeout_a_cancellation_and_a_loss() {
    let addr = free_port();
    PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), lockline::metrics::BUCKETS)
        .expect("buckets")
        .with_http_listener(addr)
        .install()
        .expect("install the exporter");
    lockline::metrics::describe();

    let store = MemoryBackend::new();
    let client = Client::new(store.clone());
    let a = client.session().await.expect("session a");
    let b = client.session().await.expect("session b");

    // Three grants, uncontended.
    for _ in 0..3 {
        a.mutex("m/plain")
            .expect("mutex")
            .lock()
            .await
            .expect("lock")
            .release()
            .await
            .expect("release");
    }

    // A holds; B times out behind it, then queues and is handed the lock.
    let held = a.mutex("m/handoff").expect("mutex").lock().await.expect("lock");
    let timed_out = b
        .mutex("m/handoff")
        .expect("mutex")
        .lock_timeout(Duration::from_millis(50))
        .await;
    assert!(
        matches!(timed_out, Err(lockline::Error::Timeout { .. })),
        "{timed_out:?}"
    );
    let waits = client.stats().waits;
    let waiter = {
        let b = b.clone();
        tokio::spawn(async move { b.mutex("m/handoff")?.lock().await })
    };
    lockline::conformance::wait_for_stats(&client, |s| s.waits == waits + 1).await;
    let during = scrape(addr).await;
    assert_eq!(during.get(&series("lockline_waiters", "")), 1.0);
    assert_eq!(during.get(&series("lockline_held", "")), 1.0);
    held.release().await.expect("release");
    waiter
        .await
        .expect("task")
        .expect("granted")
        .release()
        .await
        .expect("release");

    // A holds; B's acquire is dropped while it waits: a cancellation.
    let held = a.mutex("m/cancel").expect("mutex").lock().await.expect("lock");
    let waits = client.stats().waits;
    let cancelled = {
        let b = b.clone();
        tokio::spawn(async move { b.mutex("m/cancel")?.lock().await })
    };
    lockline::conformance::wait_for_stats(&client, |s| s.waits == waits + 1).await;
    cancelled.abort();
    assert!(cancelled.await.expect_err("aborted").is_cancelled());
    held.release().await.expect("release");
    b.flush().await;

    // C holds and its session expires under it: a loss.
    let c = client.session().await.expect("session c");
    let lost = c.mutex("m/loss").expect("mutex").lock().await.expect("lock");
    assert!(store.expire(c.id()));
    lost.lost().await;

    let after = scrape(addr).await;
    // 3 plain, A and B on m/handoff, A on m/cancel, C: 7 grants.
    assert_eq!(after.get(&series("lockline_grants_total", "")), 7.0);
    assert_eq!(after.get(&series("lockline_acquire_wait_seconds_count", "")), 7.0);
    assert_eq!(after.get(&series("lockline_hold_seconds_count", "")), 7.0);
    assert_eq!(after.get(&series("lockline_handoff_seconds_count", "")), 1.0);
    assert_eq!(after.get(&series("lockline_timeouts_total", "")), 1.0);
    assert_eq!(after.get(&series("lockline_cancellations_total", "")), 1.0);
    assert_eq!(after.get(&series("lockline_busy_total", "")), 0.0);
    assert_eq!(after.get(&series("lockline_losses_total", r#"cause="expired""#)), 1.0);
    for cause in ["unconfirmed", "deleted", "runtime_gone"] {
        let name = series("lockline_losses_total", &format!(r#"cause="{cause}""#));
        assert_eq!(after.get(&name), 0.0, "{name}");
    }
    assert_eq!(after.get(&series("lockline_held", "")), 0.0);
    assert_eq!(after.get(&series("lockline_waiters", "")), 0.0);
    // The handoff's wait was at least the first holder's time after B queued.
    assert!(after.get(&series("lockline_acquire_wait_seconds_sum", "")) > 0.0);
    assert_eq!(after.get(r#"lockline_sessions_opened_total{backend="memory"}"#), 3.0);
    assert_eq!(client.stats().grants, 7, "the client's own counters agree");

    // With lock names included, a lock's series carries its name.
    lockline::metrics::include_lock_names(true);
    a.mutex("m/named")
        .expect("mutex")
        .lock()
        .await
        .expect("lock")
        .release()
        .await
        .expect("release");
    lockline::metrics::include_lock_names(false);
    let named = scrape(addr).await;
    assert_eq!(named.get(&series("lockline_grants_total", r#"lock="m/named""#)), 1.0);
    assert_eq!(
        named.get(&series("lockline_hold_seconds_count", r#"lock="m/named""#)),
        1.0
    );
    assert_eq!(
        named.get(&series("lockline_grants_total", "")),
        7.0,
        "unnamed series unchanged"
    );

    a.close().await.expect("close a");
    b.close().await.expect("close b");
}
