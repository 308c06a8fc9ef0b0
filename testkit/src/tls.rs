//! Certificates made for one test run with Debian's `openssl`: a CA, server
//! and client certificates signed by it, in a temporary directory deleted on
//! drop. Nothing is committed, so nothing expires in the repository.

use std::fmt;
use std::io::Error;
use std::path::{Path, PathBuf};
use std::process::Command;

use tempfile::TempDir;

use crate::Result;

const OPENSSL: &str = "openssl";

/// How long the certificates made here stay valid.
const DAYS: &str = "2";

/// A certificate and its private key (PKCS#8, P-256), as PEM files.
#[derive(Debug, Clone)]
pub struct Issued {
    /// The certificate (PEM).
    pub cert: PathBuf,
    /// Its private key (PEM, unencrypted PKCS#8).
    pub key: PathBuf,
}

impl Issued {
    /// The certificate's PEM text.
    ///
    /// # Errors
    ///
    /// When the file cannot be read.
    pub fn cert_pem(&self) -> Result<String> {
        std::fs::read_to_string(&self.cert)
    }

    /// The private key's PEM text.
    ///
    /// # Errors
    ///
    /// When the file cannot be read.
    pub fn key_pem(&self) -> Result<String> {
        std::fs::read_to_string(&self.key)
    }

    /// One PEM file holding the key and then the certificate (the form
    /// ZooKeeper's `PEM` key store type reads), written beside the others.
    ///
    /// # Errors
    ///
    /// When a file cannot be read or written.
    pub fn bundle(&self) -> Result<PathBuf> {
        let path = self.cert.with_extension("bundle.pem");
        std::fs::write(&path, format!("{}{}", self.key_pem()?, self.cert_pem()?))?;
        Ok(path)
    }
}

/// A certificate authority made for one test, with the certificates it issued.
pub struct TestCa {
    dir: TempDir,
    ca: Issued,
    serial: std::sync::atomic::AtomicU32,
}

impl fmt::Debug for TestCa {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TestCa").field("dir", &self.dir.path()).finish()
    }
}

/// Whether Debian's `openssl` command is installed.
pub fn openssl_installed() -> bool {
    Command::new(OPENSSL)
        .arg("version")
        .output()
        .is_ok_and(|out| out.status.success())
}

impl TestCa {
    /// Makes a new self-signed CA (common name `name`) in a temporary directory.
    ///
    /// # Errors
    ///
    /// When `openssl` is missing or fails (the error carries its output).
    pub fn new(name: &str) -> Result<Self> {
        let dir = tempfile::Builder::new().prefix("lockline-ca-").tempdir()?;
        let ca = Issued {
            cert: dir.path().join("ca.pem"),
            key: dir.path().join("ca.key"),
        };
        new_key(&ca.key)?;
        openssl(&[
            "req",
            "-x509",
            "-new",
            "-key",
            path(&ca.key),
            "-out",
            path(&ca.cert),
            "-days",
            DAYS,
            "-subj",
            &format!("/CN={name}"),
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
        ])?;
        Ok(TestCa {
            dir,
            ca,
            serial: std::sync::atomic::AtomicU32::new(1),
        })
    }

    /// The CA's certificate (PEM file), what clients and servers trust.
    pub fn cert(&self) -> &Path {
        &self.ca.cert
    }

    /// The CA's certificate as PEM text.
    ///
    /// # Errors
    ///
    /// When the file cannot be read.
    pub fn cert_pem(&self) -> Result<String> {
        self.ca.cert_pem()
    }

    /// The directory the certificates are written to (deleted on drop).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// A server certificate for `localhost` and `127.0.0.1`, usable as a
    /// client certificate too (etcd's peer and ZooKeeper's quorum links need both).
    ///
    /// # Errors
    ///
    /// When `openssl` fails.
    pub fn server(&self, name: &str) -> Result<Issued> {
        self.issue(
            name,
            "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n",
        )
    }

    /// A client certificate whose common name is `name` (etcd takes it as the
    /// user name when authentication is on).
    ///
    /// # Errors
    ///
    /// When `openssl` fails.
    pub fn client(&self, name: &str) -> Result<Issued> {
        self.issue(name, "extendedKeyUsage=clientAuth\n")
    }

    fn issue(&self, name: &str, extensions: &str) -> Result<Issued> {
        let serial = self.serial.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let stem = format!("{serial}-{}", name.replace(|c: char| !c.is_ascii_alphanumeric(), "_"));
        let issued = Issued {
            cert: self.dir.path().join(format!("{stem}.pem")),
            key: self.dir.path().join(format!("{stem}.key")),
        };
        let csr = self.dir.path().join(format!("{stem}.csr"));
        let ext = self.dir.path().join(format!("{stem}.ext"));
        std::fs::write(
            &ext,
            format!("basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n{extensions}"),
        )?;
        new_key(&issued.key)?;
        openssl(&[
            "req",
            "-new",
            "-key",
            path(&issued.key),
            "-out",
            path(&csr),
            "-subj",
            &format!("/CN={name}"),
        ])?;
        openssl(&[
            "x509",
            "-req",
            "-in",
            path(&csr),
            "-CA",
            path(&self.ca.cert),
            "-CAkey",
            path(&self.ca.key),
            "-set_serial",
            &serial.to_string(),
            "-days",
            DAYS,
            "-extfile",
            path(&ext),
            "-out",
            path(&issued.cert),
        ])?;
        Ok(issued)
    }
}

fn new_key(key: &Path) -> Result<()> {
    openssl(&[
        "genpkey",
        "-algorithm",
        "EC",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-out",
        path(key),
    ])
}

fn path(path: &Path) -> &str {
    path.to_str().expect("temporary paths are UTF-8")
}

fn openssl(args: &[&str]) -> Result<()> {
    let out = Command::new(OPENSSL)
        .args(args)
        .output()
        .map_err(|e| Error::new(e.kind(), format!("cannot run {OPENSSL} (Debian package openssl): {e}")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(Error::other(format!(
            "{OPENSSL} {} failed: {}",
            args.first().copied().unwrap_or_default(),
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}
