//! Scale of one session holding many locks, and of many sessions in one
//! process, against PostgreSQL and MariaDB servers this program starts
//! itself.
//!
//! ```text
//! cargo run --release -p lockline-sql --example scale_sql [-- --locks 100000 --sessions 1000 --in-flight 64 --ttl 10 --ttls 2 --engine both]
//! ```
//!
//! **Many locks on one session** (`--locks N`, default 100,000; 0 skips it):
//! one session acquires N mutexes `scale/0 .. scale/N-1`, `--in-flight`
//! (default 64) acquires at once. Printed: the time and rate; the client's
//! resident memory (`VmRSS`) and live heap (a counting global allocator)
//! per held lock, measured just before the first acquire and just after the
//! last (everything the program keeps per lock: the guard, the core's
//! per-hold state, the backend's tracking of its entry; also allocator
//! growth that is not per lock). Then the server's view: client
//! connections, entry rows, the named locks held (`pg_locks`' advisory
//! locks; `METADATA_LOCK_INFO`'s user locks); whether every lock is still
//! held after two keepalive intervals, and how long `session.close()`
//! takes (it deletes the session's rows, then closes its connection, which
//! frees its named locks).
//!
//! Every held or queued entry holds one advisory lock of its session's
//! connection on PostgreSQL, and the server's shared lock table holds
//! `max_locks_per_transaction × (max_connections + max_prepared_transactions)`
//! locks in all (6,400 with the defaults 64, 100 and 0). The PostgreSQL
//! server is started with a `max_locks_per_transaction` that fits the run
//! (printed); MariaDB's `GET_LOCK` locks have no such table.
//!
//! **Many sessions** (`--sessions M`, default 1,000; 0 skips it): one client
//! opens M sessions (each its own connection, through a byte-counting
//! proxy), each holding one lock. After one keepalive interval to settle,
//! the server's statements (PostgreSQL: transactions in
//! `pg_stat_database`; MariaDB: `Questions`, this program's own left out)
//! and the bytes each way are counted over `--ttls` TTLs and printed per
//! session per TTL. The servers are started with room for 2 × M connections
//! (a session's guard connection and its control connection).
//!
//! With both engines, each runs in a process of its own (this program
//! again), so that the second one's memory figures do not start from the
//! heap the first one left.

mod support;

use std::time::Duration;

use lockline::Client;
use lockline_bench::scale::{self, CountingAlloc, CountingProxy, ScaleArgs, ScaleServer};
use lockline_bench::{BoxResult, OwnFlags};
use lockline_sql::Sql;
use support::{Counters, Db, Engine, Server};

#[global_allocator]
static HEAP: CountingAlloc = CountingAlloc::new();

/// PostgreSQL's default `max_locks_per_transaction`.
const DEFAULT_LOCKS_PER_TRANSACTION: usize = 64;

#[tokio::main]
async fn main() -> BoxResult<()> {
    let (own, rest) = OwnFlags::take(std::env::args().skip(1), &[], &["--engine"])?;
    let engines = Engine::parse_list(own.value("--engine"))?;
    let args = ScaleArgs::parse(rest.clone())?;
    if let [engine] = engines.as_slice() {
        return scale_engine(*engine, &args).await;
    }
    // One process per engine: the second engine's memory figures would
    // start from the heap the first one left.
    for (i, engine) in engines.into_iter().enumerate() {
        if i > 0 {
            println!();
        }
        let status = std::process::Command::new(std::env::current_exe()?)
            .args(["--engine", engine.flag()])
            .args(&rest)
            .status()?;
        if !status.success() {
            return Err(format!("the {} run failed: {status}", engine.name()).into());
        }
    }
    Ok(())
}

async fn scale_engine(engine: Engine, args: &ScaleArgs) -> BoxResult<()> {
    // A session's guard and control connections.
    let max_connections = (2 * args.sessions + 100).max(300);
    // Every held entry holds one advisory lock; room for the run's locks and
    // sessions, and as much again.
    let needed = (args.locks + args.sessions) * 2;
    let per_transaction = needed
        .div_ceil(max_connections)
        .next_power_of_two()
        .max(DEFAULT_LOCKS_PER_TRANSACTION);
    let server = match engine {
        Engine::Postgres => Server::postgres(
            max_connections as u32,
            &[("max_locks_per_transaction", per_transaction.to_string())],
        )?,
        Engine::MariaDb => Server::mariadb(1, max_connections as u32)?,
    };
    let mut monitor = Db::connect(engine, &server.monitor_url()).await?;
    let side = Db::connect(engine, &server.url()).await?;
    println!(
        "{} scale: {} on 127.0.0.1:{}",
        engine.name(),
        server.describe(&mut monitor).await?,
        server.port()
    );
    if engine == Engine::Postgres {
        let locks = monitor
            .number("SELECT current_setting('max_locks_per_transaction')::bigint")
            .await?;
        let connections = monitor
            .number("SELECT current_setting('max_connections')::bigint")
            .await?;
        let prepared = monitor
            .number("SELECT current_setting('max_prepared_transactions')::bigint")
            .await?;
        println!(
            "lock table: max_locks_per_transaction = {locks} (started so; the default is 64) × (max_connections {connections} \
             + max_prepared_transactions {prepared}) = {} locks server-wide; every held or queued lockline entry holds \
             one advisory lock of its session's connection (with the defaults, 64 × (100 + 0) = 6,400 in all)",
            locks * (connections + prepared)
        );
    }
    let mut target = SqlScale {
        server,
        monitor,
        side,
        connections_before: 0,
        keepalive_start: Counters::default(),
    };
    target.connections_before = target.monitor.connections().await?;
    let ran = scale::run(&mut target, args, &HEAP).await;
    if ran.is_err() {
        if let Some(deadlock) = target.monitor.latest_deadlock().await {
            println!("the server's latest detected deadlock:\n{deadlock}");
        }
    }
    ran
}

/// A server of either engine, with a monitor connection (on PostgreSQL in
/// another database, so that its statements stay out of the counts) and a
/// connection to lockline's database.
struct SqlScale {
    server: Server,
    monitor: Db,
    side: Db,
    /// Other client connections before the run (the side connection).
    connections_before: i64,
    keepalive_start: Counters,
}

impl SqlScale {
    fn engine(&self) -> Engine {
        self.server.engine()
    }

    /// Named locks held by lockline's connections: advisory locks
    /// (`pg_locks`), user locks (`METADATA_LOCK_INFO`).
    async fn named_locks(&mut self) -> BoxResult<i64> {
        let sql = match self.engine() {
            Engine::Postgres => "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted",
            Engine::MariaDb => {
                "SELECT COUNT(*) FROM information_schema.METADATA_LOCK_INFO WHERE LOCK_TYPE = 'User lock'"
            }
        };
        self.monitor.number(sql).await
    }

    async fn rows(&mut self, table: &str) -> BoxResult<i64> {
        self.side
            .number(&format!("SELECT count(*) FROM lockline_{table}"))
            .await
    }

    /// Client connections other than this program's monitor and side
    /// connections.
    async fn connections(&mut self) -> BoxResult<i64> {
        Ok(self.monitor.connections().await? - self.connections_before)
    }

    fn named_lock_name(&self) -> &'static str {
        match self.engine() {
            Engine::Postgres => "advisory locks (pg_locks)",
            Engine::MariaDb => "GET_LOCK locks (METADATA_LOCK_INFO)",
        }
    }
}

impl ScaleServer for SqlScale {
    fn client(&self) -> Client {
        Client::new(Sql::new(self.server.url()))
    }

    async fn locks_view(&mut self) -> BoxResult<String> {
        Ok(format!(
            "server: {} client connection(s), {} entry rows, {} {} held",
            self.connections().await?,
            self.rows("entries").await?,
            self.named_locks().await?,
            self.named_lock_name(),
        ))
    }

    async fn closed_line(&mut self, outcome: &str, took: Duration) -> BoxResult<String> {
        let rows = self.rows("entries").await?;
        // The named locks go with the session's connections, which close
        // right after (or, while its guards are still referenced, when they
        // are dropped: said so).
        let waited = std::time::Duration::from_secs(5);
        let open = self.monitor.connections_left(self.connections_before, waited).await? - self.connections_before;
        let connections = match open {
            0 => "once its connections were gone".to_owned(),
            open => format!("{open} of its connections still open {waited:?} later (its guards not yet dropped)"),
        };
        Ok(format!(
            "session.close() {outcome} in {took:.2?}; {rows} entry rows left; {connections}, {} {} held",
            self.named_locks().await?,
            self.named_lock_name(),
        ))
    }

    fn proxy_target(&self) -> String {
        format!("127.0.0.1:{}", self.server.port())
    }

    fn proxied_client(&self, proxy: &str) -> Client {
        Client::new(Sql::new(self.server.url_through(proxy)))
    }

    async fn sessions_view(&mut self, proxy: &CountingProxy) -> BoxResult<String> {
        Ok(format!(
            "server: {} client connections ({} through the proxy), {} session rows, {} entry rows, {} {} held",
            self.connections().await?,
            proxy.connections(),
            self.rows("sessions").await?,
            self.rows("entries").await?,
            self.named_locks().await?,
            self.named_lock_name(),
        ))
    }

    async fn keepalive_start(&mut self) -> BoxResult<()> {
        self.keepalive_start = self.monitor.counters().await?;
        Ok(())
    }

    async fn keepalive_end(&mut self, per_session_ttl: &dyn Fn(f64) -> f64) -> BoxResult<(String, Vec<String>)> {
        let after = self.monitor.counters().await?;
        // Per unit 1: the totals.
        let total = after.per(&self.keepalive_start, 1);
        let statements = support::statements_name(self.engine());
        let flushes = support::flush_name(self.engine());
        Ok((
            format!(
                "server ran {:.2} {statements}, {:.2} {flushes}, {:.0} log bytes",
                per_session_ttl(total.statements),
                per_session_ttl(total.flushes),
                per_session_ttl(total.log_bytes),
            ),
            Vec::new(),
        ))
    }
}
