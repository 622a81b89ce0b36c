"""``baton reproduce <paper>``: a paper's headline figures, claim against Baton.

Each ``reproductions/<paper>/*.yaml`` is one figure: the paper's regime as an experiment
(``experiment``: cluster, workload, slo, view, ...), the two policies it compares
(``policy`` against ``baseline``), the metric, and the claimed relative change
(``claim``, a fraction: -0.34 is "34% lower"; a 1.93x goodput is 0.93). Baton runs both
policies on the same K workloads (seeds, or disjoint windows of ``--trace``) and reports
the relative change with a 95% interval taken on the log ratio over the repeats, and one
verdict per claim (``experiments/verdicts.py``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from baton.core.errors import ConfigError, WorkloadError
from baton.experiments.config import Experiment, WorkloadConfig, experiment_from_dict, resolve_trace
from baton.experiments.repeats import repeat_workloads
from baton.experiments.run import run_experiment
from baton.experiments.matching import Calibration, Match, calibrate, parse_match, with_knob
from baton.experiments.verdicts import INCONCLUSIVE, Verdict, judge, log_ratios
from baton.workload.sources import in_folder, missing_trace
from baton.yamlfile import read_yaml

ROOT = Path(__file__).resolve().parents[3] / "reproductions"
PAPERS = ("sibyl", "ares", "arrow", "kairos", "cascade")
_KEYS = {"figure", "source", "experiment", "policy", "baseline", "metric", "claim", "full", "repeats",
         "notes", "rates", "match", "max_repeats"}
SUSTAINABLE = "max_sustainable_rate_rps"  # a metric from a rate sweep (needs ``rates``)
MAX_REPEATS = 10  # an inconclusive claim's second look: at most this many repeats in all


@dataclass(slots=True)
class Claim:
    """One headline figure of a paper and the setup that reproduces it."""

    name: str
    figure: str
    source: str
    experiment: Experiment
    policy: str
    baseline: str
    metric: str
    claim: float
    full: bool = False
    repeats: int = 3
    rates: tuple[float, ...] = ()
    match: Match | None = None  # the paper's baseline figure to match first (experiments/matching.py)
    notes: str = ""  # the mechanism behind Baton's verdict, shown in the report
    max_repeats: int = MAX_REPEATS  # an inconclusive first look may grow to this many (one more look)


def load_claim(path: Path) -> Claim:
    """Read one reproduction YAML; errors name the file and key."""
    data = read_yaml(path)
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping")
    unknown = sorted(set(data) - _KEYS)
    if unknown:
        raise ConfigError(f"{path}: {unknown[0]}: unknown key; expected {', '.join(sorted(_KEYS))}")
    for key in ("figure", "experiment", "policy", "baseline", "metric", "claim"):
        if key not in data:
            raise ConfigError(f"{path}: missing key {key!r}")
    if not isinstance(data["claim"], (int, float)) or isinstance(data["claim"], bool):
        raise ConfigError(f"{path}: claim: expected a number (a relative change), got {data['claim']!r}")
    try:
        exp = experiment_from_dict(data["experiment"])
    except ConfigError as err:
        raise ConfigError(f"{path}: experiment.{err}") from None
    exp.workload.trace = resolve_trace(exp.workload.trace, path.parent)
    rates = data.get("rates", [])
    if not isinstance(rates, list) or not all(isinstance(r, (int, float)) and r > 0 for r in rates):
        raise ConfigError(f"{path}: rates: expected a list of positive request rates, got {rates!r}")
    if (data["metric"] == SUSTAINABLE) != bool(rates):
        raise ConfigError(f"{path}: rates: give rates exactly when the metric is {SUSTAINABLE}")
    return Claim(path.stem, str(data["figure"]), str(data.get("source", "")), exp, str(data["policy"]),
                 str(data["baseline"]), str(data["metric"]), float(data["claim"]),
                 bool(data.get("full", False)), int(data.get("repeats", 3)), tuple(sorted(map(float, rates))),
                 parse_match(data.get("match"), str(path)), " ".join(str(data.get("notes", "")).split()),
                 _max_repeats(data, path))


def _max_repeats(data: dict, path: Path) -> int:
    value = data.get("max_repeats", MAX_REPEATS)
    if not isinstance(value, int) or isinstance(value, bool) or value < int(data.get("repeats", 3)):
        raise ConfigError(f"{path}: max_repeats: expected an integer >= repeats, got {value!r}")
    return value


def claims_of(paper: str, root: Path = ROOT, full: bool = False) -> list[Claim]:
    """The paper's figures (``all``: every paper's, named ``paper/figure``); those marked
    ``full`` (128/256 instances) only with ``full``."""
    if paper == "all":
        return [replace(c, name=f"{p}/{c.name}") for p in PAPERS if (root / p).is_dir()
                for c in claims_of(p, root, full)]
    folder = root / paper
    if paper not in PAPERS:
        raise ConfigError(f"reproduce: unknown paper {paper!r}; known: {', '.join(PAPERS)} or all")
    files = sorted(folder.glob("*.yaml")) if folder.is_dir() else []
    if not files:
        raise ConfigError(f"reproduce: no reproductions for {paper!r} yet (expected {folder}/*.yaml)")
    return [c for c in map(load_claim, files) if full or not c.full]


@dataclass(slots=True)
class Outcome:
    """Baton's answer to one claim: the mean relative change and its 95% interval."""

    claim: Claim
    policy_mean: float
    baseline_mean: float
    dropped: int = 0  # repeats without a value (e.g. no rate sustained at the target attainment)
    ratios: list[float] = field(default_factory=list)  # ln(policy / baseline) per repeat
    capped: int = 0  # repeats where a policy passed every rate tried (its rate: a lower bound)
    calibration: Calibration | None = None  # set when the run matched the paper's baseline figure
    first_look: int | None = None  # repeats of an inconclusive first look that was extended
    _judged: Verdict | None = None

    @property
    def judged(self) -> Verdict:
        """The verdict, judged once (its interval needs scipy's t quantile)."""
        if self._judged is None:
            self._judged = judge(self.ratios, self.claim.claim)
        return self._judged

    @property
    def baton(self) -> float:
        """The relative change: exp(mean log ratio) - 1."""
        return self.judged.change

    @property
    def ci95(self) -> tuple[float, float]:
        """95% interval of the relative change (from the log ratios: never below -100%)."""
        return self.judged.ci95

    @property
    def verdict(self) -> str:
        return self.judged.verdict

    def json(self) -> dict[str, Any]:
        v = self.judged
        fin = lambda x: None if math.isnan(x) else x  # noqa: E731
        out = {"claim": self.claim.claim, "baton": fin(v.change), "ci95": [fin(v.ci95[0]), fin(v.ci95[1])],
               "verdict": v.verdict, "repeats_to_decide": v.repeats_to_decide,
               "metric": f"{self.claim.metric}: {self.claim.policy} vs {self.claim.baseline}",
               "figure": self.claim.figure, "repeats": len(self.ratios), "dropped_repeats": self.dropped,
               "capped_repeats": self.capped,
               "first_look_repeats": self.first_look, "mechanism": self.claim.notes}
        if self.calibration is not None:
            c, m = self.calibration, self.claim.match
            out["matched"] = {"knob": c.knob, "value": c.value, "metric": m.metric if m else None,
                              "baseline_figure": fin(c.figure), "paper_figure": m.target if m else None,
                              "tried": [[v, fin(f)] for v, f in c.tried]}
        return out


def with_traces(claims: list[Claim], folder: str | None) -> list[Claim]:
    """The claims with their trace files looked up in ``folder`` (``--traces DIR``): by the
    file's name there, or a public trace's upstream name."""
    if folder is None:
        return claims
    if not Path(folder).expanduser().is_dir():
        raise ConfigError(f"--traces: {folder}: no such folder")
    out = []
    for c in claims:
        w = c.experiment.workload
        moved = replace(w, trace=in_folder(w.trace, folder)) if w.trace else w
        out.append(replace(c, experiment=replace(c.experiment, workload=moved)))
    return out


def check_traces(claims: list[Claim], trace: str | None = None) -> None:
    """Every trace the claims read is there, before any of them runs: one error naming each
    missing file and where to download it."""
    paths = [trace] if trace else [c.experiment.workload.trace for c in claims if c.experiment.workload.trace]
    missing = sorted({p for p in paths if not Path(p).is_file()})
    if missing:
        raise WorkloadError("; ".join(missing_trace(Path(p)) for p in missing))


def run_claim(claim: Claim, repeats: int | None = None, trace: str | None = None,
              progress: Callable[[str], None] | None = None, cache: dict | None = None,
              matched: bool = False, max_repeats: int | None = None) -> Outcome:
    """Both policies on the same K workloads; relative change of the metric per repeat.
    ``cache`` keeps summaries across claims that share a setup (a figure pair against two
    baselines runs the common policy once). ``matched``: first set the claim's ``match``
    knob where the paper's baseline figure is matched, and compare there."""
    cache = {} if cache is None else cache
    exp = claim.experiment
    if trace is not None:
        exp = replace(exp, workload=WorkloadConfig(trace=trace, requests=exp.workload.synthetic.requests,
                                                   rate_rps=exp.workload.synthetic.rate_rps))
    calibration = None
    if matched and claim.match is not None:
        calibration = _calibrated(claim, exp, cache, progress)
        exp = with_knob(exp, claim.match.knob, calibration.value)
    k = repeats or claim.repeats
    outcome = _compare(claim, exp, k, progress, cache)
    more = _second_look(outcome, k, max_repeats if max_repeats is not None else claim.max_repeats, exp)
    if more > k:
        if progress:
            progress(f"{claim.name}: inconclusive at {k} repeats; {more} in all")
        outcome = _compare(claim, exp, more, progress, cache)
        outcome.first_look = k
    outcome.calibration = calibration
    return outcome


def _second_look(outcome: Outcome, k: int, cap: int, exp: Experiment) -> int:
    """How many repeats an inconclusive first look grows to: those its interval says would
    decide, at most ``cap`` and the trace's disjoint windows; ``k`` (none) otherwise. One
    more look only, so the verdicts stay a two-stage design, not testing until significant."""
    v = outcome.judged
    if v.verdict != INCONCLUSIVE or v.repeats_to_decide is None:
        return k
    w = exp.workload
    if w.trace and w.requests:
        cap = min(cap, len(w.whole_trace(exp.seed)) // w.requests)
    return max(k, min(cap, v.repeats_to_decide))


def _calibrated(claim: Claim, exp: Experiment, cache: dict, progress: Callable[[str], None] | None) -> Calibration:
    """The claim's match, found once per regime (claims sharing one reuse it)."""
    assert claim.match is not None
    key = ("match", repr(exp), repr(claim.match), claim.match.policy or claim.baseline)
    if key not in cache:
        seed, requests = repeat_workloads(exp, 1)[0]

        def measure(e: Experiment, policy: str) -> dict[str, float]:
            if progress:
                progress(f"{claim.name}: matching {claim.match.knob} = {_knob_value(e, claim.match.knob)} ({policy})")
            reqs = requests if claim.match.knob != "rate_rps" else repeat_workloads(e, 1)[0][1]
            return run_experiment(replace(e, policy=policy, seed=seed), requests=reqs, name=policy)[1].summary
        cache[key] = calibrate(claim.match, exp, claim.baseline, measure)
    return cache[key]


def _knob_value(exp: Experiment, knob: str) -> Any:
    if knob == "rate_rps":
        return exp.workload.rate_rps or exp.workload.synthetic.rate_rps
    return getattr(exp.cluster.engine, knob)


def _compare(claim: Claim, exp: Experiment, k: int, progress: Callable[[str], None] | None,
             cache: dict) -> Outcome:
    pol, base, capped = [], [], 0
    for i, (seed, requests) in enumerate(repeat_workloads(exp, k)):
        values, capped_here = {}, False
        for name in (claim.baseline, claim.policy):
            key = (repr(replace(exp, policy=name, seed=seed)), i)  # repeat i is the same whatever k
            if key not in cache:
                if progress:
                    progress(f"{claim.name}: {name} ({i + 1}/{k})")
                cache[key] = _measure(replace(exp, policy=name, seed=seed), requests, name, claim)
            values[name] = float(cache[key].get(claim.metric, math.nan))
            capped_here |= bool(cache[key].get("capped"))
        capped += capped_here
        base.append(values[claim.baseline])
        pol.append(values[claim.policy])
    ratios = log_ratios(pol, base)
    return Outcome(claim, float(np.nanmean(pol)), float(np.nanmean(base)), k - len(ratios), ratios, capped=capped)


def _measure(exp: Experiment, requests: list, name: str, claim: Claim) -> dict[str, float]:
    """One policy's summary on one workload; for a sustainable-rate claim, the rate sweep's
    result (the workload's arrivals rescaled to each of ``claim.rates``, each on a steady
    window: a synthetic workload draws more requests for it, a trace window gives what it
    holds): NaN when the knee rests on a rate without a steady window (a burst)."""
    if claim.metric != SUSTAINABLE:
        return run_experiment(exp, requests=requests, name=name)[1].summary
    from baton.experiments.steady import CAPPED, KNEE, steady_point, sustained
    from baton.workload import scale_to_rate

    def run(rate: float, n: int) -> dict[str, float]:
        window = requests[:n] if n <= len(requests) or not exp.workload.drawn else \
            replace(exp.workload, requests=n).load(exp.seed)  # a synthetic source draws more; a trace's
        # window is what it holds (loading n of the trace would be its start, the same for every repeat)
        return run_experiment(exp, requests=scale_to_rate(window, rate), name=name)[1].summary
    points = [steady_point(lambda n, r=rate: run(r, n), rate, len(requests)) for rate in claim.rates]
    knee = sustained(claim.rates, points, 0.9)  # a knee resting on a burst (no steady window) is no knee
    return {SUSTAINABLE: knee.rate_rps if knee.status in (KNEE, CAPPED) and knee.rate_rps is not None else math.nan,
            "capped": float(knee.status == CAPPED)}
