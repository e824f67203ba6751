//! The Kubernetes client of the `kubernetes` configuration section: which kubeconfig and context,
//! or in-cluster, throttled to `kubernetes.qps` and `kubernetes.burst` ([`crate::throttle`]).

use http_body_util::BodyExt;
use hyper_timeout::TimeoutConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use kube::Client;
use kube::client::retry::RetryPolicy;
use kube::client::{Body, ClientBuilder, ConfigExt, DynBody};
use kube::config::{KubeConfigOptions, Kubeconfig};
use tower::retry::RetryLayer;
use tower::util::BoxService;
use tower::{BoxError, ServiceBuilder};

use crate::config::KubernetesConfig;
use crate::secret::redact_url;
use crate::throttle::{self, ThrottleLayer};

use connections::Connections;

mod connections;

/// Errors of building the Kubernetes client.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The kubeconfig could not be read.
    #[error("kubernetes.kubeconfig: cannot read {path}")]
    Kubeconfig {
        /// The file.
        path: String,
        /// The cause.
        #[source]
        source: kube::config::KubeconfigError,
    },
    /// No usable client configuration (in-cluster or kubeconfig).
    #[error("kubernetes: no usable client configuration")]
    ClientConfig(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// The kubeconfig of a cluster's Secret (`clusterSecrets`) is not usable.
    #[error("kubeconfig Secret {secret}: key value: not a usable kubeconfig")]
    SecretKubeconfig {
        /// The Secret, `namespace/name`.
        secret: String,
        /// The cause.
        #[source]
        source: kube::config::KubeconfigError,
    },
    /// The client could not be built.
    #[error("kubernetes: cannot build the client")]
    Client(#[source] kube::Error),
}

/// A `Result` with this module's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Builds a client: the configured kubeconfig and context, else in-cluster, else `KUBECONFIG` or
/// `~/.kube/config`, throttled to `kubernetes.qps` and `kubernetes.burst` ([`crate::throttle`]).
///
/// Each call makes a client with its own token bucket: the watches share one, and leader election
/// has its own, so that a burst of relists cannot delay lease renewals (client-go's controllers
/// give leader election its own client for the same reason).
///
/// A token file (a kubeconfig's `tokenFile`, or the in-cluster service account token) is read
/// again by kube-client once the copy it holds is 50 seconds old, so rotated tokens are picked up.
pub async fn client(k: &KubernetesConfig) -> Result<Client> {
    Ok(client_and_url(k).await?.0)
}

/// A client (as [`client`] builds it) and the API server's URL.
pub async fn client_and_url(k: &KubernetesConfig) -> Result<(Client, String)> {
    let options = KubeConfigOptions {
        context: k.context.clone(),
        ..Default::default()
    };
    let config = match &k.kubeconfig {
        Some(path) => {
            let kubeconfig_error = |source| Error::Kubeconfig {
                path: path.display().to_string(),
                source,
            };
            let kubeconfig = Kubeconfig::read_from(path).map_err(kubeconfig_error)?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &options)
                .await
                .map_err(kubeconfig_error)?
        }
        None if k.context.is_some() => kube::Config::from_kubeconfig(&options)
            .await
            .map_err(|e| Error::ClientConfig(Box::new(e)))?,
        None => kube::Config::infer()
            .await
            .map_err(|e| Error::ClientConfig(Box::new(e)))?,
    };
    throttled(config, k.qps, k.burst)
}

/// A client for the cluster `kubeconfig` reaches (its current context), throttled to `qps` and
/// `burst`, and the API server's URL: a fleet's cluster discovered from the Secret `secret`
/// (`namespace/name`, named by the error).
pub async fn client_from_kubeconfig(
    secret: &str,
    kubeconfig: Kubeconfig,
    qps: f64,
    burst: u32,
) -> Result<(Client, String)> {
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(|source| Error::SecretKubeconfig {
            secret: secret.to_string(),
            source,
        })?;
    throttled(config, qps, burst)
}

/// How long a connection to the API server may stay silent, a request unanswered or a watch
/// without any line, before it counts as dead: a hung API server, or a connection a network
/// drops without a reset, would otherwise hold a watch for ever while the cluster changes. The
/// watch then resumes on a new connection, or fails and stalls, naming the cause. kube-client
/// sets no read timeout of its own. A quiet watch may get no bookmark at all (the API server
/// sends one only when its resourceVersion moved), so the limit is the watches' own timeout (290
/// s, after which a live API server ends them) plus a margin: kube-runtime's watcher idles out
/// after the same 295 s.
pub const READ_IDLE: std::time::Duration = std::time::Duration::from_secs(295);

fn throttled(mut config: kube::Config, qps: f64, burst: u32) -> Result<(Client, String)> {
    config.read_timeout = Some(READ_IDLE);
    // Counted from the request, not from when a pooled connection went idle.
    config.reset_reader_on_write = true;
    let url = config.cluster_url.to_string();
    let throttle = ThrottleLayer::new(qps, burst, throttle::Counters::process());
    let client = stack(config)
        .map_err(Error::Client)?
        .with_layer(&throttle)
        .build();
    Ok((client, url))
}

/// The most a connection to the API server keeps to read responses into: a connection keeps the
/// buffer its largest read needed for as long as it lives, and a watch holds its connection for
/// good (figures in docs/benchmarks.md, "Where the bytes per watched object go").
const READ_BUFFER_MAX: usize = 64 * 1024;

/// The service a [`ClientBuilder`] starts from (kube-client's `GenericService`).
type GenericService = BoxService<http::Request<Body>, http::Response<Box<DynBody>>, BoxError>;

/// kube-client's own stack (`ClientBuilder::try_from`), layer for layer, but for the HTTP
/// client's read buffer ([`READ_BUFFER_MAX`]), its connections (watches apart, [`Connections`])
/// and kube's request tracing layer (a debug `HTTP` span per request, and an error line of its
/// own for a 5xx answer, which the bridge's callers log with their context already). A proxy in
/// the kubeconfig is refused, naming it, as kube-client built without its proxy features
/// refuses it.
fn stack(config: kube::Config) -> Result<ClientBuilder<GenericService>, kube::Error> {
    if let Some(proxy_url) = config.proxy_url {
        // A proxy URL may carry a user and password.
        let shown = redact_url(&proxy_url.to_string())
            .parse()
            .unwrap_or_default();
        return Err(kube::Error::ProxyProtocolUnsupported {
            proxy_url: Box::new(shown),
        });
    }
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    let mut connector = TimeoutConnector::new(config.rustls_https_connector_with_connector(http)?);
    connector.set_connect_timeout(config.connect_timeout);
    connector.set_read_timeout(config.read_timeout);
    connector.set_write_timeout(config.write_timeout);
    connector.set_reset_reader_on_write(config.reset_reader_on_write);
    let mut builder = hyper_util::client::legacy::Builder::new(TokioExecutor::new());
    builder.http1_max_buf_size(READ_BUFFER_MAX);
    let client = Connections::new(builder, connector);
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(
            config
                .default_retry
                .then(|| RetryLayer::new(RetryPolicy::server_retry())),
        )
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .map_err(BoxError::from)
        .map_response(|response: http::Response<hyper::body::Incoming>| {
            response.map(|body| Box::new(BodyExt::map_err(body, BoxError::from)) as Box<DynBody>)
        })
        .service(client);
    Ok(ClientBuilder::new(
        BoxService::new(service),
        config.default_namespace,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_proxy_in_the_kubeconfig_is_refused_naming_it() {
        crate::tls::install_crypto_provider();
        let mut config = kube::Config::new("https://127.0.0.1:6443".parse().unwrap());
        config.proxy_url = Some("http://user:s3cret@proxy.example:3128".parse().unwrap());
        let error = stack(config).err().expect("a proxy is refused").to_string();
        assert!(error.contains("http://***@proxy.example:3128"), "{error}");
        assert!(
            !error.contains("s3cret") && !error.contains("user"),
            "{error}"
        );
        // Without one, the stack is built.
        let config = kube::Config::new("https://127.0.0.1:6443".parse().unwrap());
        assert!(stack(config).is_ok());
    }
}
