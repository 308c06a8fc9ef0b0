//! `lockline`: hold a distributed lock while a command runs.
//!
//! ```text
//! lockline lock --etcd http://127.0.0.1:2379 [--ttl SECS] [--timeout SECS] NAME [COMMAND [ARGS...]]
//! lockline lock --zookeeper 127.0.0.1:2181[/chroot] [--ttl SECS] [--timeout SECS] NAME [COMMAND [ARGS...]]
//! ```
//!
//! Waits in line for the lock `NAME`, prints its key on standard output, then:
//!
//! - with a command: runs it with `LOCKLINE_KEY` and `LOCKLINE_TOKEN` (the
//!   fencing token) in its environment, releases the lock when it exits and
//!   exits with its status;
//! - without: holds the lock until SIGINT or SIGTERM, then releases it.
//!
//! If the lock is lost while held (session expired, key deleted), the command
//! gets SIGTERM and `lockline` exits with status 3. A `--timeout` that runs out
//! exits with status 2; bad arguments and unreachable clusters with status 1.
//!
//! On etcd it uses the Go `concurrency` layout: it excludes and is excluded by
//! `etcdctl lock NAME` and Go's `concurrency.Mutex` on the same name. On
//! ZooKeeper it uses Curator's layout under the path `/NAME`, and queues with
//! Curator's `InterProcessMutex` and kazoo's `Lock` there.

use std::process::ExitCode;
use std::time::Duration;

use lockline::{Client, Error, MutexGuard, SessionOptions};
use lockline_etcd::Etcd;
use lockline_zookeeper::ZooKeeper;
use tokio::signal::unix::{signal, SignalKind};

const USAGE: &str = "usage: lockline lock (--etcd ENDPOINT[,ENDPOINT...] | --zookeeper HOST:PORT[,...][/CHROOT]) \
                     [--ttl SECS] [--timeout SECS] NAME [COMMAND [ARGS...]]";

/// Exit status when the lock was lost while held.
const LOST: u8 = 3;
/// Exit status when `--timeout` ran out.
const TIMED_OUT: u8 = 2;

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
    match run(args).await {
        Ok(code) => code,
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

async fn run(args: Args) -> lockline::Result<ExitCode> {
    let client = match &args.server {
        Server::Etcd(endpoints) => Client::new(Etcd::new(endpoints.clone())),
        Server::ZooKeeper(hosts) => Client::new(ZooKeeper::new(hosts.clone())),
    };
    let session = client.session_with(SessionOptions::new().with_ttl(args.ttl)).await?;
    let mutex = session.mutex(&args.name)?;
    let guard = match args.timeout {
        Some(timeout) => mutex.lock_timeout(timeout).await?,
        None => mutex.lock().await?,
    };
    println!("{}", guard.key());
    eprintln!("lockline: holding {} with fencing token {}", guard.key(), guard.token());
    let code = if args.command.is_empty() {
        hold_until_signal(&guard).await
    } else {
        run_command(&guard, &args.command).await
    };
    if code == ExitCode::from(LOST) {
        let _ = session.close().await;
        return Ok(code);
    }
    guard.release().await?;
    session.close().await?;
    Ok(code)
}

async fn hold_until_signal(guard: &MutexGuard) -> ExitCode {
    let (Ok(mut interrupt), Ok(mut terminate)) = (signal(SignalKind::interrupt()), signal(SignalKind::terminate()))
    else {
        eprintln!("lockline: cannot listen for signals");
        return ExitCode::from(1);
    };
    tokio::select! {
        _ = interrupt.recv() => ExitCode::SUCCESS,
        _ = terminate.recv() => ExitCode::SUCCESS,
        () = guard.lost() => {
            eprintln!("lockline: lock lost");
            ExitCode::from(LOST)
        }
    }
}

async fn run_command(guard: &MutexGuard, command: &[String]) -> ExitCode {
    let (program, arguments) = match command.split_first() {
        Some(split) => split,
        None => return ExitCode::SUCCESS,
    };
    let mut child = match tokio::process::Command::new(program)
        .args(arguments)
        .env("LOCKLINE_KEY", guard.key())
        .env("LOCKLINE_TOKEN", guard.token().to_string())
        .spawn()
    {
        Ok(child) => child,
        Err(error) => {
            eprintln!("lockline: cannot run {program:?}: {error}");
            return ExitCode::from(1);
        }
    };
    tokio::select! {
        status = child.wait() => match status {
            Ok(status) => ExitCode::from(status.code().and_then(|c| u8::try_from(c).ok()).unwrap_or(1)),
            Err(error) => {
                eprintln!("lockline: waiting for {program:?} failed: {error}");
                ExitCode::from(1)
            }
        },
        () = guard.lost() => {
            eprintln!("lockline: lock lost; stopping {program:?}");
            if let Some(pid) = child.id() {
                let _ = tokio::process::Command::new("kill").arg(pid.to_string()).status().await;
            }
            let _ = child.wait().await;
            ExitCode::from(LOST)
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
}
