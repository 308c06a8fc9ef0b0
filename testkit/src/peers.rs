//! An etcd cluster's peer (raft) traffic through one proxy per member, so that
//! one member can be cut off from the others while its clients still reach it.
//!
//! Every member advertises its proxy's address as its peer URL, so every
//! connection *to* member `i` passes through proxy `i`. Connections *from*
//! member `i` go through the other members' proxies, mixed with the others'
//! traffic; they are told apart by the `X-Server-From` header (the sender's
//! member id) that etcd's rafthttp puts on every stream and pipeline request.
//! Isolating member `i` closes every connection to it and every connection
//! whose first request comes from it, and refuses new ones until it rejoins.
//! Connections without that header (version probes, lease forwarding) are
//! cut only when they go to the isolated member.

use std::collections::HashSet;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread;
use std::time::Duration;

use crate::Result;

/// The proxies of one cluster.
pub(crate) struct PeerNet {
    shared: Arc<NetShared>,
    ports: Vec<u16>,
}

struct NetShared {
    /// Member ids in hex (as `X-Server-From` carries them), by member index;
    /// empty until the cluster is up.
    ids: Mutex<Vec<String>>,
    isolated: Mutex<HashSet<usize>>,
    connections: Mutex<Vec<PeerConnection>>,
    stopped: AtomicBool,
}

struct PeerConnection {
    target: usize,
    source: Option<String>,
    streams: [TcpStream; 2],
}

/// The longest a new connection's request header may take to arrive.
const HEADER_TIMEOUT: Duration = Duration::from_secs(5);

impl PeerNet {
    /// One proxy per target (`127.0.0.1:<real peer port>`), each on a free port.
    pub(crate) fn start(targets: &[u16]) -> Result<Self> {
        let shared = Arc::new(NetShared {
            ids: Mutex::default(),
            isolated: Mutex::default(),
            connections: Mutex::default(),
            stopped: AtomicBool::new(false),
        });
        let mut ports = Vec::new();
        for (member, &target) in targets.iter().enumerate() {
            let listener = TcpListener::bind("127.0.0.1:0")?;
            ports.push(listener.local_addr()?.port());
            let shared = Arc::clone(&shared);
            thread::Builder::new()
                .name("lockline-testkit-peers".into())
                .spawn(move || accept_loop(listener, member, target, shared))?;
        }
        Ok(PeerNet { shared, ports })
    }

    /// The proxies' ports, by member index.
    pub(crate) fn ports(&self) -> &[u16] {
        &self.ports
    }

    /// Records the members' ids (hex), by member index.
    pub(crate) fn set_ids(&self, ids: Vec<String>) {
        *self.shared.ids.lock().unwrap_or_else(PoisonError::into_inner) = ids;
    }

    /// Cuts member `member` off from the others.
    pub(crate) fn isolate(&self, member: usize) {
        let mut connections = self.shared.connections.lock().unwrap_or_else(PoisonError::into_inner);
        self.shared
            .isolated
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(member);
        connections.retain(|connection| {
            let cut = self.shared.refuses(connection.target, connection.source.as_deref());
            if cut {
                for stream in &connection.streams {
                    let _ = stream.shutdown(Shutdown::Both);
                }
            }
            !cut
        });
    }

    /// Lets member `member` talk to the others again.
    pub(crate) fn rejoin(&self, member: usize) {
        self.shared
            .isolated
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&member);
    }
}

impl Drop for PeerNet {
    fn drop(&mut self) {
        self.shared.stopped.store(true, Ordering::SeqCst);
        let mut connections = self.shared.connections.lock().unwrap_or_else(PoisonError::into_inner);
        for connection in connections.drain(..) {
            for stream in &connection.streams {
                let _ = stream.shutdown(Shutdown::Both);
            }
        }
        for port in &self.ports {
            // Wake each acceptor so that it sees `stopped`.
            let _ = TcpStream::connect(("127.0.0.1", *port));
        }
    }
}

impl NetShared {
    /// Whether a connection to `target` from the member with id `source` must
    /// not pass.
    fn refuses(&self, target: usize, source: Option<&str>) -> bool {
        let isolated = self.isolated.lock().unwrap_or_else(PoisonError::into_inner);
        if isolated.contains(&target) {
            return true;
        }
        let Some(source) = source else {
            return false;
        };
        let ids = self.ids.lock().unwrap_or_else(PoisonError::into_inner);
        isolated
            .iter()
            .any(|&member| ids.get(member).is_some_and(|id| id == source))
    }
}

fn accept_loop(listener: TcpListener, member: usize, target: u16, shared: Arc<NetShared>) {
    for incoming in listener.incoming() {
        if shared.stopped.load(Ordering::SeqCst) {
            return;
        }
        let Ok(client) = incoming else { continue };
        let shared = Arc::clone(&shared);
        thread::spawn(move || join(client, member, target, shared));
    }
}

/// Reads the first request's header to learn the sender, then joins the
/// connection to the member unless isolation forbids it.
fn join(mut client: TcpStream, member: usize, target: u16, shared: Arc<NetShared>) {
    let mut head = Vec::new();
    let mut buf = [0u8; 4096];
    let _ = client.set_read_timeout(Some(HEADER_TIMEOUT));
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 64 * 1024 {
        match client.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    }
    let _ = client.set_read_timeout(None);
    let source = sender(&head);
    let Ok(mut server) = TcpStream::connect(SocketAddr::from(([127, 0, 0, 1], target))) else {
        let _ = client.shutdown(Shutdown::Both);
        return;
    };
    let handles = (
        client.try_clone(),
        server.try_clone(),
        client.try_clone(),
        server.try_clone(),
    );
    let (Ok(client_read), Ok(server_write), Ok(client_keep), Ok(server_keep)) = handles else {
        return;
    };
    {
        // Checked and registered under one lock: an isolation cannot slip
        // between the two.
        let mut connections = shared.connections.lock().unwrap_or_else(PoisonError::into_inner);
        if shared.refuses(member, source.as_deref()) || server.write_all(&head).is_err() {
            let _ = client.shutdown(Shutdown::Both);
            let _ = server.shutdown(Shutdown::Both);
            return;
        }
        connections.retain(|c| c.streams[0].peer_addr().is_ok());
        connections.push(PeerConnection {
            target: member,
            source,
            streams: [client_keep, server_keep],
        });
    }
    thread::spawn(move || copy(client_read, server_write));
    copy(server, client);
}

/// The member id in a request header's `X-Server-From`, lowercased.
fn sender(head: &[u8]) -> Option<String> {
    let text = String::from_utf8_lossy(head);
    text.lines().find_map(|line| {
        let (name, value) = line.split_once(':')?;
        name.trim()
            .eq_ignore_ascii_case("x-server-from")
            .then(|| value.trim().to_ascii_lowercase())
    })
}

fn copy(mut from: TcpStream, mut to: TcpStream) {
    let mut buf = [0u8; 16 * 1024];
    loop {
        match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
        }
    }
    let _ = from.shutdown(Shutdown::Both);
    let _ = to.shutdown(Shutdown::Both);
}

/// Parses a peer `/members` answer (`[{"id":<decimal>,...,"name":"n1",...}]`)
/// into hex ids by the given member names.
pub(crate) fn member_ids(answer: &str, names: &[String]) -> Option<Vec<String>> {
    let body = &answer[answer.find('[')?..];
    let mut found = Vec::new();
    for member in body.split("{\"id\":").skip(1) {
        let digits: String = member.chars().take_while(char::is_ascii_digit).collect();
        let id: u64 = digits.parse().ok()?;
        let name_at = member.find("\"name\":\"")? + "\"name\":\"".len();
        let name = member[name_at..].split('"').next()?;
        found.push((name.to_owned(), format!("{id:x}")));
    }
    names
        .iter()
        .map(|name| found.iter().find(|(n, _)| n == name).map(|(_, id)| id.clone()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_sender_and_the_member_ids() {
        let head = b"GET /raft/stream/message/1 HTTP/1.1\r\nHost: x\r\nX-Server-From: BD8D0C5B5A3E1F2\r\n\r\n";
        assert_eq!(sender(head).as_deref(), Some("bd8d0c5b5a3e1f2"));
        assert_eq!(sender(b"GET /version HTTP/1.1\r\n\r\n"), None);
        let answer = "HTTP/1.0 200 OK\r\n\r\n[{\"id\":13668033151171901709,\"peerURLs\":[\"http://127.0.0.1:1\"],\"name\":\"n1\",\"clientURLs\":[]},{\"id\":15,\"peerURLs\":[],\"name\":\"n2\",\"clientURLs\":[]}]";
        let names = ["n2".to_owned(), "n1".to_owned()];
        assert_eq!(
            member_ids(answer, &names),
            Some(vec!["f".to_owned(), format!("{:x}", 13668033151171901709u64)])
        );
    }
}
