//! `lockline`: distributed locks and leader election on etcd, ZooKeeper,
//! Redis, PostgreSQL or MariaDB/MySQL, for scripts.
//!
//! ```text
//! lockline lock [-s|--limit N|--mode MODE] [-n] [OPTIONS] NAME [--] [COMMAND [ARGS...]]
//! lockline elect [OPTIONS] NAME PROPOSAL [--] [COMMAND [ARGS...]]
//! lockline elect -l|--listen [OPTIONS] NAME
//! lockline list [OPTIONS] NAME
//! lockline check [OPTIONS] SEQUENCER
//! lockline completions bash|zsh|fish
//! lockline --help | --version | help [COMMAND]
//! ```
//!
//! - `lock` waits in line for the lock `NAME`, then runs `COMMAND` with the
//!   lock held and releases it when `COMMAND` exits; without a command it
//!   prints the held key and holds the lock until SIGINT, SIGTERM, SIGHUP or
//!   SIGQUIT, then releases it and exits 0. The lock is exclusive (a mutex);
//!   `-s`/`--shared` takes it shared instead (the read side of a read/write
//!   lock: `-s` holders hold together, and a `lock` without `-s` waits for
//!   them as they wait for it), `--limit N` takes one of N permits (a
//!   semaphore, as `consul lock -n N`: up to N holders at once; every
//!   contender of `NAME` gives the same N, a name is used by one recipe
//!   kind at a time, and a waiter waits on the entry N places ahead of it,
//!   so a permit freed nearer to it is taken once that one goes), and
//!   `--mode MODE` takes it in one of the six lock modes of a VMS-style lock
//!   manager (`NL`, `CR`, `CW`, `PR`, `PW`, `EX`, any case; see `modes.rs`):
//!   holders of compatible modes hold together (two `PR`, a `CR` beside a
//!   `PW`), a request waits for every earlier entry it is incompatible
//!   with, and every contender of `NAME` takes it with `--mode`.
//!   `-n`/`--nonblock` makes one try, as `flock -n`: when `NAME` is taken it exits at once with the
//!   `--conflict-exit-code` status (default 1, as flock's `-E`) and leaves
//!   no entry behind; it goes with `-s`, `--limit` or `--mode`, not with
//!   `--timeout`. Two of `-s`, `--limit` and `--mode` are refused (123).
//! - `elect` campaigns in the election `NAME` with `PROPOSAL` as the value.
//!   Once leader it runs `COMMAND` exactly as `lock` does (same process
//!   group, same end on a lost leadership, same exit statuses, same
//!   variables); without a command it prints the leader key and leads until
//!   one of those signals, then resigns and exits 0.
//! - `elect -l` prints the leader's key and value, on two lines, at every
//!   change (a new leader, a new value), as `etcdctl elect -l` does, until
//!   SIGINT, SIGTERM, SIGHUP or SIGQUIT (exit 0). While nobody leads nothing
//!   is printed; a leadership shorter than a server round trip may pass
//!   unseen. A value holding a newline is printed as it is. When standard
//!   output is closed (its reader went away) it stops with status 125.
//! - `list` prints the queue of `NAME`, the holder first, one line per
//!   contender: `KEY<TAB>OWNER<TAB>TOKEN<TAB>KIND`, where OWNER is the owning
//!   session's id (`-` when the backend cannot tell) and KIND is `mutex`,
//!   `read`, `write`, `semaphore`, `election` or `foreign recipe`. There is no
//!   header line, terminal or not: the output is meant for `cut` and `awk`.
//!   A contender in lock-delay (next in line after a holder that lost the
//!   lock involuntarily: not the holder yet, and nobody holds until its delay
//!   ends) has a fifth field, `lock-delay until TIME`, TIME in UTC as RFC 3339
//!   with milliseconds; the core looks at the first four contenders of a
//!   queue for it, and does not mark an election candidate (its value is its
//!   proclamation). A name taken with `--mode` lists its contenders in queue
//!   order (a granted entry may follow a waiting one), each
//!   `KEY<TAB>OWNER<TAB>TOKEN<TAB>lock-MODE<TAB>STATE`: MODE held (asked
//!   for, while waiting), TOKEN the grant's (`-` while waiting), STATE
//!   `granted`, `waiting` or `converting to MODE`. A listing that cannot be
//!   written exits 125.
//! - `check` asks the server whether `SEQUENCER` (a holder's
//!   `LOCKLINE_SEQUENCER`, `lockline1:MODE:TOKEN:NAME`) is still current: its
//!   entry is still there with that token and holds by the wait rule (a
//!   `lock-MODE` sequencer: its entry is granted in that mode with that
//!   token). Exit 0
//!   if it is, 1 if not (released, lost, a later holder's turn), as `test`
//!   answers, and quietly: a resource runs `if lockline check "$SEQ"`. With
//!   `--verbose` it also prints `current` or `not current` on standard
//!   output. A malformed sequencer is refused (123) before anything is
//!   contacted; a server out of reach is 122, as everywhere.
//! - `completions SHELL` prints a completion script for `bash`, `zsh` or
//!   `fish` (`elvish` and `powershell` too) on standard output.
//!
//! `--` ends the options; one `--` between `NAME` (or `PROPOSAL`) and
//! `COMMAND` is dropped, not run. Options come before `NAME`: everything
//! after it belongs to `COMMAND`. The command line is parsed by `clap`
//! (see `command_line.rs`): `lockline --help` lists every option of every
//! command, `lockline COMMAND --help` that command's; an option of another
//! command is refused (123) naming the commands it is for, a misspelt one
//! with a suggestion.
//!
//! # Options
//!
//! One server: `--etcd URL[,URL...]` (`http[s]://HOST:PORT`), `--zookeeper
//! HOST:PORT[,...][/CHROOT]`, `--redis URL`, `--postgres URL`
//! (`postgres://` or `postgresql://`) or `--mysql URL` (`mysql://` or
//! `mariadb://`, MariaDB or MySQL); two of them together are refused, and so
//! is a URL of the other engine. Redis and SQL servers take their
//! credentials and TLS in the URL (`?sslmode=require`): the TLS and
//! credential flags below are refused with them. `--ttl SECS` (the
//! session's TTL, default 10), `--timeout SECS` (lock and elect: give up
//! waiting, status 124), `--kill-after SECS` (the command group's grace,
//! below), `--lock-delay SECS` (lock and elect: the session's lock-delay,
//! at most 60, fractions allowed, default 0: after a holder lost the lock
//! involuntarily, wait that much longer before taking it; a release hands
//! on at once), `-s`/`--shared`, `--limit N`, `--mode MODE`, `-n`/`--nonblock` and
//! `--conflict-exit-code STATUS` (lock, above), `--metrics ADDR` (lock and
//! elect: serve lockline's metrics for Prometheus at `http://ADDR/metrics`
//! while running, the lock's name among the labels; an address that cannot
//! be listened on exits 123 before anything is contacted), `--print-key`
//! (with a command: the held key on standard output too), `-l`/`--listen`
//! (elect), `--verbose` (check). On secure clusters: `--cacert FILE`, `--cert FILE`, `--key FILE` (TLS, both
//! backends); `--user NAME[:PASSWORD]`, `--password PASSWORD` and
//! `--marker-prefix PREFIX` (etcd); `--zk-auth digest|sasl:USER:PASSWORD`
//! and `--zk-acl open|creator` (ZooKeeper). Options may be written
//! `--flag=value`. Passwords are never printed.
//!
//! # Environment
//!
//! Read, flags first: `ETCDCTL_ENDPOINTS` stands in for `--etcd` and
//! `ZOOKEEPER_CONNECT` for `--zookeeper`; when both are set and no flag
//! picks a server, `lockline` refuses in one line naming both rather than
//! guess (status 123). When neither is set and no flag picks a server,
//! `DATABASE_URL` stands in for `--postgres` or `--mysql`, as its scheme says;
//! one of another scheme (or no URL at all) is refused with status 123, in a
//! line naming the scheme it has and those it may have (never the URL: it
//! may hold a password). etcdctl's `ETCDCTL_CACERT`, `ETCDCTL_CERT`,
//! `ETCDCTL_KEY`, `ETCDCTL_USER` and `ETCDCTL_PASSWORD` fill in what the
//! flags leave out (etcd only), and `LOCKLINE_ZK_AUTH` the ZooKeeper
//! credentials.
//!
//! Set for the command: `LOCKLINE_KEY` (the held key), `LOCKLINE_TOKEN`
//! (the fencing token) and `LOCKLINE_SEQUENCER` (the holder's sequencer,
//! `lockline1:MODE:TOKEN:NAME`, MODE `mutex` under `lock`, `read` under
//! `lock -s`, `permit-N` under `lock --limit N`, `lock-MODE` (`lock-PW`, ...)
//! under `lock --mode MODE` and `leader` under `elect`, for `lockline
//! check`).
//!
//! # Output
//!
//! With a command, standard output is the command's alone: the held key goes
//! to standard error, on the line `lockline: holding KEY with fencing token
//! N`. With `--print-key` it also goes to standard output; its order relative
//! to the command's own output is then not promised. Without a command the
//! key goes to standard output (and the same line to standard error), as
//! `etcdctl lock` prints it. Diagnostics always go to standard error.
//!
//! Output is written by a thread of its own, so that stopping the command's
//! group, releasing the lock and removing a waiter's entry never wait on or
//! depend on a write: a closed pipe, a full device or a reader that stopped
//! reading loses lines, never changes what happens to the lock, the command
//! or the exit status, and never makes `lockline` panic. A key that cannot
//! be printed is reported on standard error and the command runs all the
//! same. On its way out `lockline` waits at most a second for its last lines.
//!
//! # Exit statuses
//!
//! The 12x block is `lockline`'s own and stays stable:
//!
//! | status | meaning |
//! |---|---|
//! | the command's | the command exited by itself; 128 + N when it was killed by signal N |
//! | 0 | without a command: released (resigned) after SIGINT, SIGTERM, SIGHUP or SIGQUIT; `elect -l` ended by one of them; `list` done; `check`: the sequencer is current |
//! | 1 | `check`: the sequencer is not current; `lock -n`: `NAME` is taken (the `--conflict-exit-code` status when given) |
//! | 120 | the lock (or leadership) was lost while held |
//! | 121 | credentials or permission refused |
//! | 122 | the cluster could not be reached within the deadline |
//! | 123 | bad arguments or options (an invalid name or a malformed sequencer among them) |
//! | 124 | `--timeout` ran out (as timeout(1)) |
//! | 125 | any other `lockline` failure: a session lost while waiting, a backend error, a release that failed for another reason than a loss (the key then goes when the session's TTL runs out) |
//! | 126 | the command was found but could not be run |
//! | 127 | the command was not found |
//! | 128 + N | `lockline` itself got signal N (SIGINT, SIGTERM, SIGHUP, SIGQUIT) while waiting or while the command ran |
//!
//! When a loss counts (120): without a command, before a signal came; with
//! one, while any process of its group still ran, whatever started the stop.
//! A loss while the group is being stopped after a signal or after the
//! command's exit therefore gives 120, not 128 + N nor the command's status:
//! some of its processes ran without the lock. A loss `lockline` notices only
//! once the group is gone (when releasing) changes nothing: nothing ran
//! without the lock, and it is only reported on standard error. When a loss
//! and another event are seen at the same moment, the loss counts as first
//! (`lockline` then cannot tell whether the command still ran without the
//! lock).
//!
//! A second signal while the group is being stopped only cuts the grace
//! short; it does not change the status. A signal and a grant seen at the
//! same moment count as a signal while waiting: the wait is cancelled and the
//! entry removed.
//!
//! # The command dies with the lock
//!
//! The command is started as the leader of a process group of its own, and
//! everything it starts stays in that group unless it leaves it. When
//! `lockline` gets SIGINT, SIGTERM, SIGHUP or SIGQUIT, or the lock is lost
//! (session expired or declared lost, key deleted), the whole group gets
//! SIGTERM (and SIGCONT), then SIGKILL once the `--kill-after` grace has passed
//! (default 2 s, at most 3600; a second signal to `lockline` cuts the grace
//! short). With `--kill-after 0` the group gets SIGKILL at once and no SIGTERM
//! at all, so no handler of the command runs. When the command exits by
//! itself, whatever it left running in its group is stopped the same way. No
//! external program is run for this. All of this holds for `elect` with a
//! command, with leadership in place of the lock.
//!
//! - On a signal or a normal exit the lock is released only once no process of
//!   the group runs any more, so the next holder never overlaps with it; then
//!   `lockline` exits with the command's status or 128 + its own signal (or
//!   120, see above, if the lock was lost meanwhile).
//! - On a lost lock the lock is already gone (someone else may hold it): the
//!   group is signalled at once, before anything else (any diagnostic, the
//!   session's close), and `lockline` exits 120 once the group is gone. The
//!   same holds when the loss comes while the group is already being stopped;
//!   its SIGKILL then comes when the grace that began with its SIGTERM ends.
//! - On Linux the command is started with `PR_SET_PDEATHSIG` = SIGKILL: if
//!   `lockline` is killed outright (SIGKILL, OOM killer), the command itself
//!   is killed by the kernel. If `lockline` died before that was set, the
//!   command is not started.
//! - SIGTSTP (Ctrl-Z) pauses the group (SIGSTOP) together with `lockline`;
//!   SIGCONT (`fg`) resumes both. Nothing renews the session meanwhile, so a
//!   long pause loses the lock, and the command is then stopped as above.
//! - While `lockline` waits for the lock (or campaigns), SIGINT, SIGTERM,
//!   SIGHUP or SIGQUIT cancel the wait, remove its entry and close the
//!   session before `lockline` exits, so later contenders are not held up
//!   until its TTL runs out.
//!
//! What is not guaranteed:
//!
//! - When `lockline` is killed with SIGKILL only the command's own process
//!   (the direct child) is killed: processes it started (a shell's children)
//!   keep running, and the lock is freed by the server only when the session's
//!   TTL runs out (on PostgreSQL and MariaDB/MySQL as soon as the server sees
//!   the connection close: those processes may then overlap with the next
//!   holder at once).
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
//! # Layouts
//!
//! On etcd it uses the Go `concurrency` layout: `lockline lock NAME` excludes
//! and is excluded by `etcdctl lock NAME` and Go's `concurrency.Mutex`, and
//! `lockline elect` and `etcdctl elect` (Go's `concurrency.Election`) see
//! each other's leaders and queue together. On ZooKeeper it uses Curator's
//! layout under the path `/NAME` (a `LeaderLatch` for elections), and queues
//! with Curator's `InterProcessMutex` and kazoo's `Lock` there. On
//! PostgreSQL and MariaDB/MySQL it uses `lockline-sql`'s tables (created on
//! first use unless a DBA made them): keys are `NAME/ID`, ID being the
//! entry's id and fencing token; an entry is guarded by a named lock of its
//! session's connection, so a `lockline` killed outright lets go as soon as
//! the server sees its connection close, not after the TTL.

#[macro_use]
mod output;
mod command_line;
mod group;
mod modes;
mod signals;

use std::ffi::OsStr;
use std::process::ExitCode;
use std::time::Duration;

use clap::error::ErrorKind;
use clap::parser::ValueSource;
use futures::StreamExt;
use lockline::{
    Client, Error, FencingToken, Leadership, LockMode, MutexGuard, Permit, ReadGuard, ResourceGuard, Sequencer,
    Session, SessionOptions, Tls,
};
use lockline_etcd::Etcd;
use lockline_redis::Redis;
use lockline_sql::Sql;
use lockline_zookeeper::{AclPolicy, ZooKeeper};

use crate::group::{signal_status, ProcessGroup};
use crate::signals::{signal_name, StopSignals, SuspendSignal};

/// Exit status of `check` when the sequencer is not current (as test(1)'s
/// false).
const NOT_CURRENT: u8 = 1;
/// Exit status of `lock -n` when the lock is taken, unless
/// `--conflict-exit-code` says (as flock(1)'s `-E` default).
const DEFAULT_CONFLICT: u8 = 1;
/// Exit status when the lock (or leadership) was lost while held.
const LOST: u8 = 120;
/// Exit status when the server refused the credentials or a permission.
const REFUSED: u8 = 121;
/// Exit status when the cluster could not be reached within the deadline.
const UNAVAILABLE: u8 = 122;
/// Exit status for bad arguments or options.
const USAGE_ERROR: u8 = 123;
/// Exit status when `--timeout` ran out (as timeout(1)).
const TIMED_OUT: u8 = 124;
/// Exit status for any other failure of `lockline`'s own.
const FAILURE: u8 = 125;
/// Exit status when the command was found but could not be run (as a shell).
const CANNOT_RUN: u8 = 126;
/// Exit status when the command was not found (as a shell).
const NOT_FOUND: u8 = 127;

/// The exit status for a failure of `lockline`'s own.
fn failure_status(error: &Error) -> u8 {
    match error {
        Error::AuthenticationFailed { .. } | Error::PermissionDenied { .. } => REFUSED,
        Error::Unavailable { .. } => UNAVAILABLE,
        Error::InvalidName { .. } | Error::InvalidOptions { .. } => USAGE_ERROR,
        Error::Timeout { .. } => TIMED_OUT,
        _ => FAILURE,
    }
}
/// The session's TTL unless `--ttl` says.
const DEFAULT_TTL: Duration = Duration::from_secs(10);
/// How long the command's group has between SIGTERM and SIGKILL by default.
const DEFAULT_KILL_AFTER: Duration = Duration::from_secs(2);
/// How long a `lockline` signalled while waiting waits for its entry to be
/// removed before it closes the session anyway.
const CLEANUP_TIMEOUT: Duration = Duration::from_secs(5);
/// How long `lockline` tries to close the session of a lost lock.
const LOST_CLOSE_TIMEOUT: Duration = Duration::from_secs(1);

#[derive(PartialEq)]
enum Server {
    Etcd(Vec<String>),
    ZooKeeper(String),
    Redis(String),
    /// A `postgres://` or `postgresql://` URL.
    Postgres(String),
    /// A `mysql://` or `mariadb://` URL (MariaDB or MySQL).
    MySql(String),
}

impl Server {
    /// The flag that names this kind of server.
    fn flag(&self) -> &'static str {
        match self {
            Server::Etcd(_) => "--etcd",
            Server::ZooKeeper(_) => "--zookeeper",
            Server::Redis(_) => "--redis",
            Server::Postgres(_) => "--postgres",
            Server::MySql(_) => "--mysql",
        }
    }
}

/// URLs may hold a password: `Debug` shows only their scheme.
impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let url = |url: &str| format!("{}://…", scheme(url).unwrap_or("?"));
        match self {
            Server::Etcd(endpoints) => f.debug_tuple("Etcd").field(endpoints).finish(),
            Server::ZooKeeper(hosts) => f.debug_tuple("ZooKeeper").field(hosts).finish(),
            Server::Redis(address) => f.debug_tuple("Redis").field(&url(address)).finish(),
            Server::Postgres(address) => f.debug_tuple("Postgres").field(&url(address)).finish(),
            Server::MySql(address) => f.debug_tuple("MySql").field(&url(address)).finish(),
        }
    }
}

/// The scheme of `url` (what comes before `://`), when it looks like one: a
/// letter, then letters, digits, `+`, `-` or `.`. Anything else is not
/// shown, since it may be part of a password.
fn scheme(url: &str) -> Option<&str> {
    let (scheme, _) = url.split_once("://")?;
    let mut chars = scheme.chars();
    let valid = chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
        && scheme.len() <= 32;
    valid.then_some(scheme)
}

/// The SQL server a database URL names, by its scheme (any case), or what
/// is wrong with it; `origin` is the flag or variable it came from. The URL
/// itself is never part of the message: it may hold a password.
fn database(origin: &str, url: &str) -> Result<Server, String> {
    let expected = "postgres://, postgresql://, mysql:// or mariadb://";
    let Some(found) = scheme(url) else {
        return Err(format!(
            "{origin} is not a URL (no SCHEME://); expected {expected}, e.g. postgres://USER:PASSWORD@HOST:5432/DATABASE"
        ));
    };
    let server = match found.to_ascii_lowercase().as_str() {
        "postgres" | "postgresql" => Server::Postgres(url.to_owned()),
        "mysql" | "mariadb" => Server::MySql(url.to_owned()),
        _ => {
            return Err(format!(
                "{origin} has the scheme {found}://, which lockline does not speak; expected {expected}"
            ))
        }
    };
    match (origin, &server) {
        ("--postgres", Server::MySql(_)) => Err(format!(
            "--postgres takes a postgres:// or postgresql:// URL; a {found}:// URL goes to --mysql"
        )),
        ("--mysql", Server::Postgres(_)) => Err(format!(
            "--mysql takes a mysql:// or mariadb:// URL; a {found}:// URL goes to --postgres"
        )),
        _ => Ok(server),
    }
}

/// The passwords a database or Redis URL may hold, as written and
/// percent-decoded: the user information's (`USER:PASSWORD@`, for a password
/// written with an unencoded `/`, `?` or `@` too) and `password=` query
/// parameters'. A candidate too many is harmless: it is only hidden.
fn url_secrets(url: &str) -> Vec<String> {
    let Some((_, rest)) = url.split_once("://") else {
        // Not a URL: nothing is connected, and nothing can tell where a
        // password would be; hide it all.
        return vec![url.to_owned()];
    };
    let mut secrets = Vec::new();
    for at in [rest.find('@'), rest.rfind('@')].into_iter().flatten() {
        if let Some((_, password)) = rest[..at].split_once(':') {
            secrets.push(password.to_owned());
        }
    }
    if let Some((_, query)) = rest.split_once('?') {
        for pair in query.split('&') {
            if let Some((name, value)) = pair.split_once('=') {
                if name.eq_ignore_ascii_case("password") || name.eq_ignore_ascii_case("pass") {
                    secrets.push(value.to_owned());
                }
            }
        }
    }
    let decoded: Vec<String> = secrets.iter().filter_map(|s| percent_decoded(s)).collect();
    secrets.extend(decoded);
    secrets.sort();
    secrets.dedup();
    secrets
}

/// `text` with its `%XX` escapes decoded, when that changes it and gives
/// UTF-8.
fn percent_decoded(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let hex = |at: usize| bytes.get(at).and_then(|&b| char::from(b).to_digit(16));
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if let (b'%', Some(high), Some(low)) = (bytes[i], hex(i + 1), hex(i + 2)) {
            out.push(u8::try_from(high * 16 + low).unwrap_or(b'%'));
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    let decoded = String::from_utf8(out).ok()?;
    (decoded != text).then_some(decoded)
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

/// Which lock `lock` takes.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Recipe {
    /// Exclusive: a mutex (etcd's Go layout, Curator's mutex).
    Exclusive,
    /// `--shared`: the read side of a read/write lock.
    Shared,
    /// `--limit N`: a permit of a semaphore of N.
    Limit(usize),
    /// `--mode MODE`: a resource in one of the six lock modes.
    LockMode(LockMode),
}

/// What to do with `NAME`.
#[derive(Debug, PartialEq)]
enum Mode {
    /// `lock NAME [COMMAND...]`: hold the lock, as `recipe` says.
    Lock { command: Vec<String>, recipe: Recipe },
    /// `elect NAME PROPOSAL [COMMAND...]`: lead with `proposal` as the value.
    Elect { proposal: String, command: Vec<String> },
    /// `elect --listen NAME`: print every leader.
    Listen,
    /// `list NAME`: print the queue.
    List,
    /// `check SEQUENCER`: ask whether it is current.
    Check { sequencer: Sequencer },
}

#[derive(Debug)]
struct Args {
    server: Server,
    security: Security,
    ttl: Duration,
    timeout: Option<Duration>,
    kill_after: Duration,
    /// `--lock-delay`: the session's lock-delay (zero: none).
    lock_delay: Duration,
    /// `--print-key`: the held key on standard output even with a command.
    print_key: bool,
    /// `--metrics ADDR`: where to serve the metrics while running.
    metrics: Option<std::net::SocketAddr>,
    /// `--verbose` (check): the answer on standard output too.
    verbose: bool,
    /// `--nonblock` (lock): one try, and the status when the lock is taken.
    nonblock: Option<u8>,
    /// The lock's name (check: the sequencer's).
    name: String,
    mode: Mode,
}

impl Args {
    /// Every password given, in every form a message might show it, for
    /// [`output::hide`].
    fn secrets(&self) -> Vec<String> {
        let mut secrets = match &self.server {
            Server::Redis(url) | Server::Postgres(url) | Server::MySql(url) => url_secrets(url),
            Server::Etcd(_) | Server::ZooKeeper(_) => Vec::new(),
        };
        secrets.extend(self.security.user.iter().map(|(_, password)| password.clone()));
        secrets.extend(self.security.zk_auth.iter().map(|(_, _, password)| password.clone()));
        secrets
    }

    /// The command to run while holding (empty: none).
    fn command(&self) -> &[String] {
        match &self.mode {
            Mode::Lock { command, .. } | Mode::Elect { command, .. } => command,
            Mode::Listen | Mode::List | Mode::Check { .. } => &[],
        }
    }
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

/// What the command line asks for.
enum Action {
    /// Take the lock, campaign, listen, list or check.
    Run(Box<Args>),
    /// Print clap's help or version on standard output (status 0).
    Show(clap::Error),
    /// Print a completion script.
    Completions(clap_complete::Shell),
}

/// The arguments (without the program's name), with `env` standing in for
/// the server variables (`ETCDCTL_ENDPOINTS`, `ZOOKEEPER_CONNECT`,
/// `DATABASE_URL`); clap reads the TLS and credential ones itself.
fn parse(argv: Vec<String>, env: impl Fn(&str) -> Option<String>) -> Result<Action, String> {
    use clap::{CommandFactory, FromArgMatches};
    use command_line::{Cli, Command};

    let env = |name: &str| env(name).filter(|v| !v.is_empty());
    let matches = match Cli::command().try_get_matches_from(std::iter::once("lockline".to_owned()).chain(argv)) {
        Ok(matches) => matches,
        Err(error) if matches!(error.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) => {
            return Ok(Action::Show(error))
        }
        Err(error) => return Err(command_line::one_line(&error)),
    };
    let cli = Cli::from_arg_matches(&matches).map_err(|error| command_line::one_line(&error))?;
    let Some((_, sub)) = matches.subcommand() else {
        return Err("a command is required".to_owned());
    };
    let mut recipe = Recipe::Exclusive;
    let mut nonblock = None;
    let (connection, ttl, holding, listen, verbose, rest, subcommand) = match cli.command {
        Command::Completions { shell } => return Ok(Action::Completions(shell)),
        Command::Lock(lock) => {
            // clap refuses two of them together.
            recipe = match (lock.shared, lock.limit, lock.mode) {
                (true, _, _) => Recipe::Shared,
                (false, Some(permits), _) => Recipe::Limit(permits),
                (false, None, Some(mode)) => Recipe::LockMode(mode),
                (false, None, None) => Recipe::Exclusive,
            };
            nonblock = match (lock.nonblock, lock.conflict_exit_code) {
                (true, code) => Some(code.unwrap_or(DEFAULT_CONFLICT)),
                (false, Some(_)) => {
                    return Err("--conflict-exit-code is the status of -n/--nonblock: give -n too".to_owned())
                }
                (false, None) => None,
            };
            (
                lock.connection,
                lock.session.ttl,
                Some(lock.holding),
                false,
                false,
                lock.rest,
                "lock",
            )
        }
        Command::Elect(elect) => (
            elect.connection,
            elect.session.ttl,
            Some(elect.holding),
            elect.listen,
            false,
            elect.rest,
            "elect",
        ),
        Command::List(list) => (list.connection, list.session.ttl, None, false, false, list.rest, "list"),
        Command::Check(check) => (check.connection, None, None, false, check.verbose, check.rest, "check"),
    };
    // Given on the command line, or by its variable (an empty one is unset).
    let given = |id: &str| sub.value_source(id) == Some(ValueSource::CommandLine);
    let flags = connection.security;
    let from = |id: &str, value: Option<String>| value.filter(|v| given(id) || !v.is_empty());
    let mut security = Security {
        cacert: from("cacert", flags.cacert),
        cert: from("cert", flags.cert),
        key: from("key", flags.key),
        user: None,
        marker_prefix: flags.marker_prefix,
        zk_auth: None,
        zk_acl: match flags.zk_acl.as_deref() {
            None => None,
            Some("open") => Some(AclPolicy::Open),
            Some("creator") => Some(AclPolicy::Creator),
            Some(other) => return Err(format!("--zk-acl: {other:?} is not open or creator")),
        },
    };
    let user_spec = from("user", flags.user);
    let password = from("password", flags.password);
    let zk_spec = from("zk_auth", flags.zk_auth);

    // At most one server flag (clap refuses two). Without one,
    // ETCDCTL_ENDPOINTS and ZOOKEEPER_CONNECT stand in for the flags, and
    // DATABASE_URL (set for many an application, so the more specific ones
    // win) when neither is set.
    let server_flags = connection.server;
    let mut database_url = false;
    let server = if let Some(list) = server_flags.etcd {
        Server::Etcd(endpoints(&list).ok_or("--etcd needs endpoints")?)
    } else if let Some(hosts) = server_flags.zookeeper {
        Server::ZooKeeper(hosts)
    } else if let Some(url) = server_flags.redis {
        Server::Redis(url)
    } else if let Some(url) = server_flags.postgres {
        database("--postgres", &url)?
    } else if let Some(url) = server_flags.mysql {
        database("--mysql", &url)?
    } else {
        match (env("ETCDCTL_ENDPOINTS"), env("ZOOKEEPER_CONNECT")) {
            (Some(_), Some(_)) => {
                return Err("both ETCDCTL_ENDPOINTS and ZOOKEEPER_CONNECT are set: choose one server with --etcd or --zookeeper, or unset one of them".to_owned())
            }
            (Some(list), None) => Server::Etcd(endpoints(&list).ok_or("ETCDCTL_ENDPOINTS holds no endpoint")?),
            (None, Some(hosts)) => Server::ZooKeeper(hosts),
            (None, None) => match env("DATABASE_URL") {
                Some(url) => {
                    database_url = true;
                    database("DATABASE_URL", &url)?
                }
                None => {
                    return Err(
                        "a server is required: --etcd, --zookeeper, --redis, --postgres or --mysql, or one of ETCDCTL_ENDPOINTS, ZOOKEEPER_CONNECT or DATABASE_URL".to_owned(),
                    )
                }
            },
        }
    };
    // The etcdctl variables are for etcd, LOCKLINE_ZK_AUTH for ZooKeeper:
    // elsewhere they are not read, and only flags are refused.
    let flagged = [
        "cacert",
        "cert",
        "key",
        "user",
        "password",
        "marker_prefix",
        "zk_auth",
        "zk_acl",
    ]
    .iter()
    .any(|id| given(id));
    let etcd_only = |id: &str, value: Option<String>| value.filter(|_| given(id) || matches!(server, Server::Etcd(_)));
    security.cacert = etcd_only("cacert", security.cacert);
    security.cert = etcd_only("cert", security.cert);
    security.key = etcd_only("key", security.key);
    let user_given = given("user");
    let password_given = given("password");
    let user_spec = etcd_only("user", user_spec);
    let password = etcd_only("password", password);
    let zk_spec = zk_spec.filter(|_| given("zk_auth") || matches!(server, Server::ZooKeeper(_)));
    match server {
        Server::Redis(_) | Server::Postgres(_) | Server::MySql(_) => {
            if flagged {
                let given = if database_url {
                    format!("with DATABASE_URL ({})", server.flag())
                } else {
                    format!("with {}", server.flag())
                };
                let example = match server {
                    Server::Postgres(_) => {
                        "postgres://USER:PASSWORD@HOST:5432/DATABASE?sslmode=verify-full&sslrootcert=ca.pem"
                    }
                    Server::MySql(_) => {
                        "mysql://USER:PASSWORD@HOST:3306/DATABASE?ssl-mode=VERIFY_IDENTITY&ssl-ca=ca.pem"
                    }
                    _ => "redis://:PASSWORD@HOST:PORT, rediss:// for TLS",
                };
                return Err(format!(
                    "TLS and credential flags are for --etcd and --zookeeper; {given} put them in the URL ({example})"
                ));
            }
            security = Security::default();
        }
        Server::Etcd(_) => {
            if let Some(spec) = &user_spec {
                // --password, then NAME:PASSWORD, then ETCDCTL_PASSWORD.
                let (name, inline) = match spec.split_once(':') {
                    Some((name, inline)) => (name, Some(inline.to_owned())),
                    None => (spec.as_str(), None),
                };
                let (flag, variable) = match password {
                    Some(password) if password_given => (Some(password), None),
                    other => (None, other),
                };
                security.user = Some(user(name, flag.or(inline).or(variable), "--user")?);
            } else if password_given {
                return Err("--password needs --user NAME".to_owned());
            }
            if zk_spec.is_some() || security.zk_acl.is_some() {
                return Err("--zk-auth and --zk-acl are for --zookeeper; with etcd use --user".to_owned());
            }
        }
        Server::ZooKeeper(_) => {
            security.zk_auth = zk_spec.map(|spec| zk_auth(&spec)).transpose()?;
            if user_given || password_given || security.marker_prefix.is_some() {
                return Err(
                    "--user, --password and --marker-prefix are for --etcd; with ZooKeeper use --zk-auth".to_owned(),
                );
            }
        }
    }
    if security.cert.is_some() != security.key.is_some() {
        return Err("--cert and --key go together".to_owned());
    }
    if security.cert.is_some() && security.cacert.is_none() {
        return Err("--cert and --key need --cacert (the CA that signed the servers' certificates)".to_owned());
    }

    let mut rest = rest.into_iter().peekable();
    let name = rest.next().ok_or_else(|| match subcommand {
        "check" => "SEQUENCER is required".to_owned(),
        _ => "NAME is required".to_owned(),
    })?;
    // One `--` may separate the command from NAME (and PROPOSAL).
    let command = |mut rest: std::iter::Peekable<std::vec::IntoIter<String>>| {
        rest.next_if_eq("--");
        rest.collect::<Vec<String>>()
    };
    let mode = match subcommand {
        "lock" => Mode::Lock {
            command: command(rest),
            recipe,
        },
        "elect" if listen => match rest.next() {
            Some(_) => return Err("elect --listen takes NAME only, no PROPOSAL or COMMAND".to_owned()),
            None => Mode::Listen,
        },
        "elect" => {
            let proposal = rest
                .next()
                .ok_or_else(|| "elect needs PROPOSAL after NAME (or --listen)".to_owned())?;
            if proposal == "-l" || proposal == "--listen" {
                return Err(format!("{proposal} goes before NAME: elect {proposal} NAME"));
            }
            Mode::Elect {
                proposal,
                command: command(rest),
            }
        }
        "list" => match rest.next() {
            Some(_) => return Err("list takes NAME only".to_owned()),
            None => Mode::List,
        },
        _ => {
            if rest.next().is_some() {
                return Err("check takes SEQUENCER only".to_owned());
            }
            // Malformed: refused before anything is contacted.
            let sequencer = name.parse::<Sequencer>().map_err(|error| match error {
                Error::InvalidOptions { reason } => format!("check: {reason}"),
                other => format!("check: {other}"),
            })?;
            Mode::Check { sequencer }
        }
    };
    let name = match &mode {
        Mode::Check { sequencer } => sequencer.name().to_owned(),
        _ => name,
    };
    let (timeout, kill_after, lock_delay, print_key, metrics) = match holding {
        Some(holding) => (
            holding.timeout,
            holding.kill_after,
            holding.lock_delay,
            holding.print_key,
            holding.metrics,
        ),
        None => (None, None, None, false, None),
    };
    if mode == Mode::Listen {
        if print_key {
            return Err("--print-key is for lock and elect with a COMMAND".to_owned());
        }
        if timeout.is_some() {
            return Err("--timeout is for lock and elect, not elect --listen".to_owned());
        }
        if lock_delay.is_some() {
            return Err("--lock-delay is for lock and elect, not elect --listen".to_owned());
        }
        if metrics.is_some() {
            return Err("--metrics is for lock and elect, not elect --listen".to_owned());
        }
    }
    Ok(Action::Run(Box::new(Args {
        server,
        security,
        ttl: ttl.unwrap_or(DEFAULT_TTL),
        timeout,
        kill_after: kill_after.unwrap_or(DEFAULT_KILL_AFTER),
        lock_delay: lock_delay.unwrap_or(Duration::ZERO),
        print_key,
        metrics,
        verbose,
        nonblock,
        name,
        mode,
    })))
}

/// The endpoints of a comma-separated list, when it has any.
fn endpoints(list: &str) -> Option<Vec<String>> {
    let endpoints: Vec<String> = list.split(',').filter(|e| !e.is_empty()).map(str::to_owned).collect();
    (!endpoints.is_empty()).then_some(endpoints)
}

/// How long `lockline` waits, on its way out, for its last lines to be
/// written; a stuck standard output or error cannot hold it up for longer.
const OUTPUT_TIMEOUT: Duration = Duration::from_secs(1);

fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let written = written_secrets(&argv, |name| std::env::var(name).ok());
    let code = match parse(argv, |name| std::env::var(name).ok()) {
        Ok(Action::Run(args)) => {
            output::hide(args.secrets().into_iter().chain(written).collect());
            start(*args)
        }
        // Help and version on standard output, status 0 (1 if it cannot be
        // written).
        Ok(Action::Show(shown)) => {
            return if shown.print().is_ok() {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            }
        }
        Ok(Action::Completions(shell)) => {
            use clap::CommandFactory;
            let mut stdout = std::io::stdout().lock();
            clap_complete::generate(shell, &mut command_line::Cli::command(), "lockline", &mut stdout);
            return ExitCode::SUCCESS;
        }
        Err(message) => {
            output::hide(written);
            note!("lockline: {message}");
            USAGE_ERROR
        }
    };
    output::finish(OUTPUT_TIMEOUT);
    ExitCode::from(code)
}

/// The secrets written on the command line or in the environment,
/// wherever they ended up: the password of `--user NAME:PASSWORD`, of
/// `--password PASSWORD` and of `--zk-auth SCHEME:USER:PASSWORD` (all of a
/// `--zk-auth` value without a password field), in either form (`--flag
/// value`, `--flag=value`), also inside another argument (`--zk-acl=--password=PW`
/// makes the secret option another flag's value, and a message about that
/// value must not show it); the same from `ETCDCTL_USER`,
/// `ETCDCTL_PASSWORD` and `LOCKLINE_ZK_AUTH`; and the password of any URL
/// in an argument or in `DATABASE_URL` (user info, `password=` or `pass=`
/// in the query). A word that is itself an option (`--password --`) is not
/// taken for a password.
fn written_secrets(argv: &[String], env: impl Fn(&str) -> Option<String>) -> Vec<String> {
    fn password_of(flag: &str, value: &str) -> Option<String> {
        let secret = match flag {
            "--password" => Some(value),
            "--user" => value.split_once(':').map(|(_, password)| password),
            "--zk-auth" => Some(value.splitn(3, ':').nth(2).unwrap_or(value)),
            _ => None,
        }?;
        (!secret.is_empty() && !secret.starts_with("--")).then(|| secret.to_owned())
    }
    let mut secrets = Vec::new();
    for (i, arg) in argv.iter().enumerate() {
        for flag in ["--password", "--user", "--zk-auth"] {
            if arg == flag {
                if let Some(value) = argv.get(i + 1) {
                    secrets.extend(password_of(flag, value));
                }
            }
            let written = format!("{flag}=");
            if let Some(at) = arg.find(&written) {
                secrets.extend(password_of(flag, &arg[at + written.len()..]));
            }
        }
        if let Some(at) = arg.find("://") {
            let start = arg[..at].rfind('=').map_or(0, |equals| equals + 1);
            secrets.extend(url_secrets(&arg[start..]));
        }
    }
    let env = |name: &str| env(name).filter(|value| !value.is_empty());
    secrets.extend(env("ETCDCTL_PASSWORD"));
    secrets.extend(env("ETCDCTL_USER").and_then(|user| password_of("--user", &user)));
    secrets.extend(env("LOCKLINE_ZK_AUTH").and_then(|auth| password_of("--zk-auth", &auth)));
    secrets.extend(env("DATABASE_URL").map(|url| url_secrets(&url)).into_iter().flatten());
    secrets
}

/// Starts the runtime on this thread (the command must be spawned from the
/// thread that runs `main`, see [`ProcessGroup::spawn`]) and runs.
fn start(args: Args) -> u8 {
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            note!("lockline: cannot start the async runtime: {error}");
            return FAILURE;
        }
    };
    runtime.block_on(async {
        // From here on SIGINT, SIGTERM, SIGHUP and SIGQUIT no longer kill
        // `lockline` on the spot: each step below decides what they mean.
        let mut signals = match StopSignals::listen() {
            Ok(signals) => signals,
            Err(error) => {
                note!("lockline: cannot listen for SIGINT, SIGTERM, SIGHUP and SIGQUIT: {error}");
                return FAILURE;
            }
        };
        match run(args, &mut signals).await {
            Ok(code) => code,
            Err(Error::Timeout { name, waited, .. }) => {
                if waited.is_zero() {
                    note!("lockline: {name:?} is taken (--timeout 0: one try)");
                } else {
                    note!("lockline: {name:?} not acquired within {waited:?}");
                }
                TIMED_OUT
            }
            Err(error) => {
                let message = error.to_string();
                note!("lockline: {message}");
                // The message already holds its causes' words; a cause it
                // does not hold gets a line of its own.
                let mut source = std::error::Error::source(&error);
                while let Some(cause) = source {
                    let words = cause.to_string();
                    if !message.contains(&words) {
                        note!("  caused by: {words}");
                    }
                    source = cause.source();
                }
                failure_status(&error)
            }
        }
    })
}

async fn run(args: Args, signals: &mut StopSignals) -> lockline::Result<u8> {
    let client = backend(&args)?;
    if let Some(addr) = args.metrics {
        serve_metrics(addr)?;
    }
    if let Mode::Check { sequencer } = &args.mode {
        // No lock can have this name: refused before anything is contacted.
        client.validate_name(sequencer.name())?;
    }
    let options = SessionOptions::new()
        .with_ttl(args.ttl)
        .with_lock_delay(args.lock_delay);
    let session = tokio::select! {
        biased;
        // Nothing is queued yet; a session being opened ends with its TTL.
        signal = signals.recv() => return Ok(signal_status(signal)),
        session = client.session_with(options) => session?,
    };
    let outcome = match &args.mode {
        Mode::Lock { .. } | Mode::Elect { .. } => hold(&args, &session, signals).await,
        Mode::Listen => listen(&args, &session, signals).await,
        Mode::List => list(&args, &session, signals).await,
        // Through this session, closed below: nothing of it stays behind.
        Mode::Check { sequencer } => check(&args, &session, sequencer, signals).await.map(Held::Released),
    };
    match outcome {
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

/// `check`: asks the server whether `sequencer` is current; 0 if it is,
/// [`NOT_CURRENT`] if not, quietly unless `--verbose`.
async fn check(
    args: &Args,
    session: &Session,
    sequencer: &Sequencer,
    signals: &mut StopSignals,
) -> lockline::Result<u8> {
    let current = tokio::select! {
        biased;
        // It only reads: nothing to undo.
        signal = signals.recv() => return Ok(signal_status(signal)),
        current = session.check(sequencer) => current?,
    };
    if args.verbose {
        let answer: &[u8] = if current { b"current\n" } else { b"not current\n" };
        output::output(answer.to_vec());
    }
    Ok(if current { 0 } else { NOT_CURRENT })
}

/// `--metrics ADDR`: lockline's metrics (with the lock's name: there is
/// one) served for Prometheus at `http://ADDR/metrics` until the process
/// ends. An address that cannot be listened on is refused (123) before
/// anything is contacted.
fn serve_metrics(addr: std::net::SocketAddr) -> lockline::Result<()> {
    use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
    let refused = |why: String| Error::InvalidOptions {
        reason: format!("--metrics {addr}: {why}"),
    };
    // Bound here first, so that an address in use is said now, not by a
    // listener task that fails in the background.
    drop(std::net::TcpListener::bind(addr).map_err(|e| refused(e.to_string()))?);
    PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), lockline::metrics::BUCKETS)
        .map_err(|e| refused(e.to_string()))?
        .with_http_listener(addr)
        .install()
        .map_err(|e| refused(e.to_string()))?;
    lockline::metrics::include_lock_names(true);
    lockline::metrics::describe();
    Ok(())
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
        Server::Redis(url) => Client::new(Redis::new(url.clone())),
        // Credentials and TLS are in the URL.
        Server::Postgres(url) | Server::MySql(url) => Client::new(Sql::new(url.clone())),
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

/// A held lock, read lock, permit, lock mode or leadership: the same guard
/// surface.
#[derive(Debug)]
enum Holding {
    Lock(MutexGuard),
    Read(ReadGuard),
    Permit(Permit),
    Mode(ResourceGuard),
    Leader(Leadership),
}

/// Each of [`Holding`]'s guards, for the same call.
macro_rules! each {
    ($holding:expr, $guard:ident => $body:expr) => {
        match $holding {
            Holding::Lock($guard) => $body,
            Holding::Read($guard) => $body,
            Holding::Permit($guard) => $body,
            Holding::Mode($guard) => $body,
            Holding::Leader($guard) => $body,
        }
    };
}

impl Holding {
    /// What is held, for messages.
    fn what(&self) -> &'static str {
        match self {
            Holding::Lock(_) => "lock",
            Holding::Read(_) => "shared lock",
            Holding::Permit(_) => "permit",
            Holding::Mode(_) => "lock",
            Holding::Leader(_) => "leadership",
        }
    }

    fn key(&self) -> &str {
        each!(self, guard => guard.key())
    }

    fn token(&self) -> FencingToken {
        each!(self, guard => guard.token())
    }

    fn sequencer(&self) -> Sequencer {
        each!(self, guard => guard.sequencer())
    }

    fn is_held(&self) -> bool {
        each!(self, guard => guard.is_held())
    }

    /// Resolves once the lock or leadership may no longer be held.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    async fn lost(&self) {
        each!(self, guard => guard.lost().await)
    }

    async fn release(self) -> lockline::Result<()> {
        match self {
            Holding::Lock(guard) => guard.release().await,
            Holding::Read(guard) => guard.release().await,
            Holding::Permit(guard) => guard.release().await,
            Holding::Mode(guard) => guard.release().await,
            Holding::Leader(leadership) => leadership.resign().await,
        }
    }
}

/// Waits in line for the lock, or campaigns, as `args` say; `None` when
/// `--nonblock` found the lock taken (no entry is left behind).
async fn acquire(args: &Args, session: &Session) -> lockline::Result<Option<Holding>> {
    let recipe = match &args.mode {
        Mode::Elect { proposal, .. } => {
            let election = session.election(&args.name)?;
            let leadership = match args.timeout {
                Some(timeout) => election.campaign_timeout(proposal.as_bytes(), timeout).await?,
                None => election.campaign(proposal.as_bytes()).await?,
            };
            return Ok(Some(Holding::Leader(leadership)));
        }
        Mode::Lock { recipe, .. } => *recipe,
        Mode::Listen | Mode::List | Mode::Check { .. } => Recipe::Exclusive,
    };
    let name = &args.name;
    // One try: `--nonblock`, or `--timeout 0` (which answers 124).
    if args.nonblock.is_some() || args.timeout == Some(Duration::ZERO) {
        let held = match recipe {
            Recipe::Exclusive => session.mutex(name)?.try_lock().await?.map(Holding::Lock),
            Recipe::Shared => session.rwlock(name)?.try_read().await?.map(Holding::Read),
            Recipe::Limit(permits) => session
                .semaphore(name, permits)?
                .try_acquire()
                .await?
                .map(Holding::Permit),
            Recipe::LockMode(mode) => session.resource(name)?.try_lock(mode).await?.map(Holding::Mode),
        };
        return match (held, args.nonblock) {
            (Some(held), _) => Ok(Some(held)),
            (None, Some(_)) => Ok(None),
            (None, None) => Err(Error::Timeout {
                name: name.clone(),
                waited: Duration::ZERO,
                held_by_this_session: false,
            }),
        };
    }
    let wait = async {
        Ok::<_, Error>(match recipe {
            Recipe::Exclusive => Holding::Lock(session.mutex(name)?.lock().await?),
            Recipe::Shared => Holding::Read(session.rwlock(name)?.read().await?),
            Recipe::Limit(permits) => Holding::Permit(session.semaphore(name, permits)?.acquire().await?),
            Recipe::LockMode(mode) => Holding::Mode(session.resource(name)?.lock(mode).await?),
        })
    };
    match (recipe, args.timeout) {
        (_, None) => wait.await.map(Some),
        (Recipe::Exclusive, Some(timeout)) => {
            Ok(Some(Holding::Lock(session.mutex(name)?.lock_timeout(timeout).await?)))
        }
        (Recipe::LockMode(mode), Some(timeout)) => Ok(Some(Holding::Mode(
            session.resource(name)?.lock_timeout(mode, timeout).await?,
        ))),
        // Dropping the wait removes its entry, as any cancelled acquire.
        (_, Some(timeout)) => match tokio::time::timeout(timeout, wait).await {
            Ok(held) => held.map(Some),
            Err(_) => Err(Error::Timeout {
                name: name.clone(),
                waited: timeout,
                held_by_this_session: false,
            }),
        },
    }
}

async fn hold(args: &Args, session: &Session, signals: &mut StopSignals) -> lockline::Result<Held> {
    let held = tokio::select! {
        // A signal that is pending when the lock is granted still cancels the
        // wait: dropping the acquire removes the entry, granted or not.
        biased;
        signal = signals.recv() => {
            note!("lockline: got {} while waiting for {:?}; leaving the queue", signal_name(signal), args.name);
            return Ok(Held::Cancelled(signal));
        }
        held = acquire(args, session) => match held? {
            Some(held) => held,
            None => {
                let code = args.nonblock.unwrap_or(DEFAULT_CONFLICT);
                note!("lockline: {:?} is taken (--nonblock: one try); exit {code}", args.name);
                return Ok(Held::Released(code));
            }
        },
    };
    let command = args.command();
    // With a command, standard output is the command's alone, unless asked.
    if command.is_empty() || args.print_key {
        output::key(held.key());
    }
    note!("lockline: holding {} with fencing token {}", held.key(), held.token());
    let code = if command.is_empty() {
        tokio::select! {
            // A loss ready together with a signal counts as a loss.
            biased;
            () = held.lost() => {
                note!("lockline: {} lost", held.what());
                close_lost(session).await;
                return Ok(Held::Lost);
            }
            _ = signals.recv() => 0,
        }
    } else {
        match run_command(&held, session, command, args.kill_after, signals).await {
            Some(code) => code,
            None => return Ok(Held::Lost),
        }
    };
    let what = held.what();
    match held.release().await {
        Ok(()) => {}
        // Lost after the command's group was gone (or, without a command,
        // after the signal): nothing ran without the lock, and there is
        // nothing left to release.
        Err(error @ (Error::SessionLost { .. } | Error::LockLost { .. })) => {
            note!("lockline: the {what} was lost once the command was gone; nothing to release: {error}");
        }
        // A failed release is lockline's own failure (125) whatever the
        // cause, an unreachable cluster included: the command ran with the
        // lock held all along.
        Err(error) => {
            note!(
                "lockline: could not release the {what}: {error}; the server frees it when the session's TTL runs out"
            );
            return Ok(Held::Released(FAILURE));
        }
    }
    Ok(Held::Released(code))
}

/// `elect --listen`: prints the leader's key and value on every change until
/// a signal.
async fn listen(args: &Args, session: &Session, signals: &mut StopSignals) -> lockline::Result<Held> {
    let election = session.election(&args.name)?;
    let changes = election.observe();
    tokio::pin!(changes);
    loop {
        let change = tokio::select! {
            biased;
            _ = signals.recv() => return Ok(Held::Released(0)),
            () = output::stdout_failed() => {
                note!("lockline: standard output is closed; no longer listening to {:?}", args.name);
                return Ok(Held::Released(FAILURE));
            }
            change = changes.next() => change,
        };
        match change {
            // No leader: nothing to print, as etcdctl.
            Some(Ok(None)) => {}
            Some(Ok(Some(leader))) => {
                let mut text = Vec::with_capacity(leader.key().len() + leader.value().len() + 2);
                text.extend_from_slice(leader.key().as_bytes());
                text.push(b'\n');
                text.extend_from_slice(leader.value());
                text.push(b'\n');
                output::output(text);
            }
            Some(Err(error)) => return Err(error),
            None => {
                return Err(Error::Closed {
                    session: session.id().to_string(),
                })
            }
        }
    }
}

/// `list`: prints the queue of `NAME`, the holder first (a lock-mode
/// resource's in queue order, see [`modes::listing`]).
async fn list(args: &Args, session: &Session, signals: &mut StopSignals) -> lockline::Result<Held> {
    let read = async {
        let queue = session.queue(&args.name).await?;
        let modes = modes::listing(session, &args.name, &queue).await?;
        Ok::<_, Error>((queue, modes))
    };
    let (queue, modes) = tokio::select! {
        biased;
        signal = signals.recv() => return Ok(Held::Cancelled(signal)),
        read = read => read?,
    };
    let text = match modes {
        Some(text) => text,
        None => {
            let mut text = String::new();
            for contender in queue {
                let owner = contender.owner.as_deref().unwrap_or("-");
                text.push_str(&format!(
                    "{}\t{owner}\t{}\t{}",
                    contender.key,
                    contender.token,
                    contender.kind.label()
                ));
                // Next in line after a holder that lost the lock
                // involuntarily: not the holder yet, whatever its place.
                if let Some(until) = contender.delayed_until {
                    text.push_str(&format!("\tlock-delay until {}", output::utc(until)));
                }
                text.push('\n');
            }
            text
        }
    };
    output::output(text.into_bytes());
    // The listing is all `list` is for: a listing that could not be written
    // is a failure, not a success.
    let _ = tokio::task::spawn_blocking(|| output::finish(OUTPUT_TIMEOUT)).await;
    if output::stdout_has_failed() {
        note!("lockline: cannot write the queue of {:?} on standard output", args.name);
        return Ok(Held::Released(FAILURE));
    }
    Ok(Held::Released(0))
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
    guard: &Holding,
    session: &Session,
    command: &[String],
    kill_after: Duration,
    signals: &mut StopSignals,
) -> Option<u8> {
    let Some((program, arguments)) = command.split_first() else {
        return Some(0);
    };
    let token = guard.token().to_string();
    let sequencer = guard.sequencer().to_string();
    let env = [
        ("LOCKLINE_KEY", OsStr::new(guard.key())),
        ("LOCKLINE_TOKEN", OsStr::new(&token)),
        ("LOCKLINE_SEQUENCER", OsStr::new(&sequencer)),
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
        note!(
            "lockline: {} lost before the command started; not running it",
            guard.what()
        );
        close_lost(session).await;
        return None;
    }
    let mut group = match ProcessGroup::spawn(program, arguments, env) {
        Ok(group) => group,
        Err(error) => {
            note!("lockline: cannot run {program:?}: {error}");
            return Some(match error.kind() {
                std::io::ErrorKind::NotFound => NOT_FOUND,
                _ => CANNOT_RUN,
            });
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
            note!("lockline: {} lost; stopping the command", guard.what());
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
            note!("lockline: {} lost while the command's group was being stopped", guard.what());
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
        with_env(line, &[])
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
        assert_eq!(parsed.command(), ["echo", "hi"]);
        assert!(!parsed.print_key);
    }

    #[test]
    fn parses_elect_listen_and_list() {
        let elect = args("elect --etcd http://a:1 --print-key jobs/leader node-a -- sh -c true").expect("parse");
        assert_eq!(
            elect.mode,
            super::Mode::Elect {
                proposal: "node-a".into(),
                command: vec!["sh".into(), "-c".into(), "true".into()]
            }
        );
        assert!(elect.print_key);
        let bare = args("elect --zookeeper h:1 jobs/leader node-a").expect("parse");
        assert_eq!(
            bare.mode,
            super::Mode::Elect {
                proposal: "node-a".into(),
                command: vec![]
            }
        );
        for line in [
            "elect -l --etcd http://a:1 jobs/leader",
            "elect --etcd http://a:1 --listen jobs/leader",
        ] {
            let listen = args(line).expect("parse");
            assert_eq!(listen.mode, super::Mode::Listen, "{line}");
            assert_eq!(listen.name, "jobs/leader");
        }
        let list = args("list --etcd http://a:1 jobs/x").expect("parse");
        assert_eq!(list.mode, super::Mode::List);
        // `--` between NAME and COMMAND is not the command.
        let lock = args("lock --etcd http://a:1 jobs/x -- echo hi").expect("parse");
        assert_eq!(lock.command(), ["echo", "hi"]);
        for line in [
            "elect --etcd http://a:1 jobs/leader",
            "elect -l --etcd http://a:1 jobs/leader node-a",
            "lock -l --etcd http://a:1 jobs/x",
            "list --etcd http://a:1 jobs/x extra",
            "list --etcd http://a:1 --print-key jobs/x",
            "list --etcd http://a:1 --timeout 1 jobs/x",
            "elect -l --etcd http://a:1 --timeout 1 jobs/x",
            "lock --etcd http://a:1 --print-key=yes jobs/x true",
        ] {
            assert!(args(line).is_err(), "accepted: {line}");
        }
    }

    #[test]
    fn zookeeper_connect_stands_in_for_the_flag_and_both_variables_are_refused() {
        let zk = with_env("lock x", &[("ZOOKEEPER_CONNECT", "z1:2181,z2:2181/apps")]).expect("parse");
        assert_eq!(zk.server, super::Server::ZooKeeper("z1:2181,z2:2181/apps".into()));
        let both = [
            ("ZOOKEEPER_CONNECT", "z1:2181"),
            ("ETCDCTL_ENDPOINTS", "http://e1:2379"),
        ];
        let error = with_env("lock x", &both).expect_err("both variables without a flag");
        assert!(
            error.contains("ETCDCTL_ENDPOINTS") && error.contains("ZOOKEEPER_CONNECT") && !error.contains('\n'),
            "{error}"
        );
        // A flag picks, whichever variables are set.
        let etcd = with_env("lock --etcd http://f:1 x", &both).expect("parse");
        assert_eq!(etcd.server, super::Server::Etcd(vec!["http://f:1".into()]));
        let zk = with_env("lock --zookeeper f:1 x", &both).expect("parse");
        assert_eq!(zk.server, super::Server::ZooKeeper("f:1".into()));
        let zk = with_env("lock --zookeeper f:1 x", &[("ETCDCTL_ENDPOINTS", "http://e1:2379")]).expect("parse");
        assert_eq!(zk.server, super::Server::ZooKeeper("f:1".into()));
        let etcd = with_env("lock --etcd http://f:1 x", &[("ZOOKEEPER_CONNECT", "z1:2181")]).expect("parse");
        assert_eq!(etcd.server, super::Server::Etcd(vec!["http://f:1".into()]));
    }

    #[test]
    fn statuses_of_lockline_failures_are_those_of_the_table() {
        use lockline::Error;
        let status = |error: Error| super::failure_status(&error);
        assert_eq!(
            status(Error::AuthenticationFailed {
                backend: "etcd",
                reason: "no".into()
            }),
            121
        );
        assert_eq!(
            status(Error::PermissionDenied {
                backend: "etcd",
                operation: "queue on",
                key: "k".into(),
                reason: "no".into()
            }),
            121
        );
        assert_eq!(
            status(Error::Unavailable {
                backend: "etcd",
                reason: "no member answered".into(),
                source: None
            }),
            122
        );
        assert_eq!(
            status(Error::InvalidName {
                name: "a//b".into(),
                reason: "r".into()
            }),
            123
        );
        assert_eq!(status(Error::InvalidOptions { reason: "r".into() }), 123);
        assert_eq!(
            status(Error::Timeout {
                name: "x".into(),
                waited: std::time::Duration::from_secs(1),
                held_by_this_session: false
            }),
            124
        );
        assert_eq!(status(Error::SessionLost { session: "s".into() }), 125);
        assert_eq!(status(Error::LockLost { key: "k".into() }), 125);
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
        let single = args("lock --etcd http://a:1 -t 5 x true").expect_err("an unknown short option");
        assert!(single.contains("unknown option \"-t\""), "{single}");
        let late = args("elect --etcd http://a:1 jobs/x -l").expect_err("-l after NAME");
        assert!(late.contains("goes before NAME"), "{late}");
        // After `--`, a NAME may begin with '-'.
        assert_eq!(args("lock --etcd http://a:1 -- -x true").expect("parse").name, "-x");
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
        let parsed = parse(line.split_whitespace().map(str::to_owned).collect(), move |name| {
            vars.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())
        });
        match parsed? {
            super::Action::Run(args) => Ok(*args),
            super::Action::Show(_) | super::Action::Completions(_) => Err("not a run".to_owned()),
        }
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
    fn etcdctl_endpoints_stands_in_for_the_flag() {
        // The TLS and credential variables are read by clap from the
        // process's environment: `tests/cli_arguments.rs` runs them.
        let vars = [("ETCDCTL_ENDPOINTS", "https://e1:2379,https://e2:2379")];
        let parsed = with_env("lock x", &vars).expect("parse");
        assert_eq!(
            parsed.server,
            super::Server::Etcd(vec!["https://e1:2379".into(), "https://e2:2379".into()])
        );
        let flagged = with_env("lock --etcd https://f:1 x", &vars).expect("parse");
        assert_eq!(flagged.server, super::Server::Etcd(vec!["https://f:1".into()]));
        let error = with_env("lock x", &[("ETCDCTL_ENDPOINTS", ",")]).expect_err("no endpoint");
        assert!(error.contains("holds no endpoint"), "{error}");
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
    fn takes_postgres_and_mysql_urls_of_their_own_schemes() {
        let pg = args("lock --postgres postgres://u:p@db:5432/app x").expect("parse");
        assert_eq!(pg.server, super::Server::Postgres("postgres://u:p@db:5432/app".into()));
        let pg = args("list --postgres=POSTGRESQL://db/app x").expect("parse");
        assert_eq!(pg.server, super::Server::Postgres("POSTGRESQL://db/app".into()));
        for url in ["mysql://u:p@db:3306/app", "mariadb://db/app"] {
            let my = args(&format!("elect --mysql {url} x p")).expect("parse");
            assert_eq!(my.server, super::Server::MySql(url.into()));
        }
        for (line, says) in [
            ("lock --postgres mysql://db/app x", "goes to --mysql"),
            ("lock --mysql postgres://db/app x", "goes to --postgres"),
            ("lock --mysql redis://db x", "scheme redis://"),
            ("lock --postgres db:5432/app x", "not a URL"),
            ("lock --postgres", "a value is required for '--postgres"),
            (
                "lock --postgres postgres://db/a --mysql mysql://db/a x",
                "--postgres and --mysql cannot be used together",
            ),
            (
                "lock --mysql mysql://db/a --etcd http://e:1 x",
                "--etcd and --mysql cannot be used together",
            ),
            (
                "lock --zookeeper z:1 --postgres postgres://db/a x",
                "--zookeeper and --postgres cannot be used together",
            ),
            (
                "lock --postgres postgres://db/a --redis redis://r x",
                "--redis and --postgres cannot be used together",
            ),
            // The existing pairs keep their words.
            (
                "lock --zookeeper z:1 --etcd http://e:1 x",
                "--etcd and --zookeeper cannot be used together",
            ),
            (
                "lock --redis redis://r --etcd http://e:1 x",
                "--etcd and --redis cannot be used together",
            ),
        ] {
            let error = args(line).expect_err(line);
            assert!(error.contains(says) && !error.contains('\n'), "{line}: {error}");
        }
        // The same flag twice: the last one counts.
        let twice = args("lock --postgres postgres://a/x --postgres postgres://b/x x").expect("parse");
        assert_eq!(twice.server, super::Server::Postgres("postgres://b/x".into()));
    }

    #[test]
    fn database_url_is_the_last_fallback_and_its_scheme_is_checked() {
        let pg = with_env("lock x", &[("DATABASE_URL", "postgresql://u:p@db/app")]).expect("parse");
        assert_eq!(pg.server, super::Server::Postgres("postgresql://u:p@db/app".into()));
        let my = with_env("lock x", &[("DATABASE_URL", "mariadb://u:p@db/app")]).expect("parse");
        assert_eq!(my.server, super::Server::MySql("mariadb://u:p@db/app".into()));
        // Flags and the other servers' variables win; a DATABASE_URL they
        // override is not even read.
        let bad = ("DATABASE_URL", "sqlite://app.db");
        let etcd = with_env("lock x", &[bad, ("ETCDCTL_ENDPOINTS", "http://e:1")]).expect("parse");
        assert_eq!(etcd.server, super::Server::Etcd(vec!["http://e:1".into()]));
        let zk = with_env("lock x", &[bad, ("ZOOKEEPER_CONNECT", "z:1")]).expect("parse");
        assert_eq!(zk.server, super::Server::ZooKeeper("z:1".into()));
        let flag = with_env("lock --mysql mysql://db/a x", &[bad]).expect("parse");
        assert_eq!(flag.server, super::Server::MySql("mysql://db/a".into()));
        for (url, says) in [
            (
                "sqlite://app.db",
                "DATABASE_URL has the scheme sqlite://, which lockline does not speak; expected postgres://, postgresql://, mysql:// or mariadb://",
            ),
            ("redis://:SECRET-5@r:6379", "DATABASE_URL has the scheme redis://"),
            ("host=db user=app password=SECRET-5", "DATABASE_URL is not a URL (no SCHEME://)"),
            ("app:SECRET-5://db", "DATABASE_URL is not a URL"),
        ] {
            let error = with_env("lock x", &[("DATABASE_URL", url)]).expect_err(url);
            assert!(error.contains(says), "{url}: {error}");
            assert!(!error.contains("SECRET-5") && !error.contains('\n'), "{url}: {error}");
        }
        // An empty one is not set.
        let error = with_env("lock x", &[("DATABASE_URL", "")]).expect_err("no server");
        assert!(
            error.contains("a server is required") && error.contains("DATABASE_URL"),
            "{error}"
        );
    }

    #[test]
    fn sql_servers_take_tls_and_credentials_in_the_url() {
        for line in [
            "lock --postgres postgres://db/a --cacert ca.pem x",
            "lock --postgres postgres://db/a --user alice:pw x",
            "lock --mysql mysql://db/a --password pw x",
            "lock --mysql mysql://db/a --zk-auth digest:a:b x",
            "lock --postgres postgres://db/a --marker-prefix p/ x",
        ] {
            let error = args(line).expect_err(line);
            assert!(error.contains("put them in the URL"), "{line}: {error}");
        }
        let error = args("lock --postgres postgres://db/a --cacert ca.pem x").expect_err("TLS flag");
        assert!(
            error.contains("with --postgres") && error.contains("sslmode="),
            "{error}"
        );
        let error = args("lock --mysql mysql://db/a --cacert ca.pem x").expect_err("TLS flag");
        assert!(error.contains("with --mysql") && error.contains("ssl-mode="), "{error}");
        let error = with_env("lock --cacert ca.pem x", &[("DATABASE_URL", "postgres://db/a")]).expect_err("TLS flag");
        assert!(error.contains("with DATABASE_URL (--postgres)"), "{error}");
    }

    #[test]
    fn never_shows_a_database_password() {
        let parsed = args("lock --postgres postgres://app:SECRET-6@db/app x").expect("parse");
        let shown = format!("{parsed:?}");
        assert!(shown.contains("postgres://") && !shown.contains("SECRET-6"), "{shown}");
        let parsed = args("lock --redis redis://:SECRET-6@r:6379 x").expect("parse");
        assert!(!format!("{parsed:?}").contains("SECRET-6"));
        let hidden = super::url_secrets;
        assert_eq!(hidden("postgres://app:s3cret@db/app"), ["s3cret"]);
        assert_eq!(hidden("postgres://app:s%40c@db/app"), ["s%40c", "s@c"]);
        // Unencoded '/' and '@' in a password, a password in the query.
        assert!(hidden("postgres://app:pa/ss@db/app").contains(&"pa/ss".to_owned()));
        assert!(hidden("mysql://app:p@ss@db/app").contains(&"p@ss".to_owned()));
        assert_eq!(
            hidden("postgres://app@db?password=q%2Fw&sslmode=require"),
            ["q%2Fw", "q/w"]
        );
        assert!(hidden("postgres://db/app").is_empty());
        let parsed = args("lock --etcd http://e:1 --user alice:pw-1 x").expect("parse");
        assert_eq!(parsed.secrets(), ["pw-1"]);
    }

    #[test]
    fn lock_delay_is_at_most_a_minute_for_lock_and_elect() {
        let default = args("lock --etcd http://a:1 x").expect("parse");
        assert!(default.lock_delay.is_zero());
        let given = args("lock --etcd http://a:1 --lock-delay 1.5 x true").expect("parse");
        assert_eq!(given.lock_delay.as_millis(), 1500);
        let elect = args("elect --etcd http://a:1 --lock-delay=60 x p").expect("parse");
        assert_eq!(elect.lock_delay.as_secs(), 60);
        for bad in ["-1", "soon", "NaN", "inf", "60.5", "61", ""] {
            let line = format!("lock --etcd http://a:1 --lock-delay={bad} x true");
            let error = args(&line).expect_err(&line);
            assert!(error.contains("for '--lock-delay <SECS>'"), "{line}: {error}");
        }
        assert!(args("lock --etcd http://a:1 --lock-delay").is_err(), "no value");
        for line in [
            "list --etcd http://a:1 --lock-delay 1 x",
            "elect -l --etcd http://a:1 --lock-delay 1 x",
        ] {
            let error = args(line).expect_err(line);
            assert!(error.contains("--lock-delay is for lock and elect"), "{line}: {error}");
        }
    }

    #[test]
    fn check_takes_one_well_formed_sequencer_and_the_server_options() {
        let parsed = args("check --etcd http://a:1 lockline1:mutex:7:jobs/run%201").expect("parse");
        let super::Mode::Check { sequencer } = &parsed.mode else {
            panic!("not check: {:?}", parsed.mode);
        };
        assert_eq!(sequencer.name(), "jobs/run 1");
        assert_eq!(sequencer.token().get(), 7);
        assert_eq!(parsed.name, "jobs/run 1");
        assert!(!parsed.verbose && parsed.command().is_empty());
        let verbose = args("check --verbose --postgres postgres://db/a -- lockline1:leader:9:e").expect("parse");
        assert!(verbose.verbose);
        for (line, says) in [
            ("check --etcd http://a:1", "SEQUENCER is required"),
            (
                "check --etcd http://a:1 lockline1:mutex:7:x extra",
                "check takes SEQUENCER only",
            ),
            ("check --etcd http://a:1 jobs/x", "not a lockline sequencer"),
            ("check --etcd http://a:1 lockline2:mutex:7:x", "version"),
            ("check --etcd http://a:1 lockline1:mutex:seven:x", "not a number"),
            ("check --etcd http://a:1 lockline1:exclusive:7:x", "unknown mode"),
            ("check --etcd http://a:1 lockline1:mutex:7:", "the name is empty"),
            (
                "check --etcd http://a:1 --ttl 3 lockline1:mutex:7:x",
                "--ttl is for lock, elect and list",
            ),
            (
                "check --etcd http://a:1 --timeout 3 lockline1:mutex:7:x",
                "--timeout is for lock and elect",
            ),
            (
                "check --etcd http://a:1 --kill-after 3 lockline1:mutex:7:x",
                "--kill-after is for lock and elect",
            ),
            (
                "check --etcd http://a:1 --lock-delay 3 lockline1:mutex:7:x",
                "--lock-delay is for lock and elect",
            ),
            (
                "check --etcd http://a:1 --print-key lockline1:mutex:7:x",
                "--print-key is for lock and elect",
            ),
            ("check --etcd http://a:1 -l lockline1:mutex:7:x", "-l is for elect"),
            ("lock --etcd http://a:1 --verbose x", "--verbose is for check"),
            (
                "check --etcd http://a:1 --verbose=yes lockline1:mutex:7:x",
                "unexpected value",
            ),
        ] {
            let error = args(line).expect_err(line);
            assert!(error.contains(says), "{line}: {error}");
        }
    }

    #[test]
    fn lock_takes_one_recipe_and_nonblock_its_status() {
        use super::{Mode, Recipe};
        let recipe = |line: &str| match args(line).expect(line).mode {
            Mode::Lock { recipe, .. } => recipe,
            other => panic!("{line}: {other:?}"),
        };
        assert_eq!(recipe("lock --etcd http://a:1 x"), Recipe::Exclusive);
        assert_eq!(recipe("lock --etcd http://a:1 -s x"), Recipe::Shared);
        assert_eq!(recipe("lock --shared --etcd http://a:1 x true"), Recipe::Shared);
        assert_eq!(recipe("lock --etcd http://a:1 --limit 3 x"), Recipe::Limit(3));
        assert_eq!(recipe("lock --etcd http://a:1 --limit=1 -n x"), Recipe::Limit(1));
        let nonblock = |line: &str| args(line).expect(line).nonblock;
        assert_eq!(nonblock("lock --etcd http://a:1 x"), None);
        assert_eq!(nonblock("lock --etcd http://a:1 -n x"), Some(1));
        assert_eq!(nonblock("lock --etcd http://a:1 -sn x"), Some(1));
        assert_eq!(
            nonblock("lock --etcd http://a:1 --nonblock --conflict-exit-code 7 x"),
            Some(7)
        );
        // After NAME, the command's own flags.
        let parsed = args("lock --etcd http://a:1 x flock -s -n y").expect("parse");
        assert_eq!(parsed.command(), ["flock", "-s", "-n", "y"]);
        assert_eq!(parsed.nonblock, None);
        for (line, says) in [
            (
                "lock --etcd http://a:1 -s --limit 2 x",
                "--shared and --limit cannot be used together",
            ),
            ("lock --etcd http://a:1 --limit 0 x", "from 1 to"),
            ("lock --etcd http://a:1 --limit 10001 x", "from 1 to"),
            (
                "lock --etcd http://a:1 -n --timeout 1 x",
                "--nonblock and --timeout cannot be used together",
            ),
            ("lock --etcd http://a:1 --conflict-exit-code 7 x", "give -n too"),
            (
                "lock --etcd http://a:1 -n --conflict-exit-code -1 x",
                "--conflict-exit-code",
            ),
            ("elect --etcd http://a:1 -n x p", "-n is for lock"),
            ("list --etcd http://a:1 --shared x", "--shared is for lock"),
        ] {
            let error = args(line).expect_err(line);
            assert!(error.contains(says) && !error.contains('\n'), "{line}: {error}");
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
