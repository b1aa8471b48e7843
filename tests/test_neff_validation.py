"""Issue 31: a NEFF whose members pass their checksums but hold nonsense is refused at load with one line.

Each case rewrites one member of a real NEFF and its checksum, as a bug or a hand edit would; symlink
loops and empty files are named before anything heavy runs.
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch

import neuron_stack
from neuron_stack.isa.neff import NeffError, load

EXPLORER = str(Path(sys.executable).parent / "neuron-explorer")


@pytest.fixture(scope="module")
def neff(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("neff")
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).eval()
    nm = neuron_stack.trace(model, torch.randn(2, 8))
    path = d / "model.neff"
    nm.save(path)
    return path


def rewrite(src: Path, dst: Path, member: str, edit) -> Path:
    with zipfile.ZipFile(src) as z:
        members = {n: z.read(n) for n in z.namelist()}
    doc = json.loads(members[member])
    edit(doc)
    members[member] = json.dumps(doc).encode()
    header = json.loads(members["neff.json"])
    header["checksums"][member] = hashlib.sha256(members[member]).hexdigest()
    members["neff.json"] = json.dumps(header).encode()
    with zipfile.ZipFile(dst, "w", compression=zipfile.ZIP_STORED) as z:
        for n, b in members.items():
            z.writestr(n, b)
    return dst


def first(doc: dict) -> dict:
    return doc[sorted(doc)[0]]


CASES = {
    "negative device time": ("schedule.json", lambda d: first(d).update(device_ns=-5), "device_ns = -5 is outside"),
    "device time past int64": ("schedule.json", lambda d: first(d).update(device_ns=2**70), "is outside [0, 2**62)"),
    "negative engine busy": ("schedule.json", lambda d: first(d)["busy_ns"].update(tensor=-1), "busy_ns.tensor = -1"),
    "a float count": ("schedule.json", lambda d: first(d).update(flops=1.5), "malformed schedule scalars"),
    "emptied program": ("program.json", lambda d: d.update(nodes=[], partitions=[]), "its program is empty"),
    "an output no node computes": ("program.json", lambda d: d.update(output_names=["nowhere"]),
                                   "output 'nowhere' is not one of its nodes"),
    "a negative shape": ("program.json", lambda d: d["nodes"][0]["outputs"][0].update(shape=[-2, 8]),
                         "has shape (-2, 8)"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_members_are_checked_against_their_schema(neff, tmp_path, case):
    member, edit, needle = CASES[case]
    bad = rewrite(neff, tmp_path / "bad.neff", member, edit)
    with pytest.raises(NeffError) as err:
        load(bad)
    assert needle in str(err.value) and "\n" not in str(err.value), str(err.value)


def test_the_untouched_neff_loads(neff):
    assert load(neff).schedules


def test_a_symlink_loop_is_named(tmp_path):
    loop = tmp_path / "loop.neff"
    os.symlink(loop, loop)
    with pytest.raises(NeffError, match="a symbolic link loop, not a NEFF file"):
        load(loop)
    r = subprocess.run([EXPLORER, "capture", "-n", str(loop), "-s", str(tmp_path / "s")], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 1 and r.stderr.count("\n") == 1 and "symbolic link loop" in r.stderr, r.stderr


def test_an_empty_neff_is_refused_by_capture_before_the_runtime_starts(tmp_path):
    empty = tmp_path / "empty.neff"
    empty.write_bytes(b"")
    r = subprocess.run([EXPLORER, "capture", "-n", str(empty), "-s", str(tmp_path / "s")], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 1 and r.stderr.strip() == (
        f"neuron-explorer: error: {empty}: an empty file (0 bytes); pass the compiled model with -n model.neff "
        "(neuron-cc compile -o, or NeuronModule.save)")
    assert not (tmp_path / "s").exists()   # refused before the capture child (and its torch import) ran
