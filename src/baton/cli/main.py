"""The ``baton`` command."""

from __future__ import annotations

import argparse
import errno
import os
import sys

from baton import __version__
from baton.cli import commands
from baton.cli.listing import cmd_list
from baton.cli.args import add_common, check_common
import baton.core.settings as settings
from baton.core.errors import BatonError
from baton.emulator.run import add_emulate_args
from baton.workload import FORMATS


def _policy_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--policies", help="comma-separated policy names, e.g. round-robin,least-loaded")
    p.add_argument("--configs", nargs="+", metavar="YAML",
                   help="named policy configs (each file's `policy`; its stem names the row); cluster, "
                        "workload, SLO and seed come from --config and flags so every run sees the same input")


GLOSSARY = """columns: done/rej = requests finished/rejected (rejected_<reason> in --json);
TTFT = time to first token; TPOT = time per output token after the first; TBT = time
between tokens; goodput = requests per second meeting both SLOs; SLO % = share of the
steady window's requests meeting both; preempt = KV preemptions (recomputed); migr =
migrations; load CV = mean coefficient of variation of decode instances' token load;
OAR = optimal-assignment ratio at decode start (oar_tokens, oar_count); (+x%) = change
against the first row, ~ = its 95% interval over repeats includes 0. In the records CSV,
path = the instances a request visited, by name (prefill-0>decode-1[>migration targets])."""


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Defaults shown, except where the help says its own or there is none (None: the
    config's value, or one computed)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None or "(default" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)


def _gateway_flags(p: argparse.ArgumentParser, names: tuple[str, ...], command: str | None) -> None:
    """The gateway's settings as flags of its commands, added only when one of them (or the
    whole parser) is built: the gateway's modules stay out of the other commands' start-up."""
    if command is None or p.prog.endswith(f" {command}"):
        from baton.gateway.config import GatewayConfig
        settings.add_flags(p, GatewayConfig, names, " (overrides the config)")


def parser(command: str | None = None) -> argparse.ArgumentParser:
    """The ``baton`` parser; with ``command``, only that subcommand's flags that need its
    runtime's modules are added (the others' are not parsed)."""
    top = argparse.ArgumentParser(prog="baton", description="Scheduling for PD-disaggregated LLM serving",
                                  formatter_class=HelpFormatter)
    top.add_argument("--version", action="version", version=f"baton {__version__}")
    sub = top.add_subparsers(dest="command", required=True)
    lst = sub.add_parser("list", help="the names Baton knows, one per line (policies with what each does)")
    lst.add_argument("what", choices=["policies", "presets", "gpus", "stages", "formats"])
    sim = sub.add_parser("simulate", help="one policy on one workload and cluster")
    add_common(sim)
    sim.add_argument("--policy", help="policy name (e.g. least-loaded); or `policy:` in --config")
    sim.add_argument("--reference", action="store_true", help="per-iteration reference mode")
    cmp_ = sub.add_parser("compare", help="several policies on the same workload, cluster and seed")
    add_common(cmp_)
    _policy_flags(cmp_)
    cmp_.add_argument("--reference", action="store_true", help="per-iteration reference mode")
    cmp_.add_argument("--repeats", "--windows", dest="repeats", type=int, default=1,
                      help="K repeats: K seeds of a synthetic workload, or K consecutive disjoint "
                           "windows of --requests requests of a trace; reports means and paired 95%% "
                           "intervals against the first policy (default 1)")
    cmp_.add_argument("--record", metavar="NAME", help="write the summaries into the repository's results/NAME.json "
                                                      "(with the command, commit and machine) for the docs to quote")
    sweep = sub.add_parser("sweep", help="SLO attainment and latency against request rate")
    add_common(sweep, rate_list=True)
    _policy_flags(sweep)
    sweep.add_argument("--target", type=float, default=0.9, help="SLO attainment target (default 0.9)")
    sweep.add_argument("--workers", type=int, help="local worker processes (default: one per core)")
    sweep.add_argument("--ray", action="store_true", help="run points on Ray (local, or --ray-address)")
    sweep.add_argument("--ray-address", help="address of a running Ray cluster (default: start a local one)")
    sweep.add_argument("--record", metavar="NAME", help="write the sweep into the repository's results/NAME.json "
                                                       "(with the command, commit and machine) for the docs to quote")
    demo = sub.add_parser("demo", help="built-in bursty heavy-tailed workload, every baseline, HTML report")
    add_common(demo)
    demo.add_argument("--reference", action="store_true", help="per-iteration reference mode")
    demo.add_argument("--record", action="store_true", help="write the figures into the repository's results/ (with the command, commit and machine) for the docs to quote")
    cal = sub.add_parser("calibrate", help="calibration error of the survival estimator (SIBYL Fig. 7)")
    add_common(cal)
    cal.add_argument("--delta-tokens", type=int, default=64, help="survival bucket step Δ (tokens)")
    cal.add_argument("--alpha", type=float, default=0.995, help="EMA smoothing α")
    cal.add_argument("--train-fraction", type=float, default=0.5, help="share of requests learned from")
    wl = sub.add_parser("workload", help="workload tools")
    wl_sub = wl.add_subparsers(dest="workload_command", required=True)
    stats = wl_sub.add_parser("stats", help="length and arrival statistics of a trace, with histograms")
    stats.add_argument("file", help="trace file")
    stats.add_argument("--format", choices=sorted(FORMATS), help="trace format (default: detect)")
    stats.add_argument("--arrivals", metavar="poisson:R|uniform:R", help="arrival times for a trace without them")
    stats.add_argument("--columns", metavar="time=COL,prompt=COL,output=COL",
                       help="read any CSV or JSONL trace through these column names")
    stats.add_argument("--time-unit", choices=["s", "ms"], default="s", help="unit of the --columns time column")
    stats.add_argument("--tokenizer", metavar="PATH", help="a local tokenizer.json (or its folder) for text traces")
    stats.add_argument("--cache-tokens", type=int, default=500_000,
                       help="prefix reuse with a cache of this many tokens (LRU) besides an unbounded one")
    stats.add_argument("--out", default="baton-out", help="output directory for the figure")
    stats.add_argument("--json", action="store_true", help="print the statistics as one JSON object")
    rep = sub.add_parser("reproduce", help="a paper's headline figures: its claims against Baton, with 95%% intervals")
    rep.add_argument("paper", help="sibyl, ares, arrow, kairos, cascade (a folder of reproductions/) or all")
    rep.add_argument("--full", action="store_true", help="also the 128/256-instance figures (long)")
    rep.add_argument("--repeats", type=int, help="repeats per figure (default: each figure's own, 3)")
    rep.add_argument("--max-repeats", type=int, help="an inconclusive figure's second look runs the repeats its "
                     "interval says would decide, at most this many in all (default: each figure's own, 10; "
                     "the first look's count: no second look)")
    rep.add_argument("--trace", help="the same claims on another trace of the same shape (disjoint windows)")
    rep.add_argument("--traces", metavar="DIR", help="the folder holding the public traces the claims read "
                     "(under Baton's file names or the upstream ones; default: the YAMLs' own paths)")
    rep.add_argument("--dir", help="folder of reproduction YAMLs (default: the repository's reproductions/)")
    rep.add_argument("--out", default="baton-out", help="output directory (default: baton-out)")
    rep.add_argument("--json", action="store_true", help="print one JSON object: per figure claim, baton, ci95, metric")
    rep.add_argument("--quiet", action="store_true", help="no progress")
    rep.add_argument("--record", action="store_true", help="write the figures into the repository's results/ (with the command, commit and machine) for the docs to quote")
    srv = sub.add_parser("serve", help="run the live gateway in front of vLLM/SGLang engines or emulators")
    srv.add_argument("--config", required=True, help="gateway YAML (engines, roles, policy)")
    _gateway_flags(srv, ("host", "port", "policy", "workers"), command)
    epp = sub.add_parser("epp", help="run Baton's policies as a Gateway API Inference Extension endpoint "
                                     "picker (Envoy ext_proc) for Envoy, llm-d or any GIE data plane")
    epp.add_argument("--config", required=True, help="the same YAML as baton serve (engines, policy)")
    _gateway_flags(epp, ("host", "port", "epp_port", "policy"), command)
    epp.add_argument("--envoy-config", metavar="FILE", help="write an Envoy bootstrap for this picker to FILE "
                                                            "and exit (listener: --envoy-port)")
    epp.add_argument("--envoy-port", type=int, default=8080, help="the Envoy listener --envoy-config writes")
    epp.add_argument("--fail-open", action="store_true", help="--envoy-config: with the picker down, Envoy "
                                                               "routes round-robin instead of answering 503")
    side = sub.add_parser("sidecar", help="run beside one decode engine: PD through an endpoint picker "
                                          "(prefill leg to the engine the picker names, then decode here)")
    side.add_argument("--config", required=True, help="the picker's YAML (its engines are the allowlist)")
    side.add_argument("--engine", required=True, help="the name (in the config) of the engine this sidecar serves; "
                      "with discovery, the pod's name (its prefill peers then come from the pool's pods)")
    side.add_argument("--engine-url", help="with discovery: the engine beside it (default "
                      "http://127.0.0.1:<discovery port>)")
    side.add_argument("--host", default="127.0.0.1", help="listen address")
    side.add_argument("--port", type=int, required=True, help="listen port (the engine's sidecar URL in the config)")
    prof = sub.add_parser("profile", help="measure a running engine's iterations into a profile CSV "
                                          "(use the CSV as --preset)")
    prof.add_argument("--kind", choices=["engine", "qoe"], default="engine",
                      help="engine: measure a live engine's iterations; qoe: CascadeInfer's QoE model, "
                           "profiled on the simulator's perf model (--preset)")
    prof.add_argument("--engine", metavar="URL", help="engine base URL, e.g. http://127.0.0.1:8000 (--kind engine)")
    prof.add_argument("--preset", default="llama-3.2-3b@h100", help="perf preset or profile CSV (--kind qoe)")
    prof.add_argument("--model", help="served model name (default: the engine's first)")
    prof.add_argument("--out", default="baton-out/profile.csv", help="profile CSV (a .json beside it "
                                                                   "holds the engine's KV facts)")
    prof.add_argument("--max-num-batched-tokens", type=int, default=2048,
                      help="the engine's token budget per iteration (longer prompts are not measured)")
    prof.add_argument("--max-num-seqs", type=int, default=256, help="the engine's batch cap")
    prof.add_argument("--quick", action="store_true", help="a small grid (a smoke run)")
    prof.add_argument("--seed", type=int, default=0, help="seed of the random prompts")
    cfg = sub.add_parser("config", help="settings tools")
    cfg_sub = cfg.add_subparsers(dest="config_command", required=True)
    sch = cfg_sub.add_parser("schema", help="print the JSON Schema of a config file (editors, Helm values, CI)")
    sch.add_argument("what", choices=["gateway", "experiment", "policy"], help="which file or key")
    sch.add_argument("name", nargs="?", help="policy: a named policy (default: the policy key's whole schema)")
    emu = sub.add_parser("emulate", help="run an engine emulator (an HTTP server that behaves like vLLM)")
    add_emulate_args(emu)
    for name, p in sub.choices.items():
        if name in ("simulate", "compare", "demo", "sweep"):
            p.epilog = GLOSSARY
    _show_defaults(top)
    return top


def _show_defaults(p: argparse.ArgumentParser) -> None:
    """Every parser's --help shows its defaults, nested subcommands' too (``baton workload stats``)."""
    p.formatter_class = HelpFormatter
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                _show_defaults(sub)


def _cmd_config(args: argparse.Namespace) -> None:
    from baton.cli.schema import cmd_config  # imports every runtime's config types
    if args.name is not None and args.what != "policy":
        raise BatonError(f"config schema {args.what}: takes no name")
    cmd_config(args)


COMMANDS = {"simulate": commands.cmd_simulate, "compare": commands.cmd_compare, "list": cmd_list,
            "reproduce": commands.cmd_reproduce,
            "sweep": commands.cmd_sweep, "demo": commands.cmd_demo,
            "workload": commands.cmd_workload_stats, "calibrate": commands.cmd_calibrate,
            "emulate": commands.cmd_emulate, "profile": commands.cmd_profile, "serve": commands.cmd_serve,
            "epp": commands.cmd_epp, "sidecar": commands.cmd_sidecar, "config": _cmd_config}



def main(argv: list[str] | None = None) -> int:
    given = sys.argv[1:] if argv is None else argv
    args = parser(next((a for a in given if not a.startswith("-")), None)).parse_args(argv)
    try:
        if args.command == "sweep" and args.workers is not None and args.workers <= 0:
            raise BatonError(f"--workers: expected a positive integer, got {args.workers}")
        if getattr(args, "target", None) is not None and not 0 < args.target <= 1:
            raise BatonError(f"--target: expected a fraction in (0, 1], got {args.target}")
        check_common(args)
        COMMANDS[args.command](args)
    except BatonError as exc:
        print(f"baton: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # the reader went away (`baton config schema gateway | head`)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except OSError as exc:
        if exc.errno != errno.EADDRINUSE:
            raise
        print(f"baton: error: the port is busy: {exc.strerror} (choose another with --port)", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("baton: interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
