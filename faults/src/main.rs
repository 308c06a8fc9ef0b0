//! `lockline-faults`: lockline's randomized fault test, long mode.
//!
//! ```text
//! lockline-faults [--backend etcd|zookeeper|postgres|mariadb|redis|redis-volatile|all[,...]] [--seconds N] [--seed N]
//!                 [--contenders N] [--ttl SECS] [--slack SECS] [--faults KIND,...] [--lock-delay SECS]
//!                 [--modes] [--quiet] [--keep-logs]
//! ```
//!
//! `--backend` takes one backend, several separated by commas, `all`, or
//! `both` (etcd and ZooKeeper, as before PostgreSQL was added). `redis` is
//! one Redis server with an append-only file fsynced on every write;
//! `redis-volatile` one without persistence, where a restart forgets every
//! session (the checker then allows what docs/redis.md says Redis cannot
//! promise, and nothing more: see docs/faults.md).
//! `--faults` limits the nemesis to some kinds: pause-holder, kill-holder,
//! kill-waiter, blackhole-holder and cut-holder on every backend;
//! kill-member, pause-member and kill-quorum on etcd and ZooKeeper;
//! kill-server and pause-server on PostgreSQL, MariaDB and Redis;
//! silence-one-connection and failover on PostgreSQL and MariaDB; crash-backend
//! on PostgreSQL. Unless named, a backend gets every kind it can have,
//! cut-holder on PostgreSQL, MariaDB and Redis only.
//! `--lock-delay SECS` gives the contenders a lock-delay; the checker then
//! also checks that a contender already waiting when a holder lost the lock
//! to a fault is granted it no sooner than the delay after the fault.
//! `--modes` runs lock-mode contenders instead of mutex ones: each takes a
//! lock-mode resource in random modes and converts while it holds, PW and
//! EX holders writing a register in the lock's own store with
//! `write_if_held`; the checker judges holders by their modes (see
//! docs/faults.md).
//!
//! Starts the servers, the contenders and the nemesis, prints the figures and
//! every violation, and exits with status 1 when there is one. The defaults
//! are the test suite's short run (every backend, 36 s, seed 1, 5 contenders,
//! TTL 3 s). `lockline-faults contender ...` is the contender program the run
//! starts; it is not meant to be run by hand.

use std::process::ExitCode;
use std::time::Duration;

use lockline_faults::contender::{self, ContenderArgs};
use lockline_faults::{run, Backend, Config};

const USAGE: &str =
    "usage: lockline-faults [--backend etcd|zookeeper|postgres|mariadb|redis|redis-volatile|all[,...]] \
                     [--seconds N] [--seed N] [--contenders N] [--ttl SECS] [--slack SECS] [--faults KIND,...] \
                     [--lock-delay SECS] [--modes] [--quiet] [--keep-logs]
  --backend   one or more of etcd, zookeeper, postgres, mariadb, redis, redis-volatile (comma-separated), all,
              or both (etcd and zookeeper); default all. redis: one server with appendonly yes and
              appendfsync always; redis-volatile: one server without persistence (a restart forgets
              every session; the checks relaxed then are told in docs/faults.md)
  --faults    pause-holder, kill-holder, kill-waiter, blackhole-holder, cut-holder (every backend);
              kill-member, pause-member, kill-quorum (etcd, zookeeper);
              kill-server, pause-server (postgres, mariadb, redis, redis-volatile);
              silence-one-connection, failover (postgres, mariadb); crash-backend (postgres);
              default: every kind the backend can have (cut-holder on postgres, mariadb and redis only)
  --lock-delay the contenders' lock-delay (seconds, fractions allowed, at most 60; default 0): the
              checker then also checks that no contender waiting when a holder lost the lock to a
              fault was granted it sooner than the delay after the fault (unless a contender
              ahead of it gave up meanwhile, which hands on at once)
  --modes     lock-mode contenders: a resource taken in random modes (NL, CR, CW, PR, PW, EX), converted
              up and down while held; PW and EX holders write a register in the lock's own store with
              write_if_held; the checker flags holders in incompatible modes side by side (not with
              --lock-delay)";

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1).peekable();
    if args.peek().map(String::as_str) == Some("contender") {
        args.next();
        return contend(args);
    }
    let (backends, config) = match parse(args) {
        Ok(parsed) => parsed,
        Err(message) => {
            eprintln!("{message}");
            return ExitCode::from(2);
        }
    };
    let mut failed = false;
    for backend in backends {
        let config = Config {
            backend,
            ..config.clone()
        };
        println!(
            "== {backend}{}: {:?} of faults, seed {}, {} contenders, TTL {:?}, recovery bound {:?}",
            if config.modes { " (lock modes)" } else { "" },
            config.duration,
            config.seed,
            config.contenders,
            config.ttl,
            config.recovery_bound()
        );
        match run(&config) {
            Ok(report) => {
                print!("{report}");
                failed |= !report.violations.is_empty();
            }
            Err(error) => {
                println!("could not run: {error}");
                failed = true;
            }
        }
    }
    if failed {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

fn parse(mut args: impl Iterator<Item = String>) -> Result<(Vec<Backend>, Config), String> {
    let program = std::env::current_exe().map_err(|e| format!("cannot find this program: {e}"))?;
    let mut config = Config::short(Backend::Etcd, program);
    let mut backends = Backend::ALL.to_vec();
    while let Some(flag) = args.next() {
        if flag == "--quiet" {
            config.verbose = false;
            continue;
        }
        if flag == "--keep-logs" {
            config.keep_logs = true;
            continue;
        }
        if flag == "--modes" {
            config.modes = true;
            continue;
        }
        if flag == "-h" || flag == "--help" {
            return Err(USAGE.to_owned());
        }
        let value = args.next().ok_or_else(|| format!("{flag} needs a value\n{USAGE}"))?;
        let number = |value: &str| -> Result<u64, String> {
            value
                .parse()
                .map_err(|_| format!("{flag}: {value:?} is not a whole number"))
        };
        match flag.as_str() {
            "--backend" => {
                backends = match value.as_str() {
                    "all" => Backend::ALL.to_vec(),
                    "both" => vec![Backend::Etcd, Backend::ZooKeeper],
                    list => list.split(',').map(str::parse).collect::<Result<_, _>>()?,
                }
            }
            "--seconds" => config.duration = Duration::from_secs(number(&value)?),
            "--seed" => config.seed = number(&value)?,
            "--contenders" => config.contenders = usize::try_from(number(&value)?.clamp(2, 64)).unwrap_or(5),
            "--ttl" => config.ttl = Duration::from_secs(number(&value)?.max(1)),
            "--slack" => config.slack = Duration::from_secs(number(&value)?),
            "--lock-delay" => {
                let secs: f64 = value
                    .parse()
                    .ok()
                    .filter(|s: &f64| (0.0..=60.0).contains(s))
                    .ok_or_else(|| format!("--lock-delay: {value:?} is not a number of seconds from 0 to 60"))?;
                config.lock_delay = Duration::from_secs_f64(secs);
            }
            "--faults" => {
                config.kinds = value.split(',').map(str::parse).collect::<Result<_, _>>()?;
            }
            other => return Err(format!("unknown option {other:?}\n{USAGE}")),
        }
    }
    if config.modes && !config.lock_delay.is_zero() {
        return Err(format!(
            "--modes and --lock-delay: the lock-delay check judges mutex grants only\n{USAGE}"
        ));
    }
    for backend in &backends {
        if let Some(kind) = config.kinds.iter().find(|k| !k.applies_to(*backend)) {
            return Err(format!("--faults: {kind} cannot be injected on {backend}\n{USAGE}"));
        }
    }
    Ok((backends, config))
}

fn contend(args: impl Iterator<Item = String>) -> ExitCode {
    let args = match ContenderArgs::parse(args) {
        Ok(args) => args,
        Err(message) => {
            eprintln!("contender: {message}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("contender: no runtime: {error}");
            return ExitCode::from(1);
        }
    };
    match runtime.block_on(contender::run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("contender: {error}");
            ExitCode::from(1)
        }
    }
}
