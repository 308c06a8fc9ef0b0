//! Where an etcd handoff's time goes: a profile for the performance work,
//! against a single-node etcd this program starts itself.
//!
//! ```text
//! cargo run --release -p lockline-etcd --example profile_etcd [-- --seconds 4 --contenders 16]
//! ```
//!
//! Two measurements, with B_write (one client's sequential puts) measured in
//! the same run:
//!
//! 1. **Server work per grant**: N contenders (each its own client and
//!    session) take and release one lock with zero hold time, as in
//!    `bench_etcd`; the server's own counters, per grant: WAL fsyncs, raft
//!    proposals, `Txn` and `Range` requests, watch-stream messages (creates
//!    and cancels), watch events sent, and the CPU time of the server and of
//!    this (client) process, with how many cores each kept busy.
//! 2. **A chain of handoffs**: 100 contenders queue once; the first releases
//!    and each holder releases as soon as it is granted, without queueing
//!    again. No append competes with the handoffs, so the rate is what one
//!    handoff costs: the holder's delete (its round trip, fsync included), then
//!    the watch event, the successor's one read and its grant.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use lockline::{Client, SessionOptions};
use lockline_bench::BenchArgs;
use lockline_etcd::{etcd_client, Etcd};
use lockline_testkit::EtcdCluster;

type BoxResult<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// The server counters this profile reads, by the label it prints.
const COUNTERS: [(&str, &str); 10] = [
    ("WAL fsyncs", "etcd_disk_wal_fsync_duration_seconds_count "),
    ("WAL fsync time (ms)", "etcd_disk_wal_fsync_duration_seconds_sum "),
    ("server CPU time (ms)", "process_cpu_seconds_total "),
    ("raft proposals committed", "etcd_server_proposals_committed_total "),
    (
        "Txn requests",
        "grpc_server_msg_received_total{grpc_method=\"Txn\",grpc_service=\"etcdserverpb.KV\",grpc_type=\"unary\"} ",
    ),
    (
        "Range requests",
        "grpc_server_msg_received_total{grpc_method=\"Range\",grpc_service=\"etcdserverpb.KV\",grpc_type=\"unary\"} ",
    ),
    (
        "watch-stream messages (creates, cancels)",
        "grpc_server_msg_received_total{grpc_method=\"Watch\",grpc_service=\"etcdserverpb.Watch\",grpc_type=\"bidi_stream\"} ",
    ),
    ("watch events sent", "etcd_debugging_mvcc_events_total "),
    (
        "lease keepalive messages",
        "grpc_server_msg_received_total{grpc_method=\"LeaseKeepAlive\",grpc_service=\"etcdserverpb.Lease\",grpc_type=\"bidi_stream\"} ",
    ),
    ("client CPU time (ms)", ""),
];

/// This process's CPU time (user + system) in seconds, from `/proc/self/stat`
/// (clock ticks of 1/100 s).
fn client_cpu_seconds() -> f64 {
    std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|stat| {
            // Fields after the command name (which may hold spaces): utime is
            // the 14th field of the line, stime the 15th.
            let rest = stat.rsplit_once(')')?.1;
            let fields: Vec<&str> = rest.split_whitespace().collect();
            let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<f64>().ok());
            Some((ticks(11)? + ticks(12)?) / 100.0)
        })
        .unwrap_or(0.0)
}

fn counters(cluster: &EtcdCluster) -> BTreeMap<&'static str, f64> {
    let metrics = cluster.metrics(0).unwrap_or_default();
    COUNTERS
        .iter()
        .map(|(label, name)| {
            let value = if name.is_empty() {
                client_cpu_seconds()
            } else {
                metrics
                    .lines()
                    .find_map(|l| l.strip_prefix(name).and_then(|v| v.trim().parse().ok()))
                    .unwrap_or(0.0)
            };
            // Times are printed in milliseconds.
            let value = if label.ends_with("(ms)") { value * 1000.0 } else { value };
            (*label, value)
        })
        .collect()
}

/// Sequential puts per second, and their mean latency.
async fn b_write(cluster: &EtcdCluster, seconds: f64) -> BoxResult<(f64, Duration)> {
    let mut client = etcd_client::Client::connect(cluster.endpoints(), None).await?;
    let started = Instant::now();
    let mut n = 0u32;
    while started.elapsed().as_secs_f64() < seconds {
        client.put("profile/b_write", n.to_string(), None).await?;
        n += 1;
    }
    let elapsed = started.elapsed();
    Ok((f64::from(n) / elapsed.as_secs_f64(), elapsed / n.max(1)))
}

async fn sessions(cluster: &EtcdCluster, n: usize) -> BoxResult<Vec<lockline::Session>> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let client = Client::new(Etcd::new(cluster.endpoints()));
        out.push(
            client
                .session_with(SessionOptions::new().with_ttl(Duration::from_secs(30)))
                .await?,
        );
    }
    Ok(out)
}

async fn server_work(cluster: &EtcdCluster, n: usize, seconds: f64) -> BoxResult<()> {
    let sessions = sessions(cluster, n).await?;
    let mutexes = Arc::new(
        sessions
            .iter()
            .map(|s| s.mutex("profile/work"))
            .collect::<lockline::Result<Vec<_>>>()?,
    );
    let stop = Arc::new(AtomicBool::new(false));
    let grants = Arc::new(AtomicU64::new(0));
    let before = counters(cluster);
    let tasks = (0..n)
        .map(|i| {
            let (mutexes, stop, grants) = (Arc::clone(&mutexes), Arc::clone(&stop), Arc::clone(&grants));
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let guard = mutexes[i].lock().await?;
                    grants.fetch_add(1, Ordering::Relaxed);
                    guard.release().await?;
                }
                Ok::<(), lockline::Error>(())
            })
        })
        .collect::<Vec<_>>();
    tokio::time::sleep(Duration::from_secs_f64(seconds)).await;
    let granted = grants.load(Ordering::SeqCst) as f64;
    let after = counters(cluster);
    stop.store(true, Ordering::SeqCst);
    for task in tasks {
        task.await??;
    }
    println!(
        "server work per grant, N = {n}, zero hold time ({:.0} grants/s):",
        granted / seconds
    );
    println!();
    println!("| counter | per grant |");
    println!("|---|---:|");
    for (label, _) in COUNTERS {
        println!("| {label} | {:.2} |", (after[label] - before[label]) / granted.max(1.0));
    }
    let busy = |label: &str| (after[label] - before[label]) / 1000.0 / seconds;
    println!();
    println!(
        "cores busy during the window: server {:.2}, this client process {:.2} (of {} cores)",
        busy("server CPU time (ms)"),
        busy("client CPU time (ms)"),
        std::thread::available_parallelism().map_or(0, usize::from)
    );
    for session in sessions {
        session.close().await?;
    }
    Ok(())
}

async fn chain(cluster: &EtcdCluster, n: usize, b_write: f64, put_latency: Duration) -> BoxResult<()> {
    let sessions = sessions(cluster, n).await?;
    let first = sessions[0].mutex("profile/chain")?.lock().await?;
    let (done, mut finished) = tokio::sync::mpsc::unbounded_channel();
    for session in &sessions[1..] {
        let mutex = session.mutex("profile/chain")?;
        let done = done.clone();
        tokio::spawn(async move {
            let guard = mutex.lock().await?;
            let granted = Instant::now();
            guard.release().await?;
            let _ = done.send((granted, Instant::now()));
            Ok::<(), lockline::Error>(())
        });
    }
    // Every contender in line before the first release.
    while sessions[0].queue("profile/chain").await?.len() < n {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let started = Instant::now();
    first.release().await?;
    let first_released = Instant::now();
    let (mut deletes, mut wakes) = (Vec::with_capacity(n), Vec::with_capacity(n));
    let mut released = first_released;
    let mut last = started;
    for _ in 1..n {
        let Some((granted, done)) = finished.recv().await else {
            return Err("a contender of the chain failed".into());
        };
        wakes.push(granted.saturating_duration_since(released));
        deletes.push(done - granted);
        released = done;
        last = done;
    }
    let handoffs = u32::try_from(n - 1).unwrap_or(u32::MAX);
    let rate = f64::from(handoffs) / (last - started).as_secs_f64();
    println!();
    println!(
        "a chain of {handoffs} handoffs with no append competing: {rate:.0}/s = {:.2} x B_write",
        rate / b_write
    );
    println!();
    println!("| step of a handoff | mean | p50 | p99 |");
    println!("|---|---:|---:|---:|");
    println!("| a put (B_write's mean latency) | {put_latency:.2?} | | |");
    for (step, times) in [
        ("the holder's release (delete round trip, fsync included)", &mut deletes),
        (
            "release answered -> next holder granted (watch event, one read, grant)",
            &mut wakes,
        ),
    ] {
        times.sort();
        let mean = times.iter().sum::<Duration>() / handoffs;
        let at = |q: f64| times[((times.len() - 1) as f64 * q).round() as usize];
        println!("| {step} | {mean:.2?} | {:.2?} | {:.2?} |", at(0.5), at(0.99));
    }
    for session in sessions {
        session.close().await?;
    }
    Ok(())
}

#[tokio::main]
async fn main() -> BoxResult<()> {
    let args = match BenchArgs::from_env() {
        Ok(args) => args,
        Err(message) => {
            eprintln!("{message}\nusage: profile_etcd [--seconds S] [--contenders N]");
            std::process::exit(2);
        }
    };
    let n = args
        .contenders
        .first()
        .copied()
        .filter(|_| args.contenders.len() == 1)
        .unwrap_or(16);
    let cluster = EtcdCluster::start()?;
    let (b_write, put_latency) = b_write(&cluster, args.seconds).await?;
    println!(
        "etcd handoff profile: single-node etcd on {}; B_write {b_write:.0} puts/s ({put_latency:.2?} each)",
        cluster.endpoint(0)
    );
    println!();
    server_work(&cluster, n, args.seconds).await?;
    chain(&cluster, 100, b_write, put_latency).await?;
    Ok(())
}
