//! The servers under test: a 3-member etcd cluster or ZooKeeper ensemble,
//! its leader, and a fresh client's view of the lock's entries; or one
//! PostgreSQL server, with the faults one server can have (a crash of the
//! whole server, a crash of one backend, a pause of every process) and, for
//! the failover fault, a synchronous streaming standby; or one MariaDB
//! server (a kill and restart, a pause) and, for the failover fault, a
//! semi-synchronous replica; or one Redis server, with or without
//! persistence (a kill and restart on the same port, a pause).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use lockline_testkit::{
    EtcdCluster, MariaDbOptions, MariaDbServer, Member, PgOptions, PgServer, RedisOptions, RedisServer, Replication,
    ZkEnsemble, ZkOptions,
};

use crate::contender::modes::{parse_register_key, register_key, REGISTER_PREFIX};
use crate::history::Tag;
use crate::Backend;

/// The lock-mode register as the lock's own store holds it (see
/// [`Servers::stored_register`]).
#[derive(Debug, Clone, Default)]
pub struct StoredRegister {
    /// The writes found: writer, token, seq.
    pub rows: Vec<StoredWrite>,
    /// Whether `rows` come in the server's order of the writes.
    pub ordered: bool,
    /// Members that lack writes another member has, in words (ZooKeeper).
    pub divergent: Vec<String>,
}

impl StoredRegister {
    fn ordered(rows: Vec<StoredWrite>) -> Self {
        StoredRegister {
            rows,
            ordered: true,
            divergent: Vec::new(),
        }
    }

    fn unordered(rows: Vec<StoredWrite>) -> Self {
        StoredRegister {
            rows,
            ordered: false,
            divergent: Vec::new(),
        }
    }
}

/// A running cluster of one backend.
#[derive(Debug)]
pub enum Servers {
    /// etcd.
    Etcd(EtcdCluster),
    /// ZooKeeper.
    ZooKeeper(ZkEnsemble),
    /// PostgreSQL.
    Postgres(Postgres),
    /// MariaDB.
    MariaDb(MariaDb),
    /// Redis: the server, and whether it persists (an append-only file
    /// fsynced on every write).
    Redis(RedisServer, bool),
}

/// The role (user), its password and the database the SQL contenders use:
/// an ordinary role that owns its database (lockline creates its tables
/// there and ends a silent holder's connection as the same role), no
/// superuser.
const SQL_ROLE: &str = "faults";
const SQL_PASSWORD: &str = "faults-password";
const SQL_DATABASE: &str = "faults";

/// The SQL contenders' fenced register: one row per write that committed. A
/// logged (InnoDB) table: a committed write survives a crash and is
/// replicated.
pub const SQL_REGISTER: &str = "faults_register";

/// A write found in the backend's own register: the writer, its token and
/// its sequence number for that grant.
pub type StoredWrite = (Tag, u64, u64);

/// A write to [`SQL_REGISTER`] on PostgreSQL: the writer's tag, token and
/// sequence number.
pub const PG_REGISTER_INSERT: &str = "INSERT INTO faults_register (tag, token, seq) VALUES ($1, $2, $3)";

/// The same on MariaDB.
pub const MY_REGISTER_INSERT: &str = "INSERT INTO faults_register (tag, token, seq) VALUES (?, ?, ?)";

/// The register's rows as `tag|token|seq` lines (PostgreSQL's `psql -A`) or
/// tab-separated ones (`mariadb -B`).
fn parse_register(out: &str, separator: char) -> Result<Vec<StoredWrite>, String> {
    out.lines()
        .filter(|line| !line.trim().is_empty())
        .map(|line| {
            let mut fields = line.trim().split(separator);
            let parsed = (|| {
                let tag: Tag = fields.next()?.trim().parse().ok()?;
                Some((
                    tag,
                    fields.next()?.trim().parse().ok()?,
                    fields.next()?.trim().parse().ok()?,
                ))
            })();
            parsed.ok_or_else(|| format!("unreadable register row {line:?}"))
        })
        .collect()
}

/// One PostgreSQL server (fsync off: the nemesis kills processes, never the
/// machine, and `synchronous_commit` stays on), with the role, database and
/// register table of the run; with the failover fault, its synchronous
/// standby (every commit it confirms is on the standby: what a failover
/// keeps, docs/sql.md says, only with synchronous replication).
#[derive(Debug)]
pub struct Postgres {
    server: PgServer,
    standby: Option<PgServer>,
}

impl Postgres {
    fn start(with_standby: bool) -> std::io::Result<Self> {
        let server = PgServer::start_with(&PgOptions {
            durable: false,
            // The register's commits in the server's order.
            settings: vec![("track_commit_timestamp".to_owned(), "on".to_owned())],
            ..PgOptions::default()
        })?;
        server.create_user(SQL_ROLE, SQL_PASSWORD)?;
        server.create_database(SQL_DATABASE, SQL_ROLE)?;
        server.psql_on(
            SQL_DATABASE,
            &format!(
                "CREATE TABLE {SQL_REGISTER} (id bigserial PRIMARY KEY, tag text NOT NULL, \
                 token bigint NOT NULL, seq bigint NOT NULL); \
                 ALTER TABLE {SQL_REGISTER} OWNER TO {SQL_ROLE};"
            ),
        )?;
        let standby = if with_standby {
            Some(server.start_standby(Replication::Synchronous)?)
        } else {
            None
        };
        Ok(Postgres { server, standby })
    }

    /// The contenders' URL through `address` (a proxy, or the server itself).
    pub fn url(address: &str) -> String {
        format!("postgres://{SQL_ROLE}:{SQL_PASSWORD}@{address}/{SQL_DATABASE}")
    }

    /// Crashes the primary as a machine's crash would (every process at
    /// once: frozen, then killed, so that no backend serves a statement
    /// after another's death freed its locks), promotes the standby and makes
    /// it the server (the old one is dropped); returns the new primary's
    /// address.
    fn fail_over(&mut self) -> std::io::Result<String> {
        let standby = self
            .standby
            .take()
            .ok_or_else(|| std::io::Error::other("no standby to fail over to"))?;
        self.kill()?;
        standby.promote()?;
        self.server = standby;
        Ok(format!("127.0.0.1:{}", self.server.port()))
    }

    /// A new synchronous standby of the current primary.
    fn replace_standby(&mut self) -> std::io::Result<()> {
        self.standby = Some(self.server.start_standby(Replication::Synchronous)?);
        Ok(())
    }

    /// The server's processes besides the postmaster: its children (every
    /// backend and auxiliary process is forked by the postmaster).
    fn children(&mut self) -> Vec<libc::pid_t> {
        let Some(parent) = self.server.member().pid() else {
            return Vec::new();
        };
        let Ok(entries) = std::fs::read_dir("/proc") else {
            return Vec::new();
        };
        entries
            .flatten()
            .filter_map(|entry| entry.file_name().to_str()?.parse::<libc::pid_t>().ok())
            .filter(|pid| {
                // The fourth field of /proc/PID/stat, after the command's
                // parenthesised name (which may hold spaces), is the parent.
                std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
                    stat.rsplit_once(')')
                        .and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<u32>().ok())
                        == Some(parent)
                })
            })
            .collect()
    }

    /// Sends `signal` to the server's children; how many it reached.
    fn signal_children(&mut self, signal: libc::c_int) -> usize {
        self.children()
            .into_iter()
            // SAFETY: kill(2) on a process of the server this run started.
            .filter(|&pid| unsafe { libc::kill(pid, signal) } == 0)
            .count()
    }

    /// SIGKILLs every process of the server at once, as a crash of the
    /// machine or container it runs in would (its clients see their
    /// connections reset).
    fn kill(&mut self) -> std::io::Result<()> {
        // Frozen first, so that it forks nothing while its children are
        // listed and reacts to none of their deaths; the children before it,
        // so that none notices its death and says goodbye to its client.
        self.server.member().pause()?;
        self.signal_children(libc::SIGKILL);
        self.server.member().kill()
    }

    /// SIGSTOPs the postmaster and every backend: the whole server freezes
    /// (stopping the postmaster alone would only stop new connections).
    /// Returns how many processes besides the postmaster it froze.
    fn pause(&mut self) -> std::io::Result<usize> {
        self.server.member().pause()?;
        Ok(self.signal_children(libc::SIGSTOP))
    }

    fn resume(&mut self) -> std::io::Result<()> {
        self.signal_children(libc::SIGCONT);
        self.server.member().resume()
    }

    /// The client backends of the contenders' role, in pid order.
    fn client_backends(&self) -> std::io::Result<Vec<u32>> {
        let out = self.server.psql(&format!(
            "SELECT pid FROM pg_stat_activity WHERE usename = '{SQL_ROLE}' \
             AND backend_type = 'client backend' ORDER BY pid;"
        ))?;
        Ok(out.lines().filter_map(|l| l.trim().parse().ok()).collect())
    }

    /// SIGKILLs backend `pid`, as the OOM killer would: the postmaster then
    /// ends every other session and reinitializes (crash recovery, unlogged
    /// tables emptied) without itself restarting.
    fn kill_backend(&mut self, pid: u32) -> std::io::Result<()> {
        let target = libc::pid_t::try_from(pid).map_err(std::io::Error::other)?;
        if !self.children().contains(&target) {
            return Err(std::io::Error::other(format!("{pid} is not a process of the server")));
        }
        // SAFETY: kill(2) on a backend of the server this run started.
        if unsafe { libc::kill(target, libc::SIGKILL) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }

    /// How many times the postmaster has reinitialized after a backend's
    /// crash, as its log says.
    fn crash_restarts(&mut self) -> usize {
        self.server
            .member()
            .log_tail(u64::MAX)
            .matches("all server processes terminated; reinitializing")
            .count()
    }

    /// Waits until the postmaster has reinitialized once more than
    /// `before`, up to 30 s.
    fn wait_crash_restart(&mut self, before: usize) -> std::io::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.crash_restarts() <= before {
            if Instant::now() > deadline {
                return Err(std::io::Error::other(
                    "the postmaster did not reinitialize within 30 s of a backend's crash",
                ));
            }
            // Another process's log: nothing to await but its growth.
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }

    /// Waits until the server answers a query again (after a restart, a
    /// resume or a crash recovery), up to 30 s.
    fn wait_serving(&self) -> std::io::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            match self.server.psql("SELECT 1;") {
                Ok(_) => return Ok(()),
                Err(error) if Instant::now() > deadline => return Err(error),
                // No event to await from another process: probe again.
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    }

    /// Every write that committed to the register: (writer, token, seq).
    fn committed_writes(&self) -> Result<Vec<StoredWrite>, String> {
        let out = self
            .server
            .psql_on(
                SQL_DATABASE,
                &format!("SELECT tag, token, seq FROM {SQL_REGISTER} ORDER BY pg_xact_commit_timestamp(xmin), id;"),
            )
            .map_err(|e| format!("reading the register: {e}"))?;
        parse_register(&out, '|')
    }
}

/// One MariaDB server (`innodb_flush_log_at_trx_commit = 2`: the nemesis
/// kills processes, never the machine), with the user, database and register
/// table of the run. Every server of a run logs its binary log (GTID, with
/// what it replicates) and speaks semi-synchronous replication with
/// `AFTER_SYNC`, so that with the failover fault the replica has every
/// commit the primary confirmed (what a failover keeps only with it, as
/// docs/sql.md says).
#[derive(Debug)]
pub struct MariaDb {
    server: MariaDbServer,
    replica: Option<MariaDbServer>,
}

impl MariaDb {
    fn options(server_id: Option<u32>) -> MariaDbOptions {
        let mut settings: Vec<(String, String)> = [
            ("log-bin", "mariadb-bin"),
            ("log-slave-updates", "ON"),
            ("rpl-semi-sync-master-enabled", "ON"),
            ("rpl-semi-sync-slave-enabled", "ON"),
            ("rpl-semi-sync-master-wait-point", "AFTER_SYNC"),
            // Never fall back to asynchronous while a replica is connected;
            // with none connected (between a failover and the new replica),
            // nothing to wait for.
            ("rpl-semi-sync-master-timeout", "3600000"),
            ("rpl-semi-sync-master-wait-no-slave", "OFF"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        if let Some(id) = server_id {
            settings.push(("server-id".to_owned(), id.to_string()));
        }
        MariaDbOptions {
            innodb_flush_log_at_trx_commit: 2,
            settings,
            ..MariaDbOptions::default()
        }
    }

    fn start(with_replica: bool) -> std::io::Result<Self> {
        let server = MariaDbServer::start_with(&Self::options(Some(1)))?;
        server.create_database(SQL_DATABASE)?;
        server.create_user(SQL_ROLE, SQL_PASSWORD)?;
        server.grant_all_on(SQL_DATABASE, SQL_ROLE)?;
        server.sql(&format!(
            "CREATE TABLE {SQL_DATABASE}.{SQL_REGISTER} (id BIGINT AUTO_INCREMENT PRIMARY KEY, \
             tag VARCHAR(64) NOT NULL, token BIGINT NOT NULL, seq BIGINT NOT NULL) ENGINE = InnoDB"
        ))?;
        let mut mariadb = MariaDb { server, replica: None };
        if with_replica {
            // Started at once: lockline tells a promoted replica from its
            // primary by its own run marker even when their starts are
            // within a second or two (docs/sql.md, "Failover").
            mariadb.replace_replica()?;
        }
        Ok(mariadb)
    }

    /// The contenders' URL through `address` (a proxy, or the server itself).
    pub fn url(address: &str) -> String {
        format!("mysql://{SQL_ROLE}:{SQL_PASSWORD}@{address}/{SQL_DATABASE}")
    }

    /// A new replica of the current primary, made from its whole binary
    /// log; returns once the primary commits semi-synchronously with it.
    fn replace_replica(&mut self) -> std::io::Result<()> {
        self.replica = Some(self.server.start_full_replica(&Self::options(None))?);
        self.await_semi_sync()
    }

    /// Waits until the primary commits semi-synchronously (a replica is
    /// connected and has caught up), up to 30 s.
    fn await_semi_sync(&self) -> std::io::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            // ON once a connected replica has caught up (off while none is).
            let on = self.server.sql(
                "SELECT COUNT(*) FROM information_schema.GLOBAL_STATUS \
                 WHERE (VARIABLE_NAME = 'RPL_SEMI_SYNC_MASTER_STATUS' AND VARIABLE_VALUE = 'ON') \
                 OR (VARIABLE_NAME = 'RPL_SEMI_SYNC_MASTER_CLIENTS' AND VARIABLE_VALUE + 0 >= 1)",
            )?;
            if on.trim() == "2" {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(std::io::Error::other(
                    "the primary does not commit semi-synchronously with its replica after 30 s",
                ));
            }
            // Another process's replication: nothing to await but its state.
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Kills the primary (once it commits semi-synchronously: every commit
    /// it confirmed is then on the replica), promotes the replica once it
    /// applied what it received, and makes it the server; returns the new
    /// primary's address.
    fn fail_over(&mut self) -> std::io::Result<String> {
        let replica = self
            .replica
            .take()
            .ok_or_else(|| std::io::Error::other("no replica to fail over to"))?;
        if let Err(error) = self.await_semi_sync() {
            self.replica = Some(replica);
            return Err(error);
        }
        self.server.member().kill()?;
        replica.promote()?;
        self.server = replica;
        Ok(format!("127.0.0.1:{}", self.server.port()))
    }

    /// Every write that committed to the register: (writer, token, seq).
    fn committed_writes(&self) -> Result<Vec<StoredWrite>, String> {
        let out = self
            .server
            .sql(&format!(
                "SELECT tag, token, seq FROM {SQL_DATABASE}.{SQL_REGISTER} ORDER BY id"
            ))
            .map_err(|e| format!("reading the register: {e}"))?;
        parse_register(&out, '\t')
    }
}

/// An entry found under the lock: its key or path and its owner's session
/// (etcd lease / ZooKeeper ephemeral owner) in lowercase hex.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The key (etcd) or znode path (ZooKeeper).
    pub key: String,
    /// The owning session id, as `Session::id` prints it.
    pub owner: String,
}

impl Servers {
    /// Starts `size` members (PostgreSQL, MariaDB, Redis: one server,
    /// whatever `size`; with `failover`, PostgreSQL's standby and MariaDB's
    /// replica too).
    ///
    /// # Errors
    ///
    /// When the servers cannot be started.
    pub fn start(backend: Backend, size: usize, failover: bool) -> std::io::Result<Self> {
        Ok(match backend {
            Backend::Etcd => Servers::Etcd(EtcdCluster::start_cluster(size)?),
            Backend::ZooKeeper => Servers::ZooKeeper(ZkEnsemble::start_with(size, &ZkOptions::default())?),
            Backend::Postgres => Servers::Postgres(Postgres::start(failover)?),
            Backend::MariaDb => Servers::MariaDb(MariaDb::start(failover)?),
            Backend::Redis | Backend::RedisVolatile => {
                let append_only = backend == Backend::Redis;
                let server = RedisServer::start_with(&RedisOptions {
                    append_only,
                    ..RedisOptions::default()
                })?;
                Servers::Redis(server, append_only)
            }
        })
    }

    /// How many members.
    pub fn size(&self) -> usize {
        match self {
            Servers::Etcd(cluster) => cluster.size(),
            Servers::ZooKeeper(ensemble) => ensemble.size(),
            Servers::Postgres(_) | Servers::MariaDb(_) | Servers::Redis(..) => 1,
        }
    }

    /// What runs, for the log: "etcd cluster of 3".
    pub fn describe(&self) -> String {
        match self {
            Servers::Etcd(cluster) => format!("etcd cluster of {}", cluster.size()),
            Servers::ZooKeeper(ensemble) => format!("ZooKeeper ensemble of {}", ensemble.size()),
            Servers::Postgres(Postgres { server, standby: None }) => {
                format!("PostgreSQL server on port {}", server.port())
            }
            Servers::Postgres(Postgres {
                server,
                standby: Some(standby),
            }) => format!(
                "PostgreSQL server on port {}, its synchronous standby on port {}",
                server.port(),
                standby.port()
            ),
            Servers::MariaDb(MariaDb { server, replica: None }) => format!("MariaDB server on port {}", server.port()),
            Servers::MariaDb(MariaDb {
                server,
                replica: Some(replica),
            }) => format!(
                "MariaDB server on port {}, its semi-synchronous replica on port {}",
                server.port(),
                replica.port()
            ),
            Servers::Redis(server, true) => format!(
                "Redis server on port {} (appendonly yes, appendfsync always)",
                server.port()
            ),
            Servers::Redis(server, false) => format!("Redis server on port {} (no persistence)", server.port()),
        }
    }

    /// Member `i`'s client address, `127.0.0.1:PORT`.
    pub fn address(&self, i: usize) -> String {
        match self {
            Servers::Etcd(cluster) => format!("127.0.0.1:{}", cluster.client_port(i)),
            Servers::ZooKeeper(ensemble) => ensemble.address(i),
            Servers::Postgres(pg) => format!("127.0.0.1:{}", pg.server.port()),
            Servers::MariaDb(my) => format!("127.0.0.1:{}", my.server.port()),
            Servers::Redis(server, _) => format!("127.0.0.1:{}", server.port()),
        }
    }

    /// What a contender is given to reach the members at `addresses` (its
    /// proxies): etcd endpoints, a ZooKeeper connect string, a database or
    /// Redis URL.
    pub fn endpoints(&self, addresses: &[String]) -> String {
        match self {
            Servers::Etcd(_) => addresses
                .iter()
                .map(|a| format!("http://{a}"))
                .collect::<Vec<_>>()
                .join(","),
            Servers::ZooKeeper(_) => addresses.join(","),
            Servers::Postgres(_) => Postgres::url(addresses.first().map_or("", String::as_str)),
            Servers::MariaDb(_) => MariaDb::url(addresses.first().map_or("", String::as_str)),
            Servers::Redis(..) => format!("redis://{}", addresses.first().map_or("", String::as_str)),
        }
    }

    /// Member `i` (PostgreSQL: the postmaster; MariaDB, Redis: the server).
    pub fn member(&mut self, i: usize) -> &mut Member {
        match self {
            Servers::Etcd(cluster) => cluster.member(i),
            Servers::ZooKeeper(ensemble) => ensemble.member(i),
            Servers::Postgres(pg) => pg.server.member(),
            Servers::MariaDb(my) => my.server.member(),
            Servers::Redis(server, _) => server.member(),
        }
    }

    fn postgres(&mut self) -> std::io::Result<&mut Postgres> {
        match self {
            Servers::Postgres(pg) => Ok(pg),
            _ => Err(std::io::Error::other(
                "a fault of a PostgreSQL server, on another backend",
            )),
        }
    }

    /// PostgreSQL: SIGKILLs every process of the server. MariaDB, Redis:
    /// SIGKILLs the server.
    ///
    /// # Errors
    ///
    /// On a cluster, or when the server is not running.
    pub fn kill_server(&mut self) -> std::io::Result<()> {
        match self {
            Servers::Redis(server, _) => server.member().kill(),
            Servers::MariaDb(my) => my.server.member().kill(),
            _ => self.postgres()?.kill(),
        }
    }

    /// Starts the server again after [`kill_server`](Self::kill_server), on
    /// the same port with the same data directory (PostgreSQL: crash
    /// recovery; Redis: the append-only file read back, or nothing without
    /// persistence), and waits until it answers.
    ///
    /// # Errors
    ///
    /// On a cluster, or when it does not come back.
    pub fn restart_server(&mut self) -> std::io::Result<()> {
        match self {
            Servers::Redis(server, _) => server.restart(),
            Servers::MariaDb(my) => my.server.restart(),
            _ => self.postgres()?.server.restart(),
        }
    }

    /// Freezes every process of the server (SIGSTOP); says what it froze.
    ///
    /// # Errors
    ///
    /// On a cluster, when the server is not running, or when on PostgreSQL
    /// it froze no backend besides the postmaster.
    pub fn pause_server(&mut self) -> std::io::Result<String> {
        match self {
            Servers::Redis(server, _) => {
                server.member().pause()?;
                Ok("froze redis-server".into())
            }
            Servers::MariaDb(my) => {
                my.server.member().pause()?;
                Ok("froze mariadbd".into())
            }
            _ => match self.postgres()?.pause()? {
                0 => Err(std::io::Error::other("pausing the server froze no backend")),
                frozen => Ok(format!("froze the postmaster and {frozen} more processes")),
            },
        }
    }

    /// Thaws what [`pause_server`](Self::pause_server) froze.
    ///
    /// # Errors
    ///
    /// On a cluster, or when the server is not running.
    pub fn resume_server(&mut self) -> std::io::Result<()> {
        match self {
            Servers::Redis(server, _) => server.member().resume(),
            Servers::MariaDb(my) => my.server.member().resume(),
            _ => self.postgres()?.resume(),
        }
    }

    /// PostgreSQL: the client backends of the contenders' role (pids).
    ///
    /// # Errors
    ///
    /// On another backend, or when the server cannot be asked.
    pub fn client_backends(&mut self) -> std::io::Result<Vec<u32>> {
        self.postgres()?.client_backends()
    }

    /// PostgreSQL: SIGKILLs backend `pid` (one of
    /// [`client_backends`](Self::client_backends)); the postmaster then ends
    /// every session and reinitializes (crash recovery).
    ///
    /// # Errors
    ///
    /// On another backend, or when it is not a process of the server or
    /// cannot be killed.
    pub fn kill_backend(&mut self, pid: u32) -> std::io::Result<()> {
        self.postgres()?.kill_backend(pid)
    }

    /// PostgreSQL: how many times the postmaster has reinitialized after a
    /// backend's crash so far (0 on other backends).
    pub fn crash_restarts(&mut self) -> usize {
        self.postgres().map_or(0, |pg| pg.crash_restarts())
    }

    /// PostgreSQL: waits until the postmaster has reinitialized after a
    /// backend's crash once more than `before` (from [`crash_restarts`](Self::crash_restarts)).
    ///
    /// # Errors
    ///
    /// On another backend, or when it does not within 30 s.
    pub fn wait_crash_restart(&mut self, before: usize) -> std::io::Result<()> {
        self.postgres()?.wait_crash_restart(before)
    }

    /// Every write that committed to the backend's own register, when the
    /// backend keeps one (PostgreSQL, MariaDB): (writer, token, seq), in the
    /// order the server committed them on PostgreSQL (its commit
    /// timestamps, `track_commit_timestamp`), in the order they were
    /// inserted on MariaDB (their ids).
    pub fn committed_writes(&self) -> Option<Result<Vec<StoredWrite>, String>> {
        match self {
            Servers::Postgres(pg) => Some(pg.committed_writes()),
            Servers::MariaDb(my) => Some(my.committed_writes()),
            _ => None,
        }
    }

    /// The lock-mode contenders' fenced register, as the lock's own store
    /// holds it: the writes among `written` (writer, token, seq) whose key
    /// ([`register_key`](crate::contender::modes::register_key())) is there,
    /// in the server's order of the writes on etcd (their create revisions,
    /// one linearizable read) and ZooKeeper (their nodes' czxid, each member
    /// read on its own after a `sync`: members that disagree are named);
    /// elsewhere each key is read with lockline's `Session::read`, in no
    /// order.
    ///
    /// # Errors
    ///
    /// A message when the store cannot be read.
    pub fn stored_register(&self, written: &[StoredWrite]) -> Result<StoredRegister, String> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        let backend = self.backend();
        let read = async {
            match self {
                Servers::Etcd(cluster) => etcd_register(cluster.endpoints()).await.map(StoredRegister::ordered),
                Servers::ZooKeeper(ensemble) => {
                    let members: Vec<String> = (0..ensemble.size()).map(|i| ensemble.address(i)).collect();
                    zookeeper_register(&members).await
                }
                Servers::Postgres(pg) => {
                    let url = Postgres::url(&format!("127.0.0.1:{}", pg.server.port()));
                    let client = lockline::Client::new(lockline_sql::Sql::new(url));
                    lockline_register(client, backend, written)
                        .await
                        .map(StoredRegister::unordered)
                }
                Servers::MariaDb(my) => {
                    let url = MariaDb::url(&format!("127.0.0.1:{}", my.server.port()));
                    let client = lockline::Client::new(lockline_sql::Sql::new(url));
                    lockline_register(client, backend, written)
                        .await
                        .map(StoredRegister::unordered)
                }
                Servers::Redis(server, _) => {
                    let client = lockline::Client::new(lockline_redis::Redis::new(server.url()));
                    lockline_register(client, backend, written)
                        .await
                        .map(StoredRegister::unordered)
                }
            }
        };
        runtime
            .block_on(async { tokio::time::timeout(Duration::from_secs(120), read).await })
            .map_err(|_| "reading the fenced register back took longer than 120 s".to_owned())?
    }

    fn backend(&self) -> Backend {
        match self {
            Servers::Etcd(_) => Backend::Etcd,
            Servers::ZooKeeper(_) => Backend::ZooKeeper,
            Servers::Postgres(_) => Backend::Postgres,
            Servers::MariaDb(_) => Backend::MariaDb,
            Servers::Redis(_, true) => Backend::Redis,
            Servers::Redis(_, false) => Backend::RedisVolatile,
        }
    }

    /// The failover fault's outage: crashes the primary (PostgreSQL: every
    /// process; MariaDB: the server, once it commits semi-synchronously) and
    /// promotes its standby or replica, which becomes the server from now
    /// on. Returns the new primary's address, which the contenders' proxies
    /// must be moved to (a virtual IP's move).
    ///
    /// # Errors
    ///
    /// On another backend, without a standby, or when the promotion fails.
    pub fn fail_over(&mut self) -> std::io::Result<String> {
        match self {
            Servers::Postgres(pg) => pg.fail_over(),
            Servers::MariaDb(my) => my.fail_over(),
            _ => Err(std::io::Error::other("a failover, on a backend without replicas")),
        }
    }

    /// After [`fail_over`](Self::fail_over): a new standby (PostgreSQL,
    /// synchronous) or replica (MariaDB, semi-synchronous) of the new primary,
    /// for the next failover. Returns once the primary commits with it.
    ///
    /// # Errors
    ///
    /// On another backend, or when it does not start or catch up in time.
    pub fn replace_standby(&mut self) -> std::io::Result<()> {
        match self {
            Servers::Postgres(pg) => pg.replace_standby(),
            Servers::MariaDb(my) => my.replace_replica(),
            _ => Err(std::io::Error::other("a standby, on a backend without replicas")),
        }
    }

    /// The member that leads now, if one answers as leader. Only asks running,
    /// unpaused members (the nemesis never leaves one paused when it asks).
    pub fn leader(&mut self) -> Option<usize> {
        (0..self.size()).find(|&i| {
            if !self.member(i).is_running() {
                return false;
            }
            match self {
                Servers::Etcd(cluster) => cluster
                    .metrics(i)
                    .is_some_and(|m| m.lines().any(|l| l.trim() == "etcd_server_is_leader 1")),
                Servers::ZooKeeper(ensemble) => ensemble.mode(i).as_deref() == Some("leader"),
                Servers::Postgres(_) | Servers::MariaDb(_) | Servers::Redis(..) => true,
            }
        })
    }

    /// Waits until member `i` serves again after a restart or resume.
    ///
    /// # Errors
    ///
    /// When it does not within the testkit's start deadline.
    pub fn wait_serving(&mut self, i: usize) -> std::io::Result<()> {
        match self {
            Servers::Etcd(cluster) => cluster.wait_healthy(i),
            Servers::ZooKeeper(ensemble) => ensemble.wait_serving(i),
            Servers::Postgres(pg) => pg.wait_serving(),
            Servers::MariaDb(my) => mariadb_wait_serving(&my.server),
            Servers::Redis(server, _) => redis_wait_serving(server),
        }
    }

    /// The lock's entries, read by a fresh client connected straight to the
    /// members (no proxy).
    ///
    /// # Errors
    ///
    /// A message when the servers cannot be read.
    pub fn entries(&self, name: &str) -> Result<Vec<Entry>, String> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        let read = async {
            match self {
                Servers::Etcd(cluster) => etcd_entries(cluster.endpoints(), name).await,
                Servers::ZooKeeper(ensemble) => zookeeper_entries(&ensemble.connect_string(), name).await,
                Servers::Postgres(pg) => {
                    let url = Postgres::url(&format!("127.0.0.1:{}", pg.server.port()));
                    lockline_entries(lockline::Client::new(lockline_sql::Sql::new(url)), "PostgreSQL", name).await
                }
                Servers::MariaDb(my) => {
                    let url = MariaDb::url(&format!("127.0.0.1:{}", my.server.port()));
                    lockline_entries(lockline::Client::new(lockline_sql::Sql::new(url)), "MariaDB", name).await
                }
                Servers::Redis(server, _) => {
                    let redis = lockline_redis::Redis::new(server.url());
                    lockline_entries(lockline::Client::new(redis), "Redis", name).await
                }
            }
        };
        runtime
            .block_on(async { tokio::time::timeout(Duration::from_secs(20), read).await })
            .map_err(|_| format!("listing the entries of {name:?} took longer than 20 s"))?
    }
}

async fn etcd_entries(endpoints: Vec<String>, name: &str) -> Result<Vec<Entry>, String> {
    use lockline_etcd::etcd_client::{Client, GetOptions};
    let mut client = Client::connect(endpoints, None)
        .await
        .map_err(|e| format!("etcd connect: {e}"))?;
    let prefix = format!("{name}/");
    let answer = client
        .get(prefix.as_str(), Some(GetOptions::new().with_prefix()))
        .await
        .map_err(|e| format!("etcd get {prefix:?}: {e}"))?;
    Ok(answer
        .kvs()
        .iter()
        .map(|kv| Entry {
            key: String::from_utf8_lossy(kv.key()).into_owned(),
            owner: format!("{:x}", kv.lease()),
        })
        .collect())
}

async fn zookeeper_entries(connect: &str, name: &str) -> Result<Vec<Entry>, String> {
    use lockline_zookeeper::zookeeper_client::{Client, Error};
    let client = Client::connect(connect)
        .await
        .map_err(|e| format!("ZooKeeper connect: {e}"))?;
    let path = format!("/{}", name.trim_matches('/'));
    let children = match client.list_children(&path).await {
        Ok(children) => children,
        Err(Error::NoNode) => return Ok(Vec::new()),
        Err(error) => return Err(format!("ZooKeeper list {path}: {error}")),
    };
    let mut entries = Vec::new();
    // A lock-mode resource's value block (and the stamp its updates make
    // and delete in one transaction) are reserved children, no contenders.
    for child in children
        .into_iter()
        .filter(|c| c != "lockline-value-block" && c != "lockline-stamp")
    {
        let key = format!("{path}/{child}");
        match client.check_stat(&key).await {
            Ok(Some(stat)) => entries.push(Entry {
                key,
                owner: format!("{:x}", stat.ephemeral_owner),
            }),
            Ok(None) => {}
            Err(error) => return Err(format!("ZooKeeper stat {key}: {error}")),
        }
    }
    Ok(entries)
}

/// The register's keys on etcd, in the order of their create revisions.
async fn etcd_register(endpoints: Vec<String>) -> Result<Vec<StoredWrite>, String> {
    use lockline_etcd::etcd_client::{Client, GetOptions};
    let mut client = Client::connect(endpoints, None)
        .await
        .map_err(|e| format!("etcd connect: {e}"))?;
    let answer = client
        .get(REGISTER_PREFIX, Some(GetOptions::new().with_prefix()))
        .await
        .map_err(|e| format!("etcd get {REGISTER_PREFIX:?}: {e}"))?;
    let mut kvs: Vec<_> = answer.kvs().iter().collect();
    kvs.sort_by_key(|kv| kv.create_revision());
    kvs.into_iter()
        .map(|kv| stored_write(&String::from_utf8_lossy(kv.key())))
        .collect()
}

/// The register's nodes on ZooKeeper, in the order of their czxid: every
/// member read on its own, after a `sync` (which brings it up to the
/// leader's commits), so that members which lost a committed write are
/// named. The rows are every node any member has.
async fn zookeeper_register(members: &[String]) -> Result<StoredRegister, String> {
    use lockline_zookeeper::zookeeper_client::{Client, Error};
    let parent = format!("/{}", REGISTER_PREFIX.trim_end_matches('/'));
    let mut seen: Vec<BTreeMap<String, i64>> = Vec::new();
    for member in members {
        let client = Client::connect(member)
            .await
            .map_err(|e| format!("ZooKeeper connect {member}: {e}"))?;
        let mut nodes = BTreeMap::new();
        match client.sync(&parent).await {
            Ok(()) | Err(Error::NoNode) => {}
            Err(error) => return Err(format!("ZooKeeper sync {parent} on {member}: {error}")),
        }
        let children = match client.list_children(&parent).await {
            Ok(children) => children,
            Err(Error::NoNode) => Vec::new(),
            Err(error) => return Err(format!("ZooKeeper list {parent} on {member}: {error}")),
        };
        for child in children {
            let path = format!("{parent}/{child}");
            match client.check_stat(&path).await {
                Ok(Some(stat)) => {
                    nodes.insert(path, stat.czxid);
                }
                Ok(None) => {}
                Err(error) => return Err(format!("ZooKeeper stat {path} on {member}: {error}")),
            }
        }
        seen.push(nodes);
    }
    let mut union: BTreeMap<String, i64> = BTreeMap::new();
    for nodes in &seen {
        union.extend(nodes.iter().map(|(path, czxid)| (path.clone(), *czxid)));
    }
    let mut divergent = Vec::new();
    for (i, nodes) in seen.iter().enumerate() {
        let missing: Vec<&String> = union.keys().filter(|path| !nodes.contains_key(*path)).collect();
        if let Some(first) = missing.first() {
            divergent.push(format!(
                "ZooKeeper member n{} ({}) lacks {} of the {} register nodes the others have, {first} the first",
                i + 1,
                members[i],
                missing.len(),
                union.len()
            ));
        }
    }
    let mut nodes: Vec<(i64, String)> = union.into_iter().map(|(path, czxid)| (czxid, path)).collect();
    nodes.sort();
    let rows = nodes
        .into_iter()
        .map(|(_, path)| stored_write(&path))
        .collect::<Result<_, _>>()?;
    Ok(StoredRegister {
        rows,
        ordered: true,
        divergent,
    })
}

/// The register's keys among `written`, read one by one through a lockline
/// session of its own (closed after).
async fn lockline_register(
    client: lockline::Client,
    backend: Backend,
    written: &[StoredWrite],
) -> Result<Vec<StoredWrite>, String> {
    let session = client.session().await.map_err(|e| format!("{backend} session: {e}"))?;
    let mut found = Vec::new();
    let mut failed = None;
    for &(tag, token, seq) in written {
        let key = register_key(backend, &tag.to_string(), token, seq);
        match session.read(&key).await {
            Ok(Some(_)) => found.push((tag, token, seq)),
            Ok(None) => {}
            Err(error) => {
                failed = Some(format!("{backend} read {key:?}: {error}"));
                break;
            }
        }
    }
    let _ = session.close().await;
    failed.map_or(Ok(found), Err)
}

fn stored_write(key: &str) -> Result<StoredWrite, String> {
    let (tag, token, seq) =
        parse_register_key(key).ok_or_else(|| format!("a register key not written by a contender: {key:?}"))?;
    Ok((tag.parse()?, token, seq))
}

/// Waits until a Redis server answers `PING` (after a resume), up to 30 s.
fn redis_wait_serving(server: &RedisServer) -> std::io::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match server.cli(&["PING"]) {
            Ok(answer) if answer.trim() == "PONG" => return Ok(()),
            Ok(answer) if Instant::now() > deadline => {
                return Err(std::io::Error::other(format!("PING answered {:?}", answer.trim())))
            }
            Err(error) if Instant::now() > deadline => return Err(error),
            // No event to await from another process: probe again.
            _ => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

/// Waits until a MariaDB server answers a query (after a resume), up to 30 s.
fn mariadb_wait_serving(server: &MariaDbServer) -> std::io::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match server.sql("SELECT 1") {
            Ok(_) => return Ok(()),
            Err(error) if Instant::now() > deadline => return Err(error),
            // No event to await from another process: probe again.
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

/// The lock's live entries as the backend itself lists them, through a
/// session of its own (closed after). On PostgreSQL: rows whose guard (the
/// owner connection's advisory lock) is held; a row whose guard is free is
/// dead by the backend's rules (its owner's connection ended): whoever meets
/// it deletes it, and it blocks nobody. On Redis: the queue's entries whose
/// key has not expired.
async fn lockline_entries(client: lockline::Client, what: &str, name: &str) -> Result<Vec<Entry>, String> {
    let session = client.session().await.map_err(|e| format!("{what} session: {e}"))?;
    let listed = session.backend_session().list(name).await;
    let _ = session.close().await;
    Ok(listed
        .map_err(|e| format!("{what} list {name:?}: {e}"))?
        .into_iter()
        .map(|entry| Entry {
            key: entry.key,
            owner: entry.owner.unwrap_or_default(),
        })
        .collect())
}
