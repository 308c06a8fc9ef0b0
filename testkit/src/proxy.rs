use std::fmt;
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread;
use std::time::Duration;

use crate::Result;

mod framing;

use framing::{be_i32, Frames, H2Ends};

/// A TCP proxy on a free loopback port in front of one server, for network
/// faults without `netem`:
///
/// - [`block`](Self::block) cuts every connection and refuses new ones until
///   [`unblock`](Self::unblock) (a crash or a reset: noticed at once);
/// - [`blackhole`](Self::blackhole) keeps every connection open but lets no
///   byte through either way until [`heal`](Self::heal), as a silent network
///   partition does (packets dropped, no reset). Bytes sent meanwhile are
///   delivered on `heal`, as TCP's retransmission would; new connections are
///   accepted but reach the server only after `heal`;
/// - [`set_requests_held`](Self::set_requests_held) delays the client's bytes
///   only (a slow path to the server), delivering them in order when released;
/// - [`lose_zk_responses`](Self::lose_zk_responses) (on a proxy started with
///   [`start_zookeeper`](Self::start_zookeeper)) lets chosen ZooKeeper
///   requests reach the server and loses their answers: the response is
///   thrown away and the connection cut, so the client reconnects not knowing
///   whether the request was applied — a fault injected at one exact step;
/// - [`freeze_connection`](Self::freeze_connection) blackholes *one*
///   connection, picked by the order the proxy accepted it, while every
///   other flows (a NAT or a load balancer that forgot one idle flow), until
///   [`thaw_connection`](Self::thaw_connection);
/// - [`orphan_connections`](Self::orphan_connections) closes the client's end
///   of every connection while what it sent stays on its way to the server,
///   delivered by [`deliver_orphans`](Self::deliver_orphans): a request that
///   outlives the connection it was sent on (a slow path to another member);
/// - [`retarget`](Self::retarget) sends new connections to another server,
///   as a virtual IP that follows a database's primary.
///
/// A proxy started with [`start_zookeeper`](Self::start_zookeeper) also
/// counts what passes through it ([`zk_counts`](Self::zk_counts)): requests
/// by opcode, the watches they set, and the watch events delivered.
pub struct TcpProxy {
    address: SocketAddr,
    shared: Arc<Shared>,
}

struct Shared {
    /// Where new connections go (see `retarget`).
    target: Mutex<SocketAddr>,
    blocked: AtomicBool,
    drop_responses: AtomicBool,
    blackholed: AtomicBool,
    requests_held: AtomicBool,
    orphans_delivered: AtomicBool,
    orphan_answers: AtomicUsize,
    held_request_bytes: AtomicUsize,
    /// Complete HTTP/2 requests (a frame ending a stream) among the held
    /// bytes: see `held_requests`.
    held_request_ends: AtomicUsize,
    stopped: AtomicBool,
    /// Parse ZooKeeper's framing (`start_zookeeper`).
    zookeeper: bool,
    losses: Mutex<Vec<Loss>>,
    counts: Mutex<ZkCounts>,
    connections: Mutex<Vec<TcpStream>>,
    links: Mutex<Vec<Arc<Link>>>,
    /// How many connections were accepted: the next one's number.
    accepted: AtomicUsize,
    /// Numbers of connections frozen (see `freeze_connection`), also those
    /// not joined to the server yet.
    frozen: Mutex<std::collections::HashSet<usize>>,
    /// Numbers of connections whose server answers are kept back (see
    /// `freeze_answers`).
    answers_frozen: Mutex<std::collections::HashSet<usize>>,
}

/// One proxied connection, as the switches that act on it alone see it.
struct Link {
    client: TcpStream,
    orphaned: AtomicBool,
    /// The order the proxy accepted it in, from 0.
    number: usize,
    /// The client closed its end (its bytes ended), as the proxy read it.
    client_closed: AtomicBool,
}

impl fmt::Debug for TcpProxy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TcpProxy")
            .field("address", &self.address)
            .field("target", &self.shared.target())
            .field("blocked", &self.shared.blocked.load(Ordering::SeqCst))
            .finish()
    }
}

impl TcpProxy {
    /// Starts a proxy to `target` (`127.0.0.1:PORT`).
    ///
    /// # Errors
    ///
    /// When the target is not an address or no port can be bound.
    pub fn start(target: &str) -> Result<Self> {
        Self::start_with(target, false)
    }

    /// Starts a proxy to a ZooKeeper server that understands its framing, so
    /// that [`lose_zk_responses`](Self::lose_zk_responses) can pick requests.
    ///
    /// # Errors
    ///
    /// As [`start`](Self::start).
    pub fn start_zookeeper(target: &str) -> Result<Self> {
        Self::start_with(target, true)
    }

    fn start_with(target: &str, zookeeper: bool) -> Result<Self> {
        let target: SocketAddr = target.parse().map_err(std::io::Error::other)?;
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let address = listener.local_addr()?;
        let shared = Arc::new(Shared {
            target: Mutex::new(target),
            blocked: AtomicBool::new(false),
            drop_responses: AtomicBool::new(false),
            blackholed: AtomicBool::new(false),
            requests_held: AtomicBool::new(false),
            orphans_delivered: AtomicBool::new(false),
            orphan_answers: AtomicUsize::new(0),
            held_request_bytes: AtomicUsize::new(0),
            held_request_ends: AtomicUsize::new(0),
            stopped: AtomicBool::new(false),
            zookeeper,
            losses: Mutex::default(),
            counts: Mutex::default(),
            connections: Mutex::default(),
            links: Mutex::default(),
            accepted: AtomicUsize::new(0),
            frozen: Mutex::default(),
            answers_frozen: Mutex::default(),
        });
        let acceptor = Arc::clone(&shared);
        thread::Builder::new()
            .name("lockline-testkit-proxy".into())
            .spawn(move || accept_loop(listener, acceptor))?;
        Ok(TcpProxy { address, shared })
    }

    /// The proxy's address, `127.0.0.1:PORT`.
    pub fn address(&self) -> String {
        self.address.to_string()
    }

    /// What has passed through a proxy started with
    /// [`start_zookeeper`](Self::start_zookeeper) so far, over every
    /// connection (the connect handshakes not counted); all zero on another
    /// proxy. Subtract two readings ([`ZkCounts::since`]) for a window.
    pub fn zk_counts(&self) -> ZkCounts {
        self.shared
            .counts
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Sends the connections accepted from now on to `target`
    /// (`127.0.0.1:PORT`), as a virtual IP moved to another server does (a
    /// database's failover): connections open already stay joined to the
    /// server they reached, and end when it does. A connection accepted but
    /// not joined yet (behind [`blackhole`](Self::blackhole) or
    /// [`freeze_connection`](Self::freeze_connection)) goes to `target` too.
    ///
    /// # Errors
    ///
    /// When the target is not an address.
    pub fn retarget(&self, target: &str) -> Result<()> {
        let target: SocketAddr = target.parse().map_err(std::io::Error::other)?;
        *self.shared.target.lock().unwrap_or_else(PoisonError::into_inner) = target;
        Ok(())
    }

    /// The address new connections go to, `127.0.0.1:PORT`.
    pub fn target(&self) -> String {
        self.shared.target().to_string()
    }

    /// Cuts every open connection and refuses new ones.
    pub fn block(&self) {
        self.shared.blocked.store(true, Ordering::SeqCst);
        self.shared.cut_all();
    }

    /// Lets connections through again.
    pub fn unblock(&self) {
        self.shared.blocked.store(false, Ordering::SeqCst);
    }

    /// While set, the server's answers are read and thrown away: requests
    /// reach the server, their responses never reach the client.
    pub fn set_responses_dropped(&self, dropped: bool) {
        self.shared.drop_responses.store(dropped, Ordering::SeqCst);
    }

    /// A silent partition: from now on no byte crosses the proxy in either
    /// direction, and no connection is closed or reset. Neither side can tell
    /// until its own timeouts fire.
    pub fn blackhole(&self) {
        self.shared.blackholed.store(true, Ordering::SeqCst);
    }

    /// Ends a [`blackhole`](Self::blackhole): what was sent meanwhile is
    /// delivered, in order, and traffic flows again.
    pub fn heal(&self) {
        self.shared.blackholed.store(false, Ordering::SeqCst);
    }

    /// Loses the answers to the next `count` ZooKeeper requests whose opcode
    /// is one of `opcodes` (ZooKeeper's numbers: 1 create, 3 exists, 8
    /// getChildren, 12 getChildren2, 15 create2, 19 createContainer, ...) and
    /// whose path starts with `path_prefix`: each reaches the server, which
    /// applies it; its response is dropped and the connection cut at once.
    /// Several calls add separate rules. Needs
    /// [`start_zookeeper`](Self::start_zookeeper).
    pub fn lose_zk_responses(&self, opcodes: &[i32], path_prefix: &str, count: usize) {
        self.shared
            .losses
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(Loss {
                opcodes: opcodes.to_vec(),
                path_prefix: path_prefix.to_owned(),
                remaining: count,
                fail_with: None,
            });
    }

    /// Like [`lose_zk_responses`](Self::lose_zk_responses), but the picked
    /// requests are answered with the error code `error` (ZooKeeper's numbers:
    /// -4 connection loss, -7 operation timeout, ...) on a connection that stays
    /// up: the request was applied, the client is told it failed.
    pub fn fail_zk_responses(&self, opcodes: &[i32], path_prefix: &str, count: usize, error: i32) {
        self.shared
            .losses
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(Loss {
                opcodes: opcodes.to_vec(),
                path_prefix: path_prefix.to_owned(),
                remaining: count,
                fail_with: Some(error),
            });
    }

    /// How many responses chosen by [`lose_zk_responses`](Self::lose_zk_responses)
    /// are still to be lost.
    pub fn zk_losses_pending(&self) -> usize {
        self.shared
            .losses
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .map(|l| l.remaining)
            .sum()
    }

    /// Whether the proxy is blackholed now.
    pub fn is_blackholed(&self) -> bool {
        self.shared.blackholed.load(Ordering::SeqCst)
    }

    /// While set, the client's bytes are kept back (the server hears nothing
    /// new); the server's answers still flow. Clearing it delivers what was
    /// kept, in order.
    pub fn set_requests_held(&self, held: bool) {
        self.shared.requests_held.store(held, Ordering::SeqCst);
    }

    /// How many bytes from clients the proxy keeps back for the server now.
    pub fn held_request_bytes(&self) -> usize {
        self.shared.held_request_bytes.load(Ordering::SeqCst)
    }

    /// How many whole HTTP/2 requests (gRPC calls: a frame that ends its
    /// stream) the proxy keeps back for the server now, on connections that
    /// speak HTTP/2. Unlike [`held_request_bytes`](Self::held_request_bytes),
    /// which counts a request's first frame as soon as it arrives, this
    /// counts a request only once all of it is held: what a test waits for
    /// before it cuts the connection under a request that must reach the
    /// server whole later.
    pub fn held_requests(&self) -> usize {
        self.shared.held_request_ends.load(Ordering::SeqCst)
    }

    /// How many connections the proxy has accepted so far; the next one
    /// will be number `connections_accepted()`.
    pub fn connections_accepted(&self) -> usize {
        self.shared.accepted.load(Ordering::SeqCst)
    }

    /// Freezes connection `number` (numbered from 0 in the order the proxy
    /// accepted them) alone: from now on no byte of it crosses the proxy
    /// either way and nothing is closed or reset, while every other
    /// connection flows. What is sent meanwhile is kept, and delivered by
    /// [`thaw_connection`](Self::thaw_connection). A number not accepted yet
    /// is frozen from its start.
    pub fn freeze_connection(&self, number: usize) {
        self.shared
            .frozen
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(number);
    }

    /// Keeps back the server's answers on connection `number` alone, while
    /// its requests still reach the server: a request is applied and its
    /// answer never arrives, as when a flow dies right after the request
    /// went through. [`thaw_connection`](Self::thaw_connection) delivers them.
    pub fn freeze_answers(&self, number: usize) {
        self.shared
            .answers_frozen
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(number);
    }

    /// Ends [`freeze_connection`](Self::freeze_connection) and
    /// [`freeze_answers`](Self::freeze_answers) for `number`.
    pub fn thaw_connection(&self, number: usize) {
        self.shared
            .frozen
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&number);
        self.shared
            .answers_frozen
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&number);
    }

    /// Whether the client has closed its end of connection `number` (the
    /// proxy read the end of its bytes; frozen or not). `false` for a
    /// connection not joined to the server yet.
    pub fn client_closed(&self, number: usize) -> bool {
        self.shared
            .links
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .any(|l| l.number == number && l.client_closed.load(Ordering::SeqCst))
    }

    /// Closes the client's end of every open connection (the client sees its
    /// connection end and opens a new one) while keeping the server's end
    /// open: bytes held for the server (see
    /// [`set_requests_held`](Self::set_requests_held)) stay held, whatever
    /// that switch does later, until [`deliver_orphans`](Self::deliver_orphans).
    /// The server's answers on these connections are counted, never delivered.
    /// New connections are not affected.
    pub fn orphan_connections(&self) {
        let links = self.shared.links.lock().unwrap_or_else(PoisonError::into_inner);
        for link in links.iter() {
            link.orphaned.store(true, Ordering::SeqCst);
            let _ = link.client.shutdown(Shutdown::Both);
        }
    }

    /// Delivers what orphaned connections held for the server, in order; their
    /// server ends stay open (so the server does not cancel what it received)
    /// until the proxy is dropped.
    pub fn deliver_orphans(&self) {
        self.shared.orphans_delivered.store(true, Ordering::SeqCst);
    }

    /// How many bytes the server has answered on orphaned connections since
    /// they were orphaned.
    pub fn orphan_answer_bytes(&self) -> usize {
        self.shared.orphan_answers.load(Ordering::SeqCst)
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        self.shared.stopped.store(true, Ordering::SeqCst);
        self.shared.cut_all();
        // Wake the acceptor so that it sees `stopped`.
        let _ = TcpStream::connect(self.address);
    }
}

impl Shared {
    fn target(&self) -> SocketAddr {
        *self.target.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn is_frozen(&self, number: usize) -> bool {
        self.frozen
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .contains(&number)
    }

    fn cut_all(&self) {
        let mut connections = self.connections.lock().unwrap_or_else(PoisonError::into_inner);
        for stream in connections.drain(..) {
            let _ = stream.shutdown(Shutdown::Both);
        }
    }
}

fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    for incoming in listener.incoming() {
        if shared.stopped.load(Ordering::SeqCst) {
            return;
        }
        let Ok(client) = incoming else { continue };
        if shared.blocked.load(Ordering::SeqCst) {
            let _ = client.shutdown(Shutdown::Both);
            continue;
        }
        let number = shared.accepted.fetch_add(1, Ordering::SeqCst);
        let shared = Arc::clone(&shared);
        thread::spawn(move || connect(client, shared, number));
    }
}

/// Joins one client connection to a new server connection, once the proxy is
/// not blackholed (a partitioned server cannot be reached).
fn connect(client: TcpStream, shared: Arc<Shared>, number: usize) {
    while shared.blackholed.load(Ordering::SeqCst) || shared.is_frozen(number) {
        if shared.stopped.load(Ordering::SeqCst) || shared.blocked.load(Ordering::SeqCst) {
            let _ = client.shutdown(Shutdown::Both);
            return;
        }
        thread::sleep(TICK);
    }
    let Ok(server) = TcpStream::connect(shared.target()) else {
        let _ = client.shutdown(Shutdown::Both);
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let handles = (
        client.try_clone(),
        server.try_clone(),
        server.try_clone(),
        client.try_clone(),
    );
    let (Ok(client_read), Ok(server_write), Ok(server_read), Ok(client_write)) = handles else {
        return;
    };
    let Ok(link_client) = client.try_clone() else {
        return;
    };
    let link = Arc::new(Link {
        client: link_client,
        orphaned: AtomicBool::new(false),
        number,
        client_closed: AtomicBool::new(false),
    });
    {
        let mut connections = shared.connections.lock().unwrap_or_else(PoisonError::into_inner);
        connections.retain(|s| s.peer_addr().is_ok());
        connections.push(client);
        connections.push(server);
        let mut links = shared.links.lock().unwrap_or_else(PoisonError::into_inner);
        links.retain(|l| {
            l.orphaned.load(Ordering::SeqCst) || l.client_closed.load(Ordering::SeqCst) || l.client.peer_addr().is_ok()
        });
        links.push(Arc::clone(&link));
    }
    let (requests, request_link) = (Arc::clone(&shared), Arc::clone(&link));
    let doomed: Doomed = Arc::default();
    let marked = Arc::clone(&doomed);
    thread::spawn(move || {
        pipe(
            client_read,
            server_write,
            requests,
            request_link,
            Direction::Requests,
            marked,
        )
    });
    pipe(server_read, client_write, shared, link, Direction::Responses, doomed);
}
/// ZooKeeper requests and watch events counted by a proxy
/// ([`TcpProxy::zk_counts`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ZkCounts {
    /// Requests by opcode (ZooKeeper's `OpCode`: 1 create, 2 delete, 3
    /// exists, 4 getData, 5 setData, 8 getChildren, 9 sync, 11 ping, 12
    /// getChildren2, 14 multi, 15 create2, 19 createContainer, 21 create with
    /// TTL, 22 multiRead, 106 addWatch, ...). A `multi` counts once.
    pub requests: std::collections::BTreeMap<i32, u64>,
    /// Requests that set a watch: `exists`, `getData`, `getChildren` and
    /// `getChildren2` with their watch flag on, and `addWatch`.
    pub watches_set: u64,
    /// Watch events delivered to clients (server frames with xid -1).
    pub events: u64,
}

impl ZkCounts {
    /// What was counted after `earlier`, a reading of the same proxy.
    #[must_use]
    pub fn since(&self, earlier: &ZkCounts) -> ZkCounts {
        let requests = self
            .requests
            .iter()
            .map(|(&opcode, &n)| (opcode, n - earlier.requests.get(&opcode).copied().unwrap_or(0).min(n)))
            .filter(|&(_, n)| n > 0)
            .collect();
        ZkCounts {
            requests,
            watches_set: self.watches_set.saturating_sub(earlier.watches_set),
            events: self.events.saturating_sub(earlier.events),
        }
    }

    /// Requests with this opcode.
    pub fn requests_of(&self, opcode: i32) -> u64 {
        self.requests.get(&opcode).copied().unwrap_or(0)
    }
}

/// ZooKeeper's opcodes whose request is a path and a watch flag.
const ZK_WATCHING_READS: [i32; 4] = [3, 4, 8, 12];

/// ZooKeeper's `addWatch` opcode (a persistent watch).
const ZK_ADD_WATCH: i32 = 106;

/// A rule of [`TcpProxy::lose_zk_responses`].
#[derive(Debug)]
struct Loss {
    opcodes: Vec<i32>,
    path_prefix: String,
    remaining: usize,
    /// Answer with this error code instead of losing the answer.
    fail_with: Option<i32>,
}

/// The xids, on one connection, whose responses are to be lost (`None`) or
/// replaced by an error code.
type Doomed = Arc<Mutex<Vec<(i32, Option<i32>)>>>;

impl Shared {
    /// A client request frame: marks its xid doomed when a loss rule picks it.
    fn inspect_request(&self, frame: &[u8], doomed: &Doomed) {
        let (Some(xid), Some(opcode)) = (be_i32(frame, 4), be_i32(frame, 8)) else {
            return;
        };
        let raw_path_len = be_i32(frame, 12);
        let path_len = raw_path_len.and_then(|len| usize::try_from(len).ok());
        {
            let watch_flag = path_len
                .and_then(|len| frame.get(16 + len))
                .is_some_and(|&flag| flag != 0);
            let mut counts = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
            *counts.requests.entry(opcode).or_insert(0) += 1;
            if opcode == ZK_ADD_WATCH || (ZK_WATCHING_READS.contains(&opcode) && watch_flag) {
                counts.watches_set += 1;
            }
        }
        if raw_path_len.is_none() {
            return;
        }
        let path = path_len
            .and_then(|len| frame.get(16..16 + len))
            .map(String::from_utf8_lossy)
            .unwrap_or_default();
        let mut losses = self.losses.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(rule) = losses
            .iter_mut()
            .find(|l| l.remaining > 0 && l.opcodes.contains(&opcode) && path.starts_with(&l.path_prefix))
        {
            rule.remaining -= 1;
            doomed
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push((xid, rule.fail_with));
        }
    }

    /// What to do with a server response frame: `None` to pass it on,
    /// `Some(None)` to lose it, `Some(Some(code))` to answer with an error.
    fn doom(frame: &[u8], doomed: &Doomed) -> Option<Option<i32>> {
        let xid = be_i32(frame, 4)?;
        let mut doomed = doomed.lock().unwrap_or_else(PoisonError::into_inner);
        let at = doomed.iter().position(|(x, _)| *x == xid)?;
        Some(doomed.swap_remove(at).1)
    }
}

/// How often a pipe looks at the proxy's switches while nothing arrives.
const TICK: Duration = Duration::from_millis(5);

#[derive(Clone, Copy, PartialEq, Eq)]
enum Direction {
    /// Client to server.
    Requests,
    /// Server to client.
    Responses,
}

impl Shared {
    /// Counts kept bytes, holding `ends` whole HTTP/2 requests, as gone on.
    fn unkeep(&self, direction: Direction, n: usize, ends: usize) {
        if direction == Direction::Requests {
            let _ = self
                .held_request_bytes
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |held| Some(held.saturating_sub(n)));
            let _ = self
                .held_request_ends
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |held| {
                    Some(held.saturating_sub(ends))
                });
        }
    }

    /// Whether bytes going this way on `link` must be kept back for now.
    fn holds(&self, direction: Direction, link: &Link) -> bool {
        if self.blackholed.load(Ordering::SeqCst) || self.is_frozen(link.number) {
            return true;
        }
        if direction == Direction::Responses
            && self
                .answers_frozen
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .contains(&link.number)
        {
            return true;
        }
        direction == Direction::Requests
            && if link.orphaned.load(Ordering::SeqCst) {
                !self.orphans_delivered.load(Ordering::SeqCst)
            } else {
                self.requests_held.load(Ordering::SeqCst)
            }
    }
}

/// Copies `from` to `to`, keeping bytes back while the proxy holds this
/// direction and dropping the server's answers while told to.
fn pipe(
    mut from: TcpStream,
    mut to: TcpStream,
    shared: Arc<Shared>,
    link: Arc<Link>,
    direction: Direction,
    doomed: Doomed,
) {
    let _ = from.set_read_timeout(Some(TICK));
    let mut buf = [0u8; 16 * 1024];
    let mut kept: Vec<u8> = Vec::new();
    // Whole HTTP/2 requests in `kept`.
    let mut kept_ends = 0;
    let mut h2 = H2Ends::default();
    let mut frames = Frames::default();
    // Whether `from` ended (rather than a write to `to` failing).
    let mut from_ended = false;
    loop {
        if !kept.is_empty() && !shared.holds(direction, &link) {
            if to.write_all(&kept).is_err() {
                break;
            }
            shared.unkeep(direction, kept.len(), kept_ends);
            kept.clear();
            kept_ends = 0;
        }
        match from.read(&mut buf) {
            Ok(0) => {
                from_ended = true;
                break;
            }
            Ok(n) => {
                if direction == Direction::Responses && shared.drop_responses.load(Ordering::SeqCst) {
                    continue;
                }
                if direction == Direction::Responses && link.orphaned.load(Ordering::SeqCst) {
                    shared.orphan_answers.fetch_add(n, Ordering::SeqCst);
                    continue;
                }
                let mut chunk = &buf[..n];
                let replaced;
                if shared.zookeeper {
                    match zk_frames(&shared, &mut frames, chunk, direction, &doomed) {
                        Some(out) => {
                            replaced = out;
                            chunk = &replaced;
                        }
                        // The request was applied; its answer never arrives
                        // and the connection dies with it.
                        None => break,
                    }
                }
                let ends = if direction == Direction::Requests {
                    h2.push(chunk)
                } else {
                    0
                };
                if shared.holds(direction, &link) || !kept.is_empty() {
                    kept.extend_from_slice(chunk);
                    kept_ends += ends;
                    if direction == Direction::Requests {
                        shared.held_request_bytes.fetch_add(chunk.len(), Ordering::SeqCst);
                        shared.held_request_ends.fetch_add(ends, Ordering::SeqCst);
                    }
                } else if to.write_all(chunk).is_err() && !link.orphaned.load(Ordering::SeqCst) {
                    break;
                }
            }
            Err(e)
                if matches!(
                    e.kind(),
                    ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted
                ) =>
            {
                if shared.stopped.load(Ordering::SeqCst) {
                    break;
                }
            }
            Err(_) => {
                from_ended = true;
                break;
            }
        }
    }
    if direction == Direction::Requests && from_ended {
        link.client_closed.store(true, Ordering::SeqCst);
    }
    // A peer that closed while the proxy was blackholed is not heard of
    // until the partition heals; what was held for the server still reaches
    // it when released.
    while shared.holds(direction, &link) && !shared.stopped.load(Ordering::SeqCst) {
        thread::sleep(TICK);
    }
    if !kept.is_empty() {
        let _ = to.write_all(&kept);
        shared.unkeep(direction, kept.len(), kept_ends);
    }
    if direction == Direction::Requests && link.orphaned.load(Ordering::SeqCst) {
        // The server keeps its end until the proxy is dropped.
        return;
    }
    let _ = from.shutdown(Shutdown::Both);
    let _ = to.shutdown(Shutdown::Both);
}

/// Follows ZooKeeper's framing through one chunk: requests are inspected for
/// the loss rules; responses are passed on frame by frame, one to lose making
/// it `None`, one to fail replaced by an error header.
fn zk_frames(
    shared: &Shared,
    frames: &mut Frames,
    chunk: &[u8],
    direction: Direction,
    doomed: &Doomed,
) -> Option<Vec<u8>> {
    if direction == Direction::Requests {
        for frame in frames.push(chunk) {
            frames.seen += 1;
            if frames.seen > 1 {
                // (the first frame is the connect handshake)
                shared.inspect_request(&frame, doomed);
            }
        }
        return Some(chunk.to_vec());
    }
    let mut out = Vec::with_capacity(chunk.len());
    for frame in frames.push(chunk) {
        frames.seen += 1;
        if frames.seen > 1 && be_i32(&frame, 4) == Some(-1) {
            shared.counts.lock().unwrap_or_else(PoisonError::into_inner).events += 1;
        }
        match (frames.seen > 1).then(|| Shared::doom(&frame, doomed)).flatten() {
            None => out.extend_from_slice(&frame),
            Some(Some(code)) => {
                // Header only: length 16, xid, zxid, error code.
                out.extend_from_slice(&16i32.to_be_bytes());
                out.extend_from_slice(&frame[4..16]);
                out.extend_from_slice(&code.to_be_bytes());
            }
            Some(None) => return None,
        }
    }
    Some(out)
}
