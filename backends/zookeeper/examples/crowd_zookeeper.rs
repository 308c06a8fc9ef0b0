//! A crowd on one lock, from several processes, against a standalone ZooKeeper this
//! program starts itself (issue 12, scale mode (a)).
//!
//! ```text
//! cargo run --release -p lockline-zookeeper --example crowd_zookeeper [-- --seconds 5 --processes 4 --crowd 1000 --compare 16,64 --warmup 20 --fast-start]
//! ```
//!
//! The program re-runs itself as child processes (`lockline_testkit::Crowd`),
//! each running its share of the contenders (each its own client and
//! session), which take and release one lock with zero hold time. Measured
//! once every contender has queued: grants/s, wakeups per release (the
//! clients' `stats()`), and handoff latency (a grant's time minus the
//! previous holder's release start, from the grants of every process sorted
//! by fencing token). Each `--compare` count runs in one process and in
//! `--processes`, to show whether the one-process design of `bench_zookeeper`
//! distorts; then `--crowd` contenders run in `--processes`, against the
//! largest `--compare` count.
//!
//! As `bench_zookeeper`, the server runs with production JVM settings
//! (`ZkJvm::Production`, what ZooKeeper's `zkServer.sh` uses) unless
//! `--fast-start` asks for the test harness's; the flags are printed. An
//! unmeasured run of `--warmup` seconds (default 20) at N = 64 comes first,
//! for the JIT.

use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use lockline::{Client, SessionOptions};
use lockline_testkit::{
    run_plan, unix_nanos, CrowdArgs, CrowdChild, CrowdCounts, GrantRecord, ZkEnsemble, ZkJvm, ZkOptions,
};
use lockline_zookeeper::ZooKeeper;

type BoxResult<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

fn main() -> BoxResult<()> {
    if let Some(child) = CrowdChild::from_env()? {
        return tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()?
            .block_on(contend(child));
    }
    let (args, switches) = match CrowdArgs::from_env(&["--fast-start"], 20.0) {
        Ok(parsed) => parsed,
        Err(message) => {
            eprintln!("{message}\nusage: crowd_zookeeper {} [--fast-start]", CrowdArgs::USAGE);
            std::process::exit(2);
        }
    };
    let jvm = match switches.is_empty() {
        true => ZkJvm::Production,
        false => ZkJvm::FastStart,
    };
    let ensemble = ZkEnsemble::start_with(
        1,
        &ZkOptions {
            jvm,
            ..ZkOptions::default()
        },
    )?;
    println!(
        "ZooKeeper crowd benchmark: standalone ZooKeeper on {}, {} s per measurement, \
         each contender its own client and session",
        ensemble.address(0),
        args.seconds
    );
    println!("server JVM: {} ({jvm:?})", jvm.flags().join(" "));
    run_plan(&args, &[ensemble.connect_string()])?;
    Ok(())
}

fn counts(clients: &[Client]) -> CrowdCounts {
    clients.iter().fold(CrowdCounts::default(), |sum, client| {
        let stats = client.stats();
        CrowdCounts {
            grants: sum.grants + stats.grants,
            wakeups: sum.wakeups + stats.wakeups,
            releases: sum.releases + stats.releases,
        }
    })
}

/// A child: its contenders loop lock → release on `crowd/RUN`.
async fn contend(child: CrowdChild) -> BoxResult<()> {
    let connect = child.args.first().ok_or("crowd child: no connect string")?.clone();
    let name = format!("crowd/{}", child.run);
    let mut clients = Vec::new();
    let mut mutexes = Vec::new();
    for _ in 0..child.contenders {
        let client = Client::new(ZooKeeper::new(connect.clone()));
        let session = client
            .session_with(SessionOptions::new().with_ttl(Duration::from_secs(10)))
            .await?;
        mutexes.push(session.mutex(&name)?);
        clients.push(client);
    }
    child.ready()?;
    let records = Arc::new(StdMutex::new(Vec::<GrantRecord>::new()));
    let tasks: Vec<_> = mutexes
        .iter()
        .map(|mutex| tokio::spawn(contender(mutex.clone(), Arc::clone(&records))))
        .collect();
    tokio::time::timeout(Duration::from_secs(120), async {
        for client in &clients {
            client.wait_for_stats(|s| s.appends >= 1).await;
        }
    })
    .await
    .map_err(|_| "crowd child: contenders did not queue within 120 s")?;
    let window = child.queued()?;
    tokio::time::sleep(window.until_start()).await;
    let before = counts(&clients);
    tokio::time::sleep(window.until_end()).await;
    let during = counts(&clients).since(before);
    for task in &tasks {
        task.abort();
    }
    for task in tasks {
        if let Ok(Err(error)) = task.await {
            return Err(format!("crowd child: a contender failed: {error}").into());
        }
    }
    let records = std::mem::take(&mut *records.lock().expect("records"));
    child.report(during, &records, window)?;
    let closes: Vec<_> = mutexes
        .into_iter()
        .map(|mutex| tokio::spawn(async move { mutex.session().close().await }))
        .collect();
    tokio::time::timeout(Duration::from_secs(30), async {
        for close in closes {
            let _ = close.await;
        }
    })
    .await
    .map_err(|_| "crowd child: sessions did not close within 30 s")?;
    Ok(())
}

/// One contender: lock → record → release, until aborted.
async fn contender(mutex: lockline::Mutex, records: Arc<StdMutex<Vec<GrantRecord>>>) -> lockline::Result<()> {
    loop {
        let guard = mutex.lock().await?;
        let granted_ns = unix_nanos();
        let token = guard.token().get();
        let release_started_ns = unix_nanos();
        records.lock().expect("records").push(GrantRecord {
            token,
            granted_ns,
            release_started_ns,
        });
        guard.release().await?;
    }
}
