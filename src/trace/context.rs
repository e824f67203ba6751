//! The W3C Trace Context of one event: the caller's context read from an object's annotations
//! ([`Parent::parse`], [`parse_state`]), and the event's own span in it ([`TraceContext::child`])
//! or in a new trace ([`TraceContext::root`]), rendered as a `traceparent` value once.

use rand::RngCore;

/// The `sampled` bit of the trace flags, the only flag of version 00.
const SAMPLED: u8 = 0x01;
/// `00-{32 hex}-{16 hex}-{2 hex}`.
const TRACEPARENT_LEN: usize = 55;
/// W3C: a `tracestate` has at most 32 list members.
const STATE_MEMBERS_MAX: usize = 32;
/// W3C asks vendors to propagate at least 512 characters; a longer one is not carried.
const STATE_LEN_MAX: usize = 512;

/// Why an annotation holds no usable trace context.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// Not `version-traceid-parentid-flags` in lowercase hexadecimal.
    #[error("traceparent is not version-traceid-parentid-flags in lowercase hexadecimal")]
    Malformed,
    /// Version `ff`, which W3C forbids.
    #[error("traceparent version ff is forbidden")]
    Version,
    /// An all-zero trace id or parent id.
    #[error("traceparent has an all-zero trace id or parent id")]
    ZeroId,
    /// Not a list of at most 32 `key=value` members in at most 512 printable characters.
    #[error("tracestate is not at most 32 key=value members in at most 512 printable characters")]
    State,
}

/// A `Result` with this module's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The caller's trace context, from an object's annotation: the span the event's span continues.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Parent {
    /// The trace.
    pub trace_id: [u8; 16],
    /// The caller's span.
    pub span_id: [u8; 8],
    /// Whether the caller records the trace (`sampled`).
    pub sampled: bool,
}

impl Parent {
    /// Parses a `traceparent` value (surrounding whitespace ignored). A version above 00 is read
    /// for its first four fields, as W3C asks, when what follows them starts with `-`.
    pub fn parse(value: &str) -> Result<Self> {
        let b = value.trim().as_bytes();
        let version = hex::<1>(b.get(..2)).ok_or(Error::Malformed)?[0];
        let fits = match (version, b.len()) {
            (0, len) => len == TRACEPARENT_LEN,
            (_, len) => len == TRACEPARENT_LEN || b.get(TRACEPARENT_LEN) == Some(&b'-'),
        };
        if version == 0xff {
            return Err(Error::Version);
        }
        if !fits || [2, 35, 52].iter().any(|&i| b[i] != b'-') {
            return Err(Error::Malformed);
        }
        let trace_id = hex::<16>(b.get(3..35)).ok_or(Error::Malformed)?;
        let span_id = hex::<8>(b.get(36..52)).ok_or(Error::Malformed)?;
        let flags = hex::<1>(b.get(53..55)).ok_or(Error::Malformed)?[0];
        if trace_id == [0; 16] || span_id == [0; 8] {
            return Err(Error::ZeroId);
        }
        Ok(Self {
            trace_id,
            span_id,
            sampled: flags & SAMPLED != 0,
        })
    }
}

/// Checks a `tracestate` value (surrounding whitespace ignored): at most 32 comma-separated
/// `key=value` members of printable ASCII in at most 512 characters. The bridge carries it as
/// received and never adds a member of its own.
pub fn parse_state(value: &str) -> Result<&str> {
    let value = value.trim();
    let members: Vec<&str> = value
        .split(',')
        .map(str::trim)
        .filter(|m| !m.is_empty())
        .collect();
    let printable = value.bytes().all(|b| (0x20..0x7f).contains(&b));
    let well_formed = members.iter().all(|m| {
        m.split_once('=')
            .is_some_and(|(k, v)| !k.is_empty() && !v.is_empty())
    });
    let fits =
        !members.is_empty() && members.len() <= STATE_MEMBERS_MAX && value.len() <= STATE_LEN_MAX;
    (printable && well_formed && fits)
        .then_some(value)
        .ok_or(Error::State)
}

/// The trace context an event carries: its own span, a child of the object's [`Parent`] or the
/// root of a new trace.
#[derive(Debug, Clone)]
pub struct TraceContext {
    trace_id: [u8; 16],
    span_id: [u8; 8],
    parent: Option<Parent>,
    sampled: bool,
    state: Option<String>,
    /// The `traceparent` value, rendered once.
    text: [u8; TRACEPARENT_LEN],
}

impl TraceContext {
    /// A new span in `parent`'s trace. Nothing is recorded here unless spans are exported, so
    /// the caller's sampling decision is passed on as received (W3C).
    pub fn child(parent: Parent, state: Option<String>, rng: &mut impl RngCore) -> Self {
        let mut context = Self::new(parent.trace_id, span_id(rng), parent.sampled);
        context.parent = Some(parent);
        context.state = state;
        context
    }

    /// The root span of a new trace: random trace and span ids, not sampled (this bridge records
    /// nothing unless spans are exported).
    pub fn root(rng: &mut impl RngCore) -> Self {
        let mut trace_id = [0; 16];
        while trace_id == [0; 16] {
            rng.fill_bytes(&mut trace_id);
        }
        Self::new(trace_id, span_id(rng), false)
    }

    fn new(trace_id: [u8; 16], span_id: [u8; 8], sampled: bool) -> Self {
        let mut context = Self {
            trace_id,
            span_id,
            parent: None,
            sampled,
            state: None,
            text: [b'-'; TRACEPARENT_LEN],
        };
        context.render();
        context
    }

    /// Takes the ids and sampling decision of the span that was recorded for the event (the
    /// exporter's), keeping the parent and `tracestate`.
    pub fn recorded_as(&mut self, trace_id: [u8; 16], span_id: [u8; 8], sampled: bool) {
        self.trace_id = trace_id;
        self.span_id = span_id;
        self.sampled = sampled;
        self.render();
    }

    fn render(&mut self) {
        self.text[..2].copy_from_slice(b"00");
        hex_into(&mut self.text[3..35], &self.trace_id);
        hex_into(&mut self.text[36..52], &self.span_id);
        hex_into(&mut self.text[53..], &[u8::from(self.sampled)]);
    }

    /// The `traceparent` value: `00-{trace id}-{span id}-{flags}`.
    #[inline]
    pub fn traceparent(&self) -> &str {
        // Rendered from hexadecimal digits and dashes only.
        std::str::from_utf8(&self.text).unwrap_or_default()
    }

    /// The caller's `tracestate`, carried as received.
    #[inline]
    pub fn tracestate(&self) -> Option<&str> {
        self.state.as_deref()
    }

    /// The trace id.
    pub fn trace_id(&self) -> [u8; 16] {
        self.trace_id
    }

    /// The event's span id.
    pub fn span_id(&self) -> [u8; 8] {
        self.span_id
    }

    /// The caller's context, when the object named one.
    pub fn parent(&self) -> Option<Parent> {
        self.parent
    }

    /// Whether the trace is recorded (`sampled`).
    pub fn sampled(&self) -> bool {
        self.sampled
    }
}

/// A random span id, never all zeros.
fn span_id(rng: &mut impl RngCore) -> [u8; 8] {
    let mut id = [0; 8];
    while id == [0; 8] {
        rng.fill_bytes(&mut id);
    }
    id
}

/// `N` bytes from `2N` lowercase hexadecimal digits (uppercase is invalid in a `traceparent`).
fn hex<const N: usize>(digits: Option<&[u8]>) -> Option<[u8; N]> {
    let digits = digits.filter(|d| d.len() == 2 * N)?;
    let nibble = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    let mut out = [0; N];
    for (byte, pair) in out.iter_mut().zip(digits.chunks_exact(2)) {
        *byte = nibble(pair[0])? << 4 | nibble(pair[1])?;
    }
    Some(out)
}

fn hex_into(out: &mut [u8], bytes: &[u8]) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for (pair, byte) in out.chunks_exact_mut(2).zip(bytes) {
        pair[0] = DIGITS[usize::from(byte >> 4)];
        pair[1] = DIGITS[usize::from(byte & 0xf)];
    }
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    use super::*;

    const W3C_EXAMPLE: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

    #[test]
    fn a_valid_traceparent_is_read_field_by_field() {
        let parent = Parent::parse(W3C_EXAMPLE).unwrap();
        assert_eq!(
            parent.trace_id,
            [
                0x0a, 0xf7, 0x65, 0x19, 0x16, 0xcd, 0x43, 0xdd, 0x84, 0x48, 0xeb, 0x21, 0x1c, 0x80,
                0x31, 0x9c
            ]
        );
        assert_eq!(
            parent.span_id,
            [0xb7, 0xad, 0x6b, 0x71, 0x69, 0x20, 0x33, 0x31]
        );
        assert!(parent.sampled);
        let unsampled = W3C_EXAMPLE.replace("-01", "-00");
        assert!(!Parent::parse(&unsampled).unwrap().sampled);
        assert_eq!(Parent::parse(&format!(" {W3C_EXAMPLE}\n")), Ok(parent));
    }

    #[test]
    fn invalid_traceparents_are_refused_with_their_reason() {
        let zero_trace = "00-00000000000000000000000000000000-b7ad6b7169203331-01";
        let zero_span = "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01";
        for (value, error) in [
            ("", Error::Malformed),
            ("hello", Error::Malformed),
            (&W3C_EXAMPLE.to_uppercase(), Error::Malformed),
            (&W3C_EXAMPLE[..54], Error::Malformed),
            (&format!("{W3C_EXAMPLE}-extra"), Error::Malformed),
            (&W3C_EXAMPLE.replace('-', "_"), Error::Malformed),
            (&W3C_EXAMPLE.replacen("00", "ff", 1), Error::Version),
            (zero_trace, Error::ZeroId),
            (zero_span, Error::ZeroId),
        ] {
            assert_eq!(Parent::parse(value), Err(error), "{value:?}");
        }
    }

    #[test]
    fn a_later_version_is_read_for_its_first_four_fields() {
        let v1 = W3C_EXAMPLE.replacen("00", "01", 1);
        assert!(Parent::parse(&v1).is_ok());
        assert!(Parent::parse(&format!("{v1}-more")).is_ok());
        assert_eq!(Parent::parse(&format!("{v1}more")), Err(Error::Malformed));
    }

    #[test]
    fn the_child_continues_the_trace_with_a_new_span() {
        let mut rng = StdRng::seed_from_u64(7);
        let parent = Parent::parse(W3C_EXAMPLE).unwrap();
        let child = TraceContext::child(parent, Some("congo=t61rcWkgMzE".into()), &mut rng);
        let text = child.traceparent();
        assert_eq!(text.len(), 55);
        assert!(text.starts_with("00-0af7651916cd43dd8448eb211c80319c-"));
        assert!(text.ends_with("-01"), "the caller's sampled flag: {text}");
        assert_ne!(&text[36..52], "b7ad6b7169203331");
        assert_eq!(child.parent(), Some(parent));
        assert_eq!(child.tracestate(), Some("congo=t61rcWkgMzE"));
        let reread = Parent::parse(text).unwrap();
        assert_eq!(reread.trace_id, parent.trace_id);
        assert_eq!(reread.span_id, child.span_id());
    }

    #[test]
    fn a_root_starts_a_new_unsampled_trace_each_time() {
        let mut rng = StdRng::seed_from_u64(7);
        let a = TraceContext::root(&mut rng);
        let b = TraceContext::root(&mut rng);
        assert_ne!(a.trace_id(), b.trace_id());
        assert_ne!(a.span_id(), b.span_id());
        assert!(a.traceparent().ends_with("-00"));
        assert_eq!(a.parent(), None);
        assert_eq!(a.tracestate(), None);
        assert!(Parent::parse(a.traceparent()).is_ok());
    }

    #[test]
    fn the_recorded_span_replaces_the_ids() {
        let mut rng = StdRng::seed_from_u64(7);
        let mut context = TraceContext::root(&mut rng);
        context.recorded_as([0xab; 16], [0xcd; 8], true);
        assert_eq!(
            context.traceparent(),
            "00-abababababababababababababababab-cdcdcdcdcdcdcdcd-01"
        );
    }

    #[test]
    fn tracestate_is_carried_when_well_formed() {
        assert_eq!(
            parse_state(" rojo=00f067aa0ba902b7,congo=t61rcWkgMzE "),
            Ok("rojo=00f067aa0ba902b7,congo=t61rcWkgMzE")
        );
        let many = vec!["k=v"; 33].join(",");
        let long = format!("k={}", "v".repeat(STATE_LEN_MAX));
        for bad in [
            "",
            "novalue",
            "=v",
            "k=",
            "k=\u{e9}",
            many.as_str(),
            long.as_str(),
        ] {
            assert_eq!(parse_state(bad), Err(Error::State), "{bad:?}");
        }
    }
}
