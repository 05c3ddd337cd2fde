"""Who may say what on a job's event subject. Any worker's key may publish there (a node cannot
know in advance which jobs it will run), so each event is signed by its sender's bus key and
checked here: a trainer event by the worker of the node it names, a cancel request by the api
(shared/command_auth.py). The executor then takes a trainer event only from a node of the job's
placement (lifecycle.py), so a worker speaks only for its own jobs.
"""
from __future__ import annotations

from nats.aio.msg import Msg

from shared.bus_auth import CredentialStore, worker_role
from shared.command_auth import SignatureVerifier
from shared.messages import JobEvent

API_KINDS = {"submitted", "cancel_requested"}


class EventSenders:
    def __init__(self, credentials_dir: str | None) -> None:
        self.store = CredentialStore(credentials_dir) if credentials_dir else None
        self._verifiers: dict[str, SignatureVerifier] = {}

    def refusal(self, event: JobEvent, msg: Msg) -> str | None:
        """None if the event's rightful sender signed it; else why it is refused."""
        try:
            signer = "api" if event.kind in API_KINDS else worker_role(event.node or "")
            verifier = self._verifier(signer)
        except (ValueError, OSError):
            return f"no public key for the sender it claims ({event.kind} from node {event.node!r})"
        return verifier.refusal(msg.subject, msg.data, msg.headers)

    def _verifier(self, role: str) -> SignatureVerifier:
        if self.store is None:
            raise ValueError("bus.credentials_dir is not set")
        if role not in self._verifiers:  # a node added later: its key is read when it first speaks
            self._verifiers[role] = SignatureVerifier.from_store(self.store, role)
        return self._verifiers[role]
