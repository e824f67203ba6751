//! The shape of Knative ApiServerSource's events, for `eventFormat: knative`: its types, its
//! subject (a self link built from a guessed collection name) and its reference payload. The
//! deterministic id and this bridge's extensions are kept alongside.

use crate::change::ChangeKind;
use crate::payload::Mode;

/// The event type Knative gives a change: `dev.knative.apiserver.resource.add|update|delete`
/// for whole objects, `dev.knative.apiserver.ref.*` for references.
pub fn event_type(kind: ChangeKind, payload: Mode) -> &'static str {
    match (payload, kind) {
        (Mode::Reference, ChangeKind::Added) => "dev.knative.apiserver.ref.add",
        (Mode::Reference, ChangeKind::Modified) => "dev.knative.apiserver.ref.update",
        (Mode::Reference, ChangeKind::Deleted) => "dev.knative.apiserver.ref.delete",
        (_, ChangeKind::Added) => "dev.knative.apiserver.resource.add",
        (_, ChangeKind::Modified) => "dev.knative.apiserver.resource.update",
        (_, ChangeKind::Deleted) => "dev.knative.apiserver.resource.delete",
    }
}

/// Knative's subject: `/apis/{apiVersion}/namespaces/{namespace}/{collection}/{name}`, core
/// kinds included under `/apis/v1`, an empty namespace for cluster-scoped objects.
pub fn subject(api_version: &str, namespace: Option<&str>, collection: &str, name: &str) -> String {
    format!(
        "/apis/{api_version}/namespaces/{}/{collection}/{name}",
        namespace.unwrap_or("")
    )
}

/// The collection name Knative derives from a kind (apimachinery's `UnsafeGuessKindToResource`):
/// lowercase, then `s` → `ses`, `y` → `ies`, `endpoints` unchanged, else `+s`. Kept even where it
/// differs from the real plural, because triggers match on the subject Knative produced.
pub fn guess_plural(kind: &str) -> String {
    let singular = kind.to_lowercase();
    if singular.is_empty() || singular.ends_with("endpoints") {
        return singular;
    }
    if singular.ends_with('s') {
        format!("{singular}es")
    } else if let Some(stem) = singular.strip_suffix('y') {
        format!("{stem}ies")
    } else {
        format!("{singular}s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plural_guess_matches_apimachinery() {
        for (kind, plural) in [
            ("Pod", "pods"),
            ("ConfigMap", "configmaps"),
            ("NetworkPolicy", "networkpolicies"),
            ("Ingress", "ingresses"),
            ("Endpoints", "endpoints"),
            ("CronTab", "crontabs"),
        ] {
            assert_eq!(guess_plural(kind), plural);
        }
    }

    #[test]
    fn subject_and_types() {
        assert_eq!(
            subject("v1", Some("default"), "pods", "web"),
            "/apis/v1/namespaces/default/pods/web"
        );
        assert_eq!(
            subject("stable.example.com/v1", None, "crontabs", "x"),
            "/apis/stable.example.com/v1/namespaces//crontabs/x"
        );
        assert_eq!(
            event_type(ChangeKind::Modified, Mode::Full),
            "dev.knative.apiserver.resource.update"
        );
        assert_eq!(
            event_type(ChangeKind::Deleted, Mode::Reference),
            "dev.knative.apiserver.ref.delete"
        );
    }
}
