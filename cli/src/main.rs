//! `lockline`: hold a distributed lock while a command runs.
//!
//! ```text
//! lockline lock --etcd http://127.0.0.1:2379 [--ttl SECS] [--timeout SECS] [--kill-after SECS] NAME [COMMAND [ARGS...]]
//! lockline lock --zookeeper 127.0.0.1:2181[/chroot] [--ttl SECS] [--timeout SECS] [--kill-after SECS] NAME [COMMAND [ARGS...]]
//! ```
//!
//! On secure clusters: `--cacert FILE`, `--cert FILE`, `--key FILE` (TLS, both
//! backends); `--user NAME[:PASSWORD]`, `--password PASSWORD` and
//! `--marker-prefix PREFIX` (etcd); `--zk-auth digest|sasl:USER:PASSWORD` and
//! `--zk-acl open|creator` (ZooKeeper). etcdctl's `ETCDCTL_ENDPOINTS`,
//! `ETCDCTL_CACERT`, `ETCDCTL_CERT`, `ETCDCTL_KEY`, `ETCDCTL_USER` and
//! `ETCDCTL_PASSWORD` fill in what the flags leave out (etcd only), and
//! `LOCKLINE_ZK_AUTH` the ZooKeeper credentials. Passwords are never printed.
//!
//! Waits in line for the lock `NAME`, prints its key on standard output, then:
//!
//! - with a command: runs it with `LOCKLINE_KEY` and `LOCKLINE_TOKEN` (the
//!   fencing token) in its environment, releases the lock when it exits and
//!   exits with its status (128 + N when it was killed by signal N);
//! - without: holds the lock until SIGINT, SIGTERM, SIGHUP or SIGQUIT, then
//!   releases it and exits 0.
//!
//! # Exit statuses
//!
//! - The command's own status, or 128 + N when it was killed by signal N,
//!   when it exits by itself.
//! - 128 + N when `lockline` itself got signal N (SIGINT, SIGTERM, SIGHUP,
//!   SIGQUIT) while waiting for the lock or while the command ran. Without a
//!   command, such a signal is the normal way out: 0.
//! - 3 when the lock was lost while held: without a command, before a
//!   signal came; with one, while any process of its group still ran, whatever
//!   started the stop. A loss while the group is being stopped after a
//!   signal or after the command's exit therefore gives 3, not 128 + N nor
//!   the command's status: some of its processes ran without the lock. A
//!   loss `lockline` notices only once the group is gone (when releasing)
//!   changes nothing: nothing ran without the lock, and it is only reported
//!   on standard error. When a loss and another event are seen at the same
//!   moment, the loss counts as first (`lockline` then cannot tell whether
//!   the command still ran without the lock).
//! - 2 when `--timeout` ran out.
//! - 1 for bad arguments, unreachable clusters and other errors, a release
//!   that fails for another reason than a loss among them (the key then goes
//!   when the session's TTL runs out).
//!
//! A second signal while the group is being stopped only cuts the grace
//! short; it does not change the status. A signal and a grant seen at the
//! same moment count as a signal while waiting: the wait is cancelled and the
//! entry removed.
//!
//! # Output
//!
//! The held key goes to standard output, diagnostics to standard error. Both
//! are written by a thread of their own, so that stopping the command's
//! group, releasing the lock and removing a waiter's entry never wait on or
//! depend on a write: a closed pipe, a full device or a reader that stopped
//! reading loses lines, never changes what happens to the lock, the command
//! or the exit status, and never makes `lockline` panic. A key that cannot
//! be printed is reported on standard error and the command runs all the
//! same. On its way out `lockline` waits at most a second for its last lines.
//!
//! # The command dies with the lock
//!
//! The command is started as the leader of a process group of its own, and
//! everything it starts stays in that group unless it leaves it. When
//! `lockline` gets SIGINT, SIGTERM, SIGHUP or SIGQUIT, or the lock is lost
//! (session expired or declared lost, key deleted), the whole group gets
//! SIGTERM (and SIGCONT), then SIGKILL once the `--kill-after` grace has passed
//! (default 2 s; a second signal to `lockline` cuts the grace short). With
//! `--kill-after 0` the group gets SIGKILL at once and no SIGTERM at all, so
//! no handler of the command runs. When the command exits by itself, whatever
//! it left running in its group is stopped the same way. No external program
//! is run for this.
//!
//! - On a signal or a normal exit the lock is released only once no process of
//!   the group runs any more, so the next holder never overlaps with it; then
//!   `lockline` exits with the command's status or 128 + its own signal (or 3,
//!   see above, if the lock was lost meanwhile).
//! - On a lost lock the lock is already gone (someone else may hold it): the
//!   group is signalled at once, before anything else (any diagnostic, the
//!   session's close), and `lockline` exits 3 once the group is gone. The
//!   same holds when the loss comes while the group is already being stopped;
//!   its SIGKILL then comes when the grace that began with its SIGTERM ends.
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

#[macro_use]
mod output;
mod group;
mod signals;

use std::ffi::OsStr;
use std::process::ExitCode;
use std::time::Duration;

use lockline::{Client, Error, MutexGuard, Session, SessionOptions, Tls};
use lockline_etcd::Etcd;
use lockline_zookeeper::{AclPolicy, ZooKeeper};

use crate::group::{signal_status, ProcessGroup};
use crate::signals::{signal_name, StopSignals, SuspendSignal};

const USAGE: &str = "usage: lockline lock (--etcd ENDPOINT[,ENDPOINT...] | --zookeeper HOST:PORT[,...][/CHROOT]) \
                     [--ttl SECS] [--timeout SECS] [--kill-after SECS] \
                     [--cacert FILE [--cert FILE --key FILE]] \
                     [--user NAME[:PASSWORD] [--password PASSWORD]] [--marker-prefix PREFIX] \
                     [--zk-auth digest|sasl:USER:PASSWORD] [--zk-acl open|creator] \
                     NAME [COMMAND [ARGS...]]";

/// What `--help` prints, on standard output.
const HELP: &str = "\
lockline: hold a distributed lock on etcd or ZooKeeper while a command runs.

usage: lockline lock [OPTIONS] NAME [--] [COMMAND [ARGS...]]
       lockline --help | --version

Waits in line for the lock NAME, prints its key, then runs COMMAND with the
lock held and releases it when COMMAND exits (without COMMAND: holds the lock
until SIGINT, SIGTERM, SIGHUP or SIGQUIT). `--` ends the options.

Server (one of):
  --etcd URL[,URL...]           etcd endpoints, http[s]://HOST:PORT (or ETCDCTL_ENDPOINTS)
  --zookeeper HOST:PORT[,...][/CHROOT]
                                a ZooKeeper connect string

Options:
  --ttl SECS                    session TTL (default 10)
  --timeout SECS                give up waiting after SECS (exit 2)
  --kill-after SECS             grace between SIGTERM and SIGKILL for the command's group (default 2; 0: SIGKILL at once)
  --cacert FILE                 TLS: the CA that signed the servers' certificates
  --cert FILE --key FILE        TLS: a client certificate and its key
  --user NAME[:PASSWORD]        etcd user
  --password PASSWORD           etcd password
  --marker-prefix PREFIX        etcd: where markers of cancelled acquires go (default __lockline_abandoned__/)
  --zk-auth digest|sasl:USER:PASSWORD
                                ZooKeeper credentials
  --zk-acl open|creator         ZooKeeper ACL policy for the nodes lockline creates (default open)
  -h, --help                    this help
  -V, --version                 the version

Read from the environment (flags win): ETCDCTL_ENDPOINTS, ETCDCTL_CACERT,
ETCDCTL_CERT, ETCDCTL_KEY, ETCDCTL_USER, ETCDCTL_PASSWORD (etcd only), and
LOCKLINE_ZK_AUTH (ZooKeeper credentials, digest|sasl:USER:PASSWORD).

Set for COMMAND: LOCKLINE_KEY (the held key) and LOCKLINE_TOKEN (the fencing
token: pass it to whatever the lock protects, which refuses lower tokens).

Exit statuses:
  COMMAND's own status, or 128+N when it was killed by signal N
  0     without COMMAND, released after SIGINT, SIGTERM, SIGHUP or SIGQUIT
  1     lockline's own failure: bad arguments, unreachable cluster, refused
        credentials or permission, or another error
  2     --timeout ran out
  3     the lock was lost while held
  128+N lockline itself got signal N while waiting or while COMMAND ran
";

/// Whether the arguments ask for help or the version (before the lock
/// name or `--`): what to print on standard output.
fn informational(args: &[String]) -> Option<String> {
    let rest = match args.first().map(String::as_str) {
        Some("lock") => &args[1..],
        Some("help") => return Some(HELP.to_owned()),
        _ => args,
    };
    let mut rest = rest.iter().map(String::as_str);
    while let Some(arg) = rest.next() {
        match arg {
            "-h" | "--help" => return Some(HELP.to_owned()),
            "-V" | "--version" => return Some(format!("lockline {}\n", env!("CARGO_PKG_VERSION"))),
            // Past the options: NAME, COMMAND and its own flags.
            "--" => return None,
            _ if TAKES_VALUE.contains(&arg) => {
                rest.next();
            }
            _ if !arg.starts_with('-') => return None,
            _ => {}
        }
    }
    None
}

/// The options followed by a value of their own.
const TAKES_VALUE: [&str; 13] = [
    "--etcd",
    "--zookeeper",
    "--ttl",
    "--timeout",
    "--kill-after",
    "--cacert",
    "--cert",
    "--key",
    "--user",
    "--password",
    "--marker-prefix",
    "--zk-auth",
    "--zk-acl",
];

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

/// TLS and credentials, from flags and `ETCDCTL_*` variables. Passwords
/// never appear in `Debug` output or in any message.
#[derive(Default, PartialEq)]
struct Security {
    cacert: Option<String>,
    cert: Option<String>,
    key: Option<String>,
    /// etcd user and password.
    user: Option<(String, String)>,
    marker_prefix: Option<String>,
    /// ZooKeeper scheme (`digest` or `sasl`), user and password.
    zk_auth: Option<(String, String, String)>,
    zk_acl: Option<AclPolicy>,
}

impl std::fmt::Debug for Security {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Security")
            .field("cacert", &self.cacert)
            .field("cert", &self.cert)
            .field("key", &self.key)
            .field("user", &self.user.as_ref().map(|(name, _)| name))
            .field("marker_prefix", &self.marker_prefix)
            .field(
                "zk_auth",
                &self.zk_auth.as_ref().map(|(scheme, user, _)| (scheme, user)),
            )
            .field("zk_acl", &self.zk_acl)
            .finish()
    }
}

#[derive(Debug)]
struct Args {
    server: Server,
    security: Security,
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

/// The value of `flag`, or an error naming the flag (never the value: it
/// may be a password).
fn value(flag: &str, value: Option<String>) -> Result<String, String> {
    value.ok_or_else(|| format!("{flag} needs a value"))
}

/// A user name and the password found for it.
fn user(name: &str, password: Option<String>, flag: &str) -> Result<(String, String), String> {
    if name.is_empty() {
        return Err(format!("{flag}: the user name is empty"));
    }
    let password = password
        .ok_or_else(|| format!("{flag} {name}: no password; give {name}:PASSWORD, --password or ETCDCTL_PASSWORD"))?;
    Ok((name.to_owned(), password))
}

/// `SCHEME:USER:PASSWORD` for ZooKeeper (`digest` or `sasl`).
fn zk_auth(spec: &str) -> Result<(String, String, String), String> {
    let mut parts = spec.splitn(3, ':');
    let (scheme, user, password) = (parts.next(), parts.next(), parts.next());
    match (scheme, user, password) {
        (Some(scheme @ ("digest" | "sasl")), Some(user), Some(password)) if !user.is_empty() => {
            Ok((scheme.to_owned(), user.to_owned(), password.to_owned()))
        }
        (Some(scheme), _, _) if scheme != "digest" && scheme != "sasl" => Err(format!(
            "--zk-auth: unknown scheme {scheme:?}; use digest:USER:PASSWORD or sasl:USER:PASSWORD"
        )),
        _ => Err("--zk-auth: expected digest:USER:PASSWORD or sasl:USER:PASSWORD".to_owned()),
    }
}

fn parse(args: impl Iterator<Item = String>, env: impl Fn(&str) -> Option<String>) -> Result<Args, String> {
    let env = |name: &str| env(name).filter(|v| !v.is_empty());
    let mut args = args;
    match args.next().as_deref() {
        Some("lock") => {}
        Some("-h" | "--help") | None => return Err(USAGE.to_owned()),
        Some(other) => return Err(format!("unknown command {other:?}\n{USAGE}")),
    }
    let mut security = Security::default();
    let mut user_spec = None;
    let mut password = None;
    let mut server = None;
    let mut ttl = Duration::from_secs(10);
    let mut timeout = None;
    let mut kill_after = DEFAULT_KILL_AFTER;
    let mut rest = Vec::new();
    while let Some(arg) = args.next() {
        // `--flag=value` (etcdctl's form) is `--flag value`. The value is
        // never echoed: it may be a password.
        let (arg, inline) = match arg.split_once('=') {
            Some((flag, value)) if flag.starts_with("--") => (flag.to_owned(), Some(value.to_owned())),
            _ => (arg, None),
        };
        let mut args = inline.into_iter().chain(args.by_ref());
        match arg.as_str() {
            "--etcd" => {
                let list = args.next().ok_or("--etcd needs endpoints")?;
                let endpoints: Vec<String> = list.split(',').filter(|e| !e.is_empty()).map(str::to_owned).collect();
                if endpoints.is_empty() {
                    return Err("--etcd needs endpoints".into());
                }
                if matches!(server, Some(Server::ZooKeeper(_))) {
                    return Err("--etcd and --zookeeper cannot be used together: pick one server".into());
                }
                server = Some(Server::Etcd(endpoints));
            }
            "--zookeeper" => {
                let hosts = args.next().ok_or("--zookeeper needs a connect string")?;
                if matches!(server, Some(Server::Etcd(_))) {
                    return Err("--etcd and --zookeeper cannot be used together: pick one server".into());
                }
                server = Some(Server::ZooKeeper(hosts));
            }
            "--cacert" => security.cacert = Some(value("--cacert", args.next())?),
            "--cert" => security.cert = Some(value("--cert", args.next())?),
            "--key" => security.key = Some(value("--key", args.next())?),
            "--user" => user_spec = Some(value("--user", args.next())?),
            "--password" => password = Some(value("--password", args.next())?),
            "--marker-prefix" => security.marker_prefix = Some(value("--marker-prefix", args.next())?),
            "--zk-auth" => security.zk_auth = Some(zk_auth(&value("--zk-auth", args.next())?)?),
            "--zk-acl" => {
                security.zk_acl = Some(match value("--zk-acl", args.next())?.as_str() {
                    "open" => AclPolicy::Open,
                    "creator" => AclPolicy::Creator,
                    other => return Err(format!("--zk-acl: {other:?} is not open or creator")),
                });
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
    // etcdctl's variables fill in what the flags left out, for etcd only.
    let server = match server {
        Some(server) => server,
        None => match env("ETCDCTL_ENDPOINTS") {
            Some(list) => Server::Etcd(list.split(',').filter(|e| !e.is_empty()).map(str::to_owned).collect()),
            None => return Err(format!("--etcd, --zookeeper or ETCDCTL_ENDPOINTS is required\n{USAGE}")),
        },
    };
    if matches!(server, Server::Etcd(_)) {
        security.cacert = security.cacert.or_else(|| env("ETCDCTL_CACERT"));
        security.cert = security.cert.or_else(|| env("ETCDCTL_CERT"));
        security.key = security.key.or_else(|| env("ETCDCTL_KEY"));
        user_spec = user_spec.or_else(|| env("ETCDCTL_USER"));
        if let Some(spec) = &user_spec {
            // --password, then NAME:PASSWORD, then ETCDCTL_PASSWORD.
            let (name, inline) = match spec.split_once(':') {
                Some((name, inline)) => (name, Some(inline.to_owned())),
                None => (spec.as_str(), None),
            };
            let password = password.take().or(inline).or_else(|| env("ETCDCTL_PASSWORD"));
            security.user = Some(user(name, password, "--user")?);
        } else if password.is_some() {
            return Err("--password needs --user NAME".to_owned());
        }
        if security.zk_auth.is_some() || security.zk_acl.is_some() {
            return Err("--zk-auth and --zk-acl are for --zookeeper; with etcd use --user".to_owned());
        }
    } else {
        security.zk_auth = match security.zk_auth {
            Some(auth) => Some(auth),
            None => env("LOCKLINE_ZK_AUTH").map(|spec| zk_auth(&spec)).transpose()?,
        };
        if user_spec.is_some() || password.is_some() || security.marker_prefix.is_some() {
            return Err(
                "--user, --password and --marker-prefix are for --etcd; with ZooKeeper use --zk-auth".to_owned(),
            );
        }
    }
    if security.cert.is_some() != security.key.is_some() {
        return Err("--cert and --key go together".to_owned());
    }
    if security.cert.is_some() && security.cacert.is_none() {
        return Err("--cert and --key need --cacert (the CA that signed the servers' certificates)".to_owned());
    }
    let mut rest = rest.into_iter();
    let name = rest.next().ok_or_else(|| format!("NAME is required\n{USAGE}"))?;
    Ok(Args {
        server,
        security,
        ttl,
        timeout,
        kill_after,
        name,
        command: rest.collect(),
    })
}

/// How long `lockline` waits, on its way out, for its last lines to be
/// written; a stuck standard output or error cannot hold it up for longer.
const OUTPUT_TIMEOUT: Duration = Duration::from_secs(1);

fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    if let Some(text) = informational(&argv) {
        use std::io::Write;
        let mut stdout = std::io::stdout().lock();
        return match stdout.write_all(text.as_bytes()).and_then(|()| stdout.flush()) {
            Ok(()) => ExitCode::SUCCESS,
            Err(_) => ExitCode::from(1),
        };
    }
    let code = match parse(argv.into_iter(), |name| std::env::var(name).ok()) {
        Ok(args) => start(args),
        Err(message) => {
            note!("{message}");
            1
        }
    };
    output::finish(OUTPUT_TIMEOUT);
    ExitCode::from(code)
}

/// Starts the runtime on this thread (the command must be spawned from the
/// thread that runs `main`, see [`ProcessGroup::spawn`]) and runs.
fn start(args: Args) -> u8 {
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            note!("lockline: cannot start the async runtime: {error}");
            return 1;
        }
    };
    runtime.block_on(async {
        // From here on SIGINT, SIGTERM, SIGHUP and SIGQUIT no longer kill
        // `lockline` on the spot: each step below decides what they mean.
        let mut signals = match StopSignals::listen() {
            Ok(signals) => signals,
            Err(error) => {
                note!("lockline: cannot listen for SIGINT, SIGTERM, SIGHUP and SIGQUIT: {error}");
                return 1;
            }
        };
        match run(args, &mut signals).await {
            Ok(code) => code,
            Err(Error::Timeout { name, waited }) => {
                note!("lockline: {name:?} not acquired within {waited:?}");
                TIMED_OUT
            }
            Err(error) => {
                note!("lockline: {error}");
                let mut source = std::error::Error::source(&error);
                while let Some(cause) = source {
                    note!("  caused by: {cause}");
                    source = cause.source();
                }
                1
            }
        }
    })
}

async fn run(args: Args, signals: &mut StopSignals) -> lockline::Result<u8> {
    let client = backend(&args)?;
    let session = tokio::select! {
        biased;
        // Nothing is queued yet; a session being opened ends with its TTL.
        signal = signals.recv() => return Ok(signal_status(signal)),
        session = client.session_with(SessionOptions::new().with_ttl(args.ttl)) => session?,
    };
    match hold(&args, &session, signals).await {
        Ok(Held::Released(code)) => {
            // The lock is released (or was lost only once nothing of the
            // command ran): a session that cannot be closed cleanly ends with
            // its TTL and holds nothing, so it does not change the status.
            if let Err(error) = session.close().await {
                note!("lockline: closing the session was not confirmed; it ends when its TTL runs out: {error}");
            }
            Ok(code)
        }
        Ok(Held::Cancelled(signal)) => {
            // The acquire was dropped, which removes its entry in the
            // session's background: wait for that (a second signal cuts it
            // short), then close the session, which removes whatever is left
            // on the server now rather than when its TTL runs out.
            let flushed = tokio::select! {
                biased;
                _ = signals.recv() => false,
                flushed = tokio::time::timeout(CLEANUP_TIMEOUT, session.flush()) => flushed.is_ok(),
            };
            let closed = session.close().await;
            if !flushed || closed.is_err() {
                let reason = closed.err().map(|e| format!(": {e}")).unwrap_or_default();
                note!(
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

/// The backend the arguments name, with their TLS and credentials.
fn backend(args: &Args) -> lockline::Result<Client> {
    let security = &args.security;
    let tls = match &security.cacert {
        None => None,
        Some(ca) => {
            let tls = Tls::new().with_ca_file(ca)?;
            Some(match (&security.cert, &security.key) {
                (Some(cert), Some(key)) => tls.with_client_files(cert, key)?,
                _ => tls,
            })
        }
    };
    Ok(match &args.server {
        Server::Etcd(endpoints) => {
            let mut etcd = Etcd::new(endpoints.clone());
            if let Some(tls) = tls {
                etcd = etcd.with_tls(tls);
            }
            if let Some((user, password)) = &security.user {
                etcd = etcd.with_user(user.clone(), password.clone());
            }
            if let Some(prefix) = &security.marker_prefix {
                etcd = etcd.with_marker_prefix(prefix.clone());
            }
            Client::new(etcd)
        }
        Server::ZooKeeper(hosts) => {
            let mut zk = ZooKeeper::new(hosts.clone());
            if let Some(tls) = tls {
                zk = zk.with_tls(tls);
            }
            match &security.zk_auth {
                Some((scheme, user, password)) if scheme == "sasl" => {
                    zk = zk.with_sasl_digest_md5(user.clone(), password.clone());
                }
                Some((_, user, password)) => zk = zk.with_digest(user.clone(), password.clone()),
                None => {}
            }
            if let Some(policy) = security.zk_acl {
                zk = zk.with_acl_policy(policy);
            }
            Client::new(zk)
        }
    })
}

/// How holding the lock ended.
enum Held {
    /// Released (or never taken); exit with this status.
    Released(u8),
    /// A signal came while waiting in line; the acquire was cancelled.
    Cancelled(libc::c_int),
    /// The lock was lost while held (while a process of the command's group
    /// still ran, when there was a command); the session is closed.
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
        // A signal that is pending when the lock is granted still cancels the
        // wait: dropping the acquire removes the entry, granted or not.
        biased;
        signal = signals.recv() => {
            note!("lockline: got {} while waiting for {:?}; leaving the queue", signal_name(signal), args.name);
            return Ok(Held::Cancelled(signal));
        }
        guard = acquire => guard?,
    };
    output::key(guard.key());
    note!("lockline: holding {} with fencing token {}", guard.key(), guard.token());
    let code = if args.command.is_empty() {
        tokio::select! {
            // A loss ready together with a signal counts as a loss.
            biased;
            () = guard.lost() => {
                note!("lockline: lock lost");
                close_lost(session).await;
                return Ok(Held::Lost);
            }
            _ = signals.recv() => 0,
        }
    } else {
        match run_command(&guard, session, &args.command, args.kill_after, signals).await {
            Some(code) => code,
            None => return Ok(Held::Lost),
        }
    };
    match guard.release().await {
        Ok(()) => {}
        // Lost after the command's group was gone (or, without a command,
        // after the signal): nothing ran without the lock, and there is
        // nothing left to release.
        Err(error @ (Error::SessionLost { .. } | Error::LockLost { .. })) => {
            note!("lockline: the lock was lost once the command was gone; nothing to release: {error}");
        }
        Err(error) => return Err(error),
    }
    Ok(Held::Released(code))
}

/// Closes the session of a lost lock. The server may be out of reach:
/// closing is a courtesy here and must not hold up the exit.
async fn close_lost(session: &Session) {
    let _ = tokio::time::timeout(LOST_CLOSE_TIMEOUT, session.close()).await;
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
/// was lost before that (the session is then closed).
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
            note!("lockline: cannot listen for SIGTSTP; Ctrl-Z will not pause the command: {error}");
            None
        }
    };
    if !guard.is_held() {
        note!("lockline: lock lost before the command started; not running it");
        close_lost(session).await;
        return None;
    }
    let mut group = match ProcessGroup::spawn(program, arguments, env) {
        Ok(group) => group,
        Err(error) => {
            note!("lockline: cannot run {program:?}: {error}");
            return Some(1);
        }
    };
    /// Why the command's group is stopped.
    enum Cause {
        Ended(group::Ended),
        Signal(libc::c_int),
        Lost,
    }
    let cause = loop {
        tokio::select! {
            // When several are ready at once, the loss wins (lockline cannot
            // tell whether the command still ran without the lock), then a
            // signal to lockline, then the command's exit.
            biased;
            () = guard.lost() => break Cause::Lost,
            signal = signals.recv() => break Cause::Signal(signal),
            ended = group.wait() => break Cause::Ended(ended),
            () = suspended(&mut suspend) => group.pause_with_lockline(),
        }
    };
    // The group is signalled first, before anything else: on a lost lock
    // someone else may hold it already.
    let stopping = group.start_stop(kill_after);
    // A second signal while the group is being stopped sends SIGKILL at once.
    let hurry = async {
        signals.recv().await;
    };
    let code = match cause {
        Cause::Lost => {
            note!("lockline: lock lost; stopping the command");
            tokio::join!(group.finish_stop(stopping, hurry), close_lost(session));
            return None;
        }
        Cause::Signal(signal) => {
            note!(
                "lockline: got {}; the lock is released once the command is gone",
                signal_name(signal)
            );
            signal_status(signal)
        }
        // What the command left running in its group does not outlive the
        // lock either.
        Cause::Ended(ended) => ended.code(),
    };
    // The lock may still be lost while the group is being stopped: a process
    // of the command then runs without it, and that is what `lockline`
    // reports (3), whatever started the stop. The group's SIGTERM was sent
    // already; its SIGKILL comes when the grace ends, as on any lost lock.
    let finishing = group.finish_stop(stopping, hurry);
    tokio::pin!(finishing);
    tokio::select! {
        // Both ready: the loss wins, as above.
        biased;
        () = guard.lost() => {
            note!("lockline: lock lost while the command's group was being stopped");
            tokio::join!(finishing, close_lost(session));
            None
        }
        () = &mut finishing => Some(code),
    }
}

#[cfg(test)]
mod tests {
    use super::parse;

    fn args(line: &str) -> Result<super::Args, String> {
        parse(line.split_whitespace().map(str::to_owned), |_| None)
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
    fn options_may_be_written_with_equals() {
        let parsed = args("lock --etcd=https://a:1 --cacert=ca.pem --user=alice:p=w --ttl=3 x").expect("parse");
        assert_eq!(parsed.server, super::Server::Etcd(vec!["https://a:1".into()]));
        assert_eq!(parsed.security.user, Some(("alice".into(), "p=w".into())));
        assert_eq!(parsed.ttl.as_secs(), 3);
        let Err(error) = args("lock --etcd http://a:1 --pasword=s3cret x") else {
            panic!("an unknown option was accepted");
        };
        assert!(error.contains("--pasword") && !error.contains("s3cret"), "{error}");
    }

    fn with_env(line: &str, vars: &[(&str, &str)]) -> Result<super::Args, String> {
        let vars: Vec<(String, String)> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        parse(line.split_whitespace().map(str::to_owned), move |name| {
            vars.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())
        })
    }

    #[test]
    fn takes_tls_and_credentials_from_flags_as_etcdctl_names_them() {
        let parsed =
            args("lock --etcd https://a:1 --cacert ca.pem --cert c.pem --key k.pem --user alice:pw1 x").expect("parse");
        let security = &parsed.security;
        assert_eq!(security.cacert.as_deref(), Some("ca.pem"));
        assert_eq!(security.cert.as_deref(), Some("c.pem"));
        assert_eq!(security.key.as_deref(), Some("k.pem"));
        assert_eq!(security.user, Some(("alice".into(), "pw1".into())));
        let split = args("lock --etcd https://a:1 --cacert ca.pem --user alice --password pw:2 x").expect("parse");
        assert_eq!(split.security.user, Some(("alice".into(), "pw:2".into())));
        let zk =
            args("lock --zookeeper h:1 --cacert ca.pem --zk-auth digest:bob:p:w --zk-acl creator x").expect("parse");
        assert_eq!(zk.security.zk_auth, Some(("digest".into(), "bob".into(), "p:w".into())));
        assert_eq!(zk.security.zk_acl, Some(lockline_zookeeper::AclPolicy::Creator));
    }

    #[test]
    fn honours_the_etcdctl_variables_with_flags_first() {
        let vars = [
            ("ETCDCTL_ENDPOINTS", "https://e1:2379,https://e2:2379"),
            ("ETCDCTL_CACERT", "env-ca.pem"),
            ("ETCDCTL_CERT", "env-c.pem"),
            ("ETCDCTL_KEY", "env-k.pem"),
            ("ETCDCTL_USER", "carol"),
            ("ETCDCTL_PASSWORD", "env-pw"),
        ];
        let parsed = with_env("lock x", &vars).expect("parse");
        assert_eq!(
            parsed.server,
            super::Server::Etcd(vec!["https://e1:2379".into(), "https://e2:2379".into()])
        );
        assert_eq!(parsed.security.cacert.as_deref(), Some("env-ca.pem"));
        assert_eq!(parsed.security.cert.as_deref(), Some("env-c.pem"));
        assert_eq!(parsed.security.user, Some(("carol".into(), "env-pw".into())));
        let flagged = with_env("lock --etcd https://f:1 --cacert f-ca.pem --user dave:f-pw x", &vars).expect("parse");
        assert_eq!(flagged.server, super::Server::Etcd(vec!["https://f:1".into()]));
        assert_eq!(flagged.security.cacert.as_deref(), Some("f-ca.pem"));
        assert_eq!(flagged.security.user, Some(("dave".into(), "f-pw".into())));
        // The etcd variables are not applied to ZooKeeper.
        let zk = with_env("lock --zookeeper h:1 x", &vars).expect("parse");
        assert_eq!(zk.security, super::Security::default());
        let zk = with_env("lock --zookeeper h:1 x", &[("LOCKLINE_ZK_AUTH", "sasl:eve:zpw")]).expect("parse");
        assert_eq!(zk.security.zk_auth, Some(("sasl".into(), "eve".into(), "zpw".into())));
    }

    #[test]
    fn refuses_flags_of_the_other_backend_and_half_set_credentials() {
        for line in [
            "lock --zookeeper h:1 --user a:b x",
            "lock --zookeeper h:1 --marker-prefix p/ x",
            "lock --etcd http://a:1 --zk-auth digest:a:b x",
            "lock --etcd http://a:1 --zk-acl creator x",
            "lock --etcd http://a:1 --cacert ca --cert c x",
            "lock --etcd http://a:1 --cert c --key k x",
            "lock --etcd http://a:1 --user alice x",
            "lock --etcd http://a:1 --password pw x",
            "lock --zookeeper h:1 --zk-auth world:a:b x",
            "lock --zookeeper h:1 --zk-auth digest:nopassword x",
            "lock --zookeeper h:1 --zk-acl everyone x",
        ] {
            assert!(args(line).is_err(), "accepted: {line}");
        }
    }

    #[test]
    fn never_shows_a_password() {
        let parsed = args("lock --etcd https://a:1 --cacert ca --user alice:SECRET-1 x").expect("parse");
        let shown = format!("{parsed:?}");
        assert!(shown.contains("alice") && !shown.contains("SECRET-1"), "{shown}");
        let parsed = args("lock --zookeeper h:1 --zk-auth digest:bob:SECRET-2 x").expect("parse");
        let shown = format!("{parsed:?}");
        assert!(shown.contains("bob") && !shown.contains("SECRET-2"), "{shown}");
        for line in [
            "lock --zookeeper h:1 --zk-auth bogus:bob:SECRET-3 x",
            "lock --zookeeper h:1 --user bob:SECRET-3 x",
            "lock --etcd h:1 --password SECRET-3 x",
        ] {
            let error = args(line).expect_err("refused");
            assert!(!error.contains("SECRET-3"), "{line}: {error}");
        }
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
