//! The API server client's connections: every watch on a connection of its own, closed when the
//! watch ends; every other request (LIST pages, Leases, discovery) on a shared pool.
//!
//! hyper keeps an HTTP/1 connection's read buffer at the largest size a response needed, for as
//! long as the connection lives (`http1_max_buf_size` caps what it asks for; `BytesMut` may double
//! that), and a pooled connection goes from request to request. A watch holds its connection for
//! as long as it streams, so a watch that took over the connection its LIST's pages had grown kept
//! that buffer for good (docs/benchmarks.md, "A million objects over 1,000 watches"). A watch's
//! own connection grows only with what the watch itself reads, and is given back when the watch
//! ends (a watch is opened about once per watch timeout, so the new connection is cheap).

use std::task::{Context, Poll};

use hyper::body::Incoming;
use hyper_util::client::legacy::connect::Connect;
use hyper_util::client::legacy::{Builder, Client, Error, ResponseFuture};
use kube::client::Body;

/// The two pools: see the module's documentation.
#[derive(Clone, Debug)]
pub(super) struct Connections<C> {
    pooled: Client<C, Body>,
    watches: Client<C, Body>,
}

impl<C: Connect + Clone + Send + Sync + 'static> Connections<C> {
    /// Both pools from `builder`, through `connector`; the watches' keeps no idle connection.
    pub(super) fn new(mut builder: Builder, connector: C) -> Self {
        let pooled = builder.build(connector.clone());
        let watches = builder.pool_max_idle_per_host(0).build(connector);
        Self { pooled, watches }
    }
}

/// Whether a request to `uri` is a watch (`watch=true` in its query, as kube-client asks for
/// one, or `watch=1`).
fn is_watch(uri: &http::Uri) -> bool {
    uri.query().is_some_and(|query| {
        query
            .split('&')
            .any(|pair| pair == "watch=true" || pair == "watch=1")
    })
}

impl<C: Connect + Clone + Send + Sync + 'static> tower::Service<http::Request<Body>>
    for Connections<C>
{
    type Response = http::Response<Incoming>;
    type Error = Error;
    type Future = ResponseFuture;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Error>> {
        // hyper's client is always ready: each request waits for its connection itself.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<Body>) -> ResponseFuture {
        if is_watch(request.uri()) {
            self.watches.request(request)
        } else {
            self.pooled.request(request)
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use http_body_util::Full;
    use hyper::body::Bytes;
    use hyper::server::conn::http1;
    use hyper::service::service_fn;
    use hyper_util::rt::{TokioExecutor, TokioIo};
    use tokio::net::TcpListener;

    use super::*;

    #[test]
    fn watches_are_told_by_their_query() {
        let watch = |uri: &str| is_watch(&uri.parse().unwrap());
        assert!(watch("/api/v1/configmaps?watch=true&resourceVersion=5"));
        assert!(watch("/api/v1/configmaps?resourceVersion=5&watch=1"));
        assert!(!watch("/api/v1/configmaps?limit=500"));
        assert!(!watch("/api/v1/configmaps?watch=false"));
        assert!(!watch("/api/v1/configmaps"));
        assert!(!watch("/api/v1/configmaps?labelSelector=watch%3Dtrue"));
        // As kube-client asks: a watch, a streaming list, a LIST page.
        use kube::api::{ListParams, WatchParams};
        let request = kube::core::Request::new("/api/v1/namespaces/a/configmaps");
        let uri = |r: http::Request<Vec<u8>>| r.uri().clone();
        let params = WatchParams::default();
        assert!(is_watch(&uri(request.watch(&params, "5").unwrap())));
        let streaming = WatchParams::streaming_lists();
        assert!(is_watch(&uri(request.watch(&streaming, "").unwrap())));
        let page = ListParams::default().limit(500);
        assert!(!is_watch(&uri(request.list(&page).unwrap())));
    }

    /// Serves every request on 127.0.0.1, recording each one's path and query with the number
    /// of the connection it came on.
    async fn server() -> (String, Arc<Mutex<Vec<(usize, String)>>>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = seen.clone();
        tokio::spawn(async move {
            for connection in 0.. {
                let (stream, _) = listener.accept().await.unwrap();
                let log = log.clone();
                let service = service_fn(move |request: http::Request<Incoming>| {
                    let uri = request.uri().to_string();
                    log.lock().unwrap().push((connection, uri));
                    // A body larger than a fresh read buffer, as a LIST page is.
                    let body = vec![b' '; 256 * 1024];
                    async move {
                        Ok::<_, std::convert::Infallible>(http::Response::new(Full::new(
                            Bytes::from(body),
                        )))
                    }
                });
                tokio::spawn(http1::Builder::new().serve_connection(TokioIo::new(stream), service));
            }
        });
        (url, seen)
    }

    async fn get(
        connections: &mut Connections<hyper_util::client::legacy::connect::HttpConnector>,
        url: &str,
    ) {
        use http_body_util::BodyExt;
        use tower::Service;
        let request = http::Request::get(url).body(Body::empty()).unwrap();
        let response = connections.call(request).await.unwrap();
        response.into_body().collect().await.unwrap();
        // hyper gives a connection back to its pool on a task of its own.
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }

    /// A LIST's connection goes back to the pool for the next LIST, never to a watch; each
    /// watch gets a new connection, not kept once it ends.
    #[tokio::test]
    async fn watches_never_take_over_a_pooled_connection() {
        let (url, seen) = server().await;
        let mut connections = Connections::new(
            Builder::new(TokioExecutor::new()),
            hyper_util::client::legacy::connect::HttpConnector::new(),
        );
        let list = format!("{url}/api/v1/namespaces/a/configmaps?limit=500");
        let watch = format!("{url}/api/v1/namespaces/a/configmaps?watch=true&resourceVersion=1");
        get(&mut connections, &list).await;
        get(&mut connections, &watch).await;
        get(&mut connections, &list).await;
        get(&mut connections, &watch).await;
        let seen = seen.lock().unwrap().clone();
        let on = |n: usize| seen[n].0;
        assert_eq!(seen.len(), 4, "{seen:?}");
        assert_eq!(
            on(0),
            on(2),
            "the LISTs share a pooled connection: {seen:?}"
        );
        assert!(
            on(1) != on(0) && on(3) != on(0),
            "no watch on the LISTs' connection: {seen:?}"
        );
        assert_ne!(on(1), on(3), "each watch on a new connection: {seen:?}");
    }
}
