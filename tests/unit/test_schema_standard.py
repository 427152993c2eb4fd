"""The published schema is standard JSON Schema 2020-12 (only its keywords, its draft declared; ajv in strict mode
compiles it and accepts every bundled experiment), and each probe type's `expect` takes only its own keys."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import jsonschema
import pytest
import yaml

from chaoskit.experiment.schema import DRAFT, experiment_schema

ROOT = Path(__file__).resolve().parents[2]
AJV = ROOT / ".chaoskit" / "npm" / "node_modules"  # scripts/setup.sh installs ajv@8 here where npm exists
KEYWORDS = {  # JSON Schema 2020-12: core, applicator, validation, meta-data, format, unevaluated, content
    "$schema", "$id", "$ref", "$defs", "$anchor", "$dynamicRef", "$dynamicAnchor", "$vocabulary", "$comment",
    "allOf", "anyOf", "oneOf", "not", "if", "then", "else", "dependentSchemas", "prefixItems", "items", "contains",
    "properties", "patternProperties", "additionalProperties", "propertyNames", "type", "enum", "const",
    "multipleOf", "maximum", "exclusiveMaximum", "minimum", "exclusiveMinimum", "maxLength", "minLength",
    "pattern", "maxItems", "minItems", "uniqueItems", "maxContains", "minContains", "maxProperties",
    "minProperties", "required", "dependentRequired", "title", "description", "default", "deprecated",
    "readOnly", "writeOnly", "examples", "format", "unevaluatedItems", "unevaluatedProperties",
    "contentEncoding", "contentMediaType", "contentSchema"}
NAMED = {"properties", "patternProperties", "$defs", "dependentSchemas"}  # their keys are names, not keywords
LITERAL = {"enum", "const", "default", "examples", "required"}  # their values are data


def _keywords(node, found: set[str]) -> set[str]:
    if isinstance(node, list):
        for x in node:
            _keywords(x, found)
    elif isinstance(node, dict):
        for k, v in node.items():
            found.add(k)
            if k in NAMED:
                for sub in v.values():
                    _keywords(sub, found)
            elif k not in LITERAL:
                _keywords(v, found)
    return found


def _slo(expect: dict) -> dict:
    return {"apiVersion": "chaoskit/v1", "kind": "Experiment", "metadata": {"name": "x"},
            "steadyState": {"probes": [{"name": "s", "type": "slo", "group_by": "X-Upstream-Replica",
                                        "load": {"url": "http://127.0.0.1:9/", "rate": 5, "duration": "1s"},
                                        "expect": expect}]},
            "method": [{"pause": "1s"}]}


def test_only_standard_keywords_and_the_draft_declared():
    schema = experiment_schema()
    assert schema["$schema"] == DRAFT
    jsonschema.Draft202012Validator.check_schema(schema)
    assert _keywords(schema, set()) - KEYWORDS == set()


@pytest.mark.parametrize("expect, ok", [({"p99_ms": "< 500", "error_rate": "< 0.1"}, True),
                                        ({"p99_ms[triton-0]": "< 500", "errors": {"timeout": 0}}, True),
                                        ({"eror_rate": "< 0.1"}, False),
                                        ({"p99_ms[a][b]": "< 500"}, False)])
def test_expect_takes_only_the_probe_types_keys(expect, ok):
    validator = jsonschema.Draft202012Validator(experiment_schema())
    assert (not list(validator.iter_errors(_slo(expect)))) is ok


def test_ajv_strict_compiles_it_and_accepts_every_bundled_experiment(tmp_path):
    if shutil.which("node") is None:
        pytest.skip("node is not installed (ajv runs on node)")
    assert (AJV / "ajv").is_dir(), f"ajv is not installed in {AJV}: run `make setup` (npm install ajv@8)"
    (tmp_path / "schema.json").write_text(json.dumps(experiment_schema()))
    docs = []
    for i, f in enumerate(sorted((ROOT / "experiments").rglob("*.yaml"))):
        docs.append(tmp_path / f"{i}.json")
        docs[-1].write_text(json.dumps(yaml.safe_load(f.read_text())))
    (tmp_path / "bad.json").write_text(json.dumps(_slo({"eror_rate": "< 0.1"})))
    script = ("const Ajv = require('ajv/dist/2020'); const fs = require('fs');"
              "const v = new Ajv({strict: true}).compile(JSON.parse(fs.readFileSync(process.argv[1])));"
              "for (const f of process.argv.slice(2)) console.log(f, v(JSON.parse(fs.readFileSync(f))));")
    p = subprocess.run(["node", "-e", script, str(tmp_path / "schema.json"), *map(str, docs),
                        str(tmp_path / "bad.json")], capture_output=True, text=True, timeout=60,
                       env={"NODE_PATH": str(AJV), "PATH": "/usr/bin:/bin"})
    assert p.returncode == 0, p.stderr
    verdicts = dict(line.rsplit(" ", 1) for line in p.stdout.splitlines())
    assert len(docs) >= 20 and all(verdicts[str(d)] == "true" for d in docs), p.stdout
    assert verdicts[str(tmp_path / "bad.json")] == "false"
