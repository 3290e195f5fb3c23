//! Where a server may listen, and the shared token that guards any address but loopback.

use std::net::SocketAddr;
use std::path::Path;

use tonic::{Request, Status};

pub use areal_core::TOKEN_ENV;

/// The shared token in [`TOKEN_ENV`], if set and not empty.
pub fn token_from_env() -> Option<String> {
    std::env::var(TOKEN_ENV).ok().filter(|t| !t.is_empty())
}

/// A client's token: the one in `token_file` (the option of that name of `config`, whose error
/// names it), else [`token_from_env`].
pub(crate) fn client_token(
    config: &areal_sdk::PluginConfig,
    token_file: Option<&Path>,
) -> Result<Option<String>, areal_sdk::PluginError> {
    let Some(path) = token_file else {
        return Ok(token_from_env());
    };
    let text = std::fs::read_to_string(path).map_err(|e| {
        config.invalid("token_file", format!("cannot read {}: {e}", path.display()))
    })?;
    Ok(Some(text.trim().to_owned()).filter(|t| !t.is_empty()))
}

/// The metadata key a client sends the token in.
const TOKEN_HEADER: &str = "authorization";

/// Where and how a server listens.
#[derive(Clone, Debug)]
pub struct Listen {
    /// The address (`127.0.0.1:0` picks a free port).
    pub addr: SocketAddr,
    /// The token every call must carry; required unless `addr` is loopback.
    pub token: Option<String>,
    /// Serve TLS with this certificate and key; plain HTTP/2 when `None`.
    pub tls: Option<ServerTls>,
}

impl Listen {
    /// Plain HTTP/2 on `addr`, with `token` if any.
    pub fn new(addr: SocketAddr, token: Option<String>) -> Self {
        Self {
            addr,
            token,
            tls: None,
        }
    }
}

/// A server's TLS identity: its certificate chain and private key (PEM).
#[derive(Clone)]
pub struct ServerTls {
    cert: Vec<u8>,
    key: Vec<u8>,
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerTls").finish_non_exhaustive()
    }
}

impl ServerTls {
    /// Read the certificate chain and the key (PEM files).
    pub fn from_files(cert: &Path, key: &Path) -> Result<Self, ServeError> {
        let read = |path: &Path| {
            std::fs::read(path).map_err(|source| ServeError::Tls {
                message: format!("cannot read {}", path.display()),
                source: Some(source),
            })
        };
        let (cert_pem, key_pem) = (read(cert)?, read(key)?);
        for (what, path, pem, tag) in [
            ("certificate", cert, &cert_pem, "CERTIFICATE"),
            ("private key", key, &key_pem, "PRIVATE KEY"),
        ] {
            if !String::from_utf8_lossy(pem).contains(tag) {
                return Err(ServeError::Tls {
                    message: format!("{} holds no PEM {what}", path.display()),
                    source: None,
                });
            }
        }
        Ok(Self {
            cert: cert_pem,
            key: key_pem,
        })
    }

    /// The identity as rustls serves it (the HTTP servers).
    pub(crate) fn rustls(&self) -> Result<std::sync::Arc<rustls::ServerConfig>, ServeError> {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let bad = |what: &str, e: &dyn std::fmt::Display| ServeError::Tls {
            message: format!("the {what} cannot be read: {e}"),
            source: None,
        };
        let chain = CertificateDer::pem_slice_iter(&self.cert)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| bad("certificate", &e))?;
        let key = PrivateKeyDer::from_pem_slice(&self.key).map_err(|e| bad("private key", &e))?;
        let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| bad("protocol versions", &e))?
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .map_err(|e| ServeError::Tls {
                message: format!("the certificate and key do not make a TLS identity: {e}"),
                source: None,
            })?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(std::sync::Arc::new(config))
    }

    pub(crate) fn config(&self) -> tonic::transport::ServerTlsConfig {
        tonic::transport::ServerTlsConfig::new()
            .identity(tonic::transport::Identity::from_pem(&self.cert, &self.key))
    }
}

/// Why a server cannot start or stopped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServeError {
    /// A non-loopback address without a token.
    #[error(
        "refusing to listen on {addr} without a token: any address but loopback needs a shared token \
         (set {TOKEN_ENV}, or --token-file FILE), which every client must send"
    )]
    TokenRequired {
        /// The address asked for.
        addr: SocketAddr,
    },
    /// The address cannot be bound.
    #[error("cannot listen on {addr}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The TLS certificate or key cannot be used.
    #[error("TLS: {message}")]
    Tls {
        /// What is wrong.
        message: String,
        /// The I/O error, if reading failed.
        #[source]
        source: Option<std::io::Error>,
    },
    /// The transport failed while serving.
    #[error("serving on {addr} failed")]
    Transport {
        /// The address.
        addr: SocketAddr,
        /// Why.
        #[source]
        source: tonic::transport::Error,
    },
    /// The HTTP server failed while serving.
    #[error("serving HTTP on {addr} failed")]
    Http {
        /// The address.
        addr: SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// What was asked cannot be served this way.
    #[error("{0}")]
    Unsupported(String),
}

impl Listen {
    /// Check the address against the token rule.
    pub fn check(&self) -> Result<(), ServeError> {
        if self.addr.ip().is_loopback() || self.token.as_deref().is_some_and(|t| !t.is_empty()) {
            Ok(())
        } else {
            Err(ServeError::TokenRequired { addr: self.addr })
        }
    }
}

/// Check `listen` and bind it: the listener and the address actually bound.
pub(crate) async fn bind(
    listen: &Listen,
) -> Result<(tokio::net::TcpListener, SocketAddr), ServeError> {
    listen.check()?;
    let bind_error = |source| ServeError::Bind {
        addr: listen.addr,
        source,
    };
    let listener = tokio::net::TcpListener::bind(listen.addr)
        .await
        .map_err(bind_error)?;
    let addr = listener.local_addr().map_err(bind_error)?;
    Ok((listener, addr))
}

/// A tonic interceptor that refuses calls without the token (when there is one).
#[derive(Clone, Debug)]
pub(crate) struct RequireToken(pub(crate) Option<String>);

impl tonic::service::Interceptor for RequireToken {
    fn call(&mut self, request: Request<()>) -> Result<Request<()>, Status> {
        let Some(token) = &self.0 else {
            return Ok(request);
        };
        let sent = request
            .metadata()
            .get(TOKEN_HEADER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        match sent {
            Some(sent) if constant_time_eq(sent.as_bytes(), token.as_bytes()) => Ok(request),
            Some(_) => Err(Status::unauthenticated("wrong token")),
            None => Err(Status::unauthenticated(format!(
                "this server needs a token: set {TOKEN_ENV} on the client"
            ))),
        }
    }
}

/// A tonic interceptor that adds the token to every call (when there is one).
#[derive(Clone, Debug)]
pub(crate) struct SendToken(
    pub(crate) Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>,
);

impl SendToken {
    pub(crate) fn new(token: Option<&str>) -> Result<Self, String> {
        token
            .map(|t| {
                format!("Bearer {t}")
                    .parse()
                    .map_err(|_| "the token must be printable ASCII".to_owned())
            })
            .transpose()
            .map(Self)
    }
}

impl tonic::service::Interceptor for SendToken {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        if let Some(value) = &self.0 {
            request.metadata_mut().insert(TOKEN_HEADER, value.clone());
        }
        Ok(request)
    }
}

pub(crate) fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// `N` bytes from the system's generator. Keys and ids a client could otherwise guess are
/// drawn from it; without it there is nothing safe to hand out, and the server stops.
pub(crate) fn random_bytes<const N: usize>() -> [u8; N] {
    use std::io::Read as _;
    let mut bytes = [0u8; N];
    let read = std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut bytes));
    if let Err(e) = read {
        panic!("cannot read /dev/urandom for a key: {e}");
    }
    bytes
}
