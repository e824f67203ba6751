//! Secrets kept in files (mounted Kubernetes Secrets), so that they never sit in the
//! configuration: NATS passwords, tokens and nkey seeds, HTTP bearer tokens and passwords, the
//! values of Kafka's `propertyFiles`. Every one is read by [`read`], with one rule for what the
//! value is, and errors that name the field and the file but never what the file holds; and
//! [`redact_url`], for URLs that may carry a user and password.

use std::path::{Path, PathBuf};

/// Errors of reading a secret file. Neither variant carries the file's content.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The file could not be read.
    #[error("{field}: cannot read {}", path.display())]
    Read {
        /// The configuration field naming the file (`sink.nats.credentials.tokenFile`).
        field: String,
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The file is not UTF-8 text.
    #[error("{field}: {}: the file is not UTF-8 text", path.display())]
    NotText {
        /// The configuration field naming the file.
        field: String,
        /// The file.
        path: PathBuf,
    },
}

/// A `Result` with this module's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The secret in the file at `path`, named by the configuration field `field` (a full path such
/// as `sink.http.credentials.passwordFile`, used in errors).
///
/// The value is the whole file, without one trailing line break (`\n` or `\r\n`), which `echo`,
/// editors and `kubectl create secret --from-file` of such a file leave; nothing else is removed,
/// so spaces, tabs and any further line breaks are part of the value. The file is read
/// synchronously: secret files are small and read at connection time or once a minute.
pub fn read(field: &str, path: &Path) -> Result<String> {
    let bytes = std::fs::read(path).map_err(|source| Error::Read {
        field: field.into(),
        path: path.into(),
        source,
    })?;
    let mut text = String::from_utf8(bytes).map_err(|_| Error::NotText {
        field: field.into(),
        path: path.into(),
    })?;
    let kept = without_line_break(&text).len();
    text.truncate(kept);
    Ok(text)
}

/// `text` without one trailing `\n` or `\r\n`.
/// The URL with any `user:password@` removed (`***@` in its place), for error messages and
/// logs; a comma-separated list of URLs keeps its form.
pub fn redact_url(url: &str) -> String {
    url.split(',')
        .map(|u| match (u.find("://"), u.rfind('@')) {
            (Some(s), Some(at)) if at > s => format!("{}***@{}", &u[..s + 3], &u[at + 1..]),
            _ => u.to_string(),
        })
        .collect::<Vec<_>>()
        .join(",")
}

fn without_line_break(text: &str) -> &str {
    text.strip_suffix('\n')
        .map_or(text, |t| t.strip_suffix('\r').unwrap_or(t))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_never_reach_messages() {
        assert_eq!(
            redact_url("nats://alice:s3cret@host:4222"),
            "nats://***@host:4222"
        );
        assert_eq!(
            redact_url("nats://host:4222,tls://t@h2"),
            "nats://host:4222,tls://***@h2"
        );
    }

    #[test]
    fn one_trailing_line_break_is_removed_and_nothing_else() {
        for (file, value) in [
            ("s3cret", "s3cret"),
            ("s3cret\n", "s3cret"),
            ("s3cret\r\n", "s3cret"),
            ("s3cret\n\n", "s3cret\n"),
            ("s3cret\r", "s3cret\r"),
            ("  s3 cret\t\n", "  s3 cret\t"),
            ("line one\nline two\n", "line one\nline two"),
            ("\n", ""),
            ("", ""),
        ] {
            assert_eq!(without_line_break(file), value, "{file:?}");
        }
    }

    #[test]
    fn errors_name_the_field_and_the_path_but_never_the_content() {
        let dir = tempfile::tempdir().unwrap();
        let token = dir.path().join("token");
        std::fs::write(&token, "s3cret-token\r\n").unwrap();
        assert_eq!(read("tokenFile", &token).unwrap(), "s3cret-token");

        let missing = dir.path().join("missing");
        let e = read("sink.nats.credentials.tokenFile", &missing).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "sink.nats.credentials.tokenFile: cannot read {}",
                missing.display()
            )
        );
        assert!(std::error::Error::source(&e).is_some());

        let binary = dir.path().join("binary");
        std::fs::write(&binary, b"s3cret\xff\xfe").unwrap();
        let e = read("sink.http.credentials.passwordFile", &binary).unwrap_err();
        let shown = format!("{e} {e:?}");
        assert!(
            shown.starts_with(&format!(
                "sink.http.credentials.passwordFile: {}: the file is not UTF-8 text",
                binary.display()
            )),
            "{shown}"
        );
        assert!(!shown.contains("s3cret"), "{shown}");
    }
}
