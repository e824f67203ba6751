//! The standard process metrics (`process_*`, as Prometheus's client libraries name them, without
//! the bridge's prefix): CPU, memory, file descriptors, threads and start time, read from
//! `/proc/self` at scrape time (the `procfs` crate). A field that cannot be read is left out of
//! the scrape, never reported as 0.

use std::fmt;

use procfs::process::{LimitValue, Process};

use super::metrics::single;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::{Registry, Unit};

/// A registry holding the process collector (no prefix).
pub(super) fn registry() -> Registry {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(ProcessCollector));
    registry
}

/// Reads `/proc/self` at scrape time.
#[derive(Debug)]
struct ProcessCollector;

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> fmt::Result {
        let Ok(me) = Process::myself() else {
            return Ok(());
        };
        if let Ok(stat) = me.stat() {
            let ticks = procfs::ticks_per_second() as f64;
            let cpu = (stat.utime + stat.stime) as f64 / ticks;
            single(
                &mut encoder,
                "process_cpu",
                "Total user and system CPU time spent in seconds.",
                Some(&Unit::Seconds),
                ConstCounter::new(cpu),
            )?;
            single(
                &mut encoder,
                "process_resident_memory",
                "Resident memory size in bytes.",
                Some(&Unit::Bytes),
                ConstGauge::new(stat.rss.saturating_mul(procfs::page_size()) as i64),
            )?;
            single(
                &mut encoder,
                "process_virtual_memory",
                "Virtual memory size in bytes.",
                Some(&Unit::Bytes),
                ConstGauge::new(stat.vsize as i64),
            )?;
            single(
                &mut encoder,
                "process_threads",
                "Number of OS threads in the process.",
                None,
                ConstGauge::new(stat.num_threads),
            )?;
            if let Ok(boot) = procfs::boot_time_secs() {
                let started = boot as f64 + stat.starttime as f64 / ticks;
                single(
                    &mut encoder,
                    "process_start_time",
                    "Start time of the process since unix epoch in seconds.",
                    Some(&Unit::Seconds),
                    ConstGauge::new(started),
                )?;
            }
        }
        if let Ok(open) = me.fd_count() {
            single(
                &mut encoder,
                "process_open_fds",
                "Number of open file descriptors.",
                None,
                ConstGauge::new(open as i64),
            )?;
        }
        if let Ok(limits) = me.limits()
            && let LimitValue::Value(max) = limits.max_open_files.soft_limit
        {
            single(
                &mut encoder,
                "process_max_fds",
                "Maximum number of open file descriptors.",
                None,
                ConstGauge::new(max as i64),
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_process_families_are_named_as_prometheus_clients_name_them() {
        // The kernel counts CPU time in ticks: a test process started a moment ago may not have
        // used one yet, so work until it has (its CPU time must then be scraped as above 0).
        let used = || {
            let stat = Process::myself().unwrap().stat().unwrap();
            stat.utime + stat.stime
        };
        let mut spin = 0u64;
        while used() == 0 {
            spin = std::hint::black_box(spin.wrapping_add(1));
        }
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry()).unwrap();
        for sample in [
            "process_cpu_seconds_total ",
            "process_resident_memory_bytes ",
            "process_virtual_memory_bytes ",
            "process_threads ",
            "process_start_time_seconds ",
            "process_open_fds ",
            "process_max_fds ",
        ] {
            let line = text
                .lines()
                .find(|l| l.starts_with(sample))
                .unwrap_or_else(|| panic!("no {sample:?} in:\n{text}"));
            let value: f64 = line[sample.len()..].parse().unwrap();
            assert!(value > 0.0, "{line}");
        }
    }
}
