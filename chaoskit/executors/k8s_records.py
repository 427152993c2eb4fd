"""Revert records in the cluster, authenticated: an HMAC-SHA256 with the installation's key (a Secret).

A run's revert records (revert_store: one ConfigMap per run, one key per fault) drive helper pods with hostPID
and capabilities when `chaoskit rollback --cluster` replays them, so anyone who may patch ConfigMaps in the
namespace could otherwise have a node run what they wrote. Each record carries `mac`: HMAC-SHA256, keyed by the
Secret `chaoskit-record-key` of the records' namespace, over its ConfigMap's name, its key and its canonical JSON
(sorted keys, no spaces, ASCII). chaoskit creates the Secret on first use (32 random bytes) when it is absent; a
record whose MAC is missing or wrong, or that is not JSON, is refused (RecordRefused) and never executed.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import secrets
from dataclasses import dataclass
from typing import Any

from chaoskit.executors.revert_store import MANAGED_LABEL, RevertStore

RECORD_KEY_SECRET = "chaoskit-record-key"
KEY_FIELD = "key"  # the Secret's data key: the HMAC key, base64 (as Secrets hold any value)
MAC_FIELD = "mac"
MAC_PREFIX = "hmac-sha256:"
KEY_BYTES = 32
MIN_KEY_BYTES = 16
DOMAIN = b"chaoskit revert record v1"


class RecordRefused(RuntimeError):
    """A revert record chaoskit did not write as it stands (no MAC, a wrong one, not JSON): it is never executed."""


class KeyUnavailable(RuntimeError):
    """The key Secret cannot be read or created (RBAC, a Secret that holds no usable key)."""


def canonical(request: dict[str, Any]) -> bytes:
    """The bytes the MAC covers: sorted keys, no spaces, ASCII (the same for any writer of the same record)."""
    return json.dumps(request, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode()


def mac(key: bytes, configmap: str, entry: str, request: dict[str, Any]) -> str:
    """`hmac-sha256:HEX` of the record (without its own mac), bound to its ConfigMap and key: a record moved
    to another run's ConfigMap or another key does not check."""
    message = b"\n".join((DOMAIN, configmap.encode(), entry.encode(), canonical(request)))
    return MAC_PREFIX + hmac.new(key, message, hashlib.sha256).hexdigest()


def sign(key: bytes, configmap: str, entry: str, request: dict[str, Any]) -> dict[str, Any]:
    body = {k: v for k, v in request.items() if k != MAC_FIELD}
    return {**body, MAC_FIELD: mac(key, configmap, entry, body)}


def verify(key: bytes | None, namespace: str, configmap: str, entry: str, raw: str) -> dict[str, Any]:
    """The record without its mac; RecordRefused, saying which and why, unless chaoskit wrote it as it stands."""
    where = f"revert record {namespace}/{configmap} key {entry}.json"
    try:
        data = json.loads(raw)
    except ValueError:
        raise RecordRefused(f"{where} is not JSON (changed after chaoskit wrote it)") from None
    if not isinstance(data, dict):
        raise RecordRefused(f"{where} is not a JSON object (changed after chaoskit wrote it)")
    got = data.pop(MAC_FIELD, None)
    if not isinstance(got, str):
        raise RecordRefused(f"{where} carries no MAC: chaoskit did not write it (or wrote it before records were "
                            "signed)")
    if key is None:
        raise RecordRefused(f"{where} cannot be checked: there is no key Secret {namespace}/{RECORD_KEY_SECRET}")
    if not hmac.compare_digest(got.encode(), mac(key, configmap, entry, data).encode()):
        raise RecordRefused(f"{where} fails its MAC check: it was changed after chaoskit wrote it (or signed with "
                            "another installation's key)")
    return data


def _key_error(namespace: str, what: str, e: Any) -> KeyUnavailable:
    return KeyUnavailable(f"cannot {what} the revert records' key, Secret {namespace}/{RECORD_KEY_SECRET} "
                          f"({e.status} {e.reason}): the chaoskit Role must grant it (deploy/k8s/chaoskit/role.yaml)")


def read_key(core: Any, namespace: str) -> bytes | None:
    """The installation's key, or None when the Secret does not exist; KeyUnavailable if it cannot be read or
    holds no usable key. Other API errors (unreachable) propagate."""
    from kubernetes.client.exceptions import ApiException

    try:
        secret = core.read_namespaced_secret(RECORD_KEY_SECRET, namespace)
    except ApiException as e:
        if e.status == 404:
            return None
        raise _key_error(namespace, "read", e) from None
    try:
        key = base64.b64decode((secret.data or {}).get(KEY_FIELD) or "", validate=True)
    except (binascii.Error, ValueError):
        key = b""
    if len(key) < MIN_KEY_BYTES:
        raise KeyUnavailable(f"Secret {namespace}/{RECORD_KEY_SECRET} holds no usable key (data.{KEY_FIELD}: at "
                             f"least {MIN_KEY_BYTES} bytes, base64)")
    return key


def ensure_key(core: Any, namespace: str) -> bytes:
    """The installation's key, created (32 random bytes) on first use; a key created at the same moment by
    another run wins (409: read back)."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    key = read_key(core, namespace)
    if key is not None:
        return key
    key = secrets.token_bytes(KEY_BYTES)
    body = client.V1Secret(
        metadata=client.V1ObjectMeta(name=RECORD_KEY_SECRET, labels={"chaoskit.io/role": "record-key"},
                                     annotations={"chaoskit.io/purpose": "HMAC key of chaoskit's revert records"}),
        type="Opaque", data={KEY_FIELD: base64.b64encode(key).decode()})
    try:
        core.create_namespaced_secret(namespace, body)
    except ApiException as e:
        if e.status != 409:
            raise _key_error(namespace, "create", e) from None
        return read_key(core, namespace) or key
    return key


class SignedRecords:
    """One run's revert records (a RevertStore) written with a MAC and read back only if it checks. The key is
    read (or created, by put) once, on first need."""

    def __init__(self, core: Any, namespace: str, run_id: str, key: bytes | None = None):
        self.core, self.namespace = core, namespace
        self.store = RevertStore(core, namespace, run_id)
        self._key = key

    def put(self, entry: str, request: dict[str, Any]) -> None:
        self.put_many({entry: request})

    def put_many(self, entries: dict[str, dict[str, Any]]) -> None:
        """Sign and write several entries in one merge patch."""
        if self._key is None:
            self._key = ensure_key(self.core, self.namespace)
        key = self._key
        self.store.put_many({e: sign(key, self.store.name, e, r) for e, r in entries.items()})

    def get(self, entry: str) -> dict[str, Any] | None:
        """The entry, or None if there is none; RecordRefused if it does not check."""
        return self.get_many([entry]).get(entry)

    def get_many(self, entries: list[str]) -> dict[str, dict[str, Any]]:
        """Those of the entries there are, from one read of the ConfigMap; RecordRefused if one does not check."""
        data = self.store.raw() or {}
        raws = {e: data[f"{e}.json"] for e in entries if data.get(f"{e}.json")}
        if raws and self._key is None:
            self._key = read_key(self.core, self.namespace)
        return {e: verify(self._key, self.namespace, self.store.name, e, raw) for e, raw in raws.items()}

    def remove(self, entry: str) -> None:
        self.store.remove(entry)

    def remove_many(self, entries: list[str]) -> None:
        self.store.remove_many(entries)


@dataclass(frozen=True)
class CheckedFault:
    """One fault a run left recorded in the cluster: its request if it checks, else why it was refused."""

    run_id: str
    configmap: str
    key: str
    request: dict[str, Any] | None
    refused: str | None = None


def checked_faults(core: Any, namespace: str) -> tuple[bytes | None, list[CheckedFault]]:
    """(the key, every fault any run left recorded in `namespace`, each checked). KeyUnavailable if there are
    records and the key Secret cannot be read."""
    cms = core.list_namespaced_config_map(namespace, label_selector=f"{MANAGED_LABEL}=chaoskit").items
    key = read_key(core, namespace) if any(cm.data for cm in cms) else None
    out = []
    for cm in cms:
        run_id = (cm.metadata.annotations or {}).get("chaoskit.io/run-id", "")
        for name, raw in sorted((cm.data or {}).items()):
            entry = name.removesuffix(".json")
            try:
                out.append(CheckedFault(run_id, cm.metadata.name, entry, verify(key, namespace, cm.metadata.name,
                                                                                entry, raw)))
            except RecordRefused as e:
                out.append(CheckedFault(run_id, cm.metadata.name, entry, None, str(e)))
    return key, out
