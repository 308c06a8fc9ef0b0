//! Handoff benchmark against a standalone ZooKeeper this program starts itself.
//!
//! ```text
//! cargo run --release -p lockline-zookeeper --example bench_zookeeper [-- --seconds 5 --contenders 1,2,4,16,64]
//! ```
//!
//! For each N, N contenders (each its own client and ZooKeeper session) take
//! and release one lock with zero hold time for the given number of seconds.
//! Measured in the same run, against the same server:
//!
//! - `lockline`: grants/s of lockline's mutex;
//! - `kazoo`: grants/s of kazoo's `Lock`, N kazoo clients driven by one Python
//!   process (`examples/bench_kazoo.py`, Debian's `python3-kazoo`);
//! - `B_write`: one client's sequential `set_data`/s.
//!
//! Wakeups per release are counted by lockline's clients (`stats()`) and on the
//! server (`mntr`: watchers triggered by node deletions, per deletion).

use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use lockline::{Client, SessionOptions};
use lockline_testkit::{BenchArgs, ZkEnsemble};
use lockline_zookeeper::zookeeper_client as zk;
use lockline_zookeeper::ZooKeeper;

type BoxResult<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// `zk_sum_node_deleted_watch_count` and `zk_cnt_node_deleted_watch_count`.
fn deleted_watches(ensemble: &ZkEnsemble) -> (f64, f64) {
    let mntr = ensemble.four_letter(0, "mntr").unwrap_or_default();
    let get = |name: &str| {
        mntr.lines()
            .find_map(|l| l.strip_prefix(name).and_then(|v| v.trim().parse().ok()))
            .unwrap_or(f64::NAN)
    };
    (
        get("zk_sum_node_deleted_watch_count"),
        get("zk_cnt_node_deleted_watch_count"),
    )
}

async fn b_write(ensemble: &ZkEnsemble, seconds: f64) -> BoxResult<f64> {
    let client = zk::Client::connect(&ensemble.connect_string()).await?;
    client
        .create(
            "/bench-b-write",
            b"",
            &zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all()),
        )
        .await?;
    let started = Instant::now();
    let mut n = 0u64;
    while started.elapsed().as_secs_f64() < seconds {
        client
            .set_data("/bench-b-write", n.to_string().as_bytes(), None)
            .await?;
        n += 1;
    }
    Ok(n as f64 / started.elapsed().as_secs_f64())
}

struct Run {
    grants_per_sec: f64,
    wakeups_per_release: f64,
    server_watches_per_release: f64,
}

async fn lockline_run(ensemble: &ZkEnsemble, n: usize, seconds: f64, name: &str) -> BoxResult<Run> {
    let mut clients = Vec::new();
    let mut mutexes = Vec::new();
    for _ in 0..n {
        let client = Client::new(ZooKeeper::new(ensemble.connect_string()));
        let session = client
            .session_with(SessionOptions::new().with_ttl(Duration::from_secs(10)))
            .await?;
        mutexes.push(session.mutex(name)?);
        clients.push(client);
    }
    let (sum_before, _) = deleted_watches(ensemble);
    let stop = Arc::new(AtomicBool::new(false));
    let grants = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for mutex in &mutexes {
        let (mutex, stop, grants) = (mutex.clone(), Arc::clone(&stop), Arc::clone(&grants));
        tasks.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let guard = mutex.lock().await?;
                grants.fetch_add(1, Ordering::Relaxed);
                guard.release().await?;
            }
            Ok::<(), lockline::Error>(())
        }));
    }
    tokio::time::sleep(Duration::from_secs_f64(seconds)).await;
    let counted = grants.load(Ordering::SeqCst);
    stop.store(true, Ordering::SeqCst);
    for task in tasks {
        task.await??;
    }
    let (sum_after, _) = deleted_watches(ensemble);
    let (wakeups, releases) = clients.iter().fold((0, 0), |(w, r), c| {
        let s = c.stats();
        (w + s.wakeups, r + s.releases)
    });
    for mutex in &mutexes {
        mutex.session().close().await?;
    }
    Ok(Run {
        grants_per_sec: counted as f64 / seconds,
        wakeups_per_release: wakeups as f64 / releases.max(1) as f64,
        server_watches_per_release: (sum_after - sum_before) / releases.max(1) as f64,
    })
}

fn kazoo_run(ensemble: &ZkEnsemble, n: usize, seconds: f64, path: &str) -> BoxResult<f64> {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/bench_kazoo.py");
    let output = Command::new("/usr/bin/python3")
        .args([
            script,
            &ensemble.connect_string(),
            path,
            &n.to_string(),
            &seconds.to_string(),
        ])
        .output()?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    stdout
        .lines()
        .find_map(|l| l.strip_prefix("grants_per_sec ").and_then(|v| v.trim().parse().ok()))
        .ok_or_else(|| {
            format!(
                "kazoo benchmark failed: {stdout}{}",
                String::from_utf8_lossy(&output.stderr)
            )
            .into()
        })
}

#[tokio::main]
async fn main() -> BoxResult<()> {
    let args = match BenchArgs::from_env() {
        Ok(args) => args,
        Err(message) => {
            eprintln!("{message}\nusage: bench_zookeeper [--seconds S] [--contenders 1,2,4,16,64]");
            std::process::exit(2);
        }
    };
    let ensemble = ZkEnsemble::start()?;
    let seconds = args.seconds;
    println!(
        "ZooKeeper handoff benchmark: standalone ZooKeeper on {}, {seconds} s per measurement",
        ensemble.address(0)
    );
    let b_write = b_write(&ensemble, seconds).await?;
    println!("B_write (one client's sequential set_data/s): {b_write:.0}");
    println!();
    println!(
        "| N | lockline grants/s | kazoo grants/s | lockline / kazoo | lockline / B_write | \
         wakeups/release (client) | deletion watches fired/release (server) |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|");
    for (round, &n) in args.contenders.iter().enumerate() {
        let ours = lockline_run(&ensemble, n, seconds, &format!("bench/lockline-{round}")).await?;
        let kazoo = kazoo_run(&ensemble, n, seconds, &format!("/bench/kazoo-{round}"))?;
        println!(
            "| {n} | {:.0} | {:.0} | {:.2} | {:.2} | {:.2} | {:.2} |",
            ours.grants_per_sec,
            kazoo,
            ours.grants_per_sec / kazoo,
            ours.grants_per_sec / b_write,
            ours.wakeups_per_release,
            ours.server_watches_per_release,
        );
    }
    Ok(())
}
