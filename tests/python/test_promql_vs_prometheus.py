"""PromQL answers diffed against a real Prometheus (Debian's package, installed by the test
command): the same generated points are written as OpenMetrics, turned into TSDB blocks by
`promtool tsdb create-blocks-from openmetrics` and served by a Prometheus, and sent to Weft as
OTLP/JSON (dotted OTLP names and attribute keys, which Weft translates as Prometheus's OTLP
receiver does). Every query of the battery runs as a range query and as instant queries on
both, and must give the same label sets, the same timestamps and values within 1e-9
relative."""

import json
import math
import random
import shutil
import subprocess
import time
import urllib.parse
import urllib.request

import pytest

from conftest import free_port

STEP = 15  # seconds between samples
SAMPLES = 240  # one hour


def base_time():
    # an hour boundary three hours ago: inside Prometheus's retention, before its head
    now = int(time.time())
    return (now - 3 * 3600) // 3600 * 3600


class Data:
    """Gauges, a ratio gauge, counters (one with a reset) and histograms, with jittered
    sample times and a gap in one series."""

    def __init__(self, t0):
        rng = random.Random(20261203)
        self.t0 = t0
        self.series = []  # (family, kind, otlp name, unit, labels, [(ms, value or buckets)])
        bounds = [0.05, 0.1, 0.25, 0.5, 1.0, 2.5]
        self.bounds = bounds

        def times(gap=False):
            out = []
            for i in range(SAMPLES):
                if gap and 80 <= i < 120:  # ten minutes with no samples
                    continue
                out.append((t0 + i * STEP) * 1000 + rng.randint(-400, 400))
            return out

        for worker in ["w-1", "w-2"]:
            for gpu in ["0", "1"]:
                v = rng.uniform(20, 80)
                pts = []
                for t in times(gap=(worker == "w-2" and gpu == "1")):
                    v = min(100.0, max(0.0, v + rng.uniform(-5, 5)))
                    pts.append((t, round(v, 3)))
                self.series.append(("gpu_util", "gauge", "gpu.util", "", {"worker.id": worker, "gpu": gpu}, pts))
            pts = [(t, round(rng.uniform(0, 1), 4)) for t in times()]
            self.series.append(("kv_cache_usage_ratio", "gauge", "kv_cache.usage", "1", {"worker.id": worker}, pts))
            for status in ["200", "500"]:
                total, pts = 0, []
                for i, t in enumerate(times()):
                    if worker == "w-2" and status == "200" and i == 150:
                        total = 0  # the process restarted
                    total += rng.randint(0, 40 if status == "200" else 3)
                    pts.append((t, total))
                self.series.append(("requests_total", "counter", "requests", "", {"worker.id": worker, "status": status}, pts))
            counts, total_sum, pts = [0] * (len(bounds) + 1), 0.0, []
            for t in times():
                for _ in range(rng.randint(0, 8)):
                    x = rng.expovariate(3.0)
                    total_sum += x
                    i = next((i for i, b in enumerate(bounds) if x <= b), len(bounds))
                    counts[i] += 1
                pts.append((t, (list(counts), round(total_sum, 6))))
            self.series.append(("ttft_seconds", "histogram", "ttft", "s", {"worker.id": worker}, pts))

    def openmetrics(self):
        def labels(d, extra=None):
            items = {k.replace(".", "_"): v for k, v in d.items()}
            if extra:
                items.update(extra)
            return "{" + ",".join(f'{k}="{v}"' for k, v in sorted(items.items())) + "}"

        def le(b):
            return "+Inf" if b == math.inf else ("%d" % b if b == int(b) else repr(b))

        lines, families = [], {}
        for s in self.series:
            families.setdefault((s[0], s[1]), []).append(s)
        for (family, kind), members in families.items():
            name = family[: -len("_total")] if kind == "counter" else family
            lines.append(f"# TYPE {name} {kind}")
            for _, _, _, _, attrs, pts in members:
                if kind == "histogram":
                    for i, b in enumerate(self.bounds + [math.inf]):
                        for t, (counts, _) in pts:
                            lines.append(f"{family}_bucket{labels(attrs, {'le': le(b)})} {sum(counts[: i + 1])} {t / 1000:.3f}")
                    for t, (counts, _) in pts:
                        lines.append(f"{family}_count{labels(attrs)} {sum(counts)} {t / 1000:.3f}")
                    for t, (_, s) in pts:
                        lines.append(f"{family}_sum{labels(attrs)} {s!r} {t / 1000:.3f}")
                else:
                    for t, v in pts:
                        lines.append(f"{family}{labels(attrs)} {v!r} {t / 1000:.3f}")
        lines.append("# EOF")
        return "\n".join(lines) + "\n"

    def otlp(self):
        metrics = []
        for family, kind, name, unit, attrs, pts in self.series:
            attributes = [{"key": k, "value": {"stringValue": v}} for k, v in attrs.items()]
            if kind == "gauge":
                data = {"gauge": {"dataPoints": [
                    {"timeUnixNano": str(t * 1_000_000), "asDouble": v, "attributes": attributes} for t, v in pts]}}
            elif kind == "counter":
                data = {"sum": {"aggregationTemporality": 2, "isMonotonic": True, "dataPoints": [
                    {"timeUnixNano": str(t * 1_000_000), "asInt": str(v), "attributes": attributes} for t, v in pts]}}
            else:
                data = {"histogram": {"aggregationTemporality": 2, "dataPoints": [
                    {"timeUnixNano": str(t * 1_000_000), "count": str(sum(c)), "sum": s,
                     "bucketCounts": [str(x) for x in c], "explicitBounds": self.bounds,
                     "attributes": attributes} for t, (c, s) in pts]}}
            metrics.append({"name": name, "unit": unit, **data})
        return {"resourceMetrics": [{"scopeMetrics": [{"metrics": metrics}]}]}


# Every item of the Prometheus API issue's PromQL list, over gauges, counters and histograms.
QUERIES = [
    # selectors and matchers
    'gpu_util', 'gpu_util{gpu="0"}', 'gpu_util{worker_id=~"w-.*"}', 'gpu_util{worker_id!="w-1"}',
    'gpu_util{gpu!~"1"}', 'kv_cache_usage_ratio', 'requests_total', 'requests_total{status="500"}',
    'ttft_seconds_bucket{le="0.5"}', 'ttft_seconds_count', 'ttft_seconds_sum', '{__name__=~"gpu_.*"}',
    '{__name__="kv_cache_usage_ratio", worker_id="w-2"}', 'gpu_util offset 5m', 'requests_total offset 10m',
    'gpu_util @ start()', '(gpu_util{gpu="1"} @ end() offset 2m)', '((kv_cache_usage_ratio))',
    # range functions
    'rate(requests_total[1m])', 'rate(requests_total[5m])', 'irate(requests_total[5m])',
    'increase(requests_total[5m])', 'increase(requests_total[10m])', 'delta(gpu_util[5m])',
    'idelta(gpu_util[5m])', 'resets(requests_total[30m])', 'changes(gpu_util[5m])', 'changes(kv_cache_usage_ratio[10m])',
    'deriv(gpu_util[10m])', 'predict_linear(gpu_util[10m], 600)', 'avg_over_time(gpu_util[5m])',
    'min_over_time(gpu_util[5m])', 'max_over_time(gpu_util[5m])', 'sum_over_time(kv_cache_usage_ratio[5m])',
    'count_over_time(gpu_util[5m])', 'last_over_time(gpu_util[5m])', 'stddev_over_time(gpu_util[10m])',
    'stdvar_over_time(gpu_util[10m])', 'quantile_over_time(0.9, gpu_util[10m])', 'present_over_time(gpu_util[5m])',
    'absent_over_time(gpu_util{gpu="7"}[5m])', 'rate(requests_total[5m] offset 5m)', 'rate(ttft_seconds_sum[5m])',
    # aggregations
    'sum(gpu_util)', 'sum by (worker_id) (gpu_util)', 'sum without (gpu) (gpu_util)', 'avg(gpu_util)',
    'avg by (gpu) (gpu_util)', 'min(gpu_util)', 'max by (worker_id) (gpu_util)', 'count(gpu_util)',
    'count by (worker_id) (requests_total)', 'stddev(gpu_util)', 'stdvar by (worker_id) (gpu_util)',
    'group by (worker_id) (gpu_util)', 'topk(2, gpu_util)', 'bottomk(1, gpu_util)',
    'topk by (worker_id) (1, gpu_util)', 'quantile(0.5, gpu_util)', 'quantile by (worker_id) (0.9, gpu_util)',
    'count_values("status_count", count by (status) (requests_total))', 'sum(rate(requests_total[5m]))',
    'sum by (status) (increase(requests_total[5m]))',
    # histograms
    'histogram_quantile(0.9, rate(ttft_seconds_bucket[5m]))',
    'histogram_quantile(0.5, sum by (le) (rate(ttft_seconds_bucket[5m])))',
    'histogram_quantile(0.99, sum by (le, worker_id) (increase(ttft_seconds_bucket[10m])))',
    'rate(ttft_seconds_sum[5m]) / rate(ttft_seconds_count[5m])',
    # binary operators and matching
    'gpu_util * 2', '100 - gpu_util', 'gpu_util / 100', 'gpu_util % 7', 'gpu_util ^ 0.5', '-gpu_util',
    'gpu_util > 50', 'gpu_util < bool 50', 'gpu_util >= 40 and gpu_util <= 60', 'gpu_util == bool gpu_util',
    'gpu_util != 0', '1 + 2 * 3', '2 > bool 1', 'gpu_util atan2 100',
    'gpu_util / on (worker_id) group_left sum by (worker_id) (gpu_util)',
    'sum by (worker_id) (gpu_util) / ignoring (status) group_right sum by (worker_id, status) (rate(requests_total[5m]))',
    'rate(requests_total{status="500"}[5m]) / ignoring (status) rate(requests_total{status="200"}[5m])',
    'kv_cache_usage_ratio * on (worker_id) group_left (gpu) max by (worker_id, gpu) (gpu_util{gpu="0"})',
    'gpu_util and on (worker_id) kv_cache_usage_ratio > 0.5', 'gpu_util or kv_cache_usage_ratio',
    'gpu_util unless on (gpu) gpu_util{gpu="1"}', 'sum(gpu_util) + sum(kv_cache_usage_ratio)',
    # math
    'abs(delta(gpu_util[5m]))', 'ceil(gpu_util)', 'floor(gpu_util)', 'round(gpu_util)', 'round(gpu_util, 5)',
    'ln(gpu_util)', 'log2(gpu_util)', 'log10(gpu_util)', 'sqrt(gpu_util)', 'exp(kv_cache_usage_ratio)',
    'sgn(delta(gpu_util[5m]))', 'clamp(gpu_util, 30, 60)', 'clamp_min(gpu_util, 50)', 'clamp_max(gpu_util, 50)',
    # labels and the rest
    'label_replace(gpu_util, "node", "$1", "worker_id", "w-(.*)")',
    'label_replace(gpu_util{worker_id="w-1"}, "gpu", "", "gpu", "1")',
    'label_join(gpu_util, "where", "/", "worker_id", "gpu")', 'time()', 'vector(1)', 'vector(time())',
    'scalar(sum(gpu_util))', 'scalar(gpu_util)', 'absent(nonexistent{job="x"})', 'absent(gpu_util)',
    'sort(gpu_util)', 'sort_desc(gpu_util)', 'timestamp(gpu_util)', 'gpu_util * scalar(count(gpu_util))',
    # subqueries
    'max_over_time(rate(requests_total[1m])[10m:1m])', 'avg_over_time(gpu_util[10m:30s])',
    'min_over_time(sum(gpu_util)[15m:2m])',
]


# Queries both must refuse, with the same error type.
REFUSED = [
    'sum(', 'rate(gpu_util)', '1 > 2', '{gpu=""}',
    'label_replace(gpu_util, "gpu", "", "gpu", ".*")',
    'kv_cache_usage_ratio * on (worker_id) group_left (gpu) max by (worker_id, gpu) (gpu_util)',
    'gpu_util + on (gpu) gpu_util',
]


def get_json(url):
    try:
        with urllib.request.urlopen(url, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def close(a, b):
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    if math.isinf(a) or math.isinf(b):
        return a == b
    return abs(a - b) <= 1e-9 * max(abs(a), abs(b)) or abs(a - b) < 1e-12


def normalise(data):
    kind, result = data["resultType"], data["result"]
    if kind in ("scalar", "string"):
        return kind, {(): [(result[0], result[1])]}
    out = {}
    for s in result:
        key = tuple(sorted(s["metric"].items()))
        out[key] = [(t, v) for t, v in (s["values"] if kind == "matrix" else [s["value"]])]
    return kind, out


def compare(query, mode, ours, theirs):
    assert ours[0] == theirs[0], f"{mode} {query}: {ours[0]} vs {theirs[0]}"
    a, b = ours[1], theirs[1]
    assert set(a) == set(b), f"{mode} {query}: label sets differ:\n weft {sorted(a)}\n prom {sorted(b)}"
    for key in a:
        pa, pb = a[key], b[key]
        assert [t for t, _ in pa] == [t for t, _ in pb], f"{mode} {query} {key}: timestamps differ:\n{pa}\n{pb}"
        for (t, va), (_, vb) in zip(pa, pb):
            if isinstance(va, str) and kind_is_string(va, vb):
                assert va == vb, f"{mode} {query} {key} at {t}: {va} vs {vb}"
                continue
            assert close(float(va), float(vb)), f"{mode} {query} {key} at {t}: weft {va} prom {vb}"


def kind_is_string(a, b):
    try:
        float(a), float(b)
        return False
    except ValueError:
        return True


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    promtool, prometheus = shutil.which("promtool"), shutil.which("prometheus")
    assert promtool and prometheus, "promtool and prometheus are needed (scripts/setup.sh --python installs them)"
    tmp = tmp_path_factory.mktemp("promql")
    data = Data(base_time())
    om = tmp / "data.om"
    om.write_text(data.openmetrics())
    tsdb = tmp / "tsdb"
    subprocess.run([promtool, "tsdb", "create-blocks-from", "openmetrics", str(om), str(tsdb)],
                   check=True, capture_output=True)
    config = tmp / "prometheus.yml"
    config.write_text("global: {}\n")
    port = free_port()
    proc = subprocess.Popen([prometheus, f"--config.file={config}", f"--storage.tsdb.path={tsdb}",
                             f"--web.listen-address=127.0.0.1:{port}", "--storage.tsdb.retention.time=100y"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    prom = f"http://127.0.0.1:{port}"
    deadline = time.time() + 60
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(f"{prom}/-/ready", timeout=1) as r:
                if r.status == 200:
                    break
        except OSError:
            time.sleep(0.2)
    else:
        proc.kill()
        raise RuntimeError("prometheus did not become ready")
    yield data, prom
    proc.terminate()
    proc.wait(timeout=30)


def test_the_battery_answers_as_prometheus(loaded, weft):
    data, prom = loaded
    body = json.dumps(data.otlp()).encode()
    req = urllib.request.Request(f"{weft.otlp_http}/v1/metrics", data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req) as r:
        assert r.status == 200 and json.loads(r.read() or b"{}") == {}
    ours_base = f"{weft.http}/prometheus/api/v1"
    theirs_base = f"{prom}/api/v1"
    assert len(QUERIES) >= 100
    t0 = data.t0
    checks = [
        ("range", {"start": t0 + 600, "end": t0 + 3300, "step": 60}),
        ("range", {"start": t0 + 601.5, "end": t0 + 3000, "step": 37}),
        ("instant", {"time": t0 + 1800}),
        ("instant", {"time": t0 + 1807.25}),
        ("instant", {"time": t0 + 3590 + 400}),  # past the end, within the lookback
    ]
    compared = 0
    for query in QUERIES:
        for mode, params in checks:
            path = "query_range" if mode == "range" else "query"
            qs = urllib.parse.urlencode({"query": query, **params})
            s_ours, ours = get_json(f"{ours_base}/{path}?{qs}")
            s_theirs, theirs = get_json(f"{theirs_base}/{path}?{qs}")
            assert s_theirs == 200, f"prometheus refused {query}: {theirs}"
            assert s_ours == 200, f"weft refused {mode} {query}: {ours}"
            compare(query, f"{mode} {params}", normalise(ours["data"]), normalise(theirs["data"]))
            compared += 1
    assert compared == len(QUERIES) * len(checks)

    for query in REFUSED:
        for mode, params in checks[:3:2]:
            path = "query_range" if mode == "range" else "query"
            qs = urllib.parse.urlencode({"query": query, **params})
            s_ours, ours = get_json(f"{ours_base}/{path}?{qs}")
            s_theirs, theirs = get_json(f"{theirs_base}/{path}?{qs}")
            assert s_theirs in (400, 422), f"prometheus answered {query}: {theirs}"
            assert (s_ours, ours.get("errorType")) == (s_theirs, theirs["errorType"]), \
                f"{mode} {query}: weft {s_ours} {ours}, prometheus {s_theirs} {theirs}"

    # the metadata endpoints list the same series and names
    for path in ["labels", "label/__name__/values", "label/worker_id/values",
                 f"series?match[]=gpu_util&start={t0}&end={t0 + 3600}",
                 f"series?match[]=ttft_seconds_bucket%7Bworker_id%3D%22w-1%22%7D&start={t0}&end={t0 + 3600}"]:
        _, ours = get_json(f"{ours_base}/{path}")
        _, theirs = get_json(f"{theirs_base}/{path}")
        if path.startswith("series"):
            key = lambda s: sorted(s.items())  # noqa: E731
            assert sorted(ours["data"], key=key) == sorted(theirs["data"], key=key), path
        else:
            assert ours["data"] == theirs["data"], path
