//! HTTP destinations: URL templates whose renderings must be `http(s)` URLs without user
//! information, with tokens only where object names cannot redirect events and credentials.

use crate::template::{Template, Values};

/// Parses a URL template and checks that its renderings are `http(s)` URLs without user
/// information.
pub(super) fn parse_url(at: &str, text: &str, errors: &mut Vec<String>) -> Option<Template> {
    if let Some(problem) = token_before_path(text) {
        errors.push(format!("{at}: {problem}"));
        return None;
    }
    let template = match Template::parse(text) {
        Ok(t) => t,
        Err(e) => {
            errors.push(format!("{at}: {e}"));
            return None;
        }
    };
    let sample = Values {
        cluster: "c",
        group: "g",
        version: "v",
        resource: "r",
        namespace: Some("n"),
        name: "x",
    };
    match check_url(&template.render_url(&sample)) {
        Ok(()) => Some(template),
        Err(problem) => {
            // The URL itself is not repeated: a query string may hold a key.
            errors.push(format!("{at}: {problem}"));
            None
        }
    }
}

/// A token in the scheme, user information, host or port of a URL template: whoever can name
/// an object would choose where its event (and the credentials) go. Tokens may appear in the
/// path and the query only.
fn token_before_path(text: &str) -> Option<String> {
    let authority_end = text
        .find("://")
        .map(|i| i + 3)
        .map(|start| {
            text[start..]
                .find(['/', '?', '#'])
                .map_or(text.len(), |e| start + e)
        })
        .unwrap_or_else(|| text.find(['/', '?', '#']).unwrap_or(text.len()));
    text[..authority_end].contains('{').then(|| {
        "a template token in the scheme, host or port would let object names choose where events and credentials go; tokens may appear in the path and query only"
            .to_string()
    })
}

/// Whether `url` is an absolute `http` or `https` URL without user information.
pub(super) fn check_url(url: &str) -> Result<(), String> {
    let parsed = reqwest::Url::parse(url).map_err(|e| format!("not a URL: {e}"))?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(format!(
            "the scheme is {:?}; only http and https are supported",
            parsed.scheme()
        ));
    }
    if !parsed.username().is_empty() || parsed.password().is_some() {
        return Err(
            "credentials in the URL would show in logs; use credentials.passwordFile or bearerTokenFile"
                .into(),
        );
    }
    if parsed.host_str().is_none_or(str::is_empty) {
        return Err("the URL has no host".into());
    }
    Ok(())
}
