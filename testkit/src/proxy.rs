use std::fmt;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread;

use crate::Result;

/// A TCP proxy on a free loopback port in front of one server, for network
/// faults without `netem`: [`block`](Self::block) cuts every connection and
/// refuses new ones until [`unblock`](Self::unblock).
pub struct TcpProxy {
    address: SocketAddr,
    shared: Arc<Shared>,
}

struct Shared {
    target: SocketAddr,
    blocked: AtomicBool,
    drop_responses: AtomicBool,
    stopped: AtomicBool,
    connections: Mutex<Vec<TcpStream>>,
}

impl fmt::Debug for TcpProxy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TcpProxy")
            .field("address", &self.address)
            .field("target", &self.shared.target)
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
        let target: SocketAddr = target.parse().map_err(std::io::Error::other)?;
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let address = listener.local_addr()?;
        let shared = Arc::new(Shared {
            target,
            blocked: AtomicBool::new(false),
            drop_responses: AtomicBool::new(false),
            stopped: AtomicBool::new(false),
            connections: Mutex::default(),
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
        let Ok(server) = TcpStream::connect(shared.target) else {
            let _ = client.shutdown(Shutdown::Both);
            continue;
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
            continue;
        };
        {
            let mut connections = shared.connections.lock().unwrap_or_else(PoisonError::into_inner);
            connections.retain(|s| s.peer_addr().is_ok());
            connections.push(client);
            connections.push(server);
        }
        thread::spawn(move || pipe(client_read, server_write, None));
        let drop_flag = Arc::clone(&shared);
        thread::spawn(move || pipe(server_read, client_write, Some(drop_flag)));
    }
}

/// Copies `from` to `to`; for the server's side, `responses` can say to drop.
fn pipe(mut from: TcpStream, mut to: TcpStream, responses: Option<Arc<Shared>>) {
    let mut buf = [0u8; 16 * 1024];
    loop {
        match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if responses
                    .as_ref()
                    .is_some_and(|s| s.drop_responses.load(Ordering::SeqCst))
                {
                    continue;
                }
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
        }
    }
    let _ = from.shutdown(Shutdown::Both);
    let _ = to.shutdown(Shutdown::Both);
}
