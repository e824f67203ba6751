//! What the bridge does with its allocator while it runs (jemalloc; its settings are in
//! `.cargo/config.toml`, measured in docs/architecture.md, "Memory").
//!
//! jemalloc keeps freed objects in a per-thread cache (only on the threads that turn theirs on:
//! [`thread_cache_on`]), and returns cached objects to the arena only as the thread allocates
//! more. A thread that goes idle keeps what it cached: after the
//! start (discovery, checkpoint loads, the first LIST) the runtime's worker held about 2 MiB of
//! freed objects for as long as the bridge stayed idle. [`release_idle_caches`] flushes the
//! cache of the worker it runs on every [`PERIOD`], which costs nothing measurable under load
//! and lets jemalloc's background thread return those pages to the system when idle.

use std::time::Duration;

use tikv_jemalloc_ctl::{Access, AsName as _};
use tokio_util::sync::CancellationToken;
use tracing::debug;

/// How often a worker's thread cache is flushed.
pub const PERIOD: Duration = Duration::from_secs(5);

/// The async runtime the bridge runs on: `workers` worker threads. Its threads (workers and
/// blocking pool) allocate with a thread cache ([`thread_cache_on`]).
pub fn async_runtime(workers: usize) -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .on_thread_start(|| {
            thread_cache_on();
        })
        .build()
}

/// Turns the calling thread's cache on; returns whether it could (the allocator may not be
/// jemalloc). Caches are off by default (`tcache:false` in `.cargo/config.toml`): librdkafka's
/// threads and jemalloc's own allocate little, and their caches kept about 1 MiB resident in an
/// idle bridge. The threads that carry the events turn theirs on: without a cache, the event
/// path costs about 17 % more CPU.
pub fn thread_cache_on() -> bool {
    b"thread.tcache.enabled\0".name().write(true).is_ok()
}

/// Flushes the calling thread's cache (turning it off flushes it; it is turned on again at
/// once). Returns whether it could: the allocator may not be jemalloc (tests), or its cache may
/// be off (`MALLOC_CONF=tcache:false`), which this leaves as it was.
pub fn flush_thread_cache() -> bool {
    let enabled = b"thread.tcache.enabled\0".name();
    match Access::<bool>::read(enabled) {
        Ok(true) => enabled.write(false).is_ok() && enabled.write(true).is_ok(),
        _ => false,
    }
}

/// Flushes the cache of the worker thread it runs on every [`PERIOD`], until `stop`.
pub async fn release_idle_caches(stop: CancellationToken) {
    let mut tick = tokio::time::interval(PERIOD);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = tick.tick() => {
                if !flush_thread_cache() {
                    debug!("no thread cache to flush");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_turns_its_cache_on() {
        std::thread::spawn(|| {
            let enabled = b"thread.tcache.enabled\0".name();
            // Off for a new thread, as `.cargo/config.toml` compiles in (unless overridden).
            if std::env::var_os("MALLOC_CONF").is_none() {
                assert!(!Access::<bool>::read(enabled).unwrap());
            }
            assert!(thread_cache_on());
            assert!(Access::<bool>::read(enabled).unwrap());
        })
        .join()
        .unwrap();
    }

    #[test]
    fn flushing_leaves_the_cache_as_it_was() {
        let enabled = b"thread.tcache.enabled\0".name();
        let before: bool = enabled.read().unwrap();
        flush_thread_cache();
        assert_eq!(Access::<bool>::read(enabled).unwrap(), before);
    }
}
