//! The `sink.http` section: CloudEvents over HTTP to one URL or a URL per resource (a
//! template), its credentials read from files, and the Knative drop-in: with no `sink` in the
//! file, `K_SINK` (as Knative's SinkBinding injects it) selects an HTTP sink, and
//! `K_CE_OVERRIDES` adds its extensions. Also what the rest of the bridge asks of an HTTP sink:
//! its connection and its plan line (`tail` has nothing to subscribe to).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use futures::future::BoxFuture;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::HttpSink;
use super::url::{check_url, parse_url};
use crate::attribute;
use crate::config::{
    CheckpointSupport, ContentMode, Context, Environment, HTTP_MAX_IN_FLIGHT,
    HTTP_MAX_RETRY_AFTER_SECS, HTTP_TIMEOUT_SECS, ResourceFields, Section, SinkKind, SinkSettings,
    parse_section,
};
use crate::discovery::ResolvedResource;
use crate::sink::{AnySink, Messages, Result, Scope, Settings, no_subscription};
use crate::template::Template;

crate::sink::register!(
    Http,
    SinkKind {
        name: "http",
        description: "POST CloudEvents to an HTTP receiver (CloudEvents HTTP binding): a Knative Broker or\nService, a webhook, a cloud function.",
        default: false,
        schema: |g| g.subschema_for::<HttpConfig>(),
        parse: Http::parse,
        from_environment: Http::from_environment,
    }
);

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

/// The HTTP sink Knative's SinkBinding asked for (`K_SINK`, with `K_CE_OVERRIDES` and
/// `K_CA_CERTS`), when the file configures no sink.
fn knative_sink(env: &Environment, errors: &mut Vec<String>) -> Option<HttpConfig> {
    let url = env.var(K_SINK)?.to_string();
    let extensions = match env.var(K_CE_OVERRIDES) {
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
        extra_ca_certs: env.var(K_CA_CERTS).map(str::to_string),
    })
}

/// Knative's `K_CE_OVERRIDES` document.
#[derive(Deserialize)]
struct CeOverrides {
    #[serde(default)]
    extensions: BTreeMap<String, String>,
}

/// Checks the `sink.http` section. Returns the parsed URL template.
fn validate_http(http: &HttpConfig, errors: &mut Vec<String>) -> Option<Template> {
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
fn validate_environment(http: &HttpConfig, errors: &mut Vec<String>) -> Option<Template> {
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

/// The validated HTTP sink.
#[derive(Debug, Clone)]
pub struct Http {
    /// Settings.
    pub config: HttpConfig,
    /// The parsed URL template.
    pub url: Template,
}

impl Http {
    fn parse(
        section: Section,
        context: &Context<'_>,
        errors: &mut Vec<String>,
    ) -> Option<crate::config::Sink> {
        check_heartbeat(context, errors);
        let config: HttpConfig = parse_section("http", section, errors)?;
        let url = validate_http(&config, errors)?;
        Some(Arc::new(Http { config, url }))
    }

    fn from_environment(
        env: &Environment,
        context: &Context<'_>,
        errors: &mut Vec<String>,
    ) -> Option<crate::config::Sink> {
        let config = knative_sink(env, errors)?;
        check_heartbeat(context, errors);
        let url = validate_environment(&config, errors)?;
        Some(Arc::new(Http { config, url }))
    }
}

/// Heartbeats are posted to a URL.
fn check_heartbeat(context: &Context<'_>, errors: &mut Vec<String>) {
    if let Some(Err(e)) = context.heartbeat.map(check_url) {
        errors.push(format!(
            "heartbeat.destination: the http sink posts heartbeats to a URL: {e}"
        ));
    }
}

impl SinkSettings for Http {
    fn kind(&self) -> &'static str {
        "http"
    }

    fn destination(&self) -> Option<&Template> {
        Some(&self.url)
    }

    fn resource_fields(&self) -> ResourceFields {
        ResourceFields {
            destination: Some("url"),
            keys: false,
        }
    }

    /// A resource's `url`: an `http(s)` URL template, tokens in its path and query only.
    fn parse_destination(
        &self,
        at: &str,
        text: &str,
        _: &str,
        errors: &mut Vec<String>,
    ) -> Option<Template> {
        parse_url(at, text, errors)
    }

    fn checkpoints(&self) -> CheckpointSupport {
        CheckpointSupport::Apart { required: true }
    }

    fn secret_files(&self) -> Vec<PathBuf> {
        let c = &self.config.credentials;
        [
            &c.bearer_token_file,
            &c.password_file,
            &c.tls_ca_file,
            &c.tls_cert_file,
            &c.tls_key_file,
        ]
        .into_iter()
        .flatten()
        .cloned()
        .collect()
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

impl Settings for Http {
    fn connect(&self) -> BoxFuture<'_, Result<Arc<AnySink>>> {
        Box::pin(async move {
            let sink = HttpSink::new(&self.config, self.url.clone())?;
            Ok(Arc::new(sink) as Arc<AnySink>)
        })
    }

    fn plan(&self, cluster: &str, r: &ResolvedResource) -> String {
        let url = r.destination(&self.url);
        if url.per_object() {
            format!("http {url} (per object)")
        } else {
            format!("http {}", url.render_url(&r.template_values(cluster)))
        }
    }

    fn subscribe<'a>(&'a self, _: &'a [Scope<'a>], _: bool) -> BoxFuture<'a, Result<Messages>> {
        no_subscription(
            "http",
            "the events are posted to its receiver (sink.http.url)",
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{ConfigFile, invalid};

    /// The HTTP settings of a validated sink.
    pub(crate) fn http(sink: &crate::config::Sink) -> &Http {
        sink.as_any().downcast_ref().expect("an http sink")
    }

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
        let env = Environment::from_pairs([
            (
                K_SINK,
                "http://broker-ingress.knative-eventing.svc/default/default",
            ),
            (K_CE_OVERRIDES, r#"{"extensions": {"team": "a"}}"#),
            (K_CA_CERTS, "-----BEGIN CERTIFICATE-----"),
        ]);
        let cfg = ConfigFile::parse(BASE).unwrap().validate_in(&env).unwrap();
        let Http { config, url } = http(&cfg.sink);
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
        assert_eq!(cfg.sink.kind(), "stdout");

        let bad = Environment::from_pairs([
            (K_SINK, "not a url"),
            (K_CE_OVERRIDES, r#"{"extensions": {"id": "x"}}"#),
        ]);
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

    #[test]
    fn http_sink_is_parsed() {
        let cfg = ConfigFile::parse(
            "cluster: dev\nresources: [{apiVersion: v1, resource: pods}]\ncheckpoint: {directory: /var/lib/keb}\nsink: {http: {url: 'https://h/{namespace}', contentMode: structured, credentials: {bearerTokenFile: /t}}}\n",
        )
        .unwrap()
        .validate()
        .unwrap();
        let Http { config, url } = http(&cfg.sink);
        assert_eq!(url.to_string(), "https://h/{namespace}");
        assert_eq!(config.content_mode, ContentMode::Structured);
        assert_eq!(config.max_in_flight, 64);
        assert_eq!(config.timeout_secs, 10);
        assert_eq!(cfg.sink.kind(), "http");
    }
}
