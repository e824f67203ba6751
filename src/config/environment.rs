//! The process environment as validation sees it: a snapshot of its variables, so that tests
//! give their own and a sink kind reads the ones it knows (Knative's `K_SINK`).

use std::collections::BTreeMap;

/// Environment variables, empty values counted as unset.
#[derive(Debug, Clone, Default)]
pub struct Environment {
    vars: BTreeMap<String, String>,
}

impl Environment {
    /// The variables of this process.
    pub fn from_process() -> Self {
        Self::from_pairs(std::env::vars())
    }

    /// These variables.
    pub fn from_pairs<K: Into<String>, V: Into<String>>(
        pairs: impl IntoIterator<Item = (K, V)>,
    ) -> Self {
        let vars = pairs
            .into_iter()
            .map(|(k, v)| (k.into(), v.into()))
            .filter(|(_, v)| !v.is_empty())
            .collect();
        Self { vars }
    }

    /// The value of `name`, when set and not empty.
    pub fn var(&self, name: &str) -> Option<&str> {
        self.vars.get(name).map(String::as_str)
    }
}
