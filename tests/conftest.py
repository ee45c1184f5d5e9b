"""Shared test tools: the one way the suite checks whether XLA compiled, a
self-signed TLS certificate for servers on 127.0.0.1, and one XLA compilation
cache for the whole session."""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

#: The test files that take longest in make test or make test-slow (half a
#: minute or more on 2 cores), run first: with two workers taking whole files, a
#: long file left for the end keeps one worker busy while the other has nothing
#: left to run.
LONG_FILES = (
    "test_libero.py",
    "test_ray.py",
    "test_notebook.py",
    "test_sharded.py",
    "test_playground_menagerie.py",
    "test_evaluate.py",
    "test_cli.py",
    "test_served.py",
    "test_execution_modes.py",
    "test_server_loss.py",
    "test_envpool.py",
    "test_remote_policy.py",
    "test_model.py",
    "test_gymnasium.py",
    "test_playground.py",
    "test_resume_identity.py",
    "test_errors.py",
)


def pytest_collection_modifyitems(config, items):
    """Orders the long files first, each file's tests in their own order.

    Raises:
      pytest.UsageError: a name in ``LONG_FILES`` is no test file under
        ``tests/`` (moved or renamed): the ordering would silently miss it.
    """
    here = Path(__file__).parent
    missing = [name for name in LONG_FILES if next(here.rglob(name), None) is None]
    if missing:
        raise pytest.UsageError(
            f"tests/conftest.py: LONG_FILES names {missing}, which are no test "
            "files under tests/ any more; put their new names in LONG_FILES"
        )
    rank = {name: i for i, name in enumerate(LONG_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


#: JAX's own setting (read from the environment by every process that imports
#: jax): where compiled executables are kept and looked up.
XLA_CACHE_ENV = "JAX_COMPILATION_CACHE_DIR"
#: JAX's own setting too: keep every compiled program, not only those that took
#: over a second (JAX's default). Most of the suite's programs compile in 0.3-1
#: s, and many are compiled again in another test, worker or subprocess (the
#: same engine over the same env and policy, built anew from a fresh closure):
#: loading them saves about a fifth of the test files' time on 2 cores.
MIN_COMPILE_ENV = "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"


def pytest_configure(config):
    """One persistent XLA cache for the session, in a fresh directory.

    Many tests compile the same program in another process: ``make test``'s
    two workers, and the CLI, server and worker subprocesses the tests start
    (each ``jaxmesh eval`` of the same config compiles the same scan). Set
    here, before the workers start, the directory is inherited by every one of
    them; a program is then compiled once and loaded after (every program,
    ``MIN_COMPILE_ENV``). Compilation is still observed: a hit records the same
    backend-compile event (``compiles``). A directory the user set is used as
    it is; the session's own is removed at the end.
    """
    if os.environ.get(XLA_CACHE_ENV):
        where = os.environ[XLA_CACHE_ENV]
    else:
        where = tempfile.mkdtemp(prefix="jaxmesh-tests-xla-")
        os.environ[XLA_CACHE_ENV] = where
        config._jaxmesh_xla_cache = where
    if MIN_COMPILE_ENV not in os.environ:
        os.environ[MIN_COMPILE_ENV] = "0"
        config._jaxmesh_min_compile = True
    jax.config.update("jax_compilation_cache_dir", where)
    jax.config.update(
        "jax_persistent_cache_min_compile_time_secs", float(os.environ[MIN_COMPILE_ENV])
    )


def pytest_unconfigure(config):
    where = getattr(config, "_jaxmesh_xla_cache", None)
    if where is not None:
        os.environ.pop(XLA_CACHE_ENV, None)
        shutil.rmtree(where, ignore_errors=True)
    if getattr(config, "_jaxmesh_min_compile", False):
        os.environ.pop(MIN_COMPILE_ENV, None)


#: The event JAX records once per XLA (backend) compilation.
COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


def children_of(pid: int) -> list[int]:
    """The child processes of ``pid``, of any kind (read from /proc)."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rpartition(")")[2].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            if ppid == pid:
                out.append(int(entry))
    return out


@contextlib.contextmanager
def compiles():
    """Collects the XLA compilations made inside the block (a list of names).

    Listens to ``jax.monitoring``'s backend-compile event, which JAX records for
    every program it hands to XLA (a persistent-cache hit included).
    """
    seen: list[str] = []

    def listen(event: str, duration: float, **kwargs) -> None:
        if event == COMPILE_EVENT:
            seen.append(str(kwargs.get("fun_name", "?")))

    jax.monitoring.register_event_duration_secs_listener(listen)
    try:
        yield seen
    finally:
        jax.monitoring.unregister_event_duration_listener(listen)


@pytest.fixture
def no_compile():
    """Fails the test if anything reaches XLA compilation inside it.

    Two one-time eager ops of the process are made first, so that the check is
    about the run's programs: ``jax.random.PRNGKey(0)`` (the shape probe builds
    one) and ``jnp.zeros(())`` (``Model`` asks whether it is under a trace).
    """
    jax.random.PRNGKey(0)
    jnp.zeros(())
    with compiles() as seen:
        yield
    assert not seen, f"compiled before rejecting bad input: {seen}"


@pytest.fixture(scope="session")
def pems(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A self-signed certificate for localhost / 127.0.0.1 and its key."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [
                    x509.DNSName("localhost"),
                    x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                ]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    root = tmp_path_factory.mktemp("tls")
    paths = {"cert": root / "cert.pem", "key": root / "key.pem"}
    paths["cert"].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths["key"].write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return paths


@contextlib.contextmanager
def jupyter_kernel(root: Path, name: str, env: dict | None = None):
    """A started Jupyter kernel of a kernelspec of our own (``name``, written
    under ``root``, so no kernelspec installed elsewhere can shadow it) that
    runs this very interpreter, with ``env`` added to its environment; shut
    down on exit."""
    from jupyter_client.manager import KernelManager

    spec_dir = root / "jupyter" / "kernels" / name
    spec_dir.mkdir(parents=True)
    spec = {
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": f"{name} ({sys.executable})",
        "language": "python",
        **({"env": env} if env else {}),
    }
    (spec_dir / "kernel.json").write_text(json.dumps(spec))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("JUPYTER_PATH", str(root / "jupyter"))
        km = KernelManager(kernel_name=name)
        km.start_kernel(cwd=str(root))
    try:
        yield km
    finally:
        km.shutdown_kernel(now=True)


@pytest.fixture
def no_compile_cache(monkeypatch):
    """In-process CLI runs must not turn on the persistent compilation cache
    for the rest of the test session."""
    from jaxmesh.cli.cache import CACHE_SWITCH_ENV

    monkeypatch.setenv(CACHE_SWITCH_ENV, "0")
