//! Names Kubernetes and the brokers accept: DNS labels and subdomains (namespaces, the cluster
//! name, API groups), API versions (`v1`, `v2beta1`), JetStream stream and bucket names.

/// A JetStream stream or KV bucket name: letters, digits, `_` and `-`.
pub fn is_nats_name(s: &str) -> bool {
    !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

/// A DNS label (RFC 1123), as namespace names are: lowercase letters, digits and `-`, at most
/// 63 characters, neither starting nor ending with `-`.
pub fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// A DNS subdomain: dot-separated labels, at most 253 characters.
pub(super) fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty() && s.len() <= 253 && s.split('.').all(is_dns_label)
}

/// An annotation key (a qualified name): an optional DNS subdomain prefix and `/`, then a name
/// of at most 63 letters, digits, `-`, `_` and `.` that starts and ends with a letter or digit.
pub(super) fn is_qualified_name(s: &str) -> bool {
    let (prefix, name) = match s.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, s),
    };
    let edge = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    prefix.is_none_or(is_dns_subdomain)
        && name.len() <= 63
        && edge(name.chars().next())
        && edge(name.chars().last())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// A Kubernetes API version: `v1`, `v2alpha3`, `v1beta1`.
pub(super) fn is_version(v: &str) -> bool {
    let Some(rest) = v.strip_prefix('v') else {
        return false;
    };
    let digits = rest.chars().take_while(|c| c.is_ascii_digit()).count();
    if digits == 0 {
        return false;
    }
    let tail = &rest[digits..];
    tail.is_empty()
        || ["alpha", "beta"].iter().any(|p| {
            tail.strip_prefix(p)
                .is_some_and(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dns_labels() {
        for ok in ["a", "east-1", "0", &"a".repeat(63)] {
            assert!(is_dns_label(ok), "{ok}");
        }
        for bad in ["", "-a", "a-", "A", "a.b", "a_b", &"a".repeat(64)] {
            assert!(!is_dns_label(bad), "{bad}");
        }
    }

    #[test]
    fn versions() {
        for ok in ["v1", "v1beta1", "v2alpha3", "v10"] {
            assert!(is_version(ok), "{ok}");
        }
        for bad in ["1", "v", "vbeta1", "v1beta", "v1gamma1", "V1"] {
            assert!(!is_version(bad), "{bad}");
        }
    }

    #[test]
    fn annotation_keys() {
        for ok in ["tracing.k8s.io/traceparent", "traceparent", "a/B_c.d-9"] {
            assert!(is_qualified_name(ok), "{ok}");
        }
        let long = "x".repeat(64);
        for bad in [
            "",
            "/x",
            "a/",
            "A_b/x",
            "a/b/c",
            "-x",
            "x-",
            "a b",
            long.as_str(),
        ] {
            assert!(!is_qualified_name(bad), "{bad}");
        }
    }
}
