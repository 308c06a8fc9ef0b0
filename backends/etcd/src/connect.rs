//! Connecting to etcd: one client per set of connection settings, made
//! by the first session that needs it, and the checks of endpoints and
//! TLS material that come before any connection.

use std::collections::HashMap;
use std::sync::{Arc, PoisonError};
use std::time::Duration;

use lockline::{Error, Result, SessionOptions};
use tokio::sync::OnceCell;

use crate::{error, Etcd};

/// One lazily connected client per connection setting.
pub(crate) type Clients = HashMap<Option<Connection>, Arc<OnceCell<etcd_client::Client>>>;

/// The session options a connection is built from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Connection {
    connect_timeout: Duration,
    request_timeout: Duration,
    keepalive_interval: Duration,
}

impl Connection {
    fn of(options: &SessionOptions) -> Self {
        Connection {
            connect_timeout: options.connect_timeout(),
            request_timeout: options.request_timeout(),
            keepalive_interval: options.keepalive_interval(),
        }
    }

    fn options(self) -> etcd_client::ConnectOptions {
        etcd_client::ConnectOptions::new()
            .with_connect_timeout(self.connect_timeout)
            .with_timeout(self.request_timeout)
            .with_keep_alive(self.keepalive_interval, self.request_timeout)
            .with_keep_alive_while_idle(true)
            .with_require_leader(true)
    }
}

impl Etcd {
    fn user_name(&self) -> Option<&str> {
        self.user.as_ref().map(|user| user.name.as_str())
    }

    /// TLS and `https://` go together: a mismatch is refused before any
    /// connection, with a message saying which endpoint and what to change.
    fn check_schemes(&self) -> Result<()> {
        for endpoint in &self.endpoints {
            let shown = shown(endpoint);
            if let Some(problem) = endpoint_problem(endpoint) {
                return Err(Error::InvalidOptions {
                    reason: format!("etcd endpoint {shown:?}: {problem}"),
                });
            }
            let https = endpoint.starts_with("https://");
            if self.tls.is_some() && !https {
                return Err(Error::InvalidOptions {
                    reason: format!("TLS is configured but the endpoint {shown:?} is not https://"),
                });
            }
            if self.tls.is_none() && https {
                return Err(Error::InvalidOptions {
                    reason: format!(
                        "the endpoint {shown:?} is https:// but no CA is configured: use Etcd::with_tls (--cacert)"
                    ),
                });
            }
        }
        Ok(())
    }

    pub(crate) async fn client(&self, options: &SessionOptions) -> Result<etcd_client::Client> {
        let cell = {
            let mut clients = self.clients.lock().unwrap_or_else(PoisonError::into_inner);
            let key = match clients.get(&None) {
                Some(_) => None,
                None if self.connect.is_some() => None,
                None => Some(Connection::of(options)),
            };
            Arc::clone(clients.entry(key).or_default())
        };
        let client = cell
            .get_or_try_init(|| async {
                if self.endpoints.is_empty() {
                    return Err(Error::InvalidOptions {
                        reason: "no etcd endpoint given".into(),
                    });
                }
                let mut connect = self
                    .connect
                    .clone()
                    .unwrap_or_else(|| Connection::of(options).options());
                if let Some(tls) = &self.tls {
                    connect = connect.with_tls(tls_options(tls)?);
                }
                if let Some(user) = &self.user {
                    // etcd forgets a simple token unused for --auth-token-ttl
                    // (5 minutes by default): a lock held or waited for longer
                    // must authenticate again, not fail its release.
                    connect = connect
                        .with_user(user.name.clone(), user.password.clone())
                        .with_auto_token_refresh(true);
                }
                self.check_schemes()?;
                let connecting = etcd_client::Client::connect(&self.endpoints, Some(connect));
                // Connecting authenticates when a user is set: bound it by
                // the connect timeout too, as a silent server must not hang it.
                match tokio::time::timeout(options.connect_timeout() + options.request_timeout(), connecting).await {
                    Ok(connected) => connected
                        .map_err(|e| error::map_connect(e, self.tls.as_ref(), self.user_name(), &self.endpoints)),
                    Err(_) => Err(error::unreachable(&self.endpoints, self.tls.is_some())),
                }
            })
            .await?;
        Ok(client.clone())
    }
}

/// An endpoint as messages show it: a user and password written into the
/// URL (`https://user:secret@host:2379`) become `***`.
pub(crate) fn shown(endpoint: &str) -> String {
    let (scheme, rest) = endpoint.split_once("://").unwrap_or(("", endpoint));
    let authority_end = rest.find('/').unwrap_or(rest.len());
    match rest[..authority_end].rfind('@') {
        Some(at) if scheme.is_empty() => format!("***@{}", &rest[at + 1..]),
        Some(at) => format!("{scheme}://***@{}", &rest[at + 1..]),
        None => endpoint.to_owned(),
    }
}

/// What is wrong with an endpoint, checked before any connection: etcd's
/// client would read a port out of range or a missing port as another port
/// (`http://host:99999` as port 80) instead of refusing it.
fn endpoint_problem(endpoint: &str) -> Option<String> {
    let rest = match endpoint.split_once("://") {
        Some(("http" | "https", rest)) => rest,
        Some((scheme, _)) => return Some(format!("unknown scheme {scheme:?}; use http:// or https://")),
        None => endpoint,
    };
    let authority = rest.strip_suffix('/').unwrap_or(rest);
    if authority.split('/').next().is_some_and(|host| host.contains('@')) {
        return Some("a user or password in the URL is not used; give them with Etcd::with_user (--user)".into());
    }
    if authority.contains('/') {
        return Some("an endpoint is http[s]://HOST:PORT, without a path".into());
    }
    let Some((host, port)) = authority.rsplit_once(':') else {
        return Some("no port; an endpoint is http[s]://HOST:PORT (etcd listens on 2379)".into());
    };
    if host.is_empty() || host.ends_with(':') {
        return Some("no host; an endpoint is http[s]://HOST:PORT".into());
    }
    let host_ok = match host.strip_prefix('[') {
        Some(inner) => inner
            .strip_suffix(']')
            .is_some_and(|ip| ip.parse::<std::net::Ipv6Addr>().is_ok()),
        None => host
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_')),
    };
    if !host_ok {
        return Some(format!(
            "{host:?} is not a host name or address (an IPv6 address goes in brackets: http://[::1]:2379)"
        ));
    }
    match port.parse::<u16>() {
        Ok(port) if port > 0 => None,
        _ => Some(format!("{port:?} is not a port number (1 to 65535)")),
    }
}

/// The etcd-client TLS options for `tls`.
fn tls_options(tls: &lockline::Tls) -> Result<etcd_client::TlsOptions> {
    let ca = tls.ca_pem().ok_or_else(|| Error::InvalidOptions {
        reason: "TLS needs the CA that signed the servers' certificates (Tls::with_ca_pem, --cacert)".into(),
    })?;
    check_pem("CA certificate", ca, &["CERTIFICATE"])?;
    let mut options = etcd_client::TlsOptions::new().ca_certificate(etcd_client::Certificate::from_pem(ca));
    if let Some((cert, key)) = tls.client_pem() {
        check_pem("client certificate", cert, &["CERTIFICATE"])?;
        check_pem("client key", key, &["PRIVATE KEY", "RSA PRIVATE KEY", "EC PRIVATE KEY"])?;
        options = options.identity(etcd_client::Identity::from_pem(cert, key));
    }
    Ok(options)
}

/// Refuses text without a PEM block of one of these labels (the TLS stack
/// would only say so at the handshake, as an opaque transport error). Never
/// quotes the text: it may be a private key.
fn check_pem(what: &str, pem: &str, labels: &[&str]) -> Result<()> {
    let found = labels
        .iter()
        .any(|label| pem.contains(&format!("-----BEGIN {label}-----")));
    if found {
        Ok(())
    } else {
        Err(Error::InvalidOptions {
            reason: format!("the {what} is not PEM (no -----BEGIN {}----- block)", labels[0]),
        })
    }
}
