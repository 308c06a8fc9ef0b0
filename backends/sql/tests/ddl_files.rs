//! The DDL scripts kept in `ddl/` for DBAs run as they are in their
//! engine's own client (`psql -f ddl/postgres.sql`, `mariadb lockline <
//! ddl/mariadb.sql`), make the very objects a session makes when it creates
//! its tables on first use (tables, columns, indexes, functions and
//! procedures, compared in the server's catalog), and serve sessions that
//! may create nothing.

use std::process::{Command, Stdio};
use std::time::Duration;

use lockline::conformance::bounded;
use lockline::{Client, SessionOptions};
use lockline_sql::Sql;
use lockline_testkit::{MariaDbServer, PgServer};

#[macro_use]
mod support;

/// Where the scripts are.
fn script(file: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("ddl").join(file)
}

/// Runs `command` with `file` as its standard input (or none); panics with
/// its output unless it succeeds.
fn run(mut command: Command, file: Option<&std::path::Path>) {
    let stdin = match file {
        Some(file) => Stdio::from(std::fs::File::open(file).expect("open the script")),
        None => Stdio::null(),
    };
    let output = command.stdin(stdin).output().expect("run the client");
    assert!(
        output.status.success(),
        "{command:?}: {}{}",
        String::from_utf8_lossy(&output.stderr),
        String::from_utf8_lossy(&output.stdout)
    );
}

/// Opens a session on `sql`, takes a lock and releases it.
async fn lock_once(sql: Sql) {
    let options = SessionOptions::new().with_ttl(Duration::from_secs(10));
    let opened = bounded("open", Client::new(sql).session_with(options)).await;
    let session = opened.expect("session");
    let mutex = session.mutex("scripted").expect("mutex");
    let locked = bounded("lock", mutex.lock()).await;
    locked.expect("lock").release().await.expect("release");
    session.close().await.expect("close");
}

/// lockline's objects in schema `public` as the catalog describes them.
fn postgres_objects(server: &PgServer) -> String {
    server
        .psql(
            "SELECT c.relname || ' ' || c.relkind::text || ' ' || c.relpersistence::text FROM pg_class c \
               WHERE c.relnamespace = 'public'::regnamespace ORDER BY 1; \
             SELECT table_name || '.' || column_name || ' ' || data_type || ' ' || is_nullable || ' ' \
                    || coalesce(column_default, '-') || ' ' || is_identity \
               FROM information_schema.columns WHERE table_schema = 'public' \
               ORDER BY table_name, ordinal_position; \
             SELECT conrelid::regclass || ' ' || conname || ' ' || pg_get_constraintdef(oid) FROM pg_constraint \
               WHERE connamespace = 'public'::regnamespace ORDER BY 1; \
             SELECT indexdef FROM pg_indexes WHERE schemaname = 'public' ORDER BY indexname; \
             SELECT pg_get_functiondef(p.oid) FROM pg_proc p \
               WHERE p.pronamespace = 'public'::regnamespace ORDER BY p.proname; \
             SELECT 'layout ' || layout FROM public.lockline_meta;",
        )
        .expect("read the catalog")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_postgres_script_runs_in_psql_and_makes_what_a_session_makes() {
    let server = support::postgres();
    let mut psql = server.psql_command();
    psql.args(["-X", "-q", "-v", "ON_ERROR_STOP=1", "-h"])
        .arg(server.socket_dir())
        .args([
            "-p",
            &server.port().to_string(),
            "-U",
            "postgres",
            "-d",
            "postgres",
            "-f",
        ])
        .arg(script("postgres.sql"));
    run(psql, None);
    let scripted = postgres_objects(&server);
    assert!(scripted.contains("lockline_fence"), "{scripted}");
    // The script alone serves a session that may create nothing.
    lock_once(Sql::new(server.url()).without_creating_tables()).await;

    server
        .psql("DROP SCHEMA public CASCADE; CREATE SCHEMA public;")
        .expect("empty the schema");
    lock_once(Sql::new(server.url())).await;
    let created = postgres_objects(&server);
    assert_eq!(
        scripted, created,
        "psql -f ddl/postgres.sql and a session made different objects"
    );
}

/// lockline's objects in database `lockline` as the catalog describes them:
/// a routine's definer aside (whoever created it), and its body without its
/// comments (the `mariadb` client leaves them out of what it sends).
fn mariadb_objects(server: &MariaDbServer) -> String {
    let catalog = server
        .sql(
            "SELECT TABLE_NAME, ENGINE, TABLE_COLLATION FROM information_schema.TABLES \
               WHERE TABLE_SCHEMA = 'lockline' ORDER BY 1; \
             SELECT TABLE_NAME, COLUMN_NAME, COLUMN_TYPE, IS_NULLABLE, COLUMN_DEFAULT, EXTRA, CHARACTER_SET_NAME \
               FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = 'lockline' \
               ORDER BY TABLE_NAME, ORDINAL_POSITION; \
             SELECT TABLE_NAME, INDEX_NAME, SEQ_IN_INDEX, COLUMN_NAME, NON_UNIQUE FROM information_schema.STATISTICS \
               WHERE TABLE_SCHEMA = 'lockline' ORDER BY 1, 2, 3; \
             SELECT ROUTINE_NAME, ROUTINE_TYPE, SQL_DATA_ACCESS, SECURITY_TYPE, ROUTINE_DEFINITION \
               FROM information_schema.ROUTINES WHERE ROUTINE_SCHEMA = 'lockline' ORDER BY 1; \
             SELECT SPECIFIC_NAME, ORDINAL_POSITION, PARAMETER_MODE, PARAMETER_NAME, DTD_IDENTIFIER \
               FROM information_schema.PARAMETERS WHERE SPECIFIC_SCHEMA = 'lockline' ORDER BY 1, 2; \
             SELECT CONCAT('layout ', layout) FROM lockline.lockline_meta;",
        )
        .expect("read the catalog");
    // One row a line, a body's lines joined by `\n` (escaped).
    catalog
        .lines()
        .map(|row| {
            row.split("\\n")
                .filter(|line| !line.trim().is_empty() && !line.trim_start().starts_with("--"))
                .collect::<Vec<_>>()
                .join("\\n")
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_mariadb_script_runs_in_the_client_and_makes_what_a_session_makes() {
    let (server, url) = support::mariadb();
    // A DBA of the database, as the documentation's grants make one.
    server.create_user("dba", "dba-secret").expect("create user");
    server.grant_all_on("lockline", "dba").expect("grant");
    let mut client = server.mariadb_command();
    client
        .args(["-h", "127.0.0.1", "-P", &server.port().to_string()])
        .args(["-u", "dba", "-pdba-secret", "lockline"]);
    run(client, Some(&script("mariadb.sql")));
    let scripted = mariadb_objects(&server);
    assert!(scripted.contains("lockline_fence"), "{scripted}");
    // The script alone serves a session that may create nothing.
    lock_once(Sql::new(&url).without_creating_tables()).await;

    server
        .sql("DROP DATABASE lockline; CREATE DATABASE lockline;")
        .expect("empty the database");
    lock_once(Sql::new(&url)).await;
    let created = mariadb_objects(&server);
    assert_eq!(
        scripted, created,
        "mariadb < ddl/mariadb.sql and a session made different objects"
    );
}
