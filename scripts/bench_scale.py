"""`scripts/bench scale`: the bridge's cost curve by objects and watches, against the real API server.

For each point (OBJECTS ConfigMaps of 64 bytes spread over WATCHES namespaces, one watch per
namespace through one namespaceSelector), each sink and each run, one bridge is measured through
its life:
  - ready from nothing: process start to /readyz, and to every watch's 'initial state published'
    (snapshot events/s = OBJECTS over that time); API requests made;
  - the peak resident memory through the snapshot (VmHWM: what a memory limit must cover);
  - resident memory once idle after the snapshot and KEB_BENCH_SCALE_SETTLE_S (default 30) seconds
    more, and its bytes per object: less the resident memory of the same configuration over
    WATCHES empty namespaces (measured in the same run); the reading as the bridge first went idle
    is kept beside it (`rss_idle_mib`, `bytes_per_object_idle`);
  - a steady churn (`loadgen churn`, KEB_BENCH_SCALE_RATE patches/s, default 1000, for
    KEB_BENCH_SCALE_SECONDS, default 20): CPU seconds per 10,000 live events and checkpoint bytes
    written per second (stdout: the checkpoint files' bytes written, /proc/PID/io; Kafka: the
    checkpoint topic's log growth; NATS: the KV stream's new messages times its mean message size);
  - a 410 repair: the API server restarted after a write outside the watched namespaces, so every
    watch's resourceVersion is older than its new watch cache (with KEB_BENCH_SCALE_COMPACT set,
    etcd is also compacted to its current revision first: needed when the API server runs without
    a watch cache for ConfigMaps, as for a million objects, docs/benchmarks.md); seconds from the
    API server's start until the last relist completed (its start's own seconds beside them:
    the bridge relists as soon as it serves; its stop is not timed, and the requests counted
    include those made during it: docs/benchmarks.md, "A 410 repair in one request per watch"),
    the lists begun after a 410 (`repair_gone`), the lists completed (`repair_lists`: more than
    the watches when a watch listed twice), the watch restarts by reason
    (`repair_restarts_REASON`: `gone` counts every watch that got a 410 or was told), API requests
    made, and the requests the watches spared by sharing what they learnt (`repair_spared_gone`,
    `repair_spared_probe`); with KEB_BENCH_SCALE_LOGS=DIR, the bridge's log up to the repair is
    kept as DIR/NAME.log;
  - ready from a checkpoint: SIGTERM, start again, process start to /readyz; API requests made.

Each measurement is appended as one JSON line to KEB_BENCH_SCALE_OUT (default
target/bench/scale.jsonl); `scripts/bench scale-plot [FILE] [SVG]` draws the curve from such lines
(docs/img/scale.svg) and prints the tables for docs/benchmarks.md.
"""

import base64
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

SIZE = 64


def checkpoint_config(sink, name, directory):
    return {"stdout": f'{{directory: "{directory}"}}', "http": f'{{directory: "{directory}"}}',
            "kafka": f"{{kafkaTopic: {name}}}", "nats": f"{{natsBucket: {name}}}"}[sink]


def bridge_config(b, sink, env, cluster, selector, checkpoint):
    sink_part = b.sink_yaml(sink, env, cluster)
    if sink == "http":
        # sink_yaml gives HTTP a checkpoint directory of its own: this run's replaces it.
        sink_part = sink_part.split("checkpoint:")[0]
    return (f"cluster: {cluster}\nresources:\n- {{apiVersion: v1, resource: configmaps, "
            f"namespaceSelector: kube-event-bridge-bench={selector}}}\ncheckpoint: {checkpoint}\n"
            + sink_part + os.environ.get("KEB_BENCH_CONFIG", ""))


def written_bytes(b, sink, env, name, pid):
    """Checkpoint bytes written so far, by the measure each store allows (see the module doc)."""
    if sink in ("stdout", "http"):
        for line in Path(f"/proc/{pid}/io").read_text().splitlines():
            if line.startswith("write_bytes:"):
                return int(line.split()[1])
        return 0
    if sink == "kafka":
        return b.checkpoint_bytes(sink, env, name, None)
    state = Path(env["KEB_TESTENV_FILE"]).parent
    port = json.loads((state / "state.json").read_text())["ports"]["nats_monitor"]
    jsz = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/jsz?streams=true", timeout=5))
    for a in jsz.get("account_details", []):
        for s in a.get("stream_detail", []):
            if s["name"] == f"KV_{name}":
                st = s["state"]
                return st["last_seq"] * (st["bytes"] / st["messages"] if st["messages"] else 0)
    return 0


def requests(b, address):
    return b.gauge(address, "kube_event_bridge_api_requests_total") or 0.0


def scrape(address, timeout=60):
    """The bridge's /metrics, read with patience (it grows with the watches, and is served while
    the bridge relists them all), failing loudly: a reading taken as zero would make a sum move
    backwards and a wait never end."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return urllib.request.urlopen(f"http://{address}/metrics", timeout=30).read().decode()
        except OSError as error:
            if time.monotonic() > deadline:
                raise SystemExit(f"/metrics at {address} did not answer for {timeout} s: {error}")
            time.sleep(1)


def total(body, name, label=None):
    """The sum of the samples of `name` in a scraped `body` (those carrying `label` when given,
    for example 'reason="gone"')."""
    return sum(float(line.rsplit(" ", 1)[1]) for line in body.splitlines()
               if line.startswith(name + "{") and (label is None or label in line))


def published(address):
    return total(scrape(address), "kube_event_bridge_events_published_total", 'change="modified"')


def wait_events(b, address, target, proc, timeout=600):
    """Waits until the bridge has published `target` live events in all (updates)."""
    deadline = time.monotonic() + timeout
    while (seen := published(address)) < target:
        if proc.poll() is not None:
            raise SystemExit(f"the bridge exited during the churn (exit status {proc.returncode})")
        if time.monotonic() > deadline:
            raise SystemExit(f"the churn's events were not all published: {seen:.0f} of {target:.0f}")
        time.sleep(0.5)


def churn(b, loadgen, prefix, watches, per_ns, env):
    rate = int(os.environ.get("KEB_BENCH_SCALE_RATE", "1000"))
    seconds = int(os.environ.get("KEB_BENCH_SCALE_SECONDS", "20"))
    out = b.sh(str(loadgen), "churn", prefix, str(watches), str(per_ns), str(rate), str(seconds),
               env=env, capture_output=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def by_namespace(body, name, label=None, by="namespace"):
    """The samples of `name` in a scraped `body` (those carrying `label` when given), summed by
    the value of their label `by` (the namespace unless told)."""
    found = {}
    for line in body.splitlines():
        if line.startswith(name + "{") and (label is None or label in line):
            value = re.search(rf'{by}="([^"]*)"', line)
            key = value.group(1) if value else ""
            found[key] = found.get(key, 0.0) + float(line.rsplit(" ", 1)[1])
    return found


def repair(b, proc, address, watches, env, kubectl, stamp):
    """Restarts the API server after a write outside the watched namespaces and times the relists:
    the repair is done once every watch that got a 410 (itself, or told by a sibling: restarts
    counted `gone`) has completed a list since, /readyz says ready, and either every watch got one
    or none got one for 10 s. A relist counts only once its list begins (its first object), so
    the 410s, not the relists, say which watches must list."""
    def relists():
        body = scrape(address)
        return (by_namespace(body, "kube_event_bridge_watch_restarts_total", 'reason="gone"'),
                by_namespace(body, "kube_event_bridge_lists_completed_total"))

    gone0, lists0 = relists()
    body = scrape(address)
    relists0, spared0, restarts0 = relisted(body), spared(body), restarts(body)
    req0 = requests(b, address)
    b.sh(kubectl, "-n", "default", "create", "configmap", f"scale-mark-{stamp}-{time.monotonic_ns()}",
         env=env, stdout=subprocess.DEVNULL)
    if os.environ.get("KEB_BENCH_SCALE_COMPACT"):
        compact_etcd(env["KEB_ETCD_URL"])
    testenv = str(b.REPO / "scripts/testenv")
    b.sh(testenv, "stop", "kube-apiserver", env=env, stdout=subprocess.DEVNULL)
    # Timed from the start of the API server: the bridge relists as soon as it serves, which can
    # be before `testenv start` returns (it waits for readiness), so a repair that ended meanwhile
    # counts as ending when the start returned (an upper bound) rather than as taking no time.
    started = time.monotonic()
    b.sh(testenv, "start", "kube-apiserver", env=env, stdout=subprocess.DEVNULL)
    up = time.monotonic()
    last_change, last, done_at = up, None, None
    while True:
        if proc.poll() is not None:
            raise SystemExit("the bridge exited during the 410 repair")
        (gone_now, lists_now), now = relists(), time.monotonic()
        gone = {ns for ns, n in gone_now.items() if n > gone0.get(ns, 0.0)}
        listed = {ns for ns, n in lists_now.items() if n > lists0.get(ns, 0.0)}
        if (len(gone), len(listed)) != last:
            last, last_change = (len(gone), len(listed)), now
        if gone and gone <= listed and b.readyz_status(address) == 200:
            done_at = done_at or now
            # Settled: every watch that will get a 410 has had it (none new for 10 s).
            if len(gone) >= watches or now - last_change > 10:
                break
        else:
            done_at = None
        if now - up > 1800:
            raise SystemExit(f"the 410 repair did not end: {len(gone)} watches got a 410, "
                             f"{len(gone & listed)} of them listed since")
        time.sleep(0.25)
    body = scrape(address)
    spared_now, restarts_now = spared(body), restarts(body)
    return {"repair_s": done_at - started, "apiserver_start_s": up - started,
            "repair_gone": relisted(body) - relists0,
            "repair_lists": float(sum(lists_now.values()) - sum(lists0.values())),
            **{f"repair_restarts_{reason}": n - restarts0.get(reason, 0.0)
               for reason, n in restarts_now.items() if n > restarts0.get(reason, 0.0)},
            "repair_requests": requests(b, address) - req0,
            **{f"repair_spared_{reason}": spared_now[reason] - spared0[reason] for reason in spared_now}}


def relisted(body):
    """Lists begun after a 410, every watch's (`relists_total{reason="gone"}`)."""
    return sum(by_namespace(body, "kube_event_bridge_relists_total", 'reason="gone"').values())


def restarts(body):
    """Watch restarts, every watch's, by reason (`watch_restarts_total`): a watch that lists twice
    in one repair shows why here (a list cut short counts under `dropped` or `status`)."""
    return by_namespace(body, "kube_event_bridge_watch_restarts_total", by="reason")


def spared(body):
    """Requests the watches spared, every watch's, by reason (`watch_requests_spared_total`)."""
    return {reason: sum(by_namespace(body, "kube_event_bridge_watch_requests_spared_total",
                                     f'reason="{reason}"').values())
            for reason in ("gone", "probe")}


def compact_etcd(url):
    """Compacts etcd to its current revision (its JSON gateway): every watch resuming from before
    it gets 410 Gone. Without the API server's watch cache (`KEB_TESTENV_APISERVER_FLAGS`) a
    restart alone loses no history: watches resume from etcd's."""
    def post(path, body):
        request = urllib.request.Request(url + path, json.dumps(body).encode(),
                                         {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as answer:
            return json.load(answer)
    revision = int(post("/v3/kv/range", {"key": base64.b64encode(b"/").decode()})["header"]["revision"])
    post("/v3/kv/compaction", {"revision": revision, "physical": True})


# Seconds between the first reading of memory once idle after the snapshot and the one reported
# (KEB_BENCH_SCALE_SETTLE_S).
SETTLE_S = float(os.environ.get("KEB_BENCH_SCALE_SETTLE_S", "30"))



def measure(b, point, sink, run, env, bin_path, loadgen, kubectl, stamp):
    objects, watches, prefix, empty_prefix = point
    per_ns = objects // watches
    cluster = f"s{stamp}x{objects}x{watches}x{sink}x{run}"
    name = f"scale_{stamp}_{objects}_{watches}_{sink}_{run}"
    row = {"objects": objects, "watches": watches, "sink": sink, "run": run, "stamp": stamp,
           "rate": int(os.environ.get("KEB_BENCH_SCALE_RATE", "1000"))}
    if os.environ.get("KEB_TESTENV_APISERVER_FLAGS"):
        row["apiserver_flags"] = os.environ["KEB_TESTENV_APISERVER_FLAGS"]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        # The same configuration over as many empty namespaces: the fixed cost of the watches.
        (work / "empty").mkdir()
        config = bridge_config(b, sink, env, cluster + "e", empty_prefix,
                               checkpoint_config(sink, name + "_e", work / "empty"))
        proc, log = b.start_bridge(bin_path, config, work, env)
        b.wait_ready(b.admin_address(log, proc), proc)
        b.wait_idle(proc.pid, 2.0)
        row["rss_empty_mib"] = b.rss_mib(proc.pid)
        proc.terminate()
        proc.wait()

        (work / "cp").mkdir()
        config = bridge_config(b, sink, env, cluster, prefix, checkpoint_config(sink, name, work / "cp"))
        t0 = time.monotonic()
        proc, log = b.start_bridge(bin_path, config, work, env)
        address = b.admin_address(log, proc)
        b.wait_ready(address, proc)
        row["ready_s"] = time.monotonic() - t0
        b.wait_log(proc, log, "initial state published", timeout=3600, count=watches)
        row["snapshot_s"] = time.monotonic() - t0
        row["snapshot_eps"] = objects / row["snapshot_s"]
        row["start_requests"] = requests(b, address)

        def per_object(rss_mib):
            return (rss_mib - row["rss_empty_mib"]) * 1024 * 1024 / objects

        b.wait_idle(proc.pid, 2.0)
        # The most the snapshot held at once: what a memory limit must cover.
        row["peak_rss_mib"] = b.peak_rss_mib(proc.pid)
        row["rss_idle_mib"] = b.rss_mib(proc.pid)
        row["bytes_per_object_idle"] = per_object(row["rss_idle_mib"])
        (row["heap_allocated_idle_mib"],) = b.heap_mib(address, ("allocated",))
        # Checkpoints written after the snapshot can still be on their way when the bridge first
        # goes idle (a Kafka transaction's records): memory is read again once they have settled.
        time.sleep(SETTLE_S)
        idle_cpu = b.wait_idle(proc.pid, 2.0)
        row["settle_s"] = SETTLE_S
        row["rss_mib"] = b.rss_mib(proc.pid)
        row["bytes_per_object"] = per_object(row["rss_mib"])
        row["rss_per_object"] = row["rss_mib"] * 1024 * 1024 / objects
        # jemalloc's view of the same moment: what is held (allocated) against the pages serving it.
        states = ("allocated", "active", "metadata", "resident")
        for state, mib in zip(states, b.heap_mib(address, states)):
            row[f"heap_{state}_mib"] = mib

        published0 = published(address)
        written0, t_churn = written_bytes(b, sink, env, name, proc.pid), time.monotonic()
        done = churn(b, loadgen, prefix, watches, per_ns, env)
        wait_events(b, address, published0 + done["patches"], proc)
        live_cpu = b.wait_idle(proc.pid, 2.0) - idle_cpu
        events = published(address) - published0
        row["churn_rate"] = done["rate"]
        row["live_cpu_per_10k"] = live_cpu * 10000 / events
        row["checkpoint_bytes_per_s"] = (written_bytes(b, sink, env, name, proc.pid) - written0) / done["seconds"]
        row["churn_wall_s"] = time.monotonic() - t_churn

        row.update(repair(b, proc, address, watches, env, kubectl, stamp))
        b.wait_idle(proc.pid, 2.0)
        proc.terminate()
        proc.wait()
        if os.environ.get("KEB_BENCH_SCALE_LOGS"):
            # The bridge's log from its start to the repair, kept to read the repair after the run
            # (the start from the checkpoint below writes a new one).
            logs = Path(os.environ["KEB_BENCH_SCALE_LOGS"])
            logs.mkdir(parents=True, exist_ok=True)
            shutil.copy(log, logs / f"{name}.log")

        t0 = time.monotonic()
        proc, log = b.start_bridge(bin_path, config, work, env)
        address = b.admin_address(log, proc)
        b.wait_ready(address, proc)
        row["ready_checkpoint_s"] = time.monotonic() - t0
        row["checkpoint_requests"] = requests(b, address)
        proc.terminate()
        proc.wait()
    return row


def spread(b, loadgen, prefix, watches, per_ns, env):
    t0 = time.monotonic()
    b.sh(str(loadgen), "spread", prefix, str(watches), str(per_ns), str(SIZE), env=env)
    return time.monotonic() - t0


def delete_spread(b, prefix, watches, kubectl, env):
    """No namespace controller runs here: the ConfigMaps are deleted collection by collection."""
    for i in range(watches):
        b.delete_configmaps(env, f"{prefix}-{i:04}")
    subprocess.run([kubectl, "delete", "namespace", "-l", f"kube-event-bridge-bench={prefix}", "--wait=false"],
                   env=env, stdout=subprocess.DEVNULL)


def run(b, objects_list, watches_list, runs, env, bin_path, loadgen, kubectl, stamp):
    out = Path(os.environ.get("KEB_BENCH_SCALE_OUT", b.REPO / "target/bench/scale.jsonl"))
    out.parent.mkdir(parents=True, exist_ok=True)
    sinks = os.environ.get("KEB_BENCH_SINKS", "stdout,nats,kafka").split(",")
    rows = []
    for objects in objects_list:
        for watches in watches_list:
            if objects % watches:
                raise SystemExit(f"{objects} objects do not divide over {watches} watches")
            prefix, empty = f"scale-{stamp}-{objects}-{watches}", f"scale-{stamp}-e{watches}"
            existing = os.environ.get("KEB_BENCH_SCALE_EXISTING")
            if existing:
                # `loadgen spread PREFIX WATCHES OBJECTS/WATCHES 64` made beforehand (the set-up of a
                # million objects takes long enough to be started while other points run).
                prefix, secs = existing, float("nan")
                print(f"set-up: {objects} ConfigMaps over {watches} namespaces taken as made under {prefix}")
            else:
                secs = spread(b, loadgen, prefix, watches, objects // watches, env)
                print(f"set-up: {objects} ConfigMaps of {SIZE} bytes over {watches} namespaces created in {secs:.0f} s "
                      f"({objects / secs:.0f}/s)", flush=True)
            if not any(r["watches"] == watches and r.get("empty") for r in rows):
                spread(b, loadgen, empty, watches, 0, env)
                rows.append({"watches": watches, "empty": True})
            for r in range(runs):
                for sink in sinks:
                    row = measure(b, (objects, watches, prefix, empty), sink, r, env, bin_path, loadgen, kubectl,
                                  stamp)
                    row["setup_s"] = secs
                    with out.open("a") as f:
                        f.write(json.dumps(row) + "\n")
                    rows.append(row)
                    print(json.dumps(row), flush=True)
            if not os.environ.get("KEB_BENCH_SCALE_KEEP") and not existing:
                delete_spread(b, prefix, watches, kubectl, env)
    print_tables([r for r in rows if not r.get("empty")])


COLUMNS = (("ready s", "ready_s", ".1f"), ("snapshot ev/s", "snapshot_eps", ".0f"),
           ("peak RSS MiB", "peak_rss_mib", ".0f"), ("RSS MiB", "rss_mib", ".1f"), ("B/object", "bytes_per_object", ".0f"),
           ("B/object at idle", "bytes_per_object_idle", ".0f"),
           ("RSS/object", "rss_per_object", ".0f"), ("CPU s/10k live", "live_cpu_per_10k", ".2f"),
           ("ckpt B/s", "checkpoint_bytes_per_s", ".0f"), ("410 repair s", "repair_s", ".1f"),
           ("from ckpt s", "ready_checkpoint_s", ".1f"), ("requests start", "start_requests", ".0f"),
           ("… 410", "repair_requests", ".0f"), ("… ckpt", "checkpoint_requests", ".0f"))


def mmm(values, fmt):
    values = sorted(values)
    if not values:
        return "—"
    if len(values) == 1:
        return format(values[0], fmt)
    return " / ".join(format(v, fmt) for v in (values[0], statistics.median(values), values[-1]))


def grouped(rows):
    groups = {}
    for r in rows:
        groups.setdefault((r["objects"], r["watches"], r["sink"]), []).append(r)
    return dict(sorted(groups.items()))


def print_tables(rows):
    print("\n| objects | watches | sink | runs | " + " | ".join(t for t, _, _ in COLUMNS) + " |")
    print("|" + "---|" * (4 + len(COLUMNS)))
    for (objects, watches, sink), rs in grouped(rows).items():
        # Rows from before a column was measured leave it empty.
        cells = [mmm([r[k] for r in rs if k in r], fmt) for _, k, fmt in COLUMNS]
        print(f"| {objects:,} | {watches:,} | {sink} | {len(rs)} | " + " | ".join(cells) + " |")


PANELS = (("resident memory after the snapshot (MiB)", "rss_mib"),
          ("bytes per object (less the empty watches)", "bytes_per_object"),
          ("snapshot events/s", "snapshot_eps"),
          ("ready from a checkpoint (s)", "ready_checkpoint_s"),
          ("410 repair (s)", "repair_s"),
          ("CPU s per 10,000 live events", "live_cpu_per_10k"))
COLORS = {"stdout": "#4c72b0", "nats": "#55a868", "kafka": "#c44e52", "http": "#8172b2"}


def svg(rows):
    """Six panels, objects on a log axis, one line per sink and watch count (solid 100, dashed 1,000),
    each point the median of its runs."""
    w, h, cols = 360, 250, 3
    parts = []
    xs = sorted({r["objects"] for r in rows})
    lo, hi = math.log10(xs[0]), math.log10(xs[-1]) if len(xs) > 1 else math.log10(xs[0]) + 1
    for i, (title, key) in enumerate(PANELS):
        ox, oy = (i % cols) * w + 60, (i // cols) * h + 30
        pw, ph = w - 80, h - 80
        series = {}
        for (objects, watches, sink), rs in grouped(rows).items():
            series.setdefault((sink, watches), []).append((objects, statistics.median(r[key] for r in rs)))
        top = max((v for pts in series.values() for _, v in pts), default=1) * 1.1 or 1
        parts.append(f'<text x="{ox}" y="{oy - 10}" font-size="12" font-weight="bold">{title}</text>')
        parts.append(f'<rect x="{ox}" y="{oy}" width="{pw}" height="{ph}" fill="none" stroke="#999"/>')
        for k in range(5):
            v = top * k / 4
            y = oy + ph - ph * k / 4
            parts.append(f'<text x="{ox - 4}" y="{y + 4}" font-size="9" text-anchor="end">{v:,.3g}</text>')
            parts.append(f'<line x1="{ox}" x2="{ox + pw}" y1="{y}" y2="{y}" stroke="#eee"/>')
        for x in xs:
            px = ox + pw * (math.log10(x) - lo) / (hi - lo)
            parts.append(f'<text x="{px}" y="{oy + ph + 14}" font-size="9" text-anchor="middle">{x:,}</text>')
        for (sink, watches), pts in sorted(series.items()):
            coords = [(ox + pw * (math.log10(x) - lo) / (hi - lo), oy + ph - ph * v / top) for x, v in sorted(pts)]
            dash = ' stroke-dasharray="5,3"' if watches >= 1000 else ""
            path = " ".join(f"{x:.1f},{y:.1f}" for x, y in coords)
            parts.append(f'<polyline points="{path}" fill="none" stroke="{COLORS.get(sink, "#333")}" '
                         f'stroke-width="1.5"{dash}/>')
            parts.extend(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="2.5" fill="{COLORS.get(sink, "#333")}"/>'
                         for x, y in coords)
    legend_y = 2 * h + 20
    for j, sink in enumerate(sorted({r["sink"] for r in rows})):
        parts.append(f'<line x1="{60 + j * 110}" x2="{85 + j * 110}" y1="{legend_y}" y2="{legend_y}" '
                     f'stroke="{COLORS.get(sink, "#333")}" stroke-width="2"/>')
        parts.append(f'<text x="{90 + j * 110}" y="{legend_y + 4}" font-size="11">{sink}</text>')
    parts.append(f'<text x="{60 + 4 * 110}" y="{legend_y + 4}" font-size="11">solid: 100 watches, dashed: 1,000; '
                 f'x: objects (log); each point the median of its runs</text>')
    width, height = cols * w, 2 * h + 40
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'font-family="sans-serif"><rect width="100%" height="100%" fill="white"/>' + "".join(parts) + "</svg>\n")


def plot(source, target):
    rows = [json.loads(line) for line in Path(source).read_text().splitlines() if line.strip()]
    rows = [r for r in rows if "objects" in r]
    Path(target).parent.mkdir(parents=True, exist_ok=True)
    Path(target).write_text(svg(rows))
    print_tables(rows)
    print(f"\nplot written to {target}")
