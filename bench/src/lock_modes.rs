//! The lock modes beside the mutex, on any backend: for each N, lockline's
//! mutex, a [`Resource`] locked in EX, and a mixed workload of the six
//! modes, measured one after the other in the same run against the same
//! server ([`run`]).
//!
//! - **Mutex and EX**: N contenders, each its own client and session, take
//!   and release one lock with zero hold time; the printed ratio is EX ÷
//!   mutex (grants/s, and handoffs/s at N ≥ 2). Which of the two goes first
//!   alternates from one N to the next.
//! - **Mixed** ([`MIXED_WEIGHTS`], [`MIXED_CONVERT_ONE_IN`],
//!   [`mixed_conversion`]): each contender picks a mode at random by weight,
//!   locks it, sometimes converts it (up or down), and releases, with zero
//!   hold time. Printed: grants/s (and ÷ the mutex's), conversions/s,
//!   conversions refused as deadlocks, and wakeups per release from the
//!   clients' [`Client::stats`]. With shared modes one release can rightly
//!   wake several waiters (every PR request behind an EX holder is granted
//!   when it goes), so the figure is not bounded by 1 as the mutex's is.
//!
//! Every contender also tells a tracker in the process what it surely
//! holds: its mode from the return of its `lock` until just before its
//! release; while it converts, only the most restrictive mode below both
//! the old and the new one ([`common`]: CR between CW and PR, the new mode
//! of a down-conversion), and the new mode once the conversion returns.
//! Two incompatible modes tracked at once would be a broken lock; the count
//! is printed (it should read 0). The figures are printed, never judged:
//! no timing is asserted.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex as StdMutex, PoisonError};
use std::time::{Duration, Instant};

use lockline::{Client, Error, LockMode, Resource, Session, SessionOptions};

use crate::contenders::{counts, Contenders, SESSION_TTL};
use crate::contest::{Contest, Outcome, Sampling};
use crate::{BoxError, BoxResult, OwnFlags};

/// The mixed workload's modes and their weights: read-mostly, as a DLM's
/// users mostly are.
pub const MIXED_WEIGHTS: [(LockMode, u64); 6] = [
    (LockMode::Nl, 1),
    (LockMode::Cr, 4),
    (LockMode::Cw, 2),
    (LockMode::Pr, 7),
    (LockMode::Pw, 2),
    (LockMode::Ex, 4),
];

/// One grant in this many is converted before its release.
pub const MIXED_CONVERT_ONE_IN: u64 = 4;

/// How long after its window a measurement may take to stop (every
/// contender granted once more and released) before it is reported as
/// stalled.
const STALL: Duration = Duration::from_secs(60);

/// The mode a mixed contender holding `mode` converts to: up from NL, CR,
/// CW and PR, down from PW and EX.
pub fn mixed_conversion(mode: LockMode) -> LockMode {
    match mode {
        LockMode::Nl | LockMode::Pr => LockMode::Ex,
        LockMode::Cr => LockMode::Pw,
        LockMode::Cw => LockMode::Pr,
        LockMode::Pw => LockMode::Cr,
        LockMode::Ex => LockMode::Pr,
    }
}

/// The mixed workload in words, for the programs' output and docs.
pub fn mixed_description() -> String {
    let weights: Vec<String> = MIXED_WEIGHTS.iter().map(|(m, w)| format!("{m} {w}")).collect();
    let total: u64 = MIXED_WEIGHTS.iter().map(|(_, w)| w).sum();
    let conversions: Vec<String> = LockMode::ALL
        .iter()
        .map(|&m| format!("{m}→{}", mixed_conversion(m)))
        .collect();
    format!(
        "modes by weight {} (of {total}); one grant in {MIXED_CONVERT_ONE_IN} converts ({}) before its release",
        weights.join(", "),
        conversions.join(", ")
    )
}

/// A small seeded generator (SplitMix64): the same seed gives every
/// contender the same sequence of modes on every run and every backend.
#[derive(Debug, Clone)]
pub struct Dice(u64);

impl Dice {
    /// Contender `who`'s dice for the run seeded with `seed`.
    pub fn new(seed: u64, who: usize) -> Self {
        Dice(seed ^ (who as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15))
    }

    /// The next number.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..bound` (`bound` > 0).
    pub fn below(&mut self, bound: u64) -> u64 {
        self.next_u64() % bound
    }

    /// The next mixed request: a mode by [`MIXED_WEIGHTS`], and the mode it
    /// converts to before its release, if it does.
    pub fn mixed_request(&mut self) -> (LockMode, Option<LockMode>) {
        let total: u64 = MIXED_WEIGHTS.iter().map(|(_, w)| w).sum();
        let mut roll = self.below(total);
        let mut mode = LockMode::Ex;
        for (m, weight) in MIXED_WEIGHTS {
            if roll < weight {
                mode = m;
                break;
            }
            roll -= weight;
        }
        let converts = self.below(MIXED_CONVERT_ONE_IN) == 0;
        (mode, converts.then(|| mixed_conversion(mode)))
    }
}

/// The lock-mode section's flags, taken out of a program's own:
/// `[--modes-only] [--modes-contenders 1,4,16] [--modes-seconds 2] [--modes-seed 1]`.
#[derive(Debug, Clone, PartialEq)]
pub struct ModesArgs {
    /// Only the lock-mode section (after the server's start and the
    /// program's warm-up, if any).
    pub only: bool,
    /// The contender counts (each 1..=1024; default 1, 4, 16).
    pub contenders: Vec<usize>,
    /// Seconds per measurement (0.1..=600; default 2): three measurements
    /// per N.
    pub seconds: f64,
    /// The mixed workload's seed (default 1).
    pub seed: u64,
}

impl Default for ModesArgs {
    fn default() -> Self {
        ModesArgs {
            only: false,
            contenders: vec![1, 4, 16],
            seconds: 2.0,
            seed: 1,
        }
    }
}

impl ModesArgs {
    /// The switches to take out of the arguments ([`OwnFlags::take`]).
    pub const SWITCHES: &'static [&'static str] = &["--modes-only"];
    /// The flags with a value to take out.
    pub const VALUED: &'static [&'static str] = &["--modes-contenders", "--modes-seconds", "--modes-seed"];
    /// Their usage.
    pub const USAGE: &'static str = "[--modes-only] [--modes-contenders 1,4,16] [--modes-seconds 2] [--modes-seed 1]";

    /// The section's flags among `own`.
    ///
    /// # Errors
    ///
    /// A message naming the bad flag.
    pub fn from_flags(own: &OwnFlags) -> Result<Self, String> {
        let mut args = ModesArgs {
            only: own.switch("--modes-only"),
            ..ModesArgs::default()
        };
        if let Some(list) = own.value("--modes-contenders") {
            args.contenders = list
                .split(',')
                .map(|n| n.parse().ok().filter(|n| (1..=1024).contains(n)))
                .collect::<Option<Vec<usize>>>()
                .ok_or_else(|| format!("bad --modes-contenders {list:?}: counts within 1..=1024"))?;
        }
        if let Some(value) = own.value("--modes-seconds") {
            args.seconds = value
                .parse()
                .ok()
                .filter(|s| (0.1..=600.0).contains(s))
                .ok_or_else(|| format!("bad --modes-seconds {value:?}: within 0.1..=600"))?;
        }
        if let Some(value) = own.value("--modes-seed") {
            args.seed = value.parse().map_err(|_| format!("bad --modes-seed {value:?}"))?;
        }
        Ok(args)
    }

    /// Takes these flags and `switches`/`valued` (the program's own) out of
    /// `args`; returns them, the program's own flags and the rest.
    ///
    /// # Errors
    ///
    /// A message naming the bad flag.
    pub fn take(
        args: impl IntoIterator<Item = String>,
        switches: &[&str],
        valued: &[&str],
    ) -> Result<(ModesArgs, OwnFlags, Vec<String>), String> {
        let switches = [switches, Self::SWITCHES].concat();
        let valued = [valued, Self::VALUED].concat();
        let (own, rest) = OwnFlags::take(args, &switches, &valued)?;
        Ok((Self::from_flags(&own)?, own, rest))
    }
}

/// One measurement's figures.
#[derive(Debug, Clone, Default)]
pub struct Figures {
    /// The contest's window: grants, handoffs, latencies.
    pub outcome: Outcome,
    /// Wakeups per release, as the clients counted them over the whole
    /// measurement.
    pub wakeups_per_release: f64,
    /// Conversions granted within the window (mixed only).
    pub conversions: u64,
    /// Up-conversions refused as deadlocks within the window (mixed only).
    pub deadlocks: u64,
    /// Times two incompatible modes were tracked as held at once (mixed
    /// only; 0 unless the lock is broken).
    pub overlaps: u64,
    /// The server's counters per grant over the whole measurement, one per
    /// [`ServerCounters::names`] (none without them).
    pub server: Vec<f64>,
}

impl Figures {
    /// Grants per second within the window.
    pub fn grants_per_sec(&self) -> f64 {
        self.outcome.grants_per_sec()
    }

    /// Handoffs per second within the window.
    pub fn handoffs_per_sec(&self) -> f64 {
        self.outcome.handoffs_per_sec()
    }

    /// Per second within the window.
    pub fn per_sec(&self, count: u64) -> f64 {
        count as f64 / self.outcome.seconds
    }
}

/// What a backend's server counts, read around each measurement of the
/// section (from before its sessions open until they are closed) and
/// printed per grant: statements and log flushes of a database, commands
/// of Redis, say.
///
/// Called from the program's main task, one call at a time.
#[allow(async_fn_in_trait)] // Used by the examples' main tasks only, never spawned.
pub trait ServerCounters {
    /// What is counted, one column per name (`WAL flushes`, say; the table
    /// adds `/grant`).
    fn names(&self) -> Vec<String>;

    /// Reads the counters before a measurement.
    async fn before(&mut self) -> BoxResult<()>;

    /// Each counter's increase since [`before`](Self::before), divided by
    /// `grants` (every grant of the measurement), in the order of
    /// [`names`](Self::names).
    async fn per_grant(&mut self, grants: u64) -> BoxResult<Vec<f64>>;
}

/// No server counters (the memory backend's).
#[derive(Debug, Clone, Copy, Default)]
pub struct NoCounters;

impl ServerCounters for NoCounters {
    fn names(&self) -> Vec<String> {
        Vec::new()
    }

    async fn before(&mut self) -> BoxResult<()> {
        Ok(())
    }

    async fn per_grant(&mut self, _grants: u64) -> BoxResult<Vec<f64>> {
        Ok(Vec::new())
    }
}

/// Runs one measurement between two readings of `counters`.
async fn counted<C: ServerCounters>(
    counters: &mut C,
    measurement: impl std::future::Future<Output = BoxResult<Figures>>,
) -> Result<Figures, String> {
    async {
        counters.before().await?;
        let mut figures = measurement.await?;
        figures.server = counters.per_grant(figures.outcome.all_grants).await?;
        Ok::<_, BoxError>(figures)
    }
    .await
    .map_err(reason)
}

/// One N's three measurements; a measurement that failed or stalled holds
/// its reason (a finding, printed under the tables).
#[derive(Debug)]
pub struct Row {
    /// The number of contenders.
    pub n: usize,
    /// Whether EX ran before the mutex at this N.
    pub ex_first: bool,
    /// lockline's mutex.
    pub mutex: Result<Figures, String>,
    /// A resource in EX.
    pub ex: Result<Figures, String>,
    /// The mixed workload.
    pub mixed: Result<Figures, String>,
}

/// The most restrictive mode that excludes nothing `a` or `b` admits: what
/// a holder converting between them holds for sure (the lower one, when one
/// is down from the other; CR between CW and PR).
pub fn common(a: LockMode, b: LockMode) -> LockMode {
    LockMode::ALL
        .into_iter()
        .rev()
        .find(|m| m.is_down_from(a) && m.is_down_from(b))
        .unwrap_or(LockMode::Nl)
}

/// What every contender of a mixed run tracks: who holds what.
#[derive(Debug, Default)]
struct Tracker {
    held: StdMutex<Vec<(usize, LockMode)>>,
    overlaps: AtomicU64,
}

impl Tracker {
    /// `who` holds `mode` from now (replacing what it held).
    fn hold(&self, who: usize, mode: LockMode) {
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        held.retain(|(w, _)| *w != who);
        let clashes = held.iter().filter(|(_, theirs)| !theirs.compatible(mode)).count();
        self.overlaps.fetch_add(clashes as u64, Ordering::Relaxed);
        held.push((who, mode));
    }

    /// `who` holds nothing from now.
    fn leave(&self, who: usize) {
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        held.retain(|(w, _)| *w != who);
    }
}

/// N contenders on one resource, each its own client and session.
struct ResourceContenders {
    clients: Vec<Client>,
    sessions: Vec<Session>,
    resources: Vec<Resource>,
}

impl ResourceContenders {
    async fn open(n: usize, name: &str, client: &mut dyn FnMut() -> Client) -> lockline::Result<Self> {
        let mut opened = ResourceContenders {
            clients: Vec::new(),
            sessions: Vec::new(),
            resources: Vec::new(),
        };
        for _ in 0..n {
            let client = client();
            let session = client.session_with(SessionOptions::new().with_ttl(SESSION_TTL)).await?;
            opened.resources.push(session.resource(name)?);
            opened.sessions.push(session);
            opened.clients.push(client);
        }
        Ok(opened)
    }

    fn wakeups_per_release(&self) -> f64 {
        let counted = counts(&self.clients);
        counted.wakeups as f64 / counted.releases.max(1) as f64
    }

    async fn close(self) -> lockline::Result<()> {
        for session in &self.sessions {
            session.close().await?;
        }
        Ok(())
    }
}

/// Stops `contest`, or says it stalled.
async fn stop(contest: Contest) -> BoxResult<Outcome> {
    match tokio::time::timeout(STALL, contest.stop()).await {
        Ok(outcome) => outcome,
        Err(_) => Err(format!(
            "stalled: contenders not all stopped {} s after the window",
            STALL.as_secs()
        )
        .into()),
    }
}

/// lockline's mutex: N contenders, zero hold time, for `seconds`.
///
/// # Errors
///
/// A session that cannot be opened, a lock or release that fails, or a
/// measurement that stalls.
pub async fn mutex_run(n: usize, seconds: f64, name: &str, client: &mut dyn FnMut() -> Client) -> BoxResult<Figures> {
    let contenders = Contenders::open(n, name, client).await?;
    let mut contest = contenders.contest(Sampling::Window);
    contest.run_for(seconds).await;
    let outcome = stop(contest).await?;
    let wakeups_per_release = contenders.wakeups_per_release();
    contenders.close().await?;
    Ok(Figures {
        outcome,
        wakeups_per_release,
        ..Figures::default()
    })
}

/// A resource locked in EX: N contenders, zero hold time, for `seconds`.
///
/// # Errors
///
/// As [`mutex_run`].
pub async fn ex_run(n: usize, seconds: f64, name: &str, client: &mut dyn FnMut() -> Client) -> BoxResult<Figures> {
    let contenders = ResourceContenders::open(n, name, client).await?;
    let mut each = contenders.resources.clone().into_iter();
    let mut contest = Contest::start(n, Sampling::Window, move |mut contender| {
        let resource = each.next().expect("one resource per contender");
        async move {
            while contender.running() {
                let started = Instant::now();
                let guard = resource.lock(LockMode::Ex).await?;
                contender.granted(started);
                contender.releasing();
                guard.release().await?;
            }
            Ok::<_, Error>(())
        }
    });
    contest.run_for(seconds).await;
    let outcome = stop(contest).await?;
    let wakeups_per_release = contenders.wakeups_per_release();
    contenders.close().await?;
    Ok(Figures {
        outcome,
        wakeups_per_release,
        ..Figures::default()
    })
}

/// The mixed workload: N contenders, zero hold time, for `seconds`, their
/// modes drawn from `seed` (see the module docs).
///
/// # Errors
///
/// As [`mutex_run`]; a deadlock refused to an up-conversion is counted, not
/// an error.
pub async fn mixed_run(
    n: usize,
    seconds: f64,
    name: &str,
    seed: u64,
    client: &mut dyn FnMut() -> Client,
) -> BoxResult<Figures> {
    let contenders = ResourceContenders::open(n, name, client).await?;
    let tracker = Arc::new(Tracker::default());
    let conversions = Arc::new(AtomicU64::new(0));
    let deadlocks = Arc::new(AtomicU64::new(0));
    let mut each = contenders.resources.clone().into_iter();
    let mut contest = {
        let (tracker, conversions, deadlocks) = (tracker.clone(), conversions.clone(), deadlocks.clone());
        Contest::start(n, Sampling::Window, move |mut contender| {
            let resource = each.next().expect("one resource per contender");
            let (tracker, conversions, deadlocks) = (tracker.clone(), conversions.clone(), deadlocks.clone());
            let mut dice = Dice::new(seed, contender.who());
            async move {
                let who = contender.who();
                while contender.running() {
                    let (mode, convert_to) = dice.mixed_request();
                    let started = Instant::now();
                    let mut guard = resource.lock(mode).await?;
                    contender.granted(started);
                    tracker.hold(who, mode);
                    if let Some(to) = convert_to {
                        // While the server may have either mode, claim
                        // only one below both (CW → PR: CR; a
                        // down-conversion: the new mode).
                        tracker.hold(who, common(mode, to));
                        match guard.convert(to).await {
                            Ok(()) => {
                                tracker.hold(who, to);
                                conversions.fetch_add(1, Ordering::Relaxed);
                            }
                            Err(Error::Deadlock { held, .. }) => {
                                tracker.hold(who, held);
                                deadlocks.fetch_add(1, Ordering::Relaxed);
                            }
                            Err(error) => return Err(error),
                        }
                    }
                    tracker.leave(who);
                    contender.releasing();
                    guard.release().await?;
                }
                Ok::<_, Error>(())
            }
        })
    };
    contest.run_for(seconds).await;
    let (converted, refused) = (conversions.load(Ordering::SeqCst), deadlocks.load(Ordering::SeqCst));
    let outcome = stop(contest).await?;
    let wakeups_per_release = contenders.wakeups_per_release();
    contenders.close().await?;
    Ok(Figures {
        outcome,
        wakeups_per_release,
        conversions: converted,
        deadlocks: refused,
        overlaps: tracker.overlaps.load(Ordering::SeqCst),
        server: Vec::new(),
    })
}

/// Whether this backend locks resources: one `try_lock` in NL on a fresh
/// session. `Ok(Some(why))` when it does not ([`Error::Unsupported`]).
///
/// # Errors
///
/// Any other failure.
pub async fn unsupported(name: &str, client: &mut dyn FnMut() -> Client) -> BoxResult<Option<String>> {
    let session = client()
        .session_with(SessionOptions::new().with_ttl(SESSION_TTL))
        .await?;
    let outcome = session.resource(name)?.try_lock(LockMode::Nl).await;
    let why = match outcome {
        Ok(Some(guard)) => {
            guard.release().await?;
            None
        }
        Ok(None) => None,
        Err(error @ Error::Unsupported { .. }) => Some(error.to_string()),
        Err(error) => return Err(error.into()),
    };
    session.close().await?;
    Ok(why)
}

fn reason(error: BoxError) -> String {
    error.to_string()
}

/// Measures one N: the mutex and EX (in the order `ex_first` says), then the
/// mixed workload, each on its own lock named after `prefix` and `round`,
/// each between two readings of `counters`.
pub async fn measure<C: ServerCounters>(
    n: usize,
    round: usize,
    args: &ModesArgs,
    prefix: &str,
    client: &mut dyn FnMut() -> Client,
    counters: &mut C,
) -> Row {
    let seconds = args.seconds;
    let ex_first = round % 2 == 1;
    let mutex_name = format!("{prefix}modes-mutex-{round}");
    let ex_name = format!("{prefix}modes-ex-{round}");
    let (mutex, ex) = if ex_first {
        let ex = counted(counters, ex_run(n, seconds, &ex_name, client)).await;
        let mutex = counted(counters, mutex_run(n, seconds, &mutex_name, client)).await;
        (mutex, ex)
    } else {
        let mutex = counted(counters, mutex_run(n, seconds, &mutex_name, client)).await;
        (mutex, counted(counters, ex_run(n, seconds, &ex_name, client)).await)
    };
    let mixed_name = format!("{prefix}modes-mixed-{round}");
    let mixed = counted(counters, mixed_run(n, seconds, &mixed_name, args.seed, client)).await;
    Row {
        n,
        ex_first,
        mutex,
        ex,
        mixed,
    }
}

/// `a ÷ b` with two decimals, `-` when either is missing or `b` is zero.
fn divided(a: Option<f64>, b: Option<f64>) -> String {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => format!("{:.2}", a / b),
        _ => "-".to_owned(),
    }
}

fn cell(value: Option<f64>, decimals: usize) -> String {
    value.map_or("failed".to_owned(), |v| format!("{v:.decimals$}"))
}

/// The server's counters of `figures`, one cell each (`columns` of them).
fn server_cells(figures: Option<&Figures>, columns: usize) -> Vec<String> {
    (0..columns)
        .map(|i| cell(figures.and_then(|f| f.server.get(i).copied()), 2))
        .collect()
}

/// The first table's line for `row`: mutex and EX side by side, then
/// `counters` columns of server counters per grant (mutex / EX).
pub fn ex_line(row: &Row, counters: usize) -> String {
    let (mutex, ex) = (row.mutex.as_ref().ok(), row.ex.as_ref().ok());
    let grants = (mutex.map(Figures::grants_per_sec), ex.map(Figures::grants_per_sec));
    let contended = row.n > 1;
    let handoffs = (
        mutex.filter(|_| contended).map(Figures::handoffs_per_sec),
        ex.filter(|_| contended).map(Figures::handoffs_per_sec),
    );
    let dash_or = |value: Option<f64>, failed: bool| {
        if contended {
            cell(value, 0)
        } else if failed {
            "failed".to_owned()
        } else {
            "-".to_owned()
        }
    };
    let latency = |figures: Option<&Figures>| {
        figures.map_or("failed".to_owned(), |f| {
            if contended {
                f.outcome.handoff.p50_p99()
            } else {
                f.outcome.acquire.p50_p99()
            }
        })
    };
    let server: String = server_cells(mutex, counters)
        .into_iter()
        .zip(server_cells(ex, counters))
        .map(|(m, e)| format!(" {m} / {e} |"))
        .collect();
    format!(
        "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} / {} |{server}",
        row.n,
        if row.ex_first { "EX" } else { "mutex" },
        cell(grants.0, 0),
        cell(grants.1, 0),
        divided(grants.1, grants.0),
        dash_or(handoffs.0, mutex.is_none()),
        dash_or(handoffs.1, ex.is_none()),
        divided(handoffs.1, handoffs.0),
        latency(mutex),
        latency(ex),
        cell(mutex.map(|f| f.wakeups_per_release), 2),
        cell(ex.map(|f| f.wakeups_per_release), 2),
    )
}

/// The second table's line for `row`: the mixed workload, then `counters`
/// columns of server counters per grant.
pub fn mixed_line(row: &Row, counters: usize) -> String {
    let mutex = row.mutex.as_ref().ok().map(Figures::grants_per_sec);
    let server: String = server_cells(row.mixed.as_ref().ok(), counters)
        .into_iter()
        .map(|c| format!(" {c} |"))
        .collect();
    match &row.mixed {
        Ok(mixed) => format!(
            "| {} | {:.0} | {} | {:.0} | {} | {} | {:.2} | {} |{server}",
            row.n,
            mixed.grants_per_sec(),
            divided(Some(mixed.grants_per_sec()), mutex),
            mixed.per_sec(mixed.conversions),
            mixed.deadlocks,
            mixed.outcome.acquire.p50_p99(),
            mixed.wakeups_per_release,
            mixed.overlaps,
        ),
        Err(_) => format!("| {} | failed | - | - | - | - | - | - |{server}", row.n),
    }
}

/// The first table's header and its rule, with a column per name of
/// `counters` (server counters per grant).
pub fn ex_header(counters: &[String]) -> String {
    let extra: String = counters.iter().map(|c| format!(" {c}/grant: mutex / EX |")).collect();
    format!(
        "| N | first | grants/s: mutex | EX | EX ÷ mutex | handoffs/s: mutex | EX | EX ÷ mutex | \
         handoff p50 / p99 (ms; N = 1: acquire): mutex | EX | wakeups/release: mutex / EX |{extra}\n\
         |---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|{}",
        "---:|".repeat(counters.len())
    )
}

/// The second table's header and its rule, with a column per name of
/// `counters`.
pub fn mixed_header(counters: &[String]) -> String {
    let extra: String = counters.iter().map(|c| format!(" {c}/grant |")).collect();
    format!(
        "| N | grants/s | mixed ÷ mutex (grants/s) | conversions/s | up-conversions refused as deadlocks | \
         acquire p50 / p99 (ms) | wakeups/release | incompatible holds seen |{extra}\n\
         |---:|---:|---:|---:|---:|---:|---:|---:|{}",
        "---:|".repeat(counters.len())
    )
}

/// The whole lock-mode section of a program (see the module docs): a
/// heading naming `backend` (what runs it: `single-node etcd on ...`), the
/// two tables, and the failures, if any. Lock names begin with `prefix`
/// (`bench/`, say); `client` gives each contender its own client of the
/// server under test.
///
/// When the backend does not lock resources yet ([`Error::Unsupported`]),
/// prints one line saying so and measures nothing.
///
/// # Errors
///
/// When the first session cannot be opened; a measurement that fails is a
/// finding, printed in its row and below the tables.
pub async fn run(backend: &str, args: &ModesArgs, prefix: &str, client: impl FnMut() -> Client) -> BoxResult<Vec<Row>> {
    run_with(backend, args, prefix, client, &mut NoCounters).await
}

/// [`run`], with the server's `counters` per grant in the tables.
///
/// # Errors
///
/// As [`run`].
pub async fn run_with<C: ServerCounters>(
    backend: &str,
    args: &ModesArgs,
    prefix: &str,
    mut client: impl FnMut() -> Client,
    counters: &mut C,
) -> BoxResult<Vec<Row>> {
    println!();
    println!(
        "Lock modes on {backend}: for each N, lockline's mutex and a Resource in EX (zero hold time; \
         which goes first alternates), then the mixed workload, {} s each, one after the other",
        args.seconds
    );
    if let Some(why) = unsupported(&format!("{prefix}modes-probe"), &mut client).await? {
        println!("not measured: a resource's try_lock answered Unsupported ({why})");
        return Ok(Vec::new());
    }
    let names = counters.names();
    println!();
    println!("{}", ex_header(&names));
    let mut rows = Vec::new();
    for (round, &n) in args.contenders.iter().enumerate() {
        let row = measure(n, round, args, prefix, &mut client, counters).await;
        println!("{}", ex_line(&row, names.len()));
        rows.push(row);
    }
    println!();
    println!("Mixed workload: {} (seed {}).", mixed_description(), args.seed);
    println!();
    println!("{}", mixed_header(&names));
    for row in &rows {
        println!("{}", mixed_line(row, names.len()));
    }
    let mut failures: Vec<String> = Vec::new();
    for row in &rows {
        for (what, outcome) in [("mutex", &row.mutex), ("EX", &row.ex), ("mixed", &row.mixed)] {
            match outcome {
                Err(error) => failures.push(format!("N = {}, {what}: {error}", row.n)),
                Ok(figures) if figures.overlaps > 0 => failures.push(format!(
                    "N = {}, {what}: incompatible modes held at once {} times",
                    row.n, figures.overlaps
                )),
                Ok(_) => {}
            }
        }
    }
    if !failures.is_empty() {
        println!();
        for failure in failures {
            println!("FAILED: {failure}");
        }
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(line: &str) -> Vec<String> {
        line.split_whitespace().map(str::to_owned).collect()
    }

    #[test]
    fn flags_are_taken_out_with_the_programs_own() {
        let (modes, own, rest) = ModesArgs::take(
            words("--seconds 3 --modes-only --warmup 4 --modes-contenders 2,8 --modes-seconds 0.5 --modes-seed 7"),
            &[],
            &["--warmup"],
        )
        .expect("flags");
        assert_eq!(
            modes,
            ModesArgs {
                only: true,
                contenders: vec![2, 8],
                seconds: 0.5,
                seed: 7
            }
        );
        assert_eq!(own.value("--warmup"), Some("4"));
        assert_eq!(rest, words("--seconds 3"));
        let (defaults, _, _) = ModesArgs::take(Vec::new(), &[], &[]).expect("none");
        assert_eq!(defaults, ModesArgs::default());
        for bad in [
            "--modes-contenders 0",
            "--modes-contenders 1,x",
            "--modes-seconds 0",
            "--modes-seed -1",
        ] {
            assert!(ModesArgs::take(words(bad), &[], &[]).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn the_dice_follow_the_weights_and_the_seed() {
        let mut dice = Dice::new(1, 0);
        let mut seen = std::collections::HashMap::new();
        let mut converted = 0;
        let draws = 40_000;
        for _ in 0..draws {
            let (mode, to) = dice.mixed_request();
            *seen.entry(mode).or_insert(0u64) += 1;
            if let Some(to) = to {
                assert_eq!(to, mixed_conversion(mode));
                converted += 1;
            }
        }
        let total: u64 = MIXED_WEIGHTS.iter().map(|(_, w)| w).sum();
        for (mode, weight) in MIXED_WEIGHTS {
            let expected = draws as f64 * weight as f64 / total as f64;
            let got = seen.get(&mode).copied().unwrap_or(0) as f64;
            assert!(
                (got - expected).abs() < expected * 0.1 + 50.0,
                "{mode}: {got} for {expected}"
            );
        }
        let expected = draws as f64 / MIXED_CONVERT_ONE_IN as f64;
        assert!((converted as f64 - expected).abs() < expected * 0.1);
        let replay: Vec<_> = (0..8).map(|_| Dice::new(5, 3).mixed_request()).collect();
        assert!(replay.windows(2).all(|w| w[0] == w[1]), "same seed, same draws");
        let (mut a, mut b) = (Dice::new(5, 3), Dice::new(5, 4));
        assert_ne!(
            (0..8).map(|_| a.next_u64()).collect::<Vec<_>>(),
            (0..8).map(|_| b.next_u64()).collect::<Vec<_>>(),
            "contenders draw differently"
        );
    }

    #[test]
    fn conversions_go_both_ways() {
        let up: Vec<_> = LockMode::ALL
            .iter()
            .filter(|&&m| !mixed_conversion(m).is_down_from(m))
            .collect();
        assert_eq!(up, [&LockMode::Nl, &LockMode::Cr, &LockMode::Cw, &LockMode::Pr]);
        assert!(LockMode::ALL.iter().all(|&m| mixed_conversion(m) != m));
        assert_eq!(
            mixed_description(),
            "modes by weight NL 1, CR 4, CW 2, PR 7, PW 2, EX 4 (of 20); one grant in 4 converts \
             (NL→EX, CR→PW, CW→PR, PR→EX, PW→CR, EX→PR) before its release"
        );
    }

    #[test]
    fn a_conversion_holds_what_both_modes_exclude() {
        use LockMode::*;
        assert_eq!(common(Cw, Pr), Cr);
        assert_eq!(common(Pr, Cw), Cr);
        assert_eq!(common(Pr, Ex), Pr);
        assert_eq!(common(Ex, Pr), Pr);
        assert_eq!(common(Nl, Ex), Nl);
        assert_eq!(common(Cr, Pw), Cr);
        assert_eq!(common(Pw, Cr), Cr);
        for a in LockMode::ALL {
            assert_eq!(common(a, a), a);
        }
    }

    #[test]
    fn the_tracker_counts_incompatible_holds_only() {
        let tracker = Tracker::default();
        tracker.hold(0, LockMode::Pr);
        tracker.hold(1, LockMode::Pr);
        tracker.hold(2, LockMode::Cr);
        assert_eq!(tracker.overlaps.load(Ordering::SeqCst), 0);
        tracker.hold(0, LockMode::Nl); // a down-conversion replaces the mode
        tracker.hold(3, LockMode::Pw);
        assert_eq!(tracker.overlaps.load(Ordering::SeqCst), 1, "PW beside PR");
        tracker.leave(1);
        tracker.leave(3);
        tracker.hold(4, LockMode::Ex);
        assert_eq!(tracker.overlaps.load(Ordering::SeqCst), 2, "EX beside CR");
    }

    fn figures(grants: u64, handoffs: u64) -> Figures {
        Figures {
            outcome: Outcome {
                grants,
                handoffs,
                seconds: 2.0,
                ..Outcome::default()
            },
            wakeups_per_release: 1.0,
            ..Figures::default()
        }
    }

    #[test]
    fn lines_show_ratios_and_failures() {
        let row = Row {
            n: 4,
            ex_first: true,
            mutex: Ok(figures(2000, 1998)),
            ex: Ok(figures(1000, 999)),
            mixed: Err("stalled".into()),
        };
        assert_eq!(
            ex_line(&row, 0),
            "| 4 | EX | 1000 | 500 | 0.50 | 999 | 500 | 0.50 | - | - | 1.00 / 1.00 |"
        );
        assert_eq!(mixed_line(&row, 0), "| 4 | failed | - | - | - | - | - | - |");
        assert_eq!(mixed_line(&row, 1), "| 4 | failed | - | - | - | - | - | - | failed |");
        let row = Row {
            n: 1,
            ex_first: false,
            mutex: Err("gone".into()),
            ex: Ok(figures(100, 0)),
            mixed: Ok(Figures {
                conversions: 20,
                deadlocks: 3,
                ..figures(300, 0)
            }),
        };
        assert_eq!(
            ex_line(&row, 0),
            "| 1 | mutex | failed | 50 | - | failed | - | - | failed | - | failed / 1.00 |"
        );
        assert_eq!(mixed_line(&row, 0), "| 1 | 150 | - | 10 | 3 | - | 1.00 | 0 |");
        let row = Row {
            ex: Ok(Figures {
                server: vec![2.0, 0.5],
                ..figures(100, 0)
            }),
            ..row
        };
        assert_eq!(
            ex_line(&row, 2),
            "| 1 | mutex | failed | 50 | - | failed | - | - | failed | - | failed / 1.00 | failed / 2.00 | failed / 0.50 |"
        );
        let header = ex_header(&["flushes".to_owned()]);
        let (names, rule) = header.split_once('\n').expect("two lines");
        assert!(names.ends_with("| flushes/grant: mutex / EX |"), "{names}");
        assert_eq!(names.matches('|').count(), rule.matches('|').count());
        let header = mixed_header(&["flushes".to_owned(), "statements".to_owned()]);
        let (names, rule) = header.split_once('\n').expect("two lines");
        assert!(names.ends_with("| flushes/grant | statements/grant |"), "{names}");
        assert_eq!(names.matches('|').count(), rule.matches('|').count());
    }

    /// The whole section against the memory backend, briefly: every
    /// measurement runs without failing, grants (counted from the start to
    /// the stop, so that a slow window cannot empty it), and no
    /// incompatible holds are seen. No timing is judged.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_section_runs_on_the_memory_backend() {
        let memory = Arc::new(lockline::MemoryBackend::new());
        let backend: Arc<dyn lockline::backend::Backend> = memory.clone();
        let args = ModesArgs {
            contenders: vec![1, 3],
            seconds: 0.3,
            ..ModesArgs::default()
        };
        let rows = run("memory", &args, "test/", || Client::from_arc(backend.clone()))
            .await
            .expect("section");
        assert_eq!(rows.iter().map(|row| row.n).collect::<Vec<_>>(), [1, 3]);
        for row in rows {
            for (what, outcome) in [("mutex", &row.mutex), ("EX", &row.ex), ("mixed", &row.mixed)] {
                let figures = outcome
                    .as_ref()
                    .unwrap_or_else(|e| panic!("N = {}, {what}: {e}", row.n));
                assert!(figures.outcome.all_grants > 0, "N = {}, {what}: no grants", row.n);
            }
            assert_eq!(row.mixed.expect("mixed").overlaps, 0);
        }
        assert!(memory.keys("test/modes-mixed-1").is_empty(), "nothing left behind");
    }
}
