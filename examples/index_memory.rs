//! What the known-object index holds per object: builds the indexes of `WATCHES` watches of
//! `OBJECTS` objects in all (ConfigMap-like: random UUIDs, `cm-000123` names, 7-digit
//! resourceVersions, a digest each), then relists every one of them, and prints jemalloc's
//! allocated and active bytes per object after each step, and the time each took.
//!
//! `cargo run --release --example index_memory -- OBJECTS WATCHES` (docs/benchmarks.md, "Where
//! the bytes per watched object go").

use std::time::Instant;

use kube_event_bridge::known::KnownObjects;
use tikv_jemalloc_ctl::{epoch, stats};

#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

const USAGE: &str = "usage: index_memory OBJECTS WATCHES";

/// jemalloc's (allocated, active) bytes now.
fn heap() -> anyhow::Result<(usize, usize)> {
    epoch::advance().map_err(|e| anyhow::anyhow!("jemalloc epoch: {e}"))?;
    let allocated = stats::allocated::read().map_err(|e| anyhow::anyhow!("{e}"))?;
    let active = stats::active::read().map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok((allocated, active))
}

/// Observes object `i` of watch `w` at resourceVersion `rv`.
fn observe(known: &mut KnownObjects, uids: &[String], w: usize, i: usize, rv: u64) {
    known.observe(
        &uids[i],
        &rv.to_string(),
        Some(&format!("scale-{w:04}")),
        &format!("cm-{i:06}"),
        rv.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1,
    );
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let [_, objects, watches] = args.as_slice() else {
        anyhow::bail!("{USAGE}");
    };
    let (objects, watches): (usize, usize) = (objects.parse()?, watches.parse()?);
    anyhow::ensure!(
        watches > 0 && objects % watches == 0,
        "{USAGE}: OBJECTS a multiple of WATCHES"
    );
    let per_watch = objects / watches;
    let uids: Vec<Vec<String>> = (0..watches)
        .map(|_| {
            (0..per_watch)
                .map(|_| {
                    uuid::Uuid::from_bytes(rand::random())
                        .hyphenated()
                        .to_string()
                })
                .collect()
        })
        .collect();
    let report = |step: &str, before: (usize, usize), started: Instant| -> anyhow::Result<()> {
        let now = heap()?;
        println!(
            "{step}: {:.1} B allocated, {:.1} B active per object, {:.0} ns per object",
            (now.0 - before.0) as f64 / objects as f64,
            (now.1 - before.1) as f64 / objects as f64,
            started.elapsed().as_nanos() as f64 / objects as f64,
        );
        Ok(())
    };
    let before = heap()?;
    let started = Instant::now();
    let mut indexes: Vec<KnownObjects> = (0..watches).map(|_| KnownObjects::default()).collect();
    for (w, known) in indexes.iter_mut().enumerate() {
        for i in 0..per_watch {
            observe(known, &uids[w], w, i, 1_000_000 + i as u64);
        }
        known.take_dirty();
        known.take_changes();
    }
    report("listed", before, started)?;
    let started = Instant::now();
    for (w, known) in indexes.iter_mut().enumerate() {
        known.begin_relist();
        for i in 0..per_watch {
            observe(known, &uids[w], w, i, 2_000_000 + i as u64);
        }
        let gone = known.finish_relist();
        assert!(gone.is_empty(), "a relist of every object finds none gone");
        known.take_dirty();
        known.take_changes();
    }
    report("relisted", before, started)?;
    assert_eq!(
        indexes.iter().map(KnownObjects::len).sum::<usize>(),
        objects
    );
    Ok(())
}
