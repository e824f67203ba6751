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
    /// Literal text with a character Kafka refuses in topic names.
    #[error(
        "{text:?} contains {found:?}: a Kafka topic name has only letters, digits, '.', '_' and '-'"
    )]
    TopicCharacter {
        /// The literal text.
        text: String,
        /// The first refused character.
        found: char,
    },
    /// Even the shortest rendering is longer than Kafka accepts.
    #[error(
        "renders to at least {length} characters; a Kafka topic name has at most {MAX_TOPIC_LENGTH}"
    )]
    TopicTooLong {
        /// The shortest rendering's length.
        length: usize,
    },
    /// `.` or `..`, which Kafka refuses as topic names.
    #[error("{0:?} is not a legal Kafka topic name")]
    TopicReserved(String),
    /// Literal text with a character that NATS subjects cannot carry outside tokens.
    #[error(
        "{text:?} contains {found:?}: NATS subjects cannot contain whitespace, control characters, '*' or '>' (wildcards)"
    )]
    SubjectCharacter {
        /// The literal text.
        text: String,
        /// The first refused character.
        found: char,
    },
    /// A subject with an empty token.
    #[error(
        "{0:?} has an empty token: a NATS subject cannot start or end with '.' or contain '..'"
    )]
    SubjectEmptyToken(String),
}

/// Characters percent-encoded in URL values: all but RFC 3986's unreserved ones.
const URL_VALUE: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// The longest topic name Kafka accepts.
pub const MAX_TOPIC_LENGTH: usize = 249;

/// Whether Kafka accepts `c` in a topic name.
fn is_topic_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')
}

/// Whether a subject-safe value may carry `c` (dots would add subject levels).
fn is_subject_token_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '_' | '-')
}

/// Checks a complete Kafka topic name: characters, length, and not `.` or `..`.
pub fn check_topic_name(name: &str) -> Result<(), Error> {
    if name.is_empty() {
        return Err(Error::Empty);
    }
    if let Some(found) = name.chars().find(|c| !is_topic_char(*c)) {
        return Err(Error::TopicCharacter {
            text: name.into(),
            found,
        });
    }
    if name == "." || name == ".." {
        return Err(Error::TopicReserved(name.into()));
    }
    if name.len() > MAX_TOPIC_LENGTH {
        return Err(Error::TopicTooLong { length: name.len() });
    }
    Ok(())
}

/// Checks a complete NATS subject to publish to: no whitespace, control characters or
/// wildcards, no empty token.
pub fn check_subject_name(subject: &str) -> Result<(), Error> {
    if subject.is_empty() {
        return Err(Error::Empty);
    }
    if let Some(found) = subject.chars().find(|c| !is_subject_char(*c)) {
        return Err(Error::SubjectCharacter {
            text: subject.into(),
            found,
        });
    }
    if subject.split('.').any(str::is_empty) {
        return Err(Error::SubjectEmptyToken(subject.into()));
    }
    Ok(())
}

/// Whether a NATS subject may carry `c` (`.` separates its tokens).
fn is_subject_char(c: char) -> bool {
    !(c.is_whitespace() || c.is_control() || matches!(c, '*' | '>'))
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

    /// Whether the rendering for `v` is one destination for a whole watch: it names no object,
    /// and names a namespace only when `v` has one.
    pub fn per_watch(&self, v: &Values<'_>) -> bool {
        !self.uses(Token::Name) && (v.namespace.is_some() || !self.uses(Token::Namespace))
    }

    /// Checks that the template renders legal Kafka topic names in cluster `cluster`: its
    /// literal text has only topic characters, and its shortest rendering (every token but
    /// `{cluster}` one character long) is neither too long nor `.` or `..`. Values are made safe
    /// when rendering; a long group, resource or namespace can still exceed the length, which
    /// only the broker can tell.
    pub fn check_topic(&self, cluster: &str) -> Result<(), Error> {
        let mut shortest = String::new();
        for seg in &self.segments {
            match seg {
                Segment::Literal(l) => {
                    if let Some(found) = l.chars().find(|c| !is_topic_char(*c)) {
                        return Err(Error::TopicCharacter {
                            text: l.clone(),
                            found,
                        });
                    }
                    shortest.push_str(l);
                }
                Segment::Token(Token::Cluster) => push_safe(&mut shortest, cluster, is_topic_char),
                Segment::Token(_) => shortest.push('_'),
            }
        }
        check_topic_name(&shortest)
    }

    /// Checks that the template renders legal NATS subjects: its literal text has no
    /// whitespace, control characters or wildcards, and no rendering has an empty token (values
    /// render as one non-empty token each).
    pub fn check_subject(&self) -> Result<(), Error> {
        let mut skeleton = String::new();
        for seg in &self.segments {
            match seg {
                Segment::Literal(l) => {
                    if let Some(found) = l.chars().find(|c| !is_subject_char(*c)) {
                        return Err(Error::SubjectCharacter {
                            text: l.clone(),
                            found,
                        });
                    }
                    skeleton.push_str(l);
                }
                Segment::Token(_) => skeleton.push('_'),
            }
        }
        if skeleton.split('.').any(str::is_empty) {
            return Err(Error::SubjectEmptyToken(self.source.clone()));
        }
        Ok(())
    }

    /// Renders as a Kafka topic name: characters outside `[A-Za-z0-9._-]` in values become `_`.
    pub fn render_topic(&self, v: &Values<'_>) -> String {
        self.render(v, is_topic_char)
    }

    /// Renders as a NATS subject: every value becomes one safe token (dots, wildcards and
    /// whitespace become `_`), so a group such as `apps.example.com` cannot add subject levels.
    pub fn render_subject(&self, v: &Values<'_>) -> String {
        self.render(v, is_subject_token_char)
    }

    /// The subject filter a JetStream stream needs to capture every rendering for `v`'s
    /// per-watch values: per-object tokens become `*`.
    pub fn subject_filter(&self, v: &Values<'_>) -> String {
        self.filter(v, false)
    }

    /// [`Template::subject_filter`] for every cluster: `{cluster}` becomes `*` too (its value is
    /// a DNS label, one subject token), as for the clusters of kubeconfig Secrets, whose names
    /// are not known in advance.
    pub fn subject_filter_any_cluster(&self, v: &Values<'_>) -> String {
        self.filter(v, true)
    }

    fn filter(&self, v: &Values<'_>, any_cluster: bool) -> String {
        let mut out = String::new();
        for seg in &self.segments {
            match seg {
                Segment::Literal(l) => out.push_str(l),
                Segment::Token(Token::Namespace | Token::Name) => out.push('*'),
                Segment::Token(Token::Cluster) if any_cluster => out.push('*'),
                Segment::Token(t) => push_safe(&mut out, v.get(*t), is_subject_token_char),
            }
        }
        // A level that mixes a literal and a wildcard is not a valid filter: widen it.
        out.split('.')
            .map(|level| if level.contains('*') { "*" } else { level })
            .collect::<Vec<_>>()
            .join(".")
    }

    /// Renders as a URL: every value is percent-encoded but for unreserved characters
    /// (letters, digits, `-`, `.`, `_`, `~`), so a name cannot add path segments or a query.
    pub fn render_url(&self, v: &Values<'_>) -> String {
        let mut out = String::with_capacity(self.source.len() + 48);
        for seg in &self.segments {
            match seg {
                Segment::Literal(l) => out.push_str(l),
                Segment::Token(t) => {
                    let value = v.get(*t);
                    let value = if value.is_empty() { "_" } else { value };
                    out.extend(percent_encoding::utf8_percent_encode(value, URL_VALUE));
                }
            }
        }
        out
    }

    /// An AsyncAPI channel address for one resource: the per-watch tokens rendered as a topic
    /// (or, with `subject`, a subject), `{name}` kept as a parameter, `{namespace}` kept as a
    /// parameter with `namespace_parameter`, else rendered from `v` (`_` when `None`), and
    /// `{cluster}` kept as a parameter with `cluster_parameter` (the clusters of kubeconfig
    /// Secrets).
    pub fn address(
        &self,
        v: &Values<'_>,
        subject: bool,
        namespace_parameter: bool,
        cluster_parameter: bool,
    ) -> String {
        let safe = if subject {
            is_subject_token_char
        } else {
            is_topic_char
        };
        let mut out = String::with_capacity(self.source.len() + 48);
        for seg in &self.segments {
            match seg {
                Segment::Literal(l) => out.push_str(l),
                Segment::Token(Token::Name) => out.push_str("{name}"),
                Segment::Token(Token::Namespace) if namespace_parameter => {
                    out.push_str("{namespace}")
                }
                Segment::Token(Token::Cluster) if cluster_parameter => out.push_str("{cluster}"),
                Segment::Token(t) => push_safe(&mut out, v.get(*t), safe),
            }
        }
        out
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
    fn any_cluster_becomes_a_wildcard_token_or_a_parameter() {
        let t = Template::parse("k8s.{cluster}.{group}.{resource}.{namespace}.{name}").unwrap();
        assert_eq!(
            t.subject_filter_any_cluster(&V),
            "k8s.*.stable_example_com.crontabs.*.*"
        );
        let mixed = Template::parse("k8s.c-{cluster}.{resource}").unwrap();
        assert_eq!(mixed.subject_filter_any_cluster(&V), "k8s.*.crontabs");
        assert_eq!(mixed.subject_filter(&V), "k8s.c-dev.crontabs");
        assert_eq!(
            t.address(&V, true, false, true),
            "k8s.{cluster}.stable_example_com.crontabs.team-a.{name}"
        );
        assert_eq!(
            t.address(&V, true, false, false),
            "k8s.dev.stable_example_com.crontabs.team-a.{name}"
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
    fn url_values_are_percent_encoded() {
        let t = Template::parse("https://h/{group}/{namespace}/{name}?r={resource}").unwrap();
        let v = Values {
            name: "system:a/b?c d",
            namespace: None,
            ..V
        };
        assert_eq!(
            t.render_url(&v),
            "https://h/stable.example.com/_/system%3Aa%2Fb%3Fc%20d?r=crontabs"
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

    #[test]
    fn topic_literals_must_be_topic_characters() {
        for ok in [
            "k8s.{cluster}.{group}.{resource}",
            "state_{namespace}-x",
            "{resource}",
        ] {
            assert_eq!(
                Template::parse(ok).unwrap().check_topic("dev"),
                Ok(()),
                "{ok}"
            );
        }
        let e = Template::parse("k8s events.{resource}")
            .unwrap()
            .check_topic("dev");
        assert_eq!(
            e,
            Err(Error::TopicCharacter {
                text: "k8s events.".into(),
                found: ' '
            })
        );
        for bad in ["k8s/{resource}", "k8s:{resource}", "é{resource}", "a*b"] {
            let t = Template::parse(bad).unwrap();
            assert!(
                matches!(t.check_topic("dev"), Err(Error::TopicCharacter { .. })),
                "{bad}"
            );
        }
        for reserved in [".", ".."] {
            assert_eq!(
                Template::parse(reserved).unwrap().check_topic("dev"),
                Err(Error::TopicReserved(reserved.into()))
            );
        }
    }

    #[test]
    fn topic_length_counts_the_cluster_and_one_character_per_other_token() {
        let at_limit = format!("{}.{{resource}}", "x".repeat(MAX_TOPIC_LENGTH - 2));
        assert_eq!(Template::parse(&at_limit).unwrap().check_topic("c"), Ok(()));
        // 245 + '.' + the 4 characters of the cluster name.
        let over = format!("{}.{{cluster}}", "x".repeat(245));
        assert_eq!(
            Template::parse(&over).unwrap().check_topic("abcd"),
            Err(Error::TopicTooLong { length: 250 })
        );
        assert_eq!(Template::parse(&over).unwrap().check_topic("abc"), Ok(()));
        assert!(matches!(
            check_topic_name(&"t".repeat(MAX_TOPIC_LENGTH + 1)),
            Err(Error::TopicTooLong { length: 250 })
        ));
        assert_eq!(check_topic_name(&"t".repeat(MAX_TOPIC_LENGTH)), Ok(()));
        assert_eq!(check_topic_name(""), Err(Error::Empty));
    }

    #[test]
    fn subject_literals_have_no_wildcards_spaces_or_empty_tokens() {
        for ok in [
            "k8s.{cluster}.{group}.{resource}.{namespace}.{name}",
            "audit.{cluster}.cm-{name}",
            "{name}",
        ] {
            assert_eq!(Template::parse(ok).unwrap().check_subject(), Ok(()), "{ok}");
        }
        for (bad, found) in [
            ("k8s.*.{name}", '*'),
            ("k8s.>", '>'),
            ("k8s events.{name}", ' '),
            ("k8s.\t{name}", '\t'),
            ("k8s.\u{7}.{name}", '\u{7}'),
        ] {
            match Template::parse(bad).unwrap().check_subject() {
                Err(Error::SubjectCharacter { found: f, .. }) => assert_eq!(f, found, "{bad}"),
                other => panic!("{bad}: {other:?}"),
            }
        }
        for bad in [
            ".k8s.{name}",
            "k8s.{name}.",
            "k8s..{name}",
            "{cluster}..x",
            ".",
        ] {
            assert_eq!(
                Template::parse(bad).unwrap().check_subject(),
                Err(Error::SubjectEmptyToken(bad.into())),
                "{bad}"
            );
        }
        assert_eq!(check_subject_name("k8s.prod.eu.heartbeats"), Ok(()));
        assert!(matches!(
            check_subject_name("k8s.>"),
            Err(Error::SubjectCharacter { found: '>', .. })
        ));
        assert!(matches!(
            check_subject_name("k8s..x"),
            Err(Error::SubjectEmptyToken(_))
        ));
    }

    #[test]
    fn renderings_of_checked_templates_are_legal() {
        let v = Values {
            group: "a b*c>d",
            name: "x.y z",
            ..V
        };
        let subject =
            Template::parse("k8s.{cluster}.{group}.{resource}.{namespace}.{name}").unwrap();
        subject.check_subject().unwrap();
        assert_eq!(check_subject_name(&subject.render_subject(&v)), Ok(()));
        let topic = Template::parse("k8s.{cluster}.{group}.{namespace}").unwrap();
        topic.check_topic("dev").unwrap();
        assert_eq!(check_topic_name(&topic.render_topic(&v)), Ok(()));
    }
}
