//! The servers under test: a 3-member etcd cluster or ZooKeeper ensemble,
//! its leader, and a fresh client's view of the lock's entries; or one
//! PostgreSQL server, with the faults one server can have (a crash of the
//! whole server, a crash of one backend, a pause of every process); or one
//! Redis server, with or without persistence (a kill and restart on the same
//! port, a pause).

use std::time::{Duration, Instant};

use lockline_testkit::{EtcdCluster, Member, PgOptions, PgServer, RedisOptions, RedisServer, ZkEnsemble, ZkOptions};

use crate::history::Tag;
use crate::Backend;

/// A running cluster of one backend.
#[derive(Debug)]
pub enum Servers {
    /// etcd.
    Etcd(EtcdCluster),
    /// ZooKeeper.
    ZooKeeper(ZkEnsemble),
    /// PostgreSQL.
    Postgres(Postgres),
    /// Redis: the server, and whether it persists (an append-only file
    /// fsynced on every write).
    Redis(RedisServer, bool),
}

/// The role, its password and the database the PostgreSQL contenders use: an
/// ordinary role that owns its database (lockline creates its tables there
/// and ends a silent holder's connection as the same role), no superuser.
const PG_ROLE: &str = "faults";
const PG_PASSWORD: &str = "faults-password";
const PG_DATABASE: &str = "faults";

/// The PostgreSQL contenders' fenced register: one row per write that
/// committed. A logged table: a committed write survives a crash.
pub const PG_REGISTER: &str = "faults_register";

/// A write found in the backend's own register: the writer, its token and
/// its sequence number for that grant.
pub type StoredWrite = (Tag, u64, u64);

/// A write to [`PG_REGISTER`]: the writer's tag, token and sequence number.
pub const PG_REGISTER_INSERT: &str = "INSERT INTO faults_register (tag, token, seq) VALUES ($1, $2, $3)";

/// One PostgreSQL server (fsync off: the nemesis kills processes, never the
/// machine, and `synchronous_commit` stays on), with the role, database and
/// register table of the run.
#[derive(Debug)]
pub struct Postgres {
    server: PgServer,
}

impl Postgres {
    fn start() -> std::io::Result<Self> {
        let server = PgServer::start_with(&PgOptions {
            durable: false,
            ..PgOptions::default()
        })?;
        server.create_user(PG_ROLE, PG_PASSWORD)?;
        server.create_database(PG_DATABASE, PG_ROLE)?;
        server.psql_on(
            PG_DATABASE,
            &format!(
                "CREATE TABLE {PG_REGISTER} (id bigserial PRIMARY KEY, tag text NOT NULL, \
                 token bigint NOT NULL, seq bigint NOT NULL); \
                 ALTER TABLE {PG_REGISTER} OWNER TO {PG_ROLE};"
            ),
        )?;
        Ok(Postgres { server })
    }

    /// The contenders' URL through `address` (a proxy, or the server itself).
    pub fn url(address: &str) -> String {
        format!("postgres://{PG_ROLE}:{PG_PASSWORD}@{address}/{PG_DATABASE}")
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
            "SELECT pid FROM pg_stat_activity WHERE usename = '{PG_ROLE}' \
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
            .psql_on(PG_DATABASE, &format!("SELECT tag, token, seq FROM {PG_REGISTER};"))
            .map_err(|e| format!("reading the register: {e}"))?;
        out.lines()
            .filter(|line| !line.trim().is_empty())
            .map(|line| {
                let mut fields = line.trim().split('|');
                let parsed = (|| {
                    let tag: Tag = fields.next()?.parse().ok()?;
                    Some((tag, fields.next()?.parse().ok()?, fields.next()?.parse().ok()?))
                })();
                parsed.ok_or_else(|| format!("unreadable register row {line:?}"))
            })
            .collect()
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
    /// Starts `size` members (PostgreSQL, Redis: one server, whatever `size`).
    ///
    /// # Errors
    ///
    /// When the servers cannot be started.
    pub fn start(backend: Backend, size: usize) -> std::io::Result<Self> {
        Ok(match backend {
            Backend::Etcd => Servers::Etcd(EtcdCluster::start_cluster(size)?),
            Backend::ZooKeeper => Servers::ZooKeeper(ZkEnsemble::start_with(size, &ZkOptions::default())?),
            Backend::Postgres => Servers::Postgres(Postgres::start()?),
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
            Servers::Postgres(_) | Servers::Redis(..) => 1,
        }
    }

    /// What runs, for the log: "etcd cluster of 3".
    pub fn describe(&self) -> String {
        match self {
            Servers::Etcd(cluster) => format!("etcd cluster of {}", cluster.size()),
            Servers::ZooKeeper(ensemble) => format!("ZooKeeper ensemble of {}", ensemble.size()),
            Servers::Postgres(pg) => format!("PostgreSQL server on port {}", pg.server.port()),
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
            Servers::Redis(..) => format!("redis://{}", addresses.first().map_or("", String::as_str)),
        }
    }

    /// Member `i` (PostgreSQL: the postmaster; Redis: the server).
    pub fn member(&mut self, i: usize) -> &mut Member {
        match self {
            Servers::Etcd(cluster) => cluster.member(i),
            Servers::ZooKeeper(ensemble) => ensemble.member(i),
            Servers::Postgres(pg) => pg.server.member(),
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

    /// PostgreSQL: SIGKILLs every process of the server. Redis: SIGKILLs
    /// the server.
    ///
    /// # Errors
    ///
    /// On a cluster, or when the server is not running.
    pub fn kill_server(&mut self) -> std::io::Result<()> {
        match self {
            Servers::Redis(server, _) => server.member().kill(),
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
    /// backend keeps one (PostgreSQL): (writer, token, seq).
    pub fn committed_writes(&self) -> Option<Result<Vec<StoredWrite>, String>> {
        match self {
            Servers::Postgres(pg) => Some(pg.committed_writes()),
            _ => None,
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
                Servers::Postgres(_) | Servers::Redis(..) => true,
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
    for child in children {
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
