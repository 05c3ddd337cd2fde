"""`adc audit`: query the log, follow it live (`tail -f`, over Server-Sent Events, resuming after
a disconnect from the last id seen: no gaps, no duplicates), and verify its hash chain."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cli.client import ApiClient, ApiError, Unreachable
from cli.render import audit_line, audit_lines

READ_TIMEOUT_S = 45.0  # the server sends a keepalive every 15 s; silence this long is a dead link
MAX_RETRY_S = 5.0


class StreamEnded(Exception):
    pass


def follow_audit(
    client: ApiClient,
    params: dict[str, Any],
    on_event: Callable[[dict], None],
    after_id: int | None = None,
    backlog: int = 0,
    status=sys.stderr,
    stop: Callable[[], bool] = lambda: False,
) -> None:
    """Follow /v1/audit/stream until `stop()` or an HTTP error (which raises ApiError).
    Reconnects on any transport failure, sending the last id seen as Last-Event-ID."""
    last_id = after_id
    retry_s = 1.0
    failures = 0
    announced = False
    while not stop():
        headers = {"Last-Event-ID": str(last_id)} if last_id is not None else {}
        query = dict(params) | ({"backlog": backlog} if last_id is None and backlog else {})
        try:
            with client.events("/v1/audit/stream", query, headers, read_timeout=READ_TIMEOUT_S) as events:
                if failures:
                    print(f"adc: reconnected; resuming after #{last_id}", file=status, flush=True)
                failures = 0
                for sse in events:
                    if sse.retry is not None:
                        retry_s = max(0.1, sse.retry / 1000)
                    if sse.id.isdigit():
                        last_id = int(sse.id)
                        if not announced:
                            announced = True
                            print(
                                f"adc: following the audit log after #{last_id} (Ctrl-C stops)", file=status, flush=True
                            )
                    if sse.event == "audit" and sse.data:
                        on_event(json.loads(sse.data))
                    if sse.event == "end":  # the server closed it for good (e.g. the token was revoked)
                        raise StreamEnded(json.loads(sse.data or "{}").get("reason", "ended by the server"))
                    if stop():
                        return
        except Unreachable as err:
            failures += 1
            if failures == 1:
                print(f"adc: lost the audit stream ({err}); reconnecting ...", file=status, flush=True)
        except ApiError as err:
            if err.status < 500:
                raise
            failures += 1
        else:
            failures += 1  # the server ended the stream (a restart): reconnect
        time.sleep(min(MAX_RETRY_S, retry_s * 2 ** min(failures - 1, 3)))


def _filters(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "job_id": args.job,
        "kind": args.kind,
        "rule": args.rule,
        "node": args.node,
        "action": args.action,
        "actor": args.actor,
        "source": args.source,
        "since": args.since,
        "until": args.until,
    }


def cmd_audit_query(args: argparse.Namespace) -> int:
    client = ApiClient.from_env()
    params = _filters(args)
    if args.last:
        data = client.audit(**params, last=args.last)
    else:
        data = client.audit(**params, after_id=args.after_id, limit=args.limit)
    if args.output == "json":
        print(json.dumps(data, indent=2))
    else:
        print(audit_lines(data["items"]) if data["items"] else "(no events)")
        if not args.last and len(data["items"]) == args.limit:
            print(f"  ... more: --after-id {data['next_after_id']}", file=sys.stderr)
    return 0


def cmd_audit_tail(args: argparse.Namespace) -> int:
    client = ApiClient.from_env()

    def show(event: dict) -> None:
        print(json.dumps(event) if args.output == "json" else audit_line(event), flush=True)

    if not args.follow:
        for event in client.audit(**_filters(args), last=args.lines)["items"] if args.lines > 0 else []:
            show(event)
        return 0
    try:
        follow_audit(
            client,
            {k: v for k, v in _filters(args).items() if v is not None},
            show,
            after_id=args.after_id,
            backlog=args.lines,
        )
    except KeyboardInterrupt:
        return 0
    except StreamEnded as ended:
        print(f"adc: the server ended the audit stream: {ended}", file=sys.stderr)
        return 1
    return 0


def cmd_audit_verify(args: argparse.Namespace) -> int:
    anchor_file = Path(args.anchor) if args.anchor else None
    anchor = json.loads(anchor_file.read_text()) if anchor_file and anchor_file.exists() else None
    result = ApiClient.from_env().audit_verify(anchor)
    if args.output == "json":
        print(json.dumps(result, indent=2))
    elif result["broken"]:
        b = result["broken"]
        print(
            f"audit log BROKEN at row #{b['id']} (event {b['event_id']}, {b['kind']}, {b['ts']}): {b['why']}\n"
            f"{result['rows_checked'] - 1} row(s) before it verified.",
            file=sys.stderr,
        )
    elif result["anchor"] and not result["anchor"]["held"]:
        print(
            f"audit log BROKEN: the anchor in {anchor_file} does not hold: {result['anchor']['why']}", file=sys.stderr
        )
    else:
        print(
            f"audit log intact: {result['rows_checked']} row(s) chained, last #{result['last_id']} "
            f"hash {result['last_hash'][:16]} ({result['elapsed_s']}s)"
            + (f"; anchor #{result['anchor']['id']} held" if result["anchor"] else "")
        )
    if not result["keyed"] and args.output != "json":
        print(
            "warning: the chain is not keyed (audit.chain_key_file unset): a database superuser could rewrite it"
            " unnoticed",
            file=sys.stderr,
        )
    if result["ok"] and anchor_file and result["last_id"]:
        # The new head, kept outside Postgres: next time, rows cut from the end are caught too.
        tmp = anchor_file.with_name(anchor_file.name + ".tmp")
        tmp.write_text(json.dumps({"last_id": result["last_id"], "last_hash": result["last_hash"]}) + "\n")
        tmp.replace(anchor_file)
    return 0 if result["ok"] else 1


def _filter_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--job", help="a job id")
    p.add_argument("--kind", help="e.g. decision, job.submitted, policy.updated")
    p.add_argument("--rule")
    p.add_argument("--node")
    p.add_argument("--action")
    p.add_argument("--actor", help="exact actor, e.g. 'ci-bot (user, team vision)'")
    p.add_argument("--source", help="api, decider, executor, ...")
    p.add_argument("--since", help="ISO time, inclusive")
    p.add_argument("--until", help="ISO time, exclusive")


AUDIT_VERBS = ("query", "tail", "verify")


def register(sub, with_output) -> None:
    audit = sub.add_parser("audit", help="the audit log: query, tail -f, verify (`adc audit --job ID` = query)")
    verbs = audit.add_subparsers(dest="audit_command", required=True, metavar="VERB")
    p = with_output(verbs.add_parser("query", help="events matching filters, oldest first"))
    _filter_flags(p)
    p.add_argument("--after-id", type=int, default=0, help="cursor: the last id already seen")
    p.add_argument("--limit", type=int, default=100)
    p.add_argument("--last", type=int, help="only the last N matching events")
    p.set_defaults(func=cmd_audit_query)
    p = with_output(verbs.add_parser("tail", help="the last events; with -f, follow live"))
    _filter_flags(p)
    p.add_argument("-f", "--follow", action="store_true", help="keep following; resumes by itself after a disconnect")
    p.add_argument("-n", "--lines", type=int, default=10, help="events shown first (default: 10)")
    p.add_argument("--after-id", type=int, help="follow from just after this id instead")
    p.set_defaults(func=cmd_audit_tail)
    p = with_output(
        verbs.add_parser("verify", help="check the hash chain (admin); exit 1 naming the first altered row")
    )
    p.add_argument(
        "--anchor",
        metavar="FILE",
        help="a file outside Postgres holding the head of the last verify: checked, then moved forward;"
        " catches rows cut from the end of the log",
    )
    p.set_defaults(func=cmd_audit_verify)


def with_default_verb(argv: list[str]) -> list[str]:
    """`adc audit --job X` (no verb) keeps meaning `adc audit query --job X`."""
    i = 0
    while i < len(argv):
        word = argv[i]
        if word == "--config":
            i += 2
            continue
        if word.startswith("-"):
            i += 1
            continue
        if word != "audit":
            return argv  # another command
        rest = argv[i + 1 :]
        if not rest or (rest[0] not in AUDIT_VERBS and rest[0] not in ("-h", "--help")):
            return argv[: i + 1] + ["query"] + rest
        return argv
    return argv
