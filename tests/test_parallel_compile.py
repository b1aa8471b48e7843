"""``neuron_parallel_compile`` as the user types it: a training script's graphs are extracted,
compiled in parallel into the persistent cache, and the next real run gets only cache hits; the
separate steps, retries, failures, a failing script, clean, clear-locks, analyze and bad input."""
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "sample_workloads"
BIN = Path(sys.executable).parent
NPC = str(BIN / "neuron_parallel_compile")
PY = sys.executable

SCRIPT = textwrap.dedent(f"""
    import sys
    import torch, neuron_stack
    sys.path.insert(0, {str(SAMPLES)!r})
    from models import Ranker

    torch.manual_seed(0)
    lin = neuron_stack.trace(torch.nn.Linear(8, 4), torch.randn(2, 8))
    cfg = neuron_stack.PartitionerConfig(ops_to_partition={{"aten::sort"}})
    ranker = neuron_stack.trace(Ranker(16, 8).eval(), torch.randn(2, 16), partitioner_config=cfg)
    print("ran", tuple(lin(torch.randn(2, 8)).shape), tuple(ranker(torch.randn(2, 16)).shape))
    sys.exit(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
""")


def env_for(cache: Path, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NEURON_PARALLEL_COMPILE", "NEURON_RT_INSPECT",
                                                                      "NEURON_EXTRACT", "NEURON_IGNORE"))}
    env.update(NEURON_COMPILE_CACHE_URL=str(cache), **extra)
    return env


def npc(*args, cwd, env):
    return subprocess.run([NPC, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def tag_lines(out: str, tag: str = "NEURON_PARALLEL_COMPILE") -> list[str]:
    return [line.split(f"||{tag}||: ", 1)[1] for line in out.splitlines() if f"||{tag}||: " in line]


def summary_json(out: str) -> dict:
    return json.loads(next(m for m in tag_lines(out) if m.startswith('{"compilation_summary"')))


def test_training_script_warms_the_cache_for_the_next_run(tmp_path):
    cache = tmp_path / "cache"
    r = npc("--num-parallel", "2", PY, "train_mlp.py", "--small", cwd=SAMPLES, env=env_for(cache))
    assert r.returncode == 0, r.stderr
    lines = tag_lines(r.stdout)
    assert lines[0].startswith("Running") and "NOT valid" in lines[0]
    assert "Current remaining items are 2, locked are 0, failed are 0, done are 0, total is 2" in lines
    assert "Current remaining items are 0, locked are 0, failed are 0, done are 2, total is 2" in lines
    assert summary_json(r.stdout)["compilation_summary"] == {"true": 2}   # forward + backward
    assert lines[-3:] == ["Total graphs: 2", "Total successful compilations: 2", "Total failed compilations: 0"]
    assert any("Compile cache path: " + str(cache) in m for m in tag_lines(r.stdout, "NEURON_CACHE"))
    assert len(list(cache.glob("neuronxcc-*/MODULE_*/model.done"))) == 2
    assert not list((cache / "neuron_parallel_compile").glob("MODULE_*"))   # compiled graphs leave the work dir

    # the real run: every graph comes from the cache, and the profile says so
    prof = tmp_path / "prof"
    run = subprocess.run([PY, "train_mlp.py", "--small"], cwd=SAMPLES, capture_output=True, text=True, timeout=600,
                         env=env_for(cache, NEURON_RT_INSPECT_ENABLE="1", NEURON_RT_INSPECT_DEVICE_PROFILE="session",
                                     NEURON_RT_INSPECT_OUTPUT_DIR=str(prof)))
    assert run.returncode == 0, run.stderr
    import traces
    with traces.open(traces.finalize(prof)) as p:
        hits = p.sql("SELECT kind, cache_hit FROM graphs WHERE kind IN ('forward', 'backward')").to_pylist()
        compiles = p.sql("SELECT count(*) AS n FROM events WHERE kind = 'compile'").to_pylist()[0]["n"]
    assert sorted(h["kind"] for h in hits) == ["backward", "forward"]
    assert all(h["cache_hit"] for h in hits) and compiles == 0


def test_steps_retries_failures_clean_and_clear_locks(tmp_path):
    cache = tmp_path / "cache"
    (tmp_path / "job.py").write_text(SCRIPT)
    env = env_for(cache)
    work = cache / "neuron_parallel_compile"

    # collect: the script fails after compiling two graphs -> one clear line, its status, graphs kept
    r = npc("--command", "collect", PY, "job.py", "3", cwd=tmp_path, env=env)
    assert r.returncode == 3
    err = r.stderr.strip().splitlines()
    assert err[-1].startswith("neuron_parallel_compile: error: the run command exited with status 3")
    assert "NEURON_IGNORE_TRAINING_SCRIPT_ERROR_AND_COMPILE=1" in err[-1]
    graphs = sorted(work.glob("MODULE_*"))
    assert len(graphs) == 2 and not list(cache.glob("neuronxcc-*/MODULE_*/model.done"))   # nothing compiled
    meta = [json.loads((g / "graph.json").read_text()) for g in graphs]
    assert sorted(m["ops_to_partition"] for m in meta) == [[], ["aten::sort"]]

    # compile with one retry: a damaged graph fails twice, the other compiles
    bad = next(g for g, m in zip(graphs, meta) if not m["ops_to_partition"])
    (bad / "program.json").write_text("{ damaged")
    r = npc("--command", "compile", "--num-parallel", "2", cwd=tmp_path,
            env={**env, "NEURON_PARALLEL_COMPILE_MAX_RETRIES": "1"})
    assert r.returncode == 1
    rep = summary_json(r.stdout)
    assert rep["compilation_summary"] == {"true": 1, "false": 1}
    failed = [v for v in rep["compilation_report"].values() if not v["status"]]
    assert failed[0]["retry"] == 1 and "JSONDecodeError" in failed[0]["error"]
    assert any("retry 1 of 1" in line for line in r.stdout.splitlines())
    assert tag_lines(r.stdout)[-2:] == ["Total successful compilations: 1", "Total failed compilations: 1"]
    assert [g.name for g in work.glob("MODULE_*")] == [bad.name]   # the failed graph stays for another try

    r = npc("--command", "clean", cwd=tmp_path, env=env)
    assert r.returncode == 0 and "Removed 1 collected graphs" in r.stdout and not work.exists()

    # a failing script with NEURON_IGNORE_TRAINING_SCRIPT_ERROR_AND_COMPILE: compiled anyway; one was cached
    r = npc(PY, "job.py", "3", cwd=tmp_path, env={**env, "NEURON_IGNORE_TRAINING_SCRIPT_ERROR_AND_COMPILE": "1"})
    assert r.returncode == 0, r.stderr
    assert "exited with status 3; compiling the 2 graphs collected so far" in r.stdout
    assert summary_json(r.stdout)["compilation_summary"] == {"true": 2}
    assert sum("Using a cached neff at" in m for m in tag_lines(r.stdout, "NEURON_CACHE")) == 1

    # clear-locks: the lock files of finished compiles are not held by anyone
    assert list(cache.glob("neuronxcc-*/MODULE_*.lock"))
    r = npc("--command", "clear-locks", cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr
    assert re.search(r"Removed [1-9]\d* stale lock files", r.stdout)
    assert not list(cache.glob("neuronxcc-*/MODULE_*.lock"))


def test_analyze_reports_operator_support_per_graph(tmp_path):
    (tmp_path / "job.py").write_text(SCRIPT)
    r = npc("--command", "analyze", "--analyze-output", "report", "--analyze-verbosity", "2", PY, "job.py",
            cwd=tmp_path, env=env_for(tmp_path / "cache"))
    assert r.returncode == 0, r.stderr
    res = json.loads((tmp_path / "report" / "result.json").read_text())
    assert len(res["graphs"]) == 2 and float(res["support_percentage"].rstrip("%")) < 100
    kinds = {u["kind"]: u for u in res["unsupported_operators"]}
    assert "aten::sort" in kinds and kinds["aten::sort"]["failureAt"] == "neuronx-cc"
    assert "models.py(" in kinds["aten::sort"]["call"]                      # verbosity 2: the source line
    assert res["supported_operators"].get("aten::addmm", 0) >= 2
    assert not (tmp_path / "cache" / "neuron_parallel_compile").exists()   # analyze leaves no graphs behind


@pytest.mark.parametrize("args,extra_env,needle", [
    ([], {}, "no run command"),
    (["--command", "bogus", "python"], {}, "argument --command: invalid choice: 'bogus'"),
    (["--num-parallel", "0", "python", "x.py"], {}, "--num-parallel 0: use at least 1 worker"),
    (["python"], {"NEURON_PARALLEL_COMPILE_MAX_RETRIES": "two"}, "NEURON_PARALLEL_COMPILE_MAX_RETRIES='two' is not"),
    (["./no-such-program"], {}, "cannot run './no-such-program'"),
])
def test_bad_input_is_one_line(tmp_path, args, extra_env, needle):
    r = npc(*args, cwd=tmp_path, env=env_for(tmp_path / "cache", NEURON_PARALLEL_COMPILE_WORKDIR=str(tmp_path / "g"),
                                             **extra_env))
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("neuron_parallel_compile: error:") and needle in lines[0], r.stderr
