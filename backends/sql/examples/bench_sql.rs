//! Handoff benchmark against PostgreSQL and MariaDB servers this program
//! starts itself.
//!
//! ```text
//! cargo run --release -p lockline-sql --example bench_sql [-- --seconds 5 --contenders 1,2,4,16,64 --engine both --durability 1,16]
//! cargo run --release -p lockline-sql --example bench_sql -- --modes-only [--engine both --modes-contenders 1,4,16 --modes-seconds 2 --modes-seed 1]
//! ```
//!
//! PostgreSQL runs with `fsync=on` and `full_page_writes=on` (commits are
//! flushed as in production); MariaDB with its default
//! `innodb_flush_log_at_trx_commit=1`. `--engine postgres|mariadb|both`
//! picks the engines (default both, one after the other).
//!
//! For each N, N contenders take and release one lock with zero hold time
//! for the given number of seconds. Measured in the same run, against the
//! same server:
//!
//! - `lockline`: grants/s of lockline's mutex, each contender its own client
//!   and session (its own connection, and its wait connection);
//! - `named lock`: the engine's bare named lock, the upper bound
//!   (`pg_advisory_lock` / `pg_advisory_unlock`, `GET_LOCK` /
//!   `RELEASE_LOCK`), each contender its own connection;
//! - `polling`: the polling row lock as ShedLock-style code does it: insert a
//!   row with a unique name and an expiry (`INSERT ... ON CONFLICT (name) DO
//!   NOTHING`, `INSERT IGNORE`), on conflict retry every 10 ms, release =
//!   `DELETE`; each contender its own connection, the table an ordinary
//!   (logged, InnoDB) one. Expired rows are not taken over: no hold here
//!   comes near the 10 s expiry, and ShedLock's PostgreSQL takeover
//!   (`ON CONFLICT DO UPDATE ... WHERE expires_at <= now()`) locks the
//!   holder's row at every failed poll, which only slows the baseline down;
//! - `B_write`: one client's sequential single-row `UPDATE`s, each its own
//!   committed transaction.
//!
//! Grants/s counts every grant; handoffs/s only those to another contender
//! than the one before (lockline and the named locks are FIFO; the polling
//! lock is not, and with zero hold time its releasing contender mostly takes
//! it straight back).
//!
//! Wakeups per release are counted by lockline's clients (`stats()`). The
//! server's own counters per grant, over the whole run (from before the
//! sessions or connections open until they are closed): statements
//! (PostgreSQL: transactions in `pg_stat_database`, each statement its own;
//! MariaDB: `Questions`) and flushes of the write-ahead log
//! (`pg_stat_wal.wal_sync`; MariaDB 10.11 counts no redo log fsyncs alone,
//! so `Innodb_data_fsyncs`, every InnoDB fsync).
//!
//! Latency (p50 / p99, measured in-process): of each acquire (at N = 1
//! uncontended), of each handoff (the holder starting its release → another
//! contender granted; for the polling lock only grants to another
//! contender, timed from the release just before them, which flatters it),
//! and of B_write's `UPDATE`s.
//!
//! The targets, each printed beside this run's figure, met or missed:
//! lockline ≥ 0.6 × the bare named lock's grants/s at N = 1 and ≥ 0.35 × at
//! N ≥ 2 on PostgreSQL (MariaDB: ≥ 0.3 × and ≥ 0.2 ×); ≥ 5 × the polling
//! lock's handoffs/s at N = 16 and ≥ 10 × at N = 4; wakeups per release
//! ≤ 1.05; handoff p99 at N = 64 ≤ 2 × its p50. Server CPU per grant (≤ 6 ×
//! the named lock's) is `profile_sql`'s. What stands in the way of a missed
//! one is in docs/performance-notes.md.
//!
//! A lockline run that fails (a `lock()` or `release()` that returns an
//! error) or stalls (its contenders not all stopped a minute after the
//! window) is a finding: its row says so (with MariaDB's latest detected
//! deadlock, if any), and the program goes on with the next measurement.
//!
//! **Durability** (`--durability 1,16`, `none` to skip): what a flushed
//! commit per acquire would cost. On PostgreSQL, lockline's tables as
//! shipped (entries and sessions `UNLOGGED`: no WAL, no flush per acquire)
//! against the same tables created `LOGGED` from `Sql::ddl()` under the
//! table prefix `logged_`, on the same server; on MariaDB, this server
//! (`innodb_flush_log_at_trx_commit=1`) against a second one started with
//! `=2`. Each pair is measured back to back.
//!
//! **Lock modes** (last for each engine, on the same server; alone with
//! `--modes-only`; `lockline_bench::lock_modes`): for each N of
//! `--modes-contenders` (default 1, 4, 16), lockline's mutex and a
//! `Resource` in EX side by side (EX ÷ mutex), then a mixed workload of the
//! six modes with conversions (grants/s, wakeups per release),
//! `--modes-seconds` each (default 2), with the server's statements and
//! log flushes per grant, counted as for the tables above.

mod support;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use lockline::Client;
use lockline_bench::lock_modes::{self, ModesArgs};
use lockline_bench::report::{p99_over, verdict};
use lockline_bench::{
    ms, sequential, usage_exit, BenchArgs, BoxError, BoxResult, Contenders, Contest, Latencies, Outcome, Sampling,
};
use lockline_sql::Sql;
use support::{flush_name, statements_name, Db, Engine, PerUnit, Server};

/// How often the polling lock retries.
const POLL: std::time::Duration = std::time::Duration::from_millis(10);

/// How long after its window a lockline run may take to stop before it is
/// reported as stalled.
const STALL: std::time::Duration = std::time::Duration::from_secs(60);

/// The prefix of the `LOGGED` copy of lockline's tables.
const LOGGED_PREFIX: &str = "logged_";

const OWN_USAGE: &str = "[--engine postgres|mariadb|both] [--durability 1,16|none]";

/// One measurement's figures.
#[derive(Debug, Default)]
struct Figures {
    grants_per_sec: f64,
    handoffs_per_sec: f64,
    /// lockline's only.
    wakeups_per_release: f64,
    /// The server's counters per grant.
    server: PerUnit,
    /// Statements InnoDB ended as deadlocks (the polling lock's, retried).
    deadlocks: u64,
    acquire: Latencies,
    handoff: Latencies,
}

impl Figures {
    /// A run that failed: no figures.
    fn failed() -> Self {
        Figures {
            grants_per_sec: f64::NAN,
            handoffs_per_sec: f64::NAN,
            wakeups_per_release: f64::NAN,
            server: PerUnit {
                statements: f64::NAN,
                flushes: f64::NAN,
                log_bytes: f64::NAN,
            },
            ..Figures::default()
        }
    }

    fn from(outcome: Outcome, server: PerUnit) -> Self {
        Figures {
            grants_per_sec: outcome.grants_per_sec(),
            handoffs_per_sec: outcome.handoffs_per_sec(),
            wakeups_per_release: f64::NAN,
            server,
            deadlocks: 0,
            acquire: outcome.acquire,
            handoff: outcome.handoff,
        }
    }
}

fn parse_args() -> Result<(Vec<Engine>, Vec<usize>, ModesArgs, BenchArgs), String> {
    let (modes, own, rest) = ModesArgs::take(std::env::args().skip(1), &[], &["--engine", "--durability"])?;
    let engines = Engine::parse_list(own.value("--engine"))?;
    let durability = match own.value("--durability").unwrap_or("1,16") {
        "none" => Vec::new(),
        list => list
            .split(',')
            .map(|n| n.parse().ok().filter(|n| (1..=1024).contains(n)))
            .collect::<Option<Vec<usize>>>()
            .ok_or_else(|| format!("bad --durability {list:?}: contender counts within 1..=1024, or none"))?,
    };
    Ok((engines, durability, modes, BenchArgs::parse(rest)?))
}

#[tokio::main]
async fn main() -> BoxResult<()> {
    let (engines, durability, modes, args) = parse_args().unwrap_or_else(|message| {
        usage_exit(
            &message,
            "bench_sql",
            &BenchArgs::usage(&format!("{OWN_USAGE} {}", ModesArgs::USAGE)),
        )
    });
    for (i, engine) in engines.into_iter().enumerate() {
        if i > 0 {
            println!();
        }
        bench(engine, &args, &modes, &durability).await?;
    }
    Ok(())
}

/// Measures `run` (which opens and closes its own connections) between two
/// readings of the server's counters: the first before its connections
/// open, the second once they are gone (a PostgreSQL backend flushes its
/// statistics as it exits; the WAL writer reports within a second).
/// `run` returns its outcome and how many grants it made in all.
async fn bracketed<F>(monitor: &mut Db, run: F) -> BoxResult<(Outcome, PerUnit)>
where
    F: std::future::Future<Output = BoxResult<(Outcome, u64)>>,
{
    let open_before = monitor.connections().await?;
    let before = monitor.counters().await?;
    let (outcome, grants) = run.await?;
    monitor.wait_connections_at_most(open_before).await?;
    if monitor.engine() == Engine::Postgres {
        tokio::time::sleep(std::time::Duration::from_millis(1200)).await;
    }
    let after = monitor.counters().await?;
    Ok((outcome, after.per(&before, grants)))
}

/// lockline's run: N contenders, each its own client and session.
async fn lockline_run(monitor: &mut Db, sql: &Sql, n: usize, seconds: f64, name: &str) -> BoxResult<Figures> {
    let mut wakeups_per_release = f64::NAN;
    let (outcome, server) = bracketed(monitor, async {
        let contenders = Contenders::open(n, name, || Client::new(sql.clone())).await?;
        let mut contest = contenders.contest(Sampling::Window);
        contest.run_for(seconds).await;
        let outcome = contest.stop().await?;
        let grants = contenders.counts().grants;
        wakeups_per_release = contenders.wakeups_per_release();
        contenders.close().await?;
        Ok((outcome, grants))
    })
    .await?;
    Ok(Figures {
        wakeups_per_release,
        ..Figures::from(outcome, server)
    })
}

/// [`lockline_run`], or when it fails (a `lock()` that failed is a finding),
/// a line saying so, the failure noted in `failures`, and no figures (NaN).
async fn lockline_or_failed(
    monitor: &mut Db,
    sql: &Sql,
    n: usize,
    seconds: f64,
    name: &str,
    failures: &mut Vec<(usize, String)>,
) -> BoxResult<Figures> {
    let within = std::time::Duration::from_secs_f64(seconds) + STALL;
    let ran = match tokio::time::timeout(within, lockline_run(monitor, sql, n, seconds, name)).await {
        Ok(ran) => ran,
        Err(_) => Err(format!(
            "stalled: its {n} contenders had not all stopped {} s after the window ended",
            STALL.as_secs()
        )
        .into()),
    };
    match ran {
        Ok(figures) => Ok(figures),
        Err(error) => {
            println!("| {n} | lockline FAILED ({name}): {error} |");
            if let Some(deadlock) = monitor.latest_deadlock().await {
                println!("the server's latest detected deadlock:\n{deadlock}");
            }
            monitor.wait_connections_at_most(0).await?;
            failures.push((n, error.to_string()));
            Ok(Figures::failed())
        }
    }
}

/// The engine's bare named lock, each contender its own connection.
async fn named_lock_run(monitor: &mut Db, url: &str, n: usize, seconds: f64, round: usize) -> BoxResult<Figures> {
    let engine = monitor.engine();
    let (outcome, server) = bracketed(monitor, async {
        let mut contest = Contest::new(n, Sampling::Window);
        for _ in 0..n {
            let mut db = Db::connect(engine, url).await?;
            let mut contender = contest.enter();
            contest.spawn(async move {
                let (key, name) = (1_000 + round as i64, format!("bench/named-{round}"));
                while contender.running() {
                    let started = Instant::now();
                    match engine {
                        Engine::Postgres => {
                            db.execute_with("SELECT pg_advisory_lock($1)", &[], Some(key)).await?;
                        }
                        // 0: timed out (a day); NULL: an error.
                        Engine::MariaDb => {
                            while db.optional_number_with("SELECT GET_LOCK(?, 86400)", &[&name]).await? != Some(1) {}
                        }
                    }
                    contender.granted(started);
                    contender.releasing();
                    match engine {
                        Engine::Postgres => db.execute_with("SELECT pg_advisory_unlock($1)", &[], Some(key)).await?,
                        Engine::MariaDb => db.execute_with("DO RELEASE_LOCK(?)", &[&name], None).await?,
                    };
                }
                Ok::<(), BoxError>(())
            });
        }
        contest.run_for(seconds).await;
        let outcome = contest.stop().await?;
        let grants = outcome.all_grants;
        Ok((outcome, grants))
    })
    .await?;
    Ok(Figures::from(outcome, server))
}

/// The polling row lock (see the module docs), each contender its own
/// connection.
async fn polling_run(monitor: &mut Db, url: &str, n: usize, seconds: f64, round: usize) -> BoxResult<Figures> {
    let engine = monitor.engine();
    let deadlocks = Arc::new(AtomicU64::new(0));
    let (outcome, server) = bracketed(monitor, async {
        let mut contest = Contest::new(n, Sampling::Window);
        for who in 0..n {
            let mut db = Db::connect(engine, url).await?;
            let mut contender = contest.enter();
            let deadlocks = Arc::clone(&deadlocks);
            contest.spawn(async move {
                let name = format!("bench/polling-{round}");
                let mut turn = 0u64;
                while contender.running() {
                    let owner = format!("{who}-{turn}");
                    turn += 1;
                    let started = Instant::now();
                    loop {
                        let taken = match engine {
                            Engine::Postgres => {
                                db.execute_with(
                                    "INSERT INTO bench_polling (name, owner, expires_at) \
                                     VALUES ($1, $2, now() + interval '10 seconds') ON CONFLICT (name) DO NOTHING",
                                    &[&name, &owner],
                                    None,
                                )
                                .await?
                                    == 1
                            }
                            // InnoDB ends one of two inserts of the same
                            // key behind a delete as a deadlock: a poll that
                            // did not take the lock, as ShedLock counts it.
                            Engine::MariaDb => match db
                                .execute_with(
                                    "INSERT IGNORE INTO bench_polling (name, owner, expires_at) \
                                     VALUES (?, ?, NOW(6) + INTERVAL 10 SECOND)",
                                    &[&name, &owner],
                                    None,
                                )
                                .await
                            {
                                Ok(inserted) => inserted == 1,
                                Err(error) if support::is_deadlock(&error) => {
                                    deadlocks.fetch_add(1, Ordering::Relaxed);
                                    false
                                }
                                Err(error) => return Err(error),
                            },
                        };
                        if taken {
                            break;
                        }
                        if !contender.running() {
                            return Ok(());
                        }
                        tokio::time::sleep(POLL).await;
                    }
                    contender.granted(started);
                    contender.releasing();
                    let delete = match engine {
                        Engine::Postgres => "DELETE FROM bench_polling WHERE name = $1 AND owner = $2",
                        Engine::MariaDb => "DELETE FROM bench_polling WHERE name = ? AND owner = ?",
                    };
                    // A release that InnoDB ended as a deadlock is tried again.
                    loop {
                        match db.execute_with(delete, &[&name, &owner], None).await {
                            Ok(_) => break,
                            Err(error) if support::is_deadlock(&error) => {
                                deadlocks.fetch_add(1, Ordering::Relaxed);
                            }
                            Err(error) => return Err(error),
                        }
                    }
                }
                Ok::<(), BoxError>(())
            });
        }
        contest.run_for(seconds).await;
        let outcome = contest.stop().await?;
        let grants = outcome.all_grants;
        Ok((outcome, grants))
    })
    .await?;
    Ok(Figures {
        deadlocks: deadlocks.load(Ordering::SeqCst),
        ..Figures::from(outcome, server)
    })
}

/// One client's sequential single-row `UPDATE`s: per second, each one's
/// latency, and the server's counters per `UPDATE`.
async fn b_write(monitor: &mut Db, url: &str, seconds: f64) -> BoxResult<(f64, Latencies, PerUnit)> {
    let engine = monitor.engine();
    let mut rate = (0.0, Latencies::new());
    let (_, server) = bracketed(monitor, async {
        let mut db = Db::connect(engine, url).await?;
        let update = match engine {
            Engine::Postgres => "UPDATE bench_b_write SET n = $1 WHERE id = 1",
            Engine::MariaDb => "UPDATE bench_b_write SET n = ? WHERE id = 1",
        };
        rate = sequential(seconds, async |n| {
            db.execute_with(update, &[], Some(n as i64)).await.map(drop)
        })
        .await?;
        let updates = rate.1.len() as u64;
        drop(db);
        Ok((Outcome::default(), updates))
    })
    .await?;
    Ok((rate.0, rate.1, server))
}

/// The baselines' tables, ordinary (logged, InnoDB) ones.
async fn create_baseline_tables(monitor: &mut Db) -> BoxResult<()> {
    let script = match monitor.engine() {
        Engine::Postgres => {
            "CREATE TABLE bench_b_write (id integer PRIMARY KEY, n bigint NOT NULL); \
             INSERT INTO bench_b_write VALUES (1, 0); \
             CREATE TABLE bench_polling (name text PRIMARY KEY, owner text NOT NULL, expires_at timestamptz NOT NULL);"
        }
        Engine::MariaDb => {
            "CREATE TABLE bench_b_write (id INT PRIMARY KEY, n BIGINT NOT NULL) ENGINE=InnoDB; \
             INSERT INTO bench_b_write VALUES (1, 0); \
             CREATE TABLE bench_polling (name VARCHAR(191) PRIMARY KEY, owner VARCHAR(64) NOT NULL, \
             expires_at DATETIME(6) NOT NULL) ENGINE=InnoDB;"
        }
    };
    monitor.execute(script).await.map(drop)
}

fn ratio_cell(a: f64, b: f64) -> String {
    if b > 0.0 {
        format!("{:.2}", a / b)
    } else if a > 0.0 {
        "∞".to_owned()
    } else {
        "-".to_owned()
    }
}

/// The server's statements and log flushes per grant of each lock-mode
/// measurement, read as [`bracketed`] reads them.
struct SqlCounters<'a> {
    monitor: &'a mut Db,
    open_before: i64,
    before: Option<support::Counters>,
}

impl lock_modes::ServerCounters for SqlCounters<'_> {
    fn names(&self) -> Vec<String> {
        let engine = self.monitor.engine();
        vec![statements_name(engine).to_owned(), flush_name(engine).to_owned()]
    }

    async fn before(&mut self) -> BoxResult<()> {
        self.open_before = self.monitor.connections().await?;
        self.before = Some(self.monitor.counters().await?);
        Ok(())
    }

    async fn per_grant(&mut self, grants: u64) -> BoxResult<Vec<f64>> {
        let before = self.before.take().ok_or("counters not read before the measurement")?;
        self.monitor.wait_connections_at_most(self.open_before).await?;
        if self.monitor.engine() == Engine::Postgres {
            tokio::time::sleep(std::time::Duration::from_millis(1200)).await;
        }
        let per = self.monitor.counters().await?.per(&before, grants);
        Ok(vec![per.statements, per.flushes])
    }
}

/// One engine's server: the mutex's tables and the durability pairs
/// (unless `--modes-only`), then the lock modes.
async fn bench(engine: Engine, args: &BenchArgs, modes: &ModesArgs, durability: &[usize]) -> BoxResult<()> {
    let server = match engine {
        Engine::Postgres => Server::postgres(300, &[])?,
        Engine::MariaDb => Server::mariadb(1, 300)?,
    };
    let mut monitor = Db::connect(engine, &server.monitor_url()).await?;
    if !modes.only {
        mutex_tables(engine, &server, &mut monitor, args, durability).await?;
    }
    let on = format!(
        "{} {} on 127.0.0.1:{}",
        engine.name(),
        server.describe(&mut monitor).await?,
        server.port()
    );
    let sql = Sql::new(server.url());
    let mut counters = SqlCounters {
        monitor: &mut monitor,
        open_before: 0,
        before: None,
    };
    lock_modes::run_with(&on, modes, "bench/", || Client::new(sql.clone()), &mut counters).await?;
    Ok(())
}

/// The mutex's tables on `server`: lockline, the named lock and the polling
/// lock for each N, the latencies and the targets; then the durability
/// pairs.
async fn mutex_tables(
    engine: Engine,
    server: &Server,
    monitor: &mut Db,
    args: &BenchArgs,
    durability: &[usize],
) -> BoxResult<()> {
    let seconds = args.seconds;
    let url = server.url();
    println!(
        "{} handoff benchmark: {} on 127.0.0.1:{}, {seconds} s per measurement",
        engine.name(),
        server.describe(monitor).await?,
        server.port(),
    );
    let mut setup = Db::connect(engine, &url).await?;
    create_baseline_tables(&mut setup).await?;
    drop(setup);
    let (b_write, b_write_latency, b_write_server) = b_write(monitor, &url, seconds).await?;
    let (statements, flushes) = (statements_name(engine), flush_name(engine));
    println!(
        "B_write (one client's sequential single-row UPDATEs/s, each its own commit): {b_write:.0}; \
         UPDATE latency p50 / p99: {} ms; per UPDATE: {:.2} {statements}, {:.2} {flushes}",
        b_write_latency.p50_p99(),
        b_write_server.statements,
        b_write_server.flushes,
    );
    println!();
    println!(
        "| N | grants/s: lockline | named lock | polling | handoffs/s: lockline | named lock | polling | \
         lockline / named lock | lockline / polling: grants | handoffs | lockline / B_write | \
         wakeups/release (client) | {statements}/grant: lockline | named lock | polling | \
         {flushes}/grant: lockline | polling |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let sql = Sql::new(url.clone());
    let mut rows = Vec::new();
    let mut failures = Vec::new();
    for (round, &n) in args.contenders.iter().enumerate() {
        let ours = lockline_or_failed(
            monitor,
            &sql,
            n,
            seconds,
            &format!("bench/lockline-{round}"),
            &mut failures,
        )
        .await?;
        let named = named_lock_run(monitor, &url, n, seconds, round).await?;
        let polling = polling_run(monitor, &url, n, seconds, round).await?;
        println!(
            "| {n} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {:.2} | {} | {} | {:.2} | {:.2} | {:.1} | {:.1} | {:.1} | {:.2} | {:.2} |",
            ours.grants_per_sec,
            named.grants_per_sec,
            polling.grants_per_sec,
            ours.handoffs_per_sec,
            named.handoffs_per_sec,
            polling.handoffs_per_sec,
            ours.grants_per_sec / named.grants_per_sec,
            ratio_cell(ours.grants_per_sec, polling.grants_per_sec),
            ratio_cell(ours.handoffs_per_sec, polling.handoffs_per_sec),
            ours.grants_per_sec / b_write,
            ours.wakeups_per_release,
            ours.server.statements,
            named.server.statements,
            polling.server.statements,
            ours.server.flushes,
            polling.server.flushes,
        );
        rows.push((n, ours, named, polling));
    }
    println!();
    println!(
        "Latency, ms, p50 / p99 (acquire: each acquire, uncontended at N = 1; \
         handoff: release start → another contender granted):"
    );
    println!();
    println!(
        "| N | acquire: lockline | named lock | polling | handoff: lockline | named lock | polling | \
         lockline handoff p99 / B_write p50 |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|");
    let b_write_p50 = b_write_latency.quantile(0.5).map(ms).unwrap_or(f64::NAN);
    for (n, ours, named, polling) in &rows {
        println!(
            "| {n} | {} | {} | {} | {} | {} | {} | {} |",
            ours.acquire.p50_p99(),
            named.acquire.p50_p99(),
            polling.acquire.p50_p99(),
            ours.handoff.p50_p99(),
            named.handoff.p50_p99(),
            polling.handoff.p50_p99(),
            p99_over(&ours.handoff, b_write_p50),
        );
    }
    println!();
    print_targets(engine, &rows);
    let deadlocks: Vec<String> = rows
        .iter()
        .filter(|(.., polling)| polling.deadlocks > 0)
        .map(|(n, .., polling)| format!("N = {n}: {}", polling.deadlocks))
        .collect();
    if !deadlocks.is_empty() {
        println!(
            "- (the polling lock's statements that InnoDB ended as deadlocks, counted as failed polls or retried \
             releases: {})",
            deadlocks.join(", ")
        );
    }
    for (n, error) in &failures {
        println!("- lockline FAILED at N = {n}: {error}");
    }
    if !durability.is_empty() {
        println!();
        match engine {
            Engine::Postgres => durability_postgres(monitor, &url, durability, seconds).await?,
            Engine::MariaDb => durability_mariadb(monitor, &url, durability, seconds, b_write).await?,
        }
    }
    Ok(())
}

/// The speed targets, each beside this run's figure: met or missed (a
/// missed one is priced in docs/performance-notes.md).
fn print_targets(engine: Engine, rows: &[(usize, Figures, Figures, Figures)]) {
    // lockline ÷ the bare named lock's grants/s: at N = 1, at N ≥ 2.
    let (alone, contended) = match engine {
        Engine::Postgres => (0.6, 0.35),
        Engine::MariaDb => (0.3, 0.2),
    };
    println!("Targets (this run's figures):");
    let named: Vec<String> = rows
        .iter()
        .map(|(n, ours, named, _)| {
            let ratio = ours.grants_per_sec / named.grants_per_sec;
            let target = if *n == 1 { alone } else { contended };
            format!("N = {n}: {ratio:.2} (≥ {target}: {})", verdict(ratio >= target))
        })
        .collect();
    println!(
        "- lockline ≥ {alone} × the bare named lock's grants/s at N = 1, ≥ {contended} × at N ≥ 2: {}",
        named.join(", ")
    );
    for (at, times) in [(16, 5.0), (4, 10.0)] {
        match rows.iter().find(|(n, ..)| *n == at) {
            Some((_, ours, _, polling)) => {
                let handoffs = ours.handoffs_per_sec / polling.handoffs_per_sec;
                println!(
                    "- lockline ≥ {times} × the polling row lock's handoffs/s at N = {at}: {} × ({})",
                    ratio_cell(ours.handoffs_per_sec, polling.handoffs_per_sec),
                    verdict(handoffs >= times),
                );
            }
            None => println!("- lockline ≥ {times} × the polling row lock's handoffs/s at N = {at}: not measured"),
        }
    }
    let wakeups: Vec<String> = rows
        .iter()
        .filter(|(n, ..)| *n > 1)
        .map(|(n, ours, ..)| {
            format!(
                "N = {n}: {:.2} ({})",
                ours.wakeups_per_release,
                verdict(ours.wakeups_per_release <= 1.05)
            )
        })
        .collect();
    println!("- wakeups per release ≤ 1.05: {}", wakeups.join(", "));
    match rows.iter().find(|(n, ..)| *n == 64) {
        Some((_, ours, ..)) => match (ours.handoff.quantile(0.5), ours.handoff.quantile(0.99)) {
            (Some(p50), Some(p99)) => {
                let times = p99.as_secs_f64() / p50.as_secs_f64();
                println!(
                    "- lockline's handoff p99 ≤ 2 × its p50 at N = 64: {:.2} / {:.2} ms = {times:.2} × ({})",
                    ms(p99),
                    ms(p50),
                    verdict(times <= 2.0),
                );
            }
            _ => println!("- lockline's handoff p99 ≤ 2 × its p50 at N = 64: no handoff measured"),
        },
        None => println!("- lockline's handoff p99 ≤ 2 × its p50 at N = 64: N = 64 not measured"),
    }
    println!(
        "- server CPU per grant ≤ 6 × the named lock's: measured by profile_sql \
         (cargo run --release -p lockline-sql --example profile_sql), which prints it with its target"
    );
}

/// lockline on its UNLOGGED tables against the same tables created LOGGED.
async fn durability_postgres(monitor: &mut Db, url: &str, counts: &[usize], seconds: f64) -> BoxResult<()> {
    let logged = Sql::new(url).with_table_prefix(LOGGED_PREFIX);
    let ddl = logged.ddl()?.replace("CREATE UNLOGGED TABLE", "CREATE TABLE");
    let mut setup = Db::connect(Engine::Postgres, url).await?;
    setup.execute(&ddl).await?;
    let persistence = setup
        .text(&format!(
            "SELECT string_agg(relname || '=' || relpersistence::text, ', ' ORDER BY relname) FROM pg_class \
             WHERE relkind = 'r' AND relname IN ('lockline_entries', 'lockline_sessions', \
             '{LOGGED_PREFIX}entries', '{LOGGED_PREFIX}sessions')"
        ))
        .await?;
    drop(setup);
    println!(
        "Durability: lockline's tables as shipped (entries and sessions UNLOGGED) against the same tables \
         created LOGGED from Sql::ddl() without UNLOGGED (table prefix {LOGGED_PREFIX}), same server, \
         each pair back to back (relpersistence: {persistence}; u = unlogged, p = logged):"
    );
    println!();
    println!(
        "| N | grants/s: unlogged | logged | logged / unlogged | handoff p50 / p99 (ms): unlogged | logged | \
         WAL flushes/grant: unlogged | logged | WAL bytes/grant: unlogged | logged |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let unlogged = Sql::new(url);
    for (i, &n) in counts.iter().enumerate() {
        let mut failed = Vec::new();
        let ours = lockline_or_failed(
            monitor,
            &unlogged,
            n,
            seconds,
            &format!("bench/unlogged-{i}"),
            &mut failed,
        )
        .await?;
        let flushed =
            lockline_or_failed(monitor, &logged, n, seconds, &format!("bench/logged-{i}"), &mut failed).await?;
        println!(
            "| {n} | {:.0} | {:.0} | {:.2} | {} | {} | {:.2} | {:.2} | {:.0} | {:.0} |",
            ours.grants_per_sec,
            flushed.grants_per_sec,
            flushed.grants_per_sec / ours.grants_per_sec,
            ours.handoff.p50_p99(),
            flushed.handoff.p50_p99(),
            ours.server.flushes,
            flushed.server.flushes,
            ours.server.log_bytes,
            flushed.server.log_bytes,
        );
    }
    Ok(())
}

/// lockline on this server (`innodb_flush_log_at_trx_commit=1`) against a
/// second one with `=2`.
async fn durability_mariadb(
    monitor: &mut Db,
    url: &str,
    counts: &[usize],
    seconds: f64,
    b_write: f64,
) -> BoxResult<()> {
    let relaxed = Server::mariadb(2, 300)?;
    let relaxed_url = relaxed.url();
    let mut relaxed_monitor = Db::connect(Engine::MariaDb, &relaxed_url).await?;
    let mut setup = Db::connect(Engine::MariaDb, &relaxed_url).await?;
    create_baseline_tables(&mut setup).await?;
    drop(setup);
    println!(
        "Durability: this server (innodb_flush_log_at_trx_commit=1: the redo log flushed at each commit) against \
         a second one on 127.0.0.1:{}, {} (flushed once a second), each pair back to back:",
        relaxed.port(),
        relaxed.describe(&mut relaxed_monitor).await?,
    );
    let (relaxed_b_write, relaxed_latency, relaxed_server) =
        self::b_write(&mut relaxed_monitor, &relaxed_url, seconds).await?;
    println!(
        "B_write: {b_write:.0}/s with flush=1, {relaxed_b_write:.0}/s with flush=2 (p50 / p99 {} ms, {:.2} InnoDB fsyncs per UPDATE)",
        relaxed_latency.p50_p99(),
        relaxed_server.flushes,
    );
    println!();
    println!(
        "| N | grants/s: flush=1 | flush=2 | flush=1 / flush=2 | handoff p50 / p99 (ms): flush=1 | flush=2 | \
         InnoDB fsyncs/grant: flush=1 | flush=2 | redo bytes/grant: flush=1 | flush=2 |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let (strict, loose) = (Sql::new(url), Sql::new(relaxed_url.clone()));
    for (i, &n) in counts.iter().enumerate() {
        let mut failed = Vec::new();
        let ours = lockline_or_failed(monitor, &strict, n, seconds, &format!("bench/flush1-{i}"), &mut failed).await?;
        let other = lockline_or_failed(
            &mut relaxed_monitor,
            &loose,
            n,
            seconds,
            &format!("bench/flush2-{i}"),
            &mut failed,
        )
        .await?;
        println!(
            "| {n} | {:.0} | {:.0} | {:.2} | {} | {} | {:.2} | {:.2} | {:.0} | {:.0} |",
            ours.grants_per_sec,
            other.grants_per_sec,
            ours.grants_per_sec / other.grants_per_sec,
            ours.handoff.p50_p99(),
            other.handoff.p50_p99(),
            ours.server.flushes,
            other.server.flushes,
            ours.server.log_bytes,
            other.server.log_bytes,
        );
    }
    Ok(())
}
