//! The nemesis: one fault at a time, on a seeded schedule that deals every
//! kind once per round, in a shuffled order. Between faults it
//! waits a random 0.5–2 s, and after each fault it waits (on the history, not a
//! timer) for the next grant, so that recoveries are measured one by one.

use std::fmt;
use std::thread;
use std::time::{Duration, Instant};

use crate::clock::{now_ns, secs};
use crate::fleet::Fleet;
use crate::history::{History, Tag, What};
use crate::rng::Rng;
use crate::servers::Servers;
use crate::{Backend, Config};

/// The kinds of fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum FaultKind {
    /// SIGSTOP a holder for TTL + 1.5–3 s, then SIGCONT.
    PauseHolder,
    /// SIGKILL a holder; restart it 0.3–1.5 s later.
    KillHolder,
    /// SIGKILL a waiting contender; restart it 0.3–1.5 s later.
    KillWaiter,
    /// Silently cut a holder's connections (no byte either way, no reset) for
    /// TTL + 1–2.5 s, then heal.
    BlackholeHolder,
    /// Reset a holder's connections (its proxies cut them and refuse new ones)
    /// for 0.5–2 s, then let it connect again.
    CutHolder,
    /// Silently drop *one* of a holder's connections, picked at random among
    /// those open (no byte either way, no reset), while the others flow, for
    /// TTL + 1–2.5 s, then let it through again: what a NAT or a cloud load
    /// balancer does to an idle flow. PostgreSQL and MariaDB, whose session
    /// lives on several connections (the one holding its guards, its control
    /// connection, its wait connections).
    SilenceOneConnection,
    /// SIGKILL a member (the leader half the time); restart it 2–4 s later.
    KillMember,
    /// SIGSTOP a member (the leader half the time) for 2–5 s, then SIGCONT.
    PauseMember,
    /// SIGKILL the leader and one more member (no quorum) for 1.5–2.5 s, then
    /// restart both: a short outage of the whole cluster, which background
    /// cleanup must outlast.
    KillQuorum,
    /// PostgreSQL: SIGKILL every process of the server (a crash: every session
    /// is lost, unlogged tables are emptied); restart it 1.5–3 s later.
    /// MariaDB: SIGKILL the server; restart it 1.5–3 s later.
    /// Redis: SIGKILL the server and start it again on the same port with
    /// its data directory 0.2–3 s later: with an append-only file it comes
    /// back with every acknowledged write, and a session must ride out a
    /// restart shorter than its loss deadline; without persistence it comes
    /// back empty.
    KillServer,
    /// PostgreSQL: SIGSTOP the postmaster and every backend for 1–4 s, then
    /// SIGCONT: the database's clock runs on while no session renews.
    /// MariaDB: SIGSTOP the server for 1–4 s, then SIGCONT.
    /// Redis: SIGSTOP the server for 0.3–4 s, then SIGCONT; keys expire on
    /// its clock, which runs on.
    PauseServer,
    /// PostgreSQL: SIGKILL one client backend, as the OOM killer does: the
    /// postmaster ends every other session and reinitializes (crash recovery,
    /// unlogged tables emptied) without restarting itself.
    CrashBackend,
    /// PostgreSQL, MariaDB: crash the primary (every process), promote its
    /// standby (synchronous) or replica (semi-synchronous) and move the
    /// contenders' proxies to it, as a virtual IP moves; then make a new
    /// standby of the new primary for the next failover. A run that may deal
    /// it starts with a standby.
    Failover,
}

impl FaultKind {
    /// Every kind, in schedule order.
    pub const ALL: [FaultKind; 13] = [
        FaultKind::PauseHolder,
        FaultKind::KillHolder,
        FaultKind::KillWaiter,
        FaultKind::BlackholeHolder,
        FaultKind::CutHolder,
        FaultKind::SilenceOneConnection,
        FaultKind::KillMember,
        FaultKind::PauseMember,
        FaultKind::KillQuorum,
        FaultKind::KillServer,
        FaultKind::PauseServer,
        FaultKind::CrashBackend,
        FaultKind::Failover,
    ];

    /// Whether the servers are unavailable while it lasts (recovery then
    /// counts from its end).
    pub fn is_outage(self) -> bool {
        matches!(
            self,
            FaultKind::KillQuorum
                | FaultKind::KillServer
                | FaultKind::PauseServer
                | FaultKind::CrashBackend
                | FaultKind::Failover
        )
    }

    /// Whether the kind can be injected on `backend`: member faults need a
    /// cluster, server faults one server (PostgreSQL, MariaDB, Redis), a
    /// backend's crash PostgreSQL, one silent connection and a failover a SQL
    /// database.
    pub fn applies_to(self, backend: Backend) -> bool {
        match self {
            FaultKind::PauseHolder
            | FaultKind::KillHolder
            | FaultKind::KillWaiter
            | FaultKind::BlackholeHolder
            | FaultKind::CutHolder => true,
            FaultKind::KillMember | FaultKind::PauseMember | FaultKind::KillQuorum => !backend.is_single_server(),
            FaultKind::KillServer | FaultKind::PauseServer => backend.is_single_server(),
            FaultKind::CrashBackend => backend == Backend::Postgres,
            FaultKind::SilenceOneConnection | FaultKind::Failover => backend.is_sql(),
        }
    }

    /// The kinds a run on `backend` deals when none are named. A reset of a
    /// holder's connections is dealt on the SQL databases, where the
    /// connection holds the lock, and on Redis, where the session must
    /// connect again and renew before its loss deadline (a session rides out
    /// what the server rides out); etcd and ZooKeeper sessions outlive their
    /// connections, as a blackhole already shows.
    pub fn defaults(backend: Backend) -> Vec<FaultKind> {
        FaultKind::ALL
            .into_iter()
            .filter(|k| k.applies_to(backend) && (*k != FaultKind::CutHolder || backend.is_single_server()))
            .collect()
    }
}

impl std::str::FromStr for FaultKind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        FaultKind::ALL
            .into_iter()
            .find(|k| k.to_string() == s)
            .ok_or_else(|| format!("unknown fault kind {s:?}"))
    }
}

impl fmt::Display for FaultKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FaultKind::PauseHolder => "pause-holder",
            FaultKind::KillHolder => "kill-holder",
            FaultKind::KillWaiter => "kill-waiter",
            FaultKind::BlackholeHolder => "blackhole-holder",
            FaultKind::CutHolder => "cut-holder",
            FaultKind::SilenceOneConnection => "silence-one-connection",
            FaultKind::KillMember => "kill-member",
            FaultKind::PauseMember => "pause-member",
            FaultKind::KillQuorum => "kill-quorum",
            FaultKind::KillServer => "kill-server",
            FaultKind::PauseServer => "pause-server",
            FaultKind::CrashBackend => "crash-backend",
            FaultKind::Failover => "failover",
        })
    }
}

/// A fault the nemesis injected.
#[derive(Debug, Clone)]
pub struct Fault {
    /// Its kind.
    pub kind: FaultKind,
    /// What it hit: a contender tag or a member name (with `(leader)`).
    pub target: String,
    /// The holder it hit, for holder faults.
    pub holder: Option<Tag>,
    /// When it started (ns).
    pub start: u64,
    /// When it was healed (ns); `None` while it lasts.
    pub end: Option<u64>,
}

/// The nemesis of one run.
#[derive(Debug)]
pub struct Nemesis<'a> {
    rng: Rng,
    servers: &'a mut Servers,
    fleet: &'a mut Fleet,
    history: History,
    backend: Backend,
    ttl: Duration,
    recovery: Duration,
    /// The kinds it chooses from.
    kinds: Vec<FaultKind>,
    /// Every fault injected so far.
    pub faults: Vec<Fault>,
    /// Problems of the run itself (crashed contenders, members that did not come back).
    pub problems: Vec<String>,
    /// When set, actions are printed with times relative to this instant (ns).
    log: Option<u64>,
}

impl<'a> Nemesis<'a> {
    /// A nemesis for `config` (its own stream of the run's seed, its TTL,
    /// recovery bound and fault kinds).
    pub fn new(
        config: &Config,
        servers: &'a mut Servers,
        fleet: &'a mut Fleet,
        history: History,
        log: Option<u64>,
    ) -> Self {
        Nemesis {
            rng: Rng::new(config.seed, 0xFA17),
            servers,
            fleet,
            history,
            backend: config.backend,
            ttl: config.ttl,
            recovery: config.recovery_bound(),
            kinds: config.kinds(),
            faults: Vec::new(),
            problems: Vec::new(),
            log,
        }
    }

    /// Injects faults until `duration` has passed, then leaves everything healed.
    pub fn run(&mut self, duration: Duration) {
        let until = Instant::now() + duration;
        let mut deck: Vec<FaultKind> = Vec::new();
        while Instant::now() < until {
            thread::sleep(self.rng.millis(500, 2000));
            self.reap();
            // Kinds are dealt from a shuffled deck: every kind once per round.
            if deck.is_empty() {
                deck = self.kinds.clone();
                for i in (1..deck.len()).rev() {
                    deck.swap(i, self.rng.below(i + 1));
                }
            }
            let Some(kind) = deck.pop() else { return };
            let Some(started) = self.inject(kind) else { continue };
            // Await the next grant (bounded), so that faults do not pile up.
            let granted = self
                .history
                .wait_until(self.recovery * 2, |r| r.last_grant().is_some_and(|t| t > started));
            if !granted {
                self.say(&format!("no grant within {:?} of the fault", self.recovery * 2));
            }
        }
    }

    fn say(&self, line: &str) {
        if let Some(start) = self.log {
            eprintln!("[{:7.3}s] nemesis: {line}", secs(now_ns().saturating_sub(start)));
        }
    }

    fn reap(&mut self) {
        for (slot, why) in self.fleet.reap_crashed() {
            self.problems.push(format!("contender {slot} exited on its own: {why}"));
            if let Err(error) = self.fleet.respawn(slot) {
                self.problems
                    .push(format!("contender {slot} could not be restarted: {error}"));
            }
        }
    }

    /// A holder's slot, waiting up to 2 s for one to exist. The holder is
    /// asked (through the register's answers) to keep holding until the fault
    /// ends, and has heard so: it will still be holding when the fault bites.
    fn pick_holder(&mut self) -> Option<(usize, Tag)> {
        for _ in 0..3 {
            let live: Vec<Tag> = self.fleet.slots.iter().map(|s| s.tag).collect();
            self.history
                .wait_until(Duration::from_secs(2), |r| r.holders.keys().any(|t| live.contains(t)));
            let tag = {
                let mut record = self.history.lock();
                let holders: Vec<Tag> = record.holders.keys().copied().filter(|t| live.contains(t)).collect();
                if holders.is_empty() {
                    return None;
                }
                let tag = holders[self.rng.below(holders.len())];
                record.stay.push(tag);
                tag
            };
            let asked = now_ns();
            // A write, or a check-in of a holder that does not write (a
            // lock-mode holder in NL, CR, CW or PR), answered since.
            let heard = self.history.wait_until(Duration::from_secs(1), |r| {
                r.writes.iter().rev().take_while(|w| w.t > asked).any(|w| w.tag == tag)
                    || r.checked_in.get(&tag).is_some_and(|&t| t > asked)
            });
            if heard && self.history.lock().holders.contains_key(&tag) {
                return Some((tag.slot, tag));
            }
            self.history.lock().stay.clear();
        }
        None
    }

    fn pick_member(&mut self) -> (usize, String) {
        let want_leader = self.rng.chance(0.5);
        let other = self.rng.below(self.servers.size());
        let leader = self.servers.leader();
        match leader {
            Some(leader) if want_leader => (leader, format!("n{} (leader)", leader + 1)),
            Some(leader) => {
                let i = if other == leader {
                    (other + 1) % self.servers.size()
                } else {
                    other
                };
                (i, format!("n{}", i + 1))
            }
            None => (other, format!("n{}", other + 1)),
        }
    }

    fn begin(&mut self, kind: FaultKind, target: String, holder: Option<Tag>) -> u64 {
        let start = now_ns();
        self.say(&format!("{kind} {target}"));
        self.faults.push(Fault {
            kind,
            target,
            holder,
            start,
            end: None,
        });
        start
    }

    fn end(&mut self) {
        if let Some(fault) = self.faults.last_mut() {
            fault.end = Some(now_ns());
        }
        self.history.lock().stay.clear();
    }

    /// Injects one fault and heals it; returns its start, or `None` when it had no target.
    fn inject(&mut self, kind: FaultKind) -> Option<u64> {
        let ttl = self.ttl;
        match kind {
            FaultKind::PauseHolder => {
                let (slot, tag) = self.pick_holder()?;
                let hold = ttl + self.rng.millis(1500, 3000);
                let start = self.begin(kind, tag.to_string(), Some(tag));
                if self.fleet.signal(slot, libc::SIGSTOP).is_ok() {
                    self.history.note(tag, What::Paused);
                    thread::sleep(hold);
                    let _ = self.fleet.signal(slot, libc::SIGCONT);
                    self.history.note(tag, What::Resumed);
                }
                self.end();
                Some(start)
            }
            FaultKind::KillHolder | FaultKind::KillWaiter => {
                let (slot, tag) = if kind == FaultKind::KillHolder {
                    self.pick_holder()?
                } else {
                    let holders: Vec<Tag> = self.history.lock().holders.keys().copied().collect();
                    let waiters: Vec<Tag> = self
                        .fleet
                        .slots
                        .iter()
                        .map(|s| s.tag)
                        .filter(|t| !holders.contains(t) && self.fleet.is_running(t.slot))
                        .collect();
                    if waiters.is_empty() {
                        return None;
                    }
                    let tag = waiters[self.rng.below(waiters.len())];
                    (tag.slot, tag)
                };
                let down = self.rng.millis(300, 1500);
                let start = self.begin(kind, tag.to_string(), (kind == FaultKind::KillHolder).then_some(tag));
                if let Err(error) = self.fleet.kill(slot) {
                    self.problems.push(format!("killing {tag}: {error}"));
                }
                thread::sleep(down);
                if let Err(error) = self.fleet.respawn(slot) {
                    self.problems.push(format!("restarting contender {slot}: {error}"));
                }
                self.end();
                Some(start)
            }
            FaultKind::BlackholeHolder => {
                let (slot, tag) = self.pick_holder()?;
                let hold = ttl + self.rng.millis(1000, 2500);
                let start = self.begin(kind, tag.to_string(), Some(tag));
                for proxy in &self.fleet.slots[slot].proxies {
                    proxy.blackhole();
                }
                self.history.note(tag, What::Blackholed);
                thread::sleep(hold);
                for proxy in &self.fleet.slots[slot].proxies {
                    proxy.heal();
                }
                self.history.note(tag, What::Healed);
                self.end();
                Some(start)
            }
            FaultKind::SilenceOneConnection => {
                let (slot, tag) = self.pick_holder()?;
                let open: Vec<usize> = {
                    let proxy = self.fleet.slots[slot].proxies.first()?;
                    (0..proxy.connections_accepted())
                        .filter(|&n| !proxy.client_closed(n))
                        .collect()
                };
                if open.is_empty() {
                    return None;
                }
                let number = open[self.rng.below(open.len())];
                let hold = ttl + self.rng.millis(1000, 2500);
                let start = self.begin(kind, format!("{tag}'s connection {number}"), Some(tag));
                self.fleet.slots[slot].proxies[0].freeze_connection(number);
                thread::sleep(hold);
                self.fleet.slots[slot].proxies[0].thaw_connection(number);
                self.end();
                Some(start)
            }
            FaultKind::CutHolder => {
                let (slot, tag) = self.pick_holder()?;
                let down = self.rng.millis(500, 2000);
                let start = self.begin(kind, tag.to_string(), Some(tag));
                for proxy in &self.fleet.slots[slot].proxies {
                    proxy.block();
                }
                thread::sleep(down);
                for proxy in &self.fleet.slots[slot].proxies {
                    proxy.unblock();
                }
                self.end();
                Some(start)
            }
            FaultKind::KillServer => {
                // Redis: some restarts shorter than the loss deadline (to be
                // ridden out where the data survives), some longer.
                let down = if self.backend.is_redis() {
                    self.rng.millis(200, 3000)
                } else {
                    self.rng.millis(1500, 3000)
                };
                let start = self.begin(kind, "the server".into(), None);
                if let Err(error) = self.servers.kill_server() {
                    self.problems.push(format!("killing the server: {error}"));
                }
                thread::sleep(down);
                if let Err(error) = self.servers.restart_server() {
                    self.problems.push(format!("restarting the server: {error}"));
                }
                // The outage ends when the server serves again.
                self.end();
                Some(start)
            }
            FaultKind::PauseServer => {
                let hold = if self.backend.is_redis() {
                    self.rng.millis(300, 4000)
                } else {
                    self.rng.millis(1000, 4000)
                };
                let start = self.begin(kind, "the server".into(), None);
                match self.servers.pause_server() {
                    Ok(frozen) => self.say(&frozen),
                    Err(error) => self.problems.push(format!("pausing the server: {error}")),
                }
                thread::sleep(hold);
                if let Err(error) = self.servers.resume_server() {
                    self.problems.push(format!("resuming the server: {error}"));
                }
                self.end();
                if let Err(error) = self.servers.wait_serving(0) {
                    self.problems.push(format!("the server did not come back: {error}"));
                }
                Some(start)
            }
            FaultKind::CrashBackend => {
                let pids = match self.servers.client_backends() {
                    Ok(pids) if !pids.is_empty() => pids,
                    Ok(_) => return None,
                    Err(error) => {
                        self.problems.push(format!("listing the server's backends: {error}"));
                        return None;
                    }
                };
                let pid = pids[self.rng.below(pids.len())];
                let restarts = self.servers.crash_restarts();
                // Begun as the signal goes, not before the backends were listed.
                let start = self.begin(kind, format!("backend {pid}"), None);
                match self.servers.kill_backend(pid) {
                    Ok(()) => {
                        // The postmaster reinitializes on its own: await
                        // that (its log says so), then its readiness.
                        if let Err(error) = self.servers.wait_crash_restart(restarts) {
                            self.problems.push(format!("crash of backend {pid}: {error}"));
                        }
                        if let Err(error) = self.servers.wait_serving(0) {
                            self.problems
                                .push(format!("the server did not come back after a backend crash: {error}"));
                        }
                    }
                    Err(error) => self.problems.push(format!("killing backend {pid}: {error}")),
                }
                self.end();
                Some(start)
            }
            FaultKind::Failover => {
                let start = self.begin(kind, "the primary".into(), None);
                match self.servers.fail_over() {
                    Ok(primary) => {
                        for slot in &self.fleet.slots {
                            for proxy in &slot.proxies {
                                if let Err(error) = proxy.retarget(&primary) {
                                    self.problems.push(format!("moving a proxy to {primary}: {error}"));
                                }
                            }
                        }
                        self.say(&format!("promoted; the proxies go to {primary}"));
                    }
                    Err(error) => self.problems.push(format!("failing over: {error}")),
                }
                // The outage ends when the new primary takes connections.
                self.end();
                if let Err(error) = self.servers.replace_standby() {
                    self.problems.push(format!("a standby of the new primary: {error}"));
                }
                Some(start)
            }
            FaultKind::KillMember => {
                let (i, target) = self.pick_member();
                let down = self.rng.millis(2000, 4000);
                let start = self.begin(kind, target, None);
                if let Err(error) = self.servers.member(i).kill() {
                    self.problems.push(format!("killing member n{}: {error}", i + 1));
                }
                thread::sleep(down);
                if let Err(error) = self.servers.member(i).restart() {
                    self.problems.push(format!("restarting member n{}: {error}", i + 1));
                }
                self.end();
                if let Err(error) = self.servers.wait_serving(i) {
                    self.problems
                        .push(format!("member n{} did not come back: {error}", i + 1));
                }
                Some(start)
            }
            FaultKind::KillQuorum => {
                let leader = self.servers.leader().unwrap_or(0);
                let other = (leader + 1 + self.rng.below(self.servers.size() - 1)) % self.servers.size();
                let down = self.rng.millis(1500, 2500);
                let start = self.begin(kind, format!("n{} (leader) and n{}", leader + 1, other + 1), None);
                for i in [leader, other] {
                    if let Err(error) = self.servers.member(i).kill() {
                        self.problems.push(format!("killing member n{}: {error}", i + 1));
                    }
                }
                thread::sleep(down);
                for i in [leader, other] {
                    if let Err(error) = self.servers.member(i).restart() {
                        self.problems.push(format!("restarting member n{}: {error}", i + 1));
                    }
                }
                for i in [leader, other] {
                    if let Err(error) = self.servers.wait_serving(i) {
                        self.problems
                            .push(format!("member n{} did not come back: {error}", i + 1));
                    }
                }
                // The outage ends when the cluster serves again.
                self.end();
                Some(start)
            }
            FaultKind::PauseMember => {
                let (i, target) = self.pick_member();
                let hold = self.rng.millis(2000, 5000);
                let start = self.begin(kind, target, None);
                if let Err(error) = self.servers.member(i).pause() {
                    self.problems.push(format!("pausing member n{}: {error}", i + 1));
                }
                thread::sleep(hold);
                if let Err(error) = self.servers.member(i).resume() {
                    self.problems.push(format!("resuming member n{}: {error}", i + 1));
                }
                self.end();
                if let Err(error) = self.servers.wait_serving(i) {
                    self.problems
                        .push(format!("member n{} did not come back: {error}", i + 1));
                }
                Some(start)
            }
        }
    }
}
