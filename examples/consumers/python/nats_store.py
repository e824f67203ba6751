"""Reads a JetStream stream kube-event-bridge writes, from its start to where it ended when
reading began, with an ordered consumer, applies every event to a Store (store.py), and prints
the objects held as JSON: {"objects": {uid: resourceVersion}, "applied": n, "dropped": n}.

    python nats_store.py NATS_URL STREAM

Events are decoded with the CloudEvents SDK's HTTP binding, whose binary mode (`ce-` headers)
and structured mode (an `application/cloudevents+json` body) are the ones the bridge writes to
NATS; the SDK leaves the headers' percent-encoding (non-ASCII names) to the caller."""

import asyncio
import json
import sys
from urllib.parse import unquote

import nats
from cloudevents.v1.http import from_http
from nats.js.api import DeliverPolicy

from store import Store


def decode(message):
    headers = {k: unquote(v) if k.lower().startswith("ce-") else v for k, v in (message.headers or {}).items()}
    event = from_http(headers, message.data or None)
    return event.get_attributes(), event.get_data()


async def read(server, stream):
    nc = await nats.connect(server)
    try:
        js = nc.jetstream()
        info = await js.stream_info(stream)
        # Where the stream ends now: read until that sequence.
        last = info.state.last_seq
        store = Store()
        if last > 0:
            sub = await js.subscribe(info.config.subjects[0], stream=stream, ordered_consumer=True,
                                     deliver_policy=DeliverPolicy.ALL)
            while True:
                try:
                    message = await sub.next_msg(timeout=10)
                except nats.errors.TimeoutError:
                    raise SystemExit(f"no message for 10 s before sequence {last}")
                attributes, data = decode(message)
                store.apply(attributes, data)
                if message.metadata.sequence.stream >= last:
                    break
            await sub.unsubscribe()
        return store
    finally:
        await nc.close()


def main():
    server, stream = sys.argv[1], sys.argv[2]
    store = asyncio.run(read(server, stream))
    print(json.dumps({"objects": store.snapshot(), "applied": store.applied, "dropped": store.dropped}))


if __name__ == "__main__":
    main()
