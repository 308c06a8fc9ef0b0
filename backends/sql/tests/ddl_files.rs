//! The DDL scripts kept in `ddl/` for DBAs are the ones the backend makes:
//! `Sql::ddl()` for the default table prefix, in schema `public`
//! (PostgreSQL) and database `lockline` (MariaDB/MySQL). Run with
//! `LOCKLINE_WRITE_DDL=1` to write them again after a layout change.

use lockline_sql::Sql;

fn check(file: &str, url: &str) {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("ddl").join(file);
    let made = Sql::new(url).ddl().expect("ddl");
    if std::env::var_os("LOCKLINE_WRITE_DDL").is_some() {
        std::fs::write(&path, &made).expect("write the script");
    }
    let kept = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        kept == made,
        "{} differs from Sql::ddl(): run `LOCKLINE_WRITE_DDL=1 cargo test -p lockline-sql --test ddl_files`",
        path.display()
    );
}

#[test]
fn the_postgres_script_is_current() {
    check("postgres.sql", "postgres://localhost/app");
}

#[test]
fn the_mariadb_script_is_current() {
    check("mariadb.sql", "mysql://localhost/lockline");
}
