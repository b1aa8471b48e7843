"""The fleet in a real Prometheus: three simulated hosts, each `neuron-monitor | neuron-monitor-prometheus`,
scraped by Debian's prometheus with our recording and alert rules; PromQL answers fleet utilisation,
recompile storms and CPU fallbacks. The rules pass promtool, and every dashboard and rule expression
uses only metrics the exporter serves."""
import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml
from servers import free_ports, stop, wait_http

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
RULES = ROOT / "monitor" / "prometheus" / "neuron-fleet.rules.yml"
DASHBOARDS = sorted((ROOT / "monitor" / "grafana").glob("*.json"))
HOSTS = ("trn1-a", "trn1-b", "trn1-c")
PROMQL_FUNCTIONS = {"sum", "avg", "count", "max", "min", "rate", "increase", "bottomk", "topk"}


def exported_metrics() -> set[str]:
    from monitor.prometheus import METRICS

    return {{"counter": f"{n}_total", "info": f"{n}_info"}.get(kind, n) for n, (kind, _, _) in METRICS.items()}


def rules() -> list[dict]:
    return [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]


def metrics_in(expr: str) -> set[str]:
    """Metric (and recorded series) names an expression reads: labels, ranges, strings and functions removed."""
    expr = re.sub(r'"[^"]*"', "", expr)
    expr = re.sub(r"(by|without) \([^)]*\)|\{[^}]*\}|\[[^\]]*\]", "", expr)
    return set(re.findall(r"[a-z][a-z0-9_:]*", expr)) - PROMQL_FUNCTIONS


def test_rules_and_dashboards_use_only_exported_metrics(prometheus_bin):
    exported = exported_metrics()
    recorded = {r["record"] for r in rules() if "record" in r}
    for rule in rules():
        assert metrics_in(rule["expr"]) <= exported | recorded, (rule, metrics_in(rule["expr"]) - exported)
    assert {p.name for p in DASHBOARDS} >= {"neuron-monitor-dashboard.json", "neuron-fleet-dashboard.json"}
    for path in DASHBOARDS:
        for panel in json.loads(path.read_text())["panels"]:
            for target in panel["targets"]:
                used = metrics_in(target["expr"])
                assert used and used <= exported | recorded, (path.name, target["expr"], used - exported - recorded)
    check = subprocess.run([prometheus_bin[1], "check", "rules", str(RULES)], capture_output=True, text=True,
                           timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    assert f"SUCCESS: {len(rules())} rules found" in check.stdout


MONITOR_CONFIG = {"period": "1s",
                  "neuron_runtimes": [{"tag_filter": ".*", "metrics": [
                      {"type": "neuroncore_counters"}, {"type": "execution_stats"}, {"type": "memory_used"},
                      {"type": "neuron_stack"}]}],
                  "system_metrics": [{"type": "memory_info"}, {"type": "vcpu_usage"}]}


def query(base: str, promql: str) -> list[dict]:
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    with urllib.request.urlopen(url, timeout=10) as r:
        doc = json.loads(r.read())
    assert doc["status"] == "success", doc
    return doc["data"]["result"]


def by_host(results: list[dict]) -> dict[str, float]:
    from traces.ids import instance_id

    names = {instance_id(h): h for h in HOSTS}
    return {names[r["metric"]["instance_id"]]: float(r["value"][1]) for r in results}


@pytest.fixture
def fleet(prometheus_bin, tmp_path_factory):
    """Three hosts' monitor pipelines and one Prometheus scraping them every second, with the fleet rules."""
    from traces.live import LivePublisher

    tmp = tmp_path_factory.mktemp("fleet")
    (tmp / "monitor.json").write_text(json.dumps(MONITOR_CONFIG))
    ports = free_ports(len(HOSTS) + 1)
    procs, pubs = [], []
    stop_feed = threading.Event()
    try:
        for host, port in zip(HOSTS, ports):
            live = tmp / host
            env = {**os.environ, "NEURON_STACK_HOSTNAME": host, "NEURON_STACK_LIVE_DIR": str(live)}
            pubs.append(LivePublisher(tag=f"train-{host}", target="trn1", instance_type="trn1.32xlarge",
                                      directory=live))
            pubs[-1].cores = [0, 1]
            monitor = subprocess.Popen([str(BIN / "neuron-monitor"), "-c", str(tmp / "monitor.json")], env=env,
                                       stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
            exporter = subprocess.Popen([str(BIN / "neuron-monitor-prometheus"), "--port", str(port)], env=env,
                                        stdin=monitor.stdout, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            monitor.stdout.close()   # the exporter holds the pipe now
            procs += [monitor, exporter]

        def feed():   # host a: light work; b: busy, recompiling every step (a storm); c: busy with CPU fallbacks
            proj = time.time_ns()
            while not stop_feed.is_set():
                proj += 100_000_000
                for i, pub in enumerate(pubs):
                    device_s = 0.01 if i == 0 else 0.08   # of every 0.1 s of projected time
                    for core in (0, 1):
                        pub.record_execution(core, time.time(), proj, device_s + 0.01, device_s,
                                             {"tensor": int(device_s * 1e9)}, 10**9, "completed")
                    if i == 1:
                        pub.count_event("recompile", reason="tensor 'x' dim 0: 8 -> 9", source="train.py:42")
                    if i == 2:
                        pub.count_event("cpu_fallback", op="aten::sort", source="train.py:57")
                    pub.flush()
                stop_feed.wait(0.1)
        feeder = threading.Thread(target=feed, daemon=True)
        feeder.start()

        rules_file = tmp / "rules.yml"   # the shipped rules, evaluated every second instead of 15 s
        rules_file.write_text(RULES.read_text().replace("interval: 15s", "interval: 1s"))
        targets = [f"127.0.0.1:{p}" for p in ports[:len(HOSTS)]]
        (tmp / "prometheus.yml").write_text(yaml.safe_dump({
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(rules_file)],
            "scrape_configs": [{"job_name": "neuron-monitor", "static_configs": [{"targets": targets}]}]}))
        base = f"http://127.0.0.1:{ports[-1]}"
        log = tmp / "prometheus.log"
        with open(log, "wb") as out:
            prom = subprocess.Popen([prometheus_bin[0], f"--config.file={tmp / 'prometheus.yml'}",
                                     f"--storage.tsdb.path={tmp / 'tsdb'}",
                                     f"--web.listen-address=127.0.0.1:{ports[-1]}"],
                                    stdout=out, stderr=subprocess.STDOUT)
        procs.append(prom)
        wait_http(f"{base}/-/ready", 60, prom, log, ok=lambda status: status == 200)
        yield base
    finally:
        stop_feed.set()
        for proc in reversed(procs):
            stop(proc)
        for pub in pubs:
            pub.close()


def eventually(base: str, promql: str, done, timeout_s: float = 90) -> list[dict]:
    """The query's result once ``done(result)`` holds (scrapes and rule evaluations take a few seconds)."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = query(base, promql)
        if done(result) or time.monotonic() > deadline:
            return result
        time.sleep(0.5)


def test_prometheus_answers_the_fleet_queries(fleet):
    """One test over the fleet (pytest -n 2 would start a module fixture once per worker)."""
    check_fleet_utilisation(fleet)
    check_recompile_storm_and_fallbacks(fleet)


def check_fleet_utilisation(fleet):
    assert len(eventually(fleet, "count by (instance_id) (instance_info)", lambda r: len(r) == 3)) == 3
    util = by_host(eventually(fleet, "neuron:neuroncore_utilization:avg_by_instance",
                              lambda r: len(r) == 3 and all(float(x["value"][1]) > 0 for x in r)))
    assert set(util) == set(HOSTS)
    assert util["trn1-b"] > util["trn1-a"] > 0 and util["trn1-c"] > util["trn1-a"]
    [fleet_avg] = query(fleet, "neuron:neuroncore_utilization:avg")
    assert 0 < float(fleet_avg["value"][1]) <= 1
    [busy] = query(fleet, "neuron:neuroncores_busy:count")
    assert float(busy["value"][1]) == 6   # two cores on each of three hosts


def check_recompile_storm_and_fallbacks(fleet):
    storm = eventually(fleet, 'ALERTS{alertname="NeuronRecompileStorm", alertstate="firing"}', lambda r: len(r) >= 1)
    assert by_host(storm).keys() == {"trn1-b"}
    rates = by_host(eventually(fleet, "neuron:recompiles:rate5m", lambda r: len(r) == 3))
    assert rates["trn1-b"] > 0 and rates["trn1-a"] == 0 and rates["trn1-c"] == 0
    fallbacks = eventually(fleet, 'ALERTS{alertname="NeuronCpuFallbacks", alertstate="firing"}',
                           lambda r: len(r) >= 1)
    assert by_host(fallbacks).keys() == {"trn1-c"}
    [row] = query(fleet, "sum by (instance_id, runtime_tag) (increase(neuron_stack_cpu_fallbacks_total[1m])) > 0")
    assert row["metric"]["runtime_tag"] == "train-trn1-c"
