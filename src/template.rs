//! Topic and subject templates such as `k8s.{cluster}.{group}.{resource}`.
//!
//! Parsed once at start-up into literal and token segments; rendering is a few pushes onto one
//! `String`, cheap enough for every event.

use std::fmt;

/// Errors of parsing a template.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// `{something}` that is not a known token.
    #[error(
        "unknown token {{{0}}}; known tokens: {{cluster}}, {{group}}, {{version}}, {{resource}}, {{namespace}}, {{name}}"
    )]
    UnknownToken(String),
    /// A `{` without its `}` or the reverse.
    #[error("unbalanced braces")]
    Unbalanced,
    /// Nothing at all.
    #[error("must not be empty")]
    Empty,
}

/// A value that varies per event or per watch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Token {
    /// The cluster name.
    Cluster,
    /// The API group, `core` for the core group.
    Group,
    /// The API version.
    Version,
    /// The plural resource name.
    Resource,
    /// The namespace, `_` for cluster-scoped objects.
    Namespace,
    /// The object's name.
    Name,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Segment {
    Literal(String),
    Token(Token),
}

/// A parsed template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    segments: Vec<Segment>,
    source: String,
}

/// The values a template is rendered with.
#[derive(Debug, Clone, Copy)]
pub struct Values<'a> {
    /// Cluster name.
    pub cluster: &'a str,
    /// API group (`""` for core; rendered `core`).
    pub group: &'a str,
    /// API version.
    pub version: &'a str,
    /// Plural resource.
    pub resource: &'a str,
    /// Namespace, `None` for cluster-scoped objects (rendered `_`).
    pub namespace: Option<&'a str>,
    /// Object name.
    pub name: &'a str,
}

impl Values<'_> {
    fn get(&self, t: Token) -> &str {
        match t {
            Token::Cluster => self.cluster,
            Token::Group if self.group.is_empty() => "core",
            Token::Group => self.group,
            Token::Version => self.version,
            Token::Resource => self.resource,
            Token::Namespace => self.namespace.unwrap_or("_"),
            Token::Name => self.name,
        }
    }
}

impl Template {
    /// Parses `text`.
    pub fn parse(text: &str) -> Result<Self, Error> {
        if text.is_empty() {
            return Err(Error::Empty);
        }
        let mut segments = Vec::new();
        let mut rest = text;
        while !rest.is_empty() {
            match rest.find(['{', '}']) {
                Some(i) if rest.as_bytes()[i] == b'}' => return Err(Error::Unbalanced),
                Some(i) => {
                    if i > 0 {
                        segments.push(Segment::Literal(rest[..i].to_string()));
                    }
                    let end = rest[i..].find('}').ok_or(Error::Unbalanced)? + i;
                    let name = &rest[i + 1..end];
                    let token = match name {
                        "cluster" => Token::Cluster,
                        "group" => Token::Group,
                        "version" => Token::Version,
                        "resource" => Token::Resource,
                        "namespace" => Token::Namespace,
                        "name" => Token::Name,
                        other => return Err(Error::UnknownToken(other.to_string())),
                    };
                    segments.push(Segment::Token(token));
                    rest = &rest[end + 1..];
                }
                None => {
                    segments.push(Segment::Literal(rest.to_string()));
                    rest = "";
                }
            }
        }
        Ok(Self {
            segments,
            source: text.to_string(),
        })
    }

    /// Whether the template uses `token`.
    pub fn uses(&self, token: Token) -> bool {
        self.segments.contains(&Segment::Token(token))
    }

    /// Whether the rendering depends on the object (namespace or name).
    pub fn per_object(&self) -> bool {
        self.uses(Token::Namespace) || self.uses(Token::Name)
    }

    /// Renders as a Kafka topic name: characters outside `[A-Za-z0-9._-]` in values become `_`.
    pub fn render_topic(&self, v: &Values<'_>) -> String {
        self.render(v, |c| {
            c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')
        })
    }

    /// Renders as a NATS subject: every value becomes one safe token (dots, wildcards and
    /// whitespace become `_`), so a group such as `apps.example.com` cannot add subject levels.
    pub fn render_subject(&self, v: &Values<'_>) -> String {
        self.render(v, |c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-'))
    }

    /// The subject filter a JetStream stream needs to capture every rendering for `v`'s
    /// per-watch values: per-object tokens become `*`.
    pub fn subject_filter(&self, v: &Values<'_>) -> String {
        let mut out = String::new();
        for seg in &self.segments {
            match seg {
                Segment::Literal(l) => out.push_str(l),
                Segment::Token(Token::Namespace | Token::Name) => out.push('*'),
                Segment::Token(t) => push_safe(&mut out, v.get(*t), |c| {
                    c.is_ascii_alphanumeric() || matches!(c, '_' | '-')
                }),
            }
        }
        // A level that mixes a literal and a wildcard is not a valid filter: widen it.
        out.split('.')
            .map(|level| if level.contains('*') { "*" } else { level })
            .collect::<Vec<_>>()
            .join(".")
    }

    fn render(&self, v: &Values<'_>, safe: impl Fn(char) -> bool + Copy) -> String {
        let mut out = String::with_capacity(self.source.len() + 48);
        for seg in &self.segments {
            match seg {
                Segment::Literal(l) => out.push_str(l),
                Segment::Token(t) => push_safe(&mut out, v.get(*t), safe),
            }
        }
        out
    }
}

fn push_safe(out: &mut String, value: &str, safe: impl Fn(char) -> bool) {
    if value.is_empty() {
        out.push('_');
        return;
    }
    out.extend(value.chars().map(|c| if safe(c) { c } else { '_' }));
}

impl fmt::Display for Template {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.source)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const V: Values<'static> = Values {
        cluster: "dev",
        group: "stable.example.com",
        version: "v1",
        resource: "crontabs",
        namespace: Some("team-a"),
        name: "my.tab",
    };

    #[test]
    fn topic_keeps_dots_of_the_group() {
        let t = Template::parse("k8s.{cluster}.{group}.{resource}").unwrap();
        assert_eq!(t.render_topic(&V), "k8s.dev.stable.example.com.crontabs");
        let core = Values { group: "", ..V };
        assert_eq!(t.render_topic(&core), "k8s.dev.core.crontabs");
    }

    #[test]
    fn subject_tokens_are_made_safe() {
        let t = Template::parse("k8s.{cluster}.{group}.{resource}.{namespace}.{name}").unwrap();
        assert_eq!(
            t.render_subject(&V),
            "k8s.dev.stable_example_com.crontabs.team-a.my_tab"
        );
        let cluster_scoped = Values {
            namespace: None,
            name: "a*b>c d",
            ..V
        };
        assert_eq!(
            t.render_subject(&cluster_scoped),
            "k8s.dev.stable_example_com.crontabs._.a_b_c_d"
        );
    }

    #[test]
    fn subject_filter_widens_per_object_levels() {
        let t = Template::parse("k8s.{cluster}.{group}.{resource}.ns-{namespace}.{name}").unwrap();
        assert_eq!(
            t.subject_filter(&V),
            "k8s.dev.stable_example_com.crontabs.*.*"
        );
    }

    #[test]
    fn parse_errors() {
        assert_eq!(
            Template::parse("a.{nope}"),
            Err(Error::UnknownToken("nope".into()))
        );
        assert_eq!(Template::parse("a.{cluster"), Err(Error::Unbalanced));
        assert_eq!(Template::parse("a}"), Err(Error::Unbalanced));
        assert_eq!(Template::parse(""), Err(Error::Empty));
    }
}
