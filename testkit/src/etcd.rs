use std::fmt;
use std::io::Error;
use std::process::Command;
use std::time::Duration;

use tempfile::TempDir;

use std::path::PathBuf;

use crate::peers::{member_ids, PeerNet};
use crate::process::{exchange, free_port, Member};
use crate::tls::{Issued, TestCa};
use crate::Result;

pub(crate) const ETCD: &str = "/usr/bin/etcd";
const ETCDCTL: &str = "/usr/bin/etcdctl";
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// An etcd cluster of 1 or 3 members on free loopback ports, in a temporary
/// directory; stopped and deleted on drop.
pub struct EtcdCluster {
    members: Vec<Member>,
    client_ports: Vec<u16>,
    /// Where `/health` is served: the client ports, or plain-text metrics
    /// ports when the client ports speak TLS only.
    health_ports: Vec<u16>,
    peers: Option<PeerNet>,
    tls: Option<TlsFiles>,
    dir: TempDir,
}

/// The certificates of a cluster started with [`EtcdCluster::start_tls`].
#[derive(Debug, Clone)]
struct TlsFiles {
    ca: PathBuf,
    /// A client certificate for `etcdctl` (common name `root`).
    ctl: Issued,
}

impl fmt::Debug for EtcdCluster {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdCluster")
            .field("endpoints", &self.endpoints())
            .field("dir", &self.dir.path())
            .finish()
    }
}

impl EtcdCluster {
    /// Starts a one-member cluster and waits until it serves requests.
    ///
    /// # Errors
    ///
    /// When `etcd` is missing or does not become healthy within 30 s (the
    /// error carries its log).
    pub fn start() -> Result<Self> {
        Self::start_cluster(1)
    }

    /// Starts a cluster of `size` members (1 or 3, say) and waits until every
    /// member is healthy. A start that loses a port race is retried with new ports.
    ///
    /// # Errors
    ///
    /// As [`start`](Self::start).
    pub fn start_cluster(size: usize) -> Result<Self> {
        Self::start_with(size, false, None, &[])
    }

    /// Starts a one-member cluster whose client port speaks TLS only
    /// (`https://`), with a server certificate issued by `ca`. With
    /// `client_cert_auth` the server also demands a client certificate signed
    /// by `ca` (`--client-cert-auth --trusted-ca-file`), as Kubernetes' etcd
    /// does. Health is probed on a plain-text metrics port.
    ///
    /// # Errors
    ///
    /// As [`start`](Self::start), or when the certificates cannot be made.
    pub fn start_tls(ca: &TestCa, client_cert_auth: bool) -> Result<Self> {
        let server = ca.server("etcd")?;
        let files = TlsFiles {
            ca: ca.cert().to_owned(),
            ctl: ca.client("root")?,
        };
        Self::start_with(1, false, Some((server, files, client_cert_auth)), &[])
    }
    /// Starts a cluster of `size` members whose peer traffic passes through
    /// one proxy per member, so that [`isolate`](Self::isolate) can cut a
    /// member off from the others while its clients still reach it.
    ///
    /// # Errors
    ///
    /// As [`start`](Self::start), or when the members' ids cannot be read.
    pub fn start_isolatable(size: usize) -> Result<Self> {
        Self::start_with(size, true, None, &[])
    }

    /// Cuts member `i` off from the other members (a network partition
    /// between peers; its clients still reach it). Only on a cluster from
    /// [`start_isolatable`](Self::start_isolatable).
    ///
    /// # Errors
    ///
    /// When the cluster was not started isolatable.
    pub fn isolate(&self, i: usize) -> Result<()> {
        self.peer_net()?.isolate(i);
        Ok(())
    }

    /// Ends [`isolate`](Self::isolate) for member `i`.
    ///
    /// # Errors
    ///
    /// When the cluster was not started isolatable.
    pub fn rejoin(&self, i: usize) -> Result<()> {
        self.peer_net()?.rejoin(i);
        Ok(())
    }

    fn peer_net(&self) -> Result<&PeerNet> {
        self.peers
            .as_ref()
            .ok_or_else(|| Error::other("the cluster was not started with peer proxies"))
    }

    /// Starts a one-member cluster with these extra `etcd` flags (say
    /// `--auth-token jwt,...`).
    ///
    /// # Errors
    ///
    /// As [`start`](Self::start).
    pub fn start_with_flags(flags: &[String]) -> Result<Self> {
        Self::start_with(1, false, None, flags)
    }

    fn start_with(
        size: usize,
        isolatable: bool,
        tls: Option<(Issued, TlsFiles, bool)>,
        flags: &[String],
    ) -> Result<Self> {
        let mut last = None;
        for _ in 0..3 {
            match Self::try_start(size, isolatable, tls.clone(), flags) {
                Ok(cluster) => return Ok(cluster),
                Err(error) => last = Some(error),
            }
        }
        Err(last.unwrap_or_else(|| Error::other("etcd did not start")))
    }

    fn try_start(
        size: usize,
        isolatable: bool,
        tls: Option<(Issued, TlsFiles, bool)>,
        flags: &[String],
    ) -> Result<Self> {
        if size == 0 {
            return Err(Error::other("a cluster needs at least one member"));
        }
        let dir = tempfile::Builder::new().prefix("lockline-etcd-").tempdir()?;
        let mut ports = Vec::new();
        for _ in 0..size {
            ports.push((free_port()?, free_port()?));
        }
        let scheme = if tls.is_some() { "https" } else { "http" };
        let mut health_ports = Vec::new();
        let peers = if isolatable {
            let real: Vec<u16> = ports.iter().map(|(_, peer)| *peer).collect();
            Some(PeerNet::start(&real)?)
        } else {
            None
        };
        // The port other members reach member i on: its proxy's, if any.
        let advertised: Vec<u16> = match &peers {
            Some(net) => net.ports().to_vec(),
            None => ports.iter().map(|(_, peer)| *peer).collect(),
        };
        let initial_cluster = advertised
            .iter()
            .enumerate()
            .map(|(i, peer)| format!("n{}=http://127.0.0.1:{peer}", i + 1))
            .collect::<Vec<_>>()
            .join(",");
        let mut members = Vec::new();
        for (i, (client, peer)) in ports.iter().enumerate() {
            let name = format!("n{}", i + 1);
            let data = dir.path().join(&name);
            let mut args: Vec<String> = vec![
                "--name".into(),
                name.clone(),
                "--data-dir".into(),
                data.display().to_string(),
                "--listen-client-urls".into(),
                format!("{scheme}://127.0.0.1:{client}"),
                "--advertise-client-urls".into(),
                format!("{scheme}://127.0.0.1:{client}"),
                "--listen-peer-urls".into(),
                format!("http://127.0.0.1:{peer}"),
                "--initial-advertise-peer-urls".into(),
                format!("http://127.0.0.1:{}", advertised[i]),
                "--initial-cluster".into(),
                initial_cluster.clone(),
                "--initial-cluster-state".into(),
                "new".into(),
                "--initial-cluster-token".into(),
                dir.path().display().to_string(),
                // Quick elections keep failover tests short.
                "--heartbeat-interval".into(),
                "50".into(),
                "--election-timeout".into(),
                "500".into(),
                "--logger".into(),
                "zap".into(),
                "--log-level".into(),
                "warn".into(),
            ];
            match &tls {
                Some((server, files, client_cert_auth)) => {
                    let metrics = free_port()?;
                    health_ports.push(metrics);
                    args.extend([
                        "--cert-file".into(),
                        server.cert.display().to_string(),
                        "--key-file".into(),
                        server.key.display().to_string(),
                        "--listen-metrics-urls".into(),
                        format!("http://127.0.0.1:{metrics}"),
                    ]);
                    if *client_cert_auth {
                        args.extend([
                            "--client-cert-auth".into(),
                            "--trusted-ca-file".into(),
                            files.ca.display().to_string(),
                        ]);
                    }
                }
                None => health_ports.push(*client),
            }
            args.extend(flags.iter().cloned());
            let log = dir.path().join(format!("{name}.log"));
            members.push(Member::start(&name, ETCD, &args, log, dir.path())?);
        }
        let client_ports: Vec<u16> = ports.iter().map(|(client, _)| *client).collect();
        let mut cluster = EtcdCluster {
            members,
            client_ports,
            health_ports,
            peers,
            tls: tls.map(|(_, files, _)| files),
            dir,
        };
        for i in 0..size {
            cluster.wait_healthy(i)?;
        }
        if let Some(net) = &cluster.peers {
            let request = b"GET /members HTTP/1.0\r\n\r\n";
            let names: Vec<String> = (1..=size).map(|i| format!("n{i}")).collect();
            let ids = exchange(ports[0].1, request, Duration::from_secs(5))
                .and_then(|answer| member_ids(&answer, &names))
                .ok_or_else(|| Error::other("could not read the members' ids from /members"))?;
            net.set_ids(ids);
        }
        Ok(cluster)
    }

    /// Waits until member `i` answers `/health` with a leader.
    ///
    /// # Errors
    ///
    /// When it does not within 30 s, or exits.
    pub fn wait_healthy(&mut self, i: usize) -> Result<()> {
        let port = self.health_ports[i];
        self.members[i].wait_ready(START_TIMEOUT, || health(port))
    }

    /// The client URLs of every member, `http://127.0.0.1:PORT` (`https://`
    /// for a cluster from [`start_tls`](Self::start_tls)).
    pub fn endpoints(&self) -> Vec<String> {
        (0..self.client_ports.len()).map(|i| self.endpoint(i)).collect()
    }

    /// The client URL of member `i`.
    pub fn endpoint(&self, i: usize) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://127.0.0.1:{}", self.client_ports[i])
    }

    /// The client certificate `etcdctl` uses on a cluster from
    /// [`start_tls`](Self::start_tls) (common name `root`).
    pub fn ctl_certificate(&self) -> Option<&Issued> {
        self.tls.as_ref().map(|files| &files.ctl)
    }

    /// The client port of member `i`.
    pub fn client_port(&self, i: usize) -> u16 {
        self.client_ports[i]
    }

    /// Member `i`, to stop, kill, pause or resume it.
    pub fn member(&mut self, i: usize) -> &mut Member {
        &mut self.members[i]
    }

    /// How many members the cluster has.
    pub fn size(&self) -> usize {
        self.members.len()
    }

    /// Reads `/metrics` of member `i` (Prometheus text).
    pub fn metrics(&self, i: usize) -> Option<String> {
        let request = format!(
            "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1:{}\r\n\r\n",
            self.health_ports[i]
        );
        exchange(self.health_ports[i], request.as_bytes(), Duration::from_secs(5))
    }

    /// An `etcdctl` command (API v3) against the given endpoints, ready to run.
    pub fn etcdctl(&self, endpoints: &[String]) -> Command {
        let mut command = Command::new(ETCDCTL);
        command
            .env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={}", endpoints.join(",")))
            .arg("--dial-timeout=2s")
            .arg("--command-timeout=5s");
        if let Some(files) = &self.tls {
            command
                .arg(format!("--cacert={}", files.ca.display()))
                .arg(format!("--cert={}", files.ctl.cert.display()))
                .arg(format!("--key={}", files.ctl.key.display()));
        }
        command
    }

    /// Every key under `prefix` (`""` for the whole keyspace), read with
    /// `etcdctl` from all members' endpoints.
    ///
    /// # Errors
    ///
    /// When `etcdctl` cannot be run or fails.
    pub fn keys(&self, prefix: &str) -> Result<Vec<String>> {
        let out = self
            .etcdctl(&self.endpoints())
            .args(["get", "--prefix", "--keys-only", prefix])
            .output()?;
        if !out.status.success() {
            return Err(Error::other(format!(
                "etcdctl get --prefix {prefix:?}: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        Ok(String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| !l.is_empty())
            .map(str::to_owned)
            .collect())
    }
}

fn health(port: u16) -> bool {
    let request = format!("GET /health HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\n\r\n");
    exchange(port, request.as_bytes(), Duration::from_secs(2))
        .is_some_and(|answer| answer.contains("\"health\":\"true\""))
}
