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

mod sql;

pub use sql::{MariaDb, Postgres, StoredWrite, MY_REGISTER_INSERT, PG_REGISTER_INSERT, SQL_REGISTER};

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
