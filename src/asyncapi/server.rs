//! The Server Objects of the sink (each sink describes its own, `sink::describe`), and the
//! origins of the channel addresses of a sink with a server per origin.

use serde_json::{Map, Value};

use crate::sink::describe::{Describe, origin_server_id};

/// The `servers` object and the security schemes it refers to; `None` without a server.
pub(super) fn servers(
    sink: &dyn Describe,
    origins: &Origins,
) -> Option<(Value, Map<String, Value>)> {
    sink.servers(&origins.origins)
}

/// The origins (`scheme://host:port`) of an HTTP sink's channel addresses, each a server: a
/// channel's address is then its URL's path, relative to its server. Empty for other sinks.
#[derive(Debug, Default)]
pub(super) struct Origins {
    /// The sink kind, which names the servers.
    kind: &'static str,
    origins: Vec<String>,
}

impl Origins {
    /// The distinct origins of `addresses`, in order, when `sink` has a server per origin.
    pub(super) fn of<'a>(
        addresses: impl Iterator<Item = &'a str>,
        kind: &'static str,
        sink: &dyn Describe,
    ) -> Self {
        let mut origins = Vec::new();
        if sink.servers_by_origin() {
            for a in addresses {
                let origin = split_url(a).0.to_string();
                if !origins.contains(&origin) {
                    origins.push(origin);
                }
            }
        }
        Origins { kind, origins }
    }

    /// An address as its server's id (HTTP only) and the address relative to it.
    pub(super) fn split(&self, address: Option<String>) -> (Option<String>, Option<String>) {
        match address {
            Some(a) if !self.origins.is_empty() => {
                let (origin, path) = split_url(&a);
                let index = self.origins.iter().position(|o| o == origin).unwrap_or(0);
                // The query string may hold a key: it never appears in the document.
                let path = path.split(['?', '#']).next().unwrap_or(path);
                (
                    Some(origin_server_id(self.kind, index)),
                    Some(path.to_string()),
                )
            }
            other => (None, other),
        }
    }
}

/// `https://host:port/path?q` as (`https://host:port`, `/path?q`).
fn split_url(url: &str) -> (&str, &str) {
    let start = url.find("://").map_or(0, |i| i + 3);
    match url[start..].find('/') {
        Some(i) => url.split_at(start + i),
        None => (url, "/"),
    }
}
