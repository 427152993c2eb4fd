"""`chaoskit cuda-wrap`: start a program with the CUDA fault interposer loaded (or prepare a Kubernetes Deployment's
pods to start with it), so gpu.cuda_fault can reach it."""

from __future__ import annotations

import os
import secrets
import shlex
from pathlib import Path

import typer
from rich.markup import escape

from chaoskit import cbuild, paths
from chaoskit.gpu import cuda_fault_ctl as ctl
from chaoskit.term import console

err = console(stderr=True)


def _fail(message: str, code: int = 2) -> None:
    err.print(f"[red]error:[/] {escape(message)}", markup=True, highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def _control_path(given: Path | None, command: list[str]) -> Path:
    """The control file asked for, or a new one in the state directory: for a command started here one the
    next wrap sweeps away once the command has ended (those of commands that have are swept first); for
    --print-env one that stays (a service started elsewhere uses it: remove it when the service is retired)."""
    if given is not None:
        return given
    directory = paths.state_dir() / "cuda-fault"
    if directory.is_dir():
        ctl.sweep(directory)
    if not command:
        return directory / f"service-{secrets.token_hex(4)}.ctl"
    return directory / f"{ctl.WRAP_PREFIX}{Path(command[0]).name}-{secrets.token_hex(4)}.ctl"


def _deployment_ref(text: str) -> tuple[str, str]:
    ns, sep, name = text.partition("/")
    if not sep or not ns or not name or "/" in name:
        _fail(f"--deployment: expected NAMESPACE/NAME, got {text!r}")
    return ns, name


def _kube_deployment(ref: str, containers: list[str], image: str, kubeconfig: str | None, context: str | None,
                     key_namespace: str, restore: bool, dry_run: bool) -> None:
    """Prepare (or restore) a Deployment: exit 4 if it cannot be, 5 if its record does not check."""
    from kubernetes import client

    from chaoskit.errors import PreflightError
    from chaoskit.executors import k8s_cuda_wrap as kw
    from chaoskit.executors.k8s_records import KeyUnavailable
    from chaoskit.targets.kube import KubeCluster, api_client, resolve_cluster

    ns, name = _deployment_ref(ref)
    try:
        api = api_client(resolve_cluster(KubeCluster(kubeconfig=kubeconfig, context=context)))
        apps, core = client.AppsV1Api(api), client.CoreV1Api(api)
        if restore:
            change = kw.restore(apps, core, ns, name, key_namespace, dry_run)
        else:
            change = kw.wrap(apps, core, ns, name, image, containers or None, key_namespace, dry_run)
    except (PreflightError, kw.WrapRefused, KeyUnavailable) as e:
        _fail(str(e), 4)
    except kw.AnnotationRefused as e:
        _fail(str(e), 5)
    except Exception as e:  # the API server answered an error, or could not be reached
        _fail(f"deployment {ns}/{name}: {type(e).__name__}: {getattr(e, 'reason', None) or e}", 1)
    if change is None:
        print(f"deployment {ns}/{name} " + ("was not prepared by cuda-wrap: nothing to restore" if restore
                                            else "is prepared already (undo: --restore)"))
        return
    for line in change.plan:
        print(("would: " if dry_run else "") + line)
    if not dry_run:
        print(f"follow the rollout: kubectl rollout status deployment/{name} -n {ns}")


def cuda_wrap(
    command: list[str] = typer.Argument(None, help="the program and its arguments (after --)"),
    control: Path | None = typer.Option(None, "--control", metavar="FILE",
                                        help="the control file (default: a new one in chaoskit's state directory)"),
    print_env: bool = typer.Option(False, "--print-env",
                                   help="print the environment lines instead (systemd Environment=, docker -e)"),
    deployment: str | None = typer.Option(None, "--deployment", metavar="NS/NAME",
                                          help="instead: prepare this Kubernetes Deployment's GPU containers to "
                                               "start with the interposer (a rollout: its pods restart once)"),
    container: list[str] = typer.Option([], "--container", metavar="NAME",
                                        help="with --deployment: the container(s) to prepare (default: those "
                                             "that ask for a GPU)"),
    image: str = typer.Option("chaoskit:latest", "--image",
                              help="with --deployment: the chaoskit image of the init container that installs it"),
    kubeconfig: str | None = typer.Option(None, "--kubeconfig", help="with --deployment: kubeconfig path "
                                          "(default: $KUBECONFIG, ~/.kube/config, the pod's service account)"),
    context: str | None = typer.Option(None, "--context", help="with --deployment: kubeconfig context"),
    key_namespace: str = typer.Option("chaoskit", "--key-namespace",
                                      help="with --deployment: the namespace of the signing key Secret "
                                           "(chaoskit-record-key)"),
    restore: bool = typer.Option(False, "--restore", help="with --deployment: take the interposer out again "
                                 "(a second rollout)"),
    dry_run: bool = typer.Option(False, "--dry-run", help="with --deployment: print the change, make none"),
) -> None:
    """Run COMMAND with chaoskit's CUDA fault interposer preloaded (it and its children; no effect until a
    gpu.cuda_fault is applied to it). Example: chaoskit cuda-wrap -- vllm serve MODEL. On Kubernetes, once per
    Deployment: chaoskit cuda-wrap --deployment NS/NAME"""
    if deployment is not None:
        if command or print_env or control is not None:
            _fail("--deployment takes no program, --print-env or --control")
        _kube_deployment(deployment, container, image, kubeconfig, context, key_namespace, restore, dry_run)
        return
    if container or restore or dry_run:
        _fail("--container, --restore and --dry-run go with --deployment")
    if not command and not print_env:
        _fail("give the program to start after --, or --print-env")
    try:
        library = ctl.build()
    except cbuild.NoCompiler as e:
        _fail(f"{e}; the interposer is built once from C with the system compiler")
    except cbuild.CompileFailed as e:
        _fail(str(e), 1)
    path = _control_path(control, command or [])
    if not path.exists():
        try:
            ctl.create(path)
        except OSError as e:
            _fail(f"cannot create the control file {path}: {e.strerror}")
    env = ctl.environment(library, path, {k: v for k, v in os.environ.items() if k == "LD_PRELOAD"})
    if print_env:
        for key in ("LD_PRELOAD", ctl.ENV):
            print(f"{key}={shlex.quote(env[key])}")
        return
    ctl.hold(path)  # inherited by the command: the file is swept only once it and its children are gone
    try:
        os.execvpe(command[0], command, {**os.environ, **env})
    except OSError as e:
        _fail(f"cannot start {command[0]}: {e.strerror}", 1)
