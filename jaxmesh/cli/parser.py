"""The ``jaxmesh`` command line's parser: its commands and their flags, each
command naming its function as ``"module:function"`` of ``jaxmesh.cli``."""

from __future__ import annotations

import argparse
import json
import shlex
from typing import Any

from jaxmesh._version import __version__
from jaxmesh.cache import CACHE_DIR_ENV
from jaxmesh.cli.cache import CACHE_SWITCH_ENV
from jaxmesh.cli.config import keys_help
from jaxmesh.cli.outputs import (
    EPISODE_LOG_SUFFIX,
    NEXT_TO_OUTPUT,
    SWEEP_CELLS_SUFFIX,
    SWEEP_SUFFIX,
)
from jaxmesh.trace import redact_text, secret_values


def add_config_args(parser: argparse.ArgumentParser) -> None:
    """A config command's arguments: the YAML file and its ``--set``s."""
    parser.add_argument("config", help="YAML run config, e.g. configs/cartpole.yaml")
    _set(parser, "a config key (dotted for nested: policy_config.checkpoint=X)")


def _set(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help=f"override {what}; repeatable; VALUE is parsed as YAML",
    )


def _switch(parser: argparse.ArgumentParser, flag: str, help: str) -> None:
    parser.add_argument(flag, action="store_true", help=help)


_NO_COMPILE_CACHE = (
    f"do not use the persistent compilation cache (also {CACHE_SWITCH_ENV}=0; its "
    f"directory: ${CACHE_DIR_ENV}, else ~/.cache/jaxmesh/xla)"
)


def _int(parser: argparse.ArgumentParser, flag: str, default: int, help: str) -> None:
    parser.add_argument(flag, type=int, default=default, metavar="N", help=help)


#: ``--set`` item that ``--ray-address`` adds (``workers: {ray: {address:}}``).
RAY_ADDRESS_KEY = "workers.ray.address="


class SetFlag(argparse.Action):
    """``--workers W`` and ``--ray-address A`` as ``--set`` items:
    ``workers=W`` (for ``ray:N`` or ``ray``: ``workers: {ray: {num_workers:
    N}}``), kept before ``workers.ray.address=A``."""

    def __call__(self, parser, namespace, value, option_string=None):
        items = list(getattr(namespace, "set", None) or [])
        if option_string == "--ray-address":
            namespace.set = [*items, RAY_ADDRESS_KEY + json.dumps(value)]
            return
        kind, sep, count = value.strip().partition(":")
        if kind == "ray" and (not sep or count.isdigit()):
            item = f"workers={{ray: {{num_workers: {count}}}}}"
            if not sep:
                item = "workers={ray: null}"
        elif value.strip().isdigit() and not sep:
            item = f"workers={value.strip()}"
        else:
            parser.error(
                f"--workers {value!r}: expected N (worker processes on this "
                "machine, 0: in this process) or ray:N (N Ray actors; ray: one "
                "per CPU of the cluster)"
            )
        address = [i for i in items if i.startswith(RAY_ADDRESS_KEY)]
        items = [i for i in items if not i.startswith(RAY_ADDRESS_KEY)]
        namespace.set = [*items, item, *address]


def add_server_args(
    parser: argparse.ArgumentParser, clients: str, token: str, idle: str
) -> None:
    """A server command's address, ready fd, session token and timeout, TLS."""
    parser.add_argument(
        "--address",
        default="127.0.0.1:0",
        help="HOST:PORT to bind (default 127.0.0.1:0: a free loopback port)",
    )
    parser.add_argument(
        "--ready-fd",
        type=int,
        metavar="FD",
        help="write the address and a newline to this fd once serving, then close it",
    )
    parser.add_argument(
        "--token",
        help=f"{token} (default: $JAXMESH_TOKEN, which is better: a command line "
        "is visible to other users in ps)",
    )
    parser.add_argument(
        "--idle-timeout",
        type=float,
        default=300.0,
        metavar="S",
        help=f"{idle} S seconds (default 300)",
    )
    _switch(
        parser, "--insecure", "allow a non-loopback address with no token and no TLS"
    )
    parser.add_argument(
        "--tls-cert",
        metavar="PEM",
        help=f"serve over TLS with this certificate chain (clients: {clients})",
    )
    parser.add_argument("--tls-key", metavar="PEM", help="the --tls-cert private key")


#: Each command as ``module:name`` (run by ``jaxmesh.cli.<module>.cmd_<name>``):
#: its one-line help and its description.
COMMANDS: dict[str, tuple[str, str | None]] = {
    "eval:eval": (
        "evaluate a policy from a YAML run config",
        "Evaluate a policy from a YAML run config: print the summary and write the "
        "result JSON (the config's output), its episode log and, when asked, the "
        "report and the videos.",
    ),
    "sweep:sweep": (
        "score a policy at every delay x horizon of a grid, in one program",
        "Score a policy from a YAML run config at every (delay, horizon) of a grid "
        "(jaxmesh.sweep), on the same seeds: e.g. --set delay=[0,1,2,4] --set "
        "horizon=[4,8]. Prints the table of success rate and mean return per cell and "
        f"writes the sweep's JSON next to the config's output as NAME{SWEEP_SUFFIX} "
        "(the output itself is left to jaxmesh eval). A policy that returns one "
        "action per call has no horizon or delay to sweep.",
    ),
    "explain:explain": (
        "print what a run config's policy reads and holds per lane",
        "Print jaxmesh.explain(policy, env, num_envs) for a run config: the "
        "observation leaves read, the frame windows and their bytes per lane and for "
        "num_envs lanes. Compiles nothing.",
    ),
    "explain:describe": ("print a model's describe() as JSON", None),
    "results:compare": (
        "compare two eval results on the same seeds, episode by episode",
        "Pair two results written by jaxmesh eval (the same env and seeds; two suite "
        "results: task by task and pooled) episode by episode and print "
        "jaxmesh.compare(A, B): the mean of B - A, its percentile bootstrap interval "
        "(95%%) and the share of seeds where B scores more (ties count half).",
    ),
    "decide:decide": (
        "run two policies on the same seeds until a test says which is better",
        "Run A's and B's policies on A's env, episode i of both with seed first-seed "
        "+ i, in growing batches, until the anytime-valid (betting) confidence "
        "sequence of the mean difference B - A leaves 0 (jaxmesh.decide). B's config "
        "may differ from A's only in policy, policy_config, host and output; the "
        "budget keys are ignored. Exit status: 0 decided, 1 undecided after "
        "--max-episodes, 2 bad input.",
    ),
    "results:report": (
        "write the HTML report of a result eval wrote",
        "Write one self-contained HTML page (summary table, plots, settings, "
        "telemetry, the first 1,000 episodes) of a result written by jaxmesh eval "
        "(its config's output key). Needs matplotlib (pip install 'jaxmesh[report]').",
    ),
    "serve:check-env": (
        "check that an env is reproducible from its seed",
        "Reset the env twice with --seed and once with --other, step each --steps "
        "times with one fixed action, and print jaxmesh.check_seeds's report: whether "
        "the same seed gives the same observations, rewards and ends (reproducible), "
        "and another seed something else (seed-sensitive). Exit status 0 when "
        "reproducible, 1 when not, 2 for bad input.",
    ),
    "serve:serve-env": (
        "serve a gymnasium env over gRPC (jaxmesh.EnvServer)",
        "Serve a gymnasium env's lanes over gRPC until SIGTERM or Ctrl-C. Prints the "
        "address on stdout once serving. Binding a non-loopback address needs --token "
        "(or JAXMESH_TOKEN) or --insecure.",
    ),
    "serve_policy:serve-policy": (
        "serve a policy to simulator or robot clients, batched (jaxmesh.PolicyServer)",
        "Serve a policy until SIGTERM or Ctrl-C, in openpi's websocket protocol "
        "(openpi-client's WebsocketClientPolicy works against it), or with --protocol "
        "grpc in jaxmesh's own (jaxmesh.RemotePolicy): the requests of all clients go "
        "to one queue and run in batches of up to --max-batch. Prints the address on "
        "stdout once serving. Binding a non-loopback address needs --token (or "
        "JAXMESH_TOKEN), TLS or --insecure.",
    ),
}


def make_parser() -> argparse.ArgumentParser:
    """The parser of every command; ``args.run`` names the function to call."""
    parser = argparse.ArgumentParser(
        prog="jaxmesh", description="Evaluate RL policies with jaxmesh."
    )
    parser.add_argument("--version", action="version", version=f"jaxmesh {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    p = {}
    for target, (help, description) in COMMANDS.items():
        module, _, name = target.partition(":")
        keys = {}
        if name in ("eval", "explain"):  # the config keys, after the flags
            keys["epilog"] = keys_help()
            keys["formatter_class"] = argparse.RawDescriptionHelpFormatter
        p[name] = sub.add_parser(name, help=help, description=description, **keys)
        p[name].set_defaults(run=f"{module}:cmd_{name.replace('-', '_')}")
    ev = p["eval"]
    add_config_args(ev)
    _switch(ev, "--no-progress", "no progress bar on stderr")
    ev.add_argument(
        "--workers",
        action=SetFlag,
        metavar="W",
        help="what steps a gymnasium:, libero: or factory env's lanes: N worker "
        "processes here (0: this process), or ray:N for N Ray actors "
        "(--set workers=...; needs pip install 'jaxmesh[ray]')",
    )
    ev.add_argument(
        "--ray-address",
        action=SetFlag,
        metavar="ADDRESS",
        help="the Ray cluster the actors run on (ray.init's address: auto, "
        "host:6379, ray://host:10001); --set workers.ray.address=ADDRESS",
    )
    _switch(ev, "--no-compile-cache", _NO_COMPILE_CACHE)
    _switch(
        ev,
        "--telemetry",
        "after the summary, print per-call timings (predict, env step, encode, "
        "decode, wire, queue; message bytes) of a gymnasium: or grpc:// run: "
        "result.format_telemetry()",
    )
    ev.add_argument(
        "--report",
        nargs="?",
        const=NEXT_TO_OUTPUT,
        metavar="PATH",
        help="after the run, write its HTML report (summary, plots, settings, "
        "telemetry, episodes) to PATH; without PATH, next to the output JSON (.html) "
        "or to report.html. Needs matplotlib (pip install 'jaxmesh[report]')",
    )
    ev.add_argument(
        "--video",
        nargs="?",
        const=NEXT_TO_OUTPUT,
        metavar="PATH",
        help="record episode 0 (or the config's record: episodes) and render "
        "each to a video (jaxmesh.render): PATH (.mp4, .gif), or without PATH "
        "next to the output JSON as NAME.ep<i>.mp4; the report embeds them. "
        "Needs imageio (pip install 'jaxmesh[video]')",
    )
    ev.add_argument(
        "--trace",
        metavar="PATH",
        help="write the run's timeline to PATH as Chrome-trace / Perfetto JSON "
        "(open it at https://ui.perfetto.dev)",
    )
    logs = ev.add_mutually_exclusive_group()
    logs.add_argument(
        "--episode-log",
        metavar="PATH",
        help="stream each finished episode to this JSON-lines file (default: next "
        f"to the output JSON as NAME{EPISODE_LOG_SUFFIX}; none without output); a "
        "new run starts it afresh, --resume appends to it",
    )
    _switch(logs, "--no-episode-log", "write no episode log")
    ev.add_argument(
        "--resume",
        metavar="PATH",
        help="continue an earlier run of this config: PATH is its episode log or "
        "its result JSON; only the episodes it lacks run, and the output holds "
        "the whole budget. A file of another run (policy, params, env, seeds, "
        "settings) is refused (status 2)",
    )
    sw = p["sweep"]
    add_config_args(sw)
    sw.add_argument(
        "--resume",
        metavar="PATH",
        help=f"continue a stopped sweep of this config: PATH is its NAME"
        f"{SWEEP_CELLS_SUFFIX} (each finished cell, written next to the "
        "config's output as it finished); only the other cells run. A sweep of "
        "another config is refused (status 2)",
    )
    ex = p["explain"]
    add_config_args(ex)
    de = p["describe"]
    de.add_argument(
        "target",
        help="module:Class, e.g. jaxmesh.zoo.cartpole:CartPoleMLP, or a run config "
        "(.yaml): its policy, with the inputs' shapes its env gives",
    )
    co = p["compare"]
    co.add_argument("a", metavar="A.json", help="the baseline result")
    co.add_argument("b", metavar="B.json", help="the result compared with it")
    _int(co, "--resamples", 10_000, "bootstrap resamples (default 10000)")
    co.add_argument("--seed", type=int, default=0, help="the bootstrap's seed (0)")
    _switch(
        co,
        "--unpaired",
        "compare the two means without pairing episodes (runs of different envs, "
        "seeds or budgets; each run resampled on its own)",
    )
    dc = p["decide"]
    dc.add_argument("a", metavar="A.yaml", help="run config of policy A (and the env)")
    dc.add_argument("b", metavar="B.yaml", help="run config of policy B")
    _set(dc, "a key of both configs (as eval's --set)")
    dc.add_argument(
        "--alpha", type=float, default=0.05, help="the test's level (default 0.05)"
    )
    _int(dc, "--max-episodes", 10_000, "the most episodes per policy (default 10000)")
    dc.add_argument(
        "--metric",
        choices=("return", "success"),
        default="return",
        help="what is compared: the return (needs --bounds) or the success signal",
    )
    dc.add_argument(
        "--bounds",
        type=float,
        nargs=2,
        metavar=("LO", "HI"),
        help="the smallest and largest return an episode can score (--metric "
        "return), e.g. --bounds 0 500",
    )
    dc.add_argument(
        "--first-seed",
        type=int,
        metavar="S",
        help="the seed of episode 0 (default 0, or the resumed decision's)",
    )
    dc.add_argument(
        "--batch",
        type=int,
        metavar="N",
        help="episodes per policy in the first batch (default: num_envs); "
        "each next one is an eighth of the episodes run so far, in whole "
        "first batches (at most 16 of them)",
    )
    dc.add_argument(
        "--output",
        metavar="PATH",
        help="write the decision (the interval's path and both runs) as JSON",
    )
    dc.add_argument(
        "--plot",
        metavar="PATH",
        help="draw the interval narrowing over the episodes, and where it "
        "stopped, to PATH (.png, .svg, .pdf). Needs matplotlib (pip install "
        "'jaxmesh[report]')",
    )
    dc.add_argument(
        "--report",
        metavar="PATH",
        help="write the decision as one self-contained HTML page to PATH: the "
        "summary, the test and its citation, the interval narrowing over the "
        "episodes and where it stopped (Decision.report). Needs matplotlib "
        "(pip install 'jaxmesh[report]')",
    )
    dc.add_argument(
        "--resume",
        metavar="PATH",
        help="go on from the decision JSON an earlier decide wrote (--output): "
        "its episodes count and do not run again",
    )
    _switch(dc, "--no-progress", "no progress line per batch")
    _switch(dc, "--no-compile-cache", _NO_COMPILE_CACHE)
    rp = p["report"]
    rp.add_argument("results", metavar="RESULTS.json", help="the result of eval")
    rp.add_argument(
        "-o",
        "--output",
        metavar="REPORT.html",
        help="the HTML file to write (default: RESULTS with the suffix .html)",
    )
    ce = p["check-env"]
    ce.add_argument(
        "env",
        help="gymnasium:<id> (made here), grpc://host:port (lane 0 of a server, "
        "which must be free), or a JAX env id (gymnax:, brax:)",
    )
    ce.add_argument("--seed", type=int, default=0, help="the seed reset twice (0)")
    ce.add_argument(
        "--other", type=int, default=1, help="the seed compared with it (1)"
    )
    _int(ce, "--steps", 5, "env steps compared after each reset (default 5)")
    ce.add_argument("--token", help="a served env's session token ($JAXMESH_TOKEN)")
    ce.add_argument(
        "--tls-ca",
        metavar="PEM",
        help="grpcs:// servers: the CA the server's certificate is checked against",
    )
    se = p["serve-env"]
    se.add_argument(
        "env",
        help="gymnasium:<id> or <id>, e.g. gymnasium:CartPole-v1 "
        "(gymnasium:<module>:<id> imports <module> first), or a LIBERO task "
        "libero:<suite>/<i> (options: --env-config)",
    )
    se.add_argument("--lanes", type=int, help="envs to make (lanes; default 1)")
    add_server_args(
        se,
        "grpcs://",
        "session token every call must carry",
        "end a session without a request for",
    )
    _switch(se, "--allow-remote-shutdown", "let the Shutdown RPC stop the server")
    se.add_argument(
        "--workers",
        type=int,
        metavar="W",
        help="worker processes stepping groups of a gymnasium:<id> env's lanes "
        "(threads for envs built by a factory; default 1)",
    )
    se.add_argument(
        "--env-config",
        metavar="JSON",
        help="libero:<suite>/<i> envs: their options as a JSON object, e.g. "
        "'{\"camera_size\": 128}' (jaxmesh.make_env(env, **options))",
    )
    sp = p["serve-policy"]
    sp.add_argument(
        "policy",
        help="a run config (its policy and policy_config), or module:attr (a "
        "jaxmesh.Model class or instance, or a policy function)",
    )
    add_server_args(
        sp,
        "wss://",
        "the key clients send as 'Authorization: Api-Key <token>'",
        "grpc: end a session whose client sends nothing for",
    )
    sp.add_argument(
        "--protocol",
        default="openpi",
        choices=("openpi", "grpc"),
        help="the wire protocol: openpi (default; openpi-client's websocket "
        "protocol) or grpc (jaxmesh's own, for jaxmesh.RemotePolicy in "
        "jaxmesh.evaluate, with per-episode state kept on the server)",
    )
    _int(sp, "--max-batch", 16, "the most requests one forward takes (default 16)")
    sp.add_argument(
        "--max-wait-ms",
        type=float,
        default=5.0,
        metavar="MS",
        help="how long a forward waits for more requests (default 5; never "
        "when every connected client has asked)",
    )
    _int(
        sp,
        "--max-lanes",
        4096,
        "grpc: the most lanes (num_envs) one session may open (default 4096)",
    )
    sp.add_argument(
        "--input",
        action="append",
        metavar="KEY=DTYPE[SHAPE]",
        help="openpi: an observation key a request holds, its dtype and shape "
        "(e.g. observation/state=float32[8], observation/image=uint8[224,224,3]; "
        "once per key the policy reads). Other shapes and dtypes are refused "
        "naming the key; the forward compiles for it at start. Default: from a "
        "run config's env, else any layout the model runs",
    )
    return parser


def resume_command(args: argparse.Namespace, config: dict, path: Any) -> str:
    """The command line that continues this run from ``path`` (secrets out)."""
    parts = ["jaxmesh", args.command, args.config]
    for item in args.set:
        parts += ["--set", item]
    if getattr(args, "episode_log", None) is not None:
        parts += ["--episode-log", str(args.episode_log)]
    parts += ["--resume", str(path)]
    return redact_text(shlex.join(parts), secret_values(config))
