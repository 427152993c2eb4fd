"""reference.deployment / reference.gateway: what a scenario did to the reference deployment, as ledger entries
(revert = take it down / switch the gateway back), so a killed run leaves nothing behind. Internal: no experiment
names these types; they register like any fault family (pyproject entry points, group chaoskit.injectors)."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar, Literal

from pydantic import Field

from chaoskit.injectors.base import Injector, RevertRecord
from chaoskit.model.types import StrictModel


class ReferenceDeploymentSpec(StrictModel):
    type: Literal["reference.deployment"]
    dir: str


class DeploymentRecord(RevertRecord):
    dir: str = Field(min_length=1)  # the deployment's state directory (its recorded processes)


class ReferenceDeployment(Injector[ReferenceDeploymentSpec, DeploymentRecord]):
    type: ClassVar[str] = "reference.deployment"
    internal: ClassVar[bool] = True
    summary: ClassVar[str] = "the reference deployment an experiment declared (started and stopped by the run)"
    Spec = ReferenceDeploymentSpec
    spec: ReferenceDeploymentSpec
    Record = DeploymentRecord

    def plan(self) -> list[str]:
        return [f"start the reference deployment in {self.spec.dir}"]

    def apply(self, record: DeploymentRecord) -> DeploymentRecord:
        raise NotImplementedError("started by chaoskit.reference.scenario, not by the engine")

    @classmethod
    def revert(cls, record: DeploymentRecord) -> None:
        from chaoskit.reference.deploy import Deployment

        Deployment(Path(record.dir)).down(say=lambda _m: None)

    @classmethod
    def observe(cls, record: DeploymentRecord) -> bool:
        from chaoskit.reference.deploy import Deployment
        from chaoskit.targets.process import ProcessRef, is_alive

        d = Deployment(Path(record.dir))
        return any(is_alive(ProcessRef.from_json(p)) for p in d.processes())


class ReferenceGatewaySpec(StrictModel):
    type: Literal["reference.gateway"]
    url: str


class GatewayHealth(RevertRecord):
    """A gateway's health settings, as its /gateway/status says them and its /gateway/config takes them."""

    health_mode: str
    latency_threshold_ms: float


class GatewayRecord(RevertRecord):
    url: str = Field(pattern=r"^https?://")
    previous: GatewayHealth  # the settings to switch back to


class ReferenceGateway(Injector[ReferenceGatewaySpec, GatewayRecord]):
    """A reused deployment's gateway switched to a run's health settings; revert switches it back."""

    type: ClassVar[str] = "reference.gateway"
    internal: ClassVar[bool] = True
    summary: ClassVar[str] = "a reused reference gateway's health settings, switched for one run"
    Spec = ReferenceGatewaySpec
    spec: ReferenceGatewaySpec
    Record = GatewayRecord

    def plan(self) -> list[str]:
        return [f"switch the health settings of the gateway at {self.spec.url}"]

    def apply(self, record: GatewayRecord) -> GatewayRecord:
        raise NotImplementedError("switched by chaoskit.reference.scenario, not by the engine")

    @classmethod
    def revert(cls, record: GatewayRecord) -> None:
        from chaoskit.reference.scenario import set_gateway_health

        r = record
        try:
            set_gateway_health(r.url, r.previous.to_json())
        except ConnectionRefusedError:
            pass  # the gateway is gone: nothing to switch back
        except OSError as e:
            if not isinstance(getattr(e, "reason", None), ConnectionRefusedError):
                raise

    @classmethod
    def observe(cls, record: GatewayRecord) -> bool:
        from chaoskit.reference.scenario import gateway_health

        try:
            return gateway_health(record.url) != record.previous.to_json()
        except OSError:
            return False
