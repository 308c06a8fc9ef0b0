//! Real servers for lockline's tests, benchmarks and demo.
//!
//! [`EtcdCluster`] and [`ZkEnsemble`] start Debian's `etcd` and ZooKeeper (run
//! with `java -cp /usr/share/java/zookeeper.jar`) with 1 or 3 members on free
//! loopback ports and temporary data directories; [`RedisServer`] and
//! [`RedisCluster`] do the same with Debian's `redis-server`, [`PgServer`] with
//! Debian's PostgreSQL (`initdb` and `postgres` from the highest
//! `/usr/lib/postgresql/MAJOR/bin`) and [`MariaDbServer`] with Debian's
//! `mariadb-install-db` and `mariadbd`; [`PgBouncer`] puts Debian's PgBouncer
//! in front of a [`PgServer`]. A member can be stopped (SIGTERM),
//! killed (SIGKILL), paused (SIGSTOP) and resumed (SIGCONT).
//!
//! PostgreSQL and PgBouncer refuse to run as root, so when the tests run as
//! root they run as the Debian system user `postgres`, and MariaDB as `mysql`,
//! which then own their temporary directories. Each SQL server has a superuser
//! with a password over TCP and a CLI helper ([`PgServer::psql`],
//! [`MariaDbServer::sql`]) over its Unix socket. The test kit itself has no
//! SQL client: it drives the servers' own command-line tools.
//!
//! Clean-up is unconditional: dropping a cluster (also while a test panics)
//! kills its processes and deletes its directories, and every server is started
//! with `PR_SET_PDEATHSIG` from one long-lived thread, so it dies with the test
//! process even when that process is killed outright.
//!
//! Waiting for a server to come up is the one place that polls: there is no
//! event to await from another process, so readiness is probed every 50 ms up to
//! a deadline, and a server that exits early is reported with its log.

#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]

mod etcd;
mod go;
mod lines;
mod mariadb;
mod peers;
mod pgbouncer;
mod postgres;
mod process;
mod proxy;
mod redis;
mod sql;
mod tls;
mod zookeeper;

pub use etcd::EtcdCluster;
pub use go::go_build;
pub use lines::LineChild;
pub use mariadb::{MariaDbOptions, MariaDbServer};
pub use pgbouncer::{PgBouncer, PgBouncerOptions, PoolMode};
pub use postgres::{PgOptions, PgServer, Replication};
pub use process::{free_port, spawn_tied_to_this_process, Member};
pub use proxy::{TcpProxy, ZkCounts};
pub use redis::{AppendFsync, RedisCluster, RedisOptions, RedisServer};
pub use sql::LockCounts;
pub use tls::{openssl_installed, Issued, TestCa};
pub use zookeeper::{ClientAuth, ZkEnsemble, ZkJvm, ZkOptions, ZkTlsOptions};

/// Errors of the harness: what failed and why, with the server's log tail.
pub type Error = std::io::Error;

/// The harness's result type.
pub type Result<T> = std::io::Result<T>;

/// Whether Debian's `etcd` binary is installed.
pub fn etcd_installed() -> bool {
    std::path::Path::new(etcd::ETCD).exists()
}

/// Whether Debian's MariaDB server is installed: `mariadbd`,
/// `mariadb-install-db`, the `mariadb` client and the `metadata_lock_info`
/// plugin.
pub fn mariadb_installed() -> bool {
    [
        mariadb::MARIADBD,
        mariadb::MARIADB_INSTALL_DB,
        mariadb::MARIADB,
        mariadb::METADATA_LOCK_INFO,
    ]
    .iter()
    .all(|path| std::path::Path::new(path).exists())
}

/// Whether Debian's PgBouncer is installed (`/usr/sbin/pgbouncer`).
pub fn pgbouncer_installed() -> bool {
    std::path::Path::new(pgbouncer::PGBOUNCER).exists()
}

/// Whether Debian's PostgreSQL server is installed: `postgres`, `initdb`,
/// `psql` and `pg_isready` in one `/usr/lib/postgresql/MAJOR/bin`.
pub fn postgres_installed() -> bool {
    postgres::bin_dir().is_some()
}

/// Whether Debian's `redis-server` is installed.
pub fn redis_installed() -> bool {
    std::path::Path::new(redis::REDIS_SERVER).exists()
}

/// Whether Debian's ZooKeeper jar and a `java` are installed.
pub fn zookeeper_installed() -> bool {
    std::path::Path::new(zookeeper::ZOOKEEPER_JAR).exists()
}
