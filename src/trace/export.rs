//! OTLP export of the bridge's spans, configured by the standard `OTEL_*` variables and off
//! unless they ask for it: an OTLP endpoint (`OTEL_EXPORTER_OTLP_ENDPOINT`,
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) or `OTEL_TRACES_EXPORTER=otlp`. The exporter speaks
//! OTLP over HTTP/protobuf and reads its other settings itself (headers, timeout, compression
//! not built in); the SDK reads the sampler (`OTEL_TRACES_SAMPLER`), the batch processor
//! (`OTEL_BSP_*`) and the resource (`OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`).
//!
//! Only the per-event spans ([`TARGET`]) are exported; while export is off ([`exporting`] is
//! false) none is created.

use std::sync::atomic::{AtomicBool, Ordering};

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{SpanExporter, WithExportConfig as _, WithHttpConfig as _};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing::Level;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::{Layer, Registry};

mod client;

/// The `tracing` target of the per-event spans: the only spans exported.
pub const TARGET: &str = "kube_event_bridge::event";

/// `service.name` unless `OTEL_SERVICE_NAME` or `OTEL_RESOURCE_ATTRIBUTES` names one.
const SERVICE_NAME: &str = "kube-event-bridge";

/// Set once the exporter's layer is installed: per-event spans are created only then.
static EXPORTING: AtomicBool = AtomicBool::new(false);

/// Whether spans are exported: checked once per event before any span is created.
pub fn exporting() -> bool {
    EXPORTING.load(Ordering::Relaxed)
}

/// Errors of setting up the export.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// `OTEL_TRACES_EXPORTER` names an exporter this build does not have.
    #[error("OTEL_TRACES_EXPORTER={0:?}: this build exports spans with otlp (or none)")]
    Exporter(String),
    /// An OTLP protocol other than `http/protobuf`.
    #[error("{var}={value:?}: this build exports OTLP over http/protobuf only")]
    Protocol {
        /// The variable.
        var: &'static str,
        /// Its value.
        value: String,
    },
    /// The HTTP client could not be built.
    #[error("cannot build the OTLP HTTP client")]
    Client(#[source] reqwest::Error),
    /// The exporter refused its settings (an endpoint that is not a URL).
    #[error("cannot build the OTLP span exporter")]
    Build(#[source] opentelemetry_otlp::ExporterBuildError),
}

/// A `Result` with this module's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Whether the variables (read through `var`) ask for span export: `OTEL_SDK_DISABLED=true` or
/// `OTEL_TRACES_EXPORTER=none` never; `OTEL_TRACES_EXPORTER=otlp` always; otherwise when an OTLP
/// endpoint is set. The spec's default exporter is otlp, but a bridge exports only when told
/// where to.
pub fn requested(var: impl Fn(&str) -> Option<String>) -> Result<bool> {
    let set = |name: &str| var(name).filter(|v| !v.trim().is_empty());
    if set("OTEL_SDK_DISABLED").is_some_and(|v| v.trim().eq_ignore_ascii_case("true")) {
        return Ok(false);
    }
    let wanted = match set("OTEL_TRACES_EXPORTER").map(|v| v.trim().to_ascii_lowercase()) {
        Some(v) if v == "none" => false,
        Some(v) if v == "otlp" => true,
        Some(v) => return Err(Error::Exporter(v)),
        None => [
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            "OTEL_EXPORTER_OTLP_ENDPOINT",
        ]
        .iter()
        .any(|name| set(name).is_some()),
    };
    if wanted {
        for name in [
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
            "OTEL_EXPORTER_OTLP_PROTOCOL",
        ] {
            match set(name) {
                Some(v) if v.trim() != "http/protobuf" => {
                    return Err(Error::Protocol {
                        var: name,
                        value: v,
                    });
                }
                Some(_) => break,
                None => {}
            }
        }
    }
    Ok(wanted)
}

/// The running exporter: what [`Exporter::shutdown`] flushes.
#[derive(Debug)]
pub struct Exporter {
    provider: SdkTracerProvider,
}

/// The layer that hands the per-event spans to the exporter.
pub type ExportLayer = Box<dyn Layer<Registry> + Send + Sync>;

impl Exporter {
    /// Builds the exporter and its layer when the process environment asks for export (see
    /// [`requested`]); `runtime` sends the requests. Per-event spans start once the layer is
    /// installed ([`Exporter::installed`]).
    pub fn from_env(runtime: tokio::runtime::Handle) -> Result<Option<(Self, ExportLayer)>> {
        if !requested(|name| std::env::var(name).ok())? {
            return Ok(None);
        }
        let client = client::Client::from_env(runtime).map_err(Error::Client)?;
        let exporter = SpanExporter::builder()
            .with_http()
            .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
            .with_http_client(client)
            .build()
            .map_err(Error::Build)?;
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(resource())
            .build();
        let layer = tracing_opentelemetry::layer()
            .with_tracer(provider.tracer(SERVICE_NAME))
            .with_location(false)
            .with_threads(false)
            .with_target(false)
            .with_tracked_inactivity(false)
            .with_filter(Targets::new().with_target(TARGET, Level::INFO))
            .boxed();
        Ok(Some((Self { provider }, layer)))
    }

    /// Marks the layer installed in the process's subscriber: per-event spans start.
    pub fn installed(&self) {
        EXPORTING.store(true, Ordering::Relaxed);
    }

    /// Stops creating spans, exports what is queued and stops the exporter (bounded by the
    /// exporter's timeout). The runtime must still run: it sends the last requests.
    pub fn shutdown(self) {
        EXPORTING.store(false, Ordering::Relaxed);
        if let Err(error) = self.provider.shutdown() {
            tracing::warn!(error = %error, "spans not all exported at shutdown");
        }
    }
}

/// The SDK's resource from the environment, named `kube-event-bridge` unless it names itself.
fn resource() -> Resource {
    let named = std::env::var_os("OTEL_SERVICE_NAME").is_some_and(|v| !v.is_empty())
        || std::env::var("OTEL_RESOURCE_ATTRIBUTES").is_ok_and(|v| v.contains("service.name="));
    let builder = Resource::builder();
    if named {
        builder.build()
    } else {
        builder.with_service_name(SERVICE_NAME).build()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(vars: &[(&str, &str)]) -> Result<bool> {
        requested(|name| {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_string())
        })
    }

    #[test]
    fn export_is_on_only_when_the_environment_asks() {
        let endpoint = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318");
        let traces = (
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            "http://c:4318/v1/traces",
        );
        for (vars, on) in [
            (vec![], false),
            (vec![("OTEL_SERVICE_NAME", "bridge")], false),
            (vec![("OTEL_EXPORTER_OTLP_ENDPOINT", " ")], false),
            (vec![endpoint], true),
            (vec![traces], true),
            (vec![("OTEL_TRACES_EXPORTER", "otlp")], true),
            (vec![endpoint, ("OTEL_TRACES_EXPORTER", "none")], false),
            (vec![endpoint, ("OTEL_SDK_DISABLED", "true")], false),
            (vec![endpoint, ("OTEL_SDK_DISABLED", "false")], true),
            (
                vec![endpoint, ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")],
                true,
            ),
            // Another protocol matters only when exporting.
            (vec![("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")], false),
        ] {
            assert_eq!(with(&vars).unwrap(), on, "{vars:?}");
        }
    }

    #[test]
    fn an_exporter_or_protocol_this_build_lacks_is_refused() {
        let endpoint = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317");
        let e = with(&[("OTEL_TRACES_EXPORTER", "zipkin")]).unwrap_err();
        assert!(
            e.to_string().contains("OTEL_TRACES_EXPORTER=\"zipkin\""),
            "{e}"
        );
        let e = with(&[endpoint, ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")]).unwrap_err();
        assert!(
            e.to_string()
                .contains("OTEL_EXPORTER_OTLP_PROTOCOL=\"grpc\""),
            "{e}"
        );
        // The signal's own variable wins over the general one.
        let both = [
            endpoint,
            ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/protobuf"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
        ];
        assert!(with(&both).unwrap());
    }
}
