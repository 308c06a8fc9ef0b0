//! One database server of either engine, for tests written once for both.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use lockline_testkit::{LineChild, LockCounts, MariaDbServer, PgServer};

/// A PostgreSQL or MariaDB server started for one test.
pub enum Db {
    Pg(PgServer),
    My(MariaDbServer),
}

impl Db {
    pub fn postgres() -> Self {
        Db::Pg(super::postgres())
    }

    pub fn mariadb() -> Self {
        Db::My(super::mariadb().0)
    }

    pub fn is_postgres(&self) -> bool {
        matches!(self, Db::Pg(_))
    }

    /// The superuser's URL on the test database.
    pub fn url(&self) -> String {
        match self {
            Db::Pg(server) => server.url(),
            Db::My(server) => format!("{}/lockline", server.url()),
        }
    }

    pub fn port(&self) -> u16 {
        match self {
            Db::Pg(server) => server.port(),
            Db::My(server) => server.port(),
        }
    }

    /// The URL with `address` (a proxy's `127.0.0.1:PORT`) as its host.
    pub fn url_via(&self, address: &str) -> String {
        self.url().replace(&format!("127.0.0.1:{}", self.port()), address)
    }

    /// The superuser's URL for `user` with `password` on the test database.
    pub fn url_for(&self, user: &str, password: &str) -> String {
        match self {
            Db::Pg(server) => server.url_for(user, password, "postgres"),
            Db::My(server) => server.url_for(user, password, "lockline"),
        }
    }

    /// Runs statements as the superuser on the test database; their output.
    pub fn sql(&self, statements: &str) -> String {
        match self {
            Db::Pg(server) => server.psql(statements),
            Db::My(server) => server.sql(&format!("USE lockline; {statements}")),
        }
        .unwrap_or_else(|e| panic!("{statements}: {e}"))
    }

    /// One number a query answers.
    pub fn count(&self, query: &str) -> i64 {
        let out = self.sql(query);
        out.trim()
            .parse()
            .unwrap_or_else(|e| panic!("{query} answered {out:?}: {e}"))
    }

    /// Ends the server connection `conn` (a PostgreSQL backend's pid, a
    /// MariaDB connection id) and returns once it has ended: its guards are
    /// free then. MariaDB's `KILL` only flags the connection, so its process
    /// list is probed every 10 ms (no event to await), for at most 20 s.
    #[allow(dead_code)] // not every test binary ends connections
    pub fn end_connection(&self, conn: &str) {
        if self.is_postgres() {
            self.sql(&format!("SELECT pg_terminate_backend({conn}, 5000)"));
            return;
        }
        let _ = self.sql(&format!("KILL CONNECTION {conn}"));
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while self.count(&format!(
            "SELECT count(*) FROM information_schema.PROCESSLIST WHERE ID = {conn}"
        )) > 0
        {
            assert!(
                std::time::Instant::now() < deadline,
                "the killed connection {conn} still runs after 20 s"
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }

    /// Rows of lockline's entries table.
    pub fn entries(&self) -> i64 {
        self.count("SELECT count(*) FROM lockline_entries")
    }

    /// The named locks held and waited for on the server: advisory locks,
    /// or `GET_LOCK` locks.
    pub fn locks(&self) -> LockCounts {
        match self {
            Db::Pg(server) => server.advisory_locks(),
            Db::My(server) => server.user_locks(),
        }
        .expect("count locks")
    }

    /// Kills the server (SIGKILL: a crash) and starts it again on the same
    /// port and data.
    pub fn crash_and_restart(&mut self) {
        match self {
            Db::Pg(server) => {
                server.member().kill().expect("kill");
                server.restart().expect("restart");
            }
            Db::My(server) => {
                server.member().kill().expect("kill");
                server.restart().expect("restart");
            }
        }
    }

    /// A stock server's unprivileged user `user` who owns (PostgreSQL) or
    /// has every right on (MariaDB) a database of its own, `owned`: its URL.
    pub fn owned_database_url(&self, user: &str, password: &str) -> String {
        match self {
            Db::Pg(server) => {
                server.create_user(user, password).expect("create user");
                server.create_database("owned", user).expect("create database");
                server.url_for(user, password, "owned")
            }
            Db::My(server) => {
                server.create_user(user, password).expect("create user");
                server.create_database("owned").expect("create database");
                server.grant_all_on("owned", user).expect("grant");
                server.url_for(user, password, "owned")
            }
        }
    }

    /// Creates a user who may log in and use the test database's tables
    /// (and, on MariaDB, run its procedures) once they exist, but may
    /// create nothing.
    pub fn create_user(&self, user: &str, password: &str) {
        match self {
            Db::Pg(server) => server.create_user(user, password).expect("create user"),
            Db::My(server) => {
                server.create_user(user, password).expect("create user");
                server
                    .sql(&format!(
                        "GRANT SELECT, INSERT, UPDATE, DELETE, EXECUTE ON lockline.* TO '{user}'@'%'"
                    ))
                    .expect("grant");
            }
        }
    }
}

/// The `sql_probe` example: built by a plain `cargo test`, and built here
/// when a test runs alone.
pub fn probe() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary");
    let debug = exe.parent().and_then(|deps| deps.parent()).expect("target dir");
    let probe = debug.join("examples").join("sql_probe");
    if !probe.exists() {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let status = Command::new(cargo)
            .args(["build", "-p", "lockline-sql", "--example", "sql_probe"])
            .status()
            .expect("run cargo");
        assert!(status.success(), "building the sql_probe example failed");
    }
    probe
}

/// Starts the probe in `role` on lock `name` and waits for its first line.
pub fn spawn_probe(url: &str, name: &str, role: &str, ttl_ms: u64) -> (LineChild, String) {
    let mut command = Command::new(probe());
    command.args([url, name, role, &ttl_ms.to_string()]);
    let child = LineChild::spawn(command).expect("start the probe");
    let first = child
        .line(Duration::from_secs(30))
        .unwrap_or_else(|| panic!("the probe ({role}) said nothing"));
    (child, first)
}
