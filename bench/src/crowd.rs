//! A crowd on one lock: many contenders, spread over several processes.
//!
//! The harness deals in processes, arguments and lines, so that it needs no
//! lock library: a crowd example re-runs its own executable
//! ([`std::env::current_exe`]) as P child processes, each started with
//! [`CHILD_FLAG`], its share of the contenders, the run's number and the
//! example's own arguments (a server address, say). Each child opens its
//! contenders (each its own client and session) and then follows the parent,
//! line by line on its standard input and output:
//!
//! | child says | parent answers | when |
//! |---|---|---|
//! | `ready` | `go` (to all) | every child has its sessions |
//! | `queued` | `window START END` (to all) | every contender of every child has appended an entry |
//! | `counts G W R`, `grant TOKEN GRANTED RELEASE_STARTED` ..., `done` | | after END |
//!
//! Times are nanoseconds since the UNIX epoch ([`unix_nanos`]):
//! `CLOCK_REALTIME` is one clock for every process on a machine. `counts`
//! are the grants, wakeups and releases the child's clients counted within
//! the window; each `grant` line is one grant within the window: its fencing
//! token, when `lock()` returned, and when its holder began to release.
//!
//! The parent merges every child's grants, sorts them by token (a FIFO lock
//! grants in token order), and takes each handoff's latency as the next
//! grant's time minus the previous holder's release start. Holds that
//! overlap (a grant before its predecessor began to release) are counted:
//! they would be a broken lock, or clocks that disagree.

use std::fmt;
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use lockline_testkit::spawn_tied_to_this_process;

use crate::latency::{ms, Latencies};

type Result<T> = std::io::Result<T>;

/// The first argument of a child process.
pub const CHILD_FLAG: &str = "--crowd-child";

/// How long children may take to open their sessions, and to queue.
const SETUP_TIMEOUT: Duration = Duration::from_secs(180);
/// How long after the window children may take to report, and to exit.
const REPORT_TIMEOUT: Duration = Duration::from_secs(120);
/// From the parent's `window` line to the window's start.
const WINDOW_LEAD: Duration = Duration::from_millis(500);

/// Now, in nanoseconds since the UNIX epoch.
pub fn unix_nanos() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| u64::try_from(since.as_nanos()).unwrap_or(u64::MAX))
}

fn invalid(message: impl Into<String>) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, message.into())
}

/// One grant, as a child records it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GrantRecord {
    /// The grant's fencing token.
    pub token: u64,
    /// When `lock()` returned ([`unix_nanos`]).
    pub granted_ns: u64,
    /// When the holder began to release ([`unix_nanos`]).
    pub release_started_ns: u64,
}

/// Counters of a child's clients (or the sum over children).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CrowdCounts {
    /// Grants.
    pub grants: u64,
    /// Queued contenders woken because the entry they waited on went away.
    pub wakeups: u64,
    /// Releases.
    pub releases: u64,
}

impl CrowdCounts {
    /// What was counted between `before` and `self`.
    pub fn since(self, before: CrowdCounts) -> CrowdCounts {
        CrowdCounts {
            grants: self.grants.saturating_sub(before.grants),
            wakeups: self.wakeups.saturating_sub(before.wakeups),
            releases: self.releases.saturating_sub(before.releases),
        }
    }

    fn add(self, other: CrowdCounts) -> CrowdCounts {
        CrowdCounts {
            grants: self.grants + other.grants,
            wakeups: self.wakeups + other.wakeups,
            releases: self.releases + other.releases,
        }
    }
}

/// The measured window, in nanoseconds since the UNIX epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    /// Start (inclusive).
    pub start_ns: u64,
    /// End (exclusive).
    pub end_ns: u64,
}

impl Window {
    /// How long until the window starts (zero once it has).
    pub fn until_start(&self) -> Duration {
        Duration::from_nanos(self.start_ns.saturating_sub(unix_nanos()))
    }

    /// How long until the window ends (zero once it has).
    pub fn until_end(&self) -> Duration {
        Duration::from_nanos(self.end_ns.saturating_sub(unix_nanos()))
    }

    /// Whether `ns` is within the window.
    pub fn contains(&self, ns: u64) -> bool {
        (self.start_ns..self.end_ns).contains(&ns)
    }

    /// The window's length in seconds.
    pub fn seconds(&self) -> f64 {
        self.end_ns.saturating_sub(self.start_ns) as f64 / 1e9
    }
}

/// This process, when it was started as a crowd child.
#[derive(Debug)]
pub struct CrowdChild {
    /// How many contenders this child runs.
    pub contenders: usize,
    /// The run's number (distinct per run in one program run: name the lock
    /// after it).
    pub run: usize,
    /// The arguments the parent's example passed on.
    pub args: Vec<String>,
}

impl CrowdChild {
    /// `Some` when this process was started as a crowd child
    /// (`CHILD_FLAG CONTENDERS RUN ARGS...`).
    ///
    /// # Errors
    ///
    /// When the child arguments are malformed.
    pub fn from_env() -> Result<Option<CrowdChild>> {
        Self::parse(std::env::args().skip(1))
    }

    fn parse(args: impl IntoIterator<Item = String>) -> Result<Option<CrowdChild>> {
        let mut args = args.into_iter();
        if args.next().as_deref() != Some(CHILD_FLAG) {
            return Ok(None);
        }
        let mut number = |what: &str| {
            args.next()
                .and_then(|n| n.parse().ok())
                .ok_or_else(|| invalid(format!("{CHILD_FLAG} needs {what}")))
        };
        let contenders = number("a contender count")?;
        let run = number("a run number")?;
        Ok(Some(CrowdChild {
            contenders,
            run,
            args: args.collect(),
        }))
    }

    fn say(&self, line: &str) -> Result<()> {
        let mut out = std::io::stdout().lock();
        writeln!(out, "{line}")?;
        out.flush()
    }

    fn hear(&self) -> Result<String> {
        let mut line = String::new();
        if std::io::stdin().read_line(&mut line)? == 0 {
            return Err(invalid("the crowd's parent closed this child's input"));
        }
        Ok(line.trim_end().to_owned())
    }

    /// Tells the parent that this child's contenders have their sessions,
    /// and waits (blocking this thread) until every child has.
    ///
    /// # Errors
    ///
    /// When the parent is gone or says something else.
    pub fn ready(&self) -> Result<()> {
        self.say("ready")?;
        match self.hear()?.as_str() {
            "go" => Ok(()),
            other => Err(invalid(format!("expected `go` from the crowd's parent, got {other:?}"))),
        }
    }

    /// Tells the parent that every contender of this child has queued, and
    /// waits (blocking this thread) for the measured window.
    ///
    /// # Errors
    ///
    /// When the parent is gone or says something else.
    pub fn queued(&self) -> Result<Window> {
        self.say("queued")?;
        let line = self.hear()?;
        parse_window(&line).ok_or_else(|| invalid(format!("expected `window START END`, got {line:?}")))
    }

    /// Reports the window's counts and the grants within it.
    ///
    /// # Errors
    ///
    /// When standard output is closed.
    pub fn report(&self, counts: CrowdCounts, records: &[GrantRecord], window: Window) -> Result<()> {
        let mut out = BufWriter::new(std::io::stdout().lock());
        writeln!(out, "counts {} {} {}", counts.grants, counts.wakeups, counts.releases)?;
        for record in records.iter().filter(|r| window.contains(r.granted_ns)) {
            writeln!(
                out,
                "grant {} {} {}",
                record.token, record.granted_ns, record.release_started_ns
            )?;
        }
        writeln!(out, "done")?;
        out.flush()
    }
}

fn parse_window(line: &str) -> Option<Window> {
    let mut words = line.split_whitespace();
    if words.next() != Some("window") {
        return None;
    }
    let start_ns = words.next()?.parse().ok()?;
    let end_ns = words.next()?.parse().ok()?;
    Some(Window { start_ns, end_ns })
}

/// A line of a child's report.
#[derive(Debug, PartialEq, Eq)]
enum ReportLine {
    Counts(CrowdCounts),
    Grant(GrantRecord),
    Done,
}

fn parse_report_line(line: &str) -> Option<ReportLine> {
    let mut words = line.split_whitespace();
    let kind = words.next()?;
    let mut numbers = || words.next().and_then(|w| w.parse::<u64>().ok());
    match kind {
        "counts" => Some(ReportLine::Counts(CrowdCounts {
            grants: numbers()?,
            wakeups: numbers()?,
            releases: numbers()?,
        })),
        "grant" => Some(ReportLine::Grant(GrantRecord {
            token: numbers()?,
            granted_ns: numbers()?,
            release_started_ns: numbers()?,
        })),
        "done" => Some(ReportLine::Done),
        _ => None,
    }
}

/// Every child's grants merged.
#[derive(Debug, Clone, Default)]
struct Merged {
    /// Grants within the window.
    granted: usize,
    handoff: Latencies,
    overlaps: usize,
    duplicate_tokens: usize,
}

/// Sorts the grants within `window` by token and measures each handoff.
fn merge(mut records: Vec<GrantRecord>, window: Window) -> Merged {
    records.retain(|r| window.contains(r.granted_ns));
    records.sort_unstable_by_key(|r| r.token);
    let mut merged = Merged {
        granted: records.len(),
        ..Merged::default()
    };
    for pair in records.windows(2) {
        let (before, next) = (pair[0], pair[1]);
        if before.token == next.token {
            merged.duplicate_tokens += 1;
        } else if next.granted_ns < before.release_started_ns {
            merged.overlaps += 1;
        } else {
            merged
                .handoff
                .push(Duration::from_nanos(next.granted_ns - before.release_started_ns));
        }
    }
    merged
}

/// How `contenders` are spread over `processes` (as evenly as can be).
fn shares(contenders: usize, processes: usize) -> Vec<usize> {
    let processes = processes.clamp(1, contenders.max(1));
    (0..processes)
        .map(|i| contenders / processes + usize::from(i < contenders % processes))
        .collect()
}

/// What one crowd run measured.
#[derive(Debug, Clone)]
pub struct CrowdResult {
    /// Child processes.
    pub processes: usize,
    /// Contenders over all of them.
    pub contenders: usize,
    /// The window's length.
    pub seconds: f64,
    /// The clients' counters within the window, summed over children.
    pub counts: CrowdCounts,
    /// Grants within the window (from the records).
    pub granted: usize,
    /// Handoff latency: each grant's time minus its predecessor's release start.
    pub handoff: Latencies,
    /// Grants that came before their predecessor (by token) began to release.
    pub overlaps: usize,
    /// Grants that carried the token of another.
    pub duplicate_tokens: usize,
}

impl CrowdResult {
    /// Grants per second within the window.
    pub fn grants_per_sec(&self) -> f64 {
        self.granted as f64 / self.seconds
    }

    /// Client-counted wakeups per release within the window.
    pub fn wakeups_per_release(&self) -> f64 {
        self.counts.wakeups as f64 / self.counts.releases.max(1) as f64
    }

    fn p99_ms(&self) -> f64 {
        self.handoff.quantile(0.99).map_or(f64::NAN, ms)
    }
}

/// One crowd run: `contenders` spread over `processes` children of this
/// program, measured for `seconds` once all have queued.
#[derive(Debug, Clone)]
pub struct Crowd {
    /// Child processes.
    pub processes: usize,
    /// Contenders over all of them.
    pub contenders: usize,
    /// The run's number, passed to each child ([`CrowdChild::run`]).
    pub run: usize,
    /// The window's length.
    pub seconds: f64,
    /// Arguments passed on to each child ([`CrowdChild::args`]).
    pub args: Vec<String>,
}

struct Children {
    procs: Vec<(Child, Option<ChildStdin>)>,
    lines: mpsc::Receiver<(usize, Option<String>)>,
}

impl Children {
    fn spawn(crowd: &Crowd) -> Result<Children> {
        let exe = std::env::current_exe()?;
        let (tx, lines) = mpsc::channel();
        let mut procs = Vec::new();
        for (i, share) in shares(crowd.contenders, crowd.processes).into_iter().enumerate() {
            let mut command = Command::new(&exe);
            command
                .arg(CHILD_FLAG)
                .arg(share.to_string())
                .arg(crowd.run.to_string())
                .args(&crowd.args)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit());
            let mut child = spawn_tied_to_this_process(command)?;
            let stdout = child.stdout.take().ok_or_else(|| invalid("no child stdout"))?;
            let tx = tx.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stdout).lines().map_while(std::result::Result::ok) {
                    if tx.send((i, Some(line))).is_err() {
                        return;
                    }
                }
                let _ = tx.send((i, None));
            });
            let stdin = child.stdin.take();
            procs.push((child, stdin));
        }
        Ok(Children { procs, lines })
    }

    fn tell_all(&mut self, line: &str) -> Result<()> {
        for (i, (_, stdin)) in self.procs.iter_mut().enumerate() {
            let stdin = stdin
                .as_mut()
                .ok_or_else(|| invalid(format!("crowd child {i}: input closed")))?;
            writeln!(stdin, "{line}")?;
            stdin.flush()?;
        }
        Ok(())
    }

    /// The next line of any child before `deadline`, or `None` when that
    /// child closed its output.
    fn next(&mut self, deadline: Instant, waiting_for: &str) -> Result<(usize, Option<String>)> {
        let left = deadline.saturating_duration_since(Instant::now());
        self.lines.recv_timeout(left).map_err(|_| {
            std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("crowd children did not send {waiting_for} in time"),
            )
        })
    }

    fn closed_early(&mut self, i: usize, waiting_for: &str) -> std::io::Error {
        invalid(format!(
            "crowd child {i} closed its output ({}) while the parent waited for {waiting_for}",
            self.exit_status(i)
        ))
    }

    /// How child `i` exited (waiting a little for it), for an error message.
    fn exit_status(&mut self, i: usize) -> String {
        let child = &mut self.procs[i].0;
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            match child.try_wait() {
                Ok(Some(status)) => return format!("it exited with {status}"),
                Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
                Ok(None) => return "it still runs".to_owned(),
                Err(error) => return format!("its status is unknown: {error}"),
            }
        }
    }

    /// Waits until every child has said `word`.
    fn expect_all(&mut self, word: &str, within: Duration) -> Result<()> {
        let deadline = Instant::now() + within;
        let mut heard = vec![false; self.procs.len()];
        while heard.iter().any(|h| !h) {
            let waiting_for = format!("`{word}`");
            let (i, line) = self.next(deadline, &waiting_for)?;
            let Some(line) = line else {
                return Err(self.closed_early(i, &waiting_for));
            };
            if line == word {
                heard[i] = true;
            } else {
                eprintln!("crowd child {i}: {line}");
            }
        }
        Ok(())
    }

    /// Reads every child's report.
    fn reports(&mut self, within: Duration) -> Result<(Vec<CrowdCounts>, Vec<GrantRecord>)> {
        let deadline = Instant::now() + within;
        let mut counts = vec![None; self.procs.len()];
        let mut done = vec![false; self.procs.len()];
        let mut records = Vec::new();
        while done.iter().any(|d| !d) {
            let (i, line) = self.next(deadline, "their reports")?;
            let Some(line) = line else {
                // A child that has reported closes its sessions and exits.
                if done[i] {
                    continue;
                }
                return Err(self.closed_early(i, "their reports"));
            };
            match parse_report_line(&line) {
                Some(ReportLine::Counts(c)) => counts[i] = Some(c),
                Some(ReportLine::Grant(record)) => records.push(record),
                Some(ReportLine::Done) => done[i] = true,
                None => eprintln!("crowd child {i}: {line}"),
            }
        }
        let counts = counts
            .into_iter()
            .enumerate()
            .map(|(i, c)| c.ok_or_else(|| invalid(format!("crowd child {i} reported no counts"))))
            .collect::<Result<_>>()?;
        Ok((counts, records))
    }

    /// Closes the children's input and waits for them to exit (killing
    /// those that do not within `within`).
    fn finish(&mut self, within: Duration) -> Result<()> {
        let deadline = Instant::now() + within;
        let mut failed = Vec::new();
        for (i, (child, stdin)) in self.procs.iter_mut().enumerate() {
            *stdin = None;
            loop {
                if let Some(status) = child.try_wait()? {
                    if !status.success() {
                        failed.push(format!("crowd child {i} exited with {status}"));
                    }
                    break;
                }
                if Instant::now() > deadline {
                    let _ = child.kill();
                    let _ = child.wait();
                    failed.push(format!("crowd child {i} did not exit; killed"));
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        match failed.is_empty() {
            true => Ok(()),
            false => Err(std::io::Error::other(failed.join("; "))),
        }
    }
}

impl Drop for Children {
    fn drop(&mut self) {
        for (child, _) in &mut self.procs {
            if matches!(child.try_wait(), Ok(None)) {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

impl Crowd {
    /// Starts the children, measures, merges their reports and waits for
    /// them to exit.
    ///
    /// # Errors
    ///
    /// When a child cannot be started, exits early or does not keep to the
    /// protocol in time (the children are killed).
    pub fn run(&self) -> Result<CrowdResult> {
        let mut children = Children::spawn(self)?;
        children.expect_all("ready", SETUP_TIMEOUT)?;
        children.tell_all("go")?;
        children.expect_all("queued", SETUP_TIMEOUT)?;
        let start_ns = unix_nanos() + WINDOW_LEAD.as_nanos() as u64;
        let window = Window {
            start_ns,
            end_ns: start_ns + Duration::from_secs_f64(self.seconds).as_nanos() as u64,
        };
        children.tell_all(&format!("window {} {}", window.start_ns, window.end_ns))?;
        let (counts, records) = children.reports(window.until_end() + REPORT_TIMEOUT)?;
        children.finish(REPORT_TIMEOUT)?;
        let merged = merge(records, window);
        Ok(CrowdResult {
            processes: children.procs.len(),
            contenders: self.contenders,
            seconds: window.seconds(),
            counts: counts.into_iter().fold(CrowdCounts::default(), CrowdCounts::add),
            granted: merged.granted,
            handoff: merged.handoff,
            overlaps: merged.overlaps,
            duplicate_tokens: merged.duplicate_tokens,
        })
    }
}

/// The options every crowd example takes:
/// `[--seconds S] [--processes P] [--crowd N] [--compare 16,64] [--warmup S]`.
#[derive(Debug, Clone, PartialEq)]
pub struct CrowdArgs {
    /// Seconds per measurement (0.1..=600, default 5).
    pub seconds: f64,
    /// Child processes of the multi-process runs (default 4).
    pub processes: usize,
    /// Contenders of the crowd run (default 1,000).
    pub crowd: usize,
    /// Contender counts measured both in one process and in `processes`
    /// (default 16 and 64); the largest is the crowd's yardstick.
    pub compare: Vec<usize>,
    /// Seconds of an unmeasured run first (to warm up a JIT-compiled server).
    pub warmup: f64,
}

impl CrowdArgs {
    /// Parses the program's arguments; `switches` are the example's own
    /// flags without a value, returned when given.
    ///
    /// # Errors
    ///
    /// A message naming the bad argument.
    pub fn from_env(switches: &[&str], warmup: f64) -> std::result::Result<(Self, Vec<String>), String> {
        Self::parse(std::env::args().skip(1), switches, warmup)
    }

    /// Parses the given arguments, as [`from_env`](Self::from_env).
    ///
    /// # Errors
    ///
    /// A message naming the bad argument.
    pub fn parse(
        args: impl IntoIterator<Item = String>,
        switches: &[&str],
        warmup: f64,
    ) -> std::result::Result<(Self, Vec<String>), String> {
        let mut parsed = CrowdArgs {
            seconds: 5.0,
            processes: 4,
            crowd: 1000,
            compare: vec![16, 64],
            warmup,
        };
        let mut given = Vec::new();
        let mut it = args.into_iter();
        while let Some(flag) = it.next() {
            if switches.contains(&flag.as_str()) {
                given.push(flag);
                continue;
            }
            let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
            let bad = || format!("bad {flag} {value:?}");
            match flag.as_str() {
                "--seconds" => {
                    parsed.seconds = value.parse().map_err(|_| bad())?;
                    if !(0.1..=600.0).contains(&parsed.seconds) {
                        return Err("--seconds must be within 0.1..=600".into());
                    }
                }
                "--warmup" => {
                    parsed.warmup = value.parse().map_err(|_| bad())?;
                    if !(0.0..=600.0).contains(&parsed.warmup) {
                        return Err("--warmup must be within 0..=600".into());
                    }
                }
                "--processes" => {
                    parsed.processes = value.parse().map_err(|_| bad())?;
                    if !(1..=64).contains(&parsed.processes) {
                        return Err("--processes must be within 1..=64".into());
                    }
                }
                "--crowd" => {
                    parsed.crowd = value.parse().map_err(|_| bad())?;
                    if !(1..=10_000).contains(&parsed.crowd) {
                        return Err("--crowd must be within 1..=10000".into());
                    }
                }
                "--compare" => {
                    parsed.compare = value
                        .split(',')
                        .map(|n| n.parse().map_err(|_| bad()))
                        .collect::<std::result::Result<_, _>>()?;
                    if parsed.compare.iter().any(|&n| n == 0 || n > 10_000) {
                        return Err("--compare counts must be within 1..=10000".into());
                    }
                }
                other => return Err(format!("unknown flag {other:?}")),
            }
        }
        Ok((parsed, given))
    }

    /// The usage line's options.
    pub const USAGE: &'static str = "[--seconds 5] [--processes 4] [--crowd 1000] [--compare 16,64] [--warmup S]";
}

impl fmt::Display for CrowdResult {
    /// A row of the table [`run_plan`] prints.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "| {} | {} | {:.0} | {:.2} | {} | {} | {} |",
            self.contenders,
            self.processes,
            self.grants_per_sec(),
            self.wakeups_per_release(),
            self.handoff.p50_p99(),
            self.handoff.len(),
            self.overlaps + self.duplicate_tokens,
        )
    }
}

/// Columns a crowd example adds to [`run_plan`]'s table: figures it
/// measures itself around each run (a server's connections, say).
pub trait ExtraColumns {
    /// The added columns' headers.
    fn headers(&self) -> Vec<String>;
    /// Called just before each run starts its children.
    fn before_run(&mut self);
    /// The added cells of the run that just ended.
    fn after_run(&mut self, result: &CrowdResult) -> Vec<String>;
}

/// No added columns.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoExtraColumns;

impl ExtraColumns for NoExtraColumns {
    fn headers(&self) -> Vec<String> {
        Vec::new()
    }

    fn before_run(&mut self) {}

    fn after_run(&mut self, _: &CrowdResult) -> Vec<String> {
        Vec::new()
    }
}

/// Runs the plan of a crowd example and prints it as it goes: the warm-up
/// (when asked for), each `compare` count in one process and in
/// `processes`, then the crowd in `processes`; then the comparisons (one
/// process against many; the crowd against the largest `compare` count).
/// `child_args` are passed on to every child.
///
/// # Errors
///
/// When a run fails ([`Crowd::run`]).
pub fn run_plan(args: &CrowdArgs, child_args: &[String]) -> Result<Vec<CrowdResult>> {
    run_plan_with(args, child_args, &mut NoExtraColumns)
}

/// [`run_plan`], with `extra` columns in the table.
///
/// # Errors
///
/// When a run fails ([`Crowd::run`]).
pub fn run_plan_with(
    args: &CrowdArgs,
    child_args: &[String],
    extra: &mut dyn ExtraColumns,
) -> Result<Vec<CrowdResult>> {
    let mut run = 0;
    let mut crowd = |contenders: usize, processes: usize, seconds: f64| {
        run += 1;
        Crowd {
            processes,
            contenders,
            run,
            seconds,
            args: child_args.to_vec(),
        }
        .run()
    };
    if args.warmup > 0.0 {
        let started = Instant::now();
        let warm = crowd(64, args.processes, args.warmup)?;
        println!(
            "warm-up (not measured): {:.1} s in all, {:.1} s of handoffs at N = 64 in {} processes",
            started.elapsed().as_secs_f64(),
            warm.seconds,
            warm.processes
        );
    }
    let headers = extra.headers();
    println!();
    println!(
        "| N | processes | grants/s | wakeups/release (client) | handoff p50 / p99 (ms) | handoffs measured | overlapping holds |{}",
        headers.iter().map(|h| format!(" {h} |")).collect::<String>()
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|{}", "---:|".repeat(headers.len()));
    let mut results = Vec::new();
    let mut measured = |contenders: usize, processes: usize, extra: &mut dyn ExtraColumns| {
        extra.before_run();
        let result = crowd(contenders, processes, args.seconds)?;
        let cells = extra.after_run(&result);
        println!(
            "{result}{}",
            cells.iter().map(|c| format!(" {c} |")).collect::<String>()
        );
        Ok::<_, std::io::Error>(result)
    };
    for &n in &args.compare {
        for processes in [1, args.processes] {
            results.push(measured(n, processes, extra)?);
        }
    }
    results.push(measured(args.crowd, args.processes, extra)?);
    println!();
    for line in comparisons(&results, args) {
        println!("{line}");
    }
    Ok(results)
}

/// The comparison lines under the table.
fn comparisons(results: &[CrowdResult], args: &CrowdArgs) -> Vec<String> {
    let find = |n: usize, p: usize| results.iter().find(|r| r.contenders == n && r.processes == p);
    let mut lines = Vec::new();
    for &n in &args.compare {
        if let (Some(one), Some(many)) = (find(n, 1), find(n, args.processes.min(n))) {
            if many.processes > 1 {
                lines.push(format!(
                    "one process vs {} at N = {n}: grants/s {:.0} vs {:.0} ({} / 1 process = {:.2}); \
                     handoff p99 {:.2} vs {:.2} ms ({:.2})",
                    many.processes,
                    one.grants_per_sec(),
                    many.grants_per_sec(),
                    many.processes,
                    many.grants_per_sec() / one.grants_per_sec(),
                    one.p99_ms(),
                    many.p99_ms(),
                    many.p99_ms() / one.p99_ms(),
                ));
            }
        }
    }
    let yardstick = args.compare.iter().copied().max();
    let crowd = results.last();
    if let (Some(n), Some(crowd)) = (yardstick, crowd) {
        if let Some(base) = find(n, crowd.processes.min(n)) {
            let ratio = crowd.p99_ms() / base.p99_ms();
            let verdict = |met: bool| if met { "met" } else { "missed" };
            lines.push(format!(
                "N = {} vs N = {n} ({} processes): handoff p99 {:.2} vs {:.2} ms = {ratio:.2} \
                 (target ≤ 1.5: {}); wakeups/release {:.2} (target ≤ 1.05: {}); grants/s {:.0} vs {:.0} ({:.2})",
                crowd.contenders,
                crowd.processes,
                crowd.p99_ms(),
                base.p99_ms(),
                verdict(ratio <= 1.5),
                crowd.wakeups_per_release(),
                verdict(crowd.wakeups_per_release() <= 1.05),
                crowd.grants_per_sec(),
                base.grants_per_sec(),
                crowd.grants_per_sec() / base.grants_per_sec(),
            ));
        }
    }
    let broken: usize = results.iter().map(|r| r.overlaps + r.duplicate_tokens).sum();
    lines.push(format!(
        "overlapping holds (a grant before its predecessor began to release, or a token granted twice): {broken}"
    ));
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(token: u64, granted_ns: u64, release_started_ns: u64) -> GrantRecord {
        GrantRecord {
            token,
            granted_ns,
            release_started_ns,
        }
    }

    #[test]
    fn merge_sorts_by_token_and_measures_handoffs_within_the_window() {
        let window = Window {
            start_ns: 1_000,
            end_ns: 10_000,
        };
        // As three children would report them, out of order.
        let records = vec![
            record(30, 3_000, 3_100),
            record(10, 500, 600), // before the window
            record(20, 1_000, 1_200),
            record(50, 6_000, 6_100),
            record(40, 4_000, 4_050),
            record(60, 10_000, 10_100), // at the end: outside
        ];
        let merged = merge(records, window);
        assert_eq!(merged.granted, 4);
        assert_eq!((merged.overlaps, merged.duplicate_tokens), (0, 0));
        // 3_000 - 1_200, 4_000 - 3_100, 6_000 - 4_050.
        assert_eq!(merged.handoff.len(), 3);
        assert_eq!(merged.handoff.quantile(0.0), Some(Duration::from_nanos(900)));
        assert_eq!(merged.handoff.quantile(0.5), Some(Duration::from_nanos(1_800)));
        assert_eq!(merged.handoff.quantile(1.0), Some(Duration::from_nanos(1_950)));
    }

    #[test]
    fn merge_counts_overlapping_holds_and_repeated_tokens() {
        let window = Window {
            start_ns: 0,
            end_ns: 100,
        };
        let merged = merge(
            vec![
                record(1, 10, 20),
                record(2, 15, 30),
                record(2, 40, 50),
                record(3, 60, 70),
            ],
            window,
        );
        assert_eq!((merged.overlaps, merged.duplicate_tokens), (1, 1));
        assert_eq!(merged.handoff.len(), 1);
    }

    #[test]
    fn report_lines_round_trip() {
        assert_eq!(
            parse_report_line("counts 5 4 5"),
            Some(ReportLine::Counts(CrowdCounts {
                grants: 5,
                wakeups: 4,
                releases: 5
            }))
        );
        assert_eq!(
            parse_report_line("grant 7 1700000000000000000 1700000000000001000"),
            Some(ReportLine::Grant(record(
                7,
                1_700_000_000_000_000_000,
                1_700_000_000_000_001_000
            )))
        );
        assert_eq!(parse_report_line("done"), Some(ReportLine::Done));
        for bad in ["", "grant 1 2", "counts x 1 2", "hello"] {
            assert_eq!(parse_report_line(bad), None, "{bad:?}");
        }
        assert_eq!(
            parse_window("window 10 20"),
            Some(Window {
                start_ns: 10,
                end_ns: 20
            })
        );
        assert_eq!(parse_window("go"), None);
    }

    #[test]
    fn contenders_spread_evenly() {
        assert_eq!(shares(1000, 4), vec![250; 4]);
        assert_eq!(shares(10, 4), vec![3, 3, 2, 2]);
        assert_eq!(shares(2, 4), vec![1, 1]);
        assert_eq!(shares(16, 1), vec![16]);
    }

    #[test]
    fn child_arguments() {
        let args = |line: &str| line.split_whitespace().map(str::to_owned).collect::<Vec<_>>();
        assert!(CrowdChild::parse(args("--seconds 5")).expect("not a child").is_none());
        let child = CrowdChild::parse(args("--crowd-child 250 3 127.0.0.1:2181"))
            .expect("child")
            .expect("a child");
        assert_eq!(
            (child.contenders, child.run, child.args),
            (250, 3, args("127.0.0.1:2181"))
        );
        assert!(CrowdChild::parse(args("--crowd-child x")).is_err());
    }

    #[test]
    fn crowd_arguments() {
        let parse = |line: &str| CrowdArgs::parse(line.split_whitespace().map(str::to_owned), &["--fast-start"], 0.0);
        let (defaults, given) = parse("").expect("defaults");
        assert_eq!(
            (defaults.seconds, defaults.processes, defaults.crowd, defaults.compare),
            (5.0, 4, 1000, vec![16, 64])
        );
        assert!(given.is_empty());
        let (custom, given) = parse("--fast-start --crowd 200 --compare 8 --warmup 3").expect("custom");
        assert_eq!((custom.crowd, custom.compare, custom.warmup), (200, vec![8], 3.0));
        assert_eq!(given, vec!["--fast-start".to_owned()]);
        for bad in ["--crowd 0", "--processes", "--compare 1,x", "--speed 2", "--seconds 0"] {
            assert!(parse(bad).is_err(), "{bad:?} accepted");
        }
    }
}
