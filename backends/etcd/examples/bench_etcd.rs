//! Handoff benchmark against a single-node etcd this program starts itself.
//!
//! ```text
//! cargo run --release -p lockline-etcd --example bench_etcd [-- --seconds 5 --contenders 1,2,4,16,64]
//! ```
//!
//! For each N, N contenders (each its own client and session, as separate
//! processes would be) take and release one lock with zero hold time for the
//! given number of seconds. Measured in the same run, against the same server:
//!
//! - `lockline`: grants/s of lockline's mutex;
//! - `server-lock`: grants/s of etcd's server-side lock API (`Lock`/`Unlock`,
//!   each contender with its own kept-alive lease);
//! - `herd`: grants/s of a deliberately herd-prone lock where every waiter
//!   watches the current holder, to show that the wakeup metric catches a herd;
//! - `B_write`: one client's sequential puts/s.
//!
//! Wakeups per release are counted by the clients (lockline's `stats()`, the
//! herd's own counter) and on the server (`etcd_debugging_mvcc_events_total`,
//! watch events sent, per `etcd_debugging_mvcc_delete_total`).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use lockline::{Client, SessionOptions};
use lockline_etcd::etcd_client::{
    self, Compare, CompareOp, EventType, GetOptions, LockOptions, PutOptions, SortOrder, SortTarget, Txn, TxnOp,
    WatchOptions,
};
use lockline_etcd::Etcd;
use lockline_testkit::{BenchArgs, EtcdCluster};

#[derive(Default, Clone, Copy)]
struct Run {
    grants_per_sec: f64,
    wakeups_per_release: f64,
    server_events_per_release: f64,
}

type BoxResult<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

fn metric(cluster: &EtcdCluster, name: &str) -> f64 {
    cluster
        .metrics(0)
        .and_then(|m| {
            m.lines()
                .find_map(|l| l.strip_prefix(name).and_then(|v| v.trim().parse().ok()))
        })
        .unwrap_or(f64::NAN)
}

/// Server-side watch events sent and deletes done, read together.
fn server_counts(cluster: &EtcdCluster) -> (f64, f64) {
    (
        metric(cluster, "etcd_debugging_mvcc_events_total "),
        metric(cluster, "etcd_debugging_mvcc_delete_total "),
    )
}

async fn b_write(cluster: &EtcdCluster, seconds: f64) -> BoxResult<f64> {
    let mut client = etcd_client::Client::connect(cluster.endpoints(), None).await?;
    let started = Instant::now();
    let mut n = 0u64;
    while started.elapsed().as_secs_f64() < seconds {
        client.put("bench/b_write", n.to_string(), None).await?;
        n += 1;
    }
    Ok(n as f64 / started.elapsed().as_secs_f64())
}

/// Runs `n` contenders until `seconds` pass; returns grants in the window.
async fn window<F, Fut>(n: usize, seconds: f64, contender: F) -> BoxResult<f64>
where
    F: Fn(usize, Arc<AtomicBool>, Arc<AtomicU64>) -> Fut,
    Fut: std::future::Future<Output = BoxResult<()>> + Send + 'static,
{
    let stop = Arc::new(AtomicBool::new(false));
    let grants = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for i in 0..n {
        tasks.push(tokio::spawn(contender(i, Arc::clone(&stop), Arc::clone(&grants))));
    }
    tokio::time::sleep(Duration::from_secs_f64(seconds)).await;
    let counted = grants.load(Ordering::SeqCst);
    stop.store(true, Ordering::SeqCst);
    for task in tasks {
        task.await??;
    }
    Ok(counted as f64 / seconds)
}

async fn lockline_run(cluster: &EtcdCluster, n: usize, seconds: f64, name: &str) -> BoxResult<Run> {
    let mut clients = Vec::new();
    let mut mutexes = Vec::new();
    for _ in 0..n {
        let client = Client::new(Etcd::new(cluster.endpoints()));
        let session = client
            .session_with(SessionOptions::new().with_ttl(Duration::from_secs(10)))
            .await?;
        mutexes.push(session.mutex(name)?);
        clients.push(client);
    }
    let (events_before, deletes_before) = server_counts(cluster);
    let mutexes = Arc::new(mutexes);
    let grants_per_sec = window(n, seconds, |i, stop, grants| {
        let mutexes = Arc::clone(&mutexes);
        async move {
            let mutex = &mutexes[i];
            while !stop.load(Ordering::Relaxed) {
                let guard = mutex.lock().await?;
                grants.fetch_add(1, Ordering::Relaxed);
                guard.release().await?;
            }
            Ok(())
        }
    })
    .await?;
    let (events_after, deletes_after) = server_counts(cluster);
    let (wakeups, releases) = clients.iter().fold((0, 0), |(w, r), c| {
        let s = c.stats();
        (w + s.wakeups, r + s.releases)
    });
    for mutex in mutexes.iter() {
        mutex.session().close().await?;
    }
    Ok(Run {
        grants_per_sec,
        wakeups_per_release: wakeups as f64 / releases.max(1) as f64,
        server_events_per_release: (events_after - events_before) / (deletes_after - deletes_before).max(1.0),
    })
}

async fn server_lock_run(cluster: &EtcdCluster, n: usize, seconds: f64, name: &'static str) -> BoxResult<Run> {
    let endpoints = cluster.endpoints();
    let grants_per_sec = window(n, seconds, move |_, stop, grants| {
        let endpoints = endpoints.clone();
        async move {
            let mut client = etcd_client::Client::connect(endpoints, None).await?;
            let lease = client.lease_grant(10, None).await?.id();
            let (mut keeper, mut responses) = client.lease_keep_alive(lease).await?;
            let keepalive = tokio::spawn(async move {
                loop {
                    tokio::time::sleep(Duration::from_secs(3)).await;
                    if keeper.keep_alive().await.is_err() || responses.message().await.is_err() {
                        break;
                    }
                }
            });
            while !stop.load(Ordering::Relaxed) {
                let locked = client.lock(name, Some(LockOptions::new().with_lease(lease))).await?;
                grants.fetch_add(1, Ordering::Relaxed);
                client.unlock(locked.key().to_vec()).await?;
            }
            keepalive.abort();
            client.lease_revoke(lease).await?;
            Ok(())
        }
    })
    .await?;
    Ok(Run {
        grants_per_sec,
        ..Run::default()
    })
}

/// A lock where every waiter watches the current holder (the first-created
/// key): each release wakes every waiter.
async fn herd_run(cluster: &EtcdCluster, n: usize, seconds: f64, name: &'static str) -> BoxResult<Run> {
    let endpoints = cluster.endpoints();
    let wakeups = Arc::new(AtomicU64::new(0));
    let releases = Arc::new(AtomicU64::new(0));
    let (events_before, deletes_before) = server_counts(cluster);
    let (w, r) = (Arc::clone(&wakeups), Arc::clone(&releases));
    let grants_per_sec = window(n, seconds, move |_, stop, grants| {
        let endpoints = endpoints.clone();
        let (wakeups, releases) = (Arc::clone(&w), Arc::clone(&r));
        async move {
            let mut client = etcd_client::Client::connect(endpoints, None).await?;
            let lease = client.lease_grant(30, None).await?.id();
            let prefix = format!("{name}/");
            let key = format!("{prefix}{lease:x}");
            while !stop.load(Ordering::Relaxed) {
                client
                    .put(key.clone(), "", Some(PutOptions::new().with_lease(lease)))
                    .await?;
                loop {
                    let first = client
                        .get(
                            prefix.clone(),
                            Some(
                                GetOptions::new()
                                    .with_prefix()
                                    .with_sort(SortTarget::Create, SortOrder::Ascend)
                                    .with_limit(1),
                            ),
                        )
                        .await?;
                    let Some(head) = first.kvs().first() else { break };
                    if head.key() == key.as_bytes() {
                        break;
                    }
                    let (head_key, head_rev) = (head.key().to_vec(), head.create_revision());
                    let mut watch = client.watch(head_key.clone(), Some(WatchOptions::new())).await?;
                    let still = client
                        .txn(Txn::new().when([Compare::create_revision(head_key, CompareOp::Equal, head_rev)]))
                        .await?;
                    if still.succeeded() {
                        'wait: while let Some(response) = watch.message().await? {
                            if response.events().iter().any(|e| e.event_type() == EventType::Delete) {
                                break 'wait;
                            }
                        }
                    }
                    wakeups.fetch_add(1, Ordering::Relaxed);
                }
                grants.fetch_add(1, Ordering::Relaxed);
                client
                    .txn(Txn::new().and_then([TxnOp::delete(key.clone(), None)]))
                    .await?;
                releases.fetch_add(1, Ordering::Relaxed);
            }
            client.lease_revoke(lease).await?;
            Ok(())
        }
    })
    .await?;
    let (events_after, deletes_after) = server_counts(cluster);
    Ok(Run {
        grants_per_sec,
        wakeups_per_release: wakeups.load(Ordering::SeqCst) as f64 / releases.load(Ordering::SeqCst).max(1) as f64,
        server_events_per_release: (events_after - events_before) / (deletes_after - deletes_before).max(1.0),
    })
}

#[tokio::main]
async fn main() -> BoxResult<()> {
    let args = match BenchArgs::from_env() {
        Ok(args) => args,
        Err(message) => {
            eprintln!("{message}\nusage: bench_etcd [--seconds S] [--contenders 1,2,4,16,64]");
            std::process::exit(2);
        }
    };
    let cluster = EtcdCluster::start()?;
    let seconds = args.seconds;
    println!(
        "etcd handoff benchmark: single-node etcd on {}, {seconds} s per measurement",
        cluster.endpoint(0)
    );
    let b_write = b_write(&cluster, seconds).await?;
    println!("B_write (one client's sequential puts/s): {b_write:.0}");
    println!();
    println!(
        "| N | lockline grants/s | server-lock grants/s | lockline / server-lock | lockline / B_write | \
         wakeups/release (client) | watch events/release (server) | herd grants/s | herd wakeups/release (client) | herd watch events/release (server) |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let mut uncontended = None;
    for (round, &n) in args.contenders.iter().enumerate() {
        let ours = lockline_run(&cluster, n, seconds, &format!("bench/lockline-{round}")).await?;
        let name: &'static str = Box::leak(format!("bench/server-{round}").into_boxed_str());
        let server = server_lock_run(&cluster, n, seconds, name).await?;
        let herd_name: &'static str = Box::leak(format!("bench/herd-{round}").into_boxed_str());
        let herd = herd_run(&cluster, n, seconds, herd_name).await?;
        if n == 1 {
            uncontended = Some(ours.grants_per_sec);
        }
        println!(
            "| {n} | {:.0} | {:.0} | {:.2} | {:.2} | {:.2} | {:.2} | {:.0} | {:.2} | {:.2} |",
            ours.grants_per_sec,
            server.grants_per_sec,
            ours.grants_per_sec / server.grants_per_sec,
            ours.grants_per_sec / b_write,
            ours.wakeups_per_release,
            ours.server_events_per_release,
            herd.grants_per_sec,
            herd.wakeups_per_release,
            herd.server_events_per_release,
        );
    }
    if let Some(cycles) = uncontended {
        println!();
        println!(
            "uncontended acquire+release cycles/s: {cycles:.0} = {:.2} x B_write/2 (one round trip each way)",
            cycles / (b_write / 2.0)
        );
    }
    Ok(())
}
