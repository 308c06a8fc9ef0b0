use std::fmt;
use std::io::{BufRead, BufReader, Error, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use tempfile::TempDir;

use crate::process::{free_port, Member};
use crate::Result;

pub(crate) const REDIS_SERVER: &str = "/usr/bin/redis-server";
const REDIS_CLI: &str = "/usr/bin/redis-cli";

/// How long a Redis server may take to answer its first `PING`.
const START_TIMEOUT: Duration = Duration::from_secs(20);

/// When a server with an append-only file fsyncs it (`appendfsync`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum AppendFsync {
    /// After every write, before it is acknowledged (`always`).
    #[default]
    Always,
    /// Once a second, in the background (`everysec`, Redis's default once
    /// AOF is on): a machine that loses what was not fsynced (a power
    /// loss, a kernel crash) loses up to about the last second of
    /// acknowledged writes.
    EverySec,
    /// When the operating system decides (`no`).
    No,
}

impl AppendFsync {
    fn as_arg(self) -> &'static str {
        match self {
            AppendFsync::Always => "always",
            AppendFsync::EverySec => "everysec",
            AppendFsync::No => "no",
        }
    }
}

/// How a [`RedisServer`] is started.
#[derive(Debug, Clone, Default)]
pub struct RedisOptions {
    /// Persist with an append-only file (`appendonly yes`, fsynced as
    /// [`append_fsync`](Self::append_fsync) says), so that a restart keeps
    /// the data.
    pub append_only: bool,
    /// When the append-only file is fsynced, if there is one.
    pub append_fsync: AppendFsync,
    /// `notify-keyspace-events`, e.g. `Kgx` (keyspace events for DEL and
    /// expiry); empty for none, the server's default.
    pub keyspace_events: String,
    /// A password (`requirepass`).
    pub password: Option<String>,
    /// Start as a replica of the server on this port (`replicaof`).
    pub replica_of: Option<u16>,
    /// Start as a cluster node (`cluster-enabled yes`).
    pub cluster: bool,
}

/// One Redis server (Debian's `redis-server`) on a free loopback port with a
/// temporary data directory.
pub struct RedisServer {
    member: Member,
    port: u16,
    password: Option<String>,
    dir: TempDir,
}

impl fmt::Debug for RedisServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisServer")
            .field("port", &self.port)
            .field("member", &self.member)
            .finish_non_exhaustive()
    }
}

impl RedisServer {
    /// A throwaway server: no persistence, no keyspace events.
    ///
    /// # Errors
    ///
    /// When `redis-server` is missing or does not answer in time.
    pub fn start() -> Result<Self> {
        Self::start_with(&RedisOptions::default())
    }

    /// A server started with `options`.
    ///
    /// # Errors
    ///
    /// When `redis-server` is missing or does not answer in time.
    pub fn start_with(options: &RedisOptions) -> Result<Self> {
        let dir = tempfile::Builder::new().prefix("lockline-redis-").tempdir()?;
        let port = free_port()?;
        let mut args = vec![
            "--port".to_owned(),
            port.to_string(),
            "--bind".to_owned(),
            "127.0.0.1".to_owned(),
            "--dir".to_owned(),
            dir.path().display().to_string(),
            "--save".to_owned(),
            String::new(),
            "--daemonize".to_owned(),
            "no".to_owned(),
            "--protected-mode".to_owned(),
            "no".to_owned(),
        ];
        if options.append_only {
            args.extend(["--appendonly", "yes", "--appendfsync", options.append_fsync.as_arg()].map(str::to_owned));
        } else {
            args.extend(["--appendonly", "no"].map(str::to_owned));
        }
        if !options.keyspace_events.is_empty() {
            args.extend(["--notify-keyspace-events".to_owned(), options.keyspace_events.clone()]);
        }
        if let Some(password) = &options.password {
            args.extend(["--requirepass".to_owned(), password.clone()]);
            args.extend(["--masterauth".to_owned(), password.clone()]);
        }
        if let Some(primary) = options.replica_of {
            args.extend(["--replicaof".to_owned(), "127.0.0.1".to_owned(), primary.to_string()]);
        }
        if options.cluster {
            // The cluster bus port, free too (by default PORT + 10000, which
            // may be taken).
            args.extend(["--cluster-port".to_owned(), free_port()?.to_string()]);
            args.extend(
                [
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    "2000",
                ]
                .map(str::to_owned),
            );
        }
        let log = dir.path().join("redis.log");
        let member = Member::start(&format!("redis-{port}"), REDIS_SERVER, &args, log, dir.path())?;
        let mut server = RedisServer {
            member,
            port,
            password: options.password.clone(),
            dir,
        };
        server.wait_ready()?;
        Ok(server)
    }

    fn wait_ready(&mut self) -> Result<()> {
        let (port, password) = (self.port, self.password.clone());
        self.member
            .wait_ready(START_TIMEOUT, || ping(port, password.as_deref()).is_ok())
    }

    /// The server's URL, `redis://127.0.0.1:PORT` (with the password when set).
    pub fn url(&self) -> String {
        match &self.password {
            Some(password) => format!("redis://:{password}@127.0.0.1:{}", self.port),
            None => format!("redis://127.0.0.1:{}", self.port),
        }
    }

    /// The server's port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server's process, to kill, pause or restart it.
    pub fn member(&mut self) -> &mut Member {
        &mut self.member
    }

    /// The data directory.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Starts the server again after a stop or kill, with the same port and
    /// data directory, and waits until it answers.
    ///
    /// # Errors
    ///
    /// When it is still running or does not answer in time.
    pub fn restart(&mut self) -> Result<()> {
        self.member.restart()?;
        self.wait_ready()
    }

    /// The append-only file that takes the server's writes now: the last
    /// incremental file its manifest lists (Redis 7's multi-part AOF,
    /// `appendonlydir/`). Cutting its end while the server is down loses the
    /// last writes as a machine that lost what was not fsynced would.
    ///
    /// # Errors
    ///
    /// When the server has no append-only file.
    pub fn append_only_tail(&self) -> Result<std::path::PathBuf> {
        let dir = self.dir.path().join("appendonlydir");
        let manifest = std::fs::read_dir(&dir)?
            .filter_map(std::result::Result::ok)
            .map(|entry| entry.path())
            .find(|path| path.extension().is_some_and(|e| e == "manifest"))
            .ok_or_else(|| Error::other(format!("no AOF manifest in {}", dir.display())))?;
        let listed = std::fs::read_to_string(&manifest)?;
        let last = listed
            .lines()
            .rev()
            .filter(|line| line.split_whitespace().collect::<Vec<_>>().ends_with(&["type", "i"]))
            .find_map(|line| line.split_whitespace().nth(1))
            .ok_or_else(|| Error::other(format!("no incremental AOF listed in {}", manifest.display())))?;
        Ok(dir.join(last))
    }

    /// The `run_id` of the server process now (`INFO server`): another one
    /// after each restart.
    ///
    /// # Errors
    ///
    /// When `redis-cli` fails or the server gives none.
    pub fn run_id(&self) -> Result<String> {
        let info = self.cli(&["INFO", "server"])?;
        info.lines()
            .find_map(|line| line.strip_prefix("run_id:"))
            .map(|id| id.trim().to_owned())
            .ok_or_else(|| Error::other("INFO server gave no run_id"))
    }

    /// Runs `redis-cli` against this server with `args` and returns its
    /// standard output (raw, one reply a line).
    ///
    /// # Errors
    ///
    /// When `redis-cli` fails.
    pub fn cli(&self, args: &[&str]) -> Result<String> {
        cli(self.port, self.password.as_deref(), args)
    }
}

/// Runs `redis-cli -p PORT ARGS...`; its standard output.
fn cli(port: u16, password: Option<&str>, args: &[&str]) -> Result<String> {
    let mut command = Command::new(REDIS_CLI);
    command.args(["-h", "127.0.0.1", "-p", &port.to_string()]);
    if let Some(password) = password {
        command.env("REDISCLI_AUTH", password);
    }
    let out = command.args(args).output()?;
    if !out.status.success() {
        return Err(Error::other(format!(
            "redis-cli {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Sends `PING` (after `AUTH` when a password is set) and expects `+PONG`.
fn ping(port: u16, password: Option<&str>) -> Result<()> {
    let stream = TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), Duration::from_millis(500))?;
    stream.set_read_timeout(Some(Duration::from_millis(500)))?;
    let mut writer = stream.try_clone()?;
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    if let Some(password) = password {
        write!(writer, "AUTH {password}\r\n")?;
        reader.read_line(&mut line)?;
        line.clear();
    }
    writer.write_all(b"PING\r\n")?;
    reader.read_line(&mut line)?;
    if line.starts_with("+PONG") {
        Ok(())
    } else {
        Err(Error::other(format!("not ready: {}", line.trim())))
    }
}

/// A Redis Cluster of masters (no replicas) on free loopback ports, made with
/// `redis-cli --cluster create`.
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// Starts `masters` cluster nodes and joins them into one cluster, every
    /// slot covered.
    ///
    /// # Errors
    ///
    /// When a node does not start or the cluster does not form in time.
    pub fn start(masters: usize) -> Result<Self> {
        let options = RedisOptions {
            cluster: true,
            ..RedisOptions::default()
        };
        let nodes = (0..masters)
            .map(|_| RedisServer::start_with(&options))
            .collect::<Result<Vec<_>>>()?;
        let addresses: Vec<String> = nodes.iter().map(|n| format!("127.0.0.1:{}", n.port())).collect();
        let mut args = vec!["--cluster", "create"];
        args.extend(addresses.iter().map(String::as_str));
        args.extend(["--cluster-replicas", "0", "--cluster-yes"]);
        cli(nodes[0].port(), None, &args)?;
        let cluster = RedisCluster { nodes };
        let deadline = std::time::Instant::now() + START_TIMEOUT;
        // Every node must see the whole cluster before clients connect.
        while !cluster.nodes.iter().all(|n| {
            n.cli(&["cluster", "info"])
                .is_ok_and(|info| info.contains("cluster_state:ok"))
        }) {
            if std::time::Instant::now() > deadline {
                return Err(Error::other("the Redis cluster did not reach cluster_state:ok"));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(cluster)
    }

    /// The nodes' URLs.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// Node `i`.
    pub fn node(&mut self, i: usize) -> &mut RedisServer {
        &mut self.nodes[i]
    }

    /// How many nodes there are.
    pub fn size(&self) -> usize {
        self.nodes.len()
    }
}
