//! The `kube-event-bridge` command: `run`, `check-config`, `tail`, `schema`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};
use kube_event_bridge::config::{Config, ConfigFile, Sink};
use kube_event_bridge::discovery::{self, ResolvedResource};
use kube_event_bridge::leader::Leadership;
use kube_event_bridge::{admin, runtime, schema, tail};
use tokio_util::sync::CancellationToken;
use tracing::{error, info};

#[derive(Parser)]
#[command(
    name = "kube-event-bridge",
    version,
    about = "Publishes every change of Kubernetes resources as a CloudEvent to Kafka or NATS JetStream"
)]
struct Cli {
    /// Log format on standard error.
    #[arg(long, value_enum, default_value_t = LogFormat::Text, global = true, env = "KEB_LOG_FORMAT")]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Watch the configured resources and publish their changes.
    Run {
        /// The configuration file.
        #[arg(long, short)]
        config: PathBuf,
    },
    /// Validate a configuration without connecting; with --cluster, also resolve every resource
    /// through discovery and print the plan.
    CheckConfig {
        /// The configuration file.
        config: PathBuf,
        /// Resolve resources against the cluster and print the plan.
        #[arg(long)]
        cluster: bool,
    },
    /// Print the events the bridge publishes to the configured sink, readably.
    Tail {
        /// The configuration file (its sink and resources say where to listen).
        #[arg(long, short)]
        config: PathBuf,
        /// Also print each object.
        #[arg(short, long)]
        verbose: bool,
        /// Start from the oldest retained event instead of new ones.
        #[arg(long)]
        from_beginning: bool,
        /// Exit after this many events.
        #[arg(long)]
        limit: Option<u64>,
        /// Exit after this many seconds without an event.
        #[arg(long)]
        idle_timeout_secs: Option<u64>,
    },
    /// Force a fresh snapshot of one resource: delete its watches' checkpoints. A running bridge
    /// owning them is fenced and exits; its next start lists and publishes every object again.
    Snapshot {
        /// The configuration file.
        #[arg(long, short)]
        config: PathBuf,
        /// The resource as `apiVersion/plural`: `v1/configmaps`, `apps/v1/deployments`.
        #[arg(long)]
        resource: String,
        /// Only the watch of this namespace.
        #[arg(long)]
        namespace: Option<String>,
    },
    /// Print the RBAC objects (Roles or ClusterRole, bindings, Lease access) the configuration
    /// needs, resolved through discovery: list and watch on exactly the resources it resolves to
    /// (a wildcard's by name), get, create and update on Leases when leader election is on.
    Rbac {
        /// The configuration file.
        #[arg(long, short)]
        config: PathBuf,
        /// The bridge's ServiceAccount.
        #[arg(long, default_value = "kube-event-bridge")]
        service_account: String,
        /// The namespace the bridge runs in.
        #[arg(long, default_value = "kube-event-bridge")]
        namespace: String,
    },
    /// Write the JSON Schemas of the configuration and of the events into a directory.
    Schema {
        /// Output directory.
        #[arg(long, default_value = "schemas")]
        dir: PathBuf,
    },
}

fn init_logging(format: LogFormat, default_filter: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| default_filter.into());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .init(),
    }
}

fn load(path: &std::path::Path) -> Result<Config, String> {
    ConfigFile::load(path)
        .and_then(ConfigFile::validate)
        .map_err(|e| format!("{}: {e}", path.display()))
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    // `tail` prints events on stdout; its own chatter stays quiet unless asked for.
    let default_filter = match cli.command {
        Command::Tail { .. } => "warn",
        _ => "info,kube_client=warn,rdkafka=warn",
    };
    init_logging(cli.log_format, default_filter);
    let result = match cli.command {
        Command::Run { config } => run(&config).await,
        Command::CheckConfig { config, cluster } => check_config(&config, cluster).await,
        Command::Tail {
            config,
            verbose,
            from_beginning,
            limit,
            idle_timeout_secs,
        } => {
            let options = tail::Options {
                verbose,
                from_beginning,
                limit,
                idle_timeout: idle_timeout_secs.map(Duration::from_secs),
            };
            match load(&config) {
                Ok(cfg) => tail::run(&cfg, options).await.map_err(|e| chain(&e)),
                Err(e) => Err(e),
            }
        }
        Command::Snapshot {
            config,
            resource,
            namespace,
        } => match load(&config) {
            Ok(cfg) => {
                match runtime::reset_checkpoints(&cfg, &resource, namespace.as_deref()).await {
                    Ok(reset) if reset.is_empty() => Err(format!(
                        "--resource {resource}: no configured watch matches (use apiVersion/plural, e.g. v1/configmaps)"
                    )),
                    Ok(reset) => {
                        for w in reset {
                            println!("checkpoint reset: {w}");
                        }
                        Ok(())
                    }
                    Err(e) => Err(chain(&e)),
                }
            }
            Err(e) => Err(e),
        },
        Command::Rbac {
            config,
            service_account,
            namespace,
        } => match load(&config) {
            Ok(cfg) => rbac(&cfg, &service_account, &namespace).await,
            Err(e) => Err(e),
        },
        Command::Schema { dir } => schema::write_all(&dir)
            .map_err(|e| format!("cannot write schemas to {}: {e}", dir.display())),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("error: {message}");
            ExitCode::FAILURE
        }
    }
}

/// An error with its causes, `a: b: c`.
fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

async fn run(path: &std::path::Path) -> Result<(), String> {
    // Signals are ours from the first instant: one arriving during start-up stops it cleanly
    // instead of killing the process half-way.
    let stop = listen_for_signals().map_err(|e| format!("cannot listen for signals: {e}"))?;
    let config = load(path)?;
    let grace = Duration::from_secs(config.delivery.shutdown_grace_secs);
    let delay = Duration::from_secs(config.admin.shutdown_delay_secs);
    let admin = admin::State::new(config.sink.kind());
    admin::serve(&config.admin.address, admin.clone())
        .await
        .map_err(|e| chain(&e))?;
    if config.leader_election.enabled {
        admin.set_role(admin::Role::Follower);
    }
    // Waiting for leadership holds nothing: a signal simply ends the wait.
    let leadership = tokio::select! {
        elected = runtime::elect(&config) => elected.map_err(|e| chain(&e))?,
        () = stop.cancelled() => {
            admin.shutting_down();
            info!("stopped before start-up finished: nothing to drain");
            info!("shutdown complete");
            return Ok(());
        }
    };
    if leadership.is_some() {
        admin.set_role(admin::Role::Leader);
    }
    let watches = admin.clone();
    let on_change = Box::new(move |w| watches.set_watches(w));
    let started = runtime::Bridge::start(config, leadership.clone(), on_change);
    tokio::pin!(started);
    // A signal during start lets the start finish (it may have begun writing to the broker and
    // the checkpoint store), then drains: no half-written state, within the grace period.
    let deadline = tokio::select! {
        bridge = &mut started => {
            let bridge = bridge.map_err(|e| chain(&e))?;
            return serve_until_stopped(bridge, leadership, &admin, &stop, delay, grace).await;
        }
        () = stop.cancelled() => tokio::time::Instant::now() + grace,
    };
    admin.shutting_down();
    info!("signal during start-up: finishing the start, then draining");
    let Ok(bridge) = tokio::time::timeout_at(deadline, started).await else {
        return Err("shutdown grace period exceeded during start-up".into());
    };
    let bridge = bridge.map_err(|e| chain(&e))?;
    drain(
        bridge,
        deadline.saturating_duration_since(tokio::time::Instant::now()),
    )
    .await
}

/// Runs the started bridge until the first signal, then drains it.
async fn serve_until_stopped(
    mut bridge: runtime::Bridge,
    leadership: Option<Leadership>,
    admin: &admin::State,
    stop: &CancellationToken,
    delay: Duration,
    grace: Duration,
) -> Result<(), String> {
    let lost = async {
        match &leadership {
            Some(l) => l.lost().await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(lost);
    tokio::select! {
        () = stop.cancelled() => {}
        failure = bridge.failure() => return Err(failure),
        () = &mut lost => return Err(LEADERSHIP_LOST.into()),
    }
    admin.shutting_down();
    if !delay.is_zero() {
        info!(
            delay_secs = delay.as_secs(),
            "shutdown delay: not ready, still publishing"
        );
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            failure = bridge.failure() => return Err(failure),
            () = &mut lost => return Err(LEADERSHIP_LOST.into()),
        }
    }
    drain(bridge, grace).await
}

/// Stops the watches and drains what is in flight within `grace`.
async fn drain(bridge: runtime::Bridge, grace: Duration) -> Result<(), String> {
    if bridge.shutdown(grace).await {
        info!("shutdown complete");
        Ok(())
    } else {
        Err("shutdown grace period exceeded".into())
    }
}

const LEADERSHIP_LOST: &str = "leadership lost: exiting so that a restart waits as a follower";

/// Installs the SIGTERM and SIGINT handlers. The returned token is cancelled by the first
/// signal (shut down cleanly); a second signal exits at once without draining.
fn listen_for_signals() -> std::io::Result<CancellationToken> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let stop = CancellationToken::new();
    let first = stop.clone();
    tokio::spawn(async move {
        for second in [false, true] {
            let name = tokio::select! {
                _ = term.recv() => "SIGTERM",
                _ = int.recv() => "SIGINT",
            };
            if second {
                error!(signal = name, "second signal: exiting without draining");
                std::process::exit(130);
            }
            info!(signal = name, "signal received");
            first.cancel();
        }
    });
    Ok(stop)
}

/// Resolves the configured resources through discovery.
async fn resolve(config: &Config) -> Result<Vec<ResolvedResource>, String> {
    let client = runtime::client(&config.kubernetes)
        .await
        .map_err(|e| chain(&e))?;
    discovery::resolve(&client, &config.resources)
        .await
        .map_err(|e| chain(&e))
}

async fn rbac(config: &Config, service_account: &str, namespace: &str) -> Result<(), String> {
    let resolved = resolve(config).await?;
    // The bridge keeps its Lease in its own namespace unless the config names another.
    let election = &config.leader_election;
    let lease_namespace = election
        .enabled
        .then(|| election.namespace.as_deref().unwrap_or(namespace));
    print!(
        "{}",
        kube_event_bridge::rbac::render(
            &resolved,
            service_account,
            namespace,
            lease_namespace,
            config.keeps_checkpoints()
        )
    );
    Ok(())
}

async fn check_config(path: &std::path::Path, cluster: bool) -> Result<(), String> {
    let config = load(path)?;
    if !cluster {
        println!(
            "{}: valid ({} resources, sink {})",
            path.display(),
            config.resources.len(),
            config.sink.kind()
        );
        return Ok(());
    }
    let resolved = resolve(&config).await?;
    println!(
        "{}: valid; plan for cluster {}:",
        path.display(),
        config.cluster
    );
    for r in &resolved {
        println!("{}", plan_line(&config, r));
    }
    Ok(())
}

fn plan_line(config: &Config, r: &ResolvedResource) -> String {
    let scope = if r.namespaced {
        "Namespaced"
    } else {
        "Cluster"
    };
    let namespaces = match (&r.config.namespaces, &r.config.namespace_selector) {
        (Some(list), _) => list.join(","),
        (None, Some(selector)) => format!("selector({selector})"),
        (None, None) if r.namespaced => "*".into(),
        (None, None) => "-".into(),
    };
    let values = r.template_values(&config.cluster);
    let destination = match &config.sink {
        Sink::Kafka { topic, .. } if r.destination(topic).per_object() => {
            format!("kafka topic {} (per namespace)", r.destination(topic))
        }
        Sink::Kafka { topic, .. } => {
            format!("kafka topic {}", r.destination(topic).render_topic(&values))
        }
        Sink::Nats { subject, .. } => format!(
            "nats subject {}",
            r.destination(subject).subject_filter(&values)
        ),
        Sink::Stdout => "stdout".into(),
    };
    let events: Vec<&str> = r.config.events.iter().map(|k| k.as_str()).collect();
    format!(
        "  {} kind={} scope={scope} namespaces={namespaces} labelSelector={} fieldSelector={} events={} payload={} -> {destination}",
        r.label(),
        r.api.kind,
        r.config.label_selector.as_deref().unwrap_or("-"),
        r.config.field_selector.as_deref().unwrap_or("-"),
        events.join(","),
        r.config.payload.as_str(),
    )
}
