use std::fmt;
use std::fs;
use std::io::Error;
use std::process::Command;
use std::time::Duration;

use tempfile::TempDir;

use crate::process::{exchange, free_port, Member};
use crate::tls::Issued;
use crate::Result;

pub(crate) const ZOOKEEPER_JAR: &str = "/usr/share/java/zookeeper.jar";
const JAVA: &str = "java";
const START_TIMEOUT: Duration = Duration::from_secs(60);
/// What the TLS (Netty) connection factory needs besides the jars that
/// `zookeeper.jar`'s manifest names.
const NETTY_EXTRA_JARS: [&str; 3] = [
    "/usr/share/java/netty-codec.jar",
    "/usr/share/java/netty-resolver.jar",
    "/usr/share/java/netty-transport-native-unix-common.jar",
];

/// How a [`ZkEnsemble`] is configured.
#[derive(Debug, Clone)]
pub struct ZkOptions {
    /// ZooKeeper's `tickTime` (default 200 ms; elections and syncs count ticks).
    pub tick_time: Duration,
    /// `minSessionTimeout` (default 1 s) and `maxSessionTimeout` (default 60 s).
    pub session_timeout_range: (Duration, Duration),
    /// How often the server deletes empty container nodes
    /// (`znode.container.checkIntervalMs`; default 500 ms, the server's own is 60 s).
    pub container_check_interval: Duration,
    /// A TLS `secureClientPort` beside the plain `clientPort` (which stays, for
    /// the harness's readiness probes and for tests' setup clients). `None`
    /// (the default): plain text only.
    pub tls: Option<ZkTlsOptions>,
    /// Users (name, password) the server accepts for SASL DIGEST-MD5, from a
    /// JAAS file the harness writes. Empty (the default): SASL is not enabled.
    pub sasl_users: Vec<(String, String)>,
    /// The JVM flags the servers run with (default: [`ZkJvm::FastStart`]).
    pub jvm: ZkJvm,
}

/// Which JVM settings a ZooKeeper server is started with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ZkJvm {
    /// For tests, which start many short-lived servers: a 256 MiB heap, the
    /// serial collector and the C1 compiler only (`-XX:TieredStopAtLevel=1`),
    /// which start fast and never spend a core on C2 compilation, at the cost
    /// of slower steady-state code.
    #[default]
    FastStart,
    /// What ZooKeeper's own `bin/zkServer.sh` starts a server with: the JVM's
    /// defaults (full tiered compilation up to C2, G1 on a machine of two or
    /// more cores), `zkEnv.sh`'s 1000 MiB heap (`-Xmx1000m`, here also as the
    /// initial size, so that heap growth is no part of a measurement), the
    /// out-of-memory handling `zkServer.sh` adds, and JMX enabled as
    /// `zkServer.sh` enables it by default. For benchmarks; warm the server
    /// up before measuring, as C2 compiles the hot paths only after many
    /// thousand calls.
    Production,
}

impl ZkJvm {
    /// The flags given to `java` before the class path.
    pub fn flags(self) -> &'static [&'static str] {
        match self {
            ZkJvm::FastStart => &["-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1"],
            ZkJvm::Production => &[
                "-Xms1000m",
                "-Xmx1000m",
                "-XX:+HeapDumpOnOutOfMemoryError",
                "-XX:OnOutOfMemoryError=kill -9 %p",
                "-Dcom.sun.management.jmxremote",
                "-Dcom.sun.management.jmxremote.local.only=false",
            ],
        }
    }
}

/// Whether a TLS server asks connecting clients for a certificate
/// (ZooKeeper's `ssl.clientAuth`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ClientAuth {
    /// A client without a certificate is refused (`need`).
    #[default]
    Need,
    /// A certificate is asked for but not required (`want`).
    Want,
    /// No certificate is asked for (`none`).
    None,
}

/// The server side of a TLS `secureClientPort`.
#[derive(Debug, Clone)]
pub struct ZkTlsOptions {
    /// The server's certificate and key (from [`TestCa::server`](crate::TestCa::server)).
    pub server: Issued,
    /// The CA certificate (PEM file) client certificates must chain to.
    pub client_ca: std::path::PathBuf,
    /// Whether a client certificate is required.
    pub client_auth: ClientAuth,
}

impl Default for ZkOptions {
    fn default() -> Self {
        ZkOptions {
            tick_time: Duration::from_millis(200),
            session_timeout_range: (Duration::from_secs(1), Duration::from_secs(60)),
            container_check_interval: Duration::from_millis(500),
            tls: None,
            sasl_users: Vec::new(),
            jvm: ZkJvm::FastStart,
        }
    }
}

/// A ZooKeeper ensemble of 1 (standalone) or 3 members on free loopback ports,
/// in a temporary directory; stopped and deleted on drop.
pub struct ZkEnsemble {
    members: Vec<Member>,
    client_ports: Vec<u16>,
    /// The members' `secureClientPort`s, when TLS is on.
    secure_ports: Vec<u16>,
    dir: TempDir,
}

impl fmt::Debug for ZkEnsemble {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZkEnsemble")
            .field("connect_string", &self.connect_string())
            .field("dir", &self.dir.path())
            .finish()
    }
}

impl ZkEnsemble {
    /// Starts a standalone server with the default options.
    ///
    /// # Errors
    ///
    /// When Java or ZooKeeper is missing, or the server does not serve within
    /// 60 s (the error carries its log).
    pub fn start() -> Result<Self> {
        Self::start_with(1, &ZkOptions::default())
    }

    /// Starts an ensemble of `size` members and waits until each serves (as
    /// standalone, leader or follower). A start that loses a port race is
    /// retried with new ports.
    ///
    /// # Errors
    ///
    /// As [`start`](Self::start).
    pub fn start_with(size: usize, options: &ZkOptions) -> Result<Self> {
        let mut last = None;
        for _ in 0..3 {
            match Self::try_start(size, options) {
                Ok(ensemble) => return Ok(ensemble),
                Err(error) => last = Some(error),
            }
        }
        Err(last.unwrap_or_else(|| Error::other("ZooKeeper did not start")))
    }

    fn try_start(size: usize, options: &ZkOptions) -> Result<Self> {
        if size == 0 {
            return Err(Error::other("an ensemble needs at least one member"));
        }
        let dir = tempfile::Builder::new().prefix("lockline-zk-").tempdir()?;
        let mut ports = Vec::new();
        for _ in 0..size {
            ports.push((free_port()?, free_port()?, free_port()?));
        }
        let mut secure_ports = Vec::new();
        if options.tls.is_some() {
            for _ in 0..size {
                secure_ports.push(free_port()?);
            }
        }
        let mut server_flags = Vec::new();
        let mut classpath = ZOOKEEPER_JAR.to_owned();
        if !options.sasl_users.is_empty() {
            let jaas = dir.path().join("jaas.conf");
            let users: String = options
                .sasl_users
                .iter()
                .map(|(user, password)| format!("\n    user_{user}={}", jaas_quote(password)))
                .collect();
            fs::write(
                &jaas,
                format!("Server {{\n    org.apache.zookeeper.server.auth.DigestLoginModule required{users};\n}};\n"),
            )?;
            server_flags.push(format!("-Djava.security.auth.login.config={}", jaas.display()));
            server_flags.push(
                "-Dzookeeper.authProvider.sasl=org.apache.zookeeper.server.auth.SASLAuthenticationProvider".to_owned(),
            );
        }
        if options.tls.is_some() {
            for jar in NETTY_EXTRA_JARS {
                classpath.push(':');
                classpath.push_str(jar);
            }
        }
        let mut members = Vec::new();
        for (i, (client, _, _)) in ports.iter().enumerate() {
            let name = format!("n{}", i + 1);
            let data = dir.path().join(&name);
            fs::create_dir_all(&data)?;
            let mut config = format!(
                "tickTime={}\ninitLimit=20\nsyncLimit=10\ndataDir={}\nclientPort={client}\nclientPortAddress=127.0.0.1\n\
                 minSessionTimeout={}\nmaxSessionTimeout={}\nadmin.enableServer=false\n4lw.commands.whitelist=*\n\
                 maxClientCnxns=0\n",
                options.tick_time.as_millis(),
                data.display(),
                options.session_timeout_range.0.as_millis(),
                options.session_timeout_range.1.as_millis(),
            );
            if let Some(tls) = &options.tls {
                config.push_str(&tls_config(tls, secure_ports[i], dir.path(), &name)?);
            }
            if size > 1 {
                fs::write(data.join("myid"), format!("{}\n", i + 1))?;
                for (j, (_, peer, election)) in ports.iter().enumerate() {
                    config.push_str(&format!("server.{}=127.0.0.1:{peer}:{election}\n", j + 1));
                }
            }
            let config_path = dir.path().join(format!("{name}.cfg"));
            fs::write(&config_path, config)?;
            let mut args: Vec<String> = server_flags.clone();
            args.extend(options.jvm.flags().iter().map(|&flag| flag.to_owned()));
            args.extend([
                "-Dzookeeper.4lw.commands.whitelist=*".into(),
                "-Dzookeeper.admin.enableServer=false".into(),
                format!(
                    "-Dznode.container.checkIntervalMs={}",
                    options.container_check_interval.as_millis()
                ),
                "-cp".into(),
                classpath.clone(),
                "org.apache.zookeeper.server.quorum.QuorumPeerMain".into(),
                config_path.display().to_string(),
            ]);
            let log = dir.path().join(format!("{name}.log"));
            members.push(Member::start(&name, JAVA, &args, log, dir.path())?);
        }
        let client_ports = ports.iter().map(|(client, _, _)| *client).collect();
        let mut ensemble = ZkEnsemble {
            members,
            client_ports,
            secure_ports,
            dir,
        };
        for i in 0..size {
            ensemble.wait_serving(i)?;
        }
        Ok(ensemble)
    }

    /// Waits until member `i` serves clients (its `srvr` reports a mode).
    ///
    /// # Errors
    ///
    /// When it does not within 60 s, or exits.
    pub fn wait_serving(&mut self, i: usize) -> Result<()> {
        let port = self.client_ports[i];
        // The TLS port is opened after the plain one serves: wait for both.
        let secure = self.secure_ports.get(i).copied();
        self.members[i].wait_ready(START_TIMEOUT, || {
            mode(port).is_some()
                && secure.is_none_or(|secure| {
                    std::net::TcpStream::connect_timeout(&([127, 0, 0, 1], secure).into(), Duration::from_secs(1))
                        .is_ok()
                })
        })
    }

    /// Waits until a running member reports itself leader (or standalone), and
    /// returns its index: after a leader is killed, until the rest elect one.
    ///
    /// # Errors
    ///
    /// When no leader is elected within 60 s.
    pub fn wait_leader(&mut self) -> Result<usize> {
        let deadline = std::time::Instant::now() + START_TIMEOUT;
        loop {
            for i in 0..self.members.len() {
                if self.members[i].is_running()
                    && matches!(self.mode(i).as_deref(), Some("leader") | Some("standalone"))
                {
                    return Ok(i);
                }
            }
            if std::time::Instant::now() > deadline {
                return Err(Error::new(
                    std::io::ErrorKind::TimedOut,
                    "no ZooKeeper leader elected within 60 s",
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The connect string of every member, `127.0.0.1:P1,127.0.0.1:P2,...`.
    pub fn connect_string(&self) -> String {
        self.client_ports
            .iter()
            .map(|port| format!("127.0.0.1:{port}"))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The connect string of every member's TLS `secureClientPort`
    /// (`127.0.0.1:P1,...`), or `None` when TLS is off.
    pub fn secure_connect_string(&self) -> Option<String> {
        if self.secure_ports.is_empty() {
            return None;
        }
        Some(
            self.secure_ports
                .iter()
                .map(|port| format!("127.0.0.1:{port}"))
                .collect::<Vec<_>>()
                .join(","),
        )
    }

    /// The address of member `i`'s TLS port, `127.0.0.1:PORT`, when TLS is on.
    pub fn secure_address(&self, i: usize) -> Option<String> {
        self.secure_ports.get(i).map(|port| format!("127.0.0.1:{port}"))
    }

    /// The address of member `i`, `127.0.0.1:PORT`.
    pub fn address(&self, i: usize) -> String {
        format!("127.0.0.1:{}", self.client_ports[i])
    }

    /// Member `i`, to stop, kill, pause or resume it.
    pub fn member(&mut self, i: usize) -> &mut Member {
        &mut self.members[i]
    }

    /// How many members the ensemble has.
    pub fn size(&self) -> usize {
        self.members.len()
    }

    /// Member `i`'s mode (`standalone`, `leader`, `follower`) when it serves.
    pub fn mode(&self, i: usize) -> Option<String> {
        mode(self.client_ports[i])
    }

    /// Sends a four-letter word (`mntr`, `srvr`, `wchc`, ...) to member `i`.
    pub fn four_letter(&self, i: usize, word: &str) -> Option<String> {
        exchange(self.client_ports[i], word.as_bytes(), Duration::from_secs(5))
    }

    /// Whether member `i` holds a watch of the session `session` (its id in
    /// hex, as lockline's `Session::id` gives it) on the node `path`, by its
    /// `wchp` four-letter word (paths, each followed by the ids of the
    /// sessions watching it).
    pub fn watches(&self, i: usize, path: &str, session: &str) -> bool {
        let Some(listing) = self.four_letter(i, "wchp") else {
            return false;
        };
        let watcher = format!("0x{}", session.trim_start_matches("0x"));
        let mut under_path = false;
        for line in listing.lines() {
            if line.starts_with('/') {
                under_path = line.trim_end() == path;
            } else if under_path && line.trim().eq_ignore_ascii_case(&watcher) {
                return true;
            }
        }
        false
    }

    /// ZooKeeper's own command-line client against `server`, ready for a
    /// command's arguments (`create /k v`, `get /k`).
    pub fn cli(&self, server: &str) -> Command {
        let mut command = Command::new(JAVA);
        command
            .args([
                "-Xmx128m",
                "-XX:+UseSerialGC",
                "-XX:TieredStopAtLevel=1",
                "-cp",
                ZOOKEEPER_JAR,
            ])
            .arg("org.apache.zookeeper.ZooKeeperMain")
            .args(["-server", server]);
        command
    }
}

/// The `zoo.cfg` lines of a TLS `secureClientPort` served by Netty, with
/// PEM key and trust stores (ZooKeeper 3.8 reads PEM).
fn tls_config(tls: &ZkTlsOptions, port: u16, dir: &std::path::Path, name: &str) -> Result<String> {
    // ZooKeeper's PEM key store wants the key and the certificate in one file.
    let key_store = dir.join(format!("{name}-keystore.pem"));
    fs::write(
        &key_store,
        format!("{}{}", tls.server.key_pem()?, tls.server.cert_pem()?),
    )?;
    let client_auth = match tls.client_auth {
        ClientAuth::Need => "need",
        ClientAuth::Want => "want",
        ClientAuth::None => "none",
    };
    Ok(format!(
        "secureClientPort={port}\nsecureClientPortAddress=127.0.0.1\n\
         serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory\n\
         ssl.keyStore.location={}\nssl.keyStore.type=PEM\n\
         ssl.trustStore.location={}\nssl.trustStore.type=PEM\n\
         ssl.clientAuth={client_auth}\n",
        key_store.display(),
        tls.client_ca.display(),
    ))
}

/// A JAAS string literal.
fn jaas_quote(value: &str) -> String {
    format!("\"{}\"", value.replace('\\', "\\\\").replace('"', "\\\""))
}

fn mode(port: u16) -> Option<String> {
    let answer = exchange(port, b"srvr", Duration::from_secs(2))?;
    answer
        .lines()
        .find_map(|line| line.strip_prefix("Mode: "))
        .map(|mode| mode.trim().to_owned())
}
