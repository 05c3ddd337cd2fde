"""`adc nodes | cordon | uncordon | drain | controller | policies | quota(s) | token | whoami`:
what SREs and admins do with the cluster and its rules."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
from pathlib import Path

import yaml

from cli.client import ApiClient, saved_credentials
from cli.job_commands import show
from cli.render import fields, table


def cmd_nodes(args: argparse.Namespace) -> int:
    cols = [
        ("node", lambda n: n["id"]),
        ("status", lambda n: n["status"]),
        ("devices", lambda n: len(n["devices"])),
        ("free", lambda n: n["free"]),
        ("kind", lambda n: ",".join(sorted({d["kind"] for d in n["devices"]}))),
        ("jobs", lambda n: ",".join(sorted({d["job_id"] for d in n["devices"] if d.get("job_id")})) or None),
        ("heartbeat age s", lambda n: n["last_heartbeat_age_s"]),
    ]
    show(ApiClient.from_env().nodes(), args, lambda d: table(d["items"], cols))
    return 0


def cmd_node_action(args: argparse.Namespace) -> int:
    result = ApiClient.from_env().node_action(args.node, args.action)
    show(
        result,
        args,
        lambda r: (
            f"{args.action} of {args.node} requested (decision {r.get('decision_id')}); "
            f"follow it with `adc audit --node {args.node}`"
        ),
    )
    return 0


def cmd_controller(args: argparse.Namespace) -> int:
    state = ApiClient.from_env().controller(args.verb if args.verb != "status" else None, args.reason)
    show(
        state,
        args,
        lambda s: (
            f"controller {'PAUSED' if s['paused'] else 'running'}"
            f" (since {s['updated_at']}, by {s['updated_by'] or '-'}: {s['reason'] or '-'})"
        ),
    )
    return 0


def _yaml(data) -> str:
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=False).rstrip()


def cmd_policies(args: argparse.Namespace) -> int:
    client = ApiClient.from_env()
    verb = args.verb or "show"
    if verb == "show":
        data = client.policy()
        show(
            data,
            args,
            lambda d: (
                f"# version {d['version']} by {d['updated_by'] or '-'}: {d['reason'] or '-'}\n" + _yaml(d["policy"])
            ),
        )
    elif verb == "history":
        data = client.policy_history(args.limit)
        show(
            data,
            args,
            lambda d: table(
                d["items"],
                [
                    ("version", lambda p: p["version"]),
                    ("created", lambda p: p["created_at"]),
                    ("by", lambda p: p["updated_by"]),
                    ("reason", lambda p: p["reason"]),
                ],
            ),
        )
    elif verb == "set":
        doc = yaml.safe_load(Path(args.file).read_text())
        data = client.set_policy(doc, args.reason, args.expected_version)
        show(
            data,
            args,
            lambda d: (
                f"policy version {d['version']}:\n"
                + ("\n".join(f"  {c['path']}: {c['old']} -> {c['new']}" for c in d["diff"]) or "  (no change)")
            ),
        )
    else:  # reload
        data = client.reload_policy(args.reason)
        show(data, args, lambda d: f"reload of policy version {d['version']} requested")
    return 0


QUOTA_COLUMNS = [
    ("team", lambda q: q["team"]),
    ("max gpus", lambda q: q["max_gpus"]),
    ("max running jobs", lambda q: q["max_running_jobs"]),
    ("per user gpus/jobs", lambda q: f"{q.get('max_gpus_per_user')}/{q.get('max_running_jobs_per_user')}"),
    ("priorities", lambda q: ",".join(q["allowed_priorities"]) if q["allowed_priorities"] else "any"),
    ("over quota", lambda q: q["over_quota"]),
    ("updated by", lambda q: q["updated_by"]),
]


def cmd_quotas(args: argparse.Namespace) -> int:
    show(ApiClient.from_env().quotas(), args, lambda d: table(d["items"], QUOTA_COLUMNS))
    return 0


def cmd_quota(args: argparse.Namespace) -> int:
    client = ApiClient.from_env()
    if args.verb == "rm":
        client.delete_quota(args.team)
        print(f"quota of team {args.team} removed")
        return 0
    quota = {
        "max_gpus": args.max_gpus,
        "max_running_jobs": args.max_running_jobs,
        "allowed_priorities": args.allowed_priorities.split(",") if args.allowed_priorities else None,
        "over_quota": args.over_quota,
        "max_gpus_per_user": args.max_gpus_per_user,
        "max_running_jobs_per_user": args.max_running_jobs_per_user,
    }
    show(client.set_quota(args.team, quota), args, lambda q: table([q], QUOTA_COLUMNS))
    return 0


def _create_token_in_database(args: argparse.Namespace) -> dict:
    from shared.infra.api_tokens import create_token
    from shared.infra.config import load_config
    from shared.infra.db import connect

    url = os.environ.get("DATABASE_URL") or load_config(args.config).database.url

    async def create() -> tuple[str, str]:
        conn = await connect(url)
        try:
            return await create_token(conn, args.name, args.role, args.team, args.ttl_days)
        finally:
            await conn.close()

    token_id, secret = asyncio.run(create())
    return {
        "id": token_id,
        "name": args.name,
        "role": args.role,
        "team": args.team,
        "secret": secret,
        "via": "database",
    }


def cmd_token(args: argparse.Namespace) -> int:
    if args.verb == "create":
        # With no API credentials yet (the first admin), or --db, write the database directly.
        use_db = args.db or not all(saved_credentials())
        token = (
            _create_token_in_database(args)
            if use_db
            else (ApiClient.from_env().create_token(args.name, args.role, args.team, args.ttl_days) | {"via": "api"})
        )
        if args.output == "json":
            print(json.dumps(token, indent=2))
        else:
            print(
                f"token {token['id']} for {token['name']} (role {token['role']}, team {token['team']}, "
                f"created through the {token['via']}); shown once:\n{token['secret']}"
            )
        return 0
    client = ApiClient.from_env()
    if args.verb == "revoke":
        show(client.revoke_token(args.token_id), args, lambda t: f"token {t['id']} of {t['name']} revoked")
        return 0
    cols = [
        ("id", lambda t: t["id"]),
        ("name", lambda t: t["name"]),
        ("role", lambda t: t["role"]),
        ("team", lambda t: t["team"]),
        ("created", lambda t: t["created_at"][:19]),
        ("expires", lambda t: (t["expires_at"] or "")[:19] or None),
        ("revoked", lambda t: t["revoked_at"]),
    ]
    show(client.tokens(args.include_revoked), args, lambda d: table(d["items"], cols))
    return 0


def cmd_whoami(args: argparse.Namespace) -> int:
    show(ApiClient.from_env().me(), args, fields)
    return 0


def register(sub, with_output) -> None:
    p = with_output(sub.add_parser("nodes", help="list nodes and their devices"))
    p.set_defaults(func=cmd_nodes)
    for action, text in (
        ("cordon", "place no new work on a node (operators)"),
        ("uncordon", "let a cordoned node take work again (operators)"),
        ("drain", "move every job off a node losslessly, then cordon it (operators)"),
    ):
        p = with_output(sub.add_parser(action, help=text))
        p.add_argument("node")
        p.set_defaults(func=cmd_node_action, action=action)

    p = with_output(sub.add_parser("controller", help="whether the decider is paused; pause or resume it (operators)"))
    p.add_argument("verb", nargs="?", choices=["status", "pause", "resume"], default="status")
    p.add_argument("--reason", help="why, for the audit log")
    p.set_defaults(func=cmd_controller)

    p = with_output(sub.add_parser("policies", help="the policy: show, history, set FILE, reload (admin to change)"))
    p.add_argument("verb", nargs="?", choices=["show", "history", "set", "reload"])
    p.add_argument("file", nargs="?", help="set: a YAML/JSON document with controller, strategies, schedules")
    p.add_argument("--reason", help="why, for the audit log (required by set)")
    p.add_argument("--expected-version", type=int, help="set: refuse unless this is still the current version")
    p.add_argument("--limit", type=int, default=20, help="history: how many versions")
    p.set_defaults(func=cmd_policies)

    p = with_output(sub.add_parser("quotas", help="team quotas"))
    p.set_defaults(func=cmd_quotas)
    quota = sub.add_parser("quota", help="set or remove a team's quota (admin)").add_subparsers(
        dest="verb", required=True, metavar="VERB"
    )
    p = with_output(quota.add_parser("set", help="set a team's quota (unset limits: none)"))
    p.add_argument("team")
    p.add_argument("--max-gpus", type=int)
    p.add_argument("--max-running-jobs", type=int)
    p.add_argument("--max-gpus-per-user", type=int, help="devices one user of the team may hold at once")
    p.add_argument("--max-running-jobs-per-user", type=int, help="jobs one user of the team may run at once")
    p.add_argument("--allowed-priorities", help="comma-separated levels (default: all)")
    p.add_argument("--over-quota", choices=["queue", "refuse"], default="queue")
    p.set_defaults(func=cmd_quota)
    p = quota.add_parser("rm", help="remove a team's quota")
    p.add_argument("team")
    p.set_defaults(func=cmd_quota)

    tok = sub.add_parser("token", help="API tokens: create, list, revoke").add_subparsers(
        dest="verb", required=True, metavar="VERB"
    )
    p = with_output(tok.add_parser("create", help="create a token; the secret is printed once"))
    p.add_argument("--name", required=True)
    p.add_argument("--role", choices=["user", "operator", "admin"], default="user")
    p.add_argument("--team", default="default")
    p.add_argument("--ttl-days", type=float, help="expire after this many days (default: never)")
    p.add_argument(
        "--db",
        action="store_true",
        help="write the database directly (DATABASE_URL or --config); the default without API credentials, "
        "which is how the first admin is made",
    )
    p.set_defaults(func=cmd_token)
    p = with_output(tok.add_parser("list", help="tokens, without secrets (admin)"))
    p.add_argument("--include-revoked", action="store_true")
    p.set_defaults(func=cmd_token)
    p = with_output(tok.add_parser("revoke", help="revoke a token at once (admin)"))
    p.add_argument("token_id")
    p.set_defaults(func=cmd_token)

    p = with_output(sub.add_parser("whoami", help="the name, role and team of the token in use"))
    p.set_defaults(func=cmd_whoami)


def check_policy_args(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    if getattr(args, "func", None) is cmd_policies and args.verb == "set" and (not args.file or not args.reason):
        parser.error("policies set needs a FILE and --reason")
    if getattr(args, "func", None) is cmd_policies and args.verb != "set" and args.file:
        parser.error(f"policies {args.verb or 'show'} takes no FILE")
