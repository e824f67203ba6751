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
pub(super) fn is_dns_label(s: &str) -> bool {
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
    fn versions() {
        for ok in ["v1", "v1beta1", "v2alpha3", "v10"] {
            assert!(is_version(ok), "{ok}");
        }
        for bad in ["1", "v", "vbeta1", "v1beta", "v1gamma1", "V1"] {
            assert!(!is_version(bad), "{bad}");
        }
    }
}
