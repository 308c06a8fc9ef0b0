//! One run, step by step: start the servers and the contenders, let the
//! nemesis deal faults, wind the contenders down, read back what the store
//! holds, and check the history ([`run`]). The winding down, the read-back
//! and the history's text are modules of their own.

mod history_text;
mod read_back;
mod wind_down;

use std::path::Path;
use std::time::Duration;

use crate::checker::{add_violation, check, Bounds, Report};
use crate::clock::{now_ns, ns};
use crate::contender::ContenderArgs;
use crate::fleet::Fleet;
use crate::history::{History, Record};
use crate::nemesis::{Fault, FaultKind, Nemesis};
use crate::servers::Servers;
use crate::Config;

use self::history_text::write_history;
use self::read_back::read_back_writes;
use self::wind_down::{close_contenders, entries_left, live_orphans, stop_contenders};

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
    let mut report = check(&record.events, &record.writes, &faults, bounds(config, run_start, stop));
    report.orphans = orphans.len();
    report.writes_read_back = read_back;
    add_run_findings(&mut report, config, &record, &orphans, &disagreements, &problems);
    write_history(&record, &faults, run_start, &logs.path().join("history.txt"));
    drop(record);
    keep_logs_when_wanted(config, logs, &mut report);
    Ok(report)
}

/// What the checker is given besides the history: the checked window
/// (from `run_start` to `stop`, ns) and the configuration's bounds.
fn bounds(config: &Config, run_start: u64, stop: u64) -> Bounds {
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
    }
}

/// Adds what the runner found itself to the checker's report: entries
/// left behind, the store's disagreements with the writers' answers,
/// unreadable lines, and what went wrong with the run.
fn add_run_findings(
    report: &mut Report,
    config: &Config,
    record: &Record,
    orphans: &[String],
    disagreements: &[String],
    problems: &[String],
) {
    if !orphans.is_empty() {
        add_violation(report, "entries left behind:", orphans);
    }
    if !disagreements.is_empty() {
        add_violation(
            report,
            if config.modes {
                "the fenced register in the lock's store: answers it disagrees with, or a stale write committed after a newer one:"
            } else {
                "the database's fenced register: answers it disagrees with, or a stale write committed after a newer one:"
            },
            disagreements,
        );
    }
    if !record.garbled.is_empty() {
        add_violation(report, "unreadable lines from contenders:", &record.garbled);
    }
    if !problems.is_empty() {
        add_violation(report, "the run itself went wrong:", problems);
    }
}

/// Keeps the contenders' logs and the history when something is wrong or
/// the configuration asks for them, and says where.
fn keep_logs_when_wanted(config: &Config, logs: tempfile::TempDir, report: &mut Report) {
    if report.violations.is_empty() && !config.keep_logs {
        return;
    }
    let kept = logs.keep();
    let line = format!("contender logs and history kept in {}", kept.display());
    if report.violations.is_empty() {
        eprintln!("{line}");
    } else {
        report.violations.push(line);
    }
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
fn start(config: &Config, history: &History, address: &str, logs: &Path) -> Result<(Servers, Fleet), String> {
    let servers = start_servers(config)?;
    let fleet = start_contenders(config, &servers, history, address, logs)?;
    await_first_grant(config, history, &fleet)?;
    say(
        config,
        &format!(
            "{} contenders running; nemesis for {:?}",
            config.contenders, config.duration
        ),
    );

    Ok((servers, fleet))
}

/// Starts the backend's servers (with a standby when the run fails over).
fn start_servers(config: &Config) -> Result<Servers, String> {
    let failover = config.kinds().contains(&FaultKind::Failover);
    let servers =
        Servers::start(config.backend, 3, failover).map_err(|e| format!("{} servers: {e}", config.backend))?;
    say(config, &format!("{} up", servers.describe()));
    Ok(servers)
}

/// Starts the contender processes, each reaching the members through its
/// own proxies and reporting to the history at `address`.
fn start_contenders(
    config: &Config,
    servers: &Servers,
    history: &History,
    address: &str,
    logs: &Path,
) -> Result<Fleet, String> {
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
    Fleet::start(
        config.contenders,
        &config.program,
        &members,
        endpoints,
        template,
        logs,
        history.clone(),
    )
    .map_err(|e| format!("contenders: {e}"))
}

/// Waits up to a minute for a first grant; without one, the contenders'
/// logs say why.
fn await_first_grant(config: &Config, history: &History, fleet: &Fleet) -> Result<(), String> {
    if history.wait_until(Duration::from_secs(60), |r| r.last_grant().is_some()) {
        return Ok(());
    }
    let tails: Vec<String> = (0..config.contenders).map(|s| fleet.log_tail(s, 800)).collect();
    Err(format!(
        "no contender was granted the lock within 60 s; logs:\n{}",
        tails.join("\n")
    ))
}

/// Lets the nemesis deal faults for the configured time; returns the faults
/// dealt and what went wrong with the run itself.
fn deal_faults(
    config: &Config,
    servers: &mut Servers,
    fleet: &mut Fleet,
    history: &History,
    run_start: u64,
) -> (Vec<Fault>, Vec<String>) {
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
