//! Checkpoint cost after `k` changes of an index of `N` objects: a journal record (this
//! build's checkpoint between compactions) against a rewrite of the dirty buckets in parts of at
//! most `RECORD_BYTES` (what every checkpoint wrote before the journal, and what a compaction
//! writes). Measures the encoding, which is the part that grows with the index; the broker or
//! disk write comes on top and grows with the same bytes. Prints the bytes each writes, the
//! largest record and the number of records.
//!
//! `cargo bench --bench checkpoint` (`-- journal` or `-- base` for one side).

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_main};
use kube_event_bridge::checkpoint::journal::{Journal, Plan, RECORD_BYTES, Stored};
use kube_event_bridge::known::{BUCKETS, KnownObjects};

fn uid(i: u64) -> String {
    format!("{:08x}-2fa1-11d2-883f-{:012x}", i, i.wrapping_mul(7919))
}

/// `n` objects shaped like ConfigMaps of a real namespace.
fn index(n: u64) -> KnownObjects {
    let mut known = KnownObjects::default();
    for i in 0..n {
        known.observe(
            &uid(i),
            &(1_000_000 + i).to_string(),
            Some("team-platform-production"),
            &format!("deployment-config-{i:07}"),
            i + 1,
        );
    }
    known.take_dirty();
    known.take_changes();
    known
}

/// `k` objects changed, spread over the index (random churn); `round` makes each call new.
fn churn(known: &mut KnownObjects, n: u64, k: u64, round: u64) {
    for j in 0..k {
        let i = (round * k + j).wrapping_mul(2_654_435_761) % n;
        known.observe(
            &uid(i),
            &(2_000_000 + round * k + j).to_string(),
            Some("team-platform-production"),
            &format!("deployment-config-{i:07}"),
            round * k + j + 10_000_000,
        );
    }
}

/// The buckets a compaction rewrites, encoded in parts: (bytes, largest record, records).
fn base(known: &mut KnownObjects) -> (usize, usize, usize) {
    let (mut total, mut largest, mut records) = (0, 0, 0);
    for b in known.take_dirty() {
        for part in known.encode_bucket_parts(b, true, RECORD_BYTES) {
            total += part.len();
            largest = largest.max(part.len());
            records += 1;
        }
    }
    known.take_changes();
    (total, largest, records)
}

/// A journal checkpoint, encoded: (bytes, largest record).
fn journal(known: &mut KnownObjects, journal: &Journal) -> (usize, usize) {
    let Plan::Append(records) = journal.plan(known, true, None) else {
        unreachable!("the bench keeps the journal empty")
    };
    known.take_dirty();
    let largest = records.iter().map(Vec::len).max().unwrap_or(0);
    (records.iter().map(Vec::len).sum(), largest)
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("checkpoint");
    group.sample_size(10).warm_up_time(Duration::from_secs(1));
    for n in [10_000u64, 100_000, 1_000_000] {
        let mut known = index(n);
        let mut stored = Journal::default();
        let parts: Vec<Vec<Vec<u8>>> = (0..BUCKETS)
            .map(|b| known.encode_bucket_parts(b, true, RECORD_BYTES))
            .collect();
        let whole: Vec<(usize, Stored)> = parts
            .iter()
            .enumerate()
            .map(|(b, p)| {
                let bytes = p.iter().map(Vec::len).sum();
                (
                    b,
                    Stored {
                        bytes,
                        parts: p.len(),
                    },
                )
            })
            .collect();
        let largest_bucket = whole.iter().map(|(_, s)| s.bytes).max().unwrap_or(0);
        let largest_record = parts.iter().flatten().map(Vec::len).max().unwrap_or(0);
        eprintln!(
            "N={n}: whole index {} bytes in {} records, largest bucket {largest_bucket} bytes, \
             largest record {largest_record} bytes",
            whole.iter().map(|(_, s)| s.bytes).sum::<usize>(),
            whole.iter().map(|(_, s)| s.parts).sum::<usize>(),
        );
        drop(parts);
        stored.compacted(whole, None);
        let mut round = 0;
        for k in [10u64, 100, 1_000, 10_000] {
            if k * 4 > n {
                continue;
            }
            round += 1;
            churn(&mut known, n, k, round);
            let (base_bytes, base_largest, base_records) = base(&mut known);
            round += 1;
            churn(&mut known, n, k, round);
            let (journal_bytes, journal_largest) = journal(&mut known, &stored);
            eprintln!(
                "N={n} k={k}: base {base_bytes} bytes in {base_records} records (largest \
                 {base_largest}), \
                 journal {journal_bytes} bytes (largest record {journal_largest})"
            );
            for (side, with_journal) in [("base", false), ("journal", true)] {
                group.bench_function(format!("{side}/N={n}/k={k}"), |b| {
                    b.iter_custom(|iters| {
                        let mut spent = Duration::ZERO;
                        for _ in 0..iters {
                            round += 1;
                            churn(&mut known, n, k, round);
                            let start = Instant::now();
                            let written = if with_journal {
                                journal(&mut known, &stored)
                            } else {
                                let (bytes, largest, _) = base(&mut known);
                                (bytes, largest)
                            };
                            spent += start.elapsed();
                            black_box(written);
                        }
                        spent
                    })
                });
            }
        }
    }
    group.finish();
}

fn benches() {
    let mut c = Criterion::default().configure_from_args();
    bench(&mut c);
}

criterion_main!(benches);
