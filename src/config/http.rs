//! The `sink.http` section: CloudEvents over HTTP to one URL or a URL per resource (a
//! template), its credentials read from files, and the Knative drop-in: with no `sink` in the
//! file, `K_SINK` (as Knative's SinkBinding injects it) selects an HTTP sink, and
//! `K_CE_OVERRIDES` adds its extensions.

use std::collections::BTreeMap;
use std::path::PathBuf;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::content::ContentMode;
use super::limits::{HTTP_MAX_IN_FLIGHT, HTTP_MAX_RETRY_AFTER_SECS, HTTP_TIMEOUT_SECS};
use crate::attribute;
use crate::template::{Template, Values};

/// The environment variable Knative's SinkBinding sets to the URL events go to.
pub const K_SINK: &str = "K_SINK";
/// The environment variable Knative sets to `{"extensions": {...}}`: attributes added to every
/// event.
pub const K_CE_OVERRIDES: &str = "K_CE_OVERRIDES";
/// The environment variable Knative's SinkBinding sets to the CA certificates (PEM) of an HTTPS
/// `K_SINK`, trusted besides the public roots.
pub const K_CA_CERTS: &str = "K_CA_CERTS";

/// HTTP sink settings.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct HttpConfig {
    /// The receiver's URL (`http` or `https`), a template: tokens `{cluster}`, `{group}`
    /// (`core` for the core group), `{version}`, `{resource}`, `{namespace}` (`_` for
    /// cluster-scoped objects) and `{name}`, percent-encoded. Credentials never go in it (see
    /// `credentials`).
    pub url: String,
    /// `binary` (attributes as `ce-` headers, the object as the body) or `structured` (one
    /// `application/cloudevents+json` document).
    #[serde(default)]
    pub content_mode: ContentMode,
    /// Requests awaiting a response at once, across every watch (events of one object are
    /// always sent one after the other).
    #[serde(default = "default_max_in_flight")]
    #[schemars(range(min = HTTP_MAX_IN_FLIGHT.min, max = HTTP_MAX_IN_FLIGHT.max))]
    pub max_in_flight: usize,
    /// How long one request may take, connecting included, before it is sent again.
    #[serde(default = "default_timeout_secs")]
    #[schemars(range(min = HTTP_TIMEOUT_SECS.min, max = HTTP_TIMEOUT_SECS.max))]
    pub timeout_secs: u64,
    /// The longest `Retry-After` honoured; a longer one is cut to it.
    #[serde(default = "default_max_retry_after_secs")]
    #[schemars(range(min = HTTP_MAX_RETRY_AFTER_SECS.min, max = HTTP_MAX_RETRY_AFTER_SECS.max))]
    pub max_retry_after_secs: u64,
    /// Extension attributes added to every event (lowercase letters and digits), like
    /// Knative's `ceOverrides`. They cannot replace an attribute the bridge sets.
    #[serde(default)]
    pub extensions: BTreeMap<String, String>,
    /// How to authenticate and verify the receiver.
    #[serde(default)]
    pub credentials: HttpCredentials,
    /// CA certificates (PEM) trusted besides the public roots: Knative's `K_CA_CERTS`, for the
    /// sink `K_SINK` names. Not a field of the file.
    #[serde(skip)]
    pub extra_ca_certs: Option<String>,
}

/// Enough to keep a receiver on the same network busy without opening thousands of
/// connections; each watch keeps at most `delivery.maxInFlight` of them.
const fn default_max_in_flight() -> usize {
    64
}

/// Knative's own dispatchers give a subscriber about 10 s by default.
const fn default_timeout_secs() -> u64 {
    10
}

/// Five minutes: a receiver asking for longer is down, and the watch reports itself stalled.
const fn default_max_retry_after_secs() -> u64 {
    300
}

/// HTTP credentials, read from files (mounted Secrets) so they never sit in the config. Files
/// are read again every minute and after a 401 or 403, so a rotated Secret is picked up.
#[derive(Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct HttpCredentials {
    /// A file holding a bearer token (`Authorization: Bearer ...`), such as a projected
    /// ServiceAccount token.
    pub bearer_token_file: Option<PathBuf>,
    /// User name for basic authentication, with `passwordFile`.
    pub user: Option<String>,
    /// File holding the basic-authentication password.
    pub password_file: Option<PathBuf>,
    /// CA bundle (PEM) to verify the receiver's certificate, instead of the public roots.
    pub tls_ca_file: Option<PathBuf>,
    /// Client certificate (PEM), with `tlsKeyFile`.
    pub tls_cert_file: Option<PathBuf>,
    /// Client key (PEM), with `tlsCertFile`.
    pub tls_key_file: Option<PathBuf>,
}

impl std::fmt::Debug for HttpCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpCredentials")
            .field("bearer_token_file", &self.bearer_token_file)
            .field("user", &self.user)
            .field("password_file", &self.password_file)
            .field("tls_ca_file", &self.tls_ca_file)
            .field("tls_cert_file", &self.tls_cert_file)
            .field("tls_key_file", &self.tls_key_file)
            .finish()
    }
}

/// What the process environment says about the sink (Knative's SinkBinding).
#[derive(Debug, Clone, Default)]
pub struct Environment {
    /// `K_SINK`.
    pub k_sink: Option<String>,
    /// `K_CE_OVERRIDES`.
    pub ce_overrides: Option<String>,
    /// `K_CA_CERTS`.
    pub ca_certs: Option<String>,
}

impl Environment {
    /// Reads `K_SINK`, `K_CE_OVERRIDES` and `K_CA_CERTS` (empty values count as unset).
    pub fn from_process() -> Self {
        let var = |name| std::env::var(name).ok().filter(|v: &String| !v.is_empty());
        Self {
            k_sink: var(K_SINK),
            ce_overrides: var(K_CE_OVERRIDES),
            ca_certs: var(K_CA_CERTS),
        }
    }

    /// The HTTP sink Knative asked for, when the file configures no sink.
    pub(super) fn sink(&self, errors: &mut Vec<String>) -> Option<HttpConfig> {
        let url = self.k_sink.clone()?;
        let extensions = match &self.ce_overrides {
            None => BTreeMap::new(),
            Some(text) => match serde_json::from_str::<CeOverrides>(text) {
                Ok(o) => o.extensions,
                Err(e) => {
                    errors.push(format!(
                        "{K_CE_OVERRIDES}: not {{\"extensions\": {{name: value}}}}: {e}"
                    ));
                    BTreeMap::new()
                }
            },
        };
        Some(HttpConfig {
            url,
            content_mode: ContentMode::default(),
            max_in_flight: default_max_in_flight(),
            timeout_secs: default_timeout_secs(),
            max_retry_after_secs: default_max_retry_after_secs(),
            extensions,
            credentials: HttpCredentials::default(),
            extra_ca_certs: self.ca_certs.clone(),
        })
    }
}

/// Knative's `K_CE_OVERRIDES` document.
#[derive(Deserialize)]
struct CeOverrides {
    #[serde(default)]
    extensions: BTreeMap<String, String>,
}

/// Checks the `sink.http` section. Returns the parsed URL template.
pub(super) fn validate_http(http: &HttpConfig, errors: &mut Vec<String>) -> Option<Template> {
    let at = "sink.http";
    HTTP_MAX_IN_FLIGHT.check(&format!("{at}.maxInFlight"), http.max_in_flight, errors);
    HTTP_TIMEOUT_SECS.check(&format!("{at}.timeoutSecs"), http.timeout_secs, errors);
    let retry_after = http.max_retry_after_secs;
    HTTP_MAX_RETRY_AFTER_SECS.check(&format!("{at}.maxRetryAfterSecs"), retry_after, errors);
    check_extensions(&format!("{at}.extensions"), &http.extensions, errors);
    let c = &http.credentials;
    let at_c = format!("{at}.credentials");
    if c.password_file.is_some() != c.user.is_some() {
        errors.push(format!(
            "{at_c}: user and passwordFile must be given together"
        ));
    }
    if c.password_file.is_some() && c.bearer_token_file.is_some() {
        errors.push(format!(
            "{at_c}: bearerTokenFile and user/passwordFile are two ways to authenticate; set one"
        ));
    }
    if c.user.as_deref().is_some_and(|u| u.contains(':')) {
        errors.push(format!(
            "{at_c}.user: basic authentication forbids ':' in the user name"
        ));
    }
    if c.tls_cert_file.is_some() != c.tls_key_file.is_some() {
        errors.push(format!(
            "{at_c}: tlsCertFile and tlsKeyFile must be given together"
        ));
    }
    parse_url(&format!("{at}.url"), &http.url, errors)
}

/// Checks the HTTP sink Knative's environment asked for (`K_SINK`, `K_CE_OVERRIDES`).
pub(super) fn validate_environment(
    http: &HttpConfig,
    errors: &mut Vec<String>,
) -> Option<Template> {
    let at = format!("{K_CE_OVERRIDES}.extensions");
    check_extensions(&at, &http.extensions, errors);
    parse_url(K_SINK, &http.url, errors)
}

/// Extension names: lowercase letters and digits, none the bridge sets itself.
fn check_extensions(at: &str, extensions: &BTreeMap<String, String>, errors: &mut Vec<String>) {
    for name in extensions.keys() {
        if name.is_empty()
            || !name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        {
            errors.push(format!(
                "{at}.{name}: an extension name has only lowercase letters and digits"
            ));
        } else if attribute::RESERVED.contains(&name.as_str()) {
            errors.push(format!(
                "{at}.{name}: the bridge sets this attribute itself"
            ));
        }
    }
}

/// Parses a URL template and checks that its renderings are `http(s)` URLs without user
/// information.
pub(super) fn parse_url(at: &str, text: &str, errors: &mut Vec<String>) -> Option<Template> {
    if let Some(problem) = token_before_path(text) {
        errors.push(format!("{at}: {problem}"));
        return None;
    }
    let template = match Template::parse(text) {
        Ok(t) => t,
        Err(e) => {
            errors.push(format!("{at}: {e}"));
            return None;
        }
    };
    let sample = Values {
        cluster: "c",
        group: "g",
        version: "v",
        resource: "r",
        namespace: Some("n"),
        name: "x",
    };
    match check_url(&template.render_url(&sample)) {
        Ok(()) => Some(template),
        Err(problem) => {
            // The URL itself is not repeated: a query string may hold a key.
            errors.push(format!("{at}: {problem}"));
            None
        }
    }
}

/// A token in the scheme, user information, host or port of a URL template: whoever can name
/// an object would choose where its event (and the credentials) go. Tokens may appear in the
/// path and the query only.
fn token_before_path(text: &str) -> Option<String> {
    let authority_end = text
        .find("://")
        .map(|i| i + 3)
        .map(|start| {
            text[start..]
                .find(['/', '?', '#'])
                .map_or(text.len(), |e| start + e)
        })
        .unwrap_or_else(|| text.find(['/', '?', '#']).unwrap_or(text.len()));
    text[..authority_end].contains('{').then(|| {
        "a template token in the scheme, host or port would let object names choose where          events and credentials go; tokens may appear in the path and query only"
            .to_string()
    })
}

/// Whether `url` is an absolute `http` or `https` URL without user information.
pub fn check_url(url: &str) -> Result<(), String> {
    let parsed = reqwest::Url::parse(url).map_err(|e| format!("not a URL: {e}"))?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(format!(
            "the scheme is {:?}; only http and https are supported",
            parsed.scheme()
        ));
    }
    if !parsed.username().is_empty() || parsed.password().is_some() {
        return Err(
            "credentials in the URL would show in logs; use credentials.passwordFile or bearerTokenFile"
                .into(),
        );
    }
    if parsed.host_str().is_none_or(str::is_empty) {
        return Err("the URL has no host".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{ConfigFile, Sink, invalid};

    const BASE: &str = "cluster: dev\nresources: [{apiVersion: v1, resource: pods}]\ncheckpoint: {directory: /var/lib/keb}\n";

    #[test]
    fn http_settings_are_checked() {
        let e = invalid(&format!(
            "{BASE}sink:\n  http:\n    url: 'ftp://x/{{name}}'\n    maxInFlight: 0\n    extensions: {{id: x, Bad: y}}\n    credentials: {{user: 'a:b', bearerTokenFile: /t, tlsCertFile: /c}}\n"
        ));
        for needle in [
            "sink.http.url: the scheme is \"ftp\"",
            "sink.http.maxInFlight: 0 is out of range",
            "sink.http.extensions.id: the bridge sets this attribute itself",
            "sink.http.extensions.Bad: an extension name has only lowercase",
            "sink.http.credentials: user and passwordFile must be given together",
            "sink.http.credentials.user: basic authentication forbids ':'",
            "sink.http.credentials: tlsCertFile and tlsKeyFile must be given together",
        ] {
            assert!(e.contains(needle), "missing {needle:?} in {e}");
        }
        let e = invalid(&format!(
            "{BASE}sink: {{http: {{url: 'https://user:secret@example.com/?code=hunter2'}}}}\n"
        ));
        assert!(e.contains("credentials in the URL"), "{e}");
        assert!(!e.contains("hunter2") && !e.contains("secret"), "{e}");
        for url in [
            "http://{namespace}.example.com/",
            "http://example.com:{name}/",
            "{cluster}://example.com/",
            "http://{name}@example.com/",
        ] {
            let e = invalid(&format!("{BASE}sink: {{http: {{url: '{url}'}}}}\n"));
            assert!(
                e.contains("sink.http.url: a template token in the scheme"),
                "{url}: {e}"
            );
        }
        let e = invalid(&format!(
            "{BASE}sink: {{http: {{url: 'http://x/{{nme}}'}}}}\n"
        ));
        assert!(e.contains("sink.http.url: unknown token {nme}"), "{e}");
    }

    #[test]
    fn k_sink_selects_the_http_sink_only_without_a_sink_section() {
        let env = Environment {
            k_sink: Some("http://broker-ingress.knative-eventing.svc/default/default".into()),
            ce_overrides: Some(r#"{"extensions": {"team": "a"}}"#.into()),
            ca_certs: Some("-----BEGIN CERTIFICATE-----".into()),
        };
        let cfg = ConfigFile::parse(BASE).unwrap().validate_in(&env).unwrap();
        let Sink::Http { config, url } = &cfg.sink else {
            panic!("an http sink: {:?}", cfg.sink)
        };
        assert_eq!(
            url.to_string(),
            "http://broker-ingress.knative-eventing.svc/default/default"
        );
        assert_eq!(config.extensions["team"], "a");
        assert_eq!(
            config.extra_ca_certs.as_deref(),
            Some("-----BEGIN CERTIFICATE-----"),
            "K_CA_CERTS goes with K_SINK"
        );
        let cfg = ConfigFile::parse(&format!("{BASE}sink: {{stdout: {{}}}}\n"))
            .unwrap()
            .validate_in(&env)
            .unwrap();
        assert!(matches!(cfg.sink, Sink::Stdout));

        let bad = Environment {
            k_sink: Some("not a url".into()),
            ce_overrides: Some(r#"{"extensions": {"id": "x"}}"#.into()),
            ca_certs: None,
        };
        let e = ConfigFile::parse(BASE)
            .unwrap()
            .validate_in(&bad)
            .unwrap_err()
            .to_string();
        assert!(e.contains("K_SINK: not a URL"), "{e}");
        assert!(
            e.contains("K_CE_OVERRIDES.extensions.id: the bridge sets this attribute itself"),
            "{e}"
        );
    }
}
