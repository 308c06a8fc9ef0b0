//! Handoff benchmark against a Redis server this program starts itself.
//!
//! ```text
//! cargo run --release -p lockline-redis --example bench_redis [-- --seconds 5 --contenders 1,2,4,16,64]
//! ```
//!
//! For each N, N contenders (each its own client and session) take and
//! release one lock with zero hold time for the given number of seconds.
//! Measured in the same run, against the same server:
//!
//! - `lockline`: grants/s of lockline's mutex;
//! - `redis-py`: grants/s of redis-py's `Lock` (it polls every 0.1 s), N
//!   clients driven by one Python process (`examples/bench_redis_py.py`,
//!   Debian's `python3-redis`);
//! - `spin`: grants/s of the `SET n token NX PX` lock with a Lua
//!   compare-and-delete release, retried every 10 ms;
//! - `B_write`: one client's sequential `SET`s/s.
//!
//! Wakeups per release are counted by lockline's clients (`stats()`); on the
//! server, commands processed per grant (`INFO stats`) stay flat in N when
//! each release wakes one waiter, and grow with N when every waiter looks.

use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use lockline::{Client, SessionOptions};
use lockline_redis::Redis;
use lockline_testkit::{BenchArgs, RedisServer};

type BoxResult<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

async fn connection(server: &RedisServer) -> BoxResult<redis::aio::MultiplexedConnection> {
    Ok(redis::Client::open(server.url())?
        .get_multiplexed_async_connection()
        .await?)
}

/// `total_commands_processed` from `INFO stats`.
async fn commands_processed(conn: &mut redis::aio::MultiplexedConnection) -> BoxResult<f64> {
    let info: String = redis::cmd("INFO").arg("stats").query_async(conn).await?;
    info.lines()
        .find_map(|l| l.strip_prefix("total_commands_processed:"))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| "no total_commands_processed in INFO stats".into())
}

async fn b_write(server: &RedisServer, seconds: f64) -> BoxResult<f64> {
    let mut conn = connection(server).await?;
    let started = Instant::now();
    let mut n = 0u64;
    while started.elapsed().as_secs_f64() < seconds {
        let () = redis::cmd("SET")
            .arg("bench-b-write")
            .arg(n)
            .query_async(&mut conn)
            .await?;
        n += 1;
    }
    Ok(n as f64 / started.elapsed().as_secs_f64())
}

struct Run {
    grants_per_sec: f64,
    wakeups_per_release: f64,
    commands_per_grant: f64,
}

async fn lockline_run(server: &RedisServer, n: usize, seconds: f64, name: &str) -> BoxResult<Run> {
    let mut clients = Vec::new();
    let mut mutexes = Vec::new();
    for _ in 0..n {
        let client = Client::new(Redis::new(server.url()));
        let session = client
            .session_with(SessionOptions::new().with_ttl(Duration::from_secs(10)))
            .await?;
        mutexes.push(session.mutex(name)?);
        clients.push(client);
    }
    let mut side = connection(server).await?;
    let before = commands_processed(&mut side).await?;
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
    let after = commands_processed(&mut side).await?;
    stop.store(true, Ordering::SeqCst);
    for task in tasks {
        task.await??;
    }
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
        commands_per_grant: (after - before) / counted.max(1) as f64,
    })
}

/// The seeds' single-key lock: `SET n token NX PX`, retried every 10 ms,
/// released by a Lua compare-and-delete.
async fn spin_run(server: &RedisServer, n: usize, seconds: f64, name: &str) -> BoxResult<(f64, f64)> {
    let release = redis::Script::new(
        "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) else return 0 end",
    );
    let release = Arc::new(release);
    let mut side = connection(server).await?;
    let before = commands_processed(&mut side).await?;
    let stop = Arc::new(AtomicBool::new(false));
    let grants = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for i in 0..n {
        let mut conn = connection(server).await?;
        let (stop, grants, release, name) = (
            Arc::clone(&stop),
            Arc::clone(&grants),
            Arc::clone(&release),
            name.to_owned(),
        );
        tasks.push(tokio::spawn(async move {
            let mut round = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let token = format!("{i}-{round}");
                round += 1;
                loop {
                    let taken: Option<String> = redis::cmd("SET")
                        .arg(&name)
                        .arg(&token)
                        .arg("NX")
                        .arg("PX")
                        .arg(10_000)
                        .query_async(&mut conn)
                        .await?;
                    if taken.is_some() {
                        break;
                    }
                    if stop.load(Ordering::Relaxed) {
                        return Ok(());
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                grants.fetch_add(1, Ordering::Relaxed);
                let _: i64 = release.key(&name).arg(&token).invoke_async(&mut conn).await?;
            }
            Ok::<(), redis::RedisError>(())
        }));
    }
    tokio::time::sleep(Duration::from_secs_f64(seconds)).await;
    let counted = grants.load(Ordering::SeqCst);
    let after = commands_processed(&mut side).await?;
    stop.store(true, Ordering::SeqCst);
    for task in tasks {
        task.await??;
    }
    Ok((counted as f64 / seconds, (after - before) / counted.max(1) as f64))
}

fn redis_py_run(server: &RedisServer, n: usize, seconds: f64, name: &str) -> BoxResult<f64> {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/bench_redis_py.py");
    let output = Command::new("/usr/bin/python3")
        .args([
            script,
            &server.port().to_string(),
            name,
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
                "redis-py benchmark failed: {stdout}{}",
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
            eprintln!("{message}\nusage: bench_redis [--seconds S] [--contenders 1,2,4,16,64]");
            std::process::exit(2);
        }
    };
    let server = RedisServer::start()?;
    let seconds = args.seconds;
    println!(
        "Redis handoff benchmark: redis-server on 127.0.0.1:{} (no persistence), {seconds} s per measurement",
        server.port()
    );
    let b_write = b_write(&server, seconds).await?;
    println!("B_write (one client's sequential SET/s): {b_write:.0}");
    println!();
    println!(
        "| N | lockline grants/s | redis-py grants/s | spin (SET NX PX, 10 ms) grants/s | lockline / B_write | \
         lockline / redis-py | lockline / spin | wakeups/release (client) | server commands/grant: lockline | spin |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (round, &n) in args.contenders.iter().enumerate() {
        let ours = lockline_run(&server, n, seconds, &format!("bench/lockline-{round}")).await?;
        let py = redis_py_run(&server, n, seconds, &format!("bench/redis-py-{round}"))?;
        let (spin, spin_commands) = spin_run(&server, n, seconds, &format!("bench/spin-{round}")).await?;
        println!(
            "| {n} | {:.0} | {:.0} | {:.0} | {:.2} | {:.1} | {:.2} | {:.2} | {:.1} | {:.1} |",
            ours.grants_per_sec,
            py,
            spin,
            ours.grants_per_sec / b_write,
            ours.grants_per_sec / py,
            ours.grants_per_sec / spin,
            ours.wakeups_per_release,
            ours.commands_per_grant,
            spin_commands,
        );
    }
    Ok(())
}
