//! The randomized fault test's short run, one per backend (a little over a minute
//! each): contender processes, a fenced register, a seeded nemesis, a checker.
//! The long run is the `lockline-faults` binary (see the README).

use std::path::PathBuf;
use std::sync::Mutex;

use lockline_faults::{run, Backend, Config};

/// The runs take turns: each wants the machine to itself for its timing.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn short_run(backend: Backend) {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let program = PathBuf::from(env!("CARGO_BIN_EXE_lockline-faults"));
    let config = Config::short(backend, program);
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
