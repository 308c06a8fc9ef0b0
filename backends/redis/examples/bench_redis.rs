//! Handoff benchmark against a Redis server this program starts itself.
//!
//! ```text
//! cargo run --release -p lockline-redis --example bench_redis [-- --seconds 5 --contenders 1,2,4,16,64]
//! cargo run --release -p lockline-redis --example bench_redis -- --modes-only [--modes-contenders 1,4,16 --modes-seconds 2 --modes-seed 1]
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
//! Grants/s counts every grant; handoffs/s only those that went to another
//! contender than the holder before. lockline is FIFO, so at N ≥ 2 every
//! grant is a handoff; the single-key locks are not fair, and with zero hold
//! time a releasing contender mostly takes the lock straight back, so their
//! grants/s is close to one client's and their handoffs/s is what waiting
//! contenders actually get.
//!
//! Wakeups per release are counted by lockline's clients (`stats()`) and on
//! the server (`cmdstat_publish` per grant: each release publishes once, on
//! a channel only its one waiter listens to); commands processed per grant (`INFO stats`, which counts the
//! commands inside scripts too) stay flat in N when each release wakes one
//! waiter, and grow with N when every waiter looks.
//!
//! Latency (p50 / p99, measured in-process): of each acquire (at N = 1
//! uncontended; at N ≥ 2 it includes the wait in the queue), of each handoff
//! (from the holder starting its release to the moment another contender's
//! acquire returns; for redis-py and spin only the grants that went to
//! another contender count, timed from the release just before them: a
//! waiter that polled in vain through many earlier releases is not charged
//! for those, so these figures flatter the polling locks), and of B_write's
//! `SET`s. The target line compares lockline's handoff p99 at the
//! largest N with B_write's p50.
//!
//! Then, on the same server, the lock modes (`lockline_bench::lock_modes`):
//! for each N of `--modes-contenders` (default 1, 4, 16), lockline's mutex
//! and a `Resource` in EX side by side (EX ÷ mutex), then a mixed workload
//! of the six modes with conversions (grants/s, wakeups per release),
//! `--modes-seconds` each (default 2), with the server's commands and its
//! CPU time (`INFO cpu`, in microseconds) per grant. `--modes-only` runs
//! only this part.

use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use lockline::Client;
use lockline_bench::lock_modes::{self, ModesArgs};
use lockline_bench::report::{p99_over, p99_target_line, ratio};
use lockline_bench::{ms, sequential, usage_exit, BenchArgs, BoxResult, Contenders, Contest, Latencies, Sampling};
use lockline_redis::Redis;
use lockline_testkit::RedisServer;

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

/// The server process's CPU time so far, in seconds (`used_cpu_user` plus
/// `used_cpu_sys` from `INFO cpu`).
async fn server_cpu(conn: &mut redis::aio::MultiplexedConnection) -> BoxResult<f64> {
    let info: String = redis::cmd("INFO").arg("cpu").query_async(conn).await?;
    let field = |name: &str| -> Option<f64> {
        info.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().parse().ok())
    };
    match (field("used_cpu_user:"), field("used_cpu_sys:")) {
        (Some(user), Some(sys)) => Ok(user + sys),
        _ => Err("no used_cpu_user or used_cpu_sys in INFO cpu".into()),
    }
}

/// `cmdstat_publish` calls from `INFO commandstats` (commands run by
/// scripts are counted too).
async fn publishes(conn: &mut redis::aio::MultiplexedConnection) -> BoxResult<f64> {
    let info: String = redis::cmd("INFO").arg("commandstats").query_async(conn).await?;
    Ok(info
        .lines()
        .find_map(|l| l.strip_prefix("cmdstat_publish:calls="))
        .and_then(|v| v.split(',').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0))
}

/// The server's commands (`total_commands_processed`, its scripts' own
/// included) and its CPU time in microseconds, per grant of each lock-mode
/// measurement.
struct RedisCounters {
    side: redis::aio::MultiplexedConnection,
    before: f64,
    cpu_before: f64,
}

impl lock_modes::ServerCounters for RedisCounters {
    fn names(&self) -> Vec<String> {
        vec!["server commands".to_owned(), "server CPU µs".to_owned()]
    }

    async fn before(&mut self) -> BoxResult<()> {
        self.before = commands_processed(&mut self.side).await?;
        self.cpu_before = server_cpu(&mut self.side).await?;
        Ok(())
    }

    async fn per_grant(&mut self, grants: u64) -> BoxResult<Vec<f64>> {
        let after = commands_processed(&mut self.side).await?;
        let cpu_after = server_cpu(&mut self.side).await?;
        let grants = grants.max(1) as f64;
        Ok(vec![
            (after - self.before) / grants,
            (cpu_after - self.cpu_before) * 1e6 / grants,
        ])
    }
}

/// One client's sequential `SET`s/s, and each one's latency.
async fn b_write(server: &RedisServer, seconds: f64) -> BoxResult<(f64, Latencies)> {
    let mut conn = connection(server).await?;
    Ok(sequential(seconds, async |n| {
        redis::cmd("SET")
            .arg("bench-b-write")
            .arg(n)
            .query_async::<()>(&mut conn)
            .await
    })
    .await?)
}

/// Acquire and handoff latencies of one run.
#[derive(Default)]
struct Latency {
    acquire: Latencies,
    handoff: Latencies,
}

struct Run {
    grants_per_sec: f64,
    handoffs_per_sec: f64,
    wakeups_per_release: f64,
    commands_per_grant: f64,
    releases_published: f64,
    latency: Latency,
}

async fn lockline_run(server: &RedisServer, n: usize, seconds: f64, name: &str) -> BoxResult<Run> {
    let contenders = Contenders::open(n, name, || Client::new(Redis::new(server.url()))).await?;
    let mut side = connection(server).await?;
    let before = commands_processed(&mut side).await?;
    let published_before = publishes(&mut side).await?;
    let mut contest = contenders.contest(Sampling::Window);
    contest.run_for(seconds).await;
    let after = commands_processed(&mut side).await?;
    let published_after = publishes(&mut side).await?;
    let outcome = contest.stop().await?;
    let counted = outcome.grants;
    let wakeups_per_release = contenders.wakeups_per_release();
    contenders.close().await?;
    Ok(Run {
        grants_per_sec: outcome.grants_per_sec(),
        handoffs_per_sec: outcome.handoffs_per_sec(),
        wakeups_per_release,
        commands_per_grant: (after - before) / counted.max(1) as f64,
        releases_published: (published_after - published_before) / counted.max(1) as f64,
        latency: Latency {
            acquire: outcome.acquire,
            handoff: outcome.handoff,
        },
    })
}

/// A baseline's figures.
struct Baseline {
    grants_per_sec: f64,
    handoffs_per_sec: f64,
    /// `p50 / p99` in ms, or `-`.
    acquire: String,
    handoff: String,
}

/// The seeds' single-key lock: `SET n token NX PX`, retried every 10 ms,
/// released by a Lua compare-and-delete.
/// Also returns the server commands per grant.
async fn spin_run(server: &RedisServer, n: usize, seconds: f64, name: &str) -> BoxResult<(Baseline, f64)> {
    let release = redis::Script::new(
        "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) else return 0 end",
    );
    let release = Arc::new(release);
    let mut side = connection(server).await?;
    let before = commands_processed(&mut side).await?;
    let mut contest = Contest::new(n, Sampling::Window);
    for i in 0..n {
        let mut conn = connection(server).await?;
        let (release, name) = (Arc::clone(&release), name.to_owned());
        let mut contender = contest.enter();
        contest.spawn(async move {
            let mut round = 0u64;
            while contender.running() {
                let token = format!("{i}-{round}");
                round += 1;
                let started = Instant::now();
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
                    if !contender.running() {
                        return Ok(());
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                contender.granted(started);
                contender.releasing();
                let _: i64 = release.key(&name).arg(&token).invoke_async(&mut conn).await?;
            }
            Ok::<_, redis::RedisError>(())
        });
    }
    contest.run_for(seconds).await;
    let after = commands_processed(&mut side).await?;
    let outcome = contest.stop().await?;
    Ok((
        Baseline {
            grants_per_sec: outcome.grants_per_sec(),
            handoffs_per_sec: outcome.handoffs_per_sec(),
            acquire: outcome.acquire.p50_p99(),
            handoff: outcome.handoff.p50_p99(),
        },
        (after - before) / outcome.grants.max(1) as f64,
    ))
}

fn redis_py_run(server: &RedisServer, n: usize, seconds: f64, name: &str) -> BoxResult<Baseline> {
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
    let value = |name: &str| {
        stdout
            .lines()
            .find_map(|l| l.strip_prefix(name).and_then(|v| v.trim().parse::<f64>().ok()))
    };
    let text = |name: &str| stdout.lines().find_map(|l| l.strip_prefix(name)).map(str::trim);
    match (
        value("grants_per_sec "),
        value("handoffs_per_sec "),
        text("acquire_ms "),
        text("handoff_ms "),
    ) {
        (Some(grants_per_sec), Some(handoffs_per_sec), Some(acquire), Some(handoff)) => Ok(Baseline {
            grants_per_sec,
            handoffs_per_sec,
            acquire: acquire.to_owned(),
            handoff: handoff.to_owned(),
        }),
        _ => Err(format!(
            "redis-py benchmark failed: {stdout}{}",
            String::from_utf8_lossy(&output.stderr)
        )
        .into()),
    }
}

/// The mutex's tables: lockline, redis-py and the spin lock for each N,
/// then the latencies.
async fn mutex_tables(server: &RedisServer, args: &BenchArgs) -> BoxResult<()> {
    let seconds = args.seconds;
    println!(
        "Redis handoff benchmark: redis-server on 127.0.0.1:{} (no persistence), {seconds} s per measurement",
        server.port()
    );
    let (b_write, b_write_latency) = b_write(server, seconds).await?;
    println!(
        "B_write (one client's sequential SET/s): {b_write:.0}; SET latency p50 / p99: {} ms",
        b_write_latency.p50_p99()
    );
    println!();
    println!(
        "| N | grants/s: lockline | redis-py | spin | handoffs/s: lockline | redis-py | spin | \
         lockline grants / B_write | lockline handoffs / redis-py | lockline handoffs / spin | \
         wakeups/release (client) | release messages/release (server) | server commands/grant: lockline | spin |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let mut latency_rows = Vec::new();
    for (round, &n) in args.contenders.iter().enumerate() {
        let ours = lockline_run(server, n, seconds, &format!("bench/lockline-{round}")).await?;
        let py = redis_py_run(server, n, seconds, &format!("bench/redis-py-{round}"))?;
        let (spin, spin_commands) = spin_run(server, n, seconds, &format!("bench/spin-{round}")).await?;
        println!(
            "| {n} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {:.2} | {} | {} | {:.2} | {:.2} | {:.1} | {:.1} |",
            ours.grants_per_sec,
            py.grants_per_sec,
            spin.grants_per_sec,
            ours.handoffs_per_sec,
            py.handoffs_per_sec,
            spin.handoffs_per_sec,
            ours.grants_per_sec / b_write,
            ratio(ours.handoffs_per_sec, py.handoffs_per_sec),
            ratio(ours.handoffs_per_sec, spin.handoffs_per_sec),
            ours.wakeups_per_release,
            ours.releases_published,
            ours.commands_per_grant,
            spin_commands,
        );
        latency_rows.push((n, ours.latency, py, spin));
    }
    println!();
    println!(
        "Latency, ms, p50 / p99 (acquire: each acquire, uncontended at N = 1; \
         handoff: release start → another contender granted):"
    );
    println!();
    println!(
        "| N | acquire: lockline | redis-py | spin | handoff: lockline | redis-py | spin | \
         lockline handoff p99 / B_write p50 |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|");
    let b_write_p50 = b_write_latency.quantile(0.5).map(ms).unwrap_or(f64::NAN);
    for (n, ours, py, spin) in &latency_rows {
        println!(
            "| {n} | {} | {} | {} | {} | {} | {} | {} |",
            ours.acquire.p50_p99(),
            py.acquire,
            spin.acquire,
            ours.handoff.p50_p99(),
            py.handoff,
            spin.handoff,
            p99_over(&ours.handoff, b_write_p50),
        );
    }
    if let Some(line) = p99_target_line(
        latency_rows.iter().map(|(n, ours, _, _)| (*n, &ours.handoff)),
        b_write_p50,
    ) {
        println!();
        println!("{line}");
    }
    Ok(())
}

#[tokio::main]
async fn main() -> BoxResult<()> {
    fn fail<T>(message: String) -> T {
        usage_exit(&message, "bench_redis", &BenchArgs::usage(ModesArgs::USAGE))
    }
    let (modes, _, rest) = ModesArgs::take(std::env::args().skip(1), &[], &[]).unwrap_or_else(fail);
    let args = BenchArgs::parse(rest).unwrap_or_else(fail);
    let server = RedisServer::start()?;
    if !modes.only {
        mutex_tables(&server, &args).await?;
    }
    let on = format!("redis-server on 127.0.0.1:{} (no persistence)", server.port());
    let mut counters = RedisCounters {
        side: connection(&server).await?,
        before: 0.0,
        cpu_before: 0.0,
    };
    lock_modes::run_with(
        &on,
        &modes,
        "bench/",
        || Client::new(Redis::new(server.url())),
        &mut counters,
    )
    .await?;
    Ok(())
}
