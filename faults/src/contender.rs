//! The contender program: one process, one lockline session at a time, taking
//! one lock over and over through lockline's public API, writing to the fenced
//! register while it holds, and reporting what it sees.
//!
//! Each round it waits for the lock with `lock()` (or, one time in four,
//! `lock_timeout`, which may run out and cancel the acquire), holds it for
//! 200–800 ms while writing to the register every 50 ms with its token (longer
//! while the register's answers say `stay`), and
//! then releases it (or, one time in five, drops the guard, which releases in
//! the background). It stops writing when the guard's `lost()` resolves: at
//! once, or (half of the grants, a "careless" holder) after one more write.
//! Either way the time `lost()` resolved is reported as it happened.
//! A session that is over is given up and a new one opened.
//!
//! On PostgreSQL and MariaDB each write to the register is a row inserted into the
//! database's register table in a lockline-sql `FencedTransaction` (commits
//! only while the lock is held) over the contender's own connection; the
//! harness is told what the commit answered, stamped just before the commit.
//!
//! With `--modes on` it takes a lock-mode resource instead, in random modes
//! with conversions (see [`modes`]).
//!
//! SIGTERM stops it: it releases what it holds, cancels what it waits for,
//! waits for the session's background cleanup and reports `idle`; when its
//! standard input closes it closes the session, reports `closed` and exits.

use std::time::Duration;

use lockline::{Client, Error, MutexGuard, Session, SessionOptions, SessionState};
use lockline_etcd::Etcd;
use lockline_redis::Redis;
use lockline_sql::{FencedTransaction, Sql};
use lockline_zookeeper::ZooKeeper;
use sqlx::mysql::{MySqlConnectOptions, MySqlConnection};
use sqlx::postgres::{PgConnectOptions, PgConnection};
use sqlx::ConnectOptions;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, watch};

use crate::clock::now_ns;
use crate::rng::Rng;
use crate::Backend;

pub mod modes;

/// Beyond a call's own deadline, how long before the contender calls it a hang.
const HANG_SLACK: Duration = Duration::from_secs(5);

/// What the harness tells a contender on its command line.
#[derive(Debug, Clone)]
pub struct ContenderArgs {
    /// etcd, ZooKeeper, PostgreSQL or Redis.
    pub backend: Backend,
    /// etcd endpoints (comma-separated URLs), a ZooKeeper connect string, a
    /// PostgreSQL URL or a Redis URL.
    pub endpoints: String,
    /// The lock's name.
    pub name: String,
    /// The session TTL.
    pub ttl: Duration,
    /// The harness's history and register address.
    pub report: String,
    /// `c<slot>.<incarnation>`.
    pub tag: String,
    /// Seeds this process's choices.
    pub seed: u64,
    /// The sessions' lock-delay (zero: none).
    pub lock_delay: Duration,
    /// Take a lock-mode resource in random modes, with conversions, instead
    /// of a mutex (see [`modes`]).
    pub modes: bool,
}

impl ContenderArgs {
    /// The arguments after the `contender` subcommand.
    pub fn to_args(&self) -> Vec<String> {
        vec![
            "--backend".into(),
            self.backend.to_string(),
            "--endpoints".into(),
            self.endpoints.clone(),
            "--name".into(),
            self.name.clone(),
            "--ttl-ms".into(),
            self.ttl.as_millis().to_string(),
            "--report".into(),
            self.report.clone(),
            "--tag".into(),
            self.tag.clone(),
            "--seed".into(),
            self.seed.to_string(),
            "--lock-delay-ms".into(),
            self.lock_delay.as_millis().to_string(),
            "--modes".into(),
            if self.modes { "on" } else { "off" }.into(),
        ]
    }

    /// Parses what [`to_args`](Self::to_args) wrote.
    ///
    /// # Errors
    ///
    /// A message naming the missing or bad argument.
    pub fn parse(mut args: impl Iterator<Item = String>) -> Result<Self, String> {
        let (mut backend, mut endpoints, mut name, mut ttl, mut report, mut tag, mut seed) =
            (None, None, None, None, None, None, None);
        let mut lock_delay = Duration::ZERO;
        let mut modes = false;
        while let Some(flag) = args.next() {
            let value = args.next().ok_or_else(|| format!("{flag} needs a value"))?;
            match flag.as_str() {
                "--backend" => backend = Some(value.parse()?),
                "--endpoints" => endpoints = Some(value),
                "--name" => name = Some(value),
                "--ttl-ms" => ttl = Some(Duration::from_millis(value.parse().map_err(|_| "bad --ttl-ms")?)),
                "--report" => report = Some(value),
                "--tag" => tag = Some(value),
                "--seed" => seed = Some(value.parse().map_err(|_| "bad --seed")?),
                "--lock-delay-ms" => {
                    lock_delay = Duration::from_millis(value.parse().map_err(|_| "bad --lock-delay-ms")?)
                }
                "--modes" => {
                    modes = match value.as_str() {
                        "on" => true,
                        "off" => false,
                        _ => return Err("--modes is on or off".into()),
                    }
                }
                other => return Err(format!("unknown contender argument {other:?}")),
            }
        }
        Ok(ContenderArgs {
            backend: backend.ok_or("--backend is required")?,
            endpoints: endpoints.ok_or("--endpoints is required")?,
            name: name.ok_or("--name is required")?,
            ttl: ttl.ok_or("--ttl-ms is required")?,
            report: report.ok_or("--report is required")?,
            tag: tag.ok_or("--tag is required")?,
            seed: seed.ok_or("--seed is required")?,
            lock_delay,
            modes,
        })
    }
}

/// Sends events to the harness, in order, from any task.
#[derive(Clone)]
struct Reporter {
    tag: String,
    lines: mpsc::UnboundedSender<String>,
}

impl Reporter {
    fn at(&self, t: u64, event: &str) {
        let _ = self.lines.send(format!("E {} {t} {event}\n", self.tag));
    }

    fn now(&self, event: &str) {
        self.at(now_ns(), event);
    }
}

/// The contender's connection to the fenced register.
struct Register {
    tag: String,
    reader: BufReader<tokio::net::tcp::OwnedReadHalf>,
    writer: tokio::net::tcp::OwnedWriteHalf,
    line: String,
}

impl Register {
    async fn connect(address: &str, tag: &str) -> std::io::Result<Self> {
        let stream = TcpStream::connect(address).await?;
        stream.set_nodelay(true)?;
        let (reader, writer) = stream.into_split();
        Ok(Register {
            tag: tag.to_owned(),
            reader: BufReader::new(reader),
            writer,
            line: String::new(),
        })
    }

    /// Writes with `token`; whether the register asks the holder to stay.
    async fn write(&mut self, token: u64, seq: u64) -> std::io::Result<bool> {
        let request = format!("W {} {token} {seq}\n", self.tag);
        self.exchange(&request).await
    }

    /// Tells the harness what the backend's fence decided about a write
    /// asked to commit at `t`; whether the register asks the holder to stay.
    async fn fenced(&mut self, t: u64, token: u64, seq: u64, verdict: Verdict) -> std::io::Result<bool> {
        let request = format!("F {} {t} {token} {seq} {}\n", self.tag, verdict.word());
        self.exchange(&request).await
    }

    /// Checks in while holding without writing; whether the register asks
    /// the holder to stay.
    async fn check_in(&mut self) -> std::io::Result<bool> {
        let request = format!("S {}\n", self.tag);
        self.exchange(&request).await
    }

    async fn exchange(&mut self, request: &str) -> std::io::Result<bool> {
        self.writer.write_all(request.as_bytes()).await?;
        self.line.clear();
        if self.reader.read_line(&mut self.line).await? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        Ok(self.line.trim_end().ends_with(" stay"))
    }
}

/// What the backend's fence answered to one write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    /// The commit succeeded.
    Committed,
    /// The commit was refused: the lock was not held (`Error::LockLost`).
    Refused,
    /// The commit was asked for and got no answer (or an error): it may
    /// have landed. The harness reads the table.
    Unsure,
    /// It failed before the commit was asked for: nothing landed.
    Failed,
}

impl Verdict {
    fn word(self) -> &'static str {
        match self {
            Verdict::Committed => "ok",
            Verdict::Refused => "refused",
            Verdict::Unsure => "unsure",
            Verdict::Failed => "failed",
        }
    }
}

/// The fenced register on PostgreSQL and MariaDB: a row per write in the
/// register table, inserted in a `FencedTransaction` over this contender's
/// own connection to the database (through its proxy, so faults cut it too).
struct DbRegister {
    target: DbTarget,
    conn: Option<DbConn>,
    /// How long one step (connect, begin and insert, commit) may take before
    /// the contender calls it a hang: past a blackhole, a frozen server and a
    /// reaper waiting on the transaction's row lock.
    bound: Duration,
}

enum DbTarget {
    Postgres(PgConnectOptions),
    MariaDb(MySqlConnectOptions),
}

enum DbConn {
    Postgres(PgConnection),
    MariaDb(MySqlConnection),
}

/// One fenced write on `$conn`: begun with `$begin`, the row inserted with
/// `$insert`, committed; evaluates to (verdict, time just before the commit,
/// what went wrong).
macro_rules! fenced_write {
    ($begin:path, $conn:expr, $insert:expr, $guard:expr, $tag:expr, $token:expr, $seq:expr, $bound:expr) => {{
        let bound = $bound;
        let begun = tokio::time::timeout(bound, async {
            let mut tx = $begin($guard, &mut *$conn)
                .await
                .map_err(|e| format!("fenced write: begin: {e}"))?;
            sqlx::query($insert)
                .bind($tag)
                .bind(i64::try_from($token).unwrap_or(i64::MAX))
                .bind(i64::try_from($seq).unwrap_or(i64::MAX))
                .execute(&mut *tx)
                .await
                .map_err(|e| format!("fenced write: insert: {e}"))?;
            Ok::<_, String>(tx)
        })
        .await;
        match begun {
            Ok(Ok(tx)) => {
                let asked = now_ns();
                match tokio::time::timeout(bound, tx.commit()).await {
                    Ok(Ok(())) => (Verdict::Committed, asked, None),
                    Ok(Err(Error::LockLost { .. })) => (Verdict::Refused, asked, None),
                    Ok(Err(error)) => (Verdict::Unsure, asked, Some(format!("fenced write: commit: {error}"))),
                    Err(_) => (
                        Verdict::Unsure,
                        asked,
                        Some(format!("hang: fenced write: commit did not finish within {bound:?}")),
                    ),
                }
            }
            Ok(Err(error)) => (Verdict::Failed, now_ns(), Some(error)),
            Err(_) => (
                Verdict::Failed,
                now_ns(),
                Some(format!(
                    "hang: fenced write: begin and insert did not finish within {bound:?}"
                )),
            ),
        }
    }};
}

impl DbRegister {
    fn new(backend: Backend, url: &str, ttl: Duration, request_timeout: Duration) -> Result<Self, sqlx::Error> {
        let target = if backend == Backend::MariaDb {
            DbTarget::MariaDb(url.parse()?)
        } else {
            let options: PgConnectOptions = url.parse()?;
            DbTarget::Postgres(options.application_name("lockline-faults-register"))
        };
        Ok(DbRegister {
            target,
            conn: None,
            bound: ttl * 2 + request_timeout + HANG_SLACK,
        })
    }

    async fn connect(&self) -> Result<DbConn, sqlx::Error> {
        Ok(match &self.target {
            DbTarget::Postgres(options) => DbConn::Postgres(options.connect().await?),
            DbTarget::MariaDb(options) => DbConn::MariaDb(options.connect().await?),
        })
    }

    /// One write while holding `guard`: the verdict, the time just before
    /// the commit was asked for, and what went wrong, if anything (starting
    /// with `hang:` when a step outran its bound).
    async fn write(&mut self, guard: &MutexGuard, tag: &str, token: u64, seq: u64) -> (Verdict, u64, Option<String>) {
        let bound = self.bound;
        if self.conn.is_none() {
            match tokio::time::timeout(bound, self.connect()).await {
                Ok(Ok(conn)) => self.conn = Some(conn),
                Ok(Err(error)) => {
                    return (
                        Verdict::Failed,
                        now_ns(),
                        Some(format!("fenced write: connect: {error}")),
                    )
                }
                Err(_) => {
                    return (
                        Verdict::Failed,
                        now_ns(),
                        Some(format!(
                            "hang: fenced write: connecting to the database did not finish within {bound:?}"
                        )),
                    )
                }
            }
        }
        let outcome = match self.conn.as_mut() {
            None => (Verdict::Failed, now_ns(), Some("fenced write: no connection".into())),
            Some(DbConn::Postgres(conn)) => fenced_write!(
                FencedTransaction::begin_postgres,
                conn,
                crate::servers::PG_REGISTER_INSERT,
                guard,
                tag,
                token,
                seq,
                bound
            ),
            Some(DbConn::MariaDb(conn)) => fenced_write!(
                FencedTransaction::begin_mysql,
                conn,
                crate::servers::MY_REGISTER_INSERT,
                guard,
                tag,
                token,
                seq,
                bound
            ),
        };
        if !matches!(outcome.0, Verdict::Committed | Verdict::Refused) {
            // In an unknown state: a new connection next time.
            self.conn = None;
        }
        outcome
    }
}

/// Runs a contender until it is told to stop and its input closes.
///
/// # Errors
///
/// When the harness cannot be reached.
pub async fn run(args: ContenderArgs) -> std::io::Result<()> {
    // First of all, so that a SIGTERM from now on stops it cleanly.
    let (stop_tx, stop) = watch::channel(false);
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::spawn(async move {
        terminate.recv().await;
        let _ = stop_tx.send(true);
    });
    let events = TcpStream::connect(&args.report).await?;
    events.set_nodelay(true)?;
    let (tx, mut rx) = mpsc::unbounded_channel::<String>();
    let writer = tokio::spawn(async move {
        let mut events = events;
        while let Some(line) = rx.recv().await {
            if events.write_all(line.as_bytes()).await.is_err() {
                break;
            }
        }
        let _ = events.flush().await;
    });
    let reporter = Reporter {
        tag: args.tag.clone(),
        lines: tx,
    };
    let mut register = Register::connect(&args.report, &args.tag).await?;
    reporter.now("started");

    let client = match args.backend {
        Backend::Etcd => Client::new(Etcd::new(args.endpoints.split(',').map(str::to_owned))),
        Backend::ZooKeeper => Client::new(ZooKeeper::new(args.endpoints.clone())),
        Backend::Postgres | Backend::MariaDb => Client::new(Sql::new(args.endpoints.clone())),
        Backend::Redis | Backend::RedisVolatile => Client::new(Redis::new(args.endpoints.clone())),
    };
    let options = SessionOptions::new()
        .with_ttl(args.ttl)
        .with_lock_delay(args.lock_delay);
    // Lock-mode holders write the lock's own store with `write_if_held`.
    let db = if args.backend.is_sql() && !args.modes {
        Some(
            DbRegister::new(args.backend, &args.endpoints, args.ttl, options.request_timeout())
                .map_err(|e| std::io::Error::other(format!("the register's database URL: {e}")))?,
        )
    } else {
        None
    };
    let mut rng = Rng::new(args.seed, 0);
    let mut worker = Worker {
        client,
        options,
        name: args.name.clone(),
        reporter: reporter.clone(),
        stop,
        session: None,
        db,
        backend: args.backend,
    };
    if args.modes {
        worker.contend_modes(&mut rng, &mut register).await;
    } else {
        worker.contend(&mut rng, &mut register).await;
    }

    // Stopped: nothing held, nothing queued; wait for the background cleanup.
    if let Some(session) = &worker.session {
        let flush = tokio::time::timeout(args.ttl * 4, session.flush()).await;
        if flush.is_err() {
            reporter.now("error background cleanup still running after 4 TTLs");
        }
    }
    reporter.now("idle");
    // Wait for the harness to close our input, then close the session.
    let mut input = tokio::io::stdin();
    let mut sink = [0u8; 64];
    while matches!(input.read(&mut sink).await, Ok(n) if n > 0) {}
    if let Some(session) = worker.session.take() {
        if let Err(error) = session.close().await {
            reporter.now(&format!("error close: {error}"));
        }
    }
    reporter.now("closed");
    drop(worker);
    drop(reporter);
    let _ = writer.await;
    Ok(())
}

struct Worker {
    client: Client,
    options: SessionOptions,
    name: String,
    reporter: Reporter,
    stop: watch::Receiver<bool>,
    session: Option<Session>,
    /// PostgreSQL, MariaDB: the register is a table written in fenced transactions.
    db: Option<DbRegister>,
    /// The backend (lock-mode holders name their register keys for it).
    backend: Backend,
}

impl Worker {
    fn stopping(&self) -> bool {
        *self.stop.borrow()
    }

    /// A live session: the current one, or a new one once it is over.
    async fn session(&mut self) -> Option<Session> {
        if let Some(session) = &self.session {
            if !matches!(session.state(), SessionState::Lost | SessionState::Closed) {
                return Some(session.clone());
            }
            self.reporter.now(&format!("session-over {}", session.id()));
            let over = session.clone();
            self.session = None;
            // Ends it on the server too if the library has not (best effort).
            tokio::spawn(async move {
                let _ = over.close().await;
            });
        }
        let mut backoff = Duration::from_millis(100);
        // The library promises `Unavailable` within the connect timeout.
        let bound = self.options.connect_timeout() + self.options.request_timeout() + HANG_SLACK;
        while !self.stopping() {
            let mut stop = self.stop.clone();
            let opened = tokio::select! {
                opened = tokio::time::timeout(bound, self.client.session_with(self.options.clone())) => opened,
                _ = stop.wait_for(|s| *s) => return None,
            };
            let Ok(opened) = opened else {
                self.reporter.now(&format!(
                    "error hang: opening a session did not return within {bound:?}"
                ));
                continue;
            };
            match opened {
                Ok(session) => {
                    self.reporter.now(&format!("session {}", session.id()));
                    self.session = Some(session.clone());
                    return Some(session);
                }
                Err(error) => {
                    self.reporter.now(&format!("error session: {error}"));
                    let mut stop = self.stop.clone();
                    tokio::select! {
                        _ = tokio::time::sleep(backoff) => {}
                        _ = stop.wait_for(|s| *s) => {}
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(1));
                }
            }
        }
        None
    }

    async fn contend(&mut self, rng: &mut Rng, register: &mut Register) {
        while !self.stopping() {
            let Some(session) = self.session().await else { return };
            let mutex = match session.mutex(&self.name) {
                Ok(mutex) => mutex,
                Err(error) => {
                    self.reporter.now(&format!("error mutex: {error}"));
                    continue;
                }
            };
            let timeout = rng.chance(0.25).then(|| rng.millis(300, 2000));
            self.reporter
                .now(if timeout.is_some() { "wait timeout" } else { "wait lock" });
            let mut stop = self.stop.clone();
            let acquired = tokio::select! {
                result = async {
                    match timeout {
                        // `lock_timeout` returns within its timeout (and one request).
                        Some(timeout) => {
                            let bound = timeout + self.options.request_timeout() + HANG_SLACK;
                            match tokio::time::timeout(bound, mutex.lock_timeout(timeout)).await {
                                Ok(result) => result,
                                Err(_) => {
                                    self.reporter.now(&format!(
                                        "error hang: lock_timeout({timeout:?}) did not return within {bound:?}"
                                    ));
                                    Err(Error::Timeout { name: self.name.clone(), waited: bound, held_by_this_session: false })
                                }
                            }
                        }
                        None => mutex.lock().await,
                    }
                } => result,
                // Cancelling the acquire: lockline removes its entry.
                _ = stop.wait_for(|s| *s) => return,
            };
            match acquired {
                Ok(guard) => {
                    let granted = now_ns();
                    self.reporter
                        .at(granted, &format!("grant {} {}", guard.token().get(), guard.key()));
                    self.hold(guard, rng, register).await;
                }
                Err(Error::Timeout { .. }) => self.reporter.now("timeout"),
                Err(error) => {
                    self.reporter.now(&format!("error lock: {error}"));
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
            tokio::time::sleep(rng.millis(0, 150)).await;
        }
    }

    async fn hold(&mut self, guard: MutexGuard, rng: &mut Rng, register: &mut Register) {
        let token = guard.token().get();
        let mut until = tokio::time::Instant::now() + rng.millis(200, 800);
        let drop_it = rng.chance(0.2);
        // A careless holder looks at `lost()` only after each write, as code
        // that checks and then writes does: after a pause it writes once with
        // its stale token, and only fencing stops that write.
        let careless = rng.chance(0.5);
        let mut lost_at = None;
        let mut db = self.db.take();
        {
            let lost = guard.lost();
            tokio::pin!(lost);
            let mut seq = 0u64;
            let reporter = self.reporter.clone();
            // Write first, then look at the clock: a holder frozen in its
            // pause between writes wakes up and writes before it looks.
            'holding: loop {
                // Write, noticing loss (with its time) while the write is in flight.
                let write = {
                    let (db, register, guard, reporter) = (&mut db, &mut *register, &guard, &reporter);
                    async move {
                        let Some(db) = db.as_mut() else {
                            return register.write(token, seq).await;
                        };
                        let (verdict, asked, error) = db.write(guard, &reporter.tag, token, seq).await;
                        if let Some(error) = error {
                            reporter.now(&format!("error {error}"));
                        }
                        register.fenced(asked, token, seq, verdict).await
                    }
                };
                tokio::pin!(write);
                let written = loop {
                    tokio::select! {
                        biased;
                        _ = &mut lost, if lost_at.is_none() => lost_at = Some(now_ns()),
                        written = &mut write => break written,
                    }
                };
                seq += 1;
                match written {
                    Ok(true) => until = until.max(tokio::time::Instant::now() + Duration::from_millis(200)),
                    Ok(false) => {}
                    Err(_) => self.reporter.now("error register connection"),
                }
                if lost_at.is_some() || self.stopping() || tokio::time::Instant::now() >= until {
                    break 'holding;
                }
                let mut stop = self.stop.clone();
                tokio::select! {
                    biased;
                    _ = &mut lost, if lost_at.is_none() => {
                        lost_at = Some(now_ns());
                        if !careless {
                            break 'holding;
                        }
                    }
                    _ = stop.wait_for(|s| *s) => break 'holding,
                    _ = tokio::time::sleep(Duration::from_millis(50)) => {}
                }
            }
        }
        self.db = db;
        if let Some(t) = lost_at {
            self.reporter.at(t, &format!("lost {token}"));
            // Fenced: it cannot remove a newer holder's entry.
            drop(guard);
            return;
        }
        if drop_it {
            self.reporter.now(&format!("release {token} drop"));
            drop(guard);
        } else {
            self.reporter.now(&format!("release {token} release"));
            let bound = self.options.request_timeout() * 2 + HANG_SLACK;
            let Ok(result) = tokio::time::timeout(bound, guard.release()).await else {
                self.reporter
                    .now(&format!("error hang: release() did not return within {bound:?}"));
                return;
            };
            let outcome = match &result {
                Ok(()) => "ok",
                Err(_) => "error",
            };
            self.reporter.now(&format!("released {token} {outcome}"));
            if let Err(error) = result {
                self.reporter.now(&format!("error release: {error}"));
            }
        }
    }
}
