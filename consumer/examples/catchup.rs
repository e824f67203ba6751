//! Catch-up measurement: how long a new store takes to rebuild the current objects from Kafka
//! topics written by the bridge (used by `scripts/bench consumer N`).
//!
//! ```sh
//! # a compacted topic for the bridge to write (3 partitions)
//! KAFKA_BOOTSTRAP_SERVERS=127.0.0.1:9092 catchup create-topic state.prod.configmaps 3
//! # a new store from the beginning: prints one JSON line of figures
//! KAFKA_BOOTSTRAP_SERVERS=127.0.0.1:9092 catchup measure state.prod.configmaps
//! ```

use std::time::{Duration, Instant};

use futures::StreamExt;
use kube_event_bridge_consumer::{Change, Writer, kafka};
use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let bootstrap = std::env::var("KAFKA_BOOTSTRAP_SERVERS")
        .map_err(|_| "KAFKA_BOOTSTRAP_SERVERS is not set")?;
    let mut client = ClientConfig::new();
    client.set("bootstrap.servers", bootstrap);
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("create-topic") if args.len() == 3 => {
            create_topic(&client, &args[1], args[2].parse()?).await
        }
        Some("measure") if args.len() >= 2 => measure(client, &args[1..]).await,
        _ => Err("usage: catchup create-topic TOPIC PARTITIONS | catchup measure TOPIC...".into()),
    }
}

/// Creates a compacted topic (`cleanup.policy=compact`).
async fn create_topic(
    client: &ClientConfig,
    topic: &str,
    partitions: i32,
) -> Result<(), Box<dyn std::error::Error>> {
    let admin: AdminClient<DefaultClientContext> = client.create()?;
    let new = NewTopic::new(topic, partitions, TopicReplication::Fixed(1))
        .set("cleanup.policy", "compact");
    for result in admin
        .create_topics(
            [&new],
            &AdminOptions::new().operation_timeout(Some(Duration::from_secs(30))),
        )
        .await?
    {
        result.map_err(|(t, code)| format!("cannot create topic {t}: {code}"))?;
    }
    Ok(())
}

/// Times a new store from the first record to [`Change::CaughtUp`].
async fn measure(
    client: ClientConfig,
    topics: &[String],
) -> Result<(), Box<dyn std::error::Error>> {
    let records = retained_records(&client, topics)?;
    let started = Instant::now();
    let writer = Writer::new();
    let store = writer.store();
    let mut changes = kafka::Subscription::new(client, topics)
        .reflect(writer)
        .await?;
    let mut applied = 0u64;
    let mut errors = 0u64;
    while let Some(change) = changes.next().await {
        match change {
            Ok(Change::CaughtUp) => break,
            Ok(_) => applied += 1,
            Err(error) => {
                errors += 1;
                eprintln!("error: {error}");
            }
        }
    }
    let secs = started.elapsed().as_secs_f64();
    println!(
        "{{\"objects\":{},\"records\":{records},\"changes\":{applied},\"errors\":{errors},\"seconds\":{secs:.3},\"objects_per_second\":{:.0}}}",
        store.len(),
        store.len() as f64 / secs
    );
    Ok(())
}

/// Records the topics hold now (end minus first offset, summed over partitions; transaction
/// markers included).
fn retained_records(
    client: &ClientConfig,
    topics: &[String],
) -> Result<i64, Box<dyn std::error::Error>> {
    let consumer: BaseConsumer = client
        .clone()
        .set("group.id", "catchup-metadata")
        .create()?;
    let mut total = 0;
    for topic in topics {
        let metadata = consumer.fetch_metadata(Some(topic), Duration::from_secs(30))?;
        for t in metadata.topics() {
            for p in t.partitions() {
                let (low, high) =
                    consumer.fetch_watermarks(topic, p.id(), Duration::from_secs(30))?;
                total += high - low;
            }
        }
    }
    Ok(total)
}
