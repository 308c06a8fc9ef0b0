//! Handoff benchmark against a single-node etcd this program starts itself.
//!
//! ```text
//! cargo run --release -p lockline-etcd --example bench_etcd [-- --seconds 5 --contenders 1,2,4,16,64 --warmup 2 --versus-only|--no-versus]
//! cargo run --release -p lockline-etcd --example bench_etcd -- --modes-only [--modes-contenders 1,4,16 --modes-seconds 2 --modes-seed 1]
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
//! Latency, p50 / p99: of B_write's puts; of an uncontended acquire (N = 1)
//! and acquire + release cycle; and of a handoff at every N ≥ 2, from the
//! holder starting its release to the next holder's grant (lockline's and the
//! server lock's), measured in this one process.
//!
//! Wakeups per release are counted by the clients (lockline's `stats()`, the
//! herd's own counter) and on the server (`etcd_debugging_mvcc_events_total`,
//! watch events sent, per `etcd_debugging_mvcc_delete_total`).
//!
//! Then lockline against etcd's Go `concurrency.Mutex` (Debian
//! `golang-etcd-server-dev`, built here from `examples/go/benchgo` in GOPATH
//! mode, offline, as the interop tests build their Go peer): for each N, N
//! contenders, each its own session and connection, all in one process per
//! client library (lockline in this one, Go in its own), zero hold time, a
//! fresh server per client, `--warmup` seconds (default 2) before a window of
//! `--seconds`, two repetitions in alternating order. Printed: grants/s, the
//! ratio, and the client's and the server's CPU time per grant (the server's
//! from `/proc/PID/stat` of the etcd process over the window), then the
//! targets beside this run's figures, met or missed (lockline ≥ 1.0 × Go at
//! every N, server CPU per grant ≤ Go's at N = 1, client CPU per grant below
//! Go's at every N). `--versus-only` runs only this part, `--no-versus`
//! skips it.
//!
//! Before it, on the same server, the lock modes
//! (`lockline_bench::lock_modes`): for each N of `--modes-contenders`
//! (default 1, 4, 16), lockline's mutex and a `Resource` in EX side by side
//! (EX ÷ mutex), then a mixed workload of the six modes with conversions
//! (grants/s, wakeups per release), `--modes-seconds` each (default 2).
//! `--modes-only` runs only this part. Server counters per grant: revisions
//! (`etcd_debugging_mvcc_current_revision`: writes that changed keys) and
//! WAL fsyncs (`etcd_disk_wal_fsync_duration_seconds_count`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use lockline::Client;
use lockline_bench::lock_modes::{self, ModesArgs};
use lockline_bench::report::verdict;
use lockline_bench::versus::{self, Versus};
use lockline_bench::{ms, sequential, usage_exit, BenchArgs, BoxResult, Contenders, Contest, Latencies, Sampling};
use lockline_etcd::etcd_client::{
    self, Compare, CompareOp, EventType, GetOptions, LockOptions, PutOptions, SortOrder, SortTarget, Txn, TxnOp,
    WatchOptions,
};
use lockline_etcd::Etcd;
use lockline_testkit::EtcdCluster;

#[derive(Default, Clone)]
struct Run {
    grants_per_sec: f64,
    wakeups_per_release: f64,
    server_events_per_release: f64,
    /// Each `lock()` call, start to grant.
    acquire: Latencies,
    /// Release started → the next holder granted (N ≥ 2).
    handoff: Latencies,
}

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

/// The server's revisions (writes that changed keys) and WAL fsyncs, per
/// grant of each lock-mode measurement.
struct EtcdCounters<'a> {
    cluster: &'a EtcdCluster,
    before: [f64; 2],
}

impl EtcdCounters<'_> {
    fn read(&self) -> [f64; 2] {
        [
            metric(self.cluster, "etcd_debugging_mvcc_current_revision "),
            metric(self.cluster, "etcd_disk_wal_fsync_duration_seconds_count "),
        ]
    }
}

impl lock_modes::ServerCounters for EtcdCounters<'_> {
    fn names(&self) -> Vec<String> {
        vec!["revisions".to_owned(), "WAL fsyncs".to_owned()]
    }

    async fn before(&mut self) -> BoxResult<()> {
        self.before = self.read();
        Ok(())
    }

    async fn per_grant(&mut self, grants: u64) -> BoxResult<Vec<f64>> {
        let after = self.read();
        let grants = grants.max(1) as f64;
        Ok(after.iter().zip(self.before).map(|(a, b)| (a - b) / grants).collect())
    }
}

/// One client's sequential puts: puts/s and each put's latency.
async fn b_write(cluster: &EtcdCluster, seconds: f64) -> BoxResult<(f64, Latencies)> {
    let mut client = etcd_client::Client::connect(cluster.endpoints(), None).await?;
    Ok(sequential(seconds, async |n| {
        client.put("bench/b_write", n.to_string(), None).await.map(drop)
    })
    .await?)
}

async fn lockline_run(cluster: &EtcdCluster, n: usize, seconds: f64, name: &str) -> BoxResult<Run> {
    let contenders = Contenders::open(n, name, || Client::new(Etcd::new(cluster.endpoints()))).await?;
    let (events_before, deletes_before) = server_counts(cluster);
    let mut contest = contenders.contest(Sampling::UntilStopped);
    contest.run_for(seconds).await;
    let outcome = contest.stop().await?;
    let (events_after, deletes_after) = server_counts(cluster);
    let wakeups_per_release = contenders.wakeups_per_release();
    contenders.close().await?;
    Ok(Run {
        grants_per_sec: outcome.grants_per_sec(),
        wakeups_per_release,
        server_events_per_release: (events_after - events_before) / (deletes_after - deletes_before).max(1.0),
        acquire: outcome.acquire,
        handoff: outcome.handoff,
    })
}

async fn server_lock_run(cluster: &EtcdCluster, n: usize, seconds: f64, name: &'static str) -> BoxResult<Run> {
    let endpoints = cluster.endpoints();
    let mut contest = Contest::start(n, Sampling::UntilStopped, move |mut contender| {
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
            while contender.running() {
                let started = Instant::now();
                let locked = client.lock(name, Some(LockOptions::new().with_lease(lease))).await?;
                contender.granted(started);
                contender.releasing();
                client.unlock(locked.key().to_vec()).await?;
            }
            keepalive.abort();
            client.lease_revoke(lease).await?;
            Ok::<_, etcd_client::Error>(())
        }
    });
    contest.run_for(seconds).await;
    let outcome = contest.stop().await?;
    Ok(Run {
        grants_per_sec: outcome.grants_per_sec(),
        handoff: outcome.handoff,
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
    let mut contest = Contest::start(n, Sampling::UntilStopped, move |mut contender| {
        let endpoints = endpoints.clone();
        let (wakeups, releases) = (Arc::clone(&w), Arc::clone(&r));
        async move {
            let mut client = etcd_client::Client::connect(endpoints, None).await?;
            let lease = client.lease_grant(30, None).await?.id();
            let prefix = format!("{name}/");
            let key = format!("{prefix}{lease:x}");
            while contender.running() {
                let started = Instant::now();
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
                contender.granted(started);
                client
                    .txn(Txn::new().and_then([TxnOp::delete(key.clone(), None)]))
                    .await?;
                releases.fetch_add(1, Ordering::Relaxed);
            }
            client.lease_revoke(lease).await?;
            Ok::<_, etcd_client::Error>(())
        }
    });
    contest.run_for(seconds).await;
    let outcome = contest.stop().await?;
    let (events_after, deletes_after) = server_counts(cluster);
    Ok(Run {
        grants_per_sec: outcome.grants_per_sec(),
        wakeups_per_release: wakeups.load(Ordering::SeqCst) as f64 / releases.load(Ordering::SeqCst).max(1) as f64,
        server_events_per_release: (events_after - events_before) / (deletes_after - deletes_before).max(1.0),
        ..Run::default()
    })
}

/// Builds the Go side of the comparison, offline, against Debian's etcd
/// sources, into the system's temporary directory.
fn build_benchgo() -> BoxResult<std::path::PathBuf> {
    let dir = std::env::temp_dir().join(format!("lockline-benchgo-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let out = dir.join("benchgo");
    let source = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/go/benchgo/main.go");
    lockline_testkit::go_build(source.as_ref(), &out)?;
    Ok(out)
}

/// Go's uncontended requests made from this process with etcd-client (the
/// gRPC stack lockline uses): per cycle, the `Txn` of `Mutex.Lock` (put my
/// key if absent, read the prefix's first-created key) and the `DeleteRange`
/// of `Mutex.Unlock`. One contender (N = 1): it tells the cost of the
/// protocol from the cost of the client library's transport.
async fn raw_uncontended(cluster: &EtcdCluster, pid: u32, warmup: f64, window: f64) -> BoxResult<Versus> {
    let mut client = etcd_client::Client::connect(cluster.endpoints(), None).await?;
    let lease = client.lease_grant(10, None).await?.id();
    let prefix = "bench/versus/";
    let key = format!("{prefix}{lease:x}");
    let grants = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let task = {
        let (grants, stop, mut client) = (Arc::clone(&grants), Arc::clone(&stop), client.clone());
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let first = GetOptions::new()
                    .with_prefix()
                    .with_sort(SortTarget::Create, SortOrder::Ascend)
                    .with_limit(1);
                let txn = Txn::new()
                    .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
                    .and_then([
                        TxnOp::put(key.clone(), "", Some(PutOptions::new().with_lease(lease))),
                        TxnOp::get(prefix, Some(first.clone())),
                    ])
                    .or_else([TxnOp::get(key.clone(), None), TxnOp::get(prefix, Some(first))]);
                client.txn(txn).await?;
                grants.fetch_add(1, Ordering::Relaxed);
                client.delete(key.clone(), None).await?;
            }
            Ok::<_, etcd_client::Error>(())
        })
    };
    let measured = versus::measure(pid, &grants, warmup, window).await;
    stop.store(true, Ordering::Relaxed);
    task.await??;
    client.lease_revoke(lease).await?;
    measured
}

/// One client's window on a fresh server.
async fn versus_run(go: Option<&std::path::Path>, n: usize, warmup: f64, window: f64) -> BoxResult<Versus> {
    let mut cluster = EtcdCluster::start()?;
    let pid = cluster.member(0).pid().ok_or("the etcd server has no process id")?;
    let name = "bench/versus";
    match go {
        None => {
            let contenders = Contenders::open(n, name, || Client::new(Etcd::new(cluster.endpoints()))).await?;
            let run = versus::lockline(&contenders, pid, warmup, window).await?;
            contenders.close().await?;
            Ok(run)
        }
        Some(go) => {
            let mut command = std::process::Command::new(go);
            command
                .arg(cluster.endpoints().join(","))
                .arg(name)
                .arg(n.to_string())
                .arg(warmup.to_string())
                .arg(window.to_string());
            Ok(tokio::task::spawn_blocking(move || versus::peer(command, pid)).await??)
        }
    }
}

/// One figure of each run.
fn figures(runs: &[Versus], figure: fn(&Versus) -> f64) -> Vec<f64> {
    runs.iter().map(figure).collect()
}

/// `a–b` for two figures (one when they print the same).
fn range(values: &[f64], digits: usize) -> String {
    let min = values.iter().copied().fold(f64::INFINITY, f64::min);
    let max = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let (lo, hi) = (format!("{min:.digits$}"), format!("{max:.digits$}"));
    if lo == hi {
        lo
    } else {
        format!("{lo}–{hi}")
    }
}

/// The targets against Go, each beside this run's figures (the geometric
/// mean of the repetitions), met or missed: lockline ≥ 1.0 × Go's grants/s
/// at every N, its server CPU per grant ≤ Go's at N = 1, its client CPU per
/// grant below Go's at every N.
fn print_versus_targets(runs: &[(usize, Vec<Versus>, Vec<Versus>)]) {
    let mean = |values: Vec<f64>| {
        let count = values.len().max(1) as f64;
        (values.iter().map(|v| v.ln()).sum::<f64>() / count).exp()
    };
    let of = |runs: &[Versus], figure: fn(&Versus) -> f64| mean(figures(runs, figure));
    println!();
    println!("Targets (geometric means of the repetitions):");
    let rates: Vec<String> = runs
        .iter()
        .map(|(n, ours, theirs)| {
            let ratio = of(ours, Versus::grants_per_sec) / of(theirs, Versus::grants_per_sec);
            format!("N = {n}: {ratio:.2} ({})", verdict(ratio >= 1.0))
        })
        .collect();
    println!("- lockline ≥ 1.0 × Go's grants/s at every N: {}", rates.join(", "));
    match runs.iter().find(|(n, ..)| *n == 1) {
        Some((_, ours, theirs)) => {
            let (a, b) = (
                of(ours, Versus::server_ms_per_grant),
                of(theirs, Versus::server_ms_per_grant),
            );
            println!(
                "- server CPU per grant ≤ Go's at N = 1: {a:.2} / {b:.2} ms ({})",
                verdict(a <= b)
            );
        }
        None => println!("- server CPU per grant ≤ Go's at N = 1: N = 1 not measured"),
    }
    let client: Vec<String> = runs
        .iter()
        .map(|(n, ours, theirs)| {
            let (a, b) = (
                of(ours, Versus::client_ms_per_grant),
                of(theirs, Versus::client_ms_per_grant),
            );
            format!("N = {n}: {a:.2} / {b:.2} ms ({})", verdict(a < b))
        })
        .collect();
    println!("- client CPU per grant below Go's at every N: {}", client.join(", "));
    println!("What stands in the way of a missed target: docs/performance-notes.md, \"The targets\".");
}

/// lockline against Go's `concurrency.Mutex` (see the module docs).
async fn versus_go(args: &BenchArgs, warmup: f64) -> BoxResult<()> {
    let go = build_benchgo()?;
    println!();
    println!(
        "lockline vs Go concurrency.Mutex: fresh single-node etcd per client, {warmup} s warm-up, {} s window, \
         two repetitions in alternating order (ranges over them)",
        args.seconds
    );
    println!();
    println!(
        "| N | lockline grants/s | Go grants/s | lockline ÷ Go | client CPU ms/grant: lockline / Go | \
         server CPU ms/grant: lockline / Go | server read+write syscalls/grant: lockline / Go |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|");
    let mut targets = Vec::new();
    for &n in &args.contenders {
        let (mut ours, mut theirs) = (Vec::new(), Vec::new());
        for repetition in 0..2 {
            if repetition == 0 {
                ours.push(versus_run(None, n, warmup, args.seconds).await?);
                theirs.push(versus_run(Some(&go), n, warmup, args.seconds).await?);
            } else {
                theirs.push(versus_run(Some(&go), n, warmup, args.seconds).await?);
                ours.push(versus_run(None, n, warmup, args.seconds).await?);
            }
        }
        let ratios: Vec<f64> = ours
            .iter()
            .zip(&theirs)
            .map(|(o, t)| o.grants_per_sec() / t.grants_per_sec())
            .collect();
        println!(
            "| {n} | {} | {} | {} | {} / {} | {} / {} | {} / {} |",
            range(&figures(&ours, Versus::grants_per_sec), 0),
            range(&figures(&theirs, Versus::grants_per_sec), 0),
            range(&ratios, 2),
            range(&figures(&ours, Versus::client_ms_per_grant), 2),
            range(&figures(&theirs, Versus::client_ms_per_grant), 2),
            range(&figures(&ours, Versus::server_ms_per_grant), 2),
            range(&figures(&theirs, Versus::server_ms_per_grant), 2),
            range(&figures(&ours, Versus::server_syscalls_per_grant), 1),
            range(&figures(&theirs, Versus::server_syscalls_per_grant), 1),
        );
        targets.push((n, ours, theirs));
    }
    print_versus_targets(&targets);
    if args.contenders.contains(&1) {
        // Go's requests sent through etcd-client, beside lockline's and Go's
        // own, at N = 1 (each on a fresh server, alternating).
        let (mut raw, mut ours) = (Vec::new(), Vec::new());
        for repetition in 0..2 {
            for first in [repetition == 0, repetition != 0] {
                if first {
                    let mut cluster = EtcdCluster::start()?;
                    let pid = cluster.member(0).pid().ok_or("the etcd server has no process id")?;
                    raw.push(raw_uncontended(&cluster, pid, warmup, args.seconds).await?);
                } else {
                    ours.push(versus_run(None, 1, warmup, args.seconds).await?);
                }
            }
        }
        println!();
        println!(
            "N = 1, Go's two requests per cycle sent through etcd-client: {} cycles/s, client CPU {} ms, \
             server CPU {} ms, server syscalls {} per cycle (lockline in the same rounds: {} grants/s, {} ms, \
             {} ms, {})",
            range(&figures(&raw, Versus::grants_per_sec), 0),
            range(&figures(&raw, Versus::client_ms_per_grant), 2),
            range(&figures(&raw, Versus::server_ms_per_grant), 2),
            range(&figures(&raw, Versus::server_syscalls_per_grant), 1),
            range(&figures(&ours, Versus::grants_per_sec), 0),
            range(&figures(&ours, Versus::client_ms_per_grant), 2),
            range(&figures(&ours, Versus::server_ms_per_grant), 2),
            range(&figures(&ours, Versus::server_syscalls_per_grant), 1),
        );
    }
    if let Some(dir) = go.parent() {
        let _ = std::fs::remove_dir_all(dir);
    }
    Ok(())
}

/// The mutex's tables: lockline, etcd's lock API and the herd for each N,
/// then the latencies.
async fn mutex_tables(cluster: &EtcdCluster, args: &BenchArgs) -> BoxResult<()> {
    let seconds = args.seconds;
    println!(
        "etcd handoff benchmark: single-node etcd on {}, {seconds} s per measurement",
        cluster.endpoint(0)
    );
    let (b_write, put_latency) = b_write(cluster, seconds).await?;
    println!(
        "B_write (one client's sequential puts/s): {b_write:.0}; put latency p50 / p99: {} ms",
        put_latency.p50_p99()
    );
    println!();
    println!(
        "| N | lockline grants/s | server-lock grants/s | lockline / server-lock | lockline / B_write | \
         wakeups/release (client) | watch events/release (server) | herd grants/s | herd wakeups/release (client) | herd watch events/release (server) |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let mut uncontended = None;
    let mut latency_rows = Vec::new();
    for (round, &n) in args.contenders.iter().enumerate() {
        let ours = lockline_run(cluster, n, seconds, &format!("bench/lockline-{round}")).await?;
        let name: &'static str = Box::leak(format!("bench/server-{round}").into_boxed_str());
        let server = server_lock_run(cluster, n, seconds, name).await?;
        let herd_name: &'static str = Box::leak(format!("bench/herd-{round}").into_boxed_str());
        let herd = herd_run(cluster, n, seconds, herd_name).await?;
        if n == 1 {
            uncontended = Some((ours.grants_per_sec, ours.acquire.clone()));
        }
        latency_rows.push((n, ours.handoff.clone(), server.handoff.clone()));
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
    if let Some((cycles, acquire)) = uncontended {
        println!();
        println!(
            "uncontended acquire+release cycles/s: {cycles:.0} = {:.2} x B_write/2 (one round trip each way); \
             uncontended acquire p50 / p99: {} ms",
            cycles / (b_write / 2.0),
            acquire.p50_p99()
        );
    }
    println!();
    println!("handoff latency, release started -> next holder granted, p50 / p99 in ms:");
    println!();
    println!("| N | lockline | server-lock | lockline p99 / B_write p50 |");
    println!("|---:|---:|---:|---:|");
    let put_p50 = put_latency.quantile(0.5).map_or(f64::NAN, ms);
    for (n, ours, server) in latency_rows.iter().filter(|(n, _, _)| *n > 1) {
        let ratio = ours.quantile(0.99).map_or(f64::NAN, ms) / put_p50;
        println!("| {n} | {} | {} | {ratio:.1} |", ours.p50_p99(), server.p50_p99());
    }
    Ok(())
}

#[tokio::main]
async fn main() -> BoxResult<()> {
    fn fail<T>(message: String) -> T {
        usage_exit(
            &message,
            "bench_etcd",
            &BenchArgs::usage(&format!(
                "[--warmup S] [--versus-only | --no-versus] {}",
                ModesArgs::USAGE
            )),
        )
    }
    let (modes, own, rest) = ModesArgs::take(
        std::env::args().skip(1),
        &["--versus-only", "--no-versus"],
        &["--warmup"],
    )
    .unwrap_or_else(fail);
    let args = BenchArgs::parse(rest).unwrap_or_else(fail);
    let warmup: f64 = match own.value("--warmup") {
        None => 2.0,
        Some(value) => value
            .parse()
            .ok()
            .filter(|w: &f64| (0.0..=600.0).contains(w))
            .unwrap_or_else(|| fail(format!("bad --warmup {value:?}"))),
    };
    if own.switch("--versus-only") {
        return versus_go(&args, warmup).await;
    }
    let cluster = EtcdCluster::start()?;
    if !modes.only {
        mutex_tables(&cluster, &args).await?;
    }
    let on = format!("single-node etcd on {}", cluster.endpoint(0));
    let mut counters = EtcdCounters {
        cluster: &cluster,
        before: [0.0; 2],
    };
    lock_modes::run_with(
        &on,
        &modes,
        "bench/",
        || Client::new(Etcd::new(cluster.endpoints())),
        &mut counters,
    )
    .await?;
    drop(cluster);
    if !modes.only && !own.switch("--no-versus") {
        versus_go(&args, warmup).await?;
    }
    Ok(())
}
