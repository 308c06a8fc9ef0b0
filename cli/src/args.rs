//! What the command line asks for: [`parse`] turns clap's matches (see
//! `command_line.rs`) and the environment into [`Args`]. The server and
//! its credentials are `backend.rs`'s to choose; what follows NAME is for
//! each subcommand's module to read (`lock.rs`, `elect.rs`, `list.rs`,
//! `check.rs`).

use std::time::Duration;

use clap::error::ErrorKind;
use clap::parser::ValueSource;
use lockline::Sequencer;

use crate::backend::{self, Security, Server};
use crate::command_line::{self, Cli, Command};
use crate::lock::{self, Recipe};
use crate::secrets::url_secrets;
use crate::{check, elect, list};

/// The session's TTL unless `--ttl` says.
const DEFAULT_TTL: Duration = Duration::from_secs(10);
/// How long the command's group has between SIGTERM and SIGKILL by default.
const DEFAULT_KILL_AFTER: Duration = Duration::from_secs(2);

/// What to do with `NAME`.
#[derive(Debug, PartialEq)]
pub(crate) enum Mode {
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

/// What the command line asks for, checked: everything `lockline` runs by.
#[derive(Debug)]
pub(crate) struct Args {
    pub(crate) server: Server,
    pub(crate) security: Security,
    pub(crate) ttl: Duration,
    pub(crate) timeout: Option<Duration>,
    pub(crate) kill_after: Duration,
    /// `--lock-delay`: the session's lock-delay (zero: none).
    pub(crate) lock_delay: Duration,
    /// `--print-key`: the held key on standard output even with a command.
    pub(crate) print_key: bool,
    /// `--metrics ADDR`: where to serve the metrics while running.
    pub(crate) metrics: Option<std::net::SocketAddr>,
    /// `--verbose` (check): the answer on standard output too.
    pub(crate) verbose: bool,
    /// `--nonblock` (lock): one try, and the status when the lock is taken.
    pub(crate) nonblock: Option<u8>,
    /// The lock's name (check: the sequencer's).
    pub(crate) name: String,
    pub(crate) mode: Mode,
}

impl Args {
    /// Every password given, in every form a message might show it, for
    /// [`output::hide`](crate::output::hide).
    pub(crate) fn secrets(&self) -> Vec<String> {
        let mut secrets = match &self.server {
            Server::Redis(url) | Server::Postgres(url) | Server::MySql(url) => url_secrets(url),
            Server::Etcd(_) | Server::ZooKeeper(_) => Vec::new(),
        };
        secrets.extend(self.security.user.iter().map(|(_, password)| password.clone()));
        secrets.extend(self.security.zk_auth.iter().map(|(_, _, password)| password.clone()));
        secrets
    }

    /// The command to run while holding (empty: none).
    pub(crate) fn command(&self) -> &[String] {
        match &self.mode {
            Mode::Lock { command, .. } | Mode::Elect { command, .. } => command,
            Mode::Listen | Mode::List | Mode::Check { .. } => &[],
        }
    }
}

/// What the command line asks for.
pub(crate) enum Action {
    /// Take the lock, campaign, listen, list or check.
    Run(Box<Args>),
    /// Print clap's help or version on standard output (status 0).
    Show(clap::Error),
    /// Print a completion script.
    Completions(clap_complete::Shell),
}

/// The arguments after NAME (and after PROPOSAL, for `elect`).
pub(crate) type Rest = std::iter::Peekable<std::vec::IntoIter<String>>;

/// The arguments (without the program's name), with `env` standing in for
/// the server variables (`ETCDCTL_ENDPOINTS`, `ZOOKEEPER_CONNECT`,
/// `DATABASE_URL`); clap reads the TLS and credential ones itself.
pub(crate) fn parse(argv: Vec<String>, env: impl Fn(&str) -> Option<String>) -> Result<Action, String> {
    use clap::{CommandFactory, FromArgMatches};

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
            (recipe, nonblock) = lock::recipe(&lock)?;
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
    let (server, security) = backend::choose(connection, given, env)?;

    let mut rest = rest.into_iter().peekable();
    let name = rest.next().ok_or_else(|| match subcommand {
        "check" => "SEQUENCER is required".to_owned(),
        _ => "NAME is required".to_owned(),
    })?;
    let mode = match subcommand {
        "lock" => lock::mode(rest, recipe),
        "elect" => elect::mode(rest, listen)?,
        "list" => list::mode(rest)?,
        _ => check::mode(&name, rest)?,
    };
    let name = match &mode {
        Mode::Check { sequencer } => sequencer.name().to_owned(),
        _ => name,
    };
    if let (Mode::Listen, Some(holding)) = (&mode, &holding) {
        elect::refuse_holding_flags(holding)?;
    }
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

/// The command in `rest`: one `--` may separate it from NAME (and
/// PROPOSAL), and is dropped.
pub(crate) fn command(mut rest: Rest) -> Vec<String> {
    rest.next_if_eq("--");
    rest.collect()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::{parse, Action, Args, Server};

    /// What `line` asks for, with no variable set.
    pub(crate) fn args(line: &str) -> Result<Args, String> {
        with_env(line, &[])
    }

    /// What `line` asks for, with `vars` the server variables.
    pub(crate) fn with_env(line: &str, vars: &[(&str, &str)]) -> Result<Args, String> {
        let vars: Vec<(String, String)> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let parsed = parse(line.split_whitespace().map(str::to_owned).collect(), move |name| {
            vars.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())
        });
        match parsed? {
            Action::Run(args) => Ok(*args),
            Action::Show(_) | Action::Completions(_) => Err("not a run".to_owned()),
        }
    }

    #[test]
    fn parses_options_name_and_command() {
        let parsed = args("lock --etcd http://a:1,http://b:2 --ttl 3 --timeout 0.5 jobs/x echo hi").expect("parse");
        assert_eq!(
            parsed.server,
            Server::Etcd(vec!["http://a:1".into(), "http://b:2".into()])
        );
        assert_eq!(parsed.ttl.as_secs(), 3);
        assert_eq!(parsed.timeout.map(|t| t.as_millis()), Some(500));
        assert_eq!(parsed.name, "jobs/x");
        assert_eq!(parsed.command(), ["echo", "hi"]);
        assert!(!parsed.print_key);
    }

    #[test]
    fn refuses_bad_arguments() {
        assert!(args("lock jobs/x").is_err(), "no endpoint");
        assert!(args("lock --etcd , x").is_err(), "empty endpoint list");
        let zk = args("lock --zookeeper h:1/apps x").expect("parse");
        assert_eq!(zk.server, Server::ZooKeeper("h:1/apps".into()));
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
        assert_eq!(parsed.server, Server::Etcd(vec!["https://a:1".into()]));
        assert_eq!(parsed.security.user, Some(("alice".into(), "p=w".into())));
        assert_eq!(parsed.ttl.as_secs(), 3);
        let Err(error) = args("lock --etcd http://a:1 --pasword=s3cret x") else {
            panic!("an unknown option was accepted");
        };
        assert!(error.contains("--pasword") && !error.contains("s3cret"), "{error}");
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
