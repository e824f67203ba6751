"""Reads a topic kube-event-bridge writes, from its start to where it ended when reading began,
with `read_committed`, applies every event to a Store (store.py), and prints the objects held
as JSON: {uid: resourceVersion}.

    python kafka_store.py BOOTSTRAP_SERVERS TOPIC [--by-name]

Events are decoded with the CloudEvents SDK's Kafka binding (binary and structured modes);
`--by-name`: the topic is keyed by `namespace/name` (its tombstones name objects so)."""

import json
import sys
import uuid

from cloudevents.v1.kafka import KafkaMessage, from_binary, from_structured
from confluent_kafka import Consumer, KafkaError, TopicPartition

from store import Store


def decode(message):
    headers = {k: v for k, v in (message.headers() or [])}
    kafka_message = KafkaMessage(headers=headers, key=message.key(), value=message.value())
    content_type = headers.get("content-type", b"").decode()
    if content_type.startswith("application/cloudevents+json"):
        event = from_structured(kafka_message)
    else:
        event = from_binary(kafka_message)
    return event.get_attributes(), event.get_data()


def main():
    bootstrap, topic = sys.argv[1], sys.argv[2]
    by_name = "--by-name" in sys.argv[3:]
    consumer = Consumer({
        "bootstrap.servers": bootstrap,
        "group.id": f"keb-python-{uuid.uuid4()}",
        "isolation.level": "read_committed",
        "enable.auto.commit": False,
        "enable.partition.eof": True,
    })
    partitions = consumer.list_topics(topic, timeout=30).topics[topic].partitions
    # Where each partition ends now (with read_committed: its last stable offset is reached).
    ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1] for p in partitions}
    consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
    pending = {p for p, end in ends.items() if end > 0}
    store = Store()
    while pending:
        message = consumer.poll(10)
        if message is None:
            raise SystemExit(f"no record for 10 s with partitions {sorted(pending)} not read to their end")
        if message.error():
            if message.error().code() == KafkaError._PARTITION_EOF:
                pending.discard(message.partition())
                continue
            raise SystemExit(f"consumer error: {message.error()}")
        if message.value() is None:
            store.tombstone(message.key().decode(), by_name)
        else:
            attributes, data = decode(message)
            store.apply(attributes, data)
        if message.offset() + 1 >= ends[message.partition()]:
            pending.discard(message.partition())
    consumer.close()
    print(json.dumps({"objects": store.snapshot(), "applied": store.applied, "dropped": store.dropped}))


if __name__ == "__main__":
    main()
