//! The HTTP client's settings from the validated `sink.http` section: TLS (a custom CA, a client
//! certificate), the request timeout, and the credentials, read from their files at start and
//! again every minute or after a 401 or 403, so a rotated Secret is picked up without a restart.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use super::error::Error as SetupError;
use super::{HttpConfig, HttpCredentials};
use crate::sink::Result;

/// How long credentials read from files are used before the files are read again.
const CREDENTIALS_TTL: Duration = Duration::from_secs(60);

/// The longest a connection may take to open, within the request timeout.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Builds the HTTP client: rustls with the system's roots, or only the CA bundle of
/// `credentials.tlsCaFile`; a client certificate; no redirects (a redirect is reported, the
/// URL should name the receiver).
pub(super) fn client(config: &HttpConfig) -> Result<reqwest::Client> {
    let c = &config.credentials;
    let timeout = Duration::from_secs(config.timeout_secs);
    crate::tls::install_crypto_provider();
    let mut builder = reqwest::Client::builder()
        .tls_backend_rustls()
        .timeout(timeout)
        .connect_timeout(CONNECT_TIMEOUT.min(timeout))
        .redirect(reqwest::redirect::Policy::none())
        .pool_max_idle_per_host(config.max_in_flight)
        .user_agent(concat!("kube-event-bridge/", env!("CARGO_PKG_VERSION")));
    if let Some(path) = &c.tls_ca_file {
        let pem = read_file("tlsCaFile", path)?;
        let certificates = reqwest::Certificate::from_pem_bundle(&pem)
            .map_err(|e| invalid_file("tlsCaFile", path, &e))?;
        if certificates.is_empty() {
            return Err(SetupError::Tls {
                field: "tlsCaFile",
                path: path.display().to_string(),
                reason: "no PEM certificate in the file".into(),
            }
            .into());
        }
        builder = builder.tls_certs_only(certificates);
    }
    if let Some(pem) = &config.extra_ca_certs {
        builder = trusting_also(builder, pem)?;
    }
    if let (Some(cert), Some(key)) = (&c.tls_cert_file, &c.tls_key_file) {
        let mut pem = read_file("tlsCertFile", cert)?;
        pem.push(b'\n');
        pem.extend(read_file("tlsKeyFile", key)?);
        let identity =
            reqwest::Identity::from_pem(&pem).map_err(|e| invalid_file("tlsKeyFile", key, &e))?;
        builder = builder.identity(identity);
    }
    builder.build().map_err(|e| SetupError::Client(e).into())
}

/// `builder` trusting the CA certificates in `pem` (Knative's `K_CA_CERTS`) besides its roots.
fn trusting_also(builder: reqwest::ClientBuilder, pem: &str) -> Result<reqwest::ClientBuilder> {
    let refused = |reason: String| SetupError::KnativeCaCerts { reason };
    let certificates = reqwest::Certificate::from_pem_bundle(pem.as_bytes())
        .map_err(|e| refused(error_chain(&e)))?;
    if certificates.is_empty() {
        return Err(refused("no PEM certificate in it".into()).into());
    }
    Ok(builder.tls_certs_merge(certificates))
}

fn read_file(field: &'static str, path: &Path) -> Result<Vec<u8>> {
    let read = std::fs::read(path).map_err(|source| SetupError::File {
        field,
        path: path.display().to_string(),
        source,
    });
    Ok(read?)
}

/// `e` and its cause, as one line.
fn error_chain(e: &reqwest::Error) -> String {
    use std::error::Error as _;
    e.source()
        .map_or_else(|| e.to_string(), |s| format!("{e}: {s}"))
}

fn invalid_file(field: &'static str, path: &Path, e: &reqwest::Error) -> SetupError {
    let reason = error_chain(e);
    SetupError::Tls {
        field,
        path: path.display().to_string(),
        reason,
    }
}

/// A credential as sent.
#[derive(Clone)]
pub(super) enum Credential {
    /// `Authorization: Bearer ...`.
    Bearer(String),
    /// `Authorization: Basic ...`.
    Basic {
        /// User name.
        user: String,
        /// Password.
        password: String,
    },
}

impl std::fmt::Debug for Credential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Credential::Bearer(_) => f.write_str("Bearer(<redacted>)"),
            Credential::Basic { user, .. } => write!(f, "Basic({user}, <redacted>)"),
        }
    }
}

impl Credential {
    /// Adds the `Authorization` header (marked sensitive, so it is never logged by the client).
    pub(super) fn apply(&self, request: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        match self {
            Credential::Bearer(token) => request.bearer_auth(token),
            Credential::Basic { user, password } => request.basic_auth(user, Some(password)),
        }
    }
}

/// Where the credential comes from.
#[derive(Debug)]
enum Source {
    Bearer(PathBuf),
    Basic { user: String, password: PathBuf },
}

/// The credential of the sink, read from its file and cached for [`CREDENTIALS_TTL`].
#[derive(Debug)]
pub(super) struct Credentials {
    source: Option<Source>,
    cached: Mutex<Option<(Credential, Instant)>>,
}

impl Credentials {
    /// Reads the configured credential once, so a missing file stops the start.
    pub(super) fn load(c: &HttpCredentials) -> Result<Self> {
        let source = match (&c.bearer_token_file, &c.user, &c.password_file) {
            (Some(path), _, _) => Some(Source::Bearer(path.clone())),
            (None, Some(user), Some(password)) => Some(Source::Basic {
                user: user.clone(),
                password: password.clone(),
            }),
            _ => None,
        };
        let credentials = Self {
            source,
            cached: Mutex::new(None),
        };
        credentials.current()?;
        Ok(credentials)
    }

    /// The credential to send: the cached one, or the file read again once the cache is older
    /// than [`CREDENTIALS_TTL`] or was dropped by [`Credentials::refused`].
    pub(super) fn current(&self) -> Result<Option<Credential>> {
        let Some(source) = &self.source else {
            return Ok(None);
        };
        let mut cached = self.cached.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((credential, read)) = &*cached
            && read.elapsed() < CREDENTIALS_TTL
        {
            return Ok(Some(credential.clone()));
        }
        let credential = match source {
            Source::Bearer(path) => Credential::Bearer(read_secret("bearerTokenFile", path)?),
            Source::Basic { user, password } => Credential::Basic {
                user: user.clone(),
                password: read_secret("passwordFile", password)?,
            },
        };
        *cached = Some((credential.clone(), Instant::now()));
        Ok(Some(credential))
    }

    /// The receiver refused the credential: read the file again before the next request.
    pub(super) fn refused(&self) {
        *self.cached.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }
}

/// The secret in the file of `sink.http.credentials.<field>`.
fn read_secret(field: &str, path: &Path) -> Result<String> {
    Ok(crate::secret::read(
        &format!("sink.http.credentials.{field}"),
        path,
    )?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn k_ca_certs_without_a_certificate_is_refused_naming_the_variable() {
        let builder = || reqwest::Client::builder().tls_backend_rustls();
        for (pem, reason) in [
            ("not a certificate", "no PEM certificate in it"),
            ("", "no PEM certificate in it"),
        ] {
            let e = trusting_also(builder(), pem).expect_err("refused");
            assert_eq!(e.to_string(), format!("K_CA_CERTS: {reason}"), "{pem:?}");
        }
        let broken = "-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n";
        let e = trusting_also(builder(), broken).expect_err("refused");
        assert!(e.to_string().starts_with("K_CA_CERTS: "), "{e}");
    }

    #[test]
    fn credentials_are_read_without_the_trailing_line_break_and_never_shown() {
        let dir = tempfile::tempdir().unwrap();
        let token = dir.path().join("token");
        std::fs::write(&token, "s3cret-token\n").unwrap();
        let c = Credentials::load(&HttpCredentials {
            bearer_token_file: Some(token.clone()),
            ..HttpCredentials::default()
        })
        .unwrap();
        let current = c.current().unwrap().unwrap();
        assert!(matches!(&current, Credential::Bearer(t) if t == "s3cret-token"));
        assert!(!format!("{current:?}").contains("s3cret"));

        // A rotated file is read again once the receiver refused the old credential.
        std::fs::write(&token, "rotated\n").unwrap();
        c.refused();
        assert!(matches!(c.current().unwrap(), Some(Credential::Bearer(t)) if t == "rotated"));

        let missing = Credentials::load(&HttpCredentials {
            user: Some("bridge".into()),
            password_file: Some(dir.path().join("missing")),
            ..HttpCredentials::default()
        })
        .unwrap_err()
        .to_string();
        assert!(
            missing.contains("sink.http.credentials.passwordFile: cannot read"),
            "{missing}"
        );
    }
}
