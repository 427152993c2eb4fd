"""A matrix file (kind: Matrix): gateways x faults over one template; each cell expanded into a plain experiment
that brings up its own reference deployment (replica 0 is the one every fault acts on): continuous client load
(probe `clients`) and answers graded against the ones recorded before the fault (probe `answers`)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, model_validator

from chaoskit.errors import SpecError
from chaoskit.experiment.loader import format_validation_error
from chaoskit.experiment.yamlsafe import load_yaml, read_text
from chaoskit.model.gateways import NAMES as GATEWAY_NAMES
from chaoskit.model.gateways import PARAMS as GATEWAY_PARAMS
from chaoskit.model.types import Duration, StrictModel

CELL_NAME = re.compile(r"^[a-z0-9][a-z0-9-]*$")


class MatrixLoad(StrictModel):
    """The clients' traffic through the gateway, in every phase of every cell."""

    rate: float = Field(20, gt=0, le=2000, description="requests per second (constant arrivals)")
    stream: bool = Field(True, description="streamed answers (SSE), so that mid-stream faults show")
    prompt_tokens: int = Field(16, ge=1, le=4096, description="prompt length")
    max_tokens: int = Field(16, ge=1, le=1024, description="tokens per answer")
    timeout: Duration = Field(3.0, gt=0, description="client timeout per request")
    window: Duration = Field(2.0, gt=0, description="the load runs all through the cell; each sample reports this "
                             "long a window of it")


class MatrixAnswers(StrictModel):
    """Answers graded token by token: each cell also sends these greedy chat requests in turn (prompts of its
    own; chat, so that the tap tells them from the clients' completions) and grades each streamed answer against
    the one recorded before the fault (complete, truncated, restarted, duplicated, gap, mismatch, error)."""

    requests: int = Field(8, ge=1, le=200, description="requests per sample")
    concurrency: int = Field(4, ge=1, le=64, description="in flight at once")
    failed: str = Field("== 0", description="tolerance of the answers that were not whole and right, per sample")


class MatrixHypothesis(StrictModel):
    """What a cell's clients must see while the fault is in effect and after it, for the cell to hold."""

    error_rate: str = Field("== 0", description="tolerance of the clients' error rate")
    all_p99_ms: str = Field("< 2000", description="tolerance of the p99 of all requests (failed ones at their "
                            "timeout)")


class MatrixFault(StrictModel):
    name: str = Field(description="the fault's column name (lower case, digits, dashes)")
    description: str = Field("", description="what it does to replica 0, in words (the docs' matrix shows it)")
    inject: dict[str, Any] = Field(description="the fault, as in a method step; {target.*} facts of the cell's "
                                   "deployment, e.g. {target.replica_pids[0]}, {target.replicas[0].netns}")
    may_exit: bool = Field(False, description="the fault may end replica 0 (target.may_exit for the cell)")
    engines: list[Literal["tiny-openai", "vllm"]] = Field(
        default_factory=lambda: ["tiny-openai", "vllm"], description="the engines it applies to")

    @model_validator(mode="after")
    def _name(self) -> MatrixFault:
        if not CELL_NAME.match(self.name):
            raise ValueError(f"name {self.name!r}: lower case letters, digits and dashes")
        return self


class Metadata(StrictModel):
    name: str
    description: str = ""


class MatrixSpec(StrictModel):
    apiVersion: Literal["chaoskit/v1"]
    kind: Literal["Matrix"]
    metadata: Metadata
    engine: Literal["tiny-openai", "vllm"] = Field("tiny-openai", description="the replicas' engine")
    replicas: int = Field(2, ge=2, le=4, description="replicas behind each gateway")
    model_params: dict[str, str | int | float | bool] = Field(
        default_factory=dict, description="the replicas' settings (target.reference.model_params), e.g. "
        "{max_context: 400000} for long prompts")
    gateways: list[Literal[GATEWAY_NAMES]] = Field(min_length=1, description="the rows")  # type: ignore[valid-type]
    gateway_params: dict[str, dict[str, str | int | float | bool]] = Field(
        default_factory=dict, description="per gateway, its settings over chaoskit's defaults")
    faults: list[MatrixFault] = Field(min_length=1, description="the columns")
    load: MatrixLoad = Field(default_factory=MatrixLoad)
    hypothesis: MatrixHypothesis = Field(default_factory=MatrixHypothesis)
    answers: MatrixAnswers = Field(default_factory=MatrixAnswers)
    duration: Duration = Field(8.0, gt=0, description="how long each fault is in effect")
    readmit_window: Duration = Field(0.0, ge=0, description="after the revert, the clients' load and the tap go on "
                                     "this long before recovery is judged (recorded, not judged): the time in which "
                                     "replica 0 may be readmitted. 0: until goodput is back")
    recovery: Duration = Field(10.0, gt=0, description="goodput must come back within this after the readmit "
                               "window (else the cell is flagged metastable)")

    @model_validator(mode="after")
    def _consistent(self) -> MatrixSpec:
        names = [f.name for f in self.faults]
        if dup := sorted({n for n in names if names.count(n) > 1}):
            raise ValueError(f"faults: names must differ: {', '.join(dup)}")
        for gateway, params in self.gateway_params.items():
            if gateway not in self.gateways:
                raise ValueError(f"gateway_params: {gateway} is not one of the gateways")
            if gateway in GATEWAY_PARAMS and (problem := GATEWAY_PARAMS[gateway].problem(params)):
                raise ValueError(f"gateway_params: {gateway} {problem}")
        return self


@dataclass(frozen=True)
class Cell:
    gateway: str
    fault: MatrixFault

    @property
    def id(self) -> str:
        return f"{self.gateway}--{self.fault.name}"


def load_matrix(path: Path) -> MatrixSpec:
    """The matrix file, validated: SpecError naming file, line and field."""
    loc = load_yaml(read_text(path), str(path))
    try:
        return MatrixSpec.model_validate(loc.data)
    except ValidationError as e:
        raise SpecError("\n".join(format_validation_error(e, loc))) from None


def cells(spec: MatrixSpec) -> list[Cell]:
    """Gateway by gateway, fault by fault: the order cells run in."""
    return [Cell(g, f) for g in spec.gateways for f in spec.faults if spec.engine in f.engines]


def experiment(spec: MatrixSpec, cell: Cell) -> dict[str, Any]:
    """The plain experiment of one cell: its own deployment (replicas in namespaces, so that network and proxy
    faults can act on replica 0 alone), the clients' SLO in every phase, the fault on replica 0, then the readmit
    window (a pause whose samples are recorded, not judged) when the matrix has one."""
    load = spec.load
    method: list[dict[str, Any]] = [{"name": cell.fault.name, "inject": cell.fault.inject,
                                     "duration": f"{spec.duration}s"}]
    during: dict[str, Any] = {"every": f"{load.window}s"}
    if spec.readmit_window:
        method.append({"name": "readmit-window", "pause": f"{spec.readmit_window}s"})
        during["between"] = "record"
    probe = {"name": "clients", "type": "slo", "mode": "continuous", "window": f"{load.window}s",
             "load": {"url": "{target.url}", "api": "openai", "model": "{target.model}", "stream": load.stream,
                      "rate": load.rate, "duration": f"{load.window}s", "arrival": "constant",
                      "timeout": f"{load.timeout}s", "prompt_tokens": load.prompt_tokens,
                      "max_tokens": load.max_tokens},
             "expect": {"error_rate": spec.hypothesis.error_rate, "all_p99_ms": spec.hypothesis.all_p99_ms}}
    answers = {"name": "answers", "type": "correctness", "phases": ["before", "during"], "url": "{target.url}",
               "api": "openai-chat", "model": "{target.model}", "stream": True, "max_tokens": load.max_tokens,
               "prompts": [f"matrix answer {i}: where did the tokens go?" for i in range(4)],
               "requests": spec.answers.requests, "concurrency": spec.answers.concurrency,
               "request_timeout": f"{load.timeout}s", "expect": {"failed": spec.answers.failed}}
    reference: dict[str, Any] = {"engine": spec.engine, "replicas": spec.replicas, "gateway": cell.gateway,
                                 "netns": True}
    if spec.model_params:
        reference["model_params"] = spec.model_params
    if params := spec.gateway_params.get(cell.gateway):
        reference["gateway_params"] = params
    return {
        "apiVersion": "chaoskit/v1", "kind": "Experiment",
        "metadata": {"name": f"{spec.metadata.name}-{cell.id}",
                     "description": f"{cell.fault.description or cell.fault.name} behind {cell.gateway}",
                     "tags": ["matrix", spec.metadata.name, cell.gateway, cell.fault.name]},
        "target": {"reference": reference, "may_exit": cell.fault.may_exit},
        "steadyState": {"probes": [probe, answers], "during": during,
                        "after": {"within": f"{spec.recovery}s", "every": f"{load.window}s"}},
        "method": method,
    }
