"""What every third-party gateway kind provides: how it is installed, its version, and how it is launched over
the replicas with the health checks, retries and breaker its documentation recommends."""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from chaoskit.errors import ChaoskitError
from chaoskit.model.gateways import PARAMS
from chaoskit.reference.gateways.install import apt_install, pip_install, pip_installed, venv_bin, version_of


@dataclass(frozen=True)
class Upstream:
    """One replica as a gateway sees it."""

    name: str
    host: str
    port: int

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


@dataclass(frozen=True)
class Launch:
    """The gateway's command, the configuration file chaoskit wrote for it (if it takes one), the settings in
    effect (its defaults with the experiment's gateway_params laid over them) and extra environment."""

    argv: list[str]
    settings: dict[str, str]
    config: Path | None = None
    env: dict[str, str] = field(default_factory=dict)


class GatewayKind:
    """One gateway product; the settings it is started with (its documented recommendation for health checks,
    retries and breaker) and the gateway_params it takes are chaoskit.model.gateways.PARAMS[name]."""

    name: ClassVar[str]
    package: ClassVar[str]  # what `chaoskit ref install gateway-NAME` installs (pinned where the source allows)

    def installed(self) -> bool:
        raise NotImplementedError

    def install(self, say: Callable[[str], None], force: bool = False) -> tuple[str, bool]:
        """(where it is, whether it was installed now)."""
        raise NotImplementedError

    def version(self) -> str:
        raise NotImplementedError

    def launch(self, root: Path, upstreams: list[Upstream], port: int, aux_port: int,
               settings: dict[str, str], model: str) -> Launch:
        raise NotImplementedError

    def settings(self, params: dict[str, str]) -> dict[str, str]:
        """The defaults with `params` over them; an unknown key or a value outside its choices is a ChaoskitError."""
        catalog = PARAMS[self.name]
        if problem := catalog.problem(params):
            raise ChaoskitError(f"gateway_params: {self.name} {problem}")
        return {**catalog.defaults, **params}


class PipGateway(GatewayKind):
    """A gateway from PyPI: `package` pinned (NAME==VERSION), in a venv of its own."""

    def installed(self) -> bool:
        return pip_installed(self.name, self.package)

    def install(self, say: Callable[[str], None], force: bool = False) -> tuple[str, bool]:
        return pip_install(self.name, self.package, say, force)

    def version(self) -> str:
        return self.package.partition("==")[2]

    def program(self, name: str) -> str:
        return str(venv_bin(self.name, name))


class AptGateway(GatewayKind):
    """A gateway from a Debian package whose binary has the package's name; `version_pattern` finds the version
    in what `BINARY -v` prints."""

    version_pattern: ClassVar[str]

    def binary(self) -> str:
        return shutil.which(self.package) or f"/usr/sbin/{self.package}"

    def installed(self) -> bool:
        return Path(self.binary()).exists()

    def install(self, say: Callable[[str], None], force: bool = False) -> tuple[str, bool]:
        return apt_install(self.package, self.package, say, force)

    def version(self) -> str:
        return version_of([self.binary(), "-v"],
                          lambda out: m.group(1) if (m := re.search(self.version_pattern, out)) else "")
