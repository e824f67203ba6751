//! What an event carries of its object: the payload mode (`full`, `reference`, `diff`), JSON
//! pointers that redact values or are ignored when deciding whether an update changed anything,
//! and the content digest that makes that decision without keeping the previous object.
//!
//! Pointers follow RFC 6901 and address the object as the API server serves it: `/spec/x`,
//! `/status`, `/metadata/annotations/example.com~1key`, `/metadata/labels/app`.

use kube::api::DynamicObject;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// What replaces a redacted value.
pub const REDACTED: &str = "<redacted>";

/// The annotation `kubectl apply` writes: the whole last applied manifest, in clear.
pub const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// What `data` holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum Mode {
    /// The whole object (after stripping and redaction).
    #[default]
    Full,
    /// `apiVersion`, `kind`, `namespace`, `name`, `uid` and `resourceVersion` only.
    Reference,
    /// `{"object": ..., "patch": [RFC 6902 operations from the previous version], "previous": ...}`.
    Diff,
}

impl Mode {
    /// The value of the `payload` extension.
    pub const fn as_str(self) -> &'static str {
        match self {
            Mode::Full => "full",
            Mode::Reference => "reference",
            Mode::Diff => "diff",
        }
    }
}

/// A parsed JSON pointer and the part of a [`DynamicObject`] it addresses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pointer {
    text: String,
    target: Target,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Target {
    /// `/metadata/annotations` (all) or one annotation.
    Annotations(Option<String>),
    /// `/metadata/labels` (all) or one label.
    Labels(Option<String>),
    /// Anything outside `metadata`: tokens below the object's root.
    Data(Vec<String>),
}

impl Pointer {
    /// Parses an RFC 6901 pointer; the error says what is wrong (the caller adds the field).
    pub fn parse(text: &str) -> Result<Self, String> {
        let Some(rest) = text.strip_prefix('/') else {
            return Err(format!(
                "{text:?} is not a JSON pointer (it must start with '/')"
            ));
        };
        let mut tokens = Vec::new();
        for raw in rest.split('/') {
            let mut token = String::with_capacity(raw.len());
            let mut chars = raw.chars();
            while let Some(c) = chars.next() {
                if c != '~' {
                    token.push(c);
                    continue;
                }
                match chars.next() {
                    Some('0') => token.push('~'),
                    Some('1') => token.push('/'),
                    _ => {
                        return Err(format!(
                            "{text:?}: '~' must be followed by 0 or 1 (RFC 6901)"
                        ));
                    }
                }
            }
            tokens.push(token);
        }
        let target = match tokens.first().map(String::as_str) {
            Some("metadata") => match (tokens.get(1).map(String::as_str), tokens.len()) {
                (Some("annotations"), 2 | 3) => Target::Annotations(tokens.get(2).cloned()),
                (Some("labels"), 2 | 3) => Target::Labels(tokens.get(2).cloned()),
                _ => {
                    return Err(format!(
                        "{text:?}: under /metadata only /metadata/annotations[/key] and /metadata/labels[/key] can be addressed"
                    ));
                }
            },
            Some("apiVersion" | "kind") | Some("") => {
                return Err(format!(
                    "{text:?}: addresses the object's identity, which every event needs"
                ));
            }
            _ => Target::Data(tokens),
        };
        Ok(Self {
            text: text.to_string(),
            target,
        })
    }

    /// The pointer as written.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// Replaces the value at the pointer (every value of a map for `/metadata/annotations` or
    /// `/metadata/labels`) by [`REDACTED`]. A missing value is left missing.
    pub fn redact(&self, object: &mut DynamicObject) {
        match &self.target {
            Target::Annotations(key) => redact_map(object.metadata.annotations.as_mut(), key),
            Target::Labels(key) => redact_map(object.metadata.labels.as_mut(), key),
            Target::Data(tokens) => {
                if let Some(v) = value_mut(&mut object.data, tokens) {
                    *v = Value::String(REDACTED.into());
                }
            }
        }
    }

    /// Removes the value at the pointer and returns what [`Pointer::restore`] needs to put it back.
    fn take(&self, object: &mut DynamicObject) -> Taken {
        match &self.target {
            Target::Annotations(key) => Taken::Map(take_map(&mut object.metadata.annotations, key)),
            Target::Labels(key) => Taken::Map(take_map(&mut object.metadata.labels, key)),
            Target::Data(tokens) => {
                let (last, parent) = tokens.split_last().expect("data pointers have a token");
                match value_mut(&mut object.data, parent) {
                    Some(Value::Object(map)) => Taken::Value(map.remove(last)),
                    Some(Value::Array(items)) => Taken::Value(
                        index(last, items.len())
                            .map(|i| std::mem::replace(&mut items[i], Value::Null)),
                    ),
                    _ => Taken::Value(None),
                }
            }
        }
    }

    fn restore(&self, object: &mut DynamicObject, taken: Taken) {
        match (&self.target, taken) {
            (Target::Annotations(key), Taken::Map(m)) => {
                restore_map(&mut object.metadata.annotations, key, m);
            }
            (Target::Labels(key), Taken::Map(m)) => {
                restore_map(&mut object.metadata.labels, key, m)
            }
            (Target::Data(tokens), Taken::Value(Some(v))) => {
                let (last, parent) = tokens.split_last().expect("data pointers have a token");
                match value_mut(&mut object.data, parent) {
                    Some(Value::Object(map)) => {
                        map.insert(last.clone(), v);
                    }
                    Some(Value::Array(items)) => {
                        if let Some(i) = index(last, items.len()) {
                            items[i] = v;
                        }
                    }
                    _ => {}
                }
            }
            _ => {}
        }
    }
}

type Labels = std::collections::BTreeMap<String, String>;

enum Taken {
    Map(MapTaken),
    Value(Option<Value>),
}

enum MapTaken {
    Whole(Option<Labels>),
    /// The removed value; a map it leaves empty is set to `None`, so an object whose only
    /// annotation is ignored digests like one without annotations.
    One(Option<String>),
}

fn redact_map(map: Option<&mut Labels>, key: &Option<String>) {
    let Some(map) = map else { return };
    match key {
        None => map.values_mut().for_each(|v| *v = REDACTED.into()),
        Some(k) => {
            if let Some(v) = map.get_mut(k) {
                *v = REDACTED.into();
            }
        }
    }
}

fn take_map(map: &mut Option<Labels>, key: &Option<String>) -> MapTaken {
    match key {
        None => MapTaken::Whole(map.take()),
        Some(k) => {
            let value = map.as_mut().and_then(|m| m.remove(k));
            if value.is_some() && map.as_ref().is_some_and(|m| m.is_empty()) {
                *map = None;
            }
            MapTaken::One(value)
        }
    }
}

fn restore_map(map: &mut Option<Labels>, key: &Option<String>, taken: MapTaken) {
    match (key, taken) {
        (None, MapTaken::Whole(m)) => *map = m,
        (Some(k), MapTaken::One(Some(v))) => {
            map.get_or_insert_default().insert(k.clone(), v);
        }
        _ => {}
    }
}

fn index(token: &str, len: usize) -> Option<usize> {
    token.parse::<usize>().ok().filter(|i| *i < len)
}

fn value_mut<'a>(mut v: &'a mut Value, tokens: &[String]) -> Option<&'a mut Value> {
    for t in tokens {
        v = match v {
            Value::Object(map) => map.get_mut(t)?,
            Value::Array(items) => {
                let i = index(t, items.len())?;
                &mut items[i]
            }
            _ => return None,
        };
    }
    Some(v)
}

/// A digest of everything an update could meaningfully change: the object without its
/// resourceVersion, generation (derived from the rest), managedFields and the `ignore`d pointers. Two versions with the same
/// digest differ only in noise. `scratch` is a reusable buffer; the object is left as it was.
/// Never returns 0, which stands for "unknown" in the index.
pub fn digest(object: &mut DynamicObject, ignore: &[Pointer], scratch: &mut Vec<u8>) -> u64 {
    let rv = object.metadata.resource_version.take();
    let generation = object.metadata.generation.take();
    let managed = object.metadata.managed_fields.take();
    let taken: Vec<Taken> = ignore.iter().map(|p| p.take(object)).collect();
    scratch.clear();
    // Serializing a DynamicObject into memory cannot fail.
    serde_json::to_writer(&mut *scratch, &*object).expect("object serializes");
    for (p, t) in ignore.iter().zip(taken).rev() {
        p.restore(object, t);
    }
    object.metadata.managed_fields = managed;
    object.metadata.generation = generation;
    object.metadata.resource_version = rv;
    hash(scratch).max(1)
}

/// A fast, stable 64-bit hash (it is persisted in checkpoints, so it must not change between
/// versions): eight bytes at a time, multiply-rotate mixing, a final avalanche.
pub fn hash(bytes: &[u8]) -> u64 {
    const K: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut h = K ^ (bytes.len() as u64);
    let mut chunks = bytes.chunks_exact(8);
    for c in &mut chunks {
        let w = u64::from_le_bytes(c.try_into().expect("8 bytes"));
        h = (h ^ w).wrapping_mul(K).rotate_left(29);
    }
    let mut tail = [0u8; 8];
    tail[..chunks.remainder().len()].copy_from_slice(chunks.remainder());
    h = (h ^ u64::from_le_bytes(tail)).wrapping_mul(K);
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h
}

/// The diff-mode document: the new object, the RFC 6902 patch that turns the previous version
/// into it (`null` when the previous version is unknown: an add, or the first update after a
/// restart), and the previous version when asked for.
pub fn diff_document(object: &[u8], previous: Option<&[u8]>, include_previous: bool) -> Vec<u8> {
    let patch = previous.and_then(|prev| {
        let before: Value = serde_json::from_slice(prev).ok()?;
        let after: Value = serde_json::from_slice(object).ok()?;
        serde_json::to_vec(&json_patch::diff(&before, &after)).ok()
    });
    let mut out = Vec::with_capacity(
        object.len() * if include_previous { 2 } else { 1 }
            + patch.as_ref().map_or(4, Vec::len)
            + 48,
    );
    out.extend_from_slice(br#"{"object":"#);
    out.extend_from_slice(object);
    out.extend_from_slice(br#","patch":"#);
    out.extend_from_slice(patch.as_deref().unwrap_or(b"null"));
    if include_previous && let Some(prev) = previous {
        out.extend_from_slice(br#","previous":"#);
        out.extend_from_slice(prev);
    }
    out.push(b'}');
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::api::ObjectMeta;
    use serde_json::json;
    use std::collections::BTreeMap;

    fn object() -> DynamicObject {
        DynamicObject {
            types: None,
            metadata: ObjectMeta {
                name: Some("web".into()),
                resource_version: Some("10".into()),
                annotations: Some(BTreeMap::from([
                    ("a/b".to_string(), "x".to_string()),
                    ("keep".to_string(), "y".to_string()),
                ])),
                labels: Some(BTreeMap::from([("app".to_string(), "web".to_string())])),
                ..Default::default()
            },
            data: json!({"spec": {"password": "hunter2", "list": [1, 2, 3]}, "status": {"ready": true}}),
        }
    }

    #[test]
    fn parse_accepts_rfc6901_and_refuses_the_rest() {
        let p = Pointer::parse("/metadata/annotations/a~1b").unwrap();
        assert_eq!(p.target, Target::Annotations(Some("a/b".into())));
        assert_eq!(
            Pointer::parse("/spec/a~0b").unwrap().target,
            Target::Data(vec!["spec".into(), "a~b".into()])
        );
        assert!(
            Pointer::parse("spec")
                .unwrap_err()
                .contains("must start with '/'")
        );
        assert!(Pointer::parse("/spec/~2").unwrap_err().contains("'~'"));
        assert!(
            Pointer::parse("/metadata/name")
                .unwrap_err()
                .contains("under /metadata")
        );
        assert!(Pointer::parse("/kind").unwrap_err().contains("identity"));
    }

    #[test]
    fn redact_replaces_values_in_data_and_metadata() {
        let mut o = object();
        for p in [
            "/spec/password",
            "/metadata/annotations/a~1b",
            "/spec/list/1",
            "/spec/missing",
        ] {
            Pointer::parse(p).unwrap().redact(&mut o);
        }
        assert_eq!(o.data["spec"]["password"], REDACTED);
        assert_eq!(o.data["spec"]["list"], json!([1, REDACTED, 3]));
        assert!(o.data["spec"].get("missing").is_none());
        let ann = o.metadata.annotations.as_ref().unwrap();
        assert_eq!(ann["a/b"], REDACTED);
        assert_eq!(ann["keep"], "y");
        Pointer::parse("/metadata/labels").unwrap().redact(&mut o);
        assert_eq!(o.metadata.labels.as_ref().unwrap()["app"], REDACTED);
    }

    #[test]
    fn digest_ignores_noise_and_leaves_the_object_intact() {
        let ignore = vec![
            Pointer::parse("/status").unwrap(),
            Pointer::parse("/metadata/annotations/keep").unwrap(),
            Pointer::parse("/spec/list/0").unwrap(),
        ];
        let mut scratch = Vec::new();
        let mut a = object();
        let before = serde_json::to_value(&a).unwrap();
        let d = digest(&mut a, &ignore, &mut scratch);
        assert_eq!(
            serde_json::to_value(&a).unwrap(),
            before,
            "restored exactly"
        );

        let mut b = object();
        b.metadata.resource_version = Some("11".into());
        b.metadata.managed_fields = Some(vec![Default::default()]);
        b.data["status"]["ready"] = json!(false);
        b.data["spec"]["list"][0] = json!(9);
        b.metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert("keep".into(), "z".into());
        assert_eq!(
            digest(&mut b, &ignore, &mut scratch),
            d,
            "only noise changed"
        );

        b.data["spec"]["password"] = json!("other");
        assert_ne!(digest(&mut b, &ignore, &mut scratch), d);
        let mut only = object();
        only.metadata.annotations = Some(BTreeMap::from([("keep".to_string(), "y".to_string())]));
        let mut none = object();
        none.metadata.annotations = None;
        let keep = [Pointer::parse("/metadata/annotations/keep").unwrap()];
        assert_eq!(
            digest(&mut only, &keep, &mut scratch),
            digest(&mut none, &keep, &mut scratch),
            "an ignored only annotation is like no annotations"
        );
        assert_eq!(only.metadata.annotations.as_ref().unwrap()["keep"], "y");
        let mut c = object();
        c.metadata.labels = None;
        assert_ne!(digest(&mut c, &ignore, &mut scratch), d);
        assert_ne!(
            digest(&mut object(), &[], &mut scratch),
            d,
            "status counts when not ignored"
        );
    }

    const PINNED: u64 = 2_427_501_623_112_268_591;

    #[test]
    fn hash_is_stable() {
        // Persisted in checkpoints: a change here makes every object look changed once.
        assert_eq!(hash(b"kube-event-bridge"), PINNED);
        assert_ne!(hash(b"abcdefgh1"), hash(b"abcdefgh2"));
        assert_ne!(hash(b"abcdefgh"), hash(b"abcdefgh\0"));
    }

    #[test]
    fn diff_document_patch_turns_previous_into_object() {
        let prev = br#"{"spec":{"a":1,"b":[1,2]},"metadata":{"name":"x"}}"#;
        let new = br#"{"spec":{"a":2,"b":[1,2,3]},"metadata":{"name":"x"}}"#;
        let doc: Value = serde_json::from_slice(&diff_document(new, Some(prev), true)).unwrap();
        let mut patched: Value = serde_json::from_slice(prev).unwrap();
        let patch: json_patch::Patch = serde_json::from_value(doc["patch"].clone()).unwrap();
        json_patch::patch(&mut patched, &patch).unwrap();
        assert_eq!(patched, serde_json::from_slice::<Value>(new).unwrap());
        assert_eq!(
            doc["previous"],
            serde_json::from_slice::<Value>(prev).unwrap()
        );
        let doc: Value = serde_json::from_slice(&diff_document(new, None, true)).unwrap();
        assert_eq!(doc["patch"], Value::Null);
        assert!(doc.get("previous").is_none());
    }
}
