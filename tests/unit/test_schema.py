"""`chaoskit schema` with a standard JSON Schema validator: it accepts every bundled experiment (placeholders
and includes as the loader takes them) and still rejects what it can tell is wrong."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
FILES = sorted((ROOT / "experiments").rglob("*.yaml"))


@pytest.fixture(scope="module")
def validator() -> jsonschema.Draft202012Validator:
    out = subprocess.run([sys.executable, "-m", "chaoskit", "schema"], capture_output=True, text=True, check=True)
    schema = json.loads(out.stdout)
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_bundled_experiment_validates(validator, path):
    errors = [f"{list(e.absolute_path)}: {e.message[:200]}" for e in validator.iter_errors(yaml.safe_load(path.read_text()))]
    assert not errors, errors


BASE = yaml.safe_load((ROOT / "experiments/basic/memory-pressure.yaml").read_text())


@pytest.mark.parametrize("change", [
    lambda d: d.update(metadata={"name": "bad name with spaces"}),
    lambda d: d.update(extra_key=1),
    lambda d: d["method"][0]["inject"].update(type="host.nope"),
    lambda d: d["method"][0].update(duration="-5s"),
    lambda d: d["method"][0]["inject"].update(sizee="1GiB"),
    lambda d: d.pop("method"),
    lambda d: d["steadyState"]["probes"].append({"name": "x", "type": "http"}),  # http without url
    lambda d: d["steadyState"].update(probes=[{"includes": "typo"}]),
])
def test_what_it_can_tell_is_wrong_is_rejected(validator, change):
    doc = copy.deepcopy(BASE)
    change(doc)
    assert list(validator.iter_errors(doc))


def test_placeholders_are_allowed_where_values_are_substituted(validator):
    doc = copy.deepcopy(BASE)
    doc["method"][0].update(duration="{var.duration}", timeout="{t}")
    doc["steadyState"]["probes"].append({"name": "h", "type": "http", "url": "{target.replica_url}/health"})
    assert not list(validator.iter_errors(doc))
