//! The command line on `clap`: what each subcommand takes, its help, and
//! errors turned into the one line `lockline` prints (status 123).
//!
//! Two choices keep the documented behaviour:
//!
//! - Each subcommand's NAME (and PROPOSAL) and COMMAND are one positional
//!   list whose values start at NAME (`trailing_var_arg`): options come
//!   before NAME, and everything after it, `--help` or `--ttl` included,
//!   belongs to the command. One `--` right after NAME (or PROPOSAL) is
//!   dropped by the caller.
//! - The server flags are one argument group, with no `env`: clap counts a
//!   value from the environment as given, so `ETCDCTL_ENDPOINTS` set would
//!   refuse `--zookeeper`, where flags win. `ETCDCTL_ENDPOINTS`,
//!   `ZOOKEEPER_CONNECT` and `DATABASE_URL` (whose scheme picks the flag it
//!   stands in for) are read once the flags are parsed. The TLS and
//!   credential flags take their `ETCDCTL_*` and `LOCKLINE_ZK_AUTH`
//!   variables through `env`; where a value came from is asked of the
//!   matches, since those variables apply to one backend only.

use std::collections::HashSet;
use std::time::Duration;

use clap::builder::{PossibleValue, TypedValueParser};
use clap::error::{ContextKind, ContextValue, ErrorKind};
use clap::{Args, CommandFactory, Parser, Subcommand};

use lockline::{LockMode, MAX_LOCK_DELAY, MAX_PERMITS};

/// The longest `--kill-after` accepted: a grace is meant to be short, since on
/// a lost lock the command runs unprotected during it.
pub(crate) const MAX_KILL_AFTER: Duration = Duration::from_secs(3600);

const SERVER: &str = "Server (one of)";
const SECURE: &str = "Secure clusters (etcd, ZooKeeper)";

const TOP_USAGE: &str = "lockline lock [-s|--limit N|--mode MODE] [-n] [OPTIONS] NAME [--] [COMMAND [ARGS...]]
       lockline elect [OPTIONS] NAME PROPOSAL [--] [COMMAND [ARGS...]]
       lockline elect -l|--listen [OPTIONS] NAME
       lockline list [OPTIONS] NAME
       lockline check [OPTIONS] SEQUENCER
       lockline completions bash|zsh|fish
       lockline --help | --version | help [COMMAND]";

const TOP_TEMPLATE: &str = "\
{about}

usage: {usage}

OPTIONS come before NAME, as --flag VALUE or --flag=VALUE; a NAME that
begins with '-' goes after `--`. `--` ends the options; one `--` between
NAME (PROPOSAL) and COMMAND is dropped. `lockline COMMAND --help` shows one
command's options.

Commands:
{subcommands}

{after-help}";

const SUBCOMMAND_TEMPLATE: &str = "\
{about}

usage: {usage}

{all-args}{after-help}";

/// What the whole help tells after the options.
const LIST_OUTPUT: &str = "\
list prints one line per contender, the holder first:
KEY<TAB>OWNER<TAB>TOKEN<TAB>KIND, no header (OWNER - when unknown); a
contender in lock-delay (not the holder yet: nobody holds until then) has a
fifth field, \"lock-delay until TIME\" (UTC, RFC 3339). A name taken with
--mode lists its contenders in queue order, KIND lock-MODE (the mode held,
or asked for while waiting) and a fifth field, granted, waiting or
\"converting to MODE\"; TOKEN is - while waiting.";

const OUTPUT: &str = "\
Standard output: with COMMAND it is COMMAND's alone; the held key goes to
standard error (\"lockline: holding KEY with fencing token N\"), and to
standard output as well with --print-key, in no promised order relative to
COMMAND's output. Without COMMAND the key goes to standard output.
Diagnostics always go to standard error.";

const ENVIRONMENT: &str = "\
Read from the environment (flags win): ETCDCTL_ENDPOINTS (stands in for
--etcd), ZOOKEEPER_CONNECT (stands in for --zookeeper; with both set and no
flag, lockline refuses to guess), DATABASE_URL (stands in for --postgres or
--mysql, by its scheme, when no flag and neither of those two picks a
server), ETCDCTL_CACERT, ETCDCTL_CERT, ETCDCTL_KEY, ETCDCTL_USER,
ETCDCTL_PASSWORD (etcd only), and LOCKLINE_ZK_AUTH (ZooKeeper credentials,
digest|sasl:USER:PASSWORD). Passwords are never printed.";

const SET_FOR_COMMAND: &str = "\
Set for COMMAND: LOCKLINE_KEY (the held key), LOCKLINE_TOKEN (the fencing
token: pass it to whatever the lock protects, which refuses lower tokens) and
LOCKLINE_SEQUENCER (lockline1:MODE:TOKEN:NAME, MODE mutex, read under -s,
permit-N under --limit N, lock-PW (say) under --mode PW, leader under
elect: pass it to a resource that cannot keep tokens, which asks `lockline
check` whether it is current).";

const EXIT_STATUSES: &str = "\
Exit statuses:
  COMMAND's own status, or 128+N when it was killed by signal N
  0     without COMMAND, released after SIGINT, SIGTERM, SIGHUP or SIGQUIT;
        elect -l ended by a signal; list done; check: the sequencer is current
  1     check: the sequencer is not current; lock -n: NAME is taken
        (the --conflict-exit-code status, when given)
  120   the lock (or leadership) was lost while held
  121   credentials or permission refused
  122   cluster unreachable within the deadline
  123   bad arguments or options (a malformed SEQUENCER among them)
  124   --timeout ran out
  125   any other lockline failure (session lost while waiting, backend
        error, a release that failed, ...)
  126   COMMAND found but could not be run
  127   COMMAND not found
  128+N lockline itself got signal N while waiting or while COMMAND ran";

/// The help of `lock` and `elect`, after their options.
fn holding_after_help() -> String {
    format!("{OUTPUT}\n\n{ENVIRONMENT}\n\n{SET_FOR_COMMAND}\n\n{EXIT_STATUSES}\n")
}

/// The help of `list` and `check`, after their options.
fn reading_after_help() -> String {
    format!("{ENVIRONMENT}\n\n{EXIT_STATUSES}\n")
}

/// The command line.
#[derive(Parser, Debug)]
#[command(
    name = "lockline",
    version,
    propagate_version = true,
    args_override_self = true,
    subcommand_required = true,
    about = "lockline: distributed locks and leader election on etcd, ZooKeeper, Redis,\n\
             PostgreSQL or MariaDB/MySQL, for scripts.",
    override_usage = TOP_USAGE,
    help_template = TOP_TEMPLATE,
    after_help = top_after_help(),
)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub(crate) command: Command,
}

/// The subcommands.
#[derive(Subcommand, Debug)]
pub(crate) enum Command {
    /// Hold a lock while a command runs
    ///
    /// Waits in line for the lock NAME, then runs COMMAND with the lock held
    /// and releases it when COMMAND exits; without COMMAND, prints the held
    /// key and holds the lock until SIGINT, SIGTERM, SIGHUP or SIGQUIT. The
    /// lock is exclusive; with -s it is shared (a read lock), with --limit N
    /// a permit of a semaphore of N, with --mode MODE it is taken in one of
    /// the six lock modes (NL, CR, CW, PR, PW, EX); with -n it is one try.
    #[command(
        help_template = SUBCOMMAND_TEMPLATE,
        override_usage = "lockline lock [-s|--limit N|--mode MODE] [-n] [OPTIONS] NAME [--] [COMMAND [ARGS...]]",
        after_help = holding_after_help(),
    )]
    Lock(LockArgs),
    /// Lead an election while a command runs, or watch its leaders
    ///
    /// Campaigns in the election NAME with PROPOSAL as the value; once
    /// leader, runs COMMAND as lock does, or without COMMAND prints the leader
    /// key and leads until a signal, then resigns. With -l, prints the leader
    /// of NAME, its key and its value on two lines, at every change, until a
    /// signal (no leader: nothing is printed).
    #[command(
        help_template = SUBCOMMAND_TEMPLATE,
        override_usage = "lockline elect [OPTIONS] NAME PROPOSAL [--] [COMMAND [ARGS...]]\n       \
                          lockline elect -l|--listen [OPTIONS] NAME",
        after_help = holding_after_help(),
    )]
    Elect(ElectArgs),
    /// Print the queue of a lock or election
    ///
    /// Prints the queue of NAME, the holder first: one line per contender,
    /// KEY<TAB>OWNER<TAB>TOKEN<TAB>KIND, no header (OWNER - when unknown); a
    /// contender in lock-delay (not the holder yet: nobody holds until then)
    /// has a fifth field, "lock-delay until TIME" (UTC, RFC 3339). A name
    /// taken with lock --mode lists in queue order, KIND lock-MODE, with a
    /// fifth field: granted, waiting or "converting to MODE" (TOKEN - while
    /// waiting).
    #[command(help_template = SUBCOMMAND_TEMPLATE, override_usage = "lockline list [OPTIONS] NAME", after_help = reading_after_help())]
    List(ListArgs),
    /// Ask whether a holder's sequencer is still current
    ///
    /// Asks the server whether SEQUENCER (a holder's LOCKLINE_SEQUENCER,
    /// lockline1:MODE:TOKEN:NAME) is still current: exit 0 if it is, 1 if not
    /// (released, lost, or a later holder's turn); prints nothing unless
    /// --verbose.
    #[command(help_template = SUBCOMMAND_TEMPLATE, override_usage = "lockline check [OPTIONS] SEQUENCER", after_help = reading_after_help())]
    Check(CheckArgs),
    /// Print a shell completion script
    ///
    /// Prints a completion script for SHELL on standard output (bash:
    /// `source <(lockline completions bash)`).
    #[command(help_template = SUBCOMMAND_TEMPLATE, override_usage = "lockline completions bash|zsh|fish")]
    Completions {
        /// The shell: bash, zsh or fish (elvish and powershell too).
        #[arg(value_name = "SHELL")]
        shell: clap_complete::Shell,
    },
}

/// `lock`'s arguments.
#[derive(Args, Debug)]
pub(crate) struct LockArgs {
    #[command(flatten)]
    pub(crate) connection: Connection,
    #[command(flatten)]
    pub(crate) session: SessionFlags,
    #[command(flatten)]
    pub(crate) holding: HoldingFlags,
    /// lock: a shared (read) lock: -s holders hold together, a lock without
    /// -s waits for them and they for it (a Curator read lock on ZooKeeper)
    #[arg(short = 's', long, conflicts_with = "limit")]
    pub(crate) shared: bool,
    /// lock: a permit of a semaphore of N (as consul lock -n): up to N
    /// holders at once; every contender of NAME must give the same N
    #[arg(long, value_name = "N", value_parser = permits, allow_hyphen_values = true)]
    pub(crate) limit: Option<usize>,
    /// lock: take NAME in a lock mode (any case): holders of compatible
    /// modes hold together (NL with all; CR with all but EX; CW with NL, CR,
    /// CW; PR with NL, CR, PR; PW with NL, CR; EX with NL); every contender
    /// of NAME takes it with --mode
    #[arg(long, value_name = "MODE", value_parser = LockModes, conflicts_with_all = ["shared", "limit"])]
    pub(crate) mode: Option<LockMode>,
    /// lock: one try, as flock -n: if NAME is taken, exit at once with the
    /// --conflict-exit-code status, leaving no entry behind
    #[arg(short = 'n', long, conflicts_with = "timeout")]
    pub(crate) nonblock: bool,
    /// lock -n: the status when NAME is taken (default 1, as flock -E)
    #[arg(long, value_name = "STATUS", value_parser = clap::value_parser!(u8), allow_hyphen_values = true)]
    pub(crate) conflict_exit_code: Option<u8>,
    /// NAME, then COMMAND and its ARGS (everything after NAME is COMMAND's).
    #[arg(value_name = "NAME", num_args = 0.., trailing_var_arg = true, hide = true)]
    pub(crate) rest: Vec<String>,
}

/// `elect`'s arguments.
#[derive(Args, Debug)]
pub(crate) struct ElectArgs {
    #[command(flatten)]
    pub(crate) connection: Connection,
    #[command(flatten)]
    pub(crate) session: SessionFlags,
    #[command(flatten)]
    pub(crate) holding: HoldingFlags,
    /// elect: print the leaders instead of campaigning
    #[arg(short = 'l', long)]
    pub(crate) listen: bool,
    /// NAME, then PROPOSAL (not with -l), then COMMAND and its ARGS.
    #[arg(value_name = "NAME", num_args = 0.., trailing_var_arg = true, hide = true)]
    pub(crate) rest: Vec<String>,
}

/// `list`'s arguments.
#[derive(Args, Debug)]
pub(crate) struct ListArgs {
    #[command(flatten)]
    pub(crate) connection: Connection,
    #[command(flatten)]
    pub(crate) session: SessionFlags,
    /// The lock's (or election's) name.
    #[arg(value_name = "NAME", num_args = 0.., trailing_var_arg = true, hide = true)]
    pub(crate) rest: Vec<String>,
}

/// `check`'s arguments.
#[derive(Args, Debug)]
pub(crate) struct CheckArgs {
    #[command(flatten)]
    pub(crate) connection: Connection,
    /// check: print "current" or "not current" on standard output
    #[arg(long)]
    pub(crate) verbose: bool,
    /// A holder's LOCKLINE_SEQUENCER, lockline1:MODE:TOKEN:NAME.
    #[arg(value_name = "SEQUENCER", num_args = 0.., trailing_var_arg = true, hide = true)]
    pub(crate) rest: Vec<String>,
}

/// The server and how to reach it: every subcommand but `completions`.
#[derive(Args, Debug)]
pub(crate) struct Connection {
    #[command(flatten)]
    pub(crate) server: ServerFlags,
    #[command(flatten)]
    pub(crate) security: SecurityFlags,
}

/// One server flag at most (clap refuses two); none: the environment's.
#[derive(Args, Debug)]
#[group(id = "server", multiple = false)]
pub(crate) struct ServerFlags {
    /// etcd endpoints, http[s]://HOST:PORT (or ETCDCTL_ENDPOINTS)
    #[arg(long, value_name = "URL[,URL...]", help_heading = SERVER, allow_hyphen_values = true)]
    pub(crate) etcd: Option<String>,
    /// a ZooKeeper connect string (or ZOOKEEPER_CONNECT)
    #[arg(long, value_name = "HOST:PORT[,...][/CHROOT]", help_heading = SERVER, allow_hyphen_values = true)]
    pub(crate) zookeeper: Option<String>,
    /// a Redis node, redis://[:PASSWORD@]HOST:PORT[/DB] (rediss:// for TLS)
    #[arg(long, value_name = "URL", help_heading = SERVER, allow_hyphen_values = true)]
    pub(crate) redis: Option<String>,
    /// a PostgreSQL database, postgres[ql]://USER:PASSWORD@HOST:PORT/DATABASE
    /// (TLS: ?sslmode=require, or verify-full&sslrootcert=FILE); or
    /// DATABASE_URL, a postgres[ql]:// URL
    #[arg(long, value_name = "URL", help_heading = SERVER, allow_hyphen_values = true)]
    pub(crate) postgres: Option<String>,
    /// a MariaDB or MySQL database, mysql|mariadb://USER:PASSWORD@HOST:PORT/DATABASE
    /// (TLS: ?ssl-mode=REQUIRED, or VERIFY_IDENTITY&ssl-ca=FILE); or
    /// DATABASE_URL, a mysql:// or mariadb:// URL
    #[arg(long, value_name = "URL", help_heading = SERVER, allow_hyphen_values = true)]
    pub(crate) mysql: Option<String>,
}

/// TLS and credentials. No value is ever echoed in an error: each is taken
/// as it is here and checked once parsed.
#[derive(Args, Debug)]
pub(crate) struct SecurityFlags {
    /// TLS: the CA that signed the servers' certificates (Redis and SQL take
    /// TLS and credentials in the URL)
    #[arg(long, value_name = "FILE", env = "ETCDCTL_CACERT", hide_env_values = true,
          help_heading = SECURE, allow_hyphen_values = true)]
    pub(crate) cacert: Option<String>,
    /// TLS: a client certificate (with --key)
    #[arg(long, value_name = "FILE", env = "ETCDCTL_CERT", hide_env_values = true,
          help_heading = SECURE, allow_hyphen_values = true)]
    pub(crate) cert: Option<String>,
    /// TLS: the client certificate's key (with --cert)
    #[arg(long, value_name = "FILE", env = "ETCDCTL_KEY", hide_env_values = true,
          help_heading = SECURE, allow_hyphen_values = true)]
    pub(crate) key: Option<String>,
    /// etcd user
    #[arg(long, value_name = "NAME[:PASSWORD]", env = "ETCDCTL_USER", hide_env_values = true,
          help_heading = SECURE, allow_hyphen_values = true)]
    pub(crate) user: Option<String>,
    /// etcd password
    #[arg(long, value_name = "PASSWORD", env = "ETCDCTL_PASSWORD", hide_env_values = true,
          help_heading = SECURE, allow_hyphen_values = true)]
    pub(crate) password: Option<String>,
    /// etcd: put lockline's markers under PREFIX (default: beside each lock, inside any grant on its name)
    #[arg(long, value_name = "PREFIX", help_heading = SECURE, allow_hyphen_values = true)]
    pub(crate) marker_prefix: Option<String>,
    /// ZooKeeper credentials
    #[arg(long, value_name = "digest|sasl:USER:PASSWORD", env = "LOCKLINE_ZK_AUTH",
          hide_env_values = true, help_heading = SECURE, allow_hyphen_values = true)]
    pub(crate) zk_auth: Option<String>,
    /// ZooKeeper ACL policy for the nodes lockline creates (default open)
    #[arg(long, value_name = "open|creator", help_heading = SECURE, allow_hyphen_values = true)]
    pub(crate) zk_acl: Option<String>,
}

/// The session's options.
#[derive(Args, Debug)]
pub(crate) struct SessionFlags {
    /// session TTL (default 10)
    #[arg(long, value_name = "SECS", value_parser = seconds, allow_hyphen_values = true)]
    pub(crate) ttl: Option<Duration>,
}

/// What `lock` and `elect` take for holding: an option of whatever holds
/// (the lock or the leadership) belongs here, and reaches [`Args`] through
/// `parse` like the others.
///
/// [`Args`]: crate::args::Args
#[derive(Args, Debug)]
pub(crate) struct HoldingFlags {
    /// lock, elect: give up waiting in line after SECS (exit 124); connecting
    /// is bounded apart (5 s, exit 122)
    #[arg(long, value_name = "SECS", value_parser = seconds, allow_hyphen_values = true)]
    pub(crate) timeout: Option<Duration>,
    /// grace between SIGTERM and SIGKILL for COMMAND's group (default 2; 0:
    /// SIGKILL at once; at most 3600)
    #[arg(long, value_name = "SECS", value_parser = kill_after, allow_hyphen_values = true)]
    pub(crate) kill_after: Option<Duration>,
    /// lock, elect: after a holder lost the lock involuntarily (its process
    /// killed, its session expired or cut off), wait SECS more before taking
    /// it (default 0; at most 60); a release hands on at once
    #[arg(long, value_name = "SECS", value_parser = lock_delay, allow_hyphen_values = true)]
    pub(crate) lock_delay: Option<Duration>,
    /// with COMMAND: print the held key on standard output too
    #[arg(long)]
    pub(crate) print_key: bool,
    /// lock, elect: serve lockline's metrics for Prometheus at
    /// http://ADDR/metrics (ADDR is HOST:PORT) while it runs
    #[arg(long, value_name = "ADDR")]
    pub(crate) metrics: Option<std::net::SocketAddr>,
}

/// A number of seconds, fractions allowed.
fn seconds(value: &str) -> Result<Duration, String> {
    let secs: f64 = value
        .parse()
        .map_err(|_| format!("{value:?} is not a number of seconds"))?;
    Duration::try_from_secs_f64(secs).map_err(|_| format!("{value:?} is not a valid duration"))
}

/// `--limit`: from 1 to [`MAX_PERMITS`].
fn permits(value: &str) -> Result<usize, String> {
    match value.parse::<usize>() {
        Ok(permits) if (1..=MAX_PERMITS).contains(&permits) => Ok(permits),
        _ => Err(format!("a number of permits from 1 to {MAX_PERMITS}")),
    }
}

/// `--mode`: one of the six lock modes, in any case; the modes are its
/// possible values, for the help and the completion scripts.
#[derive(Clone, Copy, Debug)]
pub(crate) struct LockModes;

impl TypedValueParser for LockModes {
    type Value = LockMode;

    fn parse_ref(
        &self,
        command: &clap::Command,
        arg: Option<&clap::Arg>,
        value: &std::ffi::OsStr,
    ) -> Result<LockMode, clap::Error> {
        fn lock_mode(value: &str) -> Result<LockMode, String> {
            value
                .parse()
                .map_err(|_| "expected a lock mode: NL, CR, CW, PR, PW or EX (any case)".to_owned())
        }
        // clap's own error for a refused value: it names the flag.
        let parser: fn(&str) -> Result<LockMode, String> = lock_mode;
        parser.parse_ref(command, arg, value)
    }

    fn possible_values(&self) -> Option<Box<dyn Iterator<Item = PossibleValue> + '_>> {
        Some(Box::new(
            LockMode::ALL.iter().map(|mode| PossibleValue::new(mode.label())),
        ))
    }
}

/// `--kill-after`: at most [`MAX_KILL_AFTER`].
fn kill_after(value: &str) -> Result<Duration, String> {
    let grace = seconds(value)?;
    if grace > MAX_KILL_AFTER {
        return Err(format!("at most {} seconds", MAX_KILL_AFTER.as_secs()));
    }
    Ok(grace)
}

/// `--lock-delay`: at most [`MAX_LOCK_DELAY`].
fn lock_delay(value: &str) -> Result<Duration, String> {
    let delay = seconds(value)?;
    if delay > MAX_LOCK_DELAY {
        return Err(format!("at most {} seconds", MAX_LOCK_DELAY.as_secs()));
    }
    Ok(delay)
}

/// The whole help's list of every option of every command (each once), from
/// the subcommands' own definitions, then what applies to them all.
fn top_after_help() -> String {
    let subcommands = Command::augment_subcommands(clap::Command::new("lockline"));
    let mut seen = HashSet::new();
    let mut every = clap::Command::new("lockline")
        .version(env!("CARGO_PKG_VERSION"))
        .help_template("{all-args}");
    for subcommand in subcommands.get_subcommands() {
        for arg in subcommand.get_arguments() {
            if !arg.is_positional() && seen.insert(arg.get_id().clone()) {
                every = every.arg(arg.clone());
            }
        }
    }
    let options = every.render_help().to_string();
    format!(
        "{}\n\n{LIST_OUTPUT}\n\n{OUTPUT}\n\n{ENVIRONMENT}\n\n{SET_FOR_COMMAND}\n\n{EXIT_STATUSES}\n",
        options.trim()
    )
}

/// The server flags, in the order messages name them.
pub(crate) const SERVER_FLAGS: [&str; 5] = ["--etcd", "--zookeeper", "--redis", "--postgres", "--mysql"];

/// The one line `lockline` prints for a parse error (never a value the user
/// gave: it may be a password).
pub(crate) fn one_line(error: &clap::Error) -> String {
    let context = |kind: ContextKind| match error.get(kind) {
        Some(ContextValue::String(text)) => Some(text.clone()),
        Some(ContextValue::Strings(texts)) => texts.first().cloned(),
        _ => None,
    };
    // "--etcd <URL[,URL...]>" names the flag "--etcd".
    let flag = |kind: ContextKind| context(kind).and_then(|arg| arg.split_whitespace().next().map(str::to_owned));
    match error.kind() {
        ErrorKind::ArgumentConflict => {
            let (Some(one), Some(other)) = (flag(ContextKind::InvalidArg), flag(ContextKind::PriorArg)) else {
                return clap_message(error);
            };
            let rank = |flag: &str| SERVER_FLAGS.iter().position(|server| *server == flag);
            match (rank(&one), rank(&other)) {
                (Some(a), Some(b)) => {
                    let (first, second) = if a < b { (&one, &other) } else { (&other, &one) };
                    format!("{first} and {second} cannot be used together: pick one server")
                }
                _ => format!("{one} and {other} cannot be used together"),
            }
        }
        ErrorKind::UnknownArgument => {
            let Some(arg) = flag(ContextKind::InvalidArg) else {
                return clap_message(error);
            };
            // `--flag=value`: the value is never shown.
            let arg = arg.split('=').next().unwrap_or_default().to_owned();
            let mut message = format!("unknown option {arg:?} (a NAME that begins with '-' goes after --)");
            if let Some(others) = owners(&arg) {
                message.push_str(&format!("; {arg} is for {others}"));
            } else if let Some(similar) = context(ContextKind::SuggestedArg) {
                message.push_str(&format!("; did you mean {similar}?"));
            }
            message
        }
        ErrorKind::InvalidSubcommand => {
            let name = context(ContextKind::InvalidSubcommand).unwrap_or_default();
            // `help --user=root:PASSWORD`: an option's value is never shown.
            let name = match name.split_once('=') {
                Some((option, _)) if option.starts_with('-') => option.to_owned(),
                _ => name,
            };
            let mut message = format!("unknown command {name:?}: lock, elect, list, check or completions");
            if let Some(similar) = context(ContextKind::SuggestedSubcommand) {
                message.push_str(&format!("; did you mean {similar}?"));
            }
            message
        }
        // A flag that takes a value also takes one that begins with '-'
        // (`--ttl -1` is refused by its parser, not taken for an option), so
        // `--ttl --user=root:PASSWORD` makes the next option its value. An
        // option is never echoed as a value: it may carry a secret.
        // The same for a flag that takes no value, written `--shared=--user=...`.
        kind @ (ErrorKind::ValueValidation | ErrorKind::InvalidValue | ErrorKind::TooManyValues)
            if context(ContextKind::InvalidValue).is_some_and(|value| value.starts_with("--")) =>
        {
            let value = context(ContextKind::InvalidValue).unwrap_or_default();
            let option = value.split('=').next().unwrap_or_default();
            let arg = flag(ContextKind::InvalidArg).unwrap_or_else(|| "an option".to_owned());
            if kind == ErrorKind::TooManyValues {
                format!("{arg} takes no value, but was given the option {option} (its value is not shown)")
            } else {
                format!("{arg} needs a value, but the option {option} follows it (its value is not shown)")
            }
        }
        ErrorKind::MissingSubcommand | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            "a command is required: lock, elect, list, check or completions (lockline --help)".to_owned()
        }
        _ => clap_message(error),
    }
}

/// The subcommands that take `flag`, when some do.
fn owners(flag: &str) -> Option<String> {
    let cli = Cli::command();
    let names: Vec<&str> = cli
        .get_subcommands()
        .filter(|subcommand| {
            subcommand.get_arguments().any(|arg| {
                arg.get_long().is_some_and(|long| flag.strip_prefix("--") == Some(long))
                    || arg
                        .get_short()
                        .is_some_and(|short| flag.strip_prefix('-') == Some(short.encode_utf8(&mut [0; 4])))
            })
        })
        .map(|subcommand| subcommand.get_name())
        .collect();
    match names.as_slice() {
        [] => None,
        [one] => Some((*one).to_owned()),
        [rest @ .., last] => Some(format!("{} and {last}", rest.join(", "))),
    }
}

/// clap's own message, without its `error: `, on one line. Some kinds name
/// what is wrong on lines of their own below the first (the required
/// arguments not given, the possible values of a refused one): the whole
/// first paragraph is kept, its lines joined, a list after a `:` with
/// commas. The usage and the hint to `--help` that follow are not.
fn clap_message(error: &clap::Error) -> String {
    let text = error.render().to_string();
    let mut lines = text.lines().map(str::trim).take_while(|line| !line.is_empty());
    let first = lines.next().unwrap_or("bad arguments");
    let mut message = first.strip_prefix("error: ").unwrap_or(first).to_owned();
    let mut listing = false;
    for line in lines {
        if message.ends_with(':') {
            listing = true;
            message.push(' ');
        } else if listing {
            message.push_str(", ");
        } else {
            message.push(' ');
        }
        message.push_str(line);
    }
    message
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::{one_line, Cli};

    /// The one line for `argv`, which clap must refuse.
    fn refusal(argv: &[&str]) -> String {
        let error = Cli::command()
            .try_get_matches_from(std::iter::once("lockline").chain(argv.iter().copied()))
            .expect_err("refused");
        one_line(&error)
    }

    /// A refusal whose substance clap puts below its first line still names
    /// it, on one line: the argument not given, the values a refused one may
    /// take.
    #[test]
    fn refusals_name_what_is_wrong_on_one_line() {
        for (argv, says) in [
            (
                &["completions"][..],
                "the following required arguments were not provided: <SHELL>",
            ),
            (
                &["completions", "tcsh"][..],
                "invalid value 'tcsh' for '<SHELL>' [possible values: bash, elvish, fish, powershell, zsh]",
            ),
            // One line already: kept as it is.
            (
                &["lock", "--mode", "XX", "x"][..],
                "invalid value 'XX' for '--mode <MODE>': expected a lock mode: NL, CR, CW, PR, PW or EX (any case)",
            ),
        ] {
            let line = refusal(argv);
            assert!(line.contains(says) && !line.contains('\n'), "{argv:?}: {line}");
            assert!(!line.contains("usage") && !line.contains("--help"), "{argv:?}: {line}");
        }
    }
}
