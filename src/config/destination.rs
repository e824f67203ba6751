//! Where events go by name: a sink's destination template (its own, or a `resources[]` entry's
//! replacement), parsed and checked by the rules of the sink that reads it.

use crate::template::{self, Template};

/// Parses the template at `at` and checks it with `check` (the rules of the names it renders),
/// pushing what is wrong, named by `at`, onto `errors`.
pub fn parse_template(
    at: &str,
    text: &str,
    check: impl FnOnce(&Template) -> Result<(), template::Error>,
    errors: &mut Vec<String>,
) -> Option<Template> {
    let checked = Template::parse(text).and_then(|t| {
        check(&t)?;
        Ok(t)
    });
    match checked {
        Ok(t) => Some(t),
        Err(e) => {
            errors.push(format!("{at}: {e}"));
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sinks_rule_decides_and_its_error_is_named_by_the_field() {
        let mut errors = Vec::new();
        let ok = parse_template("sink.x.to", "a.{resource}", |_| Ok(()), &mut errors);
        assert!(ok.is_some() && errors.is_empty(), "{errors:?}");
        let refused = parse_template(
            "sink.x.to",
            "a.{resource}",
            Template::check_subject,
            &mut errors,
        );
        assert!(
            refused.is_some(),
            "a subject rule takes dotted names: {errors:?}"
        );
        let refused = parse_template(
            "resources[1].to",
            "a b",
            Template::check_subject,
            &mut errors,
        );
        assert!(refused.is_none());
        assert!(errors[0].starts_with("resources[1].to: "), "{errors:?}");
        let unparsed = parse_template("sink.x.to", "a.{nope}", |_| Ok(()), &mut errors);
        assert!(unparsed.is_none());
        assert!(errors[1].starts_with("sink.x.to: "), "{errors:?}");
    }
}
