//! Where events go by name: the topic and subject templates of the sink and of resource entries,
//! checked to render legal Kafka topic or NATS subject names.

use crate::template::{Template, Token, Values};

/// What a template names, and so which rules its rendering must follow.
#[derive(Debug, Clone, Copy)]
pub enum Destination<'a> {
    /// A Kafka topic of the bridge in cluster `cluster`.
    Topic {
        /// The cluster name (`{cluster}`).
        cluster: &'a str,
    },
    /// A NATS subject.
    Subject,
}

/// Parses the template at `at` and checks that it renders legal names for `destination`.
pub fn parse_template(
    at: &str,
    text: &str,
    destination: Destination<'_>,
    errors: &mut Vec<String>,
) -> Option<Template> {
    let checked = Template::parse(text).and_then(|t| {
        match destination {
            Destination::Topic { cluster } => t.check_topic(cluster)?,
            Destination::Subject => t.check_subject()?,
        }
        Ok(t)
    });
    match checked {
        Ok(t) if matches!(destination, Destination::Topic { .. }) && t.uses(Token::Name) => {
            errors.push(format!(
                "{at}: {{name}} is not allowed here: one topic per object does not scale"
            ));
            None
        }
        Ok(t) => Some(t),
        Err(e) => {
            errors.push(format!("{at}: {e}"));
            None
        }
    }
}

/// Parses a URL template and checks that its renderings are `http(s)` URLs without user
/// information.
pub fn parse_url(at: &str, text: &str, errors: &mut Vec<String>) -> Option<Template> {
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
        "a template token in the scheme, host or port would let object names choose where          events and credentials go; tokens may appear in the path and query only"
            .to_string()
    })
}

/// Whether `url` is an absolute `http` or `https` URL without user information.
pub fn check_url(url: &str) -> Result<(), String> {
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

#[cfg(test)]
mod tests {
    use crate::config::invalid;

    #[test]
    fn literal_text_of_topics_and_subjects_is_checked() {
        let kafka = "sink: {kafka: {bootstrapServers: 'x:1', topic: 'TOPIC'}}";
        let resources = "resources:\n- {apiVersion: v1, resource: pods}\n- {apiVersion: v1, resource: configmaps}\n- {apiVersion: v1, resource: secrets, topic: 'OVERRIDE'}\n";
        let e = invalid(&format!(
            "cluster: dev\n{}{}\n",
            resources.replace("OVERRIDE", "cm/{resource}"),
            kafka.replace("TOPIC", "k8s events.{resource}")
        ));
        assert!(
            e.contains("sink.kafka.topic: \"k8s events.\" contains ' ': a Kafka topic name"),
            "{e}"
        );
        assert!(
            e.contains("resources[2].topic: \"cm/\" contains '/'"),
            "{e}"
        );
        for (topic, needle) in [
            (
                "..",
                "sink.kafka.topic: \"..\" is not a legal Kafka topic name",
            ),
            (
                &format!("{}{{cluster}}", "t".repeat(247)),
                "sink.kafka.topic: renders to at least 250 characters",
            ),
        ] {
            let e = invalid(&format!(
                "cluster: dev\nresources: [{{apiVersion: v1, resource: pods}}]\n{}\n",
                kafka.replace("TOPIC", topic)
            ));
            assert!(e.contains(needle), "{e}");
        }

        let nats = "sink: {nats: {url: 'nats://x', subject: 'SUBJECT', jetstream: {stream: s}}}";
        let e = invalid(&format!(
            "cluster: dev\n{}{}\n",
            resources
                .replace("topic", "subject")
                .replace("OVERRIDE", "audit..{name}"),
            nats.replace("SUBJECT", "k8s.*.{name}")
        ));
        assert!(
            e.contains("sink.nats.subject: \"k8s.*.\" contains '*': NATS subjects cannot"),
            "{e}"
        );
        assert!(
            e.contains("resources[2].subject: \"audit..{name}\" has an empty token"),
            "{e}"
        );
        for (subject, needle) in [
            ("k8s.>", "contains '>'"),
            ("k8s {name}", "contains ' '"),
            ("{cluster}.", "has an empty token"),
        ] {
            let e = invalid(&format!(
                "cluster: dev\nresources: [{{apiVersion: v1, resource: pods}}]\n{}\n",
                nats.replace("SUBJECT", subject)
            ));
            assert!(e.contains("sink.nats.subject: "), "{e}");
            assert!(e.contains(needle), "{subject}: {e}");
        }
    }
}
