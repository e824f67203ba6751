//! An HTTP receiver of CloudEvents for the HTTP sink's tests, in the test process on 127.0.0.1:
//! a hyper server that parses every request with the CloudEvents SDK's HTTP binding
//! (`cloudevents::binding::http::to_event`, binary and structured mode), answers as the test's
//! script says (accept, a status with or without `Retry-After`, a dropped connection), and keeps
//! the accepted events in arrival order for [`crate::harness::Reader`].

#![allow(dead_code)]

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use cloudevents::AttributesReader;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::task::AbortHandle;

use crate::harness::Received;

/// What the receiver answers to one request.
#[derive(Debug, Clone)]
pub enum Reply {
    /// 202 Accepted: the event counts as received.
    Accept,
    /// This status, without a body.
    Status(u16),
    /// This status with a `Retry-After` header of this value.
    RetryAfter(u16, String),
    /// Close the connection without an answer.
    Drop,
    /// Wait this long, then accept (longer than the bridge's timeout: a timeout).
    Slow(Duration),
}

/// One request as the receiver saw it, for scripts and assertions.
#[derive(Debug, Clone)]
pub struct Seen {
    /// The event id (`ce-id`, or `id` of a structured event); empty if unparsable.
    pub id: String,
    /// How many times this id was seen before (0 for the first request).
    pub attempt: usize,
    /// The request path and query.
    pub path: String,
    /// The `Authorization` header.
    pub authorization: Option<String>,
    /// The `Content-Type` header.
    pub content_type: String,
    /// What was answered.
    pub reply: Option<Reply>,
}

type Script = Box<dyn FnMut(&Seen) -> Reply + Send>;

struct Shared {
    accepted: Mutex<Vec<Received>>,
    seen: Mutex<Vec<Seen>>,
    attempts: Mutex<HashMap<String, usize>>,
    /// Requests the SDK could not parse as CloudEvents: a test failure.
    malformed: Mutex<Vec<String>>,
    script: Mutex<Script>,
    tasks: Mutex<Vec<AbortHandle>>,
    /// Requests being answered now, and the most at once.
    in_flight: AtomicUsize,
    max_in_flight: AtomicUsize,
}

/// A running receiver.
#[derive(Clone)]
pub struct Receiver {
    shared: Arc<Shared>,
    port: u16,
    tls: Option<Arc<tokio_rustls::TlsAcceptor>>,
}

impl Receiver {
    /// A plain-HTTP receiver on a free port of 127.0.0.1 that accepts everything.
    pub fn start() -> Receiver {
        Self::bind(0, None)
    }

    /// An HTTPS receiver serving the test environment's broker certificate for 127.0.0.1, which
    /// its CA (`KEB_TESTENV_CA`) signed.
    pub fn start_https() -> Receiver {
        let (ca, _) = crate::support::testenv_cas();
        let pki = Path::new(&ca).parent().unwrap().to_path_buf();
        Receiver::start_tls(&pki.join("broker.crt"), &pki.join("broker.key"))
    }

    /// An HTTPS receiver serving `cert` and `key` (PEM files).
    pub fn start_tls(cert: &Path, key: &Path) -> Receiver {
        use tokio_rustls::rustls::pki_types::pem::PemObject;
        use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
            .expect("certificate file")
            .collect::<Result<_, _>>()
            .expect("PEM certificates");
        let key = PrivateKeyDer::from_pem_file(key).expect("PEM key");
        let provider = Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
        let config = tokio_rustls::rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("TLS versions")
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .expect("server certificate");
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        Self::bind(0, Some(Arc::new(acceptor)))
    }

    fn bind(port: u16, tls: Option<Arc<tokio_rustls::TlsAcceptor>>) -> Receiver {
        let shared = Arc::new(Shared {
            accepted: Mutex::new(Vec::new()),
            seen: Mutex::new(Vec::new()),
            attempts: Mutex::new(HashMap::new()),
            malformed: Mutex::new(Vec::new()),
            script: Mutex::new(Box::new(|_| Reply::Accept)),
            tasks: Mutex::new(Vec::new()),
            in_flight: AtomicUsize::new(0),
            max_in_flight: AtomicUsize::new(0),
        });
        let mut receiver = Receiver { shared, port, tls };
        receiver.listen();
        receiver
    }

    /// Binds the receiver's port (a free one the first time) and serves it.
    fn listen(&mut self) {
        let std_listener =
            std::net::TcpListener::bind(("127.0.0.1", self.port)).expect("bind the receiver");
        std_listener.set_nonblocking(true).expect("nonblocking");
        self.port = std_listener.local_addr().expect("address").port();
        let listener = TcpListener::from_std(std_listener).expect("tokio listener");
        let this = self.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let this2 = this.clone();
                let conn = tokio::spawn(async move { this2.serve(stream).await });
                this.shared.tasks.lock().unwrap().push(conn.abort_handle());
            }
        });
        self.shared.tasks.lock().unwrap().push(task.abort_handle());
    }

    async fn serve(&self, stream: tokio::net::TcpStream) {
        let this = self.clone();
        let service = hyper::service::service_fn(move |req| {
            let this = this.clone();
            async move { this.handle(req).await }
        });
        let builder = hyper::server::conn::http1::Builder::new();
        match &self.tls {
            None => {
                let _ = builder
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            }
            Some(acceptor) => {
                if let Ok(tls) = acceptor.accept(stream).await {
                    let _ = builder.serve_connection(TokioIo::new(tls), service).await;
                }
            }
        }
    }

    /// Stops listening and closes every connection: the bridge sees connections refused.
    pub fn stop(&self) {
        for task in self.shared.tasks.lock().unwrap().drain(..) {
            task.abort();
        }
    }

    /// Listens again on the same port.
    pub fn resume(&mut self) {
        self.listen();
    }

    /// The URL to post to (`http://127.0.0.1:port/` or `https://...`).
    pub fn url(&self) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://127.0.0.1:{}/", self.port)
    }

    /// Answers every request as `script` says.
    pub fn script(&self, script: impl FnMut(&Seen) -> Reply + Send + 'static) {
        *self.shared.script.lock().unwrap() = Box::new(script);
    }

    /// The events accepted so far, in arrival order.
    pub fn accepted(&self) -> Vec<Received> {
        self.shared.accepted.lock().unwrap().clone()
    }

    /// Every request so far.
    pub fn seen(&self) -> Vec<Seen> {
        self.shared.seen.lock().unwrap().clone()
    }

    /// The accepted event at `index`, if it arrived; panics if a request was not a CloudEvent.
    pub fn accepted_at(&self, index: usize) -> Option<Received> {
        let malformed = self.shared.malformed.lock().unwrap();
        assert!(
            malformed.is_empty(),
            "requests the CloudEvents SDK could not parse: {malformed:?}"
        );
        self.shared.accepted.lock().unwrap().get(index).cloned()
    }

    /// The most requests that were being answered at once.
    pub fn max_in_flight(&self) -> usize {
        self.shared.max_in_flight.load(Ordering::SeqCst)
    }

    async fn handle(
        &self,
        req: Request<Incoming>,
    ) -> Result<Response<Full<Bytes>>, std::io::Error> {
        let now = self.shared.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.shared.max_in_flight.fetch_max(now, Ordering::SeqCst);
        let answer = self.answer(req).await;
        self.shared.in_flight.fetch_sub(1, Ordering::SeqCst);
        answer
    }

    async fn answer(
        &self,
        req: Request<Incoming>,
    ) -> Result<Response<Full<Bytes>>, std::io::Error> {
        let (parts, body) = req.into_parts();
        let body = match body.collect().await {
            Ok(b) => b.to_bytes(),
            Err(_) => return Ok(status(400)),
        };
        let header = |name: &str| {
            parts
                .headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        };
        let parsed = cloudevents::binding::http::to_event(&parts.headers, body.to_vec());
        let id = match &parsed {
            Ok(e) => e.id().to_string(),
            Err(e) => {
                self.shared
                    .malformed
                    .lock()
                    .unwrap()
                    .push(format!("{e}: {}", String::from_utf8_lossy(&body)));
                String::new()
            }
        };
        let attempt = {
            let mut attempts = self.shared.attempts.lock().unwrap();
            let n = attempts.entry(id.clone()).or_default();
            *n += 1;
            *n - 1
        };
        let mut seen = Seen {
            id,
            attempt,
            path: parts
                .uri
                .path_and_query()
                .map_or("/".into(), |p| p.to_string()),
            authorization: header("authorization"),
            content_type: header("content-type").unwrap_or_default(),
            reply: None,
        };
        let reply = match &parsed {
            Ok(_) => (self.shared.script.lock().unwrap())(&seen),
            Err(_) => Reply::Status(400),
        };
        seen.reply = Some(reply.clone());
        self.shared.seen.lock().unwrap().push(seen.clone());
        let accept = |this: &Self, event: cloudevents::Event| {
            let headers: BTreeMap<String, String> = parts
                .headers
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_str().unwrap_or_default().to_string()))
                .collect();
            this.shared.accepted.lock().unwrap().push(Received {
                event,
                key: None,
                destination: seen.path.clone(),
                headers,
            });
            status(202)
        };
        let response = match (reply, parsed) {
            (Reply::Accept, Ok(event)) => accept(self, event),
            (Reply::Slow(d), Ok(event)) => {
                tokio::time::sleep(d).await;
                accept(self, event)
            }
            (Reply::Status(code), _) => status(code),
            (Reply::RetryAfter(code, after), _) => {
                let mut r = status(code);
                r.headers_mut()
                    .insert("retry-after", after.parse().expect("header value"));
                r
            }
            // An error from the service makes hyper close the connection without an answer.
            (Reply::Drop, _) => return Err(std::io::Error::other("dropped by the script")),
            (_, Err(_)) => status(400),
        };
        Ok(response)
    }
}

fn status(code: u16) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::new()));
    *r.status_mut() = hyper::StatusCode::from_u16(code).expect("status code");
    r
}

/// The receivers of the tests of this process, by cluster name: `sink_yaml` starts one, and
/// `Reader::for_sink` reads what it accepted.
pub fn for_cluster(cluster: &str) -> Receiver {
    static RECEIVERS: OnceLock<Mutex<BTreeMap<String, Receiver>>> = OnceLock::new();
    RECEIVERS
        .get_or_init(Default::default)
        .lock()
        .unwrap()
        .entry(cluster.to_string())
        .or_insert_with(Receiver::start)
        .clone()
}
