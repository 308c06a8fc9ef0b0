use std::fmt;
use std::io::{Error, ErrorKind, Read};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use tempfile::TempDir;

use crate::process::{free_port, Member, SystemUser};
use crate::sql::{mariadb_string, percent_encode, quote, LockCounts};
use crate::Result;

pub(crate) const MARIADBD: &str = "/usr/sbin/mariadbd";
pub(crate) const MARIADB_INSTALL_DB: &str = "/usr/bin/mariadb-install-db";
pub(crate) const MARIADB: &str = "/usr/bin/mariadb";
/// The plugin whose `information_schema.METADATA_LOCK_INFO` lists `GET_LOCK`
/// locks (package mariadb-server).
pub(crate) const METADATA_LOCK_INFO: &str = "/usr/lib/mysql/plugin/metadata_lock_info.so";

/// The root password, set right after the first start.
const ROOT_PASSWORD: &str = "lockline-mariadb";

/// How long a server may take to accept connections (a restart after a kill
/// includes crash recovery).
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// Settings of the install and of every start: a small buffer pool and redo
/// log, since tests start many servers.
const SIZES: [&str; 2] = ["--innodb-buffer-pool-size=64M", "--innodb-log-file-size=16M"];

/// How a [`MariaDbServer`] is started.
#[derive(Debug, Clone)]
pub struct MariaDbOptions {
    /// `innodb_flush_log_at_trx_commit`: 1 (the default, realistic) writes and
    /// flushes the redo log at each commit; 2 writes it at each commit and
    /// flushes it once a second (a killed server loses nothing, a crashed
    /// machine up to a second); 0 does both once a second (a killed server may
    /// lose the last second of commits).
    pub innodb_flush_log_at_trx_commit: u8,
    /// `max_connections` (300 by default; the server's own default is 151).
    pub max_connections: u32,
    /// More `--NAME=VALUE` options of `mariadbd`, given after the harness's
    /// own (so they override them).
    pub settings: Vec<(String, String)>,
}

impl Default for MariaDbOptions {
    fn default() -> Self {
        MariaDbOptions {
            innodb_flush_log_at_trx_commit: 1,
            max_connections: 300,
            settings: Vec::new(),
        }
    }
}

/// One MariaDB server (Debian's `mariadbd`, with a data directory made by
/// `mariadb-install-db`) on a free loopback port with a temporary directory.
///
/// It reads no option file (`--no-defaults`: Debian's `/etc/mysql` stays
/// out), resolves no host name (`--skip-name-resolve`), uses `utf8mb4` as
/// Debian's packaged configuration does, and loads the `metadata_lock_info`
/// plugin, whose `information_schema.METADATA_LOCK_INFO` lists the `GET_LOCK`
/// locks held. When the tests run as root, the install and the server run as
/// the `mysql` system user, which owns the temporary directory; otherwise as
/// the current user.
///
/// `root` has a password, over TCP ([`MariaDbServer::url`]) and over the
/// Unix socket in the temporary directory, which [`MariaDbServer::sql`] uses.
pub struct MariaDbServer {
    member: Member,
    port: u16,
    data: PathBuf,
    socket: PathBuf,
    /// Deleted on drop, after the member is killed.
    _dir: TempDir,
}

impl fmt::Debug for MariaDbServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MariaDbServer")
            .field("port", &self.port)
            .field("data", &self.data)
            .field("member", &self.member)
            .finish_non_exhaustive()
    }
}

impl MariaDbServer {
    /// A server with the default options (`innodb_flush_log_at_trx_commit=1`,
    /// 300 connections).
    ///
    /// # Errors
    ///
    /// When MariaDB is not installed, the install fails, or the server does
    /// not accept connections in time.
    pub fn start() -> Result<Self> {
        Self::start_with(&MariaDbOptions::default())
    }

    /// A server started with `options`.
    ///
    /// # Errors
    ///
    /// When MariaDB is not installed, the install fails, or the server does
    /// not accept connections in time.
    pub fn start_with(options: &MariaDbOptions) -> Result<Self> {
        if !crate::mariadb_installed() {
            return Err(Error::new(
                ErrorKind::NotFound,
                format!(
                    "no {MARIADBD}, {MARIADB_INSTALL_DB}, {MARIADB} or {METADATA_LOCK_INFO} \
                     (Debian package mariadb-server)"
                ),
            ));
        }
        let user = SystemUser::for_server("mysql")?;
        let dir = tempfile::Builder::new().prefix("lockline-mariadb-").tempdir()?;
        if let Some(user) = &user {
            user.chown(dir.path())?;
        }
        let data = dir.path().join("data");
        install_db(dir.path(), &data, user.as_ref())?;

        let socket = dir.path().join("mariadbd.sock");
        // A port free when picked may be taken before the server binds it
        // (another test process's server, or one restarting on its own
        // port after a kill): the server then exits, and another port is
        // tried.
        let mut attempt = 0;
        loop {
            attempt += 1;
            let port = free_port()?;
            match Self::start_on(options, &dir, &data, &socket, port, user.as_ref()) {
                Err(error) if attempt < 3 && error.to_string().contains("Address already in use") => continue,
                Err(error) => return Err(error),
                Ok(member) => {
                    let server = MariaDbServer {
                        member,
                        port,
                        data,
                        socket,
                        _dir: dir,
                    };
                    return server.with_root_password();
                }
            }
        }
    }

    /// Starts `mariadbd` on `port` over the installed `data` and waits until
    /// it greets on its own Unix `socket` (which it opens after binding its
    /// TCP port: a greeting there is this server's, never another's on a
    /// port it failed to bind).
    fn start_on(
        options: &MariaDbOptions,
        dir: &TempDir,
        data: &Path,
        socket: &Path,
        port: u16,
        user: Option<&SystemUser>,
    ) -> Result<Member> {
        let mut args: Vec<String> = vec![
            // Must come first.
            "--no-defaults".to_owned(),
            format!("--datadir={}", data.display()),
            format!("--socket={}", socket.display()),
            format!("--port={port}"),
            "--bind-address=127.0.0.1".to_owned(),
            format!("--pid-file={}", dir.path().join("mariadbd.pid").display()),
            format!("--tmpdir={}", dir.path().display()),
            "--skip-name-resolve".to_owned(),
            "--plugin-load-add=metadata_lock_info.so".to_owned(),
            "--character-set-server=utf8mb4".to_owned(),
            "--collation-server=utf8mb4_general_ci".to_owned(),
            format!("--max-connections={}", options.max_connections),
            format!(
                "--innodb-flush-log-at-trx-commit={}",
                options.innodb_flush_log_at_trx_commit
            ),
            // Connections cut during their handshake (a readiness probe, a
            // test's proxy) must never get 127.0.0.1 blocked.
            "--max-connect-errors=1000000000".to_owned(),
        ];
        args.extend(SIZES.map(str::to_owned));
        // No --log-error: the log goes to standard error, the member's log.
        args.extend(options.settings.iter().map(|(name, value)| format!("--{name}={value}")));
        let mut member = Member::start_as(
            &format!("mariadb-{port}"),
            MARIADBD,
            &args,
            dir.path().join("mariadbd.log"),
            dir.path(),
            user,
        )?;
        member.wait_ready(START_TIMEOUT, || greets_on(socket))?;
        Ok(member)
    }

    /// Gives root a password on every host it connects from.
    fn with_root_password(self) -> Result<Self> {
        // The install leaves root without a password (and root@HOSTNAME, which
        // --skip-name-resolve ignores).
        let root = |host: &str| format!("'root'@{}", mariadb_string(host));
        let password = mariadb_string(ROOT_PASSWORD);
        self.client(
            None,
            &format!(
                "CREATE USER IF NOT EXISTS {tcp} IDENTIFIED BY {password}; \
             GRANT ALL PRIVILEGES ON *.* TO {tcp} WITH GRANT OPTION; \
             ALTER USER {tcp} IDENTIFIED BY {password}; \
             ALTER USER IF EXISTS {ipv6} IDENTIFIED BY {password}; \
             ALTER USER {local} IDENTIFIED BY {password};",
                tcp = root("127.0.0.1"),
                ipv6 = root("::1"),
                local = root("localhost"),
            ),
        )?;
        Ok(self)
    }

    /// Waits until the server greets a connection on its own Unix socket
    /// (MySQL protocol 10), which it opens after binding its TCP port.
    fn wait_ready(&mut self) -> Result<()> {
        let socket = self.socket.clone();
        self.member.wait_ready(START_TIMEOUT, || greets_on(&socket))
    }

    /// Root's URL, `mysql://root:PASSWORD@127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("mysql://root:{}@127.0.0.1:{}", percent_encode(ROOT_PASSWORD), self.port)
    }

    /// The URL for `user` with `password` on database `db`,
    /// `mysql://USER:PASSWORD@127.0.0.1:PORT/DB` (percent-encoded).
    pub fn url_for(&self, user: &str, password: &str, db: &str) -> String {
        format!(
            "mysql://{}:{}@127.0.0.1:{}/{}",
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

    /// The server's process (one process, a thread per connection), to kill,
    /// pause or restart it.
    pub fn member(&mut self) -> &mut Member {
        &mut self.member
    }

    /// The data directory (`datadir`).
    pub fn data_dir(&self) -> &Path {
        &self.data
    }

    /// The Unix socket.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// Starts the server again after a stop or kill, with the same port and
    /// data directory, and waits until it accepts connections (after crash
    /// recovery when it was killed).
    ///
    /// # Errors
    ///
    /// When it is still running or does not accept connections in time.
    pub fn restart(&mut self) -> Result<()> {
        self.member.restart()?;
        self.wait_ready()
    }

    /// A replica of this server, which must have been started with a binary
    /// log and a server id (`log-bin`, `server-id` in
    /// [`MariaDbOptions::settings`]): a new server with `options` (given a
    /// server id of its own) that replicates, by GTID, everything this one
    /// writes from now on (`CHANGE MASTER TO ... MASTER_USE_GTID =
    /// slave_pos`, `START SLAVE`, as root) until
    /// [`promote`](Self::promote). Replication is asynchronous unless
    /// `options` turn semi-synchronous replication on. It connects again a
    /// second after losing this server (`MASTER_CONNECT_RETRY = 1`; the
    /// server's default is a minute). Returns once both of its replication
    /// threads run.
    ///
    /// # Errors
    ///
    /// When the replica does not start, or does not replicate in time.
    pub fn start_replica(&self, options: &MariaDbOptions) -> Result<MariaDbServer> {
        let position = self.sql("SELECT @@gtid_binlog_pos")?;
        self.replica_from(position.trim(), options)
    }

    /// A replica of this server, as [`start_replica`](Self::start_replica)
    /// makes, that first replays this server's whole binary log, from its
    /// first file: a copy of every database created since this server started
    /// with its binary log (and, on a replica promoted with `log-slave-updates`,
    /// of what it replicated), as a replica made from a backup would be.
    /// Returns once it has applied everything this server had logged when it
    /// was asked.
    ///
    /// # Errors
    ///
    /// When the replica does not start, or does not catch up in time.
    pub fn start_full_replica(&self, options: &MariaDbOptions) -> Result<MariaDbServer> {
        let target = self.sql("SELECT @@gtid_binlog_pos")?;
        let replica = self.replica_from("", options)?;
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            let applied = replica.sql(&format!(
                "SELECT MASTER_GTID_WAIT({}, 0.2)",
                mariadb_string(target.trim())
            ))?;
            if applied.trim() == "0" {
                return Ok(replica);
            }
            if Instant::now() > deadline {
                return Err(Error::new(
                    ErrorKind::TimedOut,
                    format!(
                        "{}: its replica has not applied {} after {START_TIMEOUT:?}",
                        self.member.name(),
                        target.trim()
                    ),
                ));
            }
        }
    }

    fn replica_from(&self, position: &str, options: &MariaDbOptions) -> Result<MariaDbServer> {
        let mut options = options.clone();
        options
            .settings
            .push(("server-id".to_owned(), next_server_id().to_string()));
        let replica = MariaDbServer::start_with(&options)?;
        replica.sql(&format!(
            "SET GLOBAL gtid_slave_pos = {}; \
             CHANGE MASTER TO MASTER_HOST = '127.0.0.1', MASTER_PORT = {}, MASTER_USER = 'root', \
             MASTER_PASSWORD = {}, MASTER_CONNECT_RETRY = 1, MASTER_USE_GTID = slave_pos; START SLAVE;",
            mariadb_string(position),
            self.port,
            mariadb_string(ROOT_PASSWORD)
        ))?;
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            let running = replica.sql(
                "SELECT COUNT(*) FROM information_schema.GLOBAL_STATUS \
                 WHERE VARIABLE_NAME = 'SLAVE_RUNNING' AND VARIABLE_VALUE = 'ON'",
            )?;
            if running.trim() == "1" {
                return Ok(replica);
            }
            if Instant::now() > deadline {
                return Err(Error::new(
                    ErrorKind::TimedOut,
                    format!(
                        "{}: its replica does not replicate after {START_TIMEOUT:?}",
                        self.member.name()
                    ),
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Promotes this replica to a primary, as a failover does once the
    /// primary is gone: waits until what it received is applied (its
    /// `gtid_slave_pos` reaches the received `Gtid_IO_Pos`, within 30 s), then
    /// `STOP SLAVE; RESET SLAVE ALL; SET GLOBAL read_only = 0`.
    ///
    /// # Errors
    ///
    /// When it is not a replica or does not apply what it received in time.
    pub fn promote(&self) -> Result<()> {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            // Vertical, with the names (`sql` leaves them out).
            let mut command = self.mariadb_command();
            command
                .arg(format!("--socket={}", self.socket.display()))
                .args(["-u", "root", &format!("-p{ROOT_PASSWORD}")])
                .args(["--connect-timeout=10", "-e", "SHOW SLAVE STATUS\\G"]);
            let output = command.output()?;
            let status = String::from_utf8_lossy(&output.stdout);
            let received = status
                .lines()
                .find_map(|line| line.trim().strip_prefix("Gtid_IO_Pos:"))
                .map(|p| p.trim().to_owned())
                .ok_or_else(|| Error::other(format!("{} is not a replica", self.member.name())))?;
            let applied = self.sql("SELECT @@gtid_slave_pos")?;
            if applied.trim() == received {
                break;
            }
            if Instant::now() > deadline {
                return Err(Error::new(
                    ErrorKind::TimedOut,
                    format!(
                        "{}: applied {} of the received {received} after {START_TIMEOUT:?}",
                        self.member.name(),
                        applied.trim()
                    ),
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.sql("STOP SLAVE; RESET SLAVE ALL; SET GLOBAL read_only = 0;")
            .map(drop)
    }

    /// Runs `statement` (one or more, separated by `;`) as root over the Unix
    /// socket with `mariadb --no-defaults ... -N -B -e` and returns its
    /// standard output: rows without headers, columns separated by tabs
    /// (tabs, newlines and backslashes in values escaped). A statement that
    /// waits (`GET_LOCK`, say) makes this wait too.
    ///
    /// # Errors
    ///
    /// When the client fails or a statement fails, with its standard error.
    pub fn sql(&self, statement: &str) -> Result<String> {
        self.client(Some(ROOT_PASSWORD), statement)
    }

    fn client(&self, password: Option<&str>, statement: &str) -> Result<String> {
        let mut command = self.mariadb_command();
        command
            .arg(format!("--socket={}", self.socket.display()))
            .args(["-u", "root"]);
        if let Some(password) = password {
            command.arg(format!("-p{password}"));
        }
        command.args(["--connect-timeout=10", "-N", "-B", "-e", statement]);
        let output = command
            .output()
            .map_err(|e| Error::new(e.kind(), format!("cannot run {MARIADB}: {e}")))?;
        if !output.status.success() {
            return Err(Error::other(format!(
                "mariadb {statement:?}: {}{}",
                String::from_utf8_lossy(&output.stderr),
                String::from_utf8_lossy(&output.stdout)
            )));
        }
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    }

    /// A `mariadb` client command that reads no option file
    /// (`mariadb --no-defaults`; add the connection's arguments), without
    /// `MYSQL_HOST`, `MYSQL_TCP_PORT`, `MYSQL_UNIX_PORT` or `MYSQL_PWD` from this
    /// process's environment: for tests that connect as another user or over
    /// TCP (`-h 127.0.0.1 -P PORT`).
    pub fn mariadb_command(&self) -> Command {
        let mut command = Command::new(MARIADB);
        command.arg("--no-defaults");
        for key in [
            "MYSQL_HOST",
            "MYSQL_TCP_PORT",
            "MYSQL_UNIX_PORT",
            "MYSQL_PWD",
            "MYSQL_HISTFILE",
        ] {
            command.env_remove(key);
        }
        command.stdin(Stdio::null());
        command
    }

    /// Creates user `name` with `password` and no privilege: `'name'@'%'`,
    /// which with `--skip-name-resolve` and no anonymous user serves logins
    /// over TCP from 127.0.0.1 and over the Unix socket alike.
    ///
    /// # Errors
    ///
    /// When the user exists or the client fails.
    pub fn create_user(&self, name: &str, password: &str) -> Result<()> {
        self.sql(&format!(
            "CREATE USER {}@'%' IDENTIFIED BY {};",
            mariadb_string(name),
            mariadb_string(password)
        ))
        .map(drop)
    }

    /// Creates database `name` (`utf8mb4`).
    ///
    /// # Errors
    ///
    /// When the database exists or the client fails.
    pub fn create_database(&self, name: &str) -> Result<()> {
        self.sql(&format!("CREATE DATABASE {};", quote(name, '`'))).map(drop)
    }

    /// Grants `user` (made by [`MariaDbServer::create_user`]) all privileges on
    /// database `db`, not the right to grant them.
    ///
    /// # Errors
    ///
    /// When the user does not exist or the client fails.
    pub fn grant_all_on(&self, db: &str, user: &str) -> Result<()> {
        self.sql(&format!(
            "GRANT ALL PRIVILEGES ON {}.* TO {}@'%';",
            quote(db, '`'),
            mariadb_string(user)
        ))
        .map(drop)
    }

    /// The ids of the client connections (`CONNECTION_ID()`, the `Id` of
    /// `SHOW PROCESSLIST`; the query's own and the server's threads
    /// excepted), in order: each can be ended with `KILL id`.
    ///
    /// # Errors
    ///
    /// When the client fails.
    pub fn connection_ids(&self) -> Result<Vec<u64>> {
        let out = self.sql(
            "SELECT ID FROM information_schema.PROCESSLIST \
             WHERE ID <> CONNECTION_ID() AND COMMAND <> 'Daemon' ORDER BY ID;",
        )?;
        out.lines()
            .filter(|line| !line.trim().is_empty())
            .map(|line| line.trim().parse().map_err(Error::other))
            .collect()
    }

    /// Adds the time zone `name` to the server's time zone tables: a zone
    /// with daylight saving time whose clocks went back an hour one second
    /// ago (UTC+1 before, UTC after), so that for the next hour every local
    /// time of that zone happens twice, as in the night of a real change.
    /// A session with `SET time_zone = 'name'` (or every new session, after
    /// `SET GLOBAL time_zone = 'name'`) then reads local times that a
    /// conversion back to the epoch (`UNIX_TIMESTAMP(NOW())`) puts an hour
    /// early.
    ///
    /// # Errors
    ///
    /// When the zone exists or the client fails.
    pub fn add_fallback_time_zone(&self, name: &str) -> Result<()> {
        let name = mariadb_string(name);
        self.sql(&format!(
            "INSERT INTO mysql.time_zone (Use_leap_seconds) VALUES ('N'); \
             SET @zone = LAST_INSERT_ID(); \
             INSERT INTO mysql.time_zone_name (Name, Time_zone_id) VALUES ({name}, @zone); \
             INSERT INTO mysql.time_zone_transition_type \
                 (Time_zone_id, Transition_type_id, `Offset`, Is_DST, Abbreviation) \
                 VALUES (@zone, 0, 3600, 1, 'XDT'), (@zone, 1, 0, 0, 'XST'); \
             INSERT INTO mysql.time_zone_transition (Time_zone_id, Transition_time, Transition_type_id) \
                 VALUES (@zone, 0, 0), (@zone, UNIX_TIMESTAMP() - 1, 1);"
        ))
        .map(drop)
    }

    /// How many `GET_LOCK` locks are held (rows of
    /// `information_schema.METADATA_LOCK_INFO` with `LOCK_TYPE = 'User
    /// lock'`; a lock taken twice by one connection is one row) and how many
    /// connections wait in `GET_LOCK` (`information_schema.PROCESSLIST` rows in
    /// `STATE = 'User lock'`: `METADATA_LOCK_INFO` lists granted locks only).
    ///
    /// # Errors
    ///
    /// When the client fails.
    pub fn user_locks(&self) -> Result<LockCounts> {
        let out = self.sql(
            "SELECT (SELECT COUNT(*) FROM information_schema.METADATA_LOCK_INFO \
                     WHERE LOCK_TYPE = 'User lock'), \
                    (SELECT COUNT(*) FROM information_schema.PROCESSLIST \
                     WHERE STATE = 'User lock');",
        )?;
        LockCounts::parse(&out, '\t')
    }
}

/// Makes the data directory `data` in `dir` (owned by `user` when given), root
/// without a password (`--auth-root-authentication-method=normal`), no test
/// database. Written without syncing: nothing of it needs to survive a crash of
/// the machine.
fn install_db(dir: &Path, data: &Path, user: Option<&SystemUser>) -> Result<()> {
    let mut command = Command::new(MARIADB_INSTALL_DB);
    command
        .arg("--no-defaults")
        .arg(format!("--datadir={}", data.display()))
        .arg(format!("--tmpdir={}", dir.display()))
        .args([
            "--auth-root-authentication-method=normal",
            "--skip-test-db",
            "--skip-name-resolve",
            "--innodb-flush-method=nosync",
            "--skip-innodb-doublewrite",
            "--innodb-flush-log-at-trx-commit=0",
        ])
        .args(SIZES)
        .current_dir(dir)
        .stdin(Stdio::null());
    if let Some(user) = user {
        user.apply(&mut command);
        command.env("HOME", dir);
    }
    let output = command
        .output()
        .map_err(|e| Error::new(e.kind(), format!("cannot run {MARIADB_INSTALL_DB}: {e}")))?;
    if !output.status.success() {
        let who = user.map_or_else(|| "the current user".to_owned(), |u| u.name().to_owned());
        return Err(Error::other(format!(
            "mariadb-install-db (as {who}) failed: {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        )));
    }
    Ok(())
}

/// Whether the server on `port` sends its handshake (a packet whose payload
/// starts with protocol version 10) to a new TCP connection.
fn greets_on(socket: &Path) -> bool {
    let Ok(mut stream) = std::os::unix::net::UnixStream::connect(socket) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_millis(1000)));
    // 3 bytes of length, 1 of sequence number, then the payload.
    let mut head = [0u8; 5];
    stream.read_exact(&mut head).is_ok() && head[4] == 10
}

/// A server id no other replica started by this process has had, and none
/// of another process is likely to: a replica skips the events of its own
/// id, so an id reused along a chain of failovers would lose data.
fn next_server_id() -> u32 {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % 10_000;
    1_000_000 + (std::process::id() % 10_000) * 10_000 + n
}
