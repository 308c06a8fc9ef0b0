//! The lockline demo: several workers, each with its own session (as separate
//! processes would have), contend for one lock. It prints every handoff in
//! order with its fencing token, checks that grants were FIFO and tokens strictly
//! increasing, and reports wakeups per release.
//!
//! ```text
//! cargo run -p lockline-demo --release -- [--workers N] [--rounds N] [--etcd ENDPOINTS | --etcd-local | --zookeeper HOSTS | --redis [URL]
//!     | --postgres URL | --postgres-local | --mysql URL | --mariadb-local]
//! ```
//!
//! The memory backend by default; `--etcd http://host:2379[,...]` runs it on an
//! etcd cluster you have, `--etcd-local` on a throwaway etcd it starts (Debian's
//! `etcd-server`) on a free loopback port, `--zookeeper HOST:PORT[,...]` on a
//! ZooKeeper ensemble, `--redis redis://HOST:PORT` on a Redis node you have,
//! and `--redis` alone on a throwaway `redis-server` it starts.
//! `--postgres postgres://USER:PASSWORD@HOST:PORT/DATABASE` and `--mysql
//! mysql://USER:PASSWORD@HOST:PORT/DATABASE` (or `mariadb://`) run it on a
//! database you have (lockline creates its tables there on first use);
//! `--postgres-local` and `--mariadb-local` on a throwaway PostgreSQL or
//! MariaDB it starts through the test kit (Debian's `postgresql`,
//! `mariadb-server`) on a free loopback port with a temporary data directory.

use std::process::ExitCode;
use std::sync::{Arc, Mutex as StdMutex};
use std::time::{Duration, Instant};

use lockline::{Client, FencingToken, Result, SessionOptions};
use lockline_etcd::Etcd;
use lockline_redis::Redis;
use lockline_sql::Sql;
use lockline_testkit::{EtcdCluster, MariaDbServer, PgOptions, PgServer, RedisServer};
use lockline_zookeeper::ZooKeeper;

struct Args {
    workers: usize,
    rounds: usize,
    backend: Backend,
}

enum Backend {
    Memory,
    Etcd(Vec<String>),
    EtcdLocal,
    ZooKeeper(String),
    Redis(String),
    RedisLocal,
    /// A PostgreSQL or MariaDB/MySQL database by URL.
    Sql(String),
    PostgresLocal,
    MariaDbLocal,
}

const USAGE: &str = "usage: lockline-demo [--workers N (2..=64, default 5)] [--rounds N (1..=1000, default 3)] \
                     [--etcd http://HOST:PORT[,...] | --etcd-local | --zookeeper HOST:PORT[,...] | --redis [redis://HOST:PORT] \
                     | --postgres postgres://USER:PASSWORD@HOST:PORT/DB | --postgres-local \
                     | --mysql mysql://USER:PASSWORD@HOST:PORT/DB | --mariadb-local]";

fn parse_args() -> std::result::Result<Args, String> {
    let mut args = Args {
        workers: 5,
        rounds: 3,
        backend: Backend::Memory,
    };
    let mut it = std::env::args().skip(1).peekable();
    while let Some(flag) = it.next() {
        let mut number = |range: std::ops::RangeInclusive<usize>| -> std::result::Result<usize, String> {
            let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
            let n: usize = value
                .parse()
                .map_err(|_| format!("{flag}: {value:?} is not a number"))?;
            if range.contains(&n) {
                Ok(n)
            } else {
                Err(format!("{flag}: {n} is outside {range:?}"))
            }
        };
        match flag.as_str() {
            "--workers" => args.workers = number(2..=64)?,
            "--rounds" => args.rounds = number(1..=1000)?,
            "--etcd" => {
                let list = it.next().ok_or("--etcd needs endpoints")?;
                args.backend = Backend::Etcd(list.split(',').map(str::to_owned).collect());
            }
            "--etcd-local" => args.backend = Backend::EtcdLocal,
            "--zookeeper" => {
                let hosts = it.next().ok_or("--zookeeper needs a connect string")?;
                args.backend = Backend::ZooKeeper(hosts);
            }
            "--redis" => {
                // A URL after it names a server; alone, a throwaway one.
                let url = it.next_if(|v| v.starts_with("redis://") || v.starts_with("rediss://"));
                args.backend = match url {
                    Some(url) => Backend::Redis(url),
                    None => Backend::RedisLocal,
                };
            }
            flag @ ("--postgres" | "--mysql") => {
                let url = it.next().ok_or_else(|| format!("{flag} needs a URL"))?;
                let schemes: &[&str] = if flag == "--postgres" {
                    &["postgres://", "postgresql://"]
                } else {
                    &["mysql://", "mariadb://"]
                };
                if !schemes.iter().any(|s| url.to_ascii_lowercase().starts_with(s)) {
                    // Not the URL itself: it may hold a password.
                    return Err(format!("{flag} takes a {} URL", schemes.join(" or ")));
                }
                args.backend = Backend::Sql(url);
            }
            "--postgres-local" => args.backend = Backend::PostgresLocal,
            "--mariadb-local" => args.backend = Backend::MariaDbLocal,
            "-h" | "--help" => return Err(USAGE.to_owned()),
            other => return Err(format!("unknown argument {other:?}\n{USAGE}")),
        }
    }
    Ok(args)
}

/// A resource that accepts a write only with a token at least as high as the
/// highest it has seen: what fencing tokens are for.
#[derive(Default)]
struct FencedResource {
    highest: StdMutex<Option<FencingToken>>,
}

impl FencedResource {
    fn write(&self, token: FencingToken) -> bool {
        let mut highest = self.highest.lock().unwrap_or_else(|e| e.into_inner());
        if highest.is_some_and(|h| token < h) {
            return false;
        }
        *highest = Some(token);
        true
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(args) => args,
        Err(message) => {
            eprintln!("{message}");
            return ExitCode::from(2);
        }
    };
    match run(args).await {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(error) => {
            eprintln!("demo failed: {error}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> Result<bool> {
    let mut _local = None;
    let mut _local_redis = None;
    let mut _local_postgres = None;
    let mut _local_mariadb = None;
    let client = match &args.backend {
        Backend::Memory => Client::memory(),
        Backend::Etcd(endpoints) => Client::new(Etcd::new(endpoints.clone())),
        Backend::ZooKeeper(hosts) => Client::new(ZooKeeper::new(hosts.clone())),
        Backend::EtcdLocal => {
            let cluster = EtcdCluster::start()
                .map_err(|e| lockline::Error::unavailable_because("etcd", "starting a throwaway etcd", e))?;
            println!("started a throwaway etcd at {}", cluster.endpoint(0));
            let client = Client::new(Etcd::new(cluster.endpoints()));
            _local = Some(cluster);
            client
        }
        Backend::Redis(url) => Client::new(Redis::new(url.clone())),
        Backend::RedisLocal => {
            let server = RedisServer::start()
                .map_err(|e| lockline::Error::unavailable_because("redis", "starting a throwaway redis-server", e))?;
            println!("started a throwaway redis-server at {}", server.url());
            let client = Client::new(Redis::new(server.url()));
            _local_redis = Some(server);
            client
        }
        Backend::Sql(url) => Client::new(Sql::new(url.clone())),
        Backend::PostgresLocal => {
            // A throwaway: its data need not survive a crash of the machine.
            let options = PgOptions {
                durable: false,
                ..Default::default()
            };
            let server = PgServer::start_with(&options)
                .map_err(|e| lockline::Error::unavailable_because("postgres", "starting a throwaway PostgreSQL", e))?;
            println!("started a throwaway PostgreSQL at 127.0.0.1:{}", server.port());
            let client = Client::new(Sql::new(server.url()));
            _local_postgres = Some(server);
            client
        }
        Backend::MariaDbLocal => {
            let server = MariaDbServer::start()
                .map_err(|e| lockline::Error::unavailable_because("mysql", "starting a throwaway MariaDB", e))?;
            server
                .create_database("demo")
                .map_err(|e| lockline::Error::unavailable_because("mysql", "creating the database demo", e))?;
            println!("started a throwaway MariaDB at 127.0.0.1:{}", server.port());
            let client = Client::new(Sql::new(format!("{}/demo", server.url())));
            _local_mariadb = Some(server);
            client
        }
    };
    let name = "demo/printer";
    println!(
        "lockline demo: {} workers x {} rounds on one lock {name:?} ({} backend)",
        args.workers,
        args.rounds,
        client.backend_name()
    );
    let options = SessionOptions::new().with_ttl(Duration::from_secs(5));
    let resource = Arc::new(FencedResource::default());
    let grants = Arc::new(StdMutex::new(Vec::<(usize, FencingToken)>::new()));
    let started = Instant::now();

    // A starter holds the lock while the workers queue behind it, one after the
    // other, so that the queue order is known.
    let starter = client.session_with(options.clone()).await?;
    let opening = starter.mutex(name)?.lock().await?;
    // The appends before the workers' first: each grant's holder waits for
    // the next grants' requests by this count.
    let appends_before = client.stats().appends;
    let mut workers = Vec::new();
    for worker in 0..args.workers {
        let session = client.session_with(options.clone()).await?;
        let mutex = session.mutex(name)?;
        let (resource, grants) = (Arc::clone(&resource), Arc::clone(&grants));
        let queued_before = client.stats().waits;
        let rounds = args.rounds;
        let counts = client.clone();
        let total = args.workers * args.rounds;
        let workers_count = args.workers;
        workers.push(tokio::spawn(async move {
            for _ in 0..rounds {
                let guard = mutex.lock().await?;
                let token = guard.token();
                let accepted = resource.write(token);
                let seq = {
                    let mut grants = grants.lock().unwrap_or_else(|e| e.into_inner());
                    grants.push((worker, token));
                    grants.len()
                };
                println!(
                    "  grant {seq:>3}  worker {worker:>2}  token {token:>5}  write {}",
                    if accepted { "accepted" } else { "REJECTED" }
                );
                // Hold the lock across a little work, and until the requests
                // of the next grants are queued (the worker that released
                // last asks again while this one holds; a busy machine may
                // take longer than the work), so that the queue's order is
                // the workers' round: at most a second.
                tokio::time::sleep(Duration::from_millis(5)).await;
                let queued = appends_before + (seq + workers_count - 1).min(total) as u64;
                let _ =
                    tokio::time::timeout(Duration::from_secs(1), counts.wait_for_stats(|s| s.appends >= queued)).await;
                guard.release().await?;
            }
            session.close().await
        }));
        client.wait_for_stats(|s| s.waits > queued_before).await;
    }
    println!(
        "  {} workers queued behind the starter (token {}); starter releases",
        args.workers,
        opening.token()
    );
    opening.release().await?;
    starter.close().await?;
    for worker in workers {
        match worker.await {
            Ok(result) => result?,
            Err(join) => {
                eprintln!("a worker panicked: {join}");
                return Ok(false);
            }
        }
    }

    let grants = grants.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let stats = client.stats();
    let fifo = grants
        .iter()
        .enumerate()
        .all(|(i, (worker, _))| *worker == i % args.workers);
    let increasing = grants.windows(2).all(|w| w[0].1 < w[1].1);
    let stale = FencingToken::new(grants.first().map_or(0, |(_, t)| t.get()));
    let stale_rejected = grants.len() < 2 || !resource.write(stale);
    println!();
    println!(
        "{} grants in {:.0?}: FIFO round-robin order {}, fencing tokens strictly increasing {}",
        grants.len(),
        started.elapsed(),
        yes(fifo),
        yes(increasing)
    );
    println!(
        "wakeups per release: {} wakeups / {} releases = {:.2} (herd-free: at most one waiter woken per release)",
        stats.wakeups,
        stats.releases,
        stats.wakeups as f64 / stats.releases.max(1) as f64
    );
    println!(
        "a paused former holder writing with token {stale} is rejected by the fenced resource: {}",
        yes(stale_rejected)
    );
    Ok(fifo && increasing && stale_rejected && stats.wakeups <= stats.releases)
}

fn yes(ok: bool) -> &'static str {
    if ok {
        "yes"
    } else {
        "NO"
    }
}
