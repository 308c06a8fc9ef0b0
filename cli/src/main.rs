//! `lockline`: hold a distributed lock while a command runs.
//!
//! ```text
//! lockline lock --etcd http://127.0.0.1:2379 [--ttl SECS] [--timeout SECS] [--kill-after SECS] NAME [COMMAND [ARGS...]]
//! lockline lock --zookeeper 127.0.0.1:2181[/chroot] [--ttl SECS] [--timeout SECS] [--kill-after SECS] NAME [COMMAND [ARGS...]]
//! ```
//!
//! Waits in line for the lock `NAME`, prints its key on standard output, then:
//!
//! - with a command: runs it with `LOCKLINE_KEY` and `LOCKLINE_TOKEN` (the
//!   fencing token) in its environment, releases the lock when it exits and
//!   exits with its status (128 + N when it was killed by signal N);
//! - without: holds the lock until SIGINT, SIGTERM, SIGHUP or SIGQUIT, then
//!   releases it and exits 0.
//!
//! Exit statuses: the command's own; 3 when the lock was lost while held; 2
//! when `--timeout` ran out; 1 for bad arguments, unreachable clusters and
//! other errors; 128 + N when `lockline` itself got signal N (SIGINT, SIGTERM,
//! SIGHUP, SIGQUIT) while waiting for the lock or while the command ran.
//!
//! # The command dies with the lock
//!
//! The command is started as the leader of a process group of its own, and
//! everything it starts stays in that group unless it leaves it. When
//! `lockline` gets SIGINT, SIGTERM, SIGHUP or SIGQUIT, or the lock is lost
//! (session expired or declared lost, key deleted), the whole group gets
//! SIGTERM (and SIGCONT), then SIGKILL once the `--kill-after` grace has passed
//! (default 2 s; `0` sends SIGKILL at once; a second signal to `lockline` cuts
//! the grace short). When the command exits by itself, whatever it left
//! running in its group is stopped the same way. No external program is run
//! for this.
//!
//! - On a signal or a normal exit the lock is released only once no process of
//!   the group runs any more, so the next holder never overlaps with it; then
//!   `lockline` exits with the command's status or 128 + its own signal.
//! - On a lost lock the lock is already gone (someone else may hold it): the
//!   group is signalled at once, before anything else, and `lockline` exits 3
//!   once the group is gone.
//! - On Linux the command is started with `PR_SET_PDEATHSIG` = SIGKILL: if
//!   `lockline` is killed outright (SIGKILL, OOM killer), the command itself
//!   is killed by the kernel. If `lockline` died before that was set, the
//!   command is not started.
//! - SIGTSTP (Ctrl-Z) pauses the group (SIGSTOP) together with `lockline`;
//!   SIGCONT (`fg`) resumes both. Nothing renews the session meanwhile, so a
//!   long pause loses the lock, and the command is then stopped as above.
//! - While `lockline` waits for the lock, SIGINT, SIGTERM, SIGHUP or SIGQUIT
//!   cancel the wait, remove its entry and close the session before `lockline`
//!   exits, so later contenders are not held up until its TTL runs out.
//!
//! What is not guaranteed:
//!
//! - When `lockline` is killed with SIGKILL only the command's own process
//!   (the direct child) is killed: processes it started (a shell's children)
//!   keep running, and the lock is freed by the server only when the session's
//!   TTL runs out.
//! - SIGSTOP sent to `lockline` itself cannot be caught: the command runs on
//!   while `lockline` is stopped.
//! - Processes that leave the group (`setsid`, `setpgid`, daemons that detach)
//!   are never signalled.
//! - The parent-death signal is cleared when the command execs a set-user-ID
//!   or set-group-ID program or one with file capabilities.
//! - A process that cannot die (stuck in uninterruptible sleep) keeps
//!   `lockline`, and the lock, waiting.
//! - On a lost lock the command runs on, unprotected, for up to the grace.
//! - The command's group is not the terminal's foreground job: a command that
//!   reads from the terminal is stopped by SIGTTIN. `lockline` is meant for
//!   scripts, not interactive programs.
//!
//! On etcd it uses the Go `concurrency` layout: it excludes and is excluded by
//! `etcdctl lock NAME` and Go's `concurrency.Mutex` on the same name. On
//! ZooKeeper it uses Curator's layout under the path `/NAME`, and queues with
//! Curator's `InterProcessMutex` and kazoo's `Lock` there.

mod group;
mod signals;

use std::ffi::OsStr;
use std::process::ExitCode;
use std::time::Duration;

use lockline::{Client, Error, MutexGuard, Session, SessionOptions};
use lockline_etcd::Etcd;
use lockline_zookeeper::ZooKeeper;

use crate::group::{signal_status, ProcessGroup};
use crate::signals::{signal_name, StopSignals, SuspendSignal};

const USAGE: &str = "usage: lockline lock (--etcd ENDPOINT[,ENDPOINT...] | --zookeeper HOST:PORT[,...][/CHROOT]) \
                     [--ttl SECS] [--timeout SECS] [--kill-after SECS] NAME [COMMAND [ARGS...]]";

/// Exit status when the lock was lost while held.
const LOST: u8 = 3;
/// Exit status when `--timeout` ran out.
const TIMED_OUT: u8 = 2;
/// How long the command's group has between SIGTERM and SIGKILL by default.
const DEFAULT_KILL_AFTER: Duration = Duration::from_secs(2);
/// How long a `lockline` signalled while waiting waits for its entry to be
/// removed before it closes the session anyway.
const CLEANUP_TIMEOUT: Duration = Duration::from_secs(5);
/// How long `lockline` tries to close the session of a lost lock.
const LOST_CLOSE_TIMEOUT: Duration = Duration::from_secs(1);
/// The longest `--kill-after` accepted: a grace is meant to be short, since on
/// a lost lock the command runs unprotected during it.
const MAX_KILL_AFTER: Duration = Duration::from_secs(3600);

#[derive(Debug, PartialEq)]
enum Server {
    Etcd(Vec<String>),
    ZooKeeper(String),
}

#[derive(Debug)]
struct Args {
    server: Server,
    ttl: Duration,
    timeout: Option<Duration>,
    kill_after: Duration,
    name: String,
    command: Vec<String>,
}

fn seconds(flag: &str, value: Option<String>) -> Result<Duration, String> {
    let value = value.ok_or_else(|| format!("{flag} needs a value"))?;
    let secs: f64 = value
        .parse()
        .map_err(|_| format!("{flag}: {value:?} is not a number of seconds"))?;
    Duration::try_from_secs_f64(secs).map_err(|_| format!("{flag}: {value:?} is not a valid duration"))
}

fn parse(mut args: impl Iterator<Item = String>) -> Result<Args, String> {
    match args.next().as_deref() {
        Some("lock") => {}
        Some("-h" | "--help") | None => return Err(USAGE.to_owned()),
        Some(other) => return Err(format!("unknown command {other:?}\n{USAGE}")),
    }
    let mut server = None;
    let mut ttl = Duration::from_secs(10);
    let mut timeout = None;
    let mut kill_after = DEFAULT_KILL_AFTER;
    let mut rest = Vec::new();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--etcd" => {
                let list = args.next().ok_or("--etcd needs endpoints")?;
                let endpoints: Vec<String> = list.split(',').filter(|e| !e.is_empty()).map(str::to_owned).collect();
                if endpoints.is_empty() {
                    return Err("--etcd needs endpoints".into());
                }
                server = Some(Server::Etcd(endpoints));
            }
            "--zookeeper" => {
                let hosts = args.next().ok_or("--zookeeper needs a connect string")?;
                server = Some(Server::ZooKeeper(hosts));
            }
            "--ttl" => ttl = seconds("--ttl", args.next())?,
            "--timeout" => timeout = Some(seconds("--timeout", args.next())?),
            "--kill-after" => {
                kill_after = seconds("--kill-after", args.next())?;
                if kill_after > MAX_KILL_AFTER {
                    return Err(format!("--kill-after: at most {} seconds", MAX_KILL_AFTER.as_secs()));
                }
            }
            "--" => {
                rest.extend(args.by_ref());
                break;
            }
            _ if arg.starts_with("--") => return Err(format!("unknown option {arg:?}\n{USAGE}")),
            _ => {
                rest.push(arg);
                rest.extend(args.by_ref());
                break;
            }
        }
    }
    let server = server.ok_or_else(|| format!("--etcd or --zookeeper is required\n{USAGE}"))?;
    let mut rest = rest.into_iter();
    let name = rest.next().ok_or_else(|| format!("NAME is required\n{USAGE}"))?;
    Ok(Args {
        server,
        ttl,
        timeout,
        kill_after,
        name,
        command: rest.collect(),
    })
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = match parse(std::env::args().skip(1)) {
        Ok(args) => args,
        Err(message) => {
            eprintln!("{message}");
            return ExitCode::from(1);
        }
    };
    // From here on SIGINT, SIGTERM, SIGHUP and SIGQUIT no longer kill
    // `lockline` on the spot: each step below decides what they mean.
    let mut signals = match StopSignals::listen() {
        Ok(signals) => signals,
        Err(error) => {
            eprintln!("lockline: cannot listen for SIGINT, SIGTERM, SIGHUP and SIGQUIT: {error}");
            return ExitCode::from(1);
        }
    };
    match run(args, &mut signals).await {
        Ok(code) => ExitCode::from(code),
        Err(Error::Timeout { name, waited }) => {
            eprintln!("lockline: {name:?} not acquired within {waited:?}");
            ExitCode::from(TIMED_OUT)
        }
        Err(error) => {
            eprintln!("lockline: {error}");
            let mut source = std::error::Error::source(&error);
            while let Some(cause) = source {
                eprintln!("  caused by: {cause}");
                source = cause.source();
            }
            ExitCode::from(1)
        }
    }
}

async fn run(args: Args, signals: &mut StopSignals) -> lockline::Result<u8> {
    let client = match &args.server {
        Server::Etcd(endpoints) => Client::new(Etcd::new(endpoints.clone())),
        Server::ZooKeeper(hosts) => Client::new(ZooKeeper::new(hosts.clone())),
    };
    let session = tokio::select! {
        session = client.session_with(SessionOptions::new().with_ttl(args.ttl)) => session?,
        // Nothing is queued yet; a session being opened ends with its TTL.
        signal = signals.recv() => return Ok(signal_status(signal)),
    };
    match hold(&args, &session, signals).await {
        Ok(Held::Released(code)) => {
            session.close().await?;
            Ok(code)
        }
        Ok(Held::Cancelled(signal)) => {
            // The acquire was dropped, which removes its entry in the
            // session's background: wait for that (a second signal cuts it
            // short), then close the session, which removes whatever is left
            // on the server now rather than when its TTL runs out.
            let flushed = tokio::select! {
                flushed = tokio::time::timeout(CLEANUP_TIMEOUT, session.flush()) => flushed.is_ok(),
                _ = signals.recv() => false,
            };
            let closed = session.close().await;
            if !flushed || closed.is_err() {
                let reason = closed.err().map(|e| format!(": {e}")).unwrap_or_default();
                eprintln!(
                    "lockline: leaving the queue of {:?} was not confirmed; its entry goes when the session's TTL runs out{reason}",
                    args.name
                );
            }
            Ok(signal_status(signal))
        }
        // The session was closed while the command's group was stopped.
        Ok(Held::Lost) => Ok(LOST),
        Err(error) => {
            let _ = session.close().await;
            Err(error)
        }
    }
}

/// How holding the lock ended.
enum Held {
    /// Released (or never taken); exit with this status.
    Released(u8),
    /// A signal came while waiting in line; the acquire was cancelled.
    Cancelled(libc::c_int),
    /// The lock was lost while held; the session is closed.
    Lost,
}

async fn hold(args: &Args, session: &Session, signals: &mut StopSignals) -> lockline::Result<Held> {
    let mutex = session.mutex(&args.name)?;
    let acquire = async {
        match args.timeout {
            Some(timeout) => mutex.lock_timeout(timeout).await,
            None => mutex.lock().await,
        }
    };
    let guard = tokio::select! {
        guard = acquire => guard?,
        signal = signals.recv() => {
            eprintln!("lockline: got {} while waiting for {:?}; leaving the queue", signal_name(signal), args.name);
            return Ok(Held::Cancelled(signal));
        }
    };
    println!("{}", guard.key());
    eprintln!("lockline: holding {} with fencing token {}", guard.key(), guard.token());
    let code = if args.command.is_empty() {
        tokio::select! {
            _ = signals.recv() => 0,
            () = guard.lost() => {
                eprintln!("lockline: lock lost");
                let _ = tokio::time::timeout(LOST_CLOSE_TIMEOUT, session.close()).await;
                return Ok(Held::Lost);
            }
        }
    } else {
        match run_command(&guard, session, &args.command, args.kill_after, signals).await {
            Some(code) => code,
            None => return Ok(Held::Lost),
        }
    };
    guard.release().await?;
    Ok(Held::Released(code))
}

/// The next SIGTSTP, when `lockline` listens for it.
async fn suspended(suspend: &mut Option<SuspendSignal>) {
    match suspend {
        Some(suspend) => suspend.recv().await,
        None => std::future::pending().await,
    }
}

/// Runs the command in its own process group and returns the status to exit
/// with once no process of the group runs any more, or `None` when the lock
/// was lost (the session is then closed).
async fn run_command(
    guard: &MutexGuard,
    session: &Session,
    command: &[String],
    kill_after: Duration,
    signals: &mut StopSignals,
) -> Option<u8> {
    let Some((program, arguments)) = command.split_first() else {
        return Some(0);
    };
    let token = guard.token().to_string();
    let env = [
        ("LOCKLINE_KEY", OsStr::new(guard.key())),
        ("LOCKLINE_TOKEN", OsStr::new(&token)),
    ];
    // Listen before the command exists, so that a Ctrl-Z right after it
    // starts is not lockline's default stop, which would leave it running.
    let mut suspend = match SuspendSignal::listen() {
        Ok(suspend) => Some(suspend),
        Err(error) => {
            eprintln!("lockline: cannot listen for SIGTSTP; Ctrl-Z will not pause the command: {error}");
            None
        }
    };
    let mut group = match ProcessGroup::spawn(program, arguments, env) {
        Ok(group) => group,
        Err(error) => {
            eprintln!("lockline: cannot run {program:?}: {error}");
            return Some(1);
        }
    };
    enum Event {
        Ended(group::Ended),
        Signal(libc::c_int),
        Lost,
    }
    let event = loop {
        tokio::select! {
            ended = group.wait() => break Event::Ended(ended),
            signal = signals.recv() => break Event::Signal(signal),
            () = guard.lost() => break Event::Lost,
            () = suspended(&mut suspend) => group.pause_with_lockline(),
        }
    };
    // A second signal while the group is being stopped sends SIGKILL at once.
    let hurry = async {
        signals.recv().await;
    };
    match event {
        Event::Ended(ended) => {
            // What the command left running in its group does not outlive
            // the lock either.
            group.stop(kill_after, hurry).await;
            Some(ended.code())
        }
        Event::Signal(signal) => {
            eprintln!(
                "lockline: got {}; the lock is released once the command is gone",
                signal_name(signal)
            );
            group.stop(kill_after, hurry).await;
            Some(signal_status(signal))
        }
        Event::Lost => {
            eprintln!("lockline: lock lost; stopping the command");
            // The server may be out of reach: closing is a courtesy here, it
            // must not hold up the exit.
            let close = async {
                let _ = tokio::time::timeout(LOST_CLOSE_TIMEOUT, session.close()).await;
            };
            tokio::join!(group.stop(kill_after, hurry), close);
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::parse;

    fn args(line: &str) -> Result<super::Args, String> {
        parse(line.split_whitespace().map(str::to_owned))
    }

    #[test]
    fn parses_options_name_and_command() {
        let parsed = args("lock --etcd http://a:1,http://b:2 --ttl 3 --timeout 0.5 jobs/x echo hi").expect("parse");
        assert_eq!(
            parsed.server,
            super::Server::Etcd(vec!["http://a:1".into(), "http://b:2".into()])
        );
        assert_eq!(parsed.ttl.as_secs(), 3);
        assert_eq!(parsed.timeout.map(|t| t.as_millis()), Some(500));
        assert_eq!(parsed.name, "jobs/x");
        assert_eq!(parsed.command, ["echo", "hi"]);
    }

    #[test]
    fn refuses_bad_arguments() {
        assert!(args("lock jobs/x").is_err(), "no endpoint");
        assert!(args("lock --etcd , x").is_err(), "empty endpoint list");
        let zk = args("lock --zookeeper h:1/apps x").expect("parse");
        assert_eq!(zk.server, super::Server::ZooKeeper("h:1/apps".into()));
        assert!(args("lock --etcd http://a:1").is_err(), "no name");
        assert!(args("lock --etcd http://a:1 --ttl soon x").is_err());
        assert!(args("lock --etcd http://a:1 --ttl -1 x").is_err());
        assert!(args("unlock x").is_err());
        assert!(args("lock --etcd http://a:1 --bogus x").is_err());
    }

    #[test]
    fn kill_after_is_a_grace_of_at_most_an_hour() {
        let default = args("lock --etcd http://a:1 x sleep 9").expect("parse");
        assert_eq!(default.kill_after, super::DEFAULT_KILL_AFTER);
        let given = args("lock --etcd http://a:1 --kill-after 0.25 x sleep 9").expect("parse");
        assert_eq!(given.kill_after.as_millis(), 250);
        let at_once = args("lock --etcd http://a:1 --kill-after 0 x sleep 9").expect("parse");
        assert!(at_once.kill_after.is_zero());
        for bad in ["-1", "soon", "NaN", "inf", "3601"] {
            let line = format!("lock --etcd http://a:1 --kill-after {bad} x sleep 9");
            assert!(args(&line).is_err(), "--kill-after {bad} accepted");
        }
        assert!(args("lock --etcd http://a:1 --kill-after").is_err(), "no value");
    }
}
