"""Pydantic models of the experiment file (apiVersion chaoskit/v1, kind Experiment)."""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import Field, model_validator

from chaoskit.injectors import INJECTORS
from chaoskit.model.gateways import CHAOSKIT as GATEWAY_CHAOSKIT
from chaoskit.model.gateways import NAMES as GATEWAY_NAMES
from chaoskit.model.gateways import PARAMS as GATEWAY_PARAMS
from chaoskit.model.types import Duration, Port, RuleSpec, StrictModel
from chaoskit.probes import PROBES

InjectSpec = Annotated[Union[tuple(cls.Spec for cls in INJECTORS)], Field(discriminator="type")]  # type: ignore # noqa: UP007
ProbeSpec = Annotated[Union[tuple(cls.Spec for cls in PROBES)], Field(discriminator="type")]  # type: ignore # noqa: UP007


LIFETIME_MARGIN_S = 60.0
DEFAULT_LIFETIME_S = 3600.0


class Metadata(StrictModel):
    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.\-]+$", description="experiment name")
    description: str = ""
    tags: list[str] = Field(default_factory=list)


ParamValue = str | int | float | bool


class RefSettings(StrictModel):
    """What a scenario changes in its reference deployment when a variable is true (see Reference.when)."""

    replicas: int | None = Field(None, ge=1, le=8, description="replicas behind the gateway")
    health: Literal["status", "latency"] | None = Field(None, description="gateway health checks")
    latency_threshold: Duration | None = Field(None, gt=0, description="for health: latency")
    netns: bool | None = Field(None, description="each replica in its own network namespace")
    model_params: dict[str, ParamValue] = Field(default_factory=dict, description="tiny_lm parameters")
    gateway_params: dict[str, ParamValue] = Field(default_factory=dict, description="a third-party gateway's "
                                                  "settings, e.g. {retry_max_retries: 0}")


class Disaggregated(StrictModel):
    """tiny_lm split into prefill and decode servers (chaoskit.reference.pd_server); the gateway is the PD router."""

    prefill: int = Field(1, ge=1, le=4, description="prefill servers")
    decode: int = Field(1, ge=1, le=4, description="decode servers")


class Reference(StrictModel):
    """The reference deployment a scenario needs: `chaoskit run` brings it up (or reuses a running one with
    the same settings), runs, and takes it down again; ledgered, so a killed run leaves no replica behind."""

    engine: Literal["triton", "vllm", "tiny-openai"] = Field(
        "triton", description="triton (light), vllm, or tiny-openai (a light OpenAI-compatible server: completions "
                              "and chat, streamed or not, deterministic tokens; each replica logs its requests)")
    gateway: Literal[GATEWAY_NAMES] = Field(  # type: ignore[valid-type]
        "chaoskit", description="the gateway in front of the replicas: chaoskit (its own: latency stamping, health "
                                "modes) or a third-party one, installed with `chaoskit ref install gateway-NAME`: "
                                + ", ".join(GATEWAY_NAMES[1:]) + " (with engine tiny-openai or vllm)")
    gateway_params: dict[str, ParamValue] = Field(
        default_factory=dict, description="a third-party gateway's settings over chaoskit's defaults for it "
        "(`chaoskit ref up --gateway NAME` prints them), e.g. {retry_max_retries: 0} or {max_fails: 3}")
    tap: bool = Field(True, description="a third-party gateway reaches each replica through a counting pass-through "
                      "that logs every request and its answer ({target.gateway.tap_log}) and counts them on a Prometheus "
                      "endpoint ({target.gateway.tap_metrics}: chaoskit_tap_requests_total{replica,path}, "
                      "chaoskit_tap_answers_total{replica,path,outcome,status}), so that a frozen replica "
                      "cannot hide what was sent to it. It accepts connections for the replica: a replica that "
                      "refuses them (killed) is seen by the gateway as a connection closed before any answer, "
                      "not as connection refused; false keeps connection refused, without the count")
    mcp: bool = Field(False, description="also tiny-mcp, a small MCP tool server (streamable HTTP, the official "
                      "mcp SDK: the agents extra) whose tools answer deterministically and log each call; facts "
                      "{target.mcp.url}, {target.mcp.request_log}")
    replicas: int = Field(2, ge=1, le=8, description="replicas behind the gateway")
    health: Literal["status", "latency"] = Field("status", description="gateway health checks: status (HTTP 200 "
                                                 "only) or latency (also eject replicas slower than the threshold)")
    latency_threshold: Duration = Field(0.5, gt=0, description="for health: latency")
    netns: bool = Field(False, description="each replica in its own network namespace (needs root)")
    model_params: dict[str, ParamValue] = Field(default_factory=dict, description="tiny_lm parameters, e.g. "
                                                "isolate_kv_cache: false")
    port: Port | None = Field(None, description="gateway port (default: the first free block from 18000, or from $CHAOSKIT_REF_FIRST_PORT)")
    when: dict[str, RefSettings] = Field(default_factory=dict, description="settings that apply when the named "
                                         "variable is true, e.g. when: {fix: {health: latency}} and --var fix=true")
    neighbour: Reference | None = Field(None, description="a second deployment on the same host (another tenant), "
                                        "e.g. {engine: vllm}; its facts are {target.neighbour.url} and so on")
    disaggregated: Disaggregated | None = Field(
        None, description="tiny_lm split into prefill and decode servers, its KV cache handed over a TCP side "
                          "channel, e.g. {prefill: 2, decode: 1}; their settings (waiting_timeout_s, notify_abort, "
                          "...) in model_params; facts {target.prefill_pid}, {target.decode_url} ...; with netns "
                          "each decode server in a namespace of its own ({target.decode_netns})")

    @model_validator(mode="after")
    def _one_level(self) -> Reference:
        if self.neighbour is not None and (self.neighbour.neighbour is not None or self.neighbour.when):
            raise ValueError("neighbour: a neighbour has no neighbour or when of its own")
        if self.disaggregated is not None and self.engine != "triton":
            raise ValueError("disaggregated: splits tiny_lm (engine: triton, the default)")
        return self

    @model_validator(mode="after")
    def _gateway(self) -> Reference:
        if self.gateway == GATEWAY_CHAOSKIT:
            if self.gateway_params or any(o.gateway_params for o in self.when.values()):
                raise ValueError("gateway_params: for a third-party gateway only (chaoskit's takes health:)")
            return self
        if self.engine == "triton" or self.disaggregated is not None:
            raise ValueError(f"gateway: {self.gateway} serves OpenAI-compatible replicas: engine tiny-openai or vllm")
        if self.health != "status" or any(o.health not in (None, "status") for o in self.when.values()):
            raise ValueError(f"health: latency is chaoskit's gateway's; {self.gateway} uses its own health checks")
        for where, params in (("gateway_params", self.gateway_params),
                              *((f"when.{k}.gateway_params", o.gateway_params) for k, o in self.when.items())):
            if problem := GATEWAY_PARAMS[self.gateway].problem(params):
                raise ValueError(f"{where}: {self.gateway} {problem}")
        return self

    def effective(self, variables: dict[str, Any]) -> Reference:
        """These settings with every `when` block of a true variable laid over them."""
        out = self
        for name, overlay in self.when.items():
            if str(variables.get(name, "")).strip().lower() in ("true", "1", "yes", "on"):
                given = overlay.model_dump(exclude_none=True, exclude={"model_params", "gateway_params"})
                out = out.model_copy(update={**given, "model_params": {**out.model_params, **overlay.model_params},
                                             "gateway_params": {**out.gateway_params, **overlay.gateway_params}})
        return out


class Target(StrictModel):
    url: str | None = Field(None, pattern=r"^https?://", description="base URL of the service; {target.url}")
    reference: Literal["triton", "vllm", "tiny-openai"] | Reference | None = Field(
        None, description="triton|vllm|tiny-openai: the facts of a deployment started with `chaoskit ref up`; a mapping: "
                          "the deployment this experiment brings up itself (engine, replicas, health, ...)")
    facts: dict[str, str | int | float] = Field(default_factory=dict,
                                                description="extra facts, usable as {target.NAME}")
    may_exit: bool = Field(False, description="the processes a fault acts on, and the servers they belong to, "
                           "may exit during the run: each exit is still journaled (target_exited) and shown, but "
                           "the run does not deviate for it. Default false: an exit from the apply to the end of "
                           "the after phase makes the run deviate and it is never called recovered")


class During(StrictModel):
    every: Duration = Field(2.0, gt=0, description="interval between samples of each probe during the method")
    grace: Duration = Field(0.0, ge=0, description="samples taken this soon after a fault is applied are recorded "
                            "but not judged (phase 'grace'): the time the system is allowed to adapt, e.g. the "
                            "gateway's ejection window. Default 0: every sample taken while a fault is in effect "
                            "is judged. A fault in effect with no judged sample at all makes the run deviate")
    between: Literal["judge", "record"] = Field(
        "judge", description="samples taken during the method while no fault is in effect (before the first apply "
        "ends, in a pause between faults): judge (default: phase 'during', like the others) or record (phase "
        "'between', not judged; with record, a pause step that ends the method (at its top level) is sampled too by "
        "the probes that go on into the after phase: a window after the last revert). A sample during which a "
        "fault was applied is a during sample either way")


class After(StrictModel):
    within: Duration = Field(30.0, ge=0, description="how long after rollback the hypothesis may take to hold "
                                                     "again (recovery time is measured up to this bound)")
    every: Duration = Field(1.0, gt=0, description="interval between checks while waiting for recovery")


class SteadyState(StrictModel):
    probes: list[ProbeSpec] = Field(min_length=1)
    during: During | None = Field(default_factory=During, description="continuous probing during the method; "
                                                                      "null turns it off")
    after: After = Field(default_factory=After)

    @model_validator(mode="after")
    def _unique(self) -> SteadyState:
        seen: set[str] = set()
        for p in self.probes:
            if p.name in seen:
                raise ValueError(f"probe name '{p.name}' is used twice")
            seen.add(p.name)
        return self


class Step(StrictModel):
    """One method step: exactly one of inject, pause or parallel."""

    name: str | None = None
    inject: InjectSpec | None = None
    fallback: list[InjectSpec] = Field(default_factory=list, description="faults to use instead, in order, when "
                                       "this host cannot apply `inject` (its preflight fails); the journal and "
                                       "the plan say which variant ran and why")
    duration: Duration | None = Field(None, gt=0, description="how long the fault stays; omitted = until the "
                                                                "end of the method")
    pause: Duration | None = Field(None, ge=0, description="wait this long")
    parallel: list[Step] | None = Field(None, min_length=1, description="steps run at the same time")
    timeout: Duration = Field(30.0, gt=0, description="limit for applying the fault")
    max_lifetime: Duration | None = Field(None, gt=0, description="the watchdog reverts the fault this long after "
                                          "it was applied even if the run still lives (a hung run); default: "
                                          "duration + 60s, or 1h for a fault without a duration")

    def lifetime(self) -> float:
        """Seconds a fault of this step may stay applied at most."""
        if self.max_lifetime is not None:
            return self.max_lifetime
        return self.duration + LIFETIME_MARGIN_S if self.duration else DEFAULT_LIFETIME_S

    @model_validator(mode="after")
    def _exactly_one(self) -> Step:
        given = [k for k in ("inject", "pause", "parallel") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError("a step needs exactly one of 'inject', 'pause' or 'parallel'"
                             + (f" (got {', '.join(given)})" if given else ""))
        if (self.duration is not None or self.max_lifetime is not None or self.fallback) and self.inject is None:
            raise ValueError("'duration', 'max_lifetime' and 'fallback' only apply to an 'inject' step")
        if self.max_lifetime is not None and self.duration is not None and self.max_lifetime < self.duration:
            raise ValueError(f"max_lifetime ({self.max_lifetime:g}s) is shorter than duration ({self.duration:g}s)")
        return self

    def label(self) -> str:
        if self.name:
            return self.name
        if self.inject is not None:
            return self.inject.type
        if self.pause is not None:
            return f"pause {self.pause:g}s"
        return "parallel"


class Safeguard(StrictModel):
    probe: str | ProbeSpec = Field(description="name of a steady-state probe, or a probe definition")
    abort_when: RuleSpec | list[RuleSpec] = Field(description="abort when any rule is true, e.g. "
                                                              "'error_rate > 0.5'")
    on_error: Literal["ignore", "abort"] = Field("ignore", description="what a probe error means")
    every: Duration | None = Field(None, gt=0, description="sampling interval (default: steadyState.during)")

    def rules(self) -> list[Any]:
        return self.abort_when if isinstance(self.abort_when, list) else [self.abort_when]


class Experiment(StrictModel):
    api_version: Literal["chaoskit/v1"] = Field(alias="apiVersion")
    kind: Literal["Experiment"]
    metadata: Metadata
    vars: dict[str, str | int | float | bool] = Field(default_factory=dict,
                                                      description="defaults for {NAME}; --var overrides")
    target: Target = Field(default_factory=Target)
    steady_state: SteadyState = Field(alias="steadyState")
    method: list[Step] = Field(min_length=1)
    safeguards: list[Safeguard] = Field(default_factory=list)

    @model_validator(mode="after")
    def _refs(self) -> Experiment:
        names = {p.name for p in self.steady_state.probes}
        ref = self.target.reference
        for var in ref.when if isinstance(ref, Reference) else {}:
            if var not in self.vars:
                raise ValueError(f"target.reference.when.{var}: no variable '{var}' in vars "
                                 f"(declare it, e.g. vars: {{{var}: false}})")
        for i, sg in enumerate(self.safeguards):
            if isinstance(sg.probe, str) and sg.probe not in names:
                raise ValueError(f"safeguards[{i}].probe: no steady-state probe named '{sg.probe}' "
                                 f"(have: {', '.join(sorted(names))})")
        return self
