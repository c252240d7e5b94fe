//! The export pipeline: OTLP/gRPC exporter → batch span processor → tracer provider, and the
//! `tracing` layer that turns the host's spans into OpenTelemetry spans.
//!
//! Invariants: installed at most once per process; the OpenTelemetry layer only sees spans
//! and events of the host's own targets (`wasmctrl*`) at DEBUG and above, whatever the log
//! filter says, so tracing adds no log output; spans still buffered are flushed by
//! [`Telemetry::shutdown`].

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::trace::{Sampler, SdkTracerProvider};
use tracing_subscriber::filter::{LevelFilter, Targets};
use tracing_subscriber::{Layer, registry::LookupSpan};

/// `[telemetry]` of the host TOML, checked.
#[derive(Clone, Debug, PartialEq)]
pub struct TelemetryConfig {
    /// The collector's OTLP/gRPC endpoint, e.g. `http://127.0.0.1:4317`.
    pub endpoint: String,
    /// The share of traces kept, 0.0 to 1.0 (decided at each trace's root).
    pub sampling_ratio: f64,
    /// `service.name` of the exported resource.
    pub service_name: String,
}

// The ratio is checked to be within 0.0..=1.0 (never NaN), so equality is reflexive.
impl Eq for TelemetryConfig {}

/// Why telemetry could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    #[error("telemetry is already installed in this process")]
    AlreadyInstalled,
    #[error("building the OTLP exporter for {endpoint}: {message}")]
    Exporter { endpoint: String, message: String },
}

/// The installed pipeline. Keep it until the host stops, then [`shutdown`](Self::shutdown).
#[derive(Debug)]
pub struct Telemetry {
    provider: SdkTracerProvider,
}

impl Telemetry {
    /// Builds the pipeline and turns tracing on. Must run inside a tokio runtime (the gRPC
    /// channel lives on it). The returned layer goes into the process's subscriber.
    pub fn install<S>(
        config: &TelemetryConfig,
    ) -> Result<(Telemetry, impl Layer<S> + Send + Sync), TelemetryError>
    where
        S: tracing::Subscriber + for<'a> LookupSpan<'a> + Send + Sync,
    {
        if wasmctrl_runtime::telemetry::installed() {
            return Err(TelemetryError::AlreadyInstalled);
        }
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_tonic()
            .with_endpoint(config.endpoint.clone())
            .build()
            .map_err(|e| TelemetryError::Exporter {
                endpoint: config.endpoint.clone(),
                message: e.to_string(),
            })?;
        let resource =
            opentelemetry_sdk::Resource::builder().with_service_name(config.service_name.clone()).build();
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(config.sampling_ratio))))
            .with_resource(resource)
            .build();
        let tracer = provider.tracer("wasmctrl");
        // The reconcile roots and queue waits the runtime builds use this tracer too.
        if !wasmctrl_runtime::telemetry::install(tracer.clone()) {
            return Err(TelemetryError::AlreadyInstalled);
        }
        let layer = tracing_opentelemetry::layer()
            .with_tracer(tracer)
            .with_location(false)
            .with_threads(false)
            .with_filter(Targets::new().with_target("wasmctrl", LevelFilter::DEBUG));
        Ok((Telemetry { provider }, layer))
    }

    /// Exports what is still buffered and stops the exporter.
    pub fn shutdown(self) {
        wasmctrl_runtime::telemetry::disable();
        if let Err(error) = self.provider.shutdown() {
            tracing::warn!(%error, "flushing traces");
        }
    }

    /// Exports what is buffered now (tests wait for spans they can then see).
    pub fn flush(&self) {
        if let Err(error) = self.provider.force_flush() {
            tracing::warn!(%error, "flushing traces");
        }
    }
}
