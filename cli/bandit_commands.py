"""`adc bandit status | evaluate | reset`: the decider's learned placement policy (operators; a
reset is for admins). `evaluate` estimates, from the logged propensities, the value of the learned
policy against the rules' (IPS and doubly robust, 95 % intervals), before anyone switches
`bandit.mode` to active; it runs here, on the log and the model the api hands out."""

from __future__ import annotations

import argparse
import base64

from cli.client import ApiClient
from cli.job_commands import show

STATUS_FIELDS = [
    ("mode", "mode"),
    ("model version", "model_version"),
    ("decisions", "decisions"),
    ("acted on", "acted"),
    ("explored", "explored"),
    ("explored in the last hour", "explored_last_hour"),
    ("exploration budget per hour", "explore_per_hour"),
    ("agreed with the rules", "agreed"),
    ("rewarded", "rewarded"),
    ("mean reward", "mean_reward"),
    ("rules' baseline (mean reward of the rules' own arm)", "rules_mean_reward"),
    ("written by", "writer"),
    ("written at", "updated_at"),
    ("reset asked for", "reset_requested_at"),
]


POINT_COLUMNS = [
    ("decisions", "decisions"),
    ("acted", "acted"),
    ("explored", "explored"),
    ("rewarded", "rewarded"),
    ("mean reward", "mean_reward"),
    ("rules' baseline", "rules_mean_reward"),
]


def _points_text(points: dict) -> list[str]:
    """One line per decision point (placement, memory pressure, queue knobs)."""
    widths = [max(len(label), 9) for label, _ in POINT_COLUMNS]
    lines = ["", f"{'point':<10}" + "".join(f"  {label:>{w}}" for (label, _), w in zip(POINT_COLUMNS, widths))]
    for name, p in points.items():
        cells = []
        for (_, key), w in zip(POINT_COLUMNS, widths):
            value = p.get(key) if p.get("stored") else None
            cells.append(f"  {'-' if value is None else f'{value:.4f}' if isinstance(value, float) else value:>{w}}")
        lines.append(f"{name:<10}" + "".join(cells))
    return lines


def _status_text(s: dict) -> str:
    if not s.get("stored"):
        return "bandit: no model stored yet (bandit.mode is off, or the decider has not written one)"
    width = max(len(label) for label, _ in STATUS_FIELDS)
    lines = []
    for label, key in STATUS_FIELDS:
        value = s.get(key)
        if isinstance(value, float):
            value = f"{value:.4f}"
        lines.append(f"{label:<{width}}  {'-' if value is None else value}")
    return "\n".join(lines + _points_text(s.get("points") or {}))


def cmd_status(args: argparse.Namespace) -> int:
    show(ApiClient.from_env().call("GET", "/v1/bandit"), args, _status_text)
    return 0


def _estimate(e: dict) -> str:
    if e["value"] is None:
        return "-"
    return f"{e['value']:.4f}  [{e['low']:.4f}, {e['high']:.4f}]"


def cmd_evaluate(args: argparse.Namespace) -> int:
    from services.decider.bandit.evaluation import evaluate
    from services.decider.bandit.learner import Learner
    from shared.contracts.strategies import BanditConfig

    log = ApiClient.from_env().call("GET", "/v1/bandit/log", params={"limit": args.limit, "point": args.point})
    if not log.get("model"):
        raise SystemExit("adc bandit evaluate: no model stored yet; run the bandit in shadow mode first")
    epsilon = args.epsilon if args.epsilon is not None else (log.get("epsilon") or 0.1)
    learner = Learner(epsilon, model=base64.b64decode(log["model"]), version=log.get("model_version") or 0)
    # The policy that would act: the stored confidence rule unless asked for another (defaults if none stored).
    defaults = BanditConfig()
    margin = next(v for v in (args.margin, log.get("act_margin"), defaults.act_margin) if v is not None)
    after = next(v for v in (args.after, log.get("act_after"), defaults.act_after) if v is not None)
    result = evaluate(log["items"], learner, point=args.point, margin=margin, after=after)
    result |= {"model_version": learner.version, "logged": len(log["items"]), "point": args.point}

    def text(r: dict) -> str:
        return "\n".join(
            [
                f"{r['decisions']} rewarded decisions of {r['logged']} logged, {r['supported']} with support;"
                f" model version {r['model_version']}, played with act_margin {r['act_margin']},"
                f" act_after {r['act_after']}",
                f"logged mean reward      {r['logged_mean_reward'] if r['decisions'] else '-'}",
                f"bandit IPS              {_estimate(r['bandit_ips'])}",
                f"bandit doubly robust    {_estimate(r['bandit_dr'])}",
                f"rules IPS               {_estimate(r['rules_ips'])}",
                f"rules doubly robust     {_estimate(r['rules_dr'])}",
                "(value: mean reward per decision, log steps per GPU-second; [95 % interval]. A decision has"
                " support when its logging policy gave every other arm a chance (shadow_explore with the budget"
                " left); with little support, IPS says little and the doubly robust estimate rests on its model.)",
            ]
        )

    show(result, args, text)
    return 0


def cmd_reset(args: argparse.Namespace) -> int:
    body = {"reason": args.reason} if args.reason else None
    state = ApiClient.from_env().call("POST", "/v1/bandit/reset", json=body)
    show(
        state,
        args,
        lambda s: (
            f"reset of model version {s['model_version']} asked for; the leading decider "
            "carries it out at its next write (audited as bandit.reset)"
        ),
    )
    return 0


def register(sub, with_output) -> None:
    p = sub.add_parser("bandit", help="the decider's learned placement policy: status, evaluate, reset")
    verbs = p.add_subparsers(dest="verb", required=True)
    status = with_output(verbs.add_parser("status", help="mode, decisions, mean reward vs the rules', exploration"))
    status.set_defaults(func=cmd_status)
    ev = with_output(
        verbs.add_parser("evaluate", help="off-policy estimate (IPS, doubly robust) of the learned policy vs the rules")
    )
    ev.add_argument("--limit", type=int, default=5000, help="the newest this many logged decisions (default 5000)")
    ev.add_argument(
        "--epsilon", type=float, default=None, help="exploration rate to evaluate (default: the stored one)"
    )
    ev.add_argument(
        "--margin", type=float, default=None, help="act_margin to evaluate the policy with (default: the stored one)"
    )
    ev.add_argument(
        "--after", type=int, default=None, help="act_after to evaluate the policy with (default: the stored one)"
    )
    ev.add_argument("--point", choices=("placement", "memory", "knobs"), default="placement", help="the decision point")
    ev.set_defaults(func=cmd_evaluate)
    reset = with_output(verbs.add_parser("reset", help="forget what the bandit learned (admins; audited)"))
    reset.add_argument("--reason", help="why, for the audit log")
    reset.set_defaults(func=cmd_reset)
