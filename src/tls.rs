//! TLS settings for a backend's connections.

use std::fmt;
use std::path::Path;

use crate::{Error, Result};

/// TLS settings for a backend's connections, the same for etcd and ZooKeeper:
/// the CA that signed the servers' certificates and, for servers that ask
/// for one, a client certificate and its private key. All PEM.
///
/// ```
/// # fn demo(ca: &str, cert: &str, key: &str) -> lockline::Result<()> {
/// use lockline::Tls;
///
/// // From files, as etcdctl's --cacert, --cert and --key name them:
/// let tls = Tls::new()
///     .with_ca_file("/etc/etcd/ca.pem")?
///     .with_client_files("/etc/etcd/client.pem", "/etc/etcd/client-key.pem")?;
/// // Or from PEM text you already hold:
/// let tls = Tls::new().with_ca_pem(ca).with_client_pem(cert, key);
/// # Ok(()) }
/// ```
///
/// The private key never appears in `Debug` output or in an error.
#[derive(Clone, Default)]
pub struct Tls {
    ca: Option<String>,
    client: Option<(String, Secret)>,
}

impl fmt::Debug for Tls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tls")
            .field("ca", &self.ca.as_ref().map(|_| "<PEM>"))
            .field("client_cert", &self.client.as_ref().map(|_| "<PEM>"))
            .field("client_key", &self.client.as_ref().map(|(_, key)| key))
            .finish()
    }
}

impl Tls {
    /// No CA and no client certificate yet.
    pub fn new() -> Self {
        Tls::default()
    }

    /// Trusts the CA certificates in this PEM text (one or more).
    pub fn with_ca_pem(mut self, pem: impl Into<String>) -> Self {
        self.ca = Some(pem.into());
        self
    }

    /// Trusts the CA certificates in this PEM file.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidOptions`] naming the file when it cannot be read.
    pub fn with_ca_file(self, path: impl AsRef<Path>) -> Result<Self> {
        Ok(self.with_ca_pem(read("CA certificate", path.as_ref())?))
    }

    /// Presents this client certificate (PEM, with any intermediates after
    /// it) and proves it with this private key (PEM, PKCS#8, PKCS#1 or SEC1).
    pub fn with_client_pem(mut self, cert: impl Into<String>, key: impl Into<String>) -> Self {
        self.client = Some((cert.into(), Secret(key.into())));
        self
    }

    /// Presents the client certificate and private key in these PEM files.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidOptions`] naming the file that cannot be read.
    pub fn with_client_files(self, cert: impl AsRef<Path>, key: impl AsRef<Path>) -> Result<Self> {
        let cert = read("client certificate", cert.as_ref())?;
        let key = read("client key", key.as_ref())?;
        Ok(self.with_client_pem(cert, key))
    }

    /// The trusted CA certificates (PEM), if set.
    pub fn ca_pem(&self) -> Option<&str> {
        self.ca.as_deref()
    }

    /// The client certificate and private key (PEM), if set.
    pub fn client_pem(&self) -> Option<(&str, &str)> {
        self.client.as_ref().map(|(cert, key)| (cert.as_str(), key.0.as_str()))
    }
}

/// A password or private key: kept whole, shown as `<redacted>`.
#[derive(Clone, PartialEq, Eq)]
struct Secret(String);

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

fn read(what: &str, path: &Path) -> Result<String> {
    std::fs::read_to_string(path).map_err(|error| Error::InvalidOptions {
        reason: format!("cannot read the {what} {}: {error}", path.display()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_output_never_shows_the_key() {
        let tls = Tls::new()
            .with_ca_pem("CA-PEM")
            .with_client_pem("CERT-PEM", "-----BEGIN PRIVATE KEY-----\nSECRETBYTES");
        let shown = format!("{tls:?} {tls:#?}");
        assert!(!shown.contains("SECRETBYTES"), "{shown}");
        assert!(!shown.contains("CA-PEM") && !shown.contains("CERT-PEM"), "{shown}");
        assert!(shown.contains("<redacted>"), "{shown}");
        assert_eq!(
            tls.client_pem(),
            Some(("CERT-PEM", "-----BEGIN PRIVATE KEY-----\nSECRETBYTES"))
        );
    }

    #[test]
    fn a_missing_file_is_an_options_error_naming_it() {
        let error = Tls::new().with_ca_file("/nonexistent/ca.pem").unwrap_err();
        assert!(matches!(error, Error::InvalidOptions { .. }), "{error:?}");
        assert!(error.to_string().contains("/nonexistent/ca.pem"), "{error}");
    }
}
