use std::fmt;
use std::io::{Error, ErrorKind};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use tempfile::TempDir;

use crate::process::{free_port, Member, SystemUser};
use crate::sql::{percent_encode, quote, run_with_input, LockCounts};
use crate::Result;

/// Where Debian installs each major version of PostgreSQL, in `MAJOR/bin`.
const POSTGRESQL_LIB: &str = "/usr/lib/postgresql";

/// The superuser's name and password.
pub(crate) const SUPERUSER: &str = "postgres";
pub(crate) const SUPERUSER_PASSWORD: &str = "lockline-postgres";

/// How long a server may take to accept connections (a restart after a kill
/// includes crash recovery).
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a killed server's backends may take to die before a restart.
const GONE_TIMEOUT: Duration = Duration::from_secs(10);

/// The bin directory of the highest major version of Debian's PostgreSQL that
/// has a server, `initdb`, `psql` and `pg_isready`.
pub(crate) fn bin_dir() -> Option<PathBuf> {
    let mut best: Option<((u32, u32), PathBuf)> = None;
    for entry in std::fs::read_dir(POSTGRESQL_LIB).ok()?.flatten() {
        let name = entry.file_name();
        let Some(version) = name.to_str().and_then(major) else {
            continue;
        };
        let bin = entry.path().join("bin");
        let complete = ["postgres", "initdb", "psql", "pg_isready"]
            .iter()
            .all(|tool| bin.join(tool).is_file());
        if complete && best.as_ref().is_none_or(|(seen, _)| version > *seen) {
            best = Some((version, bin));
        }
    }
    best.map(|(_, bin)| bin)
}

/// `15` as (15, 0), `9.6` as (9, 6).
fn major(name: &str) -> Option<(u32, u32)> {
    let (first, second) = name.split_once('.').unwrap_or((name, "0"));
    Some((first.parse().ok()?, second.parse().ok()?))
}

/// How a [`PgServer`] is started.
#[derive(Debug, Clone)]
pub struct PgOptions {
    /// `fsync=on` and `full_page_writes=on`, the server's defaults (true by
    /// default: benchmarks need realistic commits). False turns both off for
    /// speed; `synchronous_commit` stays on either way, so every committed
    /// transaction has been written to the OS when its commit returns and a
    /// killed server loses none of them (only a crash of the machine could).
    pub durable: bool,
    /// `max_connections` (300 by default; the server's own default is 100).
    pub max_connections: u32,
    /// More `-c NAME=VALUE` settings, applied after the harness's own (so they
    /// override them).
    pub settings: Vec<(String, String)>,
}

impl Default for PgOptions {
    fn default() -> Self {
        PgOptions {
            durable: true,
            max_connections: 300,
            settings: Vec::new(),
        }
    }
}

/// How a standby of [`PgServer::start_standby`] replicates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replication {
    /// The primary commits without waiting for the standby (PostgreSQL's
    /// default): a failover can lose the last commits.
    Asynchronous,
    /// The standby is the primary's synchronous standby: with
    /// `synchronous_commit = on`, a commit returns once the standby has it on
    /// disk, so a promoted standby has every commit the primary confirmed.
    Synchronous,
}

/// One PostgreSQL server (Debian's, from `/usr/lib/postgresql/MAJOR/bin`, the
/// highest major installed) on a free loopback port with a temporary data
/// directory made by `initdb`.
///
/// PostgreSQL refuses to run as root: when the tests run as root, `initdb` and
/// the server run as the `postgres` system user, which owns the temporary
/// directory; otherwise they run as the current user.
///
/// The superuser `postgres` logs in with a password over TCP
/// (`scram-sha-256`, see [`PgServer::url`]) and without one over the Unix
/// socket in the temporary directory, which [`PgServer::psql`] uses.
pub struct PgServer {
    member: Member,
    port: u16,
    bin: PathBuf,
    data: PathBuf,
    dir: TempDir,
    user: Option<SystemUser>,
    options: PgOptions,
}

impl Drop for PgServer {
    /// Kills the server (and any backend it left) and removes its System V
    /// interlock segment, which a killed postmaster leaves behind: enough of
    /// them exhaust the machine's segment ids and no server starts.
    fn drop(&mut self) {
        let segment = std::fs::read_to_string(self.data.join("postmaster.pid"))
            .ok()
            .and_then(|pid_file| interlock_segment(&pid_file));
        let _ = self.member.kill();
        let _ = self.kill_leftovers();
        if let Some(id) = segment {
            // SAFETY: shmctl(2) with IPC_RMID on this server's own segment
            // (named in its pid file); no buffer is passed.
            unsafe { libc::shmctl(id, libc::IPC_RMID, std::ptr::null_mut()) };
        }
    }
}

/// The System V shared memory id in a `postmaster.pid` (its seventh line:
/// the segment's key and id).
fn interlock_segment(pid_file: &str) -> Option<libc::c_int> {
    let line = pid_file.lines().nth(6)?;
    line.split_whitespace().nth(1)?.parse().ok()
}

impl fmt::Debug for PgServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgServer")
            .field("port", &self.port)
            .field("data", &self.data)
            .field("member", &self.member)
            .finish_non_exhaustive()
    }
}

impl PgServer {
    /// A server with the default options (durable, 300 connections).
    ///
    /// # Errors
    ///
    /// When PostgreSQL is not installed, `initdb` fails, or the server does not
    /// accept connections in time.
    pub fn start() -> Result<Self> {
        Self::start_with(&PgOptions::default())
    }

    /// A server started with `options`.
    ///
    /// # Errors
    ///
    /// When PostgreSQL is not installed, `initdb` fails, or the server does not
    /// accept connections in time.
    pub fn start_with(options: &PgOptions) -> Result<Self> {
        let bin = installed_bin_dir()?;
        let user = SystemUser::for_server("postgres")?;
        let dir = server_dir(user.as_ref())?;
        let data = dir.path().join("data");
        initdb(&bin, dir.path(), &data, user.as_ref())?;
        Self::launch(bin, dir, data, user, options.clone())
    }

    /// Starts the server of the data directory `data` in `dir` on a free port
    /// and waits until it accepts connections.
    fn launch(bin: PathBuf, dir: TempDir, data: PathBuf, user: Option<SystemUser>, options: PgOptions) -> Result<Self> {
        let port = free_port()?;
        let mut args = vec!["-D".to_owned(), data.display().to_string()];
        args.extend(["-p".to_owned(), port.to_string()]);
        let durable = if options.durable { "on" } else { "off" };
        let mut settings: Vec<(String, String)> = [
            ("listen_addresses", "127.0.0.1".to_owned()),
            ("unix_socket_directories", dir.path().display().to_string()),
            ("max_connections", options.max_connections.to_string()),
            ("fsync", durable.to_owned()),
            ("full_page_writes", durable.to_owned()),
            ("synchronous_commit", "on".to_owned()),
            // Everything goes to standard error, the member's log.
            ("logging_collector", "off".to_owned()),
            // Dynamic shared memory as files in the data directory, removed
            // with it: a killed server's POSIX segments would otherwise stay
            // in /dev/shm for good.
            ("dynamic_shared_memory_type", "mmap".to_owned()),
        ]
        .into_iter()
        .map(|(name, value)| (name.to_owned(), value))
        .collect();
        settings.extend(options.settings.iter().cloned());
        for (name, value) in settings {
            args.extend(["-c".to_owned(), format!("{name}={value}")]);
        }
        let postgres = bin.join("postgres");
        let member = Member::start_as(
            &format!("postgres-{port}"),
            &postgres.display().to_string(),
            &args,
            dir.path().join("postgres.log"),
            dir.path(),
            user.as_ref(),
        )?;
        let mut server = PgServer {
            member,
            port,
            bin,
            data,
            dir,
            user,
            options,
        };
        server.wait_ready()?;
        Ok(server)
    }

    /// A streaming standby of this server: a copy of its data directory
    /// taken with `pg_basebackup` (over the Unix socket, as the superuser),
    /// started with `standby.signal` and a `primary_conninfo` naming this
    /// server, on a port and in a temporary directory of its own, with this
    /// server's options. It accepts read-only connections (hot standby) and
    /// replays what this server writes until [`promote`](Self::promote).
    /// Its unlogged tables are empty, as on any standby. It connects again
    /// 200 ms after losing its primary (`wal_retrieve_retry_interval`; the
    /// server's default is 5 s). Returns once it accepts connections and this
    /// server reports it streaming; with [`Replication::Synchronous`], once
    /// it is this server's synchronous standby (`synchronous_standby_names`,
    /// set on this server with `ALTER SYSTEM` once the standby streams: every
    /// commit of a logged change then waits until the standby has it on
    /// disk, and hangs while no standby answers).
    ///
    /// # Errors
    ///
    /// When `pg_basebackup` fails, or the standby does not start or stream in
    /// time.
    pub fn start_standby(&self, replication: Replication) -> Result<PgServer> {
        let name = format!("standby_{}", std::process::id());
        let dir = server_dir(self.user.as_ref())?;
        let data = dir.path().join("data");
        let mut command = pg_command(&self.bin.join("pg_basebackup"));
        command
            .arg("-D")
            .arg(&data)
            .arg("-h")
            .arg(self.dir.path())
            .args(["-p", &self.port.to_string(), "-U", SUPERUSER])
            .args(["-X", "stream", "--checkpoint=fast", "--no-sync"])
            .current_dir(dir.path());
        if let Some(user) = &self.user {
            user.apply(&mut command);
            command.env("HOME", dir.path());
        }
        let output = command.output()?;
        if !output.status.success() {
            return Err(Error::other(format!(
                "pg_basebackup of {}: {}",
                self.member.name(),
                String::from_utf8_lossy(&output.stderr)
            )));
        }
        let conninfo = format!(
            "host='{}' port={} user={SUPERUSER} application_name={name}",
            conninfo_escape(&self.dir.path().display().to_string()),
            self.port
        );
        let signal = data.join("standby.signal");
        std::fs::write(&signal, "")?;
        let auto_conf = data.join("postgresql.auto.conf");
        let mut conf = std::fs::read_to_string(&auto_conf).unwrap_or_default();
        // The primary's own setting, copied with its data, is not the standby's.
        conf = conf
            .lines()
            .filter(|line| !line.trim_start().starts_with("synchronous_standby_names"))
            .map(|line| format!("{line}\n"))
            .collect();
        conf.push_str(&format!("primary_conninfo = '{}'\n", conninfo.replace('\'', "''")));
        conf.push_str("wal_retrieve_retry_interval = '200ms'\n");
        std::fs::write(&auto_conf, conf)?;
        if let Some(user) = &self.user {
            user.chown(&signal)?;
            user.chown(&auto_conf)?;
        }
        let standby = Self::launch(self.bin.clone(), dir, data, self.user.clone(), self.options.clone())?;
        // Synchronous only once it streams: set before, every commit here
        // would hang until then.
        self.await_standby(&standby, &name, "async")?;
        if replication == Replication::Synchronous {
            self.psql(&format!(
                "ALTER SYSTEM SET synchronous_standby_names = '\"{name}\"'; SELECT pg_reload_conf();"
            ))?;
            self.await_standby(&standby, &name, "sync")?;
        }
        Ok(standby)
    }

    /// Waits until this server reports `standby` (its `application_name`
    /// `name`) streaming with `sync_state` `state`.
    fn await_standby(&self, standby: &PgServer, name: &str, state: &str) -> Result<()> {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            let found = self.psql(&format!(
                "SELECT count(*) FROM pg_stat_replication \
                 WHERE application_name = '{name}' AND state = 'streaming' AND sync_state = '{state}';"
            ))?;
            if found.trim() == "1" {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(Error::new(
                    ErrorKind::TimedOut,
                    format!(
                        "{}: its standby {} is not streaming ({state}) after {START_TIMEOUT:?}",
                        self.member.name(),
                        standby.member.name()
                    ),
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Promotes this standby to a primary (`pg_promote`, which waits for
    /// the promotion to end: what it had received is replayed, its timeline
    /// moves on, its unlogged tables start empty) and returns once it
    /// accepts writes. Its `pg_postmaster_start_time()` stays its own start.
    ///
    /// # Errors
    ///
    /// When it is not a standby, or the promotion does not end in time.
    pub fn promote(&self) -> Result<()> {
        let promoted = self.psql("SELECT pg_promote(true, 30);")?;
        if promoted.trim() != "t" {
            return Err(Error::other(format!(
                "{}: pg_promote answered {promoted:?}",
                self.member.name()
            )));
        }
        let writable = self.psql("SELECT pg_is_in_recovery();")?;
        if writable.trim() != "f" {
            return Err(Error::other(format!(
                "{}: still in recovery after its promotion",
                self.member.name()
            )));
        }
        Ok(())
    }

    /// Crashes the whole server at once, as the machine's crash would:
    /// SIGKILL to the postmaster, then to every process of the server left
    /// (its backends, which would otherwise go on serving a query in flight
    /// and exit only at its end), and waits until none is left. Every
    /// client connection is reset. [`restart`](Self::restart) starts it again.
    ///
    /// # Errors
    ///
    /// When it is not running or its processes do not exit.
    pub fn crash(&mut self) -> Result<()> {
        self.member.kill()?;
        self.kill_leftovers()
    }

    fn wait_ready(&mut self) -> Result<()> {
        let pg_isready = self.bin.join("pg_isready");
        let port = self.port.to_string();
        self.member.wait_ready(START_TIMEOUT, || {
            // 0: accepting connections; 1: starting up or recovering; 2: no answer.
            pg_command(&pg_isready)
                .args(["-q", "-h", "127.0.0.1", "-p", &port, "-U", SUPERUSER, "-d", "postgres"])
                .args(["-t", "2"])
                .stdin(Stdio::null())
                .status()
                .is_ok_and(|status| status.success())
        })
    }

    /// The superuser's URL,
    /// `postgres://postgres:PASSWORD@127.0.0.1:PORT/postgres`.
    pub fn url(&self) -> String {
        self.url_for(SUPERUSER, SUPERUSER_PASSWORD, "postgres")
    }

    /// The URL for `user` with `password` on database `db`,
    /// `postgres://USER:PASSWORD@127.0.0.1:PORT/DB` (percent-encoded).
    pub fn url_for(&self, user: &str, password: &str, db: &str) -> String {
        format!(
            "postgres://{}:{}@127.0.0.1:{}/{}",
            percent_encode(user),
            percent_encode(password),
            self.port,
            percent_encode(db)
        )
    }

    /// The server's TCP port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server's process (the postmaster), to kill, pause or restart it.
    ///
    /// Each session is served by its own process, forked by the postmaster:
    /// [`Member::pause`] freezes the postmaster only, so new connections hang
    /// while sessions already open go on being served. [`Member::kill`] kills
    /// the postmaster; its backends exit when they next wait (an idle one at
    /// once, a busy one when its query ends), and [`PgServer::restart`] kills
    /// those left. [`Member::stop`] sends SIGTERM, a smart shutdown that waits
    /// for every session to end; [`PgServer::stop`] is the fast one.
    pub fn member(&mut self) -> &mut Member {
        &mut self.member
    }

    /// The data directory (`PGDATA`).
    pub fn data_dir(&self) -> &Path {
        &self.data
    }

    /// The directory of the Unix socket (`unix_socket_directories`), which also
    /// holds the data directory and the server's log.
    pub fn socket_dir(&self) -> &Path {
        self.dir.path()
    }

    /// The directory of Debian's PostgreSQL programs in use
    /// (`/usr/lib/postgresql/MAJOR/bin`), for `psql`, `pgbench` and the like.
    pub fn bin_dir(&self) -> &Path {
        &self.bin
    }

    /// Stops the server with a fast shutdown (SIGINT: open sessions are ended,
    /// the data is checkpointed) and waits for it (SIGKILL after 10 s).
    ///
    /// # Errors
    ///
    /// When it is not running.
    pub fn stop(&mut self) -> Result<()> {
        let pid = self
            .member
            .pid()
            .ok_or_else(|| Error::other(format!("{} is not running", self.member.name())))?;
        self.member.resume()?;
        let pid = libc::pid_t::try_from(pid).map_err(Error::other)?;
        // SAFETY: plain kill(2) on our own child's pid.
        if unsafe { libc::kill(pid, libc::SIGINT) } != 0 {
            return Err(Error::last_os_error());
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.member.is_running() {
            if Instant::now() > deadline {
                return self.member.kill();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }

    /// Starts the server again after a stop or kill, with the same port and
    /// data directory, and waits until it accepts connections (after crash
    /// recovery when it was killed).
    ///
    /// A killed postmaster can leave backends behind: one busy in a query
    /// notices its postmaster's death only when the query ends (and still
    /// answers its client then), and the new server refuses to start beside
    /// the shared memory they hold. They are killed (SIGKILL) and waited for
    /// first, as a crash of the whole server would have done.
    ///
    /// # Errors
    ///
    /// When it is still running, its old processes do not exit, or it does not
    /// accept connections in time.
    pub fn restart(&mut self) -> Result<()> {
        if self.member.is_running() {
            return Err(Error::other(format!("{} is still running", self.member.name())));
        }
        self.kill_leftovers()?;
        self.member.restart()?;
        self.wait_ready()
    }

    /// SIGKILLs the processes of this server left in its data directory and
    /// waits until none is left.
    fn kill_leftovers(&self) -> Result<()> {
        let data = self.data.canonicalize()?;
        let deadline = Instant::now() + GONE_TIMEOUT;
        loop {
            let left = processes_in(&data);
            if left.is_empty() {
                break;
            }
            if Instant::now() > deadline {
                return Err(Error::new(
                    ErrorKind::TimedOut,
                    format!(
                        "{}: processes {left:?} of the old server still run in {}",
                        self.member.name(),
                        data.display()
                    ),
                ));
            }
            for pid in left {
                if let Ok(pid) = libc::pid_t::try_from(pid) {
                    // SAFETY: plain kill(2) on a process of the old server
                    // (its working directory is this server's data directory).
                    unsafe { libc::kill(pid, libc::SIGKILL) };
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }

    /// Runs `sql` (one or more statements, each in its own transaction unless
    /// it says otherwise) with the bin directory's `psql` as the superuser over
    /// the Unix socket, with `-X -A -t -q -v ON_ERROR_STOP=1` and `sql` on its
    /// standard input, and returns its standard output: unaligned rows,
    /// columns separated by `|`, without headers or command tags. A statement
    /// that waits (for a lock, say) makes this wait too.
    ///
    /// # Errors
    ///
    /// When `psql` fails or a statement fails, with `psql`'s standard error.
    pub fn psql(&self, sql: &str) -> Result<String> {
        self.psql_on("postgres", sql)
    }

    /// [`PgServer::psql`] on database `db`.
    ///
    /// # Errors
    ///
    /// When `psql` fails or a statement fails, with `psql`'s standard error.
    pub fn psql_on(&self, db: &str, sql: &str) -> Result<String> {
        let conninfo = format!(
            "host='{}' port={} user={SUPERUSER} dbname='{}' connect_timeout=10",
            conninfo_escape(&self.dir.path().display().to_string()),
            self.port,
            conninfo_escape(db),
        );
        let mut command = self.psql_command();
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
        let output = run_with_input(command, sql)?;
        if !output.status.success() {
            return Err(Error::other(format!(
                "psql {sql:?}: {}{}",
                String::from_utf8_lossy(&output.stderr),
                String::from_utf8_lossy(&output.stdout)
            )));
        }
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    }

    /// A `psql` command of the bin directory in use, with no connection
    /// settings from this process's environment (`PGHOST`, `PGUSER`,
    /// `PGPASSWORD`, ...): for tests that connect as another user or over TCP.
    pub fn psql_command(&self) -> Command {
        pg_command(&self.bin.join("psql"))
    }

    /// Creates a role `name` that can log in with `password` and has no other
    /// privilege (not a superuser, cannot create roles or databases).
    ///
    /// # Errors
    ///
    /// When the role exists or `psql` fails.
    pub fn create_user(&self, name: &str, password: &str) -> Result<()> {
        self.psql(&format!(
            "CREATE ROLE {} LOGIN PASSWORD {} NOSUPERUSER NOCREATEDB NOCREATEROLE;",
            quote(name, '"'),
            quote(password, '\'')
        ))
        .map(drop)
    }

    /// Creates database `name` owned by role `owner`, who may then create
    /// tables in its `public` schema.
    ///
    /// # Errors
    ///
    /// When the database exists, the role does not, or `psql` fails.
    pub fn create_database(&self, name: &str, owner: &str) -> Result<()> {
        self.psql(&format!(
            "CREATE DATABASE {} OWNER {};",
            quote(name, '"'),
            quote(owner, '"')
        ))
        .map(drop)
    }

    /// The process ids of the client sessions (`pg_stat_activity`'s client
    /// backends, `psql`'s own query excepted), in order: each can be ended with
    /// `pg_terminate_backend(pid)` or a signal.
    ///
    /// # Errors
    ///
    /// When `psql` fails.
    pub fn backend_pids(&self) -> Result<Vec<u32>> {
        let out = self.psql(
            "SELECT pid FROM pg_stat_activity \
             WHERE backend_type = 'client backend' AND pid <> pg_backend_pid() ORDER BY pid;",
        )?;
        out.lines()
            .filter(|line| !line.trim().is_empty())
            .map(|line| line.trim().parse().map_err(Error::other))
            .collect()
    }

    /// How many advisory locks are held and waited for, in all databases: the
    /// rows of `pg_locks` with `locktype = 'advisory'`, by `granted`. A lock
    /// taken twice by one session is one row.
    ///
    /// # Errors
    ///
    /// When `psql` fails.
    pub fn advisory_locks(&self) -> Result<LockCounts> {
        let out = self.psql(
            "SELECT count(*) FILTER (WHERE granted), count(*) FILTER (WHERE NOT granted) \
             FROM pg_locks WHERE locktype = 'advisory';",
        )?;
        LockCounts::parse(&out, '|')
    }
}

/// The bin directory of Debian's PostgreSQL, or why there is none.
fn installed_bin_dir() -> Result<PathBuf> {
    bin_dir().ok_or_else(|| {
        Error::new(
            ErrorKind::NotFound,
            format!("no PostgreSQL server in {POSTGRESQL_LIB}/MAJOR/bin (Debian package postgresql)"),
        )
    })
}

/// A temporary directory for one server, owned by `user` when given.
fn server_dir(user: Option<&SystemUser>) -> Result<TempDir> {
    let dir = tempfile::Builder::new().prefix("lockline-postgres-").tempdir()?;
    if let Some(user) = user {
        user.chown(dir.path())?;
    }
    Ok(dir)
}

/// A command of PostgreSQL's client tools without the libpq settings of this
/// process's environment (`PGHOST`, `PGSSLMODE`, ...).
fn pg_command(program: &Path) -> Command {
    let mut command = Command::new(program);
    for (key, _) in std::env::vars_os() {
        if key.to_str().is_some_and(|key| key.starts_with("PG")) {
            command.env_remove(key);
        }
    }
    command.stdin(Stdio::null());
    command
}

/// Makes the data directory `data` in `dir` (owned by `user` when given):
/// superuser `postgres` with a password, trusted on the Unix socket and asked
/// for its password (`scram-sha-256`) over TCP.
fn initdb(bin: &Path, dir: &Path, data: &Path, user: Option<&SystemUser>) -> Result<()> {
    let password_file = dir.join("superuser-password");
    std::fs::write(&password_file, SUPERUSER_PASSWORD)?;
    if let Some(user) = user {
        user.chown(&password_file)?;
    }
    let mut command = Command::new(bin.join("initdb"));
    command
        .arg("-D")
        .arg(data)
        .args(["-U", SUPERUSER])
        .arg(format!("--pwfile={}", password_file.display()))
        .args(["--auth-local=trust", "--auth-host=scram-sha-256"])
        .args(["--locale=C", "--encoding=UTF8", "--no-sync", "--no-instructions"])
        .current_dir(dir)
        .stdin(Stdio::null());
    if let Some(user) = user {
        user.apply(&mut command);
        command.env("HOME", dir);
    }
    let output = command
        .output()
        .map_err(|e| Error::new(e.kind(), format!("cannot run {}: {e}", bin.join("initdb").display())))?;
    std::fs::remove_file(&password_file)?;
    if !output.status.success() {
        let who = user.map_or_else(|| "the current user".to_owned(), |u| u.name().to_owned());
        return Err(Error::other(format!(
            "initdb (as {who}) failed: {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        )));
    }
    Ok(())
}

/// The processes whose working directory is `dir` (a PostgreSQL server's
/// processes all work in its data directory).
fn processes_in(dir: &Path) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| std::fs::read_link(format!("/proc/{pid}/cwd")).is_ok_and(|cwd| cwd == dir))
        .collect()
}

/// `value` quoted for a libpq connection string's single quotes.
pub(crate) fn conninfo_escape(value: &str) -> String {
    value.replace('\\', "\\\\").replace('\'', "\\'")
}

#[cfg(test)]
mod tests {
    use super::major;

    #[test]
    fn majors_order_numerically() {
        assert_eq!(major("15"), Some((15, 0)));
        assert_eq!(major("9.6"), Some((9, 6)));
        assert!(major("9.6") < major("10"));
        assert_eq!(major("main"), None);
    }
}
