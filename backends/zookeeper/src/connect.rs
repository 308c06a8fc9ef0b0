//! Opening a ZooKeeper session with the backend's TLS and credentials, and
//! telling a TLS failure apart from an unreachable ensemble.
//!
//! zookeeper-client retries a failed handshake quietly until its own session
//! deadline and then reports only a timeout. So lockline gives it most of the
//! connect timeout and, if no session came, spends the rest on one TLS
//! handshake of its own with each server it can reach: whatever that
//! handshake reports becomes the error's source.

use std::fmt;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::time::{Duration, Instant};

use lockline::{Error, Result, SessionOptions, Tls};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use zookeeper_client::{Client, Error as ZkError, SaslOptions, SessionInfo, TlsOptions};

use crate::error::{map, BACKEND};
use crate::ZooKeeper;

/// How much of the connect timeout is kept for finding out why no session came.
fn diagnosis_budget(connect_timeout: Duration) -> Duration {
    (connect_timeout / 4).min(Duration::from_secs(1))
}

/// Opens a ZooKeeper session as `backend` is configured, within the connect
/// timeout.
pub(crate) async fn connect(backend: &ZooKeeper, options: &SessionOptions) -> Result<Client> {
    connect_to(backend, options, None).await
}

/// Closes the ZooKeeper session `session` on the server from a connection of
/// its own: attaching to it and letting go sends `closeSession`, which makes
/// the server delete the session's ephemeral nodes whatever their ACLs, and
/// whatever copies of the session's first client are still held somewhere.
///
/// Returns whether the server confirmed that the session is gone.
pub(crate) async fn close_remotely(backend: ZooKeeper, options: SessionOptions, session: SessionInfo) -> bool {
    let id = format!("{:x}", session.id().0);
    // The first client, if a copy of it is still alive, reconnects and takes
    // the session back: attach until the server says the session is gone,
    // a bounded number of times (the session expires by itself anyway once
    // nothing renews it).
    for _ in 0..CLOSE_TRIES {
        match connect_to(&backend, &options, Some(session.clone())).await {
            Ok(client) => {
                tracing::debug!(session = %id, "closing a given-up ZooKeeper session from a second connection");
                drop(client);
            }
            Err(Error::SessionLost { .. }) => {
                tracing::debug!(session = %id, "given-up ZooKeeper session closed");
                return true;
            }
            Err(error) => {
                tracing::debug!(session = %id, %error, "attaching to a given-up ZooKeeper session failed");
            }
        }
    }
    tracing::warn!(session = %id, "could not confirm that the ZooKeeper session was closed; it expires unrenewed");
    false
}

/// The shortest time the client library is given to connect to one server.
const MIN_CONNECTION_TIMEOUT: Duration = Duration::from_millis(500);

/// How many times [`close_remotely`] attaches to a session.
const CLOSE_TRIES: usize = 10;

async fn connect_to(backend: &ZooKeeper, options: &SessionOptions, session: Option<SessionInfo>) -> Result<Client> {
    // The client library tries the servers one after the other, each for
    // the connection timeout: a silent one (a partition, a stopped VM) must
    // not use up the whole connect deadline before the next is tried.
    let servers = u32::try_from(endpoints(&backend.connect).len()).unwrap_or(1).max(1);
    let per_server = (options.connect_timeout() / servers)
        .max(MIN_CONNECTION_TIMEOUT)
        .min(options.connect_timeout());
    let mut connector = Client::connector()
        .with_session_timeout(options.ttl())
        .with_connection_timeout(per_server);
    if let Some(session) = session {
        connector = connector.with_session(session);
    }
    let tls_config = match &backend.tls {
        Some(tls) => {
            install_crypto_provider();
            connector = connector.with_tls(tls_options(tls)?);
            Some(rustls_config(tls)?)
        }
        None => None,
    };
    if let Some(digest) = &backend.digest {
        connector = connector.with_auth("digest", format!("{}:{}", digest.user, digest.password).as_bytes());
    }
    if let Some(sasl) = &backend.sasl {
        connector = connector.with_sasl(SaslOptions::digest_md5(sasl.user.clone(), sasl.password.clone()));
    }
    let budget = options.connect_timeout();
    let reserve = diagnosis_budget(budget);
    // Every server refusing connections outright is known at once: say so
    // now instead of letting the client library retry for the whole budget.
    let servers = endpoints(&backend.connect);
    let probe = servers.clone();
    let probe_budget = reserve.min(Duration::from_millis(300));
    if let Ok(Ok(Some(refused))) = tokio::time::timeout(
        reserve,
        tokio::task::spawn_blocking(move || all_refuse(&probe, probe_budget)),
    )
    .await
    {
        return Err(Error::unavailable(
            BACKEND,
            format!("no session with {refused}: connection refused"),
        ));
    }
    let connecting = async {
        if tls_config.is_some() {
            connector.secure_connect(&backend.connect).await
        } else {
            connector.connect(&backend.connect).await
        }
    };
    let failure = match tokio::time::timeout(budget.saturating_sub(reserve), connecting).await {
        Ok(Ok(client)) => return Ok(client),
        Ok(Err(ZkError::AuthFailed)) => return Err(authentication_failed(backend)),
        Ok(Err(error @ (ZkError::Timeout | ZkError::ConnectionLoss | ZkError::NoHosts))) => Some(error),
        Ok(Err(ZkError::BadArguments(what))) => {
            return Err(Error::InvalidOptions {
                reason: format!("ZooKeeper connect string {:?}: {what}", backend.connect),
            })
        }
        Ok(Err(error)) => return Err(map(error, "(connecting)")),
        Err(_) => None,
    };
    let servers_text = backend.connect.split('/').next().unwrap_or_default().to_owned();
    let probing = tokio::task::spawn_blocking(move || diagnose(&servers, tls_config, reserve));
    if let Ok(Ok(Some(tls))) = tokio::time::timeout(reserve, probing).await {
        tracing::debug!(error = %tls, "no ZooKeeper session: TLS failed");
        return Err(Error::unavailable_because(
            BACKEND,
            format!("connecting to {servers_text}"),
            tls,
        ));
    }
    Err(match failure {
        Some(error) => Error::unavailable_because(
            BACKEND,
            format!(
                "no session with {servers_text} within {:?}",
                budget.saturating_sub(reserve)
            ),
            error,
        ),
        None => Error::unavailable(
            BACKEND,
            format!(
                "no session with {servers_text} within {:?}",
                budget.saturating_sub(reserve)
            ),
        ),
    })
}

fn authentication_failed(backend: &ZooKeeper) -> Error {
    let reason = match &backend.sasl {
        Some(sasl) => format!("the server rejected the SASL DIGEST-MD5 login of user {:?}", sasl.user),
        None => "the server rejected the session's credentials (AuthFailed)".to_owned(),
    };
    Error::AuthenticationFailed {
        backend: BACKEND,
        reason,
    }
}

/// zookeeper-client builds its rustls configuration with the process's
/// default crypto provider, and panics if none can be chosen.
fn install_crypto_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Another thread may have installed one meanwhile: fine either way.
        let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    }
}

fn invalid(reason: &str) -> Error {
    Error::InvalidOptions {
        reason: format!("ZooKeeper TLS: {reason}"),
    }
}

/// zookeeper-client's TLS options. Its parse errors are not passed on: they
/// could quote the key.
fn tls_options(tls: &Tls) -> Result<TlsOptions> {
    let ca = tls
        .ca_pem()
        .ok_or_else(|| invalid("no CA certificate to verify the servers with (Tls::with_ca_pem or with_ca_file)"))?;
    let mut options = TlsOptions::new()
        .with_pem_ca(ca)
        .map_err(|_| invalid("the CA PEM holds no valid certificate"))?;
    if let Some((cert, key)) = tls.client_pem() {
        options = options
            .with_pem_identity(cert, key)
            .map_err(|_| invalid("the client certificate or private key is not valid PEM"))?;
    }
    Ok(options)
}

/// The same trust and identity as a rustls configuration, for the diagnosing
/// handshake. Also validates the PEM before any connection is tried.
fn rustls_config(tls: &Tls) -> Result<Arc<rustls::ClientConfig>> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in pem_certs(tls.ca_pem().unwrap_or_default(), "CA")? {
        roots
            .add(cert)
            .map_err(|_| invalid("the CA certificate cannot be used as a trust anchor"))?;
    }
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|_| invalid("no TLS protocol version available"))?
        .with_root_certificates(roots);
    let config = match tls.client_pem() {
        Some((cert, key)) => {
            let certs = pem_certs(cert, "client")?;
            let key = PrivateKeyDer::from_pem_slice(key.as_bytes())
                .map_err(|_| invalid("the client private key is not valid PEM (PKCS#8, PKCS#1 or SEC1)"))?;
            builder
                .with_client_auth_cert(certs, key)
                .map_err(|_| invalid("the client private key does not fit its certificate"))?
        }
        None => builder.with_no_client_auth(),
    };
    Ok(Arc::new(config))
}

fn pem_certs(pem: &str, what: &str) -> Result<Vec<CertificateDer<'static>>> {
    let certs: Vec<_> = CertificateDer::pem_slice_iter(pem.as_bytes())
        .collect::<std::result::Result<_, _>>()
        .map_err(|_| invalid(&format!("the {what} certificate PEM does not parse")))?;
    if certs.is_empty() {
        return Err(invalid(&format!("no {what} certificate in the PEM")));
    }
    Ok(certs)
}

/// Why a server's TLS port did not give a session: the error source of an
/// [`Error::Unavailable`].
#[derive(Debug)]
pub(crate) enum TlsFailure {
    /// lockline speaks TLS, and the handshake failed.
    Handshake { server: String, reason: String },
    /// lockline speaks plain text to a server that speaks TLS.
    PlainTextToTls { server: String },
}

impl fmt::Display for TlsFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TlsFailure::Handshake { server, reason } => write!(f, "TLS handshake with {server} failed: {reason}"),
            TlsFailure::PlainTextToTls { server } => write!(
                f,
                "{server} expects TLS (a secureClientPort) but this client speaks plain text; \
                 configure ZooKeeper::with_tls"
            ),
        }
    }
}

impl std::error::Error for TlsFailure {}

/// `host:port` of each server in a connect string (`[tcp://|tcp+tls://]host:port,...[/chroot]`).
fn endpoints(connect: &str) -> Vec<String> {
    servers(connect)
        .into_iter()
        .filter(|server| !server.is_empty())
        .collect()
}

/// The chroot of a connect string (`/apps` in `h1:2181,h2:2181/apps`), if it
/// has one: it starts at the first '/' that is not part of a `tcp://` or
/// `tcp+tls://` scheme.
pub(crate) fn chroot(connect: &str) -> Option<&str> {
    let after_schemes = connect.rfind("://").map_or(0, |at| at + 3);
    connect[after_schemes..]
        .find('/')
        .map(|at| &connect[after_schemes + at..])
}

/// The `host:port` of each server in a connect string, without the
/// `tcp://` or `tcp+tls://` zookeeper-client accepts before each, nor the
/// chroot; an empty server stays in, for the caller to refuse.
pub(crate) fn servers(connect: &str) -> Vec<String> {
    let hosts = match connect.find('/') {
        // A chroot starts at the first '/' not part of a scheme.
        _ if connect.contains("://") => connect,
        Some(at) => &connect[..at],
        None => connect,
    };
    hosts
        .split(',')
        .map(|server| {
            let server = server.trim();
            let server = server
                .strip_prefix("tcp+tls://")
                .or_else(|| server.strip_prefix("tcp://"))
                .unwrap_or(server);
            server.split('/').next().unwrap_or_default().to_owned()
        })
        .collect()
}

/// One TLS handshake with each reachable server, within `budget`: the first
/// TLS failure found. A server that cannot be reached at all says nothing
/// about TLS.
fn diagnose(servers: &[String], config: Option<Arc<rustls::ClientConfig>>, budget: Duration) -> Option<TlsFailure> {
    let deadline = Instant::now() + budget;
    for server in servers {
        let Some(address) = server.to_socket_addrs().ok().and_then(|mut all| all.next()) else {
            continue;
        };
        let host = server.rsplit_once(':').map_or(server.as_str(), |(host, _)| host);
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let found = match &config {
            Some(config) => {
                handshake(address, host, Arc::clone(config), deadline).map(|reason| TlsFailure::Handshake {
                    server: server.clone(),
                    reason,
                })
            }
            None => speaks_tls(address, host, deadline).then(|| TlsFailure::PlainTextToTls { server: server.clone() }),
        };
        if found.is_some() {
            return found;
        }
    }
    None
}

/// The servers, as a message names them, when every one of them refuses a
/// TCP connection (nothing listens there); `None` when any accepts, does
/// not answer within `budget`, or cannot be resolved.
fn all_refuse(servers: &[String], budget: Duration) -> Option<String> {
    if servers.is_empty() {
        return None;
    }
    for server in servers {
        let address = server.to_socket_addrs().ok()?.next()?;
        match TcpStream::connect_timeout(&address, budget) {
            Err(error) if error.kind() == std::io::ErrorKind::ConnectionRefused => {}
            _ => return None,
        }
    }
    Some(servers.join(","))
}

fn remaining(deadline: Instant) -> Option<Duration> {
    deadline
        .checked_duration_since(Instant::now())
        .filter(|left| !left.is_zero())
}

fn open(address: SocketAddr, deadline: Instant) -> Option<TcpStream> {
    let stream = TcpStream::connect_timeout(&address, remaining(deadline)?).ok()?;
    stream.set_read_timeout(remaining(deadline)).ok()?;
    stream.set_write_timeout(remaining(deadline)).ok()?;
    Some(stream)
}

/// Runs a TLS handshake with `config`; `Some(reason)` when the server or the
/// client refused it. After the handshake, waits briefly for a refusal that
/// TLS 1.3 servers send only then (a client certificate checked after the
/// client's last handshake message).
fn handshake(address: SocketAddr, host: &str, config: Arc<rustls::ClientConfig>, deadline: Instant) -> Option<String> {
    let mut stream = open(address, deadline)?;
    let name = ServerName::try_from(host.to_owned()).ok()?;
    let mut tls = rustls::ClientConnection::new(config, name).ok()?;
    while tls.is_handshaking() {
        if let Err(error) = tls.complete_io(&mut stream) {
            return describe(&error);
        }
    }
    stream
        .set_read_timeout(remaining(deadline).map(|left| left.min(Duration::from_millis(300))))
        .ok()?;
    let mut byte = [0u8; 1];
    match rustls::Stream::new(&mut tls, &mut stream).read(&mut byte) {
        Err(error) => describe(&error),
        // Data or a clean close: the handshake itself was accepted.
        Ok(0 | 1..) => None,
    }
}

/// What a failed handshake step says, if it is about TLS (a timeout is not).
fn describe(error: &std::io::Error) -> Option<String> {
    use std::io::ErrorKind;
    match error.kind() {
        ErrorKind::WouldBlock | ErrorKind::TimedOut => None,
        ErrorKind::UnexpectedEof | ErrorKind::ConnectionReset | ErrorKind::ConnectionAborted => Some(
            "the server closed the connection during the handshake (is this a TLS port, and does it want a client \
             certificate?)"
                .to_owned(),
        ),
        _ => match error.get_ref().and_then(|inner| inner.downcast_ref::<rustls::Error>()) {
            Some(tls) => Some(tls.to_string()),
            None => Some(error.to_string()),
        },
    }
}

/// Whether the server answers a TLS client hello with TLS (a certificate or
/// an alert), as a `secureClientPort` does; a plain port closes instead.
fn speaks_tls(address: SocketAddr, host: &str, deadline: Instant) -> bool {
    let Some(mut stream) = open(address, deadline) else {
        return false;
    };
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let Ok(builder) = rustls::ClientConfig::builder_with_provider(provider).with_safe_default_protocol_versions()
    else {
        return false;
    };
    let config = builder
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth();
    let Ok(name) = ServerName::try_from(host.to_owned()) else {
        return false;
    };
    let Ok(mut tls) = rustls::ClientConnection::new(Arc::new(config), name) else {
        return false;
    };
    while tls.is_handshaking() {
        if let Err(error) = tls.complete_io(&mut stream) {
            // Trusting no CA, the handshake fails on the server's certificate,
            // or the server alerts: either way it spoke TLS.
            return matches!(
                error.get_ref().and_then(|inner| inner.downcast_ref::<rustls::Error>()),
                Some(rustls::Error::InvalidCertificate(_) | rustls::Error::AlertReceived(_))
            );
        }
    }
    let _ = stream.flush();
    true
}

/// ZooKeeper's digest identity for `user` and `password`:
/// `user:base64(sha1(user:password))`, what `addauth digest user:password`
/// authenticates as.
pub(crate) fn digest_id(user: &str, password: &str) -> String {
    use base64::Engine as _;
    let hash = aws_lc_rs::digest::digest(
        &aws_lc_rs::digest::SHA1_FOR_LEGACY_USE_ONLY,
        format!("{user}:{password}").as_bytes(),
    );
    format!(
        "{user}:{}",
        base64::engine::general_purpose::STANDARD.encode(hash.as_ref())
    )
}
