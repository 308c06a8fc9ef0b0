//! The randomized stress: random modes, conversions, timeouts and dropped
//! futures on many sessions, every step checked against the rule.

use super::*;

pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub(crate) fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
    pub(crate) fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// The most restrictive mode whose conflicts both `a` and `b` have: what
/// a holder converting between them holds for sure.
pub(crate) fn meet(a: LockMode, b: LockMode) -> LockMode {
    let conflicts = |m: LockMode| LockMode::ALL.into_iter().filter(move |&o| !m.compatible(o));
    LockMode::ALL
        .into_iter()
        .rev()
        .find(|&m| conflicts(m).all(|o| !a.compatible(o) && !b.compatible(o)))
        .unwrap_or(Nl)
}

#[derive(Default)]
pub(crate) struct Checker {
    /// A raw session of the store, to read the queue synchronously.
    pub(crate) raw: Option<Arc<dyn BackendSession>>,
    /// Every registration, in order, for the report.
    pub(crate) log: Vec<String>,
    /// task -> (session id, mode, how) as the task believes it holds.
    pub(crate) holders: HashMap<usize, (String, LockMode, String)>,
    pub(crate) expired: HashSet<String>,
    pub(crate) violations: Vec<String>,
    /// The highest token of a PW/EX grant registered so far.
    pub(crate) sole_max: u64,
    /// The highest value-block sequence whose write completed.
    pub(crate) written: u64,
    pub(crate) deadlocks: u64,
    pub(crate) grants: u64,
    pub(crate) conversions: u64,
}

impl Checker {
    /// Registers what `task` now believes it holds; returns whether that
    /// broke exclusion.
    pub(crate) fn enter(&mut self, task: usize, session: &str, mode: LockMode, what: &str) -> bool {
        if self.expired.contains(session) {
            return false;
        }
        let before = self.violations.len();
        for (other, (theirs, held, how)) in &self.holders {
            if *other != task && !held.compatible(mode) {
                self.violations.push(format!(
                    "{what}: task {task} ({session}) in {mode} beside task {other} ({theirs}) in {held} (by {how})"
                ));
            }
        }
        self.holders.insert(task, (session.to_owned(), mode, what.to_owned()));
        let broke = self.violations.len() > before;
        if broke {
            if let Some(raw) = &self.raw {
                let queue = futures::executor::block_on(raw.read_queue("stress")).expect("raw read");
                let all: Vec<String> = queue
                    .slots
                    .iter()
                    .map(|s| format!("{} {}", s.entry.key, String::from_utf8_lossy(&s.value)))
                    .collect();
                let recent: Vec<&String> = self.log.iter().rev().take(16).collect();
                if let Some(last) = self.violations.last_mut() {
                    last.push_str(&format!("; store now: {all:?}; recent: {recent:?}"));
                }
            }
        }
        broke
    }

    /// Checks that the store shows `key` granted in `mode` (what the guard
    /// says) or more (a conversion whose answer never came: the guard
    /// claims less until its next call), unless the session was expired.
    pub(crate) fn observe(&mut self, task: usize, session: &str, key: &str, mode: LockMode, what: &str) {
        if self.expired.contains(session) {
            return;
        }
        let Some(raw) = &self.raw else { return };
        let queue = futures::executor::block_on(raw.read_queue("stress")).expect("raw read");
        let mine = queue.slots.iter().find(|s| s.entry.key == key);
        let server = mine.map(|s| String::from_utf8_lossy(&s.value).into_owned());
        let granted = mine.and_then(|s| granted_in(&s.value));
        let line = format!("task {task} ({session}) {what}: guard {mode}, store {server:?}");
        if !granted.is_some_and(|held| mode.is_down_from(held)) {
            let all: Vec<String> = queue
                .slots
                .iter()
                .map(|s| format!("{} {}", s.entry.key, String::from_utf8_lossy(&s.value)))
                .collect();
            self.violations.push(format!(
                "{line}; store: {all:?}; recent: {:?}",
                self.log.iter().rev().take(12).collect::<Vec<_>>()
            ));
        }
        self.log.push(line);
    }

    /// Adds the server's view to the last violation.
    pub(crate) fn server_saw(&mut self, queue: &[ModeContender]) {
        if let Some(last) = self.violations.last_mut() {
            last.push_str(&format!("; the server then: {:?}", modes(queue)));
        }
    }

    pub(crate) fn check_value(&mut self, value: &lockline::LockValue, before: u64, what: &str) {
        if value.sequence < before {
            self.violations.push(format!(
                "{what}: sequence {} below a completed write {before}",
                value.sequence
            ));
        }
        if value.valid {
            let expected = if value.sequence == 0 {
                Vec::new()
            } else {
                format!("v{}", value.sequence).into_bytes()
            };
            if value.bytes != expected {
                self.violations.push(format!(
                    "{what}: valid block {:?} at sequence {}",
                    String::from_utf8_lossy(&value.bytes),
                    value.sequence
                ));
            }
        }
    }
}

// The checker's lock is taken once every task has ended.
#[allow(clippy::await_holding_lock)]
pub(crate) async fn stress(seed: u64, tasks: usize, rounds: usize, hows: &'static [usize], round_trips: bool) {
    stress_with(seed, tasks, rounds, hows, round_trips, &Gated::default()).await;
}

// The checker's lock is taken once every task has ended.
#[allow(clippy::await_holding_lock)]
pub(crate) async fn stress_with(
    seed: u64,
    tasks: usize,
    rounds: usize,
    hows: &'static [usize],
    round_trips: bool,
    gated: &Gated,
) {
    let gated = gated.clone();
    gated.ctl.audit.store(true, std::sync::atomic::Ordering::SeqCst);
    let store = gated.store.clone();
    let client = Client::new(gated.clone());
    let name = "stress";
    let checker = Arc::new(Std::new(Checker {
        raw: Some(store.open_session(&SessionOptions::new()).await.unwrap()),
        ..Checker::default()
    }));
    let live: Arc<Std<Vec<String>>> = Arc::default();
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));

    // The server-side checker: every read of the queue has compatible holders.
    let watcher = {
        let session = client.session().await.unwrap();
        let checker = Arc::clone(&checker);
        let done = Arc::clone(&done);
        tokio::spawn(async move {
            let resource = session.resource(name).unwrap();
            let mut reads = 0u64;
            while !done.load(std::sync::atomic::Ordering::SeqCst) {
                if let Ok(queue) = resource.contenders().await {
                    if let Err(why) = compatible_holders(&queue) {
                        checker
                            .lock()
                            .unwrap()
                            .violations
                            .push(format!("server: {why}: {:?}", modes(&queue)));
                    }
                }
                reads += 1;
                tokio::task::yield_now().await;
            }
            reads
        })
    };
    // Expiries.
    let chaos = {
        let store = store.clone();
        let checker = Arc::clone(&checker);
        let live = Arc::clone(&live);
        let done = Arc::clone(&done);
        tokio::spawn(async move {
            let mut rng = Rng::new(seed ^ 0xC4A05);
            let mut expired = 0;
            while !done.load(std::sync::atomic::Ordering::SeqCst) {
                tokio::time::sleep(Duration::from_millis(15 + rng.below(20) as u64)).await;
                let victim = {
                    let live = live.lock().unwrap();
                    if live.is_empty() {
                        continue;
                    }
                    live[rng.below(live.len())].clone()
                };
                let mut c = checker.lock().unwrap();
                if store.expire(&victim) {
                    c.log.push(format!("expired {victim}"));
                    c.expired.insert(victim.clone());
                    c.holders.retain(|_, (s, _, _)| *s != victim);
                    expired += 1;
                }
            }
            expired
        })
    };

    let mut handles = Vec::new();
    for task in 0..tasks {
        let client = client.clone();
        let checker = Arc::clone(&checker);
        let live = Arc::clone(&live);
        let gated = gated.clone();
        handles.push(tokio::spawn(async move {
            let mut rng = Rng::new(seed.wrapping_add(task as u64 * 7919));
            let mut session: Option<Session> = None;
            for round in 0..rounds {
                let s = match &session {
                    Some(s) if !s.state().is_over() => s.clone(),
                    _ => {
                        let s = client.session().await.unwrap();
                        if round_trips {
                            gated.yielding(&s);
                        }
                        live.lock().unwrap().push(s.id().to_owned());
                        session = Some(s.clone());
                        s
                    }
                };
                let id = s.id().to_owned();
                let Ok(resource) = s.resource(name) else { continue };
                let mode = LockMode::ALL[rng.below(6)];
                let (before_written, before_sole) = {
                    let c = checker.lock().unwrap();
                    (c.written, c.sole_max)
                };
                let ms = Duration::from_millis(1 + rng.below(25) as u64);
                let how = hows[rng.below(hows.len())];
                let got = match how {
                    0 => resource.lock(mode).await.map(Some),
                    1 => match resource.lock_timeout(mode, ms).await {
                        Err(Error::Timeout { .. }) => Ok(None),
                        other => other.map(Some),
                    },
                    2 => resource.try_lock(mode).await,
                    _ => match tokio::time::timeout(ms, resource.lock(mode)).await {
                        Err(_) => Ok(None),
                        Ok(other) => other.map(Some),
                    },
                };
                let mut guard = match got {
                    Ok(Some(g)) => g,
                    Ok(None) => continue,
                    Err(Error::SessionLost { .. } | Error::Closed { .. } | Error::LockLost { .. }) => continue,
                    Err(e) => panic!("task {task} round {round}: lock {mode}: {e}"),
                };
                let broke = {
                    let mut c = checker.lock().unwrap();
                    c.grants += 1;
                    let what = format!("grant {mode} (how {how})");
                    c.observe(task, &id, guard.key(), mode, &what);
                    let broke = c.enter(task, &id, mode, &what);
                    c.check_value(&guard.value(), before_written, "grant");
                    if mode.sole_writer() && !c.expired.contains(&id) {
                        if guard.token().get() <= before_sole {
                            c.violations.push(format!(
                                "grant {mode}: token {} not above an earlier PW/EX token {before_sole}",
                                guard.token()
                            ));
                        }
                        c.sole_max = c.sole_max.max(guard.token().get());
                    }
                    broke
                };
                if broke {
                    if let Ok(queue) = resource.contenders().await {
                        checker.lock().unwrap().server_saw(&queue);
                    }
                }
                let mut wrote = None;
                // An up-conversion dropped in flight may have been granted:
                // the guard learns it at its next call (until then `mode()`
                // under-claims), so a later call may find the lock in it.
                let mut dropped_to: Option<LockMode> = None;
                for _ in 0..rng.below(4) {
                    let from = guard.mode();
                    if from.sole_writer() && rng.below(2) == 0 {
                        let next = guard.value().sequence + 1;
                        guard.set_value(format!("v{next}").as_bytes()).unwrap();
                        wrote = Some(next);
                    }
                    let to = LockMode::ALL[rng.below(6)];
                    if to.is_down_from(from) {
                        checker
                            .lock()
                            .unwrap()
                            .enter(task, &id, to, &format!("down {from}→{to}"));
                        match guard.convert(to).await {
                            Ok(()) => {
                                checker.lock().unwrap().observe(
                                    task,
                                    &id,
                                    guard.key(),
                                    to,
                                    &format!("down {from}→{to} done"),
                                );
                                if from.sole_writer() && !to.sole_writer() {
                                    if let Some(w) = wrote.take() {
                                        let mut c = checker.lock().unwrap();
                                        c.written = c.written.max(w);
                                    }
                                }
                            }
                            Err(_) => break,
                        }
                        continue;
                    }
                    let (before_written, before_sole) = {
                        let c = checker.lock().unwrap();
                        (c.written, c.sole_max)
                    };
                    let ms = Duration::from_millis(1 + rng.below(25) as u64);
                    let how = hows[rng.below(hows.len())];
                    // While it converts, the store holds `from` or `to`: the
                    // checker counts the mode both imply (CR for CW ⇄ PR).
                    let either = meet(from, to);
                    if either != from {
                        checker
                            .lock()
                            .unwrap()
                            .enter(task, &id, either, &format!("converting {from}→{to}"));
                    }
                    let outcome = match how {
                        0 => guard.convert(to).await.map(|()| true),
                        1 => match guard.convert_timeout(to, ms).await {
                            Err(Error::Timeout { .. }) => Ok(false),
                            other => other.map(|()| true),
                        },
                        2 => guard.try_convert(to).await,
                        _ => match tokio::time::timeout(ms, guard.convert(to)).await {
                            Err(_) => {
                                dropped_to = Some(to);
                                Ok(false)
                            }
                            Ok(other) => other.map(|()| true),
                        },
                    };
                    match outcome {
                        Ok(true) => {
                            let broke = {
                                let mut c = checker.lock().unwrap();
                                c.conversions += 1;
                                let what = format!("up {from}→{to} (how {how})");
                                c.observe(task, &id, guard.key(), to, &what);
                                let broke = c.enter(task, &id, to, &what);
                                if to.sole_writer() && !from.sole_writer() {
                                    c.check_value(&guard.value(), before_written, "up-conversion");
                                }
                                if to.writes() && !c.expired.contains(&id) && guard.token().get() <= before_sole {
                                    c.violations.push(format!(
                                        "up-conversion to {to}: token {} not above {before_sole}",
                                        guard.token()
                                    ));
                                }
                                if to.sole_writer() && !c.expired.contains(&id) {
                                    c.sole_max = c.sole_max.max(guard.token().get());
                                }
                                broke
                            };
                            if broke {
                                if let Ok(queue) = resource.contenders().await {
                                    checker.lock().unwrap().server_saw(&queue);
                                }
                            }
                        }
                        Ok(false) => {
                            let mut c = checker.lock().unwrap();
                            let what = format!("gave up {from}→{to} (how {how})");
                            // A conversion dropped in flight may have been
                            // granted (the guard learns it at its next
                            // conversion or release): the store may hold
                            // either mode, the guard claims the lower.
                            // Otherwise the call read the store first: the
                            // guard's mode is the store's.
                            let now = guard.mode();
                            if how != 3 {
                                c.observe(task, &id, guard.key(), now, &what);
                            }
                            c.enter(task, &id, now, &what);
                        }
                        Err(Error::Deadlock { held, .. }) => {
                            let mut c = checker.lock().unwrap();
                            let what = format!("deadlock {from}→{to} (how {how})");
                            c.observe(task, &id, guard.key(), from, &what);
                            c.enter(task, &id, from, &what);
                            c.deadlocks += 1;
                            if held != guard.mode() || (held != from && Some(held) != dropped_to) {
                                c.violations.push(format!(
                                    "deadlock left {held}/{} from {from} (a dropped conversion to {dropped_to:?})",
                                    guard.mode()
                                ));
                            }
                        }
                        Err(_) => break,
                    }
                    if rng.below(3) == 0 {
                        tokio::time::sleep(Duration::from_millis(rng.below(3) as u64)).await;
                    }
                }
                {
                    let mut c = checker.lock().unwrap();
                    c.holders.remove(&task);
                    c.log.push(format!("task {task} ({id}) lets go of {}", guard.mode()));
                }
                if rng.below(6) == 0 {
                    drop(guard); // background release; a PW/EX value is then not valid
                } else {
                    let sole = guard.mode().sole_writer();
                    if guard.release().await.is_ok() && sole {
                        if let Some(w) = wrote {
                            let mut c = checker.lock().unwrap();
                            c.written = c.written.max(w);
                        }
                    }
                }
            }
            if let Some(s) = session {
                let _ = s.close().await;
            }
        }));
    }
    let ended = tokio::time::timeout(Duration::from_secs(90), futures::future::join_all(handles)).await;
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    let reads = watcher.await.unwrap();
    let expired = chaos.await.unwrap();
    let queue = {
        let s = client.session().await.unwrap();
        s.resource(name).unwrap().contenders().await.unwrap()
    };
    let mut c = checker.lock().unwrap();
    c.violations
        .extend(gated.ctl.violations.lock().unwrap().iter().cloned());
    eprintln!(
        "seed {seed}: {} grants, {} up-conversions, {} deadlocks, {expired} expiries, {reads} checker reads",
        c.grants, c.conversions, c.deadlocks
    );
    assert!(
        c.violations.is_empty(),
        "seed {seed}: violations:\n{}",
        c.violations.join("\n")
    );
    let ended = ended.unwrap_or_else(|_| panic!("seed {seed}: tasks hung; queue {:?}", modes(&queue)));
    for outcome in ended {
        outcome.unwrap();
    }
    let expired_ids = c.expired.clone();
    drop(c);
    let settled = tokio::time::timeout(Duration::from_secs(5), async {
        while !store.keys(name).is_empty() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    if settled.is_err() {
        let s = client.session().await.unwrap();
        let left = s.resource(name).unwrap().contenders().await.unwrap();
        let described: Vec<String> = left
            .iter()
            .map(|c| {
                let owner = c.session.clone().unwrap_or_default();
                format!(
                    "{} {:?}/{} owner {owner} (expired by the test: {})",
                    c.key,
                    c.granted,
                    c.requested,
                    expired_ids.contains(&owner)
                )
            })
            .collect();
        panic!(
            "seed {seed}: entries left after every session ended:\n{}",
            described.join("\n")
        );
    }
}

/// Random modes, conversions (up, down, CW ⇄ PR), timeouts, tries and
/// expiries; cancellations only through the library's own timeouts. The
/// checker: every state the store passes through has compatible grants;
/// what each task believes it holds is what the store holds and is
/// compatible with what the others believe; PW/EX tokens rise; a valid
/// value block is the last write; no entry is left at the end. Held,
/// except that it can hit (rarely) the memory backend's append/expiry race
/// (`bug_memory_append_racing_expiry_leaves_an_orphan_entry`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(crate) async fn stress_random_modes_without_dropped_futures() {
    for seed in 1..=4 {
        stress(seed, 10, 40, &[0, 1, 2], false).await;
    }
}

/// The same with `lock()` and `convert()` futures dropped by an outer
/// timeout (the background cleanups). Held, but for the memory backend's
/// append/expiry race, which it hits now and then (an entry of an expired
/// session left for good).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(crate) async fn stress_random_modes_with_dropped_futures() {
    for seed in 11..=14 {
        stress(seed, 10, 40, &[0, 1, 2, 3], false).await;
    }
}

/// The same, every waiter's read after its wake answered with a prefix of
/// the queue (through the first request that waits for EX and was never
/// granted), as a hand-over's message gives it on Redis: the waiters decide
/// from it that they were handed the lock, or what they wait on, and read
/// the whole queue for anything else. Checks that prefixes were given.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(crate) async fn stress_random_modes_deciding_from_prefixes() {
    let gated = Gated::default();
    gated.ctl.prefixes.store(true, std::sync::atomic::Ordering::SeqCst);
    for seed in 51..=54 {
        stress_with(seed, 10, 40, &[0, 1, 2, 3], seed % 2 == 0, &gated).await;
    }
    let given = gated.ctl.prefixes_given.load(std::sync::atomic::Ordering::SeqCst);
    assert!(given > 0, "no read was answered with a prefix");
}

/// BUG (found by this stress): the same, every backend call answering one
/// poll later (a round trip): `convert_timeout` / `lock_timeout` deadlines
/// fall while a grant's answer is on its way, and the guard disagrees with
/// the store (see
/// `bug_convert_timeout_reports_timeout_for_a_conversion_the_store_granted`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(crate) async fn regression_stress_round_trips_with_timeouts() {
    for seed in 21..=26 {
        stress(seed, 10, 40, &[0, 1, 2], true).await;
    }
}

/// Round trips, with no timeout and no dropped future at all (waiting
/// `lock`/`convert` and tries only): exclusion, deadlock detection and
/// cleanup on their own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(crate) async fn stress_random_modes_with_round_trips_without_timeouts() {
    for seed in 41..=44 {
        stress(seed, 10, 40, &[0, 2], true).await;
    }
}

/// BUG (found by this stress): round trips and dropped futures together —
/// guards that disagree with the store after a cut in flight, and now and
/// then an orphan entry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(crate) async fn regression_stress_round_trips_with_dropped_futures() {
    for seed in 31..=34 {
        stress(seed, 10, 40, &[0, 1, 2, 3], true).await;
    }
}
