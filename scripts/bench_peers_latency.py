"""`scripts/bench peers-latency RATES SECONDS RUNS`: end-to-end latency beside Knative's
ApiServerSource adapter, in the same run, to the same receiver.

One namespace of 1,000 ConfigMaps of 1 KiB is watched at once by the bridge (HTTP sink, binary
mode, checkpoints in files) and by the adapter (mode Resource, K_SINK). Both post to one receiver,
examples/latency.rs in its `http` mode, each to a path of its own; it waits until both watch (an
event received on each path: the adapter sends nothing for what it lists at start), then patches the ConfigMaps at RATE changes/s for SECONDS, each patch stamping its wall-clock time
into an annotation, and measures per path the time from the patch to the receipt. Both programs
see the same patches from the same API server at the same moment, so the difference between their
figures is the programs'. The bridge's own share (its reading of a change to the HTTP client
taking the event) comes from its send_latency_seconds histogram over the same patches.

kubewatch is not measured: its module is not served by the Go module proxy here
(docs/benchmarks.md).
"""

import json
import os
import subprocess
import tempfile
import types
from pathlib import Path

from bench_scale import mmm

OBJECTS = 1000


def bridge_config(cluster, ns, url, work):
    return (f"cluster: {cluster}\nresources:\n- {{apiVersion: v1, resource: configmaps, namespaces: [{ns}]}}\n"
            f"sink:\n  http:\n    url: \"{url}\"\ncheckpoint: {{directory: \"{work / 'checkpoints'}\"}}\n"
            + os.environ.get("KEB_BENCH_CONFIG", ""))


def one_run(b, adapter, ns, rate, seconds, run, env, bin_path, stamp):
    """Both programs on the same patches: the probe's figures per path, and the bridge's own share
    (read → HTTP client, read → receiver's answer) over the same patches."""
    probe = b.REPO / "target/release/examples/latency"
    port = b.free_port()
    base = f"http://127.0.0.1:{port}"
    cluster = f"pl{stamp}-{rate}-{run}"
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        receiver = subprocess.Popen([str(probe), "http", str(port), "/bridge,/adapter", ns, str(OBJECTS), str(rate),
                                     str(seconds)], stdout=subprocess.PIPE, text=True, env=env)
        bridge = knative = None
        try:
            b.wait_until("the probe's receiver to listen", lambda: port_open(port), receiver, timeout=30)
            bridge, log = b.start_bridge(bin_path, bridge_config(cluster, ns, base + "/bridge", work), work, env)
            address = b.admin_address(log, bridge)
            b.wait_log(bridge, log, "initial state published")
            before = [b.histogram(address, name) for name in HISTOGRAMS]
            knative = b.start_adapter(adapter, ns, types.SimpleNamespace(url=base + "/adapter"), work, env)
            out, _ = receiver.communicate(timeout=seconds + 900)
            if receiver.returncode != 0:
                raise SystemExit(f"the latency probe failed (exit {receiver.returncode}); the adapter's log ends: "
                                 f"{(work / 'adapter.log').read_text()[-2000:]}")
            after = [b.histogram(address, name) for name in HISTOGRAMS]
        finally:
            for proc in (receiver, knative, bridge):
                if proc is not None and proc.poll() is None:
                    proc.terminate()
                    proc.wait()
    paths = json.loads(out.strip().splitlines()[-1])["paths"]
    (sent0, acked0), (sent1, acked1) = before, after
    paths["/bridge"].update(sent_p99_ms=b.histogram_percentile(sent0, sent1, 0.99),
                            sent_within_1ms_pct=b.histogram_share_within(sent0, sent1, 1),
                            ack_p99_ms=b.histogram_percentile(acked0, acked1, 0.99))
    return paths


def figure(rows, key):
    """min / median / max of `key` over the runs `rows`."""
    return mmm((row[key] for row in rows), ".1f")


HISTOGRAMS = ("kube_event_bridge_send_latency_seconds", "kube_event_bridge_publish_latency_seconds")
NAMES = {"/bridge": "kube-event-bridge (HTTP)", "/adapter": "Knative adapter"}


def port_open(port):
    import socket
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def run(b, rates, seconds, runs, env, bin_path, loadgen, kubectl, stamp):
    exports = b.sh(str(b.REPO / "scripts/testenv"), "build-peers", capture_output=True).stdout
    adapter = dict(line.removeprefix("export ").split("=", 1) for line in exports.splitlines())["KEB_KNATIVE_ADAPTER"]
    version = adapter.split("knative-adapter-")[1].split("/")[0]
    ns = f"peers-latency-{stamp}"
    b.sh(kubectl, "create", "namespace", ns, env=env, stdout=subprocess.DEVNULL)
    b.sh(str(loadgen), "create", ns, str(OBJECTS), "1024", env=env)
    results = {}
    # Rates interleaved within each run, so that a drift of the machine's load touches both.
    for r in range(runs):
        for rate in rates:
            paths = one_run(b, adapter, ns, rate, seconds, r, env, bin_path, stamp)
            for path, figures in paths.items():
                results.setdefault((rate, path), []).append(figures)
                print(f"run {r + 1}, {rate}/s, {NAMES[path]}: {json.dumps(figures)}", flush=True)
                if figures["received"] < figures["patches"]:
                    raise SystemExit(f"{NAMES[path]}: {figures['patches']} patches, only {figures['received']} "
                                     "events received")
    print(f"\npatch → receipt at the same receiver, {OBJECTS} ConfigMaps of 1 KiB patched for {seconds} s, both "
          f"programs watching at once (Knative adapter v{version}); min / median / max of {runs} runs, milliseconds")
    print(f"{'rate':>6} {'program':26} {'patches/s':>22} {'p50':>18} {'p99':>18} {'max':>22} {'bridge read→sent p99 ≤':>24}"
          f" {'read→sent ≤ 1 ms %':>22} {'read→ack p99 ≤':>18}")
    for (rate, path), rows in results.items():
        own = [figure(rows, k) if k in rows[0] else "—"
               for k in ("sent_p99_ms", "sent_within_1ms_pct", "ack_p99_ms")]
        print(f"{rate:>6} {NAMES[path]:26} {figure(rows, 'rate'):>22} {figure(rows, 'p50_ms'):>18} "
              f"{figure(rows, 'p99_ms'):>18} {figure(rows, 'max_ms'):>22} {own[0]:>24} {own[1]:>22} "
              f"{own[2]:>18}")
    print("read→sent: the bridge's own part (its reading of a change to the HTTP client taking the event), upper bound"
          " of the histogram bucket; read→ack: to the receiver's answer")
    subprocess.run([kubectl, "delete", "namespace", ns, "--wait=false"], env=env, stdout=subprocess.DEVNULL)
