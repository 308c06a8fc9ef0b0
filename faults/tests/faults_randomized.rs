//! The randomized fault test's short run, one per backend and mode (about 40 s
//! each, nine runs taking turns), and shorter lock-mode runs (about 30 s
//! each): contender processes, a fenced register, a seeded nemesis, a
//! checker. The long run is the `lockline-faults` binary
//! (see docs/faults.md).

use std::path::PathBuf;
use std::sync::Mutex;

use lockline_faults::nemesis::FaultKind;
use lockline_faults::{run, Backend, Config};

/// The runs take turns: each wants the machine to itself for its timing.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn short_run(backend: Backend) {
    let program = PathBuf::from(env!("CARGO_BIN_EXE_lockline-faults"));
    run_checked(Config::short(backend, program));
}

/// The lock-delay mode: holders lose the lock to faults, and no contender
/// waiting then may be granted it sooner than the lock-delay after the fault.
fn lock_delay_run(backend: Backend) {
    let program = PathBuf::from(env!("CARGO_BIN_EXE_lockline-faults"));
    let report = run_checked(Config::short_with_lock_delay(backend, program));
    assert!(
        report.lock_delay_checks >= 2,
        "too few grants after an involuntary loss to check the lock-delay:\n{report}"
    );
}

/// The faults a network and a database's operators deal a SQL session:
/// one of its connections gone silent (guard, control or wait), a failover
/// to a standby, a reset and a killed holder; each kind dealt at least once.
fn connection_and_failover_run(backend: Backend) {
    let program = PathBuf::from(env!("CARGO_BIN_EXE_lockline-faults"));
    let config = Config {
        kinds: vec![
            FaultKind::SilenceOneConnection,
            FaultKind::Failover,
            FaultKind::CutHolder,
            FaultKind::KillHolder,
        ],
        ..Config::short(backend, program)
    };
    let report = run_checked(config);
    for kind in [FaultKind::SilenceOneConnection, FaultKind::Failover] {
        assert!(
            report.faults.get(&kind.to_string()).copied().unwrap_or(0) >= 1,
            "no {kind} was dealt:\n{report}"
        );
    }
}

/// Lock-mode contenders: a resource taken in random modes, converted up and
/// down while held, PW and EX holders writing a register in the lock's own
/// store with `write_if_held`; no two holders in incompatible modes side by
/// side (but as the loss allowances let a mutex holder), tokens rising over
/// incompatible holders, the register never going back.
fn modes_run(backend: Backend) {
    let program = PathBuf::from(env!("CARGO_BIN_EXE_lockline-faults"));
    let report = run_checked(Config::short_modes(backend, program));
    assert!(
        report.overlaps_compatible > 0,
        "no two holders ever shared the resource:\n{report}"
    );
    assert!(
        report.conversions.0 > 0 && report.conversions.1 > 0,
        "conversions both ways wanted:\n{report}"
    );
    assert!(
        ["PR", "PW", "EX"]
            .iter()
            .all(|m| report.modes.get(*m).copied().unwrap_or(0) > 0),
        "PR, PW and EX grants wanted:\n{report}"
    );
    assert!(report.writes_accepted > 0, "no PW or EX holder wrote:\n{report}");
}

fn run_checked(config: Config) -> lockline_faults::checker::Report {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let backend = config.backend;
    let report = run(&config).unwrap_or_else(|error| panic!("the {backend} run could not start: {error}"));
    println!("{backend}, seed {}:\n{report}", config.seed);
    assert!(
        report.violations.is_empty(),
        "{backend}, seed {}: {} violation(s)\n{report}",
        config.seed,
        report.violations.len()
    );
    assert!(report.grants > 20, "too few grants to mean anything:\n{report}");
    assert!(report.faults.values().sum::<usize>() >= 6, "too few faults:\n{report}");
    report
}

#[test]
fn etcd_survives_the_nemesis() {
    short_run(Backend::Etcd);
}

#[test]
fn zookeeper_survives_the_nemesis() {
    short_run(Backend::ZooKeeper);
}

#[test]
fn postgres_survives_the_nemesis() {
    short_run(Backend::Postgres);
}

#[test]
fn postgres_with_a_lock_delay_survives_the_nemesis() {
    lock_delay_run(Backend::Postgres);
}

#[test]
fn postgres_survives_failovers_and_silent_connections() {
    connection_and_failover_run(Backend::Postgres);
}

#[test]
fn mariadb_survives_the_nemesis() {
    short_run(Backend::MariaDb);
}

#[test]
fn mariadb_survives_failovers_and_silent_connections() {
    connection_and_failover_run(Backend::MariaDb);
}

#[test]
fn redis_survives_the_nemesis() {
    short_run(Backend::Redis);
}

/// Redis without persistence: a restart forgets every session, and the
/// checker allows what docs/redis.md says Redis cannot promise then.
#[test]
fn redis_without_persistence_survives_the_nemesis() {
    short_run(Backend::RedisVolatile);
}

#[test]
fn etcd_in_lock_modes_survives_the_nemesis() {
    modes_run(Backend::Etcd);
}

#[test]
fn zookeeper_in_lock_modes_survives_the_nemesis() {
    modes_run(Backend::ZooKeeper);
}

#[test]
fn redis_in_lock_modes_survives_the_nemesis() {
    modes_run(Backend::Redis);
}
