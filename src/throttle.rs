//! Client-side throttling of API server requests, as client-go does it: a token bucket holding up
//! to `kubernetes.burst` tokens, refilled at `kubernetes.qps` per second, delays the *start* of
//! each request until a token is free. A watch is one request however long it streams, so a
//! bridge that holds its watches spends one token per watch every time one is (re)established.
//!
//! [`ThrottleLayer`] is a tower layer for the kube client's service stack. The kube client puts
//! its stack behind a buffer whose single worker asks the service for readiness before each
//! request, so waiting for a token in `poll_ready` queues requests in arrival order.
//!
//! ```no_run
//! # async fn doc(config: kube::Config) -> Result<(), kube::Error> {
//! use kube_event_bridge::throttle::{Counters, ThrottleLayer};
//!
//! let layer = ThrottleLayer::new(20.0, 30, Counters::process());
//! let client = kube::client::ClientBuilder::try_from(config)?
//!     .with_layer(&layer)
//!     .build();
//! # Ok(())
//! # }
//! ```

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use tokio::time::{Instant, Sleep};
use tower::{Layer, Service};

/// A token bucket: `burst` tokens at most, `rate` new tokens per second.
#[derive(Debug, Clone)]
pub struct Bucket {
    rate: f64,
    burst: f64,
    tokens: f64,
    updated: Instant,
}

/// Tolerance for floating-point refills: a bucket refilled for exactly one token's time holds one.
const EPSILON: f64 = 1e-9;

impl Bucket {
    /// A full bucket at `now`. `rate` must be positive and `burst` at least 1 (checked by the
    /// configuration's validation).
    pub fn new(rate: f64, burst: u32, now: Instant) -> Self {
        let burst = f64::from(burst.max(1));
        Self {
            rate,
            burst,
            tokens: burst,
            updated: now,
        }
    }

    /// Takes a token at `now`, or returns how long until one is free.
    pub fn take(&mut self, now: Instant) -> Result<(), Duration> {
        let elapsed = now.saturating_duration_since(self.updated).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.rate).min(self.burst);
        self.updated = now;
        if self.tokens + EPSILON >= 1.0 {
            self.tokens = (self.tokens - 1.0).max(0.0);
            Ok(())
        } else {
            Err(Duration::from_secs_f64((1.0 - self.tokens) / self.rate))
        }
    }
}

/// What the throttle did, for `/metrics`.
#[derive(Debug, Default)]
pub struct Counters {
    started: AtomicU64,
    throttled: AtomicU64,
    wait_micros: AtomicU64,
}

impl Counters {
    /// The process-wide counters every kube client of the bridge reports to.
    pub fn process() -> Arc<Counters> {
        static PROCESS: LazyLock<Arc<Counters>> = LazyLock::new(Arc::default);
        PROCESS.clone()
    }

    /// Requests started.
    pub fn started(&self) -> u64 {
        self.started.load(Ordering::Relaxed)
    }

    /// Requests that had to wait for a token.
    pub fn throttled(&self) -> u64 {
        self.throttled.load(Ordering::Relaxed)
    }

    /// The time requests spent waiting, in total.
    pub fn waited(&self) -> Duration {
        Duration::from_micros(self.wait_micros.load(Ordering::Relaxed))
    }
}

/// A tower layer delaying the start of each request to `qps` per second, with bursts of `burst`.
#[derive(Debug, Clone)]
pub struct ThrottleLayer {
    qps: f64,
    burst: u32,
    counters: Arc<Counters>,
}

impl ThrottleLayer {
    /// A layer admitting `qps` requests per second on average and `burst` at once, counting into
    /// `counters`.
    pub fn new(qps: f64, burst: u32, counters: Arc<Counters>) -> Self {
        Self {
            qps,
            burst,
            counters,
        }
    }
}

impl<S> Layer<S> for ThrottleLayer {
    type Service = Throttle<S>;

    fn layer(&self, inner: S) -> Throttle<S> {
        let now = Instant::now();
        Throttle {
            inner,
            bucket: Bucket::new(self.qps, self.burst, now),
            permit: Permit::None,
            sleep: Box::pin(tokio::time::sleep_until(now)),
            counters: self.counters.clone(),
        }
    }
}

/// Where the next request stands with the bucket.
#[derive(Debug, Clone, Copy)]
enum Permit {
    /// No token taken yet.
    None,
    /// Waiting for a token since this instant.
    Waiting(Instant),
    /// A token is taken: the next call may start.
    Held,
}

/// The service made by [`ThrottleLayer`].
#[derive(Debug)]
pub struct Throttle<S> {
    inner: S,
    bucket: Bucket,
    permit: Permit,
    sleep: Pin<Box<Sleep>>,
    counters: Arc<Counters>,
}

impl<S, Request> Service<Request> for Throttle<S>
where
    S: Service<Request>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        loop {
            match self.permit {
                Permit::Held => return self.inner.poll_ready(cx),
                Permit::None => {
                    let now = Instant::now();
                    match self.bucket.take(now) {
                        Ok(()) => self.permit = Permit::Held,
                        Err(wait) => {
                            self.sleep.as_mut().reset(now + wait);
                            self.permit = Permit::Waiting(now);
                        }
                    }
                }
                Permit::Waiting(since) => {
                    ready!(self.sleep.as_mut().poll(cx));
                    let now = Instant::now();
                    match self.bucket.take(now) {
                        Ok(()) => {
                            let waited = now.saturating_duration_since(since);
                            self.counters.throttled.fetch_add(1, Ordering::Relaxed);
                            self.counters
                                .wait_micros
                                .fetch_add(waited.as_micros() as u64, Ordering::Relaxed);
                            self.permit = Permit::Held;
                        }
                        Err(wait) => self.sleep.as_mut().reset(now + wait),
                    }
                }
            }
        }
    }

    fn call(&mut self, request: Request) -> Self::Future {
        debug_assert!(
            matches!(self.permit, Permit::Held),
            "call without poll_ready"
        );
        self.permit = Permit::None;
        self.counters.started.fetch_add(1, Ordering::Relaxed);
        self.inner.call(request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower::ServiceExt;

    #[test]
    fn bucket_spends_its_burst_then_refills_at_the_rate() {
        let t0 = Instant::now();
        let mut b = Bucket::new(4.0, 2, t0);
        assert_eq!(b.take(t0), Ok(()));
        assert_eq!(b.take(t0), Ok(()));
        assert_eq!(b.take(t0), Err(Duration::from_millis(250)));
        assert_eq!(b.take(t0 + Duration::from_millis(250)), Ok(()));
        // A long pause refills at most `burst` tokens.
        let later = t0 + Duration::from_secs(60);
        assert_eq!(b.take(later), Ok(()));
        assert_eq!(b.take(later), Ok(()));
        assert!(b.take(later).is_err());
    }

    /// Start times of `n` requests sent at once through a throttle of `qps` and `burst`, in
    /// milliseconds after the first.
    async fn start_times(qps: f64, burst: u32, n: usize, counters: Arc<Counters>) -> Vec<u128> {
        let t0 = Instant::now();
        let service = tower::service_fn(move |()| async move {
            Ok::<_, std::convert::Infallible>(t0.elapsed().as_millis())
        });
        let throttled = ThrottleLayer::new(qps, burst, counters).layer(service);
        // The kube client's stack: a buffer in front, so concurrent callers queue.
        let buffered = tower::buffer::Buffer::new(throttled, 64);
        let calls = (0..n).map(|_| buffered.clone().oneshot(()));
        futures::future::join_all(calls)
            .await
            .into_iter()
            .map(|r| r.expect("service"))
            .collect()
    }

    #[tokio::test(start_paused = true)]
    async fn burst_passes_at_once_then_requests_start_at_the_rate() {
        let counters = Arc::new(Counters::default());
        let mut times = start_times(10.0, 3, 6, counters.clone()).await;
        times.sort_unstable();
        assert_eq!(times, [0, 0, 0, 100, 200, 300]);
        assert_eq!(counters.started(), 6);
        assert_eq!(counters.throttled(), 3);
        // The queue is blocked 100 ms before each of the last three.
        assert_eq!(counters.waited(), Duration::from_millis(300));
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_throttle_refills_its_burst() {
        let counters = Arc::new(Counters::default());
        let t0 = Instant::now();
        let service = tower::service_fn(move |()| async move {
            Ok::<_, std::convert::Infallible>(t0.elapsed().as_millis())
        });
        let mut s = ThrottleLayer::new(2.0, 2, counters.clone()).layer(service);
        let mut at = Vec::new();
        for _ in 0..3 {
            at.push(s.ready().await.unwrap().call(()).await.unwrap());
        }
        tokio::time::sleep(Duration::from_secs(10)).await;
        for _ in 0..3 {
            at.push(s.ready().await.unwrap().call(()).await.unwrap());
        }
        assert_eq!(at, [0, 0, 500, 10_500, 10_500, 11_000]);
        assert_eq!(counters.throttled(), 2);
    }
}
