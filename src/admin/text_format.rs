//! The Prometheus text format (version 0.0.4) of the `/metrics` document, for scrapers that do
//! not ask for OpenMetrics (`Accept: application/openmetrics-text`): the same samples, with the
//! differences of the older format rewritten. A counter family's `# HELP` and `# TYPE` lines name
//! it with its samples' `_total`, `# UNIT` lines and the closing `# EOF` go, and OpenMetrics'
//! `unknown` type is `untyped`.

use std::collections::HashSet;

/// The content type of the Prometheus text format.
pub(super) const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Whether a request's `Accept` header asks for OpenMetrics.
pub(super) fn wants_openmetrics(accept: Option<&str>) -> bool {
    accept.is_some_and(|a| a.contains("application/openmetrics-text"))
}

/// `openmetrics` (an OpenMetrics text document) in the Prometheus text format.
pub(super) fn from_openmetrics(openmetrics: &str) -> String {
    let counters: HashSet<&str> = openmetrics
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|rest| rest.split_once(' '))
        .filter(|(_, kind)| *kind == "counter")
        .map(|(name, _)| name)
        .collect();
    let mut out = String::with_capacity(openmetrics.len());
    for line in openmetrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let rewritten = ["# HELP ", "# TYPE "].iter().find_map(|prefix| {
            let rest = line.strip_prefix(prefix)?;
            let (name, tail) = rest.split_once(' ').unwrap_or((rest, ""));
            let name = match counters.contains(name) {
                true => format!("{name}_total"),
                false => name.to_string(),
            };
            let tail = if *prefix == "# TYPE " && tail == "unknown" {
                "untyped"
            } else {
                tail
            };
            Some(format!("{prefix}{name} {tail}"))
        });
        match rewritten {
            Some(l) => out.push_str(&l),
            None => out.push_str(line),
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const OPENMETRICS: &str = "\
# HELP keb_events_published Events acknowledged.
# TYPE keb_events_published counter
keb_events_published_total{resource=\"v1/configmaps\"} 3
# HELP keb_latency_seconds Latency.
# TYPE keb_latency_seconds histogram
# UNIT keb_latency_seconds seconds
keb_latency_seconds_bucket{le=\"0.1\"} 1
keb_latency_seconds_sum 0.05
keb_latency_seconds_count 1
# HELP keb_ready Ready.
# TYPE keb_ready gauge
keb_ready 1
# TYPE keb_odd unknown
keb_odd 2
# EOF
";

    #[test]
    fn counters_are_named_as_their_samples_and_openmetrics_only_lines_go() {
        let text = from_openmetrics(OPENMETRICS);
        assert!(text.contains("# HELP keb_events_published_total Events acknowledged.\n"));
        assert!(text.contains("# TYPE keb_events_published_total counter\n"));
        assert!(text.contains("keb_events_published_total{resource=\"v1/configmaps\"} 3\n"));
        assert!(text.contains("# TYPE keb_latency_seconds histogram\n"));
        assert!(text.contains("# TYPE keb_ready gauge\nkeb_ready 1\n"));
        assert!(text.contains("# TYPE keb_odd untyped\n"));
        assert!(
            !text.contains("# UNIT") && !text.contains("# EOF"),
            "{text}"
        );
    }

    #[test]
    fn only_an_accept_naming_openmetrics_gets_it() {
        assert!(wants_openmetrics(Some(
            "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"
        )));
        assert!(!wants_openmetrics(Some("text/plain")));
        assert!(!wants_openmetrics(None));
    }
}
