use std::fmt;
use std::io::{Error, ErrorKind};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::time::Duration;

use tempfile::TempDir;

use crate::postgres::{conninfo_escape, SUPERUSER, SUPERUSER_PASSWORD};
use crate::process::{free_port, Member, SystemUser};
use crate::sql::{percent_encode, run_with_input};
use crate::{PgServer, Result};

/// Debian's PgBouncer (package `pgbouncer`).
pub(crate) const PGBOUNCER: &str = "/usr/sbin/pgbouncer";

/// How long PgBouncer may take to listen and let a client through.
const START_TIMEOUT: Duration = Duration::from_secs(20);

/// How PgBouncer lends its server connections to clients (`pool_mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PoolMode {
    /// A client keeps one server connection until it disconnects; it is
    /// reset (`DISCARD ALL`) before the next client gets it. PgBouncer's
    /// default.
    #[default]
    Session,
    /// A server connection goes back to the pool at the end of each
    /// transaction, so consecutive statements of one client may run on
    /// different server backends, and statements of several clients on one.
    Transaction,
    /// A server connection goes back to the pool after each statement
    /// (multi-statement transactions are refused).
    Statement,
}

impl PoolMode {
    /// The value of `pool_mode` in `pgbouncer.ini`.
    pub fn as_str(self) -> &'static str {
        match self {
            PoolMode::Session => "session",
            PoolMode::Transaction => "transaction",
            PoolMode::Statement => "statement",
        }
    }
}

impl fmt::Display for PoolMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How a [`PgBouncer`] is started. The defaults are PgBouncer's own.
#[derive(Debug, Clone)]
pub struct PgBouncerOptions {
    /// `pool_mode` (session by default).
    pub pool_mode: PoolMode,
    /// `default_pool_size`: how many server connections one user and
    /// database may have at once (20 by default). With 1, every client
    /// connection of the superuser shares one server backend.
    pub default_pool_size: u32,
    /// `ignore_startup_parameters`: startup parameters PgBouncer accepts and
    /// drops (none by default). PgBouncer refuses a client that sends one it
    /// neither tracks nor ignores with `unsupported startup parameter: NAME`;
    /// it tracks `client_encoding`, `DateStyle`, `TimeZone`,
    /// `standard_conforming_strings` and `application_name`.
    pub ignore_startup_parameters: Vec<String>,
}

impl Default for PgBouncerOptions {
    fn default() -> Self {
        PgBouncerOptions {
            pool_mode: PoolMode::Session,
            default_pool_size: 20,
            ignore_startup_parameters: Vec::new(),
        }
    }
}

/// One PgBouncer (Debian's `/usr/sbin/pgbouncer`) on a free loopback port in
/// front of a [`PgServer`], with its `pgbouncer.ini` and `userlist.txt` in a
/// temporary directory. Every database of the server is served under its own
/// name; the server's superuser logs in with its password
/// (`auth_type = scram-sha-256`, the password kept in plain text in the user
/// list, which PgBouncer also uses to log in to the server).
///
/// PgBouncer refuses to run as root: when the tests run as root it runs as the
/// `postgres` system user, which owns the temporary directory; otherwise as the
/// current user. It logs to standard error, the member's log
/// ([`Member::log_tail`]). Dropping it kills it and deletes its directory; the
/// server it fronts is not touched.
pub struct PgBouncer {
    member: Member,
    port: u16,
    server_port: u16,
    dir: TempDir,
}

impl fmt::Debug for PgBouncer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgBouncer")
            .field("port", &self.port)
            .field("server_port", &self.server_port)
            .field("member", &self.member)
            .finish_non_exhaustive()
    }
}

impl PgBouncer {
    /// Starts PgBouncer in front of `server` with `options`, and waits until a
    /// client gets through it to the server (`SELECT 1` with `psql`).
    ///
    /// # Errors
    ///
    /// When PgBouncer is not installed, cannot start, or lets no client
    /// through in time (with its log).
    pub fn start(server: &PgServer, options: &PgBouncerOptions) -> Result<Self> {
        if !Path::new(PGBOUNCER).exists() {
            return Err(Error::new(
                ErrorKind::NotFound,
                format!("no {PGBOUNCER} (Debian package pgbouncer)"),
            ));
        }
        let user = SystemUser::for_server("postgres")?;
        let dir = tempfile::Builder::new().prefix("lockline-pgbouncer-").tempdir()?;
        let port = free_port()?;
        let ini = dir.path().join("pgbouncer.ini");
        let userlist = dir.path().join("userlist.txt");
        std::fs::write(&userlist, userlist_line(SUPERUSER, SUPERUSER_PASSWORD))?;
        std::fs::write(&ini, ini_text(port, server.port(), &userlist, options))?;
        if let Some(user) = &user {
            for path in [dir.path(), &ini, &userlist] {
                user.chown(path)?;
            }
        }
        let member = Member::start_as(
            &format!("pgbouncer-{port}"),
            PGBOUNCER,
            &[ini.display().to_string()],
            dir.path().join("pgbouncer.log"),
            dir.path(),
            user.as_ref(),
        )?;
        let mut bouncer = PgBouncer {
            member,
            port,
            server_port: server.port(),
            dir,
        };
        let address = SocketAddr::from(([127, 0, 0, 1], port));
        bouncer.member.wait_ready(START_TIMEOUT, || {
            TcpStream::connect_timeout(&address, Duration::from_secs(1)).is_ok()
        })?;
        bouncer.check_through(server)?;
        Ok(bouncer)
    }

    /// One `SELECT 1` through PgBouncer as the superuser, which makes it log
    /// in to the server: a wrong configuration fails here, not in a test.
    fn check_through(&self, server: &PgServer) -> Result<()> {
        let conninfo = format!(
            "host=127.0.0.1 port={} user={SUPERUSER} password='{}' dbname=postgres connect_timeout=10",
            self.port,
            conninfo_escape(SUPERUSER_PASSWORD),
        );
        let mut command = server.psql_command();
        command.args([
            "-X",
            "-A",
            "-t",
            "-q",
            "-v",
            "ON_ERROR_STOP=1",
            "-d",
            &conninfo,
            "-f",
            "-",
        ]);
        let output = run_with_input(command, "SELECT 1;")?;
        if output.status.success() && String::from_utf8_lossy(&output.stdout).trim() == "1" {
            return Ok(());
        }
        Err(Error::other(format!(
            "{}: no client got through to the server on port {}: {}{}; log:\n{}",
            self.member.name(),
            self.server_port,
            String::from_utf8_lossy(&output.stderr),
            String::from_utf8_lossy(&output.stdout),
            self.member.log_tail(4000)
        )))
    }

    /// The server's superuser's URL through PgBouncer,
    /// `postgres://postgres:PASSWORD@127.0.0.1:PORT/postgres`.
    pub fn url(&self) -> String {
        format!(
            "postgres://{}:{}@127.0.0.1:{}/postgres",
            percent_encode(SUPERUSER),
            percent_encode(SUPERUSER_PASSWORD),
            self.port
        )
    }

    /// PgBouncer's TCP port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The port of the server it fronts.
    pub fn server_port(&self) -> u16 {
        self.server_port
    }

    /// The temporary directory holding `pgbouncer.ini`, `userlist.txt` and
    /// the log.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// PgBouncer's process, to kill, pause or read its log.
    pub fn member(&mut self) -> &mut Member {
        &mut self.member
    }

    /// The last `bytes` of PgBouncer's log (its standard error).
    pub fn log_tail(&self, bytes: u64) -> String {
        self.member.log_tail(bytes)
    }
}

/// One line of `userlist.txt`: the name and the password, each in double
/// quotes with `"` doubled.
fn userlist_line(user: &str, password: &str) -> String {
    let quoted = |value: &str| format!("\"{}\"", value.replace('"', "\"\""));
    format!("{} {}\n", quoted(user), quoted(password))
}

/// `pgbouncer.ini`: every database of the server on `server_port` under its
/// own name, listening on 127.0.0.1:`port` only (no Unix socket), logging to
/// standard error, the superuser an admin of the `pgbouncer` console.
fn ini_text(port: u16, server_port: u16, userlist: &Path, options: &PgBouncerOptions) -> String {
    let mut ini = format!(
        "[databases]\n\
         * = host=127.0.0.1 port={server_port}\n\
         \n\
         [pgbouncer]\n\
         listen_addr = 127.0.0.1\n\
         listen_port = {port}\n\
         unix_socket_dir =\n\
         auth_type = scram-sha-256\n\
         auth_file = {userlist}\n\
         admin_users = {SUPERUSER}\n\
         pool_mode = {pool_mode}\n\
         default_pool_size = {pool_size}\n\
         max_client_conn = 500\n\
         syslog = 0\n",
        userlist = userlist.display(),
        pool_mode = options.pool_mode,
        pool_size = options.default_pool_size,
    );
    if !options.ignore_startup_parameters.is_empty() {
        let ignore = options.ignore_startup_parameters.join(", ");
        ini.push_str(&format!("ignore_startup_parameters = {ignore}\n"));
    }
    ini
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ini_carries_the_options() {
        let options = PgBouncerOptions {
            pool_mode: PoolMode::Transaction,
            default_pool_size: 1,
            ignore_startup_parameters: vec!["options".into(), "extra_float_digits".into()],
        };
        let ini = ini_text(10001, 10002, Path::new("/tmp/x/userlist.txt"), &options);
        for line in [
            "* = host=127.0.0.1 port=10002",
            "listen_port = 10001",
            "auth_file = /tmp/x/userlist.txt",
            "pool_mode = transaction",
            "default_pool_size = 1",
            "ignore_startup_parameters = options, extra_float_digits",
        ] {
            assert!(ini.lines().any(|l| l == line), "{line:?} missing from\n{ini}");
        }
        let defaults = ini_text(1, 2, Path::new("u"), &PgBouncerOptions::default());
        assert!(defaults.lines().any(|l| l == "pool_mode = session"));
        assert!(!defaults.contains("ignore_startup_parameters"));
    }

    #[test]
    fn userlist_quotes_double_quotes() {
        assert_eq!(userlist_line("postgres", "pa\"ss"), "\"postgres\" \"pa\"\"ss\"\n");
    }
}
