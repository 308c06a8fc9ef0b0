//! The PostgreSQL and MariaDB servers: each starts with its options, answers
//! its CLI, serves an unprivileged user over TCP (and refuses a wrong
//! password), counts advisory or `GET_LOCK` locks held and waited for, keeps
//! its data over a kill and a restart on the same port, and two start at once
//! on different ports and directories.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use lockline_testkit::{LockCounts, MariaDbOptions, MariaDbServer, PgOptions, PgServer};

/// Waits (polling every 20 ms, at most 10 s) until `done`: for a state of
/// another process that sends no event, such as a session waiting for a lock.
fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// The user id a process runs as.
fn uid_of(pid: u32) -> u32 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("read /proc status");
    let line = status.lines().find(|l| l.starts_with("Uid:")).expect("Uid line");
    line.split_whitespace()
        .nth(1)
        .expect("real uid")
        .parse()
        .expect("a number")
}

/// The uid the servers should run as: `user`'s as root, ours otherwise.
fn expected_uid(user: &str) -> u32 {
    let me = uid_of(std::process::id());
    if me != 0 {
        return me;
    }
    let passwd = std::fs::read_to_string("/etc/passwd").expect("read /etc/passwd");
    let line = passwd
        .lines()
        .find(|l| l.starts_with(&format!("{user}:")))
        .expect("the system user exists");
    line.split(':').nth(2).expect("uid field").parse().expect("a number")
}

/// A CLI session kept open: statements are written to its standard input as
/// the test goes.
struct Session(Child);

impl Session {
    fn start(mut command: Command) -> Session {
        command
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        Session(command.spawn().expect("start a CLI session"))
    }

    fn send(&mut self, statement: &str) {
        let stdin = self.0.stdin.as_mut().expect("piped");
        writeln!(stdin, "{statement}").expect("write to the session");
        stdin.flush().expect("flush");
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

// PostgreSQL

/// `psql` over TCP as `user` with `password`.
fn pg_tcp(server: &PgServer, user: &str, password: &str, db: &str) -> Command {
    let mut command = server.psql_command();
    command
        .args(["-X", "-A", "-t", "-q", "-w", "-v", "ON_ERROR_STOP=1"])
        .args([
            "-h",
            "127.0.0.1",
            "-p",
            &server.port().to_string(),
            "-U",
            user,
            "-d",
            db,
        ])
        .env("PGPASSWORD", password)
        .env("PGCONNECT_TIMEOUT", "10");
    command
}

fn pg_tcp_query(server: &PgServer, user: &str, password: &str, db: &str, sql: &str) -> Output {
    let mut command = pg_tcp(server, user, password, db);
    command.args(["-c", sql]);
    command.output().expect("run psql")
}

#[test]
fn postgres_starts_with_its_options_and_answers_psql() {
    let options = PgOptions {
        durable: false,
        max_connections: 50,
        settings: vec![("lock_timeout".to_owned(), "7s".to_owned())],
    };
    let mut server = PgServer::start_with(&options).expect("start postgres");
    assert_eq!(server.psql("SELECT 1 + 1;").expect("psql"), "2\n");
    assert_eq!(
        server
            .psql("SHOW fsync; SHOW full_page_writes; SHOW synchronous_commit; SHOW max_connections; SHOW lock_timeout; SHOW listen_addresses;")
            .expect("psql"),
        "off\noff\non\n50\n7s\n127.0.0.1\n"
    );
    assert!(server.data_dir().join("PG_VERSION").is_file());
    assert!(server.url().starts_with("postgres://postgres:"));
    assert!(server
        .url()
        .ends_with(&format!("@127.0.0.1:{}/postgres", server.port())));
    let pid = server.member().pid().expect("running");
    assert_eq!(uid_of(pid), expected_uid("postgres"));
    // A failing statement is an error with psql's message.
    let error = server.psql("SELECT * FROM no_such_table;").expect_err("fails");
    assert!(error.to_string().contains("no_such_table"), "{error}");
}

#[test]
fn postgres_serves_an_unprivileged_user_over_tcp() {
    let server = PgServer::start().expect("start postgres");
    assert_eq!(
        server
            .psql("SHOW fsync; SHOW synchronous_commit; SHOW max_connections;")
            .expect("psql"),
        "on\non\n300\n"
    );
    // The superuser's URL password works over TCP.
    let password = server
        .url()
        .split(':')
        .nth(2)
        .expect("password")
        .split('@')
        .next()
        .expect("password")
        .to_owned();
    let out = pg_tcp_query(&server, "postgres", &password, "postgres", "SELECT current_user;");
    assert!(out.status.success(), "{}", text(&out));

    server.create_user("app", "s3cret 'quoted'").expect("create user");
    server.create_database("app db", "app").expect("create database");
    assert_eq!(
        server
            .psql("SELECT rolsuper, rolcreaterole, rolcreatedb, rolcanlogin FROM pg_roles WHERE rolname = 'app';")
            .expect("psql"),
        "f|f|f|t\n"
    );
    assert_eq!(
        server.url_for("app", "s3cret 'quoted'", "app db"),
        format!(
            "postgres://app:s3cret%20%27quoted%27@127.0.0.1:{}/app%20db",
            server.port()
        )
    );
    let out = pg_tcp_query(
        &server,
        "app",
        "s3cret 'quoted'",
        "app db",
        "CREATE TABLE t (x int); INSERT INTO t VALUES (1), (2); SELECT current_user, count(*) FROM t;",
    );
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "app|2\n");
    // Unprivileged: no new database.
    let out = pg_tcp_query(&server, "app", "s3cret 'quoted'", "app db", "CREATE DATABASE other;");
    assert!(!out.status.success());
    assert!(text(&out).contains("permission denied"), "{}", text(&out));
    // A wrong password is refused.
    let out = pg_tcp_query(&server, "app", "wrong", "app db", "SELECT 1;");
    assert!(!out.status.success());
    assert!(text(&out).contains("password authentication failed"), "{}", text(&out));
}

#[test]
fn postgres_counts_advisory_locks_and_survives_kill_and_restart() {
    let options = PgOptions {
        durable: false,
        ..PgOptions::default()
    };
    let mut server = PgServer::start_with(&options).expect("start postgres");
    let port = server.port();
    server
        .psql("CREATE TABLE kept (x int); INSERT INTO kept VALUES (42);")
        .expect("psql");
    let password = "pw";
    server.create_user("locker", password).expect("create user");

    // A holder and a waiter, over TCP as an unprivileged user.
    let mut holder = Session::start(pg_tcp(&server, "locker", password, "postgres"));
    holder.send("SELECT pg_advisory_lock(42);");
    wait_until("the holder", || {
        server.advisory_locks().expect("count") == LockCounts { held: 1, waiting: 0 }
    });
    let mut waiter = Session::start(pg_tcp(&server, "locker", password, "postgres"));
    waiter.send("SELECT pg_advisory_lock(42);");
    wait_until("the waiter", || {
        server.advisory_locks().expect("count") == LockCounts { held: 1, waiting: 1 }
    });
    // A bigint key is split into classid (high 32 bits) and objid (low 32
    // bits), with objsubid 1 (2 for the two-int4 form).
    assert_eq!(
        server
            .psql(
                "SELECT classid, objid, objsubid, mode, granted, waitstart IS NOT NULL FROM pg_locks \
                 WHERE locktype = 'advisory' ORDER BY granted DESC;"
            )
            .expect("psql"),
        "0|42|1|ExclusiveLock|t|f\n0|42|1|ExclusiveLock|f|t\n"
    );
    assert_eq!(server.backend_pids().expect("pids").len(), 2);
    // A backend busy in a query outlives its killed postmaster.
    let mut busy = Session::start(pg_tcp(&server, "locker", password, "postgres"));
    busy.send("SELECT count(*) FROM generate_series(1, 2000000000);");
    wait_until("the busy query", || {
        server
            .psql("SELECT count(*) FROM pg_stat_activity WHERE query LIKE '%generate_series%' AND state = 'active' AND pid <> pg_backend_pid();")
            .expect("psql")
            == "1\n"
    });

    // Killed with its sessions open: restart kills what is left of it.
    let old_pid = server.member().pid().expect("running");
    server.member().kill().expect("kill");
    assert!(!server.member().is_running());
    assert!(!std::path::Path::new(&format!("/proc/{old_pid}")).exists());
    drop((holder, waiter));
    let started = Instant::now();
    server.restart().expect("restart");
    assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
    drop(busy);
    assert_eq!(server.port(), port);
    assert_ne!(server.member().pid(), Some(old_pid));
    assert_eq!(server.psql("SELECT x FROM kept;").expect("psql"), "42\n");
    assert_eq!(server.advisory_locks().expect("count"), LockCounts::default());
    let out = pg_tcp_query(
        &server,
        "locker",
        password,
        "postgres",
        "SELECT pg_try_advisory_lock(42);",
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "t\n", "{}", text(&out));

    // A fast stop with a session open, and a restart.
    let _open = Session::start(pg_tcp(&server, "locker", password, "postgres"));
    wait_until("the session", || server.backend_pids().expect("pids").len() == 1);
    let started = Instant::now();
    server.stop().expect("stop");
    assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
    server.restart().expect("restart");
    assert_eq!(server.psql("SELECT x FROM kept;").expect("psql"), "42\n");
}

// MariaDB

/// `mariadb` over TCP as `user` with `password`.
fn maria_tcp(server: &MariaDbServer, user: &str, password: &str, db: &str) -> Command {
    let mut command = server.mariadb_command();
    command
        .args(["--protocol=TCP", "-h", "127.0.0.1", "-P", &server.port().to_string()])
        .args(["-u", user, &format!("-p{password}"), "-N", "-B", "--connect-timeout=10"]);
    if !db.is_empty() {
        command.arg(db);
    }
    command
}

fn maria_tcp_query(server: &MariaDbServer, user: &str, password: &str, db: &str, sql: &str) -> Output {
    let mut command = maria_tcp(server, user, password, db);
    command.args(["-e", sql]);
    command.output().expect("run mariadb")
}

#[test]
fn mariadb_starts_with_its_options_and_answers_its_cli() {
    let options = MariaDbOptions {
        innodb_flush_log_at_trx_commit: 2,
        max_connections: 50,
        settings: vec![("lock-wait-timeout".to_owned(), "7".to_owned())],
    };
    let mut server = MariaDbServer::start_with(&options).expect("start mariadb");
    assert_eq!(server.sql("SELECT 1 + 1").expect("sql"), "2\n");
    assert_eq!(
        server
            .sql(
                "SELECT @@innodb_flush_log_at_trx_commit, @@max_connections, @@lock_wait_timeout, \
                 @@character_set_server, @@skip_name_resolve, @@bind_address"
            )
            .expect("sql"),
        "2\t50\t7\tutf8mb4\t1\t127.0.0.1\n"
    );
    assert_eq!(
        server
            .sql("SELECT PLUGIN_STATUS FROM information_schema.PLUGINS WHERE PLUGIN_NAME = 'METADATA_LOCK_INFO'")
            .expect("sql"),
        "ACTIVE\n"
    );
    assert!(server.data_dir().join("ibdata1").is_file());
    assert!(server.url().starts_with("mysql://root:"));
    assert!(server.url().ends_with(&format!("@127.0.0.1:{}", server.port())));
    let pid = server.member().pid().expect("running");
    assert_eq!(uid_of(pid), expected_uid("mysql"));
    let error = server.sql("SELECT * FROM mysql.no_such_table").expect_err("fails");
    assert!(error.to_string().contains("no_such_table"), "{error}");
}

#[test]
fn mariadb_serves_an_unprivileged_user_over_tcp() {
    let server = MariaDbServer::start().expect("start mariadb");
    assert_eq!(
        server
            .sql("SELECT @@innodb_flush_log_at_trx_commit, @@max_connections")
            .expect("sql"),
        "1\t300\n"
    );
    // Root's URL password works over TCP.
    let password = server
        .url()
        .split(':')
        .nth(2)
        .expect("password")
        .split('@')
        .next()
        .expect("password")
        .to_owned();
    let out = maria_tcp_query(&server, "root", &password, "mysql", "SELECT CURRENT_USER()");
    assert!(out.status.success(), "{}", text(&out));

    server.create_user("app", "s3cret 'q' \\").expect("create user");
    server.create_database("app db").expect("create database");
    server.grant_all_on("app db", "app").expect("grant");
    let out = maria_tcp_query(
        &server,
        "app",
        "s3cret 'q' \\",
        "app db",
        "CREATE TABLE t (x int); INSERT INTO t VALUES (1), (2); SELECT CURRENT_USER(), COUNT(*) FROM t",
    );
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "app@%\t2\n");
    // Unprivileged beyond its database.
    let out = maria_tcp_query(&server, "app", "s3cret 'q' \\", "app db", "CREATE DATABASE other");
    assert!(!out.status.success());
    assert!(text(&out).contains("Access denied"), "{}", text(&out));
    // A wrong password is refused.
    let out = maria_tcp_query(&server, "app", "wrong", "app db", "SELECT 1");
    assert!(!out.status.success());
    assert!(text(&out).contains("ERROR 1045"), "{}", text(&out));
}

#[test]
fn mariadb_counts_user_locks_and_survives_kill_and_restart() {
    let mut server = MariaDbServer::start().expect("start mariadb");
    let port = server.port();
    server
        .sql("CREATE DATABASE kept; CREATE TABLE kept.t (x int); INSERT INTO kept.t VALUES (42)")
        .expect("sql");
    let password = "pw";
    server.create_user("locker", password).expect("create user");

    let mut holder = Session::start(maria_tcp(&server, "locker", password, ""));
    holder.send("SELECT GET_LOCK('lockline/a', 0), GET_LOCK('lockline/a', 0);");
    wait_until("the holder", || {
        server.user_locks().expect("count") == LockCounts { held: 1, waiting: 0 }
    });
    let mut waiter = Session::start(maria_tcp(&server, "locker", password, ""));
    waiter.send("SELECT GET_LOCK('lockline/a', 60);");
    wait_until("the waiter", || {
        server.user_locks().expect("count") == LockCounts { held: 1, waiting: 1 }
    });
    // The holder's row names the lock in TABLE_SCHEMA; the waiter has none.
    let ids = server.connection_ids().expect("ids");
    assert_eq!(ids.len(), 2);
    assert_eq!(
        server
            .sql(
                "SELECT THREAD_ID, LOCK_MODE, LOCK_TYPE, TABLE_SCHEMA, TABLE_NAME \
                 FROM information_schema.METADATA_LOCK_INFO"
            )
            .expect("sql"),
        format!("{}\tMDL_SHARED_NO_WRITE\tUser lock\tlockline/a\t\n", ids[0])
    );
    assert_eq!(
        server
            .sql("SELECT ID FROM information_schema.PROCESSLIST WHERE STATE = 'User lock'")
            .expect("sql"),
        format!("{}\n", ids[1])
    );

    let old_pid = server.member().pid().expect("running");
    server.member().kill().expect("kill");
    assert!(!server.member().is_running());
    assert!(!std::path::Path::new(&format!("/proc/{old_pid}")).exists());
    drop((holder, waiter));
    server.restart().expect("restart");
    assert_eq!(server.port(), port);
    assert_eq!(server.sql("SELECT x FROM kept.t").expect("sql"), "42\n");
    assert_eq!(server.user_locks().expect("count"), LockCounts::default());
    let out = maria_tcp_query(&server, "locker", password, "", "SELECT GET_LOCK('lockline/a', 0)");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "1\n", "{}", text(&out));

    // A clean stop (SIGTERM) and a restart.
    server.member().stop().expect("stop");
    server.restart().expect("restart");
    assert_eq!(server.sql("SELECT x FROM kept.t").expect("sql"), "42\n");
}

// Both

#[test]
fn servers_started_at_once_get_their_own_ports_and_directories() {
    let pg = std::thread::spawn(|| PgServer::start().expect("start postgres"));
    let maria = std::thread::spawn(|| MariaDbServer::start().expect("start mariadb"));
    let pg_other = PgServer::start().expect("start postgres");
    let maria_other = MariaDbServer::start().expect("start mariadb");
    let mut pg = pg.join().expect("postgres thread");
    let mut maria = maria.join().expect("mariadb thread");

    let ports = [pg.port(), pg_other.port(), maria.port(), maria_other.port()];
    for (i, port) in ports.iter().enumerate() {
        assert!(!ports[i + 1..].contains(port), "port {port} given twice: {ports:?}");
    }
    assert_ne!(pg.data_dir(), pg_other.data_dir());
    assert_ne!(maria.data_dir(), maria_other.data_dir());
    for server in [&pg, &pg_other] {
        assert_eq!(server.psql("SELECT 1;").expect("psql"), "1\n");
    }
    for server in [&maria, &maria_other] {
        assert_eq!(server.sql("SELECT 1").expect("sql"), "1\n");
    }

    // Dropping a server kills it and deletes its directory.
    let dirs: Vec<PathBuf> = vec![pg.data_dir().to_owned(), maria.data_dir().to_owned()];
    let pids = [
        pg.member().pid().expect("running"),
        maria.member().pid().expect("running"),
    ];
    drop((pg, maria));
    for dir in &dirs {
        assert!(!dir.exists(), "{} left behind", dir.display());
    }
    for pid in pids {
        assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists());
    }
}
