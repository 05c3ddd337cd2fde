"""The learner: vowpalwabbit's contextual bandit with action-dependent features (`cb_explore_adf`,
epsilon-greedy over its cost regression), wrapped so the rest of the decider speaks in feature
dicts, probabilities and bytes.

Nothing here learns by itself: every estimate comes from vowpalwabbit. A context is the job's
features (the shared line) and one line per arm; interactions between the two namespaces
(`-q ja`) let the worth of an arm depend on the job. Costs are what vowpalwabbit minimises, so a
reward r is learned as cost -r.

Conservative play (`bandit.act_margin`, `bandit.act_after`): arm 0 is always the rules' own
choice. The greedy share of the distribution goes to the learner's best arm only when the model
has learned from at least `act_after` outcomes and predicts for that arm a reward above its
prediction for arm 0 by at least `act_margin`; otherwise it stays on arm 0, and the exploring
share is vowpalwabbit's, unchanged. The predictions are the cost regression's own scores, the
ones its epsilon-greedy ranks by (each arm line's partial prediction), so the rule reads no
second model.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import tempfile
from collections.abc import Mapping, Sequence

import vowpalwabbit

Features = Mapping[str, float]
ARGS = "--cb_explore_adf --quiet -q ja --bit_precision 18"


def _line(namespace: str, features: Features) -> str:
    parts = [f"{_name(k)}:{float(v):.6g}" for k, v in sorted(features.items()) if math.isfinite(float(v))]
    return f"|{namespace} " + " ".join(parts)


@functools.lru_cache(maxsize=4096)
def _name(key: str) -> str:
    # vowpalwabbit's text format separates with spaces, colons and bars: a feature name carries none.
    return "".join(c if c.isalnum() or c == "_" else "_" for c in key)


def context_hash(shared: Features, arms: Sequence[Features]) -> str:
    """A short stable hash of a context, for the audit log."""
    text = json.dumps([dict(shared), [dict(a) for a in arms]], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class Learner:
    """One vowpalwabbit workspace; `version` counts the updates it has learned from."""

    def __init__(self, epsilon: float, seed: int = 0, model: bytes | None = None, version: int = 0) -> None:
        self.epsilon = epsilon
        self.seed = seed
        self.version = version
        if model:
            with tempfile.TemporaryDirectory() as folder:
                path = os.path.join(folder, "model")
                with open(path, "wb") as f:
                    f.write(model)
                # The saved model carries its reductions; epsilon is the config's in force now.
                self._vw = vowpalwabbit.Workspace(f"--quiet -i {path} --epsilon {epsilon} --random_seed {seed}")
        else:
            self._vw = vowpalwabbit.Workspace(f"{ARGS} --epsilon {epsilon} --random_seed {seed}")

    def _example(self, shared: Features, arms: Sequence[Features], label: tuple[int, float, float] | None = None):
        lines = ["shared " + _line("j", shared)]
        for i, arm in enumerate(arms):
            prefix = ""
            if label is not None and label[0] == i:
                prefix = f"0:{label[1]:.6g}:{max(label[2], 1e-6):.6g} "
            lines.append(prefix + _line("a", arm))
        return lines

    def predict(self, shared: Features, arms: Sequence[Features]) -> tuple[list[float], list[float]]:
        """vowpalwabbit's exploration distribution over `arms` (sums to 1) and its predicted reward of
        each arm (minus the cost regression's score, the one the distribution ranks by)."""
        examples = self._vw.parse(self._example(shared, arms), vowpalwabbit.LabelType.CONTEXTUAL_BANDIT)
        try:
            probs = [max(0.0, float(p)) for p in self._vw.predict(examples)]
            rewards = [-float(e.get_partial_prediction()) for e in examples[1:]]
        finally:
            self._vw.finish_example(examples)
        total = sum(probs)
        pmf = [p / total for p in probs] if total > 0 else [1.0 / len(arms)] * len(arms)
        return pmf, rewards

    def pmf(self, shared: Features, arms: Sequence[Features], margin: float = 0.0, after: int = 0) -> list[float]:
        """The distribution over `arms` that is played: vowpalwabbit's, made conservative (`conservative`)."""
        pmf, rewards = self.predict(shared, arms)
        return conservative(pmf, rewards, margin, self.version >= after)

    def draw(
        self, shared: Features, arms: Sequence[Features], rng, may_explore: bool, margin: float = 0.0, after: int = 0
    ) -> tuple[int, float, int]:
        """The arm to take, its propensity and the greedy arm: drawn from `pmf`, or, with no exploration
        allowed (the budget spent), the greedy arm for certain."""
        pmf = self.pmf(shared, arms, margin, after)
        greedy = max(range(len(pmf)), key=pmf.__getitem__)  # the first of equals, as numpy's argmax
        if not may_explore:
            return greedy, 1.0, greedy
        total = sum(pmf)
        chosen = int(rng.choice(len(pmf), p=[q / total for q in pmf]))
        return chosen, pmf[chosen], greedy

    def learn(self, shared: Features, arms: Sequence[Features], chosen: int, reward: float, prob: float) -> None:
        """One logged outcome: arm `chosen`, taken with probability `prob`, earned `reward`."""
        self._vw.learn(self._example(shared, arms, (chosen, -reward, prob)))
        self.version += 1

    def to_bytes(self) -> bytes:
        with tempfile.TemporaryDirectory() as folder:
            path = os.path.join(folder, "model")
            self._vw.save(path)
            with open(path, "rb") as f:
                return f.read()

    def with_epsilon(self, epsilon: float) -> Learner:
        """The same model under another exploration rate (a config reload): nothing learned is lost."""
        if epsilon == self.epsilon:
            return self
        return Learner(epsilon, self.seed, self.to_bytes(), self.version)


def conservative(pmf: Sequence[float], rewards: Sequence[float], margin: float, seen: bool) -> list[float]:
    """`pmf` with its greedy share moved back to arm 0 (the rules') unless the learner is confident:
    it has learned enough (`seen`) and predicts for its best arm a reward at least `margin` above
    arm 0's. The exploring share of every arm stays as it was (the two arms' shares swap)."""
    out = list(pmf)
    greedy = max(range(len(out)), key=out.__getitem__)
    if greedy != 0 and not (seen and rewards[greedy] - rewards[0] >= margin):
        out[0], out[greedy] = out[greedy], out[0]
    return out


class RewardModel:
    """vowpalwabbit's cost regression over the same features (`cb_adf`), fitted on logged outcomes:
    the reward estimate r(x, a) that doubly robust evaluation needs."""

    def __init__(self, seed: int = 0) -> None:
        self._vw = vowpalwabbit.Workspace(f"--cb_adf --quiet -q ja --bit_precision 18 --random_seed {seed}")

    def learn(self, shared: Features, arms: Sequence[Features], chosen: int, reward: float, prob: float) -> None:
        lines = ["shared " + _line("j", shared)]
        for i, arm in enumerate(arms):
            prefix = f"0:{-reward:.6g}:{max(prob, 1e-6):.6g} " if i == chosen else ""
            lines.append(prefix + _line("a", arm))
        self._vw.learn(lines)

    def rewards(self, shared: Features, arms: Sequence[Features]) -> list[float]:
        """The estimated reward of each arm."""
        lines = ["shared " + _line("j", shared)] + [_line("a", arm) for arm in arms]
        scores = self._vw.predict(lines)
        return [-float(c) for c in scores]
