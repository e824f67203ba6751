//! HTTP receiver for `scripts/bench`: acknowledges every request with `202 Accepted` and an empty
//! body once it has read the body, over HTTP/1.1 keep-alive, a task per connection. A Python
//! receiver measured itself rather than the HTTP sink; this one costs little beside it (its cost:
//! docs/benchmarks.md, "Whole bridge: `scripts/bench`").
//!
//! `receiver` prints `listening <address>` on its first line, then runs until killed.

use std::convert::Infallible;

use http_body_util::{BodyExt, Empty};
use hyper::body::{Bytes, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

async fn accept(request: Request<Incoming>) -> Result<Response<Empty<Bytes>>, Infallible> {
    // A failed body read is answered like the others: the bench only needs the sink to go on.
    let _ = request.into_body().collect().await;
    let mut response = Response::new(Empty::new());
    *response.status_mut() = StatusCode::ACCEPTED;
    Ok(response)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    println!("listening {}", listener.local_addr()?);
    loop {
        let (stream, _) = listener.accept().await?;
        stream.set_nodelay(true)?;
        tokio::spawn(async move {
            let _ = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service_fn(accept))
                .await;
        });
    }
}
