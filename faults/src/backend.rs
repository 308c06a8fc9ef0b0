//! Which server a run tests, and what each one's faults may cost: how long
//! it takes to elect a leader, which faults free a lock, forget sessions or
//! data, and which a session must ride out.

use std::fmt;
use std::time::Duration;

use crate::nemesis::FaultKind;

/// Which server a run tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// etcd (`lockline-etcd`).
    Etcd,
    /// ZooKeeper (`lockline-zookeeper`).
    ZooKeeper,
    /// PostgreSQL (`lockline-sql`).
    Postgres,
    /// MariaDB (`lockline-sql`).
    MariaDb,
    /// One Redis server with an append-only file fsynced on every write
    /// (`appendonly yes`, `appendfsync always`: nothing acknowledged is lost
    /// in a restart), `lockline-redis`.
    Redis,
    /// One Redis server without persistence (no append-only file, no
    /// snapshots): a restart forgets every key. The checker then allows what
    /// docs/redis.md says Redis cannot promise after such a restart, and
    /// nothing more (see [`Backend::forgets`]).
    RedisVolatile,
}

impl Backend {
    /// Every backend the test runs on.
    pub const ALL: [Backend; 6] = [
        Backend::Etcd,
        Backend::ZooKeeper,
        Backend::Postgres,
        Backend::MariaDb,
        Backend::Redis,
        Backend::RedisVolatile,
    ];

    /// Whether it is one of the Redis modes.
    pub fn is_redis(self) -> bool {
        matches!(self, Backend::Redis | Backend::RedisVolatile)
    }

    /// Whether it is one of the SQL databases (PostgreSQL, MariaDB): a
    /// session lives on several connections, the connection holds the lock,
    /// and the register is a table written in fenced transactions.
    pub fn is_sql(self) -> bool {
        matches!(self, Backend::Postgres | Backend::MariaDb)
    }

    /// Whether it runs one server (PostgreSQL, MariaDB, Redis), not a
    /// cluster: the nemesis then kills, restarts and pauses that server.
    pub fn is_single_server(self) -> bool {
        self.is_sql() || self.is_redis()
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Backend::Etcd => "etcd",
            Backend::ZooKeeper => "zookeeper",
            Backend::Postgres => "postgres",
            Backend::MariaDb => "mariadb",
            Backend::Redis => "redis",
            Backend::RedisVolatile => "redis-volatile",
        })
    }
}

impl std::str::FromStr for Backend {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "etcd" => Ok(Backend::Etcd),
            "zookeeper" | "zk" => Ok(Backend::ZooKeeper),
            "postgres" | "postgresql" | "pg" => Ok(Backend::Postgres),
            "mariadb" | "mysql" => Ok(Backend::MariaDb),
            "redis" => Ok(Backend::Redis),
            "redis-volatile" => Ok(Backend::RedisVolatile),
            other => Err(format!(
                "unknown backend {other:?} (etcd, zookeeper, postgres, mariadb, redis or redis-volatile)"
            )),
        }
    }
}

impl Backend {
    /// How long the servers may take to elect a leader after losing one.
    pub fn election_time(self) -> Duration {
        match self {
            // --election-timeout 500 ms in the testkit.
            Backend::Etcd => Duration::from_secs(1),
            // tickTime 200 ms; followers resync after the election.
            Backend::ZooKeeper => Duration::from_secs(2),
            // No election: one server, whose outages are counted from their
            // end. A second for the sessions to connect again.
            Backend::Postgres | Backend::MariaDb | Backend::Redis | Backend::RedisVolatile => Duration::from_secs(1),
        }
    }

    /// How long a holder whose connections were reset (a cut, a crash of the
    /// server) may go on holding after the reset. Zero on etcd and ZooKeeper:
    /// a session outlives its connections, a reset frees nothing. On
    /// PostgreSQL the connection holds the lock: the server frees it the
    /// moment the connection resets and may grant it at once (as it must for
    /// a killed holder), while lockline-sql learns of it only from a later
    /// request (a renewal, within a keepalive interval when it can reach the
    /// server) and at the latest when its loss deadline passes (TTL − safety
    /// margin from the last confirmed renewal, which came before the reset):
    /// that deadline, plus a second for a loaded machine. Writes are not
    /// excused: the backend's fence must refuse every one made after the next
    /// grant.
    ///
    /// On Redis without persistence a restart frees every lock the moment
    /// the server is back, and a holder learns of it at its session's next
    /// renewal (docs/redis.md, "Loss": within a keepalive interval, sooner
    /// when renewals were failing, since a failed one is retried at once):
    /// a keepalive interval plus a second for a loaded machine, counted from
    /// the server's return (see [`Backend::forgets_at_end`]). With an
    /// append-only file a restart frees nothing: zero.
    pub fn reset_notice(self, ttl: Duration) -> Duration {
        let options = lockline::SessionOptions::new().with_ttl(ttl);
        match self {
            Backend::Etcd | Backend::ZooKeeper | Backend::Redis => Duration::ZERO,
            Backend::Postgres | Backend::MariaDb => options.loss_deadline() + Duration::from_secs(1),
            Backend::RedisVolatile => options.keepalive_interval() + Duration::from_secs(1),
        }
    }

    /// The faults after which the server may grant a lock whose holder
    /// still believes it holds, for at most [`reset_notice`](Self::reset_notice):
    /// on PostgreSQL and MariaDB a reset of a holder's connections (the
    /// connection holds the lock; docs/sql.md's one window, with the reset
    /// grace off as by default). Not a crash of the server, of a backend, or
    /// a failover: the restart grace (on by default) grants nothing until
    /// every holder from before could have heard `lost()`, and the checker
    /// holds the SQL backend to that. On Redis without persistence a restart
    /// of the server (it forgets every session and entry: docs/redis.md,
    /// "What Redis cannot promise"); none elsewhere.
    pub fn forgets(self) -> &'static [FaultKind] {
        match self {
            Backend::Postgres | Backend::MariaDb => &[FaultKind::CutHolder],
            Backend::RedisVolatile => &[FaultKind::KillServer],
            Backend::Etcd | Backend::ZooKeeper | Backend::Redis => &[],
        }
    }

    /// The faults after which the server has forgotten every session, so
    /// that every session open at the fault must be given up as lost: a
    /// restart of Redis without persistence (docs/redis.md: "lockline then
    /// declares every session lost"); on the SQL databases a crash of the
    /// server (and on PostgreSQL of one backend, which restarts them all)
    /// and a failover (docs/sql.md: the connections, which hold the guards,
    /// are gone). None elsewhere.
    pub fn forgets_sessions(self) -> &'static [FaultKind] {
        match self {
            Backend::RedisVolatile => &[FaultKind::KillServer],
            Backend::Postgres => &[FaultKind::KillServer, FaultKind::CrashBackend, FaultKind::Failover],
            Backend::MariaDb => &[FaultKind::KillServer, FaultKind::Failover],
            Backend::Etcd | Backend::ZooKeeper | Backend::Redis => &[],
        }
    }

    /// The faults after which the store has forgotten its data, the keys
    /// fenced writes put included: a restart of Redis without persistence.
    /// None elsewhere (the SQL databases keep `write_if_held`'s keys in a
    /// logged table).
    pub fn forgets_data(self) -> &'static [FaultKind] {
        match self {
            Backend::RedisVolatile => &[FaultKind::KillServer],
            _ => &[],
        }
    }

    /// Whether the server frees the locks when such a fault ends (a Redis
    /// server back without its data) rather than when it begins (a
    /// PostgreSQL connection reset).
    pub fn forgets_at_end(self) -> bool {
        self == Backend::RedisVolatile
    }

    /// The faults a session must ride out, without being lost, when they
    /// last no longer than [`Config::ride_out`](crate::Config::ride_out): on Redis a restart with the
    /// data (a session survives what its server survives), a
    /// pause of the server and a reset of a holder's connections; without
    /// persistence the pause and the reset (a restart forgets the session).
    /// None elsewhere.
    pub fn rides_out(self) -> &'static [FaultKind] {
        match self {
            Backend::Redis => &[FaultKind::KillServer, FaultKind::PauseServer, FaultKind::CutHolder],
            Backend::RedisVolatile => &[FaultKind::PauseServer, FaultKind::CutHolder],
            Backend::Etcd | Backend::ZooKeeper | Backend::Postgres | Backend::MariaDb => &[],
        }
    }
}
