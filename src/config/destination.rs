//! Where events go by name: the topic and subject templates of the sink and of resource entries,
//! checked to render legal Kafka topic or NATS subject names.

use crate::template::{Template, Token};

/// What a template names, and so which rules its rendering must follow.
#[derive(Debug, Clone, Copy)]
pub(super) enum Destination<'a> {
    /// A Kafka topic of the bridge in cluster `cluster`.
    Topic {
        /// The cluster name (`{cluster}`).
        cluster: &'a str,
    },
    /// A NATS subject.
    Subject,
}

/// Parses the template at `at` and checks that it renders legal names for `destination`.
pub(super) fn parse_template(
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
