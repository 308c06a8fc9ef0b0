//! lockline's randomized fault test (DESIGN §7), in the manner of Jepsen.
//!
//! A run starts a 3-member etcd cluster or ZooKeeper ensemble on loopback,
//! a fenced register and history server in this process, and N contender
//! *processes* (this crate's binary, `lockline-faults contender ...`), each
//! reaching the members through its own [`TcpProxy`](lockline_testkit::TcpProxy)s.
//! Contenders take one lock over and over with lockline's public API and write
//! to the register with their fencing token while they hold it (see
//! [`contender`]). A seeded [`nemesis`] pauses and kills holders, kills
//! waiters, kills and pauses members (the leader half the time), kills a
//! quorum for a moment, and silently blackholes a holder's connections. The [`checker`] then reads the history:
//! tokens never go back, overlapping critical sections only where fencing
//! caught the stale holder (or it was frozen and wrote nothing), `lost()` seen
//! by every running holder before the next grant, a grant within the
//! recovery bound after every fault, and no entry left at the end.
//!
//! The short run is an integration test (`tests/faults_randomized.rs`, part of
//! `cargo test --workspace`); the long one is the binary:
//!
//! ```text
//! cargo run --release -p lockline-faults -- --backend etcd --seconds 600 --seed 7
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
use crate::nemesis::Nemesis;
use crate::servers::Servers;

/// Which server a run tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// etcd (`lockline-etcd`).
    Etcd,
    /// ZooKeeper (`lockline-zookeeper`).
    ZooKeeper,
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Backend::Etcd => "etcd",
            Backend::ZooKeeper => "zookeeper",
        })
    }
}

impl std::str::FromStr for Backend {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "etcd" => Ok(Backend::Etcd),
            "zookeeper" | "zk" => Ok(Backend::ZooKeeper),
            other => Err(format!("unknown backend {other:?} (etcd or zookeeper)")),
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
}

impl Config {
    /// The short run of the test suite: 60 s of faults, 5 contenders, TTL 3 s,
    /// recovery within TTL + election time + 6 s.
    pub fn short(backend: Backend, program: PathBuf) -> Self {
        Config {
            backend,
            duration: Duration::from_secs(60),
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
        }
    }

    /// TTL + election time + slack.
    pub fn recovery_bound(&self) -> Duration {
        self.ttl + self.backend.election_time() + self.slack
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
    let say = |line: &str| {
        if config.verbose {
            eprintln!("[{}] {line}", config.backend);
        }
    };
    let (history, address) = History::start().map_err(|e| format!("register: {e}"))?;
    let logs = tempfile::Builder::new()
        .prefix("lockline-faults-")
        .tempdir()
        .map_err(|e| e.to_string())?;
    let mut servers = Servers::start(config.backend, 3).map_err(|e| format!("{} servers: {e}", config.backend))?;
    say(&format!("{} cluster of 3 up", config.backend));
    let members: Vec<String> = (0..servers.size()).map(|i| servers.address(i)).collect();
    let template = ContenderArgs {
        backend: config.backend,
        endpoints: String::new(),
        name: LOCK.into(),
        ttl: config.ttl,
        report: address.clone(),
        tag: String::new(),
        seed: config.seed,
    };
    let endpoints = |addresses: &[String]| servers_endpoints(config.backend, addresses);
    let mut fleet = Fleet::start(
        config.contenders,
        &config.program,
        &members,
        endpoints,
        template,
        logs.path(),
        history.clone(),
    )
    .map_err(|e| format!("contenders: {e}"))?;
    let bound = config.recovery_bound();
    if !history.wait_until(Duration::from_secs(60), |r| r.last_grant().is_some()) {
        let tails: Vec<String> = (0..config.contenders).map(|s| fleet.log_tail(s, 800)).collect();
        return Err(format!(
            "no contender was granted the lock within 60 s; logs:\n{}",
            tails.join("\n")
        ));
    }
    say(&format!(
        "{} contenders running; nemesis for {:?}",
        config.contenders, config.duration
    ));

    let run_start = now_ns();
    let mut nemesis = Nemesis::new(
        config,
        &mut servers,
        &mut fleet,
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

    // Stop every contender: it releases, cancels, and waits for its cleanup.
    let stop = now_ns();
    say("stopping the contenders");
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

    // Orphans of live sessions: the idle contenders' own sessions hold nothing.
    let sessions = live_sessions(&history);
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

    // Close every session and exit.
    for &slot in &running {
        fleet.close_input(slot);
    }
    history.wait_until(Duration::from_secs(15), |r| tags.iter().all(|t| r.closed.contains(t)));
    let closed: Vec<_> = history.lock().closed.clone();
    for &slot in &running {
        let tag = fleet.slots[slot].tag;
        if closed.contains(&tag) {
            fleet.wait(slot);
        } else if fleet.is_running(slot) {
            problems.push(format!("{tag} did not close its session within 15 s"));
            let _ = fleet.kill(slot);
        }
    }

    // Nothing may remain once killed contenders' sessions have expired.
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
    let owners = all_sessions(&history);
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
    history.stop(&address);

    let record = history.lock();
    let mut report = check(
        &record.events,
        &record.writes,
        &faults,
        Bounds {
            start: run_start,
            stop,
            recovery: ns(bound),
        },
    );
    report.orphans = orphans.len();
    if !orphans.is_empty() {
        add_violation(&mut report, "entries left behind:", &orphans);
    }
    if !record.garbled.is_empty() {
        add_violation(&mut report, "unreadable lines from contenders:", &record.garbled);
    }
    if !problems.is_empty() {
        add_violation(&mut report, "the run itself went wrong:", &problems);
    }
    let mut text = String::new();
    let mut lines: Vec<(u64, String)> = record
        .events
        .iter()
        .map(|e| (e.t, format!("{} {:?}", e.tag, e.what)))
        .chain(record.writes.iter().map(|w| {
            let verdict = if w.accepted { "accepted" } else { "REJECTED" };
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
    let _ = std::fs::write(logs.path().join("history.txt"), text);
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

fn servers_endpoints(backend: Backend, addresses: &[String]) -> String {
    match backend {
        Backend::Etcd => addresses
            .iter()
            .map(|a| format!("http://{a}"))
            .collect::<Vec<_>>()
            .join(","),
        Backend::ZooKeeper => addresses.join(","),
    }
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
