//! The `kube-event-bridge` command: `run`, `check-config`, `tail`, `snapshot`, `status`, `rbac`,
//! `asyncapi`, `schema`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Parser, Subcommand, ValueEnum};
use kube_event_bridge::clusters::{self, Cluster};
use kube_event_bridge::config::{Config, ConfigFile, KubernetesConfig};
use kube_event_bridge::discovery::{self, ResolvedResource};
use kube_event_bridge::trace::export::{ExportLayer, Exporter};
use kube_event_bridge::{
    allocator, kubernetes, rbac, runtime, schema, shard, shutdown, snapshot, tail,
};
use tracing_subscriber::Layer as _;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;

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
    /// Threads running the bridge's tasks (blocking calls such as Kafka commits run on threads
    /// of their own). A second thread mostly adds the cost of handing work between threads
    /// (docs/benchmarks.md). Raise it when one core is not enough: many busy watches, snapshots
    /// of millions of objects.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=256), global = true, env = "KEB_WORKER_THREADS")]
    worker_threads: u16,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Clone, Copy, ValueEnum)]
enum DocumentFormat {
    Yaml,
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
    /// through discovery and print the plan (for a fleet: per configured cluster, each reached
    /// as the bridge reaches it; one that cannot be reached fails the check, naming it).
    CheckConfig {
        /// The configuration file.
        config: PathBuf,
        /// Resolve resources against the cluster (every configured cluster of a fleet) and print
        /// the plan.
        #[arg(long)]
        cluster: bool,
        /// Resolve against this cluster of the fleet alone (implies --cluster); with
        /// clusterSecrets, also a cluster a kubeconfig Secret names.
        #[arg(long, value_name = "NAME")]
        only: Option<String>,
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
        /// Follow one cluster of the fleet (by default every one: the configured clusters, and
        /// with clusterSecrets any cluster, where the broker allows a wildcard).
        #[arg(long)]
        cluster: Option<String>,
    },
    /// Ask the running bridge for a snapshot of one resource: its current objects are published
    /// again (origin=snapshot) between a begin and an end marker, while live events go on. Writes
    /// one request ConfigMap per watch (in snapshotRequests.namespace) and prints their names.
    /// With --reset, the older way instead: delete the watches' checkpoints, so that a running
    /// bridge owning them is fenced and exits and its next start publishes every object again.
    Snapshot {
        /// The configuration file.
        #[arg(long, short)]
        config: PathBuf,
        /// The resource as `apiVersion/plural`: `v1/configmaps`, `apps/v1/deployments`.
        #[arg(long)]
        resource: String,
        /// Only the objects of this namespace.
        #[arg(long)]
        namespace: Option<String>,
        /// Only the objects matching this label selector.
        #[arg(long, conflicts_with = "reset")]
        selector: Option<String>,
        /// The fleet member (required on a fleet).
        #[arg(long)]
        cluster: Option<String>,
        /// Wait until the snapshot is complete, printing its progress; fail if it fails.
        #[arg(long, conflicts_with = "reset")]
        wait: bool,
        /// With --wait: give up after this many seconds.
        #[arg(long, default_value_t = 600)]
        timeout_secs: u64,
        /// Also publish a tombstone for every key the compacted Kafka topic still holds for an
        /// object the cluster no longer has (resources with `key: namespacedName` and
        /// `tombstones: true`; not with --selector).
        #[arg(long, conflicts_with_all = ["reset", "selector"])]
        prune: bool,
        /// Delete the watches' checkpoints instead of asking the running bridge.
        #[arg(long)]
        reset: bool,
    },
    /// With sharding: list the configuration's watches, the replica each is assigned to and who
    /// holds its Lease, then the live replicas and how many watches each holds.
    Status {
        /// The configuration file.
        #[arg(long, short)]
        config: PathBuf,
    },
    /// Print the RBAC objects (Roles or ClusterRole, bindings, Lease access) the configuration
    /// needs, resolved through discovery: list and watch on exactly the resources it resolves to
    /// (a wildcard's by name), get, create and update on Leases when leader election is on. For
    /// a fleet: what the bridge's own cluster needs (its watched resources if it is a member, the
    /// Leases, the kubeconfig Secrets of clusterSecrets), or with --cluster what one member needs.
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
        /// A cluster of the fleet: print what the bridge needs there (the resources watched in
        /// it, the read of its identity; Leases only in the bridge's own cluster). With
        /// clusterSecrets, any cluster a kubeconfig Secret names.
        #[arg(long)]
        cluster: Option<String>,
        /// Reach the cluster through this kubeconfig for discovery, instead of how the
        /// configuration reaches it (a path or Secret that only the bridge's pod has).
        #[arg(long)]
        kubeconfig: Option<PathBuf>,
        /// The context of --kubeconfig (default: its current context).
        #[arg(long, requires = "kubeconfig")]
        context: Option<String>,
    },
    /// Print an AsyncAPI 3.0.0 document of what the configuration publishes: the server, one
    /// channel per topic or subject (templates as parameterized addresses), one send operation
    /// per channel, and each resource's CloudEvents message (headers and JSON Schema payload).
    /// Resources are resolved through discovery, as for `rbac`.
    Asyncapi {
        /// The configuration file.
        #[arg(long, short)]
        config: PathBuf,
        /// Output format.
        #[arg(long, value_enum, default_value_t = DocumentFormat::Yaml)]
        format: DocumentFormat,
    },
    /// Write the JSON Schemas of the configuration and of the events into a directory.
    Schema {
        /// Output directory.
        #[arg(long, default_value = "schemas")]
        dir: PathBuf,
    },
}

/// Logs to standard error; with `export`, the per-event spans also go to the OTLP exporter.
fn init_logging(format: LogFormat, default_filter: &str, export: Option<ExportLayer>) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| default_filter.into());
    // Colours only for a person at a terminal: never in a file or a pipe (a log collector, the
    // demo's log file), nor when NO_COLOR is set (no-color.org).
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr())
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    let Some(export) = export else {
        // Without export, the subscriber is the plain formatter with one global filter.
        let builder = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_ansi(ansi)
            .with_writer(std::io::stderr);
        return match format {
            LogFormat::Text => builder.init(),
            LogFormat::Json => builder
                .json()
                .flatten_event(true)
                .with_current_span(true)
                .init(),
        };
    };
    let log = tracing_subscriber::fmt::layer()
        .with_ansi(ansi)
        .with_writer(std::io::stderr);
    // The log keeps its filter; the exporter's layer filters for the per-event spans alone.
    let log = match format {
        LogFormat::Text => log.with_filter(filter).boxed(),
        LogFormat::Json => log
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .with_filter(filter)
            .boxed(),
    };
    tracing_subscriber::registry()
        .with(vec![log, export])
        .init();
}

/// Loads and validates the configuration file; its errors are prefixed with the file's path.
fn load(path: &std::path::Path) -> anyhow::Result<Config> {
    ConfigFile::load(path)
        .and_then(ConfigFile::validate)
        .with_context(|| path.display().to_string())
}

/// jemalloc, for every allocation of the process (librdkafka's too), configured in
/// `.cargo/config.toml` to return freed pages to the system within a quarter of a second: glibc's
/// allocator kept what a LIST or a burst had used (docs/architecture.md, "Memory"; the figures are
/// in docs/benchmarks.md).
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> ExitCode {
    let cli = Cli::parse();
    // `tail` prints events on stdout; its own chatter stays quiet unless asked for.
    let default_filter = match cli.command {
        Command::Tail { .. } => "warn",
        _ => "info,kube_client=warn,rdkafka=warn",
    };
    // The main thread runs the start (discovery, sink, checkpoints): it allocates like a worker.
    allocator::thread_cache_on();
    let runtime = allocator::async_runtime(cli.worker_threads.into());
    let ran = match runtime {
        Ok(runtime) => {
            // Only `run` exports spans; the exporter sends its requests on the runtime.
            let exporter = match &cli.command {
                Command::Run { .. } => Exporter::from_env(runtime.handle().clone()),
                _ => Ok(None),
            };
            let (exporter, layer) = match exporter {
                Ok(Some((exporter, layer))) => (Some(exporter), Some(layer)),
                Ok(None) => (None, None),
                Err(e) => {
                    eprintln!("error: {:#}", anyhow::Error::new(e));
                    return ExitCode::FAILURE;
                }
            };
            init_logging(cli.log_format, default_filter, layer);
            if let Some(exporter) = &exporter {
                exporter.installed();
                tracing::info!("exporting spans over OTLP");
            }
            let ran = runtime.block_on(command(cli.command));
            if ran.as_ref().is_err_and(aborted) {
                // What the second signal interrupted (a drain, a commit on a blocking thread) is
                // not waited for.
                runtime.shutdown_background();
            } else if let Some(exporter) = exporter {
                exporter.shutdown();
            }
            ran
        }
        Err(e) => {
            init_logging(cli.log_format, default_filter, None);
            Err(anyhow::Error::new(e).context("cannot start the async runtime"))
        }
    };
    match ran {
        Ok(()) => ExitCode::SUCCESS,
        // Logged when the signal came.
        Err(e) if aborted(&e) => ExitCode::from(shutdown::ABORT_EXIT_CODE),
        Err(e) => {
            // The error and its causes: `a: b: c`.
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Whether a second signal ended the command.
fn aborted(error: &anyhow::Error) -> bool {
    matches!(error.downcast_ref(), Some(shutdown::Error::Aborted))
}

async fn command(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Run { config } => run(&config).await,
        Command::CheckConfig {
            config,
            cluster,
            only,
        } => check_config(&config, cluster || only.is_some(), only.as_deref()).await,
        Command::Tail {
            config,
            verbose,
            from_beginning,
            limit,
            idle_timeout_secs,
            cluster,
        } => {
            let options = tail::Options {
                verbose,
                from_beginning,
                limit,
                idle_timeout: idle_timeout_secs.map(Duration::from_secs),
                cluster,
            };
            Ok(tail::run(&load(&config)?, options).await?)
        }
        Command::Snapshot {
            config,
            resource,
            namespace,
            selector,
            cluster,
            wait,
            timeout_secs,
            prune,
            reset,
        } => {
            let config = load(&config)?;
            if reset {
                let (namespace, cluster) = (namespace.as_deref(), cluster.as_deref());
                for w in snapshot::reset_checkpoints(&config, &resource, namespace, cluster).await?
                {
                    println!("checkpoint reset: {w}");
                }
                return Ok(());
            }
            let ask = snapshot::ask::Ask {
                resource,
                namespace,
                selector,
                cluster,
                prune,
            };
            let written = snapshot::ask::ask(&config, &ask).await?;
            for name in &written.names {
                println!("snapshot requested: {}/{name}", written.namespace);
            }
            if wait {
                snapshot::ask::wait(&written, Duration::from_secs(timeout_secs)).await?;
            }
            Ok(())
        }
        Command::Status { config } => status(&load(&config)?).await,
        Command::Rbac {
            config,
            service_account,
            namespace,
            cluster,
            kubeconfig,
            context,
        } => {
            let reach = kubeconfig.map(|kubeconfig| (kubeconfig, context));
            let config = load(&config)?;
            rbac(
                &config,
                &service_account,
                &namespace,
                cluster.as_deref(),
                reach,
            )
            .await
        }
        Command::Asyncapi { config, format } => asyncapi(&load(&config)?, format).await,
        Command::Schema { dir } => schema::write_all(&dir)
            .with_context(|| format!("cannot write schemas to {}", dir.display())),
    }
}

async fn run(path: &std::path::Path) -> anyhow::Result<()> {
    // Signals are ours from the first instant: one arriving during start-up stops it cleanly
    // instead of killing the process half-way; a second one returns here at once.
    shutdown::until_aborted(|drain| async move {
        let config = load(path)?;
        Ok(runtime::run(config, drain).await?)
    })
    .await?
}

/// Resolves the configured resources through discovery.
async fn resolve(config: &Config) -> anyhow::Result<Vec<ResolvedResource>> {
    let client = kubernetes::client(&config.kubernetes).await?;
    Ok(discovery::resolve(&client, &config.resources).await?)
}

/// Prints the RBAC of the bridge's own cluster, or of the fleet's cluster `cluster`; `reach` is
/// a kubeconfig (and context) to resolve the resources through instead of the configuration's.
async fn rbac(
    config: &Config,
    service_account: &str,
    namespace: &str,
    cluster: Option<&str>,
    reach: Option<(PathBuf, Option<String>)>,
) -> anyhow::Result<()> {
    let target = cluster
        .map(|name| clusters::named(config, name))
        .transpose()?;
    let mut needs = rbac::needs(config, cluster, namespace);
    // The cluster whose watched resources are granted: the member asked for, or the bridge's
    // own cluster when it is a member.
    let member = match target {
        Some(c) if !c.is_own(config) => Some(c),
        _ => clusters::own(config).cloned().map(Cluster::Configured),
    };
    let resolved = match member {
        None => Vec::new(),
        // The single cluster of a configuration without a fleet, as it always was.
        Some(_) if !config.fleet.is_fleet() && reach.is_none() => resolve(config).await?,
        Some(member) => {
            let name = member.name();
            let (client, _) = match reach {
                Some((kubeconfig, context)) => {
                    let k = KubernetesConfig {
                        kubeconfig: Some(kubeconfig),
                        context,
                        ..config.kubernetes.clone()
                    };
                    clusters::connect_with(name, &k).await?
                }
                None => clusters::connect(config, &member).await?,
            };
            let watched = config.for_cluster(name, config.kubernetes.clone());
            let resolution = clusters::resolve(config, name, &client, &watched.resources).await?;
            needs.not_served = resolution.missing;
            resolution.resources
        }
    };
    print!(
        "{}",
        rbac::render_needs(&resolved, service_account, namespace, &needs)
    );
    Ok(())
}

async fn status(config: &Config) -> anyhow::Result<()> {
    anyhow::ensure!(
        config.sharding.enabled,
        "sharding.enabled: status lists the owners of sharded watches; this configuration does not shard"
    );
    let client = kubernetes::client(&config.kubernetes).await?;
    let (watches, notes) = if config.fleet.is_fleet() {
        fleet_watches(config).await?
    } else {
        let resolved = discovery::resolve(&client, &config.resources).await?;
        let watches = shard::desired(&config.cluster, &client, &resolved).await?;
        (watches, Vec::new())
    };
    print!(
        "{}",
        shard::report(config, &client, &watches, &notes).await?
    );
    Ok(())
}

/// The watches of every cluster of a fleet (its `clusters[]` entries and the clusters its
/// kubeconfig Secrets name now), each resolved through its own API server; a cluster that cannot
/// be reached is a note naming it, as its watches are not shared while it is down.
async fn fleet_watches(config: &Config) -> anyhow::Result<(BTreeMap<String, String>, Vec<String>)> {
    let mut targets = clusters::configured(config);
    targets.extend(clusters::from_secrets(config).await?);
    let found = futures::future::join_all(targets.iter().map(|c| async move {
        let (client, _, resolution) = clusters::connect_and_resolve(config, c).await?;
        let watches = shard::desired(c.name(), &client, &resolution.resources).await?;
        Ok::<_, anyhow::Error>(watches)
    }))
    .await;
    let (mut watches, mut notes) = (BTreeMap::new(), Vec::new());
    for (c, found) in targets.iter().zip(found) {
        match found {
            Ok(w) => watches.extend(w),
            Err(e) => notes.push(format!(
                "cluster {}: its watches are not listed: {e:#}",
                c.name()
            )),
        }
    }
    Ok((watches, notes))
}

async fn asyncapi(config: &Config, format: DocumentFormat) -> anyhow::Result<()> {
    let document = if config.fleet.is_fleet() {
        asyncapi_fleet(config).await?
    } else {
        let (client, api_server) = kubernetes::client_and_url(&config.kubernetes).await?;
        let resolved = discovery::resolve(&client, &config.resources).await?;
        kube_event_bridge::asyncapi::document(config, &resolved, &api_server)?
    };
    let json = matches!(format, DocumentFormat::Json);
    print!("{}", kube_event_bridge::asyncapi::render(&document, json));
    Ok(())
}

/// The AsyncAPI document of a fleet: each configured cluster's resources resolved through its
/// own API server (one that cannot be reached fails the command, naming it), and those of the
/// clusters of kubeconfig Secrets through the bridge's own cluster. Entries a cluster does not
/// serve are named on standard error.
async fn asyncapi_fleet(config: &Config) -> anyhow::Result<serde_json::Value> {
    let targets = clusters::configured(config);
    let resolved = futures::future::join_all(targets.iter().map(|c| async move {
        let (_, api_server, resolution) = clusters::connect_and_resolve(config, c).await?;
        Ok::<_, clusters::Error>((api_server, resolution))
    }))
    .await;
    let mut parts = Vec::new();
    for (c, r) in targets.iter().zip(resolved) {
        let (api_server, resolution) = r?;
        for missing in &resolution.missing {
            eprintln!("cluster {}: left out: {missing}", c.name());
        }
        parts.push((Some(c.name()), resolution.resources, api_server));
    }
    let discovered = clusters::discovered_resources(config);
    if !discovered.is_empty() {
        // The clusters of the Secrets are not known yet: their resources take their shape from
        // the bridge's own cluster.
        let (client, _) = clusters::connect_with(&config.cluster, &config.kubernetes).await?;
        let resolution = clusters::resolve(config, &config.cluster, &client, &discovered).await?;
        for missing in &resolution.missing {
            eprintln!(
                "clusters of kubeconfig Secrets: left out: {missing} (resolved through the bridge's own cluster {})",
                config.cluster
            );
        }
        parts.push((None, resolution.resources, String::new()));
    }
    let members: Vec<kube_event_bridge::asyncapi::Member<'_>> = parts
        .iter()
        .map(
            |(cluster, resources, api_server)| kube_event_bridge::asyncapi::Member {
                cluster: *cluster,
                resources,
                api_server,
            },
        )
        .collect();
    Ok(kube_event_bridge::asyncapi::fleet_document(
        config, &members,
    )?)
}

async fn check_config(
    path: &std::path::Path,
    cluster: bool,
    only: Option<&str>,
) -> anyhow::Result<()> {
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
    if config.fleet.is_fleet() {
        return check_fleet(path, &config, only).await;
    }
    if let Some(name) = only {
        clusters::named(&config, name)?;
    }
    let resolved = resolve(&config).await?;
    println!(
        "{}: valid; plan for cluster {}:",
        path.display(),
        config.cluster
    );
    for r in &resolved {
        println!("{}", plan_line(&config, &config.cluster, r));
    }
    Ok(())
}

/// `check-config --cluster` of a fleet: every configured cluster (or `only`) resolved at once,
/// each reached as the bridge reaches it, and its plan printed in a section of its own; then
/// the clusters of kubeconfig Secrets, which are resolved when the bridge runs. Fails naming the
/// clusters that could not be reached.
async fn check_fleet(
    path: &std::path::Path,
    config: &Config,
    only: Option<&str>,
) -> anyhow::Result<()> {
    let targets = match only {
        Some(name) => vec![clusters::named(config, name)?],
        None => clusters::configured(config),
    };
    let names: Vec<&str> = targets.iter().map(Cluster::name).collect();
    println!(
        "{}: valid; plan for the fleet's cluster{} {}:",
        path.display(),
        if names.len() == 1 { "" } else { "s" },
        names.join(", ")
    );
    let plans = futures::future::join_all(targets.iter().map(|c| async move {
        let (_, _, resolution) = clusters::connect_and_resolve(config, c).await?;
        Ok::<_, clusters::Error>(resolution)
    }))
    .await;
    let mut unreachable = Vec::new();
    for (c, plan) in targets.iter().zip(plans) {
        println!("cluster {} ({}):", c.name(), c.describe(config));
        match plan {
            Ok(plan) => {
                for r in &plan.resources {
                    println!("{}", plan_line(config, c.name(), r));
                }
                for missing in &plan.missing {
                    println!("  not watched here: {missing}");
                }
                if plan.resources.is_empty() && plan.missing.is_empty() {
                    println!("  no resource is watched in this cluster");
                }
            }
            Err(e) => {
                println!("  cannot reach: {:#}", anyhow::Error::new(e));
                unreachable.push(c.name());
            }
        }
    }
    if let (Some(secrets), None) = (&config.fleet.secrets, only) {
        let selector = secrets
            .label_selector
            .as_ref()
            .map(|s| format!(" matching {s:?}"))
            .unwrap_or_default();
        let watched: Vec<String> = clusters::discovered_resources(config)
            .iter()
            .map(|r| format!("resources[{}]", r.index))
            .collect();
        println!(
            "clusters from kubeconfig Secrets in namespace {}{selector}: resolved when the bridge runs; each watches {}",
            secrets.namespace,
            if watched.is_empty() {
                "nothing (every resource is narrowed to configured clusters)".to_string()
            } else {
                watched.join(", ")
            }
        );
    }
    anyhow::ensure!(
        unreachable.is_empty(),
        "cannot reach cluster{} {} (see above)",
        if unreachable.len() == 1 { "" } else { "s" },
        unreachable.join(", ")
    );
    Ok(())
}

/// One resource of the plan of `cluster`.
fn plan_line(config: &Config, cluster: &str, r: &ResolvedResource) -> String {
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
    let destination = match kube_event_bridge::sink::settings(&config.sink) {
        Ok(sink) => sink.plan(cluster, r),
        Err(e) => e.to_string(),
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
