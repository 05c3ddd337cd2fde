"""Who may say what on a job's event subjects. Each source has its own subject, which only its
key may publish (shared/infra/bus_auth.py): `<prefix>.jobs.<node>.<job>.events` a node's worker,
`<prefix>.jobs._api.<job>.events` the api. So an event is taken only from the source its subject
names: a trainer event from the node it names, a submission or cancel request from the api. Each
is also signed by its sender's bus key (shared/infra/command_auth.py), which holds should a server run
with a looser authorization than ADC writes. The executor, the decider and the api then take a
trainer event only from a node of the job's placement (lifecycle.py), so a worker speaks only for
the attempts it runs.
"""

from __future__ import annotations

from nats.aio.msg import Msg

from shared.contracts.messages import JobEvent
from shared.contracts.subjects import API_EVENT_KINDS, Subjects
from shared.infra.bus_auth import CredentialStore, worker_role
from shared.infra.command_auth import SignatureVerifier


class EventSenders:
    def __init__(self, subjects: Subjects, credentials_dir: str | None) -> None:
        self.subjects = subjects
        self.store = CredentialStore(credentials_dir) if credentials_dir else None
        self._verifiers: dict[str, SignatureVerifier] = {}

    def refusal(self, event: JobEvent, msg: Msg) -> str | None:
        """None if the event's rightful sender published and signed it; else why it is refused."""
        if why := self.subjects.event_sender_refusal(msg.subject, event.kind, event.node):
            return why
        if event.kind == "submitted":  # a wake-up, carrying nothing the executor acts on
            return None
        try:
            signer = "api" if event.kind in API_EVENT_KINDS else worker_role(event.node or "")
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
