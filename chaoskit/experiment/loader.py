"""Turn an experiment file into a validated Experiment: includes, {…} substitution, errors with file:line."""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from chaoskit.errors import SpecError
from chaoskit.experiment.lint import hold_warnings
from chaoskit.experiment.models import Experiment, Reference
from chaoskit.experiment.yamlsafe import Located, Path_, load_yaml, read_text
from chaoskit.model.types import written
from chaoskit.targets.facts import Pending, pending_shape, reference_running, reference_shape, target_facts

_PLACEHOLDER = re.compile(r"(?<!\{)\{([A-Za-z_][\w\-]*(?:\[\d+\])?(?:\.[A-Za-z_][\w\-]*(?:\[\d+\])?)*)\}(?!\})")
_VAR_NAME = re.compile(r"^[A-Za-z_][\w\-]*$")
LINT_FAILED = "the hold and delay checks could not run on this file"


@dataclass
class Loaded:
    experiment: Experiment
    path: Path
    located: Located
    notes: list[str] = field(default_factory=list)
    variables: dict[str, Any] = field(default_factory=dict)
    deferred: set[Path_] = field(default_factory=set)  # fields holding {target.*} known only at run time
    warnings: list[str] = field(default_factory=list)  # valid, but probably not what was meant (spec.lint)


def parse_cli_vars(items: list[str]) -> dict[str, str]:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not _VAR_NAME.match(key):
            raise SpecError(f"--var {item!r}: expected NAME=VALUE")
        out[key] = value
    return out


def library_dirs(experiment_path: Path, kind: str = "probes") -> list[Path]:
    """Where `include:` looks: `probes/` (or `faults/`) beside the file and in its ancestors, then
    $CHAOSKIT_PROBES_PATH (or $CHAOSKIT_FAULTS_PATH), then the library bundled in the package."""
    from chaoskit.paths import library

    dirs = [p / kind for p in [experiment_path.parent, *experiment_path.resolve().parent.parents]]
    extra = os.environ.get(f"CHAOSKIT_{kind.upper()}_PATH", "")
    dirs += [Path(p) for p in extra.split(":") if p]
    dirs.append(library(kind))
    seen, out = set(), []
    for d in dirs:
        if d.is_dir() and d.resolve() not in seen:
            seen.add(d.resolve())
            out.append(d)
    return out


def _include(entry: dict, path: Path_, loc: Located, experiment_path: Path, kind: str = "probes") -> dict:
    """The definition `entry` includes with its other keys laid over it; errors in the keys that came from the
    definition's file name that file's lines."""
    what = "probe" if kind == "probes" else "fault step"
    name, where = entry["include"], loc.where(path)
    if not isinstance(name, str) or not _VAR_NAME.match(name):
        example = "triton-ready" if kind == "probes" else "freeze-replica-0"
        raise SpecError(f"{where}: include: expected a {what} name like '{example}' (got {name!r})")
    dirs = library_dirs(experiment_path, kind)
    for d in dirs:
        f = d / f"{name}.yaml"
        if f.is_file():
            included = load_yaml(read_text(f), str(f))
            base = included.data
            if not isinstance(base, dict):
                raise SpecError(f"{f}: a {what} definition must be a mapping")
            merged = {**base, **{k: v for k, v in entry.items() if k != "include"}}
            merged.setdefault("name", name)
            loc.includes[path] = included
            return merged
    raise SpecError(f"{where}: include: no {what} definition '{name}.yaml' in "
                    + (", ".join(str(d) for d in dirs) or f"any {kind}/ directory"))


def _include_steps(steps: Any, path: Path_, loc: Located, experiment_path: Path, depth: int = 0) -> None:
    """`- include: NAME` in the method (and in parallel blocks) becomes the step in faults/NAME.yaml."""
    if not isinstance(steps, list) or depth > 8:
        return
    for i, step in enumerate(steps):
        if isinstance(step, dict) and "include" in step:
            steps[i] = step = _include(step, path + (i,), loc, experiment_path, "faults")
        if isinstance(step, dict):
            _include_steps(step.get("parallel"), path + (i, "parallel"), loc, experiment_path, depth + 1)


def _resolve_includes(loc: Located, experiment_path: Path) -> None:
    data = loc.data
    _include_steps(data.get("method"), ("method",), loc, experiment_path)
    ss = data.get("steadyState")
    if isinstance(ss, dict) and isinstance(ss.get("probes"), list):
        for i, entry in enumerate(ss["probes"]):
            if isinstance(entry, dict) and "include" in entry:
                ss["probes"][i] = _include(entry, ("steadyState", "probes", i), loc, experiment_path)
    guards = data.get("safeguards")
    for i, sg in enumerate(guards if isinstance(guards, list) else []):
        if isinstance(sg, dict) and isinstance(sg.get("probe"), dict) and "include" in sg["probe"]:
            sg["probe"] = _include(sg["probe"], ("safeguards", i, "probe"), loc, experiment_path)


def _facts(data: dict, variables: dict[str, Any], strict: bool,
           deployed: dict[str, Any] | None) -> tuple[dict[str, Any], list[str]]:
    """The target's facts (from the target layer) and the variables, by placeholder name."""
    target = data.get("target") if isinstance(data.get("target"), dict) else {}
    facts, notes = target_facts(target, deployed, strict)
    for k, v in variables.items():
        facts[k] = v
        facts[f"var.{k}"] = v
    return facts, notes


def _pending(data: dict, variables: dict[str, Any], deployed: dict[str, Any] | None) -> Pending | None:
    """The facts a reference deployment will publish once it runs, where they are not known now: the file's own
    deployment before it starts (its engine and replica count, `when` overlays applied), or `reference: ENGINE`
    while none is running (names only: its replica count, --netns and --mcp are not known)."""
    ref = data["target"].get("reference") if isinstance(data.get("target"), dict) else None
    if deployed is not None or ref is None:
        return None
    if isinstance(ref, str):
        return None if reference_running() else pending_shape(reference_shape(ref, netns=True, mcp=True),
                                                              counted=False)
    try:
        own = Reference.model_validate(ref).effective(variables)
    except ValidationError:  # reported by validation, or a placeholder inside it: check names only
        engine = ref.get("engine") if isinstance(ref, dict) else None
        return pending_shape(reference_shape(engine if isinstance(engine, str) else "triton"), counted=False)
    nb = own.neighbour
    neighbour = None if nb is None else {"engine": nb.engine, "replicas": nb.replicas, "netns": nb.netns}
    split = (own.disaggregated.prefill, own.disaggregated.decode) if own.disaggregated else None
    return pending_shape(reference_shape(own.engine, own.replicas, own.netns, neighbour, split, own.mcp))


def _file_facts(path: Path) -> dict[str, Any]:
    """{experiment.dir}: the experiment file's directory (data files next to it: traces, prompts)."""
    return {"experiment.dir": str(path.resolve().parent)}


def _substitute(loc: Located, facts: dict[str, Any], pending: Pending | None, notes: list[str],
                sources: dict[Path_, str] | None = None) -> set[Path_]:
    """Replace placeholders in place; return the paths still holding placeholders that `pending` (a deployment
    not running yet) will provide at run time. Any other unknown placeholder is an error now. `sources` gets
    the text as written of each value a placeholder changed (errors about the value name it)."""
    deferred: set[Path_] = set()
    sources = {} if sources is None else sources

    def visit(value: Any, path: Path_) -> Any:
        if isinstance(value, dict):
            return {k: visit(v, path + (k,)) for k, v in value.items()}
        if isinstance(value, list):
            return [visit(v, path + (i,)) for i, v in enumerate(value)]
        if not isinstance(value, str) or "{" not in value:
            return value

        def repl(m: re.Match) -> str:
            key = m.group(1)
            if key in facts:
                return str(facts[key])
            if pending is not None and pending.has(key):
                notes.append(f"{loc.where(path)}: {{{key}}} is resolved at run time")
                deferred.add(path)
                # a stand-in of the right shape, so the rest of the field still gets validated
                return "http://target.invalid" if key.endswith("url") else m.group(0)
            if pending is not None and key.startswith("target."):
                raise SpecError(f"{loc.where(path)}: {_dotted(path)}: {pending.unknown(key)}")
            known = ", ".join(sorted(k for k in facts if not k.startswith("var."))) or "none"
            hint = difflib.get_close_matches(key, list(facts), n=1)
            raise SpecError(f"{loc.where(path)}: {_dotted(path)}: unknown substitution {{{key}}}"
                            + (f" (did you mean {{{hint[0]}}}?)" if hint else "")
                            + f"; known: {known}; set variables with --var NAME=VALUE")

        whole = _PLACEHOLDER.fullmatch(value)
        if whole and whole.group(1) in facts and not isinstance(facts[whole.group(1)], str):
            sources[path] = value
            return facts[whole.group(1)]  # keep numbers numbers
        out = _PLACEHOLDER.sub(repl, value).replace("{{", "{").replace("}}", "}")
        if _PLACEHOLDER.search(value):
            sources[path] = value
        return out

    for key in list(loc.data):
        if key not in ("vars", "metadata"):
            loc.data[key] = visit(loc.data[key], (key,))
    return deferred


_STAND_INS = (1, "127.0.0.1:1")  # shapes a run-time fact may take where a field wants a number or host:port


def _validate(loc: Located, deferred: set[Path_]) -> Experiment:
    """Validate; a field that only fails because it still holds a run-time placeholder is retried with
    stand-ins of other shapes (it is checked for real at run time)."""
    tried: dict[Path_, int] = {}
    while True:
        try:
            return Experiment.model_validate(loc.data, context=written())
        except ValidationError as e:
            paths = {_data_path(loc.data, tuple(x["loc"])) for x in e.errors()}
            retry = [p for p in paths if p in deferred and tried.get(p, 0) < len(_STAND_INS)]
            if not retry:
                raise
            for p in retry:
                _set(loc.data, p, _STAND_INS[tried.get(p, 0)])
                tried[p] = tried.get(p, 0) + 1


def _set(data: Any, path: Path_, value: Any) -> None:
    for part in path[:-1]:
        data = data[part]
    data[path[-1]] = value


def _dotted(path: Path_) -> str:
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or "(top level)"


@lru_cache(maxsize=1)
def _known_field_names() -> tuple[str, ...]:
    names: set[str] = set()

    def walk(schema: Any) -> None:
        if isinstance(schema, dict):
            for k, v in schema.items():
                if k == "properties" and isinstance(v, dict):
                    names.update(v)
                walk(v)
        elif isinstance(schema, list):
            for v in schema:
                walk(v)

    walk(Experiment.model_json_schema(by_alias=True))
    return tuple(sorted(names))


def _data_path(data: Any, loc: tuple) -> Path_:
    """Map pydantic's error location onto the data (dropping union tags and validator labels)."""
    path: list[str | int] = []
    cur = data
    for part in loc:
        if isinstance(cur, dict) and part in cur:
            path.append(part)
            cur = cur[part]
        elif isinstance(cur, list) and isinstance(part, int) and 0 <= part < len(cur):
            path.append(part)
            cur = cur[part]
        elif isinstance(cur, dict) and isinstance(part, str) and part == loc[-1] and part not in cur:
            path.append(part)  # a missing or unknown field: name it
            break
    return tuple(path)


def format_validation_error(err: ValidationError, loc: Located, sources: dict[Path_, str] | None = None
                            ) -> list[str]:
    problems = []
    for e in err.errors(include_url=False):
        path = _data_path(loc.data, tuple(e["loc"]))
        came_from = (sources or {}).get(path)
        msg = str(e["msg"]).removeprefix("Value error, ").removeprefix("Assertion failed, ")
        if e["type"] == "extra_forbidden":
            key = path[-1] if path else "?"
            hint = difflib.get_close_matches(str(key), _known_field_names(), n=1, cutoff=0.7)
            msg = f"unknown field '{key}'" + (f" (did you mean '{hint[0]}'?)" if hint else "")
        elif e["type"] == "missing":
            msg = "required field is missing"
        elif e["type"] == "union_tag_invalid":
            given = e.get("ctx", {}).get("tag", "?")
            choices = re.findall(r"'([^']+)'", str(e.get("ctx", {}).get("expected_tags", "")))
            hint = difflib.get_close_matches(str(given), choices, n=1)
            msg = f"unknown type '{given}'" + (f" (did you mean '{hint[0]}'?)" if hint else "") + \
                f"; known: {', '.join(choices)}"
            path = path + ("type",)
        elif e["type"] == "union_tag_not_found":
            msg = "needs a 'type' field"
        elif e["type"] == "expect_key":
            path = _data_path(loc.data, (*path, "expect", e["ctx"]["key"]))
        if came_from is not None and e["type"] not in ("extra_forbidden", "missing"):
            msg += f" (the value came from {came_from!r})"
        problems.append(f"{loc.where(path)}: {_dotted(path)}: {msg}")
    return problems


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, dict):
        for v in value.values():
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)
    elif isinstance(value, str):
        yield value


def _check_cli_vars(cli_vars: dict[str, str], declared: dict[str, Any], data: Any, path: Path) -> None:
    """A --var the file (with its includes) neither declares in `vars:` nor uses as {NAME} / {var.NAME} is a
    typo: exit 2, naming what it declares."""
    used = {m.group(1).removeprefix("var.") for text in _strings(data) for m in _PLACEHOLDER.finditer(text)}
    known = sorted(set(declared) | {u for u in used if not u.startswith("target.")})
    for name in cli_vars:
        if name not in known:
            hint = difflib.get_close_matches(name, known, n=1)
            raise SpecError(f"--var {name}: {path} has no variable '{name}'"
                            + (f" (did you mean '{hint[0]}'?)" if hint else "")
                            + f"; it declares: {', '.join(known) or 'none'}")


def load_experiment(path: str | Path, cli_vars: dict[str, str] | None = None, strict: bool = True,
                    deployed: dict[str, Any] | None = None) -> Loaded:
    """Load, include, substitute and validate. SpecError (exit 2) on any problem; PreflightError (exit 4)
    when run-time facts are missing in strict mode. `deployed`: the facts of the deployment the experiment
    brought up itself (target.reference as a mapping); without them its {target.*} wait for run time."""
    path = Path(path)
    loc = load_yaml(read_text(path), str(path))
    if not isinstance(loc.data, dict):
        raise SpecError(f"{loc.where(())}: the top level must be a mapping (apiVersion, kind, metadata, ...)")
    variables = dict(loc.data.get("vars") or {}) if isinstance(loc.data.get("vars"), dict) else {}
    _resolve_includes(loc, path)
    _check_cli_vars(cli_vars or {}, variables, loc.data, path)
    variables.update(cli_vars or {})
    facts, notes = _facts(loc.data, variables, strict, deployed)
    facts.update(_file_facts(path))
    sources: dict[Path_, str] = {}
    deferred = _substitute(loc, facts, _pending(loc.data, variables, deployed), notes, sources)
    try:
        exp = _validate(loc, deferred)
    except ValidationError as e:
        raise SpecError(format_validation_error(e, loc, sources)) from None
    except RecursionError:
        raise SpecError(f"{path}: nesting too deep") from None
    return Loaded(exp, path, loc, notes, variables, deferred, _warnings(exp, loc))


def _warnings(exp: Experiment, loc: Located) -> list[str]:
    """The lint's warnings; a lint that fails on an odd (but valid) file says so as a warning, never as a
    traceback: the file is still valid."""
    try:
        return hold_warnings(exp, loc)
    except Exception as e:  # noqa: BLE001 - advisory only; bench/fuzz.py counts these as crashes
        return [f"{loc.file}: {LINT_FAILED} ({type(e).__name__}: {e})"]
