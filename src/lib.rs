//! kube-event-bridge: watches Kubernetes resources and publishes every change as a CloudEvent
//! to Kafka, NATS JetStream or standard output.
//!
//! The pipeline, one per watched resource and namespace scope:
//! [`watch`] (list, watch, bookmarks, relist and diff) → [`change`] → [`encode`] (CloudEvent) →
//! [`sink`] (publish, await the broker's acknowledgement) → [`pipeline`] (ordered acknowledgement).

pub mod admin;
pub mod allocator;
pub mod asyncapi;
pub mod attribute;
pub mod audit;
pub mod backoff;
pub mod budget;
pub mod change;
pub mod checkpoint;
pub mod clusters;
pub mod config;
pub mod crd;
pub mod demand;
pub mod discovery;
pub mod encode;
pub mod fleet;
pub mod knative;
pub mod known;
pub mod kubernetes;
pub mod leader;
pub mod lease;
pub mod payload;
pub mod pipeline;
pub mod rbac;
pub mod runtime;
pub mod schema;
pub mod secret;
pub mod shard;
pub mod shutdown;
pub mod sink;
pub mod snapshot;
pub mod status;
pub mod stores;
pub mod supervisor;
pub mod tail;
pub mod tasks;
pub mod template;
pub mod throttle;
pub mod tls;
pub mod trace;
pub mod watch;

#[cfg(test)]
mod layout {
    //! The source tree's layout rules that the compiler does not check.

    use std::collections::{BTreeMap, BTreeSet};
    use std::path::{Path, PathBuf};

    /// Every `.rs` file under `dir`.
    fn files(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                files(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }

    /// The names that `code` takes from its parent module: `super::x` and `super::{x, y}`, and
    /// `crate::<parent>::x`.
    fn taken_from_parent(code: &str, parent: &[String]) -> BTreeSet<String> {
        let mut names = BTreeSet::new();
        let mut prefixes = vec!["super::".to_string()];
        if !parent.is_empty() {
            prefixes.push(format!("crate::{}::", parent.join("::")));
        }
        for prefix in &prefixes {
            for (at, _) in code.match_indices(prefix.as_str()) {
                let rest = &code[at + prefix.len()..];
                let ident = |text: &str| -> String {
                    text.trim()
                        .chars()
                        .take_while(|c| c.is_alphanumeric() || *c == '_')
                        .collect()
                };
                let found: Vec<String> = match rest.strip_prefix('{') {
                    Some(inner) => inner[..inner.find('}').unwrap_or(inner.len())]
                        .split(',')
                        .map(ident)
                        .collect(),
                    None => vec![ident(rest)],
                };
                names.extend(found.into_iter().filter(|n| !n.is_empty()));
            }
        }
        names
    }

    #[test]
    fn no_two_sibling_modules_import_each_other() {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut all = Vec::new();
        files(&src, &mut all);
        // (parent module path, module name) → names it takes from its parent.
        let mut imports: BTreeMap<(Vec<String>, String), BTreeSet<String>> = BTreeMap::new();
        for path in all {
            let rel = path.strip_prefix(&src).unwrap().with_extension("");
            let mut parts: Vec<String> = rel
                .iter()
                .map(|p| p.to_string_lossy().into_owned())
                .collect();
            let name = parts.pop().unwrap();
            if matches!(name.as_str(), "lib" | "main" | "mod") {
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            let code: String = text[..text.find("#[cfg(test)]").unwrap_or(text.len())]
                .lines()
                .filter(|l| !l.trim_start().starts_with("//"))
                .collect::<Vec<_>>()
                .join("\n");
            let taken = taken_from_parent(&code, &parts);
            imports.insert((parts, name), taken);
        }
        let mut pairs = Vec::new();
        for ((parent, a), taken) in &imports {
            for b in taken.iter().filter(|b| *b > a) {
                let back = imports.get(&(parent.clone(), b.clone()));
                if back.is_some_and(|t| t.contains(a)) {
                    pairs.push(format!("{}: {a} and {b}", parent.join("/")));
                }
            }
        }
        assert!(
            pairs.is_empty(),
            "sibling modules importing each other: {pairs:?}"
        );
    }
}
