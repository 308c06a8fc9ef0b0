//! The SQL servers of a run: a PostgreSQL or MariaDB primary with its
//! standby, the contenders' role and database, and the register table.

use super::*;

/// The role (user), its password and the database the SQL contenders use:
/// an ordinary role that owns its database (lockline creates its tables
/// there and ends a silent holder's connection as the same role), no
/// superuser.
pub(super) const SQL_ROLE: &str = "faults";
pub(super) const SQL_PASSWORD: &str = "faults-password";
pub(super) const SQL_DATABASE: &str = "faults";

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
pub(super) fn parse_register(out: &str, separator: char) -> Result<Vec<StoredWrite>, String> {
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
    pub(super) server: PgServer,
    pub(super) standby: Option<PgServer>,
}

impl Postgres {
    pub(super) fn start(with_standby: bool) -> std::io::Result<Self> {
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
    pub(super) fn fail_over(&mut self) -> std::io::Result<String> {
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
    pub(super) fn replace_standby(&mut self) -> std::io::Result<()> {
        self.standby = Some(self.server.start_standby(Replication::Synchronous)?);
        Ok(())
    }

    /// The server's processes besides the postmaster: its children (every
    /// backend and auxiliary process is forked by the postmaster).
    pub(super) fn children(&mut self) -> Vec<libc::pid_t> {
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
    pub(super) fn signal_children(&mut self, signal: libc::c_int) -> usize {
        self.children()
            .into_iter()
            // SAFETY: kill(2) on a process of the server this run started.
            .filter(|&pid| unsafe { libc::kill(pid, signal) } == 0)
            .count()
    }

    /// SIGKILLs every process of the server at once, as a crash of the
    /// machine or container it runs in would (its clients see their
    /// connections reset).
    pub(super) fn kill(&mut self) -> std::io::Result<()> {
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
    pub(super) fn pause(&mut self) -> std::io::Result<usize> {
        self.server.member().pause()?;
        Ok(self.signal_children(libc::SIGSTOP))
    }

    pub(super) fn resume(&mut self) -> std::io::Result<()> {
        self.signal_children(libc::SIGCONT);
        self.server.member().resume()
    }

    /// The client backends of the contenders' role, in pid order.
    pub(super) fn client_backends(&self) -> std::io::Result<Vec<u32>> {
        let out = self.server.psql(&format!(
            "SELECT pid FROM pg_stat_activity WHERE usename = '{SQL_ROLE}' \
             AND backend_type = 'client backend' ORDER BY pid;"
        ))?;
        Ok(out.lines().filter_map(|l| l.trim().parse().ok()).collect())
    }

    /// SIGKILLs backend `pid`, as the OOM killer would: the postmaster then
    /// ends every other session and reinitializes (crash recovery, unlogged
    /// tables emptied) without itself restarting.
    pub(super) fn kill_backend(&mut self, pid: u32) -> std::io::Result<()> {
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
    pub(super) fn crash_restarts(&mut self) -> usize {
        self.server
            .member()
            .log_tail(u64::MAX)
            .matches("all server processes terminated; reinitializing")
            .count()
    }

    /// Waits until the postmaster has reinitialized once more than
    /// `before`, up to 30 s.
    pub(super) fn wait_crash_restart(&mut self, before: usize) -> std::io::Result<()> {
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
    pub(super) fn wait_serving(&self) -> std::io::Result<()> {
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
    pub(super) fn committed_writes(&self) -> Result<Vec<StoredWrite>, String> {
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
    pub(super) server: MariaDbServer,
    pub(super) replica: Option<MariaDbServer>,
}

impl MariaDb {
    pub(super) fn options(server_id: Option<u32>) -> MariaDbOptions {
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

    pub(super) fn start(with_replica: bool) -> std::io::Result<Self> {
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
    pub(super) fn replace_replica(&mut self) -> std::io::Result<()> {
        self.replica = Some(self.server.start_full_replica(&Self::options(None))?);
        self.await_semi_sync()
    }

    /// Waits until the primary commits semi-synchronously (a replica is
    /// connected and has caught up), up to 30 s.
    pub(super) fn await_semi_sync(&self) -> std::io::Result<()> {
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
    pub(super) fn fail_over(&mut self) -> std::io::Result<String> {
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
    pub(super) fn committed_writes(&self) -> Result<Vec<StoredWrite>, String> {
        let out = self
            .server
            .sql(&format!(
                "SELECT tag, token, seq FROM {SQL_DATABASE}.{SQL_REGISTER} ORDER BY id"
            ))
            .map_err(|e| format!("reading the register: {e}"))?;
        parse_register(&out, '\t')
    }
}
