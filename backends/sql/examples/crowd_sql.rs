//! A crowd on one lock, from several processes, against PostgreSQL and
//! MariaDB servers this program starts itself: 1,000 contenders from 4
//! processes within 100 server connections.
//!
//! ```text
//! cargo run --release -p lockline-sql --example crowd_sql [-- --seconds 5 --processes 4 --crowd 1000 --compare 16,64 --engine both --sessions-per-process 6 --wait-connections 1 --max-connections 100]
//! ```
//!
//! The program re-runs itself as child processes (`lockline_bench::Crowd`),
//! each running its share of the contenders, which take and release one
//! lock with zero hold time. A session holds connections of its own (its
//! guard connection and its control connection), so a session per contender
//! would need thousands: here each process opens `--sessions-per-process`
//! sessions (default 6), each with at most `--wait-connections` wait
//! connections (default 1), and spreads its contenders over them in turn.
//! Contenders of one session queue in the process first (a session has one
//! entry per lock), so the server's queue holds at most one entry per
//! session, and a process uses at most K × (2 + W) connections (72 for 4
//! processes). The servers are started with `--max-connections` (default
//! 100), so a run that needed more would fail.
//!
//! Measured once every session has queued: grants/s, wakeups per release
//! (the clients' `stats()`), handoff latency (a grant's time minus the
//! previous holder's release start, from the grants of every process sorted
//! by fencing token: FIFO means tokens granted in order, so a grant before
//! its predecessor's release would show as an overlapping hold), and the
//! most client connections the server had at once during each run
//! (`pg_stat_activity`, `information_schema.PROCESSLIST`, sampled every
//! 25 ms by a connection of this program's, not counted). PostgreSQL runs
//! with `fsync=on`, MariaDB with `innodb_flush_log_at_trx_commit=1`.

mod support;

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use lockline::Client;
use lockline_bench::report::verdict;
use lockline_bench::{
    run_plan_with, usage_exit, BoxResult, CrowdArgs, CrowdChild, CrowdResult, ExtraColumns, OwnFlags,
};
use lockline_sql::Sql;
use support::{Db, Engine, Server};

/// How often the monitor counts the server's connections.
const SAMPLE: Duration = Duration::from_millis(25);

const OWN_USAGE: &str =
    "[--engine postgres|mariadb|both] [--sessions-per-process 6] [--wait-connections 1] [--max-connections 100]";

struct Plan {
    engines: Vec<Engine>,
    sessions: usize,
    waits: usize,
    max_connections: u32,
}

fn parse_args() -> Result<(CrowdArgs, Plan), String> {
    let (own, rest) = OwnFlags::take(
        std::env::args().skip(1),
        &[],
        &[
            "--engine",
            "--sessions-per-process",
            "--wait-connections",
            "--max-connections",
        ],
    )?;
    let number = |flag: &str, default: usize, max: usize| -> Result<usize, String> {
        match own.value(flag) {
            None => Ok(default),
            Some(value) => value
                .parse()
                .ok()
                .filter(|n| (1..=max).contains(n))
                .ok_or_else(|| format!("bad {flag} {value:?}: a whole number within 1..={max}")),
        }
    };
    let plan = Plan {
        engines: Engine::parse_list(own.value("--engine"))?,
        sessions: number("--sessions-per-process", 6, 1000)?,
        waits: number("--wait-connections", 1, 64)?,
        max_connections: number("--max-connections", 100, 10_000)? as u32,
    };
    let (args, _) = CrowdArgs::parse(rest, &[], 0.0)?;
    Ok((args, plan))
}

fn main() -> BoxResult<()> {
    if let Some(child) = CrowdChild::from_env()? {
        let [url, sessions, waits] = child.args.as_slice() else {
            return Err("crowd child: expected a database URL, a session count and a wait-connection count".into());
        };
        let (url, sessions, waits): (String, usize, usize) = (url.clone(), sessions.parse()?, waits.parse()?);
        return child.contend_sharing(sessions, || {
            Client::new(Sql::new(url.clone()).with_wait_connections(waits))
        });
    }
    let (args, plan) = parse_args()
        .unwrap_or_else(|message| usage_exit(&message, "crowd_sql", &format!("{} {OWN_USAGE}", CrowdArgs::USAGE)));
    for (i, &engine) in plan.engines.iter().enumerate() {
        if i > 0 {
            println!();
        }
        crowd(engine, &args, &plan)?;
    }
    Ok(())
}

/// The most client connections the server had during each run, sampled by
/// a thread of its own.
struct Connections {
    max: Arc<AtomicI64>,
    stop: Arc<AtomicBool>,
    sampler: Option<std::thread::JoinHandle<BoxResult<()>>>,
    seen: Vec<i64>,
}

impl Connections {
    fn start(engine: Engine, url: String) -> BoxResult<Self> {
        let (max, stop) = (Arc::new(AtomicI64::new(0)), Arc::new(AtomicBool::new(false)));
        let (sampled, stopped) = (Arc::clone(&max), Arc::clone(&stop));
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        let sampler = std::thread::spawn(move || {
            runtime.block_on(async move {
                let mut monitor = Db::connect(engine, &url).await?;
                while !stopped.load(Ordering::SeqCst) {
                    sampled.fetch_max(monitor.connections().await?, Ordering::SeqCst);
                    tokio::time::sleep(SAMPLE).await;
                }
                Ok(())
            })
        });
        Ok(Connections {
            max,
            stop,
            sampler: Some(sampler),
            seen: Vec::new(),
        })
    }

    fn finish(&mut self) -> BoxResult<()> {
        self.stop.store(true, Ordering::SeqCst);
        match self.sampler.take().map(std::thread::JoinHandle::join) {
            Some(Ok(result)) => result,
            Some(Err(_)) => Err("the connection sampler panicked".into()),
            None => Ok(()),
        }
    }
}

impl ExtraColumns for Connections {
    fn headers(&self) -> Vec<String> {
        vec!["server connections (max)".to_owned()]
    }

    fn before_run(&mut self) {
        self.max.store(0, Ordering::SeqCst);
    }

    fn after_run(&mut self, _: &CrowdResult) -> Vec<String> {
        let max = self.max.swap(0, Ordering::SeqCst);
        self.seen.push(max);
        vec![max.to_string()]
    }
}

fn crowd(engine: Engine, args: &CrowdArgs, plan: &Plan) -> BoxResult<()> {
    let server = match engine {
        Engine::Postgres => Server::postgres(plan.max_connections, &[])?,
        Engine::MariaDb => Server::mariadb(1, plan.max_connections)?,
    };
    let describe = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(async {
            let mut db = Db::connect(engine, &server.monitor_url()).await?;
            server.describe(&mut db).await
        })?;
    // A session's guard and control connections, and its wait connections.
    let per_process = plan.sessions * (2 + plan.waits);
    println!(
        "{} crowd benchmark: {describe} on 127.0.0.1:{}, {} s per measurement",
        engine.name(),
        server.port(),
        args.seconds
    );
    println!(
        "each process: {} session(s) shared by its contenders in turn, each its guard and control connections \
         plus at most {} wait connection(s): at most {per_process} connections per process, {} for {} processes",
        plan.sessions,
        plan.waits,
        per_process * args.processes,
        args.processes,
    );
    let mut connections = Connections::start(engine, server.monitor_url())?;
    let child_args = [server.url(), plan.sessions.to_string(), plan.waits.to_string()];
    let results = run_plan_with(args, &child_args, &mut connections);
    connections.finish()?;
    let results = results?;
    let most = connections.seen.iter().copied().max().unwrap_or(0);
    println!(
        "most server connections in any run: {most} (target ≤ 100: {}; the server's max_connections is {})",
        verdict(most <= 100),
        plan.max_connections,
    );
    if let Some(crowd) = results.last() {
        let broken = crowd.overlaps + crowd.duplicate_tokens;
        println!(
            "N = {} from {} processes: FIFO (grants in token order, none before its predecessor's release): {} \
             ({broken} out of order); wakeups/release {:.2} (target ≤ 1.05: {}); {} connections at most",
            crowd.contenders,
            crowd.processes,
            verdict(broken == 0),
            crowd.wakeups_per_release(),
            verdict(crowd.wakeups_per_release() <= 1.05),
            connections.seen.last().copied().unwrap_or(0),
        );
    }
    Ok(())
}
