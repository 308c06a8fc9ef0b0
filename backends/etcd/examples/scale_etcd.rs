//! Scale of one session holding many locks, and of many sessions in one
//! process (issue 12, modes b and c), against a single-node etcd this
//! program starts itself.
//!
//! ```text
//! cargo run --release -p lockline-etcd --example scale_etcd [-- --locks 100000 --sessions 1000 --in-flight 64 --ttl 10 --ttls 2]
//! ```
//!
//! **Many locks on one session** (`--locks N`, default 100,000; 0 skips it):
//! one session acquires N mutexes `scale/0 .. scale/N-1`, `--in-flight`
//! (default 64) acquires at once, spread over 64 tasks that each take the
//! next number until none is left. Printed: the time and rate; the client's
//! resident memory (`VmRSS`) and live heap (a counting global allocator)
//! per held lock, measured just before the first acquire and just after the
//! last. Both include everything the program keeps per lock: the guard and
//! its slot in the `Vec` of guards, the core's per-hold state (its monitor
//! task, the same-session queue), and the backend's watch on the entry (its
//! channel and its place in the session's watch hub); the mutex handles are
//! dropped once locked. They also include allocator growth that is not per
//! lock (glibc's arenas, gRPC buffers). Then the server's view: leases
//! (`LeaseLeases`), watch streams and watchers
//! (`etcd_debugging_mvcc_watch_stream_total`, `..._watcher_total`), open
//! gRPC streams by method; whether every lock is still held after two
//! keepalive intervals, and how long `session.close()` (the lease's revoke)
//! takes.
//!
//! **Many sessions** (`--sessions M`, default 1,000; 0 skips it): one client
//! (so one gRPC connection, through a byte-counting proxy) opens M
//! sessions, each holding one lock. After one keepalive interval to settle,
//! the server's `LeaseKeepAlive` messages received
//! (`grpc_server_msg_received_total`), its `etcd_debugging_lease_renewed_total`
//! and the bytes each way are counted over `--ttls` TTLs and printed per
//! session per TTL.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use lockline::{Client, MutexGuard, Session, SessionOptions};
use lockline_etcd::{etcd_client, Etcd};
use lockline_testkit::scale::{CountingAlloc, CountingProxy, ScaleArgs};
use lockline_testkit::{rss_kib, EtcdCluster};

#[global_allocator]
static HEAP: CountingAlloc = CountingAlloc::new();

type BoxResult<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

#[tokio::main]
async fn main() -> BoxResult<()> {
    let args = ScaleArgs::from_env()?;
    let cluster = EtcdCluster::start()?;
    if args.locks > 0 {
        many_locks(&cluster, &args).await?;
    }
    if args.sessions > 0 {
        many_sessions(&cluster, &args).await?;
    }
    Ok(())
}

/// Takes `count` locks named `{prefix}{i}` with `in_flight` tasks, each taking
/// the next number until none is left; the guards in number order.
async fn acquire_all(session: &Session, prefix: &str, count: usize, in_flight: usize) -> BoxResult<Vec<MutexGuard>> {
    let next = Arc::new(AtomicUsize::new(0));
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..in_flight.min(count) {
        let (session, next, prefix) = (session.clone(), Arc::clone(&next), prefix.to_owned());
        workers.spawn(async move {
            let mut held = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= count {
                    return Ok::<_, lockline::Error>(held);
                }
                held.push((i, session.mutex(&format!("{prefix}{i}"))?.lock().await?));
            }
        });
    }
    let mut guards: Vec<Option<MutexGuard>> = Vec::with_capacity(count);
    guards.resize_with(count, || None);
    while let Some(done) = workers.join_next().await {
        for (i, guard) in done?? {
            guards[i] = Some(guard);
        }
    }
    Ok(guards.into_iter().flatten().collect())
}

fn per(total: f64, count: usize) -> f64 {
    total / count.max(1) as f64
}

/// The sum of the samples of metric `name` whose labels contain `labels`.
fn metric(cluster: &EtcdCluster, name: &str, labels: &str) -> f64 {
    let text = cluster.metrics(0).unwrap_or_default();
    text.lines()
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with(' ') || rest.starts_with('{'))
                && l.contains(labels)
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// gRPC streams the server has open for `method` (started, not yet handled).
fn open_streams(cluster: &EtcdCluster, method: &str) -> f64 {
    let label = format!("grpc_method=\"{method}\"");
    metric(cluster, "grpc_server_started_total", &label) - metric(cluster, "grpc_server_handled_total", &label)
}

async fn leases(cluster: &EtcdCluster) -> BoxResult<usize> {
    let mut client = etcd_client::Client::connect(cluster.endpoints(), None).await?;
    Ok(client.leases().await?.leases().len())
}

async fn many_locks(cluster: &EtcdCluster, args: &ScaleArgs) -> BoxResult<()> {
    let locks = args.locks;
    let options = SessionOptions::new().with_ttl(args.ttl);
    let client = Client::new(Etcd::new(cluster.endpoints()));
    let session = client.session_with(options.clone()).await?;
    println!(
        "== {locks} locks on one session (TTL {:?}, {} acquires in flight) ==",
        args.ttl, args.in_flight
    );
    let (rss_before, heap_before, blocks_before) = (rss_kib(), HEAP.live_bytes(), HEAP.live_blocks());
    let sizes_before = HEAP.live_blocks_by_size();
    let started = Instant::now();
    let guards = acquire_all(&session, "scale/", locks, args.in_flight).await?;
    let took = started.elapsed();
    let (rss_after, heap_after, blocks_after) = (rss_kib(), HEAP.live_bytes(), HEAP.live_blocks());
    println!(
        "acquired {} locks in {took:.2?} ({:.0}/s)",
        guards.len(),
        guards.len() as f64 / took.as_secs_f64()
    );
    println!(
        "client RSS {rss_before} -> {rss_after} KiB: {:.2} KiB per held lock; live heap {:.0} bytes in {:.1} blocks per held lock",
        per(rss_after.saturating_sub(rss_before) as f64, locks),
        per(heap_after.saturating_sub(heap_before) as f64, locks),
        per(blocks_after.saturating_sub(blocks_before) as f64, locks),
    );
    println!(
        "  live heap blocks per held lock by size: {}",
        HEAP.growth_by_size(&sizes_before, locks, 0.05).join(", ")
    );
    println!(
        "  (a guard is {} bytes in the Vec of guards)",
        std::mem::size_of::<MutexGuard>()
    );
    println!(
        "server: {} lease(s); {} watch stream(s) with {} watchers; open gRPC streams: {} LeaseKeepAlive, {} Watch",
        leases(cluster).await?,
        metric(cluster, "etcd_debugging_mvcc_watch_stream_total", ""),
        metric(cluster, "etcd_debugging_mvcc_watcher_total", ""),
        open_streams(cluster, "LeaseKeepAlive"),
        open_streams(cluster, "Watch"),
    );
    // Two renewals, looked at halfway to the third (not during one).
    let waited = options.keepalive_interval() * 5 / 2;
    tokio::time::sleep(waited).await;
    let held = guards.iter().filter(|g| g.is_held()).count();
    println!(
        "after two keepalive intervals ({waited:.1?}): {held} of {locks} still held; client RSS {} KiB, live heap {:.0} bytes per held lock",
        rss_kib(),
        per(HEAP.live_bytes().saturating_sub(heap_before) as f64, locks),
    );
    let started = Instant::now();
    let closed = session.close().await;
    println!(
        "session.close() (the lease's revoke) {} in {:.2?}; {} lease(s) left",
        closed.map_or_else(|e| format!("FAILED ({e})"), |()| "done".to_owned()),
        started.elapsed(),
        leases(cluster).await?
    );
    drop(guards);
    Ok(())
}

async fn many_sessions(cluster: &EtcdCluster, args: &ScaleArgs) -> BoxResult<()> {
    let count = args.sessions;
    let options = SessionOptions::new().with_ttl(args.ttl);
    let proxy = CountingProxy::start(&format!("127.0.0.1:{}", cluster.client_port(0)))?;
    let client = Client::new(Etcd::new([format!("http://{}", proxy.address())]));
    println!(
        "== {count} sessions, one lock each (TTL {:?}, keepalive every {:?}) ==",
        args.ttl,
        options.keepalive_interval()
    );
    let leases_before = leases(cluster).await?;
    let started = Instant::now();
    let next = Arc::new(AtomicUsize::new(0));
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..args.in_flight.min(count) {
        let (client, options, next) = (client.clone(), options.clone(), Arc::clone(&next));
        workers.spawn(async move {
            let mut held = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= count {
                    return Ok::<_, lockline::Error>(held);
                }
                let session = client.session_with(options.clone()).await?;
                let guard = session.mutex(&format!("sessions/{i}"))?.lock().await?;
                held.push((session, guard));
            }
        });
    }
    let mut held = Vec::with_capacity(count);
    while let Some(done) = workers.join_next().await {
        held.extend(done??);
    }
    println!(
        "opened {count} sessions and took a lock on each in {:.2?}",
        started.elapsed()
    );
    tokio::time::sleep(options.keepalive_interval()).await;
    println!(
        "server: {} leases; {} watch streams with {} watchers; open gRPC streams: {} LeaseKeepAlive, {} Watch; {} client connection(s)",
        leases(cluster).await? - leases_before,
        metric(cluster, "etcd_debugging_mvcc_watch_stream_total", ""),
        metric(cluster, "etcd_debugging_mvcc_watcher_total", ""),
        open_streams(cluster, "LeaseKeepAlive"),
        open_streams(cluster, "Watch"),
        proxy.connections(),
    );
    let keepalive = "grpc_method=\"LeaseKeepAlive\"";
    let received = || metric(cluster, "grpc_server_msg_received_total", keepalive);
    let renewed = || metric(cluster, "etcd_debugging_lease_renewed_total", "");
    let (received_before, renewed_before) = (received(), renewed());
    let (up_before, down_before) = (proxy.bytes_to_server(), proxy.bytes_to_client());
    let window = args.ttl * args.ttls;
    tokio::time::sleep(window).await;
    let (up, down) = (
        proxy.bytes_to_server() - up_before,
        proxy.bytes_to_client() - down_before,
    );
    let (received, renewed) = (received() - received_before, renewed() - renewed_before);
    let ttls = window.as_secs_f64() / args.ttl.as_secs_f64();
    let per_session_ttl = |n: f64| n / count as f64 / ttls;
    println!(
        "keepalive per session per TTL (counted over {window:?}): server received {:.2} LeaseKeepAlive requests and renewed {:.2} times; \
         client sent {:.0} bytes, received {:.0} bytes",
        per_session_ttl(received),
        per_session_ttl(renewed),
        per_session_ttl(up as f64),
        per_session_ttl(down as f64),
    );
    let still = held.iter().filter(|(_, guard)| guard.is_held()).count();
    println!("{still} of {count} locks still held");
    let started = Instant::now();
    let closes = held.iter().map(|(session, _)| session.close());
    let failed: Vec<lockline::Error> = futures::future::join_all(closes)
        .await
        .into_iter()
        .filter_map(Result::err)
        .collect();
    println!(
        "closed {count} sessions (all at once) in {:.2?}; {} failed{}",
        started.elapsed(),
        failed.len(),
        failed.first().map(|e| format!(", the first: {e}")).unwrap_or_default()
    );
    Ok(())
}
