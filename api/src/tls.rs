//! TLS on every listener (`--tls-cert`, `--tls-key`, optionally `--tls-client-ca`), with rustls
//! and the ring provider.
//!
//! One certificate serves the four ports; each listener gets its own ALPN list (`h2` for OTLP/gRPC,
//! `http/1.1` for the HTTP ports, `postgresql` for the PostgreSQL wire, where the handshake
//! follows an `SSLRequest`). Handshakes run on their own tasks with a deadline, so a client that
//! connects and says nothing holds up no one else. With a client CA every connection must present
//! a certificate that CA signed. SIGHUP reads the certificate and key again (rotation without a
//! restart); the client CA is read at start only.

use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use rustls::RootCertStore;
use rustls::crypto::CryptoProvider;
use rustls::server::{ClientHello, ResolvesServerCert, ServerConfig, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

/// Longest a client may take to finish the TLS handshake after connecting.
const HANDSHAKE_DEADLINE: Duration = Duration::from_secs(10);

/// The paths TLS is configured from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsPaths {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub client_ca: Option<PathBuf>,
}

/// The server's TLS set-up: the certificate in force and the configuration listeners share.
pub struct Tls {
    paths: TlsPaths,
    provider: Arc<CryptoProvider>,
    current: Arc<CurrentCert>,
    config: ServerConfig,
    /// Handshakes that failed or ran past the deadline, over all listeners.
    pub failed_handshakes: Arc<AtomicU64>,
}

impl fmt::Debug for Tls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tls").field("paths", &self.paths).finish()
    }
}

/// The certificate and key in force; replaced whole on reload.
#[derive(Debug)]
struct CurrentCert(RwLock<Arc<CertifiedKey>>);

impl ResolvesServerCert for CurrentCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.read().unwrap_or_else(|p| p.into_inner()).clone())
    }
}

impl Tls {
    /// Reads the certificate chain, the key and the client CA; every problem is named with its
    /// file.
    pub fn load(paths: &TlsPaths) -> Result<Self, String> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let key = certified_key(&paths.cert, &paths.key, &provider)?;
        let current = Arc::new(CurrentCert(RwLock::new(Arc::new(key))));
        let builder = ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS set-up: {e}"))?;
        let builder = match &paths.client_ca {
            None => builder.with_no_client_auth(),
            Some(ca) => {
                let mut roots = RootCertStore::empty();
                for cert in read_certs(ca, "client CA")? {
                    roots.add(cert).map_err(|e| {
                        format!(
                            "client CA {}: not a usable CA certificate: {e}",
                            ca.display()
                        )
                    })?;
                }
                let verifier =
                    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
                        .build()
                        .map_err(|e| format!("client CA {}: {e}", ca.display()))?;
                builder.with_client_cert_verifier(verifier)
            }
        };
        let config = builder.with_cert_resolver(current.clone());
        Ok(Self {
            paths: paths.clone(),
            provider,
            current,
            config,
            failed_handshakes: Arc::new(AtomicU64::new(0)),
        })
    }

    /// Reads the certificate and key again; on any error the ones in force stay.
    pub fn reload(&self) -> Result<(), String> {
        let key = certified_key(&self.paths.cert, &self.paths.key, &self.provider)?;
        *self.current.0.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(key);
        Ok(())
    }

    /// An acceptor offering the given application protocols.
    pub fn acceptor(&self, alpn: &[&[u8]]) -> TlsAcceptor {
        let mut config = self.config.clone();
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        TlsAcceptor::from(Arc::new(config))
    }

    /// Accepts TCP connections on `listener` and hands over those whose handshake succeeded.
    /// The accepting task ends when the returned listener is dropped.
    pub fn listen(&self, listener: TcpListener, alpn: &[&[u8]], what: &'static str) -> TlsListener {
        let acceptor = self.acceptor(alpn);
        let local = listener.local_addr().ok();
        let failed = self.failed_handshakes.clone();
        let (tx, rx) = mpsc::channel(256);
        tokio::spawn(async move {
            loop {
                let accepted = tokio::select! {
                    accepted = listener.accept() => accepted,
                    _ = tx.closed() => break,
                };
                let (socket, peer) = match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        tracing::warn!(error = %e, listener = what, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let _ = socket.set_nodelay(true);
                let acceptor = acceptor.clone();
                let tx = tx.clone();
                let failed = failed.clone();
                tokio::spawn(async move {
                    match tokio::time::timeout(HANDSHAKE_DEADLINE, acceptor.accept(socket)).await {
                        Ok(Ok(stream)) => {
                            let _ = tx.send((stream, peer)).await;
                        }
                        Ok(Err(e)) => {
                            failed.fetch_add(1, Ordering::Relaxed);
                            tracing::debug!(%peer, listener = what, error = %e, "TLS handshake failed");
                        }
                        Err(_) => {
                            failed.fetch_add(1, Ordering::Relaxed);
                            tracing::debug!(%peer, listener = what, "TLS handshake not finished in time");
                        }
                    }
                });
            }
        });
        TlsListener { rx, local }
    }
}

fn read_certs(path: &Path, what: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| format!("{what} {}: {e}", path.display()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{what} {}: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!(
            "{what} {}: no PEM certificate (-----BEGIN CERTIFICATE-----) in it",
            path.display()
        ));
    }
    Ok(certs)
}

fn certified_key(
    cert: &Path,
    key: &Path,
    provider: &CryptoProvider,
) -> Result<CertifiedKey, String> {
    let chain = read_certs(cert, "TLS certificate")?;
    let der = PrivateKeyDer::from_pem_file(key).map_err(|e| {
        format!(
            "TLS key {}: {e} (a PEM private key, PKCS#8, PKCS#1 or SEC1, is expected)",
            key.display()
        )
    })?;
    CertifiedKey::from_der(chain, der, provider).map_err(|e| {
        format!(
            "TLS key {} does not fit certificate {}: {e}",
            key.display(),
            cert.display()
        )
    })
}

/// Connections whose TLS handshake has finished, for axum and tonic.
pub struct TlsListener {
    rx: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local: Option<SocketAddr>,
}

impl TlsListener {
    /// The connections as a stream, for tonic's `serve_with_incoming`.
    pub fn into_stream(
        self,
    ) -> impl futures::Stream<Item = Result<TlsStream<TcpStream>, io::Error>> {
        futures::stream::unfold(self.rx, |mut rx| async move {
            rx.recv().await.map(|(s, _)| (Ok(s), rx))
        })
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.rx.recv().await {
            Some(accepted) => accepted,
            // the accepting task has ended: nothing more will come
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        self.local
            .ok_or_else(|| io::Error::other("listener address unknown"))
    }
}
