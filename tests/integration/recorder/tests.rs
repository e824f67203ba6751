//! The recorder sink through every seam a sink has: validation, the whole bridge against the
//! real API server, the plan line, `tail`'s subscription and the AsyncAPI document.

use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::api::PostParams;
use kube_event_bridge::config::ConfigFile;
use kube_event_bridge::{asyncapi, discovery, runtime, sink};
use tokio_util::sync::CancellationToken;

use super::recorded;
use crate::support::{env, kube_client, unique_name, unique_namespace, wait_until};

fn config(namespace: &str, channel: &str) -> kube_event_bridge::config::Config {
    ConfigFile::parse(&format!(
        "cluster: dev\nkubernetes: {{kubeconfig: '{}'}}\nadmin: {{address: '127.0.0.1:0'}}\nresources: [{{apiVersion: v1, resource: configmaps, namespaces: [{namespace}]}}]\nsink: {{recorder: {{channel: {channel}}}}}\n",
        env().kubeconfig
    ))
    .and_then(ConfigFile::validate)
    .expect("a valid configuration")
}

#[test]
fn its_settings_are_validated_and_named() {
    let base = "cluster: dev\nresources: [{apiVersion: v1, resource: pods}]\n";
    for (sink, expected) in [
        (
            "{recorder: {channel: Bad_Name}}",
            "sink.recorder.channel: \"Bad_Name\" must be lowercase letters, digits or '-'",
        ),
        (
            "{recorder: {chanel: a}}",
            "sink.recorder.chanel: unknown field `chanel`",
        ),
        (
            "{recorder: {channel: a}, stdout: {}}",
            "sink: exactly one of http, kafka, nats, recorder, stdout may be set",
        ),
    ] {
        let e = ConfigFile::parse(&format!("{base}sink: {sink}\n"))
            .and_then(ConfigFile::validate)
            .expect_err(sink)
            .to_string();
        assert!(e.contains(expected), "{sink}: {e}");
    }
}

#[tokio::test]
async fn the_bridge_publishes_every_change_to_a_sink_added_as_a_folder() {
    let client = kube_client().await;
    let namespace = unique_namespace(&client, "recorder").await;
    let channel = unique_name("recorder");
    let config = config(&namespace, &channel);
    let resolved = discovery::resolve(&client, &config.resources)
        .await
        .expect("discovery");
    let settings = sink::settings(&config.sink).expect("the recorder is registered");
    assert_eq!(
        settings.plan(&config.cluster, &resolved[0]),
        format!("recorder channel {channel}")
    );
    let document = asyncapi::document(&config, &resolved, "https://127.0.0.1:6443").unwrap();
    let channels = document["channels"].as_object().expect("channels");
    let described = channels.values().map(|c| c["description"].to_string());
    assert!(
        described
            .clone()
            .any(|d| d.contains("Entries of an in-memory recorder channel: the changes of")),
        "{channels:?}"
    );

    let mut tail = settings
        .subscribe(
            &[sink::Scope {
                cluster: Some(&config.cluster),
                resources: &resolved,
            }],
            true,
        )
        .await
        .expect("a subscription");
    let stop = CancellationToken::new();
    let bridge = tokio::spawn(runtime::run(config, stop.clone()));
    let name = unique_name("cm");
    let cm: ConfigMap = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name},
        "data": {"k": "v"},
    }))
    .unwrap();
    Api::<ConfigMap>::namespaced(client, &namespace)
        .create(&PostParams::default(), &cm)
        .await
        .expect("create the ConfigMap");
    let subject = format!("{namespace}/{name}");
    wait_until(
        "the recorder holds the ConfigMap's event",
        Duration::from_secs(60),
        || {
            let events = recorded(&channel);
            let found = events.iter().any(|e| {
                let event: serde_json::Value = serde_json::from_slice(e).unwrap();
                event["subject"] == subject.as_str()
                    && event["data"]["metadata"]["name"] == name.as_str()
            });
            async move { found.then_some(()) }
        },
    )
    .await;
    let seen = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(event) = tail.next().await {
            let event = event.expect("a CloudEvent");
            if cloudevents::AttributesReader::subject(&event) == Some(subject.as_str()) {
                return true;
            }
        }
        false
    });
    assert!(
        seen.await.expect("tail sees the event in time"),
        "the subscription ended"
    );
    stop.cancel();
    bridge.await.unwrap().expect("the bridge stops cleanly");
}
