//! The names of the CloudEvents attributes the bridge sets, spelled once: the context attributes
//! of CloudEvents 1.0 and the bridge's extensions. The encoder writes them
//! ([`crate::encode::Event::attributes`]), the HTTP sink's configuration refuses an extension
//! that would replace one ([`RESERVED`]), the AsyncAPI generator describes them and `tail` reads
//! them back.

use std::borrow::Cow;

/// Declares the attribute names: a constant each, [`CARRIED`] and [`RESERVED`], and
/// [`ce_header`] with the binary-mode header of every carried attribute spelled at compile time
/// rather than formatted for every event.
macro_rules! attributes {
    (
        carried: { $($(#[$doc:meta])* $name:ident = $text:literal,)* }
        structured: { $($(#[$sdoc:meta])* $sname:ident = $stext:literal,)* }
    ) => {
        $($(#[$doc])* pub const $name: &str = $text;)*
        $($(#[$sdoc])* pub const $sname: &str = $stext;)*

        /// Every attribute [`crate::encode::Event::attributes`] may yield, in the order it
        /// yields them (an event carries some of them only sometimes).
        pub const CARRIED: &[&str] = &[$($text),*];

        /// The names an extension may not take: every attribute the bridge sets, then the
        /// members of a structured-mode document that are not attributes. The id, `sequence`
        /// and the others are what consumers deduplicate and order by.
        pub const RESERVED: &[&str] = &[$($text,)* $($stext),*];

        /// The binary-mode header of attribute `name`: `ce-<name>` (HTTP, NATS) or `ce_<name>`
        /// (Kafka, `separator` '_'); formatted only for a name not in [`CARRIED`].
        pub fn ce_header(name: &str, separator: char) -> Cow<'static, str> {
            let names = match name {
                $($text => Some((concat!("ce-", $text), concat!("ce_", $text))),)*
                _ => None,
            };
            match (names, separator) {
                (Some((_, kafka)), '_') => Cow::Borrowed(kafka),
                (Some((dash, _)), '-') => Cow::Borrowed(dash),
                _ => Cow::Owned(format!("ce{separator}{name}")),
            }
        }
    };
}

attributes! {
    carried: {
        /// The CloudEvents version: `1.0`.
        SPECVERSION = "specversion",
        /// `{uid}:{resourceVersion}:{change}`: the same change always has the same id.
        ID = "id",
        /// The resource's path (`/k8s/{cluster}/api/v1/configmaps`), or the API server's URL
        /// in Knative format.
        SOURCE = "source",
        /// `io.kubeeventbridge.object.added` and the others, or Knative's types.
        TYPE = "type",
        /// `namespace/name` or `name` (Knative: the object's API path).
        SUBJECT = "subject",
        /// When the watch read the change (RFC 3339).
        TIME = "time",
        /// The event JSON Schema's `$id` (this bridge's format only).
        DATASCHEMA = "dataschema",
        /// The configured cluster name.
        CLUSTER = "cluster",
        /// The object's `apiVersion`.
        APIVERSION = "apiversion",
        /// The object's `kind`.
        KIND = "kind",
        /// The plural resource name.
        RESOURCE = "resource",
        /// The object's namespace (namespaced objects only).
        NAMESPACE = "namespace",
        /// The object's name.
        NAME = "name",
        /// The object's uid.
        UID = "uid",
        /// The object's resourceVersion.
        RESOURCEVERSION = "resourceversion",
        /// The resourceVersion zero-padded to sort as a string.
        SEQUENCE = "sequence",
        /// The record key: the uid, or `namespace/name`.
        PARTITIONKEY = "partitionkey",
        /// Why the event was emitted: `snapshot`, `live` or `repaired`.
        ORIGIN = "origin",
        /// The snapshot on demand an event belongs to: its request's uid (absent otherwise).
        SNAPSHOTID = "snapshotid",
        /// What `data` carries: `full`, `reference` or `diff`.
        PAYLOAD = "payload",
        /// `true` when the payload was cut down to a reference (absent otherwise).
        TRUNCATED = "truncated",
        /// The field manager of the newest write (audit extensions).
        MANAGER = "manager",
        /// The operation of the newest write (audit extensions).
        OPERATION = "operation",
        /// The uid of namespace `kube-system` (audit extensions).
        CLUSTERID = "clusterid",
        /// The W3C `traceparent` of the event's span (the CloudEvents distributed-tracing
        /// extension): a child of the object's trace context annotation, or a new trace.
        TRACEPARENT = "traceparent",
        /// The W3C `tracestate` of the object's trace context annotation, as received (absent
        /// without one).
        TRACESTATE = "tracestate",
    }
    structured: {
        /// The content type of `data`: a member of a structured-mode document, the content type
        /// itself in binary mode.
        DATACONTENTTYPE = "datacontenttype",
        /// The payload of a structured-mode document.
        DATA = "data",
        /// A base64 payload of a structured-mode document (the bridge never writes one).
        DATA_BASE64 = "data_base64",
    }
}
