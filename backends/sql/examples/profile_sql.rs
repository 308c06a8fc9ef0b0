//! Where a lockline grant's time goes on PostgreSQL and MariaDB: a profile
//! for the performance work, against servers this program starts itself.
//!
//! ```text
//! cargo run --release -p lockline-sql --example profile_sql [-- --seconds 5 --contenders 16 --engine both --ex]
//! ```
//!
//! With `--ex`, lockline's contenders lock a `Resource` in EX (a lock mode)
//! instead of a `Mutex`; the named lock is the same. With `--nested`,
//! PostgreSQL's statement list also counts the statements lockline's
//! functions run, each on its own line (their time is inside their
//! caller's too).
//!
//! For each N, N contenders take and release one lock with zero hold time,
//! as in `bench_sql` (lockline: each its own client and session; the bare
//! named lock: each its own connection), and the run prints, per grant:
//!
//! - the CPU time of the server's processes and of this (client) process,
//!   and how many of the machine's cores each kept busy, with the target
//!   beside them (lockline's server CPU per grant ≤ 6 × the named lock's);
//! - on PostgreSQL, at the end, how many of the updates of lockline's tables
//!   were HOT (heartbeats change no indexed column);
//! - the server's statements with their calls per grant and the server's
//!   own time per call (PostgreSQL: `pg_stat_statements`, preloaded on this
//!   profiling server only; MariaDB: `performance_schema`'s statement
//!   digests, on for this server only, which cover the statements sent as
//!   text: MariaDB 10.11 neither digests the prepared statements the driver
//!   sends lockline's statements as, nor counts their executions in
//!   `prepared_statements_instances`, so only `BEGIN`/`COMMIT` show). A
//!   waiter's wait is one long
//!   statement (blocked on the server until the lock it waits on is free),
//!   so its time is queueing, not work.
//!
//! Then the handoff's latency next to the statements on its path: the
//! releaser's removal of its entry (which frees the guard), the woken
//! waiter's wait statement returning, and the successor's read of the
//! entries before its own (the grant follows that read).

mod support;

use std::time::Instant;

use lockline::Client;
use lockline_bench::{usage_exit, BoxError, BoxResult, Contenders, Contest, Outcome, OwnFlags, Sampling};
use lockline_sql::Sql;
use support::{cpu_seconds, Db, Engine, Server};

const USAGE: &str = "[--seconds 5] [--contenders 16] [--engine postgres|mariadb|both] [--ex] [--nested]";

/// Whether PostgreSQL's statement list counts the statements run inside
/// lockline's functions too (`pg_stat_statements.track = all`), each on its
/// own line, where it counts the calls the clients send alone.
static NESTED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();

fn nested() -> bool {
    NESTED.get().copied().unwrap_or(false)
}

fn parse_args() -> Result<(Vec<Engine>, Vec<usize>, f64, bool), String> {
    let (own, rest) = OwnFlags::take(
        std::env::args().skip(1),
        &["--ex", "--nested"],
        &["--engine", "--contenders", "--seconds"],
    )?;
    if let Some(other) = rest.first() {
        return Err(format!("unknown flag {other:?}"));
    }
    let engines = Engine::parse_list(own.value("--engine"))?;
    let contenders = own
        .value("--contenders")
        .unwrap_or("16")
        .split(',')
        .map(|n| n.parse().ok().filter(|n| (1..=1024).contains(n)))
        .collect::<Option<Vec<usize>>>()
        .ok_or("contender counts must be within 1..=1024")?;
    let seconds: f64 = own
        .value("--seconds")
        .unwrap_or("5")
        .parse()
        .map_err(|_| "bad --seconds")?;
    if !(0.1..=600.0).contains(&seconds) {
        return Err("--seconds must be within 0.1..=600".into());
    }
    let _ = NESTED.set(own.switch("--nested"));
    Ok((engines, contenders, seconds, own.switch("--ex")))
}

#[tokio::main]
async fn main() -> BoxResult<()> {
    let (engines, contenders, seconds, ex) =
        parse_args().unwrap_or_else(|message| usage_exit(&message, "profile_sql", USAGE));
    for (i, engine) in engines.into_iter().enumerate() {
        if i > 0 {
            println!();
        }
        let mut server = match engine {
            Engine::Postgres => {
                let mut settings = vec![("shared_preload_libraries", "pg_stat_statements".to_owned())];
                if nested() {
                    settings.push(("pg_stat_statements.track", "all".to_owned()));
                }
                Server::postgres(300, &settings)?
            }
            Engine::MariaDb => Server::mariadb_with(1, 300, &[("performance_schema", "ON".to_owned())])?,
        };
        let url = server.url();
        let mut side = Db::connect(engine, &url).await?;
        if engine == Engine::Postgres {
            side.execute("CREATE EXTENSION pg_stat_statements").await?;
        }
        println!(
            "{} profile: {} on 127.0.0.1:{}, {seconds} s per measurement, {} cores on this machine",
            engine.name(),
            server.describe(&mut side).await?,
            server.port(),
            std::thread::available_parallelism().map_or(0, usize::from),
        );
        for &n in &contenders {
            let lockline = match profile(
                &mut server,
                &mut side,
                n,
                seconds,
                if ex { Kind::Ex } else { Kind::Lockline },
            )
            .await
            {
                Ok(lockline) => lockline,
                Err(error) => {
                    println!();
                    println!("N = {n}: lockline FAILED: {error}");
                    side.wait_connections_at_most(0).await?;
                    continue;
                }
            };
            let named = profile(&mut server, &mut side, n, seconds, Kind::NamedLock).await?;
            println!();
            println!(
                "N = {n}: lockline {:.0} grants/s, bare named lock {:.0} grants/s ({:.2}); handoff p50 / p99: \
                 lockline {} ms, named lock {} ms",
                lockline.outcome.grants_per_sec(),
                named.outcome.grants_per_sec(),
                lockline.outcome.grants_per_sec() / named.outcome.grants_per_sec(),
                lockline.outcome.handoff.p50_p99(),
                named.outcome.handoff.p50_p99(),
            );
            for (label, profiled) in [("lockline", &lockline), ("named lock", &named)] {
                println!(
                    "  {label}: CPU per grant: server {:.3} ms, client {:.3} ms; cores busy: server {:.2}, client {:.2}, \
                     both {:.2}",
                    profiled.server_cpu_ms,
                    profiled.client_cpu_ms,
                    profiled.server_cores,
                    profiled.client_cores,
                    profiled.server_cores + profiled.client_cores,
                );
            }
            let times = lockline.server_cpu_ms / named.server_cpu_ms;
            println!(
                "  Target: server CPU per grant ≤ 6 × the named lock's: {times:.1} × ({})",
                lockline_bench::report::verdict(times <= 6.0)
            );
            println!();
            println!("| lockline's statements (server time) | calls/grant | server ms/call | server ms/grant |");
            println!("|---|---:|---:|---:|");
            for statement in &lockline.statements {
                println!(
                    "| `{}` | {:.2} | {:.3} | {:.3} |",
                    statement.text, statement.per_grant, statement.mean_ms, statement.ms_per_grant
                );
            }
        }
        if let support::Conn::Postgres(conn) = &mut side.conn {
            // Heartbeats and lock-mode writes change no indexed column, so
            // each can be a HOT update.
            let tables: Vec<(String, i64, i64)> = sqlx::query_as(
                "SELECT relname::text, n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables \
                 WHERE relname LIKE 'lockline\\_%' AND n_tup_upd > 0 ORDER BY relname",
            )
            .fetch_all(conn)
            .await?;
            let hot: Vec<String> = tables
                .iter()
                .map(|(table, updates, hot)| format!("{table} {hot} of {updates}"))
                .collect();
            println!();
            println!(
                "HOT updates over the whole run (pg_stat_user_tables): {}",
                hot.join(", ")
            );
        }
    }
    Ok(())
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Lockline,
    /// lockline's `Resource` locked in EX.
    Ex,
    NamedLock,
}

struct Statement {
    text: String,
    per_grant: f64,
    mean_ms: f64,
    ms_per_grant: f64,
}

struct Profiled {
    outcome: Outcome,
    server_cpu_ms: f64,
    client_cpu_ms: f64,
    server_cores: f64,
    client_cores: f64,
    statements: Vec<Statement>,
}

/// Statement texts shortened for the table: whitespace collapsed, the
/// tables' schema and quotes dropped, at most 90 characters.
fn short(text: &str) -> String {
    let text = text
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .replace("\"public\".", "")
        .replace("`bench`.", "")
        .replace(['"', '`'], "");
    match text.char_indices().nth(90) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text,
    }
}

async fn reset_statements(side: &mut Db) -> BoxResult<()> {
    match side.engine() {
        Engine::Postgres => side.execute("SELECT pg_stat_statements_reset()").await?,
        Engine::MariaDb => {
            side.execute("TRUNCATE TABLE performance_schema.events_statements_summary_by_digest")
                .await?
        }
    };
    Ok(())
}

/// The statements the server ran since the reset, the most time first:
/// text, calls, total milliseconds.
async fn statements(side: &mut Db) -> BoxResult<Vec<(String, f64, f64)>> {
    let rows: Vec<(String, f64, f64)> = match &mut side.conn {
        support::Conn::Postgres(conn) => sqlx::query_as::<_, (String, i64, f64)>(
            "SELECT query, calls, total_exec_time FROM pg_stat_statements \
             WHERE dbid = (SELECT oid FROM pg_database WHERE datname = 'postgres') \
             AND query NOT LIKE '%pg_stat_statements%' ORDER BY total_exec_time DESC LIMIT $1",
        )
        .bind(if nested() { 40_i64 } else { 12 })
        .fetch_all(conn)
        .await?
        .into_iter()
        .map(|(text, calls, ms)| (text, calls as f64, ms))
        .collect(),
        support::Conn::MariaDb(conn) => sqlx::query_as::<_, (Option<String>, u64, u64)>(
            "SELECT DIGEST_TEXT, COUNT_STAR, SUM_TIMER_WAIT FROM performance_schema.events_statements_summary_by_digest \
             WHERE SCHEMA_NAME = 'bench' AND DIGEST_TEXT NOT LIKE '%performance_schema%' \
             ORDER BY SUM_TIMER_WAIT DESC LIMIT 12",
        )
        .fetch_all(conn)
        .await?
        .into_iter()
        // Picoseconds.
        .map(|(text, calls, ps)| (text.unwrap_or_default(), calls as f64, ps as f64 / 1e9))
        .collect(),
    };
    Ok(rows)
}

async fn profile(server: &mut Server, side: &mut Db, n: usize, seconds: f64, kind: Kind) -> BoxResult<Profiled> {
    let engine = side.engine();
    let url = server.url();
    let name = format!("profile/{kind:?}-{n}");
    let contenders = match kind {
        Kind::Lockline | Kind::Ex => Some(Contenders::open(n, &name, || Client::new(Sql::new(url.clone()))).await?),
        Kind::NamedLock => None,
    };
    let mut contest = match &contenders {
        Some(contenders) if kind == Kind::Ex => {
            let resources = contenders
                .sessions()
                .map(|session| session.resource(&format!("{name}-ex")))
                .collect::<lockline::Result<Vec<_>>>()?;
            let mut each = resources.into_iter();
            Contest::start(n, Sampling::Window, move |mut contender| {
                let resource = each.next().expect("one resource per contender");
                async move {
                    while contender.running() {
                        let started = Instant::now();
                        let guard = resource.lock(lockline::LockMode::Ex).await?;
                        contender.granted(started);
                        contender.releasing();
                        guard.release().await?;
                    }
                    Ok::<_, lockline::Error>(())
                }
            })
        }
        Some(contenders) => contenders.contest(Sampling::Window),
        None => {
            let mut contest = Contest::new(n, Sampling::Window);
            for _ in 0..n {
                let mut db = Db::connect(engine, &url).await?;
                let mut contender = contest.enter();
                let name = name.clone();
                contest.spawn(async move {
                    while contender.running() {
                        let started = Instant::now();
                        match engine {
                            Engine::Postgres => {
                                db.execute_with("SELECT pg_advisory_lock($1)", &[], Some(7)).await?;
                            }
                            Engine::MariaDb => {
                                while db.optional_number_with("SELECT GET_LOCK(?, 86400)", &[&name]).await? != Some(1) {
                                }
                            }
                        }
                        contender.granted(started);
                        contender.releasing();
                        match engine {
                            Engine::Postgres => db.execute_with("SELECT pg_advisory_unlock($1)", &[], Some(7)).await?,
                            Engine::MariaDb => db.execute_with("DO RELEASE_LOCK(?)", &[&name], None).await?,
                        };
                    }
                    Ok::<(), BoxError>(())
                });
            }
            contest
        }
    };
    // Let every contender queue before the counting starts.
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let pids = server.pids();
    reset_statements(side).await?;
    let started = Instant::now();
    let (server_before, client_before) = (cpu_seconds(Some(&pids)), cpu_seconds(None));
    let grants_before = match &contenders {
        Some(contenders) => contenders.counts().grants,
        None => 0,
    };
    contest.run_for(seconds).await;
    let (server_after, client_after) = (cpu_seconds(Some(&pids)), cpu_seconds(None));
    let elapsed = started.elapsed().as_secs_f64();
    let rows = statements(side).await?;
    let outcome = contest.stop().await?;
    let grants = match &contenders {
        // Grants counted from the reset (the window's, a little earlier).
        Some(contenders) => contenders.counts().grants - grants_before,
        None => outcome.grants,
    };
    if let Some(contenders) = contenders {
        contenders.close().await?;
    }
    let per_grant = |x: f64| x / grants.max(1) as f64;
    let statements = rows
        .into_iter()
        .map(|(text, calls, ms)| Statement {
            text: short(&text),
            per_grant: per_grant(calls),
            mean_ms: ms / calls.max(1.0),
            ms_per_grant: per_grant(ms),
        })
        .collect();
    Ok(Profiled {
        server_cpu_ms: per_grant((server_after - server_before) * 1000.0),
        client_cpu_ms: per_grant((client_after - client_before) * 1000.0),
        server_cores: (server_after - server_before) / elapsed,
        client_cores: (client_after - client_before) / elapsed,
        statements,
        outcome,
    })
}
