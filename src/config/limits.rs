//! The values each number of the file accepts ([`Limit`]), checked at validation: absurd values
//! are refused naming the field instead of overflowing a timer, hanging or spinning at run time.
//! Documented in docs/configuration.md ("Limits").

/// The values an integer setting accepts: absurd values are refused at validation, naming the
/// field, instead of overflowing a timer, hanging or spinning at run time. Documented in
/// docs/configuration.md ("Limits").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limit {
    /// The smallest accepted value.
    pub min: u64,
    /// The largest accepted value.
    pub max: u64,
}

impl Limit {
    /// Records a problem at `path` unless `min <= value <= max`.
    pub fn check(self, path: &str, value: impl TryInto<u64>, errors: &mut Vec<String>) {
        let value = value.try_into().unwrap_or(u64::MAX);
        if !(self.min..=self.max).contains(&value) {
            errors.push(format!(
                "{path}: {value} is out of range; allowed: {} to {}",
                self.min, self.max
            ));
        }
    }
}

/// A day: rediscovering less often leaves new CRDs unwatched (without a wildcard) for longer.
pub const DISCOVERY_REFRESH_SECS: Limit = Limit {
    min: 1,
    max: 86_400,
};
/// A day: consumers alert on a heartbeat missing for a few intervals.
pub const HEARTBEAT_INTERVAL_SECS: Limit = Limit {
    min: 1,
    max: 86_400,
};
/// An hour: the pod's termination grace period must cover it.
pub const SHUTDOWN_DELAY_SECS: Limit = Limit { min: 0, max: 3_600 };
/// An hour: the pod's termination grace period must cover it. 0 exits without draining.
pub const SHUTDOWN_GRACE_SECS: Limit = Limit { min: 0, max: 3_600 };
/// An hour: a Lease stores whole seconds, and a standby takes over only after it.
pub const LEASE_DURATION_SECS: Limit = Limit { min: 2, max: 3_600 };
/// Ten minutes, and less than the lease duration.
pub const RETRY_PERIOD_SECS: Limit = Limit { min: 1, max: 600 };
/// An hour: a Lease stores whole seconds, and a killed replica's watches wait this long.
pub const SHARD_LEASE_DURATION_SECS: Limit = Limit { min: 2, max: 3_600 };
/// Ten minutes, and at most half the lease duration.
pub const SHARD_RENEW_SECS: Limit = Limit { min: 1, max: 600 };
/// Ten seconds: each save of a Kafka watch commits the transaction its events were sent in,
/// which must stay well below the transaction timeout.
pub const CHECKPOINT_INTERVAL_MS: Limit = Limit {
    min: 1,
    max: 10_000,
};
/// Requests per second (client-side throttling): 0.01 is one request every 100 s, which
/// already takes minutes to start a handful of watches; above 10,000 there is no throttling.
pub const QPS: (f64, f64) = (0.01, 10_000.0);
/// Requests at once above `qps`.
pub const BURST: Limit = Limit {
    min: 1,
    max: 10_000,
};
/// A day: JetStream keeps every message id of the window in memory.
pub const DUPLICATE_WINDOW_SECS: Limit = Limit {
    min: 1,
    max: 86_400,
};
/// Ten minutes without an acknowledgement is an outage, not a slow server.
pub const ACK_TIMEOUT_SECS: Limit = Limit { min: 1, max: 600 };
/// Changes buffered per watch: a million is beyond any pod's memory already.
pub const QUEUE_CAPACITY: Limit = Limit {
    min: 1,
    max: 1_000_000,
};
/// Publishes awaiting acknowledgement per watch: librdkafka's own queue holds 100,000 messages
/// by default.
pub const MAX_IN_FLIGHT: Limit = Limit {
    min: 1,
    max: 100_000,
};

/// Requests awaiting a response from the HTTP receiver across every watch: beyond ten thousand
/// open connections a receiver refuses or queues them anyway.
pub const HTTP_MAX_IN_FLIGHT: Limit = Limit {
    min: 1,
    max: 10_000,
};
/// Ten minutes without a response is an outage, not a slow receiver.
pub const HTTP_TIMEOUT_SECS: Limit = Limit { min: 1, max: 600 };
/// An hour: a longer `Retry-After` is capped to it, so a receiver cannot park the bridge for days.
pub const HTTP_MAX_RETRY_AFTER_SECS: Limit = Limit { min: 1, max: 3_600 };

/// Bytes per watch between the API server and the broker's acknowledgement: from 1 MiB (a few
/// ordinary objects, and the largest object still passes alone) to 64 GiB.
pub const MAX_QUEUE_BYTES: Limit = Limit {
    min: 1 << 20,
    max: 64 << 30,
};
/// Bytes for every watch of the process together: the same bounds as one watch's.
pub const MAX_TOTAL_QUEUE_BYTES: Limit = MAX_QUEUE_BYTES;
/// Kafka's `transaction.timeout.ms` in seconds: up to the broker's default
/// `transaction.max.timeout.ms` (15 minutes).
pub const TRANSACTION_TIMEOUT_SECS: Limit = Limit { min: 1, max: 900 };
/// The least time between two Kafka transaction commits of one watch: 0 (commit as soon as the
/// previous commit completed) to ten seconds, like `checkpoint.intervalMs`.
pub const COMMIT_INTERVAL_MS: Limit = Limit {
    min: 0,
    max: 10_000,
};

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{ConfigFile, invalid};

    #[test]
    fn api_rate_limits_default_and_are_checked() {
        let base = "cluster: dev\nresources: [{apiVersion: v1, resource: pods}]\n";
        let cfg = ConfigFile::parse(base).unwrap().validate().unwrap();
        assert_eq!((cfg.kubernetes.qps, cfg.kubernetes.burst), (20.0, 30));
        let cfg = ConfigFile::parse(&format!("{base}kubernetes: {{qps: 0.5, burst: 1}}\n"))
            .unwrap()
            .validate()
            .unwrap();
        assert_eq!((cfg.kubernetes.qps, cfg.kubernetes.burst), (0.5, 1));
        let e = invalid(&format!("{base}kubernetes: {{qps: 0, burst: 0}}\n"));
        assert!(
            e.contains("kubernetes.qps: 0 is out of range; allowed: 0.01 to 10000"),
            "{e}"
        );
        assert!(
            e.contains("kubernetes.burst: 0 is out of range; allowed: 1 to 10000"),
            "{e}"
        );
        for (qps, shown) in [
            ("-3", "-3"),
            ("1e-20", "1e-20"),
            (".nan", "NaN"),
            (".inf", "inf"),
            ("-.inf", "-inf"),
            ("1e300", "1e300"),
        ] {
            let e = invalid(&format!("{base}kubernetes: {{qps: {qps}}}\n"));
            assert!(
                e.contains(&format!("kubernetes.qps: {shown} is out of range")),
                "{qps}: {e}"
            );
        }
        let e = invalid(&format!("{base}kubernetes: {{burst: 100000}}\n"));
        assert!(
            e.contains("kubernetes.burst: 100000 is out of range"),
            "{e}"
        );
    }

    /// Every integer setting, the sections it lives in, and the limit it must respect.
    const INTEGERS: &[(&str, &str, Limit)] = &[
        ("delivery", "queueCapacity", QUEUE_CAPACITY),
        ("delivery", "maxInFlight", MAX_IN_FLIGHT),
        ("delivery", "maxQueueBytes", MAX_QUEUE_BYTES),
        ("delivery", "maxTotalQueueBytes", MAX_TOTAL_QUEUE_BYTES),
        ("delivery", "shutdownGraceSecs", SHUTDOWN_GRACE_SECS),
        ("kubernetes", "burst", BURST),
        ("leaderElection", "leaseDurationSecs", LEASE_DURATION_SECS),
        ("leaderElection", "retryPeriodSecs", RETRY_PERIOD_SECS),
        ("sharding", "leaseDurationSecs", SHARD_LEASE_DURATION_SECS),
        ("sharding", "renewSecs", SHARD_RENEW_SECS),
        ("checkpoint", "intervalMs", CHECKPOINT_INTERVAL_MS),
        ("admin", "shutdownDelaySecs", SHUTDOWN_DELAY_SECS),
        ("heartbeat", "intervalSecs", HEARTBEAT_INTERVAL_SECS),
        ("discovery", "refreshSecs", DISCOVERY_REFRESH_SECS),
    ];

    const NATS: &str = "cluster: dev\nresources: [{apiVersion: v1, resource: pods}]\nsink: {nats: {url: 'nats://x', jetstream: {stream: S, ackTimeoutSecs: ACK, duplicateWindowSecs: WINDOW}}}\n";

    #[test]
    fn absurd_integers_are_refused_naming_the_field() {
        let base = "cluster: dev\nresources: [{apiVersion: v1, resource: pods}]\n";
        for (section, key, limit) in INTEGERS {
            let path = format!("{section}.{key}");
            for value in [limit.max + 1, 1_000_000_000_000_000_000, u64::MAX] {
                let e = invalid(&format!("{base}{section}: {{{key}: {value}}}\n"));
                let refused = format!(
                    "{path}: {value} is out of range; allowed: {} to {}",
                    limit.min, limit.max
                );
                // Or, beyond the field's type (kubernetes.burst is a u32), a parse error
                // (`invalid u32 at line 3, column 21`).
                let unparsed = format!("{path}: invalid u32 at line ");
                assert!(e.contains(&refused) || e.starts_with(&unparsed), "{e}");
                assert_eq!(e.matches(&path).count(), 1, "{e}");
            }
            if limit.min > 0 {
                let e = invalid(&format!("{base}{section}: {{{key}: 0}}\n"));
                assert!(e.contains(&format!("{path}: 0 is out of range")), "{e}");
            }
            // The bounds themselves are accepted (a lease must outlast its retry period).
            for value in [limit.min, limit.max] {
                let extra = match (*section, *key) {
                    ("leaderElection", "leaseDurationSecs") => ", retryPeriodSecs: 1",
                    ("leaderElection", "retryPeriodSecs") => ", leaseDurationSecs: 3600",
                    _ => "",
                };
                let yaml = format!("{base}{section}: {{{key}: {value}{extra}}}\n");
                if let Err(e) = ConfigFile::parse(&yaml).unwrap().validate() {
                    panic!("{path}: {value} must be accepted: {e}");
                }
            }
            // Beyond any integer type, and negative: a parse error naming the field.
            for value in ["1e30", "-1", "99999999999999999999999"] {
                let e = invalid(&format!("{base}{section}: {{{key}: {value}}}\n"));
                assert!(e.starts_with(&path), "{e}");
            }
        }
        for (ack, window, needle) in [
            (
                "0",
                "120",
                "sink.nats.jetstream.ackTimeoutSecs: 0 is out of range",
            ),
            (
                "601",
                "120",
                "sink.nats.jetstream.ackTimeoutSecs: 601 is out of range",
            ),
            (
                "10",
                "0",
                "sink.nats.jetstream.duplicateWindowSecs: 0 is out of range",
            ),
            (
                "10",
                "1000000000000000000",
                "sink.nats.jetstream.duplicateWindowSecs: 1000000000000000000 is out of range",
            ),
        ] {
            let e = invalid(&NATS.replace("ACK", ack).replace("WINDOW", window));
            assert!(e.contains(needle), "{e}");
        }
        ConfigFile::parse(&NATS.replace("ACK", "600").replace("WINDOW", "86400"))
            .unwrap()
            .validate()
            .unwrap();
    }

    #[test]
    fn a_kafka_transaction_outlasts_two_checkpoint_intervals() {
        let kafka = |timeout: u64, interval: u64| {
            format!(
                "cluster: dev\nresources: [{{apiVersion: v1, resource: pods}}]\nsink: {{kafka: {{bootstrapServers: 'x:1', transactionTimeoutSecs: {timeout}}}}}\ncheckpoint: {{intervalMs: {interval}}}\n"
            )
        };
        for timeout in [0, 901, 1_000_000_000_000_000_000] {
            let e = invalid(&kafka(timeout, 500));
            assert!(
                e.contains(&format!(
                    "sink.kafka.transactionTimeoutSecs: {timeout} is out of range"
                )),
                "{e}"
            );
        }
        let e = invalid(&kafka(5, 3_000));
        assert!(
            e.contains("sink.kafka.transactionTimeoutSecs: 5 s must be at least twice checkpoint.intervalMs (3000 ms)"),
            "{e}"
        );
        assert!(
            ConfigFile::parse(&kafka(6, 3_000))
                .and_then(ConfigFile::validate)
                .is_ok()
        );
    }
}
