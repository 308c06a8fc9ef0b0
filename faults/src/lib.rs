//! lockline's randomized fault test (DESIGN §7), in the manner of Jepsen.
//!
//! A run starts a 3-member etcd cluster or ZooKeeper ensemble, or one
//! PostgreSQL or MariaDB server (with a standby or replica to fail over to),
//! or one Redis server (with an append-only file fsynced
//! on every write, or without persistence), on loopback, a fenced register and history server in
//! this process, and N contender *processes* (this crate's binary,
//! `lockline-faults contender ...`), each reaching the members through its own
//! [`TcpProxy`](lockline_testkit::TcpProxy)s. Contenders take one lock over and
//! over with lockline's public API and write to the register with their
//! fencing token while they hold it (see [`contender`]). A seeded [`nemesis`]
//! pauses and kills holders, kills waiters, kills and pauses members (the
//! leader half the time), kills a quorum for a moment, and silently
//! blackholes a holder's connections; on PostgreSQL it also resets a holder's
//! connections, kills the whole server and restarts it, crashes one backend
//! (the postmaster then restarts every session), freezes the whole server
//! and silences one of a holder's connections; on MariaDB it resets, kills,
//! freezes and silences likewise; on both it fails over to the standby;
//! on Redis it resets a holder's connections, kills the server and starts it
//! again on the same port with its data directory, and freezes it.
//! The [`checker`] then reads the history: tokens never go back, overlapping
//! critical sections only where fencing caught the stale holder (or it was
//! frozen and wrote nothing), `lost()` seen by every running holder before
//! the next grant, a grant within the recovery bound after every fault, and
//! no entry left at the end.
//!
//! On etcd, ZooKeeper and Redis the register is the test's own: it accepts a token
//! at least as high as the highest it accepted. On PostgreSQL and MariaDB each write is a
//! row inserted into a table of the database in lockline-sql's
//! `FencedTransaction`, over the contender's own connection (through its
//! proxy), which commits only while the lock is still held: the guarantee a
//! team that locks its own tables relies on, and the stronger fence (a stale
//! write is refused as soon as the lock is gone, not only once a newer holder
//! has written). A write whose commit got no answer is read back from the
//! table before the check.
//!
//! With [`Config::modes`] (`--modes`) the contenders take a lock-mode
//! resource instead, in random modes with conversions, PW and EX holders
//! writing a register in the lock's own store with `write_if_held`; the
//! checker judges holders by their modes (docs/faults.md, "Lock modes").
//!
//! The short run is an integration test (`tests/faults_randomized.rs`, part of
//! `cargo test --workspace`); the long one is the binary:
//!
//! ```text
//! cargo run --release -p lockline-faults -- --backend etcd --seconds 600 --seed 7
//! cargo run --release -p lockline-faults -- --backend postgres --seconds 600 --seed 7
//! cargo run --release -p lockline-faults -- --backend mariadb --seconds 600 --seed 7
//! cargo run --release -p lockline-faults -- --backend redis --seconds 600 --seed 7
//! cargo run --release -p lockline-faults -- --backend redis-volatile --seconds 600 --seed 7
//! ```

#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]
#![deny(rustdoc::broken_intra_doc_links)]

pub mod checker;
pub mod clock;
pub mod contender;
pub mod fleet;
pub mod history;
pub mod nemesis;
pub mod rng;
pub mod servers;

use std::collections::BTreeMap;
use std::fmt::{self, Write as _};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::checker::{add_violation, check, Bounds, Report};
use crate::clock::{now_ns, ns};
use crate::contender::ContenderArgs;
use crate::fleet::Fleet;
use crate::history::{History, What};
use crate::nemesis::{FaultKind, Nemesis};
use crate::servers::Servers;

/// Which server a run tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// etcd (`lockline-etcd`).
    Etcd,
    /// ZooKeeper (`lockline-zookeeper`).
    ZooKeeper,
    /// PostgreSQL (`lockline-sql`).
    Postgres,
    /// MariaDB (`lockline-sql`).
    MariaDb,
    /// One Redis server with an append-only file fsynced on every write
    /// (`appendonly yes`, `appendfsync always`: nothing acknowledged is lost
    /// in a restart), `lockline-redis`.
    Redis,
    /// One Redis server without persistence (no append-only file, no
    /// snapshots): a restart forgets every key. The checker then allows what
    /// docs/redis.md says Redis cannot promise after such a restart, and
    /// nothing more (see [`Backend::forgets`]).
    RedisVolatile,
}

impl Backend {
    /// Every backend the test runs on.
    pub const ALL: [Backend; 6] = [
        Backend::Etcd,
        Backend::ZooKeeper,
        Backend::Postgres,
        Backend::MariaDb,
        Backend::Redis,
        Backend::RedisVolatile,
    ];

    /// Whether it is one of the Redis modes.
    pub fn is_redis(self) -> bool {
        matches!(self, Backend::Redis | Backend::RedisVolatile)
    }

    /// Whether it is one of the SQL databases (PostgreSQL, MariaDB): a
    /// session lives on several connections, the connection holds the lock,
    /// and the register is a table written in fenced transactions.
    pub fn is_sql(self) -> bool {
        matches!(self, Backend::Postgres | Backend::MariaDb)
    }

    /// Whether it runs one server (PostgreSQL, MariaDB, Redis), not a
    /// cluster: the nemesis then kills, restarts and pauses that server.
    pub fn is_single_server(self) -> bool {
        self.is_sql() || self.is_redis()
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Backend::Etcd => "etcd",
            Backend::ZooKeeper => "zookeeper",
            Backend::Postgres => "postgres",
            Backend::MariaDb => "mariadb",
            Backend::Redis => "redis",
            Backend::RedisVolatile => "redis-volatile",
        })
    }
}

impl std::str::FromStr for Backend {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "etcd" => Ok(Backend::Etcd),
            "zookeeper" | "zk" => Ok(Backend::ZooKeeper),
            "postgres" | "postgresql" | "pg" => Ok(Backend::Postgres),
            "mariadb" | "mysql" => Ok(Backend::MariaDb),
            "redis" => Ok(Backend::Redis),
            "redis-volatile" => Ok(Backend::RedisVolatile),
            other => Err(format!(
                "unknown backend {other:?} (etcd, zookeeper, postgres, mariadb, redis or redis-volatile)"
            )),
        }
    }
}

impl Backend {
    /// How long the servers may take to elect a leader after losing one.
    pub fn election_time(self) -> Duration {
        match self {
            // --election-timeout 500 ms in the testkit.
            Backend::Etcd => Duration::from_secs(1),
            // tickTime 200 ms; followers resync after the election.
            Backend::ZooKeeper => Duration::from_secs(2),
            // No election: one server, whose outages are counted from their
            // end. A second for the sessions to connect again.
            Backend::Postgres | Backend::MariaDb | Backend::Redis | Backend::RedisVolatile => Duration::from_secs(1),
        }
    }

    /// How long a holder whose connections were reset (a cut, a crash of the
    /// server) may go on holding after the reset. Zero on etcd and ZooKeeper:
    /// a session outlives its connections, a reset frees nothing. On
    /// PostgreSQL the connection holds the lock: the server frees it the
    /// moment the connection resets and may grant it at once (as it must for
    /// a killed holder), while lockline-sql learns of it only from a later
    /// request (a renewal, within a keepalive interval when it can reach the
    /// server) and at the latest when its loss deadline passes (TTL − safety
    /// margin from the last confirmed renewal, which came before the reset):
    /// that deadline, plus a second for a loaded machine. Writes are not
    /// excused: the backend's fence must refuse every one made after the next
    /// grant.
    ///
    /// On Redis without persistence a restart frees every lock the moment
    /// the server is back, and a holder learns of it at its session's next
    /// renewal (docs/redis.md, "Loss": within a keepalive interval, sooner
    /// when renewals were failing, since a failed one is retried at once):
    /// a keepalive interval plus a second for a loaded machine, counted from
    /// the server's return (see [`Backend::forgets_at_end`]). With an
    /// append-only file a restart frees nothing: zero.
    pub fn reset_notice(self, ttl: Duration) -> Duration {
        let options = lockline::SessionOptions::new().with_ttl(ttl);
        match self {
            Backend::Etcd | Backend::ZooKeeper | Backend::Redis => Duration::ZERO,
            Backend::Postgres | Backend::MariaDb => options.loss_deadline() + Duration::from_secs(1),
            Backend::RedisVolatile => options.keepalive_interval() + Duration::from_secs(1),
        }
    }

    /// The faults after which the server may grant a lock whose holder
    /// still believes it holds, for at most [`reset_notice`](Self::reset_notice):
    /// on PostgreSQL and MariaDB a reset of a holder's connections (the
    /// connection holds the lock; docs/sql.md's one window, with the reset
    /// grace off as by default). Not a crash of the server, of a backend, or
    /// a failover: the restart grace (on by default) grants nothing until
    /// every holder from before could have heard `lost()`, and the checker
    /// holds the SQL backend to that. On Redis without persistence a restart
    /// of the server (it forgets every session and entry: docs/redis.md,
    /// "What Redis cannot promise"); none elsewhere.
    pub fn forgets(self) -> &'static [FaultKind] {
        match self {
            Backend::Postgres | Backend::MariaDb => &[FaultKind::CutHolder],
            Backend::RedisVolatile => &[FaultKind::KillServer],
            Backend::Etcd | Backend::ZooKeeper | Backend::Redis => &[],
        }
    }

    /// The faults after which the server has forgotten every session, so
    /// that every session open at the fault must be given up as lost: a
    /// restart of Redis without persistence (docs/redis.md: "lockline then
    /// declares every session lost"); on the SQL databases a crash of the
    /// server (and on PostgreSQL of one backend, which restarts them all)
    /// and a failover (docs/sql.md: the connections, which hold the guards,
    /// are gone). None elsewhere.
    pub fn forgets_sessions(self) -> &'static [FaultKind] {
        match self {
            Backend::RedisVolatile => &[FaultKind::KillServer],
            Backend::Postgres => &[FaultKind::KillServer, FaultKind::CrashBackend, FaultKind::Failover],
            Backend::MariaDb => &[FaultKind::KillServer, FaultKind::Failover],
            Backend::Etcd | Backend::ZooKeeper | Backend::Redis => &[],
        }
    }

    /// The faults after which the store has forgotten its data, the keys
    /// fenced writes put included: a restart of Redis without persistence.
    /// None elsewhere (the SQL databases keep `write_if_held`'s keys in a
    /// logged table).
    pub fn forgets_data(self) -> &'static [FaultKind] {
        match self {
            Backend::RedisVolatile => &[FaultKind::KillServer],
            _ => &[],
        }
    }

    /// Whether the server frees the locks when such a fault ends (a Redis
    /// server back without its data) rather than when it begins (a
    /// PostgreSQL connection reset).
    pub fn forgets_at_end(self) -> bool {
        self == Backend::RedisVolatile
    }

    /// The faults a session must ride out, without being lost, when they
    /// last no longer than [`Config::ride_out`]: on Redis a restart with the
    /// data (a session survives what its server survives), a
    /// pause of the server and a reset of a holder's connections; without
    /// persistence the pause and the reset (a restart forgets the session).
    /// None elsewhere.
    pub fn rides_out(self) -> &'static [FaultKind] {
        match self {
            Backend::Redis => &[FaultKind::KillServer, FaultKind::PauseServer, FaultKind::CutHolder],
            Backend::RedisVolatile => &[FaultKind::PauseServer, FaultKind::CutHolder],
            Backend::Etcd | Backend::ZooKeeper | Backend::Postgres | Backend::MariaDb => &[],
        }
    }
}

/// How a run is set up.
#[derive(Debug, Clone)]
pub struct Config {
    /// The backend.
    pub backend: Backend,
    /// How long the nemesis injects faults.
    pub duration: Duration,
    /// Seeds the schedule and the contenders' choices.
    pub seed: u64,
    /// How many contender processes.
    pub contenders: usize,
    /// The sessions' TTL.
    pub ttl: Duration,
    /// Added to TTL + election time for the recovery bound.
    pub slack: Duration,
    /// The program to run as `PROGRAM contender ...` (this crate's binary).
    pub program: PathBuf,
    /// Print the nemesis's actions as they happen.
    pub verbose: bool,
    /// The fault kinds the nemesis chooses from (every kind when empty).
    pub kinds: Vec<nemesis::FaultKind>,
    /// Keep the contenders' logs and the history (`history.txt`) even when
    /// nothing is wrong (they are always kept when something is).
    pub keep_logs: bool,
    /// The contenders' lock-delay (zero: none). With one, the checker also
    /// checks that no contender already waiting when a holder lost the lock
    /// involuntarily was granted it sooner than the delay after the fault.
    pub lock_delay: Duration,
    /// Lock-mode contenders: each takes a lock-mode resource in random
    /// modes, converting while it holds, PW and EX holders writing the
    /// register in the lock's own store with `write_if_held`
    /// ([`contender::modes`]); the checker then judges holders by their
    /// modes ([`checker`]).
    pub modes: bool,
}

impl Config {
    /// The short run of the test suite: 36 s of faults (six runs, each
    /// wanting the machine to itself, fit in about four minutes), 5
    /// contenders, TTL 3 s, recovery within TTL + election time + 6 s.
    pub fn short(backend: Backend, program: PathBuf) -> Self {
        Config {
            backend,
            duration: Duration::from_secs(36),
            seed: 1,
            contenders: 5,
            ttl: Duration::from_secs(3),
            // One request timeout (lockline's default 5 s: a request stuck on a
            // frozen member is given up only then) and 1 s for a loaded machine.
            slack: Duration::from_secs(6),
            program,
            verbose: true,
            kinds: Vec::new(),
            keep_logs: false,
            lock_delay: Duration::ZERO,
            modes: false,
        }
    }

    /// The lock-mode short run: 30 s of the backend's faults with lock-mode
    /// contenders (see [`Config::modes`]).
    pub fn short_modes(backend: Backend, program: PathBuf) -> Self {
        Config {
            duration: Duration::from_secs(30),
            modes: true,
            ..Config::short(backend, program)
        }
    }

    /// The lock-delay mode's short run: 40 s of the faults that take a
    /// holder's lock from it (pause, kill, blackhole, and on PostgreSQL a
    /// reset), with a lock-delay of 1.5 s.
    pub fn short_with_lock_delay(backend: Backend, program: PathBuf) -> Self {
        let kinds = [
            FaultKind::PauseHolder,
            FaultKind::KillHolder,
            FaultKind::BlackholeHolder,
            FaultKind::CutHolder,
        ];
        Config {
            duration: Duration::from_secs(40),
            // A reset frees a lock only where the connection holds it.
            kinds: kinds
                .into_iter()
                .filter(|&k| k != FaultKind::CutHolder || backend.is_sql())
                .collect(),
            lock_delay: Duration::from_millis(1500),
            ..Config::short(backend, program)
        }
    }

    /// The fault kinds the nemesis deals: those named, or the backend's
    /// defaults.
    pub fn kinds(&self) -> Vec<FaultKind> {
        if self.kinds.is_empty() {
            FaultKind::defaults(self.backend)
        } else {
            self.kinds.clone()
        }
    }

    /// TTL + election time + slack, and the lock-delay.
    pub fn recovery_bound(&self) -> Duration {
        self.ttl + self.backend.election_time() + self.slack + self.lock_delay
    }

    /// How long a holder whose connections were reset may go on holding
    /// once the server freed its lock (see [`Backend::reset_notice`]).
    pub fn reset_notice(&self) -> Duration {
        self.backend.reset_notice(self.ttl)
    }

    /// The longest outage (from the kill, the freeze or the cut to the
    /// server's serving again, or the connections' being let through) that
    /// no session may be lost to, on the kinds of
    /// [`Backend::rides_out`]: the loss deadline, less the keepalive
    /// interval (the last confirmed renewal may have been sent that long
    /// before the fault) and 0.4 s for the session to connect again and
    /// renew on a loaded machine. 1 s with a TTL of 3 s (deadline 2.4 s).
    pub fn ride_out(&self) -> Duration {
        let options = lockline::SessionOptions::new().with_ttl(self.ttl);
        options
            .loss_deadline()
            .saturating_sub(options.keepalive_interval())
            .saturating_sub(Duration::from_millis(400))
    }
}

/// The lock every contender takes.
pub const LOCK: &str = "jepsen/register";

/// Runs one randomized fault test and checks it.
///
/// # Errors
///
/// When the servers, the register or the contenders cannot be started (not
/// a finding about lockline).
pub fn run(config: &Config) -> Result<Report, String> {
    refuse_impossible(config)?;
    let (history, address) = History::start().map_err(|e| format!("register: {e}"))?;
    let logs = tempfile::Builder::new()
        .prefix("lockline-faults-")
        .tempdir()
        .map_err(|e| e.to_string())?;
    let (mut servers, mut fleet) = start(config, &history, &address, logs.path())?;
    let run_start = now_ns();
    let (faults, mut problems) = deal_faults(config, &mut servers, &mut fleet, &history, run_start);
    let stop = now_ns();
    let running = stop_contenders(config, &mut fleet, &history, &mut problems);
    let mut orphans = live_orphans(&servers, &history, &mut problems);
    close_contenders(&running, &mut fleet, &history, &mut problems);
    orphans.extend(entries_left(config, &servers, &history, &mut problems));
    history.stop(&address);
    let (read_back, disagreements) = read_back_writes(config, &servers, &history, &faults, &mut problems);

    let record = history.lock();
    let mut report = check(
        &record.events,
        &record.writes,
        &faults,
        Bounds {
            start: run_start,
            stop,
            recovery: ns(config.recovery_bound()),
            reset_notice: ns(config.reset_notice()),
            reset_kinds: config.backend.forgets(),
            reset_at_end: config.backend.forgets_at_end(),
            ride_out: ns(config.ride_out()),
            ride_out_kinds: config.backend.rides_out(),
            loss_deadline: ns(lockline::SessionOptions::new().with_ttl(config.ttl).loss_deadline()),
            forgets_sessions: config.backend.forgets_sessions(),
            lock_delay: ns(config.lock_delay),
        },
    );
    report.orphans = orphans.len();
    report.writes_read_back = read_back;
    if !orphans.is_empty() {
        add_violation(&mut report, "entries left behind:", &orphans);
    }
    if !disagreements.is_empty() {
        add_violation(
            &mut report,
            if config.modes {
                "the fenced register in the lock's store: answers it disagrees with, or a stale write committed after a newer one:"
            } else {
                "the database's fenced register: answers it disagrees with, or a stale write committed after a newer one:"
            },
            &disagreements,
        );
    }
    if !record.garbled.is_empty() {
        add_violation(&mut report, "unreadable lines from contenders:", &record.garbled);
    }
    if !problems.is_empty() {
        add_violation(&mut report, "the run itself went wrong:", &problems);
    }
    write_history(&record, &faults, run_start, &logs.path().join("history.txt"));
    drop(record);
    if !report.violations.is_empty() || config.keep_logs {
        let kept = logs.keep();
        let line = format!("contender logs and history kept in {}", kept.display());
        if report.violations.is_empty() {
            eprintln!("{line}");
        } else {
            report.violations.push(line);
        }
    }
    Ok(report)
}

/// Says what the run is doing, when verbose.
fn say(config: &Config, line: &str) {
    if config.verbose {
        eprintln!("[{}] {line}", config.backend);
    }
}

/// Refuses a configuration that cannot be run.
fn refuse_impossible(config: &Config) -> Result<(), String> {
    if let Some(kind) = config.kinds.iter().find(|k| !k.applies_to(config.backend)) {
        return Err(format!("the fault {kind} cannot be injected on {}", config.backend));
    }
    if config.modes && !config.lock_delay.is_zero() {
        return Err("the lock-delay check judges mutex grants only: no lock-delay with lock modes".into());
    }
    Ok(())
}

/// Starts the servers and the contenders, and waits for a first grant.
fn start(
    config: &Config,
    history: &History,
    address: &str,
    logs: &std::path::Path,
) -> Result<(Servers, Fleet), String> {
    let failover = config.kinds().contains(&FaultKind::Failover);
    let servers =
        Servers::start(config.backend, 3, failover).map_err(|e| format!("{} servers: {e}", config.backend))?;
    say(config, &format!("{} up", servers.describe()));
    let members: Vec<String> = (0..servers.size()).map(|i| servers.address(i)).collect();
    let template = ContenderArgs {
        backend: config.backend,
        endpoints: String::new(),
        name: LOCK.into(),
        ttl: config.ttl,
        report: address.to_owned(),
        tag: String::new(),
        seed: config.seed,
        lock_delay: config.lock_delay,
        modes: config.modes,
    };
    let endpoints = |addresses: &[String]| servers.endpoints(addresses);
    let fleet = Fleet::start(
        config.contenders,
        &config.program,
        &members,
        endpoints,
        template,
        logs,
        history.clone(),
    )
    .map_err(|e| format!("contenders: {e}"))?;
    if !history.wait_until(Duration::from_secs(60), |r| r.last_grant().is_some()) {
        let tails: Vec<String> = (0..config.contenders).map(|s| fleet.log_tail(s, 800)).collect();
        return Err(format!(
            "no contender was granted the lock within 60 s; logs:\n{}",
            tails.join("\n")
        ));
    }
    say(
        config,
        &format!(
            "{} contenders running; nemesis for {:?}",
            config.contenders, config.duration
        ),
    );

    Ok((servers, fleet))
}

/// Lets the nemesis deal faults for the configured time; returns the faults
/// dealt and what went wrong with the run itself.
fn deal_faults(
    config: &Config,
    servers: &mut Servers,
    fleet: &mut Fleet,
    history: &History,
    run_start: u64,
) -> (Vec<nemesis::Fault>, Vec<String>) {
    let mut nemesis = Nemesis::new(
        config,
        servers,
        fleet,
        history.clone(),
        config.verbose.then_some(run_start),
    );
    nemesis.run(config.duration);
    let faults = std::mem::take(&mut nemesis.faults);
    let mut problems = std::mem::take(&mut nemesis.problems);
    drop(nemesis);
    for (slot, why) in fleet.reap_crashed() {
        problems.push(format!("contender {slot} exited on its own: {why}"));
    }

    (faults, problems)
}

/// Stops every running contender: it releases, cancels, and waits for its
/// cleanup. Returns the contenders that were running.
fn stop_contenders(config: &Config, fleet: &mut Fleet, history: &History, problems: &mut Vec<String>) -> Vec<usize> {
    say(config, "stopping the contenders");
    let running: Vec<usize> = (0..config.contenders).filter(|&s| fleet.is_running(s)).collect();
    let tags: Vec<_> = running.iter().map(|&s| fleet.slots[s].tag).collect();
    // A contender just restarted may not be listening for SIGTERM yet.
    history.wait_until(Duration::from_secs(10), |r| tags.iter().all(|t| r.started.contains(t)));
    for &slot in &running {
        let _ = fleet.signal(slot, libc::SIGTERM);
    }
    let idle_deadline = config.ttl * 4 + Duration::from_secs(15);
    history.wait_until(idle_deadline, |r| tags.iter().all(|t| r.idle.contains(t)));
    let idle: Vec<_> = history.lock().idle.clone();
    for &slot in &running {
        let tag = fleet.slots[slot].tag;
        if !idle.contains(&tag) {
            problems.push(format!(
                "{tag} did not stop within {idle_deadline:?} of SIGTERM; log: {}",
                fleet.log_tail(slot, 1500)
            ));
            let _ = fleet.kill(slot);
        }
    }

    running
}

/// Orphans of live sessions: the idle contenders' own sessions hold nothing.
fn live_orphans(servers: &Servers, history: &History, problems: &mut Vec<String>) -> Vec<String> {
    let sessions = live_sessions(history);
    let mut orphans = Vec::new();
    match servers.entries(LOCK) {
        Ok(entries) => {
            for entry in entries {
                if let Some(tag) = sessions.get(&entry.owner) {
                    orphans.push(format!(
                        "{} owned by the live session {} of {tag}, which holds and waits for nothing",
                        entry.key, entry.owner
                    ));
                }
            }
        }
        Err(error) => problems.push(format!("listing entries: {error}")),
    }

    orphans
}

/// Closes every contender's session and lets it exit.
fn close_contenders(running: &[usize], fleet: &mut Fleet, history: &History, problems: &mut Vec<String>) {
    let tags: Vec<_> = running.iter().map(|&s| fleet.slots[s].tag).collect();
    for &slot in running {
        fleet.close_input(slot);
    }
    history.wait_until(Duration::from_secs(15), |r| tags.iter().all(|t| r.closed.contains(t)));
    let closed: Vec<_> = history.lock().closed.clone();
    for &slot in running {
        let tag = fleet.slots[slot].tag;
        if closed.contains(&tag) {
            fleet.wait(slot);
        } else if fleet.is_running(slot) {
            problems.push(format!("{tag} did not close its session within 15 s"));
            let _ = fleet.kill(slot);
        }
    }
}

/// Nothing may remain once killed contenders' sessions have expired: the
/// entries still there.
fn entries_left(config: &Config, servers: &Servers, history: &History, problems: &mut Vec<String>) -> Vec<String> {
    let mut orphans = Vec::new();
    let deadline = Instant::now() + config.ttl * 2 + Duration::from_secs(5);
    let left = loop {
        match servers.entries(LOCK) {
            Ok(entries) if entries.is_empty() => break Vec::new(),
            Ok(entries) if Instant::now() > deadline => break entries,
            Ok(_) => {}
            Err(error) if Instant::now() > deadline => {
                problems.push(format!("listing entries: {error}"));
                break Vec::new();
            }
            Err(_) => {}
        }
        // The servers expire sessions on their own clock: no event to await here.
        std::thread::sleep(Duration::from_millis(200));
    };
    let owners = all_sessions(history);
    for entry in &left {
        let owner = owners
            .get(&entry.owner)
            .map_or("no contender".to_owned(), |t| t.to_string());
        orphans.push(format!(
            "{} owned by session {} ({owner}) still there {:?} after every contender exited",
            entry.key,
            entry.owner,
            config.ttl * 2 + Duration::from_secs(5)
        ));
    }
    orphans
}

/// Writes whose commit got no answer: the backend's store says whether they
/// landed. Returns how many were read back and what disagrees.
fn read_back_writes(
    config: &Config,
    servers: &Servers,
    history: &History,
    faults: &[nemesis::Fault],
    problems: &mut Vec<String>,
) -> (usize, Vec<String>) {
    let mut read_back = 0;
    let mut disagreements = Vec::new();
    if config.modes {
        // The lock-mode register: a key of the lock's own store per write.
        let written: Vec<servers::StoredWrite> = history
            .lock()
            .writes
            .iter()
            .filter(|w| w.fence == history::Fence::Held)
            .map(|w| (w.tag, w.token, w.seq))
            .collect();
        match servers.stored_register(&written) {
            Ok(stored) => {
                let mut record = history.lock();
                read_back = record.writes.iter().filter(|w| w.unsure).count();
                // A restart that forgets the data (Redis without
                // persistence) forgets the register's keys written before.
                let forgotten_before = faults
                    .iter()
                    .filter(|f| config.backend.forgets_data().contains(&f.kind))
                    .filter_map(|f| f.end)
                    .max()
                    .unwrap_or(0);
                disagreements = reconcile(&mut record.writes, &stored.rows, "the store", forgotten_before);
                if stored.ordered {
                    disagreements.extend(committed_out_of_order(&stored.rows));
                }
                disagreements.extend(stored.divergent);
            }
            Err(error) => problems.push(error),
        }
    } else if let Some(committed) = servers.committed_writes() {
        match committed {
            Ok(rows) => {
                let mut record = history.lock();
                read_back = record.writes.iter().filter(|w| w.unsure).count();
                disagreements = reconcile(&mut record.writes, &rows, "the database", 0);
                disagreements.extend(committed_out_of_order(&rows));
            }
            Err(error) => problems.push(error),
        }
    }

    (read_back, disagreements)
}

/// Writes the history, in time order, where the logs are kept.
fn write_history(record: &history::Record, faults: &[nemesis::Fault], run_start: u64, path: &std::path::Path) {
    let mut text = String::new();
    let mut lines: Vec<(u64, String)> = record
        .events
        .iter()
        .map(|e| (e.t, format!("{} {:?}", e.tag, e.what)))
        .chain(record.writes.iter().map(|w| {
            let verdict = match (w.accepted, w.fence) {
                (true, history::Fence::Token) => "accepted",
                (false, history::Fence::Token) => "REJECTED",
                (true, history::Fence::Held) => "committed",
                (false, history::Fence::Held) => "REFUSED (lock not held)",
            };
            (
                w.t,
                format!("{} write token {} seq {} {verdict}", w.tag, w.token, w.seq),
            )
        }))
        .chain(faults.iter().flat_map(|f| {
            let mut both = vec![(f.start, format!("nemesis {} {} begins", f.kind, f.target))];
            if let Some(end) = f.end {
                both.push((end, format!("nemesis {} {} healed", f.kind, f.target)));
            }
            both
        }))
        .collect();
    lines.sort_by_key(|(t, _)| *t);
    for (t, line) in lines {
        let _ = writeln!(text, "{:10.3} {line}", clock::secs(t.saturating_sub(run_start)));
    }
    let _ = std::fs::write(path, text);
}

/// Settles the writes whose writer got no answer to its commit by what the
/// backend's store holds (`committed`: writer, token, seq; `place` names
/// it), and checks the answered ones against it. Returns what disagrees: a
/// write answered as committed that is not there, or one refused that is.
/// Writes made up to `forgotten_before` (ns) may be gone with a restart
/// that forgot the store's data (Redis without persistence): one answered
/// as committed and missing is no finding, and one unanswered stays
/// counted as landed.
fn reconcile(
    writes: &mut [history::Write],
    committed: &[servers::StoredWrite],
    place: &str,
    forgotten_before: u64,
) -> Vec<String> {
    let mut problems = Vec::new();
    let stored: std::collections::BTreeSet<_> = committed.iter().copied().collect();
    for write in writes.iter_mut().filter(|w| w.fence == history::Fence::Held) {
        let there = stored.contains(&(write.tag, write.token, write.seq));
        let forgotten = write.t <= forgotten_before;
        if write.unsure {
            if !forgotten || there {
                write.unsure = false;
                write.accepted = there;
            }
        } else if write.accepted && !there && !forgotten {
            problems.push(format!(
                "the write of {} with token {} (seq {}) was answered as committed but is not in {place}",
                write.tag, write.token, write.seq
            ));
        } else if !write.accepted && there {
            problems.push(format!(
                "the write of {} with token {} (seq {}) was refused (lock not held) but is in {place}",
                write.tag, write.token, write.seq
            ));
        }
    }
    problems
}

/// The register's rows in the server's order (PostgreSQL: of their
/// commits; MariaDB: of their inserts): a token below one committed before
/// it is a stale holder's write landing after a newer holder's, whatever
/// the writers' clocks said (the fence must have refused it); and one
/// inserted after a newer holder's committed write was made by a holder
/// that was stale by then, so its commit must have been refused. Returns
/// each such write.
fn committed_out_of_order(committed: &[servers::StoredWrite]) -> Vec<String> {
    let mut problems = Vec::new();
    let mut highest: Option<&servers::StoredWrite> = None;
    for write in committed {
        match highest {
            Some(before) if write.1 < before.1 => problems.push(format!(
                "the write of {} with token {} (seq {}) committed after the write of {} with token {} (seq {})",
                write.0, write.1, write.2, before.0, before.1, before.2
            )),
            _ => highest = Some(write),
        }
    }
    problems
}

/// Each contender's current session (opened and not given up), by id.
fn live_sessions(history: &History) -> BTreeMap<String, history::Tag> {
    let record = history.lock();
    let mut live = BTreeMap::new();
    let mut events: Vec<_> = record.events.iter().collect();
    events.sort_by_key(|e| e.t);
    for event in events {
        match &event.what {
            What::Session { id } => {
                live.insert(id.clone(), event.tag);
            }
            What::SessionOver { id } => {
                live.remove(id);
            }
            What::Killed | What::Exited => live.retain(|_, tag| *tag != event.tag),
            _ => {}
        }
    }
    live
}

/// Every session any contender opened, by id.
fn all_sessions(history: &History) -> BTreeMap<String, history::Tag> {
    history
        .lock()
        .events
        .iter()
        .filter_map(|e| match &e.what {
            What::Session { id } => Some((id.clone(), e.tag)),
            _ => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::{committed_out_of_order, reconcile};
    use crate::history::{Fence, Tag, Write};

    fn write(seq: u64, accepted: bool, unsure: bool, fence: Fence) -> Write {
        Write {
            t: seq,
            tag: Tag {
                slot: 0,
                incarnation: 0,
            },
            token: 7,
            seq,
            accepted,
            fence,
            unsure,
        }
    }

    #[test]
    fn unanswered_writes_are_settled_by_the_store_and_answered_ones_checked_against_it() {
        let tag = Tag {
            slot: 0,
            incarnation: 0,
        };
        let mut writes = vec![
            write(0, true, false, Fence::Held),  // committed, stored: fine
            write(1, true, true, Fence::Held),   // unsure, stored: landed
            write(2, true, true, Fence::Held),   // unsure, not stored: did not land
            write(3, true, false, Fence::Held),  // committed, not stored: lost
            write(4, false, false, Fence::Held), // refused, stored: landed anyway
            write(5, true, false, Fence::Token), // the test's register: not in the store
        ];
        let stored = [(tag, 7, 0), (tag, 7, 1), (tag, 7, 4)];
        let problems = reconcile(&mut writes, &stored, "the database", 0);
        let settled: Vec<(bool, bool)> = writes.iter().map(|w| (w.accepted, w.unsure)).collect();
        assert_eq!(
            settled,
            [
                (true, false),
                (true, false),
                (false, false),
                (true, false),
                (false, false),
                (true, false)
            ]
        );
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(problems[0].contains("seq 3") && problems[0].contains("not in the database"));
        assert!(problems[1].contains("seq 4") && problems[1].contains("refused"));
    }

    #[test]
    fn writes_a_restart_forgot_are_not_held_against_the_store() {
        let tag = Tag {
            slot: 0,
            incarnation: 0,
        };
        // Up to t = 2 the store's data was forgotten by a restart.
        let mut writes = vec![
            write(1, true, false, Fence::Held), // committed, forgotten: fine
            write(2, true, true, Fence::Held),  // unsure, forgotten: still counted as landed
            write(3, true, false, Fence::Held), // committed after the restart, missing: lost
            write(4, true, true, Fence::Held),  // unsure after the restart, there: landed
        ];
        let stored = [(tag, 7, 4)];
        let problems = reconcile(&mut writes, &stored, "the store", 2);
        let settled: Vec<(bool, bool)> = writes.iter().map(|w| (w.accepted, w.unsure)).collect();
        assert_eq!(settled, [(true, false), (true, true), (true, false), (true, false)]);
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].contains("seq 3") && problems[0].contains("not in the store"));
    }

    #[test]
    fn a_stale_write_committed_after_a_newer_one_is_caught() {
        let tag = |slot| Tag { slot, incarnation: 0 };
        let in_order = [(tag(0), 5, 1), (tag(0), 5, 2), (tag(1), 6, 1), (tag(2), 8, 1)];
        assert_eq!(committed_out_of_order(&in_order), Vec::<String>::new());
        let stale = [(tag(0), 5, 1), (tag(1), 6, 1), (tag(0), 5, 2), (tag(1), 6, 2)];
        let found = committed_out_of_order(&stale);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].contains("token 5 (seq 2) committed after"), "{found:?}");
    }
}
