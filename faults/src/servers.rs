//! The servers under test: a 3-member etcd cluster or ZooKeeper ensemble,
//! its leader, and a fresh client's view of the lock's entries.

use std::time::Duration;

use lockline_testkit::{EtcdCluster, Member, ZkEnsemble, ZkOptions};

use crate::Backend;

/// A running cluster of one backend.
#[derive(Debug)]
pub enum Servers {
    /// etcd.
    Etcd(EtcdCluster),
    /// ZooKeeper.
    ZooKeeper(ZkEnsemble),
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
    /// Starts `size` members.
    ///
    /// # Errors
    ///
    /// When the servers cannot be started.
    pub fn start(backend: Backend, size: usize) -> std::io::Result<Self> {
        Ok(match backend {
            Backend::Etcd => Servers::Etcd(EtcdCluster::start_cluster(size)?),
            Backend::ZooKeeper => Servers::ZooKeeper(ZkEnsemble::start_with(size, &ZkOptions::default())?),
        })
    }

    /// How many members.
    pub fn size(&self) -> usize {
        match self {
            Servers::Etcd(cluster) => cluster.size(),
            Servers::ZooKeeper(ensemble) => ensemble.size(),
        }
    }

    /// Member `i`'s client address, `127.0.0.1:PORT`.
    pub fn address(&self, i: usize) -> String {
        match self {
            Servers::Etcd(cluster) => format!("127.0.0.1:{}", cluster.client_port(i)),
            Servers::ZooKeeper(ensemble) => ensemble.address(i),
        }
    }

    /// Member `i`.
    pub fn member(&mut self, i: usize) -> &mut Member {
        match self {
            Servers::Etcd(cluster) => cluster.member(i),
            Servers::ZooKeeper(ensemble) => ensemble.member(i),
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
