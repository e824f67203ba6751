//! What the bridge does with its allocator while it runs (jemalloc; its settings are in
//! `.cargo/config.toml`, figures in docs/benchmarks.md, "Memory").
//!
//! jemalloc keeps freed objects in a per-thread cache and returns them to the arena only as the
//! thread allocates again, so a thread that goes idle keeps what it last freed: in an idle Kafka
//! bridge, most of what jemalloc counted as allocated sat in the main thread's cache (it runs
//! the start) and librdkafka's threads'. So caches are off by default, and only the threads
//! that carry events turn theirs on ([`async_runtime`], [`thread_cache_on`]); the main thread
//! flushes its cache once the start is done, and it and one worker every [`PERIOD`]
//! ([`release_idle_caches`]), which costs nothing measurable under load. The blocking pool's
//! threads keep theirs off.

use std::time::Duration;

use tikv_jemalloc_ctl::{Access, AsName as _};
use tracing::debug;

/// How often the main thread's cache and one worker's are flushed.
pub const PERIOD: Duration = Duration::from_secs(5);

/// jemalloc's control of the calling thread's cache (read and written through `mallctl`).
const TCACHE_ENABLED: &[u8] = b"thread.tcache.enabled\0";

/// The async runtime the bridge runs on: `workers` worker threads. Its workers allocate with a
/// thread cache ([`thread_cache_on`]), turned on as a worker first wakes from a park (only
/// workers park; a runtime starts with nothing to run, so its workers park at once). Threads of
/// the blocking pool keep theirs off: they wait on Kafka commits and file writes and allocate
/// little, and one that ran the start's blocking calls lives on idle for 10 s, keeping what a
/// cache would hold.
pub fn async_runtime(workers: usize) -> std::io::Result<tokio::runtime::Runtime> {
    thread_local! {
        static WOKEN: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    }
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .on_thread_unpark(|| {
            WOKEN.with(|woken| {
                if !woken.replace(true) {
                    thread_cache_on();
                }
            });
        })
        .build()
}

/// Turns the calling thread's cache on; returns whether it could (the allocator may not be
/// jemalloc). Caches are off by default (`tcache:false` in `.cargo/config.toml`): librdkafka's
/// threads and jemalloc's own allocate little, and their caches kept memory resident in an idle
/// bridge. The threads that carry the events turn theirs on: without a cache the event path
/// costs more CPU (docs/benchmarks.md, "Memory").
pub fn thread_cache_on() -> bool {
    TCACHE_ENABLED.name().write(true).is_ok()
}

/// Flushes the calling thread's cache (turning it off flushes it; it is turned on again at
/// once). Returns whether it could: the allocator may not be jemalloc, or the thread's cache may
/// be off (a thread that never turned it on), which this leaves as it was.
pub fn flush_thread_cache() -> bool {
    let enabled = TCACHE_ENABLED.name();
    match Access::<bool>::read(enabled) {
        Ok(true) => enabled.write(false).is_ok() && enabled.write(true).is_ok(),
        _ => false,
    }
}

/// Flushes the cache of the thread it runs on every [`PERIOD`], until dropped.
pub async fn release_idle_caches() {
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + PERIOD, PERIOD);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if !flush_thread_cache() {
            debug!("no thread cache to flush");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_turns_its_cache_on() {
        std::thread::spawn(|| {
            let enabled = TCACHE_ENABLED.name();
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
    fn workers_cache_and_the_blocking_pool_does_not() {
        let runtime = async_runtime(1).unwrap();
        let cached = || Access::<bool>::read(TCACHE_ENABLED.name()).unwrap();
        runtime.block_on(async {
            // The worker, with nothing to run yet, parks; the task below wakes it.
            tokio::time::sleep(Duration::from_millis(50)).await;
            assert!(tokio::spawn(async move { cached() }).await.unwrap());
            if std::env::var_os("MALLOC_CONF").is_none() {
                assert!(!tokio::task::spawn_blocking(cached).await.unwrap());
            }
        });
    }

    #[test]
    fn flushing_leaves_the_cache_as_it_was() {
        let enabled = TCACHE_ENABLED.name();
        let before: bool = enabled.read().unwrap();
        flush_thread_cache();
        assert_eq!(Access::<bool>::read(enabled).unwrap(), before);
    }
}
