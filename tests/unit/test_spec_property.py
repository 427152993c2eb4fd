"""Property test: whatever malformed document we throw at the loader, it answers SpecError, never a traceback."""

from pathlib import Path

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chaoskit.errors import SpecError
from chaoskit.experiment.loader import load_experiment

scalars = st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6), st.floats(allow_nan=True),
                    st.text(max_size=20), st.sampled_from(["15ms", "-1s", "150%", "{pid}", "{target.url}",
                                                          "process.signal", "http", "< 950", "~ (", "5..1"]))
keys = st.sampled_from(["apiVersion", "kind", "metadata", "name", "steadyState", "probes", "method", "inject",
                        "type", "duration", "pause", "parallel", "pid", "size", "expect", "url", "argv",
                        "safeguards", "abort_when", "probe", "vars", "target", "during", "every", "x"])
docs = st.recursive(scalars, lambda children: st.one_of(st.lists(children, max_size=4),
                                                      st.dictionaries(keys, children, max_size=5)), max_leaves=25)

BASE = {"apiVersion": "chaoskit/v1", "kind": "Experiment", "metadata": {"name": "p"},
        "steadyState": {"probes": [{"name": "c", "type": "command", "argv": ["true"]}]},
        "method": [{"pause": "1s"}]}


def _check(tmp_path: Path, text: str) -> None:
    f = tmp_path / "gen.yaml"
    f.write_text(text)
    try:
        load_experiment(f, strict=False)
    except SpecError as e:
        assert str(e)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(doc=docs)
def test_random_documents(tmp_path, doc):
    _check(tmp_path, yaml.safe_dump(doc))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(path=st.lists(st.sampled_from(["metadata", "steadyState", "probes", 0, "method", "inject"]), max_size=3),
       value=docs)
def test_mutated_valid_document(tmp_path, path, value):
    doc = yaml.safe_load(yaml.safe_dump(BASE))
    cur = doc
    for p in path[:-1]:
        if isinstance(cur, dict) and isinstance(p, str) and isinstance(cur.get(p), (dict, list)):
            cur = cur[p]
        elif isinstance(cur, list) and isinstance(p, int) and cur:
            cur = cur[p]
    if isinstance(cur, dict):
        cur[path[-1] if path and isinstance(path[-1], str) else "metadata"] = value
    _check(tmp_path, yaml.safe_dump(doc))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(max_size=300))
def test_random_text(tmp_path, text):
    _check(tmp_path, text)
